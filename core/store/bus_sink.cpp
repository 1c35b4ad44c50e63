#include "store/bus_sink.h"
#include "common/background_thread.h"

namespace ts::store {

StoreSink::StoreSink(telemetry::EventBus& bus, RunStore& store, const StoreSinkOptions& options)
    : m_bus(&bus), m_store(&store)
{
    telemetry::SubscriberOptions so;
    so.name = "store";
    so.capacity = options.capacity;
    so.kinds = options.kinds;
    // The writer drains it every batch (a few hundred milliseconds); the standby thread is woken
    // only when a quarter of it is waiting, which means the writer is held up.
    so.wakeThreshold = options.capacity / 4;
    m_sub = bus.subscribe(so);
    m_source = store.addSource([this](std::vector<telemetry::Event>& out) {
        const std::size_t n = m_sub->drain(out);
        m_forwarded.fetch_add(n, std::memory_order_relaxed);
        return n;
    });
    m_thread = std::thread([this] {
        becomeBackgroundThread("ts-store-sink");
        standby();
    });
}

StoreSink::~StoreSink() { (void)stop(); }

void StoreSink::standby()
{
    const std::size_t full = m_sub->capacity() / 4;
    while (!m_stop.load(std::memory_order_acquire)) {
        // wait() also returns at its timeout when anything is queued: only a backlog counts.
        if (m_sub->wait(std::chrono::seconds(1)) && m_sub->pending() >= full && !m_stop.load(std::memory_order_acquire))
            m_store->pullSource(m_source);
    }
}

Status StoreSink::stop()
{
    if (m_stopped) return okStatus();
    m_stopped = true;
    m_stop.store(true, std::memory_order_release);
    m_bus->unsubscribe(m_sub);  // closes it: the standby thread's wait() returns at once
    m_thread.join();
    // Whatever was published before stop() is still queued: the last drain keeps it.
    return m_store->removeSource(m_source);
}

} // namespace ts::store
