#pragma once
// WorkerDaemon: what trainstudio-worker serves on one port: the Worker control service
// (worker.proto: identify, start a task, stream its events, cancel, heartbeat), for the task
// that coordinates a multi-worker-mirrored run the Rendezvous service its peers join through,
// and, while it runs a parameter-server run's `ps` task, the ParameterServer service
// (parameter_server.proto) with that task's shard of the variables. A ps task ends when the
// coordinator cancels it; a parameter-server `worker` task trains against the ps tasks.
// Contract:
//  - Threading: start() returns once the server listens; gRPC's threads serve calls; one task
//    runs at a time on its own thread. shutdown() (or the destructor) cancels a running task,
//    ends open event streams and joins everything.
//  - Security: every call must carry the shared token (refused and logged otherwise); messages
//    over maxMessageBytes are refused by gRPC; a task names no files for the worker to write or
//    load (model inline; no save_weights, load_weights or model_file), so a coordinator cannot
//    make a worker touch paths it chose; a run's backup folder is a relative name kept under
//    the daemon's backupRoot. Binding anything but loopback needs allowRemote.
//  - Errors: start() says which address could not be bound and what to do.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/result.h"
#include "remote/auth.h"

namespace ts::remote {

struct WorkerOptions {
    std::string listen = "127.0.0.1:0";   // port 0: ephemeral (see port())
    bool allowRemote = false;             // required to bind a non-loopback address
    std::string token;
    std::string name;                     // how the worker calls itself (default: host:port)
    int maxMessageBytes = 4 << 20;        // bounds every request and reply (run configs inline the
                                          // model; a ps task's pulls carry its whole shard)
    TlsFiles tls;                         // certificate + key: serve TLS; rootCa: verify the
                                          // coordinating daemon's rendezvous when this one is a peer
    std::string backupRoot;               // tasks' backup folders (relative names) live under it;
                                          // empty: defaultBackupRoot() (train/backup.h)
    int64_t maxWeightsBytes = int64_t{2} << 30;  // largest initial-weights file (SendWeights) held
    // A task whose coordinator opens no event stream within this many seconds of its StartTask
    // is cancelled, as when the stream breaks: the coordinator died in between, and a serving
    // task (ps, evaluator) would otherwise wait for it forever. 0: never.
    int firstStreamSeconds = 60;
    // A `train --task evaluator:0` process serves its evaluator task with these: tasks of any
    // other type are refused, tasks read their data from dataDir (when set) instead of the run
    // configuration's (its idx pipeline's folder too), and onTaskState(state, message, hint) is
    // called, with no lock of the daemon held, when a task starts ("running", on a gRPC thread,
    // possibly after its end when it fails at once) and when it ends (on the task's thread once
    // its end is published): "completed", "failed" (message, hint: why), "cancelled" (by its
    // coordinator or this daemon's shutdown) or "left" (cancelled because its coordinator's
    // event stream broke: it died, or was cut off).
    std::string onlyTaskType;
    std::string dataDir;
    std::function<void(const std::string& state, const std::string& message, const std::string& hint)> onTaskState;
};

class WorkerDaemon {
public:
    static Result<std::unique_ptr<WorkerDaemon>> start(const WorkerOptions& options);
    ~WorkerDaemon();
    int port() const;
    void shutdown();
    // Blocks until shutdown() (from a signal handler's thread, say).
    void wait();

    class Impl;
private:
    explicit WorkerDaemon(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> m_impl;
};

// True for 127.0.0.0/8, ::1 and "localhost" (the hosts bound without --allow-remote).
bool isLoopbackHost(const std::string& host);

} // namespace ts::remote
