// Chrome traces: export validated by re-import, the Perfetto no-overlap rule, import of real
// and tool-shaped fixtures (PyTorch legacy and Kineto, TensorFlow, a cut-off Horovod timeline),
// B/E pairing, malformed input naming file and event, the trace summary, a traced Trainer run
// written through TraceFileSink, and the CLI's `trace summary` / `train --trace`.

#include <QtTest>

#include <QProcess>

#include <filesystem>
#include <fstream>
#include <set>

#include "data/dataset.h"
#include "telemetry/bus.h"
#include "telemetry/chrome_trace.h"
#include "telemetry/trace_sink.h"
#include "telemetry/trace_summary.h"
#include "train/trainer.h"

using namespace ts;
using namespace ts::telemetry;

namespace {

const std::string kTraces = std::string(TS_FIXTURES_DIR) + "/traces/";

std::filesystem::path scratch(const std::string& name)
{
    auto dir = std::filesystem::path(TS_BUILD_DIR) / "tst_chrome_trace";
    std::filesystem::create_directories(dir);
    return dir / name;
}

std::string writeText(const std::string& name, const std::string& text)
{
    const auto p = scratch(name);
    std::ofstream(p, std::ios::binary) << text;
    return p.string();
}

SpanEvent span(const Lane& lane, const std::string& name, const std::string& cat, int64_t start, int64_t dur, int64_t step,
               std::map<std::string, std::string> args = {})
{
    SpanEvent s;
    s.stamp.runId = "run-7";
    s.stamp.lane = lane;
    s.stamp.step = step;
    s.stamp.wallTimeUs = start;
    s.name = name;
    s.category = cat;
    s.startUs = start;
    s.durationUs = dur;
    s.args = std::move(args);
    return s;
}

using SpanKey = std::tuple<std::string, std::string, std::string, std::string, std::string, int64_t, int64_t, int64_t,
                           std::map<std::string, std::string>>;
SpanKey keyOf(const SpanEvent& s)
{
    return {s.name, s.category, s.stamp.lane.worker, s.stamp.lane.device, s.stamp.lane.thread, s.startUs, s.durationUs,
            s.stamp.step, s.args};
}

// Perfetto's rule: on one (pid, tid), X events either nest or do not overlap.
bool properlyNested(const nlohmann::json& doc, std::string* why)
{
    std::map<std::pair<int64_t, int64_t>, std::vector<std::pair<int64_t, int64_t>>> byTid;
    for (const auto& e : doc["traceEvents"])
        if (e["ph"] == "X") byTid[{e["pid"].get<int64_t>(), e["tid"].get<int64_t>()}].push_back({e["ts"], e["dur"]});
    for (auto& [tid, v] : byTid) {
        std::sort(v.begin(), v.end(), [](auto a, auto b) { return a.first != b.first ? a.first < b.first : a.second > b.second; });
        std::vector<int64_t> ends;
        for (auto [ts, dur] : v) {
            while (!ends.empty() && ends.back() <= ts) ends.pop_back();
            if (!ends.empty() && ts + dur > ends.back()) {
                *why = "pid " + std::to_string(tid.first) + " tid " + std::to_string(tid.second) + " at " + std::to_string(ts);
                return false;
            }
            ends.push_back(ts + dur);
        }
    }
    return true;
}

struct CliResult {
    int code;
    QString out, err;
};

CliResult runCli(const QStringList& args, int timeoutMs = 120000)
{
    QProcess p;
    p.start(QStringLiteral(TS_CLI_PATH), args);
    if (!p.waitForFinished(timeoutMs)) {
        p.kill();
        p.waitForFinished();
        return {-1, {}, "timeout"};
    }
    return {p.exitStatus() == QProcess::NormalExit ? p.exitCode() : -2, QString::fromUtf8(p.readAllStandardOutput()),
            QString::fromUtf8(p.readAllStandardError())};
}

const FindingEvent* findKind(const std::vector<FindingEvent>& fs, const std::string& kind)
{
    for (const auto& f : fs)
        if (f.kind == kind) return &f;
    return nullptr;
}

double partSum(const StepBreakdownEvent& b) { return b.input + b.forward + b.backward + b.communication + b.optimizer + b.other; }

} // namespace

class TestChromeTrace : public QObject {
    Q_OBJECT
private slots:
    void exportReimportSameSpans();
    void writerTurnsEventsIntoCountersAndInstants();
    void pytorchLegacyFixture();
    void pytorchKinetoFixture();
    void tensorflowFixture();
    void horovodTimelineCutOff();
    void cutOffInsideAnEvent();
    void beginEndPairing();
    void topLevelFieldsAroundStreamedEvents();
    void malformedTraces_data();
    void malformedTraces();
    void gzipTrace();
    void tracedTrainerRunRoundTrip();
    void cliTraceSummary();
    void cliTrainWritesTrace();
};

void TestChromeTrace::exportReimportSameSpans()
{
    const Lane r0{"local", "cpu:0", "replica 0"}, r1{"local", "cpu:1", "replica 1"}, w{"worker:1", "gpu:0", "main"};
    Trace t;
    t.metadata["run_id"] = "run-7";
    t.spans = {
        span(r0, "step", "step", 1000, 900, 1),
        span(r0, "forward", "forward", 1010, 300, 1),
        span(r0, "forward/dense", "forward", 1020, 100, 1, {{"rows", "32"}}),
        span(r0, "backward", "backward", 1320, 400, 1),
        // Overlaps "backward" without nesting: must land on its own tid.
        span(r0, "odd \"quoted\"\tname", "other", 1700, 100, 1, {{"note", "line\nbreak \\ slash"}}),
        span(r1, "forward", "forward", 1005, 310, 1),
        span(r1, "all-reduce", "communication", 1400, 50, 1),
        span(w, "kernel", "forward", 2000, 0, 2),
    };
    TraceCounter c{r0, "host utilisation %", 1500, {{"all", 55.5}, {"cpu0", 80.25}}};
    t.counters = {c};
    SpanEvent inst = span(r1, "run completed", "run", 2500, 0, 2);
    t.instants = {inst};
    const std::string path = scratch("roundtrip.json").string();
    QVERIFY(writeChromeTrace(t, path).ok());
    QVERIFY(!std::filesystem::exists(path + ".part"));

    // The document: Chrome's shape, metadata, no improper overlap on any tid.
    std::ifstream in(path);
    const nlohmann::json doc = nlohmann::json::parse(in);
    QCOMPARE(doc["displayTimeUnit"].get<std::string>(), std::string("ms"));
    QVERIFY(doc["traceEvents"].is_array());
    std::string why;
    QVERIFY2(properlyNested(doc, &why), why.c_str());
    std::set<std::string> threadNames;
    std::set<int64_t> pids;
    for (const auto& e : doc["traceEvents"]) {
        if (e["ph"] == "M" && e["name"] == "thread_name") threadNames.insert(e["args"]["name"].get<std::string>());
        if (e["ph"] == "M" && e["name"] == "process_name") pids.insert(e["pid"].get<int64_t>());
    }
    QCOMPARE(pids.size(), std::size_t(2));  // one process per worker
    QVERIFY(threadNames.count("cpu:0 replica 0") && threadNames.count("cpu:0 replica 0 (overlap 1)"));
    QVERIFY(threadNames.count("cpu:1 replica 1") && threadNames.count("gpu:0 main"));

    auto back = readChromeTrace(path);
    QVERIFY2(back.ok(), back.ok() ? "" : back.error().toString().c_str());
    QCOMPARE(back->format, std::string("trainstudio"));
    QCOMPARE(back->spans.size(), t.spans.size());
    std::multiset<SpanKey> a, b;
    for (const auto& s : t.spans) a.insert(keyOf(s));
    for (const auto& s : back->spans) {
        b.insert(keyOf(s));
        QCOMPARE(s.stamp.runId, std::string("run-7"));
    }
    QVERIFY(a == b);
    QCOMPARE(back->counters.size(), std::size_t(1));
    QCOMPARE(back->counters[0].name, c.name);
    QCOMPARE(back->counters[0].timeUs, c.timeUs);
    QVERIFY(back->counters[0].values == c.values);
    QVERIFY(back->counters[0].lane == r0);
    QCOMPARE(back->instants.size(), std::size_t(1));
    QCOMPARE(back->instants[0].name, inst.name);
    QVERIFY(back->instants[0].stamp.lane == r1);
    QVERIFY(back->warnings.empty());
    // In memory, the same document.
    QCOMPARE(toChromeJson(t)["traceEvents"].size(), doc["traceEvents"].size());
}

void TestChromeTrace::writerTurnsEventsIntoCountersAndInstants()
{
    const std::string path = scratch("events.json").string();
    auto w = ChromeTraceWriter::create(path);
    QVERIFY(w.ok());
    DeviceSampleEvent host;
    host.stamp = Stamp{"run-9", 3, 5000, Lane{"local", "", "sampler"}};
    host.utilisation = 0.5;
    host.perCore = {0.25, 0.75};
    host.processCpu = 1.5;
    host.memoryUsed = 100 << 20;
    host.memoryTotal = 1000 << 20;
    DeviceSampleEvent gpu;
    gpu.stamp = Stamp{"run-9", 3, 5000, Lane{"local", "gpu:0", "sampler"}};
    gpu.utilisation = 0.9;
    gpu.memoryUsed = 2048ull << 20;
    gpu.temperatureC = 61;
    StepMetricsEvent m;
    m.stamp = Stamp{"run-9", 3, 5100, Lane{"local", "", "trainer"}};
    m.loss = 0.25;
    m.samplesPerSec = 1000;
    RunStateEvent done;
    done.stamp = Stamp{"run-9", 3, 5200, Lane{"local", "", "trainer"}};
    done.state = RunState::Completed;
    SpanEvent counter = span(Lane{"local", "", "input"}, "queue depth", "counter", 5050, 0, 3, {{"value", "4"}});
    for (const Event& e : std::vector<Event>{host, gpu, m, done, counter}) (*w)->add(e);
    QVERIFY((*w)->finish().ok());
    QVERIFY(!(*w)->finish().ok());  // once
    auto t = readChromeTrace(path);
    QVERIFY(t.ok());
    std::map<std::string, TraceCounter> byName;
    for (const auto& c : t->counters) byName[c.name] = c;
    QCOMPARE(byName["host utilisation %"].values.at("cpu1"), 75.0);
    QCOMPARE(byName["process CPU (cores)"].values.at("value"), 1.5);
    QCOMPARE(byName["host process RSS (MiB)"].values.at("value"), 100.0);
    QCOMPARE(byName["gpu:0 utilisation %"].values.at("all"), 90.0);
    QCOMPARE(byName["gpu:0 memory used (MiB)"].values.at("value"), 2048.0);
    QCOMPARE(byName["gpu:0 temperature (C)"].values.at("value"), 61.0);
    QCOMPARE(byName["loss"].values.at("loss"), 0.25);
    QCOMPARE(byName["samples/s"].values.at("value"), 1000.0);
    QCOMPARE(byName["queue depth"].values.at("value"), 4.0);
    QCOMPARE(t->instants.size(), std::size_t(1));
    QCOMPARE(t->instants[0].name, std::string("run completed"));
    QCOMPARE(t->metadata["run_id"], std::string("run-9"));
    // Unwritable path: the error names it.
    auto bad = ChromeTraceWriter::create("/nonexistent-dir/trace.json");
    QVERIFY(!bad.ok());
    QVERIFY(bad.error().message.find("/nonexistent-dir/trace.json") != std::string::npos);
}

void TestChromeTrace::pytorchLegacyFixture()
{
    // Real output of Debian's torch 1.13 profiler (no Kineto): a bare array, pid "CPU functions".
    auto t = readChromeTrace(kTraces + "pytorch_mlp_profile.json");
    QVERIFY2(t.ok(), t.ok() ? "" : t.error().toString().c_str());
    QCOMPARE(t->format, std::string("pytorch-legacy"));
    QCOMPARE(t->spans.size(), std::size_t(1059));
    QCOMPARE(t->spans[0].stamp.lane.worker, std::string("CPU functions"));
    QCOMPARE(t->spans[0].stamp.lane.thread, std::string("tid 1"));
    auto s = summariseTrace(*t, 10);
    QVERIFY(s.ok());
    QCOMPARE(s->stepSource, std::string("ProfilerStep#N"));
    QCOMPARE(s->steps.size(), std::size_t(3));
    QCOMPARE(s->steps[0].stamp.step, int64_t(1));
    QCOMPARE(s->steps[2].stamp.step, int64_t(3));
    QCOMPARE(s->steps[0].stepSeconds, 6052e-6);  // ProfilerStep#1's dur
    for (const auto& b : s->steps) {
        QVERIFY(std::fabs(partSum(b) - b.stepSeconds) < 1e-12);
        QVERIFY(b.input > 0);      // enumerate(DataLoader)#..__next__
        QVERIFY(b.forward > 0);    // aten::linear, relu, cross_entropy
        QVERIFY(b.backward > 0);   // autograd::engine::evaluate_function: ...
        QVERIFY(b.optimizer > 0);  // Optimizer.step#SGD.step, zero_grad
        QVERIFY(b.other >= 0);
        QCOMPARE(b.communication, 0.0);
    }
    QCOMPARE(s->lanes.size(), std::size_t(1));
    QCOMPARE(s->lanes[0].top.size(), std::size_t(10));
    std::set<std::string> top;
    for (const auto& st : s->lanes[0].top) {
        top.insert(st.name);
        QVERIFY(st.selfSeconds <= st.totalSeconds + 1e-12);
        QVERIFY(st.name.rfind("ProfilerStep#", 0) != 0);  // markers are not ops
    }
    QVERIFY(top.count("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"));
    QVERIFY(top.count("Optimizer.step#SGD.step"));
    QVERIFY(top.count("aten::addmm") && top.count("aten::mm"));
    QCOMPARE(s->lanes[0].top[0].name, std::string("autograd::engine::evaluate_function: AddmmBackward0"));
    QVERIFY(findKind(s->findings, "input-bound") != nullptr);
    // Means over the three steps.
    QVERIFY(std::fabs(s->stepTime.mean - (6052 + 19437 + 9925) / 3.0 * 1e-6) < 1e-12);
    QCOMPARE(s->stepTime.min, 6052e-6);
    QCOMPARE(s->stepTime.max, 19437e-6);
}

void TestChromeTrace::pytorchKinetoFixture()
{
    auto t = readChromeTrace(kTraces + "pytorch_kineto_profile.json");
    QVERIFY2(t.ok(), t.ok() ? "" : t.error().toString().c_str());
    QCOMPARE(t->format, std::string("pytorch"));
    QCOMPARE(t->metadata["schemaVersion"], std::string("1"));
    QVERIFY(t->metadata["deviceProperties"].find("H100") != std::string::npos);
    QVERIFY(t->ignored["s"] > 0 && t->ignored["s"] == t->ignored["f"]);  // ac2g flow arrows
    std::set<std::string> lanes;
    for (const auto& s : t->spans) lanes.insert(laneLabel(s.stamp.lane));
    QVERIFY2(lanes.count("python3/gpu:0/stream 7"), qPrintable(QString::number(lanes.size())));
    QVERIFY(lanes.count("python3/thread 48213 (python3)"));
    QCOMPARE(t->instants.size(), std::size_t(2));
    auto s = summariseTrace(*t);
    QVERIFY(s.ok());
    QCOMPARE(s->steps.size(), std::size_t(3));
    for (const auto& b : s->steps) {
        QVERIFY(std::fabs(partSum(b) - b.stepSeconds) < 1e-12);
        QVERIFY(b.input > 0 && b.forward > 0 && b.backward > 0 && b.optimizer > 0);
    }
    bool kernelsOnGpuLane = false;
    for (const auto& l : s->lanes)
        if (l.lane.device == "gpu:0")
            for (const auto& st : l.top) kernelsOnGpuLane |= st.category == "kernel" && st.count > 0;
    QVERIFY(kernelsOnGpuLane);
}

void TestChromeTrace::tensorflowFixture()
{
    auto t = readChromeTrace(kTraces + "tensorflow_trace.json");
    QVERIFY2(t.ok(), t.ok() ? "" : t.error().toString().c_str());
    QCOMPARE(t->format, std::string("tensorflow"));
    QCOMPARE(t->ignored["{}"], int64_t(1));  // TensorBoard's trailing empty event
    auto s = summariseTrace(*t);
    QVERIFY(s.ok());
    QCOMPARE(s->stepSource, std::string("TensorFlow Steps thread"));
    QCOMPARE(s->steps.size(), std::size_t(3));
    QCOMPARE(s->steps[0].stamp.step, int64_t(120));
    for (const auto& b : s->steps) {
        QVERIFY(std::fabs(partSum(b) - b.stepSeconds) < 1e-12);
        QVERIFY(b.input > 0.15e-3);     // IteratorGetNext ~178 us of 280
        QVERIFY(b.backward > 20e-6);    // gradient_tape/...
        QVERIFY(b.optimizer > 10e-6);   // Adam/... ResourceApplyAdam
        QVERIFY(b.forward > 30e-6);     // sequential/...
    }
    const FindingEvent* f = nullptr;
    for (const auto& x : s->findings)
        if (x.kind == "input-bound") f = &x;
    QVERIFY(f);
    QCOMPARE(f->severity, std::string("high"));
    QCOMPARE(s->steps[0].stamp.lane.worker, std::string("/device:GPU:0"));
    QCOMPARE(s->steps[0].stamp.lane.device, std::string("gpu:0"));
}

// A timeline killed while written may end inside its last event: the complete events before it
// are read (one pass), while a syntax error before the end, or an over-range number, is still
// an error saying so.
void TestChromeTrace::cutOffInsideAnEvent()
{
    const std::string events = R"([{"ph": "X", "name": "a", "ts": 1, "dur": 5, "pid": 1, "tid": 1},
{"ph": "X", "name": "b", "ts": 10, "dur": 5, "pid": 1, "tid": 1},
{"ph": "X", "name": "c", "ts": 20, "dur": 5, "pid": 1, "tid": 1},)";
    for (const std::string tail : {"", "\n", "\n{\"ph\": \"X\", \"na", "\n{\"ph\": \"X\", \"name\": \"d\", \"ts\": 3", "\n{\"ph\": \"X\", \"args\": {\"k\": ["}) {
        auto t = parseChromeTraceText(events + tail, "cut.json");
        QVERIFY2(t.ok(), (tail + ": " + (t.ok() ? "" : t.error().toString())).c_str());
        QCOMPARE(t->spans.size(), std::size_t(3));
        QVERIFY(!t->warnings.empty());
        QVERIFY2(t->warnings[0].find("cut.json: the file ends before its closing ']'") == 0, t->warnings[0].c_str());
    }
    // A syntax error on the very last character is no cut-off: ",]", "]]", "}}".
    for (const std::string bad : {"]", "\n{\"ph\": \"X\"}]]", "\n{\"ph\": \"X\"}}"}) {
        auto t = parseChromeTraceText(events + bad, "last.json");
        QVERIFY2(!t.ok(), bad.c_str());
        QVERIFY2(t.error().message.find("last.json: not valid JSON") == 0, t.error().message.c_str());
    }
    // Not at the end: an error naming the line.
    auto broken = parseChromeTraceText(events + "\n{\"ph\": \"X\" \"name\": \"d\"},\n{\"ph\": \"X\", \"name\": \"e\"}]", "broken.json");
    QVERIFY(!broken.ok());
    QVERIFY2(broken.error().message.find("broken.json: not valid JSON at line 4") == 0, broken.error().message.c_str());
    // An over-range number in a cut-off file is named as such, not as invalid JSON.
    auto huge = parseChromeTraceText(R"([{"ph": "X", "name": "a", "ts": 1e400, "dur": 5, "pid": 1},
{"ph": "X", "name": "b", "ts": 10)", "huge.json");
    QVERIFY(!huge.ok());
    QVERIFY2(huge.error().message.find("huge.json: number overflow parsing '1e400'") == 0, huge.error().message.c_str());
    // The object form is not read when cut off (its other fields may follow the events).
    auto object = parseChromeTraceText(R"({"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 5, "pid": 1},)", "object.json");
    QVERIFY(!object.ok());
    QVERIFY2(object.error().message.find("object.json: not valid JSON") == 0, object.error().message.c_str());
}

void TestChromeTrace::horovodTimelineCutOff()
{
    auto t = readChromeTrace(kTraces + "horovod_timeline.json");
    QVERIFY2(t.ok(), t.ok() ? "" : t.error().toString().c_str());
    QCOMPARE(t->format, std::string("horovod"));
    QVERIFY(!t->warnings.empty());
    QVERIFY(t->warnings[0].find("the file ends before its closing ']'") != std::string::npos);
    int allreduce = 0, nccl = 0;
    for (const auto& s : t->spans) {
        if (s.name == "ALLREDUCE") {
            ++allreduce;
            QCOMPARE(s.args.at("dtype"), std::string("float32"));  // E's args merged into its B
            QVERIFY(s.args.count("shape"));
            QVERIFY(s.stamp.lane.worker.find("HorovodAllreduce") != std::string::npos);
        }
        if (s.name == "NCCL_ALLREDUCE") ++nccl;
    }
    QCOMPARE(allreduce, 6);
    QCOMPARE(nccl, 6);
    QCOMPARE(t->instants.size(), std::size_t(3));  // CYCLE_START
    auto s = summariseTrace(*t);
    QVERIFY(s.ok());
    QVERIFY(s->steps.empty());
    QCOMPARE(s->stepSource, std::string(""));
    QCOMPARE(s->lanes.size(), std::size_t(2));
    const LaneSummary* big = nullptr;  // the 784x128 kernel's gradient: the longest NCCL all-reduce
    for (const auto& l : s->lanes)
        if (l.lane.worker.find("cond/Horovod") != std::string::npos) big = &l;
    QVERIFY(big);
    QCOMPARE(big->top[0].name, std::string("ALLREDUCE"));
    QCOMPARE(big->top[0].count, int64_t(3));
    QCOMPARE(big->top[0].totalSeconds, 3 * 371e-6);
    QCOMPARE(classifySpan(t->spans[0], "horovod"), int(StepPart::Communication));
}

void TestChromeTrace::beginEndPairing()
{
    const std::string text = R"([
      {"ph": "B", "name": "outer", "ts": 10, "pid": 1, "tid": 1, "args": {"a": 1}},
      {"ph": "B", "name": "other thread", "ts": 12, "pid": 1, "tid": 2},
      {"ph": "B", "name": "inner", "ts": 15, "pid": 1, "tid": 1},
      {"ph": "E", "ts": 20, "pid": 1, "tid": 1},
      {"ph": "E", "ts": 30, "pid": 1, "tid": 2, "args": {"b": "x"}},
      {"ph": "E", "ts": 40, "pid": 1, "tid": 1, "args": {"c": 2}},
      {"ph": "B", "name": "never ends", "ts": 45, "pid": 1, "tid": 3},
      {"ph": "X", "name": "late", "ts": 50, "dur": 25, "pid": 1, "tid": 1},
      {"ph": "i", "name": "mark", "ts": 60, "pid": 1, "tid": 1, "s": "t"},
      {"ph": "C", "name": "mem", "ts": 60, "pid": 1, "args": {"used": 5, "free": "7", "label": "n/a"}},
      {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "loader"}},
      {"ph": "s", "id": 1, "name": "flow", "ts": 12, "pid": 1, "tid": 1}
    ])";
    auto t = parseChromeTraceText(text, "pairs.json");
    QVERIFY2(t.ok(), t.ok() ? "" : t.error().toString().c_str());
    std::map<std::string, SpanEvent> by;
    for (const auto& s : t->spans) by[s.name] = s;
    QCOMPARE(by.size(), std::size_t(5));
    QCOMPARE(by["outer"].startUs, int64_t(10));
    QCOMPARE(by["outer"].durationUs, int64_t(30));
    QCOMPARE(by["outer"].args.at("a"), std::string("1"));
    QCOMPARE(by["outer"].args.at("c"), std::string("2"));
    QCOMPARE(by["inner"].durationUs, int64_t(5));
    QCOMPARE(by["other thread"].durationUs, int64_t(18));
    QCOMPARE(by["other thread"].stamp.lane.thread, std::string("loader"));  // metadata after the events
    QCOMPARE(by["other thread"].args.at("b"), std::string("x"));
    QCOMPARE(by["never ends"].args.at("unterminated"), std::string("true"));
    QCOMPARE(by["never ends"].startUs + by["never ends"].durationUs, int64_t(75));  // closed at the trace's end
    QCOMPARE(t->warnings.size(), std::size_t(1));
    QVERIFY(t->warnings[0].find("pairs.json: event 6") != std::string::npos);
    QCOMPARE(t->counters.size(), std::size_t(1));
    QCOMPARE(t->counters[0].values.size(), std::size_t(2));  // "label" is not a number
    QCOMPARE(t->counters[0].values.at("free"), 7.0);
    QCOMPARE(t->ignored["s"], int64_t(1));
    QCOMPARE(t->spans[0].name, std::string("outer"));  // sorted by start
}

// The reader hands each entry of traceEvents over as it is parsed and drops it (a 100 MB trace
// took 1.65 GB as a JSON tree, 0.6 GB this way); fields before and after the array still count,
// and the streamed result equals the one from a parsed document.
void TestChromeTrace::topLevelFieldsAroundStreamedEvents()
{
    const std::string text = R"({"schemaVersion": 1, "traceEvents": [
        {"ph": "X", "name": "a", "ts": 1, "dur": 2, "pid": 1, "tid": 1, "args": {"k": [1, 2]}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "main"}},
        {}],
      "otherData": {"producer": "someone", "nested": {"deep": [1]}}, "deviceProperties": [{"name": "H100"}]})";
    auto streamed = parseChromeTraceText(text, "s.json");
    QVERIFY2(streamed.ok(), streamed.ok() ? "" : streamed.error().toString().c_str());
    QCOMPARE(streamed->format, std::string("pytorch"));
    QCOMPARE(streamed->eventCount, int64_t(3));
    QCOMPARE(streamed->ignored.at("{}"), int64_t(1));
    QCOMPARE(streamed->metadata.at("producer"), std::string("someone"));
    QCOMPARE(streamed->metadata.at("deviceProperties"), std::string("H100"));
    QCOMPARE(streamed->metadata.at("schemaVersion"), std::string("1"));
    QCOMPARE(streamed->spans.size(), std::size_t(1));
    QCOMPARE(streamed->spans[0].stamp.lane.thread, std::string("main"));
    QCOMPARE(streamed->spans[0].args.at("k"), std::string("[1,2]"));
    auto whole = parseChromeTrace(nlohmann::json::parse(text), "s.json");
    QVERIFY(whole.ok());
    QCOMPARE(whole->metadata, streamed->metadata);
    QCOMPARE(whole->spans.size(), streamed->spans.size());
    QCOMPARE(whole->spans[0].stamp.lane.thread, streamed->spans[0].stamp.lane.thread);
}

void TestChromeTrace::malformedTraces_data()
{
    QTest::addColumn<QString>("text");
    QTest::addColumn<QString>("expected");  // fragment of the message after the file name
    QTest::newRow("not json") << "{\"traceEvents\": [\n {\"ph\": \"X\",, }]}" << "not valid JSON at line 2";
    QTest::newRow("no traceEvents") << "{\"events\": []}" << "no \"traceEvents\" array";
    QTest::newRow("scalar root") << "42" << "expected an array";
    QTest::newRow("event not object") << "[{\"ph\":\"i\",\"ts\":1}, 7]" << "event 1: not a JSON object";
    QTest::newRow("no ph") << "[{\"ph\":\"i\",\"ts\":1}, {\"ph\":\"i\",\"ts\":1}, {\"name\":\"x\",\"ts\":3}]" << "event 2: no \"ph\"";
    QTest::newRow("X without dur") << "{\"traceEvents\": [{\"ph\":\"X\",\"name\":\"a\",\"ts\":1}]}" << "event 0 (ph \"X\"): no numeric \"dur\"";
    QTest::newRow("negative dur") << "[{\"ph\":\"X\",\"name\":\"a\",\"ts\":1,\"dur\":-5}]" << "event 0 (ph \"X\"): negative \"dur\"";
    QTest::newRow("bad ts") << "[{\"ph\":\"B\",\"name\":\"a\",\"ts\":\"soon\"}]" << "event 0 (ph \"B\"): no numeric \"ts\"";
    QTest::newRow("E without B") << "[{\"ph\":\"B\",\"name\":\"a\",\"ts\":1,\"pid\":1,\"tid\":1},{\"ph\":\"E\",\"ts\":2,\"pid\":1,\"tid\":1},"
                                    "{\"ph\":\"X\",\"name\":\"b\",\"ts\":3,\"dur\":1},{\"ph\":\"E\",\"ts\":4,\"pid\":1,\"tid\":1}]"
                                 << "event 3 (ph \"E\"): an end event with no open \"B\" on pid 1, tid 1";
    QTest::newRow("E before B") << "[{\"ph\":\"B\",\"name\":\"a\",\"ts\":10},{\"ph\":\"E\",\"ts\":5}]" << "event 1 (ph \"E\"): ends at";
    QTest::newRow("empty file") << "  \n" << "the file is empty";
    QTest::newRow("ts beyond 2^53") << "{\"traceEvents\":[{\"ph\":\"X\",\"name\":\"big\",\"ts\":9223372036854775807,\"dur\":1}]}"
                                    << "event 0 (ph \"X\"): \"ts\" 9223372036854775808.000000 us is beyond 2^53 us";
    QTest::newRow("dur beyond 2^53") << "[{\"ph\":\"X\",\"name\":\"big\",\"ts\":0,\"dur\":1e300}]" << "\"dur\" 1000000";
    QTest::newRow("number overflow") << "[{\"ph\":\"X\",\"name\":\"big\",\"ts\":1e400,\"dur\":1}]" << ": number overflow parsing '1e400'";
    QTest::newRow("array entry") << "{\"traceEvents\": [{\"ph\":\"i\",\"ts\":1}, [1, 2], 3]}" << "event 1: not a JSON object";
    QTest::newRow("traceEvents object") << "{\"traceEvents\": {\"ph\": \"i\"}}" << "no \"traceEvents\" array";
    QTest::newRow("error after many") << "[{\"ph\":\"i\",\"ts\":1}, {\"ph\":\"i\",\"ts\":1}, {\"ph\":\"X\",\"ts\":1}, {\"ph\":\"Q\"}"
                                      << "event 2 (ph \"X\"): no numeric \"dur\"";
}

void TestChromeTrace::malformedTraces()
{
    QFETCH(QString, text);
    QFETCH(QString, expected);
    const std::string file = writeText(std::string("bad_") + QTest::currentDataTag() + ".json", text.toStdString());
    auto t = readChromeTrace(file);
    QVERIFY(!t.ok());
    const QString msg = QString::fromStdString(t.error().message);
    QVERIFY2(msg.startsWith(QString::fromStdString(file)), qPrintable(msg));
    QVERIFY2(msg.contains(expected), qPrintable(msg));
    auto missing = readChromeTrace(file + ".missing");
    QVERIFY(!missing.ok());
    QVERIFY(QString::fromStdString(missing.error().message).contains(".missing"));
}

void TestChromeTrace::gzipTrace()
{
    std::ifstream in(kTraces + "tensorflow_trace.json", std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::string gz = scratch("tf.trace.json.gz").string();
    QProcess p;
    p.setStandardOutputFile(QString::fromStdString(gz));
    p.start("gzip", {"-c", QString::fromStdString(kTraces + "tensorflow_trace.json")});
    QVERIFY(p.waitForFinished(10000));
    auto t = readChromeTrace(gz);
    QVERIFY2(t.ok(), t.ok() ? "" : t.error().toString().c_str());
    auto plain = parseChromeTraceText(text, "tf");
    QCOMPARE(t->spans.size(), plain->spans.size());
}

void TestChromeTrace::tracedTrainerRunRoundTrip()
{
    InMemoryDataset ds;
    ds.x = Tensor::empty(Shape{192, 8});
    ds.y = Tensor::empty(Shape{192}, DType::I32);
    ds.numClasses = 3;
    for (int64_t i = 0; i < 192 * 8; ++i) ds.x.data<float>()[i] = static_cast<float>((i * 37) % 17) / 17.f;
    for (int64_t i = 0; i < 192; ++i) ds.y.data<int32_t>()[i] = static_cast<int32_t>(i % 3);
    InMemoryBatchOptions bo;
    bo.batchSize = 16;
    auto src = InMemoryBatchSource::create(ds, bo);
    ModelSpec m;
    m.name = "trace-mlp";
    LayerSpec in;
    in.id = "input";
    in.type = "Input";
    in.attrs["shape"] = std::vector<int64_t>{8};
    LayerSpec d;
    d.id = "dense";
    d.type = "Dense";
    d.attrs = {{"units", 3}, {"activation", "softmax"}};
    d.inputs = {"input"};
    m.layers = {in, d};
    m.compile.loss = "sparse_categorical_crossentropy";
    m.compile.optimizer = {{"type", "adam"}};
    TrainConfig tc;
    tc.epochs = 1;
    tc.strategy.kind = "mirrored";
    tc.strategy.devices = {Device{DeviceKind::Cpu, 0}, Device{DeviceKind::Cpu, 1}};
    tc.strategy.threads = 2;
    tc.sampleHz = 50;
    auto trainer = Trainer::create(m, tc);
    QVERIFY(trainer.ok());
    QVERIFY((*trainer)->initialise().ok());
    EventBus bus;
    const std::string path = scratch("trainer.json").string();
    auto sink = TraceFileSink::create(bus, path);
    QVERIFY(sink.ok());
    (*sink)->setMetadata("model", m.name);
    (*trainer)->setTelemetry(&bus, "run-trace", true);
    auto r = (*trainer)->fit(**src, nullptr, nullptr);
    QVERIFY(r.ok());
    QVERIFY((*sink)->finish().ok());
    QCOMPARE((*sink)->dropped(), uint64_t(0));

    std::ifstream f(path);
    const nlohmann::json doc = nlohmann::json::parse(f);
    std::string why;
    QVERIFY2(properlyNested(doc, &why), why.c_str());
    auto t = readChromeTrace(path);
    QVERIFY(t.ok());
    QCOMPARE(t->format, std::string("trainstudio"));
    QCOMPARE(t->metadata["model"], std::string("trace-mlp"));
    QCOMPARE(t->metadata["run_id"], std::string("run-trace"));
    QCOMPARE(t->spans.size(), (*sink)->spans());
    auto s = summariseTrace(*t);
    QVERIFY(s.ok());
    QCOMPARE(s->stepSource, std::string("TrainStudio step spans"));
    QCOMPARE(int64_t(s->steps.size()), r->steps);
    for (std::size_t i = 0; i < s->steps.size(); ++i) {
        const auto& b = s->steps[i];
        QCOMPARE(b.stamp.step, int64_t(i + 1));
        QVERIFY(std::fabs(partSum(b) - b.stepSeconds) < 1e-12);
        QVERIFY(b.communication > 0 || b.stepSeconds < 50e-6);
    }
    std::set<std::string> lanes;
    for (const auto& l : s->lanes) lanes.insert(l.lane.thread);
    QVERIFY(lanes.count("replica 0") && lanes.count("replica 1"));
    bool sampled = false;
    for (const auto& c : t->counters) sampled |= c.name == "host utilisation %";
    QVERIFY(sampled || r->seconds < 0.05);  // at 50 Hz a run shorter than a tick may have none
    std::set<std::string> instants;
    for (const auto& i : t->instants) instants.insert(i.name);
    QVERIFY(instants.count("run running") && instants.count("run completed"));
}

void TestChromeTrace::cliTraceSummary()
{
    auto r = runCli({"trace", "summary", QString::fromStdString(kTraces + "pytorch_mlp_profile.json"), "--json"});
    QVERIFY2(r.code == 0, qPrintable(r.err));
    const auto j = nlohmann::json::parse(r.out.toStdString());
    QCOMPARE(j["format"].get<std::string>(), std::string("pytorch-legacy"));
    QCOMPARE(j["step_count"].get<int>(), 3);
    QVERIFY(j["breakdown"]["input"]["mean"].get<double>() > 0);
    QVERIFY(!j["lanes"][0]["top"].empty());
    QVERIFY(!j["findings"].empty());
    auto text = runCli({"trace", "summary", QString::fromStdString(kTraces + "pytorch_kineto_profile.json")});
    QVERIFY2(text.code == 0, qPrintable(text.err));
    QVERIFY(text.out.contains("ProfilerStep#N"));
    QVERIFY(text.out.contains("aten::"));
    QVERIFY(text.out.contains("input-bound"));
    auto bad = runCli({"trace", "summary", QString::fromStdString(writeText("cli_bad.json", "[{\"ph\":\"X\",\"ts\":1}]"))});
    QCOMPARE(bad.code, 2);  // bad input
    QVERIFY2(bad.err.contains("cli_bad.json: event 0"), qPrintable(bad.err));
}

void TestChromeTrace::cliTrainWritesTrace()
{
    if (!std::filesystem::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"))
        QSKIP("Fashion-MNIST is not installed (dataset-fashion-mnist)");
    const std::string path = scratch("cli_train.json").string();
    std::filesystem::remove(path);
    auto r = runCli({"train", "--epochs", "1", "--limit", "1024", "--no-validation", "--batch-size", "128", "--quiet", "--no-record",
                     "--trace", QString::fromStdString(path)});
    QVERIFY2(r.code == 0, qPrintable(r.err));
    auto t = readChromeTrace(path);
    QVERIFY2(t.ok(), t.ok() ? "" : t.error().toString().c_str());
    auto s = summariseTrace(*t);
    QVERIFY(s.ok());
    QCOMPARE(s->steps.size(), std::size_t(8));
    auto summary = runCli({"trace", "summary", QString::fromStdString(path)});
    QVERIFY2(summary.code == 0, qPrintable(summary.err));
    QVERIFY(summary.out.contains("TrainStudio step spans"));
    QVERIFY(summary.out.contains("forward"));
}

QTEST_APPLESS_MAIN(TestChromeTrace)
#include "tst_chrome_trace.moc"
