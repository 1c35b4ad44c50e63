#pragma once
// Trace summary: the step-time breakdown, the top spans per lane and the advisor's findings for
// any Chrome trace, ours or another tool's (what `trainstudio-cli trace summary` prints and the
// studio's profiler page shows for an imported trace).
// Steps come from PyTorch's "ProfilerStep#N" spans, our own "step" category spans, or
// TensorFlow's "Steps" thread. Inside a step every instant of time goes to the highest-priority
// part whose spans cover it (communication > input > optimizer > backward > forward), across all
// lanes; what no classified span covers is "other", so the parts add up to the step time.
// Classification: our categories directly; other tools' spans by name (DataLoader, Memcpy HtoD,
// IteratorGetNext -> input; autograd / *Backward / gradient_tape -> backward; Optimizer.* /
// Apply* -> optimizer; nccl / allreduce / c10d / Horovod ops -> communication; remaining
// operator spans -> forward). With asynchronous GPU kernels the forward/backward split is
// approximate.
// Contract: pure function of the Trace; errors only for a trace with no spans at all.

#include <array>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/result.h"
#include "telemetry/breakdown.h"
#include "telemetry/chrome_trace.h"

namespace ts::telemetry {

struct PartStats {
    double mean = 0, stddev = 0, min = 0, max = 0, total = 0;  // seconds
};

struct SpanTotal {
    std::string name, category;
    int64_t count = 0;
    double totalSeconds = 0;  // inclusive
    double selfSeconds = 0;   // minus nested spans on the same lane
    double maxSeconds = 0;
};

struct LaneSummary {
    Lane lane;
    int64_t spans = 0;
    std::vector<SpanTotal> top;  // by total time, descending
};

struct TraceSummary {
    std::string source, format;
    int64_t events = 0, spans = 0;
    double durationSeconds = 0;           // first span start to last span end
    std::string stepSource;               // "ProfilerStep#N", "TrainStudio step spans", "TensorFlow Steps thread", "" (none)
    std::vector<StepBreakdownEvent> steps;
    PartStats stepTime;
    std::array<PartStats, kStepPartCount> parts{};  // indexed by StepPart
    std::vector<LaneSummary> lanes;
    std::vector<FindingEvent> findings;
    std::vector<std::string> warnings;
};

// Which step part a span belongs to, or -1 (not classified: markers, python frames, ...).
int classifySpan(const SpanEvent& span, const std::string& format);

Result<TraceSummary> summariseTrace(const Trace& trace, int topPerLane = 10);
nlohmann::json summaryToJson(const TraceSummary& summary);

} // namespace ts::telemetry
