#pragma once
// DrainThread: the loop every bus sink that processes events as they come runs (the trace file,
// the advisor): a background thread that drains one subscription once a kHelperPeriod, or
// sooner when the subscription's wake threshold is reached, and hands each batch to `take`.
// Contract:
//  - Threading: `take` runs on the drain thread while it lives, then once more on the thread
//    that calls stop() (after the join): never twice at once.
//  - stop() unsubscribes first, which closes the subscription, so the thread's wait returns at
//    once instead of at its next period; then joins and hands over what was still queued.
//    Idempotent; the destructor calls it. The bus must outlive the DrainThread.

#include <atomic>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "telemetry/bus.h"

namespace ts::telemetry {

class DrainThread {
public:
    using Take = std::function<void(std::vector<Event>&)>;
    // `threadName`: at most 15 characters (becomeBackgroundThread).
    DrainThread(EventBus& bus, std::shared_ptr<Subscription> subscription, const char* threadName, Take take);
    ~DrainThread();
    DrainThread(const DrainThread&) = delete;
    DrainThread& operator=(const DrainThread&) = delete;
    void stop();

private:
    EventBus* m_bus;
    std::shared_ptr<Subscription> m_sub;
    Take m_take;
    std::atomic<bool> m_stop{false};
    bool m_stopped = false;
    std::thread m_thread;  // last: starts once the members above exist
};

} // namespace ts::telemetry
