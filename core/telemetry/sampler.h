#pragma once
// DeviceSampler: a thread that samples the host (per-core and process CPU utilisation from
// /proc/stat and /proc/self/stat, process RSS from /proc/self/status, total memory from
// /proc/meminfo) and any number of device probes (Backend::sample() of a GPU backend) at a fixed
// rate, and publishes DeviceSampleEvents stamped with the current global step.
// Contract:
//  - Threading: configure (addProbe) before start(); start/stop from one owner thread. Probes
//    run on the sampler thread and must be safe to call from it while training runs.
//  - Step axis: every sample carries the value of the step counter passed in the options
//    (the Trainer's atomic), read when the sample is taken.
//  - The first host sample needs a previous reading for utilisation, so the thread takes a
//    baseline at start and publishes from the first tick on; stop() publishes
//    one closing round (the tail since the last tick), so even a run shorter than one period
//    has a sample per lane.
//  - Errors: start() fails if /proc cannot be read (not Linux, no procfs); a probe whose sample
//    reports nothing (utilisation < 0 and no memory) is skipped for that tick.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "common/result.h"
#include "telemetry/events.h"

namespace ts::telemetry {

class EventBus;

struct SamplerOptions {
    double hz = 10;                         // samples per second
    std::string runId;
    const std::atomic<int64_t>* step = nullptr;  // null: step 0
    Lane hostLane{"local", "", "sampler"};  // lane.device "" = the host
    bool host = true;                       // sample /proc
    std::string procRoot = "/proc";         // tests point it at a fixture tree
};

// /proc readers (exposed for tests). Jiffies per CPU line of /proc/stat: index 0 is the "cpu"
// aggregate, then cpu0, cpu1, ...
struct CpuJiffies {
    std::vector<uint64_t> busy, total;
};
Result<CpuJiffies> readCpuJiffies(const std::string& statPath);
// utime + stime of a /proc/<pid>/stat file, in clock ticks.
Result<uint64_t> readProcessTicks(const std::string& pidStatPath);
// A "Key:   123 kB" line of /proc/self/status or /proc/meminfo, in bytes.
Result<uint64_t> readKbField(const std::string& path, const std::string& key);

class DeviceSampler {
public:
    explicit DeviceSampler(SamplerOptions options);
    ~DeviceSampler();
    DeviceSampler(const DeviceSampler&) = delete;
    DeviceSampler& operator=(const DeviceSampler&) = delete;

    void addProbe(const Lane& lane, std::function<DeviceSample()> probe);

    // Checks /proc, takes the baseline and starts the thread publishing to `bus`.
    Status start(EventBus& bus);
    void stop();
    bool running() const { return m_thread.joinable(); }

    // One round now: the host sample (utilisation since the previous call) and every probe's.
    // The thread calls this each tick; tests call it directly.
    std::vector<DeviceSampleEvent> sampleOnce();
    uint64_t ticks() const { return m_ticks.load(std::memory_order_relaxed); }

private:
    Result<DeviceSampleEvent> sampleHost(int64_t step, int64_t wallUs);

    SamplerOptions m_options;
    std::vector<std::pair<Lane, std::function<DeviceSample()>>> m_probes;
    CpuJiffies m_lastCpu;
    uint64_t m_lastProcTicks = 0;
    int64_t m_lastNs = 0;
    bool m_haveBaseline = false;
    uint64_t m_memTotal = 0;
    long m_ticksPerSecond = 100;
    std::atomic<uint64_t> m_ticks{0};
    std::mutex m_mutex;
    std::condition_variable m_cv;
    bool m_stop = false;
    std::thread m_thread;
};

} // namespace ts::telemetry
