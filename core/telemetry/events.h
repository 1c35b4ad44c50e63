#pragma once
// Telemetry events: plain value structs that the engine publishes and every sink (dashboards,
// the SQLite store, trace files, remote streams) consumes. Each carries a Stamp: run id, global
// step, wall time and a lane (worker / device / thread) so that system and training metrics
// share one step axis and remote events keep their origin.

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

namespace ts::telemetry {

struct Lane {
    std::string worker = "local";  // "local", or "worker:1", "ps:0", "chief:0"
    std::string device;            // "cpu:0", "gpu:1", "" for host-wide
    std::string thread;            // "main", "replica 1", "input", ...
    bool operator==(const Lane&) const = default;
};

struct Stamp {
    std::string runId;
    int64_t step = 0;        // global step the event belongs to (0 before the first step)
    int64_t wallTimeUs = 0;  // microseconds since the Unix epoch (system_clock)
    Lane lane;
};

enum class RunState { Created, Running, Paused, Completed, Cancelled, Failed, Interrupted };
const char* runStateName(RunState s);

struct RunStateEvent {
    Stamp stamp;
    RunState state = RunState::Created;
    std::string message;  // error text for Failed
    // Running, >= 0: fit() resumed from a backup made after this step (train --restarts); the
    // store drops what an earlier attempt recorded beyond it (RunStore::rewindRun).
    int64_t resumedAfterStep = -1;
};

struct StepMetricsEvent {
    Stamp stamp;
    int64_t epoch = 0;
    double loss = 0;
    std::map<std::string, double> metrics;  // "accuracy", ...
    double samplesPerSec = 0;
    double learningRate = 0;
};

struct EpochMetricsEvent {
    Stamp stamp;
    int64_t epoch = 0;
    std::map<std::string, double> metrics;  // "loss", "accuracy", "val_loss", "val_accuracy", ...
    double seconds = 0;
    double samplesPerSec = 0;
};

// Step-time breakdown like TensorBoard's overview page; the parts add up to stepSeconds.
struct StepBreakdownEvent {
    Stamp stamp;
    double stepSeconds = 0;
    double input = 0;          // waiting for the batch (host wait + host-to-device)
    double forward = 0;
    double backward = 0;
    double communication = 0;  // gradient all-reduce / parameter exchange
    double optimizer = 0;
    double other = 0;          // stepSeconds minus the named parts
};

struct DeviceSampleEvent {
    Stamp stamp;                       // lane.device names the device ("" = host)
    double utilisation = -1;           // 0..1, -1 unknown
    std::vector<double> perCore;       // host: utilisation of each core
    double processCpu = -1;            // host: this process, in cores (2.0 = two full cores)
    uint64_t memoryUsed = 0, memoryTotal = 0;  // device memory, or process RSS / host total
    double temperatureC = -1, powerW = -1;
};

struct PipelineSampleEvent {
    Stamp stamp;
    std::string stage;         // transformation name, e.g. "map(normalise)"
    int64_t produced = 0;      // elements since the last sample
    double busySeconds = 0;    // time spent producing them
    int64_t queueDepth = 0;    // buffered elements at sample time
    int64_t queueCapacity = 0;
    double waitSeconds = 0;    // consumer wait attributed to this stage
    int parallelism = 1;
};

// A span on a lane's timeline. Tracer counters travel as SpanEvents too: category "counter",
// durationUs 0, args["value"] the sample (the Chrome trace writer turns them into C events).
struct SpanEvent {
    Stamp stamp;
    std::string name;          // "forward/dense", "all-reduce", "input wait"
    std::string category;      // "input", "forward", "backward", "communication", "optimizer", "checkpoint", ...
    int64_t startUs = 0;       // microseconds, same clock as Stamp::wallTimeUs
    int64_t durationUs = 0;
    std::map<std::string, std::string> args;
};

enum class LogLevel { Debug, Info, Warning, Error };

struct LogEvent {
    Stamp stamp;
    LogLevel level = LogLevel::Info;
    std::string message;
};

struct ErrorEvent {
    Stamp stamp;
    std::string message;
    std::string hint;
    std::string where;  // file / node / worker / device
};

struct FindingEvent {          // advisor output
    Stamp stamp;
    std::string kind;          // "input-bound", "communication", "device-idle", "host-overhead", ...
    std::string severity;      // "info", "moderate", "high"
    std::string message;
    std::string recommendation;
    int64_t firstStep = 0, lastStep = 0;
};

using Event = std::variant<RunStateEvent, StepMetricsEvent, EpochMetricsEvent, StepBreakdownEvent,
                           DeviceSampleEvent, PipelineSampleEvent, SpanEvent, LogEvent, ErrorEvent,
                           FindingEvent>;

const Stamp& stampOf(const Event& e);
// "run-state", "step-metrics", ... (the alternative's name, for logs and errors).
const char* eventKindName(const Event& e);
// "local/cpu:0/main": the lane as one readable label (empty parts left out).
std::string laneLabel(const Lane& lane);

} // namespace ts::telemetry
