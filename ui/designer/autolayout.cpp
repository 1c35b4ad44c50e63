#include "designer/autolayout.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_map>

namespace ts {

namespace {

struct LNode {
    int layer = 0;
    bool virtualNode = false;
    std::vector<int> up;    // producers (real or virtual), one layer above
    std::vector<int> down;  // consumers, one layer below
    double order = 0;       // position key within the layer
    double x = 0;
};

// x positions for one row in order: as close to `want` as possible, at least dx apart; the
// average of the left-packed and right-packed solutions (both feasible, so the mean is too).
void placeRow(std::vector<LNode>& nodes, const std::vector<int>& row, const std::vector<double>& want,
              double dx)
{
    const std::size_t n = row.size();
    std::vector<double> left(n), right(n);
    for (std::size_t i = 0; i < n; ++i)
        left[i] = i == 0 ? want[i] : std::max(want[i], left[i - 1] + dx);
    for (std::size_t k = n; k-- > 0;)
        right[k] = k + 1 == n ? want[k] : std::min(want[k], right[k + 1] - dx);
    for (std::size_t i = 0; i < n; ++i)
        nodes[row[i]].x = (left[i] + right[i]) / 2;
}

} // namespace

std::vector<std::pair<double, double>> autoLayoutPositions(const ModelSpec& spec,
                                                           const LayoutOptions& options)
{
    const int n = static_cast<int>(spec.layers.size());
    std::vector<std::pair<double, double>> out(n);
    if (n == 0)
        return out;

    std::unordered_map<std::string, int> index;
    index.reserve(n);
    for (int i = 0; i < n; ++i)
        index.emplace(spec.layers[i].id, i);

    // Resolved producer lists (dangling references are ignored) and consumer lists.
    std::vector<std::vector<int>> producers(n), consumers(n);
    for (int i = 0; i < n; ++i)
        for (const std::string& in : spec.layers[i].inputs) {
            auto it = index.find(in);
            if (it == index.end() || it->second == i)
                continue;
            producers[i].push_back(it->second);
            consumers[it->second].push_back(i);
        }

    // Layers: longest path from the sources (Kahn). Nodes on cycles are placed afterwards in
    // file order, below whatever producers they have that were placed.
    std::vector<int> layer(n, 0), pending(n);
    std::vector<int> queue;
    queue.reserve(n);
    for (int i = 0; i < n; ++i) {
        pending[i] = static_cast<int>(producers[i].size());
        if (pending[i] == 0)
            queue.push_back(i);
    }
    std::vector<bool> placed(n, false);
    for (std::size_t q = 0; q < queue.size(); ++q) {
        const int v = queue[q];
        placed[v] = true;
        for (int c : consumers[v]) {
            layer[c] = std::max(layer[c], layer[v] + 1);
            if (--pending[c] == 0)
                queue.push_back(c);
        }
    }
    for (int i = 0; i < n; ++i) {
        if (placed[i])
            continue;
        for (int p : producers[i])
            if (placed[p])
                layer[i] = std::max(layer[i], layer[p] + 1);
        placed[i] = true;
    }

    // The layered graph: real nodes first (same indices), then virtual nodes on long edges.
    std::vector<LNode> nodes(n);
    for (int i = 0; i < n; ++i)
        nodes[i].layer = layer[i];
    for (int c = 0; c < n; ++c) {
        for (int p : producers[c]) {
            int from = p;
            const int target = layer[c];
            if (layer[p] >= target) {
                // A back edge (cycle): no lane for it.
                continue;
            }
            for (int l = layer[p] + 1; l < target; ++l) {
                LNode v;
                v.layer = l;
                v.virtualNode = true;
                v.up.push_back(from);
                nodes.push_back(v);
                const int vi = static_cast<int>(nodes.size()) - 1;
                nodes[from].down.push_back(vi);
                from = vi;
            }
            nodes[from].down.push_back(c);
            nodes[c].up.push_back(from);
        }
    }

    int layerCount = 0;
    for (const LNode& v : nodes)
        layerCount = std::max(layerCount, v.layer + 1);
    std::vector<std::vector<int>> rows(layerCount);
    // Initial order: real nodes in file order, each virtual node right after its creation
    // (which follows its producer's consumers' order closely enough).
    for (int i = 0; i < static_cast<int>(nodes.size()); ++i)
        rows[nodes[static_cast<std::size_t>(i)].layer].push_back(i);
    auto renumber = [&](std::vector<int>& row) {
        for (std::size_t k = 0; k < row.size(); ++k)
            nodes[row[k]].order = static_cast<double>(k);
    };
    for (auto& row : rows)
        renumber(row);

    // Barycentre sweeps: down (by producers), then up (by consumers).
    auto sweep = [&](bool downward) {
        const int first = downward ? 1 : layerCount - 2;
        const int last = downward ? layerCount : -1;
        const int step = downward ? 1 : -1;
        for (int l = first; l != last; l += step) {
            std::vector<int>& row = rows[l];
            std::vector<std::pair<double, int>> keyed;
            keyed.reserve(row.size());
            for (int v : row) {
                const auto& nb = downward ? nodes[v].up : nodes[v].down;
                double key = nodes[v].order;
                if (!nb.empty()) {
                    double sum = 0;
                    for (int u : nb)
                        sum += nodes[u].order;
                    key = sum / static_cast<double>(nb.size());
                }
                keyed.emplace_back(key, v);
            }
            std::stable_sort(keyed.begin(), keyed.end(),
                             [](const auto& a, const auto& b) { return a.first < b.first; });
            for (std::size_t k = 0; k < row.size(); ++k)
                row[k] = keyed[k].second;
            renumber(row);
        }
    };
    for (int pass = 0; pass < 3; ++pass) {
        sweep(true);
        sweep(false);
    }
    sweep(true);

    // x: each node as near as possible to the mean x of its producers (sources: spread around 0).
    for (int l = 0; l < layerCount; ++l) {
        const std::vector<int>& row = rows[l];
        std::vector<double> want(row.size());
        for (std::size_t k = 0; k < row.size(); ++k) {
            const LNode& v = nodes[row[k]];
            if (v.up.empty()) {
                want[k] = (static_cast<double>(k) - (static_cast<double>(row.size()) - 1) / 2) * options.dx;
            } else {
                double sum = 0;
                for (int u : v.up)
                    sum += nodes[u].x;
                want[k] = sum / static_cast<double>(v.up.size());
            }
        }
        placeRow(nodes, row, want, options.dx);
    }

    for (int i = 0; i < n; ++i) {
        const LNode& v = nodes[i];
        // Whole numbers keep saved files tidy.
        out[i] = {std::round(v.x / 10) * 10, v.layer * options.dy};
    }
    return out;
}

} // namespace ts
