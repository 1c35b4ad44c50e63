#pragma once
// NvmlProbe: GPU utilisation, memory, temperature and power from NVML, loaded with
// dlopen("libnvidia-ml.so.1") so the plugin has no link-time dependency on the driver (no nvml.h
// ships with the toolkit here: the few functions used are declared in the .cpp).
// Contract: available() is false when the library or nvmlInit fails, and sample() then reports
// only what the CUDA runtime knows (memory). Thread-safe (NVML is); used from the sampler thread.

#include <string>

#include "backend/backend.h"

namespace ts::cuda {

class NvmlProbe {
public:
    static NvmlProbe& instance();  // loads NVML once per process

    bool available() const { return m_ok; }
    const std::string& status() const { return m_status; }  // why it is unavailable
    // Sample of the CUDA device `cudaDevice` (mapped to NVML by PCI bus id, since CUDA's and
    // NVML's device orders can differ). Fields NVML cannot give stay unknown (-1 / 0).
    DeviceSample sample(int cudaDevice) const;

private:
    NvmlProbe();
    bool m_ok = false;
    std::string m_status;
    struct Fns;
    Fns* m_fns = nullptr;
};

} // namespace ts::cuda
