#include "telemetry/trace_sink.h"
#include "common/background_thread.h"

namespace ts::telemetry {

Result<std::unique_ptr<TraceFileSink>> TraceFileSink::create(EventBus& bus, const std::string& path, std::size_t capacity)
{
    std::unique_ptr<TraceFileSink> s(new TraceFileSink());
    TS_ASSIGN(s->m_writer, ChromeTraceWriter::create(path));
    s->m_bus = &bus;
    SubscriberOptions o;
    o.name = "trace file";
    o.capacity = capacity;
    o.kinds = kindMask<SpanEvent, DeviceSampleEvent, StepMetricsEvent, RunStateEvent, ErrorEvent>();
    o.wakeThreshold = capacity / 8;  // drained every kDrainMs, not woken per span
    s->m_sub = bus.subscribe(o);
    s->m_thread = std::thread([p = s.get()] {
        becomeBackgroundThread("ts-trace-file");
        p->loop();
    });
    return s;
}

TraceFileSink::~TraceFileSink()
{
    if (!m_finished) (void)finish();
}

void TraceFileSink::setMetadata(const std::string& key, const std::string& value)
{
    std::lock_guard lock(m_writerMutex);
    m_writer->setMetadata(key, value);
}

void TraceFileSink::loop()
{
    // The file is written at finish(): draining only keeps the bus queue short, so a few
    // wake-up a second does (each one is a context switch onto the cores training uses); a
    // burst larger than an eighth of the queue wakes it sooner.
    constexpr auto kDrainMs = std::chrono::milliseconds(1000);
    std::vector<Event> batch;
    while (!m_stop.load(std::memory_order_acquire)) {
        if (!m_sub->wait(kDrainMs)) continue;
        batch.clear();
        m_sub->drain(batch);
        std::lock_guard lock(m_writerMutex);
        for (const Event& e : batch) {
            if (std::holds_alternative<SpanEvent>(e)) m_spans.fetch_add(1, std::memory_order_relaxed);
            m_writer->add(e);
        }
    }
}

Status TraceFileSink::finish()
{
    if (m_finished) return okStatus();
    m_finished = true;
    m_stop.store(true, std::memory_order_release);
    m_bus->unsubscribe(m_sub);  // closes it: the thread's wait() returns now, not at its next drain
    m_thread.join();
    std::vector<Event> rest = m_sub->drain();
    std::lock_guard lock(m_writerMutex);
    for (const Event& e : rest) {
        if (std::holds_alternative<SpanEvent>(e)) m_spans.fetch_add(1, std::memory_order_relaxed);
        m_writer->add(e);
    }
    if (m_sub->dropped() > 0) m_writer->setMetadata("dropped_events", std::to_string(m_sub->dropped()));
    return m_writer->finish();
}

} // namespace ts::telemetry
