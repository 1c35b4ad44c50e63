#include "telemetry/chrome_trace.h"

#include "common/json_document.h"
#include "common/paths.h"

#include <zlib.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <optional>
#include <sstream>

namespace ts::telemetry {

void appendJsonString(std::string& out, std::string_view s)
{
    out += '"';
    for (unsigned char c : s) {
        switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        default:
            if (c < 0x20) {
                char buf[8];
                std::snprintf(buf, sizeof buf, "\\u%04x", c);
                out += buf;
            } else {
                out += static_cast<char>(c);
            }
        }
    }
    out += '"';
}

namespace {

constexpr const char* kProducer = "TrainStudio 0.1.0";

void appendNumber(std::string& out, double v)
{
    if (!std::isfinite(v)) {
        out += "null";
        return;
    }
    char buf[32];
    auto r = std::to_chars(buf, buf + sizeof buf, v);
    out.append(buf, r.ptr);
}

std::string laneKey(const Lane& l) { return l.worker + '\x1f' + l.device + '\x1f' + l.thread; }

std::string threadLabel(const Lane& l)
{
    if (l.device.empty()) return l.thread.empty() ? "main" : l.thread;
    if (l.thread.empty()) return l.device;
    return l.device + " " + l.thread;
}

double mib(uint64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

} // namespace

// ---------------------------------------------------------------------------------------------
// Writer

Result<std::unique_ptr<ChromeTraceWriter>> ChromeTraceWriter::create(const std::string& path)
{
    std::unique_ptr<ChromeTraceWriter> w(new ChromeTraceWriter());
    w->m_path = path;
    w->m_tmpPath = path + ".part";
    std::ofstream probe(w->m_tmpPath, std::ios::binary | std::ios::trunc);
    if (!probe)
        return makeError(ErrorCode::IoError, "cannot write the trace file " + path,
                         "check that the folder exists and is writable");
    return w;
}

ChromeTraceWriter::~ChromeTraceWriter()
{
    if (!m_finished && !m_tmpPath.empty()) {
        std::error_code ec;
        std::filesystem::remove(m_tmpPath, ec);
    }
}

uint32_t ChromeTraceWriter::intern(const std::string& s)
{
    auto [it, inserted] = m_stringIndex.emplace(s, static_cast<uint32_t>(m_strings.size()));
    if (inserted) m_strings.push_back(s);
    return it->second;
}

uint32_t ChromeTraceWriter::laneIndex(const Lane& lane)
{
    auto [it, inserted] = m_laneIndex.emplace(laneKey(lane), static_cast<uint32_t>(m_lanes.size()));
    if (inserted) m_lanes.push_back(lane);
    return it->second;
}

void ChromeTraceWriter::addSpan(const SpanEvent& span)
{
    if (span.category == "counter") {
        TraceCounter c;
        c.lane = span.stamp.lane;
        c.name = span.name;
        c.timeUs = span.startUs;
        auto it = span.args.find("value");
        double v = 0;
        if (it != span.args.end()) {
            const char* b = it->second.data();
            std::from_chars(b, b + it->second.size(), v);
        }
        c.values["value"] = v;
        addCounter(c);
        return;
    }
    Rec r{intern(span.name), intern(span.category), laneIndex(span.stamp.lane), span.startUs,
          std::max<int64_t>(0, span.durationUs), span.stamp.step, -1};
    if (!span.args.empty()) {
        r.args = static_cast<int32_t>(m_args.size());
        m_args.push_back(span.args);
    }
    m_spans.push_back(r);
}

void ChromeTraceWriter::addInstant(const SpanEvent& instant)
{
    Rec r{intern(instant.name), intern(instant.category), laneIndex(instant.stamp.lane), instant.startUs, 0,
          instant.stamp.step, -1};
    if (!instant.args.empty()) {
        r.args = static_cast<int32_t>(m_args.size());
        m_args.push_back(instant.args);
    }
    m_instants.push_back(r);
}

void ChromeTraceWriter::addCounter(const TraceCounter& counter)
{
    laneIndex(counter.lane);
    m_counters.push_back(counter);
}

void ChromeTraceWriter::setMetadata(const std::string& key, const std::string& value) { m_metadata[key] = value; }

void ChromeTraceWriter::add(const Event& e)
{
    const Stamp& st = stampOf(e);
    if (!st.runId.empty() && !m_metadata.count("run_id")) m_metadata["run_id"] = st.runId;
    if (const auto* s = std::get_if<SpanEvent>(&e)) {
        addSpan(*s);
    } else if (const auto* d = std::get_if<DeviceSampleEvent>(&e)) {
        const std::string who = d->stamp.lane.device.empty() ? "host" : d->stamp.lane.device;
        Lane lane = d->stamp.lane;
        auto counter = [&](std::string name, std::map<std::string, double> values) {
            TraceCounter c{lane, std::move(name), d->stamp.wallTimeUs, std::move(values)};
            addCounter(c);
        };
        if (d->utilisation >= 0) {
            std::map<std::string, double> v{{"all", d->utilisation * 100.0}};
            for (std::size_t i = 0; i < d->perCore.size(); ++i) v["cpu" + std::to_string(i)] = d->perCore[i] * 100.0;
            counter(who + " utilisation %", std::move(v));
        }
        if (d->processCpu >= 0) counter("process CPU (cores)", {{"value", d->processCpu}});
        if (d->memoryUsed > 0 || d->memoryTotal > 0)
            counter(who + (d->stamp.lane.device.empty() ? " process RSS (MiB)" : " memory used (MiB)"),
                    {{"value", mib(d->memoryUsed)}});
        if (d->temperatureC >= 0) counter(who + " temperature (C)", {{"value", d->temperatureC}});
        if (d->powerW >= 0) counter(who + " power (W)", {{"value", d->powerW}});
    } else if (const auto* m = std::get_if<StepMetricsEvent>(&e)) {
        addCounter({m->stamp.lane, "loss", m->stamp.wallTimeUs, {{"loss", m->loss}}});
        if (m->samplesPerSec > 0) addCounter({m->stamp.lane, "samples/s", m->stamp.wallTimeUs, {{"value", m->samplesPerSec}}});
        if (m->learningRate > 0) addCounter({m->stamp.lane, "learning rate", m->stamp.wallTimeUs, {{"value", m->learningRate}}});
    } else if (const auto* r = std::get_if<RunStateEvent>(&e)) {
        SpanEvent i;
        i.stamp = r->stamp;
        i.name = std::string("run ") + runStateName(r->state);
        i.category = "run";
        i.startUs = r->stamp.wallTimeUs;
        if (!r->message.empty()) i.args["message"] = r->message;
        addInstant(i);
    } else if (const auto* er = std::get_if<ErrorEvent>(&e)) {
        SpanEvent i;
        i.stamp = er->stamp;
        i.name = "error";
        i.category = "error";
        i.startUs = er->stamp.wallTimeUs;
        i.args = {{"message", er->message}, {"hint", er->hint}, {"where", er->where}};
        addInstant(i);
    }
}

Status ChromeTraceWriter::finish()
{
    if (m_finished) return makeError(ErrorCode::InvalidArgument, "the trace " + m_path + " was already written");
    m_finished = true;
    // Processes: one per worker, numbered in order of appearance.
    std::map<std::string, int> pidOf;
    std::vector<std::string> workers;
    for (const Lane& l : m_lanes)
        if (pidOf.emplace(l.worker, static_cast<int>(workers.size()) + 1).second) workers.push_back(l.worker);

    // Per lane: spans sorted by start (longer first), each placed on the first sub-track where it
    // nests or follows; a span that would overlap without nesting opens another sub-track.
    std::vector<std::vector<uint32_t>> byLane(m_lanes.size());
    for (uint32_t i = 0; i < m_spans.size(); ++i) byLane[m_spans[i].lane].push_back(i);
    std::vector<uint32_t> subOf(m_spans.size(), 0);
    std::vector<uint32_t> subCount(m_lanes.size(), 1);
    for (std::size_t l = 0; l < m_lanes.size(); ++l) {
        auto& idx = byLane[l];
        std::stable_sort(idx.begin(), idx.end(), [&](uint32_t a, uint32_t b) {
            const Rec& x = m_spans[a];
            const Rec& y = m_spans[b];
            if (x.startUs != y.startUs) return x.startUs < y.startUs;
            return x.durationUs > y.durationUs;
        });
        std::vector<std::vector<int64_t>> stacks(1);
        for (uint32_t i : idx) {
            const Rec& r = m_spans[i];
            const int64_t end = r.startUs + r.durationUs;
            std::size_t k = 0;
            for (;; ++k) {
                if (k == stacks.size()) stacks.emplace_back();
                auto& st = stacks[k];
                while (!st.empty() && st.back() <= r.startUs) st.pop_back();
                if (st.empty() || end <= st.back()) {
                    st.push_back(end);
                    break;
                }
            }
            subOf[i] = static_cast<uint32_t>(k);
        }
        subCount[l] = static_cast<uint32_t>(stacks.size());
    }
    // Threads: a tid per (lane, sub-track), numbered within the process.
    std::vector<std::vector<int>> tidOf(m_lanes.size());
    std::map<int, int> nextTid;
    for (std::size_t l = 0; l < m_lanes.size(); ++l) {
        const int pid = pidOf[m_lanes[l].worker];
        for (uint32_t k = 0; k < subCount[l]; ++k) tidOf[l].push_back(++nextTid[pid]);
    }

    std::string out;
    out.reserve(256 + m_spans.size() * 160);
    out += "{\"traceEvents\":[\n";
    bool first = true;
    auto begin = [&] {
        if (!first) out += ",\n";
        first = false;
    };
    for (const std::string& w : workers) {
        const int pid = pidOf[w];
        begin();
        out += "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + std::to_string(pid) + ",\"tid\":0,\"args\":{\"name\":";
        appendJsonString(out, w);
        out += "}}";
        begin();
        out += "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":" + std::to_string(pid) +
               ",\"tid\":0,\"args\":{\"sort_index\":" + std::to_string(pid) + "}}";
    }
    for (std::size_t l = 0; l < m_lanes.size(); ++l) {
        const Lane& lane = m_lanes[l];
        const int pid = pidOf[lane.worker];
        for (uint32_t k = 0; k < subCount[l]; ++k) {
            const int tid = tidOf[l][k];
            std::string label = threadLabel(lane);
            if (k > 0) label += " (overlap " + std::to_string(k) + ")";
            begin();
            out += "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" + std::to_string(pid) + ",\"tid\":" + std::to_string(tid) +
                   ",\"args\":{\"name\":";
            appendJsonString(out, label);
            // Our own lane fields, so that re-import restores lanes exactly (viewers ignore them).
            out += ",\"ts_worker\":";
            appendJsonString(out, lane.worker);
            out += ",\"ts_device\":";
            appendJsonString(out, lane.device);
            out += ",\"ts_thread\":";
            appendJsonString(out, lane.thread);
            out += "}}";
            begin();
            out += "{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":" + std::to_string(pid) + ",\"tid\":" +
                   std::to_string(tid) + ",\"args\":{\"sort_index\":" + std::to_string(tid) + "}}";
        }
    }
    auto appendArgs = [&](const Rec& r) {
        out += ",\"args\":{\"step\":" + std::to_string(r.step);
        if (r.args >= 0)
            for (const auto& [k, v] : m_args[static_cast<std::size_t>(r.args)]) {
                if (k == "step") continue;
                out += ',';
                appendJsonString(out, k);
                out += ':';
                appendJsonString(out, v);
            }
        out += '}';
    };
    for (std::size_t l = 0; l < m_lanes.size(); ++l) {
        const int pid = pidOf[m_lanes[l].worker];
        for (uint32_t i : byLane[l]) {
            const Rec& r = m_spans[i];
            begin();
            out += "{\"ph\":\"X\",\"name\":";
            appendJsonString(out, m_strings[r.name]);
            out += ",\"cat\":";
            appendJsonString(out, m_strings[r.category]);
            out += ",\"ts\":" + std::to_string(r.startUs) + ",\"dur\":" + std::to_string(r.durationUs) +
                   ",\"pid\":" + std::to_string(pid) + ",\"tid\":" + std::to_string(tidOf[l][subOf[i]]);
            appendArgs(r);
            out += '}';
        }
    }
    for (const Rec& r : m_instants) {
        begin();
        out += "{\"ph\":\"i\",\"s\":\"t\",\"name\":";
        appendJsonString(out, m_strings[r.name]);
        out += ",\"cat\":";
        appendJsonString(out, m_strings[r.category]);
        out += ",\"ts\":" + std::to_string(r.startUs) + ",\"pid\":" + std::to_string(pidOf[m_lanes[r.lane].worker]) +
               ",\"tid\":" + std::to_string(tidOf[r.lane][0]);
        appendArgs(r);
        out += '}';
    }
    for (const TraceCounter& c : m_counters) {
        const uint32_t l = m_laneIndex.at(laneKey(c.lane));
        begin();
        out += "{\"ph\":\"C\",\"name\":";
        appendJsonString(out, c.name);
        out += ",\"ts\":" + std::to_string(c.timeUs) + ",\"pid\":" + std::to_string(pidOf[c.lane.worker]) +
               ",\"tid\":" + std::to_string(tidOf[l][0]) + ",\"args\":{";
        bool firstArg = true;
        for (const auto& [k, v] : c.values) {
            if (!std::isfinite(v)) continue;
            if (!firstArg) out += ',';
            firstArg = false;
            appendJsonString(out, k);
            out += ':';
            appendNumber(out, v);
        }
        out += "}}";
    }
    out += "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"producer\":";
    appendJsonString(out, kProducer);
    for (const auto& [k, v] : m_metadata) {
        if (k == "producer") continue;
        out += ',';
        appendJsonString(out, k);
        out += ':';
        appendJsonString(out, v);
    }
    out += "}}\n";

    if (m_path.empty()) {
        m_memory = std::move(out);
        return okStatus();
    }
    {
        std::ofstream f(m_tmpPath, std::ios::binary | std::ios::trunc);
        if (!f) return makeError(ErrorCode::IoError, "cannot write the trace file " + m_tmpPath);
        f.write(out.data(), static_cast<std::streamsize>(out.size()));
        f.flush();
        if (!f) return makeError(ErrorCode::IoError, "writing the trace file " + m_tmpPath + " failed", "check free disk space");
    }
    std::error_code ec;
    std::filesystem::rename(m_tmpPath, m_path, ec);
    if (ec) return makeError(ErrorCode::IoError, "cannot move " + m_tmpPath + " to " + m_path + ": " + ec.message());
    return okStatus();
}

namespace {
void fill(ChromeTraceWriter& w, const Trace& t)
{
    for (const auto& [k, v] : t.metadata) w.setMetadata(k, v);
    for (const auto& s : t.spans) w.addSpan(s);
    for (const auto& i : t.instants) w.addInstant(i);
    for (const auto& c : t.counters) w.addCounter(c);
}
} // namespace

Status writeChromeTrace(const Trace& trace, const std::string& path)
{
    TS_ASSIGN(auto w, ChromeTraceWriter::create(path));
    fill(*w, trace);
    return w->finish();
}

nlohmann::json toChromeJson(const Trace& trace)
{
    ChromeTraceWriter w;
    fill(w, trace);
    (void)w.finish();  // in memory: cannot fail
    return nlohmann::json::parse(w.m_memory);
}

// ---------------------------------------------------------------------------------------------
// Reader

namespace {

bool numberOf(const nlohmann::json& j, double* out)
{
    if (j.is_number()) {
        *out = j.get<double>();
        return std::isfinite(*out);
    }
    if (j.is_string()) {
        const std::string& s = j.get_ref<const std::string&>();
        if (s.empty()) return false;
        char* end = nullptr;
        *out = std::strtod(s.c_str(), &end);
        return end && *end == '\0' && std::isfinite(*out);
    }
    return false;
}

// pid/tid may be numbers or strings ("CPU functions", "stream 7"); keep them as text.
std::string idOf(const nlohmann::json& e, const char* key)
{
    auto it = e.find(key);
    if (it == e.end() || it->is_null()) return "";
    if (it->is_string()) return it->get<std::string>();
    if (it->is_number_integer()) return std::to_string(it->get<int64_t>());
    if (it->is_number()) {
        double d = it->get<double>();
        if (d == std::floor(d)) return std::to_string(static_cast<int64_t>(d));
    }
    return it->dump();
}

std::string argText(const nlohmann::json& v)
{
    if (v.is_string()) return v.get<std::string>();
    return v.dump();
}

// "GPU 0", "/device:GPU:1", "/device:TPU:0" -> "gpu:0" ...; "" when the name names no device.
std::string deviceFromName(const std::string& name)
{
    for (const char* kind : {"GPU", "TPU"}) {
        auto p = name.find(kind);
        if (p == std::string::npos) continue;
        std::size_t q = p + 3;
        while (q < name.size() && (name[q] == ' ' || name[q] == ':')) ++q;
        std::size_t r = q;
        while (r < name.size() && std::isdigit(static_cast<unsigned char>(name[r]))) ++r;
        if (r > q) {
            std::string k = kind;
            std::transform(k.begin(), k.end(), k.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
            return k + ":" + name.substr(q, r - q);
        }
    }
    return "";
}

struct Open {
    std::string name, category;
    double ts = 0;
    nlohmann::json args;
    std::size_t index = 0;
};

std::string where(const std::string& source, std::size_t index, const std::string& ph)
{
    return source + ": event " + std::to_string(index) + (ph.empty() ? "" : " (ph \"" + ph + "\")");
}

} // namespace

namespace {

constexpr double kMaxTraceMicros = 9007199254740992.0;  // 2^53

// Builds a Trace from the entries of traceEvents one at a time, so a reader can hand each event
// over as soon as it is parsed and drop it (a 100 MB trace held as a JSON tree took 16x its size).
class TraceBuilder {
public:
    explicit TraceBuilder(const std::string& source) { m_t.source = source; }

    // A top-level field of the object form besides traceEvents.
    void topLevel(const std::string& key, const nlohmann::json& v)
    {
        if (key == "otherData" && v.is_object()) {
            for (auto o = v.begin(); o != v.end(); ++o) m_t.metadata[o.key()] = argText(*o);
        } else if (key == "deviceProperties" && v.is_array()) {
            std::string names;
            for (const auto& d : v)
                if (d.is_object() && d.contains("name")) names += (names.empty() ? "" : ", ") + argText(d["name"]);
            m_t.metadata["deviceProperties"] = names;
        } else if (v.is_primitive()) {
            m_t.metadata[key] = argText(v);
        }
    }

    // The next entry of traceEvents. After an error the builder stays failed: later entries are
    // counted and otherwise ignored, and finish() returns the error.
    void event(const nlohmann::json& e)
    {
        const std::size_t i = m_index++;
        if (!m_error) {
            Status st = take(e, i);
            if (!st.ok()) m_error = st.takeError();
        }
    }

    Result<Trace> finish(bool arrayForm);

private:
    using Key = std::pair<std::string, std::string>;  // (pid, tid)

    // Threads are interned: spans keep an index, and their lanes are resolved once at the end.
    int32_t laneIndex(const std::string& pid, const std::string& tid)
    {
        auto [it, added] = m_laneIndex.try_emplace(Key{pid, tid}, static_cast<int32_t>(m_laneKeys.size()));
        if (added) m_laneKeys.push_back(it->first);
        return it->second;
    }

    SpanEvent toSpan(const std::string& name, const std::string& cat, double ts, double dur, const nlohmann::json* args) const
    {
        SpanEvent s;
        s.name = name;
        s.category = cat;
        s.startUs = std::llround(ts);
        s.durationUs = std::max<int64_t>(0, std::llround(ts + dur) - s.startUs);
        s.stamp.wallTimeUs = s.startUs;
        if (args && args->is_object())
            for (auto a = args->begin(); a != args->end(); ++a) s.args[a.key()] = argText(*a);
        return s;
    }

    void addSpan(SpanEvent s, const std::string& pid, const std::string& tid)
    {
        m_t.spans.push_back(std::move(s));
        m_spanLanes.push_back(laneIndex(pid, tid));
    }

    Status take(const nlohmann::json& e, std::size_t i);

    Trace m_t;
    std::size_t m_index = 0;
    std::optional<Error> m_error;
    std::map<Key, int32_t> m_laneIndex;
    std::vector<Key> m_laneKeys;
    std::vector<int32_t> m_spanLanes, m_instantLanes, m_counterLanes;  // parallel to m_t's vectors
    std::map<std::string, std::string> m_processName, m_processLabel;
    std::map<Key, std::string> m_threadName;
    std::map<Key, Lane> m_ownLane;  // our ts_* thread args
    std::map<Key, std::vector<Open>> m_open;
    double m_maxTs = 0;
    bool m_sawPyTorchStep = false, m_sawHorovod = false;
};

Status TraceBuilder::take(const nlohmann::json& e, std::size_t i)
{
    const std::string& source = m_t.source;
    if (e.is_object() && e.empty()) {  // TensorBoard's trace viewer ends traceEvents with {}
        ++m_t.ignored["{}"];
        return okStatus();
    }
    if (!e.is_object())
        return makeError(ErrorCode::ParseError, where(source, i, "") + ": not a JSON object",
                         "every entry of traceEvents must be an object with at least \"ph\"");
    auto phIt = e.find("ph");
    if (phIt == e.end() || !phIt->is_string() || phIt->get_ref<const std::string&>().empty())
        return makeError(ErrorCode::ParseError, where(source, i, "") + ": no \"ph\" (phase) string",
                         "each event needs \"ph\": \"X\", \"B\", \"E\", \"i\", \"C\" or \"M\"");
    const std::string ph = phIt->get<std::string>();
    const std::string name = e.contains("name") ? argText(e["name"]) : std::string();
    const std::string cat = e.contains("cat") ? argText(e["cat"]) : std::string();
    const nlohmann::json* args = e.contains("args") ? &e["args"] : nullptr;
    auto needTs = [&](double* ts) -> Status {
        auto it = e.find("ts");
        if (it == e.end() || !numberOf(*it, ts))
            return makeError(ErrorCode::ParseError, where(source, i, ph) + ": no numeric \"ts\"", "timestamps are microseconds, as numbers");
        // Beyond 2^53 us, microseconds are no longer exact and the span arithmetic overflows.
        if (std::fabs(*ts) > kMaxTraceMicros)
            return makeError(ErrorCode::ParseError, where(source, i, ph) + ": \"ts\" " + std::to_string(*ts) + " us is beyond 2^53 us",
                             "timestamps are microseconds (a trace from 1970 on is about 1.7e15); this one is not a time");
        m_maxTs = std::max(m_maxTs, *ts);
        return okStatus();
    };
    const std::string pid = idOf(e, "pid"), tid = idOf(e, "tid");

    if (ph == "X") {
        double ts = 0, dur = 0;
        TS_TRY(needTs(&ts));
        auto d = e.find("dur");
        if (d == e.end() || !numberOf(*d, &dur))
            return makeError(ErrorCode::ParseError, where(source, i, ph) + ": no numeric \"dur\"",
                             "complete (X) events need a duration in microseconds");
        if (dur < 0)
            return makeError(ErrorCode::ParseError, where(source, i, ph) + ": negative \"dur\" " + std::to_string(dur),
                             "durations are microseconds >= 0; the profiler that wrote it is at fault, or the file was edited");
        if (dur > kMaxTraceMicros)
            return makeError(ErrorCode::ParseError, where(source, i, ph) + ": \"dur\" " + std::to_string(dur) + " us is beyond 2^53 us",
                             "durations are microseconds; this one is over 285 years");
        m_maxTs = std::max(m_maxTs, ts + dur);
        addSpan(toSpan(name, cat, ts, dur, args), pid, tid);
    } else if (ph == "B") {
        double ts = 0;
        TS_TRY(needTs(&ts));
        m_open[{pid, tid}].push_back({name, cat, ts, args ? *args : nlohmann::json(), i});
    } else if (ph == "E") {
        double ts = 0;
        TS_TRY(needTs(&ts));
        auto& stack = m_open[{pid, tid}];
        if (stack.empty())
            return makeError(ErrorCode::ParseError, where(source, i, ph) + ": an end event with no open \"B\" on pid " + pid + ", tid " + tid,
                             "B and E events pair up per pid and tid, innermost first");
        Open b = std::move(stack.back());
        stack.pop_back();
        if (ts < b.ts)
            return makeError(ErrorCode::ParseError, where(source, i, ph) + ": ends at " + std::to_string(ts) + " before its B (event " +
                                                        std::to_string(b.index) + ") begins");
        if (args && args->is_object())
            for (auto a = args->begin(); a != args->end(); ++a) b.args[a.key()] = *a;  // Chrome merges E's args
        addSpan(toSpan(b.name, b.category, b.ts, ts - b.ts, &b.args), pid, tid);
    } else if (ph == "i" || ph == "I") {
        double ts = 0;
        TS_TRY(needTs(&ts));
        m_t.instants.push_back(toSpan(name, cat, ts, 0, args));
        m_instantLanes.push_back(laneIndex(pid, tid));
    } else if (ph == "C") {
        double ts = 0;
        TS_TRY(needTs(&ts));
        TraceCounter c;
        c.name = name;
        if (e.contains("id")) c.name += " " + argText(e["id"]);
        c.timeUs = std::llround(ts);
        if (args && args->is_object())
            for (auto a = args->begin(); a != args->end(); ++a) {
                double v = 0;
                if (numberOf(*a, &v)) c.values[a.key()] = v;
            }
        m_t.counters.push_back(std::move(c));
        m_counterLanes.push_back(laneIndex(pid, tid));
    } else if (ph == "M") {
        const std::string value = args && args->is_object() && args->contains("name") ? argText((*args)["name"]) : "";
        if (name == "process_name") {
            m_processName[pid] = value;
        } else if (name == "process_labels") {
            if (args && args->is_object() && args->contains("labels")) m_processLabel[pid] = argText((*args)["labels"]);
        } else if (name == "thread_name") {
            m_threadName[{pid, tid}] = value;
            if (args && args->is_object() && args->contains("ts_worker"))
                m_ownLane[{pid, tid}] = Lane{argText((*args)["ts_worker"]), args->contains("ts_device") ? argText((*args)["ts_device"]) : "",
                                             args->contains("ts_thread") ? argText((*args)["ts_thread"]) : ""};
        }
    } else {
        ++m_t.ignored[ph];
    }
    if (name.rfind("ProfilerStep#", 0) == 0) m_sawPyTorchStep = true;
    if (name == "NEGOTIATE_ALLREDUCE" || name == "NCCL_ALLREDUCE" || name == "MPI_ALLREDUCE" || name == "NEGOTIATE_ALLGATHER" ||
        name == "NEGOTIATE_BROADCAST")
        m_sawHorovod = true;
    return okStatus();
}

Result<Trace> TraceBuilder::finish(bool arrayForm)
{
    if (m_error) return *m_error;
    m_t.eventCount = static_cast<int64_t>(m_index);
    for (auto& [key, stack] : m_open) {
        for (auto& b : stack) {
            m_t.warnings.push_back(where(m_t.source, b.index, "B") + " \"" + b.name + "\" has no matching E; closed at the end of the trace");
            SpanEvent s = toSpan(b.name, b.category, b.ts, std::max(0.0, m_maxTs - b.ts), &b.args);
            s.args["unterminated"] = "true";
            addSpan(std::move(s), key.first, key.second);
        }
    }

    // Format, for the summary's heuristics and the user.
    const auto producer = m_t.metadata.find("producer");
    const bool ours = producer != m_t.metadata.end() && producer->second.rfind("TrainStudio", 0) == 0;
    bool tensorflow = false;
    for (const auto& [pid, pname] : m_processName)
        if (pname.rfind("/device:", 0) == 0 || pname.rfind("/host:", 0) == 0 || pname.rfind("/job:", 0) == 0) tensorflow = true;
    for (const auto& [key, tname] : m_threadName)
        if (tname == "Steps" || tname == "TensorFlow Ops" || tname == "TensorFlow Name Scope") tensorflow = true;
    if (ours) m_t.format = "trainstudio";
    else if (m_t.metadata.count("schemaVersion") || m_t.metadata.count("deviceProperties")) m_t.format = "pytorch";
    else if (m_sawPyTorchStep) m_t.format = arrayForm ? "pytorch-legacy" : "pytorch";
    else if (tensorflow) m_t.format = "tensorflow";
    else if (m_sawHorovod) m_t.format = "horovod";
    else m_t.format = "chrome";

    std::vector<Lane> lanes;
    lanes.reserve(m_laneKeys.size());
    for (const auto& [pid, tid] : m_laneKeys) {
        auto own = m_ownLane.find({pid, tid});
        if (own != m_ownLane.end()) {
            lanes.push_back(own->second);
            continue;
        }
        Lane l;
        auto pn = m_processName.find(pid);
        const bool numericPid = !pid.empty() && std::all_of(pid.begin(), pid.end(), [](unsigned char c) { return std::isdigit(c); });
        l.worker = pn != m_processName.end() && !pn->second.empty() ? pn->second : (numericPid ? "pid " + pid : pid);
        auto label = m_processLabel.find(pid);
        l.device = deviceFromName(label != m_processLabel.end() ? label->second : l.worker);
        auto tn = m_threadName.find({pid, tid});
        const bool numericTid = !tid.empty() && std::all_of(tid.begin(), tid.end(), [](unsigned char c) { return std::isdigit(c); });
        l.thread = tn != m_threadName.end() && !tn->second.empty() ? tn->second : (numericTid ? "tid " + tid : tid);
        lanes.push_back(std::move(l));
    }
    const auto rid = m_t.metadata.find("run_id");
    auto finishSpan = [&](SpanEvent& s, int32_t lane) {
        s.stamp.lane = lanes[static_cast<std::size_t>(lane)];
        if (ours) {
            if (rid != m_t.metadata.end()) s.stamp.runId = rid->second;
            auto st = s.args.find("step");
            if (st != s.args.end()) {
                s.stamp.step = std::strtoll(st->second.c_str(), nullptr, 10);
                s.args.erase(st);
            }
        }
    };
    for (std::size_t k = 0; k < m_t.spans.size(); ++k) finishSpan(m_t.spans[k], m_spanLanes[k]);
    for (std::size_t k = 0; k < m_t.instants.size(); ++k) finishSpan(m_t.instants[k], m_instantLanes[k]);
    for (std::size_t k = 0; k < m_t.counters.size(); ++k) m_t.counters[k].lane = lanes[static_cast<std::size_t>(m_counterLanes[k])];
    std::stable_sort(m_t.spans.begin(), m_t.spans.end(), [](const SpanEvent& a, const SpanEvent& b) {
        if (a.startUs != b.startUs) return a.startUs < b.startUs;
        return a.durationUs > b.durationUs;
    });
    return std::move(m_t);
}

Error notATraceObject(const std::string& source)
{
    return makeError(ErrorCode::ParseError, source + ": not a Chrome trace: the object has no \"traceEvents\" array",
                     "export a Chrome trace (Trace Event Format) from the profiler, e.g. torch.profiler's export_chrome_trace()");
}

Error notATrace(const std::string& source)
{
    return makeError(ErrorCode::ParseError, source + ": not a Chrome trace: expected an array of events or an object with \"traceEvents\"");
}

// Parses `text` and feeds the entries of traceEvents to `b` as the parser completes them; they
// are dropped from the document at once, so only the top-level fields stay in memory.
nlohmann::json parseFeeding(const std::string& text, TraceBuilder& b, bool* arrayForm, bool* sawEvents)
{
    using Event = nlohmann::json::parse_event_t;
    int entryDepth = -1;  // the depth the parser reports for entries of traceEvents while inside it
    std::string topKey;
    auto callback = [&](int depth, Event ev, nlohmann::json& parsed) -> bool {
        if (depth == 0 && ev == Event::array_start) {
            *arrayForm = true;
            *sawEvents = true;
            entryDepth = 1;
        } else if (depth == 1 && ev == Event::key && entryDepth < 0) {
            topKey = parsed.get<std::string>();
        } else if (depth == 1 && ev == Event::array_start && topKey == "traceEvents" && !*arrayForm) {
            *sawEvents = true;
            entryDepth = 2;
        } else if (entryDepth > 0 && depth == entryDepth &&
                   (ev == Event::object_end || ev == Event::value || ev == Event::array_end)) {
            b.event(parsed);
            return false;  // handed over: not kept in the document
        } else if (entryDepth == 2 && depth == 1 && ev == Event::array_end) {
            entryDepth = -1;  // traceEvents closed; other top-level keys follow
            topKey.clear();
        }
        return true;
    };
    return nlohmann::json::parse(text, callback);
}

} // namespace

Result<Trace> parseChromeTrace(const nlohmann::json& doc, const std::string& source)
{
    TraceBuilder b(source);
    if (doc.is_array()) {
        for (const auto& e : doc) b.event(e);
        return b.finish(true);
    }
    if (!doc.is_object()) return notATrace(source);
    auto it = doc.find("traceEvents");
    if (it == doc.end() || !it->is_array()) return notATraceObject(source);
    for (auto m = doc.begin(); m != doc.end(); ++m)
        if (m.key() != "traceEvents") b.topLevel(m.key(), *m);
    for (const auto& e : *it) b.event(e);
    return b.finish(false);
}

Result<Trace> parseChromeTraceText(const std::string& text, const std::string& source)
{
    // Nesting too deep to walk later is refused before parsing.
    TS_TRY(checkJsonDepth(text, source));
    TraceBuilder b(source);
    bool arrayForm = false, sawEvents = false;
    try {
        const nlohmann::json doc = parseFeeding(text, b, &arrayForm, &sawEvents);  // throws on bad JSON
        if (arrayForm) return b.finish(true);
        if (!doc.is_object()) return notATrace(source);
        if (!sawEvents) return notATraceObject(source);
        for (auto m = doc.begin(); m != doc.end(); ++m)
            if (m.key() != "traceEvents") b.topLevel(m.key(), *m);
        return b.finish(false);
    } catch (const nlohmann::json::out_of_range& e) {
        // "[json.exception.out_of_range.406] number overflow parsing '1e400'": the library's tag dropped.
        std::string what = e.what();
        if (const auto p = what.find("] "); p != std::string::npos) what = what.substr(p + 2);
        return makeError(ErrorCode::ParseError, source + ": " + what, "numbers must fit a double (below about 1.8e308)");
    } catch (const nlohmann::json::parse_error& e) {
        // A timeline written incrementally (Horovod, Chrome) lacks its closing bracket, or ends
        // inside its last event, when the job was killed; chrome://tracing reads what is there,
        // and so do we: the events the parser completed before the end were handed over already
        // (one pass; no second parse of a repaired copy).
        const auto lastChar = text.find_last_not_of(" \t\r\n");
        // e.byte counts the characters read, the end of input included: a syntax error on the
        // last character is at lastChar + 1, an unexpected end of input beyond it.
        if (arrayForm && lastChar != std::string::npos && e.byte > lastChar + 1) {
            auto t = b.finish(true);
            if (t.ok())
                t->warnings.insert(t->warnings.begin(), source + ": the file ends before its closing ']' (a timeline cut off while "
                                                                 "being written); read the complete events before the end");
            return t;
        }
        auto [line, col] = jsonLineColumn(text, e.byte);
        std::string what = e.what();
        const auto p = what.find("parse error");
        if (p != std::string::npos) what = what.substr(p);
        return makeError(ErrorCode::ParseError,
                         source + ": not valid JSON at line " + std::to_string(line) + ", column " + std::to_string(col) + " (" + what + ")",
                         "the file is truncated or not a Chrome trace");
    }
}

Result<Trace> readChromeTrace(const std::string& path)
{
    if (!std::filesystem::exists(path))
        return makeError(ErrorCode::NotFound, "trace file " + path + " does not exist", missingFileHint(path));
    if (std::filesystem::is_directory(path))
        return makeError(ErrorCode::InvalidArgument, path + " is a folder, not a trace file",
                         "name the .json or .json.gz file inside it (a TensorBoard profile keeps it under plugins/profile/<run>/)");
    // gzread reads plain files unchanged, so .json and .json.gz take the same path.
    gzFile f = gzopen(path.c_str(), "rb");
    if (!f) return makeError(ErrorCode::IoError, "cannot open the trace file " + path);
    std::string text;
    char buf[1 << 16];
    for (;;) {
        const int n = gzread(f, buf, sizeof buf);
        if (n < 0) {
            int err = 0;
            std::string msg = gzerror(f, &err);
            gzclose(f);
            return makeError(ErrorCode::IoError, "reading " + path + " failed: " + msg, "the gzip file may be truncated");
        }
        if (n == 0) break;
        text.append(buf, static_cast<std::size_t>(n));
    }
    gzclose(f);
    if (text.find_first_not_of(" \t\r\n") == std::string::npos)
        return makeError(ErrorCode::ParseError, path + ": the file is empty", "the profiler may not have written the trace");
    return parseChromeTraceText(text, path);
}

} // namespace ts::telemetry
