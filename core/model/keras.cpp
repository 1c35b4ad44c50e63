// Keras interop: reads model.to_json() of Sequential and Functional models written by Keras 2
// (tf.keras: inbound_nodes as [[["name", node, tensor, {}]]], "batch_input_shape") and Keras 3
// (inbound_nodes as [{"args": [__keras_tensor__ ...], "kwargs": {}}], "batch_shape", "module"
// keys, DTypePolicy objects), and writes Keras 2 style JSON (Sequential for plain chains,
// Functional otherwise) that tf.keras' model_from_json and this reader both accept.
//
// Only what TrainStudio can run is accepted: a layer class outside the catalogue, or an option
// that would change the computation (channels_first, dilation, groups, regularisers, frozen
// layers, shared layers) is an error naming the layer, never silently dropped. Initialisers are
// ignored: they only affect the starting weights, which TrainStudio draws itself.
// Imported attributes are normalised by analyzeModel (defaults filled in), so exporting and
// importing again gives the same spec. Positions are laid out top to bottom by depth.
// Dtype policies: a mixed_float16 or mixed_bfloat16 policy on the layers becomes the model's
// compile precision (the run's default precision); a Dense, Conv2D, Activation or Softmax pinned
// to float32 under it keeps attrs dtype "float32" (catalogue.cpp says what that changes). float16 and
// bfloat16 policies (16-bit variables) and float64 are errors naming the layer. Export writes
// the policy on every layer, as tf.keras does under a global policy.
// Compile settings (Keras 3's "compile_config", tf.keras 2's "training_config") give the model's
// optimizer and loss; see CompileImporter.

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "common/utf8.h"
#include "model/attrs.h"
#include "model/spec.h"
#include "nn/program.h"
#include "optim/optimizer.h"

namespace ts {

using nlohmann::json;
using namespace model_detail;

namespace {

constexpr const char* kExportKerasVersion = "2.15.0";

const std::map<std::string, std::string>& classToType()
{
    static const std::map<std::string, std::string> m = {
        {"InputLayer", "Input"},
        {"Dense", "Dense"},
        {"Conv2D", "Conv2D"},
        {"Convolution2D", "Conv2D"},
        {"MaxPooling2D", "MaxPooling2D"},
        {"MaxPool2D", "MaxPooling2D"},
        {"AveragePooling2D", "AveragePooling2D"},
        {"AvgPool2D", "AveragePooling2D"},
        {"GlobalAveragePooling2D", "GlobalAveragePooling2D"},
        {"GlobalAvgPool2D", "GlobalAveragePooling2D"},
        {"Flatten", "Flatten"},
        {"Reshape", "Reshape"},
        {"Dropout", "Dropout"},
        {"BatchNormalization", "BatchNormalization"},
        {"Activation", "Activation"},
        {"ReLU", "ReLU"},
        {"LeakyReLU", "LeakyReLU"},
        {"Softmax", "Softmax"},
        {"Add", "Add"},
        {"Concatenate", "Concatenate"},
    };
    return m;
}

std::string supportedClasses()
{
    std::string s;
    for (const auto& [cls, type] : classToType())
        s += (s.empty() ? "" : ", ") + cls;
    return s;
}

bool hasAttr(const LayerKind& kind, const std::string& name)
{
    return std::any_of(kind.attrs.begin(), kind.attrs.end(), [&](const AttrSpec& a) { return a.name == name; });
}

class Importer {
public:
    explicit Importer(std::string source) : m_source(std::move(source)) {}

    void error(const std::string& message, std::string hint = {})
    {
        m_errors.push_back(m_source + ": " + message);
        if (m_hint.empty())
            m_hint = std::move(hint);
    }
    bool ok() const { return m_errors.empty(); }
    Error toError(ErrorCode code = ErrorCode::Unsupported) const
    {
        std::string message = m_errors.front();
        for (std::size_t i = 1; i < m_errors.size(); ++i)
            message += "\n" + m_errors[i];
        return makeError(code, message,
                         m_hint.empty() ? "check the file is an unmodified Keras model.to_json()"
                                        : m_hint);
    }

    // One Keras layer dict to a LayerSpec (no inputs). False on an error (reported).
    bool convertLayer(const json& layer, const std::string& path, LayerSpec& out)
    {
        if (!layer.is_object() || !layer.contains("class_name") || !layer["class_name"].is_string()) {
            error(path + ": expected a layer object with a class_name");
            return false;
        }
        const std::string cls = layer["class_name"].get<std::string>();
        const json cfg = layer.contains("config") && layer["config"].is_object()
                             ? layer["config"] : json::object();
        std::string name;
        if (cfg.contains("name") && cfg["name"].is_string())
            name = cfg["name"].get<std::string>();
        else if (layer.contains("name") && layer["name"].is_string())
            name = layer["name"].get<std::string>();
        if (name.empty()) {
            error(path + ": " + cls + " layer has no name");
            return false;
        }
        out.id = name;
        const std::string what = "layer '" + name + "' (" + cls + ")";
        auto found = classToType().find(cls);
        if (found == classToType().end()) {
            if (cfg.contains("layers"))
                error(what + " is a nested model, which TrainStudio does not import",
                      "flatten the nested model into its parent before to_json()");
            else
                error(what + ": Keras layer class " + cls + " is not supported by TrainStudio",
                      "supported Keras layers: " + supportedClasses());
            return false;
        }
        out.type = found->second;
        m_what = what;
        m_ok = true;
        json& a = out.attrs;
        a = json::object();
        if (out.type != "Input")  // an InputLayer's dtype is its tensor's, not a policy
            dtypePolicy(cfg, out);

        if (cfg.contains("trainable") && cfg["trainable"] == false)
            unsupported("is frozen (trainable: false)", "TrainStudio trains every layer");
        for (const char* key : {"kernel_regularizer", "bias_regularizer", "activity_regularizer",
                                "beta_regularizer", "gamma_regularizer", "kernel_constraint",
                                "bias_constraint", "beta_constraint", "gamma_constraint"})
            if (cfg.contains(key) && !cfg[key].is_null())
                unsupported(std::string("uses ") + key,
                            "remove the regulariser/constraint before exporting");

        const std::string& t = out.type;
        if (t == "Input") {
            json shape;
            for (const char* key : {"batch_input_shape", "batch_shape"})
                if (cfg.contains(key) && cfg[key].is_array() && !cfg[key].empty()) {
                    shape = cfg[key];
                    shape.erase(shape.begin());
                    break;
                }
            for (const char* key : {"input_shape", "shape"})
                if (shape.is_null() && cfg.contains(key) && cfg[key].is_array())
                    shape = cfg[key];
            if (shape.is_null()) {
                error(what + " has no batch_input_shape/batch_shape",
                      "build the model with a known input shape before to_json()");
                return false;
            }
            if (!checkShape(shape))
                return false;
            a["shape"] = shape;
        } else if (t == "Dense") {
            copy(cfg, "units", a);
            activation(cfg, a);
            copy(cfg, "use_bias", a);
        } else if (t == "Conv2D") {
            copy(cfg, "filters", a);
            copy(cfg, "kernel_size", a);
            copy(cfg, "strides", a);
            padding(cfg, a);
            activation(cfg, a);
            copy(cfg, "use_bias", a);
            channelsLast(cfg);
            for (const char* key : {"dilation_rate", "groups"})
                if (cfg.contains(key) && !isOne(cfg[key]))
                    unsupported(std::string("uses ") + key + " " + cfg[key].dump(),
                                "TrainStudio's Conv2D has dilation 1 and groups 1");
        } else if (t == "MaxPooling2D" || t == "AveragePooling2D") {
            copy(cfg, "pool_size", a);
            copy(cfg, "strides", a);
            padding(cfg, a);
            channelsLast(cfg);
        } else if (t == "GlobalAveragePooling2D") {
            channelsLast(cfg);
            if (cfg.contains("keepdims") && cfg["keepdims"] == true)
                unsupported("uses keepdims=True", "follow it with a Reshape instead");
        } else if (t == "Flatten") {
            channelsLast(cfg);
        } else if (t == "Reshape") {
            copy(cfg, "target_shape", a);
        } else if (t == "Dropout") {
            copy(cfg, "rate", a);
            if (cfg.contains("noise_shape") && !cfg["noise_shape"].is_null())
                unsupported("uses noise_shape", "use a plain Dropout");
        } else if (t == "BatchNormalization") {
            axis(cfg, a);
            for (const char* key : {"momentum", "epsilon", "center", "scale"})
                copy(cfg, key, a);
            if (cfg.contains("renorm") && cfg["renorm"] == true)
                unsupported("uses batch renormalisation", "set renorm=False");
            if (cfg.contains("virtual_batch_size") && !cfg["virtual_batch_size"].is_null())
                unsupported("uses virtual_batch_size", "remove virtual_batch_size");
        } else if (t == "Activation") {
            activation(cfg, a);
        } else if (t == "ReLU") {
            const bool plain = (!cfg.contains("max_value") || cfg["max_value"].is_null())
                               && isZero(cfg, "negative_slope") && isZero(cfg, "threshold");
            if (!plain)
                unsupported("sets max_value, negative_slope or threshold",
                            "use a plain ReLU, or LeakyReLU for a negative slope");
        } else if (t == "LeakyReLU") {
            if (cfg.contains("alpha"))
                a["alpha"] = cfg["alpha"];
            else if (cfg.contains("negative_slope"))
                a["alpha"] = cfg["negative_slope"];
        } else if (t == "Softmax" || t == "Concatenate") {
            axis(cfg, a);
        }
        return m_ok;
    }

    bool checkShape(const json& shape)
    {
        for (const json& d : shape)
            if (!d.is_number_integer()) {
                error(m_what + " has an unknown (None) or invalid dimension in " + shape.dump(),
                      "TrainStudio needs a fixed input shape; give every dimension but the batch");
                return false;
            }
        return true;
    }

    std::vector<std::string> errors() const { return m_errors; }

    // The model's policy: the mixed policy its layers use (float32 if none does). Layers pinned
    // to float32 under it keep that (attrs "dtype", where the catalogue has it); two different
    // mixed policies are an error.
    bool modelPolicy(ModelSpec& spec)
    {
        if (m_mixed.size() > 1) {
            std::string names;
            for (const auto& [policy, layer] : m_mixed)
                names += (names.empty() ? "" : " and ") + std::string(precisionPolicyName(policy)) + " (layer '" + layer + "')";
            error("the layers use two mixed-precision policies, " + names,
                  "set one global policy (keras.mixed_precision.set_global_policy) before building the model");
            return false;
        }
        if (m_mixed.empty()) return true;
        spec.compile.precision = m_mixed.begin()->first;
        for (LayerSpec& l : spec.layers)
            if (m_float32.count(l.id) && findLayerKind(l.type) && hasAttr(*findLayerKind(l.type), "dtype")) l.attrs["dtype"] = "float32";
        return true;
    }

private:
    // Keras' dtype policy of a layer: "float32", {"class_name": "Policy", "config": {"name":
    // "mixed_float16"}} (tf.keras 2), or {"class_name": "DTypePolicy", ...} (Keras 3).
    void dtypePolicy(const json& cfg, const LayerSpec& layer)
    {
        if (!cfg.contains("dtype") || cfg["dtype"].is_null()) return;
        const json& d = cfg["dtype"];
        std::string name;
        if (d.is_string())
            name = d.get<std::string>();
        else if (d.is_object() && d.contains("config") && d["config"].is_object() && d["config"].value("name", json()).is_string())
            name = d["config"]["name"].get<std::string>();
        if (name == "float32") {
            m_float32.insert(layer.id);
            return;
        }
        auto policy = PrecisionConfig::parsePolicy(name, "");
        if (name.empty() || !policy.ok()) {
            // float16/bfloat16 keep the variables in 16 bits; float64 and the rest are not trained here.
            unsupported("has dtype policy " + (name.empty() ? d.dump() : "'" + name + "'"),
                        "TrainStudio trains float32 variables: use the float32, mixed_float16 or mixed_bfloat16 policy");
            return;
        }
        m_mixed.emplace(policy.value(), layer.id);
    }


    void unsupported(const std::string& what, std::string hint)
    {
        error(m_what + " " + what + ", which TrainStudio does not support", std::move(hint));
        m_ok = false;
    }

    static void copy(const json& cfg, const char* key, json& a)
    {
        if (cfg.contains(key) && !cfg[key].is_null())
            a[key] = cfg[key];
    }

    static bool isOne(const json& v)
    {
        if (v.is_null())
            return true;
        if (v.is_number())
            return v.get<double>() == 1;
        if (v.is_array())
            return std::all_of(v.begin(), v.end(),
                               [](const json& x) { return x.is_number() && x.get<double>() == 1; });
        return false;
    }

    static bool isZero(const json& cfg, const char* key)
    {
        return !cfg.contains(key) || cfg[key].is_null()
               || (cfg[key].is_number() && cfg[key].get<double>() == 0);
    }

    void channelsLast(const json& cfg)
    {
        if (cfg.contains("data_format") && !cfg["data_format"].is_null()
            && cfg["data_format"] != "channels_last")
            unsupported("uses data_format " + cfg["data_format"].dump(),
                        "TrainStudio is channels-last (NHWC) like Keras' default");
    }

    void padding(const json& cfg, json& a)
    {
        if (!cfg.contains("padding"))
            return;
        const json& p = cfg["padding"];
        if (p.is_string() && p != "valid" && p != "same")
            unsupported("uses padding " + p.dump(), "use \"valid\" or \"same\"");
        a["padding"] = p;
    }

    void axis(const json& cfg, json& a)
    {
        if (!cfg.contains("axis"))
            return;
        json v = cfg["axis"];
        // tf.keras' BatchNormalization writes the built axis as a list, e.g. [3].
        if (v.is_array() && v.size() == 1)
            v = v[0];
        if (!v.is_number_integer()) {
            unsupported("uses axis " + cfg["axis"].dump(), "only the last axis is supported");
            return;
        }
        a["axis"] = v;
    }

    void activation(const json& cfg, json& a)
    {
        if (!cfg.contains("activation"))
            return;
        const json& v = cfg["activation"];
        std::string name;
        if (v.is_null())
            name = "linear";
        else if (v.is_string())
            name = v.get<std::string>();
        else if (v.is_object() && v.contains("config") && v["config"].is_string())
            name = v["config"].get<std::string>();  // {"class_name": "function", "config": "relu"}
        else if (v.is_object() && v.contains("class_name") && v["class_name"].is_string())
            name = v["class_name"].get<std::string>();
        if (name == "softmax_v2")  // tf.nn.softmax's name in TF 2
            name = "softmax";
        Result<Activation> act = parseActivation(name);
        if (!act.ok()) {
            unsupported("uses activation " + (name.empty() ? v.dump() : "'" + name + "'"),
                        act.ok() ? std::string() : act.error().hint);
            return;
        }
        a["activation"] = activationName(act.value());
    }

    std::string m_source;
    std::vector<std::string> m_errors;
    std::string m_hint;
    std::string m_what;
    bool m_ok = true;
    std::map<PrecisionPolicy, std::string> m_mixed;  // mixed policies seen -> a layer using it
    std::set<std::string> m_float32;                 // layers whose policy is float32
};

// Producer names of a layer from its inbound_nodes, Keras 2 or Keras 3 style.
void collectKeras3Tensors(const json& v, std::vector<json>& out)
{
    if (v.is_object()) {
        if (v.value("class_name", "") == "__keras_tensor__") {
            out.push_back(v.contains("config") ? v["config"].value("keras_history", json())
                                               : json());
            return;
        }
        for (const json& x : v)
            collectKeras3Tensors(x, out);
    } else if (v.is_array()) {
        for (const json& x : v)
            collectKeras3Tensors(x, out);
    }
}

bool isHistory(const json& v)
{
    return v.is_array() && v.size() >= 3 && v[0].is_string() && v[1].is_number_integer()
           && v[2].is_number_integer();
}

bool inboundNames(Importer& imp, const json& layer, const std::string& name,
                  std::vector<std::string>& out)
{
    if (!layer.contains("inbound_nodes"))
        return true;
    const json& inbound = layer["inbound_nodes"];
    if (!inbound.is_array()) {
        imp.error("layer '" + name + "': inbound_nodes is not a list");
        return false;
    }
    if (inbound.empty())
        return true;
    if (inbound.size() > 1) {
        imp.error("layer '" + name + "' is called " + std::to_string(inbound.size())
                      + " times (a shared layer), which TrainStudio does not support",
                  "give each call its own layer");
        return false;
    }
    const json& node = inbound[0];
    std::vector<json> history;
    if (node.is_object()) {
        collectKeras3Tensors(node.value("args", json::array()), history);  // Keras 3
    } else if (node.is_array()) {
        for (const json& t : node)
            history.push_back(t);  // Keras 2: ["name", node_index, tensor_index, {kwargs}]
    }
    for (const json& h : history) {
        if (!isHistory(h)) {
            imp.error("layer '" + name + "': cannot read an inbound tensor " + h.dump());
            return false;
        }
        if (h[1].get<int64_t>() != 0 || h[2].get<int64_t>() != 0) {
            imp.error("layer '" + name + "' reads output " + h.dump()
                          + " (a shared or multi-output layer), which TrainStudio does not "
                            "support");
            return false;
        }
        out.push_back(h[0].get<std::string>());
    }
    return true;
}

std::vector<std::string> tensorNames(const json& v)
{
    std::vector<std::string> out;
    if (isHistory(v)) {
        out.push_back(v[0].get<std::string>());
    } else if (v.is_array()) {
        for (const json& x : v)
            for (std::string& s : tensorNames(x))
                out.push_back(std::move(s));
    } else if (v.is_object()) {
        for (const json& x : v)
            for (std::string& s : tensorNames(x))
                out.push_back(std::move(s));
    }
    return out;
}

// Top to bottom by depth from the inputs, side by side within a depth.
void layout(ModelSpec& spec)
{
    std::map<std::string, int> depth;
    std::map<int, int> perDepth;
    std::vector<int> depthOf(spec.layers.size(), 0);
    for (std::size_t i = 0; i < spec.layers.size(); ++i) {
        int d = 0;
        for (const std::string& in : spec.layers[i].inputs) {
            auto it = depth.find(in);
            if (it != depth.end())
                d = std::max(d, it->second + 1);
        }
        depth[spec.layers[i].id] = d;
        depthOf[i] = d;
        ++perDepth[d];
    }
    std::map<int, int> placed;
    for (std::size_t i = 0; i < spec.layers.size(); ++i) {
        const int d = depthOf[i];
        const int k = placed[d]++;
        spec.layers[i].x = (k - (perDepth[d] - 1) / 2.0) * 200.0;
        spec.layers[i].y = d * 100.0;
    }
}

// Attributes as analyzeModel normalises them, so import(export(x)) == x. Broken nodes keep
// what the file said, for the designer to show.
void normaliseAttrs(ModelSpec& spec)
{
    const GraphAnalysis a = analyzeModel(spec);
    for (LayerSpec& l : spec.layers) {
        const int k = a.indexOf(l.id);
        if (k >= 0 && a.nodes[static_cast<std::size_t>(k)].ok)
            l.attrs = a.nodes[static_cast<std::size_t>(k)].attrs;
    }
}

// The single node nothing consumes, if there is exactly one.
std::string singleSink(const ModelSpec& spec)
{
    std::set<std::string> consumed;
    for (const LayerSpec& l : spec.layers)
        consumed.insert(l.inputs.begin(), l.inputs.end());
    std::string sink;
    for (const LayerSpec& l : spec.layers)
        if (!consumed.count(l.id)) {
            if (!sink.empty())
                return {};
            sink = l.id;
        }
    return sink;
}

Result<ModelSpec> importSequential(Importer& imp, const json& config, ModelSpec spec)
{
    const json layers = config.is_array() ? config : config.value("layers", json::array());
    std::string previous;
    for (std::size_t i = 0; i < layers.size(); ++i) {
        LayerSpec l;
        if (!imp.convertLayer(layers[i], "config.layers[" + std::to_string(i) + "]", l))
            continue;
        if (l.type != "Input" && spec.layers.empty()) {
            // No InputLayer: the first layer carries the input shape (or the model says it).
            const json& cfg = layers[i]["config"];
            json shape;
            for (const char* key : {"batch_input_shape", "batch_shape"})
                if (cfg.contains(key) && cfg[key].is_array() && !cfg[key].empty())
                    shape = cfg[key];
            if (shape.is_null() && config.is_object() && config.contains("build_input_shape")
                && config["build_input_shape"].is_array())
                shape = config["build_input_shape"];
            if (shape.is_null()) {
                imp.error("Sequential model has no input shape (no InputLayer and no "
                          "batch_input_shape on '" + l.id + "')",
                          "build the model (or give the first layer input_shape) before to_json()");
                return imp.toError(ErrorCode::ParseError);
            }
            shape.erase(shape.begin());
            LayerSpec input;
            input.id = l.id + "_input";  // the name tf.keras gives the implicit InputLayer
            input.type = "Input";
            input.attrs = json{{"shape", shape}};
            if (!imp.checkShape(shape))
                return imp.toError(ErrorCode::ParseError);
            spec.layers.push_back(input);
            previous = input.id;
        }
        if (l.type == "Input" && !spec.layers.empty()) {
            imp.error("Sequential model has an InputLayer '" + l.id + "' after other layers");
            continue;
        }
        if (!previous.empty())
            l.inputs = {previous};
        previous = l.id;
        spec.layers.push_back(std::move(l));
    }
    if (!imp.ok())
        return imp.toError();
    return spec;
}

Result<ModelSpec> importFunctional(Importer& imp, const json& config, ModelSpec spec)
{
    const json layers = config.value("layers", json::array());
    for (std::size_t i = 0; i < layers.size(); ++i) {
        LayerSpec l;
        if (!imp.convertLayer(layers[i], "config.layers[" + std::to_string(i) + "]", l))
            continue;
        if (!inboundNames(imp, layers[i], l.id, l.inputs))
            continue;
        spec.layers.push_back(std::move(l));
    }
    if (!imp.ok())
        return imp.toError();
    spec.outputs = tensorNames(config.value("output_layers", json::array()));
    if (spec.outputs.size() == 1 && spec.outputs[0] == singleSink(spec))
        spec.outputs.clear();  // the default; keeps Sequential and Functional imports alike
    return spec;
}

// ---- export -----------------------------------------------------------------------------------

json initializer(const char* cls)
{
    return json{{"class_name", cls},
                {"config", std::string(cls) == "GlorotUniform" ? json{{"seed", nullptr}}
                                                               : json::object()}};
}

json nullRegularisers(std::initializer_list<const char*> keys)
{
    json j = json::object();
    for (const char* k : keys)
        j[k] = nullptr;
    return j;
}

// A layer's dtype as tf.keras 2 writes it: the policy's name for float32, else a Policy object.
json kerasDtype(const NodeInfo& n, PrecisionPolicy model)
{
    if (model == PrecisionPolicy::Float32 || n.attrs.value("dtype", std::string("policy")) == "float32")
        return "float32";
    return json{{"class_name", "Policy"}, {"config", {{"name", precisionPolicyName(model)}}}};
}

Result<json> kerasLayer(const NodeInfo& n, PrecisionPolicy policy)
{
    const json& a = n.attrs;
    json cfg = {{"name", n.id}, {"trainable", true}, {"dtype", kerasDtype(n, policy)}};
    std::string cls = n.type;
    const std::string& t = n.type;
    if (t == "Input") {
        cls = "InputLayer";
        json shape = json::array({nullptr});
        for (const json& d : a["shape"])
            shape.push_back(d);
        cfg = {{"batch_input_shape", shape}, {"dtype", "float32"}, {"sparse", false},
               {"ragged", false}, {"name", n.id}};
    } else if (t == "Dense") {
        cfg.update(json{{"units", a["units"]},
                        {"activation", a["activation"]},
                        {"use_bias", a["use_bias"]},
                        {"kernel_initializer", initializer("GlorotUniform")},
                        {"bias_initializer", initializer("Zeros")}});
        cfg.update(nullRegularisers({"kernel_regularizer", "bias_regularizer",
                                     "activity_regularizer", "kernel_constraint",
                                     "bias_constraint"}));
    } else if (t == "Conv2D") {
        cfg.update(json{{"filters", a["filters"]},
                        {"kernel_size", a["kernel_size"]},
                        {"strides", a["strides"]},
                        {"padding", a["padding"]},
                        {"data_format", "channels_last"},
                        {"dilation_rate", {1, 1}},
                        {"groups", 1},
                        {"activation", a["activation"]},
                        {"use_bias", a["use_bias"]},
                        {"kernel_initializer", initializer("GlorotUniform")},
                        {"bias_initializer", initializer("Zeros")}});
        cfg.update(nullRegularisers({"kernel_regularizer", "bias_regularizer",
                                     "activity_regularizer", "kernel_constraint",
                                     "bias_constraint"}));
    } else if (t == "MaxPooling2D" || t == "AveragePooling2D") {
        cfg.update(json{{"pool_size", a["pool_size"]},
                        {"padding", a["padding"]},
                        {"strides", a["strides"]},
                        {"data_format", "channels_last"}});
    } else if (t == "GlobalAveragePooling2D") {
        cfg.update(json{{"data_format", "channels_last"}, {"keepdims", false}});
    } else if (t == "Flatten") {
        cfg["data_format"] = "channels_last";
    } else if (t == "Reshape") {
        cfg["target_shape"] = a["target_shape"];
    } else if (t == "Dropout") {
        cfg.update(json{{"rate", a["rate"]}, {"noise_shape", nullptr}, {"seed", nullptr}});
    } else if (t == "BatchNormalization") {
        cfg.update(json{{"axis", -1},
                        {"momentum", a["momentum"]},
                        {"epsilon", a["epsilon"]},
                        {"center", a["center"]},
                        {"scale", a["scale"]},
                        {"beta_initializer", initializer("Zeros")},
                        {"gamma_initializer", initializer("Ones")},
                        {"moving_mean_initializer", initializer("Zeros")},
                        {"moving_variance_initializer", initializer("Ones")}});
        cfg.update(nullRegularisers({"beta_regularizer", "gamma_regularizer", "beta_constraint",
                                     "gamma_constraint"}));
    } else if (t == "Activation") {
        cfg["activation"] = a["activation"];
    } else if (t == "ReLU") {
        cfg.update(json{{"max_value", nullptr}, {"negative_slope", 0.0}, {"threshold", 0.0}});
    } else if (t == "LeakyReLU") {
        cfg["alpha"] = a["alpha"];
    } else if (t == "Softmax" || t == "Concatenate") {
        cfg["axis"] = -1;
    } else if (t != "Add") {
        return makeError(ErrorCode::Unsupported,
                         "node '" + n.id + "': no Keras export for layer type " + t,
                         "report this as a TrainStudio bug");
    }
    return json{{"class_name", cls}, {"config", cfg}};
}

bool isChain(const GraphAnalysis& a)
{
    if (a.inputNodes.size() != 1 || a.inputNodes[0] != 0 || a.outputNodes.size() != 1
        || a.outputNodes[0] != static_cast<int>(a.nodes.size()) - 1)
        return false;
    for (std::size_t k = 1; k < a.nodes.size(); ++k)
        if (a.nodes[k].inputs != std::vector<int>{static_cast<int>(k) - 1})
            return false;
    return true;
}

// Keras' compile settings. Keras 3 writes model.compile()'s arguments as "compile_config" next to
// the model's class_name (to_json() and .keras files; its model_from_json compiles the model with
// them), tf.keras 2's HDF5 files as the "training_config" attribute next to "model_config". The
// optimizer and loss become the model's (a run configuration or flag still overrides them), so an
// imported model trains as it did in Keras. A setting that would change training and that
// TrainStudio cannot honour is an error naming it, as for layers; execution settings
// (run_eagerly, steps_per_execution, jit_compile) and metrics do not change the weights.
class CompileImporter {
public:
    CompileImporter(Importer& imp, std::string where) : m_imp(imp), m_where(std::move(where)) {}

    void run(const json& cc, CompileSpec& out)
    {
        if (cc.is_null()) return;  // not compiled
        if (!cc.is_object()) {
            fail(m_where + ": expected an object, got " + std::string(cc.type_name()));
            return;
        }
        const bool keras2 = m_where == "training_config";
        const char* optimizerKey = keras2 ? "optimizer_config" : "optimizer";
        if (cc.contains(optimizerKey) && !cc[optimizerKey].is_null()) optimizer(cc[optimizerKey], m_where + "." + optimizerKey, out);
        if (cc.contains("loss") && !cc["loss"].is_null()) loss(cc["loss"], m_where + ".loss", out);
        if (cc.contains("loss_weights") && !allOnes(cc["loss_weights"]))
            fail(m_where + ".loss_weights = " + cc["loss_weights"].dump() + " would be ignored",
                        "TrainStudio trains one output with an unweighted loss: remove loss_weights, or scale the learning rate instead");
        if (cc.contains("metrics") && !cc["metrics"].is_null()) {
            std::vector<std::string> names;
            metricNames(cc["metrics"], names);
            out.metrics = names;
        }
    }

private:
    // Every refusal also says how to take the architecture alone (the designer imports it to
    // set training up itself).
    void fail(const std::string& message, const std::string& hint = {})
    {
        const std::string alone = "delete \"" + m_where + "\" from the file to import the architecture alone";
        m_imp.error(message, hint.empty() ? alone : hint + "; or " + alone);
    }

    static bool allOnes(const json& v)
    {
        if (v.is_null()) return true;
        if (v.is_number()) return v.get<double>() == 1.0;
        if (v.is_array() || v.is_object()) {
            for (const auto& e : v)
                if (!allOnes(e)) return false;
            return true;
        }
        return false;
    }

    void optimizer(const json& o, const std::string& path, CompileSpec& out)
    {
        json cfg;
        if (o.is_string()) {
            cfg = json{{"type", lowerAscii(o.get<std::string>())}};
        } else if (o.is_object() && o.contains("class_name") && o["class_name"].is_string()) {
            std::string cls = o["class_name"].get<std::string>();
            if (cls.rfind("Custom>", 0) == 0) cls = cls.substr(7);  // tf.keras 2.11+ writes "Custom>Adam"
            const json c = o.value("config", json::object());
            if (!c.is_object()) {
                fail(path + ".config: expected an object, got " + std::string(c.type_name()));
                return;
            }
            if (cls == "LossScaleOptimizer") {
                lossScaleOptimizer(c, path, out);
                return;
            }
            cfg = c;
            cfg.erase("name");
            // Keras before 2.3 (and legacy optimizers' configs) call it lr.
            if (cfg.contains("lr") && !cfg.contains("learning_rate")) {
                cfg["learning_rate"] = cfg["lr"];
                cfg.erase("lr");
            }
            if (cfg.contains("learning_rate") && cfg["learning_rate"].is_object()) {
                const json& lr = cfg["learning_rate"];
                const std::string schedule = lr.value("class_name", json()).is_string() ? lr["class_name"].get<std::string>() : std::string("an object");
                fail(path + ": the learning rate is a schedule (" + schedule + "), which TrainStudio does not read from Keras",
                            "compile the model with a number as learning_rate and give the run a \"schedule\" (constant, step, "
                            "exponential, cosine, warmup_cosine)");
                return;
            }
            cfg["type"] = lowerAscii(cls);
            const bool decay = cfg.contains("weight_decay") && cfg["weight_decay"].is_number() && cfg["weight_decay"].get<double>() != 0.0;
            // Keras applies an optimizer's weight_decay decoupled (w -= lr * wd * w, outside the
            // moments): Adam's is our adamw; SGD's matches ours (added to the gradient) only
            // without momentum.
            if (decay && cfg["type"] == "adam") cfg["type"] = "adamw";
            const bool momentum = cfg.contains("momentum") && cfg["momentum"].is_number() && cfg["momentum"].get<double>() != 0.0;
            if (decay && cfg["type"] == "sgd" && momentum) {
                fail(path + ": SGD with momentum and weight_decay " + cfg["weight_decay"].dump() +
                         " decays the weights apart from the momentum in Keras, which TrainStudio's SGD does not",
                     "use adamw, or SGD without weight_decay");
                return;
            }
        } else {
            fail(path + ": expected an optimizer name or {\"class_name\": ..., \"config\": ...}, got " + o.dump());
            return;
        }
        auto made = Optimizer::create(cfg);
        if (!made.ok()) {
            fail(path + ": " + made.error().message, made.error().hint);
            return;
        }
        out.optimizer = made.value()->config();  // what will run, without Keras' bookkeeping keys
    }

    // Under mixed_float16 Keras wraps the optimizer to scale the loss; the run does that from its
    // precision with Keras' defaults, so only a wrapper with other settings is refused.
    void lossScaleOptimizer(const json& c, const std::string& path, CompileSpec& out)
    {
        const bool dynamic = c.value("dynamic", json(true)).is_boolean() ? c.value("dynamic", true) : false;
        const json initial = c.value("initial_scale", json(32768.0));
        const json growth = c.value("dynamic_growth_steps", json(2000));
        if (!dynamic || !initial.is_number() || initial.get<double>() != 32768.0 || !growth.is_number() || growth.get<double>() != 2000.0) {
            fail(path + ": a LossScaleOptimizer with " + c.dump() + " is not Keras' default dynamic loss scale",
                        "remove the LossScaleOptimizer and give the run \"precision\": {\"loss_scale\": ..., \"initial_scale\": ..., "
                        "\"growth_steps\": ...}");
            return;
        }
        if (!c.contains("inner_optimizer")) {
            fail(path + ".config: a LossScaleOptimizer without inner_optimizer");
            return;
        }
        optimizer(c["inner_optimizer"], path + ".config.inner_optimizer", out);
    }

    void loss(const json& l, const std::string& path, CompileSpec& out)
    {
        // A one-output model's loss may be given as a one-element list, or a dict by output name.
        if ((l.is_array() || (l.is_object() && !l.contains("class_name"))) && l.size() == 1) {
            loss(*l.begin(), path, out);
            return;
        }
        // Keras' Loss classes by their function's name; names go through parseLoss (nn/program).
        static const std::map<std::string, std::string> classes = {
            {"SparseCategoricalCrossentropy", "sparse_categorical_crossentropy"},
            {"CategoricalCrossentropy", "categorical_crossentropy"},
            {"BinaryCrossentropy", "binary_crossentropy"},
            {"MeanSquaredError", "mean_squared_error"},
            {"MSE", "mean_squared_error"},
        };
        std::string name;
        bool fromLogits = false;
        if (l.is_string()) {
            name = l.get<std::string>();
        } else if (l.is_object() && l.contains("class_name") && l["class_name"].is_string()) {
            const json c = l.value("config", json());
            if (l["class_name"] == "function" && c.is_string()) {
                name = c.get<std::string>();  // Keras 3's form of a loss function
            } else {
                name = l["class_name"].get<std::string>();
                if (c.is_object() && !lossConfig(c, path, fromLogits)) return;
            }
        } else {
            fail(path + ": expected a loss name or {\"class_name\": ..., \"config\": ...}, got " + l.dump());
            return;
        }
        if (const auto it = classes.find(name); it != classes.end()) name = it->second;
        const auto parsed = parseLoss(name, fromLogits);
        if (!parsed.ok()) {
            fail(path + ": loss '" + name + "' is not supported", parsed.error().hint);
            return;
        }
        out.loss = lossName(parsed->kind);
        out.fromLogits = fromLogits;
    }

    // A Loss object's config: from_logits is read, the rest must be what the kernels compute.
    bool lossConfig(const json& c, const std::string& path, bool& fromLogits)
    {
        for (auto it = c.begin(); it != c.end(); ++it) {
            const std::string& k = it.key();
            const json& v = it.value();
            bool fine = true;
            if (k == "name" || (k == "dtype" && (v.is_null() || v == "float32"))) continue;
            if (k == "from_logits") {
                fine = v.is_boolean();
                if (fine) fromLogits = v.get<bool>();
            } else if (k == "reduction") {
                fine = v == "sum_over_batch_size" || v == "auto";  // null / "none": unreduced, summed by compile
            } else if (k == "fn") {
                fine = v.is_string();  // tf.keras' LossFunctionWrapper names its function; the class says which loss
            } else if (k == "label_smoothing") {
                fine = v.is_number() && v.get<double>() == 0.0;
            } else if (k == "axis") {
                fine = v.is_number_integer() && v.get<int64_t>() == -1;
            } else if (k == "ignore_class") {
                fine = v.is_null();
            } else {
                fine = false;
            }
            if (!fine) {
                fail(path + ".config: " + k + " = " + v.dump() + " would be ignored",
                            "TrainStudio's losses average over the batch without label smoothing or ignored classes: "
                            "compile the model without " + k);
                return false;
            }
        }
        return true;
    }

    static void metricNames(const json& m, std::vector<std::string>& out)
    {
        if (m.is_string()) {
            out.push_back(m.get<std::string>());
        } else if (m.is_array()) {
            for (const auto& e : m) metricNames(e, out);
        } else if (m.is_object() && m.contains("class_name")) {
            const json c = m.value("config", json());
            if (c.is_object() && c.value("name", json()).is_string()) out.push_back(c["name"].get<std::string>());
            else if (c.is_string()) out.push_back(c.get<std::string>());
            else if (m["class_name"].is_string()) out.push_back(m["class_name"].get<std::string>());
        } else if (m.is_object()) {
            for (const auto& e : m) metricNames(e, out);  // by output name
        }
    }

    Importer& m_imp;
    std::string m_where;
};

} // namespace

Result<ModelSpec> modelFromKerasJson(const json& root, const std::string& source)
{
    Importer imp(source);
    const json* j = &root;
    // model.save() keeps the to_json() document under "model_config" (HDF5 attribute dumps).
    if (j->is_object() && j->contains("model_config") && (*j)["model_config"].is_object())
        j = &(*j)["model_config"];
    if (!j->is_object() || !j->contains("class_name") || !(*j)["class_name"].is_string())
        return makeError(ErrorCode::ParseError,
                         source + ": not a Keras model: expected {\"class_name\": ..., \"config\": "
                                  "...}",
                         "export the model with Keras' model.to_json()");
    const std::string cls = (*j)["class_name"].get<std::string>();
    const json config = j->value("config", json());

    ModelSpec spec;
    if (config.is_object() && config.contains("name") && config["name"].is_string())
        spec.name = config["name"].get<std::string>();

    const bool sequential = cls == "Sequential";
    if (!sequential && cls != "Functional" && cls != "Model")
        return makeError(ErrorCode::Unsupported,
                         source + ": top-level class '" + cls
                             + "' is not a Sequential or Functional model",
                         "TrainStudio imports Sequential and Functional models; a subclassed "
                         "Model has no architecture in its JSON");
    const json layers = (sequential && config.is_array()) ? config
                        : config.is_object() ? config.value("layers", json()) : json();
    if (!layers.is_array() || layers.empty())
        return makeError(ErrorCode::ParseError,
                         source + ": " + cls + " model '" + spec.name + "' has no config.layers",
                         "export a built model with model.to_json()");
    TS_ASSIGN(ModelSpec out, sequential ? importSequential(imp, config, std::move(spec))
                                        : importFunctional(imp, config, std::move(spec)));
    if (!imp.modelPolicy(out))
        return imp.toError();
    if (j->contains("compile_config")) CompileImporter(imp, "compile_config").run((*j)["compile_config"], out.compile);
    if (j != &root && root.contains("training_config")) CompileImporter(imp, "training_config").run(root["training_config"], out.compile);
    if (!imp.ok()) return imp.toError();
    normaliseAttrs(out);
    layout(out);
    return out;
}

Result<json> modelToKerasJson(const ModelSpec& spec)
{
    const GraphAnalysis a = analyzeModel(spec);
    TS_TRY(problemsToStatus(a, "model '" + spec.name + "'"));
    json layers = json::array();
    if (isChain(a)) {
        for (const NodeInfo& n : a.nodes) {
            TS_ASSIGN(json layer, kerasLayer(n, spec.compile.precision));
            layers.push_back(std::move(layer));
        }
        return json{{"class_name", "Sequential"},
                    {"config", {{"name", spec.name}, {"layers", layers}}},
                    {"keras_version", kExportKerasVersion},
                    {"backend", "tensorflow"}};
    }
    for (const NodeInfo& n : a.nodes) {
        TS_ASSIGN(json layer, kerasLayer(n, spec.compile.precision));
        layer["name"] = n.id;
        json inbound = json::array();
        if (!n.inputs.empty()) {
            json call = json::array();
            for (int p : n.inputs)
                call.push_back(json::array(
                    {a.nodes[static_cast<std::size_t>(p)].id, 0, 0, json::object()}));
            inbound.push_back(call);
        }
        layer["inbound_nodes"] = inbound;
        layers.push_back(std::move(layer));
    }
    json inputs = json::array(), outputs = json::array();
    for (int k : a.inputNodes)
        inputs.push_back(json::array({a.nodes[static_cast<std::size_t>(k)].id, 0, 0}));
    for (int k : a.outputNodes)
        outputs.push_back(json::array({a.nodes[static_cast<std::size_t>(k)].id, 0, 0}));
    return json{{"class_name", "Functional"},
                {"config",
                 {{"name", spec.name},
                  {"trainable", true},
                  {"layers", layers},
                  {"input_layers", inputs},
                  {"output_layers", outputs}}},
                {"keras_version", kExportKerasVersion},
                {"backend", "tensorflow"}};
}

} // namespace ts
