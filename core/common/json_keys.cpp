#include "common/json_keys.h"

namespace ts {

Status checkJsonKeys(const nlohmann::json& j, const std::set<std::string>& allowed, const std::string& at)
{
    if (!j.is_object()) return okStatus();
    for (auto it = j.begin(); it != j.end(); ++it)
        if (!allowed.count(it.key())) {
            std::string list;
            for (const auto& k : allowed) list += (list.empty() ? "" : ", ") + k;
            return makeError(ErrorCode::ParseError, at + ": unknown key \"" + it.key() + "\"", "known keys: " + list);
        }
    return okStatus();
}

} // namespace ts
