#pragma once
// Background threads (input pipeline, telemetry sinks, the run store's writer, samplers) do work
// ahead of need or after the fact; none of it should delay the training threads when it wakes.

namespace ts {

// Names the calling thread (`name`, at most 15 characters: what top -H and perf show) and puts
// it under SCHED_BATCH (Linux; elsewhere a no-op). It keeps its fair share
// of the CPU but does not preempt a running thread when it wakes: with the default policy a
// woken helper took the core of the trainer (or of one of its OpenMP threads, holding up the
// whole parallel region) for its time slice. Needs no privileges; errors are ignored (the
// thread then runs as before). TS_FOREGROUND_HELPERS=1 in the environment turns it off (for
// measuring what it changes).
void becomeBackgroundThread(const char* name);

} // namespace ts
