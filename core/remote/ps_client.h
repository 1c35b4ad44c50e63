#pragma once
// RemoteParameterStore: ParameterStore (distribute/parameter_store.h) over the ParameterServer
// gRPC service of the cluster's ps tasks. Workers train through it; the coordinator pulls the
// final weights through it.
// Contract (in addition to ParameterStore's):
//  - One channel and one push thread per ps task; pulls from several ps run in parallel.
//  - Shards of any size: values, gradients and snapshots travel in parts that fit both this
//    end's maxMessageBytes and the ps daemon's bound (which the ps tells).
//  - Every call carries the shared token and a deadline (options.callTimeout); begin() waits up
//    to options.startTimeout for ps tasks that are still starting or not initialised yet.
//  - Errors name the ps task and its address ("ps:0 at 127.0.0.1:7071: push failed: ...").

#include <chrono>
#include <memory>
#include <string>

#include "common/result.h"
#include "distribute/cluster_spec.h"
#include "distribute/parameter_store.h"
#include "remote/auth.h"

namespace ts::remote {

struct PsClientOptions {
    ClusterSpec spec;                 // its "ps" addresses, in index order
    std::string runId;
    std::string token;
    std::string worker = "coordinator";  // who pushes (for the ps's log)
    TlsFiles tls;
    PartitionOptions partition;
    std::chrono::milliseconds callTimeout{30000};
    std::chrono::milliseconds startTimeout{60000};
    int maxMessageBytes = 64 << 20;   // largest message this end takes; shard parts fit it and the ps's bound
};

class RemoteParameterStore final : public ParameterStore {
public:
    static Result<std::shared_ptr<RemoteParameterStore>> connect(const PsClientOptions& options);
    ~RemoteParameterStore() override;

    Status begin(const std::vector<StoreVariable>& variables, bool initialise, const StoreResume* resume) override;
    std::string resumePosition() const override;
    Result<StoreSnapshot> snapshot() override;
    Status pull() override;
    Status push(float learningRate) override;
    Status flush() override;
    StalenessStats staleness() const override;
    void cancel() override;
    void setSchedule(const ScheduleConfig& schedule) override;
    Result<StepGrant> claimStep(int64_t batchesPerEpoch, const std::vector<ts::StepOutcome>& done) override;
    // The coordinator lost `worker` ("worker:1"): ps:0 hands the steps it holds to the others
    // and refuses its later claims.
    Status release(const std::string& worker, const std::string& reason);
    // `worker`, released before, is back (its new task started, the old one gone): ps:0 hands it
    // steps again.
    Status readmit(const std::string& worker, const std::string& reason);

    const PartitionPlan& plan() const;

    class Impl;
private:
    explicit RemoteParameterStore(std::unique_ptr<Impl> impl);
    Status membership(const std::string& worker, const std::string& reason, bool readmit);
    std::unique_ptr<Impl> m_impl;
};

} // namespace ts::remote
