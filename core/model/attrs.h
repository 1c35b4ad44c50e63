#pragma once
// Helpers shared by the model files (spec.cpp, analyze.cpp, keras.cpp): attribute type checks
// against the catalogue and "did you mean" hints. Internal to core/model.

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/spec.h"

namespace ts::model_detail {

// Empty if `value` has the JSON type `attr.kind` asks for, else what was expected, e.g.
// "expected an integer" (a null is fine where the default is null). Ranges are not checked here.
std::string attrTypeError(const AttrSpec& attr, const nlohmann::json& value);

// The attribute spec of `kind` named `name` (aliases such as LeakyReLU's Keras 3 name
// "negative_slope" resolve to their canonical attribute), or null.
const AttrSpec* findAttr(const LayerKind& kind, const std::string& name);

// Candidates within a small edit distance of `word` (best first, at most 3).
std::vector<std::string> closeMatches(const std::string& word,
                                      const std::vector<std::string>& candidates);
// "'a', 'b' and 'c'" (or "... or 'c'" with conjunction "or")
std::string quotedList(const std::vector<std::string>& names, const char* conjunction = "and");
// "did you mean 'x'?" or, with no close match, "<fallbackLead> 'a', 'b', ..."
std::string suggestion(const std::string& word, const std::vector<std::string>& candidates,
                       const std::string& fallbackLead);

std::vector<std::string> layerTypeNames();

} // namespace ts::model_detail
