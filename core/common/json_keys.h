#pragma once
// Refusing unknown keys in our JSON files (run configurations, pipelines): a misspelt or
// misplaced key would otherwise be ignored and the run would differ from what the file says.

#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "common/result.h"

namespace ts {

// ParseError "<at>: unknown key "<k>"" with the known keys as the hint; ok if `j` is not an object.
Status checkJsonKeys(const nlohmann::json& j, const std::set<std::string>& allowed, const std::string& at);

} // namespace ts
