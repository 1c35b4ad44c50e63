#pragma once
// RunData: one run's telemetry as plot-ready columns (the dashboards' model). Filled from live
// bus events by TrainingSession, or from the run store for a past run; both paths go through
// add(), so a reopened run looks exactly like it did live.
// Contract: used from one thread (the GUI's). Columns only grow between clear() calls; views
// remember how many rows they have drawn and append the rest (revision() says something changed).

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/result.h"
#include "telemetry/events.h"

namespace ts::store {
class RunStore;
}

namespace ts {

struct StepColumns {
    std::vector<double> step, epoch, wall;  // wall: seconds since the run's first event
    std::vector<double> loss, accuracy, samplesPerSec, learningRate;
    // NaN where the step did not report it: mixed_float16's loss scale and skipped steps so far,
    // and a parameter-server run's staleness (the worst worker's).
    std::vector<double> lossScale, skippedSteps, staleness;
};

struct EpochColumns {
    std::vector<double> epoch, step, wall;
    std::vector<double> loss, accuracy, valLoss, valAccuracy, samplesPerSec, seconds;  // NaN: none
};

// Seconds per step part, as StepBreakdownEvent.
struct BreakdownColumns {
    std::vector<double> step, wall;
    std::vector<double> input, forward, backward, communication, optimizer, other, total;
};

struct DeviceColumns {
    std::string label;                     // "cpu:0", "host"
    std::vector<double> step, wall;
    std::vector<double> utilisation;       // 0..1; NaN when unknown
    std::vector<double> memoryUsed, memoryTotal;  // bytes
    std::vector<std::vector<double>> perCore;     // host only: one column per core (0..1)
    std::vector<double> processCpu;        // host only: cores used by the process
};

class RunData {
public:
    void clear();
    void add(const telemetry::Event& e);
    // Loads a recorded run (metrics, epochs, breakdowns, device samples, findings, logs, state).
    static Result<RunData> load(store::RunStore& store, const std::string& runId);

    uint64_t revision() const { return m_revision; }
    const std::string& runId() const { return m_runId; }
    telemetry::RunState state() const { return m_state; }
    const std::string& stateMessage() const { return m_stateMessage; }

    const StepColumns& steps() const { return m_steps; }
    const EpochColumns& epochs() const { return m_epochs; }
    const BreakdownColumns& breakdown() const { return m_breakdown; }
    // Keyed by device label; "host" is the machine as a whole.
    const std::map<std::string, DeviceColumns>& devices() const { return m_devices; }
    const std::vector<telemetry::FindingEvent>& findings() const { return m_findings; }
    const std::vector<telemetry::LogEvent>& logs() const { return m_logs; }

    int64_t lastStep() const { return m_lastStep; }
    // Steps per epoch, once the first epoch has ended (else 0).
    int64_t stepsPerEpoch() const { return m_stepsPerEpoch; }
    // The fraction of the last `window` steps' time spent waiting for input (0..1; NaN: no data).
    double inputShare(std::size_t window = 50) const;
    // TensorBoard's verdict on an input share: "not", "moderately" or "highly" input-bound.
    static const char* inputVerdict(double share);

private:
    void rewind(double step);  // a resumed attempt: drop the columns' rows past `step`
    double wallOf(int64_t us);
    std::string m_runId;
    telemetry::RunState m_state = telemetry::RunState::Created;
    std::string m_stateMessage;
    StepColumns m_steps;
    EpochColumns m_epochs;
    BreakdownColumns m_breakdown;
    std::map<std::string, DeviceColumns> m_devices;
    std::vector<telemetry::FindingEvent> m_findings;
    std::vector<telemetry::LogEvent> m_logs;
    int64_t m_firstUs = 0;
    int64_t m_lastStep = 0;
    int64_t m_stepsPerEpoch = 0;
    uint64_t m_revision = 0;
};

} // namespace ts
