#pragma once
// Partitioner: which parameter-server task holds which part of which variable. A pure function
// of the variables (names and shapes, in the model's order), the number of ps tasks and the
// policy, so every worker, every ps and the coordinator compute the same plan independently.
// Policies (TF's ParameterServerStrategy variable_partitioner, in its vocabulary):
//  - round-robin: variable i lives whole on ps (i mod numPs).
//  - by-size (TF's MinSizePartitioner): a variable of B bytes is cut along its first dimension
//    into at most min(numPs, rows, max(1, B / minShardBytes)) near-equal row ranges, fewer where
//    whole rows would leave one below minShardBytes, so no shard is smaller than minShardBytes
//    unless the variable itself is; each shard goes to the ps that
//    holds the fewest elements so far (lowest index on ties), which balances the load.
// Contract: value types, no threads, no I/O; errors are InvalidArgument naming the variable.

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/result.h"

namespace ts {

struct PartitionOptions {
    std::string policy = "round-robin";   // "round-robin" | "by-size"
    int64_t minShardBytes = 256 << 10;    // by-size only (TF's default is 256 KiB)

    nlohmann::json toJson() const;
    static Result<PartitionOptions> fromJson(const nlohmann::json& j, const std::string& source);
};

struct VariableInfo {
    std::string name;            // "dense/kernel"
    std::vector<int64_t> shape;  // row-major; a scalar has an empty shape
    int64_t numel() const;
};

// Rows [rowBegin, rowEnd) of one variable: elements [offset, offset + count) of its row-major data.
struct ShardSlice {
    int variable = 0;            // index into the variables given to the partitioner
    std::string name;
    int64_t rowBegin = 0, rowEnd = 0;
    int64_t offset = 0, count = 0;
    std::string toString() const;  // "dense/kernel[0:392]"
};

struct PartitionPlan {
    std::vector<std::vector<ShardSlice>> perPs;  // perPs[p]: the slices ps p holds, in plan order
    int64_t elementsOn(int ps) const;
    int numPs() const { return static_cast<int>(perPs.size()); }
};

Result<PartitionPlan> partitionVariables(const std::vector<VariableInfo>& variables, int numPs, const PartitionOptions& options);

} // namespace ts
