#pragma once
// The rendezvous key-value service (rendezvous.proto) and its client.
// RendezvousServer: served by the coordinator (the chief) for one or more runs. Keys are
// write-once-or-overwrite byte strings, kept in memory; Get/Wait block (up to a deadline) until
// the keys exist. Heartbeats record when each rank of a group was last heard from.
// RendezvousClient: one channel to that server; every call carries the token and a deadline.
// Contract:
//  - Threading: both are thread-safe. The server runs gRPC's own threads; shutdown() (or the
//    destructor) wakes blocked Get/Wait calls and joins them.
//  - Errors: the server refuses calls without the token (UNAUTHENTICATED, logged), keys over
//    1 KiB and values over maxValueBytes (INVALID_ARGUMENT); messages are bounded by gRPC's
//    limits. Client calls return Result errors naming the server's address and the key.

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/result.h"
#include "remote/auth.h"

namespace ts::remote {

inline constexpr std::chrono::milliseconds kRendezvousIdleExpiry = std::chrono::minutes(15);

class RendezvousServer {
public:
    struct Options {
        std::string bindAddress = "127.0.0.1:0";   // port 0: an ephemeral port (see port())
        std::string token;                          // required
        int maxValueBytes = 1 << 20;                // bounds memory per key and message size
        // A group no rank has beaten for this long is forgotten, with its keys (and keys under no
        // group untouched as long): bounds the memory of a server that lives across many runs.
        std::chrono::milliseconds idleExpiry = kRendezvousIdleExpiry;
        TlsFiles tls;
    };
    static Result<std::unique_ptr<RendezvousServer>> start(const Options& options);
    ~RendezvousServer();
    int port() const;
    void shutdown();

    class Impl;
private:
    explicit RendezvousServer(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> m_impl;
};

// 16 hex digits that tell processes (and a restarted server) apart: random, or from the clock and
// the process id where there is no entropy source.
std::string randomId();

// Whether a rendezvous serves a key (or a heartbeat's group): a group's keys are "<group>/...",
// and a group may itself hold '/' (a restarted run's "<run>/restart-1"), so the filter sees the
// whole key. Called on gRPC threads without the service's lock held: must be thread-safe.
// Empty: every group.
using GroupFilter = std::function<bool(const std::string& key)>;

// The service alone, to serve next to others on one port (trainstudio-worker does, serving only
// the groups of the runs it was told of).
std::unique_ptr<grpc::Service> makeRendezvousService(const std::string& token, int maxValueBytes = 1 << 20,
                                                    std::chrono::milliseconds idleExpiry = kRendezvousIdleExpiry,
                                                    GroupFilter serves = {});

// What a call for a group that is none of its runs gets from a daemon's rendezvous
// (FAILED_PRECONDITION): typically a task started with TF_CONFIG that names a daemon's address.
inline constexpr const char* kRendezvousNotServed =
    "this address is a trainstudio-worker daemon: its rendezvous serves only the runs its coordinator starts";

// What a call waiting at a rendezvous that shuts down gets (UNAVAILABLE): the group it was
// joining is gone, because its run ended or rank 0 restarts it.
inline constexpr const char* kRendezvousClosing = "the rendezvous is shutting down (its run ended or is restarting)";
// What a pinned client (pin()) gets from a rendezvous that is not the one it pinned
// (FAILED_PRECONDITION): rank 0 restarted the run and serves a new one at the same address.
inline constexpr const char* kRendezvousRestarted = "the rendezvous restarted since this process joined its group (rank 0 restarted the run)";

class RendezvousClient {
public:
    static Result<std::unique_ptr<RendezvousClient>> connect(const std::string& address, const std::string& token,
                                                           const TlsFiles& tls = {});
    ~RendezvousClient();
    const std::string& address() const;

    Status set(const std::string& key, const std::vector<char>& value, std::chrono::milliseconds timeout = std::chrono::seconds(30));
    Result<std::vector<char>> get(const std::string& key, std::chrono::milliseconds timeout);
    Status wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
    struct Beat {
        std::vector<int> silent;  // the group's ranks silent for longer than `silence`
        // Once every rank has claimed: the silent ranks that had beaten before (died or froze,
        // rather than not started).
        std::vector<int> lost;
        // With an instance: another live instance holds the rank (its peer address); this beat
        // did not count.
        std::string heldBy;
        // The group formed and this rank's previous holder left it; the beat did not count either.
        bool groupRunning = false;
    };
    // Says `rank` of `group` is alive. With an `instance`, the rank is claimed for it: a claim
    // whose holder has been silent for `silence` lapses.
    Result<Beat> heartbeat(const std::string& group, int rank, int size, std::chrono::milliseconds silence, const std::string& instance = {},
                           std::chrono::milliseconds deadline = std::chrono::seconds(2));

    // One attempt to reach the service now, without waiting for it to come up: OK when it
    // answers; otherwise why not (connectTrouble: DNS, nothing listening, a TLS mismatch), the
    // trouble in *trouble when given.
    Status reach(std::chrono::milliseconds timeout, std::optional<ConnectTrouble>* trouble = nullptr);

    // From now on only the server that answered the last call is served: a server started since
    // at the same address (rank 0 restarting the run, with the same group names) refuses this
    // client (kRendezvousRestarted) instead of taking its heartbeats as claims in the new group
    // or its abort reason as the new group's. Called once the group's mesh has connected.
    void pin();

    class Impl;
private:
    explicit RendezvousClient(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> m_impl;
};

} // namespace ts::remote
