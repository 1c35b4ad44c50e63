#pragma once
// SharedMemoryAllReduce: the F32 sum all-reduce between processes of one machine through one
// POSIX shared-memory segment. The Gloo communicator uses it when every rank of its group can map
// the same segment (workers started on one host), because its TCP ring costs each rank a kernel
// copy per byte sent and received (0.30-0.38 ms of CPU for the seed MLP's 0.81 MB on loopback).
// Contract:
//  - Meeting: rank 0 create()s the segment and publishes name() and nonce() (through the
//    rendezvous); the others attach() with them, which fails cleanly if they cannot see it (other
//    machine, other IPC namespace, no /dev/shm, no space). Rank 0 unlink()s the name once all
//    have answered, so nothing is left in /dev/shm even if a process dies later.
//  - Threading: allReduceSum is called by this rank's one thread; abort() from any thread.
//  - Algorithm: tensors are reduced in segments of at most slotFloats(). Each rank copies its
//    segment into its slot; once all have, rank r sums part r of every slot in rank order into the
//    result area; once all have, each copies the result out. Every rank gets bitwise the same
//    sums, and a run is repeatable (the order is fixed); they may differ in the last bits from the
//    TCP ring's, which sums in ring order.
//  - Waiting: a rank spins for a short while (kSpin), then sleeps on a futex in the segment. Every
//    few milliseconds it calls `poll`; an error from it (this rank aborted, the heartbeat found a
//    dead peer) ends the wait with that error. A wait longer than `timeout` fails naming the rank
//    that did not arrive.
//  - Errors: abort(), on any rank, makes every pending and later call on every rank fail (a flag
//    in the segment); the segment is then unusable. Nothing here throws.
//  - Ownership: owns its mapping; the memory goes when the last rank unmaps it.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/result.h"

namespace ts::remote {

class SharedMemoryAllReduce {
public:
    // Largest segment, in floats, reduced per round (1 MiB per rank's slot).
    static constexpr int64_t kSlotFloats = int64_t{1} << 18;

    static Result<std::unique_ptr<SharedMemoryAllReduce>> create(int size, const std::string& tag);
    static Result<std::unique_ptr<SharedMemoryAllReduce>> attach(const std::string& name, uint64_t nonce, int rank, int size);
    ~SharedMemoryAllReduce();
    SharedMemoryAllReduce(const SharedMemoryAllReduce&) = delete;
    SharedMemoryAllReduce& operator=(const SharedMemoryAllReduce&) = delete;

    const std::string& name() const { return m_name; }
    uint64_t nonce() const;
    void unlink();

    // poll: returns an error to stop waiting (called every few ms while waiting). peerName names
    // a rank in the timeout error.
    using Poll = std::function<Status()>;
    Status allReduceSum(float* data, int64_t n, const Poll& poll, std::chrono::milliseconds timeout,
                        const std::function<std::string(int)>& peerName);
    void abort();
    bool aborted() const;

private:
    struct Header;
    struct Counter;
    SharedMemoryAllReduce() = default;
    static Result<std::unique_ptr<SharedMemoryAllReduce>> map(int fd, const std::string& name, int rank, int size);
    Counter& counter(int r) const;
    float* slot(int r) const;
    float* result() const;
    void arrive(uint32_t value);
    Status waitAll(uint32_t target, const Poll& poll, std::chrono::steady_clock::time_point deadline,
                   const std::function<std::string(int)>& peerName);

    std::string m_name;
    bool m_linked = false;
    int m_rank = 0;
    int m_size = 0;
    void* m_base = nullptr;
    std::size_t m_bytes = 0;
    uint32_t m_seq = 0;  // this rank's arrivals so far (every rank counts the same)
};

} // namespace ts::remote
