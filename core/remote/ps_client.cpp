#include "remote/ps_client.h"

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "parameter_server.grpc.pb.h"
#include "remote/parameter_service.h"
#include "remote/schedule_proto.h"

namespace ts::remote {
namespace {

struct Lane {
    std::string label, address;
    std::unique_ptr<ParameterServer::Stub> stub;
    std::vector<ShardSlice> slices;
    std::vector<int64_t> starts;   // each slice's first value in the shard's flat layout
    int64_t elements = 0;          // the shard's size in values
    int64_t partBytes = 0;         // the largest message both ends take (known once the ps said)
    int64_t pulledVersion = 0;     // trainer thread only
    std::thread thread;            // sends this ps's pushes
    std::mutex mutex;
    std::condition_variable cv;
    std::vector<PushRequest> pending;  // one update's parts, sent in order
    int64_t pendingSeq = 0;
    bool busy = false, quit = false;
    std::optional<Error> error;
    int64_t ackSeq = 0, ackStaleness = 0;
};

} // namespace

class RemoteParameterStore::Impl {
public:
    PsClientOptions options;
    PartitionPlan plan;
    std::vector<StoreVariable> variables;
    std::vector<int64_t> arenaOffsets;  // each variable's first element in the one-arena layout
    int64_t arenaSize = 0;
    std::string resume;                 // ps:0's InitializeRequest.resume, read by begin()
    std::optional<ScheduleConfig> schedule;  // setSchedule(): worker 0 gives it to ps:0
    std::vector<std::unique_ptr<Lane>> lanes;
    std::atomic<bool> cancelled{false};
    std::mutex callsMutex;
    std::set<grpc::ClientContext*> calls;  // in flight, for cancel()
    int64_t pushSeq = 0;
    mutable std::mutex statsMutex;
    mutable StalenessStats stats;
    mutable int64_t aggregatedSeq = 0;

    // A call's context: token, deadline, and registered so cancel() can end it.
    class Call {
    public:
        Call(Impl& impl, std::chrono::milliseconds timeout) : m_impl(impl)
        {
            attachToken(ctx, impl.options.token);
            ctx.set_deadline(std::chrono::system_clock::now() + timeout);
            std::lock_guard lock(impl.callsMutex);
            impl.calls.insert(&ctx);
            if (impl.cancelled) ctx.TryCancel();
        }
        ~Call()
        {
            std::lock_guard lock(m_impl.callsMutex);
            m_impl.calls.erase(&ctx);
        }
        grpc::ClientContext ctx;

    private:
        Impl& m_impl;
    };

    Error fail(const Lane& lane, const grpc::Status& st, const std::string& what) const
    {
        if (cancelled) return makeError(ErrorCode::Cancelled, "the run was cancelled");
        if (auto t = connectTrouble(st, lane.address, !options.tls.rootCa.empty()))
            return troubleError(*t, lane.label + ": " + what);
        std::string hint;
        switch (st.error_code()) {
        case grpc::StatusCode::UNAVAILABLE:
        case grpc::StatusCode::DEADLINE_EXCEEDED:
            hint = "is the ps task's trainstudio-worker running at " + lane.address + ", and reachable from here?";
            break;
        case grpc::StatusCode::UNAUTHENTICATED:
            hint = "every task and the coordinator must use the same shared token";
            break;
        case grpc::StatusCode::RESOURCE_EXHAUSTED:
            hint = "a message did not fit a bound on its way (the daemons' --max-message-bytes): start the daemons with a larger one";
            break;
        default:
            break;
        }
        return makeError(ErrorCode::IoError, lane.label + ": " + what + ": " + callFailure(st), hint);
    }

    // For each slice overlapping [a, b) of the lane's flat shard, calls f(slice, inSlice, atRange,
    // n): n values, starting `inSlice` values into the slice and `atRange` values into [a, b).
    template <typename F>
    static void forRange(const Lane& lane, int64_t a, int64_t b, F&& f)
    {
        for (std::size_t i = 0; i < lane.slices.size(); ++i) {
            const int64_t s0 = lane.starts[i], s1 = s0 + lane.slices[i].count;
            const int64_t lo = std::max(a, s0), hi = std::min(b, s1);
            if (hi > lo) f(lane.slices[i], lo - s0, lo - a, hi - lo);
        }
    }

    // The bytes of values [a, a + n) of the lane's shard, read from a buffer laid out like the
    // model's: base(slice) is where that slice's first value lies in it.
    template <typename Base>
    static std::string gather(const Lane& lane, int64_t a, int64_t n, Base&& base)
    {
        std::string out(static_cast<std::size_t>(n) * 4, '\0');
        forRange(lane, a, a + n, [&](const ShardSlice& s, int64_t inSlice, int64_t at, int64_t k) {
            std::memcpy(out.data() + at * 4, base(s) + inSlice, static_cast<std::size_t>(k) * 4);
        });
        return out;
    }

    // The reverse: `bytes`, values from `a` on, written where base(slice) says.
    template <typename Base>
    static void scatter(const Lane& lane, int64_t a, const std::string& bytes, Base&& base)
    {
        forRange(lane, a, a + static_cast<int64_t>(bytes.size() / 4), [&](const ShardSlice& s, int64_t inSlice, int64_t at, int64_t k) {
            std::memcpy(base(s) + inSlice, bytes.data() + at * 4, static_cast<std::size_t>(k) * 4);
        });
    }

    // Where a slice starts in the variables' values, their gradients, or a one-arena tensor
    // (an optimizer state).
    float* valuesOf(const ShardSlice& s) const { return variables[static_cast<std::size_t>(s.variable)].values + s.offset; }
    const float* gradsOf(const ShardSlice& s) const { return variables[static_cast<std::size_t>(s.variable)].grads + s.offset; }
    int64_t arenaOf(const ShardSlice& s) const { return arenaOffsets[static_cast<std::size_t>(s.variable)] + s.offset; }

    // The values a part holds ([offset, offset + n)); an error unless it is the part asked for.
    Result<int64_t> partSize(const Lane& lane, const char* what, int64_t offset, int64_t replyOffset, int64_t replyElements,
                             const std::string& values) const
    {
        const int64_t n = static_cast<int64_t>(values.size() / 4);
        if (replyElements != lane.elements || replyOffset != offset || values.size() % 4 != 0 || n > lane.elements - offset ||
            (n == 0 && offset < lane.elements))
            return makeError(ErrorCode::Internal, lane.label + ": a " + what + " part came back malformed (values " + std::to_string(replyOffset) + "+" +
                                                      std::to_string(n) + " of " + std::to_string(replyElements) + ", asked from " +
                                                      std::to_string(offset) + " of this plan's " + std::to_string(lane.elements) + ")",
                             "every task of the run must use the same model and partitioner");
        return n;
    }

    // Values a message carries when each takes `perValue` floats.
    int64_t partValues(const Lane& lane, int64_t perValue) const
    {
        return std::max<int64_t>(1, (lane.partBytes - kPartEnvelopeBytes) / (4 * perValue));
    }

    void learnBound(Lane& lane, int64_t psBound) const
    {
        lane.partBytes = std::min<int64_t>(psBound > 0 ? psBound : options.maxMessageBytes, options.maxMessageBytes);
    }

    // Pulls the shard in parts; the version is the first part's (the oldest the values may be).
    Status pullLane(Lane& lane)
    {
        int64_t offset = 0;
        bool first = true;
        do {
            Call call(*this, options.callTimeout);
            PullRequest req;
            req.set_run_id(options.runId);
            req.set_offset(offset);
            req.set_max_bytes(lane.partBytes);
            PullReply reply;
            const grpc::Status st = lane.stub->Pull(&call.ctx, req, &reply);
            if (!st.ok()) return fail(lane, st, "pull failed");
            TS_ASSIGN(const int64_t n, partSize(lane, "pull", offset, reply.offset(), reply.elements(), reply.values()));
            scatter(lane, offset, reply.values(), [&](const ShardSlice& s) { return valuesOf(s); });
            if (first) lane.pulledVersion = reply.version();
            first = false;
            offset += n;
        } while (offset < lane.elements);
        return okStatus();
    }

    // The ps's layout against this plan's.
    Status checkLayout(const Lane& lane, const PullReply& reply) const
    {
        bool same = reply.slices_size() == static_cast<int>(lane.slices.size()) && reply.slice_sizes_size() == reply.slices_size();
        for (std::size_t i = 0; same && i < lane.slices.size(); ++i)
            same = reply.slices(static_cast<int>(i)) == lane.slices[i].toString() && reply.slice_sizes(static_cast<int>(i)) == lane.slices[i].count;
        if (same) return okStatus();
        std::string held;
        for (int i = 0; i < reply.slices_size() && i < 4; ++i) held += (i ? ", " : "") + reply.slices(i);
        if (reply.slices_size() > 4) held += ", ...";
        std::string planned;
        for (std::size_t i = 0; i < lane.slices.size() && i < 4; ++i) planned += (i ? ", " : "") + lane.slices[i].toString();
        if (lane.slices.size() > 4) planned += ", ...";
        return makeError(ErrorCode::Internal, lane.label + " holds " + std::to_string(reply.slices_size()) + " slice(s) (" + held + ") where this plan has " +
                                                  std::to_string(lane.slices.size()) + " (" + planned + ")",
                         "every task of the run must use the same model and partitioner");
    }

    void pushLoop(Lane& lane)
    {
        std::unique_lock lock(lane.mutex);
        for (;;) {
            lane.cv.wait(lock, [&] { return lane.quit || !lane.pending.empty(); });
            if (lane.quit) return;
            std::vector<PushRequest> parts = std::move(lane.pending);
            const int64_t seq = lane.pendingSeq;
            lane.pending.clear();
            lane.busy = true;
            lock.unlock();
            PushReply reply;
            grpc::Status st;
            for (const auto& part : parts) {
                Call call(*this, options.callTimeout);
                st = lane.stub->Push(&call.ctx, part, &reply);
                if (!st.ok()) break;
            }
            lock.lock();
            lane.busy = false;
            if (!st.ok()) {
                if (!lane.error) lane.error = fail(lane, st, "push failed");
            } else {
                lane.ackSeq = seq;
                lane.ackStaleness = reply.staleness();
            }
            lane.cv.notify_all();
        }
    }

    // Folds pushes every ps has acknowledged into the statistics (a push's staleness is the
    // largest over the ps tasks). Callers hold statsMutex.
    void aggregate() const
    {
        if (pushSeq <= aggregatedSeq) return;
        int64_t worst = 0;
        for (const auto& lane : lanes) {
            std::lock_guard lock(lane->mutex);
            if (lane->ackSeq < pushSeq) return;
            worst = std::max(worst, lane->ackStaleness);
        }
        aggregatedSeq = pushSeq;
        ++stats.pushes;
        stats.last = worst;
        stats.max = std::max(stats.max, worst);
        stats.sum += static_cast<double>(worst);
    }

    Status waitIdle(Lane& lane)
    {
        std::unique_lock lock(lane.mutex);
        lane.cv.wait(lock, [&] { return (!lane.busy && lane.pending.empty()) || cancelled; });
        if (cancelled) return makeError(ErrorCode::Cancelled, "the run was cancelled");
        if (lane.error) return *lane.error;
        return okStatus();
    }

    // An asynchronous push that failed, without waiting for the ones in flight: the next call
    // reports it (parameter_store.h), pull() and claimStep() too, not only the next push().
    Status pushFailure()
    {
        for (auto& lane : lanes) {
            std::lock_guard lock(lane->mutex);
            if (lane->error) return *lane->error;
        }
        return okStatus();
    }
};

RemoteParameterStore::RemoteParameterStore(std::unique_ptr<Impl> impl) : m_impl(std::move(impl)) {}

RemoteParameterStore::~RemoteParameterStore()
{
    for (auto& lane : m_impl->lanes) {
        {
            std::lock_guard lock(lane->mutex);
            lane->quit = true;
        }
        lane->cv.notify_all();
    }
    cancel();
    for (auto& lane : m_impl->lanes)
        if (lane->thread.joinable()) lane->thread.join();
}

Result<std::shared_ptr<RemoteParameterStore>> RemoteParameterStore::connect(const PsClientOptions& options)
{
    if (options.spec.count("ps") == 0)
        return makeError(ErrorCode::InvalidArgument, options.spec.source() + ": the cluster has no ps task", "add \"ps\": [\"host:port\"]");
    TS_ASSIGN(auto creds, channelCredentials(options.tls));
    auto impl = std::make_unique<Impl>();
    impl->options = options;
    for (int i = 0; i < options.spec.count("ps"); ++i) {
        auto lane = std::make_unique<Lane>();
        lane->address = options.spec.addresses("ps")[static_cast<std::size_t>(i)];
        lane->label = "ps:" + std::to_string(i) + " at " + lane->address;
        grpc::ChannelArguments args = channelArguments(options.maxMessageBytes);
        // A channel per ps and per store: the pushes of one worker never queue behind another's.
        args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
        lane->stub = ParameterServer::NewStub(grpc::CreateCustomChannel(lane->address, creds, args));
        impl->lanes.push_back(std::move(lane));
    }
    std::shared_ptr<RemoteParameterStore> store(new RemoteParameterStore(std::move(impl)));
    for (auto& lane : store->m_impl->lanes) {
        Lane* l = lane.get();
        Impl* i = store->m_impl.get();
        l->thread = std::thread([i, l] { i->pushLoop(*l); });
    }
    return store;
}

const PartitionPlan& RemoteParameterStore::plan() const { return m_impl->plan; }

Status RemoteParameterStore::begin(const std::vector<StoreVariable>& variables, bool initialise, const StoreResume* resume)
{
    Impl& d = *m_impl;
    std::vector<VariableInfo> infos;
    for (const auto& v : variables) {
        if (!v.values) return makeError(ErrorCode::InvalidArgument, "variable " + v.info.name + " has no buffer");
        infos.push_back(v.info);
    }
    TS_ASSIGN(d.plan, partitionVariables(infos, static_cast<int>(d.lanes.size()), d.options.partition));
    d.variables = variables;
    d.arenaOffsets.clear();
    d.arenaSize = 0;
    for (const auto& v : variables) {
        d.arenaOffsets.push_back(d.arenaSize);
        d.arenaSize += v.info.numel();
    }
    for (std::size_t p = 0; p < d.lanes.size(); ++p) {
        Lane& lane = *d.lanes[p];
        lane.slices = d.plan.perPs[p];
        lane.starts.clear();
        lane.elements = 0;
        for (const auto& sl : lane.slices) {
            lane.starts.push_back(lane.elements);
            lane.elements += sl.count;
        }
        d.learnBound(lane, 0);
    }
    if (resume)
        for (const auto& [name, flat] : resume->state.optimizer)
            if (static_cast<int64_t>(flat.size()) != d.arenaSize)
                return makeError(ErrorCode::InvalidArgument, "optimizer state '" + name + "' has " + std::to_string(flat.size()) +
                                                                 " values, this model's variables have " + std::to_string(d.arenaSize),
                                 "the backup belongs to a different model; delete it or start a new run");
    const auto deadline = std::chrono::steady_clock::now() + d.options.startTimeout;
    // Until the deadline, "not hosting this run yet" and "not initialised yet" mean "starting".
    auto retry = [&](Lane& lane, const std::function<grpc::Status()>& call, const std::string& what) -> Status {
        for (;;) {
            const grpc::Status st = call();
            if (st.ok()) return okStatus();
            // A TLS mismatch is not a ps task still starting: say so now.
            const auto trouble = connectTrouble(st, lane.address, !d.options.tls.rootCa.empty());
            const bool starting = (st.error_code() == grpc::StatusCode::UNAVAILABLE && !(trouble && trouble->patienceSeconds == 0)) ||
                                  st.error_code() == grpc::StatusCode::FAILED_PRECONDITION;
            if (!starting || d.cancelled || std::chrono::steady_clock::now() > deadline) {
                Error e = d.fail(lane, st, what);
                if (starting && !d.cancelled)
                    e.message += " (waited " + std::to_string(d.options.startTimeout.count() / 1000) + " s for it to start)";
                return e;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
    };
    if (initialise) {
        for (auto& lane : d.lanes) {
            // The layout first (it waits for a ps still starting), then the values in parts.
            InitializeRequest layout;
            layout.set_run_id(d.options.runId);
            layout.set_layout(true);
            for (const auto& s : lane->slices) {
                layout.add_slices(s.toString());
                layout.add_slice_sizes(s.count);
            }
            if (resume) {
                layout.set_version(resume->state.updates);
                layout.set_resume(resume->position);
            }
            if (d.schedule && lane == d.lanes.front()) {
                Schedule* sc = layout.mutable_schedule();
                sc->set_workers(d.schedule->workers);
                sc->set_epochs(d.schedule->epochs);
                sc->set_max_steps(d.schedule->maxSteps);
                if (resume) {
                    sc->set_completed(resume->state.schedule.completed);
                    tallyToProto(resume->state.schedule.epochSoFar, sc->mutable_epoch_so_far());
                }
            }
            InitializeReply reply;
            TS_TRY(retry(*lane, [&] {
                Impl::Call call(d, d.options.callTimeout);
                reply.Clear();
                return lane->stub->Initialize(&call.ctx, layout, &reply);
            }, "initialisation failed"));
            d.learnBound(*lane, reply.max_part_bytes());
            const std::size_t states = resume ? resume->state.optimizer.size() : 0;
            const int64_t per = d.partValues(*lane, 1 + static_cast<int64_t>(states));
            int64_t offset = 0;
            do {
                const int64_t n = std::min(per, lane->elements - offset);
                InitializeRequest req;
                req.set_run_id(d.options.runId);
                req.set_offset(offset);
                req.set_last(offset + n == lane->elements);
                req.set_values(Impl::gather(*lane, offset, n, [&](const ShardSlice& s) { return d.valuesOf(s); }));
                if (resume) {
                    for (const auto& [name, flat] : resume->state.optimizer) {
                        OptimizerState* o = req.add_state();
                        o->set_name(name);
                        o->set_data(Impl::gather(*lane, offset, n, [&](const ShardSlice& s) { return flat.data() + d.arenaOf(s); }));
                    }
                }
                Impl::Call call(d, d.options.callTimeout);
                InitializeReply ack;
                const grpc::Status st = lane->stub->Initialize(&call.ctx, req, &ack);
                if (!st.ok()) return d.fail(*lane, st, "initialisation failed at value " + std::to_string(offset) + " of " + std::to_string(lane->elements));
                offset += n;
            } while (offset < lane->elements);
        }
    }
    // Everyone (the initialiser too) checks the plan against what the ps tasks hold, once, and
    // starts from their values.
    for (auto& lane : d.lanes) {
        PullReply reply;
        TS_TRY(retry(*lane, [&] {
            Impl::Call call(d, d.options.callTimeout);
            PullRequest req;
            req.set_run_id(d.options.runId);
            req.set_describe(true);
            reply.Clear();
            return lane->stub->Pull(&call.ctx, req, &reply);
        }, "pull failed"));
        TS_TRY(d.checkLayout(*lane, reply));
        d.learnBound(*lane, reply.max_part_bytes());
        if (lane == d.lanes.front()) d.resume = reply.resume();
    }
    return pull();
}

std::string RemoteParameterStore::resumePosition() const { return m_impl->resume; }

Result<StoreSnapshot> RemoteParameterStore::snapshot()
{
    Impl& d = *m_impl;
    TS_TRY(flush());
    StoreSnapshot out;
    std::map<std::string, std::size_t> slot;  // name -> index in out.optimizer
    for (auto& lane : d.lanes) {
        int64_t offset = 0, id = 0;
        std::vector<std::string> names;  // the first part's, which every part repeats
        do {
            SnapshotReply reply;
            {
                Impl::Call call(d, d.options.callTimeout);
                SnapshotRequest req;
                req.set_run_id(d.options.runId);
                req.set_offset(offset);
                req.set_max_bytes(lane->partBytes);
                req.set_snapshot(id);
                const grpc::Status st = lane->stub->Snapshot(&call.ctx, req, &reply);
                if (!st.ok()) return d.fail(*lane, st, "snapshot failed");
            }
            TS_ASSIGN(const int64_t n, d.partSize(*lane, "snapshot", offset, reply.offset(), reply.elements(), reply.values()));
            if (offset == 0) {
                id = reply.snapshot();
                if (lane == d.lanes.front()) {
                    out.updates = reply.version();
                    out.schedule.completed = reply.completed_steps();
                    out.schedule.epochSoFar = tallyFromProto(reply.epoch_so_far());
                }
                for (const auto& state : reply.state()) names.push_back(state.name());
            }
            Impl::scatter(*lane, offset, reply.values(), [&](const ShardSlice& s) { return d.valuesOf(s); });
            if (reply.state_size() != static_cast<int>(names.size()))
                return makeError(ErrorCode::Internal, lane->label + ": a snapshot part came back with " + std::to_string(reply.state_size()) +
                                                          " optimizer state tensor(s), the first had " + std::to_string(names.size()));
            for (int i = 0; i < reply.state_size(); ++i) {
                const OptimizerState& state = reply.state(i);
                if (state.name() != names[static_cast<std::size_t>(i)] || static_cast<int64_t>(state.data().size()) != n * 4)
                    return makeError(ErrorCode::Internal, lane->label + ": optimizer state '" + state.name() + "' came back with the wrong name or size");
                auto [it, added] = slot.emplace(state.name(), out.optimizer.size());
                if (added) out.optimizer.emplace_back(state.name(), std::vector<float>(static_cast<std::size_t>(d.arenaSize)));
                std::vector<float>& flat = out.optimizer[it->second].second;
                Impl::scatter(*lane, offset, state.data(), [&](const ShardSlice& s) { return flat.data() + d.arenaOf(s); });
            }
            offset += n;
        } while (offset < lane->elements);
    }
    return out;
}

Status RemoteParameterStore::pull()
{
    Impl& d = *m_impl;
    if (d.cancelled) return makeError(ErrorCode::Cancelled, "the run was cancelled");
    TS_TRY(d.pushFailure());
    const std::size_t n = d.lanes.size();
    std::vector<Status> results(n);
    std::vector<std::thread> threads;
    for (std::size_t p = 1; p < n; ++p) threads.emplace_back([&, p] { results[p] = d.pullLane(*d.lanes[p]); });
    results[0] = d.pullLane(*d.lanes[0]);
    for (auto& t : threads) t.join();
    for (auto& r : results)
        if (!r.ok()) return r;
    return okStatus();
}

Status RemoteParameterStore::push(float learningRate)
{
    Impl& d = *m_impl;
    if (d.cancelled) return makeError(ErrorCode::Cancelled, "the run was cancelled");
    // At most one push per ps in flight: wait for the previous one, and report it if it failed.
    for (auto& lane : d.lanes) TS_TRY(d.waitIdle(*lane));
    {
        std::lock_guard lock(d.statsMutex);
        d.aggregate();
        ++d.pushSeq;
    }
    for (auto& lane : d.lanes) {
        // The gradients are copied now: the trainer's next step overwrites them.
        std::vector<PushRequest> parts;
        const int64_t per = d.partValues(*lane, 1);
        int64_t offset = 0;
        do {
            const int64_t n = std::min(per, lane->elements - offset);
            PushRequest& req = parts.emplace_back();
            req.set_run_id(d.options.runId);
            req.set_worker(d.options.worker);
            req.set_pulled_version(lane->pulledVersion);
            req.set_learning_rate(learningRate);
            req.set_offset(offset);
            req.set_last(offset + n == lane->elements);
            req.set_grads(Impl::gather(*lane, offset, n, [&](const ShardSlice& s) { return d.gradsOf(s); }));
            offset += n;
        } while (offset < lane->elements);
        {
            std::lock_guard lock(lane->mutex);
            lane->pending = std::move(parts);
            lane->pendingSeq = d.pushSeq;
        }
        lane->cv.notify_all();
    }
    return okStatus();
}

Status RemoteParameterStore::flush()
{
    Impl& d = *m_impl;
    for (auto& lane : d.lanes) TS_TRY(d.waitIdle(*lane));
    std::lock_guard lock(d.statsMutex);
    d.aggregate();
    return okStatus();
}

StalenessStats RemoteParameterStore::staleness() const
{
    std::lock_guard lock(m_impl->statsMutex);
    m_impl->aggregate();
    return m_impl->stats;
}

void RemoteParameterStore::cancel()
{
    Impl& d = *m_impl;
    d.cancelled = true;
    {
        std::lock_guard lock(d.callsMutex);
        for (auto* c : d.calls) c->TryCancel();
    }
    for (auto& lane : d.lanes) {
        std::lock_guard lock(lane->mutex);
        lane->cv.notify_all();
    }
}

void RemoteParameterStore::setSchedule(const ScheduleConfig& schedule) { m_impl->schedule = schedule; }

Result<StepGrant> RemoteParameterStore::claimStep(int64_t batchesPerEpoch, const std::vector<ts::StepOutcome>& done)
{
    Impl& d = *m_impl;
    if (d.cancelled) return makeError(ErrorCode::Cancelled, "the run was cancelled");
    TS_TRY(d.pushFailure());
    Lane& lane = *d.lanes.front();
    ClaimRequest req;
    req.set_run_id(d.options.runId);
    req.set_worker(d.options.worker);
    req.set_batches_per_epoch(batchesPerEpoch);
    for (const ts::StepOutcome& o : done) {
        ClaimOutcome* out = req.add_done();
        out->set_step(o.step);
        out->set_loss_sum(o.lossSum);
        out->set_correct(o.correct);
        out->set_count(o.count);
    }
    ClaimReply reply;
    Impl::Call call(d, d.options.callTimeout);
    const grpc::Status st = lane.stub->ClaimStep(&call.ctx, req, &reply);
    if (!st.ok()) return d.fail(lane, st, "claiming a step failed");
    StepGrant g;
    g.kind = reply.kind() == ClaimReply::STEP ? StepGrant::Kind::Step : reply.kind() == ClaimReply::WAIT ? StepGrant::Kind::Wait : StepGrant::Kind::Done;
    g.step = reply.step();
    g.count = reply.count();
    g.epoch = reply.epoch();
    g.stepInEpoch = reply.step_in_epoch();
    g.stepsPerEpoch = reply.steps_per_epoch();
    g.totalSteps = reply.total_steps();
    if (g.kind == StepGrant::Kind::Step && (g.step < 1 || g.count < 1 || g.count > 1024 || g.epoch < 1))
        return makeError(ErrorCode::Internal, lane.label + ": a claimed step came back malformed (step " + std::to_string(g.step) + ", epoch " +
                                                 std::to_string(g.epoch) + ")",
                         "every task of the run must run the same TrainStudio version");
    return g;
}

Status RemoteParameterStore::release(const std::string& worker, const std::string& reason)
{
    return membership(worker, reason, false);
}

Status RemoteParameterStore::readmit(const std::string& worker, const std::string& reason)
{
    return membership(worker, reason, true);
}

Status RemoteParameterStore::membership(const std::string& worker, const std::string& reason, bool readmit)
{
    Impl& d = *m_impl;
    Lane& lane = *d.lanes.front();
    ReleaseRequest req;
    req.set_run_id(d.options.runId);
    req.set_worker(worker);
    req.set_reason(reason);
    ReleaseReply reply;
    Impl::Call call(d, d.options.callTimeout);
    const grpc::Status st = readmit ? lane.stub->Readmit(&call.ctx, req, &reply) : lane.stub->Release(&call.ctx, req, &reply);
    if (!st.ok()) return d.fail(lane, st, (readmit ? "readmitting " : "releasing ") + worker + " failed");
    return okStatus();
}

} // namespace ts::remote
