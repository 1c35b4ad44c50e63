// `train --strategy multi-worker-mirrored` as a TF_CONFIG cluster's evaluator task (TF's
// side-car evaluator). The process serves the Worker control service at this task's TF_CONFIG
// address; the chief starts the evaluator task on it and sends its weights after each epoch
// (remote/sidecar_evaluation.h), and the daemon evaluates them on this machine's test split
// (--data, else the run's). It serves until the run completes (exit 0), its task fails (1), or
// no chief starts a task within --collective-timeout, at first or after one stopped (1).

#include "evaluator_task.h"

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <optional>
#include <utility>

#include "interrupt.h"
#include "remote/auth.h"
#include "remote/sidecar_evaluation.h"
#include "remote/worker_service.h"
#include "telemetry/bus.h"
#include "telemetry/events.h"
#include "telemetry/tracer.h"
#include "train/run_config.h"

namespace tscli {

int runEvaluatorTask(const TrainOptions& o, const ts::ClusterSpec& spec)
{
    auto token = ts::remote::loadToken(o.tokenFile);
    if (!token.ok()) {
        printError(token.error());
        return 2;
    }
    const std::string self = spec.task().toString();
    const std::string address = *spec.address(spec.task());
    const ts::TaskId chief = spec.coordinator();
    const std::string chiefText = chief.toString() + " at " + *spec.address(chief);

    // What the daemon says about its tasks. A task that fails at once may end before its
    // "running" arrives, so starts and ends are counted.
    struct TaskEnd {
        std::string state, message, hint;
    };
    std::mutex mutex;
    std::condition_variable cv;
    int starts = 0, ends = 0;
    TaskEnd last;
    ts::remote::WorkerOptions wo;
    wo.listen = address;
    wo.allowRemote = true;  // the address is TF_CONFIG's, as the chief's rendezvous binds its own
    wo.token = *token;
    wo.name = self + " (" + address + ")";
    wo.onlyTaskType = "evaluator";
    wo.dataDir = o.data;
    wo.onTaskState = [&](const std::string& state, const std::string& message, const std::string& hint) {
        std::lock_guard lock(mutex);
        if (state == "running") {
            ++starts;
        } else {
            ++ends;
            last = TaskEnd{state, message, hint};
        }
        cv.notify_all();
    };
    tscli::InterruptScope interrupt;
    interrupt.setAction([&] {
        std::lock_guard lock(mutex);
        cv.notify_all();
    });
    auto daemon = ts::remote::WorkerDaemon::start(wo);
    if (!daemon.ok()) {
        ts::Error e = daemon.takeError();
        e.message = self + ": " + e.message;
        printError(e);
        return 2;
    }
    const auto wait = std::chrono::milliseconds(static_cast<int64_t>(o.collectiveTimeout * 1000));
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, "%g s", o.collectiveTimeout);
    const std::string waitText = std::string("up to ") + seconds;
    if (!o.quiet)
        std::fprintf(stderr, "%s evaluates the run's weights after each epoch: waiting %s for %s to start it\n", wo.name.c_str(),
                     waitText.c_str(), chiefText.c_str());
    // Until the run completes: a chief that stopped its task (cancelled, or to replace it) or
    // went away may start another (a restarted chief, say), within --collective-timeout.
    struct Outcome {
        int code;
        std::optional<ts::Error> error;
        std::string note;  // stderr, unless --quiet
    };
    std::optional<Outcome> outcome;
    int handled = 0;  // task ends seen
    std::unique_lock lock(mutex);
    while (!outcome) {
        const bool came = cv.wait_for(lock, wait, [&] { return starts > handled || ends > handled || interrupt.interrupted(); });
        if (came) cv.wait(lock, [&] { return ends > handled || interrupt.interrupted(); });
        if (interrupt.interrupted()) {
            outcome = Outcome{kInterruptedExitCode, {}, {}};
            continue;
        }
        if (!came) {
            const std::string what = handled == 0 ? " did not start an evaluation within " : " did not start the evaluation again within ";
            outcome = Outcome{1,
                              ts::makeError(ts::ErrorCode::IoError, self + ": " + chiefText + what + seconds,
                                            handled == 0 ? "start the chief too (the same command with its TF_CONFIG), or give it longer with --collective-timeout"
                                                         : "see the chief's output: its run was stopped, or failed"),
                              {}};
            continue;
        }
        handled = ends;
        if (last.state == "completed") {
            // With a message: the chief's run gives it nothing to evaluate.
            outcome = Outcome{0, {}, last.message.empty() ? self + ": the run completed" : last.message};
        } else if (last.state == "failed") {
            // A task that failed at once: the chief's event stream may not be open yet. Serve a
            // moment longer, so the chief hears why (and evaluates itself) instead of finding
            // nobody there.
            const TaskEnd end = last;
            cv.wait_for(lock, std::chrono::seconds(3), [&] { return interrupt.interrupted(); });
            outcome = Outcome{1,
                              ts::makeError(ts::ErrorCode::IoError, self + ": " + end.message,
                                            end.hint.empty() ? std::string("the chief evaluates on its own test split instead") : end.hint),
                              {}};
        } else if (!o.quiet) {
            std::fprintf(stderr, "%s: %s %s; waiting %s for it to start the evaluation again\n", self.c_str(), chiefText.c_str(),
                         last.state == "left" ? "went away (it died, or was cut off)" : "stopped the evaluation", waitText.c_str());
        }
    }
    lock.unlock();
    (*daemon)->shutdown();
    if (outcome->error) printError(*outcome->error);
    if (!outcome->note.empty() && !o.quiet) std::fprintf(stderr, "%s\n", outcome->note.c_str());
    return outcome->code;
}

namespace {

// How the chief (this process's task in `spec`) reaches the evaluator.
ts::Result<ts::remote::SidecarOptions> sidecarOptions(const ts::ClusterSpec& spec, const TrainOptions& o)
{
    ts::remote::SidecarOptions so;
    TS_ASSIGN(so.token, ts::remote::loadToken(o.tokenFile));
    // The evaluator task's own id (the recorded run's is not made yet).
    so.runId = unrecordedRunId("eval");
    so.who = spec.task().toString() + " (" + *spec.address(spec.task()) + ")";
    so.connectTimeout = std::chrono::milliseconds(static_cast<int64_t>(o.collectiveTimeout * 1000));
    return so;
}

} // namespace

ts::Result<std::unique_ptr<EvaluatorSide>> EvaluatorSide::start(const ts::RunConfig& cfg, const ts::ClusterSpec& spec, const TrainOptions& o,
                                                                 ts::telemetry::EventBus& bus)
{
    TS_ASSIGN(const ts::remote::SidecarOptions so, sidecarOptions(spec, o));
    std::unique_ptr<EvaluatorSide> side(new EvaluatorSide(o, bus));
    EvaluatorSide* self = side.get();
    TS_ASSIGN(side->m_evaluation, ts::remote::SidecarEvaluation::create(
                                      cfg, spec, so,
                                      [self](const ts::remote::SidecarResult& r) { self->evaluated(r); },
                                      [self](const std::string& line) { self->warn(line); }));
    if (!o.quiet && !o.json)
        std::printf("The cluster's evaluator (%s) validates each epoch; the training tasks do not\n", spec.addresses("evaluator").front().c_str());
    return side;
}

EvaluatorSide::EvaluatorSide(const TrainOptions& o, ts::telemetry::EventBus& bus) : m_o(o), m_bus(bus) {}
EvaluatorSide::~EvaluatorSide()
{
    m_evaluation.reset();  // first: its thread's callbacks use the members below
}

void EvaluatorSide::recordInto(const std::string& runId)
{
    std::lock_guard lock(m_mutex);
    m_runId = runId;
}

void EvaluatorSide::epochDone(ts::Trainer& trainer, const ts::EpochEvent& e)
{
    auto bytes = trainer.encodeWeights("the chief's weights after epoch " + std::to_string(e.epoch));
    {
        std::lock_guard lock(m_mutex);
        Epoch& ep = m_epochs[e.epoch] = Epoch{e, trainer.globalStep(), ts::telemetry::wallNowMicros(), 0, {}};
        // Numbered under the lock: the result may come back before submit() returns.
        if (bytes.ok()) ep.submission = m_evaluation->submit(e.epoch, std::move(bytes).value());
    }
    if (!bytes.ok()) warn("epoch " + std::to_string(e.epoch) + " is not evaluated: " + bytes.error().message);
}

// On the evaluation's helper thread.
void EvaluatorSide::evaluated(const ts::remote::SidecarResult& r)
{
    const int64_t epoch = r.epoch;
    const std::string& by = r.by;
    const ts::EvalResult* v = r.value ? &*r.value : nullptr;
    ts::telemetry::EpochMetricsEvent m;
    bool record = false;
    {
        // Weights of an attempt that failed after this epoch, which the restarted run replayed:
        // its own weights are being evaluated (or were skipped for newer ones).
        std::lock_guard lock(m_mutex);
        auto it = m_epochs.find(epoch);
        if (it == m_epochs.end() || it->second.submission != r.submission) return;
        if (v) {
            record = !m_runId.empty();
            Epoch& ep = it->second;
            ep.value = *v;
            // The whole epoch again (the store replaces its row by name), now with its validation.
            m.stamp = ts::telemetry::Stamp{m_runId, ep.step, ep.wallUs, {}};
            m.epoch = epoch;
            m.metrics = {{"loss", ep.event.loss}, {"accuracy", ep.event.accuracy}, {"val_loss", v->loss}, {"val_accuracy", v->accuracy}};
            m.seconds = ep.event.seconds;
            m.samplesPerSec = ep.event.samplesPerSec;
        }
    }
    if (!v) {
        warn("epoch " + std::to_string(epoch) + " could not be evaluated: " + r.error.toString());
        return;
    }
    if (record) m_bus.publish(ts::telemetry::Event(std::move(m)));
    if (m_o.quiet) return;
    std::string line;
    if (m_o.json) {
        line = nlohmann::json{{"evaluation", true}, {"epoch", epoch}, {"val_loss", v->loss}, {"val_accuracy", v->accuracy},
                              {"examples", v->examples}, {"by", by}}.dump() + "\n";
    } else {
        char buf[256];
        std::snprintf(buf, sizeof buf, "Epoch %lld evaluated by %s: val_loss %.4f val_accuracy %.4f (%lld examples)\n",
                      static_cast<long long>(epoch), by.c_str(), v->loss, v->accuracy, static_cast<long long>(v->examples));
        line = buf;
        clearProgressLine();
    }
    std::fputs(line.c_str(), stdout);  // one call: whole lines between the fit thread's
    std::fflush(stdout);
}

void EvaluatorSide::warn(const std::string& line)
{
    if (!m_o.quiet) std::fprintf(stderr, "warning: %s\n", line.c_str());
    ts::telemetry::LogEvent e;
    {
        std::lock_guard lock(m_mutex);
        if (m_runId.empty()) return;  // not recorded
        e.stamp.runId = m_runId;
    }
    e.stamp.wallTimeUs = ts::telemetry::wallNowMicros();
    e.level = ts::telemetry::LogLevel::Warning;
    e.message = line;
    m_bus.publish(ts::telemetry::Event(std::move(e)));
}

void EvaluatorSide::cancel() { m_evaluation->cancel(); }

UnusedEvaluator::UnusedEvaluator(const ts::RunConfig& cfg, const ts::ClusterSpec& spec, const TrainOptions& o)
{
    auto so = sidecarOptions(spec, o);
    if (!so.ok()) return;  // no token: the chief's own connections say so
    m_done = m_released.get_future();
    m_thread = std::thread([this, cfg, spec, so = std::move(so).value()] {
        (void)ts::remote::releaseUnusedEvaluator(cfg, spec, so, m_stop);
        m_released.set_value();
    });
}

void UnusedEvaluator::finish()
{
    if (m_done.valid()) m_done.wait_for(std::chrono::seconds(3));
}

UnusedEvaluator::~UnusedEvaluator()
{
    m_stop = true;
    if (m_thread.joinable()) m_thread.join();
}

void EvaluatorSide::finish(ts::Result<ts::FitResult>& result, bool interrupted)
{
    const bool completed = result.ok() && !result->cancelled && !interrupted;
    m_summary = m_evaluation->finish(completed ? "done" : !result.ok() ? "failed" : "");
    if (!result.ok()) return;
    std::lock_guard lock(m_mutex);
    auto it = m_epochs.find(result->last.epoch);
    if (it != m_epochs.end() && it->second.value) {
        result->last.valLoss = it->second.value->loss;
        result->last.valAccuracy = it->second.value->accuracy;
    }
}

} // namespace tscli
