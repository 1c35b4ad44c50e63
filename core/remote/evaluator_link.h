#pragma once
// EvaluatorLink: a distributed run's link to its evaluator task (TF's side-car evaluator) on a
// trainstudio-worker daemon (or a `train --task evaluator:0` process). Asked to evaluate, the
// task pulls the ps tasks' weights on its own machine (parameter-server), or evaluates the
// weights sent with the request (multi-worker-mirrored: the chief's after an epoch); the result
// comes back on its event stream, which a thread of this link reads.
// Contract:
//  - Threading: evaluate(), stop() and the queries belong to one thread (the one that drives
//    the evaluations); the link's own thread reads the event stream. The client must outlive it.
//  - Lost (its stream broke, its task failed, it went silent, or it refused) it stays lost:
//    the caller evaluates elsewhere, or starts a new task and a new link (rejoinable()).
//  - Errors name the evaluator (its label) and say what happened; Cancelled when `cancelled`
//    was set while waiting.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/result.h"
#include "remote/worker_client.h"
#include "train/trainer.h"

namespace ts::remote {

// The name a multi-worker chief's weights after `epoch` go by in messages.
std::string epochWeightsName(int64_t epoch);

class EvaluatorLink {
public:
    // `taskRun`: the run id its task was started with; heartbeatTimeout: how long it may stop
    // answering while it evaluates.
    EvaluatorLink(WorkerClient& client, std::string label, std::string taskRun, std::chrono::milliseconds heartbeatTimeout);
    ~EvaluatorLink();
    bool lost() const { return m_lost; }
    // Lost because its machine or daemon went away (its stream broke off or ended, it went
    // silent), not because its task failed or refused: a new task may do better once the
    // daemon answers again. A task that fails (no test split, weights over its bound) would
    // fail again.
    bool rejoinable() const { return m_lost && m_gone; }

    // Evaluates the ps tasks' weights now, or `weights` (safetensors bytes) when given: the
    // run's epoch `epoch`. Waits for the result while the evaluator answers heartbeats, at most
    // max(5 min, 10x the last evaluation) (then its task is cancelled); an error (the link is
    // lost then) names the evaluator.
    Result<EvalResult> evaluate(int64_t epoch, const std::atomic<bool>& cancelled, const std::string* weights = nullptr);

    // Stops the task (`reason` as Cancel's) and waits a moment for its end (not for a lost
    // one's); its "final" fields.
    nlohmann::json stop(const std::string& reason);

private:
    WorkerClient& m_client;
    const std::string m_label, m_taskRun;
    const std::chrono::milliseconds m_heartbeatTimeout;
    std::thread m_stream;
    std::mutex m_mutex;
    std::condition_variable m_cv;
    std::map<int64_t, nlohmann::json> m_results;  // by seq
    std::string m_problem, m_hint, m_state;
    nlohmann::json m_final = nlohmann::json::object();
    bool m_ended = false;
    bool m_taskFailed = false;  // its task reported an error
    bool m_lost = false;        // the driving thread's only, as are the ones below
    bool m_gone = false;
    double m_lastSeconds = 0;   // the last evaluation's
    int64_t m_seq = 0;
};

} // namespace ts::remote
