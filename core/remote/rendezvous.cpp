#include "remote/rendezvous.h"
#include "remote/listen_check.h"

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <set>
#include <mutex>
#include <random>

#include <unistd.h>

#include "rendezvous.grpc.pb.h"

namespace ts::remote {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::size_t kMaxKeyBytes = 1024;
constexpr int64_t kMaxWaitMs = 10 * 60 * 1000;  // a blocked call never outlives ten minutes
// Metadata naming a server's incarnation: sent with every reply, and by a pinned client with
// every call (RendezvousClient::pin).
constexpr const char* kIncarnationKey = "ts-rendezvous-incarnation";


class RendezvousService final : public Rendezvous::Service {
public:
    RendezvousService(std::string token, int maxValueBytes, std::chrono::milliseconds idleExpiry, GroupFilter serves = {})
        : m_token(std::move(token)), m_maxValue(maxValueBytes), m_idleExpiry(std::max(idleExpiry, std::chrono::milliseconds(1))),
          m_incarnation(randomId()), m_serves(std::move(serves))
    {
    }

    grpc::Status Set(grpc::ServerContext* ctx, const SetRequest* req, SetReply*) override
    {
        if (auto st = admit(*ctx, "Rendezvous.Set"); !st.ok()) return st;
        if (auto st = checkKey(*ctx, req->key()); !st.ok()) return st;
        if (req->value().size() > static_cast<std::size_t>(m_maxValue)) {
            logLine("refused Rendezvous.Set from " + ctx->peer() + ": value of " + std::to_string(req->value().size()) + " bytes");
            return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "value over " + std::to_string(m_maxValue) + " bytes");
        }
        {
            std::lock_guard lock(m_mutex);
            const auto now = Clock::now();
            m_values[req->key()] = {req->value(), now};
            sweep(now);
        }
        m_cv.notify_all();
        return grpc::Status::OK;
    }

    grpc::Status Get(grpc::ServerContext* ctx, const GetRequest* req, GetReply* reply) override
    {
        if (auto st = admit(*ctx, "Rendezvous.Get"); !st.ok()) return st;
        if (auto st = checkKey(*ctx, req->key()); !st.ok()) return st;
        std::unique_lock lock(m_mutex);
        if (!waitFor(lock, ctx, {req->key()}, req->timeout_ms()))
            return m_shutdown ? closing() : grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "key " + req->key() + " was not set in time");
        Value& v = m_values[req->key()];
        v.touched = Clock::now();
        reply->set_value(v.bytes);
        return grpc::Status::OK;
    }

    grpc::Status Wait(grpc::ServerContext* ctx, const WaitRequest* req, WaitReply*) override
    {
        if (auto st = admit(*ctx, "Rendezvous.Wait"); !st.ok()) return st;
        std::vector<std::string> keys(req->keys().begin(), req->keys().end());
        for (const auto& k : keys)
            if (auto st = checkKey(*ctx, k); !st.ok()) return st;
        std::unique_lock lock(m_mutex);
        if (!waitFor(lock, ctx, keys, req->timeout_ms()))
            return m_shutdown ? closing() : grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "keys were not all set in time");
        return grpc::Status::OK;
    }

    grpc::Status Heartbeat(grpc::ServerContext* ctx, const HeartbeatRequest* req, HeartbeatReply* reply) override
    {
        if (auto st = admit(*ctx, "Rendezvous.Heartbeat"); !st.ok()) return st;
        if (auto st = checkKey(*ctx, req->group()); !st.ok()) return st;
        if (req->size() < 1 || req->size() > 65536 || req->rank() < 0 || req->rank() >= req->size()) {
            logLine("refused Rendezvous.Heartbeat from " + ctx->peer() + ": rank " + std::to_string(req->rank()) + " of " + std::to_string(req->size()));
            return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "rank out of range");
        }
        const auto now = Clock::now();
        std::lock_guard lock(m_mutex);
        Group& g = m_groups[req->group()];
        if (g.lastSeen.empty()) g.created = now;
        g.touched = now;
        sweep(now);  // never this group: touched now
        const auto silence = std::chrono::milliseconds(std::max<int64_t>(1, req->silence_ms()));
        if (!req->instance().empty()) {
            Claim& c = g.claims[req->rank()];
            if (!c.instance.empty() && c.instance != req->instance() && now - c.lastSeen <= silence) {
                // Once per contender: it beats several times a second until it gives up or the
                // claim lapses. Either a second copy of the task, or a restarted one whose old
                // process died moments ago (its claim lapses after `silence`, then it is taken over).
                if (c.contenders.insert(req->instance()).second)
                    logLine("rank " + std::to_string(req->rank()) + " of group " + req->group() + " is held by " + c.peer + "; " + ctx->peer() +
                            " claims it too: a second copy of the task, or a restart while the old process's claim lasts (" +
                            std::to_string(silence.count()) + " ms after its last heartbeat)");
                reply->set_held_by(c.peer);
                return grpc::Status::OK;
            }
            // A lapsed claim in a group that formed: its holder joined with the others and left
            // (crashed). Its replacement joins the group rank 0 serves after noticing, not this one:
            // once every rank has claimed, the others may have read the old holder's Gloo address
            // (or connected to it), so a new address cannot join that mesh. The others notice
            // within a few heartbeats (lost_ranks), while connecting as while training.
            if (!c.instance.empty() && c.instance != req->instance() && g.formed) {
                reply->set_group_running(true);
                return grpc::Status::OK;
            }
            if (c.instance != req->instance()) c = {req->instance(), {}, {}, {}};
            c.peer = ctx->peer();
            c.lastSeen = now;
            if (static_cast<int>(g.claims.size()) == req->size()) g.formed = true;
        }
        g.lastSeen[req->rank()] = now;
        for (int r = 0; r < req->size(); ++r) {
            auto it = g.lastSeen.find(r);
            const auto since = it == g.lastSeen.end() ? g.created : it->second;
            if (now - since <= silence) continue;
            reply->add_silent_ranks(r);
            // Lost: it joined, and the others may depend on it. Before every rank has claimed, no
            // rank's Gloo address has been read (Gloo first waits for all host names), and a
            // replacement takes the lapsed claim over (above): not lost, only silent.
            if (g.formed && it != g.lastSeen.end()) reply->add_lost_ranks(r);
        }
        return grpc::Status::OK;
    }

    void shutdown()
    {
        std::lock_guard lock(m_mutex);
        m_shutdown = true;
        m_cv.notify_all();
    }

private:
    struct Claim {
        std::string instance, peer;
        Clock::time_point lastSeen;
        std::set<std::string> contenders;  // other instances already logged as beating for it
    };
    struct Value {
        std::string bytes;
        Clock::time_point touched;  // set or read
    };
    struct Group {
        Clock::time_point created, touched;  // touched: the last heartbeat for any of its ranks
        std::map<int, Clock::time_point> lastSeen;
        std::map<int, Claim> claims;  // by rank: the instance that holds it
        bool formed = false;          // every rank has been claimed
    };

    // A waiter woken by shutdown(): the group it was joining is gone (its run ended or restarts).
    static grpc::Status closing() { return grpc::Status(grpc::StatusCode::UNAVAILABLE, kRendezvousClosing); }

    // Every call: the token, then which server this is, refusing a client pinned to another one
    // (a process still holding the group of an earlier attempt, its rendezvous gone).
    grpc::Status admit(grpc::ServerContext& ctx, const char* call)
    {
        if (auto st = checkToken(ctx, m_token, call); !st.ok()) return st;
        ctx.AddInitialMetadata(kIncarnationKey, m_incarnation);
        const auto& md = ctx.client_metadata();
        const auto it = md.find(kIncarnationKey);
        if (it == md.end() || std::string_view(it->second.data(), it->second.size()) == m_incarnation) return grpc::Status::OK;
        logLine("refused " + std::string(call) + " from " + ctx.peer() + ": it joined an earlier rendezvous at this address");
        return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, kRendezvousRestarted);
    }

    grpc::Status checkKey(const grpc::ServerContext& ctx, const std::string& key)
    {
        if (key.empty() || key.size() > kMaxKeyBytes) {
            logLine("refused a rendezvous call from " + ctx.peer() + ": key of " + std::to_string(key.size()) + " bytes");
            return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "keys are 1.." + std::to_string(kMaxKeyBytes) + " bytes");
        }
        // Keys live under their group ("<group>/..."); a heartbeat names the group itself.
        if (m_serves) {
            if (!m_serves(key)) {
                // The group as a TF_CONFIG task names it ("train"): up to the first '/'.
                const std::string group = key.substr(0, key.find('/'));
                std::lock_guard lock(m_mutex);
                if (m_refusedGroups.size() < 64 && m_refusedGroups.insert(group).second)
                    logLine("refused rendezvous calls from " + ctx.peer() + " for group '" + group +
                            "': no run of this daemon (a task started with TF_CONFIG naming this address?)");
                return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, kRendezvousNotServed);
            }
        }
        return grpc::Status::OK;
    }

    // Blocks until every key exists, the deadline passes, the client goes away or shutdown().
    bool waitFor(std::unique_lock<std::mutex>& lock, grpc::ServerContext* ctx, const std::vector<std::string>& keys, int64_t timeoutMs)
    {
        const auto deadline = Clock::now() + std::chrono::milliseconds(std::clamp<int64_t>(timeoutMs, 0, kMaxWaitMs));
        auto ready = [&] {
            for (const auto& k : keys)
                if (!m_values.count(k)) return false;
            return true;
        };
        while (!ready()) {
            if (m_shutdown || ctx->IsCancelled() || Clock::now() >= deadline) return false;
            // Re-check cancellation every 100 ms: a dead client must not pin a server thread.
            m_cv.wait_until(lock, std::min(deadline, Clock::now() + std::chrono::milliseconds(100)));
        }
        return true;
    }

    // A long-lived server (a trainstudio-worker serves one rendezvous for every run it
    // coordinates, a group per run and attempt) forgets what nobody uses any more: a group none of
    // whose ranks has beaten for m_idleExpiry, and the keys under it ("<group>/...") or under no
    // live group that nobody set or read for as long. A running group's ranks beat every second or
    // so, and its keys are only read while it forms or fails, so nothing in use is lost.
    void sweep(Clock::time_point now)
    {
        if (now < m_nextSweep) return;
        m_nextSweep = now + std::min<Clock::duration>(m_idleExpiry / 4, std::chrono::minutes(1));
        for (auto it = m_groups.begin(); it != m_groups.end();)
            it = now - it->second.touched > m_idleExpiry ? m_groups.erase(it) : std::next(it);
        for (auto it = m_values.begin(); it != m_values.end();) {
            const bool idle = now - it->second.touched > m_idleExpiry;
            const bool live = idle && std::any_of(m_groups.begin(), m_groups.end(), [&](const auto& g) {
                                  return it->first.size() > g.first.size() && it->first.starts_with(g.first) && it->first[g.first.size()] == '/';
                              });
            it = idle && !live ? m_values.erase(it) : std::next(it);
        }
    }

    std::string m_token;
    int m_maxValue;
    const Clock::duration m_idleExpiry;
    Clock::time_point m_nextSweep{};
    const std::string m_incarnation;
    const GroupFilter m_serves;
    std::mutex m_mutex;
    std::set<std::string> m_refusedGroups;  // logged once each
    std::condition_variable m_cv;
    std::map<std::string, Value> m_values;
    std::map<std::string, Group> m_groups;
    bool m_shutdown = false;
};

} // namespace

std::string randomId()
{
    uint64_t v = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) * 0x9E3779B97F4A7C15ull ^
                 static_cast<uint64_t>(::getpid());
    try {
        std::random_device rd;
        v ^= (static_cast<uint64_t>(rd()) << 32) ^ rd();
    } catch (const std::exception&) {
        // No entropy source: the clock and the process id still tell two processes apart.
    }
    char text[24];
    std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(v));
    return text;
}

std::unique_ptr<grpc::Service> makeRendezvousService(const std::string& token, int maxValueBytes, std::chrono::milliseconds idleExpiry,
                                                    GroupFilter serves)
{
    return std::make_unique<RendezvousService>(token, maxValueBytes, idleExpiry, std::move(serves));
}

class RendezvousServer::Impl {
public:
    std::unique_ptr<RendezvousService> service;
    std::unique_ptr<grpc::Server> server;
    int port = 0;
};

RendezvousServer::RendezvousServer(std::unique_ptr<Impl> impl) : m_impl(std::move(impl)) {}
RendezvousServer::~RendezvousServer() { shutdown(); }
int RendezvousServer::port() const { return m_impl->port; }

void RendezvousServer::shutdown()
{
    if (!m_impl || !m_impl->server) return;
    m_impl->service->shutdown();
    m_impl->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    m_impl->server->Wait();
    m_impl->server.reset();
}

Result<std::unique_ptr<RendezvousServer>> RendezvousServer::start(const Options& options)
{
    if (options.token.empty())
        return makeError(ErrorCode::InvalidArgument, "the rendezvous service needs a shared token", "pass --token-file or set $" + std::string(kTokenEnv));
    TS_TRY(checkCanListen(options.bindAddress, "the rendezvous"));
    TS_ASSIGN(auto creds, serverCredentials(options.tls));
    auto impl = std::make_unique<Impl>();
    impl->service = std::make_unique<RendezvousService>(options.token, options.maxValueBytes, options.idleExpiry);
    grpc::ServerBuilder builder;
    // gRPC turns SO_REUSEPORT on by default: a second server on a taken port then "listens" too
    // and the kernel splits connections between the two at random.
    builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    builder.AddListeningPort(options.bindAddress, creds, &impl->port);
    builder.RegisterService(impl->service.get());
    builder.SetMaxReceiveMessageSize(options.maxValueBytes + 4096);
    impl->server = builder.BuildAndStart();
    if (!impl->server || impl->port == 0)
        return makeError(ErrorCode::IoError, "cannot serve rendezvous on " + options.bindAddress,
                         "is the port already in use, or the address not on this machine?");
    return std::unique_ptr<RendezvousServer>(new RendezvousServer(std::move(impl)));
}

class RendezvousClient::Impl {
public:
    std::string address, token;
    bool tls = false;
    std::unique_ptr<Rendezvous::Stub> stub;
    mutable std::mutex incarnationMutex;
    std::string seen, pinned;  // the last server that answered; the one pin() fixed

    // After a call that the server answered: which server that was.
    void learn(const grpc::ClientContext& ctx)
    {
        const auto& md = ctx.GetServerInitialMetadata();
        const auto it = md.find(kIncarnationKey);
        if (it == md.end()) return;
        std::lock_guard lock(incarnationMutex);
        seen.assign(it->second.data(), it->second.size());
    }

    Error fail(const grpc::Status& st, const std::string& what) const
    {
        const ErrorCode code = st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ? ErrorCode::Cancelled
                             : st.error_code() == grpc::StatusCode::UNAUTHENTICATED  ? ErrorCode::InvalidArgument
                                                                                     : ErrorCode::IoError;
        std::string hint = st.error_code() == grpc::StatusCode::UNAVAILABLE ? "is the coordinator running and reachable at " + address + "?"
                         : st.error_code() == grpc::StatusCode::UNAUTHENTICATED ? "every task must use the same shared token"
                         : st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED
                             ? "the coordinator (the chief, or worker 0 without one) serves the rendezvous at " + address +
                                   ": is it running, with the same TF_CONFIG and token, and reachable from here?"
                             : "";
        return makeError(code, "rendezvous at " + address + ": " + what + ": " + callFailure(st), hint);
    }
    void prepare(grpc::ClientContext& ctx, std::chrono::milliseconds timeout) const
    {
        attachToken(ctx, token);
        {
            std::lock_guard lock(incarnationMutex);
            if (!pinned.empty()) ctx.AddMetadata(kIncarnationKey, pinned);
        }
        ctx.set_deadline(std::chrono::system_clock::now() + timeout);
        // Tasks start in any order: a call made before the coordinator listens waits for it
        // (until the deadline) instead of failing at once.
        ctx.set_wait_for_ready(true);
    }
};

RendezvousClient::RendezvousClient(std::unique_ptr<Impl> impl) : m_impl(std::move(impl)) {}
RendezvousClient::~RendezvousClient() = default;
const std::string& RendezvousClient::address() const { return m_impl->address; }

Result<std::unique_ptr<RendezvousClient>> RendezvousClient::connect(const std::string& address, const std::string& token, const TlsFiles& tls)
{
    TS_ASSIGN(auto creds, channelCredentials(tls));
    auto impl = std::make_unique<Impl>();
    impl->address = address;
    impl->token = token;
    impl->tls = !tls.rootCa.empty();
    // A coordinator that is not up yet is tried again every few hundred ms.
    grpc::ChannelArguments args = channelArguments(2 << 20, std::chrono::milliseconds(500));
    impl->stub = Rendezvous::NewStub(grpc::CreateCustomChannel(address, creds, args));
    return std::unique_ptr<RendezvousClient>(new RendezvousClient(std::move(impl)));
}

Status RendezvousClient::set(const std::string& key, const std::vector<char>& value, std::chrono::milliseconds timeout)
{
    grpc::ClientContext ctx;
    m_impl->prepare(ctx, timeout);
    SetRequest req;
    req.set_key(key);
    req.set_value(std::string(value.begin(), value.end()));
    SetReply reply;
    const grpc::Status st = m_impl->stub->Set(&ctx, req, &reply);
    if (st.ok()) m_impl->learn(ctx);
    if (!st.ok()) return m_impl->fail(st, "set " + key);
    return okStatus();
}

Result<std::vector<char>> RendezvousClient::get(const std::string& key, std::chrono::milliseconds timeout)
{
    grpc::ClientContext ctx;
    // The server waits `timeout`; the RPC's own deadline leaves it a second to answer.
    m_impl->prepare(ctx, timeout + std::chrono::seconds(1));
    GetRequest req;
    req.set_key(key);
    req.set_timeout_ms(timeout.count());
    GetReply reply;
    const grpc::Status st = m_impl->stub->Get(&ctx, req, &reply);
    if (st.ok()) m_impl->learn(ctx);
    if (!st.ok()) return m_impl->fail(st, "get " + key);
    return std::vector<char>(reply.value().begin(), reply.value().end());
}

Status RendezvousClient::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout)
{
    grpc::ClientContext ctx;
    m_impl->prepare(ctx, timeout + std::chrono::seconds(1));
    WaitRequest req;
    for (const auto& k : keys) req.add_keys(k);
    req.set_timeout_ms(timeout.count());
    WaitReply reply;
    const grpc::Status st = m_impl->stub->Wait(&ctx, req, &reply);
    if (st.ok()) m_impl->learn(ctx);
    if (!st.ok()) return m_impl->fail(st, "wait for " + std::to_string(keys.size()) + " key(s)" + (keys.empty() ? "" : " (" + keys.front() + ", ...)"));
    return okStatus();
}

Status RendezvousClient::reach(std::chrono::milliseconds timeout, std::optional<ConnectTrouble>* trouble)
{
    grpc::ClientContext ctx;
    attachToken(ctx, m_impl->token);
    ctx.set_deadline(std::chrono::system_clock::now() + timeout);
    // No wait_for_ready: a connection that cannot be made fails now, with gRPC's reason.
    WaitRequest req;  // no keys: answered at once
    req.set_timeout_ms(0);
    WaitReply reply;
    const grpc::Status st = m_impl->stub->Wait(&ctx, req, &reply);
    if (st.ok()) return okStatus();
    auto t = connectTrouble(st, m_impl->address, m_impl->tls);
    if (trouble) *trouble = t;
    if (t) return makeError(ErrorCode::IoError, "rendezvous at " + m_impl->address + ": " + t->what, t->hint);
    return m_impl->fail(st, "reach");
}

void RendezvousClient::pin()
{
    std::lock_guard lock(m_impl->incarnationMutex);
    m_impl->pinned = m_impl->seen;
}

Result<RendezvousClient::Beat> RendezvousClient::heartbeat(const std::string& group, int rank, int size, std::chrono::milliseconds silence,
                                                           const std::string& instance, std::chrono::milliseconds deadline)
{
    grpc::ClientContext ctx;
    m_impl->prepare(ctx, deadline);
    HeartbeatRequest req;
    req.set_group(group);
    req.set_rank(rank);
    req.set_size(size);
    req.set_silence_ms(silence.count());
    req.set_instance(instance);
    HeartbeatReply reply;
    const grpc::Status st = m_impl->stub->Heartbeat(&ctx, req, &reply);
    if (st.ok()) m_impl->learn(ctx);
    if (!st.ok()) return m_impl->fail(st, "heartbeat");
    Beat beat;
    beat.silent.assign(reply.silent_ranks().begin(), reply.silent_ranks().end());
    beat.lost.assign(reply.lost_ranks().begin(), reply.lost_ranks().end());
    beat.heldBy = reply.held_by();
    beat.groupRunning = reply.group_running();
    return beat;
}

} // namespace ts::remote
