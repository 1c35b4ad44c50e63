#pragma once
// AdvisorSink: the advisor, live. Subscribes to a run's bus for step breakdowns, pipeline and
// device samples, and after every epoch (and once more at stop()) publishes the findings of the
// sliding window back onto the bus as FindingEvents, so the store, the dashboards and the CLI
// all see the same advice while the run goes.
// Threading: one sink thread of its own; the publisher threads only pay the bus's copy. The bus
// must outlive the sink. Findings identical to the previous publication (same kind and
// severity) are not repeated.

#include <atomic>
#include <memory>
#include <set>
#include <string>

#include "telemetry/advisor.h"
#include "telemetry/bus.h"
#include "telemetry/drain_thread.h"

namespace ts::telemetry {

class AdvisorSink {
public:
    AdvisorSink(EventBus& bus, std::string runId, int replicas = 1, std::size_t windowSteps = 200);
    ~AdvisorSink();  // stop()
    AdvisorSink(const AdvisorSink&) = delete;
    AdvisorSink& operator=(const AdvisorSink&) = delete;

    // Takes what is still queued, publishes the final findings and stops the thread. Idempotent.
    void stop();
    // Findings published so far (any thread after stop()).
    std::size_t published() const { return m_published.load(std::memory_order_relaxed); }

private:
    void take(std::vector<Event>& events);
    void publishFindings();

    EventBus* m_bus;
    std::string m_runId;
    Advisor m_advisor;
    std::unique_ptr<DrainThread> m_drain;
    std::atomic<std::size_t> m_published{0};
    std::set<std::string> m_last;  // "kind/severity" of the previous publication
    int64_t m_lastStep = 0;
    bool m_stopped = false;
};

} // namespace ts::telemetry
