#include "remote/worker_service.h"
#include "remote/listen_check.h"
#include "train/backup.h"
#include "data/autotune.h"

#include <filesystem>

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "distribute/cluster_spec.h"
#include "distribute/step_schedule.h"
#include "io/safetensors.h"
#include "remote/cluster.h"
#include "remote/parameter_service.h"
#include "remote/ps_client.h"
#include "remote/run_evaluator.h"
#include "remote/rendezvous.h"
#include "remote/worker_client.h"
#include "telemetry/bus.h"
#include "telemetry/sampler.h"
#include "train/run_config.h"
#include "worker.grpc.pb.h"

#ifndef TS_VERSION
#define TS_VERSION "unknown"
#endif

namespace ts::remote {
namespace {

double nowSeconds()
{
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

grpc::Status refuse(const grpc::ServerContext& ctx, grpc::StatusCode code, const std::string& call, const std::string& why)
{
    logLine("refused " + call + " from " + ctx.peer() + ": " + why);
    return grpc::Status(code, why);
}

class WorkerService final : public Worker::Service {
public:
    WorkerService(const WorkerOptions& o, ParameterService* ps)
        : m_token(o.token), m_name(o.name), m_backupRoot(o.backupRoot.empty() ? defaultBackupRoot() : o.backupRoot), m_tls(o.tls), m_ps(ps),
          m_maxWeightsBytes(o.maxWeightsBytes), m_firstStreamSeconds(o.firstStreamSeconds), m_onlyTaskType(o.onlyTaskType), m_dataDir(o.dataDir), m_onTaskState(o.onTaskState) {}
    ~WorkerService() override { shutdown(); }

    // The daemon names itself host:port once it listens, while calls may already arrive.
    void setName(std::string name)
    {
        std::lock_guard lock(m_mutex);
        m_name = std::move(name);
    }
    std::string name()
    {
        std::lock_guard lock(m_mutex);
        return m_name;
    }

    void shutdown()
    {
        // No StartTask in flight: one past its m_shutdown check would start a task after this
        // join, or join m_thread together with it.
        std::lock_guard starting(m_startMutex);
        std::unique_lock lock(m_mutex);
        m_shutdown = true;
        // The task's "cancelled" says why (its state event's reason): the coordinator takes a
        // task stopped on its machine for a lost one, not for the run's cancellation.
        if (m_state == "running" && !m_cancelRequested) m_cancelReason = kCancelShutdown;
        if (m_cancelReason == kCancelShutdown && m_cross) {
            // The peers hear a lost task (which --restarts takes back), not a cancelled run: told
            // before the trainer's cancel (first told, first kept), outside the lock (the note
            // goes to the rendezvous, up to 2 s when the chief is unreachable).
            const std::shared_ptr<Communicator> cross = m_cross;
            lock.unlock();
            cross->abort(shutdownCause());
            lock.lock();
        }
        if (m_trainer) m_trainer->cancel();
        if (m_store) m_store->cancel();
        m_cancelRequested = true;
        m_cv.notify_all();
        lock.unlock();
        if (m_thread.joinable()) m_thread.join();
    }

    grpc::Status Identify(grpc::ServerContext* ctx, const IdentifyRequest*, IdentifyReply* reply) override
    {
        if (auto st = checkToken(*ctx, m_token, "Worker.Identify"); !st.ok()) return st;
        reply->set_worker(name());
        reply->set_version(TS_VERSION);
        char host[256] = {};
        ::gethostname(host, sizeof host - 1);
        reply->set_hostname(host);
        reply->set_pid(static_cast<int32_t>(::getpid()));
        const long cores = std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
        const int64_t memory = static_cast<int64_t>(::sysconf(_SC_PHYS_PAGES)) * static_cast<int64_t>(::sysconf(_SC_PAGE_SIZE));
        double load[1] = {0};
        const double perCore = ::getloadavg(load, 1) == 1 ? std::min(1.0, load[0] / static_cast<double>(cores)) : -1;
        for (long c = 0; c < cores; ++c) {
            auto* d = reply->add_devices();
            d->set_name("cpu:" + std::to_string(c));
            d->set_kind("cpu");
            d->set_memory_bytes(memory);  // host memory, shared by the cores
            d->set_load(perCore);
        }
        std::lock_guard lock(m_mutex);
        // Stopping (SIGTERM) after its task ended: not idle, it takes no run (a coordinator
        // restarting one waits for its successor instead of failing its reservation).
        reply->set_state(m_shutdown && m_state != "running" ? "shutting down" : m_state);
        if (m_state == "running") {
            reply->set_run_id(m_runId);
            reply->set_coordinator(m_coordinator);
            reply->set_seconds(secondsSince(m_runStarted));
        } else if (reservedByOther({})) {
            reply->set_reserved(true);
            reply->set_run_id(m_reservedRun);
            reply->set_coordinator(m_reservedBy);
            reply->set_seconds(secondsSince(m_reservedAt));
        }
        return grpc::Status::OK;
    }

    grpc::Status Reserve(grpc::ServerContext* ctx, const ReserveRequest* req, ReserveReply*) override
    {
        const char* call = "Worker.Reserve";
        if (auto st = checkToken(*ctx, m_token, call); !st.ok()) return st;
        if (req->run_id().empty() || req->seconds() < 1 || req->seconds() > 60)
            return refuse(*ctx, grpc::StatusCode::INVALID_ARGUMENT, call, "need a run_id and 1..60 seconds");
        std::lock_guard lock(m_mutex);
        if (m_shutdown) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the worker is shutting down");
        if (m_state == "running") return refuse(*ctx, grpc::StatusCode::FAILED_PRECONDITION, call, busyText());
        if (reservedByOther(req->run_id())) return refuse(*ctx, grpc::StatusCode::FAILED_PRECONDITION, call, reservedText());
        m_reservedRun = req->run_id();
        knowRun(req->run_id());
        m_reservedBy = req->coordinator().empty() ? ctx->peer() : req->coordinator();
        m_reservedAt = std::chrono::steady_clock::now();
        m_reservedUntil = m_reservedAt + std::chrono::seconds(req->seconds());
        return grpc::Status::OK;
    }

    grpc::Status StartTask(grpc::ServerContext* ctx, const StartTaskRequest* req, StartTaskReply*) override
    {
        if (auto st = checkToken(*ctx, m_token, "Worker.StartTask"); !st.ok()) return st;
        const std::string call = "Worker.StartTask";
        if (req->run_id().empty() || req->run_id().size() > 128)
            return refuse(*ctx, grpc::StatusCode::INVALID_ARGUMENT, call, "run_id must be 1..128 characters");
        const std::string source = "task " + req->task_type() + ":" + std::to_string(req->task_index()) + " of run " + req->run_id();
        // Who this worker is in the cluster first, then what to run.
        auto spec = ClusterSpec::fromText(req->cluster_json(), source + ": cluster");
        if (!spec.ok()) return refuse(*ctx, grpc::StatusCode::INVALID_ARGUMENT, call, spec.error().toString());
        auto withTask = spec->withTask({req->task_type(), req->task_index()});
        if (!withTask.ok()) return refuse(*ctx, grpc::StatusCode::INVALID_ARGUMENT, call, withTask.error().toString());

        nlohmann::json j = nlohmann::json::parse(req->run_config_json(), nullptr, false);
        if (j.is_discarded()) return refuse(*ctx, grpc::StatusCode::INVALID_ARGUMENT, call, source + ": the run configuration is not valid JSON");
        auto cfg = RunConfig::fromJson(j, source);
        if (!cfg.ok()) return refuse(*ctx, grpc::StatusCode::INVALID_ARGUMENT, call, cfg.error().toString());
        if (!cfg->modelFile.empty() || !cfg->saveWeights.empty() || !cfg->loadWeights.empty())
            return refuse(*ctx, grpc::StatusCode::INVALID_ARGUMENT, call,
                          source + ": a remote task must inline its model and name no weight files (model_file, load_weights, save_weights)");
        if (cfg->backup.enabled()) {
            // A folder name the coordinator chose, kept under this daemon's backup root: it can
            // neither escape it nor name another path on this machine.
            if (Status named = checkRemoteBackupName(cfg->backup.dir, source); !named.ok())
                return refuse(*ctx, grpc::StatusCode::INVALID_ARGUMENT, call, named.error().message);
            cfg->backup.dir = (std::filesystem::path(m_backupRoot) / cfg->backup.dir).string();
            cfg->backup.restarts = 0;  // the coordinator restarts runs
            // Said now, naming this daemon's setting: the trainer's own error would point at the
            // coordinator's --backup-dir, which only names the folder.
            if (Status root = ensureBackupRoot(m_backupRoot); !root.ok())
                return refuse(*ctx, grpc::StatusCode::INVALID_ARGUMENT, call,
                              source + ": this worker cannot keep backups: its --backup-root " + m_backupRoot +
                                  " is not a folder it can write (" + root.error().message + "); start trainstudio-worker with a --backup-root this user can write, or run without --backup-dir");
        }
        const bool ps = isParameterServer(cfg->strategy.kind);
        if (auto v = withTask->validateFor(ps ? "parameter-server" : "multi-worker-mirrored"); !v.ok())
            return refuse(*ctx, grpc::StatusCode::INVALID_ARGUMENT, call, v.error().toString());
        const std::string& type = withTask->task().type;
        if (ps ? (type != "ps" && type != "worker" && type != "evaluator") : (type != "chief" && type != "worker" && type != "evaluator"))
            return refuse(*ctx, grpc::StatusCode::INVALID_ARGUMENT, call,
                          source + ": a " + (ps ? "parameter-server" : "multi-worker-mirrored") + " run has no " + type + " tasks to start");
        if (!m_onlyTaskType.empty() && type != m_onlyTaskType)
            return refuse(*ctx, grpc::StatusCode::INVALID_ARGUMENT, call,
                          source + ": " + name() + " takes only " + m_onlyTaskType + " tasks (it is a train --task " + m_onlyTaskType +
                              " process, not a trainstudio-worker)");
        if (!m_dataDir.empty()) {
            cfg->dataDir = m_dataDir;
            if (cfg->pipeline && cfg->pipeline->source.kind == SourceKind::Idx) cfg->pipeline->source.dir = m_dataDir;
        }
        // worker 0 initialises the ps tasks from its imported weights
        if (req->initial_weights_sent() && (type == "ps" || type == "evaluator"))
            return refuse(*ctx, grpc::StatusCode::INVALID_ARGUMENT, call,
                          source + ": a " + type + " task takes no initial weights; send them to the workers");
        if (req->join_running() && (!ps || type != "worker"))
            return refuse(*ctx, grpc::StatusCode::INVALID_ARGUMENT, call,
                          source + ": only a parameter-server worker joins a run in progress (join_running)");
        if (req->send_epoch_weights() && (ps || withTask->task() != withTask->coordinator()))
            return refuse(*ctx, grpc::StatusCode::INVALID_ARGUMENT, call,
                          source + ": only the chief of a multi-worker-mirrored run sends its weights after each epoch (send_epoch_weights)");
        cfg->strategy.joinRunning = req->join_running();
        std::lock_guard starting(m_startMutex);  // one StartTask at a time past this point
        std::unique_lock lock(m_mutex);
        if (m_state == "running") return refuse(*ctx, grpc::StatusCode::FAILED_PRECONDITION, call, busyText());
        if (reservedByOther(req->run_id())) return refuse(*ctx, grpc::StatusCode::FAILED_PRECONDITION, call, reservedText());
        if (m_shutdown) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the worker is shutting down");
        // The coordinator's --load-weights, sent (and checked) by SendWeights just before.
        std::shared_ptr<const SafetensorsFile> initial;
        std::string initialName;
        if (req->initial_weights_sent()) {
            if (!m_sentWeights || m_sentWeightsRun != req->run_id())
                return refuse(*ctx, grpc::StatusCode::INVALID_ARGUMENT, call,
                              source + ": no initial weights were sent for this run (SendWeights comes before StartTask)");
            initial = std::move(m_sentWeights);
            initialName = m_sentWeightsName;
        }
        m_sentWeights = nullptr;  // taken, or another run's
        m_sentWeightsRun.clear();
        lock.unlock();
        if (m_thread.joinable()) m_thread.join();  // the previous task has finished
        lock.lock();
        m_runId = req->run_id();
        knowRun(m_runId);
        ++m_taskGeneration;
        m_coordinator = req->coordinator().empty() ? ctx->peer() : req->coordinator();
        m_runStarted = std::chrono::steady_clock::now();
        m_reservedRun.clear();  // taken up
        m_events.clear();
        m_eventsBase = 0;
        m_trace = req->trace();
        m_traceLayers = req->trace_layers();
        m_step = 0;
        m_state = "running";
        m_cancelRequested = false;
        m_cancelReason.clear();
        m_coordinatorLeft = false;
        m_streamOpened = false;
        m_task = withTask->task().toString();
        m_psTask = type == "ps";
        m_evaluatorTask = type == "evaluator";
        m_sendEpochWeights = req->send_epoch_weights();
        m_evaluatorPulls = ps;
        m_evalRequests.clear();
        logLine("starting " + m_task + " of run " + m_runId + " for " + ctx->peer());
        m_thread = std::thread([this, c = std::move(cfg).value(), s = std::move(withTask).value(), initial, initialName]() mutable {
            runTask(std::move(c), std::move(s), initial.get(), initialName);
        });
        lock.unlock();
        if (m_onTaskState) m_onTaskState("running", {}, {});
        return grpc::Status::OK;
    }

    grpc::Status StreamEvents(grpc::ServerContext* ctx, const StreamEventsRequest* req, grpc::ServerWriter<Event>* writer) override
    {
        if (auto st = checkToken(*ctx, m_token, "Worker.StreamEvents"); !st.ok()) return st;
        std::unique_lock lock(m_mutex);
        if (req->run_id() != m_runId || m_runId.empty())
            return refuse(*ctx, grpc::StatusCode::NOT_FOUND, "Worker.StreamEvents", "no run " + req->run_id() + " on this worker");
        const std::string runId = m_runId;
        const uint64_t generation = m_taskGeneration;
        m_streamOpened = true;
        // Positions count every event of the run; a new stream starts at the oldest one kept.
        std::size_t sent = m_eventsBase;
        ++m_streams;
        struct Leave {
            WorkerService& s;
            ~Leave() { --s.m_streams; }
        } leave{*this};
        const auto end = [&] { return m_eventsBase + m_events.size(); };
        for (;;) {
            m_cv.wait_for(lock, std::chrono::milliseconds(200), [&] { return sent < end() || m_state != "running"; });
            if (m_runId != runId) return grpc::Status(grpc::StatusCode::ABORTED, "a new run replaced " + runId);
            // A parameter-server worker's new task of the same run (it rejoined): this stream was
            // the old task's, and its coordinator is not gone.
            if (m_taskGeneration != generation) return grpc::Status(grpc::StatusCode::ABORTED, "a new task of run " + runId + " replaced it");
            if (ctx->IsCancelled()) return coordinatorGone(lock, ctx->peer());
            std::vector<Event> batch(m_events.begin() + static_cast<std::ptrdiff_t>(sent - m_eventsBase), m_events.end());
            sent = end();
            // Not at shutdown itself: the task's last events (its "cancelled") come first, so the
            // coordinator does not take a daemon stopped mid-task for a clean end. shutdown()
            // cancels the task and joins it before the server's grace period ends the stream.
            const bool finished = m_state != "running";
            lock.unlock();
            bool delivered = true;
            for (const auto& e : batch)
                if (!(delivered = writer->Write(e))) break;
            lock.lock();
            if (!delivered) return coordinatorGone(lock, ctx->peer());
            // The coordinator has them: a long run (or one that traces every step) would
            // otherwise keep every event it ever sent in this daemon's memory.
            if (m_runId == runId && m_streams == 1 && sent > m_eventsBase) {
                m_events.erase(m_events.begin(), m_events.begin() + static_cast<std::ptrdiff_t>(sent - m_eventsBase));
                m_eventsBase = sent;
            }
            if (finished && sent == end()) return grpc::Status::OK;
        }
    }

    // The coordinator's stream broke (it died, or was stopped): nobody would record this task's
    // results or stop it, so it is cancelled rather than left training for nobody.
    grpc::Status coordinatorGone(std::unique_lock<std::mutex>&, const std::string& peer)
    {
        if (m_state == "running") cancelForLostCoordinator("the coordinator " + peer + " left run " + m_runId + ": cancelling it");
        return grpc::Status::CANCELLED;
    }

    // With m_mutex held.
    void cancelForLostCoordinator(const std::string& why)
    {
        m_cancelRequested = true;
        m_cancelReason.clear();
        m_coordinatorLeft = true;
        if (m_trainer) m_trainer->cancel();
        if (m_store) m_store->cancel();
        m_cv.notify_all();
        logLine(why);
    }

    // With m_mutex held; called every half second or so while a task runs. Its coordinator died
    // between StartTask and opening the task's event stream when none was opened in time.
    void cancelIfNeverWatched()
    {
        if (m_firstStreamSeconds <= 0 || m_streamOpened || m_state != "running" || m_cancelRequested) return;
        if (secondsSince(m_runStarted) < m_firstStreamSeconds) return;
        cancelForLostCoordinator("the coordinator " + m_coordinator + " opened no event stream for " + m_task + " of run " + m_runId + " within " +
                                 std::to_string(m_firstStreamSeconds) + " s of starting it: cancelling it");
    }

    grpc::Status Cancel(grpc::ServerContext* ctx, const CancelRequest* req, CancelReply*) override
    {
        if (auto st = checkToken(*ctx, m_token, "Worker.Cancel"); !st.ok()) return st;
        std::lock_guard lock(m_mutex);
        if (!req->run_id().empty() && req->run_id() == m_sentWeightsRun) {
            m_sentWeights = nullptr;
            m_sentWeightsRun.clear();
        }
        if (!req->run_id().empty() && req->run_id() == m_reservedRun) {
            // The coordinator gives up before starting this task (another of its workers was
            // busy): the worker is free again at once, not when the reservation lapses.
            m_reservedRun.clear();
            logLine("reservation for run " + req->run_id() + " released by " + ctx->peer());
            return grpc::Status::OK;
        }
        if (req->run_id() != m_runId) return refuse(*ctx, grpc::StatusCode::NOT_FOUND, "Worker.Cancel", "no run " + req->run_id() + " on this worker");
        m_cancelRequested = true;
        m_cancelReason = req->reason();
        if (m_trainer) m_trainer->cancel();
        if (m_store) m_store->cancel();
        m_cv.notify_all();
        logLine((m_cancelReason == kCancelDone     ? "stopping " + m_task + " of run " + m_runId + ": the run is over"
                 : m_cancelReason == kCancelFailed ? "stopping " + m_task + " of run " + m_runId + ": another task of the run failed"
                                              : "cancelling run " + m_runId) +
                " (asked by " + ctx->peer() + ")");
        return grpc::Status::OK;
    }

    grpc::Status SendWeights(grpc::ServerContext* ctx, grpc::ServerReader<WeightsPart>* reader, SendWeightsReply*) override
    {
        const char* call = "Worker.SendWeights";
        if (auto st = checkToken(*ctx, m_token, call); !st.ok()) return st;
        WeightsPart part;
        if (!reader->Read(&part)) return refuse(*ctx, grpc::StatusCode::INVALID_ARGUMENT, call, "no weights were sent");
        const std::string runId = part.run_id(), name = part.name().empty() ? "the initial weights" : part.name();
        const int64_t total = part.total_bytes();
        if (runId.empty() || runId.size() > 128) return refuse(*ctx, grpc::StatusCode::INVALID_ARGUMENT, call, "run_id must be 1..128 characters");
        if (total <= 0) return refuse(*ctx, grpc::StatusCode::INVALID_ARGUMENT, call, name + ": total_bytes must be > 0");
        if (total > m_maxWeightsBytes)
            return refuse(*ctx, grpc::StatusCode::RESOURCE_EXHAUSTED, call,
                          name + " is " + std::to_string(total) + " bytes, more than this worker holds (--max-weights-bytes " +
                              std::to_string(m_maxWeightsBytes) + ")");
        {
            std::lock_guard lock(m_mutex);
            if (m_state == "running" && !evaluatesRun(runId)) return refuse(*ctx, grpc::StatusCode::FAILED_PRECONDITION, call, busyText());
            if (reservedByOther(runId)) return refuse(*ctx, grpc::StatusCode::FAILED_PRECONDITION, call, reservedText());
            m_sentWeights = nullptr;  // the next SendWeights replaces what was kept
            m_sentWeightsRun.clear();
        }
        std::string bytes;
        bytes.reserve(static_cast<std::size_t>(total));
        do {
            if (part.run_id() != runId || part.total_bytes() != total)
                return refuse(*ctx, grpc::StatusCode::INVALID_ARGUMENT, call, name + ": every part must name the same run and total_bytes");
            if (static_cast<int64_t>(bytes.size() + part.data().size()) > total)
                return refuse(*ctx, grpc::StatusCode::INVALID_ARGUMENT, call, name + ": more than the " + std::to_string(total) + " bytes announced");
            bytes += part.data();
        } while (reader->Read(&part));
        if (static_cast<int64_t>(bytes.size()) != total)
            return refuse(*ctx, grpc::StatusCode::INVALID_ARGUMENT, call,
                          name + ": got " + std::to_string(bytes.size()) + " of the " + std::to_string(total) + " bytes announced");
        // Checked now, as a file would be: a damaged transfer fails before any task starts.
        auto decoded = decodeSafetensors(bytes, name);
        if (!decoded.ok()) return refuse(*ctx, grpc::StatusCode::INVALID_ARGUMENT, call, decoded.error().toString());
        bytes = std::string();
        std::lock_guard lock(m_mutex);
        if (m_state == "running" && !evaluatesRun(runId)) return refuse(*ctx, grpc::StatusCode::FAILED_PRECONDITION, call, busyText());
        if (reservedByOther(runId)) return refuse(*ctx, grpc::StatusCode::FAILED_PRECONDITION, call, reservedText());
        m_sentWeights = std::make_shared<const SafetensorsFile>(std::move(decoded).value());
        m_sentWeightsRun = runId;
        m_sentWeightsName = name;
        // A long transfer must not let the run's reservation lapse before its StartTask.
        if (m_reservedRun == runId) m_reservedUntil = std::max(m_reservedUntil, std::chrono::steady_clock::now() + std::chrono::seconds(30));
        return grpc::Status::OK;
    }

    grpc::Status CaptureTrace(grpc::ServerContext* ctx, const CaptureTraceRequest* req, CaptureTraceReply* reply) override
    {
        const char* call = "Worker.CaptureTrace";
        if (auto st = checkToken(*ctx, m_token, call); !st.ok()) return st;
        std::lock_guard lock(m_mutex);
        if (req->run_id() != m_runId || m_runId.empty())
            return refuse(*ctx, grpc::StatusCode::NOT_FOUND, call, "no run " + req->run_id() + " on this worker");
        if (req->steps() <= 0 || req->steps() > 1000000)
            return refuse(*ctx, grpc::StatusCode::INVALID_ARGUMENT, call, "steps must be in [1, 1000000], got " + std::to_string(req->steps()));
        auto decline = [&](const std::string& why) {
            reply->set_started(false);
            reply->set_reason(m_task + ": " + why);
            return grpc::Status::OK;
        };
        if (m_state != "running") return decline("the task is " + m_state);
        if (m_psTask) return decline("a ps task has no steps to trace (its spans come with a traced run)");
        if (m_evaluatorTask) return decline("an evaluator task has no steps to trace");
        if (!m_trainer) return decline("the task is not training yet");
        if (m_trace) return decline("the task traces every step already");
        if (!m_trainer->requestTrace(req->steps(), req->layers())) return decline("another trace is in progress in this daemon");
        logLine(m_task + " of run " + m_runId + ": tracing the next " + std::to_string(req->steps()) + " step(s) for " + ctx->peer());
        reply->set_started(true);
        return grpc::Status::OK;
    }

    grpc::Status Evaluate(grpc::ServerContext* ctx, const EvaluateRequest* req, EvaluateReply*) override
    {
        const char* call = "Worker.Evaluate";
        if (auto st = checkToken(*ctx, m_token, call); !st.ok()) return st;
        std::lock_guard lock(m_mutex);
        if (req->run_id() != m_runId || m_runId.empty())
            return refuse(*ctx, grpc::StatusCode::NOT_FOUND, call, "no run " + req->run_id() + " on this worker");
        if (!m_evaluatorTask) return refuse(*ctx, grpc::StatusCode::FAILED_PRECONDITION, call, m_task + " is not an evaluator task");
        if (m_state != "running") return refuse(*ctx, grpc::StatusCode::FAILED_PRECONDITION, call, m_task + " is " + m_state);
        if (m_evalRequests.size() >= 16)
            return refuse(*ctx, grpc::StatusCode::RESOURCE_EXHAUSTED, call, m_task + " has 16 evaluations waiting already");
        EvalRequest r{req->epoch(), req->seq(), nullptr, {}};
        if (req->weights_sent()) {
            if (!m_sentWeights || m_sentWeightsRun != req->run_id())
                return refuse(*ctx, grpc::StatusCode::FAILED_PRECONDITION, call,
                              "no weights were sent for run " + req->run_id() + " (SendWeights comes before Evaluate)");
            r.weights = std::move(m_sentWeights);
            r.weightsName = m_sentWeightsName;
            m_sentWeightsRun.clear();
        } else if (!m_evaluatorPulls) {
            return refuse(*ctx, grpc::StatusCode::INVALID_ARGUMENT, call,
                          m_task + " evaluates a multi-worker-mirrored run: it has no ps tasks to pull from; send the weights (weights_sent)");
        }
        m_evalRequests.push_back(std::move(r));
        m_cv.notify_all();
        return grpc::Status::OK;
    }

    grpc::Status Heartbeat(grpc::ServerContext* ctx, const HeartbeatPing*, HeartbeatPong* reply) override
    {
        if (auto st = checkToken(*ctx, m_token, "Worker.Heartbeat"); !st.ok()) return st;
        std::lock_guard lock(m_mutex);
        reply->set_state(m_state);
        reply->set_step(m_step);
        reply->set_wall_time(nowSeconds());
        return grpc::Status::OK;
    }

private:
    // What a task's peers hear when its daemon shuts down under it: a lost task, not a cancel.
    static Error shutdownCause()
    {
        return makeError(ErrorCode::IoError, "its trainstudio-worker shut down", "start that trainstudio-worker again; with --restarts the run takes it back");
    }

    static double secondsSince(std::chrono::steady_clock::time_point t)
    {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
    }
    // With m_mutex held: this worker runs `runId`'s evaluator task (it takes weights to evaluate).
    bool evaluatesRun(const std::string& runId) const { return m_evaluatorTask && m_state == "running" && m_runId == runId; }
    // With m_mutex held: another run than `runId` holds an unexpired reservation.
    bool reservedByOther(const std::string& runId) const
    {
        return !m_reservedRun.empty() && m_reservedRun != runId && std::chrono::steady_clock::now() < m_reservedUntil;
    }
    std::string busyText() const
    {
        return "this worker is running run " + m_runId + " for " + m_coordinator + " (started " + elapsedText(secondsSince(m_runStarted)) + " ago)";
    }
    std::string reservedText() const
    {
        // A coordinator that died between reserving and starting leaves it until it lapses.
        const double left = std::max(0.0, -secondsSince(m_reservedUntil));
        return "this worker is reserved for run " + m_reservedRun + " by " + m_reservedBy + " (" + elapsedText(secondsSince(m_reservedAt)) +
               " ago; it lapses in " + elapsedText(std::ceil(left)) + " unless that run starts)";
    }

    void publish(const std::string& kind, int64_t step, const nlohmann::json& fields, const std::string& device = {},
                 std::string payload = {})
    {
        Event e;
        if (!payload.empty()) e.set_payload(std::move(payload));
        e.set_run_id(m_runId);
        e.set_worker(m_task);
        e.set_device(device.empty() ? m_device : device);
        e.set_kind(kind);
        e.set_step(step);
        e.set_wall_time(nowSeconds());
        e.set_json(fields.dump());
        std::lock_guard lock(m_mutex);
        m_events.push_back(std::move(e));
        m_step = step;
        m_cv.notify_all();
    }

    // The trainer's weights as "weights" events (safetensors bytes in parts that fit any message
    // limit); after epoch `epoch` (> 0) or at the end. A failure to export is logged and sent as
    // a note; the run itself has trained.
    void publishWeights(Trainer& trainer, int64_t epoch = 0)
    {
        const int64_t step = trainer.globalStep();
        auto bytes = trainer.encodeWeights(m_task + "'s weights");
        if (!bytes.ok()) {
            logLine("run " + m_runId + ": cannot send the weights: " + bytes.error().toString());
            publish("log", step, {{"level", static_cast<int>(telemetry::LogLevel::Warning)}, {"message", "the chief could not send its weights: " + bytes.error().message}});
            return;
        }
        constexpr std::size_t kPart = 1 << 20;
        const std::size_t total = bytes->size();
        const std::size_t parts = std::max<std::size_t>(1, (total + kPart - 1) / kPart);
        for (std::size_t i = 0; i < parts; ++i) {
            nlohmann::json j = {{"part", i}, {"parts", parts}, {"bytes", total}};
            if (epoch > 0) j["epoch"] = epoch;
            publish("weights", step, j, {}, bytes->substr(i * kPart, kPart));
        }
    }

    // Spans of one drain go as one "spans" event, at most kSpansPerEvent each (a traced step of a
    // small model makes dozens: one event apiece would cost more than the spans).
    static constexpr std::size_t kSpansPerEvent = 1000;

    void forwardSpans(nlohmann::json& spans, int64_t step)
    {
        if (spans.empty()) return;
        publish("spans", step, {{"spans", std::move(spans)}});
        spans = nlohmann::json::array();
    }

    // Drains `sub` until `running` is false and it is empty: the trainer's (or a ps task's)
    // telemetry goes back on the event stream.
    void forwardBus(telemetry::Subscription& sub, const std::atomic<bool>& running)
    {
        nlohmann::json spans = nlohmann::json::array();
        while (running || sub.pending() > 0) {
            sub.wait(std::chrono::milliseconds(200));
            {
                std::lock_guard lock(m_mutex);
                cancelIfNeverWatched();
            }
            int64_t lastStep = 0;
            for (const auto& ev : sub.drain()) {
                if (const auto* sp = std::get_if<telemetry::SpanEvent>(&ev)) {
                    nlohmann::json j = {{"name", sp->name}, {"category", sp->category}, {"device", sp->stamp.lane.device},
                                        {"thread", sp->stamp.lane.thread}, {"step", sp->stamp.step}, {"start_us", sp->startUs},
                                        {"duration_us", sp->durationUs}, {"wall_us", sp->stamp.wallTimeUs}};
                    if (!sp->args.empty()) j["args"] = sp->args;
                    spans.push_back(std::move(j));
                    lastStep = sp->stamp.step;
                    if (spans.size() >= kSpansPerEvent) forwardSpans(spans, lastStep);
                } else {
                    forward(ev);
                }
            }
            forwardSpans(spans, lastStep);
        }
    }

    static telemetry::SubscriberOptions streamSubscription()
    {
        telemetry::SubscriberOptions so;
        so.name = "worker stream";
        so.kinds = telemetry::kindMask<telemetry::DeviceSampleEvent, telemetry::StepBreakdownEvent, telemetry::PipelineSampleEvent,
                                       telemetry::SpanEvent, telemetry::LogEvent>();
        so.capacity = 1 << 16;  // a traced step of a layered model makes hundreds of spans
        so.wakeThreshold = 256;
        return so;
    }

    void forward(const telemetry::Event& ev)
    {
        if (const auto* p = std::get_if<telemetry::PipelineSampleEvent>(&ev)) {
            publish("pipeline", p->stamp.step, {{"stage", p->stage}, {"produced", p->produced}, {"busy_seconds", p->busySeconds},
                                                {"queue_depth", p->queueDepth}, {"queue_capacity", p->queueCapacity},
                                                {"wait_seconds", p->waitSeconds}, {"parallelism", p->parallelism}});
        } else if (const auto* l = std::get_if<telemetry::LogEvent>(&ev)) {
            publish("log", l->stamp.step, {{"level", static_cast<int>(l->level)}, {"message", l->message}});
        } else if (const auto* d = std::get_if<telemetry::DeviceSampleEvent>(&ev)) {
            publish("sample", d->stamp.step, {{"utilisation", d->utilisation}, {"per_core", d->perCore}, {"process_cpu", d->processCpu},
                                              {"memory_used", d->memoryUsed}, {"memory_total", d->memoryTotal},
                                              {"temperature_c", d->temperatureC}, {"power_w", d->powerW}},
                    d->stamp.lane.device.empty() ? "host" : d->stamp.lane.device);
        } else if (const auto* b = std::get_if<telemetry::StepBreakdownEvent>(&ev)) {
            publish("breakdown", b->stamp.step, {{"step_seconds", b->stepSeconds}, {"input", b->input}, {"forward", b->forward},
                                                 {"backward", b->backward}, {"communication", b->communication},
                                                 {"optimizer", b->optimizer}, {"other", b->other}});
        }
    }

    class Listener final : public TrainListener {
    public:
        explicit Listener(WorkerService& s) : m_s(s) {}
        void onStep(const StepEvent& e) override
        {
            nlohmann::json j = {{"epoch", e.epoch}, {"loss", e.loss}, {"samples_per_sec", e.samplesPerSec},
                                {"learning_rate", e.learningRate}, {"step_seconds", e.stepSeconds}, {"batch_size", e.batchSize}};
            if (std::isfinite(e.accuracy)) j["accuracy"] = e.accuracy;  // none for a regression
            if (e.staleness >= 0) j["staleness"] = e.staleness;
            if (e.lossScale > 0) {
                j["loss_scale"] = e.lossScale;
                j["skipped_steps"] = e.skippedSteps;
            }
            m_s.publish("step", e.step, j);
            m_lastStep = e.step;
        }
        // Here, not from the bus: the steps replayed after the resume follow it on the stream, so
        // the coordinator rewinds the record before they arrive, never after.
        void onResume(const TrainingPosition& at, const ResumeSource&) override
        {
            m_s.publish("resumed", at.step, {{"after_step", at.step}});
            m_lastStep = at.step;
        }
        void onEpoch(const EpochEvent& e) override
        {
            // For the run's evaluator task (through the coordinator); on the training thread, so
            // the weights are this epoch's.
            if (m_s.m_sendEpochWeights && m_s.m_trainer) m_s.publishWeights(*m_s.m_trainer, e.epoch);
            nlohmann::json j = {{"epoch", e.epoch}, {"steps", e.steps}, {"loss", e.loss},
                                {"samples_per_sec", e.samplesPerSec}, {"seconds", e.seconds}};
            if (std::isfinite(e.accuracy)) j["accuracy"] = e.accuracy;
            if (std::isfinite(e.valLoss)) j["val_loss"] = e.valLoss;
            if (std::isfinite(e.valAccuracy)) j["val_accuracy"] = e.valAccuracy;
            m_s.publish("epoch", m_lastStep, j);
            // The coordinator prints a task's warnings (naming it) and records them in the run's
            // log. Replicas in lockstep skip the same steps: the first process says it for all.
            const bool says = m_s.m_trainer && (!m_s.m_trainer->strategy().lockstep() || m_s.m_trainer->strategy().processRank() == 0);
            if (const auto skipped = allStepsSkipped(e); skipped && says)
                m_s.publish("log", m_lastStep, {{"level", static_cast<int>(telemetry::LogLevel::Warning)},
                                                {"message", skipped->message + " (" + skipped->hint + ")"}});
        }

    private:
        WorkerService& m_s;
        // The training thread's own: m_s.m_step also moves with the forwarded telemetry's steps.
        int64_t m_lastStep = 0;
    };

    // refused: the task refused the run before training (prepareRun, the initial weights), as a
    // local run refuses bad input before its first step; the coordinator exits 2 for it.
    // code: the failure's, which tells the coordinator whether a restart could get past it
    // (restartableFailure: a data error found mid-epoch would only fail again).
    void finish(const std::string& state, const std::string& message, const std::string& hint = {}, bool refused = false,
                ErrorCode code = ErrorCode::Internal)
    {
        int64_t step = 0;
        std::string reason;  // a cancelled task's: the Cancel's reason (kCancelDone, kCancelFailed), kCancelShutdown, or none
        {
            std::lock_guard lock(m_mutex);  // publish() moves m_step on the forwarding thread too
            step = m_step;
            reason = m_cancelReason;
        }
        // A task that ends otherwise with a message (an evaluator with nothing to evaluate) says it as a note.
        if (!message.empty() && state == "failed")
            publish("error", step, {{"message", message}, {"hint", hint}, {"where", m_task}, {"refused", refused}, {"code", errorCodeName(code)}});
        else if (!message.empty()) publish("log", step, {{"level", static_cast<int>(telemetry::LogLevel::Info)}, {"message", message}});
        nlohmann::json fields = {{"state", state}, {"message", message}};
        if (state == "cancelled" && !reason.empty()) fields["reason"] = reason;
        publish("state", step, fields);
        bool left = false;
        {
            std::lock_guard lock(m_mutex);
            m_state = state;
            m_trainer = nullptr;
            m_cross = nullptr;
            left = m_coordinatorLeft && state == "cancelled";
            m_cv.notify_all();
            logLine("run " + m_runId + " " + state + (message.empty() ? "" : ": " + message));
        }
        if (m_onTaskState) m_onTaskState(left ? "left" : state, message, hint);
    }

    void fail(const Error& e, bool refused = false) { finish("failed", e.message, e.hint, refused, e.code); }

    // The end of a task that serves until it is stopped (a ps task, an evaluator): only the
    // coordinator's "the run is over" is its completion; a failure elsewhere, the user's cancel
    // or this daemon shutting down is not.
    void finishServing()
    {
        std::string reason;
        {
            std::lock_guard lock(m_mutex);
            reason = m_cancelReason;  // kCancelShutdown when the daemon stopped it
        }
        finish(reason == kCancelDone ? "completed" : "cancelled", {});
    }

    // A ps task: host this run's shard until the coordinator stops the task (Cancel), which is
    // how a ps task ends: it has no steps of its own.
    void runParameterServer(const RunConfig& cfg)
    {
        const nlohmann::json optimizer = cfg.optimizer.is_null() ? cfg.model.compile.optimizer : cfg.optimizer;
        // Its telemetry, like a worker's: the host's and this process's CPU and memory, the
        // shard's counters every second, and with a traced run a span per update and pull.
        telemetry::EventBus bus;
        auto sub = bus.subscribe(streamSubscription());
        bool trace = false;
        {
            std::lock_guard lock(m_mutex);
            trace = m_trace;
        }
        // ps:0 schedules the run's steps: each epoch all of whose steps have an outcome is the
        // run's epoch, with every worker's loss and accuracy in it (the coordinator evaluates then).
        auto onEpoch = [this](const EpochDone& e) {
            const StepTally& t = e.tally;
            const double n = static_cast<double>(std::max<int64_t>(1, t.count));
            publish("epoch", e.lastStep, {{"epoch", e.epoch}, {"steps", t.steps}, {"loss", t.lossSum / n},
                                          {"accuracy", static_cast<double>(t.correct) / n}, {"seconds", t.seconds},
                                          {"samples_per_sec", t.seconds > 0 ? static_cast<double>(t.count) / t.seconds : 0.0}});
        };
        if (auto st = m_ps->host(m_runId, m_task, optimizer, cfg.strategy.backend, trace ? &bus : nullptr, onEpoch); !st.ok())
            return fail(st.error());
        std::atomic<int64_t> version{0};
        telemetry::SamplerOptions so;
        so.hz = 2;
        so.runId = m_runId;
        so.step = &version;
        telemetry::DeviceSampler sampler(so);
        if (auto started = sampler.start(bus); !started.ok()) logLine(m_task + ": no device samples: " + started.error().message);
        std::atomic<bool> forwarding{true};
        std::thread forwarder([&] { forwardBus(*sub, forwarding); });
        publish("state", 0, {{"state", "running"}, {"role", "ps"}});
        auto shardCounters = [](const ShardStats& st) {
            return nlohmann::json{{"updates", st.version}, {"pulls", st.pulls},  {"elements", st.elements},
                                  {"bytes_in", st.bytesIn}, {"bytes_out", st.bytesOut}, {"busy_seconds", st.busySeconds}};
        };
        {
            std::unique_lock lock(m_mutex);
            auto nextCounters = std::chrono::steady_clock::now() + std::chrono::seconds(1);
            // Progress for the coordinator's heartbeat: the updates applied so far.
            while (!m_cancelRequested && !m_shutdown) {
                m_cv.wait_for(lock, std::chrono::milliseconds(500));
                cancelIfNeverWatched();
                const ShardStats st = m_ps->stats();
                version = st.version;
                m_step = st.version;
                if (std::chrono::steady_clock::now() >= nextCounters && st.initialised) {
                    lock.unlock();
                    publish("ps", st.version, shardCounters(st));
                    lock.lock();
                    nextCounters = std::chrono::steady_clock::now() + std::chrono::seconds(1);
                }
            }
        }
        const ShardStats st = m_ps->stats();
        m_ps->unhost();  // before the bus goes: the service publishes spans on it
        sampler.stop();
        forwarding = false;
        forwarder.join();
        bus.unsubscribe(sub);
        if (st.initialised) publish("ps", st.version, shardCounters(st));
        nlohmann::json final = {{"updates", st.version}, {"pulls", st.pulls}, {"elements", st.elements}, {"staleness_max", st.maxStaleness},
                                {"staleness_mean", st.version > 0 ? st.sumStaleness / static_cast<double>(st.version) : 0.0}};
        if (st.stepsCompleted >= 0) final["steps_completed"] = st.stepsCompleted;  // ps:0: the run's steps with an outcome
        publish("final", st.version, final);
        finishServing();
    }

    // An evaluator task (TF's side-car evaluator): evaluates weights on this machine's test split
    // whenever the coordinator asks (Evaluate), until it is stopped: the ps tasks' (pulled), or a
    // multi-worker-mirrored chief's after an epoch (sent with the request).
    void runEvaluator(const RunConfig& cfg, const ClusterSpec& spec)
    {
        RunEvaluatorOptions eo;
        eo.runId = m_runId;
        eo.token = m_token;
        eo.tls = m_tls;
        eo.who = m_task;
        eo.pullFromPs = isParameterServer(cfg.strategy.kind);
        // A run it has nothing to do for: its chief starts it anyway, so that it hears why and
        // ends (a `train --task evaluator:0` process exits) instead of waiting for weights.
        if (const std::string why = RunEvaluator::nothingToEvaluate(cfg); !why.empty())
            return finish("completed", m_task + " has nothing to evaluate: " + why);
        auto created = RunEvaluator::create(cfg, spec, eo);
        if (!created.ok()) return fail(created.error());
        std::unique_ptr<RunEvaluator> evaluator = std::move(created).value();
        if (evaluator->store()) {
            std::lock_guard lock(m_mutex);
            m_store = evaluator->store();  // a Cancel ends a pull in progress
            if (m_cancelRequested) m_store->cancel();
        }
        publish("state", 0, {{"state", "running"}, {"role", "evaluator"}});
        int64_t evaluations = 0;
        double seconds = 0;
        std::unique_lock lock(m_mutex);
        while (!m_cancelRequested && !m_shutdown) {
            if (m_evalRequests.empty()) {
                m_cv.wait_for(lock, std::chrono::milliseconds(500));
                cancelIfNeverWatched();
                continue;
            }
            const EvalRequest r = std::move(m_evalRequests.front());
            m_evalRequests.pop_front();
            lock.unlock();
            const auto began = std::chrono::steady_clock::now();
            auto v = r.weights ? evaluator->evaluate(*r.weights, r.weightsName) : evaluator->evaluate();
            const double took = secondsSince(began);
            nlohmann::json j = {{"seq", r.seq}, {"epoch", r.epoch}};
            if (v.ok()) {
                j.update({{"val_loss", v->loss}, {"val_accuracy", v->accuracy}, {"examples", v->examples}, {"seconds", took}});
                ++evaluations;
                seconds += took;
                logLine(m_task + " of run " + m_runId + ": epoch " + std::to_string(r.epoch) + ": val_accuracy " + std::to_string(v->accuracy) +
                        " (" + std::to_string(v->examples) + " examples)");
            } else {
                j.update({{"error", v.error().message}, {"hint", v.error().hint}});
                logLine(m_task + " of run " + m_runId + ": epoch " + std::to_string(r.epoch) + ": " + v.error().message);
            }
            publish("evaluation", r.epoch, j);
            lock.lock();
            m_step = r.epoch;
        }
        m_store = nullptr;
        lock.unlock();
        publish("final", m_step, {{"evaluations", evaluations}, {"seconds", seconds}});
        finishServing();
    }

    // `initial`: weights every training task starts from (the coordinator's --load-weights), or null.
    void runTask(RunConfig cfg, ClusterSpec spec, const SafetensorsFile* initial, const std::string& initialName)
    {
        m_device = "host";
        if (spec.task().type == "evaluator") {
            // Evaluations are occasional: beside training tasks it takes no more than their share.
            if (cfg.strategy.threads == 0) cfg.strategy.threads = spec.sharedHostThreads(spec.task(), defaultCpuBudget());
            publish("state", 0, {{"state", "connecting"}});
            return runEvaluator(cfg, spec);
        }
        if (cfg.strategy.threads == 0 && spec.task().type != "ps") {
            if (const int t = spec.sharedHostThreads(spec.task(), defaultCpuBudget()); t > 0) {
                cfg.strategy.threads = t;
                logLine(m_task + " shares this machine with " + std::to_string(spec.trainingTasksSharingHost(spec.task()) - 1) +
                        " other training task(s) of run " + m_runId + ": it uses " + std::to_string(t) + " thread(s)");
            }
        }
        publish("state", 0, {{"state", "connecting"}});
        std::shared_ptr<RemoteParameterStore> store;
        nlohmann::json running;
        if (isParameterServer(cfg.strategy.kind)) {
            if (spec.task().type == "ps") return runParameterServer(cfg);
            PsClientOptions po;
            po.spec = spec;
            po.runId = m_runId;
            po.token = m_token;
            po.worker = m_task;
            po.tls = m_tls;  // the ps tasks are daemons like this one, with the same TLS
            po.partition = cfg.strategy.partition;
            auto connected = RemoteParameterStore::connect(po);
            if (!connected.ok()) return fail(connected.error());
            store = std::move(connected).value();
            {
                std::lock_guard lock(m_mutex);
                m_store = store;
                if (m_cancelRequested) store->cancel();
            }
            cfg.strategy.kind = "parameter-server";
            cfg.strategy.parameterStore = store;
            cfg.strategy.processRank = spec.task().index;
            cfg.strategy.numWorkers = spec.count("worker");
            cfg.validate = false;  // the coordinator evaluates the ps tasks' weights
            running = {{"state", "running"}, {"rank", spec.task().index}, {"size", spec.count("worker")}};
        } else {
            ClusterOptions co;
            co.token = m_token;
            co.group = m_runId;
            co.tls = m_tls;  // the rendezvous is served by a daemon like this one, with the same TLS
            co.rendezvousAlreadyServed = spec.task() == spec.coordinator();  // served by this daemon
            co.cancelled = [this] { return m_cancelRequested.load(); };
            co.waiting = [](const std::string& line) { logLine(line); };
            auto joined = connectCluster(spec, co);
            if (!joined.ok()) {
                if (joined.error().code == ErrorCode::Cancelled && m_cancelRequested) return finish("cancelled", {});
                return fail(joined.error());
            }
            cfg.strategy.kind = "multi-worker-mirrored";
            cfg.strategy.crossProcess = joined->communicator;
            {
                std::lock_guard lock(m_mutex);
                m_cross = joined->communicator;
            }
            cfg.strategy.processRank = joined->rank;
            cfg.strategy.processNames = joined->rankNames;
            cfg.strategy.collectiveTimeout = co.timeout;
            running = {{"state", "running"}, {"rank", joined->rank}, {"size", joined->size}};
        }
        auto prepared = prepareRun(cfg);
        // This task gives up after the cluster formed: the others learn why at once, not that it
        // stopped responding (and their daemons are free again as soon as this one is).
        auto abandonCluster = [&](const Error& cause) {
            if (!cfg.strategy.crossProcess) return;
            bool shutDown = false;
            {
                std::lock_guard lock(m_mutex);
                shutDown = m_cancelReason == kCancelShutdown;
            }
            cfg.strategy.crossProcess->abort(shutDown ? shutdownCause() : cause);
        };
        // Drops this task's link to the ps tasks; says whether the task was asked to stop.
        auto dropStore = [&] {
            std::lock_guard lock(m_mutex);
            m_store = nullptr;
            return m_cancelRequested.load();
        };
        if (!prepared.ok()) {
            abandonCluster(prepared.error());
            const bool cancelled = dropStore();
            if (cancelled && prepared.error().code == ErrorCode::Cancelled) return finish("cancelled", {});
            // A refusal of the run (its model, data or settings), not a collective broken while
            // agreeing on them or an I/O error: as restartableFailure tells them apart.
            const bool refusal = !restartableFailure(prepared.error()) && prepared.error().code != ErrorCode::Cancelled;
            return fail(prepared.error(), refusal);
        }
        PreparedRun run = std::move(prepared).value();
        if (initial) {
            if (Status st = run.trainer->strategy().importParameters(initial->inOrder(), initialName); !st.ok()) {
                abandonCluster(st.error());
                dropStore();
                return fail(st.error(), /*refused=*/true);
            }
        }
        {
            std::lock_guard lock(m_mutex);
            std::string devices;
            nlohmann::json used = nlohmann::json::array();
            for (const auto& d : run.trainer->strategy().devices()) {
                devices += (devices.empty() ? "" : ",") + d.name;
                used.push_back({{"device", d.device.toString()}, {"name", d.name}, {"memory_total", d.memoryTotal}});
            }
            running["devices"] = std::move(used);  // the coordinator records them with the run
            m_device = devices;
            m_trainer = run.trainer.get();
            if (m_cancelRequested) {
                if (m_cancelReason == kCancelShutdown && m_cross) m_cross->abort(shutdownCause());
                m_trainer->cancel();
            }
        }
        publish("state", 0, running);
        // The trainer's device samples, step breakdowns, input pipeline samples, trace spans and
        // notes go back on the stream too, each with its device (the listener above
        // carries the metrics).
        telemetry::EventBus bus;
        auto sub = bus.subscribe(streamSubscription());
        bool trace = false, traceLayers = false;
        {
            std::lock_guard lock(m_mutex);
            trace = m_trace;
            traceLayers = m_traceLayers;
        }
        run.trainer->setTelemetry(&bus, m_runId, trace, traceLayers);
        // A "pipeline" section: its stall windows per stage (the studio's input view, the advisor).
        if (run.pipeline) run.pipeline->setTelemetry(&bus, m_runId);
        std::atomic<bool> forwarding{true};
        std::thread forwarder([&] { forwardBus(*sub, forwarding); });
        Listener listener(*this);
        auto result = run.trainer->fit(*run.trainSource(), run.validationSource(), &listener);
        forwarding = false;
        forwarder.join();
        bus.unsubscribe(sub);
        {
            std::lock_guard lock(m_mutex);
            m_trainer = nullptr;
        }
        nlohmann::json final = {{"steps", result.ok() ? result->steps : 0}};
        if (store && result.ok() && !result->cancelled) {
            // The last pushes land before this task says it is done: the coordinator then pulls
            // the final weights.
            Status flushed = store->flush();
            if (!flushed.ok()) result = flushed.error();
            const StalenessStats st = store->staleness();
            final["pushes"] = st.pushes;
            final["staleness_max"] = st.max;
            final["staleness_mean"] = st.pushes > 0 ? st.sum / static_cast<double>(st.pushes) : 0.0;
        }
        dropStore();
        // The chief of a multi-worker run hands the run's weights to the coordinator, which keeps
        // them with the run (the workers write no files it names). A stopped run's too, as a
        // local run keeps them: a step broken off by the stop was not applied.
        const bool chief = !store && spec.task() == spec.coordinator();
        if (!result.ok() && m_cancelRequested) {
            // Told to cancel, the tasks stop at their own next step: one still in a collective
            // sees its peers leave. That is the cancel, not a failure.
            logLine("run " + m_runId + " cancelled (" + result.error().message + ")");
            bool byUser = false;  // not because another task failed
            std::string reason;
            int64_t step = 0;
            {
                std::lock_guard lock(m_mutex);
                byUser = m_cancelReason.empty();
                reason = m_cancelReason;
                step = m_step;
            }
            // Stopped because another task failed, while failing for a reason of its own (a
            // chief refusing its backup, whose peer's "the chief could not restore the run's
            // backup (its error says why)" reached the coordinator first): that reason still goes
            // back, for the coordinator to report instead of the pointer to it (any other task
            // error arriving then is only logged).
            if (reason == kCancelFailed && result.error().code != ErrorCode::Cancelled)
                publish("error", step, {{"message", result.error().message}, {"hint", result.error().hint}, {"where", m_task},
                                        {"code", errorCodeName(result.error().code)}});
            if (chief && byUser) publishWeights(*run.trainer);
            return finish("cancelled", {});
        }
        if (!result.ok()) return fail(result.error());
        if (chief) publishWeights(*run.trainer);
        if (result->cancelled) return finish("cancelled", {});
        final["epochs"] = result->epochs;
        final["samples_per_sec"] = result->samplesPerSec;
        final["seconds"] = result->seconds;
        final["loss"] = result->last.loss;
        final["accuracy"] = result->last.accuracy;
        publish("final", result->steps, final);
        finish("completed", {});
    }

public:
    // Whether this daemon's rendezvous serves `key`: one of a run a coordinator reserved or
    // started here lately (its group is the run id, "<run>/restart-1" for a restart: a daemon
    // started again in place knows only that), or that group's heartbeat. Other groups come from
    // tasks that took this daemon's address for a TF_CONFIG task's.
    bool servesKey(const std::string& key) const
    {
        std::lock_guard lock(m_knownRunsMutex);
        return std::any_of(m_knownRuns.begin(), m_knownRuns.end(),
                           [&](const std::string& run) { return key == run || (key.size() > run.size() && key.starts_with(run) && key[run.size()] == '/'); });
    }

private:
    void knowRun(const std::string& run)
    {
        std::lock_guard lock(m_knownRunsMutex);
        if (std::find(m_knownRuns.begin(), m_knownRuns.end(), run) != m_knownRuns.end()) return;
        m_knownRuns.push_back(run);
        if (m_knownRuns.size() > 64) m_knownRuns.pop_front();  // late calls of long-gone runs may be refused
    }

    // Own lock: the rendezvous asks on gRPC threads, whatever holds m_mutex meanwhile.
    mutable std::mutex m_knownRunsMutex;
    std::deque<std::string> m_knownRuns;

    std::string m_token;
    std::string m_name;
    std::string m_backupRoot;  // remote tasks' backup folders live under it
    TlsFiles m_tls;
    ParameterService* m_ps;                          // the daemon's; hosts this daemon's ps task
    int64_t m_maxWeightsBytes;
    int m_firstStreamSeconds;
    const std::string m_onlyTaskType;  // WorkerOptions'
    const std::string m_dataDir;
    const std::function<void(const std::string&, const std::string&, const std::string&)> m_onTaskState;
    bool m_coordinatorLeft = false;  // the running task was cancelled because its coordinator's stream broke
    bool m_streamOpened = false;     // an event stream was opened for the running task
    // SendWeights: initial weights checked and kept for m_sentWeightsRun until its StartTask.
    std::shared_ptr<const SafetensorsFile> m_sentWeights;
    std::string m_sentWeightsRun, m_sentWeightsName;
    std::shared_ptr<RemoteParameterStore> m_store;   // a parameter-server worker's link to the ps tasks
    std::shared_ptr<Communicator> m_cross;           // a multi-worker task's link to its peers, from the join to its end
    std::mutex m_startMutex;
    std::mutex m_mutex;
    std::condition_variable m_cv;
    std::string m_state = "idle";
    std::string m_runId, m_task, m_device;
    uint64_t m_taskGeneration = 0;  // StartTasks so far: a stream serves the task it was opened for
    std::string m_coordinator;  // who started m_runId
    std::chrono::steady_clock::time_point m_runStarted;
    std::string m_reservedRun, m_reservedBy;  // Reserve: held for this run until m_reservedUntil
    std::chrono::steady_clock::time_point m_reservedAt, m_reservedUntil;
    std::deque<Event> m_events;  // not yet delivered (and, while several streams read, all)
    std::size_t m_eventsBase = 0;  // events of this run dropped from the front once delivered
    int m_streams = 0;             // open StreamEvents calls
    bool m_trace = false, m_traceLayers = false;  // StartTaskRequest's
    bool m_psTask = false;
    bool m_evaluatorTask = false;
    bool m_evaluatorPulls = false;     // the evaluator task's run has ps tasks to pull weights from
    bool m_sendEpochWeights = false;   // StartTaskRequest's send_epoch_weights
    struct EvalRequest {
        int64_t epoch = 0, seq = 0;
        std::shared_ptr<const SafetensorsFile> weights;  // sent (multi-worker-mirrored); null: pull the ps tasks'
        std::string weightsName;
    };
    std::deque<EvalRequest> m_evalRequests;  // an evaluator task's, oldest first
    int64_t m_step = 0;
    Trainer* m_trainer = nullptr;
    std::atomic<bool> m_cancelRequested{false};
    std::string m_cancelReason;  // the last Cancel's (CancelRequest.reason)
    bool m_shutdown = false;
    std::thread m_thread;
};

} // namespace

bool isLoopbackHost(const std::string& host)
{
    return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

class WorkerDaemon::Impl {
public:
    std::unique_ptr<ParameterService> ps;  // before worker: the worker service points at it
    std::unique_ptr<WorkerService> worker;
    std::unique_ptr<grpc::Service> rendezvous;
    std::unique_ptr<grpc::Server> server;
    int port = 0;
    std::atomic<bool> stopped{false};
};

WorkerDaemon::WorkerDaemon(std::unique_ptr<Impl> impl) : m_impl(std::move(impl)) {}
WorkerDaemon::~WorkerDaemon()
{
    shutdown();
    m_impl->server->Wait();
}
int WorkerDaemon::port() const { return m_impl->port; }

void WorkerDaemon::shutdown()
{
    if (m_impl->stopped.exchange(true)) return;
    m_impl->worker->shutdown();
    // Ends open event streams and blocked rendezvous calls after a grace period.
    m_impl->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

void WorkerDaemon::wait() { m_impl->server->Wait(); }

Result<std::unique_ptr<WorkerDaemon>> WorkerDaemon::start(const WorkerOptions& options)
{
    TS_ASSIGN(HostPort hp, HostPort::parse(options.listen, true));
    {
        // An address that is neither an IP nor a name this machine resolves is a typo, whatever
        // --allow-remote says.
        addrinfo hints{};
        hints.ai_socktype = SOCK_STREAM;
        addrinfo* found = nullptr;
        const int rc = ::getaddrinfo(hp.host.c_str(), nullptr, &hints, &found);
        if (found) ::freeaddrinfo(found);
        if (rc != 0)
            return makeError(ErrorCode::InvalidArgument, "cannot listen on " + options.listen + ": '" + hp.host + "' is not an address (" + ::gai_strerror(rc) + ")",
                             "use 127.0.0.1:PORT (this machine only), or with --allow-remote one of this machine's addresses");
    }
    if (!options.allowRemote && !isLoopbackHost(hp.host))
        return makeError(ErrorCode::InvalidArgument, "refusing to listen on " + options.listen + ": not a loopback address",
                         "other machines can reach a non-loopback address; pass --allow-remote to mean it (and use TLS)");
    if (options.token.empty())
        return makeError(ErrorCode::InvalidArgument, "trainstudio-worker needs a shared token", "pass --token-file or set $" + std::string(kTokenEnv));
    TS_TRY(checkCanListen(options.listen, "trainstudio-worker"));
    TS_ASSIGN(auto creds, serverCredentials(options.tls));
    auto impl = std::make_unique<Impl>();
    impl->ps = std::make_unique<ParameterService>(options.token, options.maxMessageBytes);
    impl->worker = std::make_unique<WorkerService>(options, impl->ps.get());
    WorkerService* worker = impl->worker.get();
    impl->rendezvous = makeRendezvousService(options.token, 1 << 20, kRendezvousIdleExpiry,
                                             [worker](const std::string& key) { return worker->servesKey(key); });
    grpc::ServerBuilder builder;
    // gRPC turns SO_REUSEPORT on by default: a second server on a taken port then "listens" too
    // and the kernel splits connections between the two at random.
    builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    // A coordinator whose machine vanished or was cut off closes no socket: without pings its
    // event stream would wait out TCP's retransmissions (many minutes) while the task trains for
    // nobody. An open stream is pinged after 10 s without traffic from the coordinator, and a
    // ping unanswered for 5 s ends the stream (the task is then cancelled, as when its
    // coordinator leaves).
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
    builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
    builder.AddListeningPort(options.listen, creds, &impl->port);
    builder.RegisterService(impl->worker.get());
    builder.RegisterService(impl->rendezvous.get());
    builder.RegisterService(impl->ps->service());
    builder.SetMaxReceiveMessageSize(options.maxMessageBytes);
    builder.SetMaxSendMessageSize(options.maxMessageBytes);
    impl->server = builder.BuildAndStart();
    if (!impl->server || impl->port == 0) {
        // checkCanListen found the port free: with TLS, gRPC refused the certificate and key.
        if (!options.tls.certificate.empty())
            return makeError(ErrorCode::InvalidArgument,
                             "cannot listen on " + options.listen + " with the TLS certificate " + options.tls.certificate + " and key " +
                                 options.tls.privateKey + " (gRPC refused them, its message is above; or the port was taken meanwhile)",
                             "--tls-key must be the private key of --tls-cert (their public keys match: compare "
                             "openssl x509 -noout -pubkey -in CERT with openssl pkey -pubout -in KEY)");
        return makeError(ErrorCode::IoError, "cannot listen on " + options.listen, "is the port in use, or the address not on this machine?");
    }
    if (options.name.empty()) impl->worker->setName(hp.host + ":" + std::to_string(impl->port));
    return std::unique_ptr<WorkerDaemon>(new WorkerDaemon(std::move(impl)));
}

} // namespace ts::remote
