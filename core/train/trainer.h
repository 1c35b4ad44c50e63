#pragma once
// Trainer: the fit loop (epochs, steps, validation each epoch, cancel) over a Strategy. A
// parameter-server worker's strategy has a step scheduler (ps:0): fit() then trains the steps
// it hands out, on its data read over and over, and validates nothing (the coordinator does).
// Contract:
//  - fit() runs on the calling thread (the engine thread); cancel() may be called from any
//    thread and makes fit() return promptly with FitResult::cancelled set.
//  - Listener callbacks run on the fit() thread, synchronously; keep them cheap (the telemetry
//    bus copies value structs and returns).
//  - Errors (bad data, backend failures) end fit() with an Error naming where it happened;
//    everything reported to the listener before that stays valid.
//  - Telemetry (optional, TrainConfig::bus): fit() publishes RunStateEvent (running, then
//    completed / cancelled / failed), StepMetricsEvent and StepBreakdownEvent every step,
//    EpochMetricsEvent, ErrorEvent on failure, DeviceSampleEvents from a sampler thread, and with
//    `trace` the tracer's SpanEvents from a collector thread. Publishing never blocks (see
//    telemetry/bus.h); the listener API is unchanged and works with or without a bus.

#include <atomic>
#include <condition_variable>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "data/source.h"
#include "distribute/strategy.h"
#include "model/spec.h"
#include "optim/optimizer.h"
#include "train/backup.h"

namespace ts::telemetry {
class EventBus;
class TraceCollector;
}

namespace ts {

class ParameterStore;

struct TrainConfig {
    int64_t epochs = 1;
    int64_t maxSteps = 0;        // > 0: stop after this many steps in total (parameter-server: of all workers)
    uint64_t seed = 0;
    nlohmann::json optimizer;    // null: the model's compile settings
    nlohmann::json schedule;     // null: constant learning rate
    std::string loss;            // empty: the model's compile loss
    int fromLogits = -1;         // -1: the model's setting
    StrategyConfig strategy;
    // Telemetry: events go to `bus` (may be null) stamped with runId. `trace` records spans
    // (input wait, forward, backward, all-reduce, optimizer, checkpoint; per layer with
    // traceLayers) and needs a bus. Device samples at sampleHz while fit() runs (0: none).
    telemetry::EventBus* bus = nullptr;
    std::string runId;
    bool trace = false;
    bool traceLayers = false;
    double sampleHz = 10;
    // Backup and restore (train/backup.h): fit() resumes from the backup in backup.dir if there
    // is one, the chief writes one each epoch or every backup.everySteps steps, and a completed
    // fit() deletes it. backupFingerprint: the run settings a backup must match (prepareRun
    // fills it from the RunConfig).
    BackupConfig backup;
    nlohmann::json backupFingerprint;
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
    int64_t staleness = -1;      // parameter-server: updates the ps applied between this
                                 // worker's pull and its latest acknowledged push; -1 otherwise
    double lossScale = 0;        // mixed_float16: this step's loss scale; 0 without loss scaling
    int64_t skippedSteps = 0;    // mixed_float16: steps skipped so far for non-finite gradients
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
    int64_t skippedSteps = 0;    // of stepsRun, those the loss scale skipped (float16 gradients overflowed)
    int64_t stepsRun = 0;        // steps this process trained in the epoch (after a resume: those after it)
    double lossScale = 0;        // mixed_float16: the loss scale at the epoch's end; 0 otherwise
};

// "epoch N: all M steps were skipped ..." when every step this process ran in the epoch was
// skipped by the loss scale (the weights did not change), with its hint; nullopt otherwise.
std::optional<Error> allStepsSkipped(const EpochEvent& e);

// A task's error that only points at the chief's (a multi-worker run whose chief refused its
// backup): the coordinator reports the chief's own error instead when it arrives.
inline constexpr const char* kChiefCouldNotRestore = "the chief could not restore the run's backup (its error says why)";

struct FitResult {
    int64_t epochs = 0, steps = 0;  // epochs: those reported, a last one cut short by max_steps included
    bool partialEpoch = false;   // the last epoch was cut short by max_steps
    EpochEvent last;             // the last completed (or partial, if stopped) epoch
    double samplesPerSec = 0;    // whole run: samples / training seconds
    double seconds = 0;
    bool cancelled = false;
    int64_t resumedFromStep = -1; // >= 0: fit() continued from a backup made after that step
};

// Where a resumed run's state came from.
struct ResumeSource {
    std::string file;   // this process's own backup file; empty when another process sent the state
    std::string words;  // for people: "the backup <file>", "the chief's backup", "worker 0's backup"
};

class TrainListener {
public:
    virtual ~TrainListener() = default;
    virtual void onStart(const Strategy&) {}
    virtual void onStep(const StepEvent&) {}
    virtual void onEpoch(const EpochEvent&) {}
    // fit() is continuing from a backup (before the first step).
    virtual void onResume(const TrainingPosition&, const ResumeSource&) {}
};

struct EvalResult {
    double loss = 0, accuracy = 0;
    int64_t examples = 0;
};

class Trainer {
public:
    static Result<std::unique_ptr<Trainer>> create(const ModelSpec& model, const TrainConfig& config);
    ~Trainer();

    // Initialises the parameters from the seed (call importParameters after to load weights).
    Status initialise();
    Result<FitResult> fit(BatchSource& train, BatchSource* validation, TrainListener* listener);
    Result<EvalResult> evaluate(BatchSource& data);
    // Any thread: stops fit() at the next step boundary, and wakes it at once if it is blocked
    // waiting for a batch (the sources fit() is reading are cancelled too, which is sticky).
    void cancel();
    // Any thread: holds fit() at the next step boundary until resume() (or cancel()). Paused
    // time counts towards neither the epoch's time nor its throughput. Publishes RunStateEvent
    // Paused / Running when a bus is set.
    void pause();
    void resume();
    bool isPaused() const { return m_paused.load(std::memory_order_relaxed); }
    // Any thread: traces the next `steps` steps of the fit() in progress (capture on demand), as
    // if `trace` had been set for them: spans reach the bus as SpanEvents. Ignored (returns
    // false) without a bus, while the run already traces, or when another run owns the tracer.
    bool requestTrace(int64_t steps, bool layers = false);

    Strategy& strategy() { return *m_strategy; }
    const std::string& modelName() const { return m_modelName; }
    const GraphAnalysis& graph() const { return *m_graph; }
    const LossSpec& loss() const { return m_loss; }
    float baseLearningRate() const { return m_baseLr; }
    int64_t globalStep() const { return m_step; }
    // Sets TrainConfig's telemetry fields after create() (prepareRun builds the Trainer).
    void setTelemetry(telemetry::EventBus* bus, std::string runId, bool trace, bool traceLayers = false);
    // The step in progress (1-based; 0 before the first), for samplers on other threads.
    const std::atomic<int64_t>& stepCounter() const { return m_currentStep; }

    Status saveWeights(const std::string& path);
    // What saveWeights writes, as bytes (safetensors; errors name `label`).
    Result<std::string> encodeWeights(const std::string& label);
    Status loadWeights(const std::string& path);
    // The complete training state at `position` (weights, optimizer state), and loading one:
    // after restoreState the next fit() continues from its position. Errors name `source`.
    Result<TrainingState> captureState(const TrainingPosition& position);
    Status restoreState(const TrainingState& state, const std::string& source);

private:
    Trainer() = default;
    Result<FitResult> fitLoop(BatchSource& train, BatchSource* validation, TrainListener* listener);
    // Parameter-server: the steps ps:0 hands this worker (distribute/step_schedule.h), each on
    // the next batch of its part of the data, read over and over.
    Result<FitResult> fitScheduled(BatchSource& train, ParameterStore& store, TrainListener* listener);
    // Starts or stops an on-demand trace capture between steps (requestTrace()).
    void serviceTraceRequests();
    // Publishes a finished step (breakdown and metrics) and tells the listener.
    void reportStep(const StepEvent& se, int64_t stepStartNs, int64_t stepEndNs, TrainListener* listener);
    std::shared_ptr<const GraphAnalysis> m_graph;
    std::unique_ptr<Strategy> m_strategy;
    TrainConfig m_config;
    LossSpec m_loss;
    LrSchedule m_schedule;
    float m_baseLr = 1e-3f;
    int64_t m_step = 0;
    std::atomic<bool> m_cancel{false};
    std::mutex m_sourceMutex;                 // guards the pointers below against cancel()
    BatchSource* m_activeTrain = nullptr;     // the sources of the fit() in progress
    BatchSource* m_activeValidation = nullptr;
    std::atomic<int64_t> m_currentStep{0};
    bool m_tracing = false;  // this fit() owns the process's tracer
    std::unique_ptr<telemetry::TraceCollector> m_collector;
    int64_t m_traceUntil = 0;                 // > 0: an on-demand capture ends after this step
    std::atomic<int64_t> m_traceRequest{0};   // steps asked for by requestTrace()
    std::atomic<bool> m_traceRequestLayers{false};
    std::atomic<bool> m_paused{false};
    std::mutex m_pauseMutex;
    std::condition_variable m_pauseCv;
    bool startTracing(bool layers);
    void stopTracing();
    // Blocks while paused; returns the seconds spent paused.
    double waitWhilePaused();
    std::string m_modelName;
    std::optional<TrainingPosition> m_resumeAt;  // set by restoreState, consumed by the next fit()
    int64_t m_agreedEpochSteps = -1;          // lockstep local shards: steps of the last complete epoch
    bool m_imbalanceLogged = false;           // lockstep local shards: the uneven-shard note was published
    // Looks for a backup (the chief reads it; multi-worker processes receive the chief's) and
    // restores it. Returns whether the run resumes.
    Result<bool> restoreFromBackup(TrainListener* listener);
    // The chief writes the backup; a failed write ends the run (as in Keras) with the file named.
    // `adjust` (optional) amends the captured state before it is written.
    Status writeBackup(const TrainingPosition& position, const std::function<void(TrainingState&)>& adjust = {});
    // Parameter-server: worker 0's backup, at the position of ps:0's schedule in it.
    Status writeScheduledBackup(int64_t epoch);
    // Draws and drops the first `count` batches of the epoch just started (resuming mid-epoch).
    // Returns whether the source ran out first, which only a lockstep local shard may
    // (`mayRunOut`); for any other source that is an error naming the backup's position.
    Result<bool> skipBatches(BatchSource& train, int64_t count, int64_t epoch, bool mayRunOut);
};

// Checks that a model's output fits the labels (class count, loss kind) before training.
Status checkModelFitsLabels(const GraphAnalysis& graph, const LossSpec& loss, int64_t numClasses,
                            const std::string& dataSource);

} // namespace ts
