// The designer through its widgets, offscreen: build the seed's MLP by dragging layers from the
// palette and connecting ports with the mouse, edit attributes in the inspector, read the shapes
// on the edges, produce a shape error (node marked, Train disabled with the reason) and fix it,
// undo everything back to an empty model and redo it, save and reload, import the Keras
// fixtures, instantiate the templates, edit with the keyboard (copy, paste, duplicate, delete,
// select all, nudge), move with the mouse, zoom and fit, the unsaved-changes prompt, recent
// files, the screenshot, and a few-hundred-layer model staying fast.

#include <QtTest>

#include <QApplication>
#include <QCheckBox>
#include <QClipboard>
#include <QComboBox>
#include <QDir>
#include <QElapsedTimer>
#include <QLabel>
#include <QLineEdit>
#include <QMessageBox>
#include <QNativeGestureEvent>
#include <QPushButton>
#include <QSpinBox>
#include <QTemporaryDir>
#include <QTimer>
#include <QToolButton>
#include <QUndoView>
#include <QUndoStack>
#include <QWheelEvent>

#include "designer/designerscene.h"
#include "designer/designerview.h"
#include "designer/edgeitem.h"
#include "designer/format.h"
#include "designer/inspector.h"
#include "designer/modeldocument.h"
#include "designer/nodeitem.h"
#include "mainwindow.h"
#include "models/problemsmodel.h"
#include "ui/ui_helpers.h"

using namespace ts;
using nlohmann::json;

class TestDesigner : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void initTestCase();
    void buildSeedMlpWithTheMouse();
    void templates_data();
    void templates();
    void kerasImport_data();
    void kerasImport();
    void inspectorEditors();
    void keyboardEditing();
    void mouseMoveSelectAndReconnect();
    void zoomPanFit();
    void unsavedChangesPrompt();
    void recentFiles();
    void screenshot();
    void largeModelStaysFast();

private:
    QTemporaryDir m_tmp;
};

namespace {

using uitest::resourceModel;

void settle(ModelDocument* doc)
{
    QCoreApplication::processEvents();
    doc->analysis();
    QCoreApplication::processEvents();
}

// The scene shows exactly the document: one node per layer at its position, one edge per
// resolvable input, annotations matching the analysis.
bool sceneMatchesDocument(MainWindow& w, QString* why)
{
    ModelDocument* doc = w.document();
    DesignerScene* scene = w.scene();
    settle(doc);
    auto fail = [why](const QString& m) {
        *why = m;
        return false;
    };
    if (scene->nodeCount() != static_cast<int>(doc->spec().layers.size()))
        return fail(QStringLiteral("%1 nodes for %2 layers").arg(scene->nodeCount()).arg(doc->spec().layers.size()));
    int edges = 0;
    for (const LayerSpec& l : doc->spec().layers) {
        NodeItem* n = scene->node(l.id);
        if (!n)
            return fail(QStringLiteral("no node for ") + QString::fromStdString(l.id));
        if (n->pos() != QPointF(l.x, l.y))
            return fail(QStringLiteral("node %1 at the wrong place").arg(QString::fromStdString(l.id)));
        for (std::size_t s = 0; s < l.inputs.size(); ++s) {
            if (!doc->contains(l.inputs[s]))
                continue;
            EdgeItem* e = scene->edge(l.id, static_cast<int>(s));
            if (!e || e->producer()->id() != l.inputs[s])
                return fail(QStringLiteral("missing edge into %1").arg(QString::fromStdString(l.id)));
            ++edges;
        }
        const NodeInfo* info = doc->nodeInfo(l.id);
        if (info && info->ok && n->annotation().outputShape != shapeText(info->outputShape))
            return fail(QStringLiteral("stale shape on ") + QString::fromStdString(l.id));
        if (n->hasProblem() != !doc->problemsOf(l.id).empty())
            return fail(QStringLiteral("problem marking on ") + QString::fromStdString(l.id));
    }
    if (edges != scene->edgeCount())
        return fail(QStringLiteral("%1 edges, expected %2").arg(scene->edgeCount()).arg(edges));
    return true;
}

#define VERIFY_SCENE(w)                                  \
    do {                                                 \
        QString why_;                                    \
        QVERIFY2(sceneMatchesDocument(w, &why_), qPrintable(why_)); \
    } while (0)

void clickNode(MainWindow& w, const std::string& id)
{
    NodeItem* n = w.scene()->node(id);
    QVERIFY(n);
    // The header, left of centre: away from ports and the name.
    QTest::mouseClick(w.view()->viewport(), Qt::LeftButton, {},
                      uitest::toViewport(w.view(), n->scenePos() + QPointF(-40, 12)));
}

template <typename T>
T* inspectorEditor(MainWindow& w, const char* attr)
{
    return qobject_cast<T*>(w.inspector()->editor(attr));
}

void typeInto(QWidget* field, const QString& text)
{
    field->setFocus();
    QTest::keyClick(field, Qt::Key_A, Qt::ControlModifier);
    QTest::keyClicks(field, text);
}

std::unique_ptr<MainWindow> openWindow(const QString& templateName = QString())
{
    auto w = std::make_unique<MainWindow>();
    w->resize(1280, 800);
    w->show();
    if (!QTest::qWaitForWindowExposed(w.get()))
        qFatal("window not exposed");
    w->activateWindow();
    if (!QTest::qWaitForWindowActive(w.get()))
        qWarning("window not active: window-wide shortcuts may not fire");
    if (!w->newFromTemplate(templateName))
        qFatal("no template %s", qPrintable(templateName));
    settle(w->document());  // the initial fit-to-view runs now, not in the middle of a gesture
    return w;
}

} // namespace

void TestDesigner::initTestCase()
{
    uitest::isolateSettings();
    QVERIFY(m_tmp.isValid());
}

void TestDesigner::buildSeedMlpWithTheMouse()
{
    auto w = openWindow();
    ModelDocument* doc = w->document();
    w->view()->resetZoom();
    w->view()->centerOn(0, 150);
    QVERIFY(w->scene()->nodeCount() == 0);
    QVERIFY(!w->action(QStringLiteral("train"))->isEnabled());  // an empty model cannot train

    // Three layers from the palette, at the seed's positions.
    QCOMPARE(uitest::dropFromPalette(*w, QStringLiteral("Input"), {0, 0}), std::string("input"));
    QCOMPARE(uitest::dropFromPalette(*w, QStringLiteral("Dense"), {0, 120}), std::string("dense"));
    QCOMPARE(uitest::dropFromPalette(*w, QStringLiteral("Dense"), {0, 240}), std::string("dense_1"));
    QCOMPARE(w->scene()->nodeCount(), 3);
    QCOMPARE(w->scene()->selectedIds(), std::vector<std::string>{"dense_1"});  // a drop selects

    // Wire them by dragging from output ports to input ports.
    uitest::connectPorts(*w, "input", "dense");
    uitest::connectPorts(*w, "dense", "dense_1");
    QCOMPARE(doc->layer("dense")->inputs, std::vector<std::string>{"input"});
    QCOMPARE(doc->layer("dense_1")->inputs, std::vector<std::string>{"dense"});
    VERIFY_SCENE(*w);

    // Attributes in the inspector.
    clickNode(*w, "dense");
    QCOMPARE(w->inspector()->inspectedId(), std::string("dense"));
    auto* units = inspectorEditor<QSpinBox>(*w, "units");
    QVERIFY(units);
    QCOMPARE(units->minimum(), 1);
    typeInto(units, QStringLiteral("256"));
    auto* act = inspectorEditor<QComboBox>(*w, "activation");
    QVERIFY(act);
    QVERIFY(act->findText(QStringLiteral("relu")) >= 0);
    act->setCurrentIndex(act->findText(QStringLiteral("relu")));
    clickNode(*w, "dense_1");
    QCOMPARE(w->inspector()->inspectedId(), std::string("dense_1"));
    typeInto(inspectorEditor<QSpinBox>(*w, "units"), QStringLiteral("10"));
    inspectorEditor<QComboBox>(*w, "activation")->setCurrentText(QStringLiteral("softmax"));

    // Model settings: click empty canvas, then the model page.
    QTest::mouseClick(w->view()->viewport(), Qt::LeftButton, {}, uitest::toViewport(w->view(), {400, 120}));
    QVERIFY(w->inspector()->inspectedId().empty());
    auto* name = w->inspector()->findChild<QLineEdit*>(QStringLiteral("modelName"));
    typeInto(name, QStringLiteral("seed_mlp"));
    QTest::keyClick(name, Qt::Key_Return);
    typeInto(w->inspector()->findChild<QSpinBox*>(QStringLiteral("batchSize")), QStringLiteral("256"));
    typeInto(w->inspector()->findChild<QSpinBox*>(QStringLiteral("epochs")), QStringLiteral("10"));
    // The model's precision policy: an undoable edit of the model (saved in its compile settings).
    auto* precision = w->inspector()->findChild<QComboBox*>(QStringLiteral("precision"));
    QVERIFY(precision);
    QCOMPARE(precision->currentText(), QStringLiteral("float32"));
    precision->setCurrentIndex(precision->findText(QStringLiteral("mixed_bfloat16")));
    QCOMPARE(int(doc->spec().compile.precision), int(PrecisionPolicy::MixedBfloat16));
    QCOMPARE(modelToJson(doc->spec())["compile"]["precision"], json("mixed_bfloat16"));
    doc->undoStack()->undo();
    QCOMPARE(int(doc->spec().compile.precision), int(PrecisionPolicy::Float32));
    QCOMPARE(precision->currentText(), QStringLiteral("float32"));
    settle(doc);

    // Exactly the seed's model file, positions included (its explicit "outputs" names the single
    // sink, which is what an empty list means).
    ModelSpec seed = resourceModel("seed_mlp");
    QCOMPARE(seed.outputs, std::vector<std::string>{"dense_1"});
    seed.outputs.clear();
    QCOMPARE(modelToJson(doc->spec()), modelToJson(seed));
    VERIFY_SCENE(*w);
    QCOMPARE(w->scene()->edge("dense", 0)->label(), QStringLiteral("784"));
    QCOMPARE(w->scene()->edge("dense_1", 0)->label(), QStringLiteral("256"));
    QVERIFY(w->scene()->node("dense_1")->isSink());
    QCOMPARE(w->scene()->node("dense_1")->annotation().outputShape, QStringLiteral("10"));
    QCOMPARE(w->scene()->node("dense")->annotation().params, int64_t(784 * 256 + 256));
    QVERIFY(w->findChild<QLabel*>(QStringLiteral("totalsLabel"))->text().contains(QStringLiteral("203,530 params")));
    QVERIFY(w->action(QStringLiteral("train"))->isEnabled());
    QVERIFY(w->trainBlockedReason().isEmpty());
    QVERIFY(w->trainCommandLine().contains(QStringLiteral("--epochs 10 --batch-size 256")));
    const json built = modelToJson(doc->spec());

    // A shape error: a 3-D input into Dense. The node is marked, Train says why.
    clickNode(*w, "input");
    auto* shape = inspectorEditor<QLineEdit>(*w, "shape");
    QVERIFY(shape);
    typeInto(shape, QStringLiteral("28, 28, 1"));
    settle(doc);
    QCOMPARE(doc->layer("input")->attrs["shape"], json::array({28, 28, 1}));
    QCOMPARE(w->scene()->edge("dense", 0)->label(), QStringLiteral("28×28×1"));
    NodeItem* dense = w->scene()->node("dense");
    QVERIFY(dense->hasProblem());
    QVERIFY(dense->annotation().problem.contains(QStringLiteral("flat input")));
    QVERIFY(!w->scene()->node("input")->hasProblem());
    QVERIFY(!w->action(QStringLiteral("train"))->isEnabled());
    QVERIFY(w->trainBlockedReason().contains(QStringLiteral("node 'dense'")));
    QVERIFY(w->action(QStringLiteral("train"))->toolTip().contains(QStringLiteral("Dense expects a flat input")));
    QVERIFY(w->problemsModel()->rowCount() >= 1);
    QCOMPARE(w->problemsModel()->index(0, 0).data(ProblemsModel::NodeIdRole).toString(), QStringLiteral("dense"));
    VERIFY_SCENE(*w);

    // The fix: a Flatten between them, wired with the mouse (its output replaces dense's input).
    QCOMPARE(uitest::dropFromPalette(*w, QStringLiteral("Flatten"), {240, 60}), std::string("flatten"));
    uitest::connectPorts(*w, "input", "flatten");
    uitest::connectPorts(*w, "flatten", "dense");
    settle(doc);
    QCOMPARE(doc->layer("dense")->inputs, std::vector<std::string>{"flatten"});
    QVERIFY(!w->scene()->node("dense")->hasProblem());
    QCOMPARE(w->scene()->edge("flatten", 0)->label(), QStringLiteral("28×28×1"));
    QCOMPARE(w->scene()->edge("dense", 0)->label(), QStringLiteral("784"));
    QVERIFY(w->action(QStringLiteral("train"))->isEnabled());
    VERIFY_SCENE(*w);
    const json fixed = modelToJson(doc->spec());

    // Undo the whole session back to an empty model, checking the canvas at every step.
    QUndoStack* undo = doc->undoStack();
    const int steps = undo->count();
    QVERIFY(steps >= 14);
    bool sawBuilt = false;
    while (undo->canUndo()) {
        undo->undo();
        VERIFY_SCENE(*w);
        sawBuilt = sawBuilt || modelToJson(doc->spec()) == built;
    }
    QVERIFY(sawBuilt);  // the state before the shape error came back on the way
    QVERIFY(doc->spec().layers.empty());
    QCOMPARE(w->scene()->nodeCount(), 0);
    QCOMPARE(w->scene()->edgeCount(), 0);
    QVERIFY(!doc->isModified());
    while (undo->canRedo()) {
        undo->redo();
        VERIFY_SCENE(*w);
    }
    QCOMPARE(modelToJson(doc->spec()), fixed);

    // Save and reload: the same spec, positions and all; saving clears the modified mark.
    const QString path = m_tmp.filePath(QStringLiteral("built.json"));
    QVERIFY(w->saveFile(path));
    QVERIFY(!doc->isModified());
    QVERIFY(!w->isWindowModified());
    auto w2 = openWindow();
    QString error;
    QVERIFY2(w2->openFile(path, &error), qPrintable(error));
    QCOMPARE(modelToJson(w2->document()->spec()), fixed);
    VERIFY_SCENE(*w2);
    QVERIFY(w2->action(QStringLiteral("train"))->isEnabled());
}

void TestDesigner::templates_data()
{
    QTest::addColumn<QString>("name");
    QCOMPARE(MainWindow::templateNames().value(0), QStringLiteral("seed_mlp"));
    for (const QString& n : MainWindow::templateNames())
        QTest::newRow(qPrintable(n)) << n;
}

void TestDesigner::templates()
{
    QFETCH(QString, name);
    auto w = openWindow(name);
    QCOMPARE(modelToJson(w->document()->spec()), modelToJson(resourceModel(name.toStdString())));
    QVERIFY(w->document()->analysis().ok());
    QVERIFY(!w->document()->isModified());
    QVERIFY(w->document()->filePath().isEmpty());
    QVERIFY(w->action(QStringLiteral("train"))->isEnabled());
    VERIFY_SCENE(*w);
    // The menu holds it too.
    QVERIFY(w->findChild<QAction*>(QStringLiteral("template_") + name));
}

void TestDesigner::kerasImport_data()
{
    QTest::addColumn<QString>("file");
    const QDir dir(QStringLiteral(TS_FIXTURES_DIR "/keras"));
    for (const QString& f : dir.entryList({QStringLiteral("*.json")}, QDir::Files))
        QTest::newRow(qPrintable(f)) << dir.filePath(f);
}

void TestDesigner::kerasImport()
{
    QFETCH(QString, file);
    auto w = openWindow();
    QString error;
    QVERIFY2(w->openFile(file, &error), qPrintable(error));
    Result<ModelSpec> expected = loadModelFile(file.toStdString());
    QVERIFY(expected.ok());
    QCOMPARE(modelToJson(w->document()->spec()), modelToJson(expected.value()));
    QVERIFY(w->document()->isModified());      // not saved in our format yet
    QVERIFY(w->document()->filePath().isEmpty());
    QVERIFY(w->recentFiles().isEmpty() || !w->recentFiles().contains(file));
    VERIFY_SCENE(*w);
    QVERIFY(w->document()->analysis().ok());

    // Export to Keras JSON and import that again: the same model.
    const QString out = m_tmp.filePath(QFileInfo(file).completeBaseName() + QStringLiteral("_export.json"));
    QVERIFY2(w->exportKerasJson(out, &error), qPrintable(error));
    auto w2 = openWindow();
    QVERIFY2(w2->openFile(out, &error), qPrintable(error));
    const ModelSpec& a = w->document()->spec();
    const ModelSpec& b = w2->document()->spec();
    QCOMPARE(b.layers.size(), a.layers.size());
    for (std::size_t i = 0; i < a.layers.size(); ++i) {
        QCOMPARE(b.layers[i].id, a.layers[i].id);
        QCOMPARE(b.layers[i].type, a.layers[i].type);
        QCOMPARE(b.layers[i].inputs, a.layers[i].inputs);
        QCOMPARE(b.layers[i].attrs, a.layers[i].attrs);
    }
    // And the Python script exports.
    QVERIFY2(w->exportKerasScript(m_tmp.filePath(QStringLiteral("model.py")), &error), qPrintable(error));
}

void TestDesigner::inspectorEditors()
{
    auto w = openWindow(QStringLiteral("small_cnn"));
    ModelDocument* doc = w->document();
    w->scene()->selectIds({"conv2d"});
    Inspector* in = w->inspector();
    QCOMPARE(in->inspectedId(), std::string("conv2d"));

    auto* filters = inspectorEditor<QSpinBox>(*w, "filters");
    QVERIFY(filters);
    QCOMPARE(filters->value(), 32);
    QCOMPARE(filters->minimum(), 1);
    QVERIFY(filters->toolTip().contains(QStringLiteral("number of output channels")));
    auto* padding = inspectorEditor<QComboBox>(*w, "padding");
    QCOMPARE(padding->count(), 2);
    QCOMPARE(padding->currentText(), QStringLiteral("valid"));
    QCOMPARE(inspectorEditor<QComboBox>(*w, "activation")->count(), 7);
    QVERIFY(in->editor("kernel_size"));
    auto* kh = in->findChild<QSpinBox*>(QStringLiteral("attr_kernel_size_h"));
    QVERIFY(kh);
    typeInto(kh, QStringLiteral("5"));
    settle(doc);
    QCOMPARE(doc->layer("conv2d")->attrs["kernel_size"], json::array({5, 3}));
    QCOMPARE(w->scene()->edge("max_pooling2d", 0)->label(), QStringLiteral("24×26×32"));
    // Reset: kernel_size is required, so reset writes the catalogue's suggestion.
    auto* reset = in->findChild<QToolButton*>(QStringLiteral("reset_kernel_size"));
    QVERIFY(reset && reset->isEnabled());
    QTest::mouseClick(reset, Qt::LeftButton);
    QCOMPARE(doc->layer("conv2d")->attrs["kernel_size"], json::array({3, 3}));
    padding->setCurrentText(QStringLiteral("same"));
    settle(doc);
    QCOMPARE(w->scene()->edge("max_pooling2d", 0)->label(), QStringLiteral("28×28×32"));
    QVERIFY(in->findChild<QLabel*>(QStringLiteral("layerInfo"))->text().contains(QStringLiteral("Parameters: 320")));

    // Pooling strides default to the window ("auto"); unticking writes them.
    w->scene()->selectIds({"max_pooling2d"});
    settle(doc);  // the rebuilt inspector page is laid out before it is clicked
    auto* autoStrides = in->findChild<QCheckBox*>(QStringLiteral("attr_strides_auto"));
    QVERIFY(autoStrides && autoStrides->isChecked());
    QTest::mouseClick(autoStrides, Qt::LeftButton);
    QVERIFY2(doc->layer("max_pooling2d")->attrs.contains("strides"), doc->layer("max_pooling2d")->attrs.dump().c_str());
    QCOMPARE(doc->layer("max_pooling2d")->attrs.at("strides"), json::array({2, 2}));  // the window
    QTest::mouseClick(autoStrides, Qt::LeftButton);
    QVERIFY(!doc->layer("max_pooling2d")->attrs.contains("strides"));

    // A float attribute with limits, on a new Dropout.
    const std::string drop = w->addLayerFromPalette(QStringLiteral("Dropout"));
    QCOMPARE(drop, std::string("dropout"));
    QCOMPARE(doc->layer(drop)->inputs, std::vector<std::string>{"max_pooling2d"});  // below the selection
    auto* rate = inspectorEditor<QDoubleSpinBox>(*w, "rate");
    QVERIFY(rate);
    QCOMPARE(rate->maximum(), 1.0);
    QCOMPARE(rate->value(), 0.5);
    typeInto(rate, QStringLiteral("0.25"));
    QCOMPARE(doc->layer(drop)->attrs["rate"], json(0.25));

    // Renaming keeps the connections.
    w->scene()->selectIds({"dense"});
    auto* layerName = in->findChild<QLineEdit*>(QStringLiteral("layerName"));
    typeInto(layerName, QStringLiteral("hidden"));
    QTest::keyClick(layerName, Qt::Key_Return);
    QVERIFY(doc->layer("hidden"));
    QCOMPARE(doc->layer("dense_1")->inputs, std::vector<std::string>{"hidden"});
    QCOMPARE(in->inspectedId(), std::string("hidden"));
    VERIFY_SCENE(*w);
    // A taken name is refused and the field reverts.
    typeInto(layerName, QStringLiteral("flatten"));
    QTest::keyClick(layerName, Qt::Key_Return);
    QCOMPARE(layerName->text(), QStringLiteral("hidden"));
    QVERIFY(doc->layer("flatten") && doc->layer("hidden"));
}

void TestDesigner::keyboardEditing()
{
    auto w = openWindow(QStringLiteral("seed_mlp"));
    ModelDocument* doc = w->document();
    QWidget* view = w->view();
    view->setFocus();
    w->scene()->selectIds({"dense", "dense_1"});

    QTest::keyClick(view, Qt::Key_C, Qt::ControlModifier);
    QVERIFY(QApplication::clipboard()->mimeData()->hasFormat(QStringLiteral("application/x-trainstudio-layers")));
    QTest::keyClick(view, Qt::Key_V, Qt::ControlModifier);
    QCOMPARE(doc->spec().layers.size(), std::size_t(5));
    QCOMPARE(w->scene()->selectedIds(), (std::vector<std::string>{"dense_2", "dense_3"}));
    QCOMPARE(doc->layer("dense_3")->inputs, std::vector<std::string>{"dense_2"});
    QVERIFY(doc->layer("dense_2")->inputs.empty());
    QCOMPARE(doc->layer("dense_2")->x, 40.0);

    QTest::keyClick(view, Qt::Key_D, Qt::ControlModifier);  // duplicate the pasted pair
    QCOMPARE(doc->spec().layers.size(), std::size_t(7));
    QCOMPARE(w->scene()->selectedIds(), (std::vector<std::string>{"dense_4", "dense_5"}));

    // Arrow keys nudge; a run of nudges is one undo step.
    const int before = doc->undoStack()->count();
    const double x = doc->layer("dense_4")->x;
    QTest::keyClick(view, Qt::Key_Right);
    QTest::keyClick(view, Qt::Key_Right, Qt::ShiftModifier);
    QCOMPARE(doc->layer("dense_4")->x, x + 60);
    QCOMPARE(doc->undoStack()->count(), before + 1);

    QTest::keyClick(view, Qt::Key_Delete);
    QCOMPARE(doc->spec().layers.size(), std::size_t(5));
    QTest::keyClick(view, Qt::Key_A, Qt::ControlModifier);
    QCOMPARE(w->scene()->selectedIds().size(), std::size_t(5));
    QTest::keyClick(view, Qt::Key_X, Qt::ControlModifier);  // cut everything
    QVERIFY(doc->spec().layers.empty());
    QTest::keyClick(view, Qt::Key_V, Qt::ControlModifier);  // back, under the original names
    QCOMPARE(doc->spec().layers.size(), std::size_t(5));
    QCOMPARE(doc->layer("dense_1")->inputs, std::vector<std::string>{"dense"});
    QCOMPARE(doc->layer("dense")->inputs, std::vector<std::string>{"input"});
    VERIFY_SCENE(*w);

    QTest::keyClick(view, Qt::Key_Z, Qt::ControlModifier);
    QVERIFY(doc->spec().layers.empty());
    VERIFY_SCENE(*w);
    while (doc->undoStack()->canUndo())
        doc->undoStack()->undo();
    QCOMPARE(modelToJson(doc->spec()), modelToJson(resourceModel("seed_mlp")));
    VERIFY_SCENE(*w);
    // The history lists every step.
    QCOMPARE(doc->undoStack()->count(), 6);  // paste, duplicate, nudge, delete, cut, paste
    QCOMPARE(w->historyView()->model()->rowCount(), doc->undoStack()->count() + 1);

    // Typing in the inspector keeps its keys: Delete there edits text, not the model.
    w->scene()->selectIds({"dense"});
    auto* name = w->inspector()->findChild<QLineEdit*>(QStringLiteral("layerName"));
    name->setFocus();
    QTest::keyClick(name, Qt::Key_End);
    QTest::keyClick(name, Qt::Key_Backspace);
    QCOMPARE(doc->spec().layers.size(), std::size_t(3));
}

void TestDesigner::mouseMoveSelectAndReconnect()
{
    auto w = openWindow(QStringLiteral("seed_mlp"));
    ModelDocument* doc = w->document();
    w->view()->resetZoom();
    w->view()->centerOn(0, 150);
    QWidget* vp = w->view()->viewport();

    // Drag a node by its header: it moves on the grid, as one undo step.
    NodeItem* input = w->scene()->node("input");
    const QPoint grab = uitest::toViewport(w->view(), input->scenePos() + QPointF(-40, 12));
    uitest::dragOnViewport(vp, grab, grab + QPoint(101, 29));
    QCOMPARE(doc->layer("input")->x, 100.0);
    QCOMPARE(doc->layer("input")->y, 30.0);
    QCOMPARE(doc->undoStack()->count(), 1);
    QVERIFY(w->scene()->edge("dense", 0)->isVisible());
    VERIFY_SCENE(*w);
    doc->undoStack()->undo();
    QCOMPARE(w->scene()->node("input")->pos(), QPointF(0, 0));

    // Rubber band over the two Dense layers selects them.
    uitest::dragOnViewport(vp, uitest::toViewport(w->view(), {-200, 100}), uitest::toViewport(w->view(), {200, 320}));
    QCOMPARE(w->scene()->selectedIds(), (std::vector<std::string>{"dense", "dense_1"}));
    // Ctrl+click adds to the selection.
    QTest::mouseClick(vp, Qt::LeftButton, Qt::ControlModifier,
                      uitest::toViewport(w->view(), w->scene()->node("input")->scenePos() + QPointF(-40, 12)));
    QCOMPARE(w->scene()->selectedIds().size(), std::size_t(3));

    // Clicking an edge's shape label selects the edge; Delete removes the connection.
    EdgeItem* e = w->scene()->edge("dense_1", 0);
    QTest::mouseClick(vp, Qt::LeftButton, {}, uitest::toViewport(w->view(), e->labelCenter()));
    QVERIFY(w->scene()->edge("dense_1", 0)->isSelected());
    w->view()->setFocus();
    QTest::keyClick(w->view(), Qt::Key_Delete);
    QVERIFY(doc->layer("dense_1")->inputs.empty());
    QVERIFY(w->scene()->node("dense_1")->hasProblem() || (settle(doc), w->scene()->node("dense_1")->hasProblem()));
    doc->undoStack()->undo();

    // Pick up a connection at its input port and drop it on empty canvas: disconnected.
    NodeItem* d1 = w->scene()->node("dense_1");
    uitest::dragOnViewport(vp, uitest::toViewport(w->view(), d1->inputPortPos(0)),
                           uitest::toViewport(w->view(), {300, 200}));
    QVERIFY(doc->layer("dense_1")->inputs.empty());
    doc->undoStack()->undo();
    // ... or on another input: it moves there (one undo step).
    const std::string flat = w->addLayerAt(QStringLiteral("Flatten"), {260, 240});
    uitest::dragOnViewport(vp, uitest::toViewport(w->view(), w->scene()->node("dense_1")->inputPortPos(0)),
                           uitest::toViewport(w->view(), w->scene()->node(flat)->inputPortPos(0)));
    QVERIFY(doc->layer("dense_1")->inputs.empty());
    QCOMPARE(doc->layer(flat)->inputs, std::vector<std::string>{"dense"});
    doc->undoStack()->undo();
    QCOMPARE(doc->layer("dense_1")->inputs, std::vector<std::string>{"dense"});

    // Dragging into an Input layer is refused with a message, and changes nothing.
    const int steps = doc->undoStack()->count();
    QSignalSpy message(w->scene(), &DesignerScene::message);
    uitest::dragOnViewport(vp, uitest::toViewport(w->view(), w->scene()->node("dense_1")->outputPortPos()),
                           uitest::toViewport(w->view(), w->scene()->node("input")->scenePos() + QPointF(0, 30)));
    QCOMPARE(doc->undoStack()->count(), steps);
    QCOMPARE(message.count(), 1);
    VERIFY_SCENE(*w);
}

void TestDesigner::zoomPanFit()
{
    auto w = openWindow(QStringLiteral("small_resnet"));
    DesignerView* view = w->view();
    QCoreApplication::processEvents();
    view->fitToView();
    const QRect content = view->mapFromScene(w->scene()->contentRect()).boundingRect();
    QVERIFY2(view->viewport()->rect().contains(content), "fit shows every layer");

    view->resetZoom();
    QCOMPARE(view->zoom(), 1.0);
    const QPoint at = view->viewport()->rect().center();
    const QPointF sceneAt = view->mapToScene(at);
    QWheelEvent wheel(QPointF(at), view->viewport()->mapToGlobal(QPointF(at)), QPoint(), QPoint(0, 120),
                      Qt::NoButton, Qt::NoModifier, Qt::NoScrollPhase, false);
    QApplication::sendEvent(view->viewport(), &wheel);
    QVERIFY(view->zoom() > 1.1);
    QVERIFY((view->mapToScene(at) - sceneAt).manhattanLength() < 2);  // zooms about the cursor

    QNativeGestureEvent pinch(Qt::ZoomNativeGesture, QPointingDevice::primaryPointingDevice(), 2,
                              QPointF(at), QPointF(at), view->viewport()->mapToGlobal(QPointF(at)), 0.5,
                              QPointF(), 0);
    const double z = view->zoom();
    QApplication::sendEvent(view->viewport(), &pinch);
    QVERIFY(qAbs(view->zoom() - z * 1.5) < 1e-6);

    view->setFocus();
    QTest::keyClick(view, Qt::Key_0, Qt::ControlModifier);
    QCOMPARE(view->zoom(), 1.0);
    w->action(QStringLiteral("zoomOut"))->trigger();
    QVERIFY(view->zoom() < 1.0);

    // Middle-button drag pans.
    const QPointF before = view->mapToScene(at);
    QTest::mousePress(view->viewport(), Qt::MiddleButton, {}, at);
    QMouseEvent move(QEvent::MouseMove, QPointF(at + QPoint(50, 40)), view->viewport()->mapToGlobal(QPointF(at + QPoint(50, 40))),
                     Qt::NoButton, Qt::MiddleButton, {});
    QApplication::sendEvent(view->viewport(), &move);
    QTest::mouseRelease(view->viewport(), Qt::MiddleButton, {}, at + QPoint(50, 40));
    QVERIFY((view->mapToScene(at) - before).manhattanLength() > 20);
}

void TestDesigner::unsavedChangesPrompt()
{
    auto w = openWindow(QStringLiteral("seed_mlp"));
    QVERIFY(w->close());  // nothing changed: no question
    w->show();
    QVERIFY(w->document()->setAttribute("dense", "units", 128));
    QVERIFY(w->isWindowModified());

    auto answer = [](QMessageBox::StandardButton button, bool* asked) {
        QTimer::singleShot(0, [button, asked] {
            auto* box = qobject_cast<QMessageBox*>(QApplication::activeModalWidget());
            if (box && box->objectName() == QLatin1String("unsavedChangesBox")) {
                *asked = true;
                QTest::mouseClick(box->button(button), Qt::LeftButton);
            }
        });
    };
    bool asked = false;
    answer(QMessageBox::Cancel, &asked);
    QVERIFY(!w->close());
    QVERIFY(asked);
    QVERIFY(w->isVisible());

    asked = false;
    answer(QMessageBox::Discard, &asked);
    QVERIFY(w->close());
    QVERIFY(asked);
}

void TestDesigner::recentFiles()
{
    auto w = openWindow(QStringLiteral("seed_mlp"));
    const QString a = m_tmp.filePath(QStringLiteral("recent_a.json"));
    const QString b = m_tmp.filePath(QStringLiteral("recent_b.json"));
    QVERIFY(w->saveFile(a));
    QVERIFY(w->saveFile(b));
    QCOMPARE(w->recentFiles().value(0), QFileInfo(b).absoluteFilePath());
    QCOMPARE(w->recentFiles().value(1), QFileInfo(a).absoluteFilePath());
    QVERIFY(w->openFile(a));
    QCOMPARE(w->recentFiles().value(0), QFileInfo(a).absoluteFilePath());
    QCOMPARE(w->recentFiles().count(QFileInfo(a).absoluteFilePath()), 1);
    QVERIFY(w->windowTitle().startsWith(QStringLiteral("recent_a.json")));
}

void TestDesigner::screenshot()
{
    auto w = openWindow();
    QString error;
    QVERIFY(w->openFile(QString::fromStdString(uitest::sourcePath("resources/models/seed_mlp.json")), &error));
    const QString png = m_tmp.filePath(QStringLiteral("shot.png"));
    QVERIFY(w->saveScreenshot(png, QSize(1200, 760)));
    QImage img(png);
    QVERIFY(!img.isNull());
    QCOMPARE(img.size(), QSize(1200, 760) * w->devicePixelRatio());
}

void TestDesigner::largeModelStaysFast()
{
    // 100 residual blocks: Dense -> Dense -> Add(previous, dense): 301 layers.
    ModelSpec spec;
    spec.name = "deep";
    LayerSpec in;
    in.id = "input";
    in.type = "Input";
    in.attrs = {{"shape", {64}}};
    spec.layers.push_back(in);
    std::string prev = "input";
    for (int b = 0; b < 100; ++b) {
        const std::string s = std::to_string(b);
        LayerSpec d1{"a" + s, "Dense", {{"units", 64}, {"activation", "relu"}}, {prev}, 0, 300.0 * b + 100};
        LayerSpec d2{"b" + s, "Dense", {{"units", 64}}, {d1.id}, 0, 300.0 * b + 200};
        LayerSpec add{"add" + s, "Add", json::object(), {prev, d2.id}, 0, 300.0 * b + 300};
        spec.layers.push_back(d1);
        spec.layers.push_back(d2);
        spec.layers.push_back(add);
        prev = add.id;
    }
    auto w = openWindow();
    QElapsedTimer t;
    t.start();
    w->document()->reset(spec);
    settle(w->document());
    const double loadMs = t.nsecsElapsed() / 1e6;
    QCOMPARE(w->scene()->nodeCount(), 301);
    QCOMPARE(w->scene()->edgeCount(), 400);

    // One attribute edit: analysis + re-annotation, touching only the node whose numbers changed.
    w->scene()->selectIds({"b50"});
    t.restart();
    QVERIFY(w->document()->setAttribute("b50", "use_bias", false));
    settle(w->document());
    const double editMs = t.nsecsElapsed() / 1e6;
    QCOMPARE(w->scene()->lastAnnotationUpdates(), 1);
    QCOMPARE(w->scene()->node("b50")->annotation().params, int64_t(64 * 64));

    // A shape-changing edit re-annotates the nodes downstream of it only where they change.
    t.restart();
    QVERIFY(w->document()->setAttribute("b50", "units", 32));
    settle(w->document());
    const double errorMs = t.nsecsElapsed() / 1e6;
    QVERIFY(w->scene()->node("add50")->hasProblem());
    QVERIFY(!w->action(QStringLiteral("train"))->isEnabled());

    // Undo both, then move one node with the mouse.
    w->document()->undoStack()->undo();
    w->document()->undoStack()->undo();
    settle(w->document());
    QVERIFY(w->action(QStringLiteral("train"))->isEnabled());
    w->view()->resetZoom();
    w->view()->centerOnNode("a10");
    NodeItem* n = w->scene()->node("a10");
    const QPoint grab = uitest::toViewport(w->view(), n->scenePos() + QPointF(-40, 12));
    t.restart();
    uitest::dragOnViewport(w->view()->viewport(), grab, grab + QPoint(200, 0));
    QCoreApplication::processEvents();
    const double moveMs = t.nsecsElapsed() / 1e6;
    QCOMPARE(w->document()->layer("a10")->x, 200.0);

    qInfo("301 layers: load+annotate %.1f ms, attribute edit %.2f ms, shape error %.2f ms, "
          "6-step mouse move %.1f ms", loadMs, editMs, errorMs, moveMs);
    // Generous bounds (a shared, busy machine); typical numbers are far below.
    QVERIFY(editMs < 100);
    QVERIFY(errorMs < 100);
    QVERIFY(moveMs < 1000);
}

QTEST_MAIN(TestDesigner)
#include "tst_designer.moc"
