#pragma once
// GlooCommunicator: ts::Communicator across processes (or threads) over Gloo's TCP transport.
// One instance per rank. Ranks meet through the coordinator's rendezvous service (rendezvous.h):
// each publishes its Gloo address there under `group`, then Gloo connects a full mesh.
// Contract (in addition to communicator.h's):
//  - Threading: collectives are called by this rank's one thread, with `rank` equal to
//    options.rank; abort() may be called from any thread.
//  - Algorithms: F32 all-reduce over Gloo's pairs: two ranks exchange halves (each reduces
//    one half, then sends it into the other's tensor: two messages each way, no notifications);
//    more ranks use Gloo's chunked ring (gloo::AllreduceRingChunked: reduce-scatter, then the
//    reduced chunks are copied around). One-to-all broadcast, all-to-all barrier. Every rank
//    gets bitwise the same sums and a run is repeatable, but with more than 2 ranks the
//    summation order is the ring's, not rank order. (gloo::AllreduceRing passes whole buffers
//    around and each rank sums in its own order: with more than 2 ranks their results differ
//    in the last bits.) Large tensors are reduced in segments (chunks under 90% of the smallest
//    net.core.wmem_max among the ranks, at most 1 MiB, or options.maxChunkBytes), so
//    synchronous sockets never block each other whatever the size.
//  - Faults: every transfer has options.timeout. A peer that dies closes its sockets, so calls
//    fail at once; a peer that hangs fails them after the timeout. The error names the rank and
//    task that stopped responding, found through the ranks' heartbeats to the rendezvous service
//    (a rank is silent after 3 heartbeat periods), or the rank that aborted and why.
//    After a failure or abort() every later call fails; make a new communicator to continue.
//    Joining: a peer that joined and then went silent (once every rank has claimed its rank),
//    a peer that gave its join up (its reason, under the group's abort key), Ctrl-C
//    (options.cancelled) or another process holding this rank end the join within a few
//    heartbeat periods, also while Gloo connects the mesh (where it would wait five timeouts).
//  - Ownership: owns its Gloo context, rendezvous channel and heartbeat thread.
//  - Process state: sets SIGPIPE to ignored if it was at its default (Gloo writes to sockets a
//    dead peer may have closed; the default action would kill the process).

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/result.h"
#include "distribute/communicator.h"
#include "remote/auth.h"

namespace ts::remote {

struct GlooOptions {
    int rank = 0;
    int size = 1;
    std::string rendezvousAddress;       // host:port of the coordinator's rendezvous service
    std::string token;
    std::string group;                   // unique per run (and attempt): the keys' prefix
    std::string hostname = "127.0.0.1";  // the interface this rank's Gloo transport listens on
    std::vector<std::string> rankNames;  // e.g. "worker:1 (10.0.0.3:2222)"; empty: "rank i"
    // Ports of gRPC services in this process's cluster (every task's cluster port): sockets on
    // them are never Gloo's. The rendezvous port is always counted.
    std::vector<int> servicePorts;
    std::chrono::milliseconds timeout{30000};
    std::chrono::milliseconds heartbeat{1000};
    // Polled while waiting for the other ranks to join: true ends the wait (Cancelled), so a
    // task cancelled before its peers arrive does not sit out the whole timeout. Called from the
    // joining thread and the heartbeat thread: must be thread-safe.
    std::function<bool()> cancelled;
    // Told, a few seconds into a wait and then every 10 s, what is being waited for: the
    // rendezvous and why it does not answer yet ("nothing listens at h0:2222 (connection
    // refused)"), or the ranks that have not joined yet, so no task waits silently. Called on the
    // joining thread and the heartbeat thread: must be thread-safe. May be null.
    std::function<void(const std::string&)> waiting;
    TlsFiles tls;
    // A smaller chunk than the kernel's socket buffers allow (see the segments above; never a
    // larger one, which could block both ranks in write()); 0: as large as they allow. Every rank
    // uses the smallest any rank has. Tests set a small one to cut tensors into many segments.
    int64_t maxChunkBytes = 0;
    // Gloo's default pairs (its event loop thread) instead of synchronous ones: for measuring the
    // difference and testing both (TS_GLOO_ASYNC=1 in the environment does the same).
    bool asyncPairs = false;
};

Result<std::unique_ptr<Communicator>> makeGlooCommunicator(const GlooOptions& options);

} // namespace ts::remote
