// trainstudio-cli trace summary FILE [--json] [--top N]: the step-time breakdown, the top spans
// per lane and the advisor's findings for a Chrome trace (ours, PyTorch, TensorFlow, Horovod).

#include <cstdio>
#include <iostream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "command_line.h"
#include "commands.h"
#include "telemetry/trace_summary.h"

namespace tscli {
namespace {

std::string fmtTime(double seconds)
{
    char buf[32];
    const double a = seconds < 0 ? -seconds : seconds;
    if (a >= 1) std::snprintf(buf, sizeof buf, "%.3f s", seconds);
    else if (a >= 1e-3) std::snprintf(buf, sizeof buf, "%.3f ms", seconds * 1e3);
    else std::snprintf(buf, sizeof buf, "%.1f us", seconds * 1e6);
    return buf;
}

std::string clip(const std::string& s, std::size_t n)
{
    if (s.size() <= n) return s;
    return s.substr(0, n - 3) + "...";
}

void printSummary(const ts::telemetry::TraceSummary& s)
{
    using namespace ts::telemetry;
    std::printf("Trace: %s\n", s.source.c_str());
    std::printf("Format: %s, %lld events, %lld spans, %s\n", s.format.c_str(), static_cast<long long>(s.events),
                static_cast<long long>(s.spans), fmtTime(s.durationSeconds).c_str());
    for (const auto& w : s.warnings) std::printf("warning: %s\n", w.c_str());
    std::printf("\n");
    if (s.steps.empty()) {
        std::printf("No steps found (no ProfilerStep#N, TrainStudio step spans or TensorFlow Steps thread): no breakdown.\n\n");
    } else {
        std::printf("Step-time breakdown over %zu step(s) (steps from %s):\n", s.steps.size(), s.stepSource.c_str());
        std::printf("  %-14s %12s %12s %12s %12s %8s\n", "part", "mean", "std", "min", "max", "share");
        auto row = [&](const char* name, const PartStats& p) {
            const double share = s.stepTime.total > 0 ? p.total / s.stepTime.total * 100.0 : 0;
            std::printf("  %-14s %12s %12s %12s %12s %7.1f%%\n", name, fmtTime(p.mean).c_str(), fmtTime(p.stddev).c_str(),
                        fmtTime(p.min).c_str(), fmtTime(p.max).c_str(), share);
        };
        row("step", s.stepTime);
        for (int p = 0; p < kStepPartCount; ++p) row(stepPartName(static_cast<StepPart>(p)), s.parts[static_cast<std::size_t>(p)]);
        std::printf("\n");
    }
    for (const auto& l : s.lanes) {
        std::printf("Top spans on %s (%lld spans):\n", laneLabel(l.lane).c_str(), static_cast<long long>(l.spans));
        std::printf("  %-48s %-16s %8s %12s %12s %12s\n", "name", "category", "count", "total", "self", "max");
        for (const auto& t : l.top)
            std::printf("  %-48s %-16s %8lld %12s %12s %12s\n", clip(t.name, 48).c_str(), clip(t.category, 16).c_str(),
                        static_cast<long long>(t.count), fmtTime(t.totalSeconds).c_str(), fmtTime(t.selfSeconds).c_str(),
                        fmtTime(t.maxSeconds).c_str());
        std::printf("\n");
    }
    if (!s.findings.empty()) {
        std::printf("Findings:\n");
        for (const auto& f : s.findings) {
            std::printf("  [%s] %s: %s\n", f.severity.c_str(), f.kind.c_str(), f.message.c_str());
            std::printf("      recommendation: %s\n", f.recommendation.c_str());
        }
    }
}

} // namespace

void addTraceCommand(CLI::App& app, TraceOptions& o)
{
    auto* c = app.add_subcommand("trace", "Analyse Chrome traces (ours, PyTorch profiler, TensorFlow, Horovod)");
    c->require_subcommand(1);
    auto* summary = c->add_subcommand("summary", "Step-time breakdown, top spans per lane and findings of a trace");
    summary->add_option("file", o.file, "Chrome trace file (.json or .json.gz)")->required();
    summary->add_flag("--json", o.json, "print the summary as JSON");
    summary->add_option("--top", o.top, "spans listed per lane (default 10)")->check(tsapp::wholeNumberAtLeastZero());
}

int runTrace(const TraceOptions& o)
{
    auto trace = ts::telemetry::readChromeTrace(o.file);
    if (!trace.ok()) {
        std::cerr << "error: " << trace.error().message << "\n";
        if (!trace.error().hint.empty()) std::cerr << "hint: " << trace.error().hint << "\n";
        return 2;  // a file that is no readable trace: bad input
    }
    auto summary = ts::telemetry::summariseTrace(*trace, o.top);
    if (!summary.ok()) {
        std::cerr << "error: " << summary.error().message << "\n";
        if (!summary.error().hint.empty()) std::cerr << "hint: " << summary.error().hint << "\n";
        return 2;
    }
    if (o.json) {
        std::cout << ts::telemetry::summaryToJson(*summary).dump(2) << "\n";
        return 0;
    }
    printSummary(*summary);
    return 0;
}

} // namespace tscli
