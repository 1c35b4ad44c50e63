// The plugin's entry point: BackendRegistry::loadPlugin() dlopens libtrainstudio-cuda.so and calls
// ts_register_backends. With no driver or no usable GPU it registers nothing (the app keeps working
// on the CPU) and says why on stderr and through ts_cuda_plugin_status().

#include <cstdio>
#include <mutex>
#include <string>

#include "backend/registry.h"
#include "cuda_backend.h"
#include "cuda_device.h"
#include "nccl_communicator.h"

namespace {

std::string& pluginStatus()
{
    static std::string status = "not registered yet";
    return status;
}

ts::BackendFactory cudaFactory(std::vector<int> devices)
{
    ts::BackendFactory f;
    f.name = "cuda";
    f.kind = ts::DeviceKind::Cuda;
    f.priority = 10;
    f.enumerate = [devices] {
        std::vector<ts::DeviceInfo> out;
        for (int d : devices)
            if (auto info = ts::cuda::deviceInfo(d); info.ok()) out.push_back(*info);
        return out;
    };
    f.create = [devices](int deviceIndex, const ts::BackendOptions& options) -> ts::Result<std::unique_ptr<ts::Backend>> {
        bool usable = false;
        for (int d : devices) usable |= d == deviceIndex;
        if (!usable) {
            std::string list;
            for (int d : devices) list += (list.empty() ? "gpu:" : ", gpu:") + std::to_string(d);
            return ts::makeError(ts::ErrorCode::NotFound,
                                 "cuda backend: gpu:" + std::to_string(deviceIndex) + " is not a usable device",
                                 "usable devices: " + list);
        }
        return ts::cuda::CudaBackend::create(deviceIndex, options);
    };
    f.communicator = [](const ts::CollectiveGroup& group) { return ts::cuda::makeNcclCommunicator(group); };
    return f;
}

} // namespace

extern "C" __attribute__((visibility("default"))) void ts_register_backends(ts::BackendRegistry* registry)
{
    static std::mutex mutex;
    std::lock_guard lock(mutex);
    std::string why;
    std::vector<int> devices = ts::cuda::usableDevices(&why);
    if (devices.empty()) {
        // Quiet: every CPU-only machine would print this at each start. The registry puts it
        // in the error of anyone asking for the cuda backend (ts_plugin_status).
        pluginStatus() = "cuda backend not registered: " + why;
        return;
    }
    registry->add(cudaFactory(devices));
    pluginStatus() = "cuda backend registered: " + why;
}

// What the last ts_register_backends did and why (for tests and `--list-devices` style output).
extern "C" __attribute__((visibility("default"))) const char* ts_cuda_plugin_status()
{
    return pluginStatus().c_str();
}

// The same under the name every plugin may export: the registry reads it after registration.
extern "C" __attribute__((visibility("default"))) const char* ts_plugin_status() { return pluginStatus().c_str(); }

// The caching allocator's counters of `device` for tests and diagnostics: out[0] bytes in use,
// [1] bytes cached, [2] peak in use, [3] cudaMalloc calls, [4] cache hits, [5] cache releases.
// Returns 0, or -1 when `device` is not a usable device (a usable one gets its context made here,
// so a device never used reads as all zeros).
extern "C" __attribute__((visibility("default"))) int ts_cuda_allocator_stats(int device, uint64_t* out)
{
    auto ctx = ts::cuda::deviceContext(device);
    if (!ctx.ok() || !out) return -1;
    const ts::cuda::AllocatorStats s = (*ctx)->allocator->stats();
    const uint64_t values[6] = {s.bytesInUse, s.bytesCached, s.peakInUse, s.deviceAllocs, s.cacheHits, s.releases};
    for (int i = 0; i < 6; ++i) out[i] = values[i];
    return 0;
}
