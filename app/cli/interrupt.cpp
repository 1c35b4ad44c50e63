#include "interrupt.h"

#include <atomic>
#include <cassert>
#include <csignal>
#include <mutex>
#include <thread>
#include <unistd.h>

namespace tscli {
namespace {

std::mutex g_mutex;
std::function<void()> g_action;     // guarded by g_mutex
bool g_scopeAlive = false;          // guarded by g_mutex
std::atomic<bool> g_interrupted{false};

sigset_t interruptSignals()
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    return set;
}

[[noreturn]] void dieBy(int sig)
{
    // The default action, so the shell sees "killed by SIGINT" (status 130) as it expects.
    std::signal(sig, SIG_DFL);
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, sig);
    pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
    raise(sig);
    _exit(128 + sig);  // not reached
}

void watch(sigset_t set)
{
    for (;;) {
        int sig = 0;
        if (sigwait(&set, &sig) != 0) continue;
        std::lock_guard lock(g_mutex);
        if (!g_scopeAlive || g_interrupted.exchange(true)) dieBy(sig);
        static const char msg[] = "\ninterrupted: stopping (interrupt again to quit at once)\n";
        [[maybe_unused]] auto n = ::write(STDERR_FILENO, msg, sizeof msg - 1);
        if (g_action) g_action();
    }
}

} // namespace

void installInterruptHandling()
{
    sigset_t set = interruptSignals();
    pthread_sigmask(SIG_BLOCK, &set, nullptr);  // inherited by every thread created from here on
    std::thread(watch, set).detach();
}

InterruptScope::InterruptScope()
{
    std::lock_guard lock(g_mutex);
    assert(!g_scopeAlive && "interrupt scopes do not nest");
    g_action = nullptr;
    g_scopeAlive = true;
    g_interrupted = false;
}

void InterruptScope::setAction(std::function<void()> action)
{
    std::lock_guard lock(g_mutex);
    g_action = std::move(action);
    if (g_action && g_interrupted) g_action();
}

InterruptScope::~InterruptScope()
{
    std::lock_guard lock(g_mutex);
    g_scopeAlive = false;
    g_action = nullptr;
}

bool InterruptScope::interrupted() const { return g_interrupted.load(); }

} // namespace tscli
