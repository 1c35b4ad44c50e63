#pragma once
// Backend registry: an explicit list of built-in backends (reference, cpu) plus modules loaded
// by path from plugins/ (e.g. libtrainstudio-cuda.so exporting ts_register_backends).
// Thread-safe; factories are registered at start-up and live for the process.

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "distribute/communicator.h"

namespace ts {

// The replicas a device collective joins: this process's replicas on `devices` (local rank r on
// devices[r]) and, when `crossProcess` is set, the same number of replicas in each other process
// of a multi-worker run (global rank = processRank * devices.size() + r). The factory exchanges
// what its library needs to connect (NCCL's unique id) over crossProcess, as one broadcast from
// process 0 that every process makes at the same point.
struct CollectiveGroup {
    std::vector<int> devices;
    Communicator* crossProcess = nullptr;  // not owned; null: this process only
    int processRank = 0, processCount = 1;
    std::chrono::milliseconds timeout{30000};  // a call that makes no progress this long fails
};

struct BackendFactory {
    std::string name;                    // "reference", "cpu", "cuda"
    DeviceKind kind = DeviceKind::Cpu;
    int priority = 0;                    // higher is preferred for a device kind
    // Devices this backend can drive right now (e.g. no GPUs -> empty).
    std::function<std::vector<DeviceInfo>()> enumerate;
    // Creates an instance bound to one device index.
    std::function<Result<std::unique_ptr<Backend>>(int deviceIndex, const BackendOptions&)> create;
    // Collectives between replicas whose tensors live in this backend's device memory (NCCL for
    // cuda); the communicator's rank is the local replica index. Empty for host backends, whose
    // tensors the host communicators (local, Gloo) reduce directly.
    std::function<Result<std::unique_ptr<Communicator>>(const CollectiveGroup&)> communicator;
};

class BackendRegistry {
public:
    static BackendRegistry& instance();  // with the built-in backends registered

    void add(BackendFactory factory);
    std::vector<std::string> names() const;
    // Lookups that miss load the default plugins once (loadDefaultPlugins) and look again.
    const BackendFactory* find(const std::string& name) const;
    // The preferred backend for a device kind ("cpu" for Cpu when built with oneDNN).
    const BackendFactory* preferred(DeviceKind kind) const;

    Result<std::unique_ptr<Backend>> create(const std::string& name, int deviceIndex,
                                            const BackendOptions& options) const;
    // Best backend for a device ("cpu:1" -> cpu backend, logical device 1).
    Result<std::unique_ptr<Backend>> create(const Device& device, const BackendOptions& options) const;

    // dlopen a plugin and call its `extern "C" void ts_register_backends(ts::BackendRegistry*)`.
    Status loadPlugin(const std::string& path);
    // Loads every libtrainstudio-*.so found next to the executable or in $TRAINSTUDIO_PLUGIN_PATH;
    // failures are returned as messages, not fatal (the app keeps working on the CPU). Hosts
    // that list devices (the studio) call it at start; otherwise the first lookup that misses
    // does.
    std::vector<std::string> loadDefaultPlugins();

private:
    BackendRegistry();
    bool loadPluginsOnce() const;  // false if they were loaded (or tried) before
    struct Impl;
    std::shared_ptr<Impl> m_d;
};

// Built-in factories (explicit list, no static-init magic).
BackendFactory referenceBackendFactory();
BackendFactory cpuBackendFactory();

} // namespace ts
