#include "remote/gloo_communicator.h"

#include <array>
#include <atomic>
#include <cassert>
#include <condition_variable>
#include <cstring>
#include <map>
#include <new>
#include <optional>
#include <random>
#include <mutex>
#include <thread>

#include <gloo/allreduce_ring_chunked.h>
#include <cstdlib>
#include <gloo/barrier_all_to_all.h>
#include <gloo/broadcast_one_to_all.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <csignal>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "distribute/cluster_spec.h"
#include "remote/rendezvous.h"

#include <arpa/inet.h>
#include <netinet/in.h>

namespace ts::remote {
namespace {

// gloo::rendezvous::Store over the coordinator's gRPC key-value service. Gloo's store interface
// reports failures by throwing; the communicator catches them at its boundary.
constexpr const char* kCancelledWhileJoining = "cancelled while waiting for the other tasks to join";

// What a rank that gave up leaves under the group's abort key for the others' errors: why
// ("<its rank name>: <reason>"), the cause's code and hint. JSON; plain text reads as an I/O error.
struct AbortNote {
    ErrorCode code = ErrorCode::IoError;
    std::string why, hint;
};

std::vector<char> abortValue(const AbortNote& n)
{
    // Paths and exception texts may hold bytes that are not UTF-8: replaced, never thrown on (abort
    // runs on replica threads and in the out-of-memory handler).
    const std::string text = nlohmann::json{{"code", errorCodeName(n.code)}, {"why", n.why}, {"hint", n.hint}}.dump(
        -1, ' ', false, nlohmann::json::error_handler_t::replace);
    return {text.begin(), text.end()};
}

AbortNote readAbortValue(const std::vector<char>& v)
{
    const std::string text(v.begin(), v.end());
    const auto j = nlohmann::json::parse(text, nullptr, false);
    if (!j.is_object() || !j.contains("why") || !j["why"].is_string()) return {ErrorCode::IoError, text, {}};
    AbortNote n;
    n.why = j["why"].get<std::string>();
    if (j.contains("hint") && j["hint"].is_string()) n.hint = j["hint"].get<std::string>();
    if (j.contains("code") && j["code"].is_string())
        if (auto c = errorCodeFromName(j["code"].get<std::string>())) n.code = *c;
    return n;
}

class GrpcStore final : public gloo::rendezvous::Store {
public:
    GrpcStore(RendezvousClient& client, std::string prefix, std::chrono::milliseconds timeout, std::function<bool()> cancelled = {})
        : m_client(client), m_prefix(std::move(prefix)), m_timeout(timeout), m_cancelled(std::move(cancelled)) {}

    void set(const std::string& key, const std::vector<char>& data) override
    {
        // Idempotent, so a slice that timed out (the rendezvous not up yet) is simply repeated.
        sliced(m_timeout, [&](std::chrono::milliseconds t) { return m_client.set(m_prefix + key, data, t); });
    }
    std::vector<char> get(const std::string& key) override
    {
        std::vector<char> value;
        sliced(m_timeout, [&](std::chrono::milliseconds t) -> Status {
            TS_ASSIGN(value, m_client.get(m_prefix + key, t));
            return okStatus();
        });
        return value;
    }
    void wait(const std::vector<std::string>& keys) override { wait(keys, m_timeout); }
    void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override
    {
        std::vector<std::string> full;
        for (const auto& k : keys) full.push_back(m_prefix + k);
        sliced(timeout, [&](std::chrono::milliseconds t) { return m_client.wait(full, t); });
    }

private:
    // Runs call(timeout) once, or with a cancel predicate in slices of at most 0.5 s until the
    // timeout, asking in between whether to give up (Ctrl-C, the studio's Stop). Throws Gloo's
    // exception with the last error.
    template <typename Call>
    void sliced(std::chrono::milliseconds timeout, Call&& call)
    {
        if (!m_cancelled) {
            if (Status st = call(timeout); !st.ok()) throw gloo::IoException(st.error().toString());
            return;
        }
        constexpr std::chrono::milliseconds kSlice{500};
        const auto deadline = std::chrono::steady_clock::now() + timeout;
        for (;;) {
            if (m_cancelled()) throw gloo::IoException(kCancelledWhileJoining);
            const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
            Status st = call(std::max(std::min(left, kSlice), std::chrono::milliseconds(1)));
            if (st.ok()) return;
            // Only a slice that ran out is repeated (the rendezvous reports its deadlines as
            // Cancelled); a refused token or a broken connection is final at once.
            if (left <= kSlice || st.error().code != ErrorCode::Cancelled) throw gloo::IoException(st.error().toString());
        }
    }

    RendezvousClient& m_client;
    std::string m_prefix;
    std::chrono::milliseconds m_timeout;
    std::function<bool()> m_cancelled;
};

// This process's sockets, by inode (fd numbers are reused; a socket's inode is not while it lives).
std::map<ino_t, int> socketInodes()
{
    std::map<ino_t, int> out;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
        const int fd = std::atoi(entry.path().filename().c_str());
        struct stat st {};
        if (::fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode)) out[st.st_ino] = fd;
    }
    return out;
}

// Gloo's Context::closeConnections() takes the pairs out of its event loop, so a transfer this
// process is waiting on is never told and waits for the full timeout; and Debian's Gloo headers
// cannot name a pair's socket (tcp/pair.h needs a header the package lacks). So the sockets that
// appeared while the Gloo mesh connected are remembered, and abort shuts them down (shutdown(2),
// not close: the fds stay Gloo's). The event loop then sees end-of-file on both sides: this
// rank's waiting transfer and the peers' fail at once, as when a process dies.
void shutdownSockets(const std::set<ino_t>& gloo)
{
    for (const auto& [ino, fd] : socketInodes())
        if (gloo.count(ino)) ::shutdown(fd, SHUT_RDWR);
}

// With synchronous pairs a send blocks until the kernel has taken every byte, and bytes are read
// only when this rank waits for them. The ring all-reduce starts with every rank sending two
// chunks (of 2 * ranks) to its neighbour before reading anything (two ranks: their half of the
// segment, the same bytes in one message), so if two chunks do not fit in the socket buffers
// both ranks block in write() until the transfer timeout: a 64 MiB all-reduce hung for 30 s on
// loopback. Gloo sizes a pair's send buffer to its largest message, which the kernel caps at
// net.core.wmem_max (208 KiB on a stock Debian) and doubles for bookkeeping; the peer's receive
// window (at least 64 KiB) adds to it. So tensors are reduced in segments whose chunks stay
// under 90% of wmem_max (and 1 MiB); later chunks only go out once the neighbour has read the
// earlier ones (Gloo's ring notifications; two ranks: the second message's write waits until
// the peer has read the first, which the peer does without waiting for this rank), so two chunks
// per direction is all that is ever in flight. Chunks are kept as large as that allows: each
// segment costs several blocking waits, and splitting the MLP's 0.81 MB into two segments took
// its ring all-reduce from 0.40 to 0.70 ms here.
int64_t localMaxChunkBytes()
{
    int64_t wmemMax = 212992;  // the kernel's default
    if (std::FILE* f = std::fopen("/proc/sys/net/core/wmem_max", "r")) {
        long long v = 0;
        if (std::fscanf(f, "%lld", &v) == 1 && v > 0) wmemMax = v;
        std::fclose(f);
    }
    return std::clamp<int64_t>(wmemMax * 9 / 10, 64 * 1024, 1024 * 1024);
}

// The sum Gloo's algorithms reduce with. Gloo's own (ReductionFunction<float>::sum) is a scalar
// loop over pointers it cannot prove distinct, and Debian builds Gloo without AVX: on the MLP's
// 0.81 MB it was 4.6% of a worker's CPU, next to 5.9% for the whole Adam update. The ring
// algorithms only ever add a received inbox into the tensor, so the two never overlap.
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"), optimize("O3")))
void sumInto(float* __restrict x, const float* __restrict y, size_t n)
{
    for (size_t i = 0; i < n; ++i) x[i] += y[i];
}

const gloo::ReductionFunction<float> kSum(gloo::SUM, &sumInto);

// The all-reduce of two ranks in two exchanges over Gloo's pairs: each rank sends the half the
// other owns and reduces the half it owns (the peer's copy arrives in an inbox), then sends its
// reduced half straight into the peer's tensor. Gloo's ring for two ranks moves the same bytes
// in four chunks, waits for a notification before each of its last sends and copies every
// received result out of an inbox; on the seed MLP's 0.81 MB of gradients this took the
// all-reduce from 0.25-0.32 to 0.18-0.22 ms, and 2 workers from 0.75-0.79x to 0.85-0.88x of one
// process with 2 threads (bench --suite distributed on this 2-core VM).
// No notifications are needed: a rank sends its second message only after receiving the peer's
// first, so the peer is inside the same call and has sent (synchronous pairs: the kernel holds
// the bytes) the half that the second message overwrites; and the peer starts its next call only
// after receiving that second message, by which time this rank has reduced the inbox. A single
// element has no two halves: it goes round Gloo's ring.
// In flight per direction: half the segment, as in the ring's first step.
class AllreduceHalves final : public gloo::Algorithm {
public:
    AllreduceHalves(const std::shared_ptr<gloo::Context>& context, float* data, int64_t count)
        : gloo::Algorithm(context), m_data(data)
    {
        assert(contextSize_ == 2 && count >= 2);
        m_offset = {0, count / 2};
        m_length = {count / 2, count - count / 2};
        m_inbox.resize(static_cast<std::size_t>(m_length[static_cast<std::size_t>(contextRank_)]));
        auto& pair = getPair(1 - contextRank_);
        const std::size_t bytes = static_cast<std::size_t>(count) * sizeof(float);
        const auto scatter = context_->nextSlot();
        m_sendOthers = pair->createSendBuffer(scatter, data, bytes);
        m_recvMine = pair->createRecvBuffer(scatter, m_inbox.data(), m_inbox.size() * sizeof(float));
        const auto gather = context_->nextSlot();
        m_sendMine = pair->createSendBuffer(gather, data, bytes);
        m_recvOthers = pair->createRecvBuffer(gather, data, bytes);
    }

    void run() override
    {
        const auto mine = static_cast<std::size_t>(contextRank_), other = 1 - mine;
        const auto bytes = [](int64_t floats) { return static_cast<std::size_t>(floats) * sizeof(float); };
        m_sendOthers->send(bytes(m_offset[other]), bytes(m_length[other]), 0);
        m_recvMine->waitRecv();
        sumInto(m_data + m_offset[mine], m_inbox.data(), static_cast<std::size_t>(m_length[mine]));
        m_sendMine->send(bytes(m_offset[mine]), bytes(m_length[mine]), bytes(m_offset[mine]));
        m_recvOthers->waitRecv();
        m_sendOthers->waitSend();
        m_sendMine->waitSend();
    }

private:
    float* m_data;
    std::array<int64_t, 2> m_offset{}, m_length{};  // each rank's half
    std::vector<float> m_inbox;
    std::unique_ptr<gloo::transport::Buffer> m_sendOthers, m_recvMine, m_sendMine, m_recvOthers;
};

class GlooCommunicator final : public Communicator {
public:
    explicit GlooCommunicator(GlooOptions options) : m_opt(std::move(options)) {}

    ~GlooCommunicator() override
    {
        stopHeartbeat();
        // Algorithms hold buffers registered with the context's pairs: free them first.
        m_allreduce.clear();
        m_registered.clear();
        m_broadcast.clear();
        m_barrier.reset();
        m_context.reset();
    }

    Status connect()
    {
        TS_ASSIGN(m_client, RendezvousClient::connect(m_opt.rendezvousAddress, m_opt.token, m_opt.tls));
        // A task restarted after a crash, while rank 0 still runs the group its previous process
        // left, waits in claimRank (group_running) until rank 0 serves the next group.
        TS_TRY(claimRank());
        m_joinStart = std::chrono::steady_clock::now();
        m_joining = m_opt.size > 1;
        startHeartbeat();
        if (m_opt.size == 1) return okStatus();
        Status joined = joinMesh();
        bool tell = false;
        {
            std::lock_guard lock(m_joinMutex);
            m_joining = false;
            // The heartbeat gave up on the join just as it succeeded: its reason stands.
            if (m_joinFailure) joined = Status(*m_joinFailure);
            else if (joined.ok()) m_connected = true;
            tell = !joined.ok() && (m_joinFailureIsOurs || (!m_joinFailure && joined.error().code == ErrorCode::Cancelled));
        }
        // A join given up here for a reason of this rank's own (Ctrl-C, a peer found lost) is told
        // to the others under the group's abort key, so that theirs say why instead of, seconds
        // later, that this rank stopped responding. Not a refusal (the others find a difference
        // themselves, and a refused second copy must not end the first's group), not a reason
        // read from that key, and not a timeout (every rank has its own).
        if (tell) (void)m_client->set(m_opt.group + "/abort", abortValue({joined.error().code, joined.error().message, {}}), std::chrono::seconds(1));
        return joined;
    }

    Status joinMesh()
    {
        try {
            gloo::transport::tcp::attr attr;
            attr.hostname = m_opt.hostname;
            m_device = gloo::transport::tcp::CreateDevice(attr);
            m_context = std::make_shared<gloo::rendezvous::Context>(m_opt.rank, m_opt.size);
            m_context->setTimeout(m_opt.timeout);
            // Waits give up on Ctrl-C, when the heartbeat finds this rank held by another process
            // (this one's claim lapsed while it was not running), and when it gave up the join.
            GrpcStore store(*m_client, m_opt.group + "/", m_opt.timeout,
                            [this] { return cancelled() || !heldBy().empty() || joinAbandoned(); });
            // Every task must describe the same cluster. Otherwise Gloo fails inside its address
            // exchange ("enforce fail at address.cc: 136 vs 68") or waits for a rank that the
            // others do not have: compare first, and name the task that differs.
            const std::string ourCluster = clusterText();
            store.set("cluster/" + std::to_string(m_opt.rank), std::vector<char>(ourCluster.begin(), ourCluster.end()));
            for (int r = 0; r < m_opt.size; ++r) {
                if (r == m_opt.rank) continue;
                const std::vector<char> v = store.get("cluster/" + std::to_string(r));  // waits for the key
                const std::string theirs(v.begin(), v.end());
                if (theirs != ourCluster)
                    return makeError(ErrorCode::InvalidArgument,
                                     rankName(m_opt.rank) + " and rank " + std::to_string(r) + " were given different clusters: this task's is " +
                                         shortened(ourCluster) + ", rank " + std::to_string(r) + "'s is " + shortened(theirs),
                                     "start every task with the same TF_CONFIG \"cluster\" (only \"task\" differs between them)");
            }
            const auto before = socketInodes();
            {
                std::lock_guard lock(m_joinMutex);
                m_joinBefore = before;  // from now on a join given up shuts Gloo's new sockets down
            }
            m_context->connectFullMesh(store, m_device);
            // Synchronous pairs (blocking socket reads and writes on the calling thread, no busy
            // polling): in Gloo's default asynchronous mode every message goes through its event
            // loop thread and a condition variable, which on 2 cores took a third of each
            // process's CPU and left the seed MLP at 42k samples/s over 2 processes (137k
            // synchronous). Abort and a silent peer still end a blocked read: abort shuts the
            // mesh's sockets down, and the heartbeat aborts. TS_GLOO_ASYNC=1 keeps Gloo's default
            // (for measuring the difference).
            if (!m_opt.asyncPairs && !std::getenv("TS_GLOO_ASYNC"))
                for (int r = 0; r < m_opt.size; ++r)
                    if (r != m_opt.rank) m_context->getPair(r)->setSync(true, false);
            // Every rank must cut tensors into the same segments (each builds its algorithms in
            // the same order), and the tightest machine's socket buffers bound the chunk: agree
            // on the smallest.
            m_maxChunkBytes = m_opt.maxChunkBytes > 0 ? std::min(m_opt.maxChunkBytes, localMaxChunkBytes()) : localMaxChunkBytes();
            const std::string mine = std::to_string(m_maxChunkBytes);
            store.set("chunk-bytes/" + std::to_string(m_opt.rank), std::vector<char>(mine.begin(), mine.end()));
            for (int r = 0; r < m_opt.size; ++r) {
                const std::vector<char> v = store.get("chunk-bytes/" + std::to_string(r));
                m_maxChunkBytes = std::min<int64_t>(m_maxChunkBytes, std::atoll(std::string(v.begin(), v.end()).c_str()));
            }
            m_maxChunkBytes = std::max<int64_t>(m_maxChunkBytes, 4096);
            m_meshSockets = glooSocketsSince(before);
            // This rendezvous only, from now on: one that rank 0 starts anew at the same
            // address (a restarted run) must not take this process's heartbeats as claims, or
            // its abort reason as the new group's.
            m_client->pin();
        } catch (const std::exception& e) {
            if (auto why = joinFailure()) return *why;
            if (auto why = stoppedHere()) return *why;
            // The rendezvous closed under this join: rank 0 stopped (its own error says why).
            if (m_opt.rank != 0 && std::string(e.what()).find(kRendezvousClosing) != std::string::npos)
                return makeError(ErrorCode::IoError,
                                 rankName(m_opt.rank) + ": " + rendezvousOwner() + " stopped while this task joined the cluster (" +
                                     kRendezvousClosing + ")",
                                 "see " + rankName(0) + "'s error; start every task again once it is fixed");
            // Name the ranks that never showed up: every rank heartbeats from the start, so a
            // silent one was not started, has another token (the rendezvous refuses it) or cannot
            // reach the rendezvous.
            // Silent for 3 heartbeats, or for half the wait when that is shorter (a short
            // --collective-timeout), but always longer than one heartbeat of a live rank.
            const auto absentAfter = std::max<std::chrono::milliseconds>(std::min<std::chrono::milliseconds>(silence(), m_opt.timeout / 2),
                                                                         m_opt.heartbeat + std::chrono::milliseconds(250));
            auto silent = m_client->heartbeat(m_opt.group, m_opt.rank, m_opt.size, absentAfter, m_instance);
            if (!silent.ok() && silent.error().code == ErrorCode::InvalidArgument) return tokenRefused();
            const std::string absent = silent.ok() ? rankList(silent->silent) : std::string();
            if (!silent.ok() && m_opt.rank != 0) {
                std::optional<ConnectTrouble> trouble;
                (void)m_client->reach(std::chrono::milliseconds(1000), &trouble);
                return rendezvousSilent(trouble);
            }
            if (!absent.empty())
                return makeError(ErrorCode::IoError,
                                 rankName(m_opt.rank) + ": " + absent + " did not join the cluster within " + waitedText() +
                                     " (rendezvous at " + m_opt.rendezvousAddress + ")",
                                 "start every task with the same TF_CONFIG and the same token (the rendezvous refuses "
                                 "another token and logs it); a task must reach " + m_opt.rendezvousAddress);
            return makeError(ErrorCode::IoError,
                             rankName(m_opt.rank) + ": cannot connect to the other " + std::to_string(m_opt.size - 1) +
                                 " rank(s) through the rendezvous at " + m_opt.rendezvousAddress + ": " + e.what(),
                             "check that every task started, uses the same cluster spec and token, and can reach "
                             "the others' hosts (Gloo listens on " + m_opt.hostname + ", ephemeral ports)");
        }
        return okStatus();
    }

    int size() const override { return m_opt.size; }
    std::string name() const override { return "gloo"; }

    // The checks every all-reduce (and registration) makes; false: nothing to reduce.
    Result<bool> checkReduce(int rank, const Tensor& t)
    {
        TS_TRY(checkCall(rank));
        if (t.dtype() != DType::F32 || !t.hostAccessible())
            return makeError(ErrorCode::Unsupported, "the Gloo all-reduce takes host F32 tensors", "copy the tensor to the host first");
        return m_opt.size > 1 && t.numel() > 0;
    }

    Status allReduceSum(int rank, Tensor& t) override
    {
        TS_ASSIGN(const bool work, checkReduce(rank, t));
        if (!work) return okStatus();
        const int64_t n = t.numel();
        return run("all-reduce of " + std::to_string(n) + " floats", [&] {
            // A registered buffer is reduced where it is.
            if (auto it = m_registered.find({t.data<float>(), n}); it != m_registered.end()) {
                for (auto& algorithm : it->second) algorithm->run();
                return;
            }
            // Otherwise one set of algorithms (and a staging buffer) per element count: Gloo
            // algorithms bind their buffers and slots when built, and every rank builds them in
            // the same call order.
            auto& slot = m_allreduce[n];
            if (slot.segments.empty()) {
                slot.buffer.assign(static_cast<std::size_t>(n), 0.f);
                slot.segments = segments(slot.buffer.data(), n);
            }
            std::memcpy(slot.buffer.data(), t.data<float>(), static_cast<std::size_t>(n) * sizeof(float));
            for (auto& algorithm : slot.segments) algorithm->run();
            std::memcpy(t.data<float>(), slot.buffer.data(), static_cast<std::size_t>(n) * sizeof(float));
        });
    }

    Status registerBuffer(int rank, Tensor& t) override
    {
        TS_ASSIGN(const bool work, checkReduce(rank, t));
        if (!work) return okStatus();
        const int64_t n = t.numel();
        auto& algorithms = m_registered[{t.data<float>(), n}];
        if (!algorithms.empty()) return okStatus();  // already registered (by the same call on every rank)
        return run("registering a buffer of " + std::to_string(n) + " floats", [&] { algorithms = segments(t.data<float>(), n); });
    }

    void releaseBuffer(int rank, const Tensor& t) override
    {
        if (rank == m_opt.rank && t.defined() && t.hostAccessible() && t.dtype() == DType::F32)
            m_registered.erase({t.data<float>(), t.numel()});
    }

    Status broadcast(int rank, int root, Tensor& t) override
    {
        TS_TRY(checkCall(rank));
        if (root < 0 || root >= m_opt.size)
            return makeError(ErrorCode::InvalidArgument, "broadcast root " + std::to_string(root) + " is not a rank of " + std::to_string(m_opt.size));
        if (!t.hostAccessible()) return makeError(ErrorCode::Unsupported, "the Gloo broadcast takes host tensors");
        if (m_opt.size == 1 || t.bytes() == 0) return okStatus();
        const std::size_t bytes = t.bytes();
        return run("broadcast of " + std::to_string(bytes) + " bytes from " + rankName(root), [&] {
            auto& slot = m_broadcast[{root, bytes}];
            if (!slot.algorithm) {
                slot.buffer.assign(bytes, 0);
                slot.algorithm = std::make_unique<gloo::BroadcastOneToAll<uint8_t>>(m_context, std::vector<uint8_t*>{slot.buffer.data()}, bytes, root);
            }
            if (rank == root) std::memcpy(slot.buffer.data(), t.raw(), bytes);
            slot.algorithm->run();
            if (rank != root) std::memcpy(t.raw(), slot.buffer.data(), bytes);
        });
    }

    Status barrier(int rank) override
    {
        TS_TRY(checkCall(rank));
        if (m_opt.size == 1) return okStatus();
        return run("barrier", [&] {
            if (!m_barrier) m_barrier = std::make_unique<gloo::BarrierAllToAll>(m_context);
            m_barrier->run();
        });
    }

    void abort(const Error& cause) override
    {
        bool ours = true;
        {
            std::lock_guard lock(m_abortMutex);
            if (m_aborted) return;
            m_reason = cause.message;
            m_aborted = true;
            // A rank whose collective already failed wrote nothing: the peers find the cause as it
            // did (the abort key, or the heartbeats). Its reason here quotes that cause, and
            // writing it would replace a culprit's (a cancelled run then read as a failure).
            ours = !m_failed;
        }
        // Tell the others why before the sockets close, so their errors can say it.
        if (m_client && ours) {
            const Error& told = cause.code == ErrorCode::Cancelled ? cancelledCause() : cause;
            (void)m_client->set(m_opt.group + "/abort", abortValue({told.code, rankName(m_opt.rank) + ": " + told.message, told.hint}),
                                std::chrono::seconds(2));
        }
        // Shutting the sockets down wakes this rank's pending transfer and the peers'.
        if (m_connected) shutdownSockets(m_meshSockets);
    }

private:
    using Segments = std::vector<std::unique_ptr<gloo::Algorithm>>;

    // How long a rank may go without a heartbeat before it counts as lost: one late beat is a
    // busy machine, three in a row are a dead, frozen or cut-off process.
    std::chrono::milliseconds silence() const { return 3 * m_opt.heartbeat; }

    // All-reduces over [data, data + n), one per segment (see localMaxChunkBytes), run in order:
    // two ranks exchange halves (AllreduceHalves), more go round Gloo's ring.
    Segments segments(float* data, int64_t n)
    {
        Segments out;
        const int64_t seg = m_maxChunkBytes / static_cast<int64_t>(sizeof(float)) * 2 * m_opt.size;
        for (int64_t b = 0; b < n; b += seg) {
            const int64_t count = std::min(seg, n - b);
            if (m_opt.size == 2 && count >= 2)
                out.push_back(std::make_unique<AllreduceHalves>(m_context, data + b, count));
            else
                out.push_back(std::make_unique<gloo::AllreduceRingChunked<float>>(m_context, std::vector<float*>{data + b}, static_cast<int>(count), &kSum));
        }
        return out;
    }

    struct AllreduceSlot {
        std::vector<float> buffer;
        Segments segments;
    };
    struct BroadcastSlot {
        std::vector<uint8_t> buffer;
        std::unique_ptr<gloo::BroadcastOneToAll<uint8_t>> algorithm;
    };

    // The cluster as this task sees it: its size and every rank's task and address, in rank order.
    std::string clusterText() const
    {
        std::string out = "[";
        for (int r = 0; r < m_opt.size; ++r) {
            out += (r ? ", " : "");
            out += r < static_cast<int>(m_opt.rankNames.size()) ? m_opt.rankNames[static_cast<std::size_t>(r)] : "rank " + std::to_string(r);
        }
        return out + "]";
    }
    static std::string shortened(const std::string& s) { return s.size() <= 400 ? s : s.substr(0, 400) + "...]"; }

    // "rank 1 (worker:0 at ...), rank 2 (...)"
    std::string rankList(const std::vector<int>& ranks) const
    {
        std::string out;
        for (int r : ranks) out += (out.empty() ? "" : ", ") + rankName(r);
        return out;
    }

    std::string rankName(int r) const
    {
        if (r >= 0 && r < static_cast<int>(m_opt.rankNames.size())) return "rank " + std::to_string(r) + " (" + m_opt.rankNames[static_cast<std::size_t>(r)] + ")";
        return "rank " + std::to_string(r);
    }

    Status checkCall(int rank)
    {
        if (rank != m_opt.rank)
            return makeError(ErrorCode::InvalidArgument, "Gloo communicator of rank " + std::to_string(m_opt.rank) + " called as rank " + std::to_string(rank),
                             "each process owns one rank");
        std::lock_guard lock(m_abortMutex);
        if (m_aborted) return makeError(ErrorCode::Cancelled, "collective aborted: " + m_reason);
        if (m_failed) return *m_failed;
        return okStatus();
    }

    template <typename Fn>
    Status run(const std::string& what, Fn&& fn)
    {
        try {
            fn();
            return okStatus();
        } catch (const std::bad_alloc&) {
            // This rank's own failure (a staging buffer), not a peer's: no culprit to look for,
            // not restartable as a network fault is. The peers learn it as from abort().
            Error e = makeError(ErrorCode::OutOfMemory, what + " on " + rankName(m_opt.rank) + " failed: out of host memory for its buffers",
                                "free memory on that machine, or train a smaller model");
            abort(e);
            return e;
        } catch (const std::exception& e) {
            return failed(what, e.what());
        }
    }

    // A transfer failed: find out who is to blame, remember it, and make the peers fail too.
    Status failed(const std::string& what, const std::string& detail)
    {
        {
            std::lock_guard lock(m_abortMutex);
            if (m_aborted) return makeError(ErrorCode::Cancelled, "collective aborted: " + m_reason);
            if (m_failed) return *m_failed;  // the heartbeat watchdog got there first
        }
        // Release the peers first: they need not wait while this rank looks for the culprit
        // (up to five heartbeat periods).
        if (m_connected) shutdownSockets(m_meshSockets);
        const AbortNote culprit = findCulprit();
        const std::string suspended = suspensionNote();
        // A peer's abort reason is "<its rank name>: <reason>".
        const bool stoppedThere = culprit.why.ends_with(std::string(": ") + Communicator::kCancelledReason);
        // Stopped on purpose elsewhere: Cancelled, so the run is recorded as cancelled and
        // --restarts does not start it again (the cancelled task is not coming back). A peer's
        // own failure that says more than a broken connection (a data error, out of memory)
        // keeps its code and hint: no task restarts for what would fail again.
        ErrorCode code = stoppedThere ? ErrorCode::Cancelled : ErrorCode::IoError;
        std::string hint = failureHint(!suspended.empty(), stoppedThere);
        if (!stoppedThere && suspended.empty()) {
            if (culprit.code != ErrorCode::IoError && culprit.code != ErrorCode::Cancelled) code = culprit.code;
            if (!culprit.hint.empty()) hint = culprit.hint;  // the cause's own advice
        }
        Error err = makeError(code, what + " on " + rankName(m_opt.rank) + " failed: " + suspended + culprit.why + " (gloo: " + detail + ")", hint);
        std::lock_guard lock(m_abortMutex);
        if (!m_failed) m_failed = err;  // the watchdog may have decided meanwhile
        return *m_failed;
    }

    // Who made this rank's transfer fail and why; an I/O error unless a rank that aborted said more.
    AbortNote findCulprit()
    {
        const auto deadline = std::chrono::steady_clock::now() + silence() + 2 * m_opt.heartbeat;
        const auto io = [](std::string why) { return AbortNote{ErrorCode::IoError, std::move(why), {}}; };
        while (true) {
            // A rank that aborted left its reason under the group's abort key.
            if (auto why = m_client->get(m_opt.group + "/abort", std::chrono::milliseconds(0)); why.ok()) return readAbortValue(*why);
            auto silent = m_client->heartbeat(m_opt.group, m_opt.rank, m_opt.size, silence(), m_instance);
            if (!silent.ok() && silent.error().message.find(kRendezvousRestarted) != std::string::npos)
                return io(rankName(0) + " restarted the run (its rendezvous at " + m_opt.rendezvousAddress + " is a new one)");
            if (!silent.ok())
                return io("the coordinator's rendezvous at " + m_opt.rendezvousAddress + " is unreachable (" + rankName(0) + " may have died)");
            if (!silent->silent.empty()) {
                return io(rankList(silent->silent) + " stopped responding (no heartbeat for " + std::to_string(silence().count()) + " ms)");
            }
            if (std::chrono::steady_clock::now() >= deadline) return io("every rank still answers heartbeats; a peer was too slow or its connection broke");
            std::this_thread::sleep_for(m_opt.heartbeat / 4);
        }
    }

    void watchdog(const std::vector<int>& silent, const std::string& how = {})
    {
        const std::string names = rankList(silent);
        {
            std::lock_guard lock(m_abortMutex);
            if (m_aborted || m_failed) return;
            const std::string suspended = suspensionNote();
            m_failed = makeError(ErrorCode::IoError,
                                 rankName(m_opt.rank) + ": " + suspended + names + " stopped responding (" +
                                     (how.empty() ? "no heartbeat for " + std::to_string(silence().count()) + " ms" : how) + ")",
                                 failureHint(!suspended.empty(), false));
        }
        if (m_connected) shutdownSockets(m_meshSockets);
    }

    // What to do after a failed collective: `suspended`, this process was the one not running;
    // `stoppedThere`, a peer's run was cancelled (Ctrl-C, Stop) and took the others down with it.
    static std::string failureHint(bool suspended, bool stoppedThere)
    {
        if (stoppedThere)
            return "the run was stopped on that task (Ctrl-C or Stop), so every task ends; start them all again to train again "
                   "(with a backup folder it resumes)";
        if (suspended) return "do not stop a task during a run; start the tasks again (a backup resumes the run)";
        return "the run stops; start the failed task and the others again (with a backup folder, --backup-dir, the run resumes "
               "from its last backup; without one it starts over)";
    }

    // When this process itself was not running (SIGSTOP or Ctrl-Z, a paused VM, a sleeping
    // laptop), its heartbeats stopped too and its peers rightly gave up on it: its own error must
    // say so rather than blame them. Two signs, as either may be seen first on waking: the
    // heartbeat thread's wait overshot by more than two periods, or it has not run for longer than
    // its longest possible loop (a period plus the heartbeat call's 2 s deadline) plus two periods.
    std::string suspensionNote() const
    {
        const auto now = std::chrono::steady_clock::now().time_since_epoch();
        const int64_t nowMs = std::chrono::duration_cast<std::chrono::milliseconds>(now).count();
        const int64_t beat = m_opt.heartbeat.count();
        const int64_t lastWake = m_lastWakeMs.load();
        // A suspension long enough for the peers to give up fails the run within seconds of
        // waking; an older one is not what went wrong now.
        int64_t gone = nowMs - m_suspensionSeenMs.load() < 30000 ? m_suspendedMs.load() : 0;
        if (lastWake > 0 && nowMs - lastWake > 3 * beat + 2000) gone = std::max(gone, nowMs - lastWake - beat);
        if (gone <= 0) return {};
        char secs[32];
        std::snprintf(secs, sizeof secs, "%.1f", static_cast<double>(gone) / 1000.0);
        return "this process, " + rankName(m_opt.rank) + ", was not running for " + secs +
               " s (stopped, or its machine paused), so its peers stopped waiting for it: ";
    }

    // A rank is claimed at the rendezvous before joining Gloo's mesh: the second copy of a task
    // started twice used to hang in Gloo's connect (where no signal reaches it) for minutes. A
    // claim whose holder is silent for 3 heartbeats lapses, so a task restarted after a crash
    // gets its rank back within that. Waits (Ctrl-C aware) for the rendezvous to be served first:
    // only a rank's holder may write its address for Gloo, or the chief could connect to the
    // copy that is then refused (seen on a slow CI machine).
    Status claimRank()
    {
        using Clock = std::chrono::steady_clock;
        const auto start = Clock::now();
        const auto end = start + m_opt.timeout;  // for the rendezvous to answer at all
        std::string holder;
        auto heldSince = Clock::time_point::max();
        // Why the rendezvous does not answer, asked every second while beats fail (a beat waits
        // for the connection, so its failure says only "deadline"); since when it is the same.
        std::optional<ConnectTrouble> trouble;
        auto troubleSince = Clock::time_point::max();
        bool groupRunning = false;
        auto nextProbe = start;
        auto nextReport = start + std::chrono::seconds(3);
        for (;;) {
            // A short deadline per beat: a rendezvous not served yet would hold it for seconds.
            auto beat = m_client->heartbeat(m_opt.group, m_opt.rank, m_opt.size, silence(), m_instance, std::chrono::milliseconds(500));
            const std::string now = beat.ok() ? beat->heldBy : std::string();
            const bool running = beat.ok() && beat->groupRunning;
            if (beat.ok() && now.empty() && !running) return okStatus();
            if (!beat.ok() && beat.error().code == ErrorCode::InvalidArgument) return tokenRefused();
            if (!beat.ok() && beat.error().message.find(kRendezvousNotServed) != std::string::npos) return daemonAddress();
            groupRunning = beat.ok() && running;
            if (beat.ok() && running) {
                // This rank's previous process trained in the group rank 0 still serves: wait
                // until rank 0 notices and serves the next group (its rendezvous goes away first).
                holder.clear();
                heldSince = Clock::time_point::max();
                trouble.reset();
            } else if (beat.ok()) {
                holder = now;
                trouble.reset();
                if (heldSince == Clock::time_point::max()) heldSince = Clock::now();
            } else if (Clock::now() >= nextProbe) {
                std::optional<ConnectTrouble> seen;
                Status reached = m_client->reach(std::chrono::milliseconds(1000), &seen);
                if (reached.ok() || !seen) {
                    trouble.reset();
                } else {
                    const ConnectTrouble found = *seen;
                    if (!trouble || trouble->what != found.what) troubleSince = Clock::now();
                    trouble = found;
                    // A TLS mismatch does not mend by waiting: say so now, not after the timeout.
                    if (found.patienceSeconds == 0 ||
                        (found.patienceSeconds > 0 && Clock::now() - troubleSince >= std::chrono::seconds(found.patienceSeconds)))
                        return unreachable(found);
                }
                nextProbe = Clock::now() + std::chrono::seconds(1);
            }
            if (cancelled()) return makeError(ErrorCode::Cancelled, rankName(m_opt.rank) + ": " + kCancelledWhileJoining);
            const auto t = Clock::now();
            // Held for longer than a dead process's claim lasts: the holder lives, this is a second
            // copy. (A rendezvous that went away meanwhile was the holder's run ending.)
            if (!holder.empty() && t - heldSince >= silence() + std::chrono::seconds(2)) return takenError(holder);
            if (t >= end) return groupRunning ? groupNotRestarted() : holder.empty() ? rendezvousSilent(trouble) : takenError(holder);
            if (m_opt.waiting && holder.empty() && t >= nextReport) {
                const auto left = std::chrono::duration_cast<std::chrono::seconds>(end - t).count();
                m_opt.waiting(rankName(m_opt.rank) + ": waiting for " + rendezvousOwner() + ": " +
                              (groupRunning ? std::string("it still trains the group this task's previous process left, and restarts it once "
                                                          "it notices")
                               : trouble    ? trouble->what
                                            : std::string("no answer yet")) +
                              "; giving up in " + std::to_string(left) + " s");
                nextReport = t + std::chrono::seconds(10);
            }
            if (beat.ok()) std::this_thread::sleep_for(std::min<std::chrono::milliseconds>(m_opt.heartbeat / 4, std::chrono::milliseconds(250)));
            else std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the failed beat waited already
        }
    }

    bool cancelled() const { return m_opt.cancelled && m_opt.cancelled(); }

    // The sockets new since `before` that may be Gloo's: TCP over IP (not a local socket or
    // gRPC's name lookups), minus gRPC's (to or from a service port: the rendezvous, a worker
    // daemon), which may have connected meanwhile.
    std::set<ino_t> glooSocketsSince(const std::map<ino_t, int>& before) const
    {
        std::set<int> services(m_opt.servicePorts.begin(), m_opt.servicePorts.end());
        if (auto rp = HostPort::parse(m_opt.rendezvousAddress); rp.ok()) services.insert(rp->port);
        auto portOf = [](const sockaddr_storage& a) {
            if (a.ss_family == AF_INET) return static_cast<int>(ntohs(reinterpret_cast<const sockaddr_in*>(&a)->sin_port));
            if (a.ss_family == AF_INET6) return static_cast<int>(ntohs(reinterpret_cast<const sockaddr_in6*>(&a)->sin6_port));
            return -1;
        };
        std::set<ino_t> out;
        for (const auto& [ino, fd] : socketInodes()) {
            if (before.count(ino)) continue;
            int type = 0;
            socklen_t tlen = sizeof type;
            if (::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tlen) != 0 || type != SOCK_STREAM) continue;
            sockaddr_storage local{}, peer{};
            socklen_t llen = sizeof local, plen = sizeof peer;
            if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &llen) != 0 || (local.ss_family != AF_INET && local.ss_family != AF_INET6))
                continue;
            const int lp = portOf(local);
            const int pp = ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &plen) == 0 ? portOf(peer) : -1;
            if (services.count(lp) || services.count(pp)) continue;
            out.insert(ino);
        }
        return out;
    }

    // Watches a join from the heartbeat thread. Gloo waits up to five collective timeouts for a
    // pair to connect (150 s by default) and hears nothing from outside meanwhile, so Ctrl-C,
    // another process taking this rank, a peer that gave up its join or died in it, or rank 0
    // going away would wait that out. On any, the reason is kept for connect() to report, the
    // store's waits end (joinAbandoned), and once Gloo's exchange has begun the sockets made
    // since (its listening and connecting pairs) are shut down, which fails Gloo's wait at once.
    // Again on each beat, for pairs Gloo made after the last. `lost`: ranks lost on two beats in
    // a row (one late beat is not a death).
    void guardJoin(const std::vector<int>& lost, std::chrono::milliseconds rendezvousQuiet)
    {
        std::optional<Error> why = stoppedHere();
        bool ours = why && why->code == ErrorCode::Cancelled;  // this rank's own reason, to tell the others (not "taken")
        if (!why) why = troubleElsewhere(lost, rendezvousQuiet, ours);
        std::lock_guard lock(m_joinMutex);
        if (!m_joining) return;
        if (why && !m_joinFailure) {
            m_joinFailure = std::move(why);
            m_joinFailureIsOurs = ours;
        }
        if (m_joinFailure && m_joinBefore) shutdownSockets(glooSocketsSince(*m_joinBefore));
    }

    // Why a join cannot complete, found outside this process: another rank gave its join up (its
    // reason under the abort key), `lost` ranks died or froze, or the rendezvous went quiet.
    // *ours: a reason of this rank's own finding, to tell the others.
    std::optional<Error> troubleElsewhere(const std::vector<int>& lost, std::chrono::milliseconds rendezvousQuiet, bool& ours)
    {
        if (auto peer = m_client->get(m_opt.group + "/abort", std::chrono::milliseconds(0)); peer.ok()) {
            const std::string text = readAbortValue(*peer).why;
            const bool stopped = text.find(kCancelledWhileJoining) != std::string::npos;
            return makeError(stopped ? ErrorCode::Cancelled : ErrorCode::IoError, rankName(m_opt.rank) + ": the cluster did not form: " + text,
                             stopped ? "the join was stopped on that task (Ctrl-C or Stop), so every task ends; start them all again"
                                     : "see that task's error; start every task again once it is fixed");
        }
        if (!lost.empty()) {
            const std::string suspended = suspensionNote();
            ours = suspended.empty();
            return makeError(ErrorCode::IoError,
                             rankName(m_opt.rank) + ": " + suspended + rankList(lost) + " stopped responding while the cluster formed (no heartbeat for " +
                                 std::to_string(silence().count()) + " ms)",
                             suspended.empty() ? "that task died or froze after it started: start it again, then the others (a backup resumes the run)"
                                               : "do not stop a task while the cluster forms; start the tasks again");
        }
        if (m_opt.rank != 0 && rendezvousQuiet > silence())
            return makeError(ErrorCode::IoError,
                             rankName(m_opt.rank) + ": " + suspensionNote() + rendezvousOwner() + " stopped answering while this task joined the cluster (for " +
                                 std::to_string(rendezvousQuiet.count()) + " ms)",
                             "see " + rankName(0) + "'s error; start every task again once it is fixed");
        return std::nullopt;
    }

    // Why this process itself gives a join up: Ctrl-C, or another process holding its rank.
    std::optional<Error> stoppedHere()
    {
        if (cancelled()) return makeError(ErrorCode::Cancelled, rankName(m_opt.rank) + ": " + kCancelledWhileJoining);
        if (const std::string holder = heldBy(); !holder.empty()) return takenError(holder);
        return std::nullopt;
    }

    std::optional<Error> joinFailure()
    {
        std::lock_guard lock(m_joinMutex);
        return m_joinFailure;
    }
    bool joinAbandoned() { return joinFailure().has_value(); }

    std::string waitedText() const { return std::to_string(std::chrono::duration_cast<std::chrono::seconds>(m_opt.timeout).count()) + " s"; }

    // "rank 0 (chief:0 at h0:2222)", and the rendezvous's address when that does not name it.
    std::string rendezvousOwner() const
    {
        const std::string r0 = rankName(0);
        return r0.find(m_opt.rendezvousAddress) == std::string::npos ? r0 + " (its rendezvous at " + m_opt.rendezvousAddress + ")" : r0;
    }

    // Rank 0 (the coordinator) serves the rendezvous: when it does not answer, rank 0 is missing,
    // or unreachable for the reason last seen.
    Error rendezvousSilent(const std::optional<ConnectTrouble>& trouble) const
    {
        const std::string where = rankName(m_opt.rank) + ": the rendezvous at " + m_opt.rendezvousAddress + ", served by " + rankName(0) +
                                  ", did not answer within " + waitedText();
        if (trouble) return makeError(ErrorCode::IoError, where + ": " + trouble->what, trouble->hint);
        return makeError(ErrorCode::IoError, where,
                         "start " + rankName(0) + " (it coordinates the run) with the same TF_CONFIG and token, and check "
                         "that this machine can reach " + m_opt.rendezvousAddress);
    }

    // Rank 0 kept the group this rank's previous process left (it has no --restarts, or never
    // noticed): a new process cannot join it.
    Error groupNotRestarted() const
    {
        return makeError(ErrorCode::IoError,
                         rankName(m_opt.rank) + ": " + rankName(0) + " did not restart the cluster within " + waitedText() +
                             ": it still runs the group that this task's previous process left",
                         "a restarted task rejoins when rank 0 restarts the run from its backup: start every task with the same "
                         "--backup-dir and --restarts; otherwise stop and start all of them");
    }

    // The rendezvous cannot be reached in a way waiting does not mend (a TLS mismatch).
    Error unreachable(const ConnectTrouble& trouble) const
    {
        return makeError(ErrorCode::InvalidArgument,
                         rankName(m_opt.rank) + ": cannot reach " + rendezvousOwner() + ": " +
                             trouble.what,
                         trouble.hint);
    }

    // The rendezvous answered, refusing this task's token (it was "did not answer within 30 s").
    Error tokenRefused() const
    {
        return makeError(ErrorCode::InvalidArgument,
                         rankName(m_opt.rank) + ": the rendezvous at " + m_opt.rendezvousAddress + ", served by " + rankName(0) +
                             ", refused this task's token",
                         "give every task the same shared token (--token-file, or $TRAINSTUDIO_TOKEN); the chief's log names the refused call");
    }

    // rank 0's address is a trainstudio-worker daemon's, which serves only its coordinator's runs.
    Error daemonAddress() const
    {
        return makeError(ErrorCode::InvalidArgument,
                         rankName(m_opt.rank) + ": a trainstudio-worker daemon answers at " + rankName(0) +
                             "'s address; a daemon's rendezvous serves only the runs its coordinator starts, not tasks started with TF_CONFIG",
                         "start every task with TF_CONFIG (each at its own address, not a daemon's), or run on the daemons with "
                         "trainstudio-cli train --cluster FILE naming them");
    }

    Error takenError(const std::string& holder) const
    {
        return makeError(ErrorCode::InvalidArgument,
                         rankName(m_opt.rank) + " is already taken: another process (connected from " + holder +
                             ") joined the cluster as this task and is still running",
                         "the task was started twice (the same TF_CONFIG task or --task); stop the extra copy, or give each "
                         "process its own task");
    }

    std::string heldBy()
    {
        std::lock_guard lock(m_heldByMutex);
        return m_heldBy;
    }

    void stopHeartbeat()
    {
        {
            std::lock_guard lock(m_hbMutex);
            m_stopHeartbeat = true;
        }
        m_hbCv.notify_all();
        if (m_heartbeat.joinable()) m_heartbeat.join();
        std::lock_guard lock(m_hbMutex);
        m_stopHeartbeat = false;
    }

    void startHeartbeat()
    {
        m_heartbeat = std::thread([this] {
            std::unique_lock lock(m_hbMutex);
            auto answered = std::chrono::steady_clock::now();
            int lostStreak = 0;  // beats in a row that reported lost ranks
            auto nextJoinReport = m_joinStart + std::chrono::seconds(3);
            auto markAwake = [this] {
                m_lastWakeMs = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
            };
            markAwake();
            while (!m_stopHeartbeat) {
                lock.unlock();
                auto silent = m_client->heartbeat(m_opt.group, m_opt.rank, m_opt.size, silence(), m_instance);
                lostStreak = silent.ok() && !silent->lost.empty() ? lostStreak + 1 : 0;
                const auto now = std::chrono::steady_clock::now();
                if (!m_connected && silent.ok() && !silent->heldBy.empty()) {
                    std::lock_guard held(m_heldByMutex);
                    m_heldBy = silent->heldBy;
                }
                if (silent.ok()) answered = now;
                if (m_joining)
                    guardJoin(lostStreak >= 2 ? silent->lost : std::vector<int>{}, std::chrono::duration_cast<std::chrono::milliseconds>(now - answered));
                if (m_joining && m_opt.waiting && silent.ok() && !silent->silent.empty() && now >= nextJoinReport) {
                    // Ranks that never beat were not started yet (or cannot reach the rendezvous):
                    // say who is awaited, as a task waiting for its chief does.
                    const auto left = std::chrono::duration_cast<std::chrono::seconds>(m_opt.timeout - (now - m_joinStart)).count();
                    m_opt.waiting(rankName(m_opt.rank) + ": waiting for " + rankList(silent->silent) + " to join the cluster; giving up in " +
                                  std::to_string(std::max<long long>(left, 0)) + " s");
                    nextJoinReport = now + std::chrono::seconds(10);
                }
                // Once connected every rank has beaten, so silence means a dead or cut-off
                // peer: fail now rather than at the transfer timeout. (A dead peer's closed
                // sockets usually fail the transfer even sooner.)
                if (m_connected && silent.ok() && !silent->silent.empty()) watchdog(silent->silent);
                // The rendezvous lives in rank 0's process: when it stops answering (rank 0
                // frozen, or its machine cut off) nobody can report rank 0 silent, so say it here.
                // Answered, but by a new rendezvous (pinned: RendezvousClient::pin): rank 0 started
                // the run again, and this group is over.
                if (m_connected && !silent.ok() && silent.error().message.find(kRendezvousRestarted) != std::string::npos)
                    watchdog({0}, "it restarted the run: its rendezvous at " + m_opt.rendezvousAddress + " is a new one");
                else if (m_connected && !silent.ok() && m_opt.rank != 0 && now - answered > silence())
                    watchdog({0}, "its rendezvous service at " + m_opt.rendezvousAddress + " has not answered for " +
                                      std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(now - answered).count()) + " ms");
                lock.lock();
                const auto asleep = std::chrono::steady_clock::now();
                m_hbCv.wait_for(lock, m_opt.heartbeat, [&] { return m_stopHeartbeat; });
                const auto overshoot = std::chrono::steady_clock::now() - asleep - m_opt.heartbeat;
                markAwake();
                if (overshoot > 2 * m_opt.heartbeat) {
                    m_suspendedMs = std::chrono::duration_cast<std::chrono::milliseconds>(overshoot).count();
                    m_suspensionSeenMs = m_lastWakeMs.load();
                }
            }
        });
    }

    GlooOptions m_opt;
    std::unique_ptr<RendezvousClient> m_client;
    std::shared_ptr<gloo::transport::Device> m_device;
    std::shared_ptr<gloo::rendezvous::Context> m_context;
    std::map<int64_t, AllreduceSlot> m_allreduce;
    std::map<std::pair<const float*, int64_t>, Segments> m_registered;  // bound to the caller's memory
    int64_t m_maxChunkBytes = 128 * 1024;  // agreed by every rank in connect()
    std::map<std::pair<int, std::size_t>, BroadcastSlot> m_broadcast;
    std::unique_ptr<gloo::BarrierAllToAll> m_barrier;

    std::mutex m_abortMutex;
    bool m_aborted = false;
    std::string m_reason;
    std::optional<Error> m_failed;
    std::atomic<bool> m_connected{false};
    std::set<ino_t> m_meshSockets;  // written before m_connected is set, read-only after

    std::mutex m_joinMutex;
    std::atomic<bool> m_joining{false};  // from the claim to the mesh's end (connected or not)
    std::chrono::steady_clock::time_point m_joinStart;  // set before the heartbeat thread starts
    std::optional<std::map<ino_t, int>> m_joinBefore;  // the process's sockets when Gloo's exchange began
    std::optional<Error> m_joinFailure;  // why the heartbeat gave the join up
    bool m_joinFailureIsOurs = false;    // and whether to tell the others (not read from them)

    std::thread m_heartbeat;
    const std::string m_instance = randomId();  // this join's claim on its rank
    std::mutex m_heldByMutex;
    std::string m_heldBy;  // set by the heartbeat: another live process holds this rank
    std::mutex m_hbMutex;
    std::condition_variable m_hbCv;
    bool m_stopHeartbeat = false;
    std::atomic<int64_t> m_lastWakeMs{0};    // steady clock, when the heartbeat thread last ran
    std::atomic<int64_t> m_suspendedMs{0};       // how long this process was last seen not running
    std::atomic<int64_t> m_suspensionSeenMs{0};  // steady clock, when that was noticed
};

} // namespace

Result<std::unique_ptr<Communicator>> makeGlooCommunicator(const GlooOptions& options)
{
    if (options.size < 1 || options.rank < 0 || options.rank >= options.size)
        return makeError(ErrorCode::InvalidArgument, "Gloo rank " + std::to_string(options.rank) + " is not in 0.." + std::to_string(options.size - 1));
    if (options.rendezvousAddress.empty())
        return makeError(ErrorCode::InvalidArgument, "no rendezvous address for the Gloo communicator", "the coordinator's host:port is needed");
    if (options.group.empty())
        return makeError(ErrorCode::InvalidArgument, "no rendezvous group for the Gloo communicator", "use the run id, unique per attempt");
    // Gloo's TCP transport writes with writev(), which raises SIGPIPE once a peer has gone; its
    // default action would kill this process instead of failing the transfer with an error that
    // names the peer. Ignore it, unless the program chose its own handling.
    struct sigaction current {};
    if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) std::signal(SIGPIPE, SIG_IGN);
    auto comm = std::make_unique<GlooCommunicator>(options);
    TS_TRY(comm->connect());
    return std::unique_ptr<Communicator>(std::move(comm));
}

} // namespace ts::remote
