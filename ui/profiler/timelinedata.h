#pragma once
// TimelineData: a trace's spans laid out for drawing and querying. Spans are grouped into lanes
// (worker / device / thread) and, inside a lane, into depth rows by nesting, so that the spans of
// one row never overlap and are sorted by both start and end. That lets every query (what is
// visible, what is under the mouse, what lies in a range) be a binary search per row instead of
// a scan of the whole trace, which is what keeps a 1M-span trace interactive.
// Plain C++ (no Qt): built once per trace, then read-only.

#include <cstdint>
#include <string>
#include <vector>

#include "telemetry/events.h"

namespace ts {

struct TimelineLane {
    telemetry::Lane lane;
    std::string label;   // laneLabel(lane)
    int firstRow = 0;    // index of its depth-0 row in TimelineData::rows()
    int depthCount = 0;
};

struct TimelineRow {
    int lane = 0;
    int depth = 0;
    // Parallel arrays, sorted by start (ends sorted too: a row's spans never overlap).
    std::vector<int64_t> starts, ends;
    std::vector<int32_t> spans;  // indices into TimelineData::spans()
};

// Aggregates over a time range (TimelineData::rangeStats).
struct CategoryTime {
    std::string category;
    double selfUs = 0;   // time in the range spent in this category's spans, minus nested spans
};

struct SpanNameTime {
    std::string name, category;
    int64_t count = 0;   // spans of this name overlapping the range
    double totalUs = 0;  // inclusive time inside the range
    double selfUs = 0;   // minus nested spans on the same lane
};

struct RangeStats {
    int64_t t0Us = 0, t1Us = 0;
    int64_t spans = 0;                      // spans overlapping the range
    double busyUs = 0;                      // sum of byCategory (time covered, summed over lanes)
    std::vector<CategoryTime> byCategory;   // descending by time
    std::vector<SpanNameTime> top;          // descending by inclusive time
};

class TimelineData {
public:
    TimelineData() = default;
    // `format` is the trace's format ("pytorch", "tensorflow", ...; see telemetry::Trace): spans
    // without a category are grouped by the step part the trace summary classifies them into.
    // Counter samples (category "counter") and zero-length spans without a duration are kept
    // out of the rows (they have nothing to draw).
    TimelineData(std::vector<telemetry::SpanEvent> spans, const std::string& format);

    bool empty() const { return m_spans.empty(); }
    const std::vector<telemetry::SpanEvent>& spans() const { return m_spans; }
    const std::vector<TimelineLane>& lanes() const { return m_lanes; }
    const std::vector<TimelineRow>& rows() const { return m_rows; }
    const std::string& format() const { return m_format; }
    int64_t startUs() const { return m_startUs; }
    int64_t endUs() const { return m_endUs; }

    // The category a span is grouped and coloured by: its own, else its step part, else
    // "uncategorised".
    const std::string& categoryOf(int span) const { return m_categories[static_cast<std::size_t>(m_categoryIds[static_cast<std::size_t>(span)])]; }
    int categoryIdOf(int span) const { return m_categoryIds[static_cast<std::size_t>(span)]; }
    const std::vector<std::string>& categories() const { return m_categories; }
    int rowOf(int span) const { return m_rowOf[static_cast<std::size_t>(span)]; }  // -1: not drawn
    int parentOf(int span) const { return m_parent[static_cast<std::size_t>(span)]; }  // -1: top level
    // The span's duration minus its direct children's (same lane), in microseconds.
    int64_t selfUs(int span) const;

    // Index of the row's span covering `timeUs`, or -1.
    int spanAt(int row, double timeUs) const;
    // Spans of a row overlapping [t0Us, t1Us]: [first, last) indices into the row's arrays.
    std::pair<std::size_t, std::size_t> rowRange(int row, double t0Us, double t1Us) const;
    // Statistics of [t0Us, t1Us] over every lane; `topCount` span names at most.
    RangeStats rangeStats(int64_t t0Us, int64_t t1Us, int topCount = 15) const;

private:
    std::vector<telemetry::SpanEvent> m_spans;
    std::string m_format;
    std::vector<TimelineLane> m_lanes;
    std::vector<TimelineRow> m_rows;
    std::vector<std::string> m_categories;
    std::vector<int32_t> m_categoryIds, m_rowOf, m_parent;
    int64_t m_startUs = 0, m_endUs = 0;
};

} // namespace ts
