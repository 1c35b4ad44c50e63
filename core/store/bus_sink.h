#pragma once
// StoreSink: feeds a telemetry bus subscription into a RunStore. The store's writer thread
// drains the subscription itself once per batch (RunStore::addSource), so the training threads
// only ever pay for the bus's copy into a queue and no thread wakes up just to hand events
// from the bus to the writer. A standby thread moves the subscription's events into the
// store's (much larger) write queue only when the subscription fills up because the writer is
// held up (a slow disk, another process's write lock); the bus drops events for this
// subscriber only if even that falls behind (counted).

#include <atomic>
#include <memory>
#include <thread>

#include "store/run_store.h"
#include "telemetry/bus.h"

namespace ts::store {

struct StoreSinkOptions {
    // Bus queue for this subscriber (events): many seconds of the busiest run's telemetry.
    std::size_t capacity = 1 << 16;
    telemetry::KindMask kinds = telemetry::kAllKinds;
};

class StoreSink {
public:
    // Subscribes to `bus` as "store" and attaches the subscription to the store's writer. The
    // bus and the store must outlive the sink.
    StoreSink(telemetry::EventBus& bus, RunStore& store, const StoreSinkOptions& options = {});
    ~StoreSink();  // stop()
    StoreSink(const StoreSink&) = delete;
    StoreSink& operator=(const StoreSink&) = delete;

    // Unsubscribes, hands what the bus still holds for us to the store and flushes it.
    // Idempotent; returns the store's write status.
    Status stop();

    uint64_t busDropped() const { return m_sub ? m_sub->dropped() : 0; }
    uint64_t forwarded() const { return m_forwarded.load(std::memory_order_relaxed); }

private:
    void standby();
    telemetry::EventBus* m_bus;
    RunStore* m_store;
    std::shared_ptr<telemetry::Subscription> m_sub;
    int m_source = 0;
    std::thread m_thread;
    std::atomic<bool> m_stop{false};
    std::atomic<uint64_t> m_forwarded{0};
    bool m_stopped = false;
};

} // namespace ts::store
