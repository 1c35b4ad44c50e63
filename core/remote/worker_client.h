#pragma once
// WorkerClient: the coordinator's side of the Worker control service (worker.proto).
// Contract:
//  - Thread-safe (one gRPC channel); streamEvents blocks its caller until the stream ends, so
//    run it on its own thread, and unblock it with cancelStream().
//  - Every call carries the token and a deadline; errors are Result errors whose message starts
//    with the worker's label ("worker:1 at 10.0.0.3:7070") and says what failed.

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/result.h"
#include "remote/auth.h"

namespace ts::remote {

struct WorkerIdentity {
    std::string worker, version, hostname, state;
    int pid = 0;
    // A busy worker: the run it trains (or is reserved for), who asked, and how long ago.
    std::string runId, coordinator;
    double seconds = 0;
    bool reserved = false;
    struct Device {
        std::string name, kind;
        int64_t memoryBytes = 0;
        double load = -1;
    };
    std::vector<Device> devices;
};

struct WorkerEvent {
    std::string runId, worker, device, kind;  // kind: "state", "step", "epoch", "error", "final"
    int64_t step = 0;
    double wallTime = 0;
    nlohmann::json fields;
    std::string payload;  // "weights": a part of the chief's weights
};

struct WorkerPulse {
    std::string state;
    int64_t step = 0;
    // The worker's clock minus this machine's, estimated as its wall time minus the midpoint of
    // the call (NTP's estimate: off by at most half the round trip), and that round trip.
    int64_t clockOffsetUs = 0;
    int64_t roundTripUs = 0;
};

struct StartTaskOptions {
    bool trace = false, traceLayers = false;  // the task traces every step (a span per layer too)
    std::string coordinator;                  // who starts it, as other coordinators are told
    bool initialWeightsSent = false;          // sendWeights() delivered its initial weights
    std::string initialWeightsName;           // the file they came from, for messages
    bool joinRunning = false;                 // a parameter-server worker rejoining a run in progress
    bool sendEpochWeights = false;            // a multi-worker chief: its weights after each epoch, for the evaluator
};

// Why a task is stopped: CancelRequest.reason, and the "reason" of a cancelled task's state
// event. A cancel without one is the user's (Ctrl-C, Stop).
inline constexpr const char* kCancelDone = "done";          // the run is over (how a ps task ends normally)
inline constexpr const char* kCancelFailed = "failed";      // another task of the run failed
inline constexpr const char* kCancelShutdown = "shutdown";  // its trainstudio-worker shut down (state events only)

class WorkerClient {
public:
    // ownConnection: a connection of its own, not shared with other channels to the same
    // address in this process (gRPC shares them, with their reconnect backoff).
    static Result<std::unique_ptr<WorkerClient>> connect(const std::string& label, const std::string& address,
                                                       const std::string& token, const TlsFiles& tls = {}, bool ownConnection = false);
    ~WorkerClient();
    const std::string& label() const;

    Result<WorkerIdentity> identify(std::chrono::milliseconds timeout);
    // Holds the idle worker for `runId` for `seconds` (until its startTask, or cancel(runId)).
    // An error names the run and coordinator that hold it instead.
    Status reserve(const std::string& runId, const std::string& coordinator, int seconds);
    Status startTask(const std::string& runId, const nlohmann::json& runConfig, const std::string& tfConfig,
                     const std::string& taskType, int taskIndex, const StartTaskOptions& options = {});
    // Sends a safetensors file's bytes (any size, in 256 KiB parts) that the task of `runId` will
    // start from (startTask with initialWeightsSent), or (initial false) that its evaluator task
    // evaluates next (requestEvaluation with weightsSent). The worker checks them on arrival; its
    // refusal names them (damaged, or over its --max-weights-bytes).
    Status sendWeights(const std::string& runId, const std::string& name, const std::string& bytes, bool initial = true);
    // Asks the running task to trace its next `steps` steps. OK(true) started; OK(false) the task
    // cannot now, `why` says so ("worker:1: the task traces every step already").
    Result<bool> captureTrace(const std::string& runId, int64_t steps, bool layers, std::string* why = nullptr);
    // Asks the run's evaluator task to evaluate: the ps tasks' weights now, or (weightsSent) those
    // sendWeights() just delivered; its result arrives on the event stream ("evaluation" with
    // this seq).
    Status requestEvaluation(const std::string& runId, int64_t epoch, int64_t seq, bool weightsSent = false);
    // Calls onEvent for every event until the task ends (OK) or the stream breaks (error).
    Status streamEvents(const std::string& runId, const std::function<void(const WorkerEvent&)>& onEvent);
    // Ends the open stream and refuses later ones (the run is over) until allowStreams().
    void cancelStream();
    void allowStreams();
    // Stops the task; `reason` as CancelRequest's: kCancelDone, kCancelFailed or "" (cancelled).
    Status cancel(const std::string& runId, const std::string& reason = {});
    Result<WorkerPulse> heartbeat(std::chrono::milliseconds timeout);

    class Impl;
private:
    explicit WorkerClient(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> m_impl;
};

} // namespace ts::remote
