#pragma once
// Both ends of a TF_CONFIG multi-worker cluster's evaluator task (TF's side-car evaluator):
// the process started as the evaluator (runEvaluatorTask), and the chief's side (EvaluatorSide),
// which sends it the weights after each epoch and records the validation it sends back.

#include <atomic>
#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "common/result.h"
#include "distribute/cluster_spec.h"
#include "train/trainer.h"

namespace ts::remote {
class SidecarEvaluation;
struct SidecarResult;
} // namespace ts::remote
namespace ts::telemetry { class EventBus; }

namespace tscli {

// Serves the chief's evaluations at this task's TF_CONFIG address until the run ends; the exit
// status: 0 the run completed, 1 otherwise (see evaluator_task.cpp), 2 bad flags, 130 Ctrl-C.
int runEvaluatorTask(const TrainOptions& o, const ts::ClusterSpec& spec);

// The chief's side. Evaluations come back on a helper thread: each is printed (a JSON line with
// "evaluation" under --json) and published on `bus` as the epoch's metrics with val_loss and
// val_accuracy (the store replaces the epoch's row). Not thread-safe otherwise: the fit thread
// calls epochDone(), the main thread finish() and summary() after fit() returned.
class EvaluatorSide {
public:
    // Starts the evaluator task at once (before the cluster is joined and the run recorded, so
    // the evaluator hears from the chief as early as the training tasks do).
    static ts::Result<std::unique_ptr<EvaluatorSide>> start(const ts::RunConfig& cfg, const ts::ClusterSpec& spec, const TrainOptions& o,
                                                            ts::telemetry::EventBus& bus);
    // The recorded run the validations go into (before the first epoch ends).
    void recordInto(const std::string& runId);
    ~EvaluatorSide();
    // At an epoch's end (the fit thread): hands the trainer's weights to the evaluator.
    void epochDone(ts::Trainer& trainer, const ts::EpochEvent& e);
    // After fit(): waits for the evaluations of a completed run (drops them otherwise), stops the
    // evaluator task, and puts the last epoch's validation into `result` when it was evaluated.
    void finish(ts::Result<ts::FitResult>& result, bool interrupted);
    // Any thread (Ctrl-C during finish()): stops waiting for the evaluations.
    void cancel();
    // Who evaluated how many epochs, skipped ones, the evaluator's loss ("evaluator" in --json's final line).
    const nlohmann::json& summary() const { return m_summary; }

private:
    EvaluatorSide(const TrainOptions& o, ts::telemetry::EventBus& bus);
    void evaluated(const ts::remote::SidecarResult& r);
    void warn(const std::string& line);

    const TrainOptions& m_o;
    ts::telemetry::EventBus& m_bus;
    std::unique_ptr<ts::remote::SidecarEvaluation> m_evaluation;
    std::mutex m_mutex;
    std::string m_runId;                // under m_mutex
    struct Epoch {
        ts::EpochEvent event;
        int64_t step = 0;
        int64_t wallUs = 0;
        uint64_t submission = 0;  // its weights' (an older result of a replayed epoch is stale)
        std::optional<ts::EvalResult> value;  // once evaluated
    };
    std::map<int64_t, Epoch> m_epochs;  // under m_mutex
    nlohmann::json m_summary = nlohmann::json::object();
};

// The chief's side when its run gives the cluster's evaluator nothing to evaluate (it does not
// validate, or validates on a "validation_pipeline"): tells the evaluator so on a helper thread,
// until it answers or this goes, so that the evaluator process exits instead of waiting.
class UnusedEvaluator {
public:
    UnusedEvaluator(const ts::RunConfig& cfg, const ts::ClusterSpec& spec, const TrainOptions& o);
    // After the run: a short run may end before the evaluator process listens, so it is given
    // up to 3 s more.
    void finish();
    ~UnusedEvaluator();  // stops asking

private:
    std::atomic<bool> m_stop{false};
    std::promise<void> m_released;  // the helper thread is done asking
    std::future<void> m_done;
    std::thread m_thread;
};

} // namespace tscli
