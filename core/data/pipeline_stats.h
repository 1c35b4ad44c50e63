#pragma once
// Stall accounting of the input pipeline, as plain values: cumulative counters per stage
// (PipelineSnapshot), the analysis of a window of steps between two snapshots (PipelineWindow)
// with a one-line verdict using TensorBoard's thresholds, and their telemetry events.
//
// Attribution ("share of the critical path"): the consumer's wait is charged to stages along the
// chain from the consumer down. Stages without threads of their own run on their caller's thread,
// so their own (self) time counts in full where their caller waits. An asynchronous stage
// (prefetch, parallel map, parallel interleave) decouples its caller: the time its caller spent
// blocked on its buffer is split over the stages feeding it (its own workers' time divided by
// their parallelism, the self time of the stages between it and the next asynchronous stage, and
// that stage's blocked time, split again in turn), in proportion to their measured time. The
// stage with the largest share is named as the one most likely responsible.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "telemetry/events.h"

namespace ts {

struct StageStats {            // cumulative since the pipeline was created
    std::string name;          // "map(normalise)", "prefetch(AUTOTUNE)"
    std::string kind;          // "source", "map", "shuffle", "batch", "prefetch", ...
    bool async = false;        // has worker threads of its own
    int64_t produced = 0;      // elements handed to the next stage
    double busySeconds = 0;    // self time: own work, excluding waiting on its input (async: worker time)
    double blockedSeconds = 0; // async: time its consumer waited on its buffer
    int64_t skipped = 0;       // bad records dropped here (skip_bad_records)
    int64_t bytesProduced = 0; // bytes of the tensors of produced elements
    int64_t queueDepth = 0;    // async: buffered elements at snapshot time
    int64_t queueCapacity = 0;
    int parallelism = 1;       // worker threads in use
};

struct PipelineSnapshot {
    double timeSeconds = 0;    // steady clock
    int64_t steps = 0;         // batches delivered whose step has ended (the consumer asked again)
    double waitSeconds = 0;    // consumer wait in those steps
    double stepSeconds = 0;    // wall time of those steps (wait + the consumer's own work)
    std::vector<StageStats> stages;  // source first, in data-flow order
};

enum class InputBound { No, Moderately, Highly };
const char* inputBoundName(InputBound b);  // "not", "moderately", "highly"
// TensorBoard's thresholds: >= 20% highly, >= 5% moderately.
InputBound classifyInputBound(double waitShare);

struct StageWindow {
    std::string name;
    int64_t produced = 0;
    double busySeconds = 0;
    double elementsPerSecond = 0;   // produced / window wall time
    double secondsPerElement = 0;   // busy / produced (one worker's cost)
    int64_t queueDepth = 0, queueCapacity = 0;
    int parallelism = 1;
    double blockedSeconds = 0;
    double criticalSeconds = 0;     // consumer wait attributed to this stage
    double criticalShare = 0;       // criticalSeconds / the consumer's total wait
    int64_t skipped = 0;
};

struct PipelineWindow {
    int64_t firstStep = 0, lastStep = 0;  // 1-based, inclusive
    int64_t steps = 0;
    double seconds = 0;           // wall time of the window
    double meanStepSeconds = 0;
    double waitSeconds = 0;       // total consumer wait
    double waitShare = 0;         // waitSeconds / total step time
    InputBound bound = InputBound::No;
    std::string bottleneck;       // stage most likely responsible ("" when not input-bound)
    std::string verdict;          // one line, e.g. "steps 1-50: highly input-bound: 41.3% ..."
    std::string recommendation;   // what to change ("" when not input-bound)
    std::vector<StageWindow> stages;
};

// The window between two snapshots of the same pipeline (`to` taken after `from`).
PipelineWindow analyseWindow(const PipelineSnapshot& from, const PipelineSnapshot& to);

// One PipelineSampleEvent per stage (stage, produced, busy, queue, attributed wait,
// parallelism), stamped with `stamp` (the caller fills run id, step, time, lane).
std::vector<telemetry::PipelineSampleEvent> pipelineSampleEvents(const PipelineWindow& w, const telemetry::Stamp& stamp);
// An "input-bound" FindingEvent (severity "moderate"/"high") when the window is input-bound.
std::optional<telemetry::FindingEvent> inputBoundFinding(const PipelineWindow& w, const telemetry::Stamp& stamp);

} // namespace ts
