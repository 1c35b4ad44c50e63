#include "remote/cluster.h"

#include "remote/gloo_communicator.h"
#include "remote/rendezvous.h"

#include <thread>

namespace ts::remote {
namespace {

// The coordinator's communicator also keeps its rendezvous server: the Gloo group goes first,
// then the server, so the last heartbeats still find it.
class ServingCommunicator final : public Communicator {
public:
    ServingCommunicator(std::unique_ptr<RendezvousServer> server, std::unique_ptr<Communicator> inner)
        : m_server(std::move(server)), m_inner(std::move(inner)) {}
    ~ServingCommunicator() override
    {
        m_inner.reset();
        m_server.reset();
    }
    int size() const override { return m_inner->size(); }
    std::string name() const override { return m_inner->name(); }
    Status allReduceSum(int rank, Tensor& t) override { return m_inner->allReduceSum(rank, t); }
    Status broadcast(int rank, int root, Tensor& t) override { return m_inner->broadcast(rank, root, t); }
    Status barrier(int rank) override { return m_inner->barrier(rank); }
    Status registerBuffer(int rank, Tensor& t) override { return m_inner->registerBuffer(rank, t); }
    void releaseBuffer(int rank, const Tensor& t) override { m_inner->releaseBuffer(rank, t); }
    void abort(const Error& cause) override { m_inner->abort(cause); }

private:
    std::unique_ptr<RendezvousServer> m_server;
    std::unique_ptr<Communicator> m_inner;
};

} // namespace

Result<ClusterConnection> connectCluster(const ClusterSpec& spec, const ClusterOptions& options)
{
    if (!spec.hasTask())
        return makeError(ErrorCode::InvalidArgument, spec.source() + ": TF_CONFIG has no \"task\"",
                         "say which task this process is: \"task\": {\"type\": \"worker\", \"index\": 0} (or --task worker:0)");
    const TaskId task = spec.task();
    TS_ASSIGN(int rank, spec.trainingRank(task));
    const auto tasks = spec.trainingTasks();
    ClusterConnection c;
    c.rank = rank;
    c.size = static_cast<int>(tasks.size());
    TS_ASSIGN(std::string selfAddress, spec.address(task));
    c.taskName = task.toString() + " (" + selfAddress + ")";
    const TaskId coord = spec.coordinator();
    c.coordinator = task == coord;
    TS_ASSIGN(std::string coordAddress, spec.address(coord));

    std::unique_ptr<RendezvousServer> server;
    if (c.coordinator && !options.rendezvousAlreadyServed) {
        RendezvousServer::Options so;
        so.bindAddress = coordAddress;
        so.token = options.token;
        so.tls = options.tls;
        auto started = RendezvousServer::start(so);
        if (!started.ok()) {
            Error e = started.takeError();
            e.message = c.taskName + ": " + e.message;
            return e;
        }
        server = std::move(started).value();
    }
    GlooOptions go;
    go.rank = rank;
    go.size = c.size;
    go.rendezvousAddress = coordAddress;
    go.token = options.token;
    go.group = options.group;
    TS_ASSIGN(HostPort self, HostPort::parse(selfAddress));
    go.hostname = self.host;
    for (const auto& t : tasks) go.rankNames.push_back(t.toString() + " at " + *spec.address(t));
    c.rankNames = go.rankNames;
    for (const auto& role : ClusterSpec::roles())
        for (const auto& a : spec.addresses(role))
            if (auto hp = HostPort::parse(a); hp.ok()) go.servicePorts.push_back(hp->port);
    go.timeout = options.timeout;
    go.heartbeat = options.heartbeat;
    go.cancelled = options.cancelled;
    go.waiting = options.waiting;
    go.tls = options.tls;
    auto comm = makeGlooCommunicator(go);
    if (!comm.ok()) {
        // This task serves the rendezvous and refused the setup while joining (the tasks were
        // given different clusters): keep serving a moment, so the others can still read what
        // they need to refuse in the same words instead of finding the rendezvous gone.
        if (server && comm.error().code == ErrorCode::InvalidArgument) std::this_thread::sleep_for(std::chrono::seconds(2));
        return comm.takeError();
    }
    if (server) c.communicator = std::make_shared<ServingCommunicator>(std::move(server), std::move(comm).value());
    else c.communicator = std::shared_ptr<Communicator>(std::move(comm).value());
    return c;
}

} // namespace ts::remote
