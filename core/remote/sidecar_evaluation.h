#pragma once
// SidecarEvaluation: the evaluator of a multi-worker-mirrored cluster whose tasks were started
// from TF_CONFIG (no coordinator; TF's SidecarEvaluator). The chief starts the cluster's
// evaluator task on the process at the evaluator's TF_CONFIG address (`train --task
// evaluator:0`, or a trainstudio-worker), hands it its weights after each epoch, and gets the
// epoch's validation back while the tasks train on. The weights travel over the task's gRPC
// link instead of through a shared checkpoint folder, so the evaluator needs no shared storage.
// When the evaluator cannot be reached (yet), refuses, or is lost, the chief evaluates the epoch
// on its own test split instead (on the helper thread); an evaluator that is not there or went
// away is asked again before each later evaluation and gets a (new) task once it answers (its
// supervisor restarted it, say).
// Contract:
//  - Threading: submit() and finish() from one thread (the chief's fit thread); evaluations run
//    on a helper thread, which also calls onResult and onNote.
//  - Only the newest weights wait: weights submitted while an evaluation runs replace the ones
//    waiting (TF's evaluator also skips to the newest checkpoint); the summary counts them.
//  - Errors: create() fails only when the run cannot be evaluated at all (the model does not
//    build); an epoch that cannot be evaluated anywhere is reported through onResult.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/result.h"
#include "distribute/cluster_spec.h"
#include "train/trainer.h"

namespace ts {
struct RunConfig;
}

namespace ts::remote {

struct SidecarOptions {
    std::string runId;   // the chief's run: its evaluator task runs under this id
    std::string token;
    std::string who;     // the chief, as the evaluator's log names it ("chief:0 (host:port)")
    // How long the evaluator may stop answering while it evaluates, and how long it is asked
    // every second at the start (after that, only before each evaluation).
    std::chrono::milliseconds heartbeatTimeout{10000};
    std::chrono::milliseconds connectTimeout{30000};
};

struct SidecarResult {
    int64_t epoch = 0;
    uint64_t submission = 0;          // what submit() returned for these weights
    std::optional<EvalResult> value;  // none: it could not be evaluated (error says why)
    Error error;
    std::string by;                   // "evaluator:0" or the chief's task ("chief:0")
};

class SidecarEvaluation {
public:
    // `cfg` validates (its test split is what the evaluator reads on its machine); `spec` has an
    // evaluator and this process's task is the chief (the coordinator task).
    static Result<std::unique_ptr<SidecarEvaluation>> create(const RunConfig& cfg, const ClusterSpec& spec, SidecarOptions options,
                                                             std::function<void(const SidecarResult&)> onResult,
                                                             std::function<void(const std::string&)> onNote);
    ~SidecarEvaluation();  // as finish("")

    // The chief's weights after `epoch` (safetensors bytes). Returns at once, with the number its
    // result carries (an epoch replayed after a restart is submitted again: its first result is stale).
    uint64_t submit(int64_t epoch, std::string weights);
    // The run is over: `reason` kCancelDone (completed: waits for what was submitted), kCancelFailed or ""
    // (cancelled: drops what waits). Stops the evaluator task; returns the summary: evaluations by
    // whom, epochs skipped, the evaluator's loss and rejoins. Idempotent.
    nlohmann::json finish(const std::string& reason);
    // Any thread (Ctrl-C): ends an evaluation in progress and drops the one waiting; finish()
    // then waits for nothing.
    void cancel();

    class Impl;
private:
    explicit SidecarEvaluation(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> m_impl;
};

// The chief of a run its cluster's evaluator has nothing to evaluate for (the run does not
// validate, or validates on a "validation_pipeline"): starts the evaluator task anyway, with the
// run's configuration, and that task completes at once saying why, so that a `train --task
// evaluator:0` process ends instead of waiting for weights. Asks every second until the evaluator
// answers and takes it, options.connectTimeout passes or `stop` is set (the run is over); any
// thread. Best effort: the error says what failed last.
Status releaseUnusedEvaluator(const RunConfig& cfg, const ClusterSpec& spec, const SidecarOptions& options, const std::atomic<bool>& stop);

} // namespace ts::remote
