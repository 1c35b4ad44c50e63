#include "remote/parameter_service.h"

#include <cmath>
#include <cstring>
#include <mutex>

#include "backend/registry.h"
#include "optim/optimizer.h"
#include "parameter_server.grpc.pb.h"
#include "remote/auth.h"
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
    explicit Impl(std::string token) : m_token(std::move(token)) {}

    grpc::Status Initialize(grpc::ServerContext* ctx, const InitializeRequest* req, InitializeReply*) override
    {
        const char* call = "ParameterServer.Initialize";
        if (auto st = checkToken(*ctx, m_token, call); !st.ok()) return st;
        std::lock_guard lock(m_mutex);
        if (auto st = checkRun(*ctx, call, req->run_id(), false); !st.ok()) return st;
        if (m_initialised) return refuse(*ctx, grpc::StatusCode::ALREADY_EXISTS, call, m_label + " of run " + m_runId + " is already initialised");
        if (req->slices_size() != req->values_size() || req->slices_size() == 0)
            return refuse(*ctx, grpc::StatusCode::INVALID_ARGUMENT, call, "need one value entry per slice (and at least one slice)");
        int64_t total = 0;
        for (const auto& v : req->values()) {
            if (v.size() % 4 != 0) return refuse(*ctx, grpc::StatusCode::INVALID_ARGUMENT, call, "values must be whole float32s");
            total += static_cast<int64_t>(v.size() / 4);
        }
        auto values = Tensor::create(Shape({total}), DType::F32, m_backend->allocator());
        auto grads = Tensor::create(Shape({total}), DType::F32, m_backend->allocator());
        if (!values.ok() || !grads.ok()) return refuse(*ctx, grpc::StatusCode::RESOURCE_EXHAUSTED, call, "cannot allocate the shard");
        m_values = std::move(values).value();
        m_grads = std::move(grads).value();
        m_slices.assign(req->slices().begin(), req->slices().end());
        m_counts.clear();
        int64_t at = 0;
        for (const auto& v : req->values()) {
            const int64_t n = static_cast<int64_t>(v.size() / 4);
            Tensor view = m_values.rows(at, at + n);
            if (n > 0 && !m_backend->copyFromHost(v.data(), view).ok())
                return refuse(*ctx, grpc::StatusCode::INTERNAL, call, "cannot store the initial values");
            m_counts.push_back(n);
            at += n;
        }
        if (auto st = m_optimizer->prepare(*m_backend, total); !st.ok())
            return refuse(*ctx, grpc::StatusCode::INTERNAL, call, st.error().message);
        // Resuming from a backup: the optimizer's state, slice by slice as the values.
        std::vector<std::pair<std::string, Tensor>> state;
        for (const auto& s : req->state()) {
            if (s.slices_size() != req->values_size())
                return refuse(*ctx, grpc::StatusCode::INVALID_ARGUMENT, call, "optimizer state '" + s.name() + "' needs one entry per slice");
            std::vector<float> flat;
            flat.reserve(static_cast<std::size_t>(total));
            for (int i = 0; i < s.slices_size(); ++i) {
                const std::string& b = s.slices(i);
                if (static_cast<int64_t>(b.size()) != m_counts[static_cast<std::size_t>(i)] * 4)
                    return refuse(*ctx, grpc::StatusCode::INVALID_ARGUMENT, call,
                                  "optimizer state '" + s.name() + "' of slice " + m_slices[static_cast<std::size_t>(i)] + " has the wrong size");
                const std::size_t at = flat.size();
                flat.resize(at + b.size() / 4);
                std::memcpy(flat.data() + at, b.data(), b.size());
            }
            state.emplace_back(s.name(), Tensor::fromVector(Shape({total}), flat));
        }
        if (!state.empty())
            if (auto st = m_optimizer->importState(*m_backend, state, m_label + "'s initial state"); !st.ok())
                return refuse(*ctx, grpc::StatusCode::INVALID_ARGUMENT, call, st.error().message);
        if (req->version() < 0) return refuse(*ctx, grpc::StatusCode::INVALID_ARGUMENT, call, "version must be >= 0");
        m_initialised = true;
        m_stats = {};
        m_stats.initialised = true;
        m_stats.elements = total;
        m_stats.version = req->version();
        m_resume = req->resume();
        logLine(m_label + " of run " + m_runId + ": initialised " + std::to_string(m_slices.size()) + " slice(s), " +
                std::to_string(total) + " values, by " + ctx->peer());
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
        int64_t at = 0;
        for (std::size_t i = 0; i < m_counts.size(); ++i) {
            const int64_t n = m_counts[i];
            std::string* out = reply->add_values();
            out->resize(static_cast<std::size_t>(n) * 4);
            Tensor view = m_values.rows(at, at + n);
            if (n > 0 && !m_backend->copyToHost(view, out->data()).ok())
                return grpc::Status(grpc::StatusCode::INTERNAL, "cannot read the shard");
            at += n;
            if (req->describe()) reply->add_slices(m_slices[i]);
        }
        if (req->describe()) reply->set_resume(m_resume);
        ++m_stats.pulls;
        m_stats.bytesOut += at * 4;
        return grpc::Status::OK;
    }

    grpc::Status Push(grpc::ServerContext* ctx, const PushRequest* req, PushReply* reply) override
    {
        const char* call = "ParameterServer.Push";
        if (auto st = checkToken(*ctx, m_token, call); !st.ok()) return st;
        std::lock_guard lock(m_mutex);
        if (auto st = checkRun(*ctx, call, req->run_id(), true); !st.ok()) return st;
        if (req->grads_size() != static_cast<int>(m_counts.size()))
            return refuse(*ctx, grpc::StatusCode::INVALID_ARGUMENT, call,
                          "got " + std::to_string(req->grads_size()) + " gradient slice(s), " + m_label + " holds " + std::to_string(m_counts.size()));
        for (int i = 0; i < req->grads_size(); ++i)
            if (static_cast<int64_t>(req->grads(i).size()) != m_counts[static_cast<std::size_t>(i)] * 4)
                return refuse(*ctx, grpc::StatusCode::INVALID_ARGUMENT, call, "gradient slice " + m_slices[static_cast<std::size_t>(i)] + " has the wrong size");
        const float lr = req->learning_rate();
        if (!std::isfinite(lr) || lr < 0) return refuse(*ctx, grpc::StatusCode::INVALID_ARGUMENT, call, "learning_rate must be finite and >= 0");
        if (req->pulled_version() < 0 || req->pulled_version() > m_stats.version)
            return refuse(*ctx, grpc::StatusCode::INVALID_ARGUMENT, call, "pulled_version " + std::to_string(req->pulled_version()) + " was never served");
        ShardWork work(m_stats.busySeconds, m_traceBus, m_runId, m_device, m_stats.version + 1, "apply update", "optimizer");
        int64_t at = 0;
        for (int i = 0; i < req->grads_size(); ++i) {
            const int64_t n = m_counts[static_cast<std::size_t>(i)];
            Tensor view = m_grads.rows(at, at + n);
            if (n > 0 && !m_backend->copyFromHost(req->grads(i).data(), view).ok())
                return grpc::Status(grpc::StatusCode::INTERNAL, "cannot stage the gradients");
            at += n;
        }
        const int64_t staleness = m_stats.version - req->pulled_version();
        // The ps's own update count drives Adam's bias correction, as TF's optimizer.iterations on a ps.
        if (auto st = m_optimizer->apply(*m_backend, m_values, m_grads, 0, at, lr, m_stats.version + 1); !st.ok())
            return grpc::Status(grpc::StatusCode::INTERNAL, m_label + ": " + st.error().message);
        ++m_stats.version;
        m_stats.bytesIn += at * 4;
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
        ShardWork work(m_stats.busySeconds, m_traceBus, m_runId, m_device, m_stats.version, "serve snapshot", "checkpoint");
        auto state = m_optimizer->exportState(*m_backend);
        if (!state.ok()) return grpc::Status(grpc::StatusCode::INTERNAL, m_label + ": " + state.error().message);
        auto host = Tensor::create(m_values.shape(), DType::F32);
        if (!host.ok()) return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "cannot copy the shard");
        const Tensor& values = *host;
        if (!m_backend->copyToHost(m_values, values.data<float>()).ok()) return grpc::Status(grpc::StatusCode::INTERNAL, "cannot read the shard");
        auto split = [&](const Tensor& flat, google::protobuf::RepeatedPtrField<std::string>* out) {
            const char* bytes = reinterpret_cast<const char*>(flat.data<float>());
            int64_t at = 0;
            for (int64_t n : m_counts) {
                out->Add(std::string(bytes + at * 4, static_cast<std::size_t>(n) * 4));
                at += n;
            }
        };
        reply->set_version(m_stats.version);
        split(values, reply->mutable_values());
        for (const auto& [name, t] : *state) {
            OptimizerState* o = reply->add_state();
            o->set_name(name);
            split(t, o->mutable_slices());
        }
        m_stats.bytesOut += values.numel() * 4 * static_cast<int64_t>(1 + state->size());
        return grpc::Status::OK;
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

    std::string m_token;
    mutable std::mutex m_mutex;
    std::string m_runId, m_label, m_device;
    telemetry::EventBus* m_traceBus = nullptr;
    std::unique_ptr<Backend> m_backend;
    std::unique_ptr<Optimizer> m_optimizer;
    Tensor m_values, m_grads;
    std::vector<std::string> m_slices;
    std::vector<int64_t> m_counts;
    std::string m_resume;  // worker 0's position in the data when resuming from a backup
    bool m_initialised = false;
    ShardStats m_stats;
};

ParameterService::ParameterService(std::string token) : m_impl(std::make_unique<Impl>(std::move(token))) {}
ParameterService::~ParameterService() = default;
grpc::Service* ParameterService::service() { return m_impl.get(); }

Status ParameterService::host(const std::string& runId, const std::string& label, const nlohmann::json& optimizer, const std::string& backend,
                              telemetry::EventBus* traceBus)
{
    TS_ASSIGN(auto opt, Optimizer::create(optimizer));
    BackendOptions bo;
    bo.threads = 1;  // updates are serialised; one core keeps the daemon light next to workers
    auto& registry = BackendRegistry::instance();
    auto be = backend.empty() ? registry.create(Device{DeviceKind::Cpu, 0}, bo) : registry.create(backend, 0, bo);
    if (!be.ok()) return be.takeError();
    std::lock_guard lock(m_impl->m_mutex);
    m_impl->m_runId = runId;
    m_impl->m_label = label;
    m_impl->m_optimizer = std::move(opt);
    m_impl->m_backend = std::move(be).value();
    m_impl->m_device = m_impl->m_backend->device().toString();
    m_impl->m_traceBus = traceBus;
    m_impl->m_values = Tensor();
    m_impl->m_grads = Tensor();
    m_impl->m_slices.clear();
    m_impl->m_counts.clear();
    m_impl->m_initialised = false;
    m_impl->m_stats = {};
    return okStatus();
}

void ParameterService::unhost()
{
    std::lock_guard lock(m_impl->m_mutex);
    m_impl->m_runId.clear();
    m_impl->m_traceBus = nullptr;
    m_impl->m_initialised = false;
    m_impl->m_values = Tensor();
    m_impl->m_grads = Tensor();
}

ShardStats ParameterService::stats() const
{
    std::lock_guard lock(m_impl->m_mutex);
    return m_impl->m_stats;
}

} // namespace ts::remote
