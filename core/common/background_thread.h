#pragma once
// Background threads (input pipeline, telemetry sinks, the run store's writer, samplers) do work
// ahead of need or after the fact; none of it should delay the training threads when it wakes.

#include <chrono>

namespace ts {

// How often the telemetry and store helpers wake on their own (the trace file and advisor sinks,
// the trace collector, the run store's commits). Each wake-up is a context switch onto the cores
// training uses, which stalls a parallel region that needs that core: on 2 busy cores, four a
// second per helper cost measurably more than one. A second keeps live timelines and findings
// current enough; bursts wake the sinks sooner (their subscriptions' wake thresholds).
inline constexpr std::chrono::milliseconds kHelperPeriod{1000};

// Names the calling thread (`name`, at most 15 characters: what top -H and perf show) and puts
// it under SCHED_BATCH (Linux; elsewhere a no-op). It keeps its fair share
// of the CPU but does not preempt a running thread when it wakes: with the default policy a
// woken helper took the core of the trainer (or of one of its OpenMP threads, holding up the
// whole parallel region) for its time slice. It also lowers the thread to nice 19, so a training
// thread that wakes takes its core back at once. Needs no privileges; errors are ignored (the
// thread then runs as before). TS_FOREGROUND_HELPERS=1 in the environment turns both off, and
// TS_HELPERS_NICE0=1 only the nice value (for measuring what they change).
void becomeBackgroundThread(const char* name);

} // namespace ts
