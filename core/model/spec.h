#pragma once
// ModelSpec: the model as a JSON graph of layers (what the designer edits, the CLI loads, the
// store snapshots) and its analysis (shape inference, validation, parameter and FLOP counts).
// Plain data; functions here are pure and thread-safe.

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "common/result.h"
#include "optim/precision.h"
#include "tensor/tensor.h"

namespace ts {

struct LayerSpec {
    std::string id;                   // unique; also the layer's Keras name and weight prefix
    std::string type;                 // catalogue type: "Dense", "Conv2D", ...
    nlohmann::json attrs = nlohmann::json::object();  // Keras attribute names (see catalogue)
    std::vector<std::string> inputs;  // producer node ids, in order
    double x = 0, y = 0;              // designer position
};

struct CompileSpec {
    nlohmann::json optimizer = {{"type", "adam"}, {"learning_rate", 1e-3}};  // + Keras config keys
    std::string loss = "sparse_categorical_crossentropy";
    bool fromLogits = false;
    std::vector<std::string> metrics = {"accuracy"};
    int64_t batchSize = 32;
    int64_t epochs = 1;
    // The Keras dtype policy the model was built under (an imported model's layer policies, or
    // "precision" in our file): the run's precision when its configuration names none.
    PrecisionPolicy precision = PrecisionPolicy::Float32;
    bool operator==(const CompileSpec&) const = default;  // every field, new ones included
};

struct ModelSpec {
    std::string name = "model";
    std::vector<LayerSpec> layers;    // file order (need not be topological)
    std::vector<std::string> outputs; // empty: the single sink node
    CompileSpec compile;
};

// Our file format ({"format": "trainstudio-model", "version": 1, ...}); see model/spec.cpp.
Result<ModelSpec> modelFromJson(const nlohmann::json& j, const std::string& source);
nlohmann::json modelToJson(const ModelSpec& spec);
// Reads our format or a Keras model.to_json() (Sequential or Functional), detected by content.
// Errors name the file and (for JSON syntax errors) the byte offset/line.
Result<ModelSpec> loadModelFile(const std::string& path);
Result<ModelSpec> parseModelText(const std::string& text, const std::string& source);
Status saveModelFile(const ModelSpec& spec, const std::string& path);

// Keras interop (model/keras.cpp).
Result<ModelSpec> modelFromKerasJson(const nlohmann::json& j, const std::string& source);
Result<nlohmann::json> modelToKerasJson(const ModelSpec& spec);

struct ParamSpec {
    std::string name;       // "kernel", "bias", "gamma", "beta", "moving_mean", "moving_variance"
    Shape shape;            // Keras layout: Dense (in, out), Conv2D (kh, kw, in, out)
    bool trainable = true;  // moving_* are not
    std::string init;       // "glorot_uniform", "zeros", "ones"
    int64_t fanIn = 0, fanOut = 0;  // for glorot: Dense in/out; Conv kh*kw*in / kh*kw*out
};

struct Problem {
    std::string nodeId;   // empty for model-level problems
    std::string message;  // "node 'dense_1': expects 1 input, got 0"
    std::string hint;     // "connect an input to 'dense_1'"
    ErrorCode code = ErrorCode::InvalidArgument;  // ShapeMismatch for shape arithmetic problems
};

// One node after analysis, with attributes normalised (Keras defaults filled in).
struct NodeInfo {
    std::string id;
    std::string type;
    nlohmann::json attrs;            // normalised, e.g. Dense: units, activation, use_bias
    std::vector<int> inputs;         // indices into GraphAnalysis::nodes
    std::vector<Shape> inputShapes;  // without the batch dimension
    Shape outputShape;               // without the batch dimension
    std::vector<ParamSpec> params;
    int64_t paramCount = 0;
    int64_t flops = 0;               // forward FLOPs per sample (multiply-add = 2)
    Conv2dParams conv;               // Conv2D: explicit padding from "same"/"valid"
    Pool2dParams pool;               // pooling layers
    bool ok = true;                  // false if this node (or an input) has a problem
};

struct GraphAnalysis {
    // Topological order (inputs first). Nodes on or behind a cycle follow, ok=false; a node
    // whose id repeats an earlier one is left out.
    std::vector<NodeInfo> nodes;
    std::vector<int> inputNodes;     // indices of Input nodes
    std::vector<int> outputNodes;    // indices of output nodes
    std::vector<Problem> problems;
    int64_t totalParams = 0;
    int64_t trainableParams = 0;
    int64_t totalFlops = 0;
    bool ok() const { return problems.empty(); }
    int indexOf(const std::string& id) const;  // -1 if absent
};

// Shape inference + validation. Reports every problem it finds (dangling inputs, unknown
// types, bad attributes, shape mismatches, cycles, duplicate ids, no/multiple inputs/outputs).
GraphAnalysis analyzeModel(const ModelSpec& spec);
// All problems joined into one Error (code ShapeMismatch/InvalidArgument), or ok.
Status problemsToStatus(const GraphAnalysis& a, const std::string& source);

// Layer catalogue: what the designer palette and the inspector show.
struct AttrSpec {
    std::string name;        // Keras name
    std::string kind;        // "int", "float", "bool", "enum", "ints" (list), "shape"
    nlohmann::json defaultValue;
    std::vector<std::string> choices;  // enum
    double min = 0, max = 0;           // numeric limits (max 0 = unbounded)
    std::string description;
    // Keras has no default (units, filters, ...): the file must give it. defaultValue is then
    // only the designer's suggestion for a new node.
    bool required = false;
};
struct LayerKind {
    std::string type;        // "Dense"
    std::string group;       // "core", "convolution", "pooling", "normalisation", "activation", "merge"
    std::string description; // one line
    int minInputs = 1, maxInputs = 1;  // -1 = unbounded
    std::vector<AttrSpec> attrs;
};
const std::vector<LayerKind>& layerCatalogue();
const LayerKind* findLayerKind(const std::string& type);

} // namespace ts
