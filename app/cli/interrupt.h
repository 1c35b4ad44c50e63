#pragma once
// Ctrl-C and SIGTERM for the CLI.
// Contract:
//  - Only while an InterruptScope is alive do SIGINT/SIGTERM get a handler, which just hands the
//    signal to a watcher thread (through a pipe; both made by the first scope), so the work done
//    on a signal runs outside the handler. Signals are never blocked: processes the CLI starts
//    (PyTorch for bench) get them as usual. Scopes are made on the main thread.
//  - While an InterruptScope is alive, the first signal runs its action on the watcher thread
//    (e.g. Trainer::cancel) and the command finishes cleanly: a training run stops at its next
//    step and is recorded as cancelled. A second signal, or any signal while no scope is alive,
//    ends the process at once with the signal's default action.
//  - The action runs under the scope's lock: it never runs after setAction() replaced it or the
//    scope was destroyed, so it may use objects that live as long as it is set. It must be quick.
//  - Scopes do not nest; one is alive at a time (asserted).

#include <functional>

namespace tscli {

class InterruptScope {
public:
    InterruptScope();
    ~InterruptScope();
    // What an interrupt does from now on; run at once when one came already (while preparing).
    void setAction(std::function<void()> action);
    InterruptScope(const InterruptScope&) = delete;
    InterruptScope& operator=(const InterruptScope&) = delete;
    // True once a signal reached this scope.
    bool interrupted() const;
};

// The shell's exit status for a command stopped by an interrupt (128 + SIGINT).
inline constexpr int kInterruptedExitCode = 130;

} // namespace tscli
