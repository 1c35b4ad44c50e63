#include "telemetry/breakdown.h"

#include <algorithm>

namespace ts::telemetry {
namespace {

struct PhaseState {
    PhaseTimes acc;
    StepPart current = StepPart::Other;
    int64_t since = 0;
    int depth = 0;
};

PhaseState& state()
{
    thread_local PhaseState s;
    return s;
}

} // namespace

const char* stepPartName(StepPart part)
{
    switch (part) {
    case StepPart::Input: return "input";
    case StepPart::Forward: return "forward";
    case StepPart::Backward: return "backward";
    case StepPart::Communication: return "communication";
    case StepPart::Optimizer: return "optimizer";
    case StepPart::Other: return "other";
    }
    return "other";
}

int64_t PhaseTimes::sum() const
{
    int64_t s = 0;
    for (int64_t v : ns) s += v;
    return s;
}

void PhaseAccount::reset()
{
    PhaseState& s = state();
    s.acc = {};
    s.since = nowNs();  // an open phase restarts its count from now
}

PhaseTimes PhaseAccount::current() { return state().acc; }

PhaseScope::PhaseScope(StepPart part, const char* spanName)
    : m_part(part), m_span(spanName)
{
    PhaseState& s = state();
    const int64_t t = nowNs();
    if (s.depth > 0) s.acc.ns[static_cast<std::size_t>(s.current)] += t - s.since;
    m_prev = s.current;
    s.current = part;
    s.since = t;
    ++s.depth;
    m_start = t;
#if defined(TS_TRACING) && TS_TRACING
    m_trace = Tracer::enabled();
#else
    m_trace = false;
#endif
}

PhaseScope::~PhaseScope()
{
    PhaseState& s = state();
    const int64_t t = nowNs();
    s.acc.ns[static_cast<std::size_t>(m_part)] += t - s.since;
    s.current = m_prev;
    s.since = t;
    --s.depth;
    if (m_trace) Tracer::recordSpan(m_span, stepPartName(m_part), m_start, t);
}

StepBreakdownEvent makeBreakdown(int64_t stepNs, const PhaseTimes& parts)
{
    int64_t named = 0;
    for (int i = 0; i < kStepPartCount; ++i)
        if (i != static_cast<int>(StepPart::Other)) named += std::max<int64_t>(0, parts.ns[static_cast<std::size_t>(i)]);
    const int64_t total = std::max(stepNs, named);
    auto sec = [](int64_t ns) { return static_cast<double>(ns) * 1e-9; };
    StepBreakdownEvent e;
    e.stepSeconds = sec(total);
    e.input = sec(std::max<int64_t>(0, parts.ns[static_cast<std::size_t>(StepPart::Input)]));
    e.forward = sec(std::max<int64_t>(0, parts.ns[static_cast<std::size_t>(StepPart::Forward)]));
    e.backward = sec(std::max<int64_t>(0, parts.ns[static_cast<std::size_t>(StepPart::Backward)]));
    e.communication = sec(std::max<int64_t>(0, parts.ns[static_cast<std::size_t>(StepPart::Communication)]));
    e.optimizer = sec(std::max<int64_t>(0, parts.ns[static_cast<std::size_t>(StepPart::Optimizer)]));
    e.other = sec(total - named);  // measured Other time is part of the remainder
    return e;
}

double partSeconds(const StepBreakdownEvent& e, StepPart part)
{
    switch (part) {
    case StepPart::Input: return e.input;
    case StepPart::Forward: return e.forward;
    case StepPart::Backward: return e.backward;
    case StepPart::Communication: return e.communication;
    case StepPart::Optimizer: return e.optimizer;
    case StepPart::Other: return e.other;
    }
    return 0;
}

} // namespace ts::telemetry
