#pragma once
// Per-GPU state shared by every CudaBackend instance on that GPU: the one stream all work on the
// device is queued on, and the caching allocator that hands out its memory. Both live for the
// process (never destroyed): tensors may outlive the backend that made them, and tearing CUDA
// state down from static destructors after the runtime has unloaded crashes at exit.
//
// CachingAllocator contract (on top of ts::Allocator's):
//  - Memory comes from plain cudaMalloc (never managed memory; see RawDeviceMemory), rounded up to a size class; a
//    freed block goes to its class's free list and is handed out again for the same class.
//  - Reuse is safe without events because every op on this device runs on the device's one
//    stream: work that read a block is queued before any work that reuses it.
//  - On allocation failure the cache is released (cudaFree of every cached block) and the
//    allocation retried once; a second failure returns nullptr and records the request for the
//    error message (lastFailure()).
//  - Thread-safe; stats() is consistent under the same lock.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "common/result.h"
#include "tensor/tensor.h"

namespace ts::cuda {

// "CUDA error 2 (out of memory) in cudaMalloc" as a typed Error naming the device.
Error cudaFailure(cudaError_t err, const std::string& what, int device);
// Status from a CUDA runtime call.
Status cudaCheck(cudaError_t err, const char* what, int device);

struct AllocatorStats {
    uint64_t bytesInUse = 0;    // handed out (size-class rounded)
    uint64_t bytesCached = 0;   // held in free lists
    uint64_t peakInUse = 0;
    uint64_t deviceAllocs = 0;  // cudaMalloc calls that succeeded
    uint64_t cacheHits = 0;     // allocations served from a free list
    uint64_t releases = 0;      // times the cache was emptied to satisfy an allocation
};

// Where the allocator's blocks come from: cudaMalloc/cudaFree on the device (cudaRawMemory), or,
// in tests, any function pair, so the caching logic is exercised on machines without a GPU.
struct RawDeviceMemory {
    std::function<void*(std::size_t)> allocate;  // nullptr when the device has no room
    std::function<void(void*)> release;
    std::function<uint64_t()> freeBytes;         // for out-of-memory messages
};
RawDeviceMemory cudaRawMemory(int device);

class CachingAllocator final : public Allocator {
public:
    CachingAllocator(int device, RawDeviceMemory raw);

    void* allocate(std::size_t bytes) override;
    void deallocate(void* p, std::size_t bytes) override;
    Device device() const override { return Device{DeviceKind::Cuda, m_device}; }
    bool hostAccessible() const override { return false; }

    AllocatorStats stats() const;
    // Returns every cached block to the driver (cudaFree); blocks in use are untouched.
    void releaseCached();
    // Size class of a request: 512-byte steps up to 1 MiB, then four classes per power of two
    // (so at most 25% slack); exposed for the allocator test.
    static std::size_t sizeClass(std::size_t bytes);
    // The last request that failed, for out-of-memory messages: bytes asked, bytes free then.
    std::pair<uint64_t, uint64_t> lastFailure() const;

private:
    void releaseLocked();

    int m_device;
    RawDeviceMemory m_raw;
    mutable std::mutex m_mutex;
    std::map<std::size_t, std::vector<void*>> m_free;  // size class -> cached blocks
    std::map<void*, std::size_t> m_live;               // block -> size class
    AllocatorStats m_stats;
    uint64_t m_failBytes = 0, m_failFree = 0;
};

struct DeviceContext {
    int index = 0;
    cudaStream_t stream = nullptr;
    CachingAllocator* allocator = nullptr;
    cudaDeviceProp props{};
};

// The process-wide context of a device, created on first use (stream and allocator); an error if
// the device cannot be initialised.
Result<DeviceContext*> deviceContext(int device);

// Devices the plugin drives: compute capability 9.0 or newer (the code is built for sm_90).
// `why` receives a sentence per device or failure that explains what was skipped.
std::vector<int> usableDevices(std::string* why);

} // namespace ts::cuda
