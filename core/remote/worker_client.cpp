#include "remote/worker_client.h"

#include <mutex>

#include "worker.grpc.pb.h"

namespace ts::remote {

class WorkerClient::Impl {
public:
    std::string label, address, token;
    bool tls = false;
    std::unique_ptr<Worker::Stub> stub;
    std::mutex streamMutex;
    grpc::ClientContext* stream = nullptr;  // the open StreamEvents call, for cancelStream()
    bool streamCancelled = false;

    void prepare(grpc::ClientContext& ctx, std::chrono::milliseconds timeout) const
    {
        attachToken(ctx, token);
        ctx.set_deadline(std::chrono::system_clock::now() + timeout);
    }
    // A worker that runs, or is reserved for, another run refuses with FAILED_PRECONDITION and
    // says which run and whose.
    Error failOrBusy(const grpc::Status& st, const std::string& what) const
    {
        if (st.error_code() == grpc::StatusCode::FAILED_PRECONDITION)
            return makeError(ErrorCode::InvalidArgument, label + " is busy: " + st.error_message(),
                             "another coordinator uses this worker: start this run again once that one has ended, or give it other "
                             "workers");
        return fail(st, what);
    }
    Error fail(const grpc::Status& st, const std::string& what) const
    {
        // Something answered, but not our service: a web server (HTTP/1 or HTTP/2 without gRPC)
        // or another gRPC server on the port. Not "unreachable": the address is right, the port
        // is not.
        const std::string& m = st.error_message();
        if (st.error_code() == grpc::StatusCode::UNIMPLEMENTED || m.find("HTTP/2") != std::string::npos ||
            m.find("http2 header with status") != std::string::npos || m.find("http1") != std::string::npos)
            return makeError(ErrorCode::IoError,
                             label + ": something answers at " + address + ", but it is not a trainstudio-worker (" + m + ")",
                             "another program listens on that port: fix the port in the cluster file, or start trainstudio-worker on a "
                             "free one (trainstudio-worker --listen HOST:PORT)");
        if (auto t = connectTrouble(st, address, tls)) {
            // Here what should listen is a worker daemon.
            if (st.error_message().find("Connection refused") != std::string::npos)
                t->hint = "is trainstudio-worker running at " + address + "? Start it there, or fix the address in the cluster file";
            return troubleError(*t, label + ": " + what);
        }
        std::string hint;
        switch (st.error_code()) {
        case grpc::StatusCode::UNAVAILABLE:
        case grpc::StatusCode::DEADLINE_EXCEEDED:
            hint = "is trainstudio-worker running at " + address + ", and reachable from here?";
            break;
        case grpc::StatusCode::UNAUTHENTICATED:
            hint = "the coordinator and the worker must use the same shared token";
            break;
        default:
            break;
        }
        return makeError(ErrorCode::IoError, label + ": " + what + ": " + callFailure(st), hint);
    }
};

WorkerClient::WorkerClient(std::unique_ptr<Impl> impl) : m_impl(std::move(impl)) {}
WorkerClient::~WorkerClient() = default;
const std::string& WorkerClient::label() const { return m_impl->label; }

Result<std::unique_ptr<WorkerClient>> WorkerClient::connect(const std::string& label, const std::string& address,
                                                          const std::string& token, const TlsFiles& tls, bool ownConnection)
{
    TS_ASSIGN(auto creds, channelCredentials(tls));
    auto impl = std::make_unique<Impl>();
    impl->label = label;
    impl->address = address;
    impl->token = token;
    impl->tls = !tls.rootCa.empty();
    grpc::ChannelArguments args = channelArguments(4 << 20);
    if (ownConnection) args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    impl->stub = Worker::NewStub(grpc::CreateCustomChannel(address, creds, args));
    return std::unique_ptr<WorkerClient>(new WorkerClient(std::move(impl)));
}

Result<WorkerIdentity> WorkerClient::identify(std::chrono::milliseconds timeout)
{
    grpc::ClientContext ctx;
    m_impl->prepare(ctx, timeout);
    IdentifyReply reply;
    const grpc::Status st = m_impl->stub->Identify(&ctx, IdentifyRequest(), &reply);
    // Refused is not unreachable: it answered, and named the token as the problem.
    if (!st.ok()) return m_impl->fail(st, st.error_code() == grpc::StatusCode::UNAUTHENTICATED ? "refused this coordinator's token" : "unreachable");
    WorkerIdentity id;
    id.worker = reply.worker();
    id.version = reply.version();
    id.hostname = reply.hostname();
    id.state = reply.state();
    id.pid = reply.pid();
    id.runId = reply.run_id();
    id.coordinator = reply.coordinator();
    id.seconds = reply.seconds();
    id.reserved = reply.reserved();
    for (const auto& d : reply.devices()) id.devices.push_back({d.name(), d.kind(), d.memory_bytes(), d.load()});
    return id;
}

Status WorkerClient::startTask(const std::string& runId, const nlohmann::json& runConfig, const std::string& tfConfig,
                               const std::string& taskType, int taskIndex, const StartTaskOptions& options)
{
    grpc::ClientContext ctx;
    m_impl->prepare(ctx, std::chrono::seconds(10));
    StartTaskRequest req;
    req.set_run_id(runId);
    req.set_run_config_json(runConfig.dump());
    req.set_cluster_json(tfConfig);
    req.set_task_type(taskType);
    req.set_task_index(taskIndex);
    req.set_trace(options.trace);
    req.set_trace_layers(options.traceLayers);
    req.set_coordinator(options.coordinator);
    req.set_initial_weights_sent(options.initialWeightsSent);
    req.set_join_running(options.joinRunning);
    req.set_send_epoch_weights(options.sendEpochWeights);
    req.set_initial_weights_name(options.initialWeightsName);
    StartTaskReply reply;
    const grpc::Status st = m_impl->stub->StartTask(&ctx, req, &reply);
    if (st.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED)
        return makeError(ErrorCode::InvalidArgument,
                         m_impl->label + " refused the task: it is " + std::to_string(req.ByteSizeLong()) +
                             " bytes, more than the worker accepts (" + st.error_message() + ")",
                         "start that trainstudio-worker with a larger --max-message-bytes (at most 64 MiB)");
    if (!st.ok()) return m_impl->failOrBusy(st, "refused the task");
    return okStatus();
}

Status WorkerClient::sendWeights(const std::string& runId, const std::string& name, const std::string& bytes, bool initial)
{
    const std::string what = initial ? "the initial weights" : name;
    constexpr std::size_t kPart = 256 << 10;  // well inside any --max-message-bytes a run config fits in
    grpc::ClientContext ctx;
    // Time for the bytes at a slow 8 MiB/s, on top of the usual call.
    m_impl->prepare(ctx, std::chrono::seconds(10 + static_cast<int64_t>(bytes.size() >> 23)));
    SendWeightsReply reply;
    auto writer = m_impl->stub->SendWeights(&ctx, &reply);
    for (std::size_t at = 0; at < bytes.size() || at == 0; at += kPart) {
        WeightsPart part;
        part.set_run_id(runId);
        part.set_name(name);
        part.set_total_bytes(static_cast<int64_t>(bytes.size()));
        part.set_data(bytes.substr(at, kPart));
        if (!writer->Write(part)) break;  // the worker ended the call: Finish says why
        if (bytes.empty()) break;
    }
    writer->WritesDone();
    const grpc::Status st = writer->Finish();
    if (st.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED)
        return makeError(ErrorCode::InvalidArgument, m_impl->label + " refused " + what + ": " + st.error_message(),
                         "start that trainstudio-worker with a larger --max-weights-bytes");
    if (st.error_code() == grpc::StatusCode::INVALID_ARGUMENT)
        return makeError(ErrorCode::InvalidArgument, m_impl->label + " refused " + what + ": " + st.error_message(),
                         initial ? "check the file with trainstudio-cli, or save the weights again" : "");
    if (!st.ok()) return m_impl->failOrBusy(st, "could not send " + what);
    return okStatus();
}

Status WorkerClient::reserve(const std::string& runId, const std::string& coordinator, int seconds)
{
    grpc::ClientContext ctx;
    m_impl->prepare(ctx, std::chrono::seconds(10));
    ReserveRequest req;
    req.set_run_id(runId);
    req.set_coordinator(coordinator);
    req.set_seconds(seconds);
    ReserveReply reply;
    const grpc::Status st = m_impl->stub->Reserve(&ctx, req, &reply);
    if (!st.ok()) return m_impl->failOrBusy(st, "refused the reservation");
    return okStatus();
}

Result<bool> WorkerClient::captureTrace(const std::string& runId, int64_t steps, bool layers, std::string* why)
{
    grpc::ClientContext ctx;
    m_impl->prepare(ctx, std::chrono::seconds(2));  // the studio asks from its UI thread
    CaptureTraceRequest req;
    req.set_run_id(runId);
    req.set_steps(steps);
    req.set_layers(layers);
    CaptureTraceReply reply;
    const grpc::Status st = m_impl->stub->CaptureTrace(&ctx, req, &reply);
    if (!st.ok()) return m_impl->fail(st, "refused the capture");
    if (why) *why = reply.reason();
    return reply.started();
}

Status WorkerClient::requestEvaluation(const std::string& runId, int64_t epoch, int64_t seq, bool weightsSent)
{
    grpc::ClientContext ctx;
    m_impl->prepare(ctx, std::chrono::seconds(5));
    EvaluateRequest req;
    req.set_run_id(runId);
    req.set_epoch(epoch);
    req.set_seq(seq);
    req.set_weights_sent(weightsSent);
    EvaluateReply reply;
    const grpc::Status st = m_impl->stub->Evaluate(&ctx, req, &reply);
    if (!st.ok()) return m_impl->fail(st, "could not ask for an evaluation");
    return okStatus();
}

Status WorkerClient::streamEvents(const std::string& runId, const std::function<void(const WorkerEvent&)>& onEvent)
{
    grpc::ClientContext ctx;
    attachToken(ctx, m_impl->token);
    {
        std::lock_guard lock(m_impl->streamMutex);
        if (m_impl->streamCancelled) return makeError(ErrorCode::Cancelled, m_impl->label + ": event stream cancelled");
        m_impl->stream = &ctx;
    }
    StreamEventsRequest req;
    req.set_run_id(runId);
    auto reader = m_impl->stub->StreamEvents(&ctx, req);
    Event e;
    bool received = false;
    while (reader->Read(&e)) {
        received = true;
        WorkerEvent w;
        w.runId = e.run_id();
        w.worker = e.worker();
        w.device = e.device();
        w.kind = e.kind();
        w.step = e.step();
        w.wallTime = e.wall_time();
        w.fields = nlohmann::json::parse(e.json(), nullptr, false);
        if (w.fields.is_discarded()) w.fields = nlohmann::json::object();
        w.payload = std::move(*e.mutable_payload());
        onEvent(w);
    }
    const grpc::Status st = reader->Finish();
    {
        std::lock_guard lock(m_impl->streamMutex);
        m_impl->stream = nullptr;
    }
    // A stream that delivered events was connected: its break is the daemon or the network
    // going away mid-run, not a connection problem (a killed daemon's "Socket closed" read as
    // "it may serve TLS").
    if (!st.ok() && received && st.error_code() == grpc::StatusCode::UNAVAILABLE)
        return makeError(ErrorCode::IoError,
                         m_impl->label + ": the connection broke while the task ran (the process serving it exited or was killed, "
                                         "or the network dropped): " + st.error_message(),
                         "see that task's log (its trainstudio-worker's, or its own output) for why it exited; then start the run again");
    if (!st.ok()) return m_impl->fail(st, "event stream broke");
    return okStatus();
}

void WorkerClient::allowStreams()
{
    std::lock_guard lock(m_impl->streamMutex);
    m_impl->streamCancelled = false;
}

void WorkerClient::cancelStream()
{
    std::lock_guard lock(m_impl->streamMutex);
    m_impl->streamCancelled = true;
    if (m_impl->stream) m_impl->stream->TryCancel();
}

Status WorkerClient::cancel(const std::string& runId, const std::string& reason)
{
    grpc::ClientContext ctx;
    m_impl->prepare(ctx, std::chrono::seconds(3));
    CancelRequest req;
    req.set_run_id(runId);
    req.set_reason(reason);
    CancelReply reply;
    const grpc::Status st = m_impl->stub->Cancel(&ctx, req, &reply);
    if (!st.ok()) return m_impl->fail(st, "cancel");
    return okStatus();
}

Result<WorkerPulse> WorkerClient::heartbeat(std::chrono::milliseconds timeout)
{
    grpc::ClientContext ctx;
    m_impl->prepare(ctx, timeout);
    HeartbeatPong reply;
    const auto wallUs = [] {
        return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
    };
    const int64_t sent = wallUs();
    const grpc::Status st = m_impl->stub->Heartbeat(&ctx, HeartbeatPing(), &reply);
    const int64_t received = wallUs();
    if (!st.ok()) return m_impl->fail(st, "no heartbeat");
    WorkerPulse pulse{reply.state(), reply.step()};
    pulse.roundTripUs = received - sent;
    if (reply.wall_time() > 0) pulse.clockOffsetUs = static_cast<int64_t>(reply.wall_time() * 1e6) - (sent + received) / 2;
    return pulse;
}

} // namespace ts::remote
