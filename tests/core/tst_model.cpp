// Model specification layer: shape inference for every layer type, parameters and FLOPs,
// validation problems (every kind, all reported, each naming its node with a hint), parse errors
// with line/column and JSON paths, our format's round trip, Keras import of the fixtures
// (tests/fixtures/keras: tf.keras 2.x and Keras 3 to_json() output), Keras export -> import, and
// the example models in resources/models.

#include <QtTest>

#include <filesystem>
#include <map>
#include <fstream>
#include <regex>
#include <set>

#include "model/attrs.h"
#include "model/spec.h"

using namespace ts;
using nlohmann::json;

class TestModel : public QObject {
    Q_OBJECT
private slots:
    void errorCodesRoundTrip();
    void catalogueIsComplete();
    void catalogueDefaultsAnalyse();
    void shapeInference_data();
    void shapeInference();
    void normalisedAttributes();
    void seedMlpParamsAndFlops();
    void smallCnnParamsAndFlops();
    void problems_data();
    void problems();
    void everyProblemReported();
    void problemsToStatusJoinsAll();
    void jsonSyntaxErrorHasLineAndColumn();
    void structuralErrors_data();
    void structuralErrors();
    void formatRoundTrip();
    void loadErrors();
    void kerasImport_data();
    void kerasImport();
    void kerasKeras2EqualsKeras3();
    void kerasConfigForms();
    void kerasImportErrors_data();
    void kerasImportErrors();
    void kerasDtypePolicies();
    void kerasCompileSettings();
    void kerasCompileErrors_data();
    void kerasCompileErrors();
    void kerasExportRoundTrip_data();
    void kerasExportRoundTrip();
    void resourceModels_data();
    void resourceModels();
};

namespace {

std::string fixture(const std::string& name)
{
    return std::string(TS_FIXTURES_DIR) + "/keras/" + name;
}

std::string resource(const std::string& name)
{
    return std::string(TS_SOURCE_DIR) + "/resources/models/" + name;
}

LayerSpec layer(std::string id, std::string type, std::vector<std::string> inputs = {},
                json attrs = json::object())
{
    LayerSpec l;
    l.id = std::move(id);
    l.type = std::move(type);
    l.inputs = std::move(inputs);
    l.attrs = std::move(attrs);
    return l;
}

Shape shapeOf(const json& j)
{
    return Shape(j.get<std::vector<int64_t>>());
}

// "input_0", "input_1", ... of the given shapes feeding one node `x` of `type`.
ModelSpec oneNode(const std::string& type, const json& attrs,
                  const std::vector<std::vector<int64_t>>& inputShapes)
{
    ModelSpec s;
    s.name = "one_node";
    std::vector<std::string> ins;
    for (std::size_t i = 0; i < inputShapes.size(); ++i) {
        ins.push_back("input_" + std::to_string(i));
        json attrs = json::object();
        attrs["shape"] = inputShapes[i];
        s.layers.push_back(layer(ins.back(), "Input", {}, attrs));
    }
    s.layers.push_back(layer("x", type, ins, attrs));
    s.outputs = {"x"};
    return s;
}

std::string allMessages(const GraphAnalysis& a)
{
    std::string s;
    for (const Problem& p : a.problems)
        s += "[" + p.nodeId + "] " + p.message + " (hint: " + p.hint + ")\n";
    return s;
}

// Everything but designer positions, which Keras JSON does not carry.
json structure(const ModelSpec& s)
{
    json j = modelToJson(s);
    for (json& l : j["layers"])
        l.erase("pos");
    j.erase("compile");
    return j;
}

std::vector<std::vector<int64_t>> shapeList(const QString& text)
{
    return json::parse(text.toStdString()).get<std::vector<std::vector<int64_t>>>();
}

} // namespace

// Readable QCOMPARE failures.
namespace ts {
char* toString(const Shape& s)
{
    return qstrdup(s.toString().c_str());
}
} // namespace ts
namespace nlohmann {
char* toString(const json& j)
{
    return qstrdup(j.dump().c_str());
}
} // namespace nlohmann

// Error codes travel between processes by name (a daemon's task errors): every code's name reads
// back as that code, and other text as none.
void TestModel::errorCodesRoundTrip()
{
    std::set<std::string> names;
    for (int i = 0; i <= static_cast<int>(ErrorCode::Internal); ++i) {
        const auto code = static_cast<ErrorCode>(i);
        names.insert(errorCodeName(code));
        QCOMPARE(errorCodeFromName(errorCodeName(code)), std::optional<ErrorCode>(code));
    }
    QCOMPARE(names.size(), static_cast<std::size_t>(ErrorCode::Internal) + 1);  // no two alike
    QCOMPARE(errorCodeFromName("error"), std::optional<ErrorCode>());
    QCOMPARE(errorCodeFromName(""), std::optional<ErrorCode>());
}

void TestModel::catalogueIsComplete()
{
    const std::set<std::string> expected = {
        "Input",      "Dense",   "Conv2D",  "MaxPooling2D",      "AveragePooling2D",
        "GlobalAveragePooling2D", "Flatten", "Reshape", "Dropout", "BatchNormalization",
        "Activation", "ReLU",    "LeakyReLU", "Softmax",         "Add",
        "Concatenate"};
    std::set<std::string> got;
    const std::set<std::string> groups = {"core",       "convolution", "pooling",
                                          "normalisation", "activation", "merge"};
    const std::set<std::string> kinds = {"int", "float", "bool", "enum", "ints", "shape"};
    for (const LayerKind& k : layerCatalogue()) {
        got.insert(k.type);
        QVERIFY2(groups.count(k.group), k.type.c_str());
        QVERIFY2(!k.description.empty(), k.type.c_str());
        QVERIFY(findLayerKind(k.type) == &k);
        for (const AttrSpec& a : k.attrs) {
            QVERIFY2(kinds.count(a.kind), (k.type + "." + a.name).c_str());
            QVERIFY2(!a.description.empty(), (k.type + "." + a.name).c_str());
            QVERIFY2(model_detail::attrTypeError(a, a.defaultValue).empty(),
                     (k.type + "." + a.name).c_str());
            if (a.kind == "enum")
                QVERIFY(!a.choices.empty());
        }
    }
    QCOMPARE(got, expected);
    QVERIFY(findLayerKind("Conv1D") == nullptr);
    const LayerKind* dense = findLayerKind("Dense");
    QCOMPARE(dense->attrs[0].name, std::string("units"));
    QVERIFY(dense->attrs[0].required);
    QCOMPARE(dense->attrs[1].defaultValue, json("linear"));
    QCOMPARE(findLayerKind("Add")->maxInputs, -1);
    QCOMPARE(findLayerKind("Input")->maxInputs, 0);
    const LayerKind* bn = findLayerKind("BatchNormalization");
    QCOMPARE(bn->attrs[1].defaultValue.get<double>(), 0.99);
    QCOMPARE(bn->attrs[2].defaultValue.get<double>(), 1e-3);
    QCOMPARE(findLayerKind("LeakyReLU")->attrs[0].defaultValue.get<double>(), 0.3);
}

// A node of each type with only the catalogue's defaults (suggestions for required attributes)
// analyses cleanly on a suitable input: what the designer gets when it drops a new node.
void TestModel::catalogueDefaultsAnalyse()
{
    for (const LayerKind& k : layerCatalogue()) {
        if (k.type == "Input")
            continue;
        json attrs = json::object();
        for (const AttrSpec& a : k.attrs)
            if (a.required)
                attrs[a.name] = a.defaultValue;
        std::vector<std::vector<int64_t>> inputs = {{8, 8, 4}};
        if (k.type == "Dense")
            inputs = {{16}};
        if (k.minInputs == 2)
            inputs.push_back(inputs[0]);
        const GraphAnalysis a = analyzeModel(oneNode(k.type, attrs, inputs));
        QVERIFY2(a.ok(), (k.type + ": " + allMessages(a)).c_str());
    }
}

void TestModel::shapeInference_data()
{
    QTest::addColumn<QString>("type");
    QTest::addColumn<QString>("attrs");
    QTest::addColumn<QString>("inputs");  // list of input shapes
    QTest::addColumn<QString>("output");
    QTest::addColumn<QString>("pads");    // [top, bottom, left, right] for Conv2D/pooling, or ""

    auto row = [](const char* name, const char* type, const char* attrs, const char* inputs,
                  const char* output, const char* pads = "") {
        QTest::newRow(name) << type << attrs << inputs << output << pads;
    };
    row("dense", "Dense", R"({"units": 5})", "[[7]]", "[5]");
    row("conv valid", "Conv2D", R"({"filters": 32, "kernel_size": [3, 3]})", "[[28, 28, 1]]",
        "[26, 26, 32]", "[0, 0, 0, 0]");
    row("conv int kernel", "Conv2D", R"({"filters": 4, "kernel_size": 5})", "[[9, 9, 2]]",
        "[5, 5, 4]", "[0, 0, 0, 0]");
    row("conv same s1", "Conv2D", R"({"filters": 8, "kernel_size": 3, "padding": "same"})",
        "[[28, 28, 1]]", "[28, 28, 8]", "[1, 1, 1, 1]");
    // TF: out = ceil(28/2) = 14, pad = max(13*2 + 3 - 28, 0) = 1 -> top 0, bottom 1.
    row("conv same s2 even", "Conv2D",
        R"({"filters": 8, "kernel_size": 3, "strides": 2, "padding": "same"})", "[[28, 28, 1]]",
        "[14, 14, 8]", "[0, 1, 0, 1]");
    // out = ceil(27/2) = 14, pad = 13*2 + 3 - 27 = 2 -> 1, 1.
    row("conv same s2 odd", "Conv2D",
        R"({"filters": 8, "kernel_size": 3, "strides": 2, "padding": "same"})", "[[27, 27, 1]]",
        "[14, 14, 8]", "[1, 1, 1, 1]");
    // even kernel: pad 3 -> top 1, bottom 2.
    row("conv same k4", "Conv2D", R"({"filters": 2, "kernel_size": 4, "padding": "same"})",
        "[[10, 10, 3]]", "[10, 10, 2]", "[1, 2, 1, 2]");
    // valid, stride 2: floor((28 - 3) / 2) + 1 = 13.
    row("conv valid s2", "Conv2D", R"({"filters": 8, "kernel_size": 3, "strides": [2, 2]})",
        "[[28, 28, 1]]", "[13, 13, 8]", "[0, 0, 0, 0]");
    row("conv rectangular", "Conv2D",
        R"({"filters": 6, "kernel_size": [1, 3], "strides": [1, 2]})", "[[5, 9, 2]]",
        "[5, 4, 6]", "[0, 0, 0, 0]");
    // kernel 1 stride 2 "same": out 14, pad max(13*2 + 1 - 28, 0) = 0.
    row("conv 1x1 s2 same", "Conv2D",
        R"({"filters": 4, "kernel_size": 1, "strides": 2, "padding": "same"})",
        "[[28, 28, 16]]", "[14, 14, 4]", "[0, 0, 0, 0]");
    row("maxpool default", "MaxPooling2D", "{}", "[[28, 28, 3]]", "[14, 14, 3]", "[0, 0, 0, 0]");
    row("maxpool odd valid", "MaxPooling2D", "{}", "[[27, 27, 3]]", "[13, 13, 3]",
        "[0, 0, 0, 0]");
    // ceil(27/2) = 14, pad 13*2 + 2 - 27 = 1 -> 0, 1.
    row("maxpool odd same", "MaxPooling2D", R"({"padding": "same"})", "[[27, 27, 3]]",
        "[14, 14, 3]", "[0, 1, 0, 1]");
    row("maxpool strides", "MaxPooling2D", R"({"pool_size": 2, "strides": 1})", "[[4, 4, 1]]",
        "[3, 3, 1]", "[0, 0, 0, 0]");
    row("avgpool 3 s1 same", "AveragePooling2D",
        R"({"pool_size": [3, 3], "strides": [1, 1], "padding": "same"})", "[[8, 8, 3]]",
        "[8, 8, 3]", "[1, 1, 1, 1]");
    row("avgpool default", "AveragePooling2D", "{}", "[[6, 4, 5]]", "[3, 2, 5]", "[0, 0, 0, 0]");
    row("gap", "GlobalAveragePooling2D", "{}", "[[7, 7, 32]]", "[32]");
    row("flatten", "Flatten", "{}", "[[5, 5, 64]]", "[1600]");
    row("flatten flat", "Flatten", "{}", "[[10]]", "[10]");
    row("reshape", "Reshape", R"({"target_shape": [28, 28, 1]})", "[[784]]", "[28, 28, 1]");
    row("reshape -1", "Reshape", R"({"target_shape": [-1, 8]})", "[[32]]", "[4, 8]");
    row("dropout", "Dropout", R"({"rate": 0.5})", "[[3, 4]]", "[3, 4]");
    row("batchnorm", "BatchNormalization", "{}", "[[6, 6, 16]]", "[6, 6, 16]");
    row("batchnorm flat", "BatchNormalization", "{}", "[[20]]", "[20]");
    row("activation", "Activation", R"({"activation": "tanh"})", "[[9]]", "[9]");
    row("relu", "ReLU", "{}", "[[2, 3, 4]]", "[2, 3, 4]");
    row("leaky", "LeakyReLU", R"({"alpha": 0.1})", "[[5]]", "[5]");
    row("softmax", "Softmax", "{}", "[[10]]", "[10]");
    row("add", "Add", "{}", "[[4, 4, 2], [4, 4, 2], [4, 4, 2]]", "[4, 4, 2]");
    row("concatenate", "Concatenate", "{}", "[[4, 4, 2], [4, 4, 3]]", "[4, 4, 5]");
    row("concatenate flat", "Concatenate", R"({"axis": 1})", "[[3], [5]]", "[8]");
}

void TestModel::shapeInference()
{
    QFETCH(QString, type);
    QFETCH(QString, attrs);
    QFETCH(QString, inputs);
    QFETCH(QString, output);
    QFETCH(QString, pads);
    const GraphAnalysis a = analyzeModel(
        oneNode(type.toStdString(), json::parse(attrs.toStdString()), shapeList(inputs)));
    QVERIFY2(a.ok(), allMessages(a).c_str());
    const int k = a.indexOf("x");
    QVERIFY(k >= 0);
    const NodeInfo& n = a.nodes[static_cast<std::size_t>(k)];
    QVERIFY(n.ok);
    QCOMPARE(n.outputShape, shapeOf(json::parse(output.toStdString())));
    QCOMPARE(n.inputShapes.size(), shapeList(inputs).size());
    // Topological: inputs come before the node.
    for (int in : n.inputs)
        QVERIFY(in < k);
    if (!pads.isEmpty()) {
        const auto p = json::parse(pads.toStdString()).get<std::vector<int>>();
        if (type == "Conv2D") {
            QCOMPARE(std::vector<int>({n.conv.padTop, n.conv.padBottom, n.conv.padLeft,
                                       n.conv.padRight}),
                     p);
            QCOMPARE(n.conv.strideH, n.attrs["strides"][0].get<int>());
            QCOMPARE(n.conv.strideW, n.attrs["strides"][1].get<int>());
        } else {
            QCOMPARE(std::vector<int>({n.pool.padTop, n.pool.padBottom, n.pool.padLeft,
                                       n.pool.padRight}),
                     p);
            QCOMPARE(n.pool.kind, type == "MaxPooling2D" ? PoolKind::Max : PoolKind::Avg);
            QCOMPARE(n.pool.windowH, n.attrs["pool_size"][0].get<int>());
            QCOMPARE(n.pool.strideW, n.attrs["strides"][1].get<int>());
        }
    }
}

void TestModel::normalisedAttributes()
{
    {
        const GraphAnalysis a = analyzeModel(
            oneNode("Conv2D", {{"filters", 8}, {"kernel_size", 3}}, {{6, 6, 1}}));
        QVERIFY(a.ok());
        const json expected = {{"filters", 8},        {"kernel_size", {3, 3}},
                               {"strides", {1, 1}},   {"padding", "valid"},
                               {"activation", "linear"}, {"use_bias", true}, {"dtype", "policy"}};
        QCOMPARE(a.nodes.back().attrs, expected);
    }
    {
        const GraphAnalysis a = analyzeModel(oneNode("MaxPooling2D", {{"pool_size", 3}}, {{9, 9, 1}}));
        QCOMPARE(a.nodes.back().attrs,
                 json({{"pool_size", {3, 3}}, {"strides", {3, 3}}, {"padding", "valid"}}));
        QCOMPARE(a.nodes.back().outputShape, Shape({3, 3, 1}));
    }
    {
        const GraphAnalysis a = analyzeModel(oneNode("Dense", {{"units", 3}}, {{4}}));
        QCOMPARE(a.nodes.back().attrs,
                 json({{"units", 3}, {"activation", "linear"}, {"use_bias", true}, {"dtype", "policy"}}));
    }
    {  // a layer pinned to float32 under a mixed policy; anything else is no dtype
        QCOMPARE(analyzeModel(oneNode("Dense", {{"units", 3}, {"dtype", "float32"}}, {{4}})).nodes.back().attrs["dtype"], json("float32"));
        const GraphAnalysis bad = analyzeModel(oneNode("Dense", {{"units", 3}, {"dtype", "float16"}}, {{4}}));
        QVERIFY(!bad.ok());
        QVERIFY2(allMessages(bad).find("dtype") != std::string::npos, allMessages(bad).c_str());
    }
    {  // Keras 3 name of LeakyReLU's slope
        const GraphAnalysis a =
            analyzeModel(oneNode("LeakyReLU", {{"negative_slope", 0.2}}, {{4}}));
        QVERIFY(a.ok());
        QCOMPARE(a.nodes.back().attrs, json({{"alpha", 0.2}}));
        QCOMPARE(analyzeModel(oneNode("LeakyReLU", json::object(), {{4}})).nodes.back().attrs,
                 json({{"alpha", 0.3}}));
    }
    {  // Keras' positive axis counts the batch dimension: 3 is the last axis of (h, w, c).
        const GraphAnalysis a = analyzeModel(oneNode("BatchNormalization", {{"axis", 3}}, {{4, 4, 2}}));
        QVERIFY2(a.ok(), allMessages(a).c_str());
        QCOMPARE(a.nodes.back().attrs,
                 json({{"axis", -1}, {"momentum", 0.99}, {"epsilon", 0.001}, {"center", true},
                       {"scale", true}}));
        const auto& params = a.nodes.back().params;
        QCOMPARE(params.size(), std::size_t(4));
        QCOMPARE(params[0].name, std::string("gamma"));
        QCOMPARE(params[0].init, std::string("ones"));
        QCOMPARE(params[1].name, std::string("beta"));
        QCOMPARE(params[2].name, std::string("moving_mean"));
        QVERIFY(!params[2].trainable);
        QCOMPARE(params[3].name, std::string("moving_variance"));
        QCOMPARE(params[3].init, std::string("ones"));
        QCOMPARE(params[3].shape, Shape({2}));
        QCOMPARE(a.trainableParams, int64_t(4));
        QCOMPARE(a.totalParams, int64_t(8));
    }
    {
        const GraphAnalysis a = analyzeModel(
            oneNode("BatchNormalization", {{"center", false}, {"scale", false}}, {{5}}));
        QCOMPARE(a.nodes.back().params.size(), std::size_t(2));
        QCOMPARE(a.trainableParams, int64_t(0));
    }
    {
        const GraphAnalysis a = analyzeModel(oneNode("Activation", {{"activation", "None"}}, {{4}}));
        QVERIFY(a.ok());
        QCOMPARE(a.nodes.back().attrs, json({{"activation", "linear"}, {"dtype", "policy"}}));
    }
}

void TestModel::seedMlpParamsAndFlops()
{
    Result<ModelSpec> spec = loadModelFile(resource("seed_mlp.json"));
    QVERIFY2(spec.ok(), spec.ok() ? "" : spec.error().toString().c_str());
    const GraphAnalysis a = analyzeModel(*spec);
    QVERIFY2(a.ok(), allMessages(a).c_str());
    // 784*256 + 256 + 256*10 + 10
    QCOMPARE(a.totalParams, int64_t(203530));
    QCOMPARE(a.trainableParams, int64_t(203530));
    // dense: 2*784*256 + 256 (bias) + 256 (relu); dense_1: 2*256*10 + 10 + 10 (softmax)
    QCOMPARE(a.totalFlops, int64_t(2 * 784 * 256 + 256 + 256 + 2 * 256 * 10 + 10 + 10));
    QCOMPARE(a.nodes.size(), std::size_t(3));
    QCOMPARE(a.inputNodes, std::vector<int>({0}));
    QCOMPARE(a.outputNodes, std::vector<int>({2}));
    const NodeInfo& dense = a.nodes[1];
    QCOMPARE(dense.id, std::string("dense"));
    QCOMPARE(dense.inputs, std::vector<int>({0}));
    QCOMPARE(dense.params.size(), std::size_t(2));
    QCOMPARE(dense.params[0].name, std::string("kernel"));
    QCOMPARE(dense.params[0].shape, Shape({784, 256}));
    QCOMPARE(dense.params[0].init, std::string("glorot_uniform"));
    QCOMPARE(dense.params[0].fanIn, int64_t(784));
    QCOMPARE(dense.params[0].fanOut, int64_t(256));
    QCOMPARE(dense.params[1].name, std::string("bias"));
    QCOMPARE(dense.params[1].shape, Shape({256}));
    QCOMPARE(dense.params[1].init, std::string("zeros"));
    QCOMPARE(dense.paramCount, int64_t(200960));
    QCOMPARE(a.nodes[2].outputShape, Shape({10}));
    QCOMPARE(a.nodes[2].attrs["activation"], json("softmax"));
}

void TestModel::smallCnnParamsAndFlops()
{
    Result<ModelSpec> spec = loadModelFile(resource("small_cnn.json"));
    QVERIFY(spec.ok());
    const GraphAnalysis a = analyzeModel(*spec);
    QVERIFY2(a.ok(), allMessages(a).c_str());
    const std::vector<std::pair<std::string, Shape>> shapes = {
        {"input", {28, 28, 1}},       {"conv2d", {26, 26, 32}}, {"max_pooling2d", {13, 13, 32}},
        {"conv2d_1", {11, 11, 64}},   {"max_pooling2d_1", {5, 5, 64}},
        {"flatten", {1600}},          {"dense", {128}},         {"dense_1", {10}}};
    for (const auto& [id, shape] : shapes)
        QCOMPARE(a.nodes[static_cast<std::size_t>(a.indexOf(id))].outputShape, shape);
    // conv2d 3*3*1*32+32 = 320, conv2d_1 3*3*32*64+64 = 18496, dense 1600*128+128 = 204928,
    // dense_1 128*10+10 = 1290 (Keras' model.summary() says 225,034).
    QCOMPARE(a.totalParams, int64_t(225034));
    const NodeInfo& conv1 = a.nodes[static_cast<std::size_t>(a.indexOf("conv2d_1"))];
    QCOMPARE(conv1.params[0].shape, Shape({3, 3, 32, 64}));
    QCOMPARE(conv1.params[0].fanIn, int64_t(3 * 3 * 32));
    QCOMPARE(conv1.params[0].fanOut, int64_t(3 * 3 * 64));
    QCOMPARE(conv1.paramCount, int64_t(18496));
    const int64_t conv0Flops = 2LL * 26 * 26 * 3 * 3 * 1 * 32 + 2 * 26 * 26 * 32;  // + bias, relu
    const int64_t pool0Flops = 13LL * 13 * 32 * 4;
    const int64_t conv1Flops = 2LL * 11 * 11 * 3 * 3 * 32 * 64 + 2 * 11 * 11 * 64;
    const int64_t pool1Flops = 5LL * 5 * 64 * 4;
    const int64_t denseFlops = 2LL * 1600 * 128 + 2 * 128;
    const int64_t dense1Flops = 2LL * 128 * 10 + 2 * 10;
    QCOMPARE(a.nodes[1].flops, conv0Flops);
    QCOMPARE(a.totalFlops,
             conv0Flops + pool0Flops + conv1Flops + pool1Flops + denseFlops + dense1Flops);
    QCOMPARE(a.totalFlops, int64_t(5349140));
}

void TestModel::problems_data()
{
    QTest::addColumn<QString>("layers");   // our format's "layers" list
    QTest::addColumn<QString>("outputs");  // "" or a JSON list
    QTest::addColumn<QString>("node");     // expected Problem::nodeId ("" for model-level)
    QTest::addColumn<QString>("message");  // substring of the message
    QTest::addColumn<QString>("hint");     // substring of the hint
    QTest::addColumn<int>("count");        // number of problems

    const char* in784 = R"({"id": "input", "type": "Input", "attrs": {"shape": [784]}})";
    auto L = [in784](const QString& rest) { return QString("[%1, %2]").arg(in784, rest); };

    QTest::newRow("unknown type")
        << L(R"({"id": "d", "type": "Dens", "inputs": ["input"], "attrs": {"units": 3}})") << ""
        << "d" << "node 'd': unknown layer type 'Dens'" << "did you mean 'Dense'" << 1;
    QTest::newRow("unknown type, no close match")
        << L(R"({"id": "d", "type": "Transformer", "inputs": ["input"]})") << "" << "d"
        << "unknown layer type 'Transformer'" << "known types: Input, Dense" << 1;
    QTest::newRow("missing units")
        << L(R"({"id": "d", "type": "Dense", "inputs": ["input"]})") << "" << "d"
        << "node 'd': missing attribute 'units'" << "set units" << 1;
    QTest::newRow("units 0")
        << L(R"({"id": "d", "type": "Dense", "inputs": ["input"], "attrs": {"units": 0}})") << ""
        << "d" << "node 'd': units must be at least 1, got 0" << "positive" << 1;
    QTest::newRow("ill-typed units")
        << L(R"({"id": "d", "type": "Dense", "inputs": ["input"], "attrs": {"units": "ten"}})")
        << "" << "d" << "node 'd': attribute 'units': expected an integer, got \"ten\""
        << "set units" << 1;
    QTest::newRow("unknown attribute")
        << L(R"({"id": "d", "type": "Dense", "inputs": ["input"], "attrs": {"units": 3, "unit": 4}})")
        << "" << "d" << "node 'd': unknown attribute 'unit' for Dense" << "did you mean 'units'"
        << 1;
    QTest::newRow("attribute on a layer without any")
        << L(R"({"id": "f", "type": "Flatten", "inputs": ["input"], "attrs": {"rate": 1}})")
        << "" << "f" << "unknown attribute 'rate' for Flatten" << "Flatten takes no attributes"
        << 1;
    QTest::newRow("unknown activation")
        << L(R"({"id": "d", "type": "Dense", "inputs": ["input"], "attrs": {"units": 3, "activation": "rellu"}})")
        << "" << "d" << "node 'd': unknown activation 'rellu'" << "did you mean 'relu'" << 1;
    QTest::newRow("bad padding")
        << R"([{"id": "input", "type": "Input", "attrs": {"shape": [8, 8, 1]}},
              {"id": "c", "type": "Conv2D", "inputs": ["input"], "attrs": {"filters": 2, "kernel_size": 3, "padding": "full"}}])"
        << "" << "c" << "padding must be 'valid' or 'same', got 'full'" << "valid" << 1;
    QTest::newRow("kernel_size 3 entries")
        << R"([{"id": "input", "type": "Input", "attrs": {"shape": [8, 8, 1]}},
              {"id": "c", "type": "Conv2D", "inputs": ["input"], "attrs": {"filters": 2, "kernel_size": [3, 3, 3]}}])"
        << "" << "c" << "kernel_size must have 2 entries" << "[h, w]" << 1;
    QTest::newRow("kernel larger than input")
        << R"([{"id": "input", "type": "Input", "attrs": {"shape": [3, 3, 1]}},
              {"id": "c", "type": "Conv2D", "inputs": ["input"], "attrs": {"filters": 2, "kernel_size": 5}}])"
        << "" << "c"
        << "node 'c': kernel 5x5 is larger than its input (3, 3, 1) with padding \"valid\" "
           "(output would be -1x-1)"
        << "padding \"same\"" << 1;
    QTest::newRow("pool larger than input")
        << R"([{"id": "input", "type": "Input", "attrs": {"shape": [1, 4, 2]}},
              {"id": "p", "type": "MaxPooling2D", "inputs": ["input"]}])"
        << "" << "p" << "(output would be 0x2)" << "smaller pool_size" << 1;
    QTest::newRow("conv on flat input")
        << L(R"({"id": "c", "type": "Conv2D", "inputs": ["input"], "attrs": {"filters": 2, "kernel_size": 3}})")
        << "" << "c" << "node 'c': Conv2D expects a 3-D input (height, width, channels), got (784,)"
        << "add a Reshape before 'c'" << 1;
    QTest::newRow("dense on image")
        << R"([{"id": "input", "type": "Input", "attrs": {"shape": [28, 28, 1]}},
              {"id": "dense", "type": "Dense", "inputs": ["input"], "attrs": {"units": 10}}])"
        << "" << "dense" << "node 'dense': Dense expects a flat input (features), got (28, 28, 1)"
        << "add a Flatten before 'dense'" << 1;
    QTest::newRow("reshape count")
        << L(R"({"id": "r", "type": "Reshape", "inputs": ["input"], "attrs": {"target_shape": [28, 28, 2]}})")
        << "" << "r" << "cannot reshape (784,) (784 elements) to (28, 28, 2) (1568 elements)"
        << "-1" << 1;
    QTest::newRow("reshape two -1")
        << L(R"({"id": "r", "type": "Reshape", "inputs": ["input"], "attrs": {"target_shape": [-1, -1]}})")
        << "" << "r" << "has more than one -1" << "at most one" << 1;
    QTest::newRow("dropout rate 1")
        << L(R"({"id": "drop", "type": "Dropout", "inputs": ["input"], "attrs": {"rate": 1.0}})")
        << "" << "drop" << "node 'drop': rate must be in [0, 1), got 1.0" << "0.5" << 1;
    QTest::newRow("softmax axis")
        << R"([{"id": "input", "type": "Input", "attrs": {"shape": [4, 5]}},
              {"id": "s", "type": "Softmax", "inputs": ["input"], "attrs": {"axis": 1}}])"
        << "" << "s" << "node 's': Softmax axis 1 is not the last axis" << "-1" << 1;
    QTest::newRow("dangling input")
        << L(R"({"id": "d", "type": "Dense", "inputs": ["inptu"], "attrs": {"units": 3}})") << ""
        << "d" << "node 'd': input 'inptu' does not exist" << "did you mean 'input'" << 1;
    QTest::newRow("no inputs")
        << L(R"({"id": "d", "type": "Dense", "attrs": {"units": 3}})") << "\"\"" << "d"
        << "node 'd': Dense expects 1 input, got 0" << "connect an input to 'd'" << 1;
    QTest::newRow("too many inputs")
        << L(R"({"id": "d", "type": "Dense", "inputs": ["input", "input"], "attrs": {"units": 3}})")
        << "" << "d" << "node 'd': Dense expects 1 input, got 2" << "merge the inputs" << 1;
    QTest::newRow("add with one input")
        << L(R"({"id": "a", "type": "Add", "inputs": ["input"]})") << "" << "a"
        << "node 'a': Add expects at least 2 inputs, got 1" << "connect more inputs" << 1;
    QTest::newRow("input with inputs")
        << R"([{"id": "input", "type": "Input", "attrs": {"shape": [3]}},
              {"id": "in2", "type": "Input", "inputs": ["input"], "attrs": {"shape": [3]}}])"
        << "" << "in2" << "node 'in2': Input takes no inputs, got 1" << "remove the inputs" << 1;
    QTest::newRow("add shape mismatch")
        << R"([{"id": "a", "type": "Input", "attrs": {"shape": [4, 4, 2]}},
              {"id": "b", "type": "Input", "attrs": {"shape": [4, 4, 3]}},
              {"id": "sum", "type": "Add", "inputs": ["a", "b"]}])"
        << "" << "sum"
        << "node 'sum': Add inputs differ in shape: 'a' is (4, 4, 2) but 'b' is (4, 4, 3)"
        << "1x1 Conv2D" << 1;
    QTest::newRow("concatenate mismatch")
        << R"([{"id": "a", "type": "Input", "attrs": {"shape": [4, 4, 2]}},
              {"id": "b", "type": "Input", "attrs": {"shape": [5, 4, 2]}},
              {"id": "cat", "type": "Concatenate", "inputs": ["a", "b"]}])"
        << "" << "cat" << "'a' is (4, 4, 2) but 'b' is (5, 4, 2)" << "all dimensions but the last"
        << 1;
    QTest::newRow("cycle")
        << L(R"({"id": "sum", "type": "Add", "inputs": ["input", "c"]},
                {"id": "b", "type": "Dense", "inputs": ["sum"], "attrs": {"units": 784}},
                {"id": "c", "type": "Dense", "inputs": ["b"], "attrs": {"units": 784}})")
        << "" << "sum" << "node 'sum' is on a cycle: 'sum' -> 'b' -> 'c' -> 'sum'"
        << "remove one of the connections between 'sum', 'b' and 'c'" << 1;
    QTest::newRow("self loop")
        << L(R"({"id": "loop", "type": "Add", "inputs": ["input", "loop"]})") << "" << "loop"
        << "node 'loop' takes its own output as an input: 'loop' -> 'loop'" << "remove 'loop' from its own inputs" << 1;
    QTest::newRow("duplicate id")
        << L(R"({"id": "input", "type": "Dense", "inputs": ["input"], "attrs": {"units": 3}})")
        << "" << "input" << "node 'input': duplicate id (layers #0 and #1)" << "rename" << 1;
    QTest::newRow("no input node")
        << R"([{"id": "a", "type": "Flatten"}])" << "" << "a" << "Flatten expects 1 input, got 0"
        << "connect" << 2;
    QTest::newRow("two sinks")
        << L(R"({"id": "a", "type": "Dense", "inputs": ["input"], "attrs": {"units": 3}},
                {"id": "b", "type": "Dense", "inputs": ["input"], "attrs": {"units": 4}})")
        << "" << "" << "has 2 unconnected ends ('a' and 'b')" << "set outputs" << 1;
    QTest::newRow("outputs names a missing node")
        << L(R"({"id": "dense", "type": "Dense", "inputs": ["input"], "attrs": {"units": 3}})")
        << R"(["dens"])" << "" << "outputs names 'dens', which is not a node of the model"
        << "did you mean 'dense'" << 1;
    QTest::newRow("input without shape")
        << R"([{"id": "input", "type": "Input"},
              {"id": "d", "type": "Dense", "inputs": ["input"], "attrs": {"units": 3}}])"
        << "" << "input" << "node 'input': missing attribute 'shape'" << "set shape" << 1;
    QTest::newRow("input with a zero dim")
        << R"([{"id": "input", "type": "Input", "attrs": {"shape": [0, 3]}},
              {"id": "d", "type": "Flatten", "inputs": ["input"]}])"
        << "" << "input" << "shape [0,3] has a dimension below 1" << "positive" << 1;
}

void TestModel::problems()
{
    QFETCH(QString, layers);
    QFETCH(QString, outputs);
    QFETCH(QString, node);
    QFETCH(QString, message);
    QFETCH(QString, hint);
    QFETCH(int, count);

    ModelSpec spec;
    spec.name = "broken";
    for (const json& l : json::parse(layers.toStdString())) {
        LayerSpec s = layer(l["id"], l["type"], l.value("inputs", std::vector<std::string>{}),
                            l.value("attrs", json::object()));
        spec.layers.push_back(s);
    }
    if (!outputs.isEmpty() && outputs != "\"\"")
        spec.outputs = json::parse(outputs.toStdString()).get<std::vector<std::string>>();
    const GraphAnalysis a = analyzeModel(spec);
    QVERIFY(!a.ok());
    const std::string all = allMessages(a);
    QVERIFY2(static_cast<int>(a.problems.size()) == count, all.c_str());
    const Problem* match = nullptr;
    for (const Problem& p : a.problems)
        if (p.message.find(message.toStdString()) != std::string::npos)
            match = &p;
    QVERIFY2(match, ("no problem says \"" + message.toStdString() + "\":\n" + all).c_str());
    QCOMPARE(match->nodeId, node.toStdString());
    if (!node.isEmpty())
        QVERIFY2(match->message.find("'" + node.toStdString() + "'") != std::string::npos,
                 match->message.c_str());
    QVERIFY2(match->hint.find(hint.toStdString()) != std::string::npos, match->hint.c_str());
    for (const Problem& p : a.problems)
        QVERIFY2(!p.hint.empty(), p.message.c_str());
    if (!node.isEmpty()) {
        const int k = a.indexOf(node.toStdString());
        if (k >= 0)
            QVERIFY(!a.nodes[static_cast<std::size_t>(k)].ok);
    }
    // The status carries every message.
    const Status st = problemsToStatus(a, "broken.json");
    QVERIFY(!st.ok());
    for (const Problem& p : a.problems)
        QVERIFY(st.error().message.find(p.message) != std::string::npos);
}

// Independent mistakes are all reported; what follows from them is not reported again.
void TestModel::everyProblemReported()
{
    ModelSpec s;
    s.name = "many";
    s.layers = {
        layer("input", "Input", {}, {{"shape", {28, 28, 1}}}),
        layer("conv", "Conv2D", {"input"}, {{"filters", 0}, {"kernel_size", 3}}),  // filters 0
        layer("pool", "MaxPooling2D", {"conv"}),        // behind conv: silent
        layer("flat", "Flatten", {"pool"}),             // silent
        layer("mystery", "Dens", {"flat"}),             // unknown type
        layer("dense", "Dense", {"mystery"}, {{"units", 10}}),  // silent
        layer("side", "Dense", {"input"}, {{"units", 4}}),      // Dense on an image
        layer("lost", "Dense", {"nowhere"}, {{"units", 4}, {"activaton", "relu"}}),
        layer("extra", "Dense", {"input"}, {{"units", 2}}),
        layer("extra", "Flatten", {"input"}),  // duplicate id
    };
    s.outputs = {"dense"};
    const GraphAnalysis a = analyzeModel(s);
    const std::string all = allMessages(a);
    std::multiset<std::string> nodes;
    for (const Problem& p : a.problems)
        nodes.insert(p.nodeId);
    QVERIFY2(nodes == std::multiset<std::string>({"conv", "mystery", "side", "lost", "lost", "extra"}),
             all.c_str());
    QVERIFY2(all.find("duplicate id") != std::string::npos, all.c_str());
    QVERIFY2(all.find("unknown attribute 'activaton'") != std::string::npos, all.c_str());
    QVERIFY2(all.find("input 'nowhere' does not exist") != std::string::npos, all.c_str());
    QVERIFY2(all.find("add a Flatten before 'side'") != std::string::npos, all.c_str());
    for (const char* id : {"conv", "pool", "flat", "mystery", "dense", "side", "lost", "extra"})
        QVERIFY2(!a.nodes[static_cast<std::size_t>(a.indexOf(id))].ok, id);
    QVERIFY(a.nodes[static_cast<std::size_t>(a.indexOf("input"))].ok);
    QCOMPARE(a.nodes.size(), std::size_t(9));  // the duplicate is left out
    // With outputs given, a broken graph still names its output.
    QCOMPARE(a.outputNodes, std::vector<int>({a.indexOf("dense")}));
}

void TestModel::problemsToStatusJoinsAll()
{
    ModelSpec ok;
    ok.layers = {layer("input", "Input", {}, {{"shape", json::array({3})}}),
                 layer("d", "Dense", {"input"}, {{"units", 2}})};
    QVERIFY(problemsToStatus(analyzeModel(ok), "ok.json").ok());

    ModelSpec one = ok;
    one.layers[1].attrs["units"] = -1;
    Status st = problemsToStatus(analyzeModel(one), "one.json");
    QVERIFY(!st.ok());
    QCOMPARE(st.error().code, ErrorCode::InvalidArgument);
    QCOMPARE(st.error().message, std::string("one.json: node 'd': units must be at least 1, got -1"));
    QVERIFY(!st.error().hint.empty());

    ModelSpec shapes;
    shapes.layers = {layer("a", "Input", {}, {{"shape", json::array({2})}}),
                     layer("b", "Input", {}, {{"shape", json::array({3})}}),
                     layer("sum", "Add", {"a", "b"})};
    st = problemsToStatus(analyzeModel(shapes), "s.json");
    QCOMPARE(st.error().code, ErrorCode::ShapeMismatch);

    ModelSpec two = one;
    two.layers.push_back(layer("e", "Relu", {"d"}));
    st = problemsToStatus(analyzeModel(two), "two.json");
    QVERIFY(st.error().message.rfind("two.json: 2 problems", 0) == 0);
    QVERIFY(st.error().message.find("units must be at least 1") != std::string::npos);
    QVERIFY(st.error().message.find("unknown layer type 'Relu'") != std::string::npos);
    QVERIFY(st.error().message.find("did you mean 'ReLU'") != std::string::npos);
}

void TestModel::jsonSyntaxErrorHasLineAndColumn()
{
    const std::string text = "{\n"
                             "  \"format\": \"trainstudio-model\",\n"
                             "  \"layers\": [\n"
                             "    {\"id\": \"a\" \"type\": \"Input\"}\n"
                             "  ]\n"
                             "}\n";
    Result<ModelSpec> r = parseModelText(text, "broken.json");
    QVERIFY(!r.ok());
    QCOMPARE(r.error().code, ErrorCode::ParseError);
    const std::string& m = r.error().message;
    QVERIFY2(m.rfind("broken.json:4:", 0) == 0, m.c_str());
    QVERIFY2(m.find("JSON syntax error") != std::string::npos, m.c_str());
    QVERIFY2(m.find("json.exception") == std::string::npos, m.c_str());
    // Same place nlohmann itself reports.
    try {
        const json unexpected = json::parse(text);
        QFAIL(("expected a parse error, got " + unexpected.dump()).c_str());
    } catch (const json::parse_error& e) {
        std::smatch match;
        const std::string what = e.what();
        QVERIFY(std::regex_search(what, match, std::regex("line (\\d+), column (\\d+)")));
        QVERIFY2(m.rfind("broken.json:" + match[1].str() + ":" + match[2].str() + ":", 0) == 0,
                 (m + " vs " + what).c_str());
    }
    QVERIFY(r.error().hint.find("line 4") != std::string::npos);

    // First line, and the end of the input.
    r = parseModelText("{\"layers\": [}", "x.json");
    QVERIFY2(r.error().message.rfind("x.json:1:13:", 0) == 0, r.error().message.c_str());
    r = parseModelText("{\n\"layers\": [\n", "y.json");
    QVERIFY2(r.error().message.rfind("y.json:3:", 0) == 0, r.error().message.c_str());

    // A key given twice is not silently the last one: named with where it is.
    r = parseModelText(R"({"format": "trainstudio-model", "layers": [{"id": "input", "type": "Input", "attrs": {"shape": [784]}},
        {"id": "d", "type": "Dense", "inputs": ["input"], "attrs": {"units": 3, "units": 30}}]})",
                       "twice.json");
    QVERIFY(!r.ok());
    QCOMPARE(r.error().code, ErrorCode::ParseError);
    QVERIFY2(r.error().message == "twice.json: \"units\" is given twice in one object (at layers[].attrs.units)", r.error().message.c_str());
}

void TestModel::structuralErrors_data()
{
    QTest::addColumn<QString>("text");
    QTest::addColumn<QString>("message");

    const QString head = R"({"format": "trainstudio-model", "version": 1, )";
    const QString in = R"({"id": "input", "type": "Input", "attrs": {"shape": [784]}})";
    QTest::newRow("units not an integer")
        << head + R"("layers": [)" + in + R"(, {"id": "d", "type": "Dense", "inputs": ["input"]},
             {"id": "e", "type": "Dense", "inputs": ["d"], "attrs": {"units": "abc"}}]})"
        << "seed_mlp.json: layers[2].attrs.units: expected an integer, got \"abc\"";
    QTest::newRow("shape not a list")
        << head + R"("layers": [{"id": "input", "type": "Input", "attrs": {"shape": 784}}]})"
        << "seed_mlp.json: layers[0].attrs.shape: expected a list of integers, got 784";
    QTest::newRow("use_bias not a bool")
        << head + R"("layers": [)" + in + R"(, {"id": "d", "type": "Dense", "inputs": ["input"], "attrs": {"units": 2, "use_bias": 1}}]})"
        << "seed_mlp.json: layers[1].attrs.use_bias: expected true or false, got 1";
    QTest::newRow("missing layers") << head + R"("name": "x"})"
                                    << "seed_mlp.json: layers: missing (expected a list of layers)";
    QTest::newRow("layers not a list")
        << head + R"("layers": {}})" << "seed_mlp.json: layers: expected a list, got an object";
    QTest::newRow("layer without id")
        << head + R"("layers": [{"type": "Input"}]})"
        << "seed_mlp.json: layers[0].id: missing (expected a string)";
    QTest::newRow("id a number") << head + R"("layers": [{"id": 3, "type": "Input"}]})"
                                 << "seed_mlp.json: layers[0].id: expected a string, got a number";
    QTest::newRow("inputs with a number")
        << head + R"("layers": [)" + in + R"(, {"id": "d", "type": "Flatten", "inputs": ["input", 7]}]})"
        << "seed_mlp.json: layers[1].inputs[1]: expected a string, got a number";
    QTest::newRow("bad pos") << head + R"("layers": [{"id": "a", "type": "Input", "pos": [1]}]})"
                             << "seed_mlp.json: layers[0].pos: expected [x, y] numbers, got [1]";
    QTest::newRow("unknown layer key")
        << head + R"("layers": [{"id": "a", "type": "Input", "input": []}]})"
        << "seed_mlp.json: layers[0].input: unknown key";
    QTest::newRow("unknown top-level key")
        << head + R"("layers": [], "outputz": []})" << "seed_mlp.json: outputz: unknown key";
    QTest::newRow("batch size 0") << head + R"("layers": [], "compile": {"batch_size": 0}})"
                                  << "seed_mlp.json: compile.batch_size: must be at least 1, got 0";
    QTest::newRow("learning rate a string")
        << head + R"("layers": [], "compile": {"optimizer": {"type": "adam", "learning_rate": "fast"}}})"
        << "seed_mlp.json: compile.optimizer.learning_rate: expected a number, got a string";
    QTest::newRow("from_logits a string")
        << head + R"("layers": [], "compile": {"from_logits": "no"}})"
        << "seed_mlp.json: compile.from_logits: expected true or false, got a string";
    QTest::newRow("unknown precision")
        << head + R"("layers": [], "compile": {"precision": "float8"}})"
        << "seed_mlp.json: compile.precision: expected \"float32\", \"mixed_float16\" or \"mixed_bfloat16\", got \"float8\"";
    QTest::newRow("wrong format")
        << R"({"format": "something-else", "layers": []})"
        << "seed_mlp.json: format: expected \"trainstudio-model\", got \"something-else\"";
    QTest::newRow("newer version")
        << R"({"format": "trainstudio-model", "version": 2, "layers": []})"
        << "seed_mlp.json: version 2 is newer than this TrainStudio reads (1)";
    QTest::newRow("not a model") << "[1, 2, 3]" << "seed_mlp.json: not a model";
}

void TestModel::structuralErrors()
{
    QFETCH(QString, text);
    QFETCH(QString, message);
    Result<ModelSpec> r = parseModelText(text.toStdString(), "seed_mlp.json");
    QVERIFY(!r.ok());
    QVERIFY2(r.error().message.find(message.toStdString()) != std::string::npos,
             r.error().message.c_str());
    QVERIFY(!r.error().hint.empty());
}

void TestModel::formatRoundTrip()
{
    Result<ModelSpec> seed = loadModelFile(resource("seed_mlp.json"));
    QVERIFY(seed.ok());
    QCOMPARE(seed->name, std::string("seed_mlp"));
    QCOMPARE(seed->compile.batchSize, int64_t(256));
    QCOMPARE(seed->compile.epochs, int64_t(10));
    QCOMPARE(seed->compile.loss, std::string("sparse_categorical_crossentropy"));
    QCOMPARE(seed->compile.optimizer["learning_rate"].get<double>(), 1e-3);
    QCOMPARE(seed->layers[1].y, 120.0);

    ModelSpec s = *seed;
    s.name = "edited";
    s.layers[1].x = 12.5;
    s.layers[1].attrs["use_bias"] = false;
    s.outputs.clear();
    s.compile.optimizer = {{"type", "sgd"}, {"learning_rate", 0.05}, {"momentum", 0.9}};
    s.compile.fromLogits = true;
    s.compile.metrics = {"accuracy", "top_k"};
    s.compile.precision = PrecisionPolicy::MixedBfloat16;

    const std::string dir = std::string(TS_BUILD_DIR) + "/tst_model_tmp";
    std::filesystem::create_directories(dir);
    const std::string path = dir + "/edited.json";
    const Status saved = saveModelFile(s, path);
    QVERIFY2(saved.ok(), saved.ok() ? "" : saved.error().toString().c_str());
    QVERIFY(!std::filesystem::exists(path + ".tmp"));
    Result<ModelSpec> back = loadModelFile(path);
    QVERIFY2(back.ok(), back.ok() ? "" : back.error().toString().c_str());
    QCOMPARE(modelToJson(*back), modelToJson(s));
    QCOMPARE(back->layers[1].x, 12.5);
    QVERIFY(back->outputs.empty());
    QCOMPARE(int(back->compile.precision), int(PrecisionPolicy::MixedBfloat16));
    // A float32 model's file has no precision key (files from before it stay byte-identical).
    QVERIFY(!modelToJson(*seed)["compile"].contains("precision"));
    QCOMPARE(modelToJson(s)["compile"]["precision"], json("mixed_bfloat16"));

    // The saved text leads with the format marker and keeps one layer per line.
    std::ifstream in(path);
    std::string first, second;
    std::getline(in, first);
    std::getline(in, second);
    QCOMPARE(second, std::string("  \"format\": \"trainstudio-model\","));

    // Saving what we loaded reproduces the resource file byte for byte.
    const std::string again = dir + "/seed_again.json";
    QVERIFY(saveModelFile(*seed, again).ok());
    std::ifstream a(resource("seed_mlp.json")), b(again);
    const std::string textA((std::istreambuf_iterator<char>(a)), std::istreambuf_iterator<char>());
    const std::string textB((std::istreambuf_iterator<char>(b)), std::istreambuf_iterator<char>());
    QCOMPARE(textB, textA);

    // modelFromJson(modelToJson(x)) == x, name defaulting to the file's stem.
    json j = modelToJson(s);
    Result<ModelSpec> fromJ = modelFromJson(j, "whatever.json");
    QVERIFY(fromJ.ok());
    QCOMPARE(modelToJson(*fromJ), j);
    j.erase("name");
    QCOMPARE(modelFromJson(j, "/some/dir/my_model.json")->name, std::string("my_model"));
    std::filesystem::remove_all(dir);
}

void TestModel::loadErrors()
{
    Result<ModelSpec> r = loadModelFile("/nonexistent/dir/model.json");
    QVERIFY(!r.ok());
    QCOMPARE(r.error().code, ErrorCode::NotFound);
    QVERIFY(r.error().message.find("/nonexistent/dir/model.json") != std::string::npos);
    QVERIFY(!r.error().hint.empty());

    ModelSpec s;
    const Status st = saveModelFile(s, "/nonexistent/dir/model.json");
    QVERIFY(!st.ok());
    QCOMPARE(st.error().code, ErrorCode::IoError);
    QVERIFY(st.error().message.find("/nonexistent/dir/model.json") != std::string::npos);
}

void TestModel::kerasImport_data()
{
    QTest::addColumn<QString>("file");
    QTest::addColumn<QString>("name");
    QTest::addColumn<QString>("ids");      // layer ids in order
    QTest::addColumn<qlonglong>("params");
    QTest::addColumn<qlonglong>("trainable");
    QTest::addColumn<QString>("output");   // output shape

    QTest::newRow("mlp keras2") << "mlp_sequential_keras2.json" << "sequential"
                                << "dense_input dense dense_1" << 203530LL << 203530LL << "[10]";
    QTest::newRow("mlp keras3") << "mlp_sequential_keras3.json" << "sequential"
                                << "input_layer dense dropout dense_1" << 203530LL << 203530LL
                                << "[10]";
    QTest::newRow("cnn keras2 (no InputLayer)")
        << "cnn_sequential_keras2.json" << "sequential"
        << "conv2d_input conv2d max_pooling2d conv2d_1 max_pooling2d_1 flatten dense dense_1"
        << 225034LL << 225034LL << "[10]";
    // conv2d 144 + bn 64 + conv2d_1 2304 + bn 64 + conv2d_2 2304 + bn 64 + conv2d_3 4640
    // + dense 330; the three BNs hold 3 * 32 moving statistics.
    QTest::newRow("resnet keras2")
        << "resnet_functional_keras2.json" << "small_resnet"
        << "input_1 conv2d batch_normalization re_lu conv2d_1 batch_normalization_1 activation "
           "conv2d_2 batch_normalization_2 add leaky_re_lu conv2d_3 max_pooling2d "
           "global_average_pooling2d dropout dense"
        << 9914LL << 9818LL << "[10]";
    QTest::newRow("resnet keras3")
        << "resnet_functional_keras3.json" << "small_resnet"
        << "input_layer conv2d batch_normalization re_lu conv2d_1 batch_normalization_1 "
           "activation conv2d_2 batch_normalization_2 add leaky_re_lu conv2d_3 max_pooling2d "
           "global_average_pooling2d dropout dense"
        << 9914LL << 9818LL << "[10]";
    // conv_a 3*8+8 = 32, dense 176*32+32 = 5664, dense_1 32*10+10 = 330.
    QTest::newRow("branches keras2 (Model)")
        << "branches_functional_keras2.json" << "branches"
        << "input_1 conv_a pool_b concatenate leaky_re_lu max_pooling2d flatten dropout dense "
           "activation reshape flatten_1 dense_1 softmax"
        << 6026LL << 6026LL << "[10]";
}

void TestModel::kerasImport()
{
    QFETCH(QString, file);
    QFETCH(QString, name);
    QFETCH(QString, ids);
    QFETCH(qlonglong, params);
    QFETCH(qlonglong, trainable);
    QFETCH(QString, output);

    // Through the format detection of loadModelFile.
    Result<ModelSpec> r = loadModelFile(fixture(file.toStdString()));
    QVERIFY2(r.ok(), r.ok() ? "" : r.error().toString().c_str());
    const ModelSpec& s = *r;
    QCOMPARE(s.name, name.toStdString());
    QStringList got;
    for (const LayerSpec& l : s.layers)
        got << QString::fromStdString(l.id);
    QCOMPARE(got.join(' '), ids);
    const GraphAnalysis a = analyzeModel(s);
    QVERIFY2(a.ok(), allMessages(a).c_str());
    QCOMPARE(a.totalParams, int64_t(params));
    QCOMPARE(a.trainableParams, int64_t(trainable));
    QCOMPARE(a.outputNodes.size(), std::size_t(1));
    QCOMPARE(a.nodes[static_cast<std::size_t>(a.outputNodes[0])].outputShape,
             shapeOf(json::parse(output.toStdString())));
    // Imported attributes are the normalised ones, and positions go top to bottom.
    for (const LayerSpec& l : s.layers) {
        const NodeInfo& n = a.nodes[static_cast<std::size_t>(a.indexOf(l.id))];
        QCOMPARE(l.attrs, n.attrs);
        for (const std::string& in : l.inputs) {
            const auto producer = std::find_if(s.layers.begin(), s.layers.end(),
                                               [&](const LayerSpec& p) { return p.id == in; });
            QVERIFY(producer->y < l.y);
        }
    }
    // The same graph through modelFromKerasJson directly.
    std::ifstream in(fixture(file.toStdString()));
    Result<ModelSpec> direct = modelFromKerasJson(json::parse(in), "x.json");
    QVERIFY(direct.ok());
    QCOMPARE(modelToJson(*direct), modelToJson(s));
}

void TestModel::kerasKeras2EqualsKeras3()
{
    Result<ModelSpec> k2 = loadModelFile(fixture("resnet_functional_keras2.json"));
    Result<ModelSpec> k3 = loadModelFile(fixture("resnet_functional_keras3.json"));
    QVERIFY(k2.ok() && k3.ok());
    json a = structure(*k2), b = structure(*k3);
    // Only the input's auto-generated name differs.
    const std::string j2 = a.dump(), j3 = b.dump();
    QCOMPARE(std::regex_replace(j2, std::regex("input_1"), "input_layer"), j3);
    // tf.keras' BN axis [3] and Keras 3's -1 both normalise to -1; LeakyReLU's alpha and
    // negative_slope both arrive as alpha.
    const auto& bn = k2->layers[2];
    QCOMPARE(bn.type, std::string("BatchNormalization"));
    QCOMPARE(bn.attrs["axis"], json(-1));
    QCOMPARE(k3->layers[10].attrs, json({{"alpha", 0.1}}));
    QCOMPARE(k2->layers[9].inputs, std::vector<std::string>({"batch_normalization_2", "re_lu"}));
    QCOMPARE(k3->layers[9].inputs, std::vector<std::string>({"batch_normalization_2", "re_lu"}));
    QCOMPARE(k2->layers[11].attrs["strides"], json({2, 2}));
    QCOMPARE(k2->layers[11].attrs["padding"], json("same"));
    QCOMPARE(k2->layers[1].attrs["use_bias"], json(false));
    QVERIFY(k2->outputs.empty());  // the single sink
}

// Spellings real files use: activation objects and None, softmax_v2, int kernel sizes, a
// Keras 3 Sequential known only by build_input_shape, an HDF5 "model_config" wrapper.
void TestModel::kerasConfigForms()
{
    const json keras = json::parse(R"({"model_config": {"module": "keras", "class_name": "Sequential",
        "config": {"name": "forms", "build_input_shape": [null, 6, 6, 2], "layers": [
          {"module": "keras.layers", "class_name": "Conv2D", "config": {"name": "c", "filters": 3,
             "kernel_size": 3, "strides": 1, "padding": "same", "activation": {"module": "keras.activations",
             "class_name": "function", "config": "relu", "registered_name": "function"}}},
          {"module": "keras.layers", "class_name": "Flatten", "config": {"name": "f"}},
          {"module": "keras.layers", "class_name": "Dense", "config": {"name": "d", "units": 4, "activation": null}},
          {"module": "keras.layers", "class_name": "Activation", "config": {"name": "a", "activation": "softmax_v2"}}]}}})");
    Result<ModelSpec> r = modelFromKerasJson(keras, "forms.h5.json");
    QVERIFY2(r.ok(), r.ok() ? "" : r.error().toString().c_str());
    QCOMPARE(r->layers.size(), std::size_t(5));
    QCOMPARE(r->layers[0].id, std::string("c_input"));
    QCOMPARE(r->layers[0].attrs, json({{"shape", {6, 6, 2}}}));
    QCOMPARE(r->layers[1].attrs["activation"], json("relu"));
    QCOMPARE(r->layers[1].attrs["kernel_size"], json({3, 3}));
    QCOMPARE(r->layers[1].attrs["strides"], json({1, 1}));
    QCOMPARE(r->layers[3].attrs["activation"], json("linear"));
    QCOMPARE(r->layers[4].attrs["activation"], json("softmax"));
    const GraphAnalysis a = analyzeModel(*r);
    QVERIFY2(a.ok(), allMessages(a).c_str());
    QCOMPARE(a.nodes.back().outputShape, Shape({4}));
    QCOMPARE(a.totalParams, int64_t(3 * 3 * 2 * 3 + 3 + 6 * 6 * 3 * 4 + 4));
}

// Keras' mixed precision lives on the layers: a model built under mixed_float16 (tf.keras 2's
// Policy objects) or mixed_bfloat16 (Keras 3's DTypePolicy) imports with that policy as its
// precision, its float32-pinned Dense keeps dtype "float32", and export writes both back.
void TestModel::kerasDtypePolicies()
{
    Result<ModelSpec> mixed = loadModelFile(fixture("mixed_float16_functional_keras2.json"));
    QVERIFY2(mixed.ok(), mixed.ok() ? "" : mixed.error().toString().c_str());
    QCOMPARE(int(mixed->compile.precision), int(PrecisionPolicy::MixedFloat16));
    std::map<std::string, json> dtypes;
    for (const LayerSpec& l : mixed->layers)
        if (l.attrs.contains("dtype")) dtypes[l.id] = l.attrs["dtype"];
    QCOMPARE(dtypes, (std::map<std::string, json>{{"conv", "policy"}, {"hidden", "policy"}, {"dense_logits", "float32"}, {"predictions", "float32"}}));
    QVERIFY(analyzeModel(*mixed).ok());

    Result<json> exported = modelToKerasJson(*mixed);
    QVERIFY(exported.ok());
    std::map<std::string, json> written;
    for (const json& l : (*exported)["config"]["layers"]) written[l["config"]["name"].get<std::string>()] = l["config"]["dtype"];
    const json policy = {{"class_name", "Policy"}, {"config", {{"name", "mixed_float16"}}}};
    QCOMPARE(written["image"], json("float32"));  // the input tensor's dtype
    QCOMPARE(written["conv"], policy);
    QCOMPARE(written["flatten"], policy);
    QCOMPARE(written["dense_logits"], json("float32"));
    QCOMPARE(written["predictions"], json("float32"));
    // A float32 model writes plain "float32" everywhere, as before.
    ModelSpec plain = *mixed;
    plain.compile.precision = PrecisionPolicy::Float32;
    for (const json& l : (*modelToKerasJson(plain))["config"]["layers"]) QCOMPARE(l["config"]["dtype"], json("float32"));

    // Keras 3: DTypePolicy objects, mixed_bfloat16.
    const json keras3 = json::parse(R"({"module": "keras", "class_name": "Sequential", "config": {"name": "k3", "layers": [
        {"module": "keras.layers", "class_name": "InputLayer", "config": {"batch_shape": [null, 8], "dtype": "float32", "name": "in"}},
        {"module": "keras.layers", "class_name": "Dense", "config": {"name": "d", "units": 4, "dtype": {"module": "keras", "class_name": "DTypePolicy", "config": {"name": "mixed_bfloat16"}, "registered_name": null}}},
        {"module": "keras.layers", "class_name": "Softmax", "config": {"name": "s", "dtype": {"module": "keras", "class_name": "DTypePolicy", "config": {"name": "float32"}, "registered_name": null}}}]}})");
    Result<ModelSpec> k3 = modelFromKerasJson(keras3, "k3.json");
    QVERIFY2(k3.ok(), k3.ok() ? "" : k3.error().toString().c_str());
    QCOMPARE(int(k3->compile.precision), int(PrecisionPolicy::MixedBfloat16));
    QCOMPARE(k3->layers[1].attrs["dtype"], json("policy"));
    // Every layer float32 (the other fixtures): a float32 model, no layer pinned.
    Result<ModelSpec> f32 = loadModelFile(fixture("mlp_sequential_keras3.json"));
    QVERIFY(f32.ok());
    QCOMPARE(int(f32->compile.precision), int(PrecisionPolicy::Float32));
    for (const LayerSpec& l : f32->layers)
        if (l.type == "Dense") QCOMPARE(l.attrs["dtype"], json("policy"));
}

// Keras 3 writes compile()'s arguments as "compile_config" (model_from_json compiles the model
// with them), tf.keras 2's HDF5 files as "training_config": the optimizer and loss are the
// model's, with Keras' bookkeeping keys dropped.
namespace {
std::string keras3WithCompile(const std::string& compileConfig)
{
    return R"({"module": "keras", "class_name": "Sequential", "config": {"name": "c", "layers": [
        {"module": "keras.layers", "class_name": "InputLayer", "config": {"batch_shape": [null, 8], "dtype": "float32", "name": "in"}},
        {"module": "keras.layers", "class_name": "Dense", "config": {"name": "d", "units": 4, "activation": "softmax"}}]},
        "build_config": {"input_shape": [null, 8]}, "compile_config": )" + compileConfig + "}";
}
} // namespace

void TestModel::kerasCompileSettings()
{
    // Keras 3, objects: Adam(learning_rate=1e-4) and SparseCategoricalCrossentropy(from_logits=True).
    Result<ModelSpec> k3 = parseModelText(keras3WithCompile(R"({"optimizer": {"module": "keras.optimizers", "class_name": "Adam",
        "config": {"name": "adam", "learning_rate": 0.0001, "weight_decay": null, "clipnorm": null, "global_clipnorm": null,
                   "clipvalue": null, "use_ema": false, "ema_momentum": 0.99, "ema_overwrite_frequency": null,
                   "loss_scale_factor": null, "gradient_accumulation_steps": null, "beta_1": 0.8, "beta_2": 0.999,
                   "epsilon": 1e-07, "amsgrad": false}, "registered_name": null},
        "loss": {"module": "keras.losses", "class_name": "SparseCategoricalCrossentropy",
                 "config": {"name": "sparse_categorical_crossentropy", "reduction": "sum_over_batch_size", "from_logits": true, "ignore_class": null},
                 "registered_name": null},
        "loss_weights": null, "metrics": ["accuracy"], "weighted_metrics": null, "run_eagerly": false,
        "steps_per_execution": 1, "jit_compile": "auto"})"), "k3.json");
    QVERIFY2(k3.ok(), k3.ok() ? "" : k3.error().toString().c_str());
    QCOMPARE(k3->compile.optimizer.value("type", ""), std::string("adam"));
    QCOMPARE(k3->compile.optimizer.value("learning_rate", 0.0), double(0.0001f));
    QCOMPARE(k3->compile.optimizer.value("beta_1", 0.0), double(0.8f));
    QVERIFY(!k3->compile.optimizer.contains("name") && !k3->compile.optimizer.contains("use_ema"));
    QCOMPARE(k3->compile.loss, std::string("sparse_categorical_crossentropy"));
    QVERIFY(k3->compile.fromLogits);
    QCOMPARE(k3->compile.metrics, std::vector<std::string>{"accuracy"});

    // Keras 3, names; the loss as a serialised function; a LossScaleOptimizer with Keras' defaults.
    Result<ModelSpec> names = parseModelText(keras3WithCompile(R"({"optimizer": "sgd", "loss": "mse", "metrics": null})"), "n.json");
    QVERIFY2(names.ok(), names.ok() ? "" : names.error().toString().c_str());
    QCOMPARE(names->compile.optimizer.value("type", ""), std::string("sgd"));
    QCOMPARE(names->compile.optimizer.value("learning_rate", 0.0), double(0.01f));
    QCOMPARE(names->compile.loss, std::string("mean_squared_error"));
    Result<ModelSpec> wrapped = parseModelText(keras3WithCompile(R"({"optimizer": {"class_name": "LossScaleOptimizer", "config": {
        "inner_optimizer": {"module": "keras.optimizers", "class_name": "RMSprop", "config": {"name": "rmsprop", "learning_rate": 0.002,
            "weight_decay": null, "clipnorm": null, "global_clipnorm": null, "clipvalue": null, "use_ema": false, "ema_momentum": 0.99,
            "ema_overwrite_frequency": null, "loss_scale_factor": null, "gradient_accumulation_steps": null, "rho": 0.8, "momentum": 0.0,
            "epsilon": 1e-07, "centered": false}, "registered_name": null}, "initial_scale": 32768.0,
        "dynamic_growth_steps": 2000}}, "loss": {"module": "keras.losses", "class_name": "function",
        "config": "binary_crossentropy", "registered_name": "function"}})"), "w.json");
    QVERIFY2(wrapped.ok(), wrapped.ok() ? "" : wrapped.error().toString().c_str());
    QCOMPARE(wrapped->compile.optimizer.value("type", ""), std::string("rmsprop"));
    QCOMPARE(wrapped->compile.optimizer.value("rho", 0.0), double(0.8f));
    QCOMPARE(wrapped->compile.loss, std::string("binary_crossentropy"));
    QVERIFY(!wrapped->compile.fromLogits);

    // Keras' Adam with weight_decay decays decoupled: our adamw. SGD's with momentum would not match.
    Result<ModelSpec> decayed = parseModelText(keras3WithCompile(R"({"optimizer": {"class_name": "Adam", "config": {"learning_rate": 0.001,
        "weight_decay": 0.01}}})"), "d.json");
    QVERIFY2(decayed.ok(), decayed.ok() ? "" : decayed.error().toString().c_str());
    QCOMPARE(decayed->compile.optimizer.value("type", ""), std::string("adamw"));
    QCOMPARE(decayed->compile.optimizer.value("weight_decay", 0.0), double(0.01f));

    // Not compiled (compile_config null, the fixtures): our defaults.
    Result<ModelSpec> plain = loadModelFile(fixture("mlp_sequential_keras3.json"));
    QVERIFY(plain.ok());
    QCOMPARE(plain->compile, CompileSpec{});

    // tf.keras 2's HDF5 attributes: training_config next to model_config, "Custom>Adam", lr.
    const std::string h5 = R"({"keras_version": "2.15.0", "backend": "tensorflow",
        "model_config": {"class_name": "Sequential", "config": {"name": "s", "layers": [
            {"class_name": "InputLayer", "config": {"batch_input_shape": [null, 8], "dtype": "float32", "name": "in"}},
            {"class_name": "Dense", "config": {"name": "d", "units": 4, "activation": "softmax"}}]}},
        "training_config": {"loss": {"class_name": "CategoricalCrossentropy", "config": {"reduction": "auto", "name": "categorical_crossentropy",
                                     "from_logits": false, "label_smoothing": 0.0, "axis": -1}},
            "metrics": [[{"class_name": "MeanMetricWrapper", "config": {"name": "accuracy", "dtype": "float32", "fn": "categorical_accuracy"}}]],
            "weighted_metrics": null, "loss_weights": null,
            "optimizer_config": {"class_name": "Custom>SGD", "config": {"name": "SGD", "jit_compile": false, "is_legacy_optimizer": false,
                                 "lr": 0.05, "momentum": 0.9, "nesterov": true}}}})";
    Result<ModelSpec> k2 = parseModelText(h5, "h5.json");
    QVERIFY2(k2.ok(), k2.ok() ? "" : k2.error().toString().c_str());
    QCOMPARE(k2->compile.optimizer.value("type", ""), std::string("sgd"));
    QCOMPARE(k2->compile.optimizer.value("learning_rate", 0.0), double(0.05f));
    QCOMPARE(k2->compile.optimizer.value("momentum", 0.0), double(0.9f));
    QCOMPARE(k2->compile.optimizer.value("nesterov", false), true);
    QCOMPARE(k2->compile.loss, std::string("categorical_crossentropy"));
    QCOMPARE(k2->compile.metrics, std::vector<std::string>{"accuracy"});

    // Saved in our format, the settings stay.
    Result<ModelSpec> again = modelFromJson(modelToJson(*k3), "again.json");
    QVERIFY(again.ok());
    QCOMPARE(again->compile, k3->compile);
}

void TestModel::kerasCompileErrors_data()
{
    QTest::addColumn<QString>("compileConfig");
    QTest::addColumn<QString>("message");
    QTest::newRow("clipnorm") << R"({"optimizer": {"class_name": "Adam", "config": {"learning_rate": 0.001, "clipnorm": 1.0}}})"
                              << "c.json: compile_config.optimizer: optimizer 'adam': clipnorm = 1.0 would be ignored";
    QTest::newRow("schedule") << R"({"optimizer": {"class_name": "SGD", "config": {"learning_rate": {"module": "keras.optimizers.schedules",
                                   "class_name": "ExponentialDecay", "config": {"initial_learning_rate": 0.1}}}}})"
                              << "c.json: compile_config.optimizer: the learning rate is a schedule (ExponentialDecay)";
    QTest::newRow("unknown optimizer") << R"({"optimizer": "adagrad"})" << "c.json: compile_config.optimizer: unknown optimizer 'adagrad'";
    QTest::newRow("label smoothing") << R"({"loss": {"class_name": "CategoricalCrossentropy", "config": {"label_smoothing": 0.1}}})"
                                     << "c.json: compile_config.loss.config: label_smoothing = 0.1 would be ignored";
    QTest::newRow("unknown loss") << R"({"loss": "huber"})" << "c.json: compile_config.loss: loss 'huber' is not supported";
    QTest::newRow("loss weights") << R"({"loss": "mse", "loss_weights": [2.0]})" << "c.json: compile_config.loss_weights = [2.0] would be ignored";
    QTest::newRow("loss scale") << R"({"optimizer": {"class_name": "LossScaleOptimizer", "config": {"inner_optimizer": "adam", "initial_scale": 128}}})"
                                << "is not Keras' default dynamic loss scale";
    QTest::newRow("not an object") << R"("adam")" << "c.json: compile_config: expected an object, got string";
    QTest::newRow("sgd momentum decay") << R"({"optimizer": {"class_name": "SGD", "config": {"momentum": 0.9, "weight_decay": 0.0001}}})"
                                        << "SGD with momentum and weight_decay 0.0001 decays the weights apart from the momentum";
    QTest::newRow("rmsprop decay") << R"({"optimizer": {"class_name": "RMSprop", "config": {"weight_decay": 0.01}}})"
                                   << "optimizer 'rmsprop': weight_decay = 0.01 would be ignored";
    QTest::newRow("unreduced loss") << R"({"loss": {"class_name": "MeanSquaredError", "config": {"reduction": null}}})"
                                    << "compile_config.loss.config: reduction = null would be ignored";
}

void TestModel::kerasCompileErrors()
{
    QFETCH(QString, compileConfig);
    QFETCH(QString, message);
    Result<ModelSpec> r = parseModelText(keras3WithCompile(compileConfig.toStdString()), "c.json");
    QVERIFY(!r.ok());
    QVERIFY2(r.error().message.find(message.toStdString()) != std::string::npos, r.error().message.c_str());
    // The designer may want the architecture alone: the hint says how.
    QVERIFY2(r.error().hint.find("delete \"compile_config\" from the file to import the architecture alone") != std::string::npos,
             r.error().hint.c_str());
}

void TestModel::kerasImportErrors_data()
{
    QTest::addColumn<QString>("text");
    QTest::addColumn<QString>("message");

    const QString in = R"({"class_name": "InputLayer", "config": {"batch_input_shape": [null, 8], "name": "input_1"}, "name": "input_1", "inbound_nodes": []})";
    auto functional = [in](const QString& layer, const QString& output) {
        return QString(R"({"class_name": "Functional", "config": {"name": "m", "layers": [%1, %2],
            "input_layers": [["input_1", 0, 0]], "output_layers": [["%3", 0, 0]]}})")
            .arg(in, layer, output);
    };
    QTest::newRow("unknown class")
        << functional(R"({"class_name": "LSTM", "config": {"name": "lstm", "units": 4}, "name": "lstm", "inbound_nodes": [[["input_1", 0, 0, {}]]]})", "lstm")
        << "k.json: layer 'lstm' (LSTM): Keras layer class LSTM is not supported by TrainStudio";
    QTest::newRow("nested model")
        << functional(R"({"class_name": "Sequential", "config": {"name": "inner", "layers": []}, "name": "inner", "inbound_nodes": [[["input_1", 0, 0, {}]]]})", "inner")
        << "layer 'inner' (Sequential) is a nested model";
    QTest::newRow("shared layer")
        << functional(R"({"class_name": "Dense", "config": {"name": "d", "units": 4}, "name": "d", "inbound_nodes": [[["input_1", 0, 0, {}]], [["input_1", 0, 0, {}]]]})", "d")
        << "layer 'd' is called 2 times (a shared layer)";
    QTest::newRow("channels_first")
        << functional(R"({"class_name": "Flatten", "config": {"name": "f", "data_format": "channels_first"}, "name": "f", "inbound_nodes": [[["input_1", 0, 0, {}]]]})", "f")
        << "layer 'f' (Flatten) uses data_format \"channels_first\", which TrainStudio does not support";
    QTest::newRow("regulariser")
        << functional(R"({"class_name": "Dense", "config": {"name": "d", "units": 4, "kernel_regularizer": {"class_name": "L2", "config": {"l2": 0.01}}}, "name": "d", "inbound_nodes": [[["input_1", 0, 0, {}]]]})", "d")
        << "layer 'd' (Dense) uses kernel_regularizer";
    QTest::newRow("unsupported activation")
        << functional(R"({"class_name": "Dense", "config": {"name": "d", "units": 4, "activation": "swish"}, "name": "d", "inbound_nodes": [[["input_1", 0, 0, {}]]]})", "d")
        << "layer 'd' (Dense) uses activation 'swish'";
    QTest::newRow("dilated conv")
        << functional(R"({"class_name": "Conv2D", "config": {"name": "c", "filters": 2, "kernel_size": [3, 3], "dilation_rate": [2, 2]}, "name": "c", "inbound_nodes": [[["input_1", 0, 0, {}]]]})", "c")
        << "layer 'c' (Conv2D) uses dilation_rate [2,2]";
    QTest::newRow("float16 variables")
        << functional(R"({"class_name": "Dense", "config": {"name": "d", "units": 4, "dtype": "float16"}, "name": "d", "inbound_nodes": [[["input_1", 0, 0, {}]]]})", "d")
        << "layer 'd' (Dense) has dtype policy 'float16', which TrainStudio does not support";
    QTest::newRow("float64 policy object")
        << functional(R"({"class_name": "Dense", "config": {"name": "d", "units": 4, "dtype": {"module": "keras", "class_name": "DTypePolicy", "config": {"name": "float64"}, "registered_name": null}}, "name": "d", "inbound_nodes": [[["input_1", 0, 0, {}]]]})", "d")
        << "layer 'd' (Dense) has dtype policy 'float64'";
    QTest::newRow("two mixed policies")
        << QString(R"({"class_name": "Functional", "config": {"name": "m", "layers": [%1,
             {"class_name": "Dense", "config": {"name": "a", "units": 4, "dtype": {"class_name": "Policy", "config": {"name": "mixed_float16"}}}, "name": "a", "inbound_nodes": [[["input_1", 0, 0, {}]]]},
             {"class_name": "Dense", "config": {"name": "b", "units": 4, "dtype": {"class_name": "Policy", "config": {"name": "mixed_bfloat16"}}}, "name": "b", "inbound_nodes": [[["a", 0, 0, {}]]]}],
             "input_layers": [["input_1", 0, 0]], "output_layers": [["b", 0, 0]]}})").arg(in)
        << "the layers use two mixed-precision policies, mixed_float16 (layer 'a') and mixed_bfloat16 (layer 'b')";
    QTest::newRow("unknown input dim")
        << R"({"class_name": "Sequential", "config": {"name": "s", "layers": [{"class_name": "InputLayer", "config": {"batch_input_shape": [null, null, 3], "name": "in"}}]}})"
        << "layer 'in' (InputLayer) has an unknown (None) or invalid dimension";
    QTest::newRow("sequential without input shape")
        << R"({"class_name": "Sequential", "config": {"name": "s", "layers": [{"class_name": "Dense", "config": {"name": "d", "units": 3}}]}})"
        << "Sequential model has no input shape";
    QTest::newRow("subclassed model")
        << R"({"class_name": "MyModel", "config": {}})" << "top-level class 'MyModel'";
    QTest::newRow("no layers")
        << R"({"class_name": "Sequential", "config": {"name": "s", "layers": []}})"
        << "Sequential model 's' has no config.layers";
}

void TestModel::kerasImportErrors()
{
    QFETCH(QString, text);
    QFETCH(QString, message);
    Result<ModelSpec> r = parseModelText(text.toStdString(), "k.json");
    QVERIFY(!r.ok());
    QVERIFY2(r.error().message.find(message.toStdString()) != std::string::npos,
             r.error().message.c_str());
    QVERIFY2(r.error().message.rfind("k.json: ", 0) == 0, r.error().message.c_str());
    QVERIFY(!r.error().hint.empty());
}

void TestModel::kerasExportRoundTrip_data()
{
    QTest::addColumn<QString>("path");
    QTest::addColumn<QString>("expectedClass");
    QTest::newRow("mlp keras2") << QString::fromStdString(fixture("mlp_sequential_keras2.json"))
                                << "Sequential";
    QTest::newRow("mlp keras3") << QString::fromStdString(fixture("mlp_sequential_keras3.json"))
                                << "Sequential";
    QTest::newRow("cnn keras2") << QString::fromStdString(fixture("cnn_sequential_keras2.json"))
                                << "Sequential";
    QTest::newRow("resnet keras2")
        << QString::fromStdString(fixture("resnet_functional_keras2.json")) << "Functional";
    QTest::newRow("resnet keras3")
        << QString::fromStdString(fixture("resnet_functional_keras3.json")) << "Functional";
    QTest::newRow("branches") << QString::fromStdString(fixture("branches_functional_keras2.json"))
                              << "Functional";
    QTest::newRow("mixed float16") << QString::fromStdString(fixture("mixed_float16_functional_keras2.json")) << "Sequential";
    QTest::newRow("seed_mlp") << QString::fromStdString(resource("seed_mlp.json")) << "Sequential";
    QTest::newRow("small_cnn") << QString::fromStdString(resource("small_cnn.json"))
                               << "Sequential";
    QTest::newRow("small_resnet") << QString::fromStdString(resource("small_resnet.json"))
                                  << "Functional";
}

void TestModel::kerasExportRoundTrip()
{
    QFETCH(QString, path);
    QFETCH(QString, expectedClass);
    Result<ModelSpec> original = loadModelFile(path.toStdString());
    QVERIFY(original.ok());
    Result<json> exported = modelToKerasJson(*original);
    QVERIFY2(exported.ok(), exported.ok() ? "" : exported.error().toString().c_str());
    QCOMPARE(QString::fromStdString((*exported)["class_name"].get<std::string>()), expectedClass);
    QCOMPARE((*exported)["backend"], json("tensorflow"));
    if (expectedClass == "Functional") {
        QVERIFY((*exported)["config"]["input_layers"].is_array());
        QVERIFY((*exported)["config"]["layers"][1]["inbound_nodes"][0][0].is_array());
    } else {
        QCOMPARE((*exported)["config"]["layers"][0]["class_name"], json("InputLayer"));
    }

    // Through text, as a file would go.
    Result<ModelSpec> back = parseModelText(exported->dump(), "exported.json");
    QVERIFY2(back.ok(), back.ok() ? "" : back.error().toString().c_str());
    if (path.contains("/fixtures/")) {
        // Imported models carry normalised attributes: the round trip is exact.
        QCOMPARE(modelToJson(*back), modelToJson(*original));
    } else {
        // Our files may leave defaults out: compare the analyses.
        const GraphAnalysis a = analyzeModel(*original), b = analyzeModel(*back);
        QVERIFY(b.ok());
        QCOMPARE(b.nodes.size(), a.nodes.size());
        for (std::size_t k = 0; k < a.nodes.size(); ++k) {
            QCOMPARE(b.nodes[k].id, a.nodes[k].id);
            QCOMPARE(b.nodes[k].type, a.nodes[k].type);
            QCOMPARE(b.nodes[k].attrs, a.nodes[k].attrs);
            QCOMPARE(b.nodes[k].inputs, a.nodes[k].inputs);
            QCOMPARE(b.nodes[k].outputShape, a.nodes[k].outputShape);
        }
        QCOMPARE(b.totalParams, a.totalParams);
        QCOMPARE(back->name, original->name);
        // Exporting again gives the same document.
        QCOMPARE(*modelToKerasJson(*back), *exported);
    }
}

void TestModel::resourceModels_data()
{
    QTest::addColumn<QString>("file");
    QTest::addColumn<qlonglong>("params");
    QTest::addColumn<qlonglong>("trainable");
    QTest::addColumn<qlonglong>("batch");
    QTest::newRow("seed_mlp") << "seed_mlp.json" << 203530LL << 203530LL << 256LL;
    QTest::newRow("small_cnn") << "small_cnn.json" << 225034LL << 225034LL << 128LL;
    // convs 144 + 2304 + 2304 + 4608 + 9216 + 512, BN 4 * (16 * 3 + 32 * 3), dense 330;
    // BN moving statistics 2 * (16 * 3 + 32 * 3) = 288 are not trainable.
    QTest::newRow("small_resnet") << "small_resnet.json" << 19994LL << 19706LL << 128LL;
}

void TestModel::resourceModels()
{
    QFETCH(QString, file);
    QFETCH(qlonglong, params);
    QFETCH(qlonglong, trainable);
    QFETCH(qlonglong, batch);
    Result<ModelSpec> r = loadModelFile(resource(file.toStdString()));
    QVERIFY2(r.ok(), r.ok() ? "" : r.error().toString().c_str());
    const GraphAnalysis a = analyzeModel(*r);
    QVERIFY2(a.ok(), allMessages(a).c_str());
    QCOMPARE(a.totalParams, int64_t(params));
    QCOMPARE(a.trainableParams, int64_t(trainable));
    QCOMPARE(r->compile.batchSize, int64_t(batch));
    QCOMPARE(r->compile.optimizer["type"], json("adam"));
    QCOMPARE(r->compile.loss, std::string("sparse_categorical_crossentropy"));
    QVERIFY(!r->compile.fromLogits);
    QCOMPARE(a.inputNodes.size(), std::size_t(1));
    QCOMPARE(a.outputNodes.size(), std::size_t(1));
    QCOMPARE(a.nodes[static_cast<std::size_t>(a.outputNodes[0])].outputShape, Shape({10}));
    QCOMPARE(a.nodes[static_cast<std::size_t>(a.outputNodes[0])].attrs["activation"],
             json("softmax"));
    // Designer positions: every node below its inputs, none on top of another.
    std::set<std::pair<double, double>> positions;
    for (const LayerSpec& l : r->layers) {
        QVERIFY2(positions.insert({l.x, l.y}).second, l.id.c_str());
        for (const std::string& in : l.inputs)
            for (const LayerSpec& p : r->layers)
                if (p.id == in)
                    QVERIFY2(p.y < l.y, l.id.c_str());
    }
    if (file == "small_resnet.json") {
        int adds = 0, bns = 0;
        for (const NodeInfo& n : a.nodes) {
            adds += n.type == "Add";
            bns += n.type == "BatchNormalization";
            if (n.type == "Conv2D")
                QCOMPARE(n.attrs["padding"], json("same"));
        }
        QCOMPARE(adds, 2);
        QCOMPARE(bns, 6);
        QCOMPARE(a.nodes[static_cast<std::size_t>(a.indexOf("global_average_pooling2d"))]
                     .outputShape,
                 Shape({32}));
    }
}

QTEST_APPLESS_MAIN(TestModel)
#include "tst_model.moc"
