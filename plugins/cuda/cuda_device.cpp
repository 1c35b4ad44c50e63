#include "cuda_device.h"

#include <algorithm>
#include <array>
#include <bit>

namespace ts::cuda {

Error cudaFailure(cudaError_t err, const std::string& what, int device)
{
    const std::string dev = "gpu:" + std::to_string(device);
    if (err == cudaErrorMemoryAllocation)
        return makeError(ErrorCode::OutOfMemory, "CUDA out of memory on " + dev + " in " + what,
                         "lower the per-replica batch or use fewer/smaller layers");
    std::string hint = "check the driver (nvidia-smi) and that no other process holds the GPU";
    if (err == cudaErrorInsufficientDriver || err == cudaErrorNoDevice)
        hint = "install an NVIDIA driver for CUDA 13, or train on cpu:N devices";
    return makeError(ErrorCode::Internal,
                     "CUDA error " + std::to_string(int(err)) + " (" + cudaGetErrorString(err) + ") on " + dev +
                         " in " + what,
                     hint);
}

Status cudaCheck(cudaError_t err, const char* what, int device)
{
    if (err == cudaSuccess) return okStatus();
    return cudaFailure(err, what, device);
}

namespace {

// Makes `device` current for the scope and restores the previous one: the allocator runs on
// whichever thread frees a tensor, which may drive another GPU.
class DeviceGuard {
public:
    explicit DeviceGuard(int device)
    {
        if (cudaGetDevice(&m_prev) != cudaSuccess) m_prev = -1;
        if (m_prev != device) cudaSetDevice(device);
    }
    ~DeviceGuard()
    {
        int cur = -1;
        if (m_prev >= 0 && cudaGetDevice(&cur) == cudaSuccess && cur != m_prev) cudaSetDevice(m_prev);
    }
    DeviceGuard(const DeviceGuard&) = delete;
    DeviceGuard& operator=(const DeviceGuard&) = delete;

private:
    int m_prev = -1;
};

} // namespace

RawDeviceMemory cudaRawMemory(int device)
{
    RawDeviceMemory raw;
    raw.allocate = [device](std::size_t bytes) -> void* {
        DeviceGuard guard(device);
        void* p = nullptr;
        if (cudaMalloc(&p, bytes) != cudaSuccess) {
            (void)cudaGetLastError();  // clear the error so the next call starts clean
            return nullptr;
        }
        return p;
    };
    raw.release = [device](void* p) {
        DeviceGuard guard(device);
        cudaFree(p);  // implicit device sync: queued users of the block finish first
    };
    raw.freeBytes = [device]() -> uint64_t {
        DeviceGuard guard(device);
        std::size_t freeB = 0, totalB = 0;
        if (cudaMemGetInfo(&freeB, &totalB) != cudaSuccess) {
            (void)cudaGetLastError();
            return 0;
        }
        return freeB;
    };
    return raw;
}

CachingAllocator::CachingAllocator(int device, RawDeviceMemory raw) : m_device(device), m_raw(std::move(raw)) {}

std::size_t CachingAllocator::sizeClass(std::size_t bytes)
{
    constexpr std::size_t kSmallStep = 512;
    constexpr std::size_t kSmallMax = std::size_t(1) << 20;
    if (bytes == 0) bytes = 1;
    if (bytes <= kSmallMax) return (bytes + kSmallStep - 1) / kSmallStep * kSmallStep;
    // Four classes per power of two: step = 2^(floor(log2(bytes)) - 2).
    const std::size_t top = std::bit_floor(bytes);
    const std::size_t step = top / 4;
    return (bytes + step - 1) / step * step;
}

void* CachingAllocator::allocate(std::size_t bytes)
{
    const std::size_t cls = sizeClass(bytes);
    std::lock_guard lock(m_mutex);
    auto it = m_free.find(cls);
    void* p = nullptr;
    if (it != m_free.end() && !it->second.empty()) {
        p = it->second.back();
        it->second.pop_back();
        m_stats.bytesCached -= cls;
        ++m_stats.cacheHits;
    } else {
        p = m_raw.allocate(cls);
        if (!p && m_stats.bytesCached > 0) {
            // Cached blocks of other sizes may be what the device lacks: give them back, retry.
            releaseLocked();
            ++m_stats.releases;
            p = m_raw.allocate(cls);
        }
        if (!p) {
            m_failBytes = cls;
            m_failFree = m_raw.freeBytes ? m_raw.freeBytes() : 0;
            return nullptr;
        }
        ++m_stats.deviceAllocs;
    }
    m_live[p] = cls;
    m_stats.bytesInUse += cls;
    m_stats.peakInUse = std::max(m_stats.peakInUse, m_stats.bytesInUse);
    return p;
}

void CachingAllocator::deallocate(void* p, std::size_t)
{
    if (!p) return;
    std::lock_guard lock(m_mutex);
    auto it = m_live.find(p);
    if (it == m_live.end()) return;  // not ours: ignore rather than corrupt the free lists
    const std::size_t cls = it->second;
    m_live.erase(it);
    m_stats.bytesInUse -= cls;
    m_free[cls].push_back(p);
    m_stats.bytesCached += cls;
}

AllocatorStats CachingAllocator::stats() const
{
    std::lock_guard lock(m_mutex);
    return m_stats;
}

void CachingAllocator::releaseCached()
{
    std::lock_guard lock(m_mutex);
    releaseLocked();
}

void CachingAllocator::releaseLocked()
{
    for (auto& [cls, blocks] : m_free) {
        for (void* p : blocks) m_raw.release(p);
        m_stats.bytesCached -= cls * blocks.size();
        blocks.clear();
    }
    m_free.clear();
}

std::pair<uint64_t, uint64_t> CachingAllocator::lastFailure() const
{
    std::lock_guard lock(m_mutex);
    return {m_failBytes, m_failFree};
}

Result<DeviceContext*> deviceContext(int device)
{
    static std::mutex mutex;
    static std::map<int, DeviceContext*> contexts;  // leaked on purpose (see the header)
    std::lock_guard lock(mutex);
    auto it = contexts.find(device);
    if (it != contexts.end()) return it->second;
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) return cudaFailure(err, "cudaGetDeviceCount", device);
    if (device < 0 || device >= count)
        return makeError(ErrorCode::NotFound,
                         "no CUDA device gpu:" + std::to_string(device) + " (this machine has " +
                             std::to_string(count) + ")",
                         "use gpu:0 .. gpu:" + std::to_string(std::max(0, count - 1)));
    DeviceGuard guard(device);
    auto* ctx = new DeviceContext;
    ctx->index = device;
    err = cudaGetDeviceProperties(&ctx->props, device);
    if (err == cudaSuccess) err = cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking);
    if (err != cudaSuccess) {
        delete ctx;
        return cudaFailure(err, "creating the device's stream", device);
    }
    ctx->allocator = new CachingAllocator(device, cudaRawMemory(device));
    contexts[device] = ctx;
    return ctx;
}

std::vector<int> usableDevices(std::string* why)
{
    std::vector<int> out;
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        if (why)
            *why = std::string("no usable CUDA device: cudaGetDeviceCount failed with error ") +
                   std::to_string(int(err)) + " (" + cudaGetErrorString(err) + ")";
        return out;
    }
    if (count == 0) {
        if (why) *why = "no CUDA device on this machine";
        return out;
    }
    std::string notes;
    for (int d = 0; d < count; ++d) {
        cudaDeviceProp props{};
        if (cudaGetDeviceProperties(&props, d) != cudaSuccess) {
            (void)cudaGetLastError();
            notes += "gpu:" + std::to_string(d) + " skipped (cannot read its properties); ";
            continue;
        }
        if (props.major < 9) {
            notes += "gpu:" + std::to_string(d) + " (" + props.name + ", sm_" + std::to_string(props.major) +
                     std::to_string(props.minor) + ") skipped: this build has sm_90 code only; ";
            continue;
        }
        out.push_back(d);
    }
    if (why) *why = std::to_string(out.size()) + " usable CUDA device(s)" + (notes.empty() ? "" : "; " + notes);
    return out;
}

} // namespace ts::cuda
