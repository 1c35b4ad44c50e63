#include "remote/parameter_service.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <optional>

#include "backend/registry.h"
#include "distribute/step_schedule.h"
#include "optim/optimizer.h"
#include "parameter_server.grpc.pb.h"
#include "remote/auth.h"
#include "remote/schedule_proto.h"
#include "telemetry/bus.h"
#include "telemetry/tracer.h"

namespace ts::remote {
namespace {

grpc::Status refuse(const grpc::ServerContext& ctx, grpc::StatusCode code, const std::string& call, const std::string& why)
{
    logLine("refused " + call + " from " + ctx.peer() + ": " + why);
    return grpc::Status(code, why);
}

// Adds the time from construction to destruction to `busy` and, with a bus, publishes it as a
// span. Lives inside the shard's lock, so what it measures is the shard's serial work.
class ShardWork {
public:
    ShardWork(double& busy, telemetry::EventBus* bus, const std::string& runId, const std::string& device, int64_t version, const char* name,
              const char* category)
        : m_busy(busy), m_bus(bus), m_runId(runId), m_device(device), m_version(version), m_name(name), m_category(category),
          m_start(std::chrono::steady_clock::now()), m_startUs(bus ? telemetry::wallNowMicros() : 0)
    {
    }
    ~ShardWork()
    {
        const auto took = std::chrono::steady_clock::now() - m_start;
        m_busy += std::chrono::duration<double>(took).count();
        if (!m_bus) return;
        telemetry::SpanEvent e;
        e.stamp = telemetry::Stamp{m_runId, m_version, m_startUs, telemetry::Lane{"local", m_device, "shard"}};
        e.name = m_name;
        e.category = m_category;
        e.startUs = m_startUs;
        e.durationUs = std::chrono::duration_cast<std::chrono::microseconds>(took).count();
        e.args = std::move(args);
        m_bus->publish(telemetry::Event(std::move(e)));
    }
    ShardWork(const ShardWork&) = delete;
    ShardWork& operator=(const ShardWork&) = delete;
    std::map<std::string, std::string> args;

private:
    double& m_busy;
    telemetry::EventBus* m_bus;
    const std::string& m_runId;
    const std::string& m_device;
    int64_t m_version;
    const char* m_name;
    const char* m_category;
    std::chrono::steady_clock::time_point m_start;
    int64_t m_startUs;
};

} // namespace

class ParameterService::Impl final : public ParameterServer::Service {
public:
    Impl(std::string token, int64_t maxMessageBytes) : m_token(std::move(token)), m_maxMessageBytes(maxMessageBytes) {}

    grpc::Status Initialize(grpc::ServerContext* ctx, const InitializeRequest* req, InitializeReply* reply) override
    {
        const char* call = "ParameterServer.Initialize";
        if (auto st = checkToken(*ctx, m_token, call); !st.ok()) return st;
        std::lock_guard lock(m_mutex);
        if (auto st = checkRun(*ctx, call, req->run_id(), false); !st.ok()) return st;
        if (m_initialised) return refuse(*ctx, grpc::StatusCode::ALREADY_EXISTS, call, m_label + " of run " + m_runId + " is already initialised");
        reply->set_max_part_bytes(m_maxMessageBytes);
        if (req->layout() || req->slices_size() > 0) {
            // The layout part (again, if an initialiser started over): the shard is allocated.
            if (req->slices_size() != req->slice_sizes_size())
                return refuse(*ctx, grpc::StatusCode::INVALID_ARGUMENT, call, "need one size per slice");
            if (req->version() < 0) return refuse(*ctx, grpc::StatusCode::INVALID_ARGUMENT, call, "version must be >= 0");
            int64_t total = 0;
            for (int64_t n : req->slice_sizes()) {
                if (n < 0 || n > (int64_t{1} << 40)) return refuse(*ctx, grpc::StatusCode::INVALID_ARGUMENT, call, "slice size " + std::to_string(n) + " is out of range");
                total += n;
            }
            m_layout = false;
            auto values = Tensor::create(Shape({total}), DType::F32, m_backend->allocator());
            auto grads = Tensor::create(Shape({total}), DType::F32, m_backend->allocator());
            if (!values.ok() || !grads.ok())
                return refuse(*ctx, grpc::StatusCode::RESOURCE_EXHAUSTED, call, "cannot allocate a shard of " + std::to_string(total) + " values");
            m_values = std::move(values).value();
            m_grads = std::move(grads).value();
            m_slices.assign(req->slices().begin(), req->slices().end());
            m_counts.assign(req->slice_sizes().begin(), req->slice_sizes().end());
            m_total = total;
            m_filled = 0;
            m_initState.clear();
            m_initVersion = req->version();
            m_resume = req->resume();
            m_scheduleConfig.reset();
            if (req->has_schedule()) {
                const Schedule& sc = req->schedule();
                if (sc.workers() < 1 || sc.epochs() < 1 || sc.max_steps() < 0 || sc.completed() < 0)
                    return refuse(*ctx, grpc::StatusCode::INVALID_ARGUMENT, call, "the step schedule needs workers >= 1, epochs >= 1, max_steps >= 0");
                ScheduleConfig c;
                c.workers = sc.workers();
                c.epochs = sc.epochs();
                c.maxSteps = sc.max_steps();
                c.completed = sc.completed();
                c.epochSoFar = tallyFromProto(sc.epoch_so_far());
                m_scheduleConfig = c;
            }
            m_layout = true;
        } else if (!m_layout) {
            return refuse(*ctx, grpc::StatusCode::FAILED_PRECONDITION, call, "send the shard's layout (its slices) before its values");
        }
        // Data: the parts arrive in order, so a lost or repeated one is caught.
        if (req->values().size() % 4 != 0) return refuse(*ctx, grpc::StatusCode::INVALID_ARGUMENT, call, "values must be whole float32s");
        const int64_t n = static_cast<int64_t>(req->values().size() / 4);
        if (n > 0 || req->state_size() > 0) {
            if (req->offset() != m_filled)
                return refuse(*ctx, grpc::StatusCode::INVALID_ARGUMENT, call,
                              "a part at offset " + std::to_string(req->offset()) + " where " + std::to_string(m_filled) + " was next");
            if (n > m_total - m_filled)
                return refuse(*ctx, grpc::StatusCode::INVALID_ARGUMENT, call, "values beyond the shard's " + std::to_string(m_total));
            if (m_filled == 0 && m_initState.empty())
                for (const auto& s : req->state()) m_initState.emplace_back(s.name(), std::vector<float>());
            if (req->state_size() != static_cast<int>(m_initState.size()))
                return refuse(*ctx, grpc::StatusCode::INVALID_ARGUMENT, call, "every part needs the same optimizer state tensors");
            for (int i = 0; i < req->state_size(); ++i) {
                const OptimizerState& s = req->state(i);
                auto& [name, flat] = m_initState[static_cast<std::size_t>(i)];
                if (s.name() != name || static_cast<int64_t>(s.data().size()) != n * 4)
                    return refuse(*ctx, grpc::StatusCode::INVALID_ARGUMENT, call,
                                  "optimizer state '" + s.name() + "' does not match the part's values (name or size)");
            }
            Tensor view = m_values.rows(m_filled, m_filled + n);
            if (n > 0 && !m_backend->copyFromHost(req->values().data(), view).ok())
                return refuse(*ctx, grpc::StatusCode::INTERNAL, call, "cannot store the initial values");
            for (int i = 0; i < req->state_size(); ++i) {
                auto& flat = m_initState[static_cast<std::size_t>(i)].second;
                const std::size_t at = flat.size();
                flat.resize(at + static_cast<std::size_t>(n));
                std::memcpy(flat.data() + at, req->state(i).data().data(), static_cast<std::size_t>(n) * 4);
            }
            m_filled += n;
        }
        if (!req->last()) return grpc::Status::OK;
        if (m_filled != m_total)
            return refuse(*ctx, grpc::StatusCode::INVALID_ARGUMENT, call,
                          "initialisation ended after " + std::to_string(m_filled) + " of the shard's " + std::to_string(m_total) + " values");
        if (auto st = m_optimizer->prepare(*m_backend, m_total); !st.ok())
            return refuse(*ctx, grpc::StatusCode::INTERNAL, call, st.error().message);
        // Resuming from a backup: the optimizer's state.
        if (!m_initState.empty()) {
            std::vector<std::pair<std::string, Tensor>> state;
            for (auto& [name, flat] : m_initState) state.emplace_back(name, Tensor::fromVector(Shape({m_total}), flat));
            m_initState.clear();
            if (auto st = m_optimizer->importState(*m_backend, state, m_label + "'s initial state"); !st.ok())
                return refuse(*ctx, grpc::StatusCode::INVALID_ARGUMENT, call, st.error().message);
        }
        m_initialised = true;
        if (m_scheduleConfig) {
            m_schedule = std::make_shared<StepSchedule>(*m_scheduleConfig);
            for (const auto& w : m_releasedEarly) m_schedule->release(w);
        }
        m_stats = {};
        m_stats.initialised = true;
        m_stats.elements = m_total;
        m_stats.version = m_initVersion;
        logLine(m_label + " of run " + m_runId + ": initialised " + std::to_string(m_slices.size()) + " slice(s), " +
                std::to_string(m_total) + " values, by " + ctx->peer());
        return grpc::Status::OK;
    }

    grpc::Status Pull(grpc::ServerContext* ctx, const PullRequest* req, PullReply* reply) override
    {
        const char* call = "ParameterServer.Pull";
        if (auto st = checkToken(*ctx, m_token, call); !st.ok()) return st;
        std::lock_guard lock(m_mutex);
        if (auto st = checkRun(*ctx, call, req->run_id(), true); !st.ok()) return st;
        ShardWork work(m_stats.busySeconds, m_traceBus, m_runId, m_device, m_stats.version, "serve pull", "communication");
        reply->set_version(m_stats.version);
        reply->set_elements(m_total);
        reply->set_max_part_bytes(m_maxMessageBytes);
        int64_t layoutBytes = 0;
        if (req->describe()) {
            for (std::size_t i = 0; i < m_slices.size(); ++i) {
                reply->add_slices(m_slices[i]);
                reply->add_slice_sizes(m_counts[i]);
                layoutBytes += static_cast<int64_t>(m_slices[i].size()) + 16;
            }
            reply->set_resume(m_resume);
            layoutBytes += static_cast<int64_t>(m_resume.size());
        }
        if (req->max_bytes() == 0) return grpc::Status::OK;
        auto n = partElements(*ctx, call, req->offset(), req->max_bytes(), layoutBytes, 1);
        if (!n.ok()) return n.status;
        reply->set_offset(req->offset());
        std::string* out = reply->mutable_values();
        out->resize(static_cast<std::size_t>(n.elements) * 4);
        Tensor view = m_values.rows(req->offset(), req->offset() + n.elements);
        if (n.elements > 0 && !m_backend->copyToHost(view, out->data()).ok())
            return grpc::Status(grpc::StatusCode::INTERNAL, "cannot read the shard");
        if (req->offset() == 0) ++m_stats.pulls;
        m_stats.bytesOut += n.elements * 4;
        return grpc::Status::OK;
    }

    grpc::Status Push(grpc::ServerContext* ctx, const PushRequest* req, PushReply* reply) override
    {
        const char* call = "ParameterServer.Push";
        if (auto st = checkToken(*ctx, m_token, call); !st.ok()) return st;
        std::lock_guard lock(m_mutex);
        if (auto st = checkRun(*ctx, call, req->run_id(), true); !st.ok()) return st;
        if (req->grads().size() % 4 != 0) return refuse(*ctx, grpc::StatusCode::INVALID_ARGUMENT, call, "gradients must be whole float32s");
        const int64_t n = static_cast<int64_t>(req->grads().size() / 4);
        if (req->offset() < 0 || n > m_total - req->offset())
            return refuse(*ctx, grpc::StatusCode::INVALID_ARGUMENT, call,
                          std::to_string(n) + " gradients at offset " + std::to_string(req->offset()) + ", " + m_label + " holds " +
                              std::to_string(m_total) + " values");
        const float lr = req->learning_rate();
        if (!std::isfinite(lr) || lr < 0) return refuse(*ctx, grpc::StatusCode::INVALID_ARGUMENT, call, "learning_rate must be finite and >= 0");
        if (req->pulled_version() < 0 || req->pulled_version() > m_stats.version)
            return refuse(*ctx, grpc::StatusCode::INVALID_ARGUMENT, call, "pulled_version " + std::to_string(req->pulled_version()) + " was never served");
        ShardWork work(m_stats.busySeconds, m_traceBus, m_runId, m_device, m_stats.version + 1, "apply update", "optimizer");
        const int64_t at = req->offset();
        if (n > 0) {
            Tensor view = m_grads.rows(at, at + n);
            if (!m_backend->copyFromHost(req->grads().data(), view).ok()) return grpc::Status(grpc::StatusCode::INTERNAL, "cannot stage the gradients");
            // The ps's own update count drives Adam's bias correction, as TF's optimizer.iterations on a ps.
            if (auto st = m_optimizer->apply(*m_backend, m_values, m_grads, at, at + n, lr, m_stats.version + 1); !st.ok())
                return grpc::Status(grpc::StatusCode::INTERNAL, m_label + ": " + st.error().message);
        }
        m_stats.bytesIn += n * 4;
        reply->set_version(m_stats.version);
        if (!req->last()) return grpc::Status::OK;
        const int64_t staleness = m_stats.version - req->pulled_version();
        ++m_stats.version;
        if (m_traceBus) work.args = {{"worker", req->worker()}, {"staleness", std::to_string(staleness)}};
        m_stats.maxStaleness = std::max(m_stats.maxStaleness, staleness);
        m_stats.sumStaleness += static_cast<double>(staleness);
        reply->set_version(m_stats.version);
        reply->set_staleness(staleness);
        return grpc::Status::OK;
    }

    grpc::Status Snapshot(grpc::ServerContext* ctx, const SnapshotRequest* req, SnapshotReply* reply) override
    {
        const char* call = "ParameterServer.Snapshot";
        if (auto st = checkToken(*ctx, m_token, call); !st.ok()) return st;
        std::lock_guard lock(m_mutex);
        if (auto st = checkRun(*ctx, call, req->run_id(), true); !st.ok()) return st;
        if (req->offset() == 0) {
            // A new snapshot: one copy of the values and the optimizer's state at this moment.
            ShardWork work(m_stats.busySeconds, m_traceBus, m_runId, m_device, m_stats.version, "take snapshot", "checkpoint");
            auto state = m_optimizer->exportState(*m_backend);
            if (!state.ok()) return grpc::Status(grpc::StatusCode::INTERNAL, m_label + ": " + state.error().message);
            Snap snap;
            snap.id = ++m_lastSnapshot;
            snap.version = m_stats.version;
            snap.values.resize(static_cast<std::size_t>(m_total));
            if (m_total > 0 && !m_backend->copyToHost(m_values, snap.values.data()).ok())
                return grpc::Status(grpc::StatusCode::INTERNAL, "cannot read the shard");
            for (const auto& [name, t] : *state) {
                if (t.numel() != m_total) return grpc::Status(grpc::StatusCode::INTERNAL, m_label + ": optimizer state '" + name + "' has the wrong size");
                snap.state.emplace_back(name, std::vector<float>(t.data<float>(), t.data<float>() + m_total));
            }
            if (m_schedule) {
                const ScheduleSnapshot sched = m_schedule->snapshot();
                snap.completed = sched.completed;
                snap.epochSoFar = sched.epochSoFar;
            }
            m_snapshot = std::move(snap);
        } else if (!m_snapshot || m_snapshot->id != req->snapshot()) {
            return refuse(*ctx, grpc::StatusCode::ABORTED, call,
                          "snapshot " + std::to_string(req->snapshot()) + " is gone (another one was taken since): take it again from offset 0");
        }
        const Snap& snap = *m_snapshot;
        auto n = partElements(*ctx, call, req->offset(), req->max_bytes(), 0, 1 + static_cast<int64_t>(snap.state.size()));
        if (!n.ok()) return n.status;
        reply->set_version(snap.version);
        reply->set_snapshot(snap.id);
        reply->set_offset(req->offset());
        reply->set_elements(m_total);
        const auto bytes = [&](const std::vector<float>& flat) {
            return std::string(reinterpret_cast<const char*>(flat.data() + req->offset()), static_cast<std::size_t>(n.elements) * 4);
        };
        reply->set_values(bytes(snap.values));
        if (req->offset() == 0) {
            reply->set_completed_steps(snap.completed);
            tallyToProto(snap.epochSoFar, reply->mutable_epoch_so_far());
        }
        for (const auto& [name, flat] : snap.state) {
            OptimizerState* o = reply->add_state();
            o->set_name(name);
            o->set_data(bytes(flat));
        }
        m_stats.bytesOut += n.elements * 4 * (1 + static_cast<int64_t>(snap.state.size()));
        if (req->offset() + n.elements == m_total) m_snapshot.reset();  // all served: free the copy
        return grpc::Status::OK;
    }

    grpc::Status ClaimStep(grpc::ServerContext* ctx, const ClaimRequest* req, ClaimReply* reply) override
    {
        const char* call = "ParameterServer.ClaimStep";
        if (auto st = checkToken(*ctx, m_token, call); !st.ok()) return st;
        if (req->worker().empty() || req->worker().size() > 256)
            return refuse(*ctx, grpc::StatusCode::INVALID_ARGUMENT, call, "name the claiming worker (\"worker:1\")");
        // Claims and the epochs they complete are serialised here, not under the shard's lock:
        // epochs are told in order, and the daemon's callback may take its own locks.
        std::lock_guard claims(m_claimMutex);
        std::shared_ptr<StepSchedule> schedule;
        {
            std::lock_guard lock(m_mutex);
            if (auto st = checkRun(*ctx, call, req->run_id(), true); !st.ok()) return st;
            if (!m_schedule)
                return refuse(*ctx, grpc::StatusCode::FAILED_PRECONDITION, call,
                              m_label + " of run " + m_runId + " schedules no steps (ps:0 does, when worker 0 gave it the schedule)");
            schedule = m_schedule;
        }
        std::vector<ts::StepOutcome> done;
        for (const auto& o : req->done()) done.push_back(ts::StepOutcome{o.step(), o.loss_sum(), o.correct(), o.count()});
        std::vector<EpochDone> epochs;
        auto grant = schedule->claim(req->worker(), req->batches_per_epoch(), done, &epochs);
        if (!grant.ok())
            return refuse(*ctx, grant.error().code == ErrorCode::Cancelled ? grpc::StatusCode::FAILED_PRECONDITION : grpc::StatusCode::INVALID_ARGUMENT,
                          call, grant.error().message);
        if (m_onEpoch)
            for (const auto& e : epochs) m_onEpoch(e);
        reply->set_kind(grant->kind == StepGrant::Kind::Step   ? ClaimReply::STEP
                        : grant->kind == StepGrant::Kind::Wait ? ClaimReply::WAIT
                                                               : ClaimReply::DONE);
        reply->set_step(grant->step);
        reply->set_count(grant->count);
        reply->set_epoch(grant->epoch);
        reply->set_step_in_epoch(grant->stepInEpoch);
        reply->set_steps_per_epoch(grant->stepsPerEpoch);
        reply->set_total_steps(grant->totalSteps);
        return grpc::Status::OK;
    }

    grpc::Status Release(grpc::ServerContext* ctx, const ReleaseRequest* req, ReleaseReply*) override
    {
        return membership(*ctx, *req, false);
    }

    grpc::Status Readmit(grpc::ServerContext* ctx, const ReleaseRequest* req, ReleaseReply*) override
    {
        return membership(*ctx, *req, true);
    }

    // Release: the coordinator lost a worker (its steps go to the others, its claims are
    // refused). Readmit: it is back with a new task and claims steps again.
    grpc::Status membership(grpc::ServerContext& ctx, const ReleaseRequest& req, bool readmit)
    {
        const char* call = readmit ? "ParameterServer.Readmit" : "ParameterServer.Release";
        if (auto st = checkToken(ctx, m_token, call); !st.ok()) return st;
        std::lock_guard claims(m_claimMutex);
        std::lock_guard lock(m_mutex);
        if (auto st = checkRun(ctx, call, req.run_id(), false); !st.ok()) return st;
        logLine(m_label + " of run " + m_runId + ": " + req.worker() + (readmit ? " readmitted by " : " released by ") + ctx.peer() +
                (req.reason().empty() ? std::string() : " (" + req.reason() + ")") +
                (readmit ? "; it takes steps again" : "; its steps go to the other workers"));
        const std::string& w = req.worker();
        if (readmit) {
            if (m_schedule) m_schedule->readmit(w);
            else m_releasedEarly.erase(std::remove(m_releasedEarly.begin(), m_releasedEarly.end(), w), m_releasedEarly.end());
        } else {
            if (m_schedule) m_schedule->release(w);
            else m_releasedEarly.push_back(w);
        }
        return grpc::Status::OK;
    }

    // How many values from `offset` the reply carries: as many as fit both bounds, each value
    // taking `perValue` floats (the values and their optimizer state). Called with m_mutex held.
    struct PartSize {
        int64_t elements = 0;
        grpc::Status status;
        bool ok() const { return status.ok(); }
    };
    PartSize partElements(const grpc::ServerContext& ctx, const char* call, int64_t offset, int64_t maxBytes, int64_t extraBytes, int64_t perValue)
    {
        PartSize out;
        if (offset < 0 || offset > m_total) {
            out.status = refuse(ctx, grpc::StatusCode::OUT_OF_RANGE, call, "offset " + std::to_string(offset) + " is outside the shard's " + std::to_string(m_total) + " values");
            return out;
        }
        // max_bytes comes from the network: clamped before the arithmetic (INT64_MIN would wrap).
        const int64_t bound = std::clamp<int64_t>(maxBytes, 0, m_maxMessageBytes);
        const int64_t budget = bound - kPartEnvelopeBytes - extraBytes;
        out.elements = std::min(m_total - offset, std::max<int64_t>(0, budget) / (4 * perValue));
        if (out.elements == 0 && offset < m_total)
            out.status = refuse(ctx, grpc::StatusCode::RESOURCE_EXHAUSTED, call, "a part of " + std::to_string(bound) + " bytes cannot carry a value");
        return out;
    }

    // Called with m_mutex held.
    grpc::Status checkRun(const grpc::ServerContext& ctx, const char* call, const std::string& runId, bool needInitialised)
    {
        if (m_runId.empty() || runId != m_runId)
            return refuse(ctx, grpc::StatusCode::UNAVAILABLE, call, "this daemon runs no ps task of run " + runId + " (yet)");
        if (needInitialised && !m_initialised)
            return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, m_label + " of run " + runId + " is not initialised yet");
        return grpc::Status::OK;
    }

    struct Snap {
        int64_t id = 0, version = 0;
        int64_t completed = 0;
        StepTally epochSoFar;
        std::vector<float> values;
        std::vector<std::pair<std::string, std::vector<float>>> state;
    };

    void reset()
    {
        m_values = Tensor();
        m_grads = Tensor();
        m_slices.clear();
        m_counts.clear();
        m_total = m_filled = 0;
        m_initState.clear();
        m_snapshot.reset();
        m_layout = m_initialised = false;
        m_scheduleConfig.reset();
        m_schedule.reset();
        m_releasedEarly.clear();
    }

    std::string m_token;
    const int64_t m_maxMessageBytes;
    mutable std::mutex m_mutex;
    std::string m_runId, m_label, m_device;
    telemetry::EventBus* m_traceBus = nullptr;
    std::unique_ptr<Backend> m_backend;
    std::unique_ptr<Optimizer> m_optimizer;
    Tensor m_values, m_grads;
    std::vector<std::string> m_slices;
    std::vector<int64_t> m_counts;
    int64_t m_total = 0;
    // Initialisation in progress: the values stored so far, the optimizer state received.
    int64_t m_filled = 0, m_initVersion = 0;
    std::vector<std::pair<std::string, std::vector<float>>> m_initState;
    std::optional<Snap> m_snapshot;  // being served in parts
    int64_t m_lastSnapshot = 0;
    std::string m_resume;  // worker 0's position in the data when resuming from a backup
    bool m_layout = false, m_initialised = false;
    ShardStats m_stats;
    // ps:0: the run's step schedule (from worker 0's layout part), and workers released before it.
    std::mutex m_claimMutex;  // taken before m_mutex
    std::optional<ScheduleConfig> m_scheduleConfig;
    std::shared_ptr<StepSchedule> m_schedule;
    std::vector<std::string> m_releasedEarly;
    std::function<void(const EpochDone&)> m_onEpoch;
};

ParameterService::ParameterService(std::string token, int maxMessageBytes) : m_impl(std::make_unique<Impl>(std::move(token), maxMessageBytes)) {}
ParameterService::~ParameterService() = default;
grpc::Service* ParameterService::service() { return m_impl.get(); }

Status ParameterService::host(const std::string& runId, const std::string& label, const nlohmann::json& optimizer, const std::string& backend,
                              telemetry::EventBus* traceBus, std::function<void(const EpochDone&)> onEpoch)
{
    TS_ASSIGN(auto opt, Optimizer::create(optimizer));
    BackendOptions bo;
    bo.threads = 1;  // updates are serialised; one core keeps the daemon light next to workers
    auto& registry = BackendRegistry::instance();
    auto be = backend.empty() ? registry.create(Device{DeviceKind::Cpu, 0}, bo) : registry.create(backend, 0, bo);
    if (!be.ok()) return be.takeError();
    std::lock_guard claims(m_impl->m_claimMutex);
    std::lock_guard lock(m_impl->m_mutex);
    m_impl->m_onEpoch = std::move(onEpoch);
    m_impl->m_runId = runId;
    m_impl->m_label = label;
    m_impl->m_optimizer = std::move(opt);
    m_impl->m_backend = std::move(be).value();
    m_impl->m_device = m_impl->m_backend->device().toString();
    m_impl->m_traceBus = traceBus;
    m_impl->reset();
    m_impl->m_stats = {};
    return okStatus();
}

void ParameterService::unhost()
{
    std::lock_guard claims(m_impl->m_claimMutex);
    std::lock_guard lock(m_impl->m_mutex);
    m_impl->m_onEpoch = nullptr;
    m_impl->m_runId.clear();
    m_impl->m_traceBus = nullptr;
    m_impl->reset();
}

ShardStats ParameterService::stats() const
{
    std::lock_guard lock(m_impl->m_mutex);
    ShardStats s = m_impl->m_stats;
    if (m_impl->m_schedule) s.stepsCompleted = m_impl->m_schedule->completed();
    return s;
}

} // namespace ts::remote
