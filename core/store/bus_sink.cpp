#include "store/bus_sink.h"

namespace ts::store {

StoreSink::StoreSink(telemetry::EventBus& bus, RunStore& store, const StoreSinkOptions& options)
    : m_bus(&bus), m_store(&store)
{
    telemetry::SubscriberOptions so;
    so.name = "store";
    so.capacity = options.capacity;
    so.kinds = options.kinds;
    // Nobody waits on it: the writer polls it every batch. The largest threshold the bus takes
    // keeps publishers from ever touching its semaphore.
    so.wakeThreshold = options.capacity;
    m_sub = bus.subscribe(so);
    m_source = store.addSource([this](std::vector<telemetry::Event>& out) {
        const std::size_t n = m_sub->drain(out);
        m_forwarded.fetch_add(n, std::memory_order_relaxed);
        return n;
    });
}

StoreSink::~StoreSink() { (void)stop(); }

Status StoreSink::stop()
{
    if (m_stopped) return okStatus();
    m_stopped = true;
    m_bus->unsubscribe(m_sub);
    // Whatever was published before stop() is still queued: the last drain keeps it.
    return m_store->removeSource(m_source);
}

} // namespace ts::store
