#pragma once
// Chrome Trace Event JSON: export of a run's spans, counters and device samples (opens in
// Perfetto and chrome://tracing), and import of such files written by other tools (PyTorch
// profiler with or without Kineto, TensorFlow profiler / timeline, Horovod timeline).
// Contract:
//  - Export writes {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}: X events
//    (ts/dur in microseconds), M events naming processes (one pid per worker) and threads (one
//    tid per device/thread lane), C events for counters and device samples, i events for run
//    state changes. Spans on one tid never overlap without nesting (Perfetto rejects that):
//    a span that would is moved to an extra "(overlap N)" tid of the same lane.
//  - ChromeTraceWriter buffers compact records and writes the file in finish(), through a
//    temporary file renamed into place (a crash leaves no half-written trace). Used from one
//    thread (the trace sink's).
//  - Import accepts a bare array or an object with "traceEvents" (a .gz file too), phases X,
//    B/E (paired per pid/tid, E's args merged), i/I, C and M; flows, async and object events are
//    counted in Trace::ignored. A Horovod timeline cut off before its closing "]" is accepted.
//  - Errors: malformed input is an Error whose message names the file and, for a bad event, its
//    index in traceEvents ("trace.json: event 17 (ph "X"): no numeric \"dur\"").

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/result.h"
#include "telemetry/events.h"

namespace ts::telemetry {

// Appends `s` as a JSON string literal (quoted, escaped). Shared by the trace writers.
void appendJsonString(std::string& out, std::string_view s);

struct TraceCounter {
    Lane lane;
    std::string name;
    int64_t timeUs = 0;
    std::map<std::string, double> values;  // one series per key
};

struct Trace {
    std::string source;                      // the file it was read from
    std::string format;                      // "trainstudio", "pytorch", "pytorch-legacy", "tensorflow", "horovod", "chrome"
    std::vector<SpanEvent> spans;            // X and paired B/E, sorted by start (longer first on ties)
    std::vector<SpanEvent> instants;         // i / I events (durationUs 0)
    std::vector<TraceCounter> counters;
    std::map<std::string, std::string> metadata;  // otherData / top-level string fields
    std::map<std::string, int64_t> ignored;  // phase -> events not represented (flows, async, ...)
    std::vector<std::string> warnings;       // e.g. a B without E, closed at the end of the trace
    int64_t eventCount = 0;                  // entries in traceEvents
};

class ChromeTraceWriter {
public:
    // Checks that `path` can be written (creates the temporary file now).
    static Result<std::unique_ptr<ChromeTraceWriter>> create(const std::string& path);
    ~ChromeTraceWriter();
    ChromeTraceWriter(const ChromeTraceWriter&) = delete;
    ChromeTraceWriter& operator=(const ChromeTraceWriter&) = delete;

    void addSpan(const SpanEvent& span);     // category "counter": a counter sample
    void addInstant(const SpanEvent& instant);
    void addCounter(const TraceCounter& counter);
    // Spans, device samples and step metrics (as counters), run state changes and errors (as
    // instants); other events are ignored.
    void add(const Event& e);
    void setMetadata(const std::string& key, const std::string& value);

    // Writes and renames the file into place. Call once.
    Status finish();
    std::size_t spanCount() const { return m_spans.size(); }

private:
    friend nlohmann::json toChromeJson(const struct Trace& trace);
    ChromeTraceWriter() = default;  // in memory (m_path empty): finish() fills m_memory
    struct Rec {
        uint32_t name, category, lane;
        int64_t startUs, durationUs, step;
        int32_t args;  // index into m_args, -1 none
    };
    uint32_t intern(const std::string& s);
    uint32_t laneIndex(const Lane& lane);
    std::string m_path, m_tmpPath;
    std::vector<std::string> m_strings;
    std::unordered_map<std::string, uint32_t> m_stringIndex;
    std::vector<Lane> m_lanes;
    std::unordered_map<std::string, uint32_t> m_laneIndex;
    std::vector<Rec> m_spans, m_instants;
    std::vector<std::map<std::string, std::string>> m_args;
    std::vector<TraceCounter> m_counters;
    std::map<std::string, std::string> m_metadata;
    std::string m_memory;
    bool m_finished = false;
};

// Writes a Trace (spans, instants, counters, metadata) as a Chrome trace file.
Status writeChromeTrace(const Trace& trace, const std::string& path);
// The same document in memory.
nlohmann::json toChromeJson(const Trace& trace);

// Reads a Chrome trace file (.json or gzip-compressed).
Result<Trace> readChromeTrace(const std::string& path);
// Parses an already loaded document; `source` names it in errors.
Result<Trace> parseChromeTrace(const nlohmann::json& document, const std::string& source);
// Parses JSON text (tolerates a bare array missing its closing bracket).
Result<Trace> parseChromeTraceText(const std::string& text, const std::string& source);

} // namespace ts::telemetry
