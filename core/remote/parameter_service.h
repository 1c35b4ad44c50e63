#pragma once
// ParameterService: the ParameterServer gRPC service (parameter_server.proto) of one
// trainstudio-worker daemon. While the daemon runs a `ps` task it hosts that task's shard: worker 0
// initialises the values, every worker pulls them and pushes gradients, and each push is applied
// at once with the run's optimizer (asynchronous updates, serialised by one lock per shard).
// ps:0 also serves the run's step schedule (distribute/step_schedule.h): workers claim steps.
// Shards travel in parts that fit the daemon's message bound, so their size is not bounded by it.
// Contract:
//  - Threading: gRPC's threads serve calls concurrently; host/unhost/stats from any thread.
//  - Security: every call needs the shared token; calls for another run, before initialisation,
//    or with slices that do not match the shard are refused (and logged); message sizes are
//    bounded by the daemon's server.
//  - Errors: host() fails on a bad optimizer configuration, naming it.

#include <functional>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>
#include <nlohmann/json.hpp>

#include "common/result.h"

namespace ts {
struct EpochDone;
}
namespace ts::telemetry {
class EventBus;
}

namespace ts::remote {

// What a part's message holds besides its float data (ids, names, field tags): both sides leave
// this much of the bound for it.
inline constexpr int64_t kPartEnvelopeBytes = 4096;

struct ShardStats {
    bool initialised = false;
    int64_t version = 0;           // updates applied
    int64_t pulls = 0;
    int64_t elements = 0;
    int64_t maxStaleness = 0;
    double sumStaleness = 0;
    int64_t bytesIn = 0, bytesOut = 0;  // gradients received, values sent (payload bytes)
    double busySeconds = 0;             // applying updates and serving pulls (under the shard's lock)
    int64_t stepsCompleted = -1;        // ps:0: the run's steps with an outcome (-1: it schedules none)
};

class ParameterService {
public:
    // `maxMessageBytes`: the daemon server's bound on every message; parts are sized to fit it.
    ParameterService(std::string token, int maxMessageBytes);
    ~ParameterService();
    grpc::Service* service();

    // Starts hosting run `runId`'s shard as task `label` ("ps:0"), uninitialised, with the run's
    // optimizer and backend (empty: the best for cpu:0). Replaces any previous shard. With
    // `traceBus` (it must outlive the hosting: unhost() first), every update applied and every
    // pull served is published on it as a SpanEvent (lane thread "shard"). With `onEpoch`, ps:0
    // tells each epoch of the run's step schedule that completed, in order, from a gRPC thread,
    // not after unhost() returned. It runs under the service's claim lock (which gives the order
    // and the "not after"): it must be quick and must not call host() or unhost().
    Status host(const std::string& runId, const std::string& label, const nlohmann::json& optimizer, const std::string& backend,
                telemetry::EventBus* traceBus = nullptr, std::function<void(const EpochDone&)> onEpoch = {});
    // Stops hosting: later calls for the run are refused.
    void unhost();
    ShardStats stats() const;

    class Impl;
private:
    std::unique_ptr<Impl> m_impl;
};

} // namespace ts::remote
