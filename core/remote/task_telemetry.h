#pragma once
// Task telemetry: what a task streams to the coordinator besides its metrics and states (device
// samples, step breakdowns, input pipeline samples, trace spans, notes, a resume, a ps task's
// shard counters),
// turned back into telemetry events on the coordinator's bus, each on its task's lane.
// Contract: free functions, called from the coordinator's loop thread (one PsLoad per task);
// malformed fields fall back to defaults, never throw.

#include <cstdint>
#include <string>

#include "remote/worker_client.h"
#include "telemetry/events.h"

namespace ts::telemetry {
class EventBus;
}

namespace ts::remote {

// A stamp on `worker`'s lane at `step`, wall time now.
telemetry::Stamp taskStamp(const std::string& runId, const std::string& worker, const std::string& device, int64_t step);

// A ps task's load as its counters ("ps" events, about every second) show it.
struct PsLoad {
    double wall = -1, busy = 0;
    int64_t updates = 0, pulls = 0, bytesIn = 0, bytesOut = 0;
    int busyIntervals = 0;     // consecutive counter intervals with the shard busy >= kPsBusyShare
    int64_t busySince = 0;     // the step the streak began at
    bool reported = false;     // the finding for this streak was published
};
// A shard busy this share of the wall time, kPsBusyIntervals intervals in a row, is the run's
// bottleneck: a "ps-bound" finding says so, once per streak.
inline constexpr double kPsBusyShare = 0.8;
inline constexpr int kPsBusyIntervals = 5;

// Publishes `e` on `bus` when it is telemetry (true); false for other kinds. `primary`: `e` comes
// from the task whose metrics are the run's (only its breakdowns are the run's, and a resume
// rewinds the run only from there).
// "ps" events become counter tracks (busy %, updates/s, pulls/s, MB/s in and out) on the ps's
// lane, and the "ps-bound" finding. `clockOffsetUs`: the task's clock minus this machine's; span
// times are moved onto this machine's clock by it, so the lanes of tasks on other machines line
// up in the trace (0: the same clock).
bool publishTaskTelemetry(const std::string& runId, const WorkerEvent& e, bool primary, telemetry::EventBus& bus, PsLoad& load,
                          int64_t clockOffsetUs = 0);

// The offset to apply from a heartbeat's estimate: 0 when it is within the estimate's error (half
// the round trip, with a margin: tasks on this machine share its clock), else the estimate.
int64_t significantClockOffset(int64_t offsetUs, int64_t roundTripUs);

} // namespace ts::remote
