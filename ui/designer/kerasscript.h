#pragma once
// A runnable Keras (tf.keras) Python script equivalent to a model: the same graph through the
// functional API with the same layer names and (normalised) attributes, compiled with the
// model's optimizer, loss and metrics, and trained on Fashion-MNIST with its batch size and
// epochs. Plain C++ on the spec.

#include <string>

#include "common/result.h"
#include "model/spec.h"

namespace ts {

// Fails (naming the problems) when the model does not validate: such a script could not run.
Result<std::string> kerasScript(const ModelSpec& spec);

// A Python identifier for a layer id ("dense-1" -> "dense_1", "class" -> "class_").
std::string pythonIdentifier(const std::string& id);

} // namespace ts
