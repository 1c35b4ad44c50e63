#pragma once
// AUTOTUNE: sets the parallelism of parallel stages (map, interleave) and the buffer size of
// prefetch stages written as kAutotune, from the rates measured between two snapshots:
//  - a stage with per-element worker time b that must deliver r elements per step to a consumer
//    that works c seconds per step needs about b * r / c workers; the tuner keeps 25% headroom,
//    adds one more while the consumer still waits on that stage, and gives a worker back only
//    after several intervals with (almost) no wait;
//  - a prefetch buffer doubles while its consumer still waits on it (to absorb jitter);
//  - all parallel stages together stay within the CPU budget (threads, default: the schedulable
//    cores) and all buffers within the RAM budget (default: half of physical memory), like tf.data.
// Pure arithmetic over snapshots: the Pipeline calls it from its consumer's thread; no threads.

#include <cstdint>
#include <vector>

#include "data/pipeline_stats.h"

namespace ts {

int defaultCpuBudget();         // cores this process may run on (sched_getaffinity), at least 1
int64_t defaultRamBudget();     // half of physical RAM

struct TuningKnob {
    enum class Kind { Parallelism, BufferSize };
    int stage = 0;              // index into PipelineSnapshot::stages
    Kind kind = Kind::Parallelism;
    int64_t value = 1;          // current setting
    int64_t minValue = 1, maxValue = 1;
};

class Autotuner {
public:
    Autotuner(int cpuBudget, int64_t ramBudgetBytes);

    // New values for `knobs` (same order) after the interval [from, to]. Needs at least one step
    // in the interval; otherwise returns the current values.
    std::vector<int64_t> tune(const PipelineSnapshot& from, const PipelineSnapshot& to, const std::vector<TuningKnob>& knobs);

    int cpuBudget() const { return m_cpuBudget; }
    int64_t ramBudget() const { return m_ramBudget; }

private:
    int m_cpuBudget;
    int64_t m_ramBudget;
    std::vector<int> m_calmIntervals;  // per knob: consecutive intervals that asked for less
    // Hill climbing on parallelism: a raise is kept only if the consumer's wait fell with it. On
    // a machine whose cores the model's kernels already fill, another map thread just competes
    // with them (measured: 2 threads for normalise made the seed MLP's stall worse, not better).
    std::vector<double> m_waitBefore;  // per knob: wait share in the interval before the raise
    std::vector<int> m_evaluate;       // per knob: the last interval raised it
    std::vector<int> m_hold;           // per knob: intervals left without raises after a useless one
};

} // namespace ts
