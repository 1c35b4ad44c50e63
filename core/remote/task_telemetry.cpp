#include "remote/task_telemetry.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "telemetry/bus.h"
#include "telemetry/tracer.h"

namespace ts::remote {

namespace tm = ts::telemetry;

tm::Stamp taskStamp(const std::string& runId, const std::string& worker, const std::string& device, int64_t step)
{
    tm::Stamp s;
    s.runId = runId;
    s.step = step;
    s.wallTimeUs = tm::wallNowMicros();
    s.lane.worker = worker;
    s.lane.device = device;
    return s;
}

int64_t significantClockOffset(int64_t offsetUs, int64_t roundTripUs)
{
    return std::llabs(offsetUs) > std::max<int64_t>(roundTripUs, 1000) ? offsetUs : 0;
}

bool publishTaskTelemetry(const std::string& runId, const WorkerEvent& e, bool primary, tm::EventBus& bus, PsLoad& load,
                          int64_t clockOffsetUs)
{
    const auto& f = e.fields;
    if (e.kind == "sample") {
        // Every worker's devices, each on its own lane.
        tm::DeviceSampleEvent d;
        d.stamp = taskStamp(runId, e.worker, e.device == "host" ? std::string() : e.device, e.step);
        d.utilisation = f.value("utilisation", -1.0);
        if (f.contains("per_core") && f["per_core"].is_array()) d.perCore = f["per_core"].get<std::vector<double>>();
        d.processCpu = f.value("process_cpu", -1.0);
        d.memoryUsed = f.value("memory_used", uint64_t{0});
        d.memoryTotal = f.value("memory_total", uint64_t{0});
        d.temperatureC = f.value("temperature_c", -1.0);
        d.powerW = f.value("power_w", -1.0);
        bus.publish(tm::Event(std::move(d)));
    } else if (e.kind == "breakdown") {
        // The primary task's steps are the run's (every worker's are alike in lockstep).
        if (!primary) return true;
        tm::StepBreakdownEvent b;
        b.stamp = taskStamp(runId, e.worker, e.device, e.step);
        b.stepSeconds = f.value("step_seconds", 0.0);
        b.input = f.value("input", 0.0);
        b.forward = f.value("forward", 0.0);
        b.backward = f.value("backward", 0.0);
        b.communication = f.value("communication", 0.0);
        b.optimizer = f.value("optimizer", 0.0);
        b.other = f.value("other", 0.0);
        bus.publish(tm::Event(std::move(b)));
    } else if (e.kind == "pipeline") {
        tm::PipelineSampleEvent p;
        p.stamp = taskStamp(runId, e.worker, "", e.step);
        p.stage = f.value("stage", "");
        p.produced = f.value("produced", int64_t{0});
        p.busySeconds = f.value("busy_seconds", 0.0);
        p.queueDepth = f.value("queue_depth", int64_t{0});
        p.queueCapacity = f.value("queue_capacity", int64_t{0});
        p.waitSeconds = f.value("wait_seconds", 0.0);
        p.parallelism = f.value("parallelism", 1);
        bus.publish(tm::Event(std::move(p)));
    } else if (e.kind == "spans") {
        if (!f.contains("spans") || !f["spans"].is_array()) return true;
        for (const auto& j : f["spans"]) {
            if (!j.is_object()) continue;
            tm::SpanEvent sp;
            sp.stamp.runId = runId;
            sp.stamp.step = j.value("step", int64_t{0});
            sp.stamp.wallTimeUs = j.value("wall_us", int64_t{0}) - clockOffsetUs;
            sp.stamp.lane = tm::Lane{e.worker, j.value("device", ""), j.value("thread", "")};
            sp.name = j.value("name", "");
            sp.category = j.value("category", "");
            sp.startUs = j.value("start_us", int64_t{0}) - clockOffsetUs;
            sp.durationUs = j.value("duration_us", int64_t{0});
            if (j.contains("args") && j["args"].is_object())
                for (const auto& [k, v] : j["args"].items())
                    if (v.is_string()) sp.args[k] = v.get<std::string>();
            bus.publish(tm::Event(std::move(sp)));
        }
    } else if (e.kind == "log") {
        const int level = f.value("level", static_cast<int>(tm::LogLevel::Info));
        tm::LogEvent l;
        l.stamp = taskStamp(runId, e.worker, "", e.step);
        l.level = level >= 0 && level <= static_cast<int>(tm::LogLevel::Error) ? static_cast<tm::LogLevel>(level) : tm::LogLevel::Info;
        l.message = e.worker + ": " + f.value("message", "");
        bus.publish(tm::Event(std::move(l)));
    } else if (e.kind == "resumed") {
        // The chief resumed from a backup: what the failed attempt recorded after that step is
        // replayed now, so the store drops it (RunStore::rewindRun).
        if (primary) {
            tm::RunStateEvent r{taskStamp(runId, e.worker, "", e.step), tm::RunState::Running, {}};
            r.resumedAfterStep = f.value("after_step", int64_t{-1});
            bus.publish(tm::Event(std::move(r)));
        }
    } else if (e.kind == "ps") {
        // Rates since the last counters, as counter tracks on the ps's lane; a shard busy most of
        // the time for kPsBusyIntervals in a row is the run's bottleneck: say so once per streak.
        const double busy = f.value("busy_seconds", 0.0);
        const int64_t updates = f.value("updates", int64_t{0}), pulls = f.value("pulls", int64_t{0});
        const int64_t in = f.value("bytes_in", int64_t{0}), out = f.value("bytes_out", int64_t{0});
        const double dt = load.wall >= 0 ? e.wallTime - load.wall : 0;
        if (dt > 0.2) {
            const double share = std::clamp((busy - load.busy) / dt, 0.0, 1.0);
            const int64_t wallUs = static_cast<int64_t>(e.wallTime * 1e6) - clockOffsetUs;
            const std::pair<const char*, double> tracks[] = {{"ps busy %", 100 * share},
                                                             {"ps updates/s", static_cast<double>(updates - load.updates) / dt},
                                                             {"ps pulls/s", static_cast<double>(pulls - load.pulls) / dt},
                                                             {"ps MB/s in", static_cast<double>(in - load.bytesIn) / dt / 1e6},
                                                             {"ps MB/s out", static_cast<double>(out - load.bytesOut) / dt / 1e6}};
            for (const auto& [name, value] : tracks) {
                tm::SpanEvent c;
                c.stamp = tm::Stamp{runId, e.step, wallUs, tm::Lane{e.worker, "", "shard"}};
                c.name = name;
                c.category = "counter";
                c.startUs = wallUs;
                c.args["value"] = std::to_string(value);
                bus.publish(tm::Event(std::move(c)));
            }
            if (share >= kPsBusyShare) {
                if (load.busyIntervals++ == 0) load.busySince = e.step;
            } else {
                load.busyIntervals = 0;
                load.reported = false;
            }
            if (load.busyIntervals >= kPsBusyIntervals && !load.reported) {
                load.reported = true;
                tm::FindingEvent fe;
                fe.stamp = taskStamp(runId, e.worker, "", e.step);
                fe.kind = "ps-bound";
                fe.severity = "high";
                char pct[16];
                std::snprintf(pct, sizeof pct, "%.0f%%", 100 * share);
                fe.message = e.worker + " was busy " + pct + " of the time for " + std::to_string(load.busyIntervals) +
                             " s applying updates and serving pulls: the workers wait for it";
                fe.recommendation = "add ps tasks (the variables are spread over them), or partition by size so that no ps holds "
                                    "most of the bytes; fewer workers per ps also help";
                fe.firstStep = load.busySince;
                fe.lastStep = e.step;
                bus.publish(tm::Event(std::move(fe)));
            }
        }
        load.wall = e.wallTime;
        load.busy = busy;
        load.updates = updates;
        load.pulls = pulls;
        load.bytesIn = in;
        load.bytesOut = out;
    } else {
        return false;
    }
    return true;
}

} // namespace ts::remote
