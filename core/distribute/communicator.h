#pragma once
// Communicator: collectives between the replicas of one run (all-reduce, broadcast, barrier).
// Contract:
//  - Collective calls are made by every rank with the same sequence of calls and the same
//    element counts; ranks are identified by `rank` in [0, size()).
//  - Threading: each rank calls from its own thread (ranks-as-threads for LocalCommunicator,
//    one process per rank for Gloo/NCCL). A call returns once this rank's result is complete.
//  - Errors: a peer that fails (or calls abort()) makes every pending and later call on every
//    rank return Cancelled/an error naming the rank, instead of hanging.
//  - Determinism: results are bit-identical across ranks and runs. LocalCommunicator sums in
//    rank order; Gloo with more than 2 ranks sums each chunk in ring order (fixed for a given
//    size), so its sums can differ from the local ones in the last bits.

#include <memory>
#include <string>

#include "common/result.h"
#include "tensor/tensor.h"

namespace ts {

class Communicator {
public:
    virtual ~Communicator() = default;
    virtual int size() const = 0;
    virtual std::string name() const = 0;
    // In-place element-wise sum over ranks (F32); every rank ends with the sum.
    virtual Status allReduceSum(int rank, Tensor& t) = 0;
    // Copy root's tensor to every other rank.
    virtual Status broadcast(int rank, int root, Tensor& t) = 0;
    virtual Status barrier(int rank) = 0;
    // Declares `t` (host or device memory that stays allocated while it is registered) as a
    // buffer this rank will all-reduce again and again, so the communicator may bind its
    // transfers to it instead of copying through staging memory. Every rank registers its
    // corresponding buffer at the same point of its call sequence, and afterwards passes that
    // same tensor (same memory and size) to allReduceSum when the others pass theirs: ranks that
    // disagree make different calls on the wire. Local only (no communication). releaseBuffer
    // undoes it, before the memory is freed if the communicator lives on. Pure virtual so that a
    // wrapper cannot drop the call and leave its rank out of step with the others.
    virtual Status registerBuffer(int rank, Tensor& t) = 0;
    virtual void releaseBuffer(int rank, const Tensor& t) = 0;
    // Unblocks everyone with an error (a replica failed or the run was cancelled). The peers'
    // errors quote cause.message and take its code when it says more than a broken connection
    // (a data error: no task restarts for it); a Cancelled cause is a stop, which the peers hear
    // as kCancelledReason whatever its message.
    virtual void abort(const Error& cause) = 0;
    // The reason a cancelled run (Ctrl-C, the studio's Stop) aborts with: peers that see it
    // report a stop elsewhere, not a failure to restart from.
    static constexpr const char* kCancelledReason = "the run was cancelled";
    static Error cancelledCause() { return makeError(ErrorCode::Cancelled, kCancelledReason); }
};

// Ranks as threads of one process, tensors in host memory. The all-reduce is a
// reduce-scatter/all-gather over shared memory: rank r sums slice r of every rank's buffer in
// rank order and writes it back to all ranks, so the work is split evenly across threads.
std::unique_ptr<Communicator> makeLocalCommunicator(int size);

// This process's `localSize` replicas (ranks as threads, rank = local replica index) joined to
// the other processes of a multi-worker run through `crossProcess` (one rank per process, e.g.
// Gloo). Size is localSize * crossProcess->size(); global replica g = processRank * localSize + r.
// All-reduce: local sum, then local replica 0 all-reduces across processes, then a local
// broadcast, so only one rank per process talks over the network. A failure on either level
// aborts both, and the local replicas' errors carry the cross-process one.
std::unique_ptr<Communicator> makeHierarchicalCommunicator(int localSize, std::shared_ptr<Communicator> crossProcess,
                                                           int processRank);

} // namespace ts
