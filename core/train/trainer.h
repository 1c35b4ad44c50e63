#pragma once
// Trainer: the fit loop (epochs, steps, validation each epoch, cancel) over a Strategy.
// Contract:
//  - fit() runs on the calling thread (the engine thread); cancel() may be called from any
//    thread and makes fit() return promptly with FitResult::cancelled set.
//  - Listener callbacks run on the fit() thread, synchronously; keep them cheap (the telemetry
//    bus copies value structs and returns).
//  - Errors (bad data, backend failures) end fit() with an Error naming where it happened;
//    everything reported to the listener before that stays valid.

#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "data/source.h"
#include "distribute/strategy.h"
#include "model/spec.h"
#include "optim/optimizer.h"

namespace ts {

struct TrainConfig {
    int64_t epochs = 1;
    int64_t maxSteps = 0;        // > 0: stop after this many steps in total
    uint64_t seed = 0;
    nlohmann::json optimizer;    // null: the model's compile settings
    nlohmann::json schedule;     // null: constant learning rate
    std::string loss;            // empty: the model's compile loss
    int fromLogits = -1;         // -1: the model's setting
    StrategyConfig strategy;
};

struct StepEvent {
    int64_t step = 0;            // 1-based global step
    int64_t epoch = 0;           // 1-based
    int64_t stepInEpoch = 0;     // 1-based
    int64_t stepsInEpoch = 0;    // -1 if unknown
    double loss = 0;             // running mean over this epoch so far
    double accuracy = 0;         // running mean over this epoch so far
    double samplesPerSec = 0;    // this epoch so far
    double learningRate = 0;
    double stepSeconds = 0;      // wall time of this step
    double inputWaitSeconds = 0; // time waiting for the batch
    int64_t batchSize = 0;
};

struct EpochEvent {
    int64_t epoch = 0;
    int64_t steps = 0;
    double loss = 0, accuracy = 0;
    double valLoss = std::numeric_limits<double>::quiet_NaN();
    double valAccuracy = std::numeric_limits<double>::quiet_NaN();
    double samplesPerSec = 0;
    double seconds = 0;          // training time of the epoch (validation excluded)
    double inputWaitSeconds = 0;
};

struct FitResult {
    int64_t epochs = 0, steps = 0;
    EpochEvent last;             // the last completed (or partial, if stopped) epoch
    double samplesPerSec = 0;    // whole run: samples / training seconds
    double seconds = 0;
    bool cancelled = false;
};

class TrainListener {
public:
    virtual ~TrainListener() = default;
    virtual void onStart(const Strategy&) {}
    virtual void onStep(const StepEvent&) {}
    virtual void onEpoch(const EpochEvent&) {}
};

struct EvalResult {
    double loss = 0, accuracy = 0;
    int64_t examples = 0;
};

class Trainer {
public:
    static Result<std::unique_ptr<Trainer>> create(const ModelSpec& model, const TrainConfig& config);

    // Initialises the parameters from the seed (call importParameters after to load weights).
    Status initialise();
    Result<FitResult> fit(BatchSource& train, BatchSource* validation, TrainListener* listener);
    Result<EvalResult> evaluate(BatchSource& data);
    void cancel();

    Strategy& strategy() { return *m_strategy; }
    const GraphAnalysis& graph() const { return *m_graph; }
    const LossSpec& loss() const { return m_loss; }
    float baseLearningRate() const { return m_baseLr; }
    int64_t globalStep() const { return m_step; }

    Status saveWeights(const std::string& path);
    Status loadWeights(const std::string& path);

private:
    Trainer() = default;
    std::shared_ptr<const GraphAnalysis> m_graph;
    std::unique_ptr<Strategy> m_strategy;
    TrainConfig m_config;
    LossSpec m_loss;
    LrSchedule m_schedule;
    float m_baseLr = 1e-3f;
    int64_t m_step = 0;
    std::atomic<bool> m_cancel{false};
    std::string m_modelName;
};

// Checks that a model's output fits the labels (class count, loss kind) before training.
Status checkModelFitsLabels(const GraphAnalysis& graph, const LossSpec& loss, int64_t numClasses,
                            const std::string& dataSource);

} // namespace ts
