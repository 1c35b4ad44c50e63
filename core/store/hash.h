#pragma once
// Checksums of run configurations and files. No cryptography is needed: these detect a changed
// configuration or a replaced/truncated checkpoint, not an attacker. FNV-1a, 64 bits.

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/result.h"

namespace ts::store {

uint64_t fnv1a64(std::string_view data, uint64_t seed = 0xcbf29ce484222325ull);

// "fnv1a64:" + 16 lowercase hex digits of the canonical dump of `config` (nlohmann::json
// objects keep their keys sorted, so equal documents give equal text whatever their key order).
std::string configHash(const nlohmann::json& config);

// "fnv1a64:" + 16 hex digits of the file's bytes; errors name the file.
Result<std::string> fileChecksum(const std::string& path);

} // namespace ts::store
