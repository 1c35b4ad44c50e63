#include "data/pipeline_stats.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace ts {

const char* inputBoundName(InputBound b)
{
    switch (b) {
    case InputBound::No: return "not";
    case InputBound::Moderately: return "moderately";
    case InputBound::Highly: return "highly";
    }
    return "not";
}

InputBound classifyInputBound(double waitShare)
{
    if (waitShare >= 0.20) return InputBound::Highly;
    if (waitShare >= 0.05) return InputBound::Moderately;
    return InputBound::No;
}

namespace {

std::string fmt(const char* f, double v)
{
    char buf[64];
    std::snprintf(buf, sizeof buf, f, v);
    return buf;
}

std::string msText(double seconds) { return seconds < 0.01 ? fmt("%.2f ms", seconds * 1e3) : fmt("%.1f ms", seconds * 1e3); }

// Splits `amount` of blocked time at async stage `a` over the stages feeding it (see the header).
void attribute(const std::vector<StageStats>& st, const std::vector<StageWindow>& w, int a, double amount,
               std::vector<double>& critical)
{
    if (amount <= 0) return;
    struct Part {
        int stage;
        double weight;
        bool nested;
    };
    std::vector<Part> parts;
    const auto& own = w[static_cast<std::size_t>(a)];
    parts.push_back({a, own.busySeconds / std::max(1, own.parallelism), false});
    int i = a - 1;
    for (; i >= 0 && !st[static_cast<std::size_t>(i)].async; --i) parts.push_back({i, w[static_cast<std::size_t>(i)].busySeconds, false});
    if (i >= 0) parts.push_back({i, w[static_cast<std::size_t>(i)].blockedSeconds, true});
    double total = 0;
    for (const auto& p : parts) total += std::max(0.0, p.weight);
    if (total <= 0) {
        critical[static_cast<std::size_t>(a)] += amount;
        return;
    }
    for (const auto& p : parts) {
        const double share = amount * std::max(0.0, p.weight) / total;
        if (p.nested) attribute(st, w, p.stage, share, critical);
        else critical[static_cast<std::size_t>(p.stage)] += share;
    }
}

std::string recommendationFor(const StageStats& s, const std::vector<StageStats>& all)
{
    const bool anyAsync = std::any_of(all.begin(), all.end(), [](const StageStats& x) { return x.async; });
    if (s.kind == "map") {
        if (!s.async)
            return "run " + s.name + " in parallel (num_parallel_calls: \"AUTOTUNE\")" +
                   (anyAsync ? std::string() : " and add prefetch(AUTOTUNE) as the last transformation");
        return "raise num_parallel_calls of " + s.name + " (it uses " + std::to_string(s.parallelism) +
               " threads), cache() its output if it is not random, or make the function cheaper";
    }
    if (s.kind == "source")
        return "read ahead of the step: interleave the files with num_parallel_calls, cache() after the source, or add "
               "prefetch(AUTOTUNE)";
    if (s.kind == "shuffle")
        return "shuffle refills its buffer at each epoch's start: prefetch after it, or use a smaller buffer_size";
    if (s.kind == "batch") return "add prefetch(AUTOTUNE) after batch so batches are assembled ahead of the step";
    if (s.kind == "prefetch")
        return "the prefetch buffer runs dry: the stages before it are too slow together; parallelise the slowest one";
    return anyAsync ? "parallelise the slowest stage before the prefetch" : "add prefetch(AUTOTUNE) as the last transformation";
}

} // namespace

PipelineWindow analyseWindow(const PipelineSnapshot& from, const PipelineSnapshot& to)
{
    PipelineWindow w;
    w.steps = to.steps - from.steps;
    w.firstStep = from.steps + 1;
    w.lastStep = to.steps;
    w.seconds = std::max(0.0, to.timeSeconds - from.timeSeconds);
    const double stepTotal = std::max(0.0, to.stepSeconds - from.stepSeconds);
    w.waitSeconds = std::max(0.0, to.waitSeconds - from.waitSeconds);
    w.meanStepSeconds = w.steps > 0 ? stepTotal / static_cast<double>(w.steps) : 0;
    w.waitShare = stepTotal > 0 ? std::min(1.0, w.waitSeconds / stepTotal) : 0;
    w.bound = w.steps > 0 ? classifyInputBound(w.waitShare) : InputBound::No;

    const std::size_t n = to.stages.size();
    w.stages.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
        const StageStats& b = to.stages[i];
        const StageStats* a = i < from.stages.size() ? &from.stages[i] : nullptr;
        StageWindow& s = w.stages[i];
        s.name = b.name;
        s.produced = b.produced - (a ? a->produced : 0);
        s.busySeconds = std::max(0.0, b.busySeconds - (a ? a->busySeconds : 0));
        s.blockedSeconds = std::max(0.0, b.blockedSeconds - (a ? a->blockedSeconds : 0));
        s.skipped = b.skipped - (a ? a->skipped : 0);
        s.queueDepth = b.queueDepth;
        s.queueCapacity = b.queueCapacity;
        s.parallelism = std::max(1, b.parallelism);
        s.elementsPerSecond = w.seconds > 0 ? static_cast<double>(s.produced) / w.seconds : 0;
        s.secondsPerElement = s.produced > 0 ? s.busySeconds / static_cast<double>(s.produced) : 0;
    }

    // The consumer's thread runs the synchronous stages from the last one down to the first
    // asynchronous stage; their self time is wait in full. The rest is that stage's blocked time.
    std::vector<double> critical(n, 0.0);
    int i = static_cast<int>(n) - 1;
    for (; i >= 0 && !to.stages[static_cast<std::size_t>(i)].async; --i)
        critical[static_cast<std::size_t>(i)] += w.stages[static_cast<std::size_t>(i)].busySeconds;
    if (i >= 0) attribute(to.stages, w.stages, i, w.stages[static_cast<std::size_t>(i)].blockedSeconds, critical);
    double total = 0;
    for (double c : critical) total += c;
    for (std::size_t k = 0; k < n; ++k) {
        w.stages[k].criticalSeconds = critical[k];
        w.stages[k].criticalShare = total > 0 ? critical[k] / total : 0;
    }

    std::string range = "steps " + std::to_string(w.firstStep) + "-" + std::to_string(w.lastStep);
    if (w.steps <= 0) {
        w.verdict = "no steps yet";
        return w;
    }
    const std::string share = fmt("%.1f%%", w.waitShare * 100);
    const std::string perStep = msText(w.waitSeconds / static_cast<double>(w.steps)) + " of " + msText(w.meanStepSeconds) + " per step";
    if (w.bound == InputBound::No) {
        w.verdict = range + ": not input-bound: " + share + " of step time waiting for input (" + perStep + ")";
        return w;
    }
    std::size_t best = 0;
    for (std::size_t k = 1; k < n; ++k)
        if (critical[k] > critical[best]) best = k;
    if (n > 0 && total > 0) {
        w.bottleneck = to.stages[best].name;
        w.recommendation = recommendationFor(to.stages[best], to.stages);
    }
    w.verdict = range + ": " + inputBoundName(w.bound) + " input-bound: " + share + " of step time waiting for input (" +
                perStep + ")";
    if (!w.bottleneck.empty())
        w.verdict += "; most likely " + w.bottleneck + " (" + fmt("%.0f%%", w.stages[best].criticalShare * 100) + " of the wait)";
    return w;
}

std::vector<telemetry::PipelineSampleEvent> pipelineSampleEvents(const PipelineWindow& w, const telemetry::Stamp& stamp)
{
    std::vector<telemetry::PipelineSampleEvent> out;
    out.reserve(w.stages.size());
    for (const auto& s : w.stages) {
        telemetry::PipelineSampleEvent e;
        e.stamp = stamp;
        e.stage = s.name;
        e.produced = s.produced;
        e.busySeconds = s.busySeconds;
        e.queueDepth = s.queueDepth;
        e.queueCapacity = s.queueCapacity;
        e.waitSeconds = s.criticalSeconds;
        e.parallelism = s.parallelism;
        out.push_back(std::move(e));
    }
    return out;
}

std::optional<telemetry::FindingEvent> inputBoundFinding(const PipelineWindow& w, const telemetry::Stamp& stamp)
{
    if (w.bound == InputBound::No) return std::nullopt;
    telemetry::FindingEvent f;
    f.stamp = stamp;
    f.kind = "input-bound";
    f.severity = w.bound == InputBound::Highly ? "high" : "moderate";
    f.message = w.verdict;
    f.recommendation = w.recommendation;
    f.firstStep = w.firstStep;
    f.lastStep = w.lastStep;
    return f;
}

} // namespace ts
