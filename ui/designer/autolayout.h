#pragma once
// Top-to-bottom layered layout of a model graph (Sugiyama style, kept simple and linear-ish):
// layers by longest path from the inputs, long edges get virtual nodes so skip connections keep
// a lane of their own, a few barycentre sweeps order each layer, and x positions follow the
// producers while keeping nodes `dx` apart. Plain C++ on the spec; the document applies the
// result as one undoable edit.

#include <utility>
#include <vector>

#include "model/spec.h"

namespace ts {

struct LayoutOptions {
    double dx = 220;  // centre-to-centre distance of neighbours in a row
    double dy = 100;  // top-to-top distance of rows
};

// One (x, y) per spec.layers entry: x is the node's centre, y its top.
std::vector<std::pair<double, double>> autoLayoutPositions(const ModelSpec& spec,
                                                           const LayoutOptions& options = {});

} // namespace ts
