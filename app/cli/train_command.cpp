#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "command_line.h"
#include "commands.h"
#include "output_guard.h"
#include "common/json_document.h"
#include "common/utf8.h"
#include "data/autotune.h"
#include "distribute/cluster_spec.h"
#include "embedded_models.h"
#include "evaluator_task.h"
#include "interrupt.h"
#include "store/recording.h"
#include "remote/auth.h"
#include "remote/cluster.h"
#include "remote/run_evaluator.h"
#include "store/run_store.h"
#include "telemetry/bus.h"
#include "telemetry/trace_sink.h"
#include "telemetry/tracer.h"
#include "nn/program.h"
#include "optim/optimizer.h"
#include "train/run_config.h"

namespace tscli {
namespace {

std::string fmtRate(double r)
{
    char buf[32];
    if (r >= 1e4) std::snprintf(buf, sizeof buf, "%.1fk", r / 1e3);
    else std::snprintf(buf, sizeof buf, "%.0f", r);
    return buf;
}

std::string fmtDuration(double s)
{
    char buf[32];
    if (s >= 3600) std::snprintf(buf, sizeof buf, "%dh%02dm", static_cast<int>(s / 3600), static_cast<int>(std::fmod(s, 3600) / 60));
    else if (s >= 60) std::snprintf(buf, sizeof buf, "%dm%02ds", static_cast<int>(s / 60), static_cast<int>(std::fmod(s, 60)));
    else std::snprintf(buf, sizeof buf, "%.1fs", s);
    return buf;
}

nlohmann::json num(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

class ConsoleListener final : public ts::TrainListener {
public:
    ConsoleListener(bool json, bool quiet, int64_t epochs) : m_json(json), m_quiet(quiet), m_epochs(epochs)
    {
        m_tty = isatty(STDERR_FILENO) && !json && !quiet;
    }
    void onStart(const ts::Strategy& s) override
    {
        if (m_json || m_quiet) return;
        std::cout << "Strategy " << s.name() << " over " << s.numReplicas() << " replica(s), "
                  << s.threadsPerReplica() << " thread(s) each:";
        for (const auto& d : s.devices()) std::cout << " " << d.name;
        std::cout << "\n" << std::flush;
    }
    void onStep(const ts::StepEvent& e) override
    {
        if (!m_tty) return;
        // Redraw at most ~10 times a second: the bar must not cost training time.
        const auto now = std::chrono::steady_clock::now();
        if (e.stepInEpoch != e.stepsInEpoch && now - m_lastDraw < std::chrono::milliseconds(100)) return;
        m_lastDraw = now;
        const int width = 24;
        const double frac = e.stepsInEpoch > 0 ? static_cast<double>(e.stepInEpoch) / static_cast<double>(e.stepsInEpoch) : 0;
        std::string bar(static_cast<std::size_t>(width), ' ');
        for (int i = 0; i < static_cast<int>(frac * width); ++i) bar[static_cast<std::size_t>(i)] = '=';
        if (frac < 1 && static_cast<int>(frac * width) < width) bar[static_cast<std::size_t>(frac * width)] = '>';
        const double eta = e.samplesPerSec > 0 && e.stepsInEpoch > 0
                               ? static_cast<double>(e.stepsInEpoch - e.stepInEpoch) * static_cast<double>(e.batchSize) / e.samplesPerSec
                               : 0;
        char line[256];
        char acc[32] = "";
        if (std::isfinite(e.accuracy)) std::snprintf(acc, sizeof acc, " acc %.4f", e.accuracy);
        std::snprintf(line, sizeof line, "\rEpoch %lld/%lld %5lld/%lld [%s] loss %.4f%s | %s samples/s | ETA %s   ",
                      static_cast<long long>(e.epoch), static_cast<long long>(m_epochs), static_cast<long long>(e.stepInEpoch),
                      static_cast<long long>(e.stepsInEpoch), bar.c_str(), e.loss, acc, fmtRate(e.samplesPerSec).c_str(),
                      fmtDuration(eta).c_str());
        std::cerr << line << std::flush;
    }
    // Runs first at every epoch end, on the trainer's thread (checkpoints).
    std::function<void(const ts::EpochEvent&)> epochHook;

    void onResume(const ts::TrainingPosition& p, const ts::ResumeSource& source) override
    {
        if (m_quiet) return;
        if (m_json) {
            std::cout << nlohmann::json{{"resumed", true}, {"step", p.step}, {"epoch", p.epoch}, {"step_in_epoch", p.stepInEpoch},
                                        {"backup", source.file.empty() ? nlohmann::json(nullptr) : nlohmann::json(source.file)},
                                        {"from", source.words}}.dump()
                      << "\n" << std::flush;
            return;
        }
        std::printf("Resumed from %s after step %lld (epoch %lld, step %lld of it)\n", source.words.c_str(),
                    static_cast<long long>(p.step), static_cast<long long>(p.epoch), static_cast<long long>(p.stepInEpoch));
        std::fflush(stdout);
    }

    void onEpoch(const ts::EpochEvent& e) override
    {
        if (epochHook) epochHook(e);
        if (m_quiet) return;
        if (m_json) {
            nlohmann::json j = {{"epoch", e.epoch}, {"steps", e.steps}, {"loss", num(e.loss)}, {"accuracy", num(e.accuracy)},
                                {"val_loss", num(e.valLoss)}, {"val_accuracy", num(e.valAccuracy)},
                                {"samples_per_sec", num(e.samplesPerSec)}, {"seconds", num(e.seconds)}};
            if (e.lossScale > 0) {
                j["loss_scale"] = e.lossScale;
                j["skipped_steps"] = e.skippedSteps;
            }
            std::cout << j.dump() + "\n" << std::flush;  // one write: an evaluator's lines come from another thread
            return;
        }
        if (m_tty) clearProgressLine();
        char line[256];
        // A regression has no accuracy (NaN): only the losses are shown.
        int n = std::snprintf(line, sizeof line, "Epoch %lld/%lld: loss %.4f", static_cast<long long>(e.epoch), static_cast<long long>(m_epochs),
                              e.loss);
        if (std::isfinite(e.accuracy)) n += std::snprintf(line + n, sizeof line - static_cast<std::size_t>(n), " accuracy %.4f", e.accuracy);
        if (std::isfinite(e.valLoss)) n += std::snprintf(line + n, sizeof line - static_cast<std::size_t>(n), " | val_loss %.4f", e.valLoss);
        if (std::isfinite(e.valLoss) && std::isfinite(e.valAccuracy))
            n += std::snprintf(line + n, sizeof line - static_cast<std::size_t>(n), " val_accuracy %.4f", e.valAccuracy);
        std::snprintf(line + n, sizeof line - static_cast<std::size_t>(n), " | %s samples/s | %s", fmtRate(e.samplesPerSec).c_str(),
                      fmtDuration(e.seconds).c_str());
        std::cout << std::string(line) + "\n" << std::flush;
        // An epoch whose every step the loss scale skipped changed no weight: said, not left to
        // a flat loss (a fixed scale too large for float16 skips them all).
        if (const auto skipped = ts::allStepsSkipped(e))
            std::cerr << "warning: " << skipped->message << "\nhint: " << skipped->hint << "\n" << std::flush;
    }

private:
    bool m_json, m_quiet, m_tty = false;
    int64_t m_epochs;
    std::chrono::steady_clock::time_point m_lastDraw{};
};

} // namespace

// Loads a model from a file, or one of the built-in models by name ("seed_mlp", "mlp", "cnn").
ts::Result<ts::ModelSpec> loadModel(const std::string& nameOrPath)
{
    std::string name = nameOrPath.empty() ? "seed_mlp" : nameOrPath;
    if (name == "mlp") name = "seed_mlp";
    if (name == "cnn") name = "small_cnn";
    if (name == "resnet") name = "small_resnet";
    if (!std::filesystem::exists(name)) {
        for (const auto& m : embeddedModels())
            if (name == m.name) return ts::parseModelText(m.json, std::string("built-in model ") + m.name);
        if (nameOrPath.find('/') == std::string::npos && nameOrPath.find(".json") == std::string::npos) {
            std::string known;
            for (const auto& m : embeddedModels()) known += (known.empty() ? "" : ", ") + std::string(m.name);
            return ts::makeError(ts::ErrorCode::NotFound, "no model file or built-in model named '" + nameOrPath + "'",
                                 "built-in models: " + known + " (also mlp, cnn, resnet)");
        }
    }
    return ts::loadModelFile(name);
}

// A flag's number, parsed whole (no trailing text) and accepted by `ok`; otherwise the message is
// `expectation` + ", got " + the text. CLI11's own range checks print bounds like 1.79e308.
CLI::Validator numberWhere(std::function<bool(double)> ok, std::string expectation, std::string name)
{
    return CLI::Validator(
        [ok = std::move(ok), expectation = std::move(expectation)](std::string& v) -> std::string {
            char* end = nullptr;
            const double x = std::strtod(v.c_str(), &end);
            return end != v.c_str() && *end == '\0' && ok(x) ? std::string() : expectation + ", got " + v;
        },
        std::move(name));
}

void addTrainCommand(CLI::App& app, TrainOptions& o)
{
    auto* c = app.add_subcommand("train", "Train a model (default: the seed's MLP on Fashion-MNIST)");
    c->add_option("--model", o.model, "model file (ours or Keras model.to_json()) or built-in name: mlp, cnn, resnet");
    c->add_option("--config", o.config, "run configuration JSON (flags override its fields)");
    c->add_option("--data", o.data, "folder of IDX files (default: the Fashion-MNIST folder)");
    c->add_option("--epochs", o.epochs, "epochs (default: the model's compile setting)")->check(CLI::Range(1, 1000000));
    c->add_option("--max-steps", o.maxSteps, "stop after this many steps in total")->check(tsapp::wholeNumberAtLeastZero());
    c->add_option("--batch-size", o.batchSize, "global batch size (split across replicas)")->check(CLI::Range(1LL, 1LL << 31));
    c->add_option("--optimizer", o.optimizer, "adam, adamw, sgd or rmsprop (overrides the model's)");
    c->add_option("--learning-rate", o.learningRate, "learning rate (overrides the model's)")
        ->check(numberWhere([](double x) { return std::isfinite(x) && x > 0 && x <= 1000; }, "must be a finite number in (0, 1000]",
                            "POSITIVE"));
    c->add_option("--strategy", o.strategy,
                  "one-device, mirrored, multi-worker-mirrored (one process per task of TF_CONFIG, or --cluster) or parameter-server (--cluster)")
        ->check(CLI::IsMember({"one-device", "mirrored", "multi-worker-mirrored", "parameter-server"}));
    c->add_option("--tf-config", o.tfConfig, "multi-worker: TF_CONFIG file (default: the TF_CONFIG environment variable)");
    c->add_option("--task", o.task, "multi-worker: this process's task, e.g. worker:1 (overrides TF_CONFIG's \"task\")");
    c->add_option("--token-file", o.tokenFile,
                  "multi-worker: file with the cluster's shared token (default: $" + std::string(ts::remote::kTokenEnv) + ")");
    c->add_option("--cluster", o.cluster,
                  "coordinate a multi-worker-mirrored (default) or parameter-server run on the trainstudio-worker daemons listed in FILE "
                  "(TF_CONFIG \"cluster\" format)");
    c->add_option("--partitioner", o.partitioner, "parameter-server: round-robin (whole variables) or by-size (split large ones)")
        ->check(CLI::IsMember({"round-robin", "by-size"}));
    // Checked here, not by the ps daemons after the run was created (a failed run in the history).
    c->add_option("--min-shard-bytes", o.minShardBytes, "parameter-server with by-size: the smallest shard of a split variable (>= 4)")
        ->check(numberWhere([](double x) { return x >= 4 && x <= 9.2e18 && x == std::floor(x); },
                            "must be a whole number of bytes, at least 4 (one float)", "BYTES"));
    c->add_option("--tls-ca", o.tlsCa, "with --cluster: talk TLS to the workers, verifying them with this PEM CA");
    // Bounded: NaN or 1e300 seconds overflowed the millisecond count into a negative timeout.
    c->add_option("--collective-timeout", o.collectiveTimeout, "multi-worker: seconds before a silent peer fails the run (0.1 to 86400)")
        ->check(numberWhere([](double x) { return x >= 0.1 && x <= 86400; }, "must be a number of seconds from 0.1 to 86400 (a day)",
                            "SECONDS"));
    c->add_option("--devices", o.devices, "comma-separated devices, e.g. cpu:0,cpu:1");
    c->add_option("--precision", o.precision,
                  "Keras' mixed-precision policy: float32, mixed_bfloat16, or mixed_float16 (with dynamic loss scaling); default: the model's policy (float32 unless it has one)")
        ->check(CLI::IsMember({"float32", "mixed_float16", "mixed_bfloat16"}));
    c->add_option("--threads", o.threads, "total CPU threads (default: all cores)")->check(CLI::Range(0, ts::kMaxThreads));
    // Checked: CLI11 would wrap -1 around to 2^64 - 1.
    c->add_option("--seed", o.seed, "random seed (initialisation, shuffling, dropout; default: the configuration's, else 0)")
        ->check(numberWhere([](double x) { return x >= 0 && x == std::floor(x); }, "must be a whole number >= 0", "SEED"))
        ->each([&o](const std::string&) { o.seedGiven = true; });
    c->add_flag("--no-shuffle", o.noShuffle, "serve batches in file order");
    c->add_flag("--no-validation", o.noValidation, "skip the per-epoch validation (the test set, or the configuration's validation_pipeline)");
    c->add_option("--limit", o.limit, "use only the first N training examples")->check(tsapp::wholeNumberAtLeastZero());
    c->add_option("--validation-limit", o.validationLimit, "use only the first N test examples")->check(tsapp::wholeNumberAtLeastZero());
    c->add_option("--load-weights", o.loadWeights, "initial weights (.safetensors, Keras layouts)");
    c->add_option("--save-weights", o.saveWeights, "write the final weights (.safetensors; with --cluster they come back from the cluster)");
    c->add_option("--backend", o.backend, "force a backend by name (reference, cpu; cuda with the CUDA plugin and a GPU)");
    c->add_flag("--json", o.json, "one JSON object per epoch, then one with \"final\": true");
    c->add_flag("--quiet", o.quiet, "print nothing but errors");
    c->add_option("--db", o.db, "record the run into this run database (default: " + ts::store::defaultDatabasePath() + ")");
    c->add_flag("--no-record", o.noRecord, "do not record the run in the run database");
    c->add_option("--run-name", o.runName, "name of the recorded run (default: model name and time)");
    c->add_option("--tag", o.tags, "tag the recorded run (repeatable)");
    c->add_option("--trace", o.trace, "write the run's Chrome trace (Perfetto, chrome://tracing) to FILE");
    c->add_flag("--trace-layers", o.traceLayers, "with --trace: a span per layer in forward and backward");
    c->add_option("--checkpoint-every", o.checkpointEvery,
                  "keep the weights every N epochs with the recorded run (safetensors in the run's folder)")
        ->check(tsapp::wholeNumberAtLeastZero());
    c->add_option("--backup-dir", o.backupDir,
                  "back the run up into DIR (weights, optimizer state, data position) and resume from it when started again "
                  "(Keras BackupAndRestore); a completed run deletes its backup");
    c->add_option("--backup-every-steps", o.backupEverySteps, "with --backup-dir: back up every N steps (default: after each epoch)")
        ->check(tsapp::wholeNumberAtLeastZero());
    c->add_option("--restarts", o.restarts,
                  "with --backup-dir: when the run fails (e.g. a multi-worker peer died), start it again from its backup up to N "
                  "times; multi-worker tasks re-join the cluster and wait for the restarted peer (also when a task is lost while the "
                  "cluster forms). In a parameter-server run a lost "
                  "worker or evaluator rejoins with a new task once its daemon answers again; each rejoin counts as a restart")
        ->check(CLI::Range(0, 100));
}

namespace {

// multi-worker-mirrored: the cluster this task belongs to (TF_CONFIG or --tf-config, --task),
// validated; no network yet.
ts::Result<ts::ClusterSpec> clusterOfThisTask(const TrainOptions& o)
{
    auto spec = o.tfConfig.empty() ? ts::ClusterSpec::fromEnvironment() : ts::ClusterSpec::fromFile(o.tfConfig);
    if (!spec.ok()) return spec.takeError();
    ts::ClusterSpec cluster = std::move(spec).value();
    if (!o.task.empty()) {
        auto parsed = ts::parseTaskId(o.task);
        if (!parsed.ok())
            return ts::makeError(ts::ErrorCode::InvalidArgument, "--task " + o.task + ": expected type:index", "e.g. --task worker:1 or --task chief:0");
        auto withTask = cluster.withTask(*parsed);
        if (!withTask.ok()) {
            // The task came from the flag, not from the file the message names.
            ts::Error e = withTask.takeError();
            e.message = "--task " + o.task + ": " + e.message;
            return e;
        }
        cluster = std::move(withTask).value();
    }
    TS_TRY(cluster.validateFor("multi-worker-mirrored"));
    return cluster;
}

// Connects to the other tasks: waits up to --collective-timeout for them to join.
ts::Result<ts::remote::ClusterConnection> joinCluster(const ts::ClusterSpec& cluster, const TrainOptions& o,
                                                     std::function<bool()> cancelled)
{
    TS_ASSIGN(std::string token, ts::remote::loadToken(o.tokenFile));
    ts::remote::ClusterOptions co;
    co.cancelled = std::move(cancelled);
    co.token = token;
    co.timeout = std::chrono::milliseconds(static_cast<int64_t>(o.collectiveTimeout * 1000));
    if (!o.quiet) co.waiting = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
    return ts::remote::connectCluster(cluster, co);
}

} // namespace

ts::Result<std::unique_ptr<ts::telemetry::TraceFileSink>> openTraceFile(ts::telemetry::EventBus& bus, const TrainOptions& o)
{
    if (o.traceLayers && o.trace.empty()) return ts::makeError(ts::ErrorCode::InvalidArgument, "--trace-layers needs --trace FILE");
    if (o.trace.empty()) return std::unique_ptr<ts::telemetry::TraceFileSink>();
    return ts::telemetry::TraceFileSink::create(bus, o.trace);
}

int recordedLine(const TrainRecording* recording, const TrainOptions& o)
{
    if (!recording) return 0;
    if (recording->problems() > 0) {
        // The training went well, the record of it did not: say so, and fail the command, rather
        // than "Recorded as run ..." over a database that refused the commits.
        printError(ts::makeError(ts::ErrorCode::IoError,
                                 "the run trained, but its record in " + recording->databasePath() + " is incomplete (" +
                                     std::to_string(recording->problems()) + " recording problem(s), said above)",
                                 "check the database with `trainstudio-cli runs list --db " + recording->databasePath() +
                                     "`, or record into another --db"));
        return 1;
    }
    if (!o.json && !o.quiet) std::printf("Recorded as run %s in %s\n", recording->runId().c_str(), recording->databasePath().c_str());
    return 0;
}

void finishTraceFile(ts::telemetry::TraceFileSink& sink, const TrainOptions& o, TrainRecording* recording)
{
    ts::Status st = sink.finish();
    if (!st.ok()) printError(st.error());
    else if (!o.quiet && !o.json)
        std::printf("Trace written to %s (%zu spans%s)\n", o.trace.c_str(), sink.spans(),
                    sink.dropped() ? (", " + std::to_string(sink.dropped()) + " events dropped").c_str() : "");
    if (st.ok() && recording) recording->keepFile("trace", o.trace);
}

int runTrain(const TrainOptions& options)
{
    TrainOptions o = options;
    std::optional<ts::remote::ClusterConnection> cluster;
    // The recorded run's name and tags go into JSON: refuse what is not UTF-8 text up front.
    const bool textOk = ts::isValidUtf8(o.runName) && std::all_of(o.tags.begin(), o.tags.end(), [](const std::string& t) { return ts::isValidUtf8(t); });
    if (!textOk) {
        printError(ts::makeError(ts::ErrorCode::InvalidArgument, "--run-name and --tag take UTF-8 text; one has other bytes",
                                 "type it again, or set the terminal's locale to UTF-8"));
        return 2;
    }
    // The run configuration first: its strategy decides whether this process joins a cluster.
    ts::RunConfig cfg;
    if (!o.config.empty()) {
        auto j = ts::readJsonFile(o.config, "run configuration");
        auto r = j.ok() ? ts::RunConfig::fromJson(*j, o.config, !o.model.empty()) : ts::Result<ts::RunConfig>(j.takeError());
        if (!r.ok()) {
            printError(r.error());
            return 2;
        }
        cfg = std::move(r).value();
    }
    // Where a strategy was asked for (a configuration's one-device cannot be told from its
    // default, so only another counts).
    std::string strategySource;
    if (!o.strategy.empty()) strategySource = "--strategy";
    else if (!o.config.empty() && !cfg.strategy.kind.empty() && cfg.strategy.kind != "one-device") strategySource = o.config + "'s strategy.type";
    // Flags override the configuration; without either, one device.
    if (o.strategy.empty()) o.strategy = cfg.strategy.kind.empty() ? "one-device" : cfg.strategy.kind;
    if (!o.cluster.empty() && !strategySource.empty() && o.strategy != "multi-worker-mirrored" && o.strategy != "parameter-server") {
        // A coordinated run is one of the two cluster strategies; training it as another would
        // not be what was asked.
        printError(ts::makeError(ts::ErrorCode::InvalidArgument,
                                 "--cluster runs multi-worker-mirrored or parameter-server, but " + strategySource + " is " + o.strategy,
                                 "drop the strategy (multi-worker-mirrored is the default with --cluster) or choose one of those two; "
                                 "each task's local replicas come from --devices"));
        return 2;
    }
    // Settings that would silently do nothing: say so (the run itself is fine).
    if (!o.quiet) {
        if (o.noRecord && !o.db.empty())
            std::fprintf(stderr, "warning: --db %s has no effect with --no-record: nothing is recorded\n", o.db.c_str());
        const char* tfConfig = std::getenv("TF_CONFIG");
        if (tfConfig && *tfConfig && o.strategy != "multi-worker-mirrored" && o.cluster.empty())
            std::fprintf(stderr,
                         "warning: TF_CONFIG is set, but the strategy is %s: this process trains alone, outside the TF_CONFIG "
                         "cluster\nhint: pass --strategy multi-worker-mirrored to join it, or unset TF_CONFIG\n",
                         o.strategy.c_str());
    }
    if (!o.cluster.empty() && (!o.tfConfig.empty() || !o.task.empty())) {
        printError(ts::makeError(ts::ErrorCode::InvalidArgument, "--cluster coordinates remote workers; --tf-config/--task make this process a task",
                                 "use one or the other"));
        return 2;
    }
    // A task of a multi-worker run: its cluster is checked now, but it joins the others only once
    // its own settings are known to be good (a typo fails at once, not after the peers gathered).
    std::optional<ts::ClusterSpec> clusterSpec;
    bool coordinatingTask = true;  // records the run and writes backups: the chief of a multi-worker run
    if (o.strategy == "multi-worker-mirrored" && o.cluster.empty()) {
        auto spec = clusterOfThisTask(o);
        if (!spec.ok()) {
            printError(spec.error());
            return 2;
        }
        clusterSpec = std::move(spec).value();
        // The cluster's evaluator trains nothing: it evaluates what the chief sends it. Started
        // with the same command as the other tasks (TF's way), it takes the run's settings
        // from the chief and ignores the training flags.
        if (clusterSpec->task().type == "evaluator") return runEvaluatorTask(o, *clusterSpec);
        coordinatingTask = clusterSpec->task() == clusterSpec->coordinator();
        if (!coordinatingTask) {
            o.noRecord = true;
            o.checkpointEvery = 0;
        }
    } else if (o.strategy == "parameter-server" && o.cluster.empty()) {
        printError(ts::makeError(ts::ErrorCode::InvalidArgument, "parameter-server runs on a cluster of trainstudio-worker daemons",
                                 "pass --cluster FILE listing \"ps\" and \"worker\" tasks"));
        return 2;
    } else if (!o.tfConfig.empty() || !o.task.empty()) {
        printError(ts::makeError(ts::ErrorCode::InvalidArgument, "--tf-config and --task are for --strategy multi-worker-mirrored",
                                 "add --strategy multi-worker-mirrored to run this process as that task, or drop them"));
        return 2;
    }
    if (!o.model.empty() || (o.config.empty())) {
        auto model = loadModel(o.model);
        if (!model.ok()) {
            printError(model.error());
            return 2;
        }
        cfg.model = std::move(model).value();
        cfg.modelFile.clear();
    }
    if (!o.data.empty() && cfg.pipeline) {
        // It would be ignored: a pipeline names its own files.
        printError(ts::makeError(ts::ErrorCode::InvalidArgument,
                                 "--data names the IDX folder of a run without an input pipeline; " +
                                     (cfg.source.empty() ? std::string("this run's") : cfg.source + "'s") + " pipeline reads its own source",
                                 "set the pipeline source's \"dir\" (or \"paths\") in the configuration, or leave --data out"));
        return 2;
    }
    if (!o.data.empty()) cfg.dataDir = o.data;
    if (o.epochs >= 0) cfg.epochs = o.epochs;
    if (o.epochs == 0) {
        printError(ts::makeError(ts::ErrorCode::InvalidArgument, "--epochs must be >= 1", "an epoch is one pass over the training data"));
        return 2;
    }
    if (o.maxSteps > 0) cfg.maxSteps = o.maxSteps;
    if (o.batchSize >= 0) {
        if (o.batchSize == 0) {
            printError(ts::makeError(ts::ErrorCode::InvalidArgument, "--batch-size must be >= 1, got 0",
                                     "the global batch is split across replicas; 256 suits the seed's MLP"));
            return 2;
        }
        cfg.batchSize = o.batchSize;
    }
    if (!o.optimizer.empty() || o.learningRate > 0) {
        nlohmann::json opt = cfg.optimizer.is_null() ? cfg.model.compile.optimizer : cfg.optimizer;
        // A configuration's model_file is read later (prepareRun): its optimizer (an imported
        // Keras model's SGD, say) is the one --learning-rate alone changes, not the default Adam.
        if (cfg.optimizer.is_null() && !cfg.modelFile.empty() && o.optimizer.empty())
            if (auto named = ts::loadModelFile(cfg.modelFile); named.ok()) opt = named->compile.optimizer;
        if (!o.optimizer.empty()) opt = {{"type", o.optimizer}};
        if (o.learningRate > 0) opt["learning_rate"] = o.learningRate;
        cfg.optimizer = opt;
    }
    cfg.strategy.kind = o.strategy;
    if (!o.devices.empty()) {
        cfg.strategy.devices.clear();
        std::stringstream ss(o.devices);
        std::string item;
        while (std::getline(ss, item, ',')) {
            auto d = ts::Device::parse(item);
            if (!d.ok()) {
                printError(d.error());
                return 2;
            }
            cfg.strategy.devices.push_back(*d);
        }
    }
    // Flags that would do nothing in this run are mistakes to point out, not to ignore quietly.
    {
        const bool ps = o.strategy == "parameter-server";
        std::string unused, hint;
        if (!o.partitioner.empty() && !ps) unused = "--partitioner", hint = "it splits variables across ps tasks: use it with --strategy parameter-server";
        else if (o.minShardBytes > 0 && !(ps && (o.partitioner.empty() ? cfg.strategy.partition.policy : o.partitioner) == "by-size"))
            unused = "--min-shard-bytes", hint = "it sizes the shards of --partitioner by-size (parameter-server): add that, or drop it";
        else if (!o.tlsCa.empty() && o.cluster.empty())
            unused = "--tls-ca", hint = "it is how --cluster talks TLS to the worker daemons; TF_CONFIG tasks meet over the token-checked rendezvous";
        if (!unused.empty()) {
            printError(ts::makeError(ts::ErrorCode::InvalidArgument, unused + " has no effect in this run (--strategy " + o.strategy + ")", hint));
            return 2;
        }
    }
    if (o.threads > 0) cfg.strategy.threads = o.threads;
    if (clusterSpec && cfg.strategy.threads == 0) {
        const int cores = ts::defaultCpuBudget();
        if (const int t = clusterSpec->sharedHostThreads(clusterSpec->task(), cores); t > 0) {
            cfg.strategy.threads = t;
            if (!o.quiet && !o.json)
                std::printf("%d training tasks of this cluster run on this machine: this one uses %d of its %d core(s) (--threads overrides)\n",
                            clusterSpec->trainingTasksSharingHost(clusterSpec->task()), t, cores);
        }
    }
    if (!o.backend.empty()) cfg.strategy.backend = o.backend;
    if (!o.precision.empty()) {
        // The policy alone: a configuration's loss-scale settings stay.
        auto policy = ts::PrecisionConfig::parsePolicy(o.precision, "--precision");
        if (!policy.ok()) {
            printError(policy.takeError());
            return 2;
        }
        if (!cfg.precision) cfg.precision = ts::PrecisionConfig{};
        cfg.precision->policy = policy.value();
    }
    if (!o.partitioner.empty()) cfg.strategy.partition.policy = o.partitioner;
    if (o.minShardBytes > 0) cfg.strategy.partition.minShardBytes = o.minShardBytes;
    if (o.seedGiven) cfg.seed = o.seed;
    if (o.noShuffle) cfg.shuffle = false;
    if (o.noValidation) {
        cfg.validate = false;
        cfg.validationPipeline.reset();  // the flag skips every validation, a configuration's pipeline too
    }
    if (o.limit > 0) cfg.limit = o.limit;
    if (o.validationLimit > 0) cfg.validationLimit = o.validationLimit;
    if (!o.loadWeights.empty()) cfg.loadWeights = o.loadWeights;
    if (!o.saveWeights.empty()) cfg.saveWeights = o.saveWeights;
    if (!o.backupDir.empty()) cfg.backup.dir = o.backupDir;
    if (o.backupEverySteps >= 0) cfg.backup.everySteps = o.backupEverySteps;
    if (o.restarts >= 0) cfg.backup.restarts = o.restarts;
    if ((cfg.backup.restarts > 0 || cfg.backup.everySteps > 0) && !cfg.backup.enabled()) {
        printError(ts::makeError(ts::ErrorCode::InvalidArgument, "--restarts and --backup-every-steps need a backup folder",
                                 "add --backup-dir DIR (a restarted run resumes from the backup there)"));
        return 2;
    }

    // The backup folder is made now (by the task that writes backups), so a folder that cannot
    // be made is a flag error, not a recorded failed run.
    if (cfg.backup.enabled() && o.cluster.empty() && coordinatingTask) {
        std::error_code ec;
        std::filesystem::create_directories(cfg.backup.dir, ec);
        if (ec || !std::filesystem::is_directory(cfg.backup.dir, ec)) {
            printError(ts::makeError(ts::ErrorCode::InvalidArgument,
                                     "--backup-dir " + cfg.backup.dir + ": cannot make the folder" + (ec ? ": " + ec.message() : std::string()),
                                     "choose a folder this user can write"));
            return 2;
        }
    }
    // Outputs must not overwrite what the run reads or the store keeps.
    {
        const std::string db = o.noRecord ? std::string() : o.db.empty() ? ts::store::defaultDatabasePath() : o.db;
        std::vector<tscli::Protected> inputs = {{"the run database", db},
                                                {"the model file", cfg.modelFile.empty() ? o.model : cfg.modelFile},
                                                {"the run configuration", o.config},
                                                {"the TF_CONFIG file", o.tfConfig},
                                                {"the cluster file", o.cluster},
                                                {"the token file", o.tokenFile},
                                                {"the TLS CA file", o.tlsCa}};
        // The pipelines' own files (a trace written over the training CSV destroyed the data)
        // and their cache files (an output written over one destroyed the cache, and the next
        // run refused it as "not a TrainStudio cache file").
        for (const auto* pipeline : {&cfg.pipeline, &cfg.validationPipeline}) {
            if (!*pipeline) continue;
            for (const std::string& path : (*pipeline)->source.paths) inputs.push_back({"a file the pipeline reads", path});
            for (const auto& op : (*pipeline)->ops)
                if (op.kind == ts::TransformKind::Cache && !op.cacheFile.empty()) inputs.push_back({"a cache file of the pipeline", op.cacheFile});
        }
        std::vector<tscli::Protected> dirs;
        if (!db.empty()) dirs.push_back({"the run store's files", ts::store::RunStore::filesRoot(db)});
        // --save-weights may replace the --load-weights file (read before the first step, as
        // Keras' load_weights(f); fit(); save_weights(f)); a trace may not.
        std::vector<tscli::Protected> traceInputs = inputs;
        traceInputs.push_back({"the initial weights (--load-weights)", cfg.loadWeights});
        for (const auto& [out, flag, protectedFiles] : {std::tuple{cfg.saveWeights, std::string("--save-weights"), &inputs},
                                                        std::tuple{o.trace, std::string("--trace"), &traceInputs}})
            if (ts::Status st = tscli::checkOutputPath(out, flag, *protectedFiles, dirs); !st.ok()) {
                printError(st.error());
                return 2;
            }
        // The two outputs themselves: the later write would replace the earlier.
        if (tscli::samePath(cfg.saveWeights, o.trace)) {
            printError(ts::makeError(ts::ErrorCode::InvalidArgument, "--trace and --save-weights name the same file " + o.trace,
                                     "give each its own file"));
            return 2;
        }
    }

    if (!o.cluster.empty()) {
        auto recordingOpened = openTrainRecording(o);
        if (!recordingOpened.ok()) {
            printError(recordingOpened.error());
            return 2;
        }
        return runCoordinated(o, std::move(cfg), recordingOpened->get());
    }
    if (o.checkpointEvery > 0 && o.noRecord) {
        printError(ts::makeError(ts::ErrorCode::InvalidArgument, "--checkpoint-every keeps checkpoints with the recorded run",
                                 "drop --no-record (choose the database with --db), or use --save-weights for the final weights"));
        return 2;
    }
    // Every run is recorded (unless --no-record): open the database before any work.
    auto recordingOpened = openTrainRecording(o);
    if (!recordingOpened.ok()) {
        printError(recordingOpened.error());
        return 2;
    }
    std::unique_ptr<TrainRecording> recording = std::move(recordingOpened).value();
    // --trace: the trace sink subscribes to the run's telemetry bus (opened first: a bad path
    // fails before any work).
    ts::telemetry::EventBus bus;
    auto traceOpened = openTraceFile(bus, o);
    if (!traceOpened.ok()) {
        printError(traceOpened.error());
        return 2;
    }
    std::unique_ptr<ts::telemetry::TraceFileSink> traceSink = std::move(traceOpened).value();
    // A cluster task that records nothing (not the coordinator) has no run log: the trainer's
    // warnings (its input shard ran out early, ...) go to its own stderr, after each epoch.
    std::shared_ptr<ts::telemetry::Subscription> warnings;
    std::multiset<std::string> saidOnStderr;  // this command's own warnings (logWarning): printed when they happened
    auto printWarnings = [&] {
        if (!warnings || o.quiet) return;
        for (const auto& ev : warnings->drain()) {
            const auto* e = std::get_if<ts::telemetry::LogEvent>(&ev);
            if (!e || e->level < ts::telemetry::LogLevel::Warning) continue;
            if (auto said = saidOnStderr.find(e->message); said != saidOnStderr.end()) {
                saidOnStderr.erase(said);
                continue;
            }
            std::fprintf(stderr, "warning: %s\n", e->message.c_str());
        }
    };
    // This task gives up for good after the cluster formed (its own data or settings refused,
    // its database unusable): the others learn why at once, not that it stopped responding, and
    // as a failure no restart gets past (it is not coming back to re-form the cluster).
    auto abandonCluster = [&](const ts::Error& cause) {
        if (!cluster || !cluster->communicator) return;
        const bool restartable = cause.code != ts::ErrorCode::Cancelled && ts::restartableFailure(cause);
        cluster->communicator->abort(restartable ? ts::makeError(ts::ErrorCode::InvalidArgument, cause.message, cause.hint) : cause);
    };
    auto useCluster = [&] {
        cfg.strategy.crossProcess = cluster->communicator;
        cfg.strategy.processRank = cluster->rank;
        cfg.strategy.processNames = cluster->rankNames;
        cfg.strategy.collectiveTimeout = std::chrono::milliseconds(static_cast<int64_t>(o.collectiveTimeout * 1000));
    };
    // Ctrl-C stops the run at its next step, recorded as cancelled; while this task waits for
    // its peers, it stops waiting.
    tscli::InterruptScope interrupt;
    auto interrupted = [&interrupt] { return interrupt.interrupted(); };
    // A cluster with an evaluator task validates there (TF's side-car evaluator): no training
    // task validates at its epochs' ends, and the chief sends its weights after each epoch.
    const bool hasEvaluator = clusterSpec && clusterSpec->count("evaluator") > 0;
    const std::string evaluatorIdle = ts::remote::RunEvaluator::nothingToEvaluate(cfg);
    const bool sidecarValidates = hasEvaluator && evaluatorIdle.empty();
    std::optional<UnusedEvaluator> unusedEvaluator;  // told so, so that it exits
    std::unique_ptr<EvaluatorSide> sidecar;
    if (hasEvaluator && coordinatingTask && !sidecarValidates) {
        if (!o.quiet) std::fprintf(stderr, "note: the cluster's evaluator is not used: %s\n", evaluatorIdle.c_str());
        unusedEvaluator.emplace(cfg, *clusterSpec, o);
    } else if (hasEvaluator && coordinatingTask) {
        auto made = EvaluatorSide::start(cfg, *clusterSpec, o, bus);
        if (!made.ok()) {
            if (recording) recording->prepareFailed(cfg, made.error());
            printError(made.error());
            return 2;
        }
        sidecar = std::move(made).value();
    }
    // Joins the cluster. With --restarts, a cluster that did not form (a task died or froze while
    // it formed, or never came) is formed again, as a supervisor restarting that task expects;
    // each time counts as one of the run's restarts (`fitRestarts` are those spent on failed fits).
    int formRestarts = 0;
    int64_t failedStep = 0;  // where the last failed fit stopped
    // A warning into the recorded run's log (the console has it already).
    // A warning this command printed itself, for the run's log too.
    auto logWarning = [&](int64_t step, const std::string& message) {
        if (warnings) saidOnStderr.insert(message);
        ts::telemetry::LogEvent e;
        e.stamp.runId = recording ? recording->runId() : std::string();
        e.stamp.step = step;
        e.stamp.wallTimeUs = ts::telemetry::wallNowMicros();
        e.level = ts::telemetry::LogLevel::Warning;
        e.message = message;
        bus.publish(ts::telemetry::Event(std::move(e)));
    };
    auto formCluster = [&](int fitRestarts) {
        auto joined = joinCluster(*clusterSpec, o, interrupted);
        while (!joined.ok() && !interrupt.interrupted() && fitRestarts + formRestarts < cfg.backup.restarts &&
               ts::restartableFailure(joined.error())) {
            ++formRestarts;
            const std::string restart = "restart " + std::to_string(fitRestarts + formRestarts) + " of " + std::to_string(cfg.backup.restarts);
            std::fprintf(stderr, "warning: the cluster did not form: %s\n  forming it again (%s)\n", joined.error().message.c_str(),
                         restart.c_str());
            if (fitRestarts > 0) logWarning(failedStep, "the cluster did not form (" + joined.error().message + "); forming it again (" + restart + ")");
            joined = joinCluster(*clusterSpec, o, interrupted);
        }
        return joined;
    };
    if (clusterSpec) {
        auto joined = formCluster(0);
        if (!joined.ok() && interrupt.interrupted()) return tscli::kInterruptedExitCode;  // nothing started, nothing to record
        if (!joined.ok()) {
            // The coordinating task records the attempt: the history shows which task never came.
            if (recording) recording->prepareFailed(cfg, joined.error());
            printError(joined.error());
            return 2;
        }
        cluster = std::move(joined).value();
        useCluster();
        if (!o.quiet && !o.json)
            std::printf("Joined the cluster as %s, rank %d of %d%s\n", cluster->taskName.c_str(), cluster->rank, cluster->size,
                        cluster->coordinator ? " (coordinator: records the run)" : "");
        std::fflush(stdout);
    }
    // One attempt, or with --restarts several: a failed fit() is started again from the backup,
    // into the same recorded run (replayed steps overwrite their metrics).
    std::optional<ts::PreparedRun> prepared;
    ts::Result<ts::FitResult> result = ts::makeError(ts::ErrorCode::Internal, "the run was not started");
    std::unique_ptr<ConsoleListener> listener;
    std::string traceRunId;
    for (int attempt = 0;; ++attempt) {
        if (attempt > 0 && interrupt.interrupted()) break;  // no restart after Ctrl-C: keep the failure
        interrupt.setAction(nullptr);
        if (attempt > 0 && cluster) {
            // Re-join: the old Gloo group is broken. The peers that failed must be started again
            // (by their supervisor); connecting waits for them up to --collective-timeout.
            prepared.reset();
            cfg.strategy.crossProcess.reset();
            cluster.reset();
            auto joined = formCluster(attempt);
            if (!joined.ok()) {
                result = joined.takeError();
                break;
            }
            cluster = std::move(joined).value();
            useCluster();
        }
        auto made = ts::prepareRun(cfg);
        if (!made.ok()) {
            abandonCluster(made.error());
            if (attempt == 0) {
                // Refused before it starts (its model, data, weights or settings): bad input.
                if (recording) recording->prepareFailed(cfg, made.error());
                printError(made.error());
                return 2;
            }
            result = made.takeError();
            break;
        }
        prepared.emplace(std::move(made).value());
        ts::PreparedRun& run = *prepared;
        // How this task's part of the input was chosen.
        for (const ts::Pipeline* p : {run.pipeline.get(), run.validationPipeline.get()})
            if (attempt == 0 && cluster && p && !p->note().empty() && !o.quiet && !o.json) std::printf("%s\n", p->note().c_str());
        interrupt.setAction([trainer = run.trainer.get()] { trainer->cancel(); });
        listener = std::make_unique<ConsoleListener>(o.json, o.quiet, run.config.epochs);
        if (recording && o.checkpointEvery > 0)
            listener->epochHook = [&](const ts::EpochEvent& e) {
                if (e.epoch % o.checkpointEvery == 0) recording->checkpoint(*prepared, e.epoch, prepared->trainer->globalStep());
            };
        if (recording) {
            if (attempt == 0) {
                // The store records what the trainer publishes; a run that cannot be recorded
                // (a damaged database) is not trained, so nothing claims to have recorded it.
                if (ts::Status st = recording->begin(run, bus); !st.ok()) {
                    ts::Error e = st.takeError();
                    e.hint += " (--db FILE, or --no-record)";
                    abandonCluster(e);
                    printError(e);
                    return 2;
                }
                if (sidecar) sidecar->recordInto(recording->runId());
            } else {
                recording->attach(run);
            }
        } else if (cluster) {
            if (!warnings) {
                ts::telemetry::SubscriberOptions so;
                so.name = "console warnings";
                so.capacity = 256;
                so.kinds = ts::telemetry::kindMask<ts::telemetry::LogEvent>();
                so.wakeThreshold = so.capacity;  // drained after each epoch, never woken
                warnings = bus.subscribe(so);
            }
            run.trainer->setTelemetry(&bus, {}, false);
            listener->epochHook = [&](const ts::EpochEvent&) { printWarnings(); };
        }
        if (sidecar)
            listener->epochHook = [&, before = listener->epochHook](const ts::EpochEvent& e) {
                if (before) before(e);
                sidecar->epochDone(*prepared->trainer, e);
            };
        if (traceSink) {
            if (traceRunId.empty())
                traceRunId = recording ? recording->runId() : unrecordedRunId("run");
            traceSink->setMetadata("model", run.model.name);
            traceSink->setMetadata("strategy", run.trainer->strategy().name());
            traceSink->setMetadata("replicas", std::to_string(run.trainer->strategy().numReplicas()));
            run.trainer->setTelemetry(&bus, traceRunId, true, o.traceLayers);
        }
        // A "pipeline" section in --config: its stall windows and verdicts join the run's telemetry.
        if (run.pipeline && recording) run.pipeline->setTelemetry(&bus, recording->runId());
        result = run.trainer->fit(*run.trainSource(), sidecarValidates ? nullptr : run.validationSource(), listener.get());
        printWarnings();
        const int restartsUsed = formRestarts + attempt;
        if (result.ok() || restartsUsed >= cfg.backup.restarts || !ts::restartableFailure(result.error())) break;
        const std::string why = result.error().message;
        failedStep = run.trainer->globalStep();
        std::fprintf(stderr, "warning: the run failed at step %lld: %s\n  restarting it from its backup (restart %d of %d)\n",
                     static_cast<long long>(failedStep), why.c_str(), restartsUsed + 1, cfg.backup.restarts);
        logWarning(failedStep, "the run failed (" + why + "); restarting it from its backup (restart " + std::to_string(restartsUsed + 1) + " of " +
                   std::to_string(cfg.backup.restarts) + ")");
    }
    interrupt.setAction(nullptr);  // the trainer is destroyed before the scope
    // The evaluator's last evaluations join the record before the run's end does (Ctrl-C stops
    // waiting for them).
    if (sidecar) {
        interrupt.setAction([&sidecar] { sidecar->cancel(); });
        sidecar->finish(result, interrupt.interrupted());
        interrupt.setAction(nullptr);
    }
    if (unusedEvaluator && !interrupt.interrupted()) unusedEvaluator->finish();
    if (!prepared) {
        // A restart could not even be prepared (e.g. the cluster could not be re-joined).
        if (recording) recording->fitDone(result);
        printError(result.error());
        return 1;
    }
    ts::PreparedRun& run = *prepared;
    const int64_t badRecords = run.pipeline ? run.pipeline->badRecords() : 0;
    if (badRecords > 0) {
        // skip_bad_records: say how many were dropped and the first reasons, also in the run's log.
        // Each epoch reads a bad record again, so the count is of skips over the epochs trained.
        const int64_t epochs = result.ok() ? result->epochs : 0;
        std::string msg = "skipped " + std::to_string(badRecords) + " bad record(s) in the training data" +
                          (epochs > 1 ? " over " + std::to_string(epochs) + " epochs (each epoch meets them again)" : std::string());
        const auto first = run.pipeline->badRecordMessages();
        const std::size_t shown = std::min<std::size_t>(first.size(), 3);
        for (std::size_t i = 0; i < shown; ++i) msg += "\n  " + first[i];
        if (static_cast<int64_t>(shown) < badRecords) msg += "\n  ... and " + std::to_string(badRecords - static_cast<int64_t>(shown)) + " more";
        std::cerr << "warning: " << msg << "\n";
        logWarning(run.trainer->globalStep(), msg);
    }
    if (recording) recording->fitDone(result);
    if (traceSink) finishTraceFile(*traceSink, o, recording.get());
    if (!result.ok()) {
        printError(result.error());
        return 1;
    }
    // A cancelled run keeps its weights so far too (as the studio's Stop does); the exit status
    // and the message say it did not finish.
    if (!run.config.saveWeights.empty()) {
        ts::Status st = run.trainer->saveWeights(run.config.saveWeights);
        if (!st.ok()) {
            printError(st.error());
            return 1;
        }
    }
    if (recording) recording->keepWeights(run, run.config.saveWeights, result->steps);
    const ts::FitResult& r = *result;
    if (r.cancelled) {
        if (o.json) {
            nlohmann::json j = {{"final", true}, {"cancelled", true}, {"epochs", r.epochs}, {"steps", r.steps}};
            if (recording) j["run_id"] = recording->runId();
            std::cout << j.dump() << "\n";
        } else if (!o.quiet) {
            std::printf("Cancelled after %lld step(s)\n", static_cast<long long>(r.steps));
            if (!run.config.saveWeights.empty()) std::printf("Weights so far written to %s\n", run.config.saveWeights.c_str());
            if (recording) std::printf("Recorded as cancelled run %s in %s\n", recording->runId().c_str(), recording->databasePath().c_str());
        }
        return tscli::kInterruptedExitCode;
    }
    if (o.json) {
        nlohmann::json j = {{"final", true}, {"epochs", r.epochs}, {"partial_epoch", r.partialEpoch}, {"steps", r.steps}, {"loss", num(r.last.loss)},
                            {"accuracy", num(r.last.accuracy)}, {"val_loss", num(r.last.valLoss)},
                            {"val_accuracy", num(r.last.valAccuracy)}, {"samples_per_sec", num(r.samplesPerSec)},
                            {"seconds", num(r.seconds)}, {"strategy", run.trainer->strategy().name()},
                            {"replicas", run.trainer->strategy().numReplicas()}};
        if (recording) j["run_id"] = recording->runId();
        if (run.pipeline) j["bad_records"] = badRecords;
        if (sidecar) j["evaluator"] = sidecar->summary();
        std::cout << j.dump() << "\n";
    } else if (!o.quiet) {
        std::printf("Trained %lld step(s) in %s: %s samples/s", static_cast<long long>(r.steps), fmtDuration(r.seconds).c_str(),
                    fmtRate(r.samplesPerSec).c_str());
        if (std::isfinite(r.last.valAccuracy)) std::printf(", test accuracy %.4f", r.last.valAccuracy);
        std::printf("\n");
        if (!run.config.saveWeights.empty()) std::printf("Weights written to %s\n", run.config.saveWeights.c_str());
    }
    return recordedLine(recording.get(), o);
}

int runValidate(const std::string& file, bool json)
{
    auto model = loadModel(file);
    if (!model.ok()) {
        printError(model.error());
        // A script reading --json gets the verdict on standard output too.
        if (json)
            std::cout << nlohmann::json{{"ok", false}, {"readable", false}, {"nodes", nlohmann::json::array()},
                                        {"problems", {{{"node", ""}, {"message", model.error().message}, {"hint", model.error().hint}}}}}
                             .dump(2)
                      << "\n";
        return 2;  // no model to validate (1: a model with problems)
    }
    ts::GraphAnalysis a = ts::analyzeModel(*model);
    // What `train` would refuse beyond the graph: the compile settings and the one Input and one
    // output training needs. Reported like the graph's problems, so validate says all of it.
    auto trainingProblem = [&](const std::string& message, const std::string& hint) {
        ts::Problem p;
        p.message = message;
        p.hint = hint;
        a.problems.push_back(std::move(p));
    };
    if (auto loss = ts::parseLoss(model->compile.loss, model->compile.fromLogits); !loss.ok())
        trainingProblem("compile.loss: " + loss.error().message, loss.error().hint);
    if (auto opt = ts::Optimizer::create(model->compile.optimizer); !opt.ok())
        trainingProblem("compile.optimizer: " + opt.error().message, opt.error().hint);
    if (a.inputNodes.size() > 1)
        trainingProblem("the model has " + std::to_string(a.inputNodes.size()) + " Input nodes; training needs exactly one",
                        "merge the inputs into one Input layer");
    if (a.outputNodes.size() > 1)
        trainingProblem("the model has " + std::to_string(a.outputNodes.size()) + " outputs; training needs exactly one",
                        "set \"outputs\" to the node the loss applies to");
    if (ts::Status fits = ts::checkModelFitsMemory(a, file); !fits.ok()) trainingProblem(fits.error().message, fits.error().hint);
    if (json) {
        nlohmann::json nodes = nlohmann::json::array();
        for (const auto& n : a.nodes)
            nodes.push_back({{"id", n.id}, {"type", n.type}, {"output_shape", n.outputShape.dims()},
                             {"params", n.paramCount}, {"flops", n.flops}, {"ok", n.ok}});
        nlohmann::json problems = nlohmann::json::array();
        for (const auto& p : a.problems) problems.push_back({{"node", p.nodeId}, {"message", p.message}, {"hint", p.hint}});
        std::cout << nlohmann::json{{"ok", a.ok()}, {"nodes", nodes}, {"problems", problems},
                                    {"total_params", a.totalParams}, {"trainable_params", a.trainableParams},
                                    {"total_flops", a.totalFlops}}.dump(2)
                  << "\n";
        return a.ok() ? 0 : 1;
    }
    if (!a.ok()) {
        std::cerr << file << ": " << a.problems.size() << " problem(s)\n";
        for (const auto& p : a.problems) {
            // The analysis names the node in its messages ("node 'dense': ...").
            std::cerr << "  " << p.message << "\n";
            if (!p.hint.empty()) std::cerr << "    hint: " << p.hint << "\n";
        }
        return 1;
    }
    std::printf("Model: %s\n", model->name.c_str());
    std::printf("%-24s %-24s %-18s %12s %14s\n", "Layer (id)", "Type", "Output shape", "Params", "FLOPs/sample");
    std::printf("%s\n", std::string(96, '-').c_str());
    for (const auto& n : a.nodes) {
        std::string shape = "(None";
        for (int64_t d : n.outputShape.dims()) shape += ", " + std::to_string(d);
        shape += ")";
        std::printf("%-24s %-24s %-18s %12lld %14lld\n", n.id.c_str(), n.type.c_str(), shape.c_str(),
                    static_cast<long long>(n.paramCount), static_cast<long long>(n.flops));
    }
    std::printf("%s\n", std::string(96, '-').c_str());
    std::printf("Total params: %lld (trainable %lld)\nForward FLOPs per sample: %lld\n", static_cast<long long>(a.totalParams),
                static_cast<long long>(a.trainableParams), static_cast<long long>(a.totalFlops));
    return 0;
}

} // namespace tscli
