#include "remote/coordinator.h"

#include "train/backup.h"

#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <cmath>
#include <limits>
#include <map>
#include <filesystem>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include "common/json_document.h"
#include "data/dataset.h"
#include "io/safetensors.h"
#include "remote/evaluator_link.h"
#include "remote/ps_client.h"
#include "remote/run_evaluator.h"
#include "remote/task_telemetry.h"
#include "telemetry/bus.h"
#include "telemetry/events.h"
#include "telemetry/tracer.h"
#include "train/run_config.h"

namespace ts::remote {

using namespace std::chrono_literals;
namespace tm = ts::telemetry;

struct Coordinator::Task {
    TaskId id;
    bool ps = false;                 // a parameter-server run's ps task
    std::string address, label;
    std::unique_ptr<WorkerClient> client;
    std::thread stream;
    std::string state = "starting";  // last state the worker reported
};

namespace {

// A task's error that only says the chief's error tells why (trainer.h).
bool pointsAtChief(const Error& e)
{
    return e.message.find(kChiefCouldNotRestore) != std::string::npos;
}

// A task's "error" event as the run's error. A refusal of the run's model, data or settings is
// bad input: not restarted (it would be refused again), and the CLI exits 2 for it. Otherwise
// the task's own code decides whether a restart could get past it (restartableFailure): a data
// error found mid-epoch is not restarted either, while a peer lost or an I/O error is. Not a
// task's "cancelled": this coordinator knows its own cancels, and a peer of a task stopped on
// its machine (its daemon shut down) reads that stop as a cancel, which must stay restartable.
Error taskError(const std::string& label, const nlohmann::json& fields)
{
    ErrorCode code = ErrorCode::Internal;
    if (fields.value("refused", false)) code = ErrorCode::InvalidArgument;
    else if (auto named = errorCodeFromName(fields.value("code", "")); named && *named != ErrorCode::Cancelled) code = *named;
    return makeError(code, label + ": " + fields.value("message", ""), fields.value("hint", ""));
}

// Whether `err` (refused: a task's refusal) becomes the run's failure instead of `failure`: the
// chief's own reason replaces a task's pointer to it, and a refusal or an error no restart gets
// past (the cause: a data error found mid-epoch) the error it caused on a peer (its collective
// broken, which alone would be restarted), whichever arrived first.
bool replacesFailure(const std::optional<Error>& failure, bool failureRefused, const Error& err, bool refused)
{
    if (!failure || (pointsAtChief(*failure) && !pointsAtChief(err)) || (refused && !failureRefused)) return true;
    return !restartableFailure(err) && err.code != ErrorCode::Cancelled && restartableFailure(*failure);
}

// A safetensors file's bytes as its "weights" parts arrive, in order on one task's stream:
// anything else (a part missing, repeated, or of another count) is a broken sender, and the
// bytes are not used rather than used damaged.
struct WeightParts {
    std::string bytes;
    int64_t got = 0;        // parts so far; -1: broken
    int64_t expected = -1;  // the parts announced
    void add(int64_t part, int64_t parts, const std::string& payload)
    {
        if (part == got && parts > 0 && (expected < 0 || parts == expected)) {
            expected = parts;
            bytes += payload;
            ++got;
        } else {
            got = -1;
        }
    }
    bool complete() const { return got > 0 && got == expected; }
    void clear() { *this = {}; }
};

// Everything the stream and heartbeat threads tell run()'s loop, in arrival order.
struct Inbox {
    std::mutex mutex;
    std::condition_variable cv;
    std::deque<std::pair<std::size_t, WorkerEvent>> events;  // (task, event)
    std::vector<std::pair<std::size_t, Error>> failures;
    std::vector<bool> ended;
    std::vector<bool> silent;  // stopped answering heartbeats: its stream may never end
    std::set<std::size_t> comeback;  // parameter-server: lost workers whose daemons answer again
    // Each task's clock minus ours, from the heartbeat with the shortest round trip so far.
    std::vector<int64_t> clockOffsetUs, clockRoundTripUs;
    void noteClock(std::size_t i, const WorkerPulse& p)
    {
        if (p.roundTripUs <= 0 || p.roundTripUs >= clockRoundTripUs[i]) return;
        clockRoundTripUs[i] = p.roundTripUs;
        clockOffsetUs[i] = significantClockOffset(p.clockOffsetUs, p.roundTripUs);
    }
    bool allEnded() const
    {
        for (bool e : ended)
            if (!e) return false;
        return true;
    }
    // Every stream has ended but those of tasks that went silent.
    bool allAnsweringEnded() const
    {
        for (std::size_t i = 0; i < ended.size(); ++i)
            if (!ended[i] && !silent[i]) return false;
        return true;
    }
};

} // namespace

bool Coordinator::supportsStrategy(const std::string& kind)
{
    return kind == "multi-worker-mirrored" || isParameterServer(kind);
}

bool Coordinator::supportsStrategy(const std::string& kind, const ClusterSpec& spec)
{
    return supportsStrategy(kind) && spec.validateFor(kind).ok();
}

Coordinator::Coordinator(CoordinatorOptions options, std::string strategy)
    : m_options(std::move(options)), m_strategy(std::move(strategy))
{
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    m_who = m_options.name + " on " + host + " (pid " + std::to_string(::getpid()) + ")";
}

Coordinator::~Coordinator()
{
    for (Task* t : everyTask())
        if (t->stream.joinable()) {
            t->client->cancelStream();
            t->stream.join();
        }
}

Result<std::unique_ptr<Coordinator>> Coordinator::create(CoordinatorOptions options, const std::string& strategy)
{
    if (!supportsStrategy(strategy))
        return makeError(ErrorCode::Unsupported, "remote workers cannot run the '" + strategy + "' strategy yet",
                         "choose multi-worker-mirrored or parameter-server for a cluster of trainstudio-worker daemons");
    if (auto st = options.spec.validateFor(strategy); !st.ok()) return st.error();
    const bool ps = isParameterServer(strategy);
    std::unique_ptr<Coordinator> c(new Coordinator(std::move(options), ps ? "parameter-server" : strategy));
    std::vector<TaskId> ids;
    if (ps) {
        // The ps tasks start first (the workers pull from them), then the workers.
        for (int i = 0; i < c->m_options.spec.count("ps"); ++i) ids.push_back({"ps", i});
        for (int i = 0; i < c->m_options.spec.count("worker"); ++i) ids.push_back({"worker", i});
    } else {
        ids = c->m_options.spec.trainingTasks();
    }
    // TF's side-car evaluator: it evaluates a parameter-server run's weights (pulled from the ps
    // tasks) or a multi-worker-mirrored chief's after each epoch (sent through here), off the
    // training tasks' path.
    if (c->m_options.useEvaluator && c->m_options.spec.count("evaluator") > 0) ids.push_back({"evaluator", 0});
    for (const auto& id : ids) {
        auto t = std::make_unique<Task>();
        t->id = id;
        t->ps = id.type == "ps";
        t->address = *c->m_options.spec.address(id);
        t->label = id.toString() + " at " + t->address;
        auto client = WorkerClient::connect(t->label, t->address, c->m_options.token, c->m_options.tls);
        if (!client.ok()) return client.error();
        t->client = std::move(client).value();
        if (id.type == "evaluator") c->m_evaluator = std::move(t);
        else c->m_tasks.push_back(std::move(t));
    }
    return c;
}

std::vector<Coordinator::Task*> Coordinator::tasksWith(Task* evaluator) const
{
    std::vector<Task*> all;
    for (const auto& t : m_tasks) all.push_back(t.get());
    if (evaluator) all.push_back(evaluator);
    return all;
}

std::vector<TaskProbe> Coordinator::probe(std::chrono::milliseconds timeout, std::chrono::milliseconds connectPatience)
{
    // Ask all tasks at once: a cluster of unreachable machines costs one timeout, not one each.
    const std::vector<Task*> all = everyTask();
    std::vector<TaskProbe> probes(all.size());
    std::vector<std::thread> threads;
    for (std::size_t i = 0; i < all.size(); ++i)
        threads.emplace_back([&, i] {
            const Task& t = *all[i];
            TaskProbe& p = probes[i];
            p.id = t.id;
            p.address = t.address;
            p.label = t.label;
            // gRPC's catch-all "failed to connect to all addresses" (ours: "cannot connect to")
            // has come back, on a loaded machine, from a daemon that was already listening, for
            // 10 s of retries ("No such file or directory": gRPC 1.51 reads connect()'s errno
            // after other calls, grpc/grpc#35064, so a connect in progress can be taken for a
            // failure). Ask again on a connection of the probe's own (the shared one may wait out
            // a reconnect backoff, failing every call with the old error) until connectPatience
            // rather than fail a run on it. The same late errno can read as a refused connection
            // (a full ctest saw one from a daemon listening on another network namespace's
            // address): that is asked again within `timeout` only, so a daemon that is really
            // down is still reported within it. An unknown host is a definite answer, reported
            // at once. The task's own client is left alone: another thread may use it
            // (captureTrace).
            const auto start = std::chrono::steady_clock::now();
            const auto deadline = start + std::max(timeout, connectPatience);
            auto who = t.client->identify(timeout);
            std::unique_ptr<WorkerClient> own;
            for (;;) {
                if (who.ok() || who.error().code != ErrorCode::IoError) break;
                const bool catchAll = who.error().message.find("cannot connect to") != std::string::npos;
                const bool refused = who.error().message.find("nothing listens at") != std::string::npos;
                if (!catchAll && !(refused && std::chrono::steady_clock::now() < start + timeout - std::chrono::milliseconds(300))) break;
                const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    (catchAll ? deadline : start + timeout) - std::chrono::steady_clock::now());
                if (left < std::chrono::milliseconds(300)) break;
                std::this_thread::sleep_for(std::chrono::milliseconds(200));
                if (!own)
                    if (auto fresh = WorkerClient::connect(t.label, t.address, m_options.token, m_options.tls, /*ownConnection=*/true); fresh.ok())
                        own = std::move(fresh).value();
                who = (own ? own : t.client)->identify(std::min(timeout, left - std::chrono::milliseconds(200)));
            }
            if (!who.ok()) {
                p.problem = who.error().message;
                p.hint = who.error().hint;
                return;
            }
            p.identity = std::move(who).value();
            if (p.identity.version != TS_VERSION) {
                p.problem = t.label + " runs TrainStudio " + p.identity.version + ", this coordinator " + TS_VERSION;
                p.hint = "install the same version on every machine";
            } else if (p.identity.state == "shutting down") {
                p.problem = t.label + " is shutting down";
                p.hint = "start that trainstudio-worker again once it has stopped, or give this run another worker";
            } else if (p.identity.state == "running" || p.identity.reserved) {
                const std::string ago = elapsedText(p.identity.seconds);
                p.problem = t.label + (p.identity.reserved ? " is reserved for run " : " is busy with run ") + p.identity.runId +
                            (p.identity.reserved ? " by " : " for ") +
                            (p.identity.coordinator.empty() ? std::string("another coordinator") : p.identity.coordinator) +
                            (p.identity.reserved ? " (" + ago + " ago)" : " (started " + ago + " ago)");
                p.hint = "wait for that run to end (or stop it there), or give this run other workers";
            } else {
                p.ok = true;
            }
        });
    for (auto& th : threads) th.join();
    return probes;
}

Status Coordinator::preflight(std::chrono::milliseconds timeout, std::chrono::milliseconds connectPatience)
{
    // The evaluator is not needed to train: one that does not answer is skipped at the start (or
    // at a restart), with a warning on the run's bus naming it.
    for (const auto& p : probe(timeout, connectPatience))
        if (!p.ok && p.id.type != "evaluator") return makeError(ErrorCode::InvalidArgument, "pre-flight: " + p.problem, p.hint);
    return {};
}

Result<int> Coordinator::captureTrace(int64_t steps, bool layers)
{
    std::string taskRun;
    {
        std::lock_guard lock(m_wakeMutex);
        taskRun = m_taskRun;
    }
    if (taskRun.empty())
        return makeError(ErrorCode::InvalidArgument, "no run is training on the workers now", "capture while the run trains");
    if (m_options.trace)
        return makeError(ErrorCode::InvalidArgument, "this run traces every step already", "its spans are recorded with the run");
    int started = 0;
    std::string declined;
    std::lock_guard clients(m_clientsMutex);
    for (const auto& t : m_tasks) {
        if (t->ps) continue;  // no steps of their own; their spans come with a traced run
        std::string why;
        auto r = t->client->captureTrace(taskRun, steps, layers, &why);
        if (!r.ok()) declined += (declined.empty() ? "" : "; ") + r.error().message;
        else if (*r) ++started;
        else declined += (declined.empty() ? "" : "; ") + why;
    }
    if (started == 0)
        return makeError(ErrorCode::InvalidArgument, "no task could start the capture: " + declined, "try again once every task trains");
    return started;
}

void Coordinator::cancel()
{
    m_cancel = true;
    std::lock_guard lock(m_wakeMutex);
    if (m_wake) m_wake();
}

Result<FitResult> Coordinator::run(RunConfig cfg, const std::string& runId, tm::EventBus& bus,
                                   const std::function<void(const tm::EpochMetricsEvent&)>& onEpoch)
{
    cfg.strategy.kind = m_strategy;
    m_restarts = 0;
    m_rejoins = 0;
    // --load-weights: the tasks cannot read this machine's files, so the bytes travel with each
    // training task (checked here first, so a damaged file fails before any worker starts). In a
    // parameter-server run, worker 0's imported values become the ps tasks' initial values.
    m_initialWeights.clear();
    m_initialWeightsName = cfg.loadWeights;
    Status weightsOk = okStatus();
    if (!cfg.loadWeights.empty()) {
        auto bytes = readTextFile(cfg.loadWeights, "weights file");
        auto decoded = bytes.ok() ? decodeSafetensors(*bytes, cfg.loadWeights) : Result<SafetensorsFile>(bytes.error());
        if (decoded.ok()) m_initialWeights = std::move(bytes).value();
        else weightsOk = decoded.takeError();
        cfg.loadWeights.clear();
    }
    if (!weightsOk.ok()) {
        Error e = weightsOk.takeError();
        bus.publish(tm::Event(tm::ErrorEvent{taskStamp(runId, "coordinator", "", 0), e.message, e.hint, "coordinator"}));
        bus.publish(tm::Event(tm::RunStateEvent{taskStamp(runId, "coordinator", "", 0), tm::RunState::Failed, e.message}));
        return e;
    }
    if (Status ok = checkBackupConfig(cfg.backup); !ok.ok()) {
        Error e = ok.takeError();
        bus.publish(tm::Event(tm::ErrorEvent{taskStamp(runId, "coordinator", "", 0), e.message, e.hint, "coordinator"}));
        bus.publish(tm::Event(tm::RunStateEvent{taskStamp(runId, "coordinator", "", 0), tm::RunState::Failed, e.message}));
        return e;
    }
    const int allowed = cfg.backup.enabled() ? cfg.backup.restarts : 0;
    for (int attempt = 0;; ++attempt) {
        const std::string taskRun = attempt == 0 ? runId : runId + "/restart-" + std::to_string(attempt);
        // Lost parameter-server workers that rejoined (runAttempt) spend the same budget.
        auto r = runAttempt(cfg, runId, taskRun, bus, onEpoch, m_restarts + m_rejoins < allowed);
        if (!m_restartPending) return r;
        // Wait for every task to answer and be idle again (the failed one's daemon restarted by
        // its supervisor, the others' tasks ended by the cancel), then start the run again.
        ++m_restarts;
        const auto deadline = std::chrono::steady_clock::now() + m_options.restartWait;
        // Asked again and again anyway: each round is short.
        Status ready = preflight(1s, 1s);
        while (!ready.ok() && !m_cancel && std::chrono::steady_clock::now() < deadline) {
            std::this_thread::sleep_for(250ms);
            ready = preflight(1s, 1s);
        }
        if (m_cancel) {
            // Stopped by the user (coordinator.h: a cancel() gives cancelled = true), not a failure
            // to restart; the backup stays for a later start.
            bus.publish(tm::Event(tm::LogEvent{taskStamp(runId, "coordinator", "", 0), tm::LogLevel::Info,
                                               "cancelled while waiting to restart the run (" + r.error().message + ")"}));
            bus.publish(tm::Event(tm::RunStateEvent{taskStamp(runId, "coordinator", "", 0), tm::RunState::Cancelled, {}}));
            FitResult cancelled;
            cancelled.cancelled = true;
            return cancelled;
        }
        if (!ready.ok()) {
            Error e = ready.takeError();
            e.message = "cannot restart the run: " + e.message;
            if (e.hint.empty()) e.hint = "start the failed trainstudio-worker again, then start the run again to resume from its backup";
            else e.hint += "; then start the run again to resume from its backup";
            bus.publish(tm::Event(tm::ErrorEvent{taskStamp(runId, "coordinator", "", 0), e.message, e.hint, "coordinator"}));
            bus.publish(tm::Event(tm::RunStateEvent{taskStamp(runId, "coordinator", "", 0), tm::RunState::Failed, e.message}));
            return e;
        }
        // The pre-flight reached every daemon (on connections of its own where needed), but a
        // task's client may share a channel still waiting out the reconnect backoff its dead
        // daemon caused, and would fail the reservation with the old "nothing listens": the
        // restarted run talks to every daemon on a new connection.
        {
            std::lock_guard clients(m_clientsMutex);
            for (Task* t : everyTask())
                if (auto fresh = WorkerClient::connect(t->label, t->address, m_options.token, m_options.tls, /*ownConnection=*/true); fresh.ok())
                    t->client = std::move(fresh).value();
        }
        bus.publish(tm::Event(tm::LogEvent{taskStamp(runId, "coordinator", "", 0), tm::LogLevel::Warning,
                                           "restarting the run from its backup (restart " + std::to_string(m_restarts + m_rejoins) + " of " +
                                               std::to_string(allowed) + ")"}));
    }
}

Result<FitResult> Coordinator::runAttempt(const RunConfig& cfg, const std::string& runId, const std::string& taskRun,
                                          tm::EventBus& bus, const std::function<void(const tm::EpochMetricsEvent&)>& onEpoch,
                                          bool mayRestart)
{
    m_restartPending = false;
    m_refused = false;  // this attempt's
    bool started = false;
    for (Task* t : everyTask()) {
        // A restart: the last attempt's streams were cancelled and its states are stale.
        t->client->allowStreams();
        t->state.clear();
    }
    auto stamp = [&](const std::string& worker, const std::string& device, int64_t step) {
        return taskStamp(runId, worker, device, step);
    };
    const bool psRun = isParameterServer(m_strategy);
    // --restarts: restarts of the run from its backup and rejoins of lost parameter-server
    // workers, together.
    const int allowedRestarts = cfg.backup.enabled() ? cfg.backup.restarts : 0;
    m_summary = nlohmann::json::object();
    m_devices = nlohmann::json::array();
    // The task whose metrics are the run's: the chief (rank 0), or worker 0 after the ps tasks.
    std::size_t primary = 0;
    while (primary < m_tasks.size() && m_tasks[primary]->ps) ++primary;
    // The cluster's evaluator, if the run validates. It is not needed to train: one that cannot
    // be reserved or started is named in a warning, and the coordinator evaluates.
    // multi-worker-mirrored: while it is there, the training tasks do not validate and the chief
    // sends its weights after each epoch, which go to the evaluator (unless the run validates on
    // something else than the idx test split an evaluator reads: then the tasks validate).
    Task* evaluatorTask = RunEvaluator::nothingToEvaluate(cfg).empty() ? m_evaluator.get() : nullptr;
    Task* const evaluatorSlot = evaluatorTask;  // stays when the evaluator is lost (it may rejoin)
    auto attemptTasks = [&] { return tasksWith(evaluatorTask); };
    // With --restarts, the heartbeats probe a lost evaluator's daemon (probeEvaluator); once it
    // answers (evaluatorBack), the next evaluation starts a new task on it first.
    std::atomic<bool> probeEvaluator{false}, evaluatorBack{false};
    bool chiefSendsWeights = false;  // multi-worker-mirrored with its evaluator started
    // `rejoinable`: it may come back (see EvaluatorLink::rejoinable); only runs that evaluate
    // through it as they go (parameter-server, or a multi-worker chief that sends its weights)
    // take it back.
    auto evaluatorUnavailable = [&](const Error& why, int64_t epoch, bool rejoinable) {
        // A multi-worker-mirrored run's training tasks validate themselves when it is not there
        // at their start.
        const std::string instead = psRun || epoch > 0 ? "the coordinator evaluates the run" + std::string(epoch > 0 ? " from now on" : "")
                                                       : "the chief and the workers validate the run themselves";
        bus.publish(tm::Event(tm::LogEvent{stamp(m_evaluator->id.toString(), "", 0), tm::LogLevel::Warning, why.message + "; " + instead}));
        m_summary["evaluator_lost"] = {{"task", m_evaluator->id.toString()}, {"epoch", epoch}, {"why", why.message}, {"instead", instead}};
        if (rejoinable && (psRun || chiefSendsWeights) && m_restarts + m_rejoins < allowedRestarts) probeEvaluator = true;
    };
    std::unique_ptr<RunEvaluator> evaluator;
    if (psRun || evaluatorTask) {
        RunEvaluatorOptions eo;
        eo.runId = taskRun;
        eo.token = m_options.token;
        eo.tls = m_options.tls;
        eo.loadValidation = !evaluatorTask;  // else read only if the evaluator task is lost
        eo.pullFromPs = psRun;
        auto ev = RunEvaluator::create(cfg, m_options.spec, eo);
        if (!ev.ok()) {
            bus.publish(tm::Event(tm::ErrorEvent{stamp("coordinator", "", 0), ev.error().message, ev.error().hint, "coordinator"}));
            bus.publish(tm::Event(tm::RunStateEvent{stamp("coordinator", "", 0), tm::RunState::Failed, ev.error().message}));
            return ev.error();
        }
        evaluator = std::move(ev).value();
    }
    const nlohmann::json runConfig = cfg.toJson();
    const nlohmann::json withoutValidation = [&] {
        RunConfig c = cfg;
        c.validate = false;
        return c.toJson();
    }();
    Inbox inbox;
    inbox.ended.assign(m_tasks.size(), false);
    inbox.silent.assign(m_tasks.size(), false);
    inbox.clockOffsetUs.assign(m_tasks.size(), 0);
    inbox.clockRoundTripUs.assign(m_tasks.size(), std::numeric_limits<int64_t>::max());
    // parameter-server: the run is over when every worker has ended (the ps tasks serve on).
    auto trainingEnded = [&] {
        for (std::size_t i = 0; i < m_tasks.size(); ++i)
            if (!m_tasks[i]->ps && !inbox.ended[i]) return false;
        return true;
    };
    {
        std::lock_guard lock(m_wakeMutex);
        m_wake = [&inbox] {
            std::lock_guard l(inbox.mutex);
            inbox.cv.notify_all();
        };
    }
    struct Unwake {
        Coordinator* c;
        ~Unwake()
        {
            std::lock_guard lock(c->m_wakeMutex);
            c->m_wake = nullptr;
            c->m_taskRun.clear();
        }
    } unwake{this};
    auto fail = [&](std::size_t i, Error e) {
        std::lock_guard lock(inbox.mutex);
        inbox.failures.emplace_back(i, std::move(e));
        inbox.cv.notify_all();
    };
    auto finish = [&](const Result<FitResult>& r, int64_t steps) -> Result<FitResult> {
        if (mayRestart && m_restarts + m_rejoins < allowedRestarts && started && !r.ok() && !m_cancel && restartableFailure(r.error())) {
            // Not the run's end: run() starts it again from the backup.
            m_restartPending = true;
            bus.publish(tm::Event(tm::LogEvent{stamp("coordinator", "", steps), tm::LogLevel::Warning,
                                               "the run failed: " + r.error().message}));
            return r;
        }
        if (!r.ok())
            bus.publish(tm::Event(tm::ErrorEvent{stamp("coordinator", "", steps), r.error().message, r.error().hint, "coordinator"}));
        const tm::RunState state = !r.ok() ? tm::RunState::Failed : r->cancelled ? tm::RunState::Cancelled : tm::RunState::Completed;
        bus.publish(tm::Event(tm::RunStateEvent{stamp("coordinator", "", steps), state, r.ok() ? std::string() : r.error().message}));
        return r;
    };

    // Reserve every task's worker first, in address order: every coordinator takes shared
    // workers in the same order, so of two started at once on crossed clusters one gets all of
    // its workers and the other is refused at the first shared one, instead of each holding a
    // worker the other needs and both failing. A refusal releases what was reserved.
    {
        std::vector<Task*> order = attemptTasks();
        std::sort(order.begin(), order.end(), [&](const Task* a, const Task* b) { return a->address < b->address; });
        for (std::size_t k = 0; k < order.size(); ++k) {
            Task& t = *order[k];
            if (Status st = t.client->reserve(taskRun, m_who, 30); !st.ok()) {
                if (&t == evaluatorTask) {
                    // Busy or refusing, it answers: taking it back later would be refused again.
                    evaluatorUnavailable(st.error(), 0, !t.client->heartbeat(1s).ok());
                    evaluatorTask = nullptr;
                    continue;
                }
                for (std::size_t j = 0; j < k; ++j) (void)order[j]->client->cancel(taskRun, kCancelFailed);
                bus.publish(tm::Event(tm::ErrorEvent{stamp(t.id.toString(), "", 0), st.error().message, st.error().hint, t.label}));
                return finish(Result<FitResult>(st.error()), 0);
            }
        }
    }
    // Start every task (ps tasks first: they come first in m_tasks); a refusal cancels the ones
    // already started and releases the others.
    StartTaskOptions start;
    start.trace = m_options.trace;
    start.traceLayers = m_options.traceLayers;
    start.coordinator = m_who;
    // The initial weights go to every training task at once (a ps task is initialised by worker
    // 0), before any task starts: the first started would otherwise wait for the last's transfer.
    if (!m_initialWeights.empty()) {
        std::vector<Status> sent(m_tasks.size(), okStatus());
        std::vector<std::thread> senders;
        for (std::size_t i = 0; i < m_tasks.size(); ++i)
            if (!m_tasks[i]->ps)
                senders.emplace_back([&, i] { sent[i] = m_tasks[i]->client->sendWeights(taskRun, m_initialWeightsName, m_initialWeights); });
        for (auto& s : senders) s.join();
        for (std::size_t i = 0; i < m_tasks.size(); ++i) {
            if (sent[i].ok()) continue;
            for (Task* other : attemptTasks()) (void)other->client->cancel(taskRun, kCancelFailed);
            Error e = sent[i].takeError();
            bus.publish(tm::Event(tm::ErrorEvent{stamp(m_tasks[i]->id.toString(), "", 0), e.message, e.hint, m_tasks[i]->label}));
            return finish(Result<FitResult>(e), 0);
        }
    }
    // A parameter-server run's evaluator last: it pulls from the ps tasks only when asked. A
    // multi-worker-mirrored run's first: whether it started decides whether the others validate.
    std::vector<Task*> startOrder = attemptTasks();
    if (!psRun && evaluatorTask) std::rotate(startOrder.begin(), startOrder.end() - 1, startOrder.end());
    for (Task* task : startOrder) {
        Task& t = *task;
        start.initialWeightsSent = !m_initialWeights.empty() && !t.ps && &t != evaluatorTask;
        start.initialWeightsName = start.initialWeightsSent ? m_initialWeightsName : std::string();
        const bool sidecar = !psRun && evaluatorTask && &t != evaluatorTask;
        start.sendEpochWeights = sidecar && &t == m_tasks[primary].get();
        chiefSendsWeights |= start.sendEpochWeights;
        auto tf = m_options.spec.tfConfigFor(t.id);
        Status st = tf.ok() ? t.client->startTask(taskRun, sidecar ? withoutValidation : runConfig, *tf, t.id.type, t.id.index, start)
                            : Status(tf.error());
        if (!st.ok() && &t == evaluatorTask) {
            (void)t.client->cancel(taskRun, kCancelFailed);  // its reservation
            evaluatorUnavailable(st.error(), 0, !t.client->heartbeat(1s).ok());
            evaluatorTask = nullptr;
            continue;
        }
        if (!st.ok()) {
            for (Task* other : attemptTasks()) (void)other->client->cancel(taskRun, kCancelFailed);
            bus.publish(tm::Event(tm::ErrorEvent{stamp(t.id.toString(), "", 0), st.error().message, st.error().hint, t.label}));
            return finish(Result<FitResult>(st.error()), 0);
        }
    }
    started = true;
    {
        std::lock_guard lock(m_wakeMutex);
        m_taskRun = taskRun;
    }
    std::unique_ptr<EvaluatorLink> remoteEvaluator;
    if (evaluatorTask) remoteEvaluator = std::make_unique<EvaluatorLink>(*evaluatorTask->client, evaluatorTask->label, taskRun, m_options.heartbeatTimeout);
    bus.publish(tm::Event(tm::RunStateEvent{stamp("coordinator", "", 0), tm::RunState::Running, {}}));

    // Task i's events, into the inbox until its stream ends (a rejoined worker's new task gets
    // a new one).
    auto openStream = [&](std::size_t i) {
        return std::thread([&, i] {
            Status st = m_tasks[i]->client->streamEvents(taskRun, [&](const WorkerEvent& e) {
                std::lock_guard lock(inbox.mutex);
                inbox.events.emplace_back(i, e);
                inbox.cv.notify_all();
            });
            std::lock_guard lock(inbox.mutex);
            inbox.ended[i] = true;
            if (!st.ok() && st.error().code != ErrorCode::Cancelled) inbox.failures.emplace_back(i, st.takeError());
            inbox.cv.notify_all();
        });
    };
    for (std::size_t i = 0; i < m_tasks.size(); ++i) m_tasks[i]->stream = openStream(i);
    // Heartbeats: a worker that has not answered for heartbeatTimeout is gone (its stream may not
    // notice a machine that vanished without closing its sockets).
    // parameter-server with --restarts: the heartbeats also probe each lost worker's daemon
    // (probe[i]); one that answers again is a comeback for the loop, which starts the worker anew
    // and re-arms its heartbeat (rearm[i]).
    std::vector<std::atomic<bool>> probe(m_tasks.size()), rearm(m_tasks.size()), dropping(m_tasks.size());
    std::atomic<bool> stopBeats{false};
    std::thread beats([&] {
        std::vector<std::chrono::steady_clock::time_point> lastSeen(m_tasks.size(), std::chrono::steady_clock::now());
        std::vector<bool> reported(m_tasks.size(), false);
        const auto limit = m_options.heartbeatTimeout;
        const auto secs = std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(limit).count() / 1000.0);
        while (!stopBeats) {
            for (std::size_t i = 0; i < m_tasks.size() && !stopBeats; ++i) {
                if (rearm[i].exchange(false)) {
                    reported[i] = false;
                    lastSeen[i] = std::chrono::steady_clock::now();
                }
                if (probe[i]) {
                    if (m_tasks[i]->client->heartbeat(1s).ok()) {
                        std::lock_guard lock(inbox.mutex);
                        inbox.comeback.insert(i);
                        inbox.cv.notify_all();
                    }
                    continue;
                }
                if (reported[i]) continue;
                auto p = m_tasks[i]->client->heartbeat(std::min<std::chrono::milliseconds>(limit, 1s));
                const auto now = std::chrono::steady_clock::now();
                if (p.ok()) {
                    lastSeen[i] = now;
                    std::lock_guard lock(inbox.mutex);
                    inbox.noteClock(i, *p);
                }
                else if (now - lastSeen[i] > limit) {
                    reported[i] = true;
                    {
                        std::lock_guard lock(inbox.mutex);
                        inbox.silent[i] = true;
                    }
                    fail(i, makeError(ErrorCode::IoError,
                                      m_tasks[i]->label + " stopped responding (no heartbeat for " + secs.substr(0, secs.find('.') + 2) +
                                          " s): " + p.error().message,
                                      "check that machine and its trainstudio-worker; then start the run again"));
                }
            }
            if (probeEvaluator && !evaluatorBack && evaluatorSlot->client->heartbeat(1s).ok()) evaluatorBack = true;
            for (int k = 0; k < 5 && !stopBeats; ++k) std::this_thread::sleep_for(100ms);
        }
    });

    // The loop: publish the merged stream (the chief's metrics are the run's: every worker
    // reports the same global ones), stop at the first failure or on cancel().
    std::optional<Error> failure;
    FitResult fit;
    bool anyCancelled = false, cancelSent = false;
    std::map<std::string, int64_t> staleness;  // parameter-server: each worker's latest
    // mixed_float16: each worker's latest loss scale and skipped steps (parameter-server workers
    // scale their own losses; multi-worker ones agree, so the chief's are everyone's).
    std::map<std::string, std::pair<double, int64_t>> lossScales;
    std::optional<tm::EpochMetricsEvent> lastEpoch;  // worker 0's, re-recorded with the final evaluation
    double workerSamplesPerSec = 0;
    int64_t workerSteps = 0;
    // parameter-server: the samples and seconds of ps:0's epochs, which count every worker's
    // steps (a lost worker's too), for the run's throughput.
    double psEpochSamples = 0, psEpochSeconds = 0;
    // Worker 0's epoch, with the ps tasks' weights evaluated on the test split now: by the
    // evaluator task while it is there, else here.
    std::string evaluatedBy = "coordinator";
    int64_t lastEvaluatedEpoch = 0;
    bool validationLost = false;  // the evaluator was lost and this machine cannot read the test split
    // A lost evaluator whose daemon answers again gets a new task (its old one, if still there,
    // is stopped first), as a lost worker does, from the same --restarts budget. An error leaves
    // it lost; the heartbeats probe it again.
    auto rejoinEvaluator = [&](const tm::EpochMetricsEvent& m) {
        Task& t = *evaluatorSlot;
        auto again = [&]() -> Status {
            TS_ASSIGN(const WorkerIdentity who, t.client->identify(1s));
            if (who.state == "running" && who.runId != taskRun)
                return makeError(ErrorCode::InvalidArgument, t.label + " runs run " + who.runId + " for " + who.coordinator);
            remoteEvaluator.reset();  // ends the old task's stream
            t.client->allowStreams();
            if (who.state == "running") {
                // Its old task (a stopped machine that came back): it ends at once, but not before
                // the Cancel returns.
                (void)t.client->cancel(taskRun, kCancelFailed);
                for (int k = 0; k < 20; ++k) {
                    auto p = t.client->heartbeat(1s);
                    if (!p.ok() || p->state != "running") break;
                    std::this_thread::sleep_for(100ms);
                }
            }
            TS_TRY(t.client->reserve(taskRun, m_who, 30));
            StartTaskOptions fresh = start;
            fresh.sendEpochWeights = false;
            fresh.initialWeightsSent = false;
            fresh.initialWeightsName.clear();
            auto tf = m_options.spec.tfConfigFor(t.id);
            Status st = tf.ok() ? t.client->startTask(taskRun, runConfig, *tf, t.id.type, t.id.index, fresh) : Status(tf.error());
            if (!st.ok()) (void)t.client->cancel(taskRun, kCancelFailed);  // its reservation
            return st;
        };
        if (Status st = again(); !st.ok()) {
            bus.publish(tm::Event(tm::LogEvent{stamp(t.id.toString(), "", m.stamp.step), tm::LogLevel::Info,
                                               t.label + " answers again but cannot rejoin yet: " + st.error().message}));
            probeEvaluator = true;
            return;
        }
        remoteEvaluator = std::make_unique<EvaluatorLink>(*t.client, t.label, taskRun, m_options.heartbeatTimeout);
        evaluatorTask = &t;
        validationLost = false;
        ++m_rejoins;
        bus.publish(tm::Event(tm::LogEvent{stamp(t.id.toString(), "", m.stamp.step), tm::LogLevel::Warning,
                                           t.label + " answers again: " + t.id.toString() + " evaluates the run again with a new task (restart " +
                                               std::to_string(m_restarts + m_rejoins) + " of " + std::to_string(allowedRestarts) + ")"}));
        m_summary["rejoined"].push_back({{"task", t.id.toString()}, {"at_epoch", m.epoch}});
    };
    // The evaluator's task ends with the run (`reason` as Cancel's); its final counts go in the summary.
    auto stopEvaluator = [&](const std::string& reason) {
        if (!remoteEvaluator) return;
        nlohmann::json final = remoteEvaluator->stop(reason);
        if (!final.empty()) m_summary[m_evaluator->id.toString()] = std::move(final);
    };
    // `weights`: a multi-worker-mirrored chief's after the epoch (safetensors bytes); null: the
    // ps tasks' now.
    auto evaluatedEpoch = [&](tm::EpochMetricsEvent& m, const std::string* weights = nullptr) {
        if (evaluatorBack && !failure && !m_cancel && (!remoteEvaluator || remoteEvaluator->lost())) {
            probeEvaluator = false;  // before the flag: a probe in flight may set it once more
            evaluatorBack = false;
            if (m_restarts + m_rejoins < allowedRestarts) rejoinEvaluator(m);
        }
        if (!evaluator || !cfg.validate || failure || validationLost) return;
        Result<EvalResult> v = makeError(ErrorCode::Internal, "not evaluated");
        if (remoteEvaluator && !remoteEvaluator->lost()) {
            v = remoteEvaluator->evaluate(m.epoch, m_cancel, weights);
            if (!v.ok() && m_cancel) return;
            if (!v.ok()) evaluatorUnavailable(v.error(), m.epoch, remoteEvaluator->rejoinable());
            evaluatedBy = m_evaluator->id.toString();
        }
        if (!v.ok()) {
            evaluatedBy = "coordinator";
            if (Status loaded = evaluator->loadValidation(); !loaded.ok()) {
                // Training does not need it: the run goes on without validation rather than
                // fail on the evaluator's account.
                validationLost = true;
                if (m_summary.contains("evaluator_lost")) m_summary["evaluator_lost"]["instead"] = "the run goes on without validation";
                bus.publish(tm::Event(tm::LogEvent{stamp("coordinator", "", m.stamp.step), tm::LogLevel::Warning,
                                                   "the coordinator cannot evaluate either (" + loaded.error().message +
                                                       "): the run goes on without validation"}));
                return;
            }
            if (weights) {
                v = evaluator->evaluateEncoded(*weights, epochWeightsName(m.epoch));
            } else {
                v = evaluator->evaluate();
            }
        }
        if (!v.ok()) {
            if (!failure && !m_cancel) failure = v.takeError();
            return;
        }
        m.metrics["val_loss"] = v->loss;
        m.metrics["val_accuracy"] = v->accuracy;
        lastEvaluatedEpoch = m.epoch;
        fit.last.valLoss = v->loss;
        fit.last.valAccuracy = v->accuracy;
    };
    // Each task's last reported step: a run stopped early has no "final" event to count from.
    std::vector<int64_t> lastStep(m_tasks.size(), 0);
    // parameter-server: workers the run lost and went on without (ps:0 handed their steps to
    // the others), and the worker whose steps are the run's step metrics (the first still in it).
    std::vector<bool> dropped(m_tasks.size(), false);
    std::vector<std::thread> droppers;  // stop a lost worker's task without holding up the loop
    std::size_t reporter = primary;
    int64_t lastReported = 0;           // the run's step metrics go forward only
    auto firstLiveWorker = [&] {
        std::size_t r = 0;
        while (r < m_tasks.size() && (m_tasks[r]->ps || dropped[r])) ++r;
        return r;
    };
    auto liveWorkers = [&] {
        int n = 0;
        for (std::size_t k = 0; k < m_tasks.size(); ++k) n += !m_tasks[k]->ps && !dropped[k];
        return n;
    };
    // A worker that died or went silent is not the run's end while others train (TF's
    // ClusterCoordinator reschedules its steps): ps:0 gets its steps back, it is stopped and
    // named in a warning. Returns false when it was the last worker.
    auto dropWorker = [&](std::size_t i, const Error& why) {
        if (!psRun || m_tasks[i]->ps || dropped[i] || m_cancel || liveWorkers() <= 1 || !evaluator) return false;
        Task& t = *m_tasks[i];
        if (Status st = evaluator->store()->release(t.id.toString(), why.message); !st.ok()) return false;
        dropped[i] = true;
        staleness.erase(t.id.toString());  // no longer the run's
        lossScales.erase(t.id.toString());
        bus.publish(tm::Event(tm::LogEvent{stamp(t.id.toString(), "", lastStep[i]), tm::LogLevel::Warning,
                                           why.message + "; the run goes on without " + t.id.toString() + ": its steps go to the other workers"}));
        m_summary["lost"].push_back({{"task", t.id.toString()}, {"reason", why.message}, {"after_step", lastStep[i]}});
        reporter = firstLiveWorker();
        // Its stream first: the run's end waits for it, and a frozen daemon answers no Cancel.
        t.client->cancelStream();
        dropping[i] = true;  // no comeback before this Cancel has come back
        droppers.emplace_back([&t, &taskRun, &flag = dropping[i]] {
            (void)t.client->cancel(taskRun, kCancelFailed);
            flag = false;
        });
        if (m_restarts + m_rejoins < allowedRestarts) probe[i] = true;
        return true;
    };
    // A lost worker's daemon answers again (restarted by its supervisor, or its network back):
    // its old task is stopped, a new one started that joins the run in progress (worker 0's too:
    // it neither initialises the ps tasks again nor resumes from the backup, and goes on writing
    // backups), and ps:0 hands it steps again (TF's ClusterCoordinator uses a recovered worker
    // again). Called without the inbox lock. An error (the old task still ending, the daemon
    // busy) leaves it lost; the next probe tries again.
    std::vector<std::thread> oldStreams;
    auto rejoinWorker = [&](std::size_t i) -> Status {
        Task& t = *m_tasks[i];
        TS_ASSIGN(const WorkerPulse pulse, t.client->heartbeat(1s));
        if (pulse.state == "running") (void)t.client->cancel(taskRun, kCancelFailed);  // its old task, still there
        TS_TRY(t.client->reserve(taskRun, m_who, 30));
        TS_TRY(evaluator->store()->readmit(t.id.toString(), "its daemon answers again"));
        StartTaskOptions again = start;
        again.joinRunning = true;          // no initialising the ps tasks, no resuming: it joins
        again.initialWeightsSent = false;  // it pulls the ps tasks' values
        again.initialWeightsName.clear();
        auto tf = m_options.spec.tfConfigFor(t.id);
        Status st = tf.ok() ? t.client->startTask(taskRun, runConfig, *tf, t.id.type, t.id.index, again) : Status(tf.error());
        if (!st.ok()) {
            (void)evaluator->store()->release(t.id.toString(), "its new task did not start: " + st.error().message);
            (void)t.client->cancel(taskRun, kCancelFailed);
            return st;
        }
        return okStatus();
    };
    // multi-worker-mirrored: the chief's weights at its end; and, for the evaluator, after the
    // epoch in progress.
    WeightParts chiefWeights, epochWeights;
    int64_t epochWeightsEpoch = 0;
    std::vector<PsLoad> psLoad(m_tasks.size());
    std::unique_lock lock(inbox.mutex);
    for (;;) {
        inbox.cv.wait(lock, [&] {
            return !inbox.events.empty() || !inbox.failures.empty() || inbox.allEnded() || (psRun && trainingEnded()) ||
                   (m_cancel && !cancelSent) || !inbox.comeback.empty();
        });
        if (m_cancel && !cancelSent) {
            // Each worker stops at its next step and reports "cancelled"; their streams then end.
            cancelSent = true;
            lock.unlock();
            // Parameter server: the ps tasks stay up until the weights so far are pulled (below).
            for (auto& t : m_tasks)
                if (!(psRun && t->ps)) (void)t->client->cancel(taskRun);
            lock.lock();
        }
        while (!inbox.events.empty()) {
            auto [i, e] = std::move(inbox.events.front());
            inbox.events.pop_front();
            const int64_t clockOffset = inbox.clockOffsetUs[i];
            lock.unlock();
            Task& t = *m_tasks[i];
            const bool chief = i == primary;
            const auto& f = e.fields;
            lastStep[i] = std::max(lastStep[i], e.step);
            if (psRun && !dropped[i] && e.kind == "step" && f.contains("staleness")) staleness[e.worker] = f["staleness"].get<int64_t>();
            if (!dropped[i] && e.kind == "step" && f.contains("loss_scale"))
                lossScales[e.worker] = {f["loss_scale"].get<double>(), f.value("skipped_steps", int64_t{0})};
            if (dropped[i]) {
                // A lost worker's late events (it may come back after it was given up, and fail
                // when ps:0 refuses it) are not the run's.
            } else if (e.kind == "state") {
                t.state = f.value("state", "");
                if (f.contains("devices") && f["devices"].is_array())
                    for (auto d : f["devices"]) {
                        if (!d.is_object()) continue;
                        d["task"] = t.id.toString();
                        // A restarted task reports its devices again.
                        if (std::find(m_devices.begin(), m_devices.end(), d) == m_devices.end()) m_devices.push_back(std::move(d));
                    }
                bus.publish(tm::Event(tm::LogEvent{stamp(e.worker, e.device, e.step), tm::LogLevel::Info, t.label + ": " + t.state}));
                const std::string reason = f.value("reason", "");
                const bool asked = m_cancel || reason == kCancelDone || reason == kCancelFailed;  // by this coordinator
                if (t.state == "cancelled" && !asked && !t.ps && (psRun || reason == kCancelShutdown)) {
                    // Stopped on its machine (its daemon shut down), not by this run: a lost
                    // worker, not the run's cancellation. parameter-server: its steps go to the
                    // others (ps:0 would keep them held, and the others wait for them forever);
                    // multi-worker: the run fails naming it (--restarts starts it again).
                    std::lock_guard g(inbox.mutex);
                    inbox.failures.emplace_back(i, makeError(ErrorCode::IoError,
                                                             t.label + ": its task was stopped on its machine" +
                                                                 (reason == kCancelShutdown ? " (its trainstudio-worker shut down)" : ""),
                                                             "start that trainstudio-worker again; with --restarts the run takes it back"));
                    inbox.cv.notify_all();
                } else if (t.state == "cancelled") {
                    anyCancelled = true;
                }
            } else if (e.kind == "error") {
                const bool refusal = f.value("refused", false);
                Error err = taskError(t.label, f);
                if (m_cancel) {
                    // After Stop: a task whose peer stopped first sees its collective break off.
                    // That is the cancellation seen from there, not the run's failure.
                    bus.publish(tm::Event(tm::LogEvent{stamp(e.worker, e.device, e.step), tm::LogLevel::Info,
                                                       err.message + " (after the run was cancelled)"}));
                } else {
                    bus.publish(tm::Event(tm::ErrorEvent{stamp(e.worker, e.device, e.step), err.message, err.hint, t.label}));
                    if (replacesFailure(failure, m_refused, err, refusal)) {
                        failure = err;
                        m_refused = refusal;
                    }
                }
            } else if (e.kind == "step" && (psRun ? (i == reporter || (i < reporter && !t.ps)) && e.step > lastReported : chief)) {
                if (psRun) reporter = i;  // a rejoined lower worker reports again once it trains
                lastReported = e.step;
                tm::StepMetricsEvent m;
                m.stamp = stamp(e.worker, e.device, e.step);
                m.epoch = f.value("epoch", int64_t{0});
                m.loss = f.value("loss", 0.0);
                m.metrics["accuracy"] = f.value("accuracy", 0.0);
                m.samplesPerSec = f.value("samples_per_sec", 0.0);
                m.learningRate = f.value("learning_rate", 0.0);
                // Every worker's latest staleness, named by worker, at worker 0's steps (the
                // store keeps one value per metric and step); "staleness" is the largest of them
                // (it was worker 0's own, hiding a worker that fell behind).
                if (!staleness.empty()) {
                    int64_t worst = 0;
                    for (const auto& [worker, v] : staleness) {
                        m.metrics["staleness/" + worker] = static_cast<double>(v);
                        worst = std::max(worst, v);
                    }
                    m.metrics["staleness"] = static_cast<double>(worst);
                }
                if (!lossScales.empty()) {
                    // The smallest scale (the worker that overflowed most recently) and every
                    // worker's skipped steps together.
                    double smallest = std::numeric_limits<double>::infinity();
                    int64_t skipped = 0;
                    for (const auto& [worker, v] : lossScales) {
                        if (!psRun && worker != e.worker) continue;
                        smallest = std::min(smallest, v.first);
                        skipped += v.second;
                    }
                    if (std::isfinite(smallest)) {
                        m.metrics["loss_scale"] = smallest;
                        m.metrics["skipped_steps"] = static_cast<double>(skipped);
                    }
                }
                bus.publish(tm::Event(std::move(m)));
            } else if (e.kind == "epoch" && (psRun ? t.ps && t.id.index == 0 : chief)) {
                // parameter-server: ps:0's, whose step schedule counts every worker's steps.
                tm::EpochMetricsEvent m;
                m.stamp = stamp(e.worker, e.device, e.step);
                m.epoch = f.value("epoch", int64_t{0});
                for (const char* k : {"loss", "accuracy", "val_loss", "val_accuracy"})
                    if (f.contains(k)) m.metrics[k] = f[k].get<double>();
                m.seconds = f.value("seconds", 0.0);
                m.samplesPerSec = f.value("samples_per_sec", 0.0);
                fit.epochs = m.epoch;
                fit.last.epoch = m.epoch;
                fit.last.loss = f.value("loss", 0.0);
                fit.last.accuracy = f.contains("accuracy") && f["accuracy"].is_number() ? f["accuracy"].get<double>()
                                                                                        : std::numeric_limits<double>::quiet_NaN();
                if (psRun) {
                    psEpochSamples += m.samplesPerSec * m.seconds;
                    psEpochSeconds += m.seconds;
                    evaluatedEpoch(m);  // the streams queue meanwhile (the inbox is unlocked)
                    lastEpoch = m;
                } else if (chiefSendsWeights) {
                    // The chief trains on meanwhile: its events queue in the inbox.
                    if (epochWeightsEpoch == m.epoch && epochWeights.complete())
                        evaluatedEpoch(m, &epochWeights.bytes);
                    else
                        bus.publish(tm::Event(tm::LogEvent{stamp(e.worker, e.device, e.step), tm::LogLevel::Warning,
                                                           t.label + " sent no complete weights for epoch " + std::to_string(m.epoch) +
                                                               ": that epoch is not evaluated"}));
                    epochWeights.clear();
                }
                if (onEpoch) onEpoch(m);
                bus.publish(tm::Event(std::move(m)));
            } else if (e.kind == "final" && psRun) {
                m_summary[t.id.toString()] = f;
                if (!t.ps) {
                    // The run's throughput is every worker's; its steps, the updates applied.
                    workerSteps += f.value("steps", int64_t{0});
                    workerSamplesPerSec += f.value("samples_per_sec", 0.0);
                    fit.seconds = std::max(fit.seconds, f.value("seconds", 0.0));
                    fit.steps = workerSteps;
                    fit.samplesPerSec = workerSamplesPerSec;
                }
            } else if (e.kind == "weights" && chief && !psRun) {
                const int64_t part = f.value("part", int64_t{-1}), parts = f.value("parts", int64_t{0});
                if (f.contains("epoch")) {
                    // An epoch's weights for the evaluator; part 0 starts anew.
                    if (part == 0) {
                        epochWeights.clear();
                        epochWeightsEpoch = f.value("epoch", int64_t{0});
                    }
                    if (f.value("epoch", int64_t{0}) == epochWeightsEpoch) epochWeights.add(part, parts, e.payload);
                    else epochWeights.got = -1;
                } else {
                    chiefWeights.add(part, parts, e.payload);
                }
            } else if (e.kind == "final" && chief) {
                fit.steps = f.value("steps", int64_t{0});
                fit.samplesPerSec = f.value("samples_per_sec", 0.0);
                fit.seconds = f.value("seconds", 0.0);
            } else {
                (void)publishTaskTelemetry(runId, e, chief, bus, psLoad[i], clockOffset);
            }
            lock.lock();
        }
        if (!inbox.failures.empty() && !failure) {
            // After Stop, a stream that broke off is part of stopping (see above); a task that
            // stopped answering while its stream is still open is not, or Stop would wait forever.
            // parameter-server: a lost worker is dropped instead while others train (dropWorker).
            auto failures = std::exchange(inbox.failures, {});
            for (const auto& [i, e] : failures) {
                if (dropped[i]) continue;
                const bool ended = inbox.ended[i];
                lock.unlock();
                const bool goesOn = !failure && dropWorker(i, e);
                lock.lock();
                if (goesOn) continue;
                if (m_cancel && ended)
                    bus.publish(tm::Event(tm::LogEvent{stamp(m_tasks[i]->id.toString(), "", 0), tm::LogLevel::Info,
                                                       e.message + " (after the run was cancelled)"}));
                else if (!failure)
                    failure = e;
            }
        }
        for (const std::size_t i : std::exchange(inbox.comeback, {})) {
            if (m_restarts + m_rejoins >= allowedRestarts) {
                for (auto& p : probe) p = false;  // no restarts left: nobody comes back
                break;
            }
            // Not before its old stream has ended and everything it queued is handled (its last
            // events and its end must not be taken for the new task's), nor while the Cancel of
            // its old task is on its way.
            const auto mine = [i](const auto& entry) { return entry.first == i; };
            if (!dropped[i] || !probe[i] || !inbox.ended[i] || dropping[i] || failure || m_cancel || trainingEnded() ||
                std::any_of(inbox.events.begin(), inbox.events.end(), mine) ||
                std::any_of(inbox.failures.begin(), inbox.failures.end(), mine))
                continue;
            lock.unlock();
            Status st = rejoinWorker(i);
            lock.lock();
            if (!st.ok()) continue;  // probed again in a moment
            Task& t = *m_tasks[i];
            rearm[i] = true;  // before probe[i] goes off: the heartbeats restart from now
            probe[i] = false;
            ++m_rejoins;
            // Its old stream ended when it was dropped; a new one carries the new task's events.
            oldStreams.push_back(std::move(t.stream));
            inbox.ended[i] = false;
            inbox.silent[i] = false;
            inbox.clockRoundTripUs[i] = std::numeric_limits<int64_t>::max();  // a new process, maybe a new clock
            dropped[i] = false;
            t.client->allowStreams();
            t.stream = openStream(i);
            const int64_t at = std::max(lastReported, lastStep[i]);
            bus.publish(tm::Event(tm::LogEvent{stamp(t.id.toString(), "", at), tm::LogLevel::Warning,
                                               t.label + " answers again: " + t.id.toString() + " rejoins the run with a new task (restart " +
                                                   std::to_string(m_restarts + m_rejoins) + " of " + std::to_string(allowedRestarts) + ")"}));
            m_summary["rejoined"].push_back({{"task", t.id.toString()}, {"at_step", at}});
        }
        if (failure || inbox.allEnded() || (psRun && trainingEnded() && inbox.events.empty())) break;
    }
    lock.unlock();
    m_finalWeights.clear();
    if (psRun && !failure) {
        // Every worker has ended: their last pushes are applied (each flushes before it reports
        // its end). The final weights are the ps tasks'; then the ps tasks are stopped.
        bool completed = false;
        for (std::size_t k = 0; k < m_tasks.size(); ++k)
            completed |= !m_cancel && !m_tasks[k]->ps && !dropped[k] && m_tasks[k]->state == "completed";
        // A stopped run keeps its weights so far too (pulled before the ps tasks are stopped).
        if (completed || m_cancel) {
            Status pulled = evaluator->pullWeights();
            auto weights = pulled.ok() ? evaluator->trainer().strategy().exportParameters()
                                       : Result<std::vector<std::pair<std::string, Tensor>>>(pulled.error());
            if (weights.ok()) m_finalWeights = std::move(weights).value();
            else if (!m_cancel) failure = weights.takeError();
            else  // stopped: the run stays cancelled, only without weights
                bus.publish(tm::Event(tm::LogEvent{stamp(m_tasks[primary]->id.toString(), "", fit.steps), tm::LogLevel::Warning,
                                                   "the weights so far could not be pulled from the ps tasks: " + weights.error().message}));
        }
        if (completed && !failure && lastEpoch && cfg.validate) {
            // The last epoch again, now with the weights after every worker's last push.
            tm::EpochMetricsEvent m = *lastEpoch;
            m.stamp = stamp(m_tasks[primary]->id.toString(), "", fit.steps);
            evaluatedEpoch(m);
            if (!failure && !validationLost) {
                m_summary["evaluation"] = {{"val_loss", fit.last.valLoss}, {"val_accuracy", fit.last.valAccuracy}, {"by", evaluatedBy}};
                bus.publish(tm::Event(std::move(m)));
            }
        }
        if (validationLost) {
            // An earlier epoch's test accuracy is not the final weights'.
            fit.last.valLoss = std::numeric_limits<double>::quiet_NaN();
            fit.last.valAccuracy = std::numeric_limits<double>::quiet_NaN();
        }
        const std::string reason = failure ? kCancelFailed : m_cancel ? "" : kCancelDone;
        stopEvaluator(reason);
        for (auto& t : m_tasks)
            if (t->ps) (void)t->client->cancel(taskRun, reason);
        // Wait for the ps tasks' ends (their final statistics), still watching for failures.
        // A dropped worker's failures are old news (its heartbeats may still lapse now).
        auto liveFailure = [&]() -> const Error* {
            for (const auto& [i, e] : inbox.failures)
                if (!dropped[i]) return &e;
            return nullptr;
        };
        lock.lock();
        inbox.cv.wait(lock, [&] { return inbox.allEnded() || liveFailure() != nullptr; });
        while (!inbox.events.empty()) {
            auto [i, e] = std::move(inbox.events.front());
            inbox.events.pop_front();
            if (e.kind == "state") m_tasks[i]->state = e.fields.value("state", "");
            else if (e.kind == "final") m_summary[m_tasks[i]->id.toString()] = e.fields;
            else if (e.kind == "error") {
                if (!failure) {
                    failure = taskError(m_tasks[i]->label, e.fields);
                    m_refused = e.fields.value("refused", false);
                }
            } else
                (void)publishTaskTelemetry(runId, e, i == primary, bus, psLoad[i], inbox.clockOffsetUs[i]);
        }
        if (const Error* e = liveFailure(); e && !failure) failure = *e;
        lock.unlock();
    }
    if (!psRun && chiefSendsWeights) {
        // The last epoch's weights are the final ones: its evaluation is the run's, if the run
        // completed and that epoch was evaluated (not an earlier one's).
        const bool ofFinalWeights = !failure && !m_cancel && !validationLost && lastEvaluatedEpoch > 0 && lastEvaluatedEpoch == fit.epochs;
        if (ofFinalWeights) {
            m_summary["evaluation"] = {{"val_loss", fit.last.valLoss}, {"val_accuracy", fit.last.valAccuracy}, {"by", evaluatedBy}};
        } else {
            fit.last.valLoss = std::numeric_limits<double>::quiet_NaN();
            fit.last.valAccuracy = std::numeric_limits<double>::quiet_NaN();
        }
        stopEvaluator(failure ? kCancelFailed : m_cancel ? "" : kCancelDone);
    }
    stopBeats = true;
    beats.join();
    // Stop the others: they would wait for the failed one until their collective timeout.
    if (failure) {
        for (Task* t : everyTask()) (void)t->client->cancel(taskRun, kCancelFailed);
        // What the tasks measured up to the failure (their last breakdowns, samples and spans
        // leave in batches) is still on its way: let the streams end on their own for a moment
        // (not waiting for a silent task's, which a frozen machine never ends).
        lock.lock();
        inbox.cv.wait_for(lock, 1s, [&] { return inbox.allAnsweringEnded(); });
        for (auto& [i, e] : inbox.events) {
            if (e.kind == "state") {
                m_tasks[i]->state = e.fields.value("state", "");
            } else if (e.kind == "error") {
                // Another task's error after the first: logged, and the run's instead when
                // replacesFailure says so.
                const bool refusal = e.fields.value("refused", false);
                Error err = taskError(m_tasks[i]->label, e.fields);
                bus.publish(tm::Event(tm::LogEvent{stamp(e.worker, e.device, e.step), tm::LogLevel::Info, err.message}));
                if (replacesFailure(failure, m_refused, err, refusal)) {
                    failure = err;
                    m_refused = refusal;
                }
            } else {
                (void)publishTaskTelemetry(runId, e, i == primary, bus, psLoad[i], inbox.clockOffsetUs[i]);
            }
        }
        inbox.events.clear();
        lock.unlock();
    }
    for (auto& d : droppers) d.join();
    for (auto& s : oldStreams) s.join();
    for (auto& t : m_tasks) {
        if (failure) t->client->cancelStream();
        t->stream.join();
    }
    if (!failure && !m_cancel)
        for (std::size_t k = 0; k < m_tasks.size(); ++k)
            if (const auto& t = m_tasks[k]; !dropped[k] && t->state != "completed" && t->state != "cancelled") {
                failure = makeError(ErrorCode::Internal, t->label + ": the task ended in state '" + t->state + "'",
                                    "see that worker's log (trainstudio-worker prints every task's error)");
                break;
            }
    fit.cancelled = (anyCancelled || m_cancel) && !failure;
    if (!psRun && !failure && chiefWeights.got > 0) {
        if (!chiefWeights.complete()) {
            bus.publish(tm::Event(tm::LogEvent{stamp(m_tasks[primary]->id.toString(), "", lastStep[primary]), tm::LogLevel::Warning,
                                               m_tasks[primary]->label + " sent " + std::to_string(chiefWeights.got) + " of " +
                                                   std::to_string(chiefWeights.expected) + " parts of its weights: none are kept"}));
        } else {
            auto decoded = decodeSafetensors(chiefWeights.bytes, m_tasks[primary]->label + "'s weights");
            if (decoded.ok()) {
                m_finalWeights = decoded->inOrder();
            } else {
                bus.publish(tm::Event(tm::LogEvent{stamp(m_tasks[primary]->id.toString(), "", lastStep[primary]), tm::LogLevel::Warning,
                                                   "the weights could not be read: " + decoded.error().message}));
            }
        }
    }
    // The run's steps, as a local run counts them (resumed: from its start): ps:0's schedule
    // counted every worker's, a lost worker's (which never reported its end), a rejoined
    // worker's old task's and those before a resume. Its throughput, likewise, is that of ps:0's
    // epochs; the reporting workers' sum, which leaves a lost worker out, only when no epoch
    // ended (a run stopped in its first).
    if (psRun) {
        const auto ps0 = m_summary.find("ps:0");
        if (ps0 != m_summary.end() && ps0->value("steps_completed", int64_t{0}) > 0) fit.steps = (*ps0)["steps_completed"].get<int64_t>();
        if (psEpochSeconds > 0) fit.samplesPerSec = psEpochSamples / psEpochSeconds;
    }
    if (fit.steps == 0) {
        // Stopped before the "final" events (Stop, Ctrl-C): the steps the tasks reported, counted
        // as those are (parameter server: every worker's updates; else the chief's steps).
        if (psRun) {
            for (std::size_t i = 0; i < m_tasks.size(); ++i)
                if (!m_tasks[i]->ps) fit.steps += lastStep[i];
        } else {
            fit.steps = lastStep[primary];
        }
    }
    return finish(failure ? Result<FitResult>(*failure) : Result<FitResult>(fit), fit.steps);
}

} // namespace ts::remote
