#include "telemetry/drain_thread.h"

#include "common/background_thread.h"

namespace ts::telemetry {

DrainThread::DrainThread(EventBus& bus, std::shared_ptr<Subscription> subscription, const char* threadName, Take take)
    : m_bus(&bus), m_sub(std::move(subscription)), m_take(std::move(take))
{
    m_thread = std::thread([this, threadName] {
        becomeBackgroundThread(threadName);
        std::vector<Event> batch;
        while (!m_stop.load(std::memory_order_acquire)) {
            if (!m_sub->wait(kHelperPeriod)) continue;
            batch.clear();
            m_sub->drain(batch);
            m_take(batch);
        }
    });
}

DrainThread::~DrainThread() { stop(); }

void DrainThread::stop()
{
    if (m_stopped) return;
    m_stopped = true;
    m_stop.store(true, std::memory_order_release);
    m_bus->unsubscribe(m_sub);  // closes it: the thread's wait() returns now, not at its next drain
    m_thread.join();
    std::vector<Event> rest = m_sub->drain();
    m_take(rest);
}

} // namespace ts::telemetry
