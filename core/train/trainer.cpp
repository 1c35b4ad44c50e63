#include "train/trainer.h"

#include <chrono>

#include "io/safetensors.h"

namespace ts {
namespace {
using Clock = std::chrono::steady_clock;
double secondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
}

Status checkModelFitsLabels(const GraphAnalysis& graph, const LossSpec& loss, int64_t numClasses,
                            const std::string& dataSource)
{
    if (graph.outputNodes.size() != 1) return okStatus();
    const NodeInfo& out = graph.nodes[static_cast<std::size_t>(graph.outputNodes[0])];
    if (loss.kind == LossKind::SparseCategoricalCrossentropy || loss.kind == LossKind::CategoricalCrossentropy) {
        if (out.outputShape.rank() != 1)
            return makeError(ErrorCode::ShapeMismatch,
                             "output node '" + out.id + "' has shape " + out.outputShape.toString() +
                                 "; a classification loss needs one score per class",
                             "add Flatten/GlobalAveragePooling2D and a Dense(" + std::to_string(numClasses) + ") output");
        if (numClasses > 0 && out.outputShape[0] != numClasses)
            return makeError(ErrorCode::ShapeMismatch,
                             "output node '" + out.id + "' produces " + std::to_string(out.outputShape[0]) +
                                 " classes but the labels in " + dataSource + " have " + std::to_string(numClasses),
                             "set units of '" + out.id + "' to " + std::to_string(numClasses));
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
    TS_ASSIGN(t->m_strategy, Strategy::create(config.strategy, analysis, t->m_loss, opt));
    return t;
}

Status Trainer::initialise() { return m_strategy->initialise(m_config.seed); }

void Trainer::cancel()
{
    m_cancel = true;
    m_strategy->cancel();
}

Result<FitResult> Trainer::fit(BatchSource& train, BatchSource* validation, TrainListener* listener)
{
    FitResult result;
    if (listener) listener->onStart(*m_strategy);
    const int64_t epochs = m_config.epochs > 0 ? m_config.epochs : 1;
    double trainSeconds = 0;
    int64_t trainSamples = 0;
    for (int64_t epoch = 1; epoch <= epochs; ++epoch) {
        if (m_cancel) break;
        TS_TRY(train.startEpoch(epoch - 1));
        EpochEvent ev;
        ev.epoch = epoch;
        double lossSum = 0;
        int64_t correct = 0, seen = 0;
        const auto epochStart = Clock::now();
        bool stop = false, completed = false;
        for (int64_t s = 1;; ++s) {
            if (m_cancel) { stop = true; break; }
            if (m_config.maxSteps > 0 && m_step >= m_config.maxSteps) { stop = true; break; }
            const auto t0 = Clock::now();
            auto next = train.next();
            if (!next.ok()) {
                if (next.error().code == ErrorCode::Cancelled && m_cancel) { stop = true; break; }
                return next.takeError();
            }
            if (!next->has_value()) { completed = true; break; }
            const Batch& batch = **next;
            const double wait = secondsSince(t0);
            const float lr = m_schedule.at(m_step);
            auto st = m_strategy->trainStep(batch, lr, m_step + 1, m_config.seed ^ (static_cast<uint64_t>(m_step + 1) << 20));
            if (!st.ok()) {
                if (st.error().code == ErrorCode::Cancelled && m_cancel) { stop = true; break; }
                Error e = st.takeError();
                e.message = "epoch " + std::to_string(epoch) + ", step " + std::to_string(s) + ": " + e.message;
                return e;
            }
            ++m_step;
            ++ev.steps;
            lossSum += st->lossSum;
            correct += st->correct;
            seen += st->count;
            ev.inputWaitSeconds += wait;
            if (!std::isfinite(st->lossSum))
                return makeError(ErrorCode::InvalidArgument,
                                 "the loss became " + std::to_string(st->lossSum) + " at epoch " + std::to_string(epoch) +
                                     ", step " + std::to_string(s),
                                 "lower the learning rate, or check the data for NaN/Inf values");
            if (listener) {
                StepEvent se;
                se.step = m_step;
                se.epoch = epoch;
                se.stepInEpoch = s;
                se.stepsInEpoch = train.batchesPerEpoch();
                se.loss = lossSum / static_cast<double>(seen);
                se.accuracy = static_cast<double>(correct) / static_cast<double>(seen);
                se.samplesPerSec = static_cast<double>(seen) / std::max(1e-9, secondsSince(epochStart));
                se.learningRate = lr;
                se.stepSeconds = secondsSince(t0);
                se.inputWaitSeconds = wait;
                se.batchSize = batch.size();
                listener->onStep(se);
            }
        }
        ev.seconds = secondsSince(epochStart);
        if (seen == 0) break;
        ev.loss = lossSum / static_cast<double>(seen);
        ev.accuracy = static_cast<double>(correct) / static_cast<double>(seen);
        ev.samplesPerSec = static_cast<double>(seen) / std::max(1e-9, ev.seconds);
        trainSeconds += ev.seconds;
        trainSamples += seen;
        if (validation && !m_cancel) {
            auto v = evaluate(*validation);
            if (!v.ok()) {
                if (!(v.error().code == ErrorCode::Cancelled && m_cancel)) return v.takeError();
            } else {
                ev.valLoss = v->loss;
                ev.valAccuracy = v->accuracy;
            }
        }
        if (completed) result.epochs = epoch;
        result.last = ev;
        if (listener) listener->onEpoch(ev);
        if (stop) break;
    }
    result.steps = m_step;
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
    for (;;) {
        if (m_cancel) return makeError(ErrorCode::Cancelled, "evaluation cancelled");
        auto next = data.next();
        if (!next.ok()) return next.takeError();
        if (!next->has_value()) break;
        TS_ASSIGN(StepStats st, m_strategy->evalStep(**next));
        lossSum += st.lossSum;
        correct += st.correct;
        r.examples += st.count;
    }
    if (r.examples > 0) {
        r.loss = lossSum / static_cast<double>(r.examples);
        r.accuracy = static_cast<double>(correct) / static_cast<double>(r.examples);
    }
    return r;
}

Status Trainer::saveWeights(const std::string& path)
{
    TS_ASSIGN(auto params, m_strategy->exportParameters());
    std::map<std::string, std::string> meta = {{"format", "trainstudio"}, {"model", m_modelName},
                                               {"step", std::to_string(m_step)}};
    return writeSafetensors(path, params, meta);
}

Status Trainer::loadWeights(const std::string& path)
{
    TS_ASSIGN(auto file, readSafetensors(path));
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (const auto& name : file.order) tensors.emplace_back(name, file.tensors.at(name));
    return m_strategy->importParameters(tensors, path);
}

} // namespace ts
