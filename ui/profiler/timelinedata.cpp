#include "profiler/timelinedata.h"

#include <algorithm>
#include <unordered_map>

#include "telemetry/breakdown.h"
#include "telemetry/trace_summary.h"

namespace ts {

TimelineData::TimelineData(std::vector<telemetry::SpanEvent> spans, const std::string& format) : m_format(format)
{
    // Counter samples are values, not time intervals.
    spans.erase(std::remove_if(spans.begin(), spans.end(),
                               [](const telemetry::SpanEvent& s) { return s.category == "counter" || s.durationUs < 0; }),
                spans.end());
    // Start order, longer first on ties, so a parent always comes before its children. Imported
    // traces arrive sorted; others are sorted through an index (moving whole spans is costly).
    auto before = [](const telemetry::SpanEvent& a, const telemetry::SpanEvent& b) {
        return a.startUs != b.startUs ? a.startUs < b.startUs : a.durationUs > b.durationUs;
    };
    if (std::is_sorted(spans.begin(), spans.end(), before)) {
        m_spans = std::move(spans);
    } else {
        // Compact keys sort without chasing each span through memory; the index keeps it stable.
        struct Key {
            int64_t start, negDuration;
            int32_t index;
            bool operator<(const Key& o) const
            {
                return start != o.start ? start < o.start
                                        : negDuration != o.negDuration ? negDuration < o.negDuration : index < o.index;
            }
        };
        std::vector<Key> order(spans.size());
        for (std::size_t i = 0; i < spans.size(); ++i)
            order[i] = {spans[i].startUs, -spans[i].durationUs, static_cast<int32_t>(i)};
        std::sort(order.begin(), order.end());
        m_spans.reserve(spans.size());
        for (const Key& k : order)
            m_spans.push_back(std::move(spans[static_cast<std::size_t>(k.index)]));
    }
    const std::size_t n = m_spans.size();
    m_categoryIds.resize(n);
    m_rowOf.assign(n, -1);
    m_parent.assign(n, -1);
    if (n == 0)
        return;

    std::unordered_map<std::string, int32_t> categoryIndex;
    std::unordered_map<std::string, int> laneIndex;
    std::vector<std::vector<int32_t>> laneSpans;
    m_startUs = m_spans.front().startUs;
    m_endUs = m_startUs;
    for (std::size_t i = 0; i < n; ++i) {
        const telemetry::SpanEvent& s = m_spans[i];
        m_endUs = std::max(m_endUs, s.startUs + s.durationUs);
        const std::string* category = &s.category;
        std::string byPart;
        if (category->empty()) {
            const int part = telemetry::classifySpan(s, m_format);
            byPart = part >= 0 ? telemetry::stepPartName(static_cast<telemetry::StepPart>(part)) : "uncategorised";
            category = &byPart;
        }
        auto cit = categoryIndex.find(*category);
        if (cit == categoryIndex.end()) {
            cit = categoryIndex.emplace(*category, static_cast<int32_t>(m_categories.size())).first;
            m_categories.push_back(*category);
        }
        m_categoryIds[i] = cit->second;

        // Worker and device are part of the lane: two workers may both have a "main" thread. A
        // trace has a handful of lanes, so comparing is cheaper than building a hash key per span.
        int lane = -1;
        if (m_lanes.size() <= 32) {
            for (std::size_t l = 0; l < m_lanes.size() && lane < 0; ++l)
                if (m_lanes[l].lane == s.stamp.lane)
                    lane = static_cast<int>(l);
        } else {
            const std::string key = s.stamp.lane.worker + '\x1f' + s.stamp.lane.device + '\x1f' + s.stamp.lane.thread;
            const auto lit = laneIndex.find(key);
            if (lit != laneIndex.end())
                lane = lit->second;
        }
        if (lane < 0) {
            lane = static_cast<int>(m_lanes.size());
            TimelineLane entry;
            entry.lane = s.stamp.lane;
            entry.label = telemetry::laneLabel(s.stamp.lane);
            m_lanes.push_back(std::move(entry));
            laneSpans.emplace_back();
            // The index is kept complete so it can take over once there are many lanes.
            laneIndex.emplace(s.stamp.lane.worker + '\x1f' + s.stamp.lane.device + '\x1f' + s.stamp.lane.thread, lane);
        }
        laneSpans[static_cast<std::size_t>(lane)].push_back(static_cast<int32_t>(i));
    }

    // Depth by nesting: stack[k] is the open span at depth k, so a row's spans never overlap.
    for (std::size_t l = 0; l < m_lanes.size(); ++l) {
        std::vector<std::vector<int32_t>> depthSpans;
        std::vector<std::pair<int64_t, int32_t>> stack;  // (end, span)
        for (int32_t i : laneSpans[l]) {
            const telemetry::SpanEvent& s = m_spans[static_cast<std::size_t>(i)];
            while (!stack.empty() && stack.back().first <= s.startUs)
                stack.pop_back();
            const std::size_t depth = stack.size();
            m_parent[static_cast<std::size_t>(i)] = stack.empty() ? -1 : stack.back().second;
            stack.emplace_back(s.startUs + s.durationUs, i);
            if (depthSpans.size() <= depth)
                depthSpans.resize(depth + 1);
            depthSpans[depth].push_back(i);
        }
        TimelineLane& lane = m_lanes[l];
        lane.firstRow = static_cast<int>(m_rows.size());
        lane.depthCount = static_cast<int>(depthSpans.size());
        for (std::size_t d = 0; d < depthSpans.size(); ++d) {
            TimelineRow row;
            row.lane = static_cast<int>(l);
            row.depth = static_cast<int>(d);
            row.spans = std::move(depthSpans[d]);
            row.starts.reserve(row.spans.size());
            row.ends.reserve(row.spans.size());
            const int rowIndex = static_cast<int>(m_rows.size());
            for (int32_t i : row.spans) {
                const telemetry::SpanEvent& s = m_spans[static_cast<std::size_t>(i)];
                row.starts.push_back(s.startUs);
                row.ends.push_back(s.startUs + s.durationUs);
                m_rowOf[static_cast<std::size_t>(i)] = rowIndex;
            }
            m_rows.push_back(std::move(row));
        }
    }
}

int64_t TimelineData::selfUs(int span) const
{
    if (span < 0 || static_cast<std::size_t>(span) >= m_spans.size())
        return 0;
    const telemetry::SpanEvent& s = m_spans[static_cast<std::size_t>(span)];
    int64_t self = s.durationUs;
    const int row = m_rowOf[static_cast<std::size_t>(span)];
    const std::size_t childRow = static_cast<std::size_t>(row) + 1;
    if (row < 0 || childRow >= m_rows.size() || m_rows[childRow].lane != m_rows[static_cast<std::size_t>(row)].lane)
        return self;
    const TimelineRow& r = m_rows[childRow];
    const auto [first, last] = rowRange(static_cast<int>(childRow), static_cast<double>(s.startUs),
                                        static_cast<double>(s.startUs + s.durationUs));
    for (std::size_t k = first; k < last; ++k)
        if (m_parent[static_cast<std::size_t>(r.spans[k])] == span)
            self -= r.ends[k] - r.starts[k];
    return std::max<int64_t>(0, self);
}

std::pair<std::size_t, std::size_t> TimelineData::rowRange(int row, double t0Us, double t1Us) const
{
    if (row < 0 || static_cast<std::size_t>(row) >= m_rows.size())
        return {0, 0};
    const TimelineRow& r = m_rows[static_cast<std::size_t>(row)];
    // Ends are sorted too, so the first span ending at or after t0 is found by bisection.
    const auto first = std::lower_bound(r.ends.begin(), r.ends.end(), t0Us,
                                        [](int64_t end, double t) { return static_cast<double>(end) < t; });
    const std::size_t f = static_cast<std::size_t>(first - r.ends.begin());
    const auto last = std::upper_bound(r.starts.begin() + static_cast<std::ptrdiff_t>(f), r.starts.end(), t1Us,
                                       [](double t, int64_t start) { return t < static_cast<double>(start); });
    return {f, static_cast<std::size_t>(last - r.starts.begin())};
}

int TimelineData::spanAt(int row, double timeUs) const
{
    if (row < 0 || static_cast<std::size_t>(row) >= m_rows.size())
        return -1;
    const TimelineRow& r = m_rows[static_cast<std::size_t>(row)];
    const auto it = std::upper_bound(r.starts.begin(), r.starts.end(), timeUs,
                                     [](double t, int64_t start) { return t < static_cast<double>(start); });
    if (it == r.starts.begin())
        return -1;
    const std::size_t k = static_cast<std::size_t>(it - r.starts.begin()) - 1;
    return static_cast<double>(r.ends[k]) >= timeUs ? r.spans[k] : -1;
}

RangeStats TimelineData::rangeStats(int64_t t0Us, int64_t t1Us, int topCount) const
{
    RangeStats out;
    if (t1Us < t0Us)
        std::swap(t0Us, t1Us);
    out.t0Us = t0Us;
    out.t1Us = t1Us;
    std::vector<double> categorySelf(m_categories.size(), 0.0);
    std::unordered_map<std::string, SpanNameTime> names;
    for (std::size_t row = 0; row < m_rows.size(); ++row) {
        const TimelineRow& r = m_rows[row];
        const auto [first, last] = rowRange(static_cast<int>(row), static_cast<double>(t0Us), static_cast<double>(t1Us));
        for (std::size_t k = first; k < last; ++k) {
            const int64_t a = std::max(t0Us, r.starts[k]), b = std::min(t1Us, r.ends[k]);
            // A span touching the range only at an edge has no time in it.
            if (b <= a && !(r.starts[k] == r.ends[k] && r.starts[k] >= t0Us && r.starts[k] <= t1Us))
                continue;
            const double clip = static_cast<double>(std::max<int64_t>(0, b - a));
            const int32_t span = r.spans[k];
            const telemetry::SpanEvent& s = m_spans[static_cast<std::size_t>(span)];
            ++out.spans;
            categorySelf[static_cast<std::size_t>(m_categoryIds[static_cast<std::size_t>(span)])] += clip;
            SpanNameTime& nt = names[s.name];
            if (nt.count == 0) {
                nt.name = s.name;
                nt.category = categoryOf(span);
            }
            ++nt.count;
            nt.totalUs += clip;
            nt.selfUs += clip;
            // Nested time belongs to the child: take it out of the parent's self time.
            const int32_t parent = m_parent[static_cast<std::size_t>(span)];
            if (parent >= 0) {
                categorySelf[static_cast<std::size_t>(m_categoryIds[static_cast<std::size_t>(parent)])] -= clip;
                names[m_spans[static_cast<std::size_t>(parent)].name].selfUs -= clip;
            }
        }
    }
    for (std::size_t c = 0; c < m_categories.size(); ++c) {
        if (categorySelf[c] <= 0)
            continue;
        out.byCategory.push_back({m_categories[c], categorySelf[c]});
        out.busyUs += categorySelf[c];
    }
    std::sort(out.byCategory.begin(), out.byCategory.end(), [](const CategoryTime& a, const CategoryTime& b) {
        return a.selfUs != b.selfUs ? a.selfUs > b.selfUs : a.category < b.category;
    });
    out.top.reserve(names.size());
    for (auto& [name, nt] : names)
        if (nt.count > 0)
            out.top.push_back(std::move(nt));
    std::sort(out.top.begin(), out.top.end(), [](const SpanNameTime& a, const SpanNameTime& b) {
        return a.totalUs != b.totalUs ? a.totalUs > b.totalUs : a.name < b.name;
    });
    if (topCount >= 0 && out.top.size() > static_cast<std::size_t>(topCount))
        out.top.resize(static_cast<std::size_t>(topCount));
    return out;
}

} // namespace ts
