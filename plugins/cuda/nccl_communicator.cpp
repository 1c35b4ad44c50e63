#include "nccl_communicator.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime.h>
#include <nccl.h>

#include "cuda_device.h"

namespace ts::cuda {
namespace {

using Clock = std::chrono::steady_clock;

// NCCL's last-error text is one buffer for the whole process, so it may describe another
// thread's failure: it is given as a hint after the error code.
std::string cudaText(cudaError_t e) { return std::string("CUDA error ") + cudaGetErrorString(e); }

std::string ncclText(ncclResult_t r, ncclComm_t comm)
{
    std::string out = std::string("NCCL error ") + std::to_string(static_cast<int>(r)) + " (" + ncclGetErrorString(r) + ")";
    if (const char* last = ncclGetLastError(comm); last && *last) out += "; NCCL's last message: " + std::string(last);
    return out;
}

// Restores the calling thread's current device: replica 0's thread (which builds the
// communicator) and whoever destroys it keep the device their backend bound them to, whatever
// device NCCL's calls were made for.
class DeviceGuard {
public:
    DeviceGuard() { cudaGetDevice(&m_device); }
    ~DeviceGuard() { cudaSetDevice(m_device); }
    DeviceGuard(const DeviceGuard&) = delete;
    DeviceGuard& operator=(const DeviceGuard&) = delete;

private:
    int m_device = 0;
};

class NcclCommunicator final : public Communicator {
public:
    explicit NcclCommunicator(const CollectiveGroup& g)
        : m_devices(g.devices), m_processRank(g.processRank), m_processCount(g.processCount), m_timeout(g.timeout),
          m_comms(g.devices.size(), nullptr), m_streams(g.devices.size(), nullptr), m_scratch(g.devices.size(), nullptr),
          m_started(g.devices.size(), nullptr),
          m_dead(g.devices.size(), 0)
    {
    }

    ~NcclCommunicator() override
    {
        DeviceGuard guard;
        std::vector<std::size_t> live;
        for (std::size_t r = 0; r < m_comms.size(); ++r)
            if (m_comms[r]) live.push_back(r);
        // A communicator that failed, or whose peers may be gone, is aborted (it never waits for
        // them). Healthy ones are finalized together: finalize is an intra-node collective, so
        // one thread finalizing several GPUs one by one would wait on itself.
        bool clean = !failedOrAborted();
        if (clean && !live.empty()) {
            ncclGroupStart();
            for (std::size_t r : live) {
                cudaSetDevice(m_devices[r]);
                const ncclResult_t rc = ncclCommFinalize(m_comms[r]);
                clean &= rc == ncclSuccess || rc == ncclInProgress;
            }
            const ncclResult_t end = ncclGroupEnd();
            clean &= end == ncclSuccess || end == ncclInProgress;
            const auto deadline = Clock::now() + m_timeout;
            for (std::size_t r : live) {
                ncclResult_t st = ncclInProgress;
                while (clean && ncclCommGetAsyncError(m_comms[r], &st) == ncclSuccess && st == ncclInProgress && Clock::now() < deadline)
                    std::this_thread::sleep_for(std::chrono::microseconds(200));
                clean &= st == ncclSuccess;
            }
        }
        for (std::size_t r : live) {
            cudaSetDevice(m_devices[r]);
            if (clean) ncclCommDestroy(m_comms[r]);
            else ncclCommAbort(m_comms[r]);
        }
        for (std::size_t r = 0; r < m_scratch.size(); ++r) {
            cudaSetDevice(m_devices[r]);
            if (m_scratch[r]) cudaFree(m_scratch[r]);
            if (m_started[r]) cudaEventDestroy(m_started[r]);
        }
    }

    Status connect(Communicator* cross)
    {
        DeviceGuard guard;
        const int n = static_cast<int>(m_devices.size());
        // Process 0 makes the id; every process takes part in the broadcast even when that
        // failed (a flag in front of the id), so none is left waiting in it.
        ncclUniqueId id{};
        std::string idFailure;
        if (m_processRank == 0)
            if (ncclResult_t rc = ncclGetUniqueId(&id); rc != ncclSuccess) idFailure = ncclText(rc, nullptr);
        if (cross && m_processCount > 1) {
            static_assert(sizeof(id) % sizeof(float) == 0);
            constexpr int64_t words = static_cast<int64_t>(sizeof(id) / sizeof(float));
            Tensor t = Tensor::zeros({1 + words});
            t.data<float>()[0] = idFailure.empty() ? 1.f : 0.f;
            std::memcpy(t.data<float>() + 1, &id, sizeof(id));
            TS_TRY(cross->broadcast(m_processRank, 0, t));
            if (m_processRank != 0 && t.data<float>()[0] != 1.f)
                idFailure = "process 0 could not make NCCL's unique id (its log says why)";
            std::memcpy(&id, t.data<float>() + 1, sizeof(id));
        }
        if (!idFailure.empty())
            return makeError(ErrorCode::IoError, "NCCL could not start: " + idFailure,
                             "check NCCL_SOCKET_IFNAME and that process 0's host has a usable network interface");
        for (int r = 0; r < n; ++r) {
            const std::size_t i = static_cast<std::size_t>(r);
            TS_ASSIGN(DeviceContext * ctx, deviceContext(m_devices[i]));
            m_streams[i] = ctx->stream;
            TS_TRY(cudaCheck(cudaSetDevice(ctx->index), "cudaSetDevice", ctx->index));
            TS_TRY(cudaCheck(cudaMalloc(&m_scratch[i], sizeof(float)), "cudaMalloc (barrier scratch)", ctx->index));
            // Defined contents, so the barrier's sum reads no uninitialised memory (initcheck).
            TS_TRY(cudaCheck(cudaMemset(m_scratch[i], 0, sizeof(float)), "cudaMemset (barrier scratch)", ctx->index));
            TS_TRY(cudaCheck(cudaEventCreateWithFlags(&m_started[i], cudaEventDisableTiming), "cudaEventCreate", ctx->index));
        }
        // All of this process's ranks join in one group (NCCL needs every local rank's init
        // in flight at once when one thread drives several GPUs); non-blocking, then polled.
        ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
        config.blocking = 0;
        ncclResult_t rc = ncclGroupStart();
        std::string failure, where;
        if (rc != ncclSuccess) failure = ncclText(rc, nullptr);
        for (int r = 0; r < n && rc == ncclSuccess; ++r) {
            if (cudaError_t e = cudaSetDevice(m_devices[static_cast<std::size_t>(r)]); e != cudaSuccess) {
                failure = cudaText(e);
                where = deviceName(r);
                break;
            }
            rc = ncclCommInitRankConfig(&m_comms[static_cast<std::size_t>(r)], size(), id, globalRank(r), &config);
            if (rc == ncclInProgress) rc = ncclSuccess;
            if (rc != ncclSuccess) {
                failure = ncclText(rc, nullptr);
                where = deviceName(r);
            }
        }
        const ncclResult_t end = ncclGroupEnd();
        if (failure.empty() && end != ncclSuccess && end != ncclInProgress) failure = ncclText(end, nullptr);
        if (!failure.empty()) {
            // A failure of the group as a whole (start or end) belongs to no one device.
            if (where.empty()) where = n == 1 ? deviceName(0) : "this process's " + std::to_string(n) + " GPUs";
            // Every communicator of a failed group is aborted (the destructor does it).
            Error e = makeError(ErrorCode::IoError, "NCCL could not start its communicator on " + where + ": " + failure,
                                "check that every task runs the same build and can reach process 0's host");
            std::lock_guard lock(m_mutex);
            m_failed = e;
            return e;
        }
        // One deadline for all of them: the inits run together, so n waits must not add up.
        const auto deadline = Clock::now() + m_timeout;
        for (int r = 0; r < n; ++r) TS_TRY(settle(r, "connecting to the other " + std::to_string(size() - 1) + " GPU replica(s)", deadline));
        return okStatus();
    }

    int size() const override { return static_cast<int>(m_devices.size()) * m_processCount; }
    std::string name() const override { return "nccl"; }

    Status allReduceSum(int rank, Tensor& t) override
    {
        TS_TRY(checkCall(rank, t, true));
        if (t.numel() == 0) return okStatus();
        return collective(rank, "all-reduce of " + std::to_string(t.numel()) + " floats", [&](ncclComm_t c, cudaStream_t s) {
            return ncclAllReduce(t.raw(), t.raw(), static_cast<std::size_t>(t.numel()), ncclFloat32, ncclSum, c, s);
        });
    }

    Status broadcast(int rank, int root, Tensor& t) override
    {
        TS_TRY(checkCall(rank, t, false));
        if (root < 0 || root >= size())
            return makeError(ErrorCode::InvalidArgument, "broadcast root " + std::to_string(root) + " is not a replica of " + std::to_string(size()));
        if (t.bytes() == 0) return okStatus();
        return collective(rank, "broadcast of " + std::to_string(t.bytes()) + " bytes from replica " + std::to_string(root),
                          [&](ncclComm_t c, cudaStream_t s) { return ncclBroadcast(t.raw(), t.raw(), t.bytes(), ncclUint8, root, c, s); });
    }

    Status barrier(int rank) override
    {
        TS_TRY(checkRank(rank));
        float* scratch = static_cast<float*>(m_scratch[static_cast<std::size_t>(rank)]);
        return collective(rank, "barrier", [&](ncclComm_t c, cudaStream_t s) { return ncclAllReduce(scratch, scratch, 1, ncclFloat32, ncclSum, c, s); });
    }

    // NCCL reads and writes the tensors in device memory where they are: nothing to bind.
    Status registerBuffer(int rank, Tensor&) override { return checkRank(rank); }
    void releaseBuffer(int, const Tensor&) override {}

    void abort(const Error& cause) override
    {
        std::lock_guard lock(m_mutex);
        if (m_aborted) return;
        m_aborted = true;
        m_reason = cause.message;
        // The ranks' threads see the flag in their wait loops and abort their own NCCL
        // communicators there (the communicator is only touched by its rank's thread).
    }

private:
    int globalRank(int local) const { return m_processRank * static_cast<int>(m_devices.size()) + local; }
    std::string deviceName(int local) const
    {
        return "gpu:" + std::to_string(m_devices[static_cast<std::size_t>(local)]) + " (replica " + std::to_string(globalRank(local)) + " of " +
               std::to_string(size()) + ")";
    }

    bool failedOrAborted()
    {
        std::lock_guard lock(m_mutex);
        return m_aborted || m_failed.has_value();
    }

    Status checkRank(int rank)
    {
        if (rank < 0 || rank >= static_cast<int>(m_devices.size()))
            return makeError(ErrorCode::InvalidArgument, "NCCL communicator called as local rank " + std::to_string(rank) + " of " +
                                                             std::to_string(m_devices.size()));
        std::lock_guard lock(m_mutex);
        if (m_aborted) return makeError(ErrorCode::Cancelled, "collective aborted: " + m_reason);
        if (m_failed) return *m_failed;
        return okStatus();
    }

    Status checkCall(int rank, const Tensor& t, bool f32)
    {
        TS_TRY(checkRank(rank));
        const int dev = m_devices[static_cast<std::size_t>(rank)];
        if (t.hostAccessible() || t.device().kind != DeviceKind::Cuda || t.device().index != dev)
            return makeError(ErrorCode::Unsupported, "the NCCL communicator of " + deviceName(rank) + " was given a tensor on " + t.device().toString(),
                             "pass the replica's own device tensors");
        if (f32 && t.dtype() != DType::F32)
            return makeError(ErrorCode::Unsupported, "the NCCL all-reduce of " + deviceName(rank) + " takes F32 tensors, not " + dtypeName(t.dtype()));
        return okStatus();
    }

    // Queues one NCCL operation on the rank's device stream and waits until it has run.
    template <typename Fn>
    Status collective(int rank, const std::string& what, Fn&& enqueue)
    {
        const std::size_t r = static_cast<std::size_t>(rank);
        // A no-op on the rank's own (bound) thread; checked so that a failure is reported here
        // rather than left as the thread's last error for the next kernel launch to find.
        if (cudaError_t e = cudaSetDevice(m_devices[r]); e != cudaSuccess)
            return fail(rank, what, cudaText(e));
        // Marks where the stream reaches the collective: the timeout counts from there, not
        // while this replica's own kernels queued before it still run.
        if (cudaError_t e = cudaEventRecord(m_started[r], m_streams[r]); e != cudaSuccess)
            return fail(rank, what, cudaText(e));
        const ncclResult_t rc = enqueue(m_comms[r], m_streams[r]);
        if (rc != ncclSuccess && rc != ncclInProgress) return fail(rank, what, ncclText(rc, m_comms[r]));
        TS_TRY(settle(rank, what, Clock::now() + m_timeout));
        // Wait for the stream, still watching for peers' failures (a dead peer leaves the
        // kernel waiting forever). A query that answers cudaErrorNotReady also leaves it as the
        // thread's last error, which the next kernel launch's cudaGetLastError() would report as
        // its own failure ("device not ready" in the optimizer): each such answer is cleared.
        auto deadline = Clock::time_point::max();
        int spins = 0;
        while (true) {
            const cudaError_t q = cudaStreamQuery(m_streams[r]);
            if (q == cudaSuccess) return okStatus();
            if (q != cudaErrorNotReady) return fail(rank, what, cudaText(q));
            (void)cudaGetLastError();
            if (deadline == Clock::time_point::max()) {
                const cudaError_t ev = cudaEventQuery(m_started[r]);
                if (ev == cudaSuccess) deadline = Clock::now() + m_timeout;
                else if (ev == cudaErrorNotReady) (void)cudaGetLastError();
                else return fail(rank, what, cudaText(ev));
            }
            TS_TRY(poll(rank, what, deadline));
            if (++spins > 64) std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
    }

    // Waits until the rank's communicator has no call in progress (non-blocking mode).
    Status settle(int rank, const std::string& what, Clock::time_point deadline)
    {
        while (true) {
            ncclResult_t st = ncclSuccess;
            const ncclResult_t rc = ncclCommGetAsyncError(m_comms[static_cast<std::size_t>(rank)], &st);
            if (rc != ncclSuccess) return fail(rank, what, ncclText(rc, m_comms[static_cast<std::size_t>(rank)]));
            if (st == ncclSuccess) return okStatus();
            if (st != ncclInProgress) return fail(rank, what, ncclText(st, m_comms[static_cast<std::size_t>(rank)]));
            TS_TRY(checkAbortAndTime(rank, what, deadline));
            std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
    }

    Status poll(int rank, const std::string& what, Clock::time_point deadline)
    {
        ncclResult_t st = ncclSuccess;
        if (const ncclResult_t rc = ncclCommGetAsyncError(m_comms[static_cast<std::size_t>(rank)], &st); rc != ncclSuccess)
            return fail(rank, what, ncclText(rc, m_comms[static_cast<std::size_t>(rank)]));
        if (st != ncclSuccess && st != ncclInProgress) return fail(rank, what, ncclText(st, m_comms[static_cast<std::size_t>(rank)]));
        return checkAbortAndTime(rank, what, deadline);
    }

    Status checkAbortAndTime(int rank, const std::string& what, Clock::time_point deadline)
    {
        std::optional<Error> stop;
        {
            std::lock_guard lock(m_mutex);
            if (m_failed) stop = *m_failed;
            else if (m_aborted) stop = makeError(ErrorCode::Cancelled, "collective aborted: " + m_reason);
        }
        if (stop) {
            abortRank(rank);  // outside the lock: NCCL's abort blocks while it tears down
            return *stop;
        }
        if (Clock::now() >= deadline)
            return fail(rank, what,
                        "no progress for " + std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(m_timeout).count()) +
                            " ms: a replica's process stopped, hangs, or cannot reach this one");
        return okStatus();
    }

    Status fail(int rank, const std::string& what, const std::string& detail)
    {
        Error err = makeError(ErrorCode::IoError, what + " on " + deviceName(rank) + " failed: " + detail,
                              "the run stops; restart the failed task and resume from the last checkpoint");
        {
            std::lock_guard lock(m_mutex);
            if (!m_failed) m_failed = err;
        }
        abortRank(rank);
        return err;
    }

    // Only the rank's own thread calls this (or the destructor): NCCL calls on one communicator
    // are not made from two threads at once.
    void abortRank(int rank)
    {
        const std::size_t r = static_cast<std::size_t>(rank);
        if (m_dead[r] || !m_comms[r]) return;
        DeviceGuard guard;
        cudaSetDevice(m_devices[r]);
        ncclCommAbort(m_comms[r]);
        m_comms[r] = nullptr;
        m_dead[r] = 1;
    }

    std::vector<int> m_devices;
    int m_processRank, m_processCount;
    std::chrono::milliseconds m_timeout;
    std::vector<ncclComm_t> m_comms;
    std::vector<cudaStream_t> m_streams;
    std::vector<void*> m_scratch;
    std::vector<cudaEvent_t> m_started;  // per rank: recorded before each collective
    std::vector<char> m_dead;  // per rank, touched only by that rank's thread (not vector<bool>: bits share bytes)

    std::mutex m_mutex;
    bool m_aborted = false;
    std::string m_reason;
    std::optional<Error> m_failed;
};

} // namespace

Result<std::unique_ptr<Communicator>> makeNcclCommunicator(const CollectiveGroup& group)
{
    if (group.devices.empty()) return makeError(ErrorCode::InvalidArgument, "an NCCL communicator needs at least one device");
    if (group.processCount < 1 || group.processRank < 0 || group.processRank >= group.processCount)
        return makeError(ErrorCode::InvalidArgument, "process rank " + std::to_string(group.processRank) + " is not in 0.." +
                                                         std::to_string(group.processCount - 1));
    if (group.processCount > 1 && !group.crossProcess)
        return makeError(ErrorCode::InvalidArgument, "a multi-process NCCL communicator needs the processes' link to exchange its id");
    for (std::size_t i = 0; i < group.devices.size(); ++i)
        for (std::size_t j = i + 1; j < group.devices.size(); ++j)
            if (group.devices[i] == group.devices[j])
                return makeError(ErrorCode::InvalidArgument, "gpu:" + std::to_string(group.devices[i]) + " is listed twice",
                                 "NCCL takes one replica per GPU");
    auto comm = std::make_unique<NcclCommunicator>(group);
    TS_TRY(comm->connect(group.crossProcess));
    return std::unique_ptr<Communicator>(std::move(comm));
}

} // namespace ts::cuda
