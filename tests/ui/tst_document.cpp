// The designer's document (no widgets): every edit is one undo command that records only what
// it changes, undo/redo restore the exact spec, attribute typing merges into one step, renames
// and deletions keep inputs and outputs consistent, connections refuse cycles and impossible
// inputs, pasted layers get fresh ids, analysis runs once per event-loop pass, ids follow Keras,
// auto-layout goes top to bottom, and the Keras script builds the same model (checked by running
// it against a recording stand-in for tensorflow when python3 is available).

#include <QtTest>

#include <QProcess>
#include <QStandardPaths>
#include <QTemporaryDir>
#include <QUndoStack>

#include <set>

#include "designer/autolayout.h"
#include "designer/kerasscript.h"
#include "designer/modeldocument.h"
#include "ui/ui_helpers.h"

using namespace ts;
using nlohmann::json;

class TestDocument : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void initTestCase();
    void addConnectUndoRedo();
    void attributeTypingMergesIntoOneStep();
    void deltasNameOnlyWhatChanged();
    void removeKeepsInputsAndOutputsConsistent();
    void renameUpdatesReferences();
    void connectionRules();
    void insertLayersRenamesAndRemaps();
    void duplicateIdsInFileAreRenamed();
    void kerasFileIsAnImport();
    void analysisCoalesces();
    void kerasStyleIds();
    void autoLayoutTopToBottom_data();
    void autoLayoutTopToBottom();
    void kerasScriptBuildsSameModel_data();
    void kerasScriptBuildsSameModel();
    void kerasScriptRefusesBrokenModel();

private:
    QTemporaryDir m_tmp;
};

namespace {

using uitest::resourceModel;

json specJson(const ModelSpec& s)
{
    return modelToJson(s);
}

} // namespace

void TestDocument::initTestCase()
{
    uitest::isolateSettings();
    QVERIFY(m_tmp.isValid());
}

void TestDocument::addConnectUndoRedo()
{
    ModelDocument doc;
    QUndoStack* undo = doc.undoStack();
    const std::string in = doc.addLayer("Input", {0, 0});
    const std::string d1 = doc.addLayer("Dense", {0, 120});
    QCOMPARE(in, std::string("input"));
    QCOMPARE(d1, std::string("dense"));
    QVERIFY(doc.connectLayers(in, d1));
    QVERIFY(doc.setAttribute(d1, "units", 10));
    QCOMPARE(undo->count(), 4);
    const json full = specJson(doc.spec());
    QVERIFY(doc.isModified());
    QVERIFY(doc.analysis().ok());

    while (undo->canUndo())
        undo->undo();
    QVERIFY(doc.spec().layers.empty());
    QVERIFY(!doc.isModified());
    while (undo->canRedo())
        undo->redo();
    QCOMPARE(specJson(doc.spec()), full);
    QCOMPARE(doc.nodeInfo("dense")->outputShape, Shape({10}));
}

void TestDocument::attributeTypingMergesIntoOneStep()
{
    ModelDocument doc;
    doc.reset(resourceModel("seed_mlp"));
    // Typing "128" into a spin box: 1, 12, 128.
    for (int v : {1, 12, 128})
        QVERIFY(doc.setAttribute("dense", "units", v));
    QCOMPARE(doc.undoStack()->count(), 1);
    QCOMPARE(doc.layer("dense")->attrs["units"], json(128));
    // Another attribute is another step.
    QVERIFY(doc.setAttribute("dense", "activation", "tanh"));
    QCOMPARE(doc.undoStack()->count(), 2);
    doc.undoStack()->undo();
    doc.undoStack()->undo();
    QCOMPARE(doc.layer("dense")->attrs["units"], json(256));
    QVERIFY(!doc.isModified());
    // Typing a value back to where it was leaves nothing to undo.
    doc.undoStack()->clear();
    QVERIFY(doc.setAttribute("dense", "units", 25));
    QVERIFY(doc.setAttribute("dense", "units", 256));
    QCOMPARE(doc.undoStack()->count(), 0);
    // Setting the same value is no edit at all.
    QVERIFY(!doc.setAttribute("dense", "units", 256));
}

void TestDocument::deltasNameOnlyWhatChanged()
{
    ModelDocument doc;
    doc.reset(resourceModel("small_cnn"));
    std::vector<DocumentDelta> deltas;
    connect(&doc, &ModelDocument::layersChanged, this, [&](const DocumentDelta& d) { deltas.push_back(d); });

    QVERIFY(doc.moveLayers({{"conv2d", QPointF(50, 100)}}));
    QCOMPARE(deltas.size(), std::size_t(1));
    QCOMPARE(deltas[0].changed, std::vector<std::string>{"conv2d"});
    QVERIFY(!deltas[0].structural);  // a move needs no new analysis
    QVERIFY(!doc.analysisPending());

    deltas.clear();
    QVERIFY(doc.setAttribute("dense", "units", 64));
    QCOMPARE(deltas.size(), std::size_t(1));
    QCOMPARE(deltas[0].changed, std::vector<std::string>{"dense"});
    QVERIFY(deltas[0].structural);
    QVERIFY(doc.analysisPending());

    deltas.clear();
    QVERIFY(doc.removeLayers({"dense"}));
    QCOMPARE(deltas[0].removed, std::vector<std::string>{"dense"});
    QCOMPARE(deltas[0].changed, std::vector<std::string>{"dense_1"});  // lost its input
    deltas.clear();
    doc.undoStack()->undo();
    QCOMPARE(deltas[0].added, std::vector<std::string>{"dense"});
    QCOMPARE(deltas[0].changed, std::vector<std::string>{"dense_1"});
    QCOMPARE(specJson(doc.spec())["layers"], specJson([&] {
                 ModelSpec s = resourceModel("small_cnn");
                 s.layers[1].x = 50;
                 s.layers[1].y = 100;
                 s.layers[6].attrs["units"] = 64;
                 return s;
             }())["layers"]);
}

void TestDocument::removeKeepsInputsAndOutputsConsistent()
{
    ModelDocument doc;
    doc.reset(resourceModel("small_resnet"));
    const json before = specJson(doc.spec());
    // re_lu_2 feeds conv2d_3 and conv2d_5 (the shortcut); "dense" is the declared output.
    QVERIFY(doc.removeLayers({"re_lu_2", "dense"}));
    for (const LayerSpec& l : doc.spec().layers)
        for (const std::string& in : l.inputs)
            QVERIFY2(in != "re_lu_2" && in != "dense", l.id.c_str());
    QVERIFY(doc.spec().outputs.empty());
    QCOMPARE(doc.undoStack()->count(), 1);
    doc.undoStack()->undo();
    QCOMPARE(specJson(doc.spec()), before);  // same order, same inputs, same outputs
}

void TestDocument::renameUpdatesReferences()
{
    ModelDocument doc;
    doc.reset(resourceModel("seed_mlp"));
    QString why;
    QVERIFY(!doc.renameLayer("dense", "dense_1", &why));
    QVERIFY(why.contains(QLatin1String("already")));
    QVERIFY(!doc.renameLayer("dense", "has space", &why));
    QVERIFY(doc.renameLayer("dense_1", "logits", &why));
    QCOMPARE(doc.spec().outputs, std::vector<std::string>{"logits"});
    QVERIFY(doc.renameLayer("dense", "hidden"));
    QCOMPARE(doc.layer("logits")->inputs, std::vector<std::string>{"hidden"});
    QVERIFY(doc.analysis().ok());
    doc.undoStack()->undo();
    doc.undoStack()->undo();
    QCOMPARE(specJson(doc.spec()), specJson(resourceModel("seed_mlp")));
}

void TestDocument::connectionRules()
{
    ModelDocument doc;
    doc.reset(resourceModel("seed_mlp"));
    QString why;
    QVERIFY(!doc.connectLayers("dense_1", "input", -1, &why));  // Input takes no inputs
    QVERIFY(why.contains(QLatin1String("no inputs")));
    QVERIFY(!doc.connectLayers("dense_1", "dense", -1, &why));  // would make a cycle
    QVERIFY(why.contains(QLatin1String("cycle")));
    QVERIFY(!doc.connectLayers("dense", "dense", -1, &why));
    QVERIFY(!doc.connectLayers("input", "dense", 0, &why));  // already connected
    QCOMPARE(doc.undoStack()->count(), 0);
    // A single-input layer: connecting replaces its input.
    QVERIFY(doc.connectLayers("input", "dense_1"));
    QCOMPARE(doc.layer("dense_1")->inputs, std::vector<std::string>{"input"});
    // Merge layers append; an explicit slot past the end appends too.
    const std::string add = doc.addLayer("Add", {0, 360});
    QVERIFY(doc.connectLayers("dense", add));
    QVERIFY(doc.connectLayers("dense_1", add, 5));
    QCOMPARE(doc.layer(add)->inputs, (std::vector<std::string>{"dense", "dense_1"}));
    QVERIFY(doc.disconnectInput(add, 0));
    QCOMPARE(doc.layer(add)->inputs, std::vector<std::string>{"dense_1"});
    QVERIFY(!doc.disconnectInput(add, 3));
}

void TestDocument::insertLayersRenamesAndRemaps()
{
    ModelDocument doc;
    doc.reset(resourceModel("seed_mlp"));
    const json clip = doc.layersToJson({"dense", "dense_1"});
    Result<std::vector<LayerSpec>> layers = ModelDocument::layersFromJson(clip.dump());
    QVERIFY(layers.ok());
    const std::vector<std::string> ids = doc.insertLayers(layers.value(), QPointF(40, 40), QStringLiteral("Paste"));
    QCOMPARE(ids, (std::vector<std::string>{"dense_2", "dense_3"}));
    QVERIFY(doc.layer("dense_2")->inputs.empty());  // "input" was outside the copied set
    QCOMPARE(doc.layer("dense_3")->inputs, std::vector<std::string>{"dense_2"});
    QCOMPARE(doc.layer("dense_3")->x, 40.0);
    QCOMPARE(doc.layer("dense_3")->y, 280.0);
    QCOMPARE(doc.undoStack()->count(), 1);
    // Into an empty model, free ids are kept.
    ModelDocument other;
    QCOMPARE(other.insertLayers(layers.value(), {}, {}), (std::vector<std::string>{"dense", "dense_1"}));
    QCOMPARE(other.layer("dense_1")->inputs, std::vector<std::string>{"dense"});
}

void TestDocument::duplicateIdsInFileAreRenamed()
{
    const QString path = m_tmp.filePath(QStringLiteral("dup.json"));
    QFile f(path);
    QVERIFY(f.open(QIODevice::WriteOnly));
    f.write(R"({"format": "trainstudio-model", "version": 1, "layers": [
        {"id": "input", "type": "Input", "attrs": {"shape": [4]}},
        {"id": "dense", "type": "Dense", "inputs": ["input"], "attrs": {"units": 3}},
        {"id": "dense", "type": "Dense", "inputs": ["input"], "attrs": {"units": 2}}]})");
    f.close();
    ModelDocument doc;
    QVERIFY(doc.open(path).ok());
    QCOMPARE(doc.spec().layers[2].id, std::string("dense_1"));
    QVERIFY(doc.isModified());
    QCOMPARE(doc.undoStack()->count(), 1);
    doc.undoStack()->undo();
    QCOMPARE(doc.spec().layers[2].id, std::string("dense"));
}

void TestDocument::kerasFileIsAnImport()
{
    ModelDocument doc;
    const QString path = QString::fromStdString(std::string(TS_FIXTURES_DIR) + "/keras/mlp_sequential_keras2.json");
    QVERIFY(doc.open(path).ok());
    QVERIFY(doc.filePath().isEmpty());  // Save must not overwrite the Keras file
    QCOMPARE(doc.importedFrom(), path);
    QVERIFY(doc.isModified());
    QVERIFY(doc.analysis().ok());
    const QString saved = m_tmp.filePath(QStringLiteral("imported.json"));
    QVERIFY(doc.save(saved).ok());
    QVERIFY(!doc.isModified());
    ModelDocument again;
    QVERIFY(again.open(saved).ok());
    QCOMPARE(specJson(again.spec()), specJson(doc.spec()));
    QVERIFY(!again.isModified());

    ModelDocument broken;
    QFile bad(m_tmp.filePath(QStringLiteral("bad.json")));
    QVERIFY(bad.open(QIODevice::WriteOnly));
    bad.write("{\"format\": \"trainstudio-model\", \"layers\": [}");
    bad.close();
    const Status s = broken.open(bad.fileName());
    QVERIFY(!s.ok());
    QVERIFY(s.error().message.find("bad.json:1:") != std::string::npos);
}

void TestDocument::analysisCoalesces()
{
    ModelDocument doc;
    doc.reset(resourceModel("small_cnn"));
    const int runs = doc.analysisCount();
    QSignalSpy updated(&doc, &ModelDocument::analysisUpdated);
    for (int v = 1; v <= 20; ++v)
        doc.setAttribute("dense", "units", v);
    QCOMPARE(doc.analysisCount(), runs);  // nothing yet: deferred to the event loop
    QTRY_COMPARE(updated.count(), 1);
    QCOMPARE(doc.analysisCount(), runs + 1);
    QCOMPARE(doc.nodeInfo("dense")->outputShape, Shape({20}));
}

void TestDocument::kerasStyleIds()
{
    // Keras' default layer names (to_snake_case of the class).
    const std::map<std::string, std::string> expected = {
        {"Input", "input"}, {"Dense", "dense"}, {"Conv2D", "conv2d"},
        {"MaxPooling2D", "max_pooling2d"}, {"AveragePooling2D", "average_pooling2d"},
        {"GlobalAveragePooling2D", "global_average_pooling2d"}, {"Flatten", "flatten"},
        {"Reshape", "reshape"}, {"Dropout", "dropout"}, {"BatchNormalization", "batch_normalization"},
        {"Activation", "activation"}, {"ReLU", "re_lu"}, {"LeakyReLU", "leaky_re_lu"},
        {"Softmax", "softmax"}, {"Add", "add"}, {"Concatenate", "concatenate"}};
    for (const LayerKind& k : layerCatalogue()) {
        QVERIFY2(expected.count(k.type), k.type.c_str());
        QCOMPARE(ModelDocument::baseIdForType(k.type), expected.at(k.type));
    }
    ModelDocument doc;
    doc.reset(resourceModel("small_resnet"));
    QCOMPARE(doc.uniqueId("ReLU"), std::string("re_lu_5"));
    QCOMPARE(doc.uniqueId("Dropout"), std::string("dropout"));
}

void TestDocument::autoLayoutTopToBottom_data()
{
    QTest::addColumn<QString>("name");
    for (const char* n : {"seed_mlp", "small_cnn", "small_resnet"})
        QTest::newRow(n) << QString::fromLatin1(n);
}

void TestDocument::autoLayoutTopToBottom()
{
    QFETCH(QString, name);
    ModelDocument doc;
    ModelSpec spec = resourceModel(name.toStdString());
    for (LayerSpec& l : spec.layers)
        l.x = l.y = 0;  // everything on one spot
    doc.reset(spec);
    QVERIFY(doc.autoLayout());
    QCOMPARE(doc.undoStack()->count(), 1);
    const ModelSpec& s = doc.spec();
    for (const LayerSpec& l : s.layers)
        for (const std::string& in : l.inputs)
            QVERIFY2(doc.layer(in)->y < l.y, (in + " -> " + l.id).c_str());
    // No two nodes (180 wide, under 100 tall) overlap.
    for (std::size_t i = 0; i < s.layers.size(); ++i)
        for (std::size_t k = i + 1; k < s.layers.size(); ++k) {
            const bool apart = std::abs(s.layers[i].x - s.layers[k].x) >= 180
                               || std::abs(s.layers[i].y - s.layers[k].y) >= 100;
            QVERIFY2(apart, (s.layers[i].id + " overlaps " + s.layers[k].id).c_str());
        }
    // A chain is a straight column.
    if (name == QLatin1String("seed_mlp") || name == QLatin1String("small_cnn"))
        for (const LayerSpec& l : s.layers)
            QCOMPARE(l.x, s.layers.front().x);
}

void TestDocument::kerasScriptBuildsSameModel_data()
{
    QTest::addColumn<QString>("path");
    for (const char* n : {"seed_mlp", "small_cnn", "small_resnet"})
        QTest::newRow(n) << QString::fromStdString(uitest::sourcePath("resources/models/" + std::string(n) + ".json"));
    for (const char* n : {"branches_functional_keras2", "resnet_functional_keras3", "cnn_sequential_keras2", "mixed_float16_functional_keras2"})
        QTest::newRow(n) << QString::fromStdString(std::string(TS_FIXTURES_DIR) + "/keras/" + n + ".json");
}

void TestDocument::kerasScriptBuildsSameModel()
{
    QFETCH(QString, path);
    Result<ModelSpec> spec = loadModelFile(path.toStdString());
    QVERIFY(spec.ok());
    Result<std::string> script = kerasScript(spec.value());
    QVERIFY2(script.ok(), script.ok() ? "" : script.error().toString().c_str());
    const std::string& text = script.value();
    QVERIFY(text.find("def build_model():") != std::string::npos);
    QVERIFY(text.find("model.fit(") != std::string::npos);
    QVERIFY(text.find("fashion_mnist") != std::string::npos);

    const QString python = QStandardPaths::findExecutable(QStringLiteral("python3"));
    if (python.isEmpty())
        QSKIP("python3 is not installed: the script's structure was checked, not run");

    // A stand-in for tensorflow that records layers, calls and compile settings, so the script
    // runs here (no TensorFlow) and what it builds can be compared with the spec.
    QTemporaryDir dir;
    QVERIFY(dir.isValid());
    QDir(dir.path()).mkpath(QStringLiteral("tensorflow/keras"));
    auto write = [&](const QString& rel, const char* content) {
        QFile f(dir.filePath(rel));
        QVERIFY(f.open(QIODevice::WriteOnly));
        f.write(content);
    };
    write(QStringLiteral("tensorflow/__init__.py"), R"PY(
from . import keras
class nn:
    @staticmethod
    def leaky_relu(x, alpha=0.2):
        return x
)PY");
    write(QStringLiteral("tensorflow/keras/__init__.py"), R"PY(
__version__ = "2.15.0"
RECORD = {"layers": [], "compile": None}
class Tensor:
    def __init__(self, layer):
        self.layer = layer
class Layer:
    def __init__(self, cls, args, kwargs):
        self.cls, self.args, self.kwargs = cls, list(args), dict(kwargs)
        self.inbound = []
        RECORD["layers"].append(self)
    def __call__(self, x):
        xs = x if isinstance(x, list) else [x]
        self.inbound = [t.layer.kwargs["name"] for t in xs]
        return Tensor(self)
def Input(shape, name):
    layer = Layer("InputLayer", [], {"shape": list(shape), "name": name})
    return Tensor(layer)
class Model:
    def __init__(self, inputs, outputs, name):
        as_list = lambda v: v if isinstance(v, list) else [v]
        RECORD["model"] = {"name": name,
                           "inputs": [t.layer.kwargs["name"] for t in as_list(inputs)],
                           "outputs": [t.layer.kwargs["name"] for t in as_list(outputs)]}
    def compile(self, optimizer, loss, metrics):
        RECORD["compile"] = {"optimizer": optimizer, "loss": loss, "metrics": metrics}
class _Factory:
    def __init__(self, kind):
        self.kind = kind
    def __getattr__(self, cls):
        return lambda *a, **k: {"class": cls, "kind": self.kind, "args": list(a), "kwargs": k}
optimizers = _Factory("optimizer")
losses = _Factory("loss")
class mixed_precision:
    @staticmethod
    def set_global_policy(name):
        RECORD["policy"] = name
from . import layers
)PY");
    write(QStringLiteral("tensorflow/keras/layers.py"), R"PY(
from . import Layer
def __getattr__(cls):
    return lambda *args, **kwargs: Layer(cls, args, kwargs)
)PY");
    write(QStringLiteral("numpy.py"), "# only the data loading uses numpy; not called here\n");
    write(QStringLiteral("model.py"), text.c_str());
    write(QStringLiteral("driver.py"), R"PY(
import json, sys
sys.path.insert(0, sys.argv[1])
import model
from tensorflow import keras
m = model.build_model()
model.compile_model(m)
out = {"layers": [], "model": keras.RECORD["model"], "compile": keras.RECORD["compile"], "policy": keras.RECORD.get("policy")}
for l in keras.RECORD["layers"]:
    kw = dict(l.kwargs)
    for k, v in list(kw.items()):
        if callable(v):
            kw[k] = "<callable>"
    out["layers"].append({"class": l.cls, "args": l.args, "kwargs": kw, "inbound": l.inbound})
print(json.dumps(out))
)PY");
    QProcess p;
    p.setWorkingDirectory(dir.path());
    p.start(python, {dir.filePath(QStringLiteral("driver.py")), dir.path()});
    QVERIFY(p.waitForFinished(20000));
    QVERIFY2(p.exitCode() == 0, p.readAllStandardError().constData());
    const json out = json::parse(p.readAllStandardOutput().toStdString());

    // Same layers, classes, names, wiring and attributes as the analysed spec.
    const GraphAnalysis a = analyzeModel(spec.value());
    QCOMPARE(out["layers"].size(), a.nodes.size());
    for (std::size_t i = 0; i < a.nodes.size(); ++i) {
        const NodeInfo& n = a.nodes[i];
        const json& l = out["layers"][i];
        QCOMPARE(l["kwargs"]["name"].get<std::string>(), n.id);
        QCOMPARE(l["class"].get<std::string>(), n.type == "Input" ? std::string("InputLayer") : n.type);
        std::vector<std::string> inbound;
        for (int k : n.inputs)
            inbound.push_back(a.nodes[static_cast<std::size_t>(k)].id);
        QCOMPARE(l["inbound"].get<std::vector<std::string>>(), inbound);
        const json& at = n.attrs;
        const json& kw = l["kwargs"];
        if (n.type == "Input")
            QCOMPARE(kw["shape"], at["shape"]);
        if (n.type == "Dense") {
            QCOMPARE(l["args"][0], at["units"]);
            QCOMPARE(kw["use_bias"], at["use_bias"]);
        }
        if (n.type == "Conv2D") {
            QCOMPARE(l["args"][0], at["filters"]);
            QCOMPARE(kw["kernel_size"], at["kernel_size"]);
            QCOMPARE(kw["strides"], at["strides"]);
            QCOMPARE(kw["padding"], at["padding"]);
        }
        if (n.type == "MaxPooling2D" || n.type == "AveragePooling2D") {
            QCOMPARE(kw["pool_size"], at["pool_size"]);
            QCOMPARE(kw["strides"], at["strides"]);
        }
        if (n.type == "BatchNormalization") {
            QCOMPARE(kw["momentum"], at["momentum"]);
            QCOMPARE(kw["epsilon"], at["epsilon"]);
        }
        // Pinned layers say dtype="float32"; nothing else names a dtype.
        const bool pinned = at.value("dtype", std::string()) == "float32";
        QCOMPARE(kw.value("dtype", json()), pinned ? json("float32") : json());
        if (at.contains("activation") && at["activation"] != "leaky_relu")
            QCOMPARE(kw.contains("activation") ? kw["activation"] : l["args"][0], at["activation"]);
    }
    std::vector<std::string> outputs;
    for (int k : a.outputNodes)
        outputs.push_back(a.nodes[static_cast<std::size_t>(k)].id);
    QCOMPARE(out["model"]["outputs"].get<std::vector<std::string>>(), outputs);
    QCOMPARE(out["model"]["name"].get<std::string>(), spec.value().name);
    // The model's mixed policy is set before any layer is built; a float32 model sets none.
    QCOMPARE(out["policy"], spec.value().compile.precision == PrecisionPolicy::Float32 ? json() : json(precisionPolicyName(spec.value().compile.precision)));
    const json& c = out["compile"];
    const json& opt = spec.value().compile.optimizer;
    QCOMPARE(c["optimizer"]["kwargs"]["learning_rate"], opt["learning_rate"]);
    QCOMPARE(c["loss"]["kwargs"]["from_logits"].get<bool>(), spec.value().compile.fromLogits);
    QCOMPARE(c["metrics"].get<std::vector<std::string>>(), spec.value().compile.metrics);
}

void TestDocument::kerasScriptRefusesBrokenModel()
{
    ModelSpec s = resourceModel("seed_mlp");
    s.layers[1].inputs.clear();
    Result<std::string> script = kerasScript(s);
    QVERIFY(!script.ok());
    QVERIFY(script.error().message.find("dense") != std::string::npos);
    QCOMPARE(pythonIdentifier("dense-1"), std::string("dense_1"));
    QCOMPARE(pythonIdentifier("class"), std::string("class_"));
    QCOMPARE(pythonIdentifier("1x"), std::string("layer_1x"));
}

QTEST_MAIN(TestDocument)
#include "tst_document.moc"
