#include "store/bus_sink.h"
#include "common/background_thread.h"

namespace ts::store {

StoreSink::StoreSink(telemetry::EventBus& bus, RunStore& store, const StoreSinkOptions& options)
    : m_bus(&bus), m_store(&store), m_options(options)
{
    telemetry::SubscriberOptions so;
    so.name = "store";
    so.capacity = options.capacity;
    so.kinds = options.kinds;
    so.wakeThreshold = options.capacity / 8;  // drained every drainMs; woken early only in a burst
    m_sub = bus.subscribe(so);
    m_thread = std::thread([this] {
        becomeBackgroundThread("ts-store-sink");
        loop();
    });
}

StoreSink::~StoreSink() { (void)stop(); }

void StoreSink::loop()
{
    std::vector<telemetry::Event> batch;
    const auto wait = std::chrono::milliseconds(std::max(1, m_options.drainMs));
    while (!m_stop.load(std::memory_order_acquire)) {
        if (!m_sub->wait(wait)) {
            // A closed subscription (the bus went away) with nothing left: idle until stop().
            if (m_sub->closed() && m_sub->pending() == 0) std::this_thread::sleep_for(wait);
            continue;
        }
        m_sub->drain(batch);
        m_forwarded.fetch_add(batch.size(), std::memory_order_relaxed);
        m_store->recordEvents(std::move(batch));
        batch = {};
    }
}

Status StoreSink::stop()
{
    if (m_stopped) return okStatus();
    m_stopped = true;
    m_stop.store(true, std::memory_order_release);
    m_thread.join();
    m_bus->unsubscribe(m_sub);
    // Whatever was published before stop() is still queued: keep it.
    std::vector<telemetry::Event> rest = m_sub->drain();
    m_forwarded.fetch_add(rest.size(), std::memory_order_relaxed);
    m_store->recordEvents(std::move(rest));
    return m_store->flush();
}

} // namespace ts::store
