#include "distribute/agreement.h"

#include <cstring>

namespace ts {
namespace {

std::string shortText(const nlohmann::json& v)
{
    std::string s = v.is_null() ? std::string("(none)") : v.dump();
    if (s.size() > 40) s = s.substr(0, 37) + "...";
    return s;
}

void diff(const nlohmann::json& a, const nlohmann::json& b, const std::string& path, std::vector<std::string>& out, std::size_t limit)
{
    if (out.size() >= limit || a == b) return;
    if (a.is_object() && b.is_object()) {
        for (auto it = a.begin(); it != a.end(); ++it)
            diff(it.value(), b.contains(it.key()) ? b[it.key()] : nlohmann::json(), path.empty() ? it.key() : path + "." + it.key(), out, limit);
        for (auto it = b.begin(); it != b.end(); ++it)
            if (!a.contains(it.key())) diff(nlohmann::json(), it.value(), path.empty() ? it.key() : path + "." + it.key(), out, limit);
        return;
    }
    if (a.is_array() && b.is_array() && a.size() == b.size()) {
        for (std::size_t i = 0; i < a.size(); ++i) diff(a[i], b[i], path + "[" + std::to_string(i) + "]", out, limit);
        return;
    }
    out.push_back((path.empty() ? std::string("the settings") : path) + " (" + shortText(a) + " vs " + shortText(b) + ")");
}

std::string nameOf(const std::vector<std::string>& names, int r)
{
    return r < static_cast<int>(names.size()) ? names[static_cast<std::size_t>(r)] : "rank " + std::to_string(r);
}

} // namespace

std::vector<std::string> settingDifferences(const nlohmann::json& theirs, const nlohmann::json& ours, std::size_t limit)
{
    std::vector<std::string> out;
    diff(theirs, ours, "", out, limit);
    return out;
}

Status agreeOnSettings(Communicator& comm, int rank, const std::vector<std::string>& rankNames, const nlohmann::json& settings)
{
    const int size = comm.size();
    if (size <= 1) return okStatus();
    const std::string mine = settings.dump();
    std::vector<nlohmann::json> all(static_cast<std::size_t>(size));
    // Each rank's settings in turn: its length (exact in a float up to 16 MiB), then its bytes.
    for (int root = 0; root < size; ++root) {
        Tensor len = Tensor::fromVector({1}, {root == rank ? static_cast<float>(mine.size()) : 0.f});
        TS_TRY(comm.broadcast(rank, root, len));
        const auto n = static_cast<int64_t>(len.data<float>()[0]);
        if (n <= 0 || n > (int64_t{1} << 24))
            return makeError(ErrorCode::InvalidArgument, nameOf(rankNames, root) + " sent settings of " + std::to_string(n) + " bytes",
                             "every task must run the same TrainStudio version");
        Tensor bytes = Tensor::zeros({n}, DType::U8);
        if (root == rank) std::memcpy(bytes.raw(), mine.data(), mine.size());
        TS_TRY(comm.broadcast(rank, root, bytes));
        auto parsed = nlohmann::json::parse(static_cast<const char*>(bytes.raw()), static_cast<const char*>(bytes.raw()) + n, nullptr, false);
        if (parsed.is_discarded())
            return makeError(ErrorCode::InvalidArgument, nameOf(rankNames, root) + " sent settings that are not JSON",
                             "every task must run the same TrainStudio version");
        all[static_cast<std::size_t>(root)] = std::move(parsed);
    }
    std::string problems;
    for (int r = 1; r < size; ++r) {
        const auto d = settingDifferences(all[static_cast<std::size_t>(r)], all[0]);
        if (d.empty()) continue;
        std::string list;
        for (const auto& s : d) list += (list.empty() ? "" : ", ") + s;
        problems += (problems.empty() ? "" : "; ") + nameOf(rankNames, r) + " differs from " + nameOf(rankNames, 0) + " in " + list;
    }
    if (problems.empty()) return okStatus();
    return makeError(ErrorCode::InvalidArgument, "the tasks of this multi-worker run were started with different settings: " + problems,
                     "start every task with the same model, batch size, optimizer, schedule, epochs, seed, data options "
                     "and backup flags (--backup-dir on every task or on none, the same --backup-every-steps and --restarts; "
                     "data folders, backup folders, weight files, devices and threads may differ)");
}

} // namespace ts
