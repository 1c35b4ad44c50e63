#pragma once
// RunRecording: records one training run into the run store — the configuration snapshot, then
// everything the trainer publishes on the telemetry bus (status transitions, step and epoch
// metrics, step breakdowns, device samples, spans, errors, the advisor's findings), and the
// weights as checkpoints. The CLI's `train` and the studio's session both record through it.
// Contract:
//  - Threading: begin/prepareFailed/fitDone/keepWeights/keepFile are called from the thread that
//    runs the training (or prepares it); checkpoint() from the trainer's thread between steps.
//    The sinks it starts drain the bus on their own threads.
//  - Ownership: it owns the RunStore connection it was given; the bus and the PreparedRun must
//    outlive the recording until fitDone().
//  - Errors: recording problems never fail the training. They go to the warning callback (by
//    default standard error), and the run carries on unrecorded or partly recorded.

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/result.h"
#include "tensor/tensor.h"
#include "store/run_store.h"

namespace ts {
struct FitResult;
struct PreparedRun;
struct RunConfig;
namespace telemetry {
class AdvisorSink;
class EventBus;
}
}

namespace ts::store {

class StoreSink;

struct RecordingOptions {
    std::string name;               // run name; empty: the model name and time
    std::vector<std::string> tags;
    std::function<void(const Error&)> warn;  // null: print to standard error
};

class RunRecording {
public:
    RunRecording(RunStore store, RecordingOptions options);
    ~RunRecording();
    RunRecording(const RunRecording&) = delete;
    RunRecording& operator=(const RunRecording&) = delete;

    // Opens (creating) the database at `path`; the error names it and says what to do.
    static Result<std::unique_ptr<RunRecording>> open(const std::string& path, RecordingOptions options = {});

    // After prepareRun: creates the run, subscribes the store (and the advisor) to `bus` and
    // points the trainer's telemetry at it (a later setTelemetry for tracing must keep runId()).
    // An error (naming the database, with what to do) when the run cannot be created, e.g. a
    // damaged database: the caller must not train a run it says is recorded.
    Status begin(PreparedRun& run, telemetry::EventBus& bus);
    // A restarted attempt of the same run (train --restarts): points the new trainer's telemetry
    // at the bus and run id begin() set up.
    void attach(PreparedRun& run);
    // A run trained by remote workers (train --cluster): creates the run from its configuration
    // and records what the coordinator publishes on `bus` (the workers' merged streams).
    // Errors as begin().
    Status beginRemote(const RunConfig& config, telemetry::EventBus& bus);
    // prepareRun failed: the run is recorded as failed with its error.
    void prepareFailed(const RunConfig& config, const Error& error);
    // fit() returned: drains the bus into the store; completed, cancelled or failed. With
    // `interrupted`, a cancelled run is marked interrupted (the app closed during the run).
    void fitDone(const Result<FitResult>& result, bool interrupted = false);
    // A remote run's devices, once its tasks reported them (Coordinator::devices()); an empty
    // array changes nothing.
    void setDevices(const nlohmann::json& devices);
    // Commits what the bus has delivered so far (the store batches for up to a second), for a
    // reader that needs it now. Thread-safe; blocks until committed.
    Status flush() { return m_store.flush(); }
    // Keeps the final weights in the store's folder: a copy of `savedPath` (the user's file) if
    // given, else written from `run`'s trainer.
    void keepWeights(PreparedRun& run, const std::string& savedPath, int64_t step);
    // The same for weights that came from elsewhere (a remote run's chief or ps tasks).
    void keepWeights(const std::vector<std::pair<std::string, Tensor>>& weights, const std::map<std::string, std::string>& metadata,
                     const std::string& savedPath, int64_t step);
    // Writes the weights into the run's folder (atomically) as a periodic checkpoint.
    void checkpoint(PreparedRun& run, int64_t epoch, int64_t step);
    // Another file the run wrote (kind "trace"): copied into the store's folder,
    // listed with the run and removed with it (the user's file stays theirs).
    void keepFile(const std::string& kind, const std::string& path);

    std::string runId() const { return m_id; }
    std::string databasePath() const { return m_store.path(); }
    uint64_t droppedEvents() const;
    // Recording problems warned about so far (a failed commit, a checkpoint not kept; not
    // dropped telemetry): non-zero means the record is incomplete, and a command should say so
    // instead of "Recorded as run ...".
    int problems() const { return m_problems.load(); }

private:
    void warn(const Error& e, bool incomplete = true) const;
    Status create(const RunConfig& config, const PreparedRun* run);
    // Writes weights into the run's folder as `fileName` (through `write`, given the path) and
    // records them as a checkpoint of `kind`; a failure is a warning.
    void saveCheckpoint(const std::string& fileName, int64_t step, const std::string& kind,
                        const std::function<Status(const std::string&)>& write);
    // `fileName` in the run's folder of the store, the folder made if needed.
    std::string ownFile(const std::string& fileName);

    RunStore m_store;
    RecordingOptions m_options;
    std::string m_id;
    std::unique_ptr<StoreSink> m_sink;
    std::unique_ptr<telemetry::AdvisorSink> m_advisor;
    uint64_t m_dropped = 0;
    mutable std::atomic<int> m_problems{0};
    telemetry::EventBus* m_bus = nullptr;  // begin()'s, for attach()
};

} // namespace ts::store
