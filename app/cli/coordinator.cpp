// trainstudio-cli train --cluster FILE: this process coordinates a multi-worker-mirrored run on
// trainstudio-worker daemons. Pre-flight (every task's worker answers, same version), then
// every task is started, their event streams are merged into one recorded run, and a worker
// that dies or goes silent stops the run with an error naming it.

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <iostream>
#include <mutex>
#include <optional>
#include <thread>

#include "commands.h"
#include "distribute/cluster_spec.h"
#include "store/recording.h"
#include "remote/auth.h"
#include "remote/worker_client.h"
#include "telemetry/bus.h"
#include "telemetry/tracer.h"
#include "train/run_config.h"

namespace tscli {
namespace {

using namespace std::chrono_literals;
namespace tm = ts::telemetry;

void printError(const ts::Error& e)
{
    std::cerr << "error: " << e.message << "\n";
    if (!e.hint.empty()) std::cerr << "hint: " << e.hint << "\n";
}

struct Task {
    ts::TaskId id;
    std::string address, label;
    std::unique_ptr<ts::remote::WorkerClient> client;
    std::thread stream;
    std::string state = "starting";  // last state the worker reported
    bool ended = false;              // its stream closed
};

// Everything the stream and heartbeat threads tell the main thread, in arrival order.
struct Inbox {
    std::mutex mutex;
    std::condition_variable cv;
    std::deque<std::pair<std::size_t, ts::remote::WorkerEvent>> events;  // (task, event)
    std::vector<std::pair<std::size_t, ts::Error>> failures;
    std::vector<bool> ended;
};

} // namespace

int runCoordinated(const TrainOptions& o, ts::RunConfig cfg, TrainRecording* recording)
{
    auto spec = ts::ClusterSpec::fromFile(o.cluster);
    if (!spec.ok()) {
        printError(spec.error());
        return 2;
    }
    if (auto st = spec->validateFor("multi-worker-mirrored"); !st.ok()) {
        printError(st.error());
        return 2;
    }
    auto token = ts::remote::loadToken(o.tokenFile);
    if (!token.ok()) {
        printError(token.error());
        return 2;
    }
    if (!cfg.modelFile.empty()) {
        auto m = ts::loadModelFile(cfg.modelFile);
        if (!m.ok()) {
            printError(m.error());
            return 2;
        }
        cfg.model = std::move(m).value();
        cfg.modelFile.clear();
    }
    if (!cfg.saveWeights.empty() || !cfg.loadWeights.empty()) {
        printError(ts::makeError(ts::ErrorCode::InvalidArgument, "--save-weights/--load-weights are not available with --cluster yet",
                                 "workers write no files the coordinator names; train with --tf-config on each machine to keep weights"));
        return 2;
    }
    cfg.strategy.kind = "multi-worker-mirrored";

    // Pre-flight: every task's worker answers with our version before anything starts.
    std::vector<Task> tasks;
    for (const auto& id : spec->trainingTasks()) {
        Task t;
        t.id = id;
        t.address = *spec->address(id);
        t.label = id.toString() + " at " + t.address;
        ts::remote::TlsFiles tls;
        tls.rootCa = o.tlsCa;
        auto c = ts::remote::WorkerClient::connect(t.label, t.address, *token, tls);
        if (!c.ok()) {
            printError(c.error());
            return 2;
        }
        t.client = std::move(c).value();
        tasks.push_back(std::move(t));
    }
    for (auto& t : tasks) {
        auto who = t.client->identify(3s);
        if (!who.ok()) {
            ts::Error e = who.takeError();
            e.message = "pre-flight: " + e.message;
            printError(e);
            return 2;
        }
        if (who->version != TS_PROJECT_VERSION) {
            printError(ts::makeError(ts::ErrorCode::InvalidArgument,
                                     "pre-flight: " + t.label + " runs TrainStudio " + who->version + ", this coordinator " + TS_PROJECT_VERSION,
                                     "install the same version on every machine"));
            return 2;
        }
        if (who->state == "running") {
            printError(ts::makeError(ts::ErrorCode::InvalidArgument, "pre-flight: " + t.label + " is busy with another run",
                                     "wait for it, or cancel that run"));
            return 2;
        }
        if (!o.quiet && !o.json)
            std::printf("%s: %s (%s, pid %d, %zu device(s))\n", t.label.c_str(), who->worker.c_str(), who->hostname.c_str(), who->pid,
                        who->devices.size());
    }

    tm::EventBus bus;
    if (recording) recording->beginRemote(cfg, bus);
    const std::string runId = recording && !recording->runId().empty()
                                  ? recording->runId()
                                  : "run-" + std::to_string(::getpid()) + "-" + std::to_string(tm::wallNowMicros());
    auto stamp = [&](const std::string& worker, const std::string& device, int64_t step) {
        tm::Stamp s;
        s.runId = runId;
        s.step = step;
        s.wallTimeUs = tm::wallNowMicros();
        s.lane.worker = worker;
        s.lane.device = device;
        return s;
    };
    const nlohmann::json runConfig = cfg.toJson();
    Inbox inbox;
    inbox.ended.assign(tasks.size(), false);
    auto fail = [&](std::size_t i, ts::Error e) {
        std::lock_guard lock(inbox.mutex);
        inbox.failures.emplace_back(i, std::move(e));
        inbox.cv.notify_all();
    };

    // Start every task; a refusal cancels the ones already started.
    for (std::size_t i = 0; i < tasks.size(); ++i) {
        auto tf = spec->tfConfigFor(tasks[i].id);
        ts::Status st = tf.ok() ? tasks[i].client->startTask(runId, runConfig, *tf, tasks[i].id.type, tasks[i].id.index) : ts::Status(tf.error());
        if (!st.ok()) {
            for (std::size_t k = 0; k < i; ++k) (void)tasks[k].client->cancel(runId);
            bus.publish(tm::Event(tm::ErrorEvent{stamp(tasks[i].id.toString(), "", 0), st.error().message, st.error().hint, tasks[i].label}));
            if (recording) recording->fitDone(ts::Result<ts::FitResult>(st.error()));
            printError(st.error());
            return 1;
        }
    }
    bus.publish(tm::Event(tm::RunStateEvent{stamp("coordinator", "", 0), tm::RunState::Running, {}}));
    if (!o.quiet && !o.json) std::printf("Started run %s on %zu worker(s)\n", runId.c_str(), tasks.size());
    std::fflush(stdout);

    for (std::size_t i = 0; i < tasks.size(); ++i)
        tasks[i].stream = std::thread([&, i] {
            ts::Status st = tasks[i].client->streamEvents(runId, [&](const ts::remote::WorkerEvent& e) {
                std::lock_guard lock(inbox.mutex);
                inbox.events.emplace_back(i, e);
                inbox.cv.notify_all();
            });
            std::lock_guard lock(inbox.mutex);
            inbox.ended[i] = true;
            if (!st.ok() && st.error().code != ts::ErrorCode::Cancelled) inbox.failures.emplace_back(i, st.takeError());
            inbox.cv.notify_all();
        });
    // Heartbeats: a worker that has not answered for 3 s is gone (its stream may not notice a
    // machine that vanished without closing its sockets).
    std::atomic<bool> stopBeats{false};
    std::thread beats([&] {
        std::vector<std::chrono::steady_clock::time_point> lastSeen(tasks.size(), std::chrono::steady_clock::now());
        std::vector<bool> reported(tasks.size(), false);
        while (!stopBeats) {
            for (std::size_t i = 0; i < tasks.size() && !stopBeats; ++i) {
                if (reported[i]) continue;
                auto p = tasks[i].client->heartbeat(1s);
                const auto now = std::chrono::steady_clock::now();
                if (p.ok()) lastSeen[i] = now;
                else if (now - lastSeen[i] > 3s) {
                    reported[i] = true;
                    fail(i, ts::makeError(ts::ErrorCode::IoError, tasks[i].label + " stopped responding (no heartbeat for 3 s): " + p.error().message,
                                          "check that machine and its trainstudio-worker; then start the run again"));
                }
            }
            for (int k = 0; k < 5 && !stopBeats; ++k) std::this_thread::sleep_for(100ms);
        }
    });

    // The main loop: record the merged stream (the chief's metrics are the run's: every worker
    // reports the same global ones), print the chief's epochs, stop at the first failure.
    std::optional<ts::Error> failure;
    ts::FitResult fit;
    bool anyCancelled = false;
    std::unique_lock lock(inbox.mutex);
    for (;;) {
        inbox.cv.wait(lock, [&] {
            if (!inbox.events.empty() || !inbox.failures.empty()) return true;
            for (bool e : inbox.ended)
                if (!e) return false;
            return true;
        });
        while (!inbox.events.empty()) {
            auto [i, e] = std::move(inbox.events.front());
            inbox.events.pop_front();
            lock.unlock();
            const bool chief = i == 0;
            const auto& f = e.fields;
            if (e.kind == "state") {
                tasks[i].state = f.value("state", "");
                bus.publish(tm::Event(tm::LogEvent{stamp(e.worker, e.device, e.step), tm::LogLevel::Info, tasks[i].label + ": " + tasks[i].state}));
                if (tasks[i].state == "cancelled") anyCancelled = true;
            } else if (e.kind == "error") {
                ts::Error err = ts::makeError(ts::ErrorCode::Internal, tasks[i].label + ": " + f.value("message", ""), f.value("hint", ""));
                bus.publish(tm::Event(tm::ErrorEvent{stamp(e.worker, e.device, e.step), err.message, err.hint, tasks[i].label}));
                if (!failure) failure = err;
            } else if (e.kind == "step" && chief) {
                tm::StepMetricsEvent m;
                m.stamp = stamp(e.worker, e.device, e.step);
                m.epoch = f.value("epoch", int64_t{0});
                m.loss = f.value("loss", 0.0);
                m.metrics["accuracy"] = f.value("accuracy", 0.0);
                m.samplesPerSec = f.value("samples_per_sec", 0.0);
                m.learningRate = f.value("learning_rate", 0.0);
                bus.publish(tm::Event(std::move(m)));
            } else if (e.kind == "epoch" && chief) {
                tm::EpochMetricsEvent m;
                m.stamp = stamp(e.worker, e.device, e.step);
                m.epoch = f.value("epoch", int64_t{0});
                for (const char* k : {"loss", "accuracy", "val_loss", "val_accuracy"})
                    if (f.contains(k)) m.metrics[k] = f[k].get<double>();
                m.seconds = f.value("seconds", 0.0);
                m.samplesPerSec = f.value("samples_per_sec", 0.0);
                bus.publish(tm::Event(std::move(m)));
                fit.epochs = m.epoch;
                fit.last.epoch = m.epoch;
                fit.last.loss = f.value("loss", 0.0);
                fit.last.accuracy = f.value("accuracy", 0.0);
                if (!o.quiet) {
                    if (o.json) std::cout << nlohmann::json{{"epoch", m.epoch}, {"loss", fit.last.loss}, {"accuracy", fit.last.accuracy}, {"worker", e.worker}}.dump() << "\n";
                    else std::printf("Epoch %lld: loss %.4f accuracy %.4f | %.0f samples/s\n", static_cast<long long>(m.epoch), fit.last.loss,
                                     fit.last.accuracy, m.samplesPerSec);
                    std::fflush(stdout);
                }
            } else if (e.kind == "sample") {
                // Every worker's devices, each on its own lane.
                tm::DeviceSampleEvent d;
                d.stamp = stamp(e.worker, e.device == "host" ? std::string() : e.device, e.step);
                d.utilisation = f.value("utilisation", -1.0);
                if (f.contains("per_core") && f["per_core"].is_array()) d.perCore = f["per_core"].get<std::vector<double>>();
                d.processCpu = f.value("process_cpu", -1.0);
                d.memoryUsed = f.value("memory_used", uint64_t{0});
                d.memoryTotal = f.value("memory_total", uint64_t{0});
                d.temperatureC = f.value("temperature_c", -1.0);
                d.powerW = f.value("power_w", -1.0);
                bus.publish(tm::Event(std::move(d)));
            } else if (e.kind == "breakdown" && chief) {
                tm::StepBreakdownEvent b;
                b.stamp = stamp(e.worker, e.device, e.step);
                b.stepSeconds = f.value("step_seconds", 0.0);
                b.input = f.value("input", 0.0);
                b.forward = f.value("forward", 0.0);
                b.backward = f.value("backward", 0.0);
                b.communication = f.value("communication", 0.0);
                b.optimizer = f.value("optimizer", 0.0);
                b.other = f.value("other", 0.0);
                bus.publish(tm::Event(std::move(b)));
            } else if (e.kind == "final" && chief) {
                fit.steps = f.value("steps", int64_t{0});
                fit.samplesPerSec = f.value("samples_per_sec", 0.0);
                fit.seconds = f.value("seconds", 0.0);
            }
            lock.lock();
        }
        if (!inbox.failures.empty() && !failure) failure = inbox.failures.front().second;
        bool allEnded = true;
        for (bool e : inbox.ended) allEnded = allEnded && e;
        if (failure || allEnded) break;
    }
    lock.unlock();
    stopBeats = true;
    beats.join();
    if (failure) {
        // Stop the others: they would wait for the failed one until their collective timeout.
        for (auto& t : tasks) (void)t.client->cancel(runId);
    }
    for (auto& t : tasks) {
        if (failure) t.client->cancelStream();
        t.stream.join();
    }
    if (!failure)
        for (auto& t : tasks)
            if (t.state != "completed" && t.state != "cancelled") {
                failure = ts::makeError(ts::ErrorCode::Internal, t.label + ": the task ended in state '" + t.state + "'");
                break;
            }
    fit.cancelled = anyCancelled && !failure;
    ts::Result<ts::FitResult> result = failure ? ts::Result<ts::FitResult>(*failure) : ts::Result<ts::FitResult>(fit);
    if (failure) bus.publish(tm::Event(tm::ErrorEvent{stamp("coordinator", "", 0), failure->message, failure->hint, "coordinator"}));
    bus.publish(tm::Event(tm::RunStateEvent{stamp("coordinator", "", fit.steps), failure ? tm::RunState::Failed : tm::RunState::Completed,
                                            failure ? failure->message : std::string()}));
    if (recording) recording->fitDone(result);
    if (failure) {
        printError(*failure);
        return 1;
    }
    if (o.json) {
        nlohmann::json j = {{"final", true}, {"epochs", fit.epochs}, {"steps", fit.steps}, {"loss", fit.last.loss},
                            {"accuracy", fit.last.accuracy}, {"samples_per_sec", fit.samplesPerSec}, {"seconds", fit.seconds},
                            {"strategy", "multi-worker-mirrored"}, {"workers", tasks.size()}, {"run_id", runId}};
        std::cout << j.dump() << "\n";
    } else if (!o.quiet) {
        std::printf("Trained %lld step(s) on %zu worker(s) in %.1fs: %.0f samples/s\n", static_cast<long long>(fit.steps), tasks.size(),
                    fit.seconds, fit.samplesPerSec);
        if (recording) std::printf("Recorded as run %s in %s\n", recording->runId().c_str(), recording->databasePath().c_str());
    }
    return 0;
}

} // namespace tscli
