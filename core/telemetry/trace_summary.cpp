#include "telemetry/trace_summary.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <unordered_map>

#include "common/utf8.h"
#include "telemetry/advisor.h"

namespace ts::telemetry {
namespace {

bool has(const std::string& s, const char* needle) { return s.find(needle) != std::string::npos; }
bool starts(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }
bool ends(const std::string& s, const char* suffix)
{
    const std::size_t n = std::char_traits<char>::length(suffix);
    return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

constexpr int kInput = static_cast<int>(StepPart::Input);
constexpr int kForward = static_cast<int>(StepPart::Forward);
constexpr int kBackward = static_cast<int>(StepPart::Backward);
constexpr int kComm = static_cast<int>(StepPart::Communication);
constexpr int kOptimizer = static_cast<int>(StepPart::Optimizer);

// Higher wins where spans of several parts cover the same instant.
int priority(int part)
{
    switch (part) {
    case kComm: return 5;
    case kInput: return 4;
    case kOptimizer: return 3;
    case kBackward: return 2;
    case kForward: return 1;
    }
    return 0;
}

bool isStepMarker(const SpanEvent& s)
{
    return starts(s.name, "ProfilerStep#") || s.category == "step" || s.stamp.lane.thread == "Steps";
}

PartStats statsOf(const std::vector<double>& v)
{
    PartStats p;
    if (v.empty()) return p;
    p.min = *std::min_element(v.begin(), v.end());
    p.max = *std::max_element(v.begin(), v.end());
    for (double x : v) p.total += x;
    p.mean = p.total / static_cast<double>(v.size());
    double ss = 0;
    for (double x : v) ss += (x - p.mean) * (x - p.mean);
    p.stddev = std::sqrt(ss / static_cast<double>(v.size()));
    return p;
}

nlohmann::json statsJson(const PartStats& p)
{
    return {{"mean", p.mean}, {"std", p.stddev}, {"min", p.min}, {"max", p.max}, {"total", p.total}};
}

} // namespace

int classifySpan(const SpanEvent& s, const std::string& format)
{
    const std::string& c = s.category;
    // Ours (and any tool using the same words as categories).
    if (c == "input") return kInput;
    if (c == "forward") return kForward;
    if (c == "backward") return kBackward;
    if (c == "communication") return kComm;
    if (c == "optimizer") return kOptimizer;
    if (isStepMarker(s) || c == "checkpoint" || c == "run" || c == "counter" || c == "python_function" ||
        c == "cuda_runtime" || c == "ac2g" || c == "Trace" || c == "overhead")
        return -1;  // markers, Python frames, launch calls (launch cost is host overhead: "other")

    const std::string& n = s.name;
    auto longName = s.args.find("long_name");  // TensorFlow's full op path
    const std::string full = longName != s.args.end() ? longName->second : (s.args.count("name") ? s.args.at("name") : n);
    const std::string ln = lowerAscii(n);
    if (format == "horovod") return std::all_of(n.begin(), n.end(), ::isdigit) ? -1 : kComm;  // digits: rank-ready marks
    if (starts(n, "c10d::") || starts(ln, "nccl") || has(ln, "nccl") || has(ln, "allreduce") || has(ln, "all_reduce") ||
        has(ln, "all-reduce") || has(ln, "allgather") || has(ln, "all_gather") || has(ln, "reduce_scatter") ||
        has(ln, "reducescatter") || starts(ln, "gloo:") || starts(n, "NEGOTIATE_") || starts(n, "MPI_") ||
        has(n, "FUSION_BUFFER") || starts(n, "CollectiveReduce") || starts(n, "CollectiveBcast") || n == "_Send" ||
        n == "_Recv" || n == "_HostSend" || n == "_HostRecv")
        return kComm;
    if (has(n, "DataLoader") || has(n, "Memcpy HtoD") || has(n, "IteratorGetNext") || starts(n, "Iterator::") ||
        has(ln, "host-to-device") || n == "aten::pin_memory")
        return kInput;
    if (starts(n, "Optimizer.") || has(full, "ResourceApply") || starts(full, "Adam/") || starts(full, "SGD/") ||
        starts(full, "RMSprop/") || has(full, "/Adam/") || has(full, "/SGD/") || starts(n, "AssignAddVariableOp"))
        return kOptimizer;
    if (has(n, "autograd") || ends(n, "Backward0") || ends(n, "Backward1") || ends(n, "Backward") || has(n, "_backward") ||
        starts(full, "gradient_tape") || starts(full, "gradients/") || has(full, "/gradients/"))
        return kBackward;
    if (c == "user_annotation") return -1;  // record_function regions that said nothing above
    if (starts(n, "aten::") || c == "cpu_op" || c == "Operator" || c == "operator" || c == "Op" || c == "kernel" ||
        c == "gpu_op" || c == "gpu_memset" || format == "tensorflow")
        return kForward;
    return -1;
}

Result<TraceSummary> summariseTrace(const Trace& trace, int topPerLane)
{
    TraceSummary sum;
    sum.source = trace.source;
    sum.format = trace.format;
    sum.events = trace.eventCount;
    sum.spans = static_cast<int64_t>(trace.spans.size());
    sum.warnings = trace.warnings;
    if (trace.spans.empty())
        return makeError(ErrorCode::InvalidArgument,
                         (trace.source.empty() ? std::string("the trace") : trace.source) + " has no spans (X or B/E events)",
                         "profile at least one step; counters and metadata alone have no timeline to summarise");
    int64_t t0 = trace.spans.front().startUs, t1 = t0;
    for (const auto& s : trace.spans) {
        t0 = std::min(t0, s.startUs);
        t1 = std::max(t1, s.startUs + s.durationUs);
    }
    sum.durationSeconds = static_cast<double>(t1 - t0) * 1e-6;

    // Steps: the first kind of marker present wins.
    std::vector<const SpanEvent*> steps;
    for (const auto& s : trace.spans)
        if (starts(s.name, "ProfilerStep#")) steps.push_back(&s);
    if (!steps.empty()) sum.stepSource = "ProfilerStep#N";
    if (steps.empty()) {
        for (const auto& s : trace.spans)
            if (s.category == "step") steps.push_back(&s);
        if (!steps.empty()) sum.stepSource = "TrainStudio step spans";
    }
    if (steps.empty()) {
        for (const auto& s : trace.spans)
            if (s.stamp.lane.thread == "Steps") steps.push_back(&s);
        if (!steps.empty()) sum.stepSource = "TensorFlow Steps thread";
    }
    std::sort(steps.begin(), steps.end(), [](const SpanEvent* a, const SpanEvent* b) { return a->startUs < b->startUs; });

    // Classified intervals, by start.
    struct Interval {
        int64_t start, end;
        int part;
    };
    std::vector<Interval> intervals;
    int64_t maxLen = 0;
    for (const auto& s : trace.spans) {
        const int part = classifySpan(s, trace.format);
        if (part < 0 || s.durationUs <= 0) continue;
        intervals.push_back({s.startUs, s.startUs + s.durationUs, part});
        maxLen = std::max(maxLen, s.durationUs);
    }
    std::sort(intervals.begin(), intervals.end(), [](const Interval& a, const Interval& b) { return a.start < b.start; });

    int replicas = 0;
    {
        std::map<std::string, int> seen;
        for (const auto& s : trace.spans)
            if (starts(s.stamp.lane.thread, "replica")) seen[laneLabel(s.stamp.lane)] = 1;
        replicas = std::max<int>(1, static_cast<int>(seen.size()));
    }

    std::vector<double> stepTimes;
    std::array<std::vector<double>, kStepPartCount> partTimes;
    int64_t index = 0;
    for (const SpanEvent* st : steps) {
        ++index;
        const int64_t s = st->startUs, e = st->startUs + st->durationUs;
        // Sweep over the clipped intervals: each instant goes to the highest-priority part.
        std::vector<std::pair<int64_t, int>> edges;  // (time, +part+1 opening / -(part+1) closing)
        auto first = std::lower_bound(intervals.begin(), intervals.end(), s - maxLen,
                                      [](const Interval& iv, int64_t t) { return iv.start < t; });
        for (auto it = first; it != intervals.end() && it->start < e; ++it) {
            const int64_t a = std::max(s, it->start), b = std::min(e, it->end);
            if (b <= a) continue;
            edges.push_back({a, it->part + 1});
            edges.push_back({b, -(it->part + 1)});
        }
        std::sort(edges.begin(), edges.end());
        std::array<int64_t, kStepPartCount> us{};
        std::array<int, kStepPartCount> active{};
        int64_t prev = s;
        for (const auto& [t, d] : edges) {
            int best = -1;
            for (int p = 0; p < kStepPartCount; ++p)
                if (active[static_cast<std::size_t>(p)] > 0 && (best < 0 || priority(p) > priority(best))) best = p;
            if (best >= 0) us[static_cast<std::size_t>(best)] += t - prev;
            prev = t;
            if (d > 0) ++active[static_cast<std::size_t>(d - 1)];
            else --active[static_cast<std::size_t>(-d - 1)];
        }
        StepBreakdownEvent b;
        b.stamp = st->stamp;
        b.stamp.wallTimeUs = s;
        if (starts(st->name, "ProfilerStep#")) b.stamp.step = std::strtoll(st->name.c_str() + 13, nullptr, 10);
        else if (sum.stepSource == "TensorFlow Steps thread")
            b.stamp.step = std::all_of(st->name.begin(), st->name.end(), ::isdigit) && !st->name.empty()
                               ? std::strtoll(st->name.c_str(), nullptr, 10)
                               : index;
        const int64_t total = e - s;
        int64_t named = 0;
        for (int64_t v : us) named += v;
        b.stepSeconds = static_cast<double>(total) * 1e-6;
        b.input = static_cast<double>(us[kInput]) * 1e-6;
        b.forward = static_cast<double>(us[kForward]) * 1e-6;
        b.backward = static_cast<double>(us[kBackward]) * 1e-6;
        b.communication = static_cast<double>(us[kComm]) * 1e-6;
        b.optimizer = static_cast<double>(us[kOptimizer]) * 1e-6;
        b.other = static_cast<double>(total - named) * 1e-6;
        sum.steps.push_back(b);
        stepTimes.push_back(b.stepSeconds);
        for (int p = 0; p < kStepPartCount; ++p)
            partTimes[static_cast<std::size_t>(p)].push_back(partSeconds(b, static_cast<StepPart>(p)));
    }
    sum.stepTime = statsOf(stepTimes);
    for (int p = 0; p < kStepPartCount; ++p) sum.parts[static_cast<std::size_t>(p)] = statsOf(partTimes[static_cast<std::size_t>(p)]);

    // Top spans per lane, with self time (minus directly nested spans on the same lane).
    std::vector<Lane> laneOrder;
    std::unordered_map<std::string, std::vector<const SpanEvent*>> byLane;
    for (const auto& s : trace.spans) {
        const std::string key = laneLabel(s.stamp.lane) + '\x1f' + s.stamp.lane.worker + '\x1f' + s.stamp.lane.device;
        auto [it, inserted] = byLane.try_emplace(key);
        if (inserted) laneOrder.push_back(s.stamp.lane);
        it->second.push_back(&s);
    }
    for (const Lane& lane : laneOrder) {
        const auto& spans = byLane[laneLabel(lane) + '\x1f' + lane.worker + '\x1f' + lane.device];
        std::vector<int64_t> self(spans.size());
        std::vector<std::size_t> stack;
        for (std::size_t i = 0; i < spans.size(); ++i) {  // spans are sorted by start, longer first
            const SpanEvent& s = *spans[i];
            self[i] = s.durationUs;
            while (!stack.empty() && spans[stack.back()]->startUs + spans[stack.back()]->durationUs <= s.startUs)
                stack.pop_back();
            if (!stack.empty()) {
                const SpanEvent& parent = *spans[stack.back()];
                if (s.startUs + s.durationUs <= parent.startUs + parent.durationUs) self[stack.back()] -= s.durationUs;
            }
            stack.push_back(i);
        }
        std::map<std::pair<std::string, std::string>, SpanTotal> totals;
        for (std::size_t i = 0; i < spans.size(); ++i) {
            const SpanEvent& s = *spans[i];
            if (isStepMarker(s)) continue;
            SpanTotal& t = totals[{s.name, s.category}];
            t.name = s.name;
            t.category = s.category;
            ++t.count;
            const double d = static_cast<double>(s.durationUs) * 1e-6;
            t.totalSeconds += d;
            t.selfSeconds += static_cast<double>(std::max<int64_t>(0, self[i])) * 1e-6;
            t.maxSeconds = std::max(t.maxSeconds, d);
        }
        LaneSummary ls;
        ls.lane = lane;
        ls.spans = static_cast<int64_t>(spans.size());
        for (auto& [k, t] : totals) ls.top.push_back(std::move(t));
        std::sort(ls.top.begin(), ls.top.end(), [](const SpanTotal& a, const SpanTotal& b) {
            if (a.totalSeconds != b.totalSeconds) return a.totalSeconds > b.totalSeconds;
            return a.name < b.name;
        });
        if (topPerLane >= 0 && ls.top.size() > static_cast<std::size_t>(topPerLane)) ls.top.resize(static_cast<std::size_t>(topPerLane));
        sum.lanes.push_back(std::move(ls));
    }

    AdvisorInput in;
    in.steps = sum.steps;
    in.replicas = replicas;
    sum.findings = advise(in);
    return sum;
}

nlohmann::json summaryToJson(const TraceSummary& s)
{
    nlohmann::json steps = nlohmann::json::array();
    for (const auto& b : s.steps)
        steps.push_back({{"step", b.stamp.step}, {"start_us", b.stamp.wallTimeUs}, {"step_seconds", b.stepSeconds},
                         {"input", b.input}, {"forward", b.forward}, {"backward", b.backward},
                         {"communication", b.communication}, {"optimizer", b.optimizer}, {"other", b.other}});
    nlohmann::json breakdown = {{"step", statsJson(s.stepTime)}};
    for (int p = 0; p < kStepPartCount; ++p)
        breakdown[stepPartName(static_cast<StepPart>(p))] = statsJson(s.parts[static_cast<std::size_t>(p)]);
    nlohmann::json lanes = nlohmann::json::array();
    for (const auto& l : s.lanes) {
        nlohmann::json top = nlohmann::json::array();
        for (const auto& t : l.top)
            top.push_back({{"name", t.name}, {"category", t.category}, {"count", t.count}, {"total_seconds", t.totalSeconds},
                           {"self_seconds", t.selfSeconds}, {"max_seconds", t.maxSeconds}});
        lanes.push_back({{"worker", l.lane.worker}, {"device", l.lane.device}, {"thread", l.lane.thread},
                         {"label", laneLabel(l.lane)}, {"spans", l.spans}, {"top", top}});
    }
    nlohmann::json findings = nlohmann::json::array();
    for (const auto& f : s.findings)
        findings.push_back({{"kind", f.kind}, {"severity", f.severity}, {"message", f.message},
                            {"recommendation", f.recommendation}, {"first_step", f.firstStep}, {"last_step", f.lastStep}});
    return {{"source", s.source}, {"format", s.format}, {"events", s.events}, {"spans", s.spans},
            {"duration_seconds", s.durationSeconds}, {"step_source", s.stepSource}, {"step_count", s.steps.size()},
            {"breakdown", breakdown}, {"steps", steps}, {"lanes", lanes}, {"findings", findings}, {"warnings", s.warnings}};
}

} // namespace ts::telemetry
