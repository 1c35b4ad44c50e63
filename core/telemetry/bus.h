#pragma once
// EventBus: the in-process fan-out of telemetry events to several subscribers (dashboards, the
// run store, trace files, remote streams).
// Contract:
//  - Threading: publish() may be called from any thread, concurrently (trainer, replica threads,
//    samplers, the trace collector). It never blocks and never waits for a subscriber: each
//    subscriber has its own bounded lock-free queue (a Vyukov MPMC ring); publish copies the
//    event into every matching queue and returns. A full queue DROPS the event for that
//    subscriber only and counts it (Subscription::dropped()); a slow subscriber loses events,
//    the trainer loses no time.
//  - Each Subscription is drained by its owner on its own thread or timer (drain(), wait());
//    draining one subscription from several threads at once is allowed but gives no ordering.
//    Events from one publishing thread arrive in publish order.
//  - subscribe()/unsubscribe() may be called at any time from any thread; an event published
//    concurrently with subscribe() may or may not reach the new subscriber.
//  - Ownership: the bus and the caller share each Subscription (shared_ptr). Destroying the bus
//    or unsubscribing closes the subscription: already queued events can still be drained,
//    wait() returns at once, nothing new arrives.
//  - Errors: none; publish has no failure mode other than counted drops.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <semaphore>
#include <string>
#include <vector>

#include "telemetry/events.h"

namespace ts::telemetry {

// Bit i selects Event alternative i; kindMask<SpanEvent, DeviceSampleEvent>() builds one.
using KindMask = uint32_t;
inline constexpr KindMask kAllKinds = (KindMask(1) << std::variant_size_v<Event>) - 1;

template <typename T, std::size_t I = 0>
constexpr std::size_t eventIndex()
{
    if constexpr (I >= std::variant_size_v<Event>) {
        static_assert(I < std::variant_size_v<Event>, "not an Event alternative");
        return I;
    } else if constexpr (std::is_same_v<T, std::variant_alternative_t<I, Event>>) {
        return I;
    } else {
        return eventIndex<T, I + 1>();
    }
}

template <typename... Ts>
constexpr KindMask kindMask()
{
    return ((KindMask(1) << eventIndex<Ts>()) | ...);
}

struct SubscriberOptions {
    std::string name = "subscriber";  // for diagnostics: "dashboard", "store", "trace file"
    std::size_t capacity = 8192;      // events buffered before drops (rounded up to a power of 2)
    KindMask kinds = kAllKinds;       // which events this subscriber receives
    // A sink asleep in wait() is woken once this many events are pending (else by its timeout).
    // 1 wakes it at the first event; sinks that drain on a cadence set a fraction of the capacity,
    // so a training step's events do not wake a thread (a context switch onto the cores the
    // kernels use) each time: per-event wake-ups cost the seed's MLP ~8% of its throughput.
    std::size_t wakeThreshold = 1;
};

namespace detail {
class EventRing;
}

class Subscription {
public:
    ~Subscription();
    Subscription(const Subscription&) = delete;
    Subscription& operator=(const Subscription&) = delete;

    const std::string& name() const { return m_name; }
    KindMask kinds() const { return m_kinds; }

    // Moves up to maxEvents queued events into `out` (appended); returns how many.
    std::size_t drain(std::vector<Event>& out, std::size_t maxEvents = std::numeric_limits<std::size_t>::max());
    std::vector<Event> drain(std::size_t maxEvents = std::numeric_limits<std::size_t>::max());

    // Blocks the calling (sink) thread until wakeThreshold events are queued, the subscription
    // is closed, or the timeout passes. Returns true if events are ready.
    bool wait(std::chrono::milliseconds timeout);

    // Called on the publishing thread when an event arrives and the callback has not fired
    // since the last drain() (at most once per drain cycle). Must be cheap and must not block:
    // post a message to the sink's own thread, set a flag. Set it before events flow.
    void setWakeCallback(std::function<void()> callback);

    uint64_t received() const { return m_received.load(std::memory_order_relaxed); }
    uint64_t dropped() const { return m_dropped.load(std::memory_order_relaxed); }
    std::size_t pending() const;
    std::size_t capacity() const;
    bool closed() const { return m_closed.load(std::memory_order_acquire); }

private:
    friend class EventBus;
    Subscription(const SubscriberOptions& options);
    void deliver(const Event& e);
    void deliver(Event&& e);
    void afterPush(bool pushed);
    void close();

    std::string m_name;
    KindMask m_kinds;
    std::size_t m_wakeThreshold = 1;
    std::unique_ptr<detail::EventRing> m_ring;
    std::atomic<uint64_t> m_received{0}, m_dropped{0};
    std::atomic<bool> m_closed{false};
    std::atomic<bool> m_waiting{false};
    std::counting_semaphore<> m_signal{0};
    std::atomic<bool> m_wakeFired{false};
    std::function<void()> m_wake;
    std::atomic<bool> m_hasWake{false};
};

class EventBus {
public:
    EventBus();
    ~EventBus();
    EventBus(const EventBus&) = delete;
    EventBus& operator=(const EventBus&) = delete;

    std::shared_ptr<Subscription> subscribe(const SubscriberOptions& options = {});
    void unsubscribe(const std::shared_ptr<Subscription>& subscription);

    void publish(const Event& e);
    void publish(Event&& e);

    uint64_t published() const { return m_published.load(std::memory_order_relaxed); }
    // Sum of every current subscriber's drops.
    uint64_t dropped() const;
    std::size_t subscriberCount() const;

private:
    using List = std::vector<std::shared_ptr<Subscription>>;
    std::atomic<std::shared_ptr<const List>> m_list;
    std::mutex m_editMutex;  // serialises subscribe/unsubscribe (never taken by publish)
    std::atomic<uint64_t> m_published{0};
};

} // namespace ts::telemetry
