#pragma once
// Step-time breakdown (TensorBoard's overview page): input, forward, backward, communication,
// optimizer, other. The Trainer and the Strategy mark phases with PhaseScope on replica 0's
// thread (the trainer's); the parts are exclusive times measured with nowNs(), and `other` is
// the remainder of the measured step, so the parts add up to the step time exactly.
// Contract:
//  - Threading: phase accounting is thread_local; each thread accounts its own phases. The
//    Trainer resets and reads its own thread's accounts around each step; phases recorded on
//    replica threads only produce spans.
//  - Nesting: a phase inside another takes its time out of the outer one (host-to-device copy
//    inside forward counts as input).
//  - PhaseScope also records a trace span (category = the part's name) when tracing is on.
//  - Errors: none.

#include <array>
#include <cstdint>

#include "telemetry/events.h"
#include "telemetry/tracer.h"

namespace ts::telemetry {

enum class StepPart : int { Input = 0, Forward, Backward, Communication, Optimizer, Other };
inline constexpr int kStepPartCount = 6;
// "input", "forward", "backward", "communication", "optimizer", "other"
const char* stepPartName(StepPart part);

// Exclusive nanoseconds per part, measured on one thread.
struct PhaseTimes {
    std::array<int64_t, kStepPartCount> ns{};
    int64_t sum() const;
};

class PhaseAccount {
public:
    // Clears the calling thread's accounts (start of a step).
    static void reset();
    // The calling thread's accounts since the last reset.
    static PhaseTimes current();
};

class PhaseScope {
public:
    PhaseScope(StepPart part, const char* spanName);
    ~PhaseScope();
    PhaseScope(const PhaseScope&) = delete;
    PhaseScope& operator=(const PhaseScope&) = delete;

private:
    StepPart m_part;
    StepPart m_prev;
    int64_t m_start;
    const char* m_span;
    bool m_trace;
};

// Builds the event for a step of `stepNs` from measured parts: `other` is stepNs minus the
// named parts (plus any explicitly measured Other time), never negative; if the named parts
// exceed the step (clock granularity), the step time is raised to their sum.
StepBreakdownEvent makeBreakdown(int64_t stepNs, const PhaseTimes& parts);

// Seconds of one part of an event.
double partSeconds(const StepBreakdownEvent& e, StepPart part);

} // namespace ts::telemetry
