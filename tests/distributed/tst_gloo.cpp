// The collective layer across processes: the rendezvous key-value service (token, bounds,
// timeouts), the Gloo communicator with ranks as threads (sums, broadcast, barrier, abort, a
// peer that goes away) and with two real processes on loopback (sums, kill -9 of a peer).

#include <QtTest>

#include <csignal>
#include <cstring>
#include <unistd.h>
#include <cstdlib>
#include <future>
#include <mutex>
#include <thread>

#include <algorithm>
#include <atomic>

#include "distribute/agreement.h"
#include "distributed/loopback_listener.h"
#include "remote/gloo_communicator.h"
#include "remote/rendezvous.h"

using namespace ts;
using namespace ts::remote;
using namespace std::chrono_literals;

namespace {

const std::string kToken = "test-token-1234";

std::unique_ptr<RendezvousServer> startServer()
{
    RendezvousServer::Options o;
    o.token = kToken;
    o.maxValueBytes = 64 * 1024;
    auto s = RendezvousServer::start(o);
    if (!s.ok()) qFatal("%s", s.error().toString().c_str());
    return std::move(s).value();
}

// A rendezvous serving TLS with the fixture's certificate (server.crt, for 127.0.0.1 and localhost).
std::unique_ptr<RendezvousServer> startTlsServer()
{
    const std::string dir = std::string(TS_FIXTURES_DIR) + "/tls/";
    RendezvousServer::Options o;
    o.token = kToken;
    o.tls.certificate = dir + "server.crt";
    o.tls.privateKey = dir + "server.key";
    auto s = RendezvousServer::start(o);
    if (!s.ok()) qFatal("%s", s.error().toString().c_str());
    return std::move(s).value();
}

GlooOptions options(int port, int rank, int size, const std::string& group, std::chrono::milliseconds timeout = 20s)
{
    GlooOptions o;
    o.rank = rank;
    o.size = size;
    o.rendezvousAddress = "127.0.0.1:" + std::to_string(port);
    o.token = kToken;
    o.group = group;
    for (int r = 0; r < size; ++r) o.rankNames.push_back("worker:" + std::to_string(r));
    o.timeout = timeout;
    o.heartbeat = 200ms;
    return o;
}

// Makes `size` communicators concurrently (rendezvous needs every rank at once).
std::vector<std::unique_ptr<Communicator>> makeRanks(int port, int size, const std::string& group,
                                                     std::chrono::milliseconds timeout = 20s, int64_t maxChunkBytes = 0, bool asyncPairs = false)
{
    std::vector<std::future<Result<std::unique_ptr<Communicator>>>> fs;
    for (int r = 0; r < size; ++r)
        fs.push_back(std::async(std::launch::async, [=] {
            GlooOptions o = options(port, r, size, group, timeout);
            o.maxChunkBytes = maxChunkBytes;
            o.asyncPairs = asyncPairs;
            return makeGlooCommunicator(o);
        }));
    std::vector<std::unique_ptr<Communicator>> out;
    for (auto& f : fs) {
        auto c = f.get();
        if (!c.ok()) qFatal("%s", c.error().toString().c_str());
        out.push_back(std::move(c).value());
    }
    return out;
}

// Runs fn(rank) on one thread per rank and returns each rank's status.
std::vector<Status> onRanks(int size, const std::function<Status(int)>& fn)
{
    std::vector<std::future<Status>> fs;
    for (int r = 0; r < size; ++r) fs.push_back(std::async(std::launch::async, fn, r));
    std::vector<Status> out;
    for (auto& f : fs) out.push_back(f.get());
    return out;
}

// The value rank r contributes at element i: small integers, so float sums are exact.
float contribution(int r, int64_t i) { return static_cast<float>((i % 97) * (r + 1) - r); }

// Child process mode: TS_GLOO_PEER_RANK set. Joins the parent's rendezvous, all-reduces, prints
// a checksum; with TS_GLOO_PEER_DIE the rank SIGKILLs itself after the first all-reduce.
int runPeer()
{
    const int rank = std::atoi(std::getenv("TS_GLOO_PEER_RANK"));
    const int size = std::atoi(std::getenv("TS_GLOO_PEER_SIZE"));
    const int port = std::atoi(std::getenv("TS_GLOO_PEER_PORT"));
    const std::string group = std::getenv("TS_GLOO_PEER_GROUP");
    const int die = std::getenv("TS_GLOO_PEER_DIE") ? std::atoi(std::getenv("TS_GLOO_PEER_DIE")) : -1;
    auto comm = makeGlooCommunicator(options(port, rank, size, group));
    if (!comm.ok()) {
        std::fprintf(stderr, "peer %d: %s\n", rank, comm.error().toString().c_str());
        return 2;
    }
    const int64_t n = 1 << 20;
    Tensor t = Tensor::empty({n});
    for (int step = 0; step < 5; ++step) {
        for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = contribution(rank, i);
        if (step == 1 && rank == die) ::raise(SIGKILL);
        const auto t0 = std::chrono::steady_clock::now();
        Status st = (*comm)->allReduceSum(rank, t);
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (!st.ok()) {
            std::printf("FAILED after %.3f s: %s\n", secs, st.error().message.c_str());
            return 3;
        }
        double sum = 0;
        for (int64_t i = 0; i < n; ++i) sum += t.data<float>()[i];
        std::printf("step %d checksum %.1f\n", step, sum);
    }
    std::fflush(stdout);
    return 0;
}

} // namespace

class TestGloo : public QObject {
    Q_OBJECT
private slots:
    void initTestCase()
    {
        // Again here: Qt Test installs its crash handler for SIGPIPE when it starts running.
        std::signal(SIGPIPE, SIG_IGN);
    }
    void rendezvousNeedsToken();
    void rendezvousBounds();
    void threadsAllReduceBroadcastBarrier();
    void largeAllReduceDoesNotDeadlock();
    void twoRanksAnySizeAndSegments_data();
    void twoRanksAnySizeAndSegments();
    void registeredBufferReducesInPlace();
    void rendezvousOverTls();
    void abortUnblocksPeers();
    void abortReleasesOwnPendingCall();
    void victimsAbortKeepsTheCause();
    void idleGroupsAreForgotten();
    void peerLostWhileJoiningIsNamed();
    void cancelWhileConnectingEndsPromptly();
    void peerCancelledWhileJoiningIsSaid();
    void restartedRendezvousRefusesOldGroup();
    void vanishedPeerIsNamed();
    void badOptions();
    void settingsMustAgree();
    void absentRanksAreNamed();
    void portInUseIsRefused();
    void connectTroubleIsNamed_data();
    void connectTroubleIsNamed();
    void unreachableRendezvousIsExplained();
    void silentPeerIsNoAnswerInTime();
    void twoProcessLoopback();
    void killedProcessIsDetected();
};

void TestGloo::rendezvousNeedsToken()
{
    auto server = startServer();
    const std::string addr = "127.0.0.1:" + std::to_string(server->port());
    auto wrong = RendezvousClient::connect(addr, "not-the-token");
    QVERIFY(wrong.ok());
    Status st = (*wrong)->set("k", {'v'});
    QVERIFY(!st.ok());
    QVERIFY2(st.error().message.find("rendezvous at " + addr) != std::string::npos, st.error().message.c_str());
    QVERIFY2(st.error().message.find("token") != std::string::npos, st.error().message.c_str());
    auto empty = RendezvousClient::connect(addr, "");
    QVERIFY(!(*empty)->get("k", 10ms).ok());

    auto good = RendezvousClient::connect(addr, kToken);
    QVERIFY((*good)->set("k", {'v', '1'}).ok());
    auto v = (*good)->get("k", 100ms);
    QVERIFY(v.ok());
    QCOMPARE(std::string(v->begin(), v->end()), std::string("v1"));
    // The refused set left nothing behind.
    QVERIFY(!(*good)->get("never", 50ms).ok());
    QVERIFY(!RendezvousServer::start({}).ok());  // no token: refused to start
}

void TestGloo::rendezvousBounds()
{
    auto server = startServer();
    const std::string addr = "127.0.0.1:" + std::to_string(server->port());
    auto c = std::move(RendezvousClient::connect(addr, kToken)).value();
    // A missing key times out with an error naming it, instead of hanging.
    const auto t0 = std::chrono::steady_clock::now();
    auto missing = c->get("absent-key", 300ms);
    QVERIFY(!missing.ok());
    QVERIFY(std::chrono::steady_clock::now() - t0 < 3s);
    QVERIFY2(missing.error().message.find("absent-key") != std::string::npos, missing.error().message.c_str());
    // Oversized values and keys are refused.
    Status big = c->set("big", std::vector<char>(64 * 1024 + 1, 'x'));
    QVERIFY(!big.ok());
    QVERIFY2(big.error().message.find("over 65536 bytes") != std::string::npos, big.error().message.c_str());
    QVERIFY(!c->set(std::string(2000, 'k'), {'v'}).ok());
    QVERIFY(!c->set("", {'v'}).ok());
    // A message larger than gRPC's bound never reaches the service.
    QVERIFY(!c->set("huge", std::vector<char>(4 << 20, 'x')).ok());
    // Wait returns once a key set by someone else appears.
    auto other = std::move(RendezvousClient::connect(addr, kToken)).value();
    std::thread setter([&] {
        std::this_thread::sleep_for(100ms);
        (void)other->set("late", {'1'});
    });
    QVERIFY(c->wait({"late"}, 5s).ok());
    setter.join();
    // Heartbeats: a rank that never beat is silent once `silence` has passed.
    auto silent = c->heartbeat("g", 0, 2, 100ms);
    QVERIFY(silent.ok());
    QVERIFY(silent->silent.empty());
    std::this_thread::sleep_for(150ms);
    silent = c->heartbeat("g", 0, 2, 100ms);
    QCOMPARE(silent->silent, std::vector<int>{1});
    // Lost ranks: claimed, then quiet, once every rank has claimed. Before that a quiet rank is
    // only silent (a restarted process may still take it over), as is one that never beat.
    QVERIFY(c->heartbeat("lost", 0, 3, 300ms, "r0").ok() && c->heartbeat("lost", 1, 3, 300ms, "r1").ok());
    std::this_thread::sleep_for(400ms);
    silent = c->heartbeat("lost", 0, 3, 300ms, "r0");
    QCOMPARE(silent->silent, (std::vector<int>{1, 2}));
    QVERIFY(silent->lost.empty());
    QVERIFY(c->heartbeat("lost", 2, 3, 300ms, "r2").ok());  // formed
    silent = c->heartbeat("lost", 0, 3, 300ms, "r0");
    QCOMPARE(silent->silent, std::vector<int>{1});
    QCOMPARE(silent->lost, std::vector<int>{1});
    // Claims: before a group forms, a rank whose holder went silent passes to a new process (one
    // that crashed while joining, started again); once every rank joined, its replacement is told
    // the group is running (it waits for rank 0's next group) and does not take the rank over.
    // Whether `instance` now holds `rank` of "claims"; "held" or "running" when not, and why.
    auto claim = [&](int rank, const std::string& instance) -> std::string {
        auto b = c->heartbeat("claims", rank, 2, 100ms, instance);
        if (!b.ok()) return b.error().toString();
        return !b->heldBy.empty() ? "held" : b->groupRunning ? "running" : "claimed";
    };
    QCOMPARE(claim(0, "a"), std::string("claimed"));
    QCOMPARE(claim(0, "b"), std::string("held"));  // "a" still beats: a task started twice
    std::this_thread::sleep_for(150ms);
    QCOMPARE(claim(0, "b"), std::string("claimed"));  // "a" lapsed
    QCOMPARE(claim(1, "c"), std::string("claimed"));  // formed
    std::this_thread::sleep_for(150ms);
    QCOMPARE(claim(1, "d"), std::string("running"));
    QCOMPARE(claim(1, "c"), std::string("claimed"));  // its holder may return
    QVERIFY(!c->heartbeat("g", 2, 2, 100ms).ok());
}

void TestGloo::threadsAllReduceBroadcastBarrier()
{
    auto server = startServer();
    const int size = 3;
    auto ranks = makeRanks(server->port(), size, "threads");
    QCOMPARE(ranks[0]->size(), size);
    QCOMPARE(ranks[0]->name(), std::string("gloo"));
    std::vector<std::vector<float>> results(size);
    auto st = onRanks(size, [&](int r) -> Status {
        // Two sizes, each twice (the cached algorithm is reused), odd sizes that do not split evenly.
        for (int64_t n : {int64_t{7}, int64_t{100003}, int64_t{7}, int64_t{100003}}) {
            Tensor t = Tensor::empty({n});
            for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = contribution(r, i);
            TS_TRY(ranks[static_cast<std::size_t>(r)]->allReduceSum(r, t));
            for (int64_t i = 0; i < n; ++i) {
                float expect = 0;
                for (int q = 0; q < size; ++q) expect += contribution(q, i);
                if (t.data<float>()[i] != expect) return makeError(ErrorCode::Internal, "rank " + std::to_string(r) + " element " + std::to_string(i) + " wrong");
            }
            if (n == 100003) results[static_cast<std::size_t>(r)].assign(t.data<float>(), t.data<float>() + n);
        }
        Tensor b = Tensor::fromVector({4}, {float(r), float(r), float(r), float(r)});
        TS_TRY(ranks[static_cast<std::size_t>(r)]->broadcast(r, 1, b));
        for (int i = 0; i < 4; ++i)
            if (b.data<float>()[i] != 1.f) return makeError(ErrorCode::Internal, "broadcast from rank 1 not received by rank " + std::to_string(r));
        TS_TRY(ranks[static_cast<std::size_t>(r)]->barrier(r));
        return okStatus();
    });
    for (const Status& s : st) QVERIFY2(s.ok(), s.ok() ? "" : s.error().toString().c_str());
    QCOMPARE(results[1], results[0]);
    QCOMPARE(results[2], results[0]);
    // A rank may only call as itself.
    Tensor t = Tensor::zeros({3});
    QVERIFY(!ranks[0]->allReduceSum(1, t).ok());
}

// Synchronous pairs block in write() until the kernel takes the bytes, and the ring's first
// step has both ranks send half the tensor before reading: unsegmented, a 96 MB all-reduce
// exceeds the socket buffers (wmem_max + an autotuned window, at most 36 MB on this VM) and both
// ranks wait for the transfer timeout.
void TestGloo::largeAllReduceDoesNotDeadlock()
{
    auto server = startServer();
    const int size = 2;
    auto ranks = makeRanks(server->port(), size, "large", 5s);
    const int64_t n = int64_t{24} << 20;
    auto st = onRanks(size, [&](int r) -> Status {
        Tensor t = Tensor::empty({n});
        for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = contribution(r, i);
        TS_TRY(ranks[static_cast<std::size_t>(r)]->allReduceSum(r, t));
        for (int64_t i = 0; i < n; ++i)
            if (t.data<float>()[i] != contribution(0, i) + contribution(1, i))
                return makeError(ErrorCode::Internal, "rank " + std::to_string(r) + " element " + std::to_string(i) + " wrong");
        return okStatus();
    });
    for (const Status& s : st) QVERIFY2(s.ok(), s.ok() ? "" : s.error().toString().c_str());
}

// Two ranks exchange halves of each segment: sizes that do not halve evenly, one element (no
// halves: Gloo's ring), a last segment of one element, many small segments, tensors of
// different sizes in turn and a registered buffer; every result exact and alike on both ranks.
void TestGloo::twoRanksAnySizeAndSegments_data()
{
    QTest::addColumn<bool>("async");
    QTest::newRow("synchronous pairs") << false;
    // Gloo's event loop writes the second message straight into the tensor as it arrives.
    QTest::newRow("asynchronous pairs") << true;
}

void TestGloo::twoRanksAnySizeAndSegments()
{
    QFETCH(bool, async);
    auto server = startServer();
    const int size = 2;
    auto ranks = makeRanks(server->port(), size, "halves", 20s, 4096, async);  // segments of 4096 floats
    std::vector<std::vector<float>> results(size);
    auto st = onRanks(size, [&](int r) -> Status {
        Communicator& c = *ranks[static_cast<std::size_t>(r)];
        auto check = [&](Tensor& t, float extra, const char* what) -> Status {
            const int64_t n = t.numel();
            for (int64_t i = 0; i < n; ++i)
                if (t.data<float>()[i] != contribution(0, i) + contribution(1, i) + 2.f * extra)
                    return makeError(ErrorCode::Internal, std::string(what) + ": rank " + std::to_string(r) + " element " + std::to_string(i) +
                                                              " of " + std::to_string(n) + " wrong");
            return okStatus();
        };
        Tensor reg = Tensor::empty({int64_t{3} * 4096 + 5});
        TS_TRY(c.registerBuffer(r, reg));
        for (int round = 0; round < 2; ++round) {
            for (int64_t n : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{7}, int64_t{4096}, int64_t{4097}, int64_t{100003}}) {
                Tensor t = Tensor::empty({n});
                for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = contribution(r, i) + static_cast<float>(round);
                TS_TRY(c.allReduceSum(r, t));
                TS_TRY(check(t, static_cast<float>(round), "staged"));
                if (n == 100003) results[static_cast<std::size_t>(r)].assign(t.data<float>(), t.data<float>() + n);
                for (int64_t i = 0; i < reg.numel(); ++i) reg.data<float>()[i] = contribution(r, i) + static_cast<float>(n % 5);
                TS_TRY(c.allReduceSum(r, reg));
                TS_TRY(check(reg, static_cast<float>(n % 5), "registered"));
            }
        }
        return okStatus();
    });
    for (const Status& s : st) QVERIFY2(s.ok(), s.ok() ? "" : s.error().toString().c_str());
    QCOMPARE(results[1], results[0]);
}

// A registered buffer is reduced where it is, over several segments and calls; other tensors of
// the same size still go through staging; after release the memory is no longer bound.
void TestGloo::registeredBufferReducesInPlace()
{
    auto server = startServer();
    const int size = 2;
    auto ranks = makeRanks(server->port(), size, "registered");
    const int64_t n = int64_t{3} << 20;  // several segments on any machine
    auto st = onRanks(size, [&](int r) -> Status {
        Communicator& c = *ranks[static_cast<std::size_t>(r)];
        Tensor mine = Tensor::empty({n});
        TS_TRY(c.registerBuffer(r, mine));
        for (int round = 0; round < 3; ++round) {
            for (int64_t i = 0; i < n; ++i) mine.data<float>()[i] = contribution(r, i) + static_cast<float>(round);
            TS_TRY(c.allReduceSum(r, mine));
            for (int64_t i = 0; i < n; ++i)
                if (mine.data<float>()[i] != contribution(0, i) + contribution(1, i) + 2.f * static_cast<float>(round))
                    return makeError(ErrorCode::Internal, "registered: rank " + std::to_string(r) + " element " + std::to_string(i) + " wrong");
            // A different tensor of the same size, in between: the staging path.
            Tensor other = Tensor::empty({n});
            for (int64_t i = 0; i < n; ++i) other.data<float>()[i] = static_cast<float>(r + 1);
            TS_TRY(c.allReduceSum(r, other));
            if (other.data<float>()[n - 1] != 3.f) return makeError(ErrorCode::Internal, "staging: rank " + std::to_string(r) + " wrong");
        }
        c.releaseBuffer(r, mine);
        mine.fill(static_cast<float>(r));
        TS_TRY(c.allReduceSum(r, mine));  // now staged like any tensor
        if (mine.data<float>()[0] != 1.f) return makeError(ErrorCode::Internal, "after release: rank " + std::to_string(r) + " wrong");
        return okStatus();
    });
    for (const Status& s : st) QVERIFY2(s.ok(), s.ok() ? "" : s.error().toString().c_str());
}

void TestGloo::rendezvousOverTls()
{
    const std::string dir = std::string(TS_FIXTURES_DIR) + "/tls/";
    auto server = startTlsServer();
    const std::string addr = "127.0.0.1:" + std::to_string(server->port());
    TlsFiles ca;
    ca.rootCa = dir + "server.crt";
    auto secure = std::move(RendezvousClient::connect(addr, kToken, ca)).value();
    QVERIFY(secure->set("k", {'t'}).ok());
    auto v = secure->get("k", 1s);
    QVERIFY(v.ok());
    QCOMPARE(v->size(), std::size_t{1});
    // A plaintext client gets nowhere.
    auto plain = std::move(RendezvousClient::connect(addr, kToken)).value();
    QVERIFY(!plain->set("k2", {'p'}, 2s).ok());
    // A Gloo group meets through the TLS rendezvous.
    std::vector<std::future<Result<std::unique_ptr<Communicator>>>> fs;
    for (int r = 0; r < 2; ++r)
        fs.push_back(std::async(std::launch::async, [&, r] {
            GlooOptions g = options(server->port(), r, 2, "tls");
            g.tls = ca;
            return makeGlooCommunicator(g);
        }));
    std::vector<std::unique_ptr<Communicator>> ranks;
    for (auto& f : fs) {
        auto c = f.get();
        QVERIFY2(c.ok(), c.ok() ? "" : c.error().toString().c_str());
        ranks.push_back(std::move(c).value());
    }
    auto st = onRanks(2, [&](int r) -> Status {
        Tensor t = Tensor::fromVector({2}, {float(r + 1), 1.f});
        TS_TRY(ranks[static_cast<std::size_t>(r)]->allReduceSum(r, t));
        if (t.data<float>()[0] != 3.f || t.data<float>()[1] != 2.f) return makeError(ErrorCode::Internal, "wrong sum");
        return okStatus();
    });
    for (const Status& s : st) QVERIFY2(s.ok(), s.ok() ? "" : s.error().toString().c_str());
}

void TestGloo::abortUnblocksPeers()
{
    auto server = startServer();
    auto ranks = makeRanks(server->port(), 2, "abort");
    auto pending = std::async(std::launch::async, [&] {
        Tensor t = Tensor::zeros({1000});
        const auto t0 = std::chrono::steady_clock::now();
        Status st = ranks[0]->allReduceSum(0, t);
        return std::make_pair(std::move(st), std::chrono::steady_clock::now() - t0);
    });
    std::this_thread::sleep_for(200ms);
    ranks[1]->abort(makeError(ErrorCode::OutOfMemory, "replica cpu:0 ran out of memory"));  // rank 1 fails before its all-reduce
    auto [st, took] = pending.get();
    QVERIFY(!st.ok());
    QVERIFY2(took < 5s, "the pending all-reduce returned promptly");
    QVERIFY2(st.error().message.find("rank 1 (worker:1): replica cpu:0 ran out of memory") != std::string::npos, st.error().message.c_str());
    // The cause's kind reaches the peer: no restart for what would fail again.
    QCOMPARE(st.error().code, ErrorCode::OutOfMemory);
    // Later calls on both ranks fail at once.
    Tensor t = Tensor::zeros({10});
    QVERIFY(!ranks[0]->allReduceSum(0, t).ok());
    Status later = ranks[1]->barrier(1);
    QVERIFY(!later.ok());
    QCOMPARE(later.error().code, ErrorCode::Cancelled);
}

// Rank 0 is cancelled; rank 1's all-reduce fails because of it, and rank 1 aborts in turn (as
// Strategy::runAll does) with a reason that quotes rank 0's. Rank 2, arriving last, must still
// read rank 0's cancellation (Cancelled: the run is not restarted), not rank 1's failure.
void TestGloo::victimsAbortKeepsTheCause()
{
    auto server = startServer();
    auto ranks = makeRanks(server->port(), 3, "victim");
    ranks[0]->abort(Communicator::cancelledCause());
    Tensor t = Tensor::zeros({1000});
    Status first = ranks[1]->allReduceSum(1, t);
    QVERIFY(!first.ok());
    QCOMPARE(first.error().code, ErrorCode::Cancelled);
    ranks[1]->abort(makeError(first.error().code, "cpu:0: " + first.error().message));
    Status last = ranks[2]->allReduceSum(2, t);
    QVERIFY(!last.ok());
    QVERIFY2(last.error().code == ErrorCode::Cancelled, last.error().toString().c_str());
    QVERIFY2(last.error().message.find("rank 0 (worker:0): the run was cancelled") != std::string::npos, last.error().message.c_str());
}

// Rank 0 restarts the run: a new rendezvous at the same address, with the same group name. The
// old group's communicators, still alive until their processes get to it, must not claim ranks
// in it with their heartbeats (a new process for that rank was then refused as "held") nor leave
// their abort reason there for the next attempt's errors to quote.
void TestGloo::restartedRendezvousRefusesOldGroup()
{
    auto server = startServer();
    const std::string address = "127.0.0.1:" + std::to_string(server->port());
    auto ranks = makeRanks(server->port(), 2, "train");
    server.reset();
    RendezvousServer::Options o;
    o.token = kToken;
    o.bindAddress = address;
    auto again = RendezvousServer::start(o);
    QVERIFY2(again.ok(), again.ok() ? "" : again.error().toString().c_str());
    std::this_thread::sleep_for(1s);  // five of the old ranks' heartbeat periods
    ranks[0]->abort(makeError(ErrorCode::IoError, "an old attempt's reason"));
    auto fresh = RendezvousClient::connect(address, kToken);
    QVERIFY(fresh.ok());
    auto beat = (*fresh)->heartbeat("train", 1, 2, 10s, "a-new-process");
    QVERIFY2(beat.ok(), beat.ok() ? "" : beat.error().toString().c_str());
    QVERIFY2(beat->heldBy.empty() && !beat->groupRunning, ("held by " + beat->heldBy).c_str());
    QVERIFY(!(*fresh)->get("train/abort", 100ms).ok());
    // A client that joined the new one is served as before.
    QVERIFY((*fresh)->set("train/k", {'v'}).ok());
    (*fresh)->pin();
    QVERIFY((*fresh)->get("train/k", 100ms).ok());
}

// A server that outlives its runs (a trainstudio-worker) forgets groups nobody beats for any more,
// with their keys, and keys under no group untouched as long; a group still beating keeps its keys
// however old they are.
void TestGloo::idleGroupsAreForgotten()
{
    RendezvousServer::Options o;
    o.token = kToken;
    o.idleExpiry = 1s;
    auto server = std::move(RendezvousServer::start(o)).value();
    auto c = std::move(RendezvousClient::connect("127.0.0.1:" + std::to_string(server->port()), kToken)).value();
    QVERIFY(c->heartbeat("run-1", 0, 2, 10s, "a").ok());
    QVERIFY(c->heartbeat("run-1", 1, 2, 10s, "b").ok());  // formed
    QVERIFY(c->set("run-1/0", {'x'}).ok());
    QVERIFY(c->set("loose", {'y'}).ok());
    QVERIFY(c->heartbeat("run-2", 0, 1, 10s, "c").ok());
    QVERIFY(c->set("run-2/0", {'z'}).ok());
    QVERIFY(c->set("run-2-other/0", {'w'}).ok());  // shares a prefix, not the group
    for (int i = 0; i < 16; ++i) {  // 1.6 s: run-2 keeps beating, run-1 has stopped
        std::this_thread::sleep_for(100ms);
        QVERIFY(c->heartbeat("run-2", 0, 1, 10s, "c").ok());
    }
    QVERIFY(c->set("fresh", {'f'}).ok());  // Set and Heartbeat sweep, every quarter of the expiry at most
    QVERIFY(!c->get("run-1/0", 0ms).ok());
    QVERIFY(!c->get("loose", 0ms).ok());
    QVERIFY(!c->get("run-2-other/0", 0ms).ok());
    QVERIFY(c->get("run-2/0", 0ms).ok());
    QVERIFY(c->get("fresh", 0ms).ok());
    // run-1 is gone with its claims: a new process takes rank 1 as in a new group.
    auto again = c->heartbeat("run-1", 1, 2, 10s, "d");
    QVERIFY(again.ok() && again->heldBy.empty() && !again->groupRunning);
}

namespace {
// A child process of this test (runPeer) joining `group` as rank 1 of 2, stopped (SIGSTOP) once it
// has published its Gloo address and waits for rank 0's: a task that froze while the cluster formed.
struct FrozenPeer {
    std::unique_ptr<QProcess> process;
    ~FrozenPeer()
    {
        if (process && process->state() != QProcess::NotRunning) {
            ::kill(static_cast<pid_t>(process->processId()), SIGKILL);
            process->waitForFinished(5000);
        }
    }
};

Status freezePeerAfterItsAddress(FrozenPeer& peer, RendezvousClient& c, int port, const std::string& group)
{
    peer.process = std::make_unique<QProcess>();
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    env.insert("TS_GLOO_PEER_RANK", "1");
    env.insert("TS_GLOO_PEER_SIZE", "2");
    env.insert("TS_GLOO_PEER_PORT", QString::number(port));
    env.insert("TS_GLOO_PEER_GROUP", QString::fromStdString(group));
    peer.process->setProcessEnvironment(env);
    peer.process->start(QCoreApplication::applicationFilePath(), {});
    // What rank 0 publishes before the pairs' addresses, so that rank 1 goes on to publish its
    // own: its cluster (compared before Gloo's exchange), then its host name under Gloo's key
    // (Debian's Gloo; rank 0 writes the same later, being on this machine).
    const std::string cluster = "[worker:0, worker:1]";
    TS_TRY(c.set(group + "/cluster/0", std::vector<char>(cluster.begin(), cluster.end())));
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    TS_TRY(c.set(group + "/rank_0", std::vector<char>(host, host + std::strlen(host))));
    TS_TRY(c.wait({group + "/1"}, 30s));  // Gloo's key for rank 1's pair addresses
    ::kill(static_cast<pid_t>(peer.process->processId()), SIGSTOP);
    return okStatus();
}
} // namespace

// Gloo waits up to five transfer timeouts for a pair to connect: a peer that froze after it
// published its address (or died) left the others there for 100 s here. The heartbeat names it
// within a few beats instead. (Whether rank 0 listens or connects depends on the ports; either way.)
void TestGloo::peerLostWhileJoiningIsNamed()
{
    auto server = startServer();
    auto c = std::move(RendezvousClient::connect("127.0.0.1:" + std::to_string(server->port()), kToken)).value();
    for (int attempt = 0; attempt < 2; ++attempt) {
        const std::string group = "frozen-" + std::to_string(attempt);
        FrozenPeer peer;
        Status frozen = freezePeerAfterItsAddress(peer, *c, server->port(), group);
        QVERIFY2(frozen.ok(), frozen.ok() ? "" : frozen.error().toString().c_str());
        const auto t0 = std::chrono::steady_clock::now();
        auto joined = makeGlooCommunicator(options(server->port(), 0, 2, group));
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        QVERIFY(!joined.ok());
        QVERIFY2(joined.error().message.find("rank 1 (worker:1) stopped responding while the cluster formed") != std::string::npos,
                 joined.error().toString().c_str());
        QVERIFY2(secs < 8, qPrintable(QString::number(secs)));
    }
}

// Ctrl-C while Gloo connects a pair (past the rendezvous's waits, which always heard it): the join
// ends within a heartbeat, Cancelled, not after Gloo's connect timeout.
void TestGloo::cancelWhileConnectingEndsPromptly()
{
    auto server = startServer();
    auto c = std::move(RendezvousClient::connect("127.0.0.1:" + std::to_string(server->port()), kToken)).value();
    FrozenPeer peer;
    Status frozen = freezePeerAfterItsAddress(peer, *c, server->port(), "cancel-connect");
    QVERIFY2(frozen.ok(), frozen.ok() ? "" : frozen.error().toString().c_str());
    std::atomic<bool> cancel{false};
    GlooOptions o = options(server->port(), 0, 2, "cancel-connect");
    o.heartbeat = 1500ms;  // the frozen peer counts as lost only after 4.5 s
    o.cancelled = [&] { return cancel.load(); };
    auto pending = std::async(std::launch::async, [&] { return makeGlooCommunicator(o); });
    // Rank 0's pair addresses: past the rendezvous's waits, it connects (or listens) to rank 1.
    Status published = c->wait({"cancel-connect/0"}, 30s);
    QVERIFY2(published.ok(), published.ok() ? "" : published.error().toString().c_str());
    std::this_thread::sleep_for(200ms);
    const auto t0 = std::chrono::steady_clock::now();
    cancel = true;
    auto joined = pending.get();
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    QVERIFY(!joined.ok());
    QVERIFY2(joined.error().code == ErrorCode::Cancelled, joined.error().toString().c_str());
    QVERIFY2(secs < 3.5, qPrintable(QString::number(secs)));
}

// A rank that gives its join up (here Ctrl-C while rank 2 has not come) says why under the
// group's abort key: rank 0 ends at once with that reason, Cancelled (the run was stopped on
// purpose), instead of waiting out the timeout and naming rank 1 among the absent.
void TestGloo::peerCancelledWhileJoiningIsSaid()
{
    auto server = startServer();
    std::atomic<bool> cancel{false};
    GlooOptions one = options(server->port(), 1, 3, "peer-cancel");
    one.cancelled = [&] { return cancel.load(); };
    auto zero = std::async(std::launch::async, [&] { return makeGlooCommunicator(options(server->port(), 0, 3, "peer-cancel")); });
    auto first = std::async(std::launch::async, [&] { return makeGlooCommunicator(one); });
    std::this_thread::sleep_for(500ms);
    const auto t0 = std::chrono::steady_clock::now();
    cancel = true;
    auto r1 = first.get();
    QVERIFY(!r1.ok());
    QCOMPARE(r1.error().code, ErrorCode::Cancelled);
    auto r0 = zero.get();
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    QVERIFY(!r0.ok());
    QVERIFY2(r0.error().code == ErrorCode::Cancelled, r0.error().toString().c_str());
    QVERIFY2(r0.error().message.find("the cluster did not form: rank 1 (worker:1): cancelled while waiting") != std::string::npos,
             r0.error().message.c_str());
    QVERIFY2(secs < 3, qPrintable(QString::number(secs)));
}

void TestGloo::abortReleasesOwnPendingCall()
{
    // The run is cancelled on rank 0 while rank 0 itself waits in an all-reduce (rank 1 has not
    // arrived): the wait ends at once, not at the 20 s transfer timeout, and rank 1 learns why.
    auto server = startServer();
    auto ranks = makeRanks(server->port(), 2, "self-abort");
    auto pending = std::async(std::launch::async, [&] {
        Tensor t = Tensor::zeros({100000});
        const auto t0 = std::chrono::steady_clock::now();
        Status st = ranks[0]->allReduceSum(0, t);
        return std::make_pair(std::move(st), std::chrono::steady_clock::now() - t0);
    });
    std::this_thread::sleep_for(200ms);
    ranks[0]->abort(Communicator::cancelledCause());
    auto [st, took] = pending.get();
    QVERIFY(!st.ok());
    QCOMPARE(st.error().code, ErrorCode::Cancelled);
    QVERIFY2(took < 3s, "released promptly");
    Tensor t = Tensor::zeros({100000});
    const auto t0 = std::chrono::steady_clock::now();
    Status peer = ranks[1]->allReduceSum(1, t);
    QVERIFY(!peer.ok());
    QVERIFY(std::chrono::steady_clock::now() - t0 < 10s);
    QVERIFY2(peer.error().message.find("rank 0 (worker:0): the run was cancelled") != std::string::npos, peer.error().message.c_str());
}

void TestGloo::vanishedPeerIsNamed()
{
    auto server = startServer();
    auto ranks = makeRanks(server->port(), 3, "vanish");
    // Rank 2 goes away (its sockets close and its heartbeats stop) while 0 and 1 all-reduce.
    std::vector<std::future<std::pair<Status, std::chrono::steady_clock::duration>>> fs;
    for (int r = 0; r < 2; ++r)
        fs.push_back(std::async(std::launch::async, [&, r] {
            Tensor t = Tensor::zeros({4096});
            const auto t0 = std::chrono::steady_clock::now();
            Status st = ranks[static_cast<std::size_t>(r)]->allReduceSum(r, t);
            return std::make_pair(std::move(st), std::chrono::steady_clock::now() - t0);
        }));
    std::this_thread::sleep_for(100ms);
    ranks[2].reset();
    for (int r = 0; r < 2; ++r) {
        auto [st, took] = fs[static_cast<std::size_t>(r)].get();
        QVERIFY(!st.ok());
        QVERIFY2(took < 10s, "detected within 10 s");
        QVERIFY2(st.error().message.find("rank 2 (worker:2) stopped responding") != std::string::npos, st.error().message.c_str());
    }
}

// Multi-worker tasks started with different settings stop before training, every rank with the
// same message naming each differing task and setting (Gloo ranks as threads).
void TestGloo::settingsMustAgree()
{
    const nlohmann::json base = {{"batch_size", 256}, {"optimizer", {{"type", "adam"}, {"learning_rate", 0.001}}},
                                 {"model", {{"layers", {{{"id", "in"}}, {{"id", "dense"}, {"units", 256}}}}}}};
    QCOMPARE(settingDifferences(base, base).size(), std::size_t(0));
    nlohmann::json other = base;
    other["optimizer"]["learning_rate"] = 0.5;
    other["model"]["layers"][1]["units"] = 128;
    other["epochs"] = 3;
    const auto d = settingDifferences(other, base);
    QCOMPARE(d.size(), std::size_t(3));
    QVERIFY(std::count(d.begin(), d.end(), "optimizer.learning_rate (0.5 vs 0.001)") == 1);
    QVERIFY(std::count(d.begin(), d.end(), "model.layers[1].units (128 vs 256)") == 1);
    QVERIFY(std::count(d.begin(), d.end(), "epochs (3 vs (none))") == 1);
    QCOMPARE(settingDifferences(other, base, 1).size(), std::size_t(1));

    auto server = startServer();
    auto ranks = makeRanks(server->port(), 3, "agree");
    const std::vector<std::string> names = {"chief:0 at a:1", "worker:0 at b:2", "worker:1 at c:3"};
    auto same = onRanks(3, [&](int r) { return agreeOnSettings(*ranks[static_cast<std::size_t>(r)], r, names, base); });
    for (const Status& st : same) QVERIFY2(st.ok(), st.ok() ? "" : st.error().message.c_str());

    nlohmann::json batch = base;
    batch["batch_size"] = 64;
    auto differ = onRanks(3, [&](int r) {
        const nlohmann::json& mine = r == 1 ? batch : r == 2 ? other : base;
        return agreeOnSettings(*ranks[static_cast<std::size_t>(r)], r, names, mine);
    });
    for (const Status& st : differ) {
        QVERIFY(!st.ok());
        QCOMPARE(st.error().code, ErrorCode::InvalidArgument);
        QCOMPARE(st.error().message, differ[0].error().message);  // the same verdict everywhere
    }
    const std::string& m = differ[0].error().message;
    QVERIFY2(m.find("worker:0 at b:2 differs from chief:0 at a:1 in batch_size (64 vs 256)") != std::string::npos, m.c_str());
    QVERIFY2(m.find("worker:1 at c:3 differs from chief:0 at a:1 in") != std::string::npos, m.c_str());
    QVERIFY2(m.find("optimizer.learning_rate (0.5 vs 0.001)") != std::string::npos, m.c_str());
    // The group still works afterwards (the failure is the settings', not the link's).
    auto again = onRanks(3, [&](int r) { return agreeOnSettings(*ranks[static_cast<std::size_t>(r)], r, names, base); });
    for (const Status& st : again) QVERIFY(st.ok());
}

// A rank that never starts is named by the ones waiting; a rank whose coordinator never starts
// names the coordinator.
void TestGloo::absentRanksAreNamed()
{
    auto server = startServer();
    auto lone = makeGlooCommunicator(options(server->port(), 0, 2, "absent", 1500ms));
    QVERIFY(!lone.ok());
    QVERIFY2(lone.error().message.find("rank 1 (worker:1) did not join the cluster within 1 s") != std::string::npos,
             lone.error().message.c_str());
    QVERIFY2(lone.error().hint.find("token") != std::string::npos, lone.error().hint.c_str());
    // While it waits it says for whom (from its heartbeat thread), 3 s in and every 10 s.
    {
        std::mutex m;
        std::vector<std::string> said;
        GlooOptions o = options(server->port(), 0, 2, "absent-said", 4s);
        o.waiting = [&](const std::string& line) {
            std::lock_guard lock(m);
            said.push_back(line);
        };
        QVERIFY(!makeGlooCommunicator(o).ok());
        std::lock_guard lock(m);
        QCOMPARE(said.size(), std::size_t(1));
        QVERIFY2(said.front().find("rank 0 (worker:0): waiting for rank 1 (worker:1) to join the cluster; giving up in ") != std::string::npos,
                 said.front().c_str());
    }

    // Cancelled while waiting for its peer: ends at once, not at the 20 s timeout.
    std::atomic<bool> cancel{false};
    GlooOptions waiting = options(server->port(), 0, 2, "cancel-wait");
    waiting.cancelled = [&] { return cancel.load(); };
    const auto t0 = std::chrono::steady_clock::now();
    auto pending = std::async(std::launch::async, [&] { return makeGlooCommunicator(waiting); });
    std::this_thread::sleep_for(300ms);
    cancel = true;
    auto cancelled = pending.get();
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    QVERIFY(!cancelled.ok());
    QCOMPARE(cancelled.error().code, ErrorCode::Cancelled);
    QVERIFY2(secs < 3, qPrintable(QString::number(secs)));

    // Another token: refused at once, and said so (it was "did not answer within 20 s").
    GlooOptions stranger = options(server->port(), 1, 2, "stranger");
    stranger.token = "not-the-token";
    const auto t1 = std::chrono::steady_clock::now();
    auto refused = makeGlooCommunicator(stranger);
    QVERIFY(!refused.ok());
    QVERIFY2(refused.error().message.find("rank 1 (worker:1): the rendezvous at 127.0.0.1:") != std::string::npos &&
                 refused.error().message.find("refused this task's token") != std::string::npos,
             refused.error().message.c_str());
    QVERIFY(std::chrono::steady_clock::now() - t1 < 5s);

    const int closed = server->port();
    server.reset();  // nobody serves the rendezvous now
    auto orphan = makeGlooCommunicator(options(closed, 1, 2, "orphan", 1500ms));
    QVERIFY(!orphan.ok());
    QVERIFY2(orphan.error().message.find("served by rank 0 (worker:0), did not answer") != std::string::npos,
             orphan.error().message.c_str());
}

// gRPC would let a second server share a port (SO_REUSEPORT) and split the connections.
void TestGloo::portInUseIsRefused()
{
    auto first = startServer();
    RendezvousServer::Options o;
    o.token = kToken;
    o.bindAddress = "127.0.0.1:" + std::to_string(first->port());
    auto second = RendezvousServer::start(o);
    QVERIFY(!second.ok());
    const std::string taken = "port " + std::to_string(first->port()) + " is in use by another program";
    QVERIFY2(second.error().message.find(taken) != std::string::npos, second.error().message.c_str());
}

// gRPC's UNAVAILABLE messages (as gRPC 1.51 words them) in words a user can act on.
void TestGloo::connectTroubleIsNamed_data()
{
    QTest::addColumn<QString>("message");
    QTest::addColumn<bool>("tls");
    QTest::addColumn<QString>("expected");
    QTest::addColumn<int>("patience");
    QTest::newRow("dns") << "DNS resolution failed for h0:2222: C-ares status is not ARES_SUCCESS qtype=AAAA name=h0 is_balancer=0: Domain name not found"
                         << false << "host name 'h0' does not resolve (DNS: Domain name not found)" << -1;
    QTest::newRow("refused") << "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Failed to connect to remote host: Connection refused"
                             << false << "nothing listens at h0:2222 (connection refused)" << -1;
    QTest::newRow("plain to tls") << "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:17443: Socket closed"
                                  << false << "closed the connection at once: it may serve TLS" << 5;
    QTest::newRow("tls to plain") << "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:17444: Ssl handshake failed: "
                                     "SSL_ERROR_SSL: error:0A00010B:SSL routines::wrong version number"
                                  << true << "h0:2222 does not speak TLS" << 0;
    QTest::newRow("other ca") << "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:17443: Ssl handshake failed: "
                                 "SSL_ERROR_SSL: error:0A000086:SSL routines::certificate verify failed"
                              << true << "not signed by the CA this side trusts (certificate verify failed)" << 0;
    QTest::newRow("name") << "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:24001: Peer name h0 is not in peer certificate"
                          << true << "does not name 'h0'" << 0;
}

void TestGloo::connectTroubleIsNamed()
{
    QFETCH(QString, message);
    QFETCH(bool, tls);
    QFETCH(QString, expected);
    QFETCH(int, patience);
    auto t = connectTrouble(grpc::Status(grpc::StatusCode::UNAVAILABLE, message.toStdString()), "h0:2222", tls);
    QVERIFY(t.has_value());
    QVERIFY2(t->what.find(expected.toStdString()) != std::string::npos, t->what.c_str());
    QVERIFY(!t->hint.empty());
    QCOMPARE(t->patienceSeconds, patience);
    // Not a connection failure: nothing to say.
    QVERIFY(!connectTrouble(grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "wrong token"), "h0:2222", tls).has_value());
}

// A rank whose rendezvous cannot be reached says why while it waits, and in its error; a TLS
// mismatch ends the wait early instead of at the timeout.
void TestGloo::unreachableRendezvousIsExplained()
{
    // Nothing listens: a free port, found by binding one and letting it go.
    int freePort = 0;
    {
        auto probe = startServer();
        freePort = probe->port();
    }
    std::vector<std::string> said;
    GlooOptions o = options(freePort, 1, 2, "nobody", 4s);
    o.waiting = [&](const std::string& line) { said.push_back(line); };
    auto c = makeGlooCommunicator(o);
    QVERIFY(!c.ok());
    const std::string refused = "nothing listens at 127.0.0.1:" + std::to_string(freePort) + " (connection refused)";
    QVERIFY2(c.error().message.find("did not answer within 4 s: " + refused) != std::string::npos, c.error().message.c_str());
    QVERIFY(!said.empty());
    const std::string waitingFor = "waiting for rank 0 (worker:0) (its rendezvous at 127.0.0.1:" + std::to_string(freePort) + "): " + refused;
    QVERIFY2(said.front().find(waitingFor) != std::string::npos, said.front().c_str());

    // A TLS rendezvous: a plaintext rank gives up after 5 s of closed connections, one trusting
    // another CA at once; both well inside their 60 s.
    const std::string dir = std::string(TS_FIXTURES_DIR) + "/tls/";
    auto server = startTlsServer();
    QElapsedTimer timer;
    timer.start();
    auto plain = makeGlooCommunicator(options(server->port(), 1, 2, "plain", 60s));
    QVERIFY(!plain.ok());
    QVERIFY2(plain.error().message.find("closed the connection at once") != std::string::npos, plain.error().message.c_str());
    QVERIFY2(plain.error().hint.find("--tls-ca") != std::string::npos, plain.error().hint.c_str());
    QVERIFY2(timer.elapsed() < 20000, std::to_string(timer.elapsed()).c_str());
    timer.restart();
    GlooOptions other = options(server->port(), 1, 2, "other-ca", 60s);
    other.tls.rootCa = dir + "other-ca.crt";
    auto wrongCa = makeGlooCommunicator(other);
    QVERIFY(!wrongCa.ok());
    QVERIFY2(wrongCa.error().message.find("is not signed by the CA this side trusts") != std::string::npos, wrongCa.error().message.c_str());
    QVERIFY2(timer.elapsed() < 10000, std::to_string(timer.elapsed()).c_str());
}

// A peer that accepts connections and never answers (a stopped machine's kernel still completes
// the TCP handshake): the client's deadline passes. gRPC says only "Deadline Exceeded"; the
// error says what that means instead. Our services' own deadline texts stay as they are.
void TestGloo::silentPeerIsNoAnswerInTime()
{
    tstest::LoopbackListener silent;
    QVERIFY(silent.port > 0);
    const std::string where = "127.0.0.1:" + std::to_string(silent.port);
    auto client = RendezvousClient::connect(where, kToken);
    QVERIFY(client.ok());
    auto v = (*client)->get("k", 300ms);
    QVERIFY(!v.ok());
    QVERIFY2(v.error().message == "rendezvous at " + where + ": get k: no answer in time (a stopped or overloaded machine?)", v.error().message.c_str());

    QCOMPARE(callFailure(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "Deadline Exceeded")),
             std::string("no answer in time (a stopped or overloaded machine?)"));
    QCOMPARE(callFailure(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "key k was not set in time")), std::string("key k was not set in time"));
    QCOMPARE(callFailure(grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "wrong token")), std::string("wrong token"));
}

void TestGloo::badOptions()
{
    GlooOptions o = options(1, 2, 2, "g");
    QVERIFY(!makeGlooCommunicator(o).ok());
    o = options(1, 0, 2, "");
    QVERIFY(!makeGlooCommunicator(o).ok());
    // A rendezvous nobody serves: the error names the address, after the timeout rather than never.
    auto server = startServer();
    const int deadPort = server->port();
    server.reset();
    o = options(deadPort, 0, 2, "g");
    o.timeout = 1s;
    const auto t0 = std::chrono::steady_clock::now();
    auto c = makeGlooCommunicator(o);
    QVERIFY(!c.ok());
    QVERIFY(std::chrono::steady_clock::now() - t0 < 10s);
    QVERIFY2(c.error().message.find("127.0.0.1:" + std::to_string(deadPort)) != std::string::npos, c.error().message.c_str());
}

namespace {
struct Peer {
    std::unique_ptr<QProcess> process;
    QString output() const { return QString::fromUtf8(process->readAllStandardOutput()) + QString::fromUtf8(process->readAllStandardError()); }
};

std::vector<Peer> spawnPeers(int port, int size, const QString& group, int die)
{
    std::vector<Peer> peers;
    for (int r = 0; r < size; ++r) {
        Peer p;
        p.process = std::make_unique<QProcess>();
        QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
        env.insert("TS_GLOO_PEER_RANK", QString::number(r));
        env.insert("TS_GLOO_PEER_SIZE", QString::number(size));
        env.insert("TS_GLOO_PEER_PORT", QString::number(port));
        env.insert("TS_GLOO_PEER_GROUP", group);
        if (die >= 0) env.insert("TS_GLOO_PEER_DIE", QString::number(die));
        p.process->setProcessEnvironment(env);
        p.process->start(QCoreApplication::applicationFilePath(), {});
        peers.push_back(std::move(p));
    }
    return peers;
}
} // namespace

void TestGloo::twoProcessLoopback()
{
    auto server = startServer();
    auto peers = spawnPeers(server->port(), 2, "two-process", -1);
    QStringList outs;
    for (auto& p : peers) {
        QVERIFY(p.process->waitForFinished(60000));
        outs << p.output();
        QVERIFY2(p.process->exitCode() == 0, qPrintable(outs.back()));
    }
    // Both ranks hold the same sums, and they are the exact expected ones.
    QCOMPARE(outs[0], outs[1]);
    const int64_t n = 1 << 20;
    double expect = 0;
    for (int64_t i = 0; i < n; ++i) expect += contribution(0, i) + contribution(1, i);
    QVERIFY2(outs[0].contains(QString("step 4 checksum %1").arg(expect, 0, 'f', 1)), qPrintable(outs[0]));
}

void TestGloo::killedProcessIsDetected()
{
    auto server = startServer();
    auto peers = spawnPeers(server->port(), 2, "kill-9", 1);  // rank 1 SIGKILLs itself at step 1
    QVERIFY(peers[1].process->waitForFinished(60000));
    QCOMPARE(peers[1].process->exitStatus(), QProcess::CrashExit);
    QVERIFY(peers[0].process->waitForFinished(30000));
    const QString out = peers[0].output();
    QCOMPARE(peers[0].process->exitCode(), 3);
    QVERIFY2(out.contains("rank 1 (worker:1) stopped responding"), qPrintable(out));
    const auto m = QRegularExpression("FAILED after ([0-9.]+) s").match(out);
    QVERIFY2(m.hasMatch(), qPrintable(out));
    QVERIFY2(m.captured(1).toDouble() < 10.0, qPrintable(out));
}

int main(int argc, char** argv)
{
    if (std::getenv("TS_GLOO_PEER_RANK")) return runPeer();
    // As the communicator would (it leaves a non-default disposition alone, and Qt Test installs
    // a crash handler for SIGPIPE): a write to a peer that has gone must be an error, not a crash.
    std::signal(SIGPIPE, SIG_IGN);
    QCoreApplication app(argc, argv);
    TestGloo t;
    return QTest::qExec(&t, argc, argv);
}

#include "tst_gloo.moc"
