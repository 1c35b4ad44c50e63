#include "interrupt.h"

#include <atomic>
#include <cassert>
#include <cerrno>
#include <csignal>
#include <fcntl.h>
#include <iterator>
#include <mutex>
#include <thread>
#include <unistd.h>

namespace tscli {
namespace {

std::mutex g_mutex;
std::function<void()> g_action;     // guarded by g_mutex
bool g_scopeAlive = false;          // guarded by g_mutex
std::atomic<bool> g_interrupted{false};
int g_pipe[2] = {-1, -1};           // the handler writes the signal number, the watcher reads it

void onSignal(int sig)
{
    const int saved = errno;  // async-signal-safe: one write()
    const unsigned char b = static_cast<unsigned char>(sig);
    [[maybe_unused]] auto n = ::write(g_pipe[1], &b, 1);
    errno = saved;
}

constexpr int kSignals[] = {SIGINT, SIGTERM};
struct sigaction g_previous[std::size(kSignals)];  // the dispositions before the scope, guarded by g_mutex

struct sigaction actionFor(void (*handler)(int))
{
    struct sigaction sa {};
    sa.sa_handler = handler;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = handler == SIG_DFL ? 0 : SA_RESTART;  // most system calls resume after the handler
    return sa;
}

[[noreturn]] void dieBy(int sig)
{
    // The default action, so the shell sees "killed by SIGINT" (status 130) as it expects.
    const struct sigaction dfl = actionFor(SIG_DFL);
    for (int other : kSignals) sigaction(other, &dfl, nullptr);
    raise(sig);
    _exit(128 + sig);  // not reached
}

void watch()
{
    for (;;) {
        unsigned char b = 0;
        const ssize_t n = ::read(g_pipe[0], &b, 1);
        if (n != 1) {
            if (n < 0 && errno == EINTR) continue;
            return;
        }
        const int sig = b;
        std::lock_guard lock(g_mutex);
        if (!g_scopeAlive || g_interrupted.exchange(true)) dieBy(sig);
        static const char msg[] = "\ninterrupted: stopping (interrupt again to quit at once)\n";
        [[maybe_unused]] auto w = ::write(STDERR_FILENO, msg, sizeof msg - 1);
        if (g_action) g_action();
    }
}

// The pipe and its watcher thread, made by the first scope: commands that never stop a run
// (runs, validate, bench) start nothing.
void startWatcher()
{
    static std::once_flag once;
    std::call_once(once, [] {
        if (::pipe2(g_pipe, O_CLOEXEC) != 0) return;  // no pipe: signals keep their default action
        std::thread(watch).detach();
    });
}

} // namespace

InterruptScope::InterruptScope()
{
    startWatcher();
    std::lock_guard lock(g_mutex);
    assert(!g_scopeAlive && "interrupt scopes do not nest");
    g_action = nullptr;
    g_scopeAlive = true;
    g_interrupted = false;
    if (g_pipe[1] < 0) return;
    const struct sigaction sa = actionFor(onSignal);
    for (std::size_t i = 0; i < std::size(kSignals); ++i) {
        sigaction(kSignals[i], nullptr, &g_previous[i]);
        // A signal the parent made us ignore (a background job of a script, nohup) stays ignored.
        if (g_previous[i].sa_handler != SIG_IGN) sigaction(kSignals[i], &sa, nullptr);
    }
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
    // From here on a signal does what it did before the scope (usually: end the process).
    if (g_pipe[1] >= 0)
        for (std::size_t i = 0; i < std::size(kSignals); ++i) sigaction(kSignals[i], &g_previous[i], nullptr);
}

bool InterruptScope::interrupted() const { return g_interrupted.load(); }

} // namespace tscli
