#include "distribute/parameter_server_strategy.h"

#include <atomic>
#include <cstring>
#include <thread>

#include "backend/registry.h"
#include "distribute/parameter_store.h"
#include "telemetry/breakdown.h"

namespace ts {
namespace {

constexpr const char* kUpdates = "ps/updates";
constexpr const char* kSchedule = "ps/schedule";  // ps:0's step schedule (encodeScheduleSnapshot)

class ParameterServerStrategy final : public Strategy {
public:
    Device m_device;
    std::unique_ptr<Backend> m_backend;
    std::unique_ptr<Program> m_program;
    std::unique_ptr<LossScaler> m_scaler;  // mixed_float16: this worker's own loss scale
    std::shared_ptr<ParameterStore> m_store;
    int m_rank = 0, m_workers = 1, m_threads = 1;
    bool m_join = false;  // StrategyConfig::joinRunning
    std::vector<StoreVariable> m_variables;
    bool m_begun = false;
    StoreResume m_resume;           // worker 0: what the ps tasks start from (a backup's state)
    bool m_snapshotValues = false;  // the program holds the latest snapshot's values
    std::atomic<bool> m_cancelled{false};

    std::string name() const override { return "parameter-server"; }
    int numReplicas() const override { return 1; }
    int globalReplicas() const override { return m_workers; }
    int threadsPerReplica() const override { return m_threads; }
    std::vector<DeviceInfo> devices() const override { return {m_backend->info()}; }
    Program& primary() override { return *m_program; }
    void cancel() override
    {
        m_cancelled = true;
        m_store->cancel();
    }

    Status initialise(uint64_t seed) override
    {
        TS_TRY(m_program->initialiseParameters(seed));
        m_variables = trainableStoreVariables(m_program->params());  // non-trainable ones are refused in create()
        m_begun = false;
        m_resume = {};
        return okStatus();
    }

    // Worker 0's values (from the run's seed, or the weights imported after initialise) become
    // the ps tasks' values, like TF's chief creating the variables; the other workers wait for
    // them. Deferred to the first use so that an import between initialise and fit is what the
    // ps tasks start from.
    Status begin()
    {
        if (m_begun) return okStatus();
        const bool initialiser = m_rank == 0 && !m_join;  // a rejoined worker 0 finds them initialised
        TS_TRY(m_store->begin(m_variables, initialiser, initialiser ? &m_resume : nullptr));
        m_begun = true;
        return okStatus();
    }

    // This worker's rows of `batch`, as indices into it: all of a local shard (an auto-sharded
    // pipeline), else its share of the global batch (a sharded source served only those).
    std::pair<int64_t, int64_t> rowsOf(const Batch& batch) const
    {
        if (batch.localShard) return {0, batch.size()};
        const int64_t rows = batch.globalSize();
        return {rows * m_rank / m_workers - batch.offset, rows * (m_rank + 1) / m_workers - batch.offset};
    }

    Result<StepStats> trainStep(const Batch& batch, float lr, int64_t, uint64_t seed) override
    {
        using telemetry::PhaseScope;
        using telemetry::StepPart;
        if (m_cancelled) return makeError(ErrorCode::Cancelled, "the run was cancelled");
        const auto [b, e] = rowsOf(batch);
        if (b < 0 || e > batch.size())
            return makeError(ErrorCode::Internal, "worker " + std::to_string(m_rank) + " got rows [" + std::to_string(batch.offset) +
                                                      ", " + std::to_string(batch.offset + batch.size()) + ") without its share");
        StepStats stats;
        const float lossScale = m_scaler ? m_scaler->scale() : 1.0f;
        if (e > b) {
            {
                PhaseScope phase(StepPart::Communication, "pull variables");
                TS_TRY(begin());
                TS_TRY(m_store->pull());
                m_snapshotValues = false;
            }
            float loss = 0;
            int64_t correct = 0;
            {
                PhaseScope phase(StepPart::Forward, "forward");
                TS_TRY(m_program->forward(batch.x.rows(b, e), true, seed + static_cast<uint64_t>(m_rank) * 0x9E3779B97F4A7C15ull));
            }
            {
                PhaseScope phase(StepPart::Backward, "backward");
                // The mean over this worker's rows: each push is one full update, as in TF.
                TS_TRY(m_program->lossAndBackward(batch.y.rows(b, e), true, e - b, &loss, &correct, lossScale));
            }
            bool finite = true;
            if (m_scaler) {
                // Each worker scales its own loss; a step with non-finite gradients pushes nothing.
                PhaseScope phase(StepPart::Optimizer, "loss-scale check");
                Tensor grads = m_program->gradientArena();
                if (grads.defined()) {
                    TS_ASSIGN(finite, unscaleGradients(*m_backend, grads, lossScale));
                }
            }
            if (finite) {
                PhaseScope phase(StepPart::Communication, "push gradients");
                TS_TRY(m_store->push(lr));
            }
            stats = {static_cast<double>(loss) * static_cast<double>(e - b), correct, e - b};
            if (m_scaler) {
                stats.lossScale = lossScale;
                stats.skipped = !m_scaler->update(finite);
                stats.skippedSteps = m_scaler->skippedSteps();
            }
        }
        stats.staleness = m_store->staleness().last;
        return stats;
    }

    Result<StepStats> evalStep(const Batch& batch) override
    {
        if (m_cancelled) return makeError(ErrorCode::Cancelled, "the run was cancelled");
        TS_TRY(begin());
        TS_TRY(m_store->pull());
        m_snapshotValues = false;
        float loss = 0;
        int64_t correct = 0;
        TS_TRY(m_program->forward(batch.x, false, 0));
        TS_TRY(m_program->lossAndBackward(batch.y, false, batch.size(), &loss, &correct));
        return StepStats{static_cast<double>(loss) * static_cast<double>(batch.size()), correct, batch.size()};
    }

    Result<std::vector<std::pair<std::string, Tensor>>> exportParameters() override
    {
        TS_TRY(begin());
        // Right after a snapshot (a backup takes the optimizer state first), its values, which
        // match that state; else the ps tasks' current ones.
        if (!m_snapshotValues) {
            TS_TRY(m_store->flush());
            TS_TRY(m_store->pull());
        }
        m_snapshotValues = false;
        return m_program->exportParameters();
    }

    // A training-state backup: the ps tasks' optimizer state as one arena (a local optimizer's
    // layout) and their update count, bit-copied into two floats.
    Result<std::vector<std::pair<std::string, Tensor>>> exportOptimizerState() override
    {
        TS_TRY(begin());
        TS_ASSIGN(StoreSnapshot snap, m_store->snapshot());
        m_snapshotValues = true;
        std::vector<std::pair<std::string, Tensor>> out;
        for (auto& [name, flat] : snap.optimizer) {
            const auto n = static_cast<int64_t>(flat.size());
            out.emplace_back(name, Tensor::fromVector(Shape({n}), flat));
        }
        std::vector<float> updates(2);
        std::memcpy(updates.data(), &snap.updates, sizeof(snap.updates));
        out.emplace_back(kUpdates, Tensor::fromVector(Shape({2}), updates));
        out.emplace_back(kSchedule, Tensor::fromVector(Shape({12}), encodeScheduleSnapshot(snap.schedule)));
        return out;
    }

    Status importOptimizerState(const std::vector<std::pair<std::string, Tensor>>& tensors, const std::string& source) override
    {
        if (m_begun)
            return makeError(ErrorCode::Unsupported, "parameter-server workers cannot restore optimizer state (" + source + ") once training began",
                             "restore a backup when the run starts");
        StoreResume r;
        r.position = m_resume.position;
        bool haveUpdates = false;
        for (const auto& [name, t] : tensors) {
            if (t.dtype() != DType::F32)
                return makeError(ErrorCode::InvalidArgument, source + ": optimizer state '" + name + "' is not float32", "delete the backup");
            const float* p = t.data<float>();
            if (name == kUpdates) {
                if (t.numel() != 2) return makeError(ErrorCode::InvalidArgument, source + ": '" + name + "' must hold 2 values", "delete the backup");
                std::memcpy(&r.state.updates, p, sizeof(r.state.updates));
                haveUpdates = r.state.updates >= 0;
            } else if (name == kSchedule) {
                auto sched = decodeScheduleSnapshot(p, t.numel());
                if (!sched) return makeError(ErrorCode::InvalidArgument, source + ": '" + name + "' is malformed", "delete the backup");
                r.state.schedule = *sched;
            } else {
                r.state.optimizer.emplace_back(name, std::vector<float>(p, p + t.numel()));
            }
        }
        if (!haveUpdates)
            return makeError(ErrorCode::InvalidArgument, source + ": no parameter-server update count ('" + std::string(kUpdates) + "'): it was not written by a parameter-server run",
                             "resume with the strategy the backup was written by, or delete it");
        m_resume = std::move(r);
        return okStatus();
    }

    int processRank() const override { return m_rank; }
    bool sharesResumeThroughStore() const override { return true; }
    ParameterStore* stepScheduler() override { return m_store.get(); }
    Status start() override { return begin(); }

    // Worker 0's resume point reaches the others through the ps tasks it initialises.
    Result<std::string> shareResumePoint(const std::string& chiefs) override
    {
        if (m_rank == 0) m_resume.position = chiefs;
        TS_TRY(begin());
        return m_store->resumePosition();
    }

    // Before the first step only: worker 0's imported values initialise the ps tasks (the
    // others' are checked for shape and then replaced by what they pull). Later, the ps tasks
    // hold the variables and a worker's copy is only a cache of them.
    Status importParameters(const std::vector<std::pair<std::string, Tensor>>& tensors, const std::string& source) override
    {
        if (m_begun)
            return makeError(ErrorCode::Unsupported, "parameter-server workers cannot load weights (" + source + ") once training began: the ps tasks hold them",
                             "load the weights when the run starts (load_weights)");
        return m_program->importParameters(tensors, source);
    }
};

} // namespace

std::vector<StoreVariable> trainableStoreVariables(const std::vector<ParamSlot>& params)
{
    std::vector<StoreVariable> vars;
    for (const ParamSlot& slot : params) {
        if (!slot.grad.defined()) continue;
        StoreVariable v;
        v.info.name = slot.name;
        for (int d = 0; d < slot.value.shape().rank(); ++d) v.info.shape.push_back(slot.value.shape()[d]);
        v.values = slot.value.data<float>();
        v.grads = slot.grad.data<float>();
        vars.push_back(std::move(v));
    }
    return vars;
}

Result<std::unique_ptr<Strategy>> makeParameterServerStrategy(const StrategyConfig& config, std::shared_ptr<const GraphAnalysis> graph,
                                                              const LossSpec& loss)
{
    if (!config.parameterStore)
        return makeError(ErrorCode::InvalidArgument, "parameter-server needs the cluster's ps tasks, and none were connected",
                         "run parameter-server through trainstudio-worker daemons (trainstudio-cli train --cluster FILE --strategy parameter-server)");
    if (config.numWorkers < 1 || config.processRank < 0 || config.processRank >= config.numWorkers)
        return makeError(ErrorCode::InvalidArgument, "worker " + std::to_string(config.processRank) + " is not in the cluster's 0.." +
                                                         std::to_string(config.numWorkers - 1));
    if (config.devices.size() > 1)
        return makeError(ErrorCode::InvalidArgument, "a parameter-server worker trains on one device, got " + std::to_string(config.devices.size()),
                         "give each worker one device (more workers for more devices)");
    auto s = std::make_unique<ParameterServerStrategy>();
    s->m_store = config.parameterStore;
    s->m_rank = config.processRank;
    s->m_join = config.joinRunning;
    s->m_workers = config.numWorkers;
    s->m_device = config.devices.empty() ? Device{DeviceKind::Cpu, 0} : config.devices[0];
    const unsigned hw = std::thread::hardware_concurrency();
    s->m_threads = config.threads > 0 ? config.threads : static_cast<int>(hw == 0 ? 1 : hw);
    BackendOptions opts;
    opts.threads = s->m_threads;
    auto& registry = BackendRegistry::instance();
    auto be = config.backend.empty() ? registry.create(s->m_device, opts) : registry.create(config.backend, s->m_device.index, opts);
    if (!be.ok()) {
        Error e = be.takeError();
        e.message = s->m_device.toString() + ": " + e.message;
        return e;
    }
    s->m_backend = std::move(be).value();
    TS_TRY(s->m_backend->setComputeType(config.precision.computeType()));
    if (config.precision.scalesLoss()) s->m_scaler = std::make_unique<LossScaler>(config.precision);
    if (!s->m_backend->allocator().hostAccessible())
        return makeError(ErrorCode::Unsupported, s->m_device.toString() + ": parameter-server workers exchange variables from host memory",
                         "use a CPU device for parameter-server workers");
    s->m_backend->bindThread();
    TS_ASSIGN(s->m_program, Program::create(graph, *s->m_backend, loss));
    if (s->m_program->nonTrainableArena().defined())
        return makeError(ErrorCode::Unsupported, "parameter-server does not hold non-trainable variables (BatchNormalization's moving statistics) yet",
                         "remove BatchNormalization from the model, or use multi-worker-mirrored");
    return std::unique_ptr<Strategy>(std::move(s));
}

} // namespace ts
