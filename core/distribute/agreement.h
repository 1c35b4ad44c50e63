#pragma once
// Agreement between the processes of one multi-worker run before it starts: every task must
// train the same model with the same batch, optimizer, schedule, epochs and data options, or
// the run either fails far from the cause (a collective of the wrong size) or, worse, finishes
// with weights no single configuration would give (different learning rates all-reduce fine).
// Contract: a collective — every rank calls it at the same point, with its own settings. Each
// rank's settings (a JSON object) reach every other rank, so all return the same verdict: OK,
// or one InvalidArgument that names each task that differs from rank 0 and the settings that
// differ (dotted paths, both values). Errors of the communicator itself are returned as they are.

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/result.h"
#include "distribute/communicator.h"

namespace ts {

// `rankNames[r]` names rank r in messages ("worker:1 at host:port"); shorter than size(): "rank r".
Status agreeOnSettings(Communicator& comm, int rank, const std::vector<std::string>& rankNames, const nlohmann::json& settings);

// Where `theirs` differs from `ours`: "path (theirs vs ours)", object keys joined with '.',
// array elements as [i]; at most `limit` entries, long values shortened.
std::vector<std::string> settingDifferences(const nlohmann::json& theirs, const nlohmann::json& ours, std::size_t limit = 6);

} // namespace ts
