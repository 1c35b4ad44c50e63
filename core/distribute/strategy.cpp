#include "distribute/strategy.h"

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include "backend/registry.h"
#include "distribute/communicator.h"
#include "distribute/parameter_server_strategy.h"
#include "optim/optimizer.h"
#include "telemetry/breakdown.h"
#include "telemetry/tracer.h"

namespace ts {

bool isParameterServer(const std::string& kind) { return kind == "parameter-server" || kind == "parameter_server"; }

namespace {

// The loss scaler's state travels with the optimizer's in training-state backups.
constexpr const char* kLossScaleState = "loss_scale/state";

Tensor lossScaleTensor(const LossScaler& scaler)
{
    const std::vector<float> v = scaler.state();
    return Tensor::fromVector({static_cast<int64_t>(v.size())}, v);
}

// Splits the loss scaler's state off `all` into `scaler` (null: there must be none).
Status takeLossScaleState(const std::vector<std::pair<std::string, Tensor>>& all, LossScaler* scaler,
                          const std::string& source, std::vector<std::pair<std::string, Tensor>>& rest)
{
    bool found = false;
    for (const auto& [name, t] : all) {
        if (name != kLossScaleState) {
            rest.emplace_back(name, t);
            continue;
        }
        found = true;
        if (!scaler)
            return makeError(ErrorCode::InvalidArgument, source + " holds a loss scale, and this run does not scale its loss",
                             "resume it with the precision policy it was trained with (mixed_float16)");
        if (t.dtype() != DType::F32 || !t.hostAccessible())
            return makeError(ErrorCode::ParseError, source + ": " + kLossScaleState + " is not a host f32 tensor",
                             "the backup was not written by this version; start the run afresh");
        TS_TRY(scaler->restore(t.toVector(), source));
    }
    if (scaler && !found)
        return makeError(ErrorCode::InvalidArgument, source + " has no loss-scale state, and this run scales its loss (mixed_float16)",
                         "resume it with the precision policy it was trained with");
    return okStatus();
}

int hardwareThreads()
{
    const unsigned n = std::thread::hardware_concurrency();
    return n == 0 ? 1 : static_cast<int>(n);
}

// A thread that runs one job at a time for its replica; blocks (never spins) between steps.
class ReplicaThread {
public:
    explicit ReplicaThread(std::function<void()> init)
        : m_thread([this, init = std::move(init)] {
              init();
              loop();
          })
    {
    }
    ~ReplicaThread()
    {
        {
            std::lock_guard lock(m_mutex);
            m_quit = true;
        }
        m_cv.notify_all();
        m_thread.join();
    }
    void post(std::function<Status()> job)
    {
        {
            std::lock_guard lock(m_mutex);
            m_job = std::move(job);
            m_done = false;
        }
        m_cv.notify_all();
    }
    Status wait()
    {
        std::unique_lock lock(m_mutex);
        m_doneCv.wait(lock, [&] { return m_done; });
        return std::move(m_result);
    }

private:
    void loop()
    {
        for (;;) {
            std::function<Status()> job;
            {
                std::unique_lock lock(m_mutex);
                m_cv.wait(lock, [&] { return m_quit || m_job; });
                if (m_quit) return;
                job = std::move(m_job);
                m_job = nullptr;
            }
            Status st = job();
            {
                std::lock_guard lock(m_mutex);
                m_result = std::move(st);
                m_done = true;
            }
            m_doneCv.notify_all();
        }
    }
    std::mutex m_mutex;
    std::condition_variable m_cv, m_doneCv;
    std::function<Status()> m_job;
    Status m_result;
    bool m_done = true, m_quit = false;
    std::thread m_thread;
};

struct Replica {
    Device device;
    std::unique_ptr<Backend> backend;
    std::unique_ptr<Program> program;
    std::unique_ptr<Optimizer> optimizer;  // own copy when parameters are not shared
    std::unique_ptr<ReplicaThread> thread; // null for replica 0
    StepStats stats;
    bool statsGlobal = false;              // stats already summed over every process
    bool applied = false;                  // this step reached the update (finite or not)
    bool finite = true;                    // loss scaling: the reduced gradients were finite
};

class ReplicatedStrategy final : public Strategy {
public:
    std::string m_name;
    int m_threadsPer = 1;
    std::vector<Replica> m_replicas;
    std::unique_ptr<Communicator> m_comm;
    std::unique_ptr<Optimizer> m_sharedOptimizer;
    bool m_sharedParams = false;
    std::atomic<bool> m_cancelled{false};
    // Multi-worker: the processes' link (rank m_processRank of m_processCount), else null.
    std::shared_ptr<Communicator> m_cross;
    int m_processRank = 0, m_processCount = 1;
    std::unique_ptr<LossScaler> m_scaler;  // mixed_float16 only

    std::string name() const override { return m_name; }
    int numReplicas() const override { return static_cast<int>(m_replicas.size()); }
    int globalReplicas() const override { return numReplicas() * m_processCount; }
    int threadsPerReplica() const override { return m_threadsPer; }
    std::vector<DeviceInfo> devices() const override
    {
        std::vector<DeviceInfo> out;
        for (const auto& r : m_replicas) out.push_back(r.backend->info());
        return out;
    }
    Program& primary() override { return *m_replicas[0].program; }
    void cancel() override
    {
        m_cancelled = true;
        if (m_comm) m_comm->abort(Communicator::cancelledCause());
    }
    void abandon(const Error& cause) override
    {
        if (m_comm) m_comm->abort(cause);
    }

    // A replica's failure as the cause the other replicas (and processes) are told.
    Error replicaCause(int r, const Error& e) const
    {
        return makeError(e.code, m_replicas[static_cast<std::size_t>(r)].device.toString() + ": " + e.message, e.hint);
    }

    // Runs fn(r) for every replica concurrently and returns the first error.
    Status runAll(const std::function<Status(int)>& fn)
    {
        const int n = numReplicas();
        for (int r = 1; r < n; ++r) {
            m_replicas[static_cast<std::size_t>(r)].thread->post([this, &fn, r] {
                Status st = fn(r);
                if (!st.ok() && m_comm) m_comm->abort(replicaCause(r, st.error()));
                return st;
            });
        }
        Status first = fn(0);
        if (!first.ok() && m_comm) m_comm->abort(replicaCause(0, first.error()));
        for (int r = 1; r < n; ++r) {
            Status st = m_replicas[static_cast<std::size_t>(r)].thread->wait();
            // A replica's own failure, not another's collective aborted because of it: its code
            // decides whether a restart could get past it.
            if (!st.ok() && (first.ok() || (first.error().code == ErrorCode::Cancelled && st.error().code != ErrorCode::Cancelled)))
                first = std::move(st);
        }
        return first;
    }

    // Local replica r's rows of `batch`, as indices into it: of a global (or sharded global)
    // batch, its global replica's share; of a local shard, its share of this process's rows.
    std::pair<int64_t, int64_t> rowsOf(int r, const Batch& batch) const
    {
        if (batch.localShard) {
            const int64_t n = numReplicas(), rows = batch.size();
            return {rows * r / n, rows * (r + 1) / n};
        }
        const int64_t n = globalReplicas(), rows = batch.globalSize();
        const int64_t g = static_cast<int64_t>(m_processRank) * numReplicas() + r;
        return {rows * g / n - batch.offset, rows * (g + 1) / n - batch.offset};
    }

    bool lockstep() const override { return m_cross != nullptr; }

    // A sharded batch must hold exactly this process's rows of the global batch.
    Status checkShard(const Batch& batch) const
    {
        if (batch.globalRows < 0 || batch.localShard) return okStatus();
        const int64_t g = batch.globalRows;
        const int64_t lo = g * m_processRank / m_processCount, hi = g * (m_processRank + 1) / m_processCount;
        if (batch.offset != lo || batch.size() != hi - lo)
            return makeError(ErrorCode::Internal, "process " + std::to_string(m_processRank) + " of " + std::to_string(m_processCount) +
                                                      " got rows [" + std::to_string(batch.offset) + ", " +
                                                      std::to_string(batch.offset + batch.size()) + ") of a batch of " +
                                                      std::to_string(g) + "; its share is [" + std::to_string(lo) + ", " +
                                                      std::to_string(hi) + ")");
        return okStatus();
    }

    // Multi-worker: the step's statistics summed over the processes, so every process reports
    // the global loss and accuracy (exact for counts below 2^24 per step).
    Status sumAcrossProcesses(StepStats& total)
    {
        if (!m_cross) return okStatus();
        Tensor t = Tensor::fromVector({3}, {static_cast<float>(total.lossSum), static_cast<float>(total.correct), static_cast<float>(total.count)});
        TS_TRY(m_cross->allReduceSum(m_processRank, t));
        total.lossSum = t.data<float>()[0];
        total.correct = static_cast<int64_t>(t.data<float>()[1]);
        total.count = static_cast<int64_t>(t.data<float>()[2]);
        return okStatus();
    }

    Status initialise(uint64_t seed) override
    {
        Program& p0 = primary();
        TS_TRY(p0.initialiseParameters(seed));
        if (!m_sharedParams && numReplicas() > 1) {
            TS_ASSIGN(auto params, p0.exportParameters());
            for (std::size_t r = 1; r < m_replicas.size(); ++r)
                TS_TRY(m_replicas[r].program->importParameters(params, "replica 0"));
        } else if (numReplicas() > 1) {
            // Shared trainable arena; per-replica non-trainable state starts from replica 0's.
            TS_ASSIGN(auto params, p0.exportParameters());
            for (std::size_t r = 1; r < m_replicas.size(); ++r)
                TS_TRY(m_replicas[r].program->importParameters(params, "replica 0"));
        }
        if (m_cross) {
            // TF's MultiWorkerMirrored starts every worker from the chief's values.
            TS_ASSIGN(auto params, p0.exportParameters());
            for (auto& [name, t] : params) TS_TRY(m_cross->broadcast(m_processRank, 0, t));
            for (auto& rep : m_replicas) TS_TRY(rep.program->importParameters(params, "the chief (process 0)"));
        }
        return okStatus();
    }

    Result<StepStats> trainStep(const Batch& batch, float lr, int64_t step, uint64_t seed) override
    {
        if (m_cancelled) return makeError(ErrorCode::Cancelled, "the run was cancelled");
        const int64_t rows = batch.globalSize();
        const int n = numReplicas();
        const int global = globalReplicas();
        TS_TRY(checkShard(batch));
        const float lossScale = m_scaler ? m_scaler->scale() : 1.0f;
        TS_TRY(runAll([&](int r) -> Status {
            Replica& rep = m_replicas[static_cast<std::size_t>(r)];
            Program& prog = *rep.program;
            Backend& be = *rep.backend;
            auto [b, e] = rowsOf(r, batch);
            rep.stats = {};
            rep.statsGlobal = false;
            rep.applied = false;
            rep.finite = true;
            Tensor grads = prog.gradientArena();
            // Phases: replica 0's (the trainer's thread) make the step-time breakdown; every
            // replica's become spans on its lane when tracing.
            using telemetry::PhaseScope;
            using telemetry::StepPart;
            if (e > b) {
                float loss = 0;
                int64_t correct = 0;
                {
                    PhaseScope phase(StepPart::Forward, "forward");
                    // Dropout streams follow the global replica, as in one process with all the replicas.
                    const uint64_t g = static_cast<uint64_t>(m_processRank) * static_cast<uint64_t>(n) + static_cast<uint64_t>(r);
                    TS_TRY(prog.forward(batch.x.rows(b, e), true, seed + g * 0x9E3779B97F4A7C15ull));
                }
                {
                    PhaseScope phase(StepPart::Backward, "backward");
                    TS_TRY(prog.lossAndBackward(batch.y.rows(b, e), true, rows, &loss, &correct, lossScale));
                }
                rep.stats = {static_cast<double>(loss) * static_cast<double>(e - b), correct, e - b};
            } else if (grads.defined()) {
                PhaseScope phase(StepPart::Backward, "backward");
                TS_TRY(be.scale(0.f, grads));  // no rows for this replica: contribute nothing
            }
            bool apply = true;
            float contributors = static_cast<float>(global);  // replicas whose batch-norm statistics moved
            if (global > 1 && grads.defined()) {
                PhaseScope phase(StepPart::Communication, "all-reduce");
                if (m_cross) {
                    // Multi-worker: the step's statistics ride in the gradients' tail, so every
                    // process learns the global loss without a second collective (each one is a
                    // point where the faster process waits for the slower).
                    Tensor withTail = prog.gradientArenaWithTail();
                    const int64_t total = grads.numel();
                    Tensor tail = withTail.rows(total, total + Program::kGradientTail);
                    const float sums[Program::kGradientTail] = {static_cast<float>(rep.stats.lossSum),
                                                               static_cast<float>(rep.stats.correct),
                                                               static_cast<float>(rep.stats.count), e > b ? 1.f : 0.f};
                    TS_TRY(be.copyFromHost(sums, tail));
                    TS_TRY(m_comm->allReduceSum(r, withTail));
                    float summed[Program::kGradientTail];
                    TS_TRY(be.copyToHost(tail, summed));
                    rep.stats = {summed[0], static_cast<int64_t>(summed[1]), static_cast<int64_t>(summed[2])};
                    rep.statsGlobal = true;
                    contributors = summed[3];
                    if (batch.localShard && rep.stats.count != rows) {
                        // Shards ran out unevenly. Every process's batch was empty (the epoch is
                        // over), or the global batch is short and the pipeline drops remainders
                        // (as one process would drop it): nothing is applied and the step does
                        // not count. Otherwise the gradients, divided by the nominal size, become
                        // the mean over the rows there were.
                        if (rep.stats.count == 0 || batch.dropRemainder) {
                            apply = false;
                            rep.stats = {};
                        } else {
                            TS_TRY(be.scale(static_cast<float>(rows) / static_cast<float>(rep.stats.count), grads));
                        }
                    }
                } else {
                    TS_TRY(m_comm->allReduceSum(r, grads));
                }
            }
            rep.applied = apply && grads.defined();
            if (m_scaler && rep.applied) {
                // Every replica holds the same reduced gradients, so all reach the same verdict.
                PhaseScope phase(StepPart::Optimizer, "loss-scale check");
                TS_ASSIGN(rep.finite, unscaleGradients(be, grads, lossScale));
            }
            if (grads.defined() && apply && rep.finite) {
                PhaseScope phase(StepPart::Optimizer, "optimizer update");
                const int64_t total = grads.numel();
                if (m_sharedParams) {
                    // Each replica updates its share of the one shared arena.
                    const int64_t ob = total * r / n, oe = total * (r + 1) / n;
                    if (oe > ob) TS_TRY(m_sharedOptimizer->apply(be, prog.trainableArena(), grads, ob, oe, lr, step));
                } else {
                    TS_TRY(rep.optimizer->apply(be, prog.trainableArena(), grads, 0, total, lr, step));
                }
            }
            Tensor frozen = prog.nonTrainableArena();
            if (global > 1 && frozen.defined() && apply) {
                // BatchNorm moving statistics: the mean over replicas (TF's MirroredVariable MEAN),
                // multi-worker: over the replicas that had rows (the gradient tail counted them),
                // so replicas idle at an epoch's end do not hold the statistics back.
                PhaseScope phase(StepPart::Communication, "all-reduce (batch-norm statistics)");
                if (m_cross && e == b) TS_TRY(be.scale(0.f, frozen));
                TS_TRY(m_comm->allReduceSum(r, frozen));
                TS_TRY(be.scale(1.f / std::max(1.f, contributors), frozen));
            }
            // Replica threads hand their spans over every step, so none are left behind at the end.
            if (r > 0 && telemetry::Tracer::enabled()) telemetry::Tracer::flushThread();
            return okStatus();
        }));
        StepStats total;
        if (m_replicas[0].statsGlobal) {
            // Multi-worker with gradients: every local replica holds the sums over all processes.
            total = m_replicas[0].stats;
        } else {
            for (const auto& rep : m_replicas) {
                total.lossSum += rep.stats.lossSum;
                total.correct += rep.stats.correct;
                total.count += rep.stats.count;
            }
            TS_TRY(sumAcrossProcesses(total));
        }
        if (m_scaler) {
            total.lossScale = lossScale;
            if (m_replicas[0].applied) total.skipped = !m_scaler->update(m_replicas[0].finite);
            total.skippedSteps = m_scaler->skippedSteps();
        }
        return total;
    }

    Result<StepStats> evalStep(const Batch& batch) override
    {
        if (m_cancelled) return makeError(ErrorCode::Cancelled, "the run was cancelled");
        const int64_t rows = batch.globalSize();
        TS_TRY(checkShard(batch));
        TS_TRY(runAll([&](int r) -> Status {
            Replica& rep = m_replicas[static_cast<std::size_t>(r)];
            auto [b, e] = rowsOf(r, batch);
            rep.stats = {};
            if (e == b) return okStatus();
            float loss = 0;
            int64_t correct = 0;
            TS_TRY(rep.program->forward(batch.x.rows(b, e), false, 0));
            TS_TRY(rep.program->lossAndBackward(batch.y.rows(b, e), false, rows, &loss, &correct));
            rep.stats = {static_cast<double>(loss) * static_cast<double>(e - b), correct, e - b};
            if (r > 0 && telemetry::Tracer::enabled()) telemetry::Tracer::flushThread();
            return okStatus();
        }));
        StepStats total;
        for (const auto& rep : m_replicas) {
            total.lossSum += rep.stats.lossSum;
            total.correct += rep.stats.correct;
            total.count += rep.stats.count;
        }
        TS_TRY(sumAcrossProcesses(total));
        // A short global batch of a pipeline that drops remainders is dropped, as in one process.
        if (batch.localShard && batch.dropRemainder && total.count != rows) return StepStats{};
        return total;
    }

    Result<std::vector<std::pair<std::string, Tensor>>> exportParameters() override { return primary().exportParameters(); }

    Status importParameters(const std::vector<std::pair<std::string, Tensor>>& tensors, const std::string& source) override
    {
        for (auto& rep : m_replicas) TS_TRY(rep.program->importParameters(tensors, source));
        return okStatus();
    }

    // Every replica applies the same update to the same values, so replica 0's state is all of it.
    Result<std::vector<std::pair<std::string, Tensor>>> exportOptimizerState() override
    {
        std::vector<std::pair<std::string, Tensor>> state;
        if (m_sharedOptimizer) {
            TS_ASSIGN(state, m_sharedOptimizer->exportState(*m_replicas[0].backend));
        } else if (m_replicas[0].optimizer) {
            TS_ASSIGN(state, m_replicas[0].optimizer->exportState(*m_replicas[0].backend));
        }
        if (m_scaler) state.emplace_back(kLossScaleState, lossScaleTensor(*m_scaler));
        return state;
    }

    Status importOptimizerState(const std::vector<std::pair<std::string, Tensor>>& all, const std::string& source) override
    {
        std::vector<std::pair<std::string, Tensor>> tensors;
        TS_TRY(takeLossScaleState(all, m_scaler.get(), source, tensors));
        if (m_sharedOptimizer) return m_sharedOptimizer->importState(*m_replicas[0].backend, tensors, source);
        for (auto& rep : m_replicas)
            if (rep.optimizer) TS_TRY(rep.optimizer->importState(*rep.backend, tensors, source));
        return okStatus();
    }

    int processRank() const override { return m_processRank; }
    int processCount() const override { return m_processCount; }
    Status broadcastFromChief(Tensor& t) override
    {
        if (!m_cross) return okStatus();
        return m_cross->broadcast(m_processRank, 0, t);
    }
};

} // namespace

Result<std::vector<std::pair<std::string, Tensor>>> Strategy::exportOptimizerState()
{
    return makeError(ErrorCode::Unsupported, "the " + name() + " strategy cannot back up its optimizer state",
                     "back up the run without this strategy, or turn backups off");
}

Result<std::string> Strategy::shareResumePoint(const std::string&)
{
    return makeError(ErrorCode::Unsupported, "the " + name() + " strategy shares its resume point with broadcastFromChief");
}

Status Strategy::importOptimizerState(const std::vector<std::pair<std::string, Tensor>>&, const std::string&)
{
    return makeError(ErrorCode::Unsupported, "the " + name() + " strategy cannot restore optimizer state",
                     "back up the run without this strategy, or turn backups off");
}

Result<std::unique_ptr<Strategy>> Strategy::create(const StrategyConfig& config,
                                                   std::shared_ptr<const GraphAnalysis> graph,
                                                   const LossSpec& loss, const nlohmann::json& optimizerConfig)
{
    auto s = std::make_unique<ReplicatedStrategy>();
    std::vector<Device> devices = config.devices;
    const int totalThreads = config.threads > 0 ? config.threads : hardwareThreads();
    if (config.kind == "one-device" || config.kind == "onedevice" || config.kind == "one_device") {
        s->m_name = "one-device";
        if (devices.empty()) devices = {Device{DeviceKind::Cpu, 0}};
        if (devices.size() != 1)
            return makeError(ErrorCode::InvalidArgument,
                             "the one-device strategy takes exactly one device, got " + std::to_string(devices.size()),
                             "pass one device (e.g. --devices cpu:0) or use --strategy mirrored");
    } else if (config.kind == "mirrored") {
        s->m_name = "mirrored";
        if (devices.empty())
            for (int i = 0; i < std::max(1, std::min(totalThreads, hardwareThreads())); ++i)
                devices.push_back(Device{DeviceKind::Cpu, i});
    } else if (config.kind == "multi-worker-mirrored" || config.kind == "multi_worker_mirrored") {
        s->m_name = "multi-worker-mirrored";
        if (!config.crossProcess)
            return makeError(ErrorCode::InvalidArgument, "multi-worker-mirrored needs a cluster, and none was connected",
                             "run each task with TF_CONFIG set (or trainstudio-cli train --tf-config FILE)");
        if (config.processRank < 0 || config.processRank >= config.crossProcess->size())
            return makeError(ErrorCode::InvalidArgument, "process rank " + std::to_string(config.processRank) + " is not in the cluster's 0.." +
                                                             std::to_string(config.crossProcess->size() - 1));
        s->m_cross = config.crossProcess;
        s->m_processRank = config.processRank;
        s->m_processCount = config.crossProcess->size();
        if (devices.empty()) devices = {Device{DeviceKind::Cpu, 0}};
    } else if (isParameterServer(config.kind)) {
        return makeParameterServerStrategy(config, graph, loss);
    } else {
        return makeError(ErrorCode::InvalidArgument, "unknown strategy '" + config.kind + "'",
                         "use one-device, mirrored, multi-worker-mirrored or parameter-server (with a cluster)");
    }
    for (std::size_t i = 0; i < devices.size(); ++i)
        for (std::size_t j = i + 1; j < devices.size(); ++j)
            if (devices[i] == devices[j])
                return makeError(ErrorCode::InvalidArgument, "device " + devices[i].toString() + " is listed twice",
                                 "each replica needs its own device");
    const int n = static_cast<int>(devices.size());
    s->m_threadsPer = std::max(1, totalThreads / n);
    BackendOptions opts;
    opts.threads = s->m_threadsPer;
    auto& registry = BackendRegistry::instance();
    s->m_replicas.resize(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r) {
        Replica& rep = s->m_replicas[static_cast<std::size_t>(r)];
        rep.device = devices[static_cast<std::size_t>(r)];
        auto be = config.backend.empty() ? registry.create(rep.device, opts)
                                         : registry.create(config.backend, rep.device.index, opts);
        if (!be.ok()) {
            Error e = be.takeError();
            e.message = rep.device.toString() + ": " + e.message;
            return e;
        }
        rep.backend = std::move(be).value();
        TS_TRY(rep.backend->setComputeType(config.precision.computeType()));
    }
    if (config.precision.scalesLoss()) s->m_scaler = std::make_unique<LossScaler>(config.precision);
    bool allHost = true;
    for (auto& rep : s->m_replicas) allHost &= rep.backend->allocator().hostAccessible();
    s->m_sharedParams = allHost && n > 1;
    // Each replica's backend is bound on its own thread; Programs are built there too so that
    // first-touch memory lands near the thread that uses it.
    for (int r = 0; r < n; ++r) {
        Replica& rep = s->m_replicas[static_cast<std::size_t>(r)];
        if (r == 0) {
            rep.backend->bindThread();
        } else {
            Backend* be = rep.backend.get();
            rep.thread = std::make_unique<ReplicaThread>([be, r] {
                be->bindThread();
                telemetry::Tracer::setThreadLane(telemetry::Lane{"local", be->device().toString(), "replica " + std::to_string(r)});
            });
        }
    }
    Program* shared = nullptr;
    for (int r = 0; r < n; ++r) {
        Replica& rep = s->m_replicas[static_cast<std::size_t>(r)];
        auto prog = Program::create(graph, *rep.backend, loss, s->m_sharedParams ? shared : nullptr);
        if (!prog.ok()) return prog.takeError();
        rep.program = std::move(prog).value();
        if (r == 0) shared = rep.program.get();
    }
    const int64_t nparams = s->m_replicas[0].program->trainableCount();
    if (s->m_sharedParams) {
        TS_ASSIGN(s->m_sharedOptimizer, Optimizer::create(optimizerConfig));
        if (nparams > 0) TS_TRY(s->m_sharedOptimizer->prepare(*s->m_replicas[0].backend, nparams));
    } else {
        for (auto& rep : s->m_replicas) {
            TS_ASSIGN(rep.optimizer, Optimizer::create(optimizerConfig));
            if (nparams > 0) TS_TRY(rep.optimizer->prepare(*rep.backend, nparams));
        }
    }
    if (s->m_cross) {
        // Every process must build the same kind of collective (they make different calls on
        // the cross-process link otherwise), so first agree on where the replicas' tensors
        // live; and batches are split by global replica index, which needs the same number of
        // local replicas in every process.
        Tensor agree = Tensor::fromVector({2}, {allHost ? 0.f : 1.f, static_cast<float>(n)});
        TS_TRY(s->m_cross->allReduceSum(s->m_processRank, agree));
        const float devicesAt = agree.data<float>()[0], replicas = agree.data<float>()[1];
        if (replicas != static_cast<float>(n * s->m_processCount))
            return makeError(ErrorCode::InvalidArgument,
                             "the workers of this multi-worker run have different numbers of local replicas (this one: " + std::to_string(n) +
                                 ", " + std::to_string(static_cast<int64_t>(replicas)) + " over " + std::to_string(s->m_processCount) +
                                 " processes)",
                             "give every task the same --devices");
        if (devicesAt != 0.f && devicesAt != static_cast<float>(s->m_processCount))
            return makeError(ErrorCode::InvalidArgument,
                             "the workers of this multi-worker run mix host and GPU replicas (" + std::to_string(static_cast<int>(devicesAt)) +
                                 " of " + std::to_string(s->m_processCount) + " processes train on GPUs; this one on " +
                                 s->m_replicas[0].device.toString() + ")",
                             "give every task the same kind of --devices");
    }
    if (!allHost && s->globalReplicas() > 1) {
        // Replicas in device memory: the device's own collectives (NCCL), which read and write
        // the gradients where they are, on the device's stream.
        const std::string backendName = s->m_replicas[0].backend->name();
        CollectiveGroup group;
        for (auto& rep : s->m_replicas) {
            if (rep.backend->name() != backendName || rep.backend->allocator().hostAccessible())
                return makeError(ErrorCode::InvalidArgument,
                                 "the replicas mix devices (" + s->m_replicas[0].device.toString() + " on " + backendName + ", " +
                                     rep.device.toString() + " on " + rep.backend->name() + ")",
                                 "give every replica the same kind of device");
            group.devices.push_back(rep.device.index);
        }
        group.crossProcess = s->m_cross.get();
        group.processRank = s->m_processRank;
        group.processCount = s->m_processCount;
        group.timeout = config.collectiveTimeout;
        const BackendFactory* factory = registry.find(backendName);
        if (!factory || !factory->communicator)
            return makeError(ErrorCode::Unsupported,
                             "the " + backendName + " backend has no collectives, so " + s->m_name + " cannot reduce gradients over " +
                                 std::to_string(s->globalReplicas()) + " replicas on it",
                             "train on one device (--strategy one-device) or on cpu devices");
        TS_ASSIGN(s->m_comm, factory->communicator(group));
    } else if (s->m_cross) {
        s->m_comm = makeHierarchicalCommunicator(n, s->m_cross, s->m_processRank);
        // The gradients (and their statistics tail) cross processes every step: reduced in
        // place, without staging copies.
        for (int r = 0; r < n; ++r) {
            Tensor g = s->m_replicas[static_cast<std::size_t>(r)].program->gradientArenaWithTail();
            if (g.defined()) TS_TRY(s->m_comm->registerBuffer(r, g));
        }
    } else if (n > 1) {
        s->m_comm = makeLocalCommunicator(n);
    }
    return std::unique_ptr<Strategy>(std::move(s));
}

} // namespace ts
