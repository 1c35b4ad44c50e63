#include "store/export.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>

#include "io/safetensors.h"
#include "telemetry/chrome_trace.h"

namespace ts::store {

namespace {

std::string csvField(const std::string& s)
{
    if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
    std::string out = "\"";
    for (char c : s) {
        if (c == '"') out += '"';
        out += c;
    }
    return out + "\"";
}

std::string csvNumber(double v)
{
    if (std::isnan(v)) return {};
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.9g", v);
    return buf;
}

std::string wallSeconds(int64_t us)
{
    char buf[32];
    std::snprintf(buf, sizeof buf, "%lld.%06lld", static_cast<long long>(us / 1000000), static_cast<long long>(us % 1000000));
    return buf;
}

// "loss" first, then the others by name.
std::vector<std::string> columnOrder(std::set<std::string> names)
{
    std::vector<std::string> cols;
    if (names.erase("loss")) cols.push_back("loss");
    cols.insert(cols.end(), names.begin(), names.end());
    return cols;
}

Status streamOk(std::ostream& out, const std::string& runId)
{
    if (!out) return makeError(ErrorCode::IoError, "writing the metrics of run " + runId + " failed", "check the disk space");
    return okStatus();
}

} // namespace

Status exportStepMetricsCsv(RunStore& store, const std::string& runId, std::ostream& out)
{
    TS_ASSIGN(std::vector<std::string> names, store.metricNames(runId));
    const std::vector<std::string> cols = columnOrder({names.begin(), names.end()});
    out << "wall_time,step,epoch";
    for (const auto& c : cols) out << ',' << csvField(c);
    out << '\n';
    std::string line;
    TS_TRY(store.forEachStep(runId, [&](int64_t step, int64_t epoch, int64_t wallUs, const std::map<std::string, double>& m) {
        line = wallSeconds(wallUs) + ',' + std::to_string(step) + ',' + std::to_string(epoch);
        for (const auto& c : cols) {
            line += ',';
            if (auto it = m.find(c); it != m.end()) line += csvNumber(it->second);
        }
        line += '\n';
        out << line;
    }));
    return streamOk(out, runId);
}

Status exportEpochMetricsCsv(RunStore& store, const std::string& runId, std::ostream& out)
{
    TS_ASSIGN(std::vector<EpochRow> rows, store.epochMetrics(runId));
    std::set<std::string> names;
    for (const auto& r : rows)
        for (const auto& [k, v] : r.metrics) names.insert(k);
    const std::vector<std::string> cols = columnOrder(std::move(names));
    out << "epoch,step,wall_time";
    for (const auto& c : cols) out << ',' << csvField(c);
    out << '\n';
    for (const auto& r : rows) {
        out << r.epoch << ',' << r.step << ',' << wallSeconds(r.wallUs);
        for (const auto& c : cols) {
            out << ',';
            if (auto it = r.metrics.find(c); it != r.metrics.end()) out << csvNumber(it->second);
        }
        out << '\n';
    }
    return streamOk(out, runId);
}

Result<std::size_t> exportChromeTrace(RunStore& store, const std::string& runId, const std::string& path)
{
    TS_ASSIGN(RunInfo info, store.run(runId));
    TS_ASSIGN(auto writer, telemetry::ChromeTraceWriter::create(path));
    writer->setMetadata("producer", "trainstudio");
    writer->setMetadata("run_id", info.id);
    writer->setMetadata("run_name", info.name);
    writer->setMetadata("model", info.modelName);
    writer->setMetadata("strategy", info.strategy);
    writer->setMetadata("config_hash", info.configHash);
    if (info.startedUs > 0) {
        telemetry::RunStateEvent e;
        e.stamp.runId = info.id;
        e.stamp.wallTimeUs = info.startedUs;
        e.state = RunState::Running;
        writer->add(e);
    }
    TS_ASSIGN(auto spans, store.spans(runId));
    for (const auto& s : spans) writer->add(s);
    TS_ASSIGN(auto samples, store.deviceSamples(runId));
    for (const auto& s : samples) writer->add(s);
    TS_TRY(store.forEachStep(runId, [&](int64_t step, int64_t epoch, int64_t wallUs, const std::map<std::string, double>& m) {
        telemetry::StepMetricsEvent e;
        e.stamp.runId = info.id;
        e.stamp.step = step;
        e.stamp.wallTimeUs = wallUs;
        e.epoch = epoch;
        for (const auto& [k, v] : m) {
            if (k == "loss") e.loss = v;
            else if (k == "samples_per_sec") e.samplesPerSec = v;
            else if (k == "learning_rate") e.learningRate = v;
            else e.metrics[k] = v;
        }
        writer->add(e);
    }));
    if (info.endedUs > 0 && isTerminal(info.status)) {
        telemetry::RunStateEvent e;
        e.stamp.runId = info.id;
        e.stamp.wallTimeUs = info.endedUs;
        e.state = info.status;
        e.message = info.error;
        writer->add(e);
    }
    const std::size_t n = spans.size();
    TS_TRY(writer->finish());
    return n;
}

Result<Checkpoint> finalCheckpoint(RunStore& store, const std::string& runId)
{
    TS_ASSIGN(std::vector<Checkpoint> cps, store.checkpoints(runId));
    if (cps.empty())
        return makeError(ErrorCode::NotFound, "run " + runId + " has no recorded weights",
                         "train with recording on (the default) to keep the final weights, or pass --save-weights");
    const Checkpoint* pick = nullptr;  // the last "final" one (ordered by step), else the latest
    for (const auto& c : cps)
        if (c.kind == "final") pick = &c;
    if (!pick) pick = &cps.back();
    TS_TRY(store.verifyCheckpoint(*pick));
    return *pick;
}

Result<Checkpoint> exportFinalWeights(RunStore& store, const std::string& runId, const std::string& path)
{
    TS_ASSIGN(const Checkpoint picked, finalCheckpoint(store, runId));
    const Checkpoint* pick = &picked;
    std::ifstream in(pick->path, std::ios::binary);
    if (!in) return makeError(ErrorCode::IoError, "cannot read checkpoint file '" + pick->path + "'");
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (static_cast<int64_t>(bytes.size()) != pick->bytes)
        return makeError(ErrorCode::IoError, "checkpoint file '" + pick->path + "' changed while it was read");
    TS_TRY(writeFileAtomically(path, {std::string_view(bytes)}));
    return *pick;
}

} // namespace ts::store
