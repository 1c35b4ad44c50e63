#include "train/trainer.h"

#include <chrono>
#include <cstring>
#include <filesystem>
#include <future>
#include <thread>
#include <tuple>
#include <utility>

#include "distribute/parameter_store.h"
#include "io/safetensors.h"
#include "telemetry/breakdown.h"
#include "telemetry/bus.h"
#include "telemetry/sampler.h"
#include "telemetry/tracer.h"

namespace ts {
namespace {
using Clock = std::chrono::steady_clock;
double secondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The tracer is process-wide: one run at a time may own it.
std::atomic<bool> g_traceOwned{false};

const telemetry::Lane& trainerLane()
{
    static const telemetry::Lane lane{"local", "", "trainer"};
    return lane;
}
}

Status checkModelFitsLabels(const GraphAnalysis& graph, const LossSpec& loss, int64_t numClasses,
                            const std::string& dataSource)
{
    if (graph.outputNodes.size() != 1) return okStatus();
    const NodeInfo& out = graph.nodes[static_cast<std::size_t>(graph.outputNodes[0])];
    const bool oneOutput = out.outputShape.rank() == 1 && out.outputShape[0] == 1;  // a regression on the ids may be meant
    if (numClasses > 0 && (loss.kind == LossKind::CategoricalCrossentropy ||
                           (loss.kind != LossKind::SparseCategoricalCrossentropy && !oneOutput))) {
        // Class ids against a loss that wants one-hot rows or 0/1 targets: the loss turned NaN at
        // the first step and the hint blamed the learning rate.
        const char* name = lossName(loss.kind);
        return makeError(ErrorCode::InvalidArgument,
                         std::string("the loss ") + name + " needs " +
                             (loss.kind == LossKind::CategoricalCrossentropy ? "one-hot label rows" : "a target per output") +
                             ", but the labels in " + dataSource + " are class ids (0.." + std::to_string(numClasses - 1) + ")",
                         "use sparse_categorical_crossentropy, Keras' loss for integer class ids (compile.loss, or --config's \"loss\")");
    }
    if (loss.kind == LossKind::SparseCategoricalCrossentropy || loss.kind == LossKind::CategoricalCrossentropy) {
        if (out.outputShape.rank() != 1)
            return makeError(ErrorCode::ShapeMismatch,
                             "output node '" + out.id + "' has shape " + out.outputShape.toString() +
                                 "; a classification loss needs one score per class",
                             "add Flatten/GlobalAveragePooling2D and a Dense(" + std::to_string(numClasses) + ") output");
        if (numClasses > 0 && out.outputShape[0] != numClasses) {
            const std::string units = std::to_string(out.outputShape[0]);
            // Labels beyond the output may also be a damaged labels file, not a model to change.
            return makeError(ErrorCode::ShapeMismatch,
                             "output node '" + out.id + "' produces " + units + " classes but the labels in " + dataSource +
                                 " go up to " + std::to_string(numClasses - 1) + " (" + std::to_string(numClasses) + " classes)",
                             "set units of '" + out.id + "' to " + std::to_string(numClasses) +
                                 (numClasses > out.outputShape[0]
                                      ? "; if the data has only " + units + " classes, its labels are damaged (ids must be 0.." +
                                            std::to_string(out.outputShape[0] - 1) + ")"
                                      : ""));
        }
    }
    return okStatus();
}

Result<std::unique_ptr<Trainer>> Trainer::create(const ModelSpec& model, const TrainConfig& config)
{
    std::unique_ptr<Trainer> t(new Trainer());
    t->m_config = config;
    t->m_modelName = model.name;
    auto analysis = std::make_shared<GraphAnalysis>(analyzeModel(model));
    TS_TRY(problemsToStatus(*analysis, model.name));
    t->m_graph = analysis;
    const std::string lossName = config.loss.empty() ? model.compile.loss : config.loss;
    const bool fromLogits = config.fromLogits < 0 ? model.compile.fromLogits : config.fromLogits != 0;
    TS_ASSIGN(t->m_loss, parseLoss(lossName, fromLogits));
    nlohmann::json opt = config.optimizer.is_null() ? model.compile.optimizer : config.optimizer;
    if (config.epochs < 1 && config.maxSteps < 1)
        return makeError(ErrorCode::InvalidArgument, "epochs must be >= 1", "pass --epochs N with N >= 1");
    TS_ASSIGN(auto probe, Optimizer::create(opt));  // validates the config before any allocation
    t->m_baseLr = probe->learningRate();
    TS_ASSIGN(t->m_schedule, LrSchedule::create(config.schedule, t->m_baseLr));
    TS_TRY(checkBackupConfig(config.backup));
    TS_ASSIGN(t->m_strategy, Strategy::create(config.strategy, analysis, t->m_loss, opt));
    return t;
}

Status Trainer::initialise() { return m_strategy->initialise(m_config.seed); }

Trainer::~Trainer() = default;

void Trainer::cancel()
{
    m_cancel = true;
    {
        std::lock_guard lock(m_pauseMutex);
        m_pauseCv.notify_all();
    }
    m_strategy->cancel();
    std::lock_guard lock(m_sourceMutex);
    if (m_activeTrain) m_activeTrain->cancel();
    if (m_activeValidation) m_activeValidation->cancel();
}

void Trainer::pause()
{
    std::lock_guard lock(m_pauseMutex);
    m_paused = true;
}

void Trainer::resume()
{
    std::lock_guard lock(m_pauseMutex);
    m_paused = false;
    m_pauseCv.notify_all();
}

double Trainer::waitWhilePaused()
{
    using namespace telemetry;
    if (!m_paused.load(std::memory_order_relaxed)) return 0;
    const auto t0 = Clock::now();
    auto publishState = [&](RunState state) {
        if (!m_config.bus) return;
        RunStateEvent e;
        e.stamp = Stamp{m_config.runId, m_step, wallNowMicros(), trainerLane()};
        e.state = state;
        m_config.bus->publish(Event(std::move(e)));
    };
    publishState(RunState::Paused);
    {
        std::unique_lock lock(m_pauseMutex);
        m_pauseCv.wait(lock, [&] { return !m_paused || m_cancel; });
    }
    if (!m_cancel) publishState(RunState::Running);
    return secondsSince(t0);
}

bool Trainer::requestTrace(int64_t steps, bool layers)
{
    if (!m_config.bus || steps <= 0 || m_config.trace) return false;
    m_traceRequestLayers = layers;
    m_traceRequest = steps;
    return true;
}

bool Trainer::startTracing(bool layers)
{
    using namespace telemetry;
    bool expected = false;
    if (!g_traceOwned.compare_exchange_strong(expected, true)) return false;
    m_tracing = true;
    Tracer::instance().beginSession();  // fences off leftovers of an earlier traced run
    Tracer::setStep(m_step);
    Tracer::setThreadLane(Lane{"local", m_strategy->primary().backend().device().toString(), "replica 0"});
    Tracer::setLevel(layers ? TraceLevel::Detailed : TraceLevel::Spans);
    m_collector = std::make_unique<TraceCollector>(*m_config.bus, m_config.runId);
    return true;
}

void Trainer::stopTracing()
{
    using namespace telemetry;
    if (!m_tracing) return;
    Tracer::setLevel(TraceLevel::Off);
    m_collector->stop();  // publishes everything recorded, this thread's buffer included
    m_collector.reset();
    m_tracing = false;
    m_traceUntil = 0;
    g_traceOwned = false;
}

void Trainer::setTelemetry(telemetry::EventBus* bus, std::string runId, bool trace, bool traceLayers)
{
    m_config.bus = bus;
    m_config.runId = std::move(runId);
    m_config.trace = trace;
    m_config.traceLayers = traceLayers;
}

Result<FitResult> Trainer::fit(BatchSource& train, BatchSource* validation, TrainListener* listener)
{
    using namespace telemetry;
    EventBus* bus = m_config.bus;
    if (m_config.trace && !bus)
        return makeError(ErrorCode::InvalidArgument, "tracing a run needs a telemetry bus",
                         "set TrainConfig::bus (trainstudio-cli does this for --trace)");
    auto stamp = [&] {
        Stamp s;
        s.runId = m_config.runId;
        s.step = m_step;
        s.wallTimeUs = wallNowMicros();
        s.lane = trainerLane();
        return s;
    };
    auto log = [&](LogLevel level, std::string message) {
        LogEvent e;
        e.stamp = stamp();
        e.level = level;
        e.message = std::move(message);
        bus->publish(Event(std::move(e)));
    };
    std::unique_ptr<DeviceSampler> sampler;
    m_tracing = false;
    m_traceUntil = 0;
    if (bus) {
        RunStateEvent running;
        running.stamp = stamp();
        running.state = RunState::Running;
        bus->publish(Event(std::move(running)));
        if (m_config.trace && !startTracing(m_config.traceLayers))
            log(LogLevel::Warning, "another run in this process is being traced; this run records no spans");
        if (m_config.sampleHz > 0) {
            SamplerOptions so;
            so.hz = m_config.sampleHz;
            so.runId = m_config.runId;
            so.step = &m_currentStep;
            sampler = std::make_unique<DeviceSampler>(so);
            const Backend* be = &m_strategy->primary().backend();
            sampler->addProbe(Lane{"local", be->device().toString(), "sampler"}, [be] { return be->sample(); });
            Status st = sampler->start(*bus);
            if (!st.ok()) {
                log(LogLevel::Warning, "device sampling is off: " + st.error().message);
                sampler.reset();
            }
        }
    }
    {
        std::lock_guard lock(m_sourceMutex);
        m_activeTrain = &train;
        m_activeValidation = validation;
    }
    if (m_cancel) {  // cancelled before the sources were known
        train.cancel();
        if (validation) validation->cancel();
    }
    ParameterStore* scheduler = m_strategy->stepScheduler();
    if (scheduler) {
        // ps:0 hands out the run's steps: epochs x the workers' batches (or max_steps) in all.
        ScheduleConfig sc;
        sc.workers = m_strategy->globalReplicas();
        sc.epochs = m_config.epochs > 0 ? m_config.epochs : 1;
        sc.maxSteps = m_config.maxSteps;
        scheduler->setSchedule(sc);
    }
    auto result = [&]() -> Result<FitResult> {
        // A worker joining a parameter-server run in progress takes up the run where it is.
        if (m_config.backup.enabled() && !m_config.strategy.joinRunning) TS_TRY(restoreFromBackup(listener));
        if (scheduler) return fitScheduled(train, *scheduler, listener);
        return fitLoop(train, validation, listener);
    }();
    if (!result.ok()) m_strategy->abandon(result.error());
    if (result.ok() && !result->cancelled && m_config.backup.enabled() && m_strategy->processRank() == 0) {
        // Keras deletes the backup when training ends: a later run with the same folder starts anew.
        std::error_code ec;
        std::filesystem::remove(backupPath(m_config.backup.dir), ec);
    }
    {
        std::lock_guard lock(m_sourceMutex);
        m_activeTrain = m_activeValidation = nullptr;
    }
    if (sampler) sampler->stop();
    stopTracing();
    if (bus) {
        RunStateEvent end;
        end.stamp = stamp();
        if (!result.ok()) {
            ErrorEvent err;
            err.stamp = end.stamp;
            err.message = result.error().message;
            err.hint = result.error().hint;
            err.where = "training " + (m_modelName.empty() ? std::string("the model") : "model '" + m_modelName + "'");
            bus->publish(Event(std::move(err)));
            end.state = result.error().code == ErrorCode::Cancelled ? RunState::Cancelled : RunState::Failed;
            end.message = result.error().message;
        } else {
            end.state = result->cancelled ? RunState::Cancelled : RunState::Completed;
        }
        bus->publish(Event(std::move(end)));
    }
    return result;
}

namespace {

// A step's running means over its epoch so far (seen > 0).
// Accuracy as Keras reports it for the loss: categorical (argmax) or binary; none (NaN) for a
// regression (mean_squared_error), where "accuracy 0.0000" read as a useless model.
double accuracyOf(const LossSpec& loss, int64_t correct, int64_t seen)
{
    if (loss.kind == LossKind::MeanSquaredError || seen == 0) return std::numeric_limits<double>::quiet_NaN();
    return static_cast<double>(correct) / static_cast<double>(seen);
}

void setRunningMeans(StepEvent& se, const LossSpec& loss, double lossSum, int64_t correct, int64_t seen, double seconds)
{
    se.loss = lossSum / static_cast<double>(seen);
    se.accuracy = accuracyOf(loss, correct, seen);
    se.samplesPerSec = static_cast<double>(seen) / std::max(1e-9, seconds);
}

} // namespace

Result<FitResult> Trainer::fitLoop(BatchSource& train, BatchSource* validation, TrainListener* listener)
{
    using namespace telemetry;
    EventBus* bus = m_config.bus;
    FitResult result;
    if (listener) listener->onStart(*m_strategy);
    const int64_t epochs = m_config.epochs > 0 ? m_config.epochs : 1;
    double trainSeconds = 0;
    int64_t trainSamples = 0;
    const std::optional<TrainingPosition> resume = std::exchange(m_resumeAt, std::nullopt);
    const int64_t firstEpoch = resume ? resume->epoch : 1;
    if (resume) result.resumedFromStep = resume->step;
    result.epochs = firstEpoch - 1;
    const bool backups = m_config.backup.enabled() && m_strategy->processRank() == 0;
    // An auto-sharded pipeline in a lockstep (multi-worker) run: shards may run out unevenly, so
    // a process whose shard is exhausted keeps joining the steps with an empty batch until the
    // step's all-reduce says every shard is (a global count of 0).
    const Batch emptyShard = train.emptyShard();
    const bool join = emptyShard.localShard && m_strategy->lockstep();
    for (int64_t epoch = firstEpoch; epoch <= epochs; ++epoch) {
        if (m_cancel) break;
        TS_TRY(train.startEpoch(epoch - 1));
        EpochEvent ev;
        ev.epoch = epoch;
        double lossSum = 0;
        int64_t correct = 0, seen = 0;
        auto epochStart = Clock::now();
        bool stop = false, completed = false;
        bool exhausted = false;    // join: this process's shard has run out
        int64_t joinedSteps = 0;   // join: steps this process took part in with an empty batch
        int64_t firstStep = 1;
        if (resume && resume->epoch == epoch && resume->stepInEpoch > 0) {
            // The batches before the backup's position are drawn and dropped: the order of an
            // epoch is a function of (seed, epoch), so the next batch is the one the interrupted
            // run would have trained on.
            TS_ASSIGN(exhausted, skipBatches(train, resume->stepInEpoch, epoch, join));
            lossSum = resume->lossSum;
            correct = resume->correct;
            seen = resume->seen;
            ev.steps = resume->stepInEpoch;
            ev.inputWaitSeconds = resume->inputWaitSeconds;
            epochStart -= std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(resume->epochSeconds));
            firstStep = resume->stepInEpoch + 1;
        }
        for (int64_t s = firstStep;; ++s) {
            if (m_paused.load(std::memory_order_relaxed)) epochStart += std::chrono::duration_cast<Clock::duration>(
                                                              std::chrono::duration<double>(waitWhilePaused()));
            if (m_cancel) { stop = true; break; }
            if (m_config.maxSteps > 0 && m_step >= m_config.maxSteps) { stop = true; break; }
            serviceTraceRequests();
            const auto t0 = Clock::now();
            const int64_t stepStartNs = nowNs();
            PhaseAccount::reset();
            m_currentStep.store(m_step + 1, std::memory_order_relaxed);
            if (m_tracing) Tracer::setStep(m_step + 1);
            auto next = [&]() -> Result<std::optional<Batch>> {
                if (exhausted) return std::optional<Batch>();
                PhaseScope input(StepPart::Input, "input wait");
                auto n = train.next();
                if (m_tracing && n.ok() && !n->has_value() && !join) Tracer::setStep(m_step);  // the epoch ended: no new step
                return n;
            }();
            if (!next.ok()) {
                if (next.error().code == ErrorCode::Cancelled && m_cancel) { stop = true; break; }
                return next.takeError();
            }
            if (!next->has_value() && !join) {
                // No step after all (end of epoch): later spans (validation) belong to the last step.
                m_currentStep.store(m_step, std::memory_order_relaxed);
                completed = true;
                break;
            }
            exhausted = !next->has_value();
            const Batch& batch = exhausted ? emptyShard : **next;
            const double wait = secondsSince(t0);
            const float lr = m_schedule.at(m_step);
            auto st = m_strategy->trainStep(batch, lr, m_step + 1, m_config.seed ^ (static_cast<uint64_t>(m_step + 1) << 20));
            if (!st.ok()) {
                if (st.error().code == ErrorCode::Cancelled && m_cancel) { stop = true; break; }
                Error e = st.takeError();
                e.message = "epoch " + std::to_string(epoch) + ", step " + std::to_string(s) + ": " + e.message;
                return e;
            }
            if (join && st->count == 0) {
                // Every process's shard has run out (or the short last global batch was dropped):
                // the epoch ended with the previous step.
                if (m_tracing) Tracer::setStep(m_step);
                m_currentStep.store(m_step, std::memory_order_relaxed);
                completed = true;
                break;
            }
            if (exhausted) ++joinedSteps;
            const int64_t stepEndNs = nowNs();
#if defined(TS_TRACING) && TS_TRACING
            if (m_tracing) Tracer::recordSpan("step", "step", stepStartNs, stepEndNs);
#endif
            ++m_step;
            ++ev.steps;
            lossSum += st->lossSum;
            correct += st->correct;
            seen += st->count;
            ev.inputWaitSeconds += wait;
            ++ev.stepsRun;
            if (st->skipped) ++ev.skippedSteps;
            ev.lossScale = st->lossScale;
            if (!std::isfinite(st->lossSum))
                return makeError(ErrorCode::InvalidArgument,
                                 "the loss became " + std::to_string(st->lossSum) + " at epoch " + std::to_string(epoch) +
                                     ", step " + std::to_string(s),
                                 "lower the learning rate, or check the data for NaN/Inf values");
            if (listener || bus) {
                StepEvent se;
                se.step = m_step;
                se.epoch = epoch;
                se.stepInEpoch = s;
                // Lockstep shards: an epoch lasts as long as the largest shard, known after one.
                se.stepsInEpoch = join ? m_agreedEpochSteps : train.batchesPerEpoch();
                setRunningMeans(se, m_loss, lossSum, correct, seen, secondsSince(epochStart));
                se.learningRate = lr;
                se.stepSeconds = secondsSince(t0);
                se.inputWaitSeconds = wait;
                se.batchSize = join ? st->count : batch.globalSize();
                se.staleness = st->staleness;
                se.lossScale = st->lossScale;
                se.skippedSteps = st->skippedSteps;
                reportStep(se, stepStartNs, stepEndNs, listener);
            }
            if (backups && m_config.backup.everySteps > 0 && m_step % m_config.backup.everySteps == 0)
                TS_TRY(writeBackup(TrainingPosition{m_step, epoch, s, lossSum, correct, seen, ev.inputWaitSeconds,
                                                    secondsSince(epochStart)}));
        }
        ev.seconds = secondsSince(epochStart);
        if (join && completed) {
            m_agreedEpochSteps = ev.steps;
            if (joinedSteps > 1 && bus && !m_imbalanceLogged) {
                // One empty step is the last partial batch; more mean the shards differ in size.
                m_imbalanceLogged = true;
                LogEvent e;
                e.stamp = Stamp{m_config.runId, m_step, wallNowMicros(), trainerLane()};
                e.level = LogLevel::Warning;
                e.message = "epoch " + std::to_string(epoch) + ": this task's share of the input ran out " +
                            std::to_string(joinedSteps) + " of " + std::to_string(ev.steps) +
                            " steps before the end; it idled while the others trained on theirs (the files it reads hold fewer "
                            "examples: balance the files, or shard by element with auto_shard \"data\")";
                bus->publish(Event(std::move(e)));
            }
        }
        if (seen == 0) break;
        ev.loss = lossSum / static_cast<double>(seen);
        ev.accuracy = accuracyOf(m_loss, correct, seen);
        ev.samplesPerSec = static_cast<double>(seen) / std::max(1e-9, ev.seconds);
        trainSeconds += ev.seconds;
        trainSamples += seen;
        if (validation && !m_cancel) {
            TS_TRACE_SCOPE("validation", "validation");
            auto v = evaluate(*validation);
            if (!v.ok()) {
                if (!(v.error().code == ErrorCode::Cancelled && m_cancel)) return v.takeError();
            } else {
                ev.valLoss = v->loss;
                ev.valAccuracy = v->accuracy;
            }
        }
        // max_steps ending an epoch early: it is reported (its line, row and checkpoint), so it
        // counts, marked partial; the final line said 1 epoch after two epoch lines.
        if (completed || !m_cancel) result.epochs = epoch;
        // max_steps landing on an epoch's last step stops before the source says the epoch ended.
        const int64_t perEpoch = train.batchesPerEpoch();
        result.partialEpoch = !completed && !m_cancel && !(perEpoch > 0 && ev.steps >= perEpoch);
        result.last = ev;
        // A cancelled epoch is not an epoch: like Keras (no on_epoch_end on an interrupt), its
        // part is no epoch row, line or checkpoint (its steps are recorded). The run said it
        // trained 3 epochs while the history held a fourth.
        if (m_cancel && !completed) break;
        if (bus) {
            EpochMetricsEvent em;
            em.stamp = Stamp{m_config.runId, m_step, wallNowMicros(), trainerLane()};
            em.epoch = epoch;
            em.metrics = {{"loss", ev.loss}};
            if (std::isfinite(ev.accuracy)) em.metrics["accuracy"] = ev.accuracy;  // none for a regression
            if (std::isfinite(ev.valLoss)) em.metrics["val_loss"] = ev.valLoss;
            if (std::isfinite(ev.valAccuracy)) em.metrics["val_accuracy"] = ev.valAccuracy;
            em.seconds = ev.seconds;
            em.samplesPerSec = ev.samplesPerSec;
            bus->publish(Event(std::move(em)));
        }
        if (listener) listener->onEpoch(ev);
        if (backups && m_config.backup.everySteps == 0 && completed && !m_cancel)
            TS_TRY(writeBackup(TrainingPosition{m_step, epoch + 1, 0, 0, 0, 0, 0, 0}));
        if (stop) break;
    }
    result.steps = m_step;
    result.seconds = trainSeconds;
    result.samplesPerSec = trainSeconds > 0 ? static_cast<double>(trainSamples) / trainSeconds : 0;
    result.cancelled = m_cancel.load();
    return result;
}

std::optional<Error> allStepsSkipped(const EpochEvent& e)
{
    if (e.stepsRun <= 0 || e.skippedSteps != e.stepsRun) return std::nullopt;
    char scale[32];
    std::snprintf(scale, sizeof scale, "%g", e.lossScale);
    const std::string which = e.stepsRun == e.steps ? "all " + std::to_string(e.steps) + " steps were skipped"
                                                    : "all " + std::to_string(e.stepsRun) + " steps since the resume were skipped";
    return makeError(ErrorCode::InvalidArgument,
                     "epoch " + std::to_string(e.epoch) + ": " + which + " (their float16 gradients overflowed at loss scale " + scale +
                         "), so the weights did not change",
                     "use a dynamic loss scale (precision.loss_scale \"dynamic\") or a smaller fixed one, or train with mixed_bfloat16");
}

void Trainer::serviceTraceRequests()
{
    using namespace telemetry;
    if (m_traceUntil > 0 && m_step >= m_traceUntil) stopTracing();  // the capture is complete
    const int64_t n = m_traceRequest.exchange(0);
    if (n <= 0 || m_tracing || !m_config.bus) return;
    if (startTracing(m_traceRequestLayers)) {
        m_traceUntil = m_step + n;
        return;
    }
    LogEvent e;
    e.stamp = Stamp{m_config.runId, m_step, wallNowMicros(), trainerLane()};
    e.level = LogLevel::Warning;
    e.message = "another run in this process is being traced; the capture was not started";
    m_config.bus->publish(Event(std::move(e)));
}

void Trainer::reportStep(const StepEvent& se, int64_t stepStartNs, int64_t stepEndNs, TrainListener* listener)
{
    using namespace telemetry;
    if (EventBus* bus = m_config.bus) {
        Stamp st{m_config.runId, se.step, wallMicros(stepEndNs), trainerLane()};
        StepBreakdownEvent b = makeBreakdown(stepEndNs - stepStartNs, PhaseAccount::current());
        b.stamp = st;
        bus->publish(Event(std::move(b)));
        StepMetricsEvent m;
        m.stamp = std::move(st);
        m.epoch = se.epoch;
        m.loss = se.loss;
        if (std::isfinite(se.accuracy)) m.metrics.emplace("accuracy", se.accuracy);
        if (se.staleness >= 0) m.metrics.emplace("staleness", static_cast<double>(se.staleness));
        if (se.lossScale > 0) {
            // Keras reports the scale as the LossScaleOptimizer's dynamic_scale; the skipped
            // steps show how often it had to back off.
            m.metrics.emplace("loss_scale", se.lossScale);
            m.metrics.emplace("skipped_steps", static_cast<double>(se.skippedSteps));
        }
        m.samplesPerSec = se.samplesPerSec;
        m.learningRate = se.learningRate;
        bus->publish(Event(std::move(m)));
    }
    if (listener) listener->onStep(se);
}

Result<FitResult> Trainer::fitScheduled(BatchSource& train, ParameterStore& store, TrainListener* listener)
{
    using namespace telemetry;
    FitResult result;
    if (listener) listener->onStart(*m_strategy);
    TS_TRY(m_strategy->start());
    const std::optional<TrainingPosition> resume = std::exchange(m_resumeAt, std::nullopt);
    if (resume) result.resumedFromStep = resume->step;
    const bool backups = m_config.backup.enabled() && m_strategy->processRank() == 0;
    // This worker's part of the data, read over and over, in a new order each pass (a resumed
    // run starts at the pass of its epoch, not replaying the first pass's order).
    int64_t pass = resume ? std::max<int64_t>(0, resume->epoch - 1) : 0;
    TS_TRY(train.startEpoch(pass));
    int64_t batchesPerPass = train.batchesPerEpoch();  // -1 until a pass has ended (a CSV file's lines)
    int64_t batchesThisPass = 0;
    std::vector<StepOutcome> untold;       // outcomes of trained steps, told with the next claim
    std::future<Result<StepGrant>> ahead;  // the next steps' claim, in flight while these train
    StepGrant block;                       // the steps granted now: [step, step + count)
    int64_t inBlock = 0;                   // of them, trained or begun
    int64_t lastBackup = resume ? resume->step : 0;
    // This worker's share of the run's current epoch.
    EpochEvent ev;
    double lossSum = 0, trainSeconds = 0;
    int64_t correct = 0, seen = 0, trainSamples = 0, taken = 0;
    auto epochStart = Clock::now();
    auto closeEpoch = [&](bool completed) {
        if (ev.epoch == 0 || seen == 0) return;
        ev.seconds = secondsSince(epochStart);
        ev.loss = lossSum / static_cast<double>(seen);
        ev.accuracy = accuracyOf(m_loss, correct, seen);
        ev.samplesPerSec = static_cast<double>(seen) / std::max(1e-9, ev.seconds);
        trainSeconds += ev.seconds;
        trainSamples += seen;
        if (completed || !m_cancel) result.epochs = ev.epoch;
        result.partialEpoch = !completed && !m_cancel;
        result.last = ev;
        if (listener) listener->onEpoch(ev);
    };
    bool finished = false;
    for (;;) {
        if (m_paused.load(std::memory_order_relaxed)) epochStart += std::chrono::duration_cast<Clock::duration>(
                                                          std::chrono::duration<double>(waitWhilePaused()));
        if (m_cancel) break;
        serviceTraceRequests();
        const auto t0 = Clock::now();
        const int64_t stepStartNs = nowNs();
        PhaseAccount::reset();
        if (inBlock >= block.count) {
            Result<StepGrant> grant = [&] {
                PhaseScope phase(StepPart::Communication, "claim step");
                if (ahead.valid()) return ahead.get();
                return store.claimStep(batchesPerPass, std::exchange(untold, {}));
            }();
            if (!grant.ok()) {
                if (grant.error().code == ErrorCode::Cancelled && m_cancel) break;
                return grant.takeError();
            }
            if (grant->kind == StepGrant::Kind::Done) {
                finished = true;
                break;
            }
            if (grant->kind == StepGrant::Kind::Wait) {
                // Every step is handed out (this worker's last ones too, until their outcomes are
                // told: at once); one held by a worker the coordinator loses comes back.
                if (untold.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
                continue;
            }
            block = *grant;
            inBlock = 0;
            // The next steps are claimed while these train (the claim's round trip off the
            // steps' path), telling the outcomes of the steps before these.
            ahead = std::async(std::launch::async, [&store, tell = std::exchange(untold, {}), batches = batchesPerPass] {
                return store.claimStep(batches, tell);
            });
        }
        StepGrant g = block;
        g.step = block.step + inBlock++;
        std::tie(g.epoch, g.stepInEpoch) = stepPosition(g.step, block.stepsPerEpoch);
        if (g.epoch != ev.epoch) {
            closeEpoch(true);  // this worker's share of the previous epoch
            if (backups && ev.epoch > 0 && m_config.backup.everySteps == 0) TS_TRY(writeScheduledBackup(g.epoch));
            ev = EpochEvent{};
            ev.epoch = g.epoch;
            lossSum = 0;
            correct = seen = 0;
            epochStart = t0;
        }
        if (backups && m_config.backup.everySteps > 0 && (g.step - 1) / m_config.backup.everySteps > lastBackup / m_config.backup.everySteps) {
            TS_TRY(writeScheduledBackup(g.epoch));
            lastBackup = g.step - 1;
        }
        m_currentStep.store(g.step, std::memory_order_relaxed);
        if (m_tracing) Tracer::setStep(g.step);
        auto next = [&]() -> Result<std::optional<Batch>> {
            PhaseScope input(StepPart::Input, "input wait");
            auto n = train.next();
            if (!n.ok() || n->has_value()) return n;
            // The end of a pass: its length is known now; the next pass begins.
            if (batchesPerPass < 0) batchesPerPass = batchesThisPass;
            batchesThisPass = 0;
            TS_TRY(train.startEpoch(++pass));
            return train.next();
        }();
        if (!next.ok()) {
            if (next.error().code == ErrorCode::Cancelled && m_cancel) break;
            return next.takeError();
        }
        if (!next->has_value())
            return makeError(ErrorCode::InvalidArgument, "this worker's part of the training data has no batch",
                             "give the pipeline more data (or files) than there are workers, or use fewer workers");
        ++batchesThisPass;
        const Batch& batch = **next;
        const double wait = secondsSince(t0);
        const float lr = m_schedule.at(g.step - 1);
        auto st = m_strategy->trainStep(batch, lr, g.step, m_config.seed ^ (static_cast<uint64_t>(g.step) << 20));
        if (!st.ok()) {
            if (st.error().code == ErrorCode::Cancelled && m_cancel) break;
            Error e = st.takeError();
            e.message = "epoch " + std::to_string(g.epoch) + ", step " + std::to_string(g.step) + ": " + e.message;
            return e;
        }
        const int64_t stepEndNs = nowNs();
#if defined(TS_TRACING) && TS_TRACING
        if (m_tracing) Tracer::recordSpan("step", "step", stepStartNs, stepEndNs);
#endif
        m_step = g.step;
        ++taken;
        untold.push_back(StepOutcome{g.step, st->lossSum, st->correct, st->count});
        if (!std::isfinite(st->lossSum))
            return makeError(ErrorCode::InvalidArgument,
                             "the loss became " + std::to_string(st->lossSum) + " at epoch " + std::to_string(g.epoch) + ", step " +
                                 std::to_string(g.step),
                             "lower the learning rate, or check the data for NaN/Inf values");
        ++ev.steps;
        ++ev.stepsRun;
        if (st->skipped) ++ev.skippedSteps;
        ev.lossScale = st->lossScale;
        lossSum += st->lossSum;
        correct += st->correct;
        seen += st->count;
        ev.inputWaitSeconds += wait;
        if ((listener || m_config.bus) && seen > 0) {
            StepEvent se;
            se.step = g.step;
            se.epoch = g.epoch;
            se.stepInEpoch = g.stepInEpoch;
            se.stepsInEpoch = g.stepsPerEpoch;
            setRunningMeans(se, m_loss, lossSum, correct, seen, secondsSince(epochStart));
            se.learningRate = lr;
            se.stepSeconds = secondsSince(t0);
            se.inputWaitSeconds = wait;
            se.batchSize = st->count;
            se.staleness = st->staleness;
            se.lossScale = st->lossScale;
            se.skippedSteps = st->skippedSteps;
            reportStep(se, stepStartNs, stepEndNs, listener);
        }
    }
    if (ahead.valid()) (void)ahead.get();  // stopped while a claim was in flight
    closeEpoch(finished);
    result.steps = taken;  // this worker's: the coordinator adds every worker's
    result.seconds = trainSeconds;
    result.samplesPerSec = trainSeconds > 0 ? static_cast<double>(trainSamples) / trainSeconds : 0;
    result.cancelled = m_cancel.load();
    return result;
}

Result<EvalResult> Trainer::evaluate(BatchSource& data)
{
    TS_TRY(data.startEpoch(0));
    EvalResult r;
    double lossSum = 0;
    int64_t correct = 0;
    // As in training: lockstep processes evaluate their shards until every one has run out.
    const Batch emptyShard = data.emptyShard();
    const bool join = emptyShard.localShard && m_strategy->lockstep();
    bool exhausted = false;
    for (;;) {
        if (m_cancel) return makeError(ErrorCode::Cancelled, "evaluation cancelled");
        auto next = exhausted ? Result<std::optional<Batch>>(std::optional<Batch>()) : data.next();
        if (!next.ok()) return next.takeError();
        if (!next->has_value() && !join) break;
        exhausted = !next->has_value();
        TS_ASSIGN(StepStats st, m_strategy->evalStep(exhausted ? emptyShard : **next));
        if (join && st.count == 0) break;
        lossSum += st.lossSum;
        correct += st.correct;
        r.examples += st.count;
    }
    if (r.examples > 0) {
        r.loss = lossSum / static_cast<double>(r.examples);
        r.accuracy = accuracyOf(m_loss, correct, r.examples);
    }
    return r;
}

Status Trainer::saveWeights(const std::string& path)
{
    TS_TRACE_SCOPE("checkpoint", "checkpoint");
    TS_ASSIGN(auto params, m_strategy->exportParameters());
    return writeSafetensors(path, params, weightsMetadata(m_modelName, m_step));
}

Result<std::string> Trainer::encodeWeights(const std::string& label)
{
    TS_ASSIGN(auto params, m_strategy->exportParameters());
    return encodeSafetensors(params, weightsMetadata(m_modelName, m_step), label);
}

Status Trainer::loadWeights(const std::string& path)
{
    TS_ASSIGN(auto file, readSafetensors(path));
    return m_strategy->importParameters(file.inOrder(), path);
}

Result<TrainingState> Trainer::captureState(const TrainingPosition& position)
{
    TrainingState state;
    state.position = position;
    state.fingerprint = m_config.backupFingerprint;
    state.model = m_modelName;
    // The optimizer state first: a parameter-server snapshot takes the values with it, which
    // exportParameters then returns (values and state of the same moment).
    TS_ASSIGN(state.optimizer, m_strategy->exportOptimizerState());
    TS_ASSIGN(state.parameters, m_strategy->exportParameters());
    return state;
}

Status Trainer::restoreState(const TrainingState& state, const std::string& source)
{
    TS_TRY(m_strategy->importParameters(state.parameters, source));
    TS_TRY(m_strategy->importOptimizerState(state.optimizer, source));
    m_step = state.position.step;
    m_resumeAt = state.position;
    return okStatus();
}

Status Trainer::writeBackup(const TrainingPosition& position, const std::function<void(TrainingState&)>& adjust)
{
    TS_TRACE_SCOPE("backup", "checkpoint");
    const std::string path = backupPath(m_config.backup.dir);
    auto state = captureState(position);
    if (state.ok() && adjust) adjust(*state);
    const int64_t step = state.ok() ? state->position.step : position.step;
    Status st = state.ok() ? writeTrainingState(path, *state) : Status(state.takeError());
    if (st.ok()) return st;
    Error e = st.takeError();
    e.message = "could not write the run's backup at step " + std::to_string(step) + ": " + e.message;
    if (e.hint.empty()) e.hint = "free disk space or choose another backup folder, then start the run again to resume";
    return e;
}

Status Trainer::writeScheduledBackup(int64_t epoch)
{
    return writeBackup(TrainingPosition{}, [epoch](TrainingState& state) {
        // The backup's position is ps:0's schedule in it: the steps completed by then, and the
        // epoch's tally; a resumed run hands out the steps after them.
        for (const auto& [name, t] : state.optimizer) {
            if (name != "ps/schedule") continue;
            if (auto s = decodeScheduleSnapshot(t.data<float>(), t.numel()))
                state.position = TrainingPosition{s->completed, epoch, s->epochSoFar.steps, s->epochSoFar.lossSum, s->epochSoFar.correct,
                                                  s->epochSoFar.count, 0, s->epochSoFar.seconds};
        }
    });
}

Result<bool> Trainer::restoreFromBackup(TrainListener* listener)
{
    const std::string& dir = m_config.backup.dir;
    const std::string path = backupPath(dir);
    const bool chief = m_strategy->processRank() == 0;
    // The chief decides (0: no backup, 1: resume, 2: its backup is unusable) and tells the others,
    // so every process of a multi-worker run takes the same branch.
    float verdict = 0;
    std::optional<Error> failure;
    if (chief) {
        std::error_code ec;
        std::filesystem::create_directories(dir, ec);
        if (ec) {
            failure = makeError(ErrorCode::IoError, "cannot create the backup folder " + dir + ": " + ec.message(),
                                "choose a folder this user can write (--backup-dir)");
        } else if (std::filesystem::exists(path, ec)) {
            auto state = readTrainingState(path);
            Status st = state.ok() ? checkFingerprint(path, state->fingerprint, m_config.backupFingerprint)
                                   : Status(state.takeError());
            if (st.ok()) st = restoreState(*state, path);
            if (st.ok()) verdict = 1;
            else failure = st.takeError();
        }
        if (failure) verdict = 2;
    }
    if (m_strategy->sharesResumeThroughStore()) {
        // Parameter-server: worker 0 starts the ps tasks from its backup and leaves its position
        // with them; the others read it back. A worker 0 whose backup is unusable fails, and the
        // coordinator stops the others waiting for the ps tasks.
        if (failure) return *failure;
        std::string position;
        if (chief && verdict == 1) {
            const Tensor p = encodePosition(*m_resumeAt);
            position.assign(reinterpret_cast<const char*>(p.data<float>()), static_cast<std::size_t>(p.numel()) * sizeof(float));
        }
        TS_ASSIGN(std::string shared, m_strategy->shareResumePoint(position));
        if (shared.empty()) return false;
        if (!chief) {
            const Tensor probe = encodePosition(TrainingPosition{});
            if (shared.size() != static_cast<std::size_t>(probe.numel()) * sizeof(float))
                return makeError(ErrorCode::Internal, "worker 0's resume position from the ps tasks has " + std::to_string(shared.size()) + " bytes",
                                 "every task of the run must run the same TrainStudio version");
            std::vector<float> floats(static_cast<std::size_t>(probe.numel()));
            std::memcpy(floats.data(), shared.data(), shared.size());
            m_resumeAt = decodePosition(Tensor::fromVector(probe.shape(), floats));
            m_step = m_resumeAt->step;
        }
    } else {
        Tensor v = Tensor::fromVector({1}, {verdict});
        TS_TRY(m_strategy->broadcastFromChief(v));
        verdict = v.data<float>()[0];
        if (verdict == 2) {
            if (failure) return *failure;
            return makeError(ErrorCode::InvalidArgument, kChiefCouldNotRestore,
                             "fix or delete the chief's backup folder, then start every task again");
        }
        if (verdict == 0) return false;
        if (m_strategy->processCount() > 1) {
            // Every process continues from the chief's state, whatever its own folder holds.
            TS_ASSIGN(auto params, m_strategy->exportParameters());
            TS_ASSIGN(auto optimizer, m_strategy->exportOptimizerState());
            for (auto& [name, t] : params) TS_TRY(m_strategy->broadcastFromChief(t));
            for (auto& [name, t] : optimizer) TS_TRY(m_strategy->broadcastFromChief(t));
            Tensor position = encodePosition(m_resumeAt ? *m_resumeAt : TrainingPosition{});
            TS_TRY(m_strategy->broadcastFromChief(position));
            if (!chief) {
                TrainingState state;
                state.position = decodePosition(position);
                state.parameters = std::move(params);
                state.optimizer = std::move(optimizer);
                TS_TRY(restoreState(state, "the chief's backup"));
            }
        }
    }
    ResumeSource from;
    if (chief) from = {path, "the backup " + path};
    else from.words = m_strategy->sharesResumeThroughStore() ? "worker 0's backup" : "the chief's backup";
    if (listener) listener->onResume(*m_resumeAt, from);
    if (m_config.bus) {
        telemetry::RunStateEvent resumed;
        resumed.stamp = telemetry::Stamp{m_config.runId, m_resumeAt->step, telemetry::wallNowMicros(), trainerLane()};
        resumed.state = telemetry::RunState::Running;
        resumed.resumedAfterStep = m_resumeAt->step;
        m_config.bus->publish(telemetry::Event(std::move(resumed)));
        telemetry::LogEvent e;
        e.stamp = telemetry::Stamp{m_config.runId, m_step, telemetry::wallNowMicros(), trainerLane()};
        e.level = telemetry::LogLevel::Info;
        e.message = "resumed from " + from.words + " after step " + std::to_string(m_resumeAt->step) + " (epoch " +
                    std::to_string(m_resumeAt->epoch) + ", step " + std::to_string(m_resumeAt->stepInEpoch) + " of it)";
        m_config.bus->publish(telemetry::Event(std::move(e)));
    }
    return true;
}

Result<bool> Trainer::skipBatches(BatchSource& train, int64_t count, int64_t epoch, bool mayRunOut)
{
    for (int64_t i = 0; i < count; ++i) {
        auto next = train.next();
        if (!next.ok()) return next.takeError();
        if (!next->has_value() && mayRunOut) return true;  // this shard was already joining the others' steps
        if (!next->has_value())
            return makeError(ErrorCode::InvalidArgument,
                             "the backup continues epoch " + std::to_string(epoch) + " after step " + std::to_string(count) +
                                 ", but the data has only " + std::to_string(i) + " batches per epoch",
                             "the training data or batch size changed since the backup; restore them or delete the backup");
    }
    return false;
}

} // namespace ts
