#include "telemetry/trace_sink.h"

namespace ts::telemetry {

Result<std::unique_ptr<TraceFileSink>> TraceFileSink::create(EventBus& bus, const std::string& path, std::size_t capacity)
{
    std::unique_ptr<TraceFileSink> s(new TraceFileSink());
    TS_ASSIGN(s->m_writer, ChromeTraceWriter::create(path));
    SubscriberOptions o;
    o.name = "trace file";
    o.capacity = capacity;
    o.kinds = kindMask<SpanEvent, DeviceSampleEvent, StepMetricsEvent, RunStateEvent, ErrorEvent>();
    o.wakeThreshold = capacity / 8;  // drained every kHelperPeriod, not woken per span
    s->m_sub = bus.subscribe(o);
    // The file is written at finish(): draining only keeps the bus queue short.
    s->m_drain = std::make_unique<DrainThread>(bus, s->m_sub, "ts-trace-file", [p = s.get()](std::vector<Event>& batch) { p->add(batch); });
    return s;
}

TraceFileSink::~TraceFileSink()
{
    if (m_drain && !m_finished) (void)finish();  // no drain: create() failed before subscribing
}

void TraceFileSink::setMetadata(const std::string& key, const std::string& value)
{
    std::lock_guard lock(m_writerMutex);
    m_writer->setMetadata(key, value);
}

void TraceFileSink::add(const std::vector<Event>& events)
{
    std::lock_guard lock(m_writerMutex);
    for (const Event& e : events) {
        if (std::holds_alternative<SpanEvent>(e)) m_spans.fetch_add(1, std::memory_order_relaxed);
        m_writer->add(e);
    }
}

Status TraceFileSink::finish()
{
    if (m_finished) return okStatus();
    m_finished = true;
    m_drain->stop();  // adds what was still queued
    std::lock_guard lock(m_writerMutex);
    if (m_sub->dropped() > 0) m_writer->setMetadata("dropped_events", std::to_string(m_sub->dropped()));
    return m_writer->finish();
}

} // namespace ts::telemetry
