#include "telemetry/bus.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <new>

namespace ts::telemetry {
namespace detail {

// Dmitry Vyukov's bounded MPMC queue: every cell carries a sequence number that says whether it
// is free for the producer of lap `pos` or filled for the consumer of lap `pos`. Producers and
// consumers claim positions with one CAS each; nobody ever waits for anybody.
// A cell stores its sequence number minus its index, so zero-filled memory is the initial state
// (cell i free for lap 0) and the cells come from calloc untouched: a 65536-event ring (20 MB)
// costs memory only as far as events actually queue up, not from the start of every run.
class EventRing {
public:
    explicit EventRing(std::size_t capacity)
    {
        std::size_t n = 2;
        while (n < capacity) n <<= 1;
        m_mask = n - 1;
        m_cells.reset(static_cast<Cell*>(std::calloc(n, sizeof(Cell))));
        if (!m_cells) throw std::bad_alloc();
    }
    ~EventRing()
    {
        Event e;
        while (tryPop(e)) {
        }
    }

    template <typename E>
    bool tryPush(E&& e)
    {
        std::size_t pos = m_enqueue.load(std::memory_order_relaxed);
        for (;;) {
            const std::size_t i = pos & m_mask;
            Cell& c = m_cells.get()[i];
            const std::size_t seq = loadSeq(c, i);
            const auto dif = static_cast<std::ptrdiff_t>(seq) - static_cast<std::ptrdiff_t>(pos);
            if (dif == 0) {
                if (m_enqueue.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
                    new (c.storage) Event(std::forward<E>(e));
                    storeSeq(c, i, pos + 1);
                    return true;
                }
            } else if (dif < 0) {
                return false;  // full: the cell still holds last lap's event
            } else {
                pos = m_enqueue.load(std::memory_order_relaxed);
            }
        }
    }

    bool tryPop(Event& out)
    {
        std::size_t pos = m_dequeue.load(std::memory_order_relaxed);
        for (;;) {
            const std::size_t i = pos & m_mask;
            Cell& c = m_cells.get()[i];
            const std::size_t seq = loadSeq(c, i);
            const auto dif = static_cast<std::ptrdiff_t>(seq) - static_cast<std::ptrdiff_t>(pos + 1);
            if (dif == 0) {
                if (m_dequeue.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
                    Event* p = std::launder(reinterpret_cast<Event*>(c.storage));
                    out = std::move(*p);
                    p->~Event();
                    storeSeq(c, i, pos + m_mask + 1);
                    return true;
                }
            } else if (dif < 0) {
                return false;  // empty
            } else {
                pos = m_dequeue.load(std::memory_order_relaxed);
            }
        }
    }

    std::size_t size() const
    {
        const std::size_t e = m_enqueue.load(std::memory_order_relaxed);
        const std::size_t d = m_dequeue.load(std::memory_order_relaxed);
        return e > d ? std::min(e - d, capacity()) : 0;
    }
    std::size_t capacity() const { return m_mask + 1; }

private:
    struct Cell {
        std::size_t seqMinusIndex;  // accessed through std::atomic_ref only
        alignas(Event) unsigned char storage[sizeof(Event)];
    };
    static_assert(alignof(Cell) <= alignof(std::max_align_t), "calloc's alignment must do for a cell");
    struct Free {
        void operator()(Cell* p) const { std::free(p); }
    };
    static std::size_t loadSeq(Cell& c, std::size_t i)
    {
        return std::atomic_ref<std::size_t>(c.seqMinusIndex).load(std::memory_order_acquire) + i;
    }
    static void storeSeq(Cell& c, std::size_t i, std::size_t seq)
    {
        std::atomic_ref<std::size_t>(c.seqMinusIndex).store(seq - i, std::memory_order_release);
    }
    std::unique_ptr<Cell, Free> m_cells;
    std::size_t m_mask = 0;
    alignas(64) std::atomic<std::size_t> m_enqueue{0};
    alignas(64) std::atomic<std::size_t> m_dequeue{0};
};

} // namespace detail

Subscription::Subscription(const SubscriberOptions& options)
    : m_name(options.name), m_kinds(options.kinds),
      m_ring(std::make_unique<detail::EventRing>(std::max<std::size_t>(options.capacity, 2)))
{
    m_wakeThreshold = std::clamp<std::size_t>(options.wakeThreshold, 1, std::max<std::size_t>(1, m_ring->capacity() / 2));
}

Subscription::~Subscription() = default;

void Subscription::afterPush(bool pushed)
{
    if (!pushed) {
        m_dropped.fetch_add(1, std::memory_order_relaxed);
        return;
    }
    m_received.fetch_add(1, std::memory_order_relaxed);
    // Wake a sleeping sink: the semaphore is released only by whoever clears m_waiting, so it
    // never holds more than one token. release() is a counter bump (+ a futex wake if asleep).
    if (m_waiting.load(std::memory_order_acquire) && (m_wakeThreshold <= 1 || m_ring->size() >= m_wakeThreshold) &&
        m_waiting.exchange(false, std::memory_order_acq_rel))
        m_signal.release();
    if (m_hasWake.load(std::memory_order_acquire) && !m_wakeFired.exchange(true, std::memory_order_acq_rel))
        m_wake();
}

void Subscription::deliver(const Event& e)
{
    if (m_closed.load(std::memory_order_relaxed)) return;
    afterPush(m_ring->tryPush(e));
}

void Subscription::deliver(Event&& e)
{
    if (m_closed.load(std::memory_order_relaxed)) return;
    afterPush(m_ring->tryPush(std::move(e)));
}

std::size_t Subscription::drain(std::vector<Event>& out, std::size_t maxEvents)
{
    m_wakeFired.store(false, std::memory_order_release);
    std::size_t n = 0;
    Event e;
    while (n < maxEvents && m_ring->tryPop(e)) {
        out.push_back(std::move(e));
        ++n;
    }
    return n;
}

std::vector<Event> Subscription::drain(std::size_t maxEvents)
{
    std::vector<Event> out;
    out.reserve(std::min(maxEvents, m_ring->size()));
    drain(out, maxEvents);
    return out;
}

bool Subscription::wait(std::chrono::milliseconds timeout)
{
    if (m_ring->size() >= m_wakeThreshold) return true;
    if (closed()) return m_ring->size() > 0;
    m_waiting.store(true, std::memory_order_release);
    // Re-check after announcing: an event pushed before the flag was visible is seen here.
    if (m_ring->size() >= m_wakeThreshold || closed()) {
        if (!m_waiting.exchange(false, std::memory_order_acq_rel)) m_signal.acquire();  // a publisher took the flag: eat its token
        return m_ring->size() > 0;
    }
    const bool signalled = m_signal.try_acquire_for(timeout);
    if (!signalled && !m_waiting.exchange(false, std::memory_order_acq_rel)) m_signal.acquire();
    return m_ring->size() > 0;
}

void Subscription::setWakeCallback(std::function<void()> callback)
{
    m_wake = std::move(callback);
    m_hasWake.store(static_cast<bool>(m_wake), std::memory_order_release);
}

std::size_t Subscription::pending() const { return m_ring->size(); }
std::size_t Subscription::capacity() const { return m_ring->capacity(); }

void Subscription::close()
{
    m_closed.store(true, std::memory_order_release);
    if (m_waiting.exchange(false, std::memory_order_acq_rel)) m_signal.release();
}

EventBus::EventBus() : m_list(std::make_shared<const List>()) {}

EventBus::~EventBus()
{
    auto list = m_list.load();
    for (const auto& s : *list) s->close();
}

std::shared_ptr<Subscription> EventBus::subscribe(const SubscriberOptions& options)
{
    std::shared_ptr<Subscription> sub(new Subscription(options));
    std::lock_guard lock(m_editMutex);
    auto next = std::make_shared<List>(*m_list.load());
    next->push_back(sub);
    m_list.store(std::move(next));
    return sub;
}

void EventBus::unsubscribe(const std::shared_ptr<Subscription>& subscription)
{
    if (!subscription) return;
    {
        std::lock_guard lock(m_editMutex);
        auto next = std::make_shared<List>(*m_list.load());
        next->erase(std::remove(next->begin(), next->end(), subscription), next->end());
        m_list.store(std::move(next));
    }
    subscription->close();
}

void EventBus::publish(const Event& e)
{
    m_published.fetch_add(1, std::memory_order_relaxed);
    const auto list = m_list.load(std::memory_order_acquire);
    const KindMask bit = KindMask(1) << e.index();
    for (const auto& s : *list)
        if (s->m_kinds & bit) s->deliver(e);
}

void EventBus::publish(Event&& e)
{
    m_published.fetch_add(1, std::memory_order_relaxed);
    const auto list = m_list.load(std::memory_order_acquire);
    const KindMask bit = KindMask(1) << e.index();
    // Copy into all matching subscribers but the last, which takes the event itself.
    Subscription* last = nullptr;
    for (const auto& s : *list) {
        if (!(s->m_kinds & bit)) continue;
        if (last) last->deliver(static_cast<const Event&>(e));
        last = s.get();
    }
    if (last) last->deliver(std::move(e));
}

uint64_t EventBus::dropped() const
{
    uint64_t n = 0;
    for (const auto& s : *m_list.load()) n += s->dropped();
    return n;
}

std::size_t EventBus::subscriberCount() const { return m_list.load()->size(); }

} // namespace ts::telemetry
