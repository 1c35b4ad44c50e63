#pragma once
// Joining a multi-worker run: turns a ClusterSpec (TF_CONFIG with this process's task) into the
// cross-process Communicator that MultiWorkerMirrored uses. The coordinator task (the chief, else
// worker 0) serves the rendezvous at its cluster address; every training task (chief and
// workers, in rank order) then joins the Gloo group through it.
// Contract:
//  - connectCluster blocks until every training task has joined or options.timeout passes; the
//    error then names this task and the rendezvous address.
//  - The returned communicator owns the rendezvous server on the coordinator: keep it alive
//    until the run ends on every task (the strategy holds it).
//  - Thread-safety: see GlooCommunicator.

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/result.h"
#include "distribute/cluster_spec.h"
#include "distribute/communicator.h"
#include "remote/auth.h"

namespace ts::remote {

struct ClusterOptions {
    std::string token;
    std::string group = "train";   // rendezvous key prefix (a fresh server per run anyway)
    std::chrono::milliseconds timeout{60000};
    std::chrono::milliseconds heartbeat{1000};
    TlsFiles tls;
    // The coordinator's rendezvous is already served (by trainstudio-worker, next to its control
    // service at the task's address): do not start another.
    bool rendezvousAlreadyServed = false;
    std::function<bool()> cancelled;  // GlooOptions::cancelled
    std::function<void(const std::string&)> waiting;  // GlooOptions::waiting
};

struct ClusterConnection {
    int rank = 0;
    int size = 1;
    bool coordinator = false;       // this task serves the rendezvous (and records the run)
    std::string taskName;           // "worker:1 (127.0.0.1:5001)"
    std::vector<std::string> rankNames;  // every rank's task, "worker:1 at 127.0.0.1:5001"
    std::shared_ptr<Communicator> communicator;
};

Result<ClusterConnection> connectCluster(const ClusterSpec& spec, const ClusterOptions& options);

} // namespace ts::remote
