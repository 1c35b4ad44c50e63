#pragma once
// RunEvaluator: a distributed run's weights seen from outside the training: a one-device copy of
// the model that evaluates weights on the test split: a parameter-server run's, pulled from its
// ps tasks; a multi-worker-mirrored run's, the chief's after an epoch, given to it. The
// coordinator uses one for a parameter-server run's final weights, and evaluates with it when
// the cluster has no evaluator task or lost it; an evaluator task (TF's side-car evaluator) uses
// one on its own machine.
// Contract:
//  - Threading: one thread at a time (the caller serialises); cancel() of the store from any.
//  - Ownership: owns its model, its link to the ps tasks (none without pullFromPs) and its copy
//    of the test split.
//  - Errors: Result errors from the ps tasks (unreachable, not initialised), the data files or
//    weights that do not fit the model (named), with their hints.

#include <memory>
#include <string>
#include <string_view>

#include "common/result.h"
#include "distribute/cluster_spec.h"
#include "remote/auth.h"
#include "train/trainer.h"

namespace ts {
struct SafetensorsFile;
struct RunConfig;
struct InMemoryDataset;
class InMemoryBatchSource;
}

namespace ts::remote {

class RemoteParameterStore;

struct RunEvaluatorOptions {
    std::string runId;           // the attempt whose ps tasks hold the weights
    std::string token;
    TlsFiles tls;
    std::string who = "coordinator";  // for the ps tasks' logs ("evaluator:0")
    bool loadValidation = true;  // read the test split now (when the run validates)
    bool pullFromPs = true;      // false: a multi-worker-mirrored run's evaluator, given the weights
};

class RunEvaluator {
public:
    static Result<std::unique_ptr<RunEvaluator>> create(const RunConfig& config, const ClusterSpec& spec, const RunEvaluatorOptions& options);
    // Why a run's evaluator task has nothing to evaluate (empty: it evaluates): the run does not
    // validate, or (multi-worker-mirrored) validates on a "validation_pipeline", which its
    // training tasks read (an evaluator reads the idx test split).
    static std::string nothingToEvaluate(const RunConfig& config);
    ~RunEvaluator();

    // The ps tasks' current weights into this model.
    Status pullWeights();
    // The ps tasks' current weights on the test split (an error when the run does not validate).
    Result<EvalResult> evaluate();
    // `weights` (named `source` in errors) on the test split.
    Result<EvalResult> evaluate(const SafetensorsFile& weights, const std::string& source);
    // The same from a safetensors file's bytes (damaged ones are an error naming `source`).
    Result<EvalResult> evaluateEncoded(std::string_view weights, const std::string& source);
    // Reads the test split now (one created without it that must evaluate after all).
    Status loadValidation();
    Trainer& trainer() { return *m_trainer; }
    const std::shared_ptr<RemoteParameterStore>& store() const { return m_store; }  // null without pullFromPs

private:
    RunEvaluator() = default;
    Status checkValidates() const;
    std::unique_ptr<Trainer> m_trainer;
    std::shared_ptr<RemoteParameterStore> m_store;
    std::shared_ptr<InMemoryDataset> m_test;
    std::unique_ptr<InMemoryBatchSource> m_validation;  // null: not loaded, or the run does not validate
    std::unique_ptr<RunConfig> m_config;
    bool m_begun = false;
};

} // namespace ts::remote
