#include "session/rundata.h"

#include <cmath>
#include <limits>

#include "store/run_store.h"
#include "telemetry/advisor.h"

namespace ts {
namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
double metricOr(const std::map<std::string, double>& m, const char* key)
{
    auto it = m.find(key);
    return it == m.end() ? kNaN : it->second;
}
}

void RunData::clear() { *this = RunData(); }

double RunData::wallOf(int64_t us)
{
    if (m_firstUs == 0 || us < m_firstUs) m_firstUs = m_firstUs == 0 ? us : m_firstUs;
    return static_cast<double>(us - m_firstUs) * 1e-6;
}

namespace {

// Drops the rows whose step is past `step` from every column of `cols` (columns in `all`).
void dropAfter(const std::vector<double>& steps, double step, std::initializer_list<std::vector<double>*> all)
{
    std::size_t keep = 0;
    while (keep < steps.size() && steps[keep] <= step) ++keep;
    for (auto* c : all)
        if (c->size() > keep) c->resize(keep);
}

} // namespace

void RunData::rewind(double step)
{
    auto& s = m_steps;
    dropAfter(s.step, step, {&s.epoch, &s.wall, &s.loss, &s.accuracy, &s.samplesPerSec, &s.learningRate, &s.lossScale,
                             &s.skippedSteps, &s.staleness, &s.step});
    auto& e = m_epochs;
    dropAfter(e.step, step, {&e.epoch, &e.wall, &e.loss, &e.accuracy, &e.valLoss, &e.valAccuracy, &e.samplesPerSec, &e.seconds, &e.step});
    auto& b = m_breakdown;
    dropAfter(b.step, step, {&b.wall, &b.input, &b.forward, &b.backward, &b.communication, &b.optimizer, &b.other, &b.total, &b.step});
    m_lastStep = std::min(m_lastStep, static_cast<int64_t>(step));
}

void RunData::add(const telemetry::Event& event)
{
    using namespace telemetry;
    const Stamp& stamp = stampOf(event);
    if (m_runId.empty()) m_runId = stamp.runId;
    ++m_revision;
    std::visit(
        [&](const auto& e) {
            using T = std::decay_t<decltype(e)>;
            if constexpr (std::is_same_v<T, RunStateEvent>) {
                // A restarted attempt (train --restarts) replays the steps after its backup: the
                // curves continue from there with its values, as the run's record does.
                if (e.resumedAfterStep >= 0) rewind(static_cast<double>(e.resumedAfterStep));
                m_state = e.state;
                m_stateMessage = e.message;
                if (e.stamp.wallTimeUs > 0) wallOf(e.stamp.wallTimeUs);
            } else if constexpr (std::is_same_v<T, StepMetricsEvent>) {
                // A step recorded twice (a resumed run) keeps the newest value in place.
                if (!m_steps.step.empty() && static_cast<double>(e.stamp.step) <= m_steps.step.back()) return;
                m_steps.step.push_back(static_cast<double>(e.stamp.step));
                m_steps.epoch.push_back(static_cast<double>(e.epoch));
                m_steps.wall.push_back(wallOf(e.stamp.wallTimeUs));
                m_steps.loss.push_back(e.loss);
                m_steps.accuracy.push_back(metricOr(e.metrics, "accuracy"));
                m_steps.samplesPerSec.push_back(e.samplesPerSec);
                m_steps.learningRate.push_back(e.learningRate);
                m_steps.lossScale.push_back(metricOr(e.metrics, "loss_scale"));
                m_steps.skippedSteps.push_back(metricOr(e.metrics, "skipped_steps"));
                m_steps.staleness.push_back(metricOr(e.metrics, "staleness"));
                m_lastStep = std::max(m_lastStep, e.stamp.step);
            } else if constexpr (std::is_same_v<T, EpochMetricsEvent>) {
                m_epochs.epoch.push_back(static_cast<double>(e.epoch));
                m_epochs.step.push_back(static_cast<double>(e.stamp.step));
                m_epochs.wall.push_back(wallOf(e.stamp.wallTimeUs));
                m_epochs.loss.push_back(metricOr(e.metrics, "loss"));
                m_epochs.accuracy.push_back(metricOr(e.metrics, "accuracy"));
                m_epochs.valLoss.push_back(metricOr(e.metrics, "val_loss"));
                m_epochs.valAccuracy.push_back(metricOr(e.metrics, "val_accuracy"));
                m_epochs.samplesPerSec.push_back(e.samplesPerSec);
                m_epochs.seconds.push_back(e.seconds);
                if (m_stepsPerEpoch == 0 && e.epoch == 1) m_stepsPerEpoch = e.stamp.step;
            } else if constexpr (std::is_same_v<T, StepBreakdownEvent>) {
                if (!m_breakdown.step.empty() && static_cast<double>(e.stamp.step) <= m_breakdown.step.back()) return;
                m_breakdown.step.push_back(static_cast<double>(e.stamp.step));
                m_breakdown.wall.push_back(wallOf(e.stamp.wallTimeUs));
                m_breakdown.input.push_back(e.input);
                m_breakdown.forward.push_back(e.forward);
                m_breakdown.backward.push_back(e.backward);
                m_breakdown.communication.push_back(e.communication);
                m_breakdown.optimizer.push_back(e.optimizer);
                m_breakdown.other.push_back(e.other);
                m_breakdown.total.push_back(e.stepSeconds);
            } else if constexpr (std::is_same_v<T, DeviceSampleEvent>) {
                // Remote runs: every worker's host and devices apart ("worker:1 host").
                std::string label = e.stamp.lane.device.empty() ? "host" : e.stamp.lane.device;
                if (!e.stamp.lane.worker.empty() && e.stamp.lane.worker != "local") label = e.stamp.lane.worker + " " + label;
                DeviceColumns& d = m_devices[label];
                d.label = label;
                d.step.push_back(static_cast<double>(e.stamp.step));
                d.wall.push_back(wallOf(e.stamp.wallTimeUs));
                d.utilisation.push_back(e.utilisation >= 0 ? e.utilisation : kNaN);
                d.memoryUsed.push_back(static_cast<double>(e.memoryUsed));
                d.memoryTotal.push_back(static_cast<double>(e.memoryTotal));
                d.processCpu.push_back(e.processCpu >= 0 ? e.processCpu : kNaN);
                if (!e.perCore.empty()) {
                    if (d.perCore.size() < e.perCore.size()) d.perCore.resize(e.perCore.size());
                    for (std::size_t c = 0; c < d.perCore.size(); ++c) {
                        auto& col = d.perCore[c];
                        col.resize(d.step.size() - 1, kNaN);  // a core that appeared late
                        col.push_back(c < e.perCore.size() ? e.perCore[c] : kNaN);
                    }
                }
            } else if constexpr (std::is_same_v<T, FindingEvent>) {
                // The advisor re-issues its findings every epoch: keep the newest of each kind.
                for (auto& f : m_findings)
                    if (f.kind == e.kind) {
                        f = e;
                        return;
                    }
                m_findings.push_back(e);
            } else if constexpr (std::is_same_v<T, LogEvent>) {
                m_logs.push_back(e);
            } else if constexpr (std::is_same_v<T, ErrorEvent>) {
                LogEvent l;
                l.stamp = e.stamp;
                l.level = LogLevel::Error;
                l.message = (e.where.empty() ? "" : e.where + ": ") + e.message + (e.hint.empty() ? "" : " (" + e.hint + ")");
                m_logs.push_back(std::move(l));
            } else {
                --m_revision;  // spans and pipeline samples are not plotted here
            }
        },
        event);
}

double RunData::inputShare(std::size_t window) const
{
    const std::size_t n = m_breakdown.step.size();
    if (n == 0) return kNaN;
    double input = 0, total = 0;
    for (std::size_t i = n - std::min(n, window); i < n; ++i) {
        input += m_breakdown.input[i];
        total += m_breakdown.total[i];
    }
    return total > 0 ? input / total : kNaN;
}

const char* RunData::inputVerdict(double share)
{
    const telemetry::AdvisorThresholds t;
    if (!std::isfinite(share) || share < t.inputModerate) return "not";
    return share < t.inputHigh ? "moderately" : "highly";
}

Result<RunData> RunData::load(store::RunStore& store, const std::string& runId)
{
    using namespace telemetry;
    RunData d;
    TS_ASSIGN(store::RunInfo info, store.run(runId));
    d.m_runId = runId;
    Status inner = okStatus();
    // One snapshot: a run still being written shows a consistent prefix.
    TS_TRY(store.withReadSnapshot([&] {
        Status s = store.forEachStep(runId, [&](int64_t step, int64_t epoch, int64_t wallUs,
                                                const std::map<std::string, double>& metrics) {
            if (!metrics.count("loss")) return;
            StepMetricsEvent e;
            e.stamp = Stamp{runId, step, wallUs, {}};
            e.epoch = epoch;
            e.loss = metrics.at("loss");
            for (const auto& [k, v] : metrics)
                if (k != "loss" && k != "samples_per_sec" && k != "learning_rate") e.metrics[k] = v;
            e.samplesPerSec = metricOr(metrics, "samples_per_sec");
            e.learningRate = metricOr(metrics, "learning_rate");
            d.add(Event(std::move(e)));
        });
        if (!s.ok()) {
            inner = s;
            return;
        }
        auto epochs = store.epochMetrics(runId);
        if (!epochs.ok()) {
            inner = epochs.takeError();
            return;
        }
        for (const auto& row : *epochs) {
            EpochMetricsEvent e;
            e.stamp = Stamp{runId, row.step, row.wallUs, {}};
            e.epoch = row.epoch;
            e.metrics = row.metrics;
            e.seconds = metricOr(row.metrics, "seconds");
            e.samplesPerSec = metricOr(row.metrics, "samples_per_sec");
            d.add(Event(std::move(e)));
        }
        auto breakdowns = store.breakdowns(runId);
        if (breakdowns.ok())
            for (auto& b : *breakdowns) d.add(Event(std::move(b)));
        auto devices = store.deviceSamples(runId);
        if (devices.ok())
            for (auto& s : *devices) d.add(Event(std::move(s)));
        auto findings = store.findings(runId);
        if (findings.ok())
            for (auto& f : *findings) d.add(Event(std::move(f)));
        auto logs = store.logs(runId);
        if (logs.ok())
            for (auto& l : *logs) d.add(Event(std::move(l)));
    }));
    TS_TRY(inner);
    d.m_state = info.status;
    d.m_stateMessage = info.error;
    return d;
}

} // namespace ts
