#include "distribute/communicator.h"

#include <vector>

namespace ts {
namespace {

class HierarchicalCommunicator final : public Communicator {
public:
    HierarchicalCommunicator(int localSize, std::shared_ptr<Communicator> cross, int processRank)
        : m_localSize(localSize), m_cross(std::move(cross)), m_processRank(processRank),
          m_local(localSize > 1 ? makeLocalCommunicator(localSize) : nullptr)
    {
    }
    int size() const override { return m_localSize * m_cross->size(); }
    std::string name() const override { return m_local ? "local+" + m_cross->name() : m_cross->name(); }

    Status allReduceSum(int rank, Tensor& t) override
    {
        if (m_local) TS_TRY(m_local->allReduceSum(rank, t));
        TS_TRY(leader(rank, [&] { return m_cross->allReduceSum(m_processRank, t); }));
        if (m_local) TS_TRY(m_local->broadcast(rank, 0, t));
        return okStatus();
    }

    Status broadcast(int rank, int root, Tensor& t) override
    {
        if (root < 0 || root >= size())
            return makeError(ErrorCode::InvalidArgument, "broadcast root " + std::to_string(root) + " is not a replica of " + std::to_string(size()));
        const int rootProcess = root / m_localSize, rootLocal = root % m_localSize;
        // In the root's process its value first reaches local replica 0, which sends it out.
        if (m_local && m_processRank == rootProcess && rootLocal != 0) TS_TRY(m_local->broadcast(rank, rootLocal, t));
        TS_TRY(leader(rank, [&] { return m_cross->broadcast(m_processRank, rootProcess, t); }));
        if (m_local) TS_TRY(m_local->broadcast(rank, 0, t));
        return okStatus();
    }

    Status barrier(int rank) override
    {
        if (m_local) TS_TRY(m_local->barrier(rank));
        TS_TRY(leader(rank, [&] { return m_cross->barrier(m_processRank); }));
        if (m_local) TS_TRY(m_local->barrier(rank));
        return okStatus();
    }

    // The cross-process link outlives this communicator (the caller's cluster connection), so
    // what was registered with it is released here.
    ~HierarchicalCommunicator() override
    {
        for (const Tensor& t : m_registered) m_cross->releaseBuffer(m_processRank, t);
    }

    // Local replica 0's buffer is the one that goes across processes; holding it keeps its
    // memory allocated while it is registered.
    Status registerBuffer(int rank, Tensor& t) override
    {
        if (rank != 0) return okStatus();
        TS_TRY(m_cross->registerBuffer(m_processRank, t));
        m_registered.push_back(t);
        return okStatus();
    }

    void releaseBuffer(int rank, const Tensor& t) override
    {
        if (rank != 0) return;
        for (auto it = m_registered.begin(); it != m_registered.end(); ++it)
            if (it->raw() == t.raw() && it->numel() == t.numel()) {
                m_cross->releaseBuffer(m_processRank, t);
                m_registered.erase(it);
                return;
            }
    }

    void abort(const Error& cause) override
    {
        if (m_local) m_local->abort(cause);
        m_cross->abort(cause);
    }

private:
    // Local replica 0 runs the cross-process step; if it fails, the local replicas waiting for
    // its result are released with its error instead of waiting forever.
    template <typename Fn>
    Status leader(int rank, Fn&& fn)
    {
        if (rank != 0) return okStatus();
        Status st = fn();
        if (!st.ok() && m_local) m_local->abort(st.error());
        return st;
    }

    int m_localSize;
    std::shared_ptr<Communicator> m_cross;
    int m_processRank;
    std::unique_ptr<Communicator> m_local;
    std::vector<Tensor> m_registered;
};

} // namespace

std::unique_ptr<Communicator> makeHierarchicalCommunicator(int localSize, std::shared_ptr<Communicator> crossProcess, int processRank)
{
    TS_ASSERT(localSize >= 1 && crossProcess);
    return std::make_unique<HierarchicalCommunicator>(localSize, std::move(crossProcess), processRank);
}

} // namespace ts
