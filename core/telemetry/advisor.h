#pragma once
// Advisor: turns a window of step-time breakdowns (and, when present, pipeline and device
// samples) into findings with a concrete recommendation, using TensorBoard's thresholds:
//   input-bound: < 5% not, 5% to < 20% "moderately", >= 20% "highly" (share of step time);
//   host overhead ("other": kernel launch, framework work): moderate >= 3%, high >= 15%.
// Communication share and device idle have no TensorBoard verdict; ours are in
// AdvisorThresholds with the reasoning next to them.
// Contract: pure functions of their inputs (no threads, no state); Advisor keeps a sliding
// window and is used from one thread (a sink's). Findings are sorted by severity, then kind.

#include <cstddef>
#include <deque>
#include <string>
#include <vector>

#include "telemetry/events.h"

namespace ts::telemetry {

struct AdvisorThresholds {
    double inputModerate = 0.05, inputHigh = 0.20;  // TensorBoard
    double hostModerate = 0.03, hostHigh = 0.15;    // TensorBoard (kernel launch / all other)
    // All-reduce at 10% of the step already costs more than the replica it adds at ~10 replicas;
    // at 25% a larger per-replica batch (or fewer replicas) is nearly always faster.
    double communicationModerate = 0.10, communicationHigh = 0.25;
    // A device waiting half the step is the "more GPUs made it slower" case.
    double idleModerate = 0.30, idleHigh = 0.50;
    // Measured device utilisation (GPU probes): below these means the device is starved.
    double utilisationModerate = 0.50, utilisationHigh = 0.20;
    // A batch that arrives within 50 us means the pipeline is not the bottleneck (tf.data).
    double inputNegligibleSeconds = 50e-6;
    // mixed_float16: a skipped step (its gradients overflowed) is a whole step's work lost. Keras'
    // dynamic scale starts at 2^15 and halves until the gradients fit, so a few skips in the
    // first steps are expected; after those, 2% of steps skipped costs 2% of the run, and 10%
    // means the gradients keep overflowing (exploding, or bad data).
    double skippedModerate = 0.02, skippedHigh = 0.10;
    int64_t lossScaleSettleSteps = 100;
    int64_t allSkippedMinSteps = 10;  // every step skipped: said from this many steps on
};

struct AdvisorInput {
    std::vector<StepBreakdownEvent> steps;
    std::vector<PipelineSampleEvent> pipeline;
    std::vector<DeviceSampleEvent> devices;
    // Step metrics that carry "loss_scale" and "skipped_steps" (mixed_float16), in step order.
    std::vector<StepMetricsEvent> lossScale;
    int replicas = 1;  // > 1 adds "fewer replicas" to communication advice
};

std::vector<FindingEvent> advise(const AdvisorInput& input, const AdvisorThresholds& thresholds = {});

// Sliding window over a run's events, for a sink that wants findings as the run goes.
class Advisor {
public:
    explicit Advisor(std::size_t windowSteps = 200, AdvisorThresholds thresholds = {});
    void setReplicas(int replicas) { m_replicas = replicas; }
    // Keeps breakdowns, pipeline and device samples, and step metrics with a loss scale; ignores
    // other events.
    void add(const Event& e);
    std::vector<FindingEvent> findings() const;
    std::size_t steps() const { return m_steps.size(); }

private:
    std::size_t m_window;
    AdvisorThresholds m_thresholds;
    int m_replicas = 1;
    std::deque<StepBreakdownEvent> m_steps;
    std::deque<PipelineSampleEvent> m_pipeline;
    std::deque<DeviceSampleEvent> m_devices;
    std::deque<StepMetricsEvent> m_lossScale;
};

} // namespace ts::telemetry
