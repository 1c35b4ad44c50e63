#include "ui/ui_helpers.h"

#include <QApplication>
#include <QDragEnterEvent>
#include <QGraphicsView>
#include <QMimeData>
#include <QSettings>
#include <QSpinBox>
#include <QTemporaryDir>
#include <QTest>
#include <QTreeView>

#include <memory>

#include "designer/designerscene.h"
#include "designer/designerview.h"
#include "designer/modeldocument.h"
#include "designer/palettewidget.h"
#include "mainwindow.h"
#include "models/layerpalettemodel.h"
#include "setup/runsetuppanel.h"
#include "trainpage.h"

namespace uitest {

void isolateSettings()
{
    static std::unique_ptr<QTemporaryDir> dir;
    dir = std::make_unique<QTemporaryDir>();
    QSettings::setDefaultFormat(QSettings::IniFormat);
    QSettings::setPath(QSettings::IniFormat, QSettings::UserScope, dir->path());
    QCoreApplication::setOrganizationName(QStringLiteral("TrainStudioTests"));
    QCoreApplication::setApplicationName(QStringLiteral("tst"));
}

QPoint toViewport(QGraphicsView* view, QPointF scenePos)
{
    return view->mapFromScene(scenePos);
}

void dragOnViewport(QWidget* viewport, QPoint from, QPoint to, Qt::KeyboardModifiers mods)
{
    QTest::mousePress(viewport, Qt::LeftButton, mods, from);
    const int steps = 6;
    for (int i = 1; i <= steps; ++i) {
        const QPoint p = from + (to - from) * i / steps;
        // QTest::mouseMove does not carry the held button to every platform; send the event.
        QMouseEvent move(QEvent::MouseMove, QPointF(p), viewport->mapToGlobal(QPointF(p)), Qt::NoButton,
                         Qt::LeftButton, mods);
        QApplication::sendEvent(viewport, &move);
    }
    QTest::mouseRelease(viewport, Qt::LeftButton, mods, to);
}

std::string dropFromPalette(ts::MainWindow& w, const QString& type, QPointF scenePos)
{
    ts::PaletteWidget* palette = w.layerPalette();
    const QModelIndex index = palette->indexOfType(type);
    if (!index.isValid())
        return {};
    QTreeView* tree = palette->view();
    tree->scrollTo(index);
    const QRect visible = palette->rectOfType(type);
    QTest::mouseClick(tree->viewport(), Qt::LeftButton, {}, visible.center());
    const QModelIndex current = tree->currentIndex();
    if (current.data(ts::LayerPaletteModel::TypeRole).toString() != type)
        return {};
    std::unique_ptr<QMimeData> mime(tree->model()->mimeData({current}));
    if (!mime)
        return {};

    const std::size_t before = w.document()->spec().layers.size();
    QWidget* viewport = w.view()->viewport();
    const QPoint at = toViewport(w.view(), scenePos + QPointF(0, 10));  // the drop holds the header
    QDragEnterEvent enter(at, Qt::CopyAction, mime.get(), Qt::LeftButton, {});
    QApplication::sendEvent(viewport, &enter);
    if (!enter.isAccepted())
        return {};
    QDragMoveEvent move(at, Qt::CopyAction, mime.get(), Qt::LeftButton, {});
    QApplication::sendEvent(viewport, &move);
    QDropEvent drop(QPointF(at), Qt::CopyAction, mime.get(), Qt::LeftButton, {});
    QApplication::sendEvent(viewport, &drop);
    const auto& layers = w.document()->spec().layers;
    if (layers.size() != before + 1)
        return {};
    return layers.back().id;
}

void connectPorts(ts::MainWindow& w, const std::string& from, const std::string& to, int slot)
{
    ts::NodeItem* a = w.scene()->node(from);
    ts::NodeItem* b = w.scene()->node(to);
    if (!a || !b)
        return;
    dragOnViewport(w.view()->viewport(), toViewport(w.view(), a->outputPortPos()),
                   toViewport(w.view(), b->inputPortPos(slot)));
}

std::string sourcePath(const std::string& relative)
{
    return std::string(TS_SOURCE_DIR) + "/" + relative;
}

ts::ModelSpec resourceModel(const std::string& name)
{
    ts::Result<ts::ModelSpec> s = ts::loadModelFile(sourcePath("resources/models/" + name + ".json"));
    if (!s.ok())
        qFatal("%s", s.error().toString().c_str());
    return s.value();
}

std::unique_ptr<ts::MainWindow> trainingWindow(const QString& db, int epochs, int limit)
{
    auto w = std::make_unique<ts::MainWindow>();
    w->setConfirmStopOnClose(false);
    w->setDatabasePath(db);
    w->newFromTemplate("seed_mlp");
    w->resize(1300, 850);
    w->show();
    w->showTab("train");
    ts::RunSetupPanel* setup = w->trainPage()->setup();
    setup->findChild<QSpinBox*>("epochs")->setValue(epochs);
    setup->findChild<QSpinBox*>("limit")->setValue(limit);
    return w;
}

} // namespace uitest
