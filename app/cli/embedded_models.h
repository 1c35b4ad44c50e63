#pragma once

#include <string>
#include <vector>

namespace tscli {

struct EmbeddedModel {
    const char* name;  // file name without .json, e.g. "seed_mlp"
    const char* json;
};

const std::vector<EmbeddedModel>& embeddedModels();

} // namespace tscli
