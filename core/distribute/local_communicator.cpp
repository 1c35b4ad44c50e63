#include "distribute/communicator.h"

#include <condition_variable>
#include <cstring>
#include <mutex>
#include <vector>

namespace ts {
namespace {

// A reusable barrier that can be aborted (std::barrier cannot), blocking on a condition
// variable: ranks never spin, so a busy neighbour core does not stall the others.
class AbortableBarrier {
public:
    explicit AbortableBarrier(int n) : m_n(n) {}
    Status arriveAndWait()
    {
        std::unique_lock lock(m_mutex);
        if (m_aborted) return aborted();
        const uint64_t gen = m_generation;
        if (++m_count == m_n) {
            m_count = 0;
            ++m_generation;
            m_cv.notify_all();
            return okStatus();
        }
        m_cv.wait(lock, [&] { return m_generation != gen || m_aborted; });
        if (m_generation == gen) return aborted();
        return okStatus();
    }
    void abort(const std::string& reason)
    {
        std::lock_guard lock(m_mutex);
        if (!m_aborted) m_reason = reason;
        m_aborted = true;
        m_cv.notify_all();
    }

private:
    Error aborted() const { return makeError(ErrorCode::Cancelled, "collective aborted: " + m_reason); }
    std::mutex m_mutex;
    std::condition_variable m_cv;
    int m_n;
    int m_count = 0;
    uint64_t m_generation = 0;
    bool m_aborted = false;
    std::string m_reason;
};

class LocalCommunicator final : public Communicator {
public:
    explicit LocalCommunicator(int n) : m_size(n), m_barrier(n), m_buffers(static_cast<std::size_t>(n), nullptr), m_counts(static_cast<std::size_t>(n), 0) {}
    int size() const override { return m_size; }
    std::string name() const override { return "local"; }
    // Shared memory: the replicas' buffers are read where they are anyway.
    Status registerBuffer(int, Tensor&) override { return okStatus(); }
    void releaseBuffer(int, const Tensor&) override {}

    Status allReduceSum(int rank, Tensor& t) override
    {
        TS_ASSERT(t.dtype() == DType::F32 && t.hostAccessible());
        if (m_size == 1) return okStatus();
        m_buffers[static_cast<std::size_t>(rank)] = t.data<float>();
        m_counts[static_cast<std::size_t>(rank)] = t.numel();
        TS_TRY(m_barrier.arriveAndWait());
        const int64_t n = m_counts[0];
        for (int r = 1; r < m_size; ++r)
            if (m_counts[static_cast<std::size_t>(r)] != n) {
                m_barrier.abort("rank " + std::to_string(r) + " reduced " + std::to_string(m_counts[static_cast<std::size_t>(r)]) +
                      " elements, rank 0 " + std::to_string(n));
                return makeError(ErrorCode::Internal, "all-reduce size mismatch between replicas");
            }
        const int64_t begin = n * rank / m_size, end = n * (rank + 1) / m_size;
        float* acc = m_buffers[0];
        for (int r = 1; r < m_size; ++r) {
            const float* src = m_buffers[static_cast<std::size_t>(r)];
            for (int64_t i = begin; i < end; ++i) acc[i] += src[i];
        }
        for (int r = 1; r < m_size; ++r)
            std::memcpy(m_buffers[static_cast<std::size_t>(r)] + begin, acc + begin,
                        static_cast<std::size_t>(end - begin) * sizeof(float));
        return m_barrier.arriveAndWait();
    }

    Status broadcast(int rank, int root, Tensor& t) override
    {
        if (m_size == 1) return okStatus();
        m_buffers[static_cast<std::size_t>(rank)] = static_cast<float*>(t.raw());
        m_counts[static_cast<std::size_t>(rank)] = static_cast<int64_t>(t.bytes());
        TS_TRY(m_barrier.arriveAndWait());
        if (rank != root) {
            if (m_counts[static_cast<std::size_t>(root)] != static_cast<int64_t>(t.bytes()))
                return makeError(ErrorCode::Internal, "broadcast size mismatch between replicas");
            std::memcpy(t.raw(), m_buffers[static_cast<std::size_t>(root)], t.bytes());
        }
        return m_barrier.arriveAndWait();
    }

    Status barrier(int) override { return m_barrier.arriveAndWait(); }
    void abort(const Error& cause) override { m_barrier.abort(cause.message); }

private:
    int m_size;
    AbortableBarrier m_barrier;
    std::vector<float*> m_buffers;
    std::vector<int64_t> m_counts;
};

} // namespace

std::unique_ptr<Communicator> makeLocalCommunicator(int size) { return std::make_unique<LocalCommunicator>(size); }

} // namespace ts
