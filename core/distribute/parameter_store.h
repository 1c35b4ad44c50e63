#pragma once
// ParameterStore: where a ParameterServer worker's variables live — the ps tasks of the cluster.
// The worker strategy pulls current values before each step and pushes its gradients after it;
// the ps tasks apply them with the run's optimizer as they arrive (asynchronous training).
// The gRPC implementation is remote/ps_client.h; core only sees this interface.
// Contract:
//  - Threading: begin/pull/push/flush/staleness are called from one thread (the worker's
//    trainer thread); claimStep may run on a second thread meanwhile (the next step is claimed
//    while one trains); cancel() may be called from any thread and makes pending and later
//    calls return Cancelled promptly.
//  - Ownership: the variables' buffers belong to the caller and must outlive the store's use of
//    them; push() copies the gradients before it returns, so the caller may overwrite them.
//  - Errors: a failed pull or push names the ps task and its address ("ps:1 at 10.0.0.4:7070");
//    an asynchronous push that failed is reported by the next call.
//  - Steps: ps:0 schedules the run's steps (distribute/step_schedule.h); workers train the steps
//    claimStep() hands them, as TF's ClusterCoordinator dispatches steps to free workers.

#include <cstdint>
#include <string>
#include <vector>

#include "common/result.h"
#include "distribute/partitioner.h"
#include "distribute/step_schedule.h"

namespace ts {

struct StoreVariable {
    VariableInfo info;
    float* values = nullptr;       // host memory, info.numel() floats: pull() writes here
    const float* grads = nullptr;  // host memory: push() reads here
};

struct ParamSlot;
// The trainable parameters among `params` (those with a gradient), as a store's variables over
// the slots' own buffers.
std::vector<StoreVariable> trainableStoreVariables(const std::vector<ParamSlot>& params);

struct StalenessStats {
    int64_t pushes = 0;            // pushes acknowledged so far
    int64_t last = -1;             // staleness of the latest acknowledged push (-1: none yet)
    int64_t max = 0;
    double sum = 0;                // over acknowledged pushes (mean = sum / pushes)
};

// The ps tasks' side of a training-state backup: their optimizer's state and update count.
struct StoreSnapshot {
    // Each optimizer state tensor over every variable, in the order begin() got them (one arena,
    // as a local optimizer holds it), e.g. {"adam/m", ...}.
    std::vector<std::pair<std::string, std::vector<float>>> optimizer;
    int64_t updates = 0;  // applied so far (ps:0's count; the ps tasks' Adam step count)
    ScheduleSnapshot schedule;  // ps:0's step schedule at that moment
};

// What worker 0 starts the ps tasks from when a run resumes from its backup.
struct StoreResume {
    StoreSnapshot state;   // no optimizer tensors: a fresh optimizer
    std::string position;  // opaque bytes (worker 0's place in the data) the others read back
};

class ParameterStore {
public:
    virtual ~ParameterStore() = default;
    // Plans the partition of `variables` over the ps tasks. With `initialise` (exactly one worker
    // of a run: worker 0), their current values become the ps tasks' initial values, with
    // `resume`'s optimizer state, update count and position when it is given; the others wait
    // until every ps is initialised and check that it holds the same plan.
    virtual Status begin(const std::vector<StoreVariable>& variables, bool initialise, const StoreResume* resume) = 0;
    // After begin(): the position worker 0 initialised the ps tasks with ("" for a fresh start).
    virtual std::string resumePosition() const = 0;
    // Waits for this worker's pushes, then takes every ps's values (into the variables' buffers),
    // optimizer state and update count, each ps's at one moment (not all ps at the same one:
    // the other workers go on pushing).
    virtual Result<StoreSnapshot> snapshot() = 0;
    // Current values of every variable from every ps (in parallel) into the variables' buffers.
    virtual Status pull() = 0;
    // Sends the gradients to the ps tasks without waiting for them to be applied (at most one
    // push per ps in flight: a second waits for the first). lr is this step's learning rate.
    virtual Status push(float learningRate) = 0;
    // Waits until every push so far has been applied (or failed).
    virtual Status flush() = 0;
    // Updates a ps applied between this worker's pull and its push, over the pushes so far.
    virtual StalenessStats staleness() const = 0;
    virtual void cancel() = 0;
    // Before begin(): the run's schedule, which worker 0's begin() gives ps:0 (with a resume's
    // completed steps and epoch tally, from StoreResume::state.schedule).
    virtual void setSchedule(const ScheduleConfig& schedule) = 0;
    // After begin(): reports the outcomes of steps this worker trained since its last claim and
    // claims its next steps from ps:0. batchesPerEpoch: this worker's part of the data (-1: not
    // known yet). Wait means ask again shortly.
    virtual Result<StepGrant> claimStep(int64_t batchesPerEpoch, const std::vector<StepOutcome>& done) = 0;
};

} // namespace ts
