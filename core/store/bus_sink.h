#pragma once
// StoreSink: drains a telemetry bus subscription into a RunStore on its own thread, so the
// training threads only ever pay for the bus's copy into a queue. The bus drops events for this
// subscriber if it falls behind (counted); the store batches what arrives into transactions.

#include <atomic>
#include <memory>
#include <thread>

#include "store/run_store.h"
#include "telemetry/bus.h"

namespace ts::store {

struct StoreSinkOptions {
    std::size_t capacity = 1 << 16;   // bus queue for this subscriber (events)
    telemetry::KindMask kinds = telemetry::kAllKinds;
    int drainMs = 25;                 // how long the sink thread waits for events at most
};

class StoreSink {
public:
    // Subscribes to `bus` as "store" and starts the sink thread. The bus and the store must
    // outlive the sink.
    StoreSink(telemetry::EventBus& bus, RunStore& store, const StoreSinkOptions& options = {});
    ~StoreSink();  // stop()
    StoreSink(const StoreSink&) = delete;
    StoreSink& operator=(const StoreSink&) = delete;

    // Drains what the bus still holds for us into the store, unsubscribes, stops the thread and
    // flushes the store. Idempotent; returns the store's write status.
    Status stop();

    uint64_t busDropped() const { return m_sub ? m_sub->dropped() : 0; }
    uint64_t forwarded() const { return m_forwarded.load(std::memory_order_relaxed); }

private:
    void loop();
    telemetry::EventBus* m_bus;
    RunStore* m_store;
    StoreSinkOptions m_options;
    std::shared_ptr<telemetry::Subscription> m_sub;
    std::thread m_thread;
    std::atomic<bool> m_stop{false};
    std::atomic<uint64_t> m_forwarded{0};
    bool m_stopped = false;
};

} // namespace ts::store
