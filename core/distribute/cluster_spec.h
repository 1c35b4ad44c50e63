#pragma once
// ClusterSpec: the machines of a multi-process run, read from TensorFlow's TF_CONFIG verbatim
//   {"cluster": {"chief": ["host:port"], "worker": ["host:port", ...], "ps": [...],
//                "evaluator": [...]},
//    "task": {"type": "worker", "index": 0}, "environment": "cloud", "rpc_layer": "grpc"}
// from the TF_CONFIG environment variable, a file, or JSON text, and written back per task so
// every process of a run gets the same cluster with its own task.
// Contract:
//  - Value type; immutable after parsing, safe to share read-only between threads.
//  - Parsing validates everything that does not depend on a strategy (roles, host:port syntax,
//    duplicate addresses, task type and index); validateFor() adds a strategy's needs.
//  - Errors are ParseError/InvalidArgument whose message names the source (file, "TF_CONFIG",
//    ...) and the offending entry, with a hint saying how to fix it.

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/result.h"

namespace ts {

struct TaskId {
    std::string type;   // "chief" | "worker" | "ps" | "evaluator"
    int index = 0;
    bool operator==(const TaskId&) const = default;
    std::string toString() const { return type + ":" + std::to_string(index); }  // "worker:1"
};

// "worker:1" -> {worker, 1}; InvalidArgument unless it is type:index with a decimal index (the
// type is checked against a cluster by ClusterSpec::withTask).
Result<TaskId> parseTaskId(const std::string& text);

struct HostPort {
    std::string host;   // without brackets for IPv6
    int port = 0;
    // "host:port", "[v6]:port" for IPv6 hosts.
    std::string toString() const;
    // Accepts "host:port" and "[v6addr]:port"; port in 1..65535 (0 only with allowPortZero).
    static Result<HostPort> parse(const std::string& text, bool allowPortZero = false);
};

class ClusterSpec {
public:
    static const std::vector<std::string>& roles();   // chief, worker, ps, evaluator

    static Result<ClusterSpec> fromJson(const nlohmann::json& j, const std::string& source);
    static Result<ClusterSpec> fromText(const std::string& text, const std::string& source);
    static Result<ClusterSpec> fromFile(const std::string& path);
    // TF_CONFIG from the environment; NotFound if it is unset or empty.
    static Result<ClusterSpec> fromEnvironment();

    // The TF_CONFIG document (cluster + this spec's task if it has one).
    nlohmann::json toJson() const;
    // TF_CONFIG for `task` of this cluster, as compact JSON text (what to export for it).
    Result<std::string> tfConfigFor(const TaskId& task) const;
    // Every task of the cluster: chief, workers, ps, evaluators, each in index order.
    std::vector<TaskId> tasks() const;
    // "tf_config-worker-0.json": the file writeTfConfigs() gives `task`.
    static std::string tfConfigFileName(const TaskId& task);
    // Writes each task's TF_CONFIG (tfConfigFor) to dir/tfConfigFileName(task), atomically,
    // making `dir` if needed; returns the paths in tasks() order. Errors name the file.
    Result<std::vector<std::string>> writeTfConfigs(const std::string& dir) const;
    // A copy with its own task set (validated).
    Result<ClusterSpec> withTask(const TaskId& task) const;

    // Strategy-specific checks: "multi-worker-mirrored" needs a chief or workers and no ps;
    // "parameter-server" needs at least one ps and one worker.
    Status validateFor(const std::string& strategy) const;

    const std::vector<std::string>& addresses(const std::string& role) const;
    int count(const std::string& role) const { return static_cast<int>(addresses(role).size()); }
    bool hasTask() const { return m_hasTask; }
    const TaskId& task() const { return m_task; }
    Result<std::string> address(const TaskId& task) const;
    std::string source() const { return m_source; }

    // Synchronous training workers (chief first, then workers) in rank order, TF's convention:
    // the chief is rank 0 when present.
    std::vector<TaskId> trainingTasks() const;
    int numTrainingWorkers() const { return count("chief") + count("worker"); }
    // Rank of a chief/worker task among trainingTasks(); InvalidArgument for ps/evaluator.
    Result<int> trainingRank(const TaskId& task) const;
    // The task that runs the coordination services (rendezvous): the chief, else worker 0.
    TaskId coordinator() const;
    // Training tasks (chief, workers) on the same host as `task` (itself included; loopback
    // names are one host), so that tasks sharing a machine can share its cores.
    int trainingTasksSharingHost(const TaskId& task) const;
    // Threads for `task` when the user set none: its share of `cores` when other training tasks
    // run on its host (each taking every core, two tasks on 2 cores trained 10x slower), else 0
    // (no change: all of them).
    int sharedHostThreads(const TaskId& task, int cores) const
    {
        const int n = trainingTasksSharingHost(task);
        return n > 1 ? std::max(1, cores / n) : 0;
    }

private:
    std::map<std::string, std::vector<std::string>> m_jobs;
    TaskId m_task;
    bool m_hasTask = false;
    nlohmann::json m_extra = nlohmann::json::object();  // "environment", "rpc_layer": kept as given
    std::string m_source;
};

} // namespace ts
