#include "telemetry/advisor_sink.h"

#include "telemetry/tracer.h"

namespace ts::telemetry {

AdvisorSink::AdvisorSink(EventBus& bus, std::string runId, int replicas, std::size_t windowSteps)
    : m_bus(&bus), m_runId(std::move(runId)), m_advisor(windowSteps)
{
    m_advisor.setReplicas(replicas);
    SubscriberOptions so;
    so.name = "advisor";
    so.capacity = 1 << 14;
    so.kinds = kindMask<StepBreakdownEvent, PipelineSampleEvent, DeviceSampleEvent, EpochMetricsEvent, StepMetricsEvent>();
    so.wakeThreshold = so.capacity / 8;  // drained every kHelperPeriod; findings are per epoch anyway
    m_drain = std::make_unique<DrainThread>(bus, bus.subscribe(so), "ts-advisor", [this](std::vector<Event>& batch) { take(batch); });
}

AdvisorSink::~AdvisorSink() { stop(); }

void AdvisorSink::take(std::vector<Event>& events)
{
    for (const Event& e : events) {
        if (std::holds_alternative<EpochMetricsEvent>(e)) {
            publishFindings();  // an epoch ended: advice for the window behind it
            continue;
        }
        m_lastStep = std::max(m_lastStep, stampOf(e).step);
        m_advisor.add(e);
    }
}

void AdvisorSink::publishFindings()
{
    if (m_advisor.steps() == 0) return;
    std::set<std::string> now;
    for (FindingEvent& f : m_advisor.findings()) {
        const std::string key = f.kind + "/" + f.severity;
        now.insert(key);
        if (m_last.count(key)) continue;  // already said, unchanged
        f.stamp.runId = m_runId;
        f.stamp.step = m_lastStep;
        f.stamp.wallTimeUs = wallNowMicros();
        f.stamp.lane = Lane{"local", "", "advisor"};
        m_bus->publish(Event(std::move(f)));
        m_published.fetch_add(1, std::memory_order_relaxed);
    }
    m_last = std::move(now);
}

void AdvisorSink::stop()
{
    if (m_stopped) return;
    m_stopped = true;
    m_drain->stop();  // takes what was still queued
    publishFindings();
}

} // namespace ts::telemetry
