#include "data/autotune.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <thread>

namespace ts {

int defaultCpuBudget()
{
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        const int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
    return std::max(1u, std::thread::hardware_concurrency());
}

int64_t defaultRamBudget()
{
    const long pages = sysconf(_SC_PHYS_PAGES);
    const long pageSize = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || pageSize <= 0) return int64_t(1) << 30;
    return static_cast<int64_t>(pages) * pageSize / 2;
}

Autotuner::Autotuner(int cpuBudget, int64_t ramBudgetBytes)
    : m_cpuBudget(std::max(1, cpuBudget)), m_ramBudget(std::max<int64_t>(1 << 20, ramBudgetBytes))
{
}

std::vector<int64_t> Autotuner::tune(const PipelineSnapshot& from, const PipelineSnapshot& to,
                                     const std::vector<TuningKnob>& knobs)
{
    std::vector<int64_t> out;
    out.reserve(knobs.size());
    for (const auto& k : knobs) out.push_back(k.value);
    m_calmIntervals.resize(knobs.size(), 0);
    m_waitBefore.resize(knobs.size(), 0);
    m_evaluate.resize(knobs.size(), 0);
    m_hold.resize(knobs.size(), 0);
    const PipelineWindow w = analyseWindow(from, to);
    if (w.steps < 1) return out;

    const double stepSeconds = w.meanStepSeconds;
    const double waitPerStep = w.waitSeconds / static_cast<double>(w.steps);
    // The consumer's own work per step: what the pipeline must keep up with.
    const double consumerSeconds = std::max(1e-4, stepSeconds - waitPerStep);
    const bool waiting = w.waitShare > 0.02;
    const bool calm = w.waitShare < 0.01;

    // The parallel stage the wait is charged to most.
    int worst = -1;
    double worstShare = 0;
    for (std::size_t i = 0; i < knobs.size(); ++i) {
        if (knobs[i].kind != TuningKnob::Kind::Parallelism) continue;
        const double share = w.stages[static_cast<std::size_t>(knobs[i].stage)].criticalShare;
        if (share > worstShare) {
            worstShare = share;
            worst = static_cast<int>(i);
        }
    }

    for (std::size_t i = 0; i < knobs.size(); ++i) {
        const TuningKnob& k = knobs[i];
        const StageWindow& s = w.stages[static_cast<std::size_t>(k.stage)];
        int64_t v = k.value;
        if (k.kind == TuningKnob::Kind::Parallelism) {
            int64_t need = v;
            if (s.produced > 0) {
                const double perStep = static_cast<double>(s.produced) / static_cast<double>(w.steps);
                need = static_cast<int64_t>(std::ceil(1.25 * s.secondsPerElement * perStep / consumerSeconds));
            }
            if (waiting && static_cast<int>(i) == worst && worstShare >= 0.25) need = std::max(need, v + 1);
            if (m_evaluate[i]) {
                m_evaluate[i] = 0;
                if (w.waitShare > 0.8 * m_waitBefore[i] && v > k.minValue) {
                    // The raise did not pay: take it back and leave this knob alone for a while.
                    out[i] = v - 1;
                    m_hold[i] = 30;
                    m_calmIntervals[i] = 0;
                    continue;
                }
            }
            if (m_hold[i] > 0) {
                --m_hold[i];
                need = std::min(need, v);
            }
            if (need > v) {
                m_waitBefore[i] = w.waitShare;
                m_evaluate[i] = waiting ? 1 : 0;  // a raise while the consumer waited must cut its wait
                v = need;
                m_calmIntervals[i] = 0;
            } else if (need < v && calm) {
                // Give threads back slowly: three calm intervals in a row, one at a time.
                if (++m_calmIntervals[i] >= 3) {
                    --v;
                    m_calmIntervals[i] = 0;
                }
            } else {
                m_calmIntervals[i] = 0;
            }
        } else {
            // Prefetch: the consumer blocked on this buffer for more than 1% of the window.
            const double blockedShare = w.seconds > 0 ? s.blockedSeconds / w.seconds : 0;
            if (blockedShare > 0.01) v = std::max<int64_t>(v * 2, v + 1);
        }
        out[i] = std::clamp(v, k.minValue, k.maxValue);
    }

    // CPU budget: parallel stages together get at most cpuBudget threads; trim the ones that
    // carry the least of the wait first.
    int64_t threads = 0;
    for (std::size_t i = 0; i < knobs.size(); ++i)
        if (knobs[i].kind == TuningKnob::Kind::Parallelism) threads += out[i];
    while (threads > m_cpuBudget) {
        int victim = -1;
        double least = 2;
        for (std::size_t i = 0; i < knobs.size(); ++i) {
            if (knobs[i].kind != TuningKnob::Kind::Parallelism || out[i] <= knobs[i].minValue) continue;
            const double share = w.stages[static_cast<std::size_t>(knobs[i].stage)].criticalShare;
            if (share < least) {
                least = share;
                victim = static_cast<int>(i);
            }
        }
        if (victim < 0) break;
        --out[static_cast<std::size_t>(victim)];
        --threads;
    }

    // RAM budget: buffered bytes (buffer size x bytes per element) within the budget.
    int64_t bytes = 0;
    std::vector<double> perElement(knobs.size(), 0);
    for (std::size_t i = 0; i < knobs.size(); ++i) {
        if (knobs[i].kind != TuningKnob::Kind::BufferSize) continue;
        const StageStats& st = to.stages[static_cast<std::size_t>(knobs[i].stage)];
        perElement[i] = st.produced > 0 ? static_cast<double>(st.bytesProduced) / static_cast<double>(st.produced) : 0;
        bytes += static_cast<int64_t>(perElement[i] * static_cast<double>(out[i]));
    }
    for (std::size_t i = 0; i < knobs.size() && bytes > m_ramBudget; ++i) {
        if (knobs[i].kind != TuningKnob::Kind::BufferSize || perElement[i] <= 0) continue;
        while (out[i] > knobs[i].minValue && bytes > m_ramBudget) {
            --out[i];
            bytes -= static_cast<int64_t>(perElement[i]);
        }
    }
    return out;
}

} // namespace ts
