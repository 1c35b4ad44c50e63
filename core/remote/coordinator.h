#pragma once
// Coordinator: runs one training run on trainstudio-worker daemons. It connects to every
// training task of a ClusterSpec, checks them before launch (reachable, same version, idle),
// starts the tasks, merges their event streams into one stream of telemetry events on a bus
// (the chief's metrics are the run's; every worker's devices on their own lanes), and stops the
// run with an error naming the worker when one fails, dies or goes silent.
// The CLI (`train --cluster`) and the studio's session both coordinate through it.
// parameter-server: the ps tasks start first, then the workers; ps:0 hands out the run's steps
// (distribute/step_schedule.h) and tells each epoch once all its steps are done; each worker's
// steps carry their staleness; the coordinator plays TF's chief: it evaluates the ps tasks'
// weights after each epoch and at the end (pulled from every ps), records the run, then stops
// the ps tasks. A worker that dies or goes silent does not end the run while another trains:
// ps:0 hands its steps to the others, and the coordinator warns, naming it, and stops its task.
// A cluster's "evaluator" task (parameter-server only: TF's side-car evaluator) evaluates
// instead, on its own machine, when the coordinator asks after each epoch and at the end; an
// evaluator that fails or goes silent is named in a warning and the coordinator evaluates again.
// A "chief" entry of the cluster only says where the coordinator runs: it is not contacted.
// Contract:
//  - Threading: probe/preflight/run are called from one thread (run blocks it until the run
//    ends); cancel() may be called from any thread at any time, also before run().
//  - Ownership: the bus passed to run() must outlive the call; nothing is kept after it.
//  - Errors: Result errors whose message names the task and its address ("worker:1 at
//    10.0.0.3:7070 stopped responding ...") with a hint saying what to do.

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/result.h"
#include "distribute/cluster_spec.h"
#include "remote/auth.h"
#include "remote/worker_client.h"
#include "train/trainer.h"

namespace ts {
struct RunConfig;
namespace telemetry {
class EventBus;
struct EpochMetricsEvent;
}
}

namespace ts::remote {

struct CoordinatorOptions {
    ClusterSpec spec;
    std::string token;
    TlsFiles tls;
    std::chrono::milliseconds heartbeatTimeout{3000};  // silence after which a worker is gone
    // With the run's backup.restarts: how long a restart waits for every task to answer again
    // and be idle (a daemon that died must be started again by its supervisor meanwhile).
    std::chrono::milliseconds restartWait{60000};
    // Every training task traces every step (traceLayers: a span per layer too); ps tasks
    // publish a span per update applied and pull served. The spans arrive on run()'s bus.
    bool trace = false, traceLayers = false;
    // parameter-server: contact the cluster's evaluator task (false: a run that does not
    // validate, which has nothing for it to do; it is then neither probed nor started).
    bool useEvaluator = true;
    // Who coordinates, as a busy worker names it to other coordinators ("trainstudio-cli"); the
    // host and pid are added.
    std::string name = "a TrainStudio coordinator";
};

// One task as the pre-flight saw it.
struct TaskProbe {
    TaskId id;
    std::string address, label;        // label: "worker:1 at 10.0.0.3:7070"
    bool ok = false;                   // reachable, same version, idle
    WorkerIdentity identity;           // valid when the worker answered
    std::string problem, hint;         // why not ok
};

class Coordinator {
public:
    // The strategies a cluster can run: "multi-worker-mirrored", "parameter-server".
    static bool supportsStrategy(const std::string& kind);
    // ... and whether this cluster has the tasks it needs (parameter-server: >= 1 ps and worker).
    static bool supportsStrategy(const std::string& kind, const ClusterSpec& spec);

    // Validates the spec for `strategy` and opens a channel to every training task (no network
    // traffic yet: gRPC connects lazily).
    static Result<std::unique_ptr<Coordinator>> create(CoordinatorOptions options, const std::string& strategy);
    ~Coordinator();

    // Asks every task who it is; never fails as a whole: each probe says what is wrong.
    // connectPatience: how long gRPC's catch-all "cannot connect to" is asked again before it
    // counts (a daemon already listening has given it on a loaded machine); at least `timeout`.
    std::vector<TaskProbe> probe(std::chrono::milliseconds timeout, std::chrono::milliseconds connectPatience = {});
    // probe() and the first problem as an error ("pre-flight: worker:1 at ... : ..."); not the
    // evaluator's, which run() skips with a warning.
    Status preflight(std::chrono::milliseconds timeout = std::chrono::seconds(3),
                     std::chrono::milliseconds connectPatience = std::chrono::seconds(10));

    // Trains `config` (its model inline, strategy forced to this coordinator's) as run `runId`
    // and publishes the merged stream on `bus`. onEpoch (optional) sees the chief's epochs.
    // A cancel() gives a FitResult with cancelled = true once every worker has stopped.
    // config.loadWeights (multi-worker-mirrored): this process reads the file and every task
    // starts from its weights; a parameter-server run refuses it.
    // Backups (config.backup, multi-worker-mirrored): the chief task backs up under its daemon's
    // --backup-root; with backup.restarts a run that fails after its tasks started is started
    // again, once every task answers and is idle, and resumes from the chief's backup into the
    // same run on the bus. Parameter-server: a lost worker rejoins with a new task once its daemon
    // answers again (summary "rejoined"); rejoins spend backup.restarts too.
    Result<FitResult> run(RunConfig config, const std::string& runId, telemetry::EventBus& bus,
                          const std::function<void(const telemetry::EpochMetricsEvent&)>& onEpoch = {});
    void cancel();
    // Any thread, while run() trains: every training task traces its next `steps` steps (its
    // spans arrive on run()'s bus, each on its task's lanes). Returns how many tasks started;
    // an error when none could (no run in progress, the run traces every step already, ...).
    // A task that cannot is named in the error only when no task started.
    Result<int> captureTrace(int64_t steps, bool layers = false);

    std::size_t numTasks() const { return m_tasks.size(); }
    // What the tasks of the last run() reported at their end, by task ("worker:1": its steps,
    // pushes and staleness; "ps:0": updates applied, steps completed; "evaluator:0": its
    // evaluations), plus "evaluation" (with "by": who evaluated the final weights) and
    // "lost" (parameter-server: the workers the run went on without, why, and after which step)
    // and "rejoined" (those that came back with a new task, and the run's step then).
    nlohmann::json summary() const { return m_summary; }
    // After run(): the devices each training task trained on, as the run record lists them
    // ({"task", "device", "name", "memory_total"}); empty before a task started.
    nlohmann::json devices() const { return m_devices; }
    // The weights the last run() ended with (Keras names and layouts, host tensors): the ps
    // tasks' (parameter-server) or the chief's, which it sends at its end (multi-worker-mirrored).
    // A run stopped by cancel() keeps them too; empty after a failed run, and after a cancel() while
    // waiting to restart one (the backup holds the weights to resume from).
    const std::vector<std::pair<std::string, Tensor>>& finalWeights() const { return m_finalWeights; }
    const ClusterSpec& spec() const { return m_options.spec; }
    // How many times the last run() was restarted from its backup, and how many lost
    // parameter-server workers rejoined it (all attempts); together at most backup.restarts.
    int restarts() const { return m_restarts; }
    // After a failed run(): its error is a task's refusal of the run before training (its model,
    // data, weights or settings, as prepareRun refuses them locally): bad input, not a failure.
    bool refused() const { return m_refused; }
    int rejoins() const { return m_rejoins; }

private:
    struct Task;
    Coordinator(CoordinatorOptions options, std::string strategy);
    // One attempt; its tasks run as `taskRun` (a fresh rendezvous group per attempt). With
    // mayRestart, a failure after the tasks started sets m_restartPending and is published as a
    // warning instead of ending the run.
    Result<FitResult> runAttempt(const RunConfig& config, const std::string& runId, const std::string& taskRun,
                                 telemetry::EventBus& bus,
                                 const std::function<void(const telemetry::EpochMetricsEvent&)>& onEpoch, bool mayRestart);
    bool m_restartPending = false;
    int m_restarts = 0, m_rejoins = 0;

    CoordinatorOptions m_options;
    std::string m_strategy;
    std::string m_who;  // "trainstudio-cli on host (pid 12)": how busy workers name this coordinator
    std::vector<std::unique_ptr<Task>> m_tasks;   // parameter-server: the ps tasks first
    std::unique_ptr<Task> m_evaluator;            // parameter-server: the cluster's evaluator task, if any
    // m_tasks, then `evaluator` if not null (everyTask: the cluster's evaluator, if any).
    std::vector<Task*> tasksWith(Task* evaluator) const;
    std::vector<Task*> everyTask() const { return tasksWith(m_evaluator.get()); }
    nlohmann::json m_summary = nlohmann::json::object();
    nlohmann::json m_devices = nlohmann::json::array();
    std::vector<std::pair<std::string, Tensor>> m_finalWeights;
    std::string m_initialWeights, m_initialWeightsName;  // run()'s load_weights: bytes and file
    std::atomic<bool> m_cancel{false};
    std::function<void()> m_wake;   // wakes run()'s loop; set while it runs
    std::string m_taskRun;          // the attempt whose tasks train now (empty: none)
    std::mutex m_wakeMutex;         // guards m_wake and m_taskRun
    bool m_refused = false;         // see refused()
    std::mutex m_clientsMutex;      // guards replacing a task's client against captureTrace's calls
};

} // namespace ts::remote
