#include "nvml_probe.h"

#include <dlfcn.h>

#include <cuda_runtime.h>

namespace ts::cuda {

namespace {
// The NVML ABI used here (stable since NVML 4; nvml.h is not available to include).
using nvmlReturn_t = int;
constexpr nvmlReturn_t kNvmlSuccess = 0;
struct nvmlDeviceOpaque;
using nvmlDevice_t = nvmlDeviceOpaque*;
struct nvmlUtilization_t {
    unsigned int gpu;
    unsigned int memory;
};
struct nvmlMemory_t {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
};
constexpr int kNvmlTemperatureGpu = 0;
} // namespace

struct NvmlProbe::Fns {
    nvmlReturn_t (*init)();
    const char* (*errorString)(nvmlReturn_t);
    nvmlReturn_t (*byPciBusId)(const char*, nvmlDevice_t*);
    nvmlReturn_t (*utilization)(nvmlDevice_t, nvmlUtilization_t*);
    nvmlReturn_t (*memory)(nvmlDevice_t, nvmlMemory_t*);
    nvmlReturn_t (*temperature)(nvmlDevice_t, int, unsigned int*);
    nvmlReturn_t (*power)(nvmlDevice_t, unsigned int*);
};

NvmlProbe& NvmlProbe::instance()
{
    static NvmlProbe* probe = new NvmlProbe;  // never unloaded: samplers may run until exit
    return *probe;
}

NvmlProbe::NvmlProbe()
{
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char* e = dlerror();
        m_status = std::string("NVML not loaded (") + (e ? e : "libnvidia-ml.so.1 not found") +
                   "): GPU utilisation, temperature and power are unknown";
        return;
    }
    auto fns = new Fns{};
    auto sym = [&](auto& fn, const char* name) {
        fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
        return fn != nullptr;
    };
    const bool all = sym(fns->init, "nvmlInit_v2") && sym(fns->errorString, "nvmlErrorString") &&
                     sym(fns->byPciBusId, "nvmlDeviceGetHandleByPciBusId_v2") &&
                     sym(fns->utilization, "nvmlDeviceGetUtilizationRates") &&
                     sym(fns->memory, "nvmlDeviceGetMemoryInfo") && sym(fns->temperature, "nvmlDeviceGetTemperature") &&
                     sym(fns->power, "nvmlDeviceGetPowerUsage");
    if (!all) {
        m_status = "NVML is too old (a function is missing): GPU utilisation is unknown";
        delete fns;
        return;
    }
    const nvmlReturn_t r = fns->init();
    if (r != kNvmlSuccess) {
        m_status = std::string("nvmlInit failed: ") + fns->errorString(r);
        delete fns;
        return;
    }
    m_fns = fns;
    m_ok = true;
    m_status = "NVML loaded";
}

DeviceSample NvmlProbe::sample(int cudaDevice) const
{
    DeviceSample s;
    if (m_ok) {
        char bus[32] = {};
        nvmlDevice_t dev = nullptr;
        if (cudaDeviceGetPCIBusId(bus, sizeof bus, cudaDevice) == cudaSuccess &&
            m_fns->byPciBusId(bus, &dev) == kNvmlSuccess) {
            nvmlUtilization_t u{};
            if (m_fns->utilization(dev, &u) == kNvmlSuccess) s.utilisation = u.gpu / 100.0;
            nvmlMemory_t m{};
            if (m_fns->memory(dev, &m) == kNvmlSuccess) {
                s.memoryUsed = m.used;
                s.memoryTotal = m.total;
            }
            unsigned int t = 0;
            if (m_fns->temperature(dev, kNvmlTemperatureGpu, &t) == kNvmlSuccess) s.temperatureC = t;
            unsigned int mw = 0;
            if (m_fns->power(dev, &mw) == kNvmlSuccess) s.powerW = mw / 1000.0;
            return s;
        }
    }
    // Without NVML: memory from the runtime (on this thread's context for the device).
    int prev = -1;
    cudaGetDevice(&prev);
    if (prev != cudaDevice) cudaSetDevice(cudaDevice);
    std::size_t freeB = 0, totalB = 0;
    if (cudaMemGetInfo(&freeB, &totalB) == cudaSuccess) {
        s.memoryTotal = totalB;
        s.memoryUsed = totalB - freeB;
    } else {
        (void)cudaGetLastError();
    }
    if (prev >= 0 && prev != cudaDevice) cudaSetDevice(prev);
    return s;
}

} // namespace ts::cuda
