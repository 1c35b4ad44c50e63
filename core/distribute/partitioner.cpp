#include "distribute/partitioner.h"

#include <algorithm>

#include "common/json_keys.h"

namespace ts {

nlohmann::json PartitionOptions::toJson() const
{
    return {{"policy", policy}, {"min_shard_bytes", minShardBytes}};
}

Result<PartitionOptions> PartitionOptions::fromJson(const nlohmann::json& j, const std::string& source)
{
    PartitionOptions o;
    if (j.is_null()) return o;
    if (!j.is_object()) return makeError(ErrorCode::ParseError, source + ": must be an object like {\"policy\": \"by-size\"}");
    TS_TRY(checkJsonKeys(j, {"policy", "min_shard_bytes"}, source));
    try {
        o.policy = j.value("policy", o.policy);
        o.minShardBytes = j.value("min_shard_bytes", o.minShardBytes);
    } catch (const nlohmann::json::exception& e) {
        return makeError(ErrorCode::ParseError, source + ": " + e.what());
    }
    if (o.policy != "round-robin" && o.policy != "by-size")
        return makeError(ErrorCode::InvalidArgument, source + ".policy: unknown partitioner '" + o.policy + "'",
                         "use \"round-robin\" (whole variables) or \"by-size\" (split large variables)");
    if (o.minShardBytes < 4)
        return makeError(ErrorCode::InvalidArgument, source + ".min_shard_bytes: " + std::to_string(o.minShardBytes) + " (use >= 4)");
    return o;
}

int64_t VariableInfo::numel() const
{
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
}

std::string ShardSlice::toString() const
{
    return name + "[" + std::to_string(rowBegin) + ":" + std::to_string(rowEnd) + "]";
}

int64_t PartitionPlan::elementsOn(int ps) const
{
    int64_t n = 0;
    for (const auto& s : perPs[static_cast<std::size_t>(ps)]) n += s.count;
    return n;
}

Result<PartitionPlan> partitionVariables(const std::vector<VariableInfo>& variables, int numPs, const PartitionOptions& options)
{
    if (numPs < 1) return makeError(ErrorCode::InvalidArgument, "partitioning needs at least one ps task, got " + std::to_string(numPs));
    if (options.policy != "round-robin" && options.policy != "by-size")
        return makeError(ErrorCode::InvalidArgument, "unknown partitioner '" + options.policy + "'", "use round-robin or by-size");
    if (options.policy == "by-size" && options.minShardBytes < 4)
        return makeError(ErrorCode::InvalidArgument, "min_shard_bytes " + std::to_string(options.minShardBytes) + " is below one float");
    PartitionPlan plan;
    plan.perPs.resize(static_cast<std::size_t>(numPs));
    std::vector<int64_t> load(static_cast<std::size_t>(numPs), 0);
    for (std::size_t i = 0; i < variables.size(); ++i) {
        const VariableInfo& v = variables[i];
        for (int64_t d : v.shape)
            if (d < 1)
                return makeError(ErrorCode::InvalidArgument, "variable '" + v.name + "' has an empty dimension",
                                 "every dimension of a variable must be >= 1");
        const int64_t n = v.numel();
        const int64_t rows = v.shape.empty() ? 1 : v.shape[0];
        const int64_t rowSize = rows > 0 ? n / rows : 0;
        if (options.policy == "round-robin") {
            const int ps = static_cast<int>(i % static_cast<std::size_t>(numPs));
            plan.perPs[static_cast<std::size_t>(ps)].push_back({static_cast<int>(i), v.name, 0, rows, 0, n});
            load[static_cast<std::size_t>(ps)] += n;
            continue;
        }
        const int64_t bytes = n * 4;  // float32 variables
        int64_t shards = std::max<int64_t>(1, std::min({static_cast<int64_t>(numPs), rows, bytes / options.minShardBytes}));
        // Rows are whole: fewer shards while the smallest (rows / shards of them) is below the minimum.
        while (shards > 1 && rows / shards * rowSize * 4 < options.minShardBytes) --shards;
        for (int64_t s = 0; s < shards; ++s) {
            const int64_t rb = rows * s / shards, re = rows * (s + 1) / shards;
            // Fewest elements so far wins; a variable's shards land on distinct ps tasks because
            // there are at most numPs of them and each one just placed raised its ps's load.
            int best = -1;
            for (int p = 0; p < numPs; ++p) {
                bool taken = false;
                for (const auto& sl : plan.perPs[static_cast<std::size_t>(p)]) taken |= sl.variable == static_cast<int>(i);
                if (taken) continue;
                if (best < 0 || load[static_cast<std::size_t>(p)] < load[static_cast<std::size_t>(best)]) best = p;
            }
            plan.perPs[static_cast<std::size_t>(best)].push_back({static_cast<int>(i), v.name, rb, re, rb * rowSize, (re - rb) * rowSize});
            load[static_cast<std::size_t>(best)] += (re - rb) * rowSize;
        }
    }
    return plan;
}

} // namespace ts
