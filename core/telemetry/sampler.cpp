#include "telemetry/sampler.h"
#include "common/background_thread.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>

#include "telemetry/bus.h"
#include "telemetry/tracer.h"

namespace ts::telemetry {

Result<CpuJiffies> readCpuJiffies(const std::string& statPath)
{
    std::ifstream in(statPath);
    if (!in)
        return makeError(ErrorCode::IoError, "cannot read " + statPath,
                         "CPU utilisation needs Linux procfs; run without the device sampler elsewhere");
    CpuJiffies out;
    std::string line;
    while (std::getline(in, line)) {
        if (line.compare(0, 3, "cpu") != 0) {
            if (!out.total.empty()) break;  // the cpu lines come first, together
            continue;
        }
        std::istringstream ls(line);
        std::string label;
        ls >> label;
        uint64_t v[8] = {};
        int n = 0;
        while (n < 8 && ls >> v[n]) ++n;
        if (n < 4)
            return makeError(ErrorCode::ParseError, statPath + ": line '" + line + "' has fewer than 4 counters");
        // user nice system idle iowait irq softirq steal (guest time is already in user).
        uint64_t total = 0;
        for (int i = 0; i < n; ++i) total += v[i];
        const uint64_t idle = v[3] + (n > 4 ? v[4] : 0);
        out.busy.push_back(total - idle);
        out.total.push_back(total);
    }
    if (out.total.empty()) return makeError(ErrorCode::ParseError, statPath + ": no cpu lines");
    return out;
}

Result<uint64_t> readProcessTicks(const std::string& pidStatPath)
{
    std::ifstream in(pidStatPath);
    std::string text;
    if (!in || !std::getline(in, text)) return makeError(ErrorCode::IoError, "cannot read " + pidStatPath);
    // The command name (field 2) is in parentheses and may contain spaces: parse after the last ')'.
    const auto close = text.rfind(')');
    if (close == std::string::npos) return makeError(ErrorCode::ParseError, pidStatPath + ": no ')' after the command name");
    std::istringstream ls(text.substr(close + 1));
    std::string field;
    uint64_t utime = 0, stime = 0;
    for (int i = 3; i <= 15; ++i) {  // fields 3..15; utime is 14, stime 15
        if (!(ls >> field)) return makeError(ErrorCode::ParseError, pidStatPath + ": fewer than 15 fields");
        if (i == 14) utime = std::strtoull(field.c_str(), nullptr, 10);
        if (i == 15) stime = std::strtoull(field.c_str(), nullptr, 10);
    }
    return utime + stime;
}

Result<uint64_t> readKbField(const std::string& path, const std::string& key)
{
    std::ifstream in(path);
    if (!in) return makeError(ErrorCode::IoError, "cannot read " + path);
    std::string line;
    const std::string prefix = key + ":";
    while (std::getline(in, line)) {
        if (line.compare(0, prefix.size(), prefix) != 0) continue;
        std::istringstream ls(line.substr(prefix.size()));
        uint64_t v = 0;
        std::string unit;
        if (!(ls >> v)) return makeError(ErrorCode::ParseError, path + ": '" + key + "' has no number");
        ls >> unit;
        return unit == "kB" ? v * 1024 : v;
    }
    return makeError(ErrorCode::NotFound, path + ": no '" + key + "' line");
}

DeviceSampler::DeviceSampler(SamplerOptions options) : m_options(std::move(options))
{
    const long t = sysconf(_SC_CLK_TCK);
    if (t > 0) m_ticksPerSecond = t;
}

DeviceSampler::~DeviceSampler() { stop(); }

void DeviceSampler::addProbe(const Lane& lane, std::function<DeviceSample()> probe)
{
    m_probes.emplace_back(lane, std::move(probe));
}

Result<DeviceSampleEvent> DeviceSampler::sampleHost(int64_t step, int64_t wallUs)
{
    const std::string& root = m_options.procRoot;
    TS_ASSIGN(CpuJiffies cpu, readCpuJiffies(root + "/stat"));
    TS_ASSIGN(uint64_t procTicks, readProcessTicks(root + "/self/stat"));
    const int64_t t = nowNs();
    DeviceSampleEvent e;
    e.stamp.runId = m_options.runId;
    e.stamp.step = step;
    e.stamp.wallTimeUs = wallUs;
    e.stamp.lane = m_options.hostLane;
    auto rss = readKbField(root + "/self/status", "VmRSS");
    if (rss.ok()) e.memoryUsed = *rss;
    if (m_memTotal == 0) {
        auto total = readKbField(root + "/meminfo", "MemTotal");
        if (total.ok()) m_memTotal = *total;
    }
    e.memoryTotal = m_memTotal;
    if (m_haveBaseline && m_lastCpu.total.size() == cpu.total.size()) {
        auto util = [&](std::size_t i) {
            const uint64_t dt = cpu.total[i] - std::min(cpu.total[i], m_lastCpu.total[i]);
            const uint64_t db = cpu.busy[i] - std::min(cpu.busy[i], m_lastCpu.busy[i]);
            return dt == 0 ? 0.0 : std::clamp(static_cast<double>(db) / static_cast<double>(dt), 0.0, 1.0);
        };
        e.utilisation = util(0);
        for (std::size_t i = 1; i < cpu.total.size(); ++i) e.perCore.push_back(util(i));
        const double seconds = static_cast<double>(t - m_lastNs) * 1e-9;
        if (seconds > 0)
            e.processCpu = static_cast<double>(procTicks - std::min(procTicks, m_lastProcTicks)) /
                           static_cast<double>(m_ticksPerSecond) / seconds;
    }
    m_lastCpu = std::move(cpu);
    m_lastProcTicks = procTicks;
    m_lastNs = t;
    m_haveBaseline = true;
    return e;
}

std::vector<DeviceSampleEvent> DeviceSampler::sampleOnce()
{
    std::vector<DeviceSampleEvent> out;
    const int64_t step = m_options.step ? m_options.step->load(std::memory_order_relaxed) : 0;
    const int64_t wallUs = wallNowMicros();
    if (m_options.host) {
        auto host = sampleHost(step, wallUs);
        if (host.ok()) out.push_back(std::move(host).value());
    }
    for (const auto& [lane, probe] : m_probes) {
        const DeviceSample s = probe();
        if (s.utilisation < 0 && s.memoryTotal == 0 && s.memoryUsed == 0) continue;
        DeviceSampleEvent e;
        e.stamp.runId = m_options.runId;
        e.stamp.step = step;
        e.stamp.wallTimeUs = wallUs;
        e.stamp.lane = lane;
        e.utilisation = s.utilisation;
        e.memoryUsed = s.memoryUsed;
        e.memoryTotal = s.memoryTotal;
        e.temperatureC = s.temperatureC;
        e.powerW = s.powerW;
        out.push_back(std::move(e));
    }
    m_ticks.fetch_add(1, std::memory_order_relaxed);
    return out;
}

Status DeviceSampler::start(EventBus& bus)
{
    if (m_thread.joinable()) return makeError(ErrorCode::InvalidArgument, "the device sampler is already running");
    if (!(m_options.hz > 0))
        return makeError(ErrorCode::InvalidArgument, "device sampling rate must be > 0 Hz, got " + std::to_string(m_options.hz));
    if (m_options.host) {
        TS_TRY(sampleHost(0, 0));  // baseline; also proves /proc is readable
    }
    m_stop = false;
    const auto period = std::chrono::nanoseconds(static_cast<int64_t>(1e9 / m_options.hz));
    m_thread = std::thread([this, &bus, period] {
        becomeBackgroundThread("ts-sampler");
        Tracer::setThreadLane(m_options.hostLane);
        auto last = std::chrono::steady_clock::now();
        auto next = last + period;
        std::unique_lock lock(m_mutex);
        while (!m_stop) {
            if (m_cv.wait_until(lock, next, [this] { return m_stop; })) break;
            lock.unlock();
            for (auto& e : sampleOnce()) bus.publish(Event(std::move(e)));
            last = std::chrono::steady_clock::now();
            lock.lock();
            next += period;
            if (next < last) next = last + period;  // fell behind (suspended): don't burst
        }
        lock.unlock();
        // A closing round for the tail since the last tick, so a run shorter than one period
        // still has every lane on its dashboards; not when a tick has just covered it.
        if (ticks() == 0 || std::chrono::steady_clock::now() - last >= period / 2)
            for (auto& e : sampleOnce()) bus.publish(Event(std::move(e)));
    });
    return okStatus();
}

void DeviceSampler::stop()
{
    if (!m_thread.joinable()) return;
    {
        std::lock_guard lock(m_mutex);
        m_stop = true;
    }
    m_cv.notify_all();
    m_thread.join();
}

} // namespace ts::telemetry
