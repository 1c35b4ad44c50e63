#include "distribute/step_schedule.h"

#include <algorithm>
#include <cstring>
#include <tuple>

namespace ts {

namespace {
struct PackedSnapshot {
    int64_t completed, steps;
    double lossSum;
    int64_t correct, count;
    double seconds;
};
static_assert(sizeof(PackedSnapshot) == 12 * sizeof(float));
} // namespace

std::vector<float> encodeScheduleSnapshot(const ScheduleSnapshot& s)
{
    const PackedSnapshot p{s.completed, s.epochSoFar.steps, s.epochSoFar.lossSum, s.epochSoFar.correct, s.epochSoFar.count, s.epochSoFar.seconds};
    std::vector<float> out(12);
    std::memcpy(out.data(), &p, sizeof p);
    return out;
}

std::optional<ScheduleSnapshot> decodeScheduleSnapshot(const float* values, int64_t n)
{
    if (n != 12) return std::nullopt;
    PackedSnapshot p;
    std::memcpy(&p, values, sizeof p);
    if (p.completed < 0 || p.steps < 0 || p.count < 0) return std::nullopt;
    return ScheduleSnapshot{p.completed, StepTally{p.steps, p.lossSum, p.correct, p.count, p.seconds}};
}

StepSchedule::StepSchedule(ScheduleConfig config) : m_config(std::move(config))
{
    m_config.workers = std::max(1, m_config.workers);
    m_completed = std::max<int64_t>(0, m_config.completed);
    m_next = m_completed + 1;
}

std::pair<int64_t, int64_t> stepPosition(int64_t step, int64_t stepsPerEpoch)
{
    if (stepsPerEpoch <= 0) return {1, step};
    const int64_t epoch = (step - 1) / stepsPerEpoch + 1;
    return {epoch, step - (epoch - 1) * stepsPerEpoch};
}

int64_t StepSchedule::epochOf(int64_t step) const { return stepPosition(step, m_stepsPerEpoch).first; }

int64_t StepSchedule::lastStep() const
{
    if (m_stepsPerEpoch < 0) return -1;
    const int64_t byEpochs = m_config.epochs * m_stepsPerEpoch;
    return m_config.maxSteps > 0 ? std::min(byEpochs, m_config.maxSteps) : byEpochs;
}

int64_t StepSchedule::epochSize(int64_t epoch) const
{
    const int64_t first = (epoch - 1) * m_stepsPerEpoch + 1;
    return std::max<int64_t>(0, std::min(m_stepsPerEpoch, lastStep() - first + 1));
}

void StepSchedule::fixEpochSize()
{
    if (m_stepsPerEpoch > 0) return;
    int64_t sum = 0;
    int known = 0;
    for (const auto& [worker, n] : m_batches) {
        if (m_released.count(worker)) continue;
        if (n < 0) return;
        sum += n;
        ++known;
    }
    if (known < m_config.workers - static_cast<int>(m_released.size()) || known == 0) return;
    m_stepsPerEpoch = std::max<int64_t>(1, sum);
    m_block = m_config.maxBlock > 0 ? m_config.maxBlock : std::clamp<int64_t>(m_stepsPerEpoch / (32 * m_config.workers), 1, 8);
    // A resumed run continues the epoch it was in: its steps before that epoch are whole epochs.
    const int64_t before = std::max<int64_t>(0, m_config.completed - m_config.epochSoFar.steps);
    m_epoch = before / m_stepsPerEpoch + 1;
    if (m_config.completed > 0) {
        m_tally = m_config.epochSoFar;
        m_resumedSeconds = m_config.epochSoFar.seconds;
    }
}

void StepSchedule::collect(std::vector<EpochDone>* epochs)
{
    if (m_stepsPerEpoch < 0) return;
    const int64_t last = lastStep();
    // Outcomes of steps past the run's end (handed out before its length was known) count for nothing.
    m_pending.erase(m_pending.upper_bound(last), m_pending.end());
    for (;;) {
        const int64_t size = epochSize(m_epoch);
        if (size <= 0) return;
        const int64_t end = m_epoch * m_stepsPerEpoch;
        for (auto it = m_pending.begin(); it != m_pending.end() && it->first <= end;) {
            m_tally.steps += 1;
            m_tally.lossSum += it->second.lossSum;
            m_tally.correct += it->second.correct;
            m_tally.count += it->second.count;
            it = m_pending.erase(it);
        }
        if (m_tally.steps < size) return;
        const auto now = Clock::now();
        m_tally.seconds = m_resumedSeconds + (m_epochStart ? std::chrono::duration<double>(now - *m_epochStart).count() : 0.0);
        if (epochs) epochs->push_back(EpochDone{m_epoch, (m_epoch - 1) * m_stepsPerEpoch + size, m_tally});
        ++m_epoch;
        m_tally = {};
        m_resumedSeconds = 0;
        m_epochStart = now;
    }
}

Result<StepGrant> StepSchedule::claim(const std::string& worker, int64_t batchesPerEpoch, const std::vector<StepOutcome>& done,
                                      std::vector<EpochDone>* epochs)
{
    std::lock_guard lock(m_mutex);
    if (m_released.count(worker))
        return makeError(ErrorCode::Cancelled, worker + " was released from the run (the coordinator lost touch with it); it takes no more steps",
                         "start the run again to train on every worker");
    if (!m_batches.count(worker) && static_cast<int>(m_batches.size()) >= m_config.workers)
        return makeError(ErrorCode::InvalidArgument, worker + " is not one of the run's " + std::to_string(m_config.workers) + " workers");
    for (const StepOutcome& o : done) {
        auto it = m_held.find(o.step);
        if (it == m_held.end() || it->second != worker)
            return makeError(ErrorCode::InvalidArgument, worker + " reported step " + std::to_string(o.step) + ", which it does not hold");
    }
    for (const StepOutcome& o : done) {
        m_held.erase(o.step);
        ++m_completed;
        m_pending[o.step] = o;
    }
    int64_t& known = m_batches.try_emplace(worker, -1).first->second;
    if (batchesPerEpoch >= 0) known = batchesPerEpoch;
    fixEpochSize();
    collect(epochs);

    StepGrant g;
    g.stepsPerEpoch = m_stepsPerEpoch;
    g.totalSteps = lastStep();
    // No step before every worker has checked in (or was released): with their parts' sizes
    // known, the first step already belongs to the right epoch. Once the epoch's size is fixed
    // that holds anyway: a readmitted worker that never checked in holds nobody back.
    int checkedIn = 0;
    for (const auto& [w, n] : m_batches) checkedIn += m_released.count(w) == 0;
    if (m_stepsPerEpoch < 0 && checkedIn < m_config.workers - static_cast<int>(m_released.size())) {
        g.kind = StepGrant::Kind::Wait;
        return g;
    }
    if (!m_epochStart) m_epochStart = Clock::now();
    const int64_t last = g.totalSteps >= 0 ? g.totalSteps : m_config.maxSteps > 0 ? m_config.maxSteps : -1;
    if (!m_returned.empty()) {
        g.step = *m_returned.begin();
        g.count = 1;
        m_returned.erase(m_returned.begin());
    } else if (last < 0 || m_next <= last) {
        g.step = m_next;
        g.count = last < 0 ? 1 : std::min(m_block, last - m_next + 1);
        m_next += g.count;
    } else {
        g.kind = m_held.empty() ? StepGrant::Kind::Done : StepGrant::Kind::Wait;
        return g;
    }
    g.kind = StepGrant::Kind::Step;
    for (int64_t i = 0; i < g.count; ++i) m_held[g.step + i] = worker;
    std::tie(g.epoch, g.stepInEpoch) = stepPosition(g.step, m_stepsPerEpoch);
    return g;
}

void StepSchedule::release(const std::string& worker)
{
    std::lock_guard lock(m_mutex);
    if (!m_released.insert(worker).second) return;
    for (auto it = m_held.begin(); it != m_held.end();) {
        if (it->second == worker) {
            m_returned.insert(it->first);
            it = m_held.erase(it);
        } else {
            ++it;
        }
    }
    fixEpochSize();
}

void StepSchedule::readmit(const std::string& worker)
{
    std::lock_guard lock(m_mutex);
    if (m_released.erase(worker) == 0) return;
    TS_ASSERT(std::none_of(m_held.begin(), m_held.end(), [&](const auto& h) { return h.second == worker; }));
}

ScheduleSnapshot StepSchedule::snapshot() const
{
    std::lock_guard lock(m_mutex);
    ScheduleSnapshot s;
    s.completed = m_completed;
    s.epochSoFar = m_tally;
    // Outcomes waiting for an earlier step of their epoch count for the epoch too.
    if (m_stepsPerEpoch > 0) {
        const int64_t end = m_epoch * m_stepsPerEpoch;
        for (const auto& [step, o] : m_pending) {
            if (step > end) break;
            s.epochSoFar.steps += 1;
            s.epochSoFar.lossSum += o.lossSum;
            s.epochSoFar.correct += o.correct;
            s.epochSoFar.count += o.count;
        }
        s.epochSoFar.seconds = m_resumedSeconds + (m_epochStart ? std::chrono::duration<double>(Clock::now() - *m_epochStart).count() : 0.0);
    }
    return s;
}

int64_t StepSchedule::completed() const
{
    std::lock_guard lock(m_mutex);
    return m_completed;
}

} // namespace ts
