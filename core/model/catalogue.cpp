// The layer catalogue: every layer type TrainStudio knows, with Keras attribute names, kinds,
// defaults and limits. The designer palette and inspector are built from it, the parser
// type-checks attributes against it and analyze.cpp validates against it.

#include <algorithm>
#include <cctype>

#include "model/attrs.h"
#include "model/spec.h"

namespace ts {

namespace {

using nlohmann::json;

const std::vector<std::string> kActivations = {"linear", "relu",    "leaky_relu", "gelu",
                                               "sigmoid", "tanh",   "softmax"};

AttrSpec attr(std::string name, std::string kind, json def, std::string description,
              double min = 0, double max = 0, std::vector<std::string> choices = {},
              bool required = false)
{
    AttrSpec a;
    a.name = std::move(name);
    a.kind = std::move(kind);
    a.defaultValue = std::move(def);
    a.choices = std::move(choices);
    a.min = min;
    a.max = max;
    a.description = std::move(description);
    a.required = required;
    return a;
}

AttrSpec activationAttr(std::string def, bool required = false)
{
    return attr("activation", "enum", std::move(def),
                "elementwise function applied to the output", 0, 0, kActivations, required);
}

// Keras' per-layer dtype: "policy" follows the run's precision, "float32" keeps the layer in full
// precision (Keras' dtype="float32" on the output layers of a mixed_float16 model). It changes
// Dense and Conv2D, the layers that compute in 16 bits here; on Activation and Softmax (always
// float32 here) it is kept so that a Keras export pins them as the imported model did.
AttrSpec dtypeAttr()
{
    return attr("dtype", "enum", "policy",
                "compute type: \"policy\" follows the run's precision; \"float32\" keeps this layer in full precision", 0, 0,
                {"policy", "float32"});
}

AttrSpec paddingAttr()
{
    return attr("padding", "enum", "valid",
                "\"valid\": no padding; \"same\": pad so that output = ceil(input / stride)", 0, 0,
                {"valid", "same"});
}

std::vector<LayerKind> buildCatalogue()
{
    std::vector<LayerKind> c;
    auto add = [&c](std::string type, std::string group, std::string description, int minIn,
                    int maxIn, std::vector<AttrSpec> attrs) {
        LayerKind k;
        k.type = std::move(type);
        k.group = std::move(group);
        k.description = std::move(description);
        k.minInputs = minIn;
        k.maxInputs = maxIn;
        k.attrs = std::move(attrs);
        c.push_back(std::move(k));
    };

    add("Input", "core", "Model input: the shape of one sample, without the batch dimension", 0, 0,
        {attr("shape", "shape", json::array({784}),
              "dimensions of one sample, e.g. [784] or [28, 28, 1] (height, width, channels)", 1,
              0, {}, true)});
    add("Dense", "core", "Fully connected layer: activation(x @ kernel + bias) on a flat input", 1,
        1,
        {attr("units", "int", 64, "number of output features", 1, 0, {}, true),
         activationAttr("linear"),
         attr("use_bias", "bool", true, "add a learned bias vector"), dtypeAttr()});
    add("Flatten", "core", "Flattens (height, width, channels) into one feature vector", 1, 1, {});
    add("Reshape", "core", "Reshapes to target_shape (one dimension may be -1)", 1, 1,
        {attr("target_shape", "shape", json::array({-1}),
              "new shape without the batch dimension; one entry may be -1", -1, 0, {}, true)});
    add("Dropout", "core", "Randomly zeroes a fraction of inputs during training", 1, 1,
        {attr("rate", "float", 0.5, "fraction of inputs to drop, in [0, 1)", 0, 1, {}, true)});

    add("Conv2D", "convolution", "2-D convolution over (height, width, channels) inputs", 1, 1,
        {attr("filters", "int", 32, "number of output channels", 1, 0, {}, true),
         attr("kernel_size", "ints", json::array({3, 3}),
              "window (height, width), or one number for both", 1, 0, {}, true),
         attr("strides", "ints", json::array({1, 1}), "step (height, width), or one number", 1),
         paddingAttr(), activationAttr("linear"),
         attr("use_bias", "bool", true, "add a learned bias per filter"), dtypeAttr()});

    add("MaxPooling2D", "pooling", "Maximum over each pool_size window", 1, 1,
        {attr("pool_size", "ints", json::array({2, 2}), "window (height, width), or one number",
              1),
         attr("strides", "ints", nullptr, "step (height, width); default: pool_size", 1),
         paddingAttr()});
    add("AveragePooling2D", "pooling", "Mean over each pool_size window", 1, 1,
        {attr("pool_size", "ints", json::array({2, 2}), "window (height, width), or one number",
              1),
         attr("strides", "ints", nullptr, "step (height, width); default: pool_size", 1),
         paddingAttr()});
    add("GlobalAveragePooling2D", "pooling",
        "Mean over height and width: (height, width, channels) to (channels)", 1, 1, {});

    add("BatchNormalization", "normalisation",
        "Normalises each channel with batch statistics (running averages at inference)", 1, 1,
        {attr("axis", "int", -1, "feature axis; only the last axis (-1) is supported"),
         attr("momentum", "float", 0.99, "decay of the running mean and variance", 0, 1),
         attr("epsilon", "float", 1e-3, "added to the variance for stability", 0),
         attr("center", "bool", true, "learn an offset (beta)"),
         attr("scale", "bool", true, "learn a scale (gamma)")});

    add("Activation", "activation", "Applies an activation function elementwise", 1, 1,
        {activationAttr("relu", true), dtypeAttr()});
    add("ReLU", "activation", "max(x, 0)", 1, 1, {});
    add("LeakyReLU", "activation", "x if x > 0 else alpha * x", 1, 1,
        {attr("alpha", "float", 0.3,
              "slope for negative inputs (Keras 3 calls it negative_slope)", 0)});
    add("Softmax", "activation", "Softmax over the last axis", 1, 1,
        {attr("axis", "int", -1, "axis to normalise; only the last axis (-1) is supported"), dtypeAttr()});

    add("Add", "merge", "Elementwise sum of two or more inputs of the same shape", 2, -1, {});
    add("Concatenate", "merge",
        "Joins two or more inputs along the last axis (other dimensions must match)", 2, -1,
        {attr("axis", "int", -1, "axis to join on; only the last axis (-1) is supported")});
    return c;
}

std::size_t editDistance(const std::string& a, const std::string& b)
{
    std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
    for (std::size_t j = 0; j <= b.size(); ++j)
        prev[j] = j;
    for (std::size_t i = 1; i <= a.size(); ++i) {
        cur[0] = i;
        for (std::size_t j = 1; j <= b.size(); ++j) {
            const bool same = std::tolower(static_cast<unsigned char>(a[i - 1]))
                              == std::tolower(static_cast<unsigned char>(b[j - 1]));
            cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (same ? 0 : 1)});
        }
        std::swap(prev, cur);
    }
    return prev[b.size()];
}

bool isIntegral(const json& v)
{
    return v.is_number_integer();
}

} // namespace

const std::vector<LayerKind>& layerCatalogue()
{
    static const std::vector<LayerKind> catalogue = buildCatalogue();
    return catalogue;
}

const LayerKind* findLayerKind(const std::string& type)
{
    for (const LayerKind& k : layerCatalogue())
        if (k.type == type)
            return &k;
    return nullptr;
}

namespace model_detail {

std::string attrTypeError(const AttrSpec& attr, const json& value)
{
    if (value.is_null())
        return attr.defaultValue.is_null() ? std::string() : "expected a value, got null";
    if (attr.kind == "int")
        return isIntegral(value) ? std::string() : "expected an integer";
    if (attr.kind == "float")
        return value.is_number() ? std::string() : "expected a number";
    if (attr.kind == "bool")
        return value.is_boolean() ? std::string() : "expected true or false";
    if (attr.kind == "enum") {
        // Keras may serialise an activation as a config object; keras.cpp unwraps those.
        return value.is_string() ? std::string() : "expected a string";
    }
    if (attr.kind == "ints") {
        if (isIntegral(value))
            return {};
        if (value.is_array() && std::all_of(value.begin(), value.end(), isIntegral))
            return {};
        return "expected an integer or a list of integers";
    }
    if (attr.kind == "shape") {
        if (value.is_array() && std::all_of(value.begin(), value.end(), isIntegral))
            return {};
        return "expected a list of integers";
    }
    return {};
}

const AttrSpec* findAttr(const LayerKind& kind, const std::string& name)
{
    const std::string canonical =
        (kind.type == "LeakyReLU" && name == "negative_slope") ? std::string("alpha") : name;
    for (const AttrSpec& a : kind.attrs)
        if (a.name == canonical)
            return &a;
    return nullptr;
}

std::vector<std::string> closeMatches(const std::string& word,
                                      const std::vector<std::string>& candidates)
{
    std::vector<std::pair<std::size_t, std::string>> scored;
    const std::size_t limit = std::max<std::size_t>(2, word.size() / 3);
    for (const std::string& c : candidates) {
        const std::size_t d = editDistance(word, c);
        if (d <= limit)
            scored.emplace_back(d, c);
    }
    std::stable_sort(scored.begin(), scored.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<std::string> out;
    for (std::size_t i = 0; i < scored.size() && i < 3; ++i)
        out.push_back(scored[i].second);
    return out;
}

std::string quotedList(const std::vector<std::string>& names, const char* conjunction)
{
    std::string out;
    for (std::size_t i = 0; i < names.size(); ++i) {
        if (i > 0 && i + 1 == names.size()) {
            out += ' ';
            out += conjunction;
            out += ' ';
        } else if (i > 0) {
            out += ", ";
        }
        out += "'" + names[i] + "'";
    }
    return out;
}

std::string suggestion(const std::string& word, const std::vector<std::string>& candidates,
                       const std::string& fallbackLead)
{
    const std::vector<std::string> close = closeMatches(word, candidates);
    if (!close.empty()) {
        std::string s = "did you mean ";
        for (std::size_t i = 0; i < close.size(); ++i)
            s += (i == 0 ? "'" : (i + 1 == close.size() ? "' or '" : "', '")) + close[i];
        return s + "'?";
    }
    std::string s = fallbackLead;
    for (std::size_t i = 0; i < candidates.size(); ++i)
        s += (i == 0 ? " " : ", ") + candidates[i];
    return s;
}

std::vector<std::string> layerTypeNames()
{
    std::vector<std::string> names;
    for (const LayerKind& k : layerCatalogue())
        names.push_back(k.type);
    return names;
}

} // namespace model_detail
} // namespace ts
