#include "remote/evaluator_link.h"

#include <algorithm>
#include <optional>

namespace ts::remote {

std::string epochWeightsName(int64_t epoch) { return "the chief's weights after epoch " + std::to_string(epoch); }

EvaluatorLink::EvaluatorLink(WorkerClient& client, std::string label, std::string taskRun, std::chrono::milliseconds heartbeatTimeout)
    : m_client(client), m_label(std::move(label)), m_taskRun(std::move(taskRun)), m_heartbeatTimeout(heartbeatTimeout)
{
    m_stream = std::thread([this] {
        Status st = m_client.streamEvents(m_taskRun, [this](const WorkerEvent& e) {
            std::lock_guard lock(m_mutex);
            if (e.kind == "evaluation") {
                m_results[e.fields.value("seq", int64_t{-1})] = e.fields;
            } else if (e.kind == "error" && m_problem.empty()) {
                m_problem = e.fields.value("message", std::string("failed"));
                m_hint = e.fields.value("hint", "");
                m_taskFailed = true;
            } else if (e.kind == "final") {
                m_final = e.fields;
            } else if (e.kind == "state") {
                m_state = e.fields.value("state", "");
            }
            m_cv.notify_all();
        });
        std::lock_guard lock(m_mutex);
        m_ended = true;
        if (!st.ok() && st.error().code != ErrorCode::Cancelled && m_problem.empty()) {
            m_problem = st.error().message;
            m_hint = st.error().hint;
        }
        m_cv.notify_all();
    });
}

EvaluatorLink::~EvaluatorLink()
{
    m_client.cancelStream();
    m_stream.join();
}

Result<EvalResult> EvaluatorLink::evaluate(int64_t epoch, const std::atomic<bool>& cancelled, const std::string* weights)
{
    if (m_lost) return makeError(ErrorCode::Internal, m_label + " was lost");
    const int64_t seq = ++m_seq;
    auto lose = [&](std::string why, std::string hint) -> Result<EvalResult> {
        m_lost = true;
        return makeError(ErrorCode::IoError, std::move(why), std::move(hint));
    };
    // A task that failed (no test split on its machine, say) is named by its own error.
    auto ended = [&]() -> std::optional<Result<EvalResult>> {
        if (m_problem.empty() && !m_ended) return std::nullopt;
        m_gone = !m_taskFailed;
        // A broken stream's error names the evaluator already; its task's own error does not.
        const bool named = m_problem.rfind(m_label, 0) == 0;
        return lose(named ? m_problem : m_label + ": " + (m_problem.empty() ? "its task ended (" + m_state + ")" : m_problem),
                    m_hint.empty() ? "see that worker's log" : m_hint);
    };
    {
        std::lock_guard lock(m_mutex);
        if (auto e = ended()) return *e;
    }
    Status asked = weights ? m_client.sendWeights(m_taskRun, epochWeightsName(epoch), *weights, false) : okStatus();
    if (asked.ok()) asked = m_client.requestEvaluation(m_taskRun, epoch, seq, weights != nullptr);
    if (Status st = std::move(asked); !st.ok()) {
        {
            // Its stream may say why (a task that failed names its own error) a moment later.
            std::unique_lock lock(m_mutex);
            m_cv.wait_for(lock, std::chrono::seconds(1), [&] { return !m_problem.empty() || m_ended; });
            if (auto e = ended()) return *e;
        }
        // Refused by a daemon that still answers, or not heard by one that does not?
        m_gone = !m_client.heartbeat(std::chrono::seconds(1)).ok();
        return lose(st.error().message, st.error().hint);
    }
    const auto requested = std::chrono::steady_clock::now();
    auto lastAnswer = requested;
    // An evaluation that never ends (a hung task answering heartbeats) must not hold the
    // coordinator, which reads every task's stream between evaluations, for good.
    const auto limit = std::chrono::duration<double>(std::max(300.0, 10 * m_lastSeconds));
    std::unique_lock lock(m_mutex);
    for (;;) {
        if (auto it = m_results.find(seq); it != m_results.end()) {
            const nlohmann::json r = std::move(it->second);
            m_results.erase(it);
            if (r.contains("error"))
                return lose(m_label + " could not evaluate epoch " + std::to_string(epoch) + ": " + r.value("error", ""), r.value("hint", ""));
            EvalResult v;
            v.loss = r.value("val_loss", 0.0);
            v.accuracy = r.value("val_accuracy", 0.0);
            v.examples = r.value("examples", int64_t{0});
            m_lastSeconds = r.value("seconds", 0.0);
            return v;
        }
        if (auto e = ended()) return *e;
        if (cancelled) return makeError(ErrorCode::Cancelled, "stopped");
        if (m_cv.wait_for(lock, std::chrono::milliseconds(500), [&] { return m_results.count(seq) || !m_problem.empty() || m_ended; }))
            continue;
        // Still there? A machine that vanished closes no stream.
        lock.unlock();
        const auto pulse = m_client.heartbeat(std::chrono::seconds(1));
        lock.lock();
        const auto now = std::chrono::steady_clock::now();
        if (pulse.ok()) {
            lastAnswer = now;
        } else if (now - lastAnswer > m_heartbeatTimeout) {
            m_gone = true;
            return lose(m_label + " stopped responding while it evaluated epoch " + std::to_string(epoch) + ": " + pulse.error().message,
                        "check that machine and its trainstudio-worker");
        }
        if (now - requested > limit) {
            m_gone = !pulse.ok();
            lock.unlock();
            (void)m_client.cancel(m_taskRun, kCancelFailed);  // the hung task, so its machine is free again
            lock.lock();
            return lose(m_label + " did not finish evaluating epoch " + std::to_string(epoch) + " within " +
                            std::to_string(static_cast<int>(limit.count())) + " s",
                        "see that worker's log");
        }
    }
}

nlohmann::json EvaluatorLink::stop(const std::string& reason)
{
    {
        std::lock_guard lock(m_mutex);
        if (m_ended) return m_final;
    }
    (void)m_client.cancel(m_taskRun, reason);
    std::unique_lock lock(m_mutex);
    if (!m_lost) m_cv.wait_for(lock, std::chrono::seconds(5), [&] { return m_ended; });
    return m_final;
}

} // namespace ts::remote
