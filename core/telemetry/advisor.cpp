#include "telemetry/advisor.h"

#include <algorithm>
#include <cstdio>
#include <map>

namespace ts::telemetry {
namespace {

std::string pct(double share)
{
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f%%", share * 100.0);
    return buf;
}

std::string ms(double seconds)
{
    char buf[32];
    if (seconds < 1e-3) std::snprintf(buf, sizeof buf, "%.0f us", seconds * 1e6);
    else std::snprintf(buf, sizeof buf, "%.2f ms", seconds * 1e3);
    return buf;
}

// Shares are sums of many doubles: a share meant to sit exactly on a threshold (5%) may come
// out a few ulps below it. Thresholds are percentages; a billionth does not matter.
bool atLeast(double share, double threshold) { return share >= threshold - 1e-9; }

int severityRank(const std::string& s) { return s == "high" ? 0 : s == "moderate" ? 1 : 2; }

bool startsWith(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

struct StageTotals {
    double wait = 0, busy = 0, depth = 0, capacity = 0;
    int64_t produced = 0, samples = 0;
    int parallelism = 1;
};

// What to change in the input pipeline, from its samples (or the generic advice without them).
std::string inputRecommendation(const std::vector<PipelineSampleEvent>& pipeline)
{
    if (pipeline.empty())
        return "add prefetch(AUTOTUNE) after batching so the next batch is prepared while the model trains; "
               "raise map parallelism to AUTOTUNE (num_parallel_calls); cache() the decoded dataset if it fits in memory";
    std::map<std::string, StageTotals> stages;
    for (const auto& p : pipeline) {
        StageTotals& t = stages[p.stage];
        t.wait += p.waitSeconds;
        t.busy += p.busySeconds;
        t.produced += p.produced;
        t.depth += static_cast<double>(p.queueDepth);
        t.capacity += static_cast<double>(p.queueCapacity);
        t.parallelism = std::max(t.parallelism, p.parallelism);
        ++t.samples;
    }
    bool hasPrefetch = false;
    for (const auto& [name, t] : stages) hasPrefetch |= startsWith(name, "prefetch");
    // The bottleneck: the stage the consumer waited on most; without wait attribution, the one
    // that spends the most time per element.
    const std::string* worst = nullptr;
    double worstScore = -1;
    for (const auto& [name, t] : stages) {
        const double score = t.wait > 0 ? t.wait : (t.produced > 0 ? t.busy / static_cast<double>(t.produced) : t.busy) * 1e-6;
        if (score > worstScore) {
            worstScore = score;
            worst = &name;
        }
    }
    std::vector<std::string> recs;
    if (worst) {
        const StageTotals& t = stages[*worst];
        const std::string quoted = "'" + *worst + "'";
        if (startsWith(*worst, "map") && t.parallelism <= 1)
            recs.push_back("raise map parallelism to AUTOTUNE: stage " + quoted + " runs on one thread and the trainer waits on it");
        else if (startsWith(*worst, "map"))
            recs.push_back("stage " + quoted + " is the slowest even at parallelism " + std::to_string(t.parallelism) +
                           ": make its function cheaper, move fixed work before cache(), or vectorise it after batch()");
        else if (startsWith(*worst, "read") || startsWith(*worst, "source") || startsWith(*worst, "interleave") ||
                 startsWith(*worst, "file"))
            recs.push_back("read in advance: interleave the file reads (cycle_length, num_parallel_calls=AUTOTUNE) or cache() "
                           "the dataset after decoding; stage " + quoted + " is the slowest");
        else if (startsWith(*worst, "shuffle"))
            recs.push_back("stage " + quoted + " stalls while its buffer refills: shuffle before the expensive map, or lower "
                           "buffer_size");
        else if (startsWith(*worst, "prefetch") && t.capacity > 0 && t.depth < 0.1 * t.capacity)
            recs.push_back("prefetch " + quoted + " is nearly always empty: its producers are too slow; raise map parallelism "
                           "to AUTOTUNE upstream");
        else
            recs.push_back("stage " + quoted + " is the slowest: give it more parallelism (AUTOTUNE) or cache its output");
    }
    if (!hasPrefetch) recs.push_back("add prefetch(AUTOTUNE) as the last stage");
    std::string out;
    for (const auto& r : recs) out += (out.empty() ? "" : "; ") + r;
    return out;
}

} // namespace

std::vector<FindingEvent> advise(const AdvisorInput& in, const AdvisorThresholds& th)
{
    std::vector<FindingEvent> out;
    if (in.steps.empty()) return out;
    double total = 0, input = 0, comm = 0, other = 0;
    for (const auto& s : in.steps) {
        total += s.stepSeconds;
        input += s.input;
        comm += s.communication;
        other += s.other;
    }
    if (!(total > 0)) return out;
    const double n = static_cast<double>(in.steps.size());
    const StepBreakdownEvent& last = in.steps.back();
    auto finding = [&](const char* kind, const char* severity, std::string message, std::string rec) {
        FindingEvent f;
        f.stamp = last.stamp;
        f.kind = kind;
        f.severity = severity;
        f.message = std::move(message);
        f.recommendation = std::move(rec);
        f.firstStep = in.steps.front().stamp.step;
        f.lastStep = last.stamp.step;
        out.push_back(std::move(f));
    };
    const std::string window = " over " + std::to_string(in.steps.size()) + " step(s)";

    // Input-bound verdict (always given, like TensorBoard's overview).
    const double inputShare = input / total;
    const double inputPerStep = input / n;
    if (!atLeast(inputShare, th.inputModerate) || inputPerStep <= th.inputNegligibleSeconds) {
        finding("input-bound", "info",
                "Not input-bound: " + pct(inputShare) + " of step time waits for input (" + ms(inputPerStep) + " per step)" + window + ".",
                "nothing to change in the input pipeline; speed-ups are in the compute parts");
    } else {
        const bool high = atLeast(inputShare, th.inputHigh);
        finding("input-bound", high ? "high" : "moderate",
                std::string(high ? "Highly" : "Moderately") + " input-bound: " + pct(inputShare) +
                    " of step time waits for the next batch (" + ms(inputPerStep) + " per step)" + window + ".",
                inputRecommendation(in.pipeline));
    }

    // Host overhead: time in the step outside every measured part.
    const double otherShare = other / total;
    if (atLeast(otherShare, th.hostModerate)) {
        const bool high = atLeast(otherShare, th.hostHigh);
        finding("host-overhead", high ? "high" : "moderate",
                pct(otherShare) + " of step time is host overhead outside input, compute, communication and the optimizer "
                                  "(framework work, kernel launches, waiting for replica threads)" + window + ".",
                "increase the batch size so the fixed per-step cost is amortised; with many small layers use fewer, larger "
                "ones; give every replica thread its own core");
    }

    // Communication share.
    const double commShare = comm / total;
    if (atLeast(commShare, th.communicationModerate)) {
        const bool high = atLeast(commShare, th.communicationHigh);
        std::string rec = "increase the per-replica batch so each all-reduce carries more compute";
        if (in.replicas > 1) rec += ", or use fewer replicas (" + std::to_string(in.replicas) + " now)";
        finding("communication", high ? "high" : "moderate",
                pct(commShare) + " of step time is gradient all-reduce (" + ms(comm / n) + " per step)" + window + ".",
                rec);
    }

    // Loss scaling (mixed_float16): steps skipped because their gradients overflowed, after the
    // scale has had its first steps to settle.
    {
        const StepMetricsEvent* first = nullptr;
        for (const auto& m : in.lossScale)
            if (m.stamp.step > th.lossScaleSettleSteps) {
                first = &m;
                break;
            }
        const StepMetricsEvent* lastScale = in.lossScale.empty() ? nullptr : &in.lossScale.back();
        auto metric = [](const StepMetricsEvent& m, const char* key) {
            const auto it = m.metrics.find(key);
            return it == m.metrics.end() ? 0.0 : it->second;
        };
        // Every step so far skipped (a fixed scale too large for float16): no weight has changed.
        // Said at any run length; the share below waits for the scale to settle.
        const bool allSkipped = lastScale && lastScale->stamp.step >= th.allSkippedMinSteps &&
                                metric(*lastScale, "skipped_steps") >= static_cast<double>(lastScale->stamp.step);
        if (allSkipped) {
            FindingEvent f;
            f.stamp = lastScale->stamp;
            f.kind = "loss-scale";
            f.severity = "high";
            f.message = "all " + std::to_string(lastScale->stamp.step) + " steps so far were skipped because their float16 gradients "
                        "overflowed at loss scale " + [&] {
                            char buf[32];
                            std::snprintf(buf, sizeof buf, "%g", metric(*lastScale, "loss_scale"));  // may be 1e30
                            return std::string(buf);
                        }() + ": the weights have not changed.";
            f.recommendation = "use a dynamic loss scale (precision.loss_scale \"dynamic\") or a smaller fixed one, or train with "
                               "mixed_bfloat16, which needs no loss scaling";
            f.firstStep = 1;
            f.lastStep = lastScale->stamp.step;
            out.push_back(std::move(f));
        }
        if (!allSkipped && first && lastScale && lastScale->stamp.step > first->stamp.step) {
            const int64_t steps = lastScale->stamp.step - first->stamp.step;
            const double skipped = metric(*lastScale, "skipped_steps") - metric(*first, "skipped_steps");
            const double share = skipped / static_cast<double>(steps);
            if (skipped > 0 && atLeast(share, th.skippedModerate)) {
                const bool high = atLeast(share, th.skippedHigh);
                FindingEvent f;
                f.stamp = lastScale->stamp;
                f.kind = "loss-scale";
                f.severity = high ? "high" : "moderate";
                f.message = std::to_string(static_cast<int64_t>(skipped)) + " of the last " + std::to_string(steps) +
                            " steps were skipped because their float16 gradients overflowed (" + pct(share) +
                            " of the work lost; loss scale now " + std::to_string(static_cast<int64_t>(metric(*lastScale, "loss_scale"))) + ").";
                f.recommendation = "if the loss is rising too, lower the learning rate (the gradients are exploding); check the data "
                                   "for extreme values; or train with mixed_bfloat16, which has float32's range and needs no loss scaling";
                f.firstStep = first->stamp.step;
                f.lastStep = lastScale->stamp.step;
                out.push_back(std::move(f));
            }
        }
    }

    // Device idle: measured utilisation of real devices when probes report it, else the share
    // of the step the device is not computing.
    std::map<std::string, std::pair<double, int>> util;
    for (const auto& d : in.devices)
        if (!d.stamp.lane.device.empty() && d.utilisation >= 0) {
            auto& u = util[d.stamp.lane.worker + "/" + d.stamp.lane.device];
            u.first += d.utilisation;
            ++u.second;
        }
    const std::pair<const char*, double> nonCompute[] = {{"input", input}, {"communication", comm}, {"host overhead", other}};
    const auto* largest = &nonCompute[0];
    for (const auto& p : nonCompute)
        if (p.second > largest->second) largest = &p;
    auto idleRec = [&] {
        std::string r = "the largest non-compute part is " + std::string(largest->first) + " (" + pct(largest->second / total) + "): ";
        if (largest == &nonCompute[0]) r += "fix the input pipeline first (see input-bound)";
        else if (largest == &nonCompute[1]) r += "increase the per-replica batch or use fewer replicas";
        else r += "increase the batch size to amortise per-step overhead";
        return r;
    };
    if (!util.empty()) {
        for (const auto& [device, u] : util) {
            const double mean = u.first / u.second;
            if (mean < th.utilisationModerate) {
                const bool high = mean < th.utilisationHigh;
                finding("device-idle", high ? "high" : "moderate",
                        "Device " + device + " is busy only " + pct(mean) + " of the time (" + std::to_string(u.second) +
                            " sample(s)).",
                        idleRec());
            }
        }
    } else {
        const double idle = (input + comm + other) / total;
        if (atLeast(idle, th.idleModerate)) {
            const bool high = atLeast(idle, th.idleHigh);
            finding("device-idle", high ? "high" : "moderate",
                    "The device computes (forward, backward, optimizer) only " + pct(1.0 - idle) + " of step time" + window + ".",
                    idleRec());
        }
    }
    std::stable_sort(out.begin(), out.end(), [](const FindingEvent& a, const FindingEvent& b) {
        return severityRank(a.severity) < severityRank(b.severity);
    });
    return out;
}

Advisor::Advisor(std::size_t windowSteps, AdvisorThresholds thresholds)
    : m_window(std::max<std::size_t>(1, windowSteps)), m_thresholds(thresholds)
{
}

void Advisor::add(const Event& e)
{
    if (const auto* s = std::get_if<StepBreakdownEvent>(&e)) {
        m_steps.push_back(*s);
        while (m_steps.size() > m_window) m_steps.pop_front();
        // Samples older than the window's first step no longer describe it.
        const int64_t first = m_steps.front().stamp.step;
        while (!m_pipeline.empty() && m_pipeline.front().stamp.step < first) m_pipeline.pop_front();
        while (!m_devices.empty() && m_devices.front().stamp.step < first) m_devices.pop_front();
        while (!m_lossScale.empty() && m_lossScale.front().stamp.step < first) m_lossScale.pop_front();
    } else if (const auto* m = std::get_if<StepMetricsEvent>(&e)) {
        if (m->metrics.count("loss_scale")) m_lossScale.push_back(*m);
    } else if (const auto* p = std::get_if<PipelineSampleEvent>(&e)) {
        m_pipeline.push_back(*p);
    } else if (const auto* d = std::get_if<DeviceSampleEvent>(&e)) {
        if (!d->stamp.lane.device.empty()) m_devices.push_back(*d);  // host samples don't say device idle
    }
}

std::vector<FindingEvent> Advisor::findings() const
{
    AdvisorInput in;
    in.steps.assign(m_steps.begin(), m_steps.end());
    in.pipeline.assign(m_pipeline.begin(), m_pipeline.end());
    in.devices.assign(m_devices.begin(), m_devices.end());
    in.lossScale.assign(m_lossScale.begin(), m_lossScale.end());
    in.replicas = m_replicas;
    return advise(in, m_thresholds);
}

} // namespace ts::telemetry
