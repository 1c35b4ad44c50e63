#include "remote/sidecar_evaluation.h"

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "model/spec.h"
#include "remote/evaluator_link.h"
#include "remote/run_evaluator.h"
#include "remote/worker_client.h"
#include "train/run_config.h"

namespace ts::remote {

using namespace std::chrono_literals;

namespace {

// The run configuration the evaluator task gets: the model inline (its file is on this
// machine), and given weights, it loads and writes none and keeps no backups.
Result<RunConfig> evaluatorConfig(const RunConfig& cfg)
{
    RunConfig sent = cfg;
    if (!sent.modelFile.empty()) {
        TS_ASSIGN(sent.model, loadModelFile(sent.modelFile));
        sent.modelFile.clear();
    }
    sent.loadWeights.clear();
    sent.saveWeights.clear();
    sent.backup = BackupConfig{};
    return sent;
}

} // namespace

class SidecarEvaluation::Impl {
public:
    Impl(RunConfig cfg, ClusterSpec spec, SidecarOptions o, std::function<void(const SidecarResult&)> onResult,
         std::function<void(const std::string&)> onNote)
        : m_cfg(std::move(cfg)), m_spec(std::move(spec)), m_o(std::move(o)), m_onResult(std::move(onResult)), m_onNote(std::move(onNote))
    {
        m_task = m_spec.task().toString();
        m_address = m_spec.addresses("evaluator").front();
        m_label = "evaluator:0 at " + m_address;
    }

    void start() { m_thread = std::thread([this] { run(); }); }

    uint64_t submit(int64_t epoch, std::string weights)
    {
        std::lock_guard lock(m_mutex);
        const uint64_t number = ++m_submissions;
        if (m_stopping) return number;
        if (m_pending) ++m_skipped;
        m_latest[epoch] = number;
        m_pending = Job{epoch, number, std::move(weights)};
        m_cv.notify_all();
        return number;
    }

    void cancel()
    {
        std::lock_guard lock(m_mutex);
        m_cancelled = true;
        m_pending.reset();
        m_cv.notify_all();
    }

    nlohmann::json finish(const std::string& reason)
    {
        {
            std::lock_guard lock(m_mutex);
            if (!m_stopping) {
                m_stopping = true;
                m_reason = reason;
                if (reason != kCancelDone) {
                    m_cancelled = true;  // ends an evaluation in progress, drops the one waiting
                    m_pending.reset();
                }
            }
            m_cv.notify_all();
        }
        if (m_thread.joinable()) m_thread.join();
        nlohmann::json s = {{"evaluator", m_label}, {"evaluations", m_evaluations}, {"skipped", m_skipped}, {"rejoins", m_rejoins}};
        if (!m_lost.empty()) s["evaluator_lost"] = m_lost;
        if (!m_final.empty()) s["final"] = m_final;
        return s;
    }

private:
    struct Job {
        int64_t epoch = 0;
        uint64_t number = 0;
        std::string weights;
    };

    void note(const std::string& line)
    {
        if (m_onNote) m_onNote(line);
    }

    void run()
    {
        // At the start the evaluator may not be up yet: it is asked every second for a while,
        // and before each evaluation; an epoch that ends before it answers is evaluated here.
        const auto deadline = std::chrono::steady_clock::now() + m_o.connectTimeout;
        for (;;) {
            std::unique_lock lock(m_mutex);
            m_cv.wait_for(lock, 1s, [&] { return m_pending || m_stopping; });
            std::optional<Job> job = std::move(m_pending);
            m_pending.reset();
            const bool stopping = m_stopping;
            lock.unlock();
            if (job) evaluate(*job);
            else if (stopping) break;
            else if (!m_started && !m_refused && std::chrono::steady_clock::now() < deadline) tryStart(0);
        }
        // Stopped even when lost: a task that failed an evaluation may still run there.
        if (m_link) m_final = m_link->stop(m_reason);
        m_link.reset();
    }

    // startTask(), and what a failure means for the run, said once: refused for good, or not
    // there (yet).
    bool tryStart(int64_t epoch)
    {
        Status st = startTask();
        // After a loss, that loss was said already.
        if (st.ok() || m_announced || m_started || (!m_refused && epoch == 0)) return st.ok();
        m_announced = true;
        // A daemon's hint names trainstudio-worker; in a TF_CONFIG cluster it is a train process.
        std::string hint = st.error().hint;
        if (!m_refused && (hint.empty() || hint.find("trainstudio-worker") != std::string::npos || hint.find("start it") == 0))
            hint = "start the evaluator there (the same train command, with task evaluator:0 of TF_CONFIG), or fix its address in TF_CONFIG";
        m_lost = {{"epoch", epoch}, {"why", st.error().message}};
        note(st.error().message + "; " + m_task + " evaluates each epoch itself" + (m_refused ? std::string() : " until the evaluator answers") +
             (hint.empty() ? std::string() : " (hint: " + hint + ")"));
        return false;
    }

    // Starts the evaluator task (a new one after a loss) and its link. Refused (a process that
    // answers but will not take it) is final: m_refused.
    Status startTask()
    {
        if (!m_client) {
            auto c = WorkerClient::connect(m_label, m_address, m_o.token, {}, /*ownConnection=*/true);
            if (!c.ok()) {
                m_refused = true;  // a malformed address does not get better
                return c.error();
            }
            m_client = std::move(c).value();
        }
        if (auto pulse = m_client->heartbeat(1s); !pulse.ok()) return pulse.error();
        TS_ASSIGN(std::string tfConfig, m_spec.tfConfigFor({"evaluator", 0}));
        StartTaskOptions so;
        so.coordinator = m_o.who;
        Status st = m_client->startTask(m_o.runId, m_cfg.toJson(), tfConfig, "evaluator", 0, so);
        if (!st.ok()) {
            auto who = m_client->identify(1s);
            if (!who.ok()) return st;  // not there (any more): asked again later
            if (who->state == "running" && who->runId == m_o.runId) {
                // This run's old task (its stream broke, say): replaced by a new one once it ended.
                (void)m_client->cancel(m_o.runId, kCancelFailed);
                for (int i = 0; i < 30 && who.ok() && who->state == "running"; ++i) {
                    std::this_thread::sleep_for(100ms);
                    who = m_client->identify(1s);
                }
                st = m_client->startTask(m_o.runId, m_cfg.toJson(), tfConfig, "evaluator", 0, so);
            } else if (who->state == "running" || who->reserved) {
                // Busy with another run: an old chief's, whose loss it has not noticed yet (a
                // restarted chief), or another cluster's. Asked again later.
                return makeError(ErrorCode::IoError, st.error().message, "it takes this run once that one ends");
            }
        }
        if (!st.ok()) {
            m_refused = m_client->heartbeat(1s).ok();  // it answers, and said no
            return st;
        }
        m_client->allowStreams();
        m_link = std::make_unique<EvaluatorLink>(*m_client, m_label, m_o.runId, m_o.heartbeatTimeout);
        m_started = true;
        return okStatus();
    }

    void evaluate(const Job& job)
    {
        SidecarResult r;
        r.epoch = job.epoch;
        r.submission = job.number;
        if ((!m_link || m_link->rejoinable()) && !m_refused) {
            // Gone (or not reached yet): one quick try before each evaluation.
            m_link.reset();
            const bool before = m_started, announced = m_announced;
            if (tryStart(job.epoch)) {
                if (before) ++m_rejoins;
                if (before || announced)
                    note(m_label + (before ? " answers again" : " answers") + ": it evaluates from epoch " + std::to_string(job.epoch) + " on");
            }
        }
        if (m_link && !m_link->lost()) {
            auto v = m_link->evaluate(job.epoch, m_cancelled, &job.weights);
            if (v.ok()) {
                if (stale(job)) return;
                r.value = *v;
                r.by = "evaluator:0";
                ++m_evaluations["evaluator:0"];
                m_onResult(r);
                return;
            }
            if (m_cancelled) return;
            if (!m_link->rejoinable()) m_refused = true;
            m_lost = {{"epoch", job.epoch}, {"why", v.error().message}};
            note(v.error().message + "; " + m_task + " evaluates " + (m_refused ? "from now on" : "until it answers again"));
        }
        // Here: on the chief's own test split.
        r.by = m_task;
        const bool repeated = m_hereFailed.has_value();
        auto v = evaluateHere(job);
        if (!v.ok() && (m_cancelled || repeated)) return;
        if (stale(job)) return;
        if (v.ok()) {
            r.value = *v;
            ++m_evaluations[m_task];
        } else {
            r.error = v.error();
        }
        m_onResult(r);
    }

    // The epoch was submitted again since (replayed after a restart): this result is of the
    // weights of an attempt that failed; neither counted nor reported.
    bool stale(const Job& job)
    {
        std::lock_guard lock(m_mutex);
        return m_latest[job.epoch] != job.number;
    }

    Result<EvalResult> evaluateHere(const Job& job)
    {
        if (m_hereFailed) return *m_hereFailed;  // no test split here: said once
        if (!m_here) {
            RunEvaluatorOptions eo;
            eo.runId = m_o.runId;
            eo.who = m_task;
            eo.pullFromPs = false;
            // One thread: beside the chief's training, whose peers wait for it at every step.
            RunConfig c = m_cfg;
            c.strategy.threads = 1;
            auto made = RunEvaluator::create(c, m_spec, eo);
            if (!made.ok()) {
                m_hereFailed = made.error();
                m_hereFailed->message = m_task + " cannot evaluate either (" + m_hereFailed->message + "): the run goes on without validation";
                return *m_hereFailed;
            }
            m_here = std::move(made).value();
        }
        return m_here->evaluateEncoded(job.weights, epochWeightsName(job.epoch));
    }

    const RunConfig m_cfg;
    const ClusterSpec m_spec;
    const SidecarOptions m_o;
    const std::function<void(const SidecarResult&)> m_onResult;
    const std::function<void(const std::string&)> m_onNote;
    std::string m_task, m_address, m_label;

    std::mutex m_mutex;
    std::condition_variable m_cv;
    std::optional<Job> m_pending;
    bool m_stopping = false;
    std::string m_reason;
    std::atomic<bool> m_cancelled{false};
    int64_t m_skipped = 0;  // under m_mutex until the thread is joined
    uint64_t m_submissions = 0;  // under m_mutex
    std::map<int64_t, uint64_t> m_latest;  // each epoch's latest submission, under m_mutex

    // The helper thread's only (finish() reads them after joining it).
    std::thread m_thread;
    std::unique_ptr<WorkerClient> m_client;
    std::unique_ptr<EvaluatorLink> m_link;
    std::unique_ptr<RunEvaluator> m_here;
    std::optional<Error> m_hereFailed;  // it could not be made: said once, later epochs go unevaluated
    bool m_refused = false;
    bool m_started = false;    // a task was started (a later one is a rejoin)
    bool m_announced = false;  // that it could not be started was said
    std::map<std::string, int64_t> m_evaluations;
    int64_t m_rejoins = 0;
    nlohmann::json m_lost = nlohmann::json::object();
    nlohmann::json m_final = nlohmann::json::object();
};

SidecarEvaluation::SidecarEvaluation(std::unique_ptr<Impl> impl) : m_impl(std::move(impl)) {}
SidecarEvaluation::~SidecarEvaluation() { (void)m_impl->finish(""); }

Result<std::unique_ptr<SidecarEvaluation>> SidecarEvaluation::create(const RunConfig& cfg, const ClusterSpec& spec, SidecarOptions options,
                                                                     std::function<void(const SidecarResult&)> onResult,
                                                                     std::function<void(const std::string&)> onNote)
{
    if (!cfg.validate) return makeError(ErrorCode::InvalidArgument, "the run does not validate: its evaluator has nothing to do");
    if (spec.count("evaluator") == 0 || !spec.hasTask())
        return makeError(ErrorCode::InvalidArgument, spec.source() + ": no evaluator task, or no task for this process");
    TS_ASSIGN(RunConfig c, evaluatorConfig(cfg));
    auto impl = std::make_unique<Impl>(std::move(c), spec, std::move(options), std::move(onResult), std::move(onNote));
    impl->start();
    return std::unique_ptr<SidecarEvaluation>(new SidecarEvaluation(std::move(impl)));
}

uint64_t SidecarEvaluation::submit(int64_t epoch, std::string weights) { return m_impl->submit(epoch, std::move(weights)); }
nlohmann::json SidecarEvaluation::finish(const std::string& reason) { return m_impl->finish(reason); }
void SidecarEvaluation::cancel() { m_impl->cancel(); }

Status releaseUnusedEvaluator(const RunConfig& cfg, const ClusterSpec& spec, const SidecarOptions& options, const std::atomic<bool>& stop)
{
    const std::string address = spec.addresses("evaluator").front();
    const std::string label = "evaluator:0 at " + address;
    TS_ASSIGN(auto client, WorkerClient::connect(label, address, options.token, {}, /*ownConnection=*/true));
    TS_ASSIGN(std::string tfConfig, spec.tfConfigFor({"evaluator", 0}));
    TS_ASSIGN(const RunConfig c, evaluatorConfig(cfg));
    const nlohmann::json sent = c.toJson();
    StartTaskOptions so;
    so.coordinator = options.who;
    const auto deadline = std::chrono::steady_clock::now() + options.connectTimeout;
    for (;;) {
        if (stop) return makeError(ErrorCode::Cancelled, "the run ended before " + label + " answered");
        // One that answers but refuses may be busy with an old chief's task, which ends.
        Status st = makeError(ErrorCode::IoError, label + " did not answer");
        if (client->heartbeat(1s).ok()) {
            st = client->startTask(options.runId, sent, tfConfig, "evaluator", 0, so);
            if (st.ok()) return st;
        }
        if (std::chrono::steady_clock::now() >= deadline) return st;
        for (int i = 0; i < 10 && !stop; ++i) std::this_thread::sleep_for(100ms);
    }
}

} // namespace ts::remote
