#include "telemetry/events.h"

namespace ts::telemetry {

const char* runStateName(RunState s)
{
    switch (s) {
    case RunState::Created: return "created";
    case RunState::Running: return "running";
    case RunState::Paused: return "paused";
    case RunState::Completed: return "completed";
    case RunState::Cancelled: return "cancelled";
    case RunState::Failed: return "failed";
    case RunState::Interrupted: return "interrupted";
    }
    return "unknown";
}

const Stamp& stampOf(const Event& e)
{
    return std::visit([](const auto& ev) -> const Stamp& { return ev.stamp; }, e);
}

const char* eventKindName(const Event& e)
{
    static const char* const names[] = {"run-state", "step-metrics", "epoch-metrics", "step-breakdown",
                                        "device-sample", "pipeline-sample", "span", "log", "error", "finding"};
    static_assert(sizeof(names) / sizeof(names[0]) == std::variant_size_v<Event>, "name every Event alternative");
    return names[e.index()];
}

std::string laneLabel(const Lane& lane)
{
    std::string out;
    for (const std::string* part : {&lane.worker, &lane.device, &lane.thread}) {
        if (part->empty()) continue;
        if (!out.empty()) out += '/';
        out += *part;
    }
    return out;
}

} // namespace ts::telemetry
