// trainstudio-cli train --cluster FILE [--strategy parameter-server]: this process coordinates a
// multi-worker-mirrored (default) or parameter-server run on trainstudio-worker daemons. Pre-flight (every task's worker answers, same version), then
// every task is started, their event streams are merged into one recorded run, and a worker
// that dies or goes silent stops the run with an error naming it.

#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>

#include "commands.h"
#include "interrupt.h"
#include "distribute/cluster_spec.h"
#include "io/safetensors.h"
#include "store/recording.h"
#include "remote/auth.h"
#include "remote/coordinator.h"
#include "telemetry/bus.h"
#include "telemetry/events.h"
#include "telemetry/trace_sink.h"
#include "telemetry/tracer.h"
#include "train/backup.h"
#include "train/run_config.h"

namespace tscli {
namespace {

std::string fixed4(double v)
{
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.4f", v);
    return buf;
}

using namespace std::chrono_literals;

} // namespace

int runCoordinated(const TrainOptions& o, ts::RunConfig cfg, TrainRecording* recording)
{
    auto spec = ts::ClusterSpec::fromFile(o.cluster);
    if (!spec.ok()) {
        printError(spec.error());
        return 2;
    }
    const std::string strategy = o.strategy == "parameter-server" ? "parameter-server" : "multi-worker-mirrored";
    if (auto st = spec->validateFor(strategy); !st.ok()) {
        printError(st.error());
        return 2;
    }
    auto token = ts::remote::loadToken(o.tokenFile);
    if (!token.ok()) {
        printError(token.error());
        return 2;
    }
    // Refused here before any daemon is reserved (each daemon checks it again).
    if (cfg.backup.enabled())
        if (auto st = ts::checkRemoteBackupName(cfg.backup.dir, "--backup-dir"); !st.ok()) {
            printError(st.error());
            return 2;
        }
    // Say so rather than skip it quietly.
    if (!spec->addresses("evaluator").empty() && !cfg.validate && !o.quiet)
        std::fprintf(stderr, "note: %s: the evaluator task is not started: the run does not validate\n", o.cluster.c_str());
    if (!cfg.modelFile.empty()) {
        auto m = ts::loadModelFile(cfg.modelFile);
        if (!m.ok()) {
            printError(m.error());
            return 2;
        }
        cfg.model = std::move(m).value();
        cfg.modelFile.clear();
    }
    const bool ps = strategy == "parameter-server";
    // The final weights come back to this process (pulled from the ps tasks, or sent by the
    // chief), which writes them itself; the workers are never told a path.
    const std::string saveWeights = cfg.saveWeights;
    cfg.saveWeights.clear();
    if (!cfg.loadWeights.empty()) {
        // The coordinator sends the file's weights to every training task; checked before any contact.
        if (auto w = ts::readSafetensors(cfg.loadWeights); !w.ok()) {
            printError(w.error());
            return 2;
        }
    }
    ts::telemetry::EventBus bus;
    // --trace: every task traces every step and streams its spans here; one file holds them all,
    // a lane per task, device and thread (moved onto this machine's clock when a task's clock differs).
    auto traceOpened = openTraceFile(bus, o);
    if (!traceOpened.ok()) {
        printError(traceOpened.error());
        return 2;
    }
    std::unique_ptr<ts::telemetry::TraceFileSink> traceSink = std::move(traceOpened).value();
    if (traceSink) {
        traceSink->setMetadata("model", cfg.model.name);
        traceSink->setMetadata("strategy", strategy);
        traceSink->setMetadata("cluster", o.cluster);
    }
    ts::remote::CoordinatorOptions copts;
    copts.spec = std::move(spec).value();
    copts.token = *token;
    copts.tls.rootCa = o.tlsCa;
    copts.name = "trainstudio-cli";
    copts.trace = !o.trace.empty();
    copts.traceLayers = o.traceLayers;
    copts.useEvaluator = cfg.validate;
    auto coordinator = ts::remote::Coordinator::create(std::move(copts), strategy);
    if (!coordinator.ok()) {
        printError(coordinator.error());
        return 2;
    }
    auto& c = **coordinator;
    // Ctrl-C cancels every task (each stops at its next step) and the run is recorded as cancelled.
    tscli::InterruptScope interrupt;
    interrupt.setAction([&c] { c.cancel(); });
    // Pre-flight: every task's worker answers with our version before anything starts.
    bool evaluatorAnswered = true;
    for (const auto& p : c.probe(3s, 10s)) {
        if (!p.ok && p.id.type == "evaluator") {
            evaluatorAnswered = false;
            // Not needed to train (TF's side-car evaluator): the run starts without it, and the
            // coordinator says below who evaluates instead.
            if (!o.quiet) std::fprintf(stderr, "warning: pre-flight: %s: the run goes on without it\n", p.problem.c_str());
            continue;
        }
        if (!p.ok) {
            printError(ts::makeError(ts::ErrorCode::InvalidArgument, "pre-flight: " + p.problem, p.hint));
            return 2;
        }
        if (!o.quiet && !o.json)
            std::printf("%s: %s (%s, pid %d, %zu device(s))\n", p.label.c_str(), p.identity.worker.c_str(), p.identity.hostname.c_str(),
                        p.identity.pid, p.identity.devices.size());
    }

    cfg.strategy.kind = strategy;  // what the record shows; run() forces it too
    if (recording)
        if (ts::Status st = recording->beginRemote(cfg, bus); !st.ok()) {
            ts::Error e = st.takeError();
            e.hint += " (--db FILE, or --no-record)";
            printError(e);
            return 2;
        }
    const std::string runId = recording && !recording->runId().empty()
                                  ? recording->runId()
                                  : unrecordedRunId("run");
    const std::string where = (ps ? std::to_string(c.spec().count("worker")) + " worker(s) and " + std::to_string(c.spec().count("ps")) + " ps task(s)"
                                  : std::to_string(c.numTasks()) + " worker(s)") +
                              (c.spec().count("evaluator") == 0 || !cfg.validate ? ""
                               : evaluatorAnswered                                 ? " (evaluator:0 evaluates)"
                                                                                   : " (evaluator:0 did not answer: the coordinator evaluates)");
    if (!o.quiet && !o.json) std::printf("Starting run %s on %s\n", runId.c_str(), where.c_str());
    std::fflush(stdout);
    const std::string modelName = cfg.model.name;
    // The run's warnings (a lost worker the run goes on without, ...) on stderr, after each epoch
    // and at the end; the record keeps them too.
    ts::telemetry::SubscriberOptions wo;
    wo.name = "console warnings";
    wo.capacity = 256;
    wo.kinds = ts::telemetry::kindMask<ts::telemetry::LogEvent>();
    wo.wakeThreshold = wo.capacity;  // drained after each epoch, never woken
    auto warnings = bus.subscribe(wo);
    auto printWarnings = [&] {
        for (const auto& ev : warnings->drain())
            if (const auto* e = std::get_if<ts::telemetry::LogEvent>(&ev); e && e->level >= ts::telemetry::LogLevel::Warning && !o.quiet)
                std::fprintf(stderr, "warning: %s\n", e->message.c_str());
    };
    auto result = c.run(std::move(cfg), runId, bus, [&](const ts::telemetry::EpochMetricsEvent& m) {
        printWarnings();
        if (o.quiet) return;
        const double loss = m.metrics.count("loss") ? m.metrics.at("loss") : 0.0;
        // As a local run's epoch lines, with the task whose epoch it is (no accuracy for a regression).
        nlohmann::json j{{"epoch", m.epoch}, {"loss", loss}, {"samples_per_sec", m.samplesPerSec}, {"seconds", m.seconds},
                         {"worker", m.stamp.lane.worker}};
        for (const char* k : {"accuracy", "val_loss", "val_accuracy"})
            if (m.metrics.count(k)) j[k] = m.metrics.at(k);
        if (o.json) {
            std::cout << j.dump() << "\n";
        } else {
            std::string line = "Epoch " + std::to_string(m.epoch) + ": loss " + fixed4(loss);
            for (const char* k : {"accuracy", "val_loss", "val_accuracy"})
                if (m.metrics.count(k)) line += std::string(" ") + k + " " + fixed4(m.metrics.at(k));
            std::printf("%s | %.0f samples/s\n", line.c_str(), m.samplesPerSec);
        }
        std::fflush(stdout);
    });
    printWarnings();
    bus.unsubscribe(warnings);
    // A cancelled run keeps its weights so far, as a local run does; the record lists them (in
    // the run's folder when no --save-weights names a file).
    if (result.ok() && !c.finalWeights().empty()) {
        const auto meta = ts::weightsMetadata(modelName, result->steps);
        ts::Status saved = saveWeights.empty() ? ts::okStatus() : ts::writeSafetensors(saveWeights, c.finalWeights(), meta);
        if (!saved.ok()) result = saved.error();
        else if (recording) recording->keepWeights(c.finalWeights(), meta, saveWeights, result->steps);
    } else if (result.ok() && !saveWeights.empty()) {
        printError(ts::makeError(ts::ErrorCode::Internal, "no weights came back from the cluster: " + saveWeights + " was not written",
                                 "the run's log says why (trainstudio-cli runs show RUN)"));
    }
    if (recording) {
        recording->setDevices(c.devices());
        recording->fitDone(result);
    }
    if (traceSink) finishTraceFile(*traceSink, o, recording);
    if (!result.ok()) {
        printError(result.error());
        return c.refused() ? 2 : 1;  // a task refused the run's model, data, weights or settings: bad input, as locally
    }
    const ts::FitResult& fit = *result;
    if (fit.cancelled) {
        if (o.json) std::cout << nlohmann::json{{"final", true}, {"cancelled", true}, {"steps", fit.steps}, {"run_id", runId}}.dump() << "\n";
        else if (!o.quiet) {
            std::printf("Cancelled after %lld step(s); every task was stopped\n", static_cast<long long>(fit.steps));
            if (recording) std::printf("Recorded as cancelled run %s in %s\n", recording->runId().c_str(), recording->databasePath().c_str());
        }
        return tscli::kInterruptedExitCode;
    }
    if (o.json) {
        nlohmann::json j = {{"final", true}, {"epochs", fit.epochs}, {"steps", fit.steps}, {"loss", fit.last.loss},
                            {"accuracy", std::isfinite(fit.last.accuracy) ? nlohmann::json(fit.last.accuracy) : nlohmann::json(nullptr)},
                            {"samples_per_sec", fit.samplesPerSec}, {"seconds", fit.seconds},
                            {"strategy", strategy}, {"workers", c.numTasks()}, {"run_id", runId},
                            {"restarts", c.restarts()}, {"rejoins", c.rejoins()}};
        if (std::isfinite(fit.last.valAccuracy)) j["val_accuracy"] = fit.last.valAccuracy;
        if (std::isfinite(fit.last.valLoss)) j["val_loss"] = fit.last.valLoss;
        if (ps) {
            j["workers"] = c.spec().count("worker");
            j["ps"] = c.spec().count("ps");
        }
        if (!c.summary().empty()) j["tasks"] = c.summary();  // per task, the evaluator's, losses, rejoins
        std::cout << j.dump() << "\n";
    } else if (!o.quiet) {
        std::printf("Trained %lld step(s) on %s in %.1fs: %.0f samples/s\n", static_cast<long long>(fit.steps), where.c_str(), fit.seconds,
                    fit.samplesPerSec);
        const nlohmann::json summary = c.summary();
        if (c.restarts() > 0)
            std::printf("Restarted %d time(s), each time from %s backup\n", c.restarts(), ps ? "worker 0's" : "the chief's");
        if (summary.contains("lost"))
            for (const auto& l : summary["lost"])
                std::printf("Went on without %s after its step %lld (%s): the other workers trained its steps\n",
                            l.value("task", "").c_str(), static_cast<long long>(l.value("after_step", int64_t{0})), l.value("reason", "").c_str());
        if (summary.contains("evaluator_lost"))
            std::printf("%s was lost at epoch %lld: %s\n", summary["evaluator_lost"].value("task", "").c_str(),
                        static_cast<long long>(summary["evaluator_lost"].value("epoch", int64_t{0})),
                        summary["evaluator_lost"].value("instead", "").c_str());
        if (summary.contains("rejoined"))
            for (const auto& r : summary["rejoined"]) {
                if (r.contains("at_epoch"))  // the evaluator
                    std::printf("%s rejoined at epoch %lld with a new task and evaluated again from then\n", r.value("task", "").c_str(),
                                static_cast<long long>(r.value("at_epoch", int64_t{0})));
                else
                    std::printf("%s rejoined at step %lld with a new task\n", r.value("task", "").c_str(),
                                static_cast<long long>(r.value("at_step", int64_t{0})));
            }
        if (std::isfinite(fit.last.valAccuracy)) {
            const std::string by = summary.contains("evaluation") ? summary["evaluation"].value("by", "") : "";
            std::printf("Test accuracy of the final weights: %.4f (loss %.4f)%s\n", fit.last.valAccuracy, fit.last.valLoss,
                        by.empty() || by == "coordinator" ? "" : (", evaluated by " + by).c_str());
        }
    }
    return recordedLine(recording, o);
}

} // namespace tscli
