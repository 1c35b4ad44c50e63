// trainstudio-cli runs list|show|compare|delete|export|rename|tag: the run history in the
// SQLite run store (the default database in the user's data folder, or --db FILE).

#include <cmath>
#include <cstdio>
#include <ctime>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "command_line.h"
#include "commands.h"
#include "store/recording.h"
#include "output_guard.h"
#include "store/export.h"
#include "store/run_store.h"
#include "train/run_config.h"

namespace tscli {

namespace {

namespace st = ts::store;

std::string localTime(int64_t us)
{
    if (us <= 0) return "-";
    const std::time_t t = static_cast<std::time_t>(us / 1000000);
    std::tm tm{};
    localtime_r(&t, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
    return buf;
}

nlohmann::json isoTime(int64_t us)
{
    if (us <= 0) return nullptr;
    const std::time_t t = static_cast<std::time_t>(us / 1000000);
    std::tm tm{};
    gmtime_r(&t, &tm);
    char buf[48];
    const std::size_t n = std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
    std::snprintf(buf + n, sizeof buf - n, ".%06lldZ", static_cast<long long>(us % 1000000));
    return buf;
}

std::string duration(const st::RunInfo& r)
{
    if (r.startedUs <= 0) return "-";
    const int64_t end = r.endedUs > 0 ? r.endedUs : (st::isTerminal(r.status) ? r.startedUs : 0);
    if (end == 0) return "running";
    const double s = static_cast<double>(end - r.startedUs) / 1e6;
    char buf[32];
    if (s >= 3600) std::snprintf(buf, sizeof buf, "%dh%02dm", static_cast<int>(s / 3600), static_cast<int>(std::fmod(s, 3600) / 60));
    else if (s >= 60) std::snprintf(buf, sizeof buf, "%dm%02ds", static_cast<int>(s / 60), static_cast<int>(std::fmod(s, 60)));
    else std::snprintf(buf, sizeof buf, "%.1fs", s);
    return buf;
}

nlohmann::json num(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

std::string fmtNum(double v)
{
    if (std::isnan(v)) return "-";
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.4g", v);
    return buf;
}

std::string joined(const std::vector<std::string>& v, const char* sep = ",")
{
    std::string out;
    for (const auto& s : v) out += (out.empty() ? "" : sep) + s;
    return out;
}

nlohmann::json runJson(const st::RunInfo& r)
{
    return {{"id", r.id},
            {"name", r.name},
            {"project", r.project},
            {"model", r.modelName},
            {"strategy", r.strategy},
            {"status", st::statusName(r.status)},
            {"error", r.error},
            {"seed", r.seed},
            {"config_hash", r.configHash},
            {"created", isoTime(r.createdUs)},
            {"started", isoTime(r.startedUs)},
            {"ended", isoTime(r.endedUs)},
            {"tags", r.tags},
            {"last_step", r.lastStep}};
}

// Read commands open read-write (that upgrades an older schema and marks runs whose writer died
// as interrupted) and fall back to read-only for a database of a newer TrainStudio.
ts::Result<st::RunStore> openStore(const RunsOptions& o, bool write)
{
    const std::string path = o.db.empty() ? st::defaultDatabasePath() : o.db;
    std::error_code ec;
    if (!std::filesystem::exists(path, ec))
        return ts::makeError(ts::ErrorCode::NotFound, "no run database at '" + path + "'",
                             o.db.empty() ? "train a model first (every `trainstudio-cli train` is recorded there) or pass --db FILE"
                                          : "check the path");
    st::OpenOptions opts;
    opts.create = false;
    auto store = st::RunStore::open(path, opts);
    if (store.ok() || write || store.error().code != ts::ErrorCode::Unsupported) return store;
    std::cerr << "note: " << store.error().message << "; reading it read-only\n";
    opts.readOnly = true;
    return st::RunStore::open(path, opts);
}

// JSON for --json output. Names and tags stored before the store checked them may hold bytes
// that are not UTF-8: they are replaced rather than thrown on.
std::string jsonText(const nlohmann::json& j, int indent)
{
    return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

int fail(const ts::Error& e)
{
    printError(e);
    return 1;
}

// What the user asked for is wrong (a run that is not there or is ambiguous, a name or tag the
// store refuses, a metric no run has): bad input, exit 2 like the other commands.
int refused(const ts::Error& e)
{
    printError(e);
    return 2;
}

// The store judged the request (InvalidArgument, NotFound) or failed at it (anything else).
int failOrRefused(const ts::Error& e)
{
    return e.code == ts::ErrorCode::InvalidArgument || e.code == ts::ErrorCode::NotFound ? refused(e) : fail(e);
}

// Usage errors of the subcommands: the message and where the form is described.
int usage(const std::string& message, const std::string& form)
{
    return refused(ts::makeError(ts::ErrorCode::InvalidArgument, message, "usage: trainstudio-cli " + form));
}

int list(st::RunStore& store, const RunsOptions& o)
{
    st::RunFilter f;
    if (!o.status.empty()) {
        auto s = st::parseStatus(o.status);
        if (!s) {
            printError(ts::makeError(ts::ErrorCode::InvalidArgument, "unknown status '" + o.status + "'",
                                     "one of created, running, paused, completed, cancelled, failed, interrupted"));
            return 2;
        }
        f.status = *s;
    }
    if (!o.strategy.empty()) {
        static const std::set<std::string> strategies = {"one-device", "mirrored", "multi-worker-mirrored", "parameter-server"};
        if (!strategies.count(o.strategy))
            return refused(ts::makeError(ts::ErrorCode::InvalidArgument, "unknown strategy '" + o.strategy + "'",
                                         "one of one-device, mirrored, multi-worker-mirrored, parameter-server"));
    }
    f.nameContains = o.name;
    f.tag = o.tag;
    f.strategy = o.strategy;
    f.model = o.model;
    f.limit = o.limit;
    auto runs = store.listRuns(f);
    if (!runs.ok()) return fail(runs.error());
    if (o.json) {
        nlohmann::json a = nlohmann::json::array();
        for (const auto& r : *runs) a.push_back(runJson(r));
        std::cout << jsonText(a, 2) << "\n";
        return 0;
    }
    if (runs->empty()) {
        std::cout << "No runs in " << store.path() << (f.status || !o.name.empty() || !o.tag.empty() || !o.strategy.empty() || !o.model.empty()
                                                           ? " match the filter" : "") << ".\n";
        return 0;
    }
    std::printf("%-8s  %-30s  %-11s  %-14s  %-12s  %8s  %-19s  %8s  %s\n", "ID", "NAME", "STATUS", "MODEL", "STRATEGY", "STEPS",
                "STARTED", "DURATION", "TAGS");
    for (const auto& r : *runs) {
        // Names and models are the user's: cut by character and padded by terminal columns.
        std::printf("%-8s  %s  %-11s  %s  %-12s  %8lld  %-19s  %8s  %s\n", r.id.substr(0, 8).c_str(), column(r.name, 30).c_str(),
                    st::statusName(r.status), column(r.modelName, 14).c_str(), r.strategy.substr(0, 12).c_str(),
                    static_cast<long long>(r.lastStep), localTime(r.startedUs > 0 ? r.startedUs : r.createdUs).c_str(),
                    duration(r).c_str(), joined(r.tags).c_str());
    }
    return 0;
}

int show(st::RunStore& store, const RunsOptions& o)
{
    if (o.runs.size() != 1) {
        return usage("runs show takes one run", "runs show RUN (an id, a unique id prefix or a name; `runs list` lists them)");
    }
    auto id = store.resolveRunId(o.runs[0]);
    if (!id.ok()) return failOrRefused(id.error());
    auto run = store.run(*id);
    if (!run.ok()) return fail(run.error());
    auto epochs = store.epochMetrics(*id);
    if (!epochs.ok()) return fail(epochs.error());
    auto names = store.metricNames(*id);
    if (!names.ok()) return fail(names.error());
    auto cps = store.checkpoints(*id);
    if (!cps.ok()) return fail(cps.error());
    auto findings = store.findings(*id);
    if (!findings.ok()) return fail(findings.error());
    auto files = store.files(*id);
    if (!files.ok()) return fail(files.error());
    auto counts = store.counts(*id);
    if (!counts.ok()) return fail(counts.error());
    const st::RunCounts& n = *counts;
    // Per metric: first, min, max and last in one pass (M4 with a single bucket).
    struct Summary {
        std::string name;
        st::Series s;
    };
    std::vector<Summary> metrics;
    for (const auto& n : *names) {
        st::SeriesQuery q;
        q.buckets = 1;
        auto s = store.series(*id, n, q);
        if (!s.ok()) return fail(s.error());
        metrics.push_back({n, std::move(s).value()});
    }
    auto minMax = [](const st::Series& s, double& lo, double& hi) {
        lo = hi = std::nan("");
        for (const auto& p : s.points) {
            if (std::isnan(lo) || p.value < lo) lo = p.value;
            if (std::isnan(hi) || p.value > hi) hi = p.value;
        }
    };
    auto checkpointState = [&](const st::Checkpoint& c) -> std::string {
        ts::Status v = store.verifyCheckpoint(c);
        if (v.ok()) return "ok";
        return v.error().code == ts::ErrorCode::NotFound ? "missing" : "changed";
    };
    const st::RunInfo& r = *run;
    if (o.json) {
        nlohmann::json j = runJson(r);
        j["config"] = r.config;
        j["model_spec"] = r.model;
        j["devices"] = r.devices;
        nlohmann::json ep = nlohmann::json::array();
        for (const auto& e : *epochs) {
            nlohmann::json m = nlohmann::json::object();
            for (const auto& [k, v] : e.metrics) m[k] = num(v);
            ep.push_back({{"epoch", e.epoch}, {"step", e.step}, {"time", isoTime(e.wallUs)}, {"metrics", m}});
        }
        j["epochs"] = ep;
        nlohmann::json ms = nlohmann::json::object();
        for (const auto& m : metrics) {
            double lo, hi;
            minMax(m.s, lo, hi);
            ms[m.name] = {{"samples", m.s.samples}, {"first_step", m.s.step0}, {"last_step", m.s.step1},
                          {"min", num(lo)}, {"max", num(hi)}, {"last", m.s.points.empty() ? nlohmann::json(nullptr) : num(m.s.points.back().value)}};
        }
        j["metrics"] = ms;
        nlohmann::json cj = nlohmann::json::array();
        for (const auto& c : *cps)
            cj.push_back({{"step", c.step}, {"kind", c.kind}, {"path", c.path}, {"checksum", c.checksum}, {"bytes", c.bytes},
                          {"state", checkpointState(c)}});
        j["checkpoints"] = cj;
        nlohmann::json fj = nlohmann::json::array();
        for (const auto& f : *findings)
            fj.push_back({{"kind", f.kind}, {"severity", f.severity}, {"message", f.message}, {"recommendation", f.recommendation},
                          {"first_step", f.firstStep}, {"last_step", f.lastStep}});
        j["findings"] = fj;
        nlohmann::json files2 = nlohmann::json::array();
        for (const auto& f : *files) files2.push_back({{"kind", f.kind}, {"path", f.path}, {"checksum", f.checksum}, {"bytes", f.bytes}});
        j["files"] = files2;
        j["records"] = {{"steps", n.steps}, {"epochs", n.epochs}, {"step_breakdowns", n.breakdowns},
                        {"device_samples", n.deviceSamples}, {"pipeline_samples", n.pipelineSamples}, {"spans", n.spans},
                        {"findings", n.findings}, {"logs", n.logs}, {"checkpoints", n.checkpoints}, {"files", n.files}};
        std::cout << jsonText(j, 2) << "\n";
        return 0;
    }
    std::printf("Run %s\n", r.id.c_str());
    std::printf("  name        %s\n", r.name.c_str());
    if (!r.project.empty()) std::printf("  project     %s\n", r.project.c_str());
    std::printf("  status      %s%s\n", st::statusName(r.status), r.error.empty() ? "" : (": " + r.error).c_str());
    std::printf("  model       %s\n", r.modelName.c_str());
    // Devices as people name them ("cpu:0 (AMD EPYC, 2 threads)"), not the stored JSON.
    const std::string devices = st::devicesSummary(r.devices, true);
    std::printf("  strategy    %s%s\n", r.strategy.c_str(), devices.empty() ? "" : (" on " + devices).c_str());
    std::printf("  seed        %llu\n", static_cast<unsigned long long>(r.seed));
    // Mixed precision changes the numbers a run gets: say so, whether the configuration chose it
    // or left it to the model's policy (float32 runs from before either existed carry no key).
    if (r.config.is_object() && r.config.contains("precision")) {
        const auto& p = r.config["precision"];
        std::printf("  precision   %s\n", p.is_string() ? p.get<std::string>().c_str() : p.dump().c_str());
    } else if (r.model.is_object() && r.model.contains("compile") && r.model["compile"].is_object() &&
               r.model["compile"].value("precision", std::string()) != "") {
        std::printf("  precision   %s (the model's policy)\n", r.model["compile"]["precision"].get<std::string>().c_str());
    }
    std::printf("  config      %s\n", r.configHash.empty() ? "-" : r.configHash.c_str());
    std::printf("  created     %s\n", localTime(r.createdUs).c_str());
    std::printf("  started     %s\n", localTime(r.startedUs).c_str());
    std::printf("  ended       %s (%s)\n", localTime(r.endedUs).c_str(), duration(r).c_str());
    if (!r.tags.empty()) std::printf("  tags        %s\n", joined(r.tags, ", ").c_str());
    std::printf("  records     %lld steps, %lld epochs, %lld step breakdowns, %lld device samples, %lld pipeline samples, "
                "%lld spans, %lld log lines\n",
                static_cast<long long>(n.steps), static_cast<long long>(n.epochs), static_cast<long long>(n.breakdowns),
                static_cast<long long>(n.deviceSamples), static_cast<long long>(n.pipelineSamples), static_cast<long long>(n.spans),
                static_cast<long long>(n.logs));
    if (!epochs->empty()) {
        std::set<std::string> cols;
        for (const auto& e : *epochs)
            for (const auto& [k, v] : e.metrics) cols.insert(k);
        // Each column as wide as its name (samples_per_sec was cut to "samples_per_se").
        std::printf("\nEpochs\n  %-6s %-8s", "epoch", "step");
        for (const auto& c : cols) std::printf(" %*s", static_cast<int>(std::max<std::size_t>(10, c.size())), c.c_str());
        std::printf("\n");
        for (const auto& e : *epochs) {
            std::printf("  %-6lld %-8lld", static_cast<long long>(e.epoch), static_cast<long long>(e.step));
            for (const auto& c : cols) {
                auto it = e.metrics.find(c);
                std::printf(" %*s", static_cast<int>(std::max<std::size_t>(10, c.size())),
                            it == e.metrics.end() ? "-" : fmtNum(it->second).c_str());
            }
            std::printf("\n");
        }
    }
    if (!metrics.empty()) {
        std::printf("\nStep metrics\n  %-20s %9s %10s %10s %10s %10s\n", "metric", "samples", "steps", "min", "max", "last");
        for (const auto& m : metrics) {
            double lo, hi;
            minMax(m.s, lo, hi);
            const std::string steps = std::to_string(m.s.step0) + "-" + std::to_string(m.s.step1);
            std::printf("  %-20s %9lld %10s %10s %10s %10s\n", m.name.c_str(), static_cast<long long>(m.s.samples), steps.c_str(),
                        fmtNum(lo).c_str(), fmtNum(hi).c_str(), m.s.points.empty() ? "-" : fmtNum(m.s.points.back().value).c_str());
        }
    }
    if (!cps->empty()) {
        std::printf("\nCheckpoints\n");
        for (const auto& c : *cps)
            std::printf("  step %-8lld %-9s %-8s %s\n", static_cast<long long>(c.step), c.kind.c_str(), checkpointState(c).c_str(),
                        c.path.c_str());
    }
    if (!files->empty()) {
        std::printf("\nFiles\n");
        for (const auto& f : *files) std::printf("  %-8s %s\n", f.kind.c_str(), f.path.c_str());
    }
    if (!findings->empty()) {
        std::printf("\nFindings\n");
        for (const auto& f : *findings) {
            std::printf("  [%s] %s: %s\n", f.severity.c_str(), f.kind.c_str(), f.message.c_str());
            if (!f.recommendation.empty()) std::printf("      -> %s\n", f.recommendation.c_str());
        }
    }
    return 0;
}

int compare(st::RunStore& store, const RunsOptions& o)
{
    if (o.runs.size() < 2) {
        return usage("runs compare needs two or more runs", "runs compare RUN RUN... [--metric loss]");
    }
    std::vector<std::string> ids;
    for (const auto& r : o.runs) {
        auto id = store.resolveRunId(r);
        if (!id.ok()) return failOrRefused(id.error());
        ids.push_back(*id);
    }
    st::SeriesQuery q;
    q.buckets = o.buckets > 0 ? o.buckets : 200;
    auto series = store.compare(ids, o.metric, q);
    if (!series.ok()) return fail(series.error());
    if (std::all_of(series->begin(), series->end(), [](const st::Series& x) { return x.samples == 0; })) {
        // A misspelt metric: say which ones the runs have.
        std::set<std::string> known;
        for (const auto& id : ids)
            if (auto names = store.metricNames(id); names.ok()) known.insert(names->begin(), names->end());
        std::string list;
        for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
        return refused(ts::makeError(ts::ErrorCode::NotFound, "none of these runs recorded the metric '" + o.metric + "'",
                                  list.empty() ? std::string("the runs have no step metrics yet") : "recorded metrics: " + list));
    }
    nlohmann::json out = nlohmann::json::array();
    if (!o.json) std::printf("%-8s  %-30s  %9s  %10s  %10s  %10s  %10s\n", "ID", "NAME", "SAMPLES", "FIRST", "MIN", "MAX", "LAST");
    for (const auto& s : *series) {
        auto info = store.run(s.runId);
        if (!info.ok()) return fail(info.error());
        double lo = std::nan(""), hi = std::nan("");
        for (const auto& p : s.points) {
            if (std::isnan(lo) || p.value < lo) lo = p.value;
            if (std::isnan(hi) || p.value > hi) hi = p.value;
        }
        const double first = s.points.empty() ? std::nan("") : s.points.front().value;
        const double last = s.points.empty() ? std::nan("") : s.points.back().value;
        if (o.json) {
            nlohmann::json pts = nlohmann::json::array();
            for (const auto& p : s.points) pts.push_back({p.step, num(p.value)});
            out.push_back({{"id", s.runId}, {"name", info->name}, {"metric", s.metric}, {"samples", s.samples},
                           {"step0", s.step0}, {"step1", s.step1}, {"downsampled", s.downsampled}, {"first", num(first)},
                           {"min", num(lo)}, {"max", num(hi)}, {"last", num(last)}, {"points", pts}});
        } else {
            std::printf("%-8s  %s  %9lld  %10s  %10s  %10s  %10s\n", s.runId.substr(0, 8).c_str(), column(info->name, 30).c_str(),
                        static_cast<long long>(s.samples), fmtNum(first).c_str(), fmtNum(lo).c_str(), fmtNum(hi).c_str(),
                        fmtNum(last).c_str());
        }
    }
    if (o.json) std::cout << jsonText(out, 2) << "\n";
    else if (!series->empty()) std::printf("(metric %s, steps %lld-%lld)\n", o.metric.c_str(), static_cast<long long>((*series)[0].step0),
                                            static_cast<long long>((*series)[0].step1));
    return 0;
}

int remove(st::RunStore& store, const RunsOptions& o)
{
    if (o.runs.empty()) {
        return usage("runs delete needs at least one run", "runs delete RUN... [--keep-files]");
    }
    // Resolve every name first: a typo in the third run must not leave the first two deleted.
    std::vector<std::pair<std::string, std::string>> targets;
    for (const auto& r : o.runs) {
        auto id = store.resolveRunId(r);
        if (!id.ok()) return failOrRefused(id.error());
        // The same run named twice (by id and by name) is deleted once.
        if (std::any_of(targets.begin(), targets.end(), [&](const auto& t) { return t.first == *id; })) continue;
        auto info = store.run(*id);
        if (!info.ok()) return fail(info.error());
        targets.emplace_back(*id, info->name);
    }
    nlohmann::json out = nlohmann::json::array();
    for (const auto& [id, name] : targets) {
        auto report = store.deleteRun(id, !o.keepFiles);
        if (!report.ok()) return fail(report.error());
        if (o.json) {
            out.push_back({{"id", id}, {"name", name}, {"removed_files", report->removedFiles}, {"kept_files", report->keptFiles}});
        } else {
            std::printf("Deleted run %s (%s): %zu file(s) removed", id.c_str(), name.c_str(), report->removedFiles.size());
            if (!report->keptFiles.empty()) std::printf(", %zu kept", report->keptFiles.size());
            std::printf("\n");
            for (const auto& k : report->keptFiles) std::printf("  kept %s\n", k.c_str());
        }
    }
    if (o.json) std::cout << jsonText(out, 2) << "\n";
    return 0;
}

int exportRun(st::RunStore& store, const RunsOptions& o)
{
    if (o.runs.size() != 1) {
        return usage("runs export takes one run", "runs export RUN [--csv FILE] [--epochs-csv FILE] [--trace FILE] [--weights FILE]");
    }
    if (o.csv.empty() && o.epochsCsv.empty() && o.trace.empty() && o.weights.empty()) {
        printError(ts::makeError(ts::ErrorCode::InvalidArgument, "nothing to export",
                                 "give --csv FILE (step metrics), --epochs-csv FILE, --trace FILE (Chrome trace) and/or "
                                 "--weights FILE (safetensors); '-' writes a CSV to standard output"));
        return 2;
    }
    // Standard output holds one thing: one CSV, or --json's summary.
    {
        const int toStdout = (o.csv == "-") + (o.epochsCsv == "-");
        if (o.trace == "-" || o.weights == "-")
            return usage("only a CSV export can go to standard output ('-')", "runs export RUN --trace FILE --weights FILE [--csv -]");
        if (toStdout > 1) return usage("--csv - and --epochs-csv - would mix two CSVs on standard output", "runs export RUN --csv - --epochs-csv FILE");
        if (toStdout > 0 && o.json)
            return usage("--json prints its summary on standard output, where the CSV ('-') goes too", "runs export RUN --csv FILE --json");
    }
    auto id = store.resolveRunId(o.runs[0]);
    if (!id.ok()) return failOrRefused(id.error());
    {
        // Never over the database or the files the store keeps (checkpoints).
        const std::vector<tscli::Protected> files = {{"the run database", store.path()}};
        const std::vector<tscli::Protected> dirs = {{"the run store's files", st::RunStore::filesRoot(store.path())}};
        const std::vector<std::pair<std::string, std::string>> outputs = {
            {o.csv, "--csv"}, {o.epochsCsv, "--epochs-csv"}, {o.trace, "--trace"}, {o.weights, "--weights"}};
        for (const auto& [out, flag] : outputs)
            if (ts::Status st = tscli::checkOutputPath(out, flag, files, dirs); !st.ok()) return refused(st.error());
        // Two outputs into one file: the later would replace the earlier, both said "Wrote".
        for (std::size_t i = 0; i < outputs.size(); ++i)
            for (std::size_t j = i + 1; j < outputs.size(); ++j)
                if (tscli::samePath(outputs[i].first, outputs[j].first)) {
                    printError(ts::makeError(ts::ErrorCode::InvalidArgument,
                                             outputs[i].second + " and " + outputs[j].second + " name the same file " + outputs[i].first,
                                             "give each export its own file"));
                    return 2;
                }
    }
    nlohmann::json written = nlohmann::json::object();
    int code = 0;
    auto note = [&](const std::string& what, const std::string& path, const std::string& extra) {
        written[what] = path;
        if (!o.json && path != "-") std::fprintf(stderr, "Wrote %s to %s%s\n", what.c_str(), path.c_str(), extra.c_str());
    };
    auto csvTo = [&](const std::string& path, bool epochs) -> ts::Status {
        if (path == "-") return epochs ? st::exportEpochMetricsCsv(store, *id, std::cout) : st::exportStepMetricsCsv(store, *id, std::cout);
        // Written next to the target, then renamed: a failed export leaves no half file.
        const std::string tmp = path + ".tmp";
        {
            std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
            if (!f)
                return ts::makeError(ts::ErrorCode::IoError, "cannot write '" + path + "'", "check that the folder exists and is writable");
            ts::Status s = epochs ? st::exportEpochMetricsCsv(store, *id, f) : st::exportStepMetricsCsv(store, *id, f);
            f.close();
            if (!s.ok() || !f) {
                std::filesystem::remove(tmp);
                return s.ok() ? ts::makeError(ts::ErrorCode::IoError, "cannot write '" + path + "'") : s;
            }
        }
        std::error_code ec;
        std::filesystem::rename(tmp, path, ec);
        if (ec) return ts::makeError(ts::ErrorCode::IoError, "cannot rename '" + tmp + "' to '" + path + "': " + ec.message());
        return ts::okStatus();
    };
    // Each export is independent: a missing checkpoint does not stop the metrics or the trace.
    if (!o.csv.empty()) {
        ts::Status s = csvTo(o.csv, false);
        if (s.ok()) note("metrics_csv", o.csv, "");
        else code = fail(s.error());
    }
    if (!o.epochsCsv.empty()) {
        ts::Status s = csvTo(o.epochsCsv, true);
        if (s.ok()) note("epochs_csv", o.epochsCsv, "");
        else code = fail(s.error());
    }
    if (!o.trace.empty()) {
        auto n = st::exportChromeTrace(store, *id, o.trace);
        // A run trained without --trace has no timeline: the file holds its counters (device
        // samples) for Perfetto, which `trace summary` does not summarise. Said, not left to find.
        if (n.ok())
            note("trace", o.trace,
                 *n > 0 ? " (" + std::to_string(*n) + " spans)"
                        : " (0 spans: the run was trained without --trace; the file holds its device and pipeline counters, "
                          "which Perfetto shows and `trace summary` does not summarise)");
        else code = fail(n.error());
    }
    if (!o.weights.empty()) {
        auto c = st::exportFinalWeights(store, *id, o.weights);
        if (c.ok()) note("weights", o.weights, " (" + c->kind + " checkpoint at step " + std::to_string(c->step) + ")");
        else code = fail(c.error());
    }
    if (o.json) std::cout << jsonText(nlohmann::json{{"id", *id}, {"written", written}}, 2) << "\n";
    return code;
}

int rename(st::RunStore& store, const RunsOptions& o)
{
    if (o.runs.size() != 1) {
        return usage("runs rename takes one run and the new name", "runs rename RUN NEW_NAME");
    }
    auto id = store.resolveRunId(o.runs[0]);
    if (!id.ok()) return failOrRefused(id.error());
    ts::Status s = store.renameRun(*id, o.newName);
    if (!s.ok()) return failOrRefused(s.error());
    if (o.json) std::cout << jsonText(nlohmann::json{{"id", *id}, {"name", o.newName}}, -1) << "\n";
    else std::printf("Renamed run %s to '%s'\n", id->c_str(), o.newName.c_str());
    return 0;
}

int tag(st::RunStore& store, const RunsOptions& o)
{
    if (o.runs.size() != 1) {
        return usage("runs tag takes one run", "runs tag RUN --add TAG... --remove TAG...");
    }
    auto id = store.resolveRunId(o.runs[0]);
    if (!id.ok()) return failOrRefused(id.error());
    for (const auto& t : o.addTags) {
        ts::Status s = store.addTag(*id, t);
        if (!s.ok()) return failOrRefused(s.error());
    }
    for (const auto& t : o.removeTags) {
        ts::Status s = store.removeTag(*id, t);
        if (!s.ok()) return fail(s.error());
    }
    auto info = store.run(*id);
    if (!info.ok()) return fail(info.error());
    if (o.json) std::cout << jsonText(nlohmann::json{{"id", *id}, {"tags", info->tags}}, -1) << "\n";
    else std::printf("Run %s tags: %s\n", id->c_str(), info->tags.empty() ? "(none)" : joined(info->tags, ", ").c_str());
    return 0;
}

} // namespace

ts::Result<std::unique_ptr<TrainRecording>> openTrainRecording(const TrainOptions& o)
{
    if (o.noRecord) return std::unique_ptr<TrainRecording>();
    const std::string path = o.db.empty() ? st::defaultDatabasePath() : o.db;
    st::RecordingOptions ro;
    ro.name = o.runName;
    ro.tags = o.tags;
    auto recording = st::RunRecording::open(path, std::move(ro));
    if (!recording.ok()) {
        ts::Error e = recording.takeError();
        e.hint = (e.hint.empty() ? "" : e.hint + "; ") + "or train without recording: --no-record";
        return e;
    }
    return std::move(recording).value();
}

void addRunsCommand(CLI::App& app, RunsOptions& o)
{
    auto* runs = app.add_subcommand("runs", "The run history: list, show, compare, delete and export recorded runs");
    runs->require_subcommand(1);
    auto common = [&o](CLI::App* c) {
        c->add_option("--db", o.db, "run database (default: " + st::defaultDatabasePath() + ")");
        c->add_flag("--json", o.json, "print JSON");
    };
    auto* list = runs->add_subcommand("list", "List runs, newest first");
    common(list);
    list->add_option("--status", o.status, "only runs with this status (created, running, completed, cancelled, failed, interrupted)");
    list->add_option("--name", o.name, "only runs whose name contains this (case-insensitive)");
    list->add_option("--tag", o.tag, "only runs with this tag");
    list->add_option("--strategy", o.strategy, "only runs with this strategy (one-device, mirrored, ...)");
    list->add_option("--model", o.model, "only runs of this model (its name)");
    list->add_option("--limit", o.limit, "at most this many runs (0: all)")->check(tsapp::wholeNumberAtLeastZero());
    list->callback([&o] { o.action = "list"; });

    auto* show = runs->add_subcommand("show", "Show one run: configuration, epochs, metrics, checkpoints, findings");
    common(show);
    show->add_option("run", o.run, "run id, unique id prefix (4+ characters) or name")->required();
    show->callback([&o] { o.action = "show"; });

    auto* cmp = runs->add_subcommand("compare", "Compare runs on one metric (downsampled series with --json)");
    common(cmp);
    cmp->add_option("runs", o.runs, "two or more runs (id, id prefix of 4+ characters, or name)")->required();
    cmp->add_option("--metric", o.metric, "step metric to compare (default: loss)");
    cmp->add_option("--buckets", o.buckets, "downsample each series to this many min/max buckets (default 200)")->check(CLI::Range(1, 100000));
    cmp->callback([&o] { o.action = "compare"; });

    auto* del = runs->add_subcommand("delete", "Delete runs and the files they own (checkpoints, traces)");
    common(del);
    del->add_option("runs", o.runs, "runs to delete (id, id prefix of 4+ characters, or name)")->required();
    del->add_flag("--keep-files", o.keepFiles, "keep the checkpoint and trace files");
    del->callback([&o] { o.action = "delete"; });

    auto* exp = runs->add_subcommand("export", "Export a run: step metrics CSV, epoch CSV, Chrome trace, final weights");
    common(exp);
    exp->add_option("run", o.run, "run id, unique id prefix (4+ characters) or name")->required();
    exp->add_option("--csv", o.csv, "step metrics as CSV ('-' for standard output)");
    exp->add_option("--epochs-csv", o.epochsCsv, "epoch metrics as CSV ('-' for standard output)");
    exp->add_option("--trace", o.trace, "spans and samples as a Chrome trace (Perfetto, chrome://tracing)");
    exp->add_option("--weights", o.weights, "the final weights as .safetensors");
    exp->callback([&o] { o.action = "export"; });

    auto* ren = runs->add_subcommand("rename", "Rename a run");
    common(ren);
    ren->add_option("run", o.run, "run id, unique id prefix (4+ characters) or name")->required();
    ren->add_option("name", o.newName, "the new name")->required();
    ren->callback([&o] { o.action = "rename"; });

    auto* tg = runs->add_subcommand("tag", "Add or remove a run's tags");
    common(tg);
    tg->add_option("run", o.run, "run id, unique id prefix (4+ characters) or name")->required();
    tg->add_option("--add", o.addTags, "tags to add");
    tg->add_option("--remove", o.removeTags, "tags to remove");
    tg->callback([&o] { o.action = "tag"; });
}

int runRuns(const RunsOptions& options)
{
    RunsOptions o = options;
    if (!o.run.empty()) o.runs = {o.run};
    const bool write = o.action == "delete" || o.action == "rename" || o.action == "tag";
    auto store = openStore(o, write);
    if (!store.ok()) return store.error().code == ts::ErrorCode::NotFound ? refused(store.error()) : fail(store.error());
    int code = 2;
    if (o.action == "list") code = list(*store, o);
    else if (o.action == "show") code = show(*store, o);
    else if (o.action == "compare") code = compare(*store, o);
    else if (o.action == "delete") code = remove(*store, o);
    else if (o.action == "export") code = exportRun(*store, o);
    else if (o.action == "rename") code = rename(*store, o);
    else if (o.action == "tag") code = tag(*store, o);
    ts::Status closed = store->close();
    if (!closed.ok() && code == 0) return fail(closed.error());
    return code;
}

} // namespace tscli
