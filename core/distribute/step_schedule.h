#pragma once
// StepSchedule: the steps of a parameter-server run, handed to whichever worker asks next, as
// TF's ClusterCoordinator dispatches each scheduled step to a free worker. An epoch is a number
// of steps over all workers, not each worker's pass over its data: a slow worker takes fewer of
// them instead of holding the epoch back, and the steps a lost worker held go to the others.
// ps:0's daemon serves one (ParameterServer.ClaimStep); this class is its logic, without gRPC.
//
// Steps are numbered 1.. over the run; none is handed out before every worker checked in. A
// claim gets a few consecutive steps (like Keras's steps_per_execution), so a claim's round
// trip is paid once for several steps. An epoch has the sum of every worker's batches per epoch
// (each worker reads its own part of the data, repeated: a worker that runs out starts its part
// again). A worker whose part's length is not known yet (a CSV file before its first pass) says
// so; until every worker's is known, steps count in epoch 1 and the epoch's size is fixed when
// the last one becomes known (tf.data learns a cardinality the same way).
//
// Contract:
//  - Threading: every member may be called from any thread (one mutex inside).
//  - Errors: claims from a worker that was released (until it is readmitted), or outcomes for
//    steps a worker does not hold, are refused with a message naming the worker and the step.

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/result.h"

namespace ts {

// Loss, accuracy and examples of some steps (one step's, or an epoch's so far).
struct StepTally {
    int64_t steps = 0;
    double lossSum = 0;   // sum over examples
    int64_t correct = 0;
    int64_t count = 0;    // examples
    double seconds = 0;   // an epoch's: from its first claim to its last step's outcome
};

struct ScheduleConfig {
    int workers = 1;
    int64_t epochs = 1;
    int64_t maxSteps = 0;     // > 0: the run ends after this many steps in all
    // Steps per claim (Keras's steps_per_execution for the same reason: one round trip for
    // several steps); 0: automatic, up to 8 while every worker still gets 32 claims an epoch.
    int64_t maxBlock = 0;
    // Resuming from a backup: steps completed before it, and the tally of the epoch it was in.
    int64_t completed = 0;
    StepTally epochSoFar;
};

// Steps [step, step + count) for one worker (a lost worker's returned steps come one by one).
struct StepGrant {
    enum class Kind { Step, Wait, Done };
    Kind kind = Kind::Done;
    int64_t step = 0;           // 1-based over the run
    int64_t count = 0;
    int64_t epoch = 0;          // of `step`, 1-based
    int64_t stepInEpoch = 0;    // of `step`, 1-based
    int64_t stepsPerEpoch = -1; // -1: not known yet
    int64_t totalSteps = -1;    // -1: not known yet
};

// What a worker reports for a step it trained, with its next claim.
struct StepOutcome {
    int64_t step = 0;
    double lossSum = 0;
    int64_t correct = 0;
    int64_t count = 0;
};

// An epoch whose every step has an outcome.
struct EpochDone {
    int64_t epoch = 0;
    int64_t lastStep = 0;  // the run's steps up to its end
    StepTally tally;
};

// What a backup keeps: the steps with an outcome so far and the current epoch's tally. Steps
// held by workers at that moment are trained again after a resume.
struct ScheduleSnapshot {
    int64_t completed = 0;
    StepTally epochSoFar;
};

// Where `step` lies: its epoch and place in it (epoch 1 while the epoch's size is unknown, -1).
std::pair<int64_t, int64_t> stepPosition(int64_t step, int64_t stepsPerEpoch);

// A snapshot as the float32 bits of a backup tensor (12 values), and back (nullopt: wrong size).
std::vector<float> encodeScheduleSnapshot(const ScheduleSnapshot& s);
std::optional<ScheduleSnapshot> decodeScheduleSnapshot(const float* values, int64_t n);

class StepSchedule {
public:
    using Clock = std::chrono::steady_clock;
    explicit StepSchedule(ScheduleConfig config);

    // `worker` ("worker:1") reports the outcomes of steps it held (`done`), says how many
    // batches its part of the data has per epoch (-1: not known yet), and gets its next steps,
    // Wait (every step is handed out, but others still hold some: one may come back), or Done.
    // Epochs that became complete are appended to `epochs`, in order.
    Result<StepGrant> claim(const std::string& worker, int64_t batchesPerEpoch, const std::vector<StepOutcome>& done,
                            std::vector<EpochDone>* epochs);
    // `worker` is gone: the steps it holds go to the next claims, its later claims are refused,
    // and its part of the data no longer counts towards an epoch it had not sized yet.
    void release(const std::string& worker);
    // A released `worker` takes steps again (its daemon came back and the coordinator started it
    // anew, as TF's ClusterCoordinator uses a recovered worker again). Call it only once the old
    // task is gone: the worker holds no steps then (release returned them, and a released
    // worker's claims are refused). Its part of the data counts again for an unsized epoch.
    void readmit(const std::string& worker);
    ScheduleSnapshot snapshot() const;
    // Steps with an outcome so far.
    int64_t completed() const;

private:
    int64_t epochOf(int64_t step) const;
    int64_t epochSize(int64_t epoch) const;
    int64_t lastStep() const;  // -1: unknown yet
    void fixEpochSize();
    void collect(std::vector<EpochDone>* epochs);

    mutable std::mutex m_mutex;
    ScheduleConfig m_config;
    int64_t m_stepsPerEpoch = -1;
    int64_t m_block = 1;                           // steps per claim, once the epoch's size is known
    int64_t m_next = 1;                            // the next step never handed out
    std::set<int64_t> m_returned;                  // released steps, handed out first
    std::map<int64_t, std::string> m_held;         // step -> worker
    std::map<std::string, int64_t> m_batches;      // worker -> its batches per epoch (-1 unknown)
    std::set<std::string> m_released;
    int64_t m_completed = 0;
    // Outcomes not yet folded into an epoch (while the epoch size is unknown, or of epochs after
    // the one being tallied), by step.
    std::map<int64_t, StepOutcome> m_pending;
    int64_t m_epoch = 1;                           // the epoch being tallied
    StepTally m_tally;                             // its outcomes so far
    std::optional<Clock::time_point> m_epochStart; // its first claim
    double m_resumedSeconds = 0;
};

} // namespace ts
