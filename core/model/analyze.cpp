// analyzeModel: validation, shape inference, parameter and FLOP counts for a ModelSpec.
//
// Every problem is reported, not just the first: structural ones (duplicate ids, unknown types,
// bad attributes, dangling inputs, wrong input counts, cycles, outputs) for every node, then
// shape problems in topological order. A node downstream of a broken node is marked ok=false
// without a report of its own, so one mistake gives one message.
//
// Shapes never include the batch dimension. Attributes are normalised (Keras defaults filled in,
// kernel_size/strides/pool_size as [h, w], activations as their canonical Keras name, axes as
// -1) because the graph executor reads NodeInfo::attrs and nothing else.
//
// FLOPs are forward FLOPs per sample:
//  - Dense: 2*in*units, Conv2D: 2*OH*OW*KH*KW*C*F (a multiply-add counts 2);
//    a bias adds 1 per output element, a non-linear fused activation 1 per output element.
//  - Pooling: 1 per window element per output (compare or add); GlobalAveragePooling2D:
//    1 per input element.
//  - BatchNormalization: 2 per element (inference form: one multiply, one add).
//  - Activation, ReLU, LeakyReLU, Softmax: 1 per element; Add: 1 per element per extra input.
//  - Input, Flatten, Reshape, Dropout (identity at inference), Concatenate: 0 (data movement).

#include <algorithm>
#include <functional>
#include <map>
#include <queue>
#include <set>

#include "model/attrs.h"
#include "model/spec.h"

namespace ts {

using nlohmann::json;
using namespace model_detail;

int GraphAnalysis::indexOf(const std::string& id) const
{
    for (std::size_t i = 0; i < nodes.size(); ++i)
        if (nodes[i].id == id)
            return static_cast<int>(i);
    return -1;
}

namespace {

std::string nodeRef(const std::string& id)
{
    return "node '" + id + "'";
}

std::string shortDump(const json& v)
{
    std::string s = v.dump();
    if (s.size() > 40)
        s = s.substr(0, 37) + "...";
    return s;
}

std::string numberText(double v)
{
    return json(v).dump();
}

std::string dimsText(int64_t h, int64_t w)
{
    return std::to_string(h) + "x" + std::to_string(w);
}

struct Reporter {
    std::vector<Problem>& problems;
    void operator()(const std::string& node, std::string message, std::string hint,
                    ErrorCode code = ErrorCode::InvalidArgument) const
    {
        problems.push_back(Problem{node, std::move(message), std::move(hint), code});
    }
};

// One layer of the spec during analysis.
struct Work {
    const LayerSpec* layer = nullptr;
    const LayerKind* kind = nullptr;
    bool excluded = false;      // repeated id: left out of the graph
    bool structuralOk = true;   // type, attributes and inputs are fine
    json attrs = json::object();
    std::vector<int> producers; // file indices of resolved inputs, in order
    std::vector<int> consumers;
};

// ---- attributes (independent of shapes) ------------------------------------------------------

class AttrNormaliser {
public:
    AttrNormaliser(const LayerSpec& layer, const LayerKind& kind, const Reporter& report)
        : m_layer(layer), m_kind(kind), m_report(report)
    {
    }

    // Fills `out` with every catalogue attribute of the kind; false if any is wrong.
    bool run(json& out)
    {
        if (!m_layer.attrs.is_null() && !m_layer.attrs.is_object()) {
            fail("attrs must be an object of attribute values, got " + shortDump(m_layer.attrs),
                 "write attrs as {\"name\": value, ...}");
            return false;
        }
        json given = m_layer.attrs.is_object() ? m_layer.attrs : json::object();
        std::vector<std::string> names;
        for (const AttrSpec& a : m_kind.attrs)
            names.push_back(a.name);

        for (auto it = given.begin(); it != given.end(); ++it) {
            const AttrSpec* spec = findAttr(m_kind, it.key());
            if (!spec) {
                fail("unknown attribute '" + it.key() + "' for " + m_kind.type,
                     names.empty() ? m_kind.type + " takes no attributes; remove '" + it.key() + "'"
                                   : suggestion(it.key(), names,
                                                m_kind.type + " attributes are:"));
                continue;
            }
            if (spec->name != it.key() && given.contains(spec->name)) {
                fail("gives both '" + spec->name + "' and '" + it.key() + "'",
                     "keep only '" + spec->name + "'");
                continue;
            }
            const std::string typeError = attrTypeError(*spec, it.value());
            if (!typeError.empty()) {
                m_broken.insert(spec->name);
                fail("attribute '" + it.key() + "': " + typeError + ", got "
                         + shortDump(it.value()),
                     "set " + it.key() + " to " + exampleOf(*spec));
                continue;
            }
            m_values[spec->name] = it.value();
        }

        for (const AttrSpec& a : m_kind.attrs) {
            auto found = m_values.find(a.name);
            const bool present = found != m_values.end() && !found->second.is_null();
            if (m_broken.count(a.name)) {
                out[a.name] = a.defaultValue;  // reported above; go on checking the rest
                continue;
            }
            if (!present && a.required) {
                fail("missing attribute '" + a.name + "' (" + a.description + ")",
                     "set " + a.name + ", e.g. " + a.defaultValue.dump());
                continue;
            }
            if (!present) {
                out[a.name] = a.defaultValue;
                continue;
            }
            normalise(a, found->second, out);
        }
        // Keras pooling: strides default to the window.
        if (out.contains("pool_size") && out.contains("strides") && out["strides"].is_null())
            out["strides"] = out["pool_size"];
        return m_ok;
    }

private:
    void fail(std::string message, std::string hint)
    {
        m_report(m_layer.id, nodeRef(m_layer.id) + ": " + std::move(message), std::move(hint));
        m_ok = false;
    }

    static std::string exampleOf(const AttrSpec& a)
    {
        if (a.kind == "enum")
            return "one of " + quotedList(a.choices, "or");
        if (!a.defaultValue.is_null())
            return a.defaultValue.dump();
        return a.kind == "ints" ? "[2, 2]" : "a " + a.kind;
    }

    void normalise(const AttrSpec& a, const json& v, json& out)
    {
        const std::string& name = a.name;
        if (a.kind == "int") {
            const int64_t x = v.get<int64_t>();
            if (a.min != 0 && x < static_cast<int64_t>(a.min)) {
                fail(name + " must be at least " + std::to_string(static_cast<int64_t>(a.min))
                         + ", got " + std::to_string(x),
                     "set " + name + " to a positive number, e.g. " + a.defaultValue.dump());
            }
            out[name] = x;
        } else if (a.kind == "float") {
            const double x = v.get<double>();
            out[name] = x;
            checkFloatRange(a, x);
        } else if (a.kind == "bool") {
            out[name] = v.get<bool>();
        } else if (a.kind == "enum") {
            const std::string s = v.get<std::string>();
            if (name == "activation") {
                Result<Activation> act = parseActivation(s);
                if (!act.ok()) {
                    fail("unknown activation '" + s + "'",
                         suggestion(s, a.choices, "valid activations:"));
                    out[name] = a.defaultValue;
                } else {
                    out[name] = activationName(act.value());
                }
            } else if (std::find(a.choices.begin(), a.choices.end(), s) == a.choices.end()) {
                fail(name + " must be " + quotedList(a.choices, "or") + ", got '" + s + "'",
                     suggestion(s, a.choices, "valid values:"));
                out[name] = a.defaultValue;
            } else {
                out[name] = s;
            }
        } else if (a.kind == "ints") {
            std::vector<int64_t> xs;
            if (v.is_number_integer())
                xs = {v.get<int64_t>(), v.get<int64_t>()};
            else
                xs = v.get<std::vector<int64_t>>();
            if (xs.size() != 2) {
                fail(name + " must have 2 entries (height, width), got " + shortDump(v),
                     "write " + name + " as [h, w] or one number for both");
                out[name] = a.defaultValue;
                return;
            }
            if (xs[0] < 1 || xs[1] < 1) {
                fail(name + " entries must be at least 1, got " + shortDump(v),
                     "use positive sizes, e.g. [2, 2]");
            }
            out[name] = xs;
        } else if (a.kind == "shape") {
            const std::vector<int64_t> xs = v.get<std::vector<int64_t>>();
            out[name] = xs;
            if (m_kind.type == "Reshape") {
                const auto unknown = std::count(xs.begin(), xs.end(), int64_t(-1));
                const bool bad = std::any_of(xs.begin(), xs.end(),
                                             [](int64_t d) { return d == 0 || d < -1; });
                if (xs.empty())
                    fail("target_shape is empty", "give at least one dimension, e.g. [-1]");
                else if (unknown > 1)
                    fail("target_shape " + shortDump(v) + " has more than one -1",
                         "at most one dimension can be inferred (-1)");
                else if (bad)
                    fail("target_shape " + shortDump(v) + " has a dimension below 1",
                         "use positive dimensions and at most one -1");
            } else {
                if (xs.empty())
                    fail(name + " is empty",
                         "give the dimensions of one sample, e.g. [784] or [28, 28, 1]");
                else if (std::any_of(xs.begin(), xs.end(), [](int64_t d) { return d < 1; }))
                    fail(name + " " + shortDump(v) + " has a dimension below 1",
                         "every dimension must be known and positive (no batch dimension)");
            }
        }
    }

    void checkFloatRange(const AttrSpec& a, double x)
    {
        const std::string& name = a.name;
        if (m_kind.type == "Dropout" && name == "rate") {
            if (x < 0 || x >= 1)
                fail("rate must be in [0, 1), got " + numberText(x),
                     "a rate of 0.5 drops half of the inputs during training");
            return;
        }
        if (name == "epsilon") {
            if (!(x > 0))
                fail("epsilon must be positive, got " + numberText(x),
                     "the Keras default is 0.001");
            return;
        }
        if (x < a.min || (a.max != 0 && x > a.max))
            fail(name + " must be in [" + numberText(a.min) + ", "
                     + (a.max != 0 ? numberText(a.max) : std::string("inf")) + "], got "
                     + numberText(x),
                 "the Keras default is " + a.defaultValue.dump());
    }

    const LayerSpec& m_layer;
    const LayerKind& m_kind;
    const Reporter& m_report;
    std::map<std::string, json> m_values;
    std::set<std::string> m_broken;
    bool m_ok = true;
};

// ---- shape inference ---------------------------------------------------------------------------

struct WindowOut {
    int64_t out = 0;
    int padBefore = 0, padAfter = 0;
};

// TensorFlow's rule: "valid" gives floor((in - k) / s) + 1 (may be < 1: an error); "same" gives
// ceil(in / s), padding max((out - 1) * s + k - in, 0) split with the extra row at the end.
WindowOut windowOut(int64_t in, int64_t k, int64_t s, bool same)
{
    WindowOut w;
    if (same) {
        w.out = (in + s - 1) / s;
        const int64_t total = std::max<int64_t>((w.out - 1) * s + k - in, 0);
        w.padBefore = static_cast<int>(total / 2);
        w.padAfter = static_cast<int>(total - total / 2);
    } else {
        const int64_t num = in - k;
        const int64_t q = num >= 0 ? num / s : -((-num + s - 1) / s);  // floor division
        w.out = q + 1;
    }
    return w;
}

class ShapeInference {
public:
    ShapeInference(NodeInfo& node, const std::vector<std::string>& inputIds,
                   const Reporter& report)
        : m_node(node), m_inputIds(inputIds), m_report(report)
    {
    }

    bool run()
    {
        const std::string& t = m_node.type;
        if (t == "Input") return input();
        if (t == "Dense") return dense();
        if (t == "Conv2D") return conv();
        if (t == "MaxPooling2D") return pool(PoolKind::Max);
        if (t == "AveragePooling2D") return pool(PoolKind::Avg);
        if (t == "GlobalAveragePooling2D") return globalAvgPool();
        if (t == "Flatten") return flatten();
        if (t == "Reshape") return reshape();
        if (t == "BatchNormalization") return batchNorm();
        if (t == "Softmax") return softmax();
        if (t == "Dropout" || t == "ReLU" || t == "LeakyReLU" || t == "Activation")
            return elementwise();
        if (t == "Add") return add();
        if (t == "Concatenate") return concatenate();
        fail("has no shape rule for type " + t, "report this as a TrainStudio bug");
        return false;
    }

private:
    const Shape& in(int i = 0) const { return m_node.inputShapes[static_cast<std::size_t>(i)]; }
    const json& attr(const char* name) const { return m_node.attrs.at(name); }

    bool fail(std::string message, std::string hint, ErrorCode code = ErrorCode::InvalidArgument)
    {
        m_report(m_node.id, nodeRef(m_node.id) + ": " + std::move(message), std::move(hint), code);
        return false;
    }

    void addParam(std::string name, Shape shape, bool trainable, std::string init,
                  int64_t fanIn = 0, int64_t fanOut = 0)
    {
        ParamSpec p;
        p.name = std::move(name);
        p.shape = std::move(shape);
        p.trainable = trainable;
        p.init = std::move(init);
        p.fanIn = fanIn;
        p.fanOut = fanOut;
        m_node.paramCount += p.shape.numel();
        m_node.params.push_back(std::move(p));
    }

    bool requireImage(const char* what)
    {
        if (in().rank() == 3)
            return true;
        std::string hint;
        if (in().rank() == 1)
            hint = "add a Reshape before '" + m_node.id
                   + "' to (height, width, channels), e.g. target_shape [28, 28, 1], or give the "
                     "Input an image shape";
        else if (in().rank() == 2)
            hint = "add a Reshape before '" + m_node.id
                   + "' that appends a channels dimension, e.g. target_shape ["
                   + std::to_string(in()[0]) + ", " + std::to_string(in()[1]) + ", 1]";
        else
            hint = std::string(what) + " needs (height, width, channels) inputs";
        return fail(m_node.type + " expects a 3-D input (height, width, channels), got "
                        + in().toString(),
                    hint, ErrorCode::ShapeMismatch);
    }

    // Keras counts axes with the batch dimension: the last axis of a rank-r sample is -1 or r.
    bool lastAxis(const char* name)
    {
        const int64_t axis = attr(name).get<int64_t>();
        const int rank = in().rank();
        if (axis == -1 || axis == rank) {
            m_node.attrs[name] = -1;
            return true;
        }
        return fail(m_node.type + " " + name + " " + std::to_string(axis)
                        + " is not the last axis of its input " + in().toString()
                        + " (only the last axis is supported)",
                    "set " + std::string(name) + " to -1 (channels-last)");
    }

    int64_t activationFlops(int64_t elements) const
    {
        const json& a = m_node.attrs.value("activation", json("linear"));
        return a == "linear" ? 0 : elements;
    }

    bool input()
    {
        m_node.outputShape = Shape(attr("shape").get<std::vector<int64_t>>());
        return true;
    }

    bool dense()
    {
        if (in().rank() != 1)
            return fail("Dense expects a flat input (features), got " + in().toString()
                            + " (Dense on the last axis of a " + std::to_string(in().rank())
                            + "-D input is not supported)",
                        "add a Flatten before '" + m_node.id + "'", ErrorCode::ShapeMismatch);
        const int64_t nIn = in()[0];
        const int64_t units = attr("units").get<int64_t>();
        const bool bias = attr("use_bias").get<bool>();
        m_node.outputShape = Shape{units};
        addParam("kernel", Shape{nIn, units}, true, "glorot_uniform", nIn, units);
        if (bias)
            addParam("bias", Shape{units}, true, "zeros");
        m_node.flops = 2 * nIn * units + (bias ? units : 0) + activationFlops(units);
        return true;
    }

    bool conv()
    {
        if (!requireImage("Conv2D"))
            return false;
        const auto k = attr("kernel_size").get<std::vector<int64_t>>();
        const auto s = attr("strides").get<std::vector<int64_t>>();
        const bool same = attr("padding") == "same";
        const int64_t H = in()[0], W = in()[1], C = in()[2];
        const int64_t F = attr("filters").get<int64_t>();
        const WindowOut oh = windowOut(H, k[0], s[0], same);
        const WindowOut ow = windowOut(W, k[1], s[1], same);
        if (oh.out < 1 || ow.out < 1)
            return fail("kernel " + dimsText(k[0], k[1]) + " is larger than its input "
                            + in().toString() + " with padding \"valid\" (output would be "
                            + dimsText(oh.out, ow.out) + ")",
                        "use padding \"same\", a smaller kernel_size, or less downsampling before '"
                            + m_node.id + "'",
                        ErrorCode::ShapeMismatch);
        m_node.conv.strideH = static_cast<int>(s[0]);
        m_node.conv.strideW = static_cast<int>(s[1]);
        m_node.conv.padTop = oh.padBefore;
        m_node.conv.padBottom = oh.padAfter;
        m_node.conv.padLeft = ow.padBefore;
        m_node.conv.padRight = ow.padAfter;
        m_node.outputShape = Shape{oh.out, ow.out, F};
        const bool bias = attr("use_bias").get<bool>();
        addParam("kernel", Shape{k[0], k[1], C, F}, true, "glorot_uniform", k[0] * k[1] * C,
                 k[0] * k[1] * F);
        if (bias)
            addParam("bias", Shape{F}, true, "zeros");
        const int64_t outElems = oh.out * ow.out * F;
        m_node.flops = 2 * oh.out * ow.out * k[0] * k[1] * C * F + (bias ? outElems : 0)
                       + activationFlops(outElems);
        return true;
    }

    bool pool(PoolKind kind)
    {
        if (!requireImage(m_node.type.c_str()))
            return false;
        const auto k = attr("pool_size").get<std::vector<int64_t>>();
        const auto s = attr("strides").get<std::vector<int64_t>>();
        const bool same = attr("padding") == "same";
        const int64_t H = in()[0], W = in()[1], C = in()[2];
        const WindowOut oh = windowOut(H, k[0], s[0], same);
        const WindowOut ow = windowOut(W, k[1], s[1], same);
        if (oh.out < 1 || ow.out < 1)
            return fail("pool_size " + dimsText(k[0], k[1]) + " is larger than its input "
                            + in().toString() + " with padding \"valid\" (output would be "
                            + dimsText(oh.out, ow.out) + ")",
                        "use padding \"same\", a smaller pool_size, or less downsampling before '"
                            + m_node.id + "'",
                        ErrorCode::ShapeMismatch);
        Pool2dParams& p = m_node.pool;
        p.kind = kind;
        p.windowH = static_cast<int>(k[0]);
        p.windowW = static_cast<int>(k[1]);
        p.strideH = static_cast<int>(s[0]);
        p.strideW = static_cast<int>(s[1]);
        p.padTop = oh.padBefore;
        p.padBottom = oh.padAfter;
        p.padLeft = ow.padBefore;
        p.padRight = ow.padAfter;
        m_node.outputShape = Shape{oh.out, ow.out, C};
        m_node.flops = oh.out * ow.out * C * k[0] * k[1];
        return true;
    }

    bool globalAvgPool()
    {
        if (!requireImage("GlobalAveragePooling2D"))
            return false;
        m_node.outputShape = Shape{in()[2]};
        m_node.flops = in().numel();
        return true;
    }

    bool flatten()
    {
        m_node.outputShape = Shape{in().numel()};
        return true;
    }

    bool reshape()
    {
        std::vector<int64_t> dims = attr("target_shape").get<std::vector<int64_t>>();
        const int64_t n = in().numel();
        int64_t known = 1;
        int unknownAt = -1;
        for (std::size_t i = 0; i < dims.size(); ++i) {
            if (dims[i] == -1)
                unknownAt = static_cast<int>(i);
            else
                known *= dims[i];
        }
        if (unknownAt >= 0) {
            if (known == 0 || n % known != 0)
                return fail("cannot reshape " + in().toString() + " (" + std::to_string(n)
                                + " elements) to " + attr("target_shape").dump() + ": "
                                + std::to_string(n) + " is not a multiple of "
                                + std::to_string(known),
                            "choose a target_shape whose known dimensions divide "
                                + std::to_string(n),
                            ErrorCode::ShapeMismatch);
            dims[static_cast<std::size_t>(unknownAt)] = n / known;
        } else if (known != n) {
            return fail("cannot reshape " + in().toString() + " (" + std::to_string(n)
                            + " elements) to " + Shape(dims).toString() + " ("
                            + std::to_string(known) + " elements)",
                        "the element count must stay the same; use -1 for one dimension to "
                        "have it inferred",
                        ErrorCode::ShapeMismatch);
        }
        m_node.outputShape = Shape(dims);
        return true;
    }

    bool batchNorm()
    {
        if (!lastAxis("axis"))
            return false;
        const int64_t c = in()[-1];
        const bool center = attr("center").get<bool>();
        const bool scale = attr("scale").get<bool>();
        if (scale)
            addParam("gamma", Shape{c}, true, "ones");
        if (center)
            addParam("beta", Shape{c}, true, "zeros");
        addParam("moving_mean", Shape{c}, false, "zeros");
        addParam("moving_variance", Shape{c}, false, "ones");
        m_node.outputShape = in();
        m_node.flops = 2 * in().numel();
        return true;
    }

    bool softmax()
    {
        if (!lastAxis("axis"))
            return false;
        m_node.outputShape = in();
        m_node.flops = in().numel();
        return true;
    }

    bool elementwise()
    {
        m_node.outputShape = in();
        if (m_node.type == "Dropout")
            m_node.flops = 0;
        else if (m_node.type == "Activation")
            m_node.flops = activationFlops(in().numel());
        else
            m_node.flops = in().numel();
        return true;
    }

    bool add()
    {
        bool ok = true;
        for (std::size_t i = 1; i < m_node.inputShapes.size(); ++i) {
            if (m_node.inputShapes[i] == in(0))
                continue;
            ok = fail("Add inputs differ in shape: '" + m_inputIds[0] + "' is " + in(0).toString()
                          + " but '" + m_inputIds[i] + "' is " + m_node.inputShapes[i].toString(),
                      "Add needs identical shapes; match channels with a 1x1 Conv2D or "
                      "spatial size with strides/padding \"same\"",
                      ErrorCode::ShapeMismatch);
        }
        if (!ok)
            return false;
        m_node.outputShape = in(0);
        m_node.flops = static_cast<int64_t>(m_node.inputShapes.size() - 1) * in(0).numel();
        return true;
    }

    bool concatenate()
    {
        if (!lastAxis("axis"))
            return false;
        bool ok = true;
        int64_t last = in(0)[-1];
        for (std::size_t i = 1; i < m_node.inputShapes.size(); ++i) {
            const Shape& s = m_node.inputShapes[i];
            bool match = s.rank() == in(0).rank();
            for (int d = 0; match && d + 1 < s.rank(); ++d)
                match = s[d] == in(0)[d];
            if (!match) {
                ok = fail("Concatenate inputs differ in more than the last axis: '"
                              + m_inputIds[0] + "' is " + in(0).toString() + " but '"
                              + m_inputIds[i] + "' is " + s.toString(),
                          "all dimensions but the last must be equal; resize or flatten the "
                          "inputs first",
                          ErrorCode::ShapeMismatch);
                continue;
            }
            last += s[-1];
        }
        if (!ok)
            return false;
        std::vector<int64_t> dims = in(0).dims();
        dims.back() = last;
        m_node.outputShape = Shape(dims);
        return true;
    }

    NodeInfo& m_node;
    const std::vector<std::string>& m_inputIds;
    const Reporter& m_report;
};

// ---- graph structure --------------------------------------------------------------------------

// Strongly connected components (Tarjan) of the sub-graph `members`, edges producer -> consumer.
std::vector<std::vector<int>> stronglyConnected(const std::vector<Work>& work,
                                                const std::vector<int>& members)
{
    std::set<int> inSet(members.begin(), members.end());
    std::map<int, int> index, low;
    std::vector<int> stack;
    std::set<int> onStack;
    std::vector<std::vector<int>> components;
    int counter = 0;
    std::function<void(int)> visit = [&](int v) {
        index[v] = low[v] = counter++;
        stack.push_back(v);
        onStack.insert(v);
        for (int w : work[static_cast<std::size_t>(v)].consumers) {
            if (!inSet.count(w))
                continue;
            if (!index.count(w)) {
                visit(w);
                low[v] = std::min(low[v], low[w]);
            } else if (onStack.count(w)) {
                low[v] = std::min(low[v], index[w]);
            }
        }
        if (low[v] == index[v]) {
            std::vector<int> comp;
            int w;
            do {
                w = stack.back();
                stack.pop_back();
                onStack.erase(w);
                comp.push_back(w);
            } while (w != v);
            std::sort(comp.begin(), comp.end());
            components.push_back(std::move(comp));
        }
    };
    for (int v : members)
        if (!index.count(v))
            visit(v);
    return components;
}

// A cycle through the component's first node, in data-flow order.
std::vector<int> cycleIn(const std::vector<Work>& work, const std::vector<int>& component)
{
    std::set<int> comp(component.begin(), component.end());
    std::vector<int> path;
    std::map<int, std::size_t> seen;
    int v = component.front();
    while (!seen.count(v)) {
        seen[v] = path.size();
        path.push_back(v);
        int next = -1;
        for (int w : work[static_cast<std::size_t>(v)].consumers)
            if (comp.count(w)) {
                next = w;
                break;
            }
        if (next < 0)
            return {};
        v = next;
    }
    std::vector<int> cycle(path.begin() + static_cast<std::ptrdiff_t>(seen[v]), path.end());
    cycle.push_back(v);
    return cycle;
}

} // namespace

GraphAnalysis analyzeModel(const ModelSpec& spec)
{
    GraphAnalysis a;
    const Reporter report{a.problems};
    const std::size_t n = spec.layers.size();
    std::vector<Work> work(n);
    std::map<std::string, int> firstIndex;
    const std::vector<std::string> typeNames = layerTypeNames();

    if (n == 0) {
        report("", "model '" + spec.name + "' has no layers",
               "start with an Input layer, e.g. shape [784]");
        return a;
    }

    // Ids: unique and non-empty.
    for (std::size_t i = 0; i < n; ++i) {
        const LayerSpec& l = spec.layers[i];
        work[i].layer = &l;
        if (l.id.empty()) {
            work[i].excluded = true;
            report("", "layer #" + std::to_string(i) + " (" + (l.type.empty() ? "?" : l.type)
                           + ") has no id",
                   "give every layer a unique id, e.g. \"dense_2\"");
            continue;
        }
        auto [it, inserted] = firstIndex.emplace(l.id, static_cast<int>(i));
        if (!inserted) {
            // References to the id are ambiguous: the first node is not usable either.
            work[i].excluded = true;
            work[static_cast<std::size_t>(it->second)].structuralOk = false;
            report(l.id,
                   nodeRef(l.id) + ": duplicate id (layers #" + std::to_string(it->second)
                       + " and #" + std::to_string(i) + ")",
                   "rename one of them; ids must be unique");
        }
    }
    bool wiringProblem = false;  // dangling inputs, wrong input counts, cycles
    std::vector<std::string> allIds;
    for (const auto& [id, index] : firstIndex)
        allIds.push_back(id);

    // Types, attributes and inputs, one node at a time.
    for (std::size_t i = 0; i < n; ++i) {
        Work& w = work[i];
        if (w.excluded)
            continue;
        const LayerSpec& l = *w.layer;
        w.kind = findLayerKind(l.type);
        if (!w.kind) {
            w.structuralOk = false;
            report(l.id, nodeRef(l.id) + ": unknown layer type '" + l.type + "'",
                   suggestion(l.type, typeNames, "known types:"));
        } else {
            AttrNormaliser norm(l, *w.kind, report);
            if (!norm.run(w.attrs))
                w.structuralOk = false;
        }
        for (const std::string& in : l.inputs) {
            auto found = firstIndex.find(in);
            if (found == firstIndex.end()) {
                w.structuralOk = false;
                wiringProblem = true;
                std::vector<std::string> others;
                for (const std::string& id : allIds)
                    if (id != l.id)
                        others.push_back(id);
                report(l.id, nodeRef(l.id) + ": input '" + in + "' does not exist",
                       suggestion(in, others, "existing nodes:"));
                continue;
            }
            w.producers.push_back(found->second);
            work[static_cast<std::size_t>(found->second)].consumers.push_back(
                static_cast<int>(i));
        }
        if (w.kind) {
            const int got = static_cast<int>(l.inputs.size());
            const int lo = w.kind->minInputs, hi = w.kind->maxInputs;
            if (got < lo || (hi >= 0 && got > hi)) {
                w.structuralOk = false;
                wiringProblem = true;
                std::string expects;
                if (hi == 0)
                    expects = "takes no inputs";
                else if (lo == hi)
                    expects = "expects " + std::to_string(lo) + " input" + (lo == 1 ? "" : "s");
                else
                    expects = "expects at least " + std::to_string(lo) + " inputs";
                std::string hint;
                if (hi == 0)
                    hint = "remove the inputs of '" + l.id + "'; an Input is fed by the data";
                else if (got < lo)
                    hint = "connect " + std::string(got == 0 ? "an input" : "more inputs")
                           + " to '" + l.id + "'";
                else
                    hint = "merge the inputs with Add or Concatenate before '" + l.id + "'";
                report(l.id, nodeRef(l.id) + ": " + l.type + " " + expects + ", got "
                                 + std::to_string(got),
                       hint);
            }
        }
    }

    // Topological order (Kahn), preferring file order among ready nodes.
    std::vector<int> indegree(n, 0);
    for (std::size_t i = 0; i < n; ++i)
        if (!work[i].excluded)
            indegree[i] = static_cast<int>(work[i].producers.size());
    std::priority_queue<int, std::vector<int>, std::greater<int>> ready;
    for (std::size_t i = 0; i < n; ++i)
        if (!work[i].excluded && indegree[i] == 0)
            ready.push(static_cast<int>(i));
    std::vector<int> order;
    std::vector<bool> placed(n, false);
    while (!ready.empty()) {
        const int v = ready.top();
        ready.pop();
        order.push_back(v);
        placed[static_cast<std::size_t>(v)] = true;
        for (int c : work[static_cast<std::size_t>(v)].consumers)
            if (--indegree[static_cast<std::size_t>(c)] == 0)
                ready.push(c);
    }
    std::vector<int> stuck;
    for (std::size_t i = 0; i < n; ++i)
        if (!work[i].excluded && !placed[i])
            stuck.push_back(static_cast<int>(i));
    bool hasCycle = false;
    if (!stuck.empty()) {
        for (const std::vector<int>& comp : stronglyConnected(work, stuck)) {
            const int first = comp.front();
            const auto& cons = work[static_cast<std::size_t>(first)].consumers;
            const bool selfLoop = std::find(cons.begin(), cons.end(), first) != cons.end();
            if (comp.size() < 2 && !selfLoop)
                continue;  // only downstream of a cycle
            hasCycle = true;
            const std::vector<int> cycle = cycleIn(work, comp);
            std::string path;
            std::vector<std::string> names;
            for (std::size_t k = 0; k < cycle.size(); ++k) {
                path += (k ? " -> '" : "'") + spec.layers[static_cast<std::size_t>(cycle[k])].id
                        + "'";
                if (k + 1 < cycle.size())
                    names.push_back(spec.layers[static_cast<std::size_t>(cycle[k])].id);
            }
            const std::string& head = spec.layers[static_cast<std::size_t>(first)].id;
            report(head, nodeRef(head) + (names.size() == 1 ? " takes its own output as an input: " : " is on a cycle: ") + path,
                   names.size() == 1 ? "a model must be acyclic; remove '" + head + "' from its own inputs"
                                     : "a model must be acyclic; remove one of the connections between " + quotedList(names));
        }
        order.insert(order.end(), stuck.begin(), stuck.end());
    }

    // Nodes in order, with resolved input indices.
    std::vector<int> nodeOf(n, -1);
    for (std::size_t k = 0; k < order.size(); ++k)
        nodeOf[static_cast<std::size_t>(order[k])] = static_cast<int>(k);
    a.nodes.reserve(order.size());
    for (int f : order) {
        const Work& w = work[static_cast<std::size_t>(f)];
        NodeInfo node;
        node.id = w.layer->id;
        node.type = w.layer->type;
        node.attrs = w.attrs;
        for (int p : w.producers)
            node.inputs.push_back(nodeOf[static_cast<std::size_t>(p)]);
        node.ok = w.structuralOk && placed[static_cast<std::size_t>(f)];
        a.nodes.push_back(std::move(node));
    }

    // Shapes, in topological order; a broken producer silently breaks its consumers.
    for (std::size_t k = 0; k < a.nodes.size(); ++k) {
        NodeInfo& node = a.nodes[k];
        if (!node.ok)
            continue;
        std::vector<std::string> inputIds;
        for (int p : node.inputs) {
            const NodeInfo& producer = a.nodes[static_cast<std::size_t>(p)];
            node.ok = node.ok && producer.ok;
            node.inputShapes.push_back(producer.outputShape);
            inputIds.push_back(producer.id);
        }
        if (!node.ok) {
            node.inputShapes.clear();
            continue;
        }
        ShapeInference infer(node, inputIds, report);
        if (!infer.run()) {
            node.ok = false;
            node.params.clear();
            node.paramCount = 0;
            node.flops = 0;
        }
    }

    for (std::size_t k = 0; k < a.nodes.size(); ++k) {
        const NodeInfo& node = a.nodes[k];
        if (node.type == "Input")
            a.inputNodes.push_back(static_cast<int>(k));
        a.totalParams += node.paramCount;
        a.totalFlops += node.flops;
        for (const ParamSpec& p : node.params)
            if (p.trainable)
                a.trainableParams += p.shape.numel();
    }
    if (a.inputNodes.empty())
        report("", "model '" + spec.name + "' has no Input node",
               "add an Input layer with the shape of one sample, e.g. [784] or [28, 28, 1]");

    // Outputs: as given, or the single sink.
    if (!spec.outputs.empty()) {
        for (const std::string& out : spec.outputs) {
            const int k = a.indexOf(out);
            if (k < 0)
                report("", "outputs names '" + out + "', which is not a node of the model",
                       suggestion(out, allIds, "existing nodes:"));
            else
                a.outputNodes.push_back(k);
        }
    } else {
        std::vector<std::string> sinks;
        std::vector<int> sinkNodes;
        for (std::size_t k = 0; k < a.nodes.size(); ++k) {
            const int f = order[k];
            if (work[static_cast<std::size_t>(f)].consumers.empty()) {
                sinks.push_back(a.nodes[k].id);
                sinkNodes.push_back(static_cast<int>(k));
            }
        }
        if (sinks.size() == 1) {
            a.outputNodes = sinkNodes;
        } else if (sinks.size() > 1) {
            // With broken connections the loose ends are a consequence, not news.
            if (!wiringProblem && !hasCycle)
                report("", "model '" + spec.name + "' has " + std::to_string(sinks.size())
                               + " unconnected ends (" + quotedList(sinks)
                               + ") and no \"outputs\" to say which is the output",
                       "set outputs to the node the loss applies to, or connect or remove the "
                       "others");
        } else if (!hasCycle) {
            report("", "model '" + spec.name + "' has no output node",
                   "set outputs to the node the loss applies to");
        }
    }
    return a;
}

Status problemsToStatus(const GraphAnalysis& a, const std::string& source)
{
    if (a.problems.empty())
        return okStatus();
    const std::string where = source.empty() ? std::string() : source + ": ";
    const bool allShapes =
        std::all_of(a.problems.begin(), a.problems.end(),
                    [](const Problem& p) { return p.code == ErrorCode::ShapeMismatch; });
    const ErrorCode code = allShapes ? ErrorCode::ShapeMismatch : ErrorCode::InvalidArgument;
    if (a.problems.size() == 1)
        return makeError(code, where + a.problems[0].message, a.problems[0].hint);
    std::string message = where + std::to_string(a.problems.size()) + " problems in the model:";
    for (const Problem& p : a.problems) {
        message += "\n  " + p.message;
        if (!p.hint.empty())
            message += " (hint: " + p.hint + ")";
    }
    return makeError(code, message, "fix the problems in order; later ones may follow from "
                                    "earlier ones");
}

} // namespace ts
