#pragma once
// Shared by the ui tests: real mouse gestures on a QGraphicsView's viewport, a palette drop,
// and settings kept out of the user's home.

#include <QPoint>
#include <QPointF>
#include <QString>

#include <memory>
#include <string>

#include "model/spec.h"

class QGraphicsView;
class QWidget;

namespace ts {
class MainWindow;
}

namespace uitest {

// Points QSettings at a fresh temporary directory (call before creating windows).
void isolateSettings();

// Press at `from`, move in steps with the button held, release at `to` (viewport coordinates).
void dragOnViewport(QWidget* viewport, QPoint from, QPoint to, Qt::KeyboardModifiers mods = {});
QPoint toViewport(QGraphicsView* view, QPointF scenePos);

// Drags a layer type from the palette onto the canvas at a scene position: the palette row is
// clicked (real mouse event), its model's mime data is taken as QDrag would, and the drag-enter,
// drag-move and drop events are delivered to the canvas viewport. Returns the new layer's id.
std::string dropFromPalette(ts::MainWindow& w, const QString& type, QPointF scenePos);

// Connects `from`'s output port to input `slot` of `to` by dragging with the mouse.
void connectPorts(ts::MainWindow& w, const std::string& from, const std::string& to, int slot = 0);

// A shown studio window recording into `db`, holding the seed MLP, on its Train tab with the
// run's epochs and example limit set (0: all examples).
std::unique_ptr<ts::MainWindow> trainingWindow(const QString& db, int epochs, int limit);

std::string sourcePath(const std::string& relative);  // TS_SOURCE_DIR + "/" + relative

// A model from resources/models (by file stem); a missing or broken one ends the test run.
ts::ModelSpec resourceModel(const std::string& name);

} // namespace uitest
