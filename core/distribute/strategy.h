#pragma once
// Strategy: owns the replicas of a model (one Program per device), splits each global batch
// across them, and makes every replica apply the same update from the summed gradients.
// The Trainer's loop is identical for one device or many; only the Strategy differs.
// Contract:
//  - Threading: trainStep/evalStep/initialise/export/import are called from one thread (the
//    trainer's). Mirrored runs replica r > 0 on its own worker thread; replica 0 runs on the
//    caller's thread. cancel() may be called from any thread.
//  - Determinism: given the same seed, batches and thread counts, results are bit-identical.
//  - Errors: a failing replica aborts the communicator so the others return instead of waiting;
//    the step returns the first error, naming the replica's device.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "common/limits.h"
#include "data/source.h"
#include "distribute/partitioner.h"
#include "nn/program.h"
#include "optim/precision.h"

namespace ts {

class Communicator;
class ParameterStore;

// "parameter-server" (or "parameter_server"): variables on ps tasks, workers push asynchronously.
bool isParameterServer(const std::string& kind);

struct StrategyConfig {
    std::string kind = "one-device";  // "one-device" | "mirrored" | "multi-worker-mirrored" | "parameter-server"
    std::vector<Device> devices;      // empty: cpu:0 (one-device, multi-worker) / cpu:0..cores-1 (mirrored)
    int threads = 0;                  // total CPU threads of this process; 0 = all cores
    std::string backend;              // force a backend by name ("reference", "cpu"); empty = best
    // multi-worker-mirrored: the link to the other processes (one rank per process, e.g. the
    // Gloo communicator from remote/cluster.h); this process is rank `processRank` of it.
    // Every process gets the same global batches; process p's replicas take its share of the
    // rows (global replica p * local replicas + r), so the run equals one process with all the
    // replicas. Not part of the JSON: the caller connects the cluster.
    std::shared_ptr<Communicator> crossProcess;
    int processRank = 0;
    std::vector<std::string> processNames;  // each rank's task for messages ("worker:1 at host:port"); may be empty
    // Device collectives (NCCL): a collective whose peers make no progress this long fails.
    std::chrono::milliseconds collectiveTimeout{30000};
    // parameter-server: the ps tasks holding the variables (remote/ps_client.h), and this
    // worker's place: worker processRank of numWorkers trains on rows
    // [rank * B / n, (rank + 1) * B / n) of every global batch (element-wise auto-sharding).
    // `partition` travels in the run's JSON ("strategy": {"partition": {...}}); the store does not.
    std::shared_ptr<ParameterStore> parameterStore;
    int numWorkers = 1;
    PartitionOptions partition;
    // Parameter-server: this worker's task joins a run in progress (the coordinator lost its old
    // one and started it anew): it neither initialises the ps tasks (even as worker 0) nor
    // resumes from a backup; it trains the steps ps:0 hands it from now on.
    bool joinRunning = false;
    // Mixed precision: every replica's backend computes dense and convolution layers in the
    // policy's type (an error naming the device if it cannot), and under mixed_float16 the loss
    // is scaled (optim/precision.h). Set from the run's "precision".
    PrecisionConfig precision;
};

struct StepStats {
    double lossSum = 0;   // sum over rows of the per-sample loss
    int64_t correct = 0;
    int64_t count = 0;
    int64_t staleness = -1;  // parameter-server: of the latest acknowledged push (-1: none/not PS)
    // Loss scaling (mixed_float16): the scale this step's loss was multiplied by (0: no loss
    // scaling), whether the step was skipped for non-finite gradients, and how many were so far.
    float lossScale = 0;
    bool skipped = false;
    int64_t skippedSteps = 0;
};

class Strategy {
public:
    virtual ~Strategy() = default;
    static Result<std::unique_ptr<Strategy>> create(const StrategyConfig& config,
                                                    std::shared_ptr<const GraphAnalysis> graph,
                                                    const LossSpec& loss,
                                                    const nlohmann::json& optimizer);

    virtual std::string name() const = 0;
    virtual int numReplicas() const = 0;     // in this process
    virtual int globalReplicas() const { return numReplicas(); }  // in all processes of the run
    virtual std::vector<DeviceInfo> devices() const = 0;
    virtual int threadsPerReplica() const = 0;

    // Initialises replica 0's parameters from seed and mirrors them to the others.
    virtual Status initialise(uint64_t seed) = 0;
    // One synchronous step on a global batch. A Batch::localShard is this process's part of it
    // (nominal size batch.globalRows); the returned count is then the true global size, and a
    // step in which every process's batch is empty (their shards have run out) updates nothing
    // and returns a count of 0.
    virtual Result<StepStats> trainStep(const Batch& batch, float lr, int64_t step, uint64_t seed) = 0;
    virtual Result<StepStats> evalStep(const Batch& batch) = 0;
    // True when every process takes part in every step (multi-worker mirrored): a process whose
    // local shard has run out must join the others' remaining steps with empty batches.
    virtual bool lockstep() const { return false; }

    virtual Result<std::vector<std::pair<std::string, Tensor>>> exportParameters() = 0;
    virtual Status importParameters(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                    const std::string& source) = 0;
    virtual Program& primary() = 0;
    virtual void cancel() = 0;
    // This process's run failed outside a collective (its input, a backup): the other processes
    // of a multi-worker run are told `cause` (its message, code and hint) and stop with it,
    // instead of finding this process silent seconds later and restarting for a task that is
    // not coming back. Idempotent; the peers hear nothing more after a collective failed (they
    // know) and there are none in a single process (its replicas' collectives are released).
    // Any thread.
    virtual void abandon(const Error& cause) { (void)cause; }

    // Training-state backups (train/backup.h): host copies of the optimizer's state, and loading
    // them into every replica. The parameter-server strategy keeps that state on the ps tasks and
    // returns Unsupported.
    virtual Result<std::vector<std::pair<std::string, Tensor>>> exportOptimizerState();
    virtual Status importOptimizerState(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                        const std::string& source);
    // Multi-worker: this process's rank (0 = the chief, which writes backups), and a collective
    // copy of the chief's host F32 tensor into every process's `t` (same shape everywhere). In
    // a single process: rank 0 and a no-op.
    virtual int processRank() const { return 0; }
    virtual int processCount() const { return 1; }
    virtual Status broadcastFromChief(Tensor&) { return okStatus(); }
    // Parameter-server: the chief's resume point (opaque bytes, "" for a fresh start) reaches
    // every worker through the ps tasks, which this starts; the chief passes its own and every
    // worker gets it back. Unsupported elsewhere: the trainer broadcasts it (broadcastFromChief).
    virtual bool sharesResumeThroughStore() const { return false; }
    virtual Result<std::string> shareResumePoint(const std::string& chiefs);
    // Parameter-server: the store whose ps:0 schedules this worker's steps (the trainer claims
    // each step from it), else null; and start(), which makes it ready to claim from (worker 0
    // initialises the ps tasks, the others wait for them). A no-op elsewhere.
    virtual ParameterStore* stepScheduler() { return nullptr; }
    virtual Status start() { return okStatus(); }
};

} // namespace ts
