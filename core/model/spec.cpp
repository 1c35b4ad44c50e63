// TrainStudio's model file format, version 1: a JSON document that the designer writes, the CLI
// loads and the run store snapshots.
//
//   {"format": "trainstudio-model", "version": 1, "name": "seed_mlp",
//    "layers": [
//      {"id": "input", "type": "Input", "attrs": {"shape": [784]}, "pos": [0, 0]},
//      {"id": "dense", "type": "Dense", "inputs": ["input"],
//       "attrs": {"units": 256, "activation": "relu"}, "pos": [0, 120]},
//      {"id": "dense_1", "type": "Dense", "inputs": ["dense"],
//       "attrs": {"units": 10, "activation": "softmax"}, "pos": [0, 240]}],
//    "outputs": ["dense_1"],
//    "compile": {"optimizer": {"type": "adam", "learning_rate": 0.001},
//                "loss": "sparse_categorical_crossentropy", "from_logits": false,
//                "metrics": ["accuracy"], "batch_size": 256, "epochs": 10}}
//
// - layers: in any order; "id" is unique (it is also the Keras layer name and the weight
//   prefix), "type" is a catalogue type (model/catalogue.cpp), "inputs" lists producer ids in
//   order (absent for Input), "attrs" uses Keras attribute names and may leave out defaults,
//   "pos" is the designer position [x, y] (optional).
// - outputs: optional; absent or empty means "the single node nothing consumes".
// - compile: optional; optimizer is {"type": ..., Keras config keys ...} or just a type name;
//   "precision" (optional) is the Keras dtype policy: "float32", "mixed_float16" or "mixed_bfloat16".
// - name: optional; defaults to the file name without extension.
//
// The parser checks the document's structure and the JSON types of known attributes and names
// the JSON path of every mistake ("seed_mlp.json: layers[2].attrs.units: expected an
// integer"). Graph-level meaning (unknown types, dangling inputs, shapes) is analyzeModel's job,
// so that the designer can open a broken model and show what is wrong with it.
// parseModelText also accepts a Keras model.to_json() (see model/keras.cpp).

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "model/attrs.h"
#include "model/spec.h"

#include "common/json_document.h"

namespace ts {

using nlohmann::json;
using nlohmann::ordered_json;
using namespace model_detail;

namespace {

constexpr const char* kFormat = "trainstudio-model";
constexpr int kVersion = 1;

std::string jsonTypeName(const json& v)
{
    if (v.is_null()) return "null";
    if (v.is_boolean()) return "a boolean";
    if (v.is_number()) return "a number";
    if (v.is_string()) return "a string";
    if (v.is_array()) return "a list";
    return "an object";
}

class Parser {
public:
    explicit Parser(std::string source) : m_source(std::move(source)) {}

    void error(const std::string& path, const std::string& message, std::string hint = {})
    {
        m_errors.push_back(m_source + ": " + (path.empty() ? "" : path + ": ") + message);
        if (m_hint.empty())
            m_hint = std::move(hint);
    }

    bool ok() const { return m_errors.empty(); }

    Error toError() const
    {
        std::string message = m_errors.front();
        for (std::size_t i = 1; i < m_errors.size(); ++i)
            message += "\n" + m_errors[i];
        std::string hint = m_hint;
        if (hint.empty())
            hint = "see the TrainStudio model format: {\"format\": \"trainstudio-model\", "
                   "\"version\": 1, \"layers\": [{\"id\", \"type\", \"inputs\", \"attrs\", "
                   "\"pos\"}, ...], \"outputs\": [...], \"compile\": {...}}";
        return makeError(ErrorCode::ParseError, message, hint);
    }

    void unknownKeys(const json& obj, const std::string& path,
                     const std::vector<std::string>& known)
    {
        for (auto it = obj.begin(); it != obj.end(); ++it)
            if (std::find(known.begin(), known.end(), it.key()) == known.end())
                error(join(path, it.key()), "unknown key",
                      suggestion(it.key(), known, "known keys:"));
    }

    static std::string join(const std::string& path, const std::string& key)
    {
        return path.empty() ? key : path + "." + key;
    }

    bool getString(const json& obj, const std::string& path, const char* key, std::string& out,
                   bool required)
    {
        if (!obj.contains(key)) {
            if (required)
                error(join(path, key), "missing (expected a string)");
            return false;
        }
        const json& v = obj[key];
        if (!v.is_string()) {
            error(join(path, key), "expected a string, got " + jsonTypeName(v));
            return false;
        }
        out = v.get<std::string>();
        return true;
    }

    bool getStrings(const json& obj, const std::string& path, const char* key,
                    std::vector<std::string>& out)
    {
        if (!obj.contains(key))
            return false;
        const json& v = obj[key];
        if (!v.is_array()) {
            error(join(path, key), "expected a list of strings, got " + jsonTypeName(v));
            return false;
        }
        out.clear();
        for (std::size_t i = 0; i < v.size(); ++i) {
            if (!v[i].is_string()) {
                error(join(path, key) + "[" + std::to_string(i) + "]",
                      "expected a string, got " + jsonTypeName(v[i]));
                continue;
            }
            out.push_back(v[i].get<std::string>());
        }
        return true;
    }

    bool getPositiveInt(const json& obj, const std::string& path, const char* key, int64_t& out)
    {
        if (!obj.contains(key))
            return false;
        const json& v = obj[key];
        if (!v.is_number_integer()) {
            error(join(path, key), "expected an integer, got " + jsonTypeName(v));
            return false;
        }
        if (v.get<int64_t>() < 1) {
            error(join(path, key), "must be at least 1, got " + v.dump());
            return false;
        }
        out = v.get<int64_t>();
        return true;
    }

private:
    std::string m_source;
    std::vector<std::string> m_errors;
    std::string m_hint;
};

LayerSpec parseLayer(Parser& p, const json& l, const std::string& path)
{
    LayerSpec layer;
    if (!l.is_object()) {
        p.error(path, "expected a layer object, got " + jsonTypeName(l),
                "write a layer as {\"id\": ..., \"type\": ..., \"inputs\": [...], \"attrs\": {}}");
        return layer;
    }
    p.unknownKeys(l, path, {"id", "type", "inputs", "attrs", "pos"});
    p.getString(l, path, "id", layer.id, true);
    p.getString(l, path, "type", layer.type, true);
    p.getStrings(l, path, "inputs", layer.inputs);
    if (l.contains("attrs")) {
        const json& attrs = l["attrs"];
        if (!attrs.is_object()) {
            p.error(path + ".attrs", "expected an object, got " + jsonTypeName(attrs));
        } else {
            layer.attrs = attrs;
            // Types of known attributes; ranges and unknown names are analyzeModel's.
            if (const LayerKind* kind = findLayerKind(layer.type)) {
                for (auto it = attrs.begin(); it != attrs.end(); ++it) {
                    const AttrSpec* spec = findAttr(*kind, it.key());
                    if (!spec)
                        continue;
                    const std::string e = attrTypeError(*spec, it.value());
                    if (!e.empty())
                        p.error(path + ".attrs." + it.key(), e + ", got " + it.value().dump(),
                                spec->description);
                }
            }
        }
    }
    if (l.contains("pos")) {
        const json& pos = l["pos"];
        if (!pos.is_array() || pos.size() != 2 || !pos[0].is_number() || !pos[1].is_number())
            p.error(path + ".pos", "expected [x, y] numbers, got " + pos.dump());
        else {
            layer.x = pos[0].get<double>();
            layer.y = pos[1].get<double>();
        }
    }
    return layer;
}

void parseCompile(Parser& p, const json& c, CompileSpec& out)
{
    const std::string path = "compile";
    if (!c.is_object()) {
        p.error(path, "expected an object, got " + jsonTypeName(c));
        return;
    }
    p.unknownKeys(c, path,
                  {"optimizer", "loss", "from_logits", "metrics", "batch_size", "epochs", "precision"});
    if (c.contains("optimizer")) {
        const json& o = c["optimizer"];
        if (o.is_string()) {
            out.optimizer = json{{"type", o.get<std::string>()}};
        } else if (o.is_object()) {
            if (!o.contains("type") || !o["type"].is_string())
                p.error(path + ".optimizer.type", "missing (expected a string such as \"adam\")");
            for (const char* key : {"learning_rate", "beta_1", "beta_2", "epsilon", "momentum",
                                    "rho", "weight_decay"})
                if (o.contains(key) && !o[key].is_number())
                    p.error(path + ".optimizer." + key,
                            "expected a number, got " + jsonTypeName(o[key]));
            out.optimizer = o;
        } else {
            p.error(path + ".optimizer",
                    "expected an object or a string, got " + jsonTypeName(o));
        }
    }
    p.getString(c, path, "loss", out.loss, false);
    if (c.contains("from_logits")) {
        if (!c["from_logits"].is_boolean())
            p.error(path + ".from_logits",
                    "expected true or false, got " + jsonTypeName(c["from_logits"]));
        else
            out.fromLogits = c["from_logits"].get<bool>();
    }
    p.getStrings(c, path, "metrics", out.metrics);
    p.getPositiveInt(c, path, "batch_size", out.batchSize);
    p.getPositiveInt(c, path, "epochs", out.epochs);
    if (c.contains("precision")) {
        const json& v = c["precision"];
        auto policy = v.is_string() ? PrecisionConfig::parsePolicy(v.get<std::string>(), "") : Result<PrecisionPolicy>(PrecisionPolicy::Float32);
        if (v.is_string() && policy.ok())
            out.precision = policy.value();
        else
            p.error(path + ".precision", "expected \"float32\", \"mixed_float16\" or \"mixed_bfloat16\", got " + v.dump());
    }
}

std::string stemOf(const std::string& source)
{
    return std::filesystem::path(source).stem().string();
}

// Position numbers as integers where they are whole (keeps files tidy).
template <typename J>
J number(double v)
{
    if (std::isfinite(v) && std::floor(v) == v && std::fabs(v) < 1e15)
        return J(static_cast<int64_t>(v));
    return J(v);
}

template <typename J>
J toJson(const ModelSpec& spec)
{
    J root = J::object();
    root["format"] = kFormat;
    root["version"] = kVersion;
    root["name"] = spec.name;
    J layers = J::array();
    for (const LayerSpec& l : spec.layers) {
        J layer = J::object();
        layer["id"] = l.id;
        layer["type"] = l.type;
        if (!l.inputs.empty())
            layer["inputs"] = l.inputs;
        layer["attrs"] = J::parse(l.attrs.is_null() ? std::string("{}") : l.attrs.dump());
        layer["pos"] = J::array({number<J>(l.x), number<J>(l.y)});
        layers.push_back(std::move(layer));
    }
    root["layers"] = std::move(layers);
    if (!spec.outputs.empty())
        root["outputs"] = spec.outputs;
    J compile = J::object();
    // "type" first, then the Keras config keys.
    const J given = J::parse(spec.compile.optimizer.dump());
    J optimizer = given.is_object() ? J::object() : given;
    if (given.is_object()) {
        if (given.contains("type"))
            optimizer["type"] = given["type"];
        for (auto it = given.begin(); it != given.end(); ++it)
            optimizer[it.key()] = it.value();
    }
    compile["optimizer"] = std::move(optimizer);
    compile["loss"] = spec.compile.loss;
    compile["from_logits"] = spec.compile.fromLogits;
    compile["metrics"] = spec.compile.metrics;
    compile["batch_size"] = spec.compile.batchSize;
    compile["epochs"] = spec.compile.epochs;
    // Only when set: float32 models keep the files they always had.
    if (spec.compile.precision != PrecisionPolicy::Float32) compile["precision"] = precisionPolicyName(spec.compile.precision);
    root["compile"] = std::move(compile);
    return root;
}

// One line per value, with ", " and ": " separators.
std::string compact(const ordered_json& j)
{
    if (j.is_object()) {
        std::string s = "{";
        bool first = true;
        for (auto it = j.begin(); it != j.end(); ++it) {
            s += (first ? "" : ", ") + ordered_json(it.key()).dump() + ": " + compact(it.value());
            first = false;
        }
        return s + "}";
    }
    if (j.is_array()) {
        std::string s = "[";
        for (std::size_t i = 0; i < j.size(); ++i)
            s += (i ? ", " : "") + compact(j[i]);
        return s + "]";
    }
    return j.dump();
}

// Top-level keys one per line and one layer per line: readable and diff-friendly.
std::string modelText(const ModelSpec& spec)
{
    const ordered_json root = toJson<ordered_json>(spec);
    std::string s = "{\n";
    bool first = true;
    for (auto it = root.begin(); it != root.end(); ++it) {
        s += first ? "" : ",\n";
        first = false;
        s += "  " + ordered_json(it.key()).dump() + ": ";
        if (it.key() == "layers") {
            s += "[\n";
            for (std::size_t i = 0; i < it.value().size(); ++i)
                s += "    " + compact(it.value()[i]) + (i + 1 < it.value().size() ? ",\n" : "\n");
            s += "  ]";
        } else {
            s += compact(it.value());
        }
    }
    return s + "\n}\n";
}

} // namespace

Result<ModelSpec> modelFromJson(const json& j, const std::string& source)
{
    Parser p(source);
    if (!j.is_object())
        return makeError(ErrorCode::ParseError,
                         source + ": expected a JSON object, got " + jsonTypeName(j),
                         "a TrainStudio model starts with {\"format\": \"trainstudio-model\", ...}");
    if (j.contains("format") && j["format"] != kFormat)
        return makeError(ErrorCode::ParseError,
                         source + ": format: expected \"" + kFormat + "\", got " + j["format"].dump(),
                         "this is not a TrainStudio model file");
    if (j.contains("version")) {
        const json& v = j["version"];
        if (!v.is_number_integer())
            p.error("version", "expected an integer, got " + jsonTypeName(v));
        else if (v.get<int64_t>() > kVersion)
            return makeError(ErrorCode::Unsupported,
                             source + ": version " + v.dump() + " is newer than this TrainStudio "
                                 "reads (" + std::to_string(kVersion) + ")",
                             "open the file with a newer TrainStudio");
        else if (v.get<int64_t>() < 1)
            p.error("version", "must be at least 1, got " + v.dump());
    }
    p.unknownKeys(j, "", {"format", "version", "name", "layers", "outputs", "compile"});

    ModelSpec spec;
    const std::string stem = stemOf(source);
    spec.name = stem.empty() ? std::string("model") : stem;
    p.getString(j, "", "name", spec.name, false);

    if (!j.contains("layers")) {
        p.error("layers", "missing (expected a list of layers)",
                "add \"layers\": [{\"id\": \"input\", \"type\": \"Input\", \"attrs\": "
                "{\"shape\": [784]}}, ...]");
    } else if (!j["layers"].is_array()) {
        p.error("layers", "expected a list, got " + jsonTypeName(j["layers"]));
    } else {
        const json& layers = j["layers"];
        for (std::size_t i = 0; i < layers.size(); ++i)
            spec.layers.push_back(parseLayer(p, layers[i], "layers[" + std::to_string(i) + "]"));
    }
    p.getStrings(j, "", "outputs", spec.outputs);
    if (j.contains("compile"))
        parseCompile(p, j["compile"], spec.compile);

    if (!p.ok())
        return p.toError();
    return spec;
}

json modelToJson(const ModelSpec& spec)
{
    return toJson<json>(spec);
}

Result<ModelSpec> parseModelText(const std::string& text, const std::string& source)
{
    TS_ASSIGN(json j, parseJsonDocument(text, source));
    if (j.is_object()) {
        if (j.contains("format") || j.contains("layers"))
            return modelFromJson(j, source);
        if (j.contains("class_name") || j.contains("model_config"))
            return modelFromKerasJson(j, source);
    }
    return makeError(ErrorCode::ParseError,
                     source + ": not a model: expected a TrainStudio model (\"format\": \""
                         + kFormat + "\") or a Keras model.to_json() (\"class_name\": "
                         "\"Sequential\" or \"Functional\")",
                     "open a .json file saved by TrainStudio or written by Keras' to_json()");
}

Result<ModelSpec> loadModelFile(const std::string& path)
{
    TS_ASSIGN(std::string text, readTextFile(path, "model file"));
    return parseModelText(text, path);
}

Status saveModelFile(const ModelSpec& spec, const std::string& path)
{
    // Write beside the target and rename, so a crash never leaves half a model file.
    const std::string tmp = path + ".tmp";
    {
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        if (!out)
            return makeError(ErrorCode::IoError,
                             path + ": cannot write: " + std::strerror(errno),
                             "check that the folder exists and is writable");
        out << modelText(spec);
        out.flush();
        if (!out) {
            std::error_code ignored;
            std::filesystem::remove(tmp, ignored);
            return makeError(ErrorCode::IoError, path + ": write failed: " + std::strerror(errno),
                             "check free disk space");
        }
    }
    std::error_code ec;
    std::filesystem::rename(tmp, path, ec);
    if (ec) {
        std::filesystem::remove(tmp, ec);
        return makeError(ErrorCode::IoError, path + ": cannot replace the file: " + ec.message(),
                         "check that the folder is writable");
    }
    return okStatus();
}

} // namespace ts
