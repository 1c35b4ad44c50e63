#include "designer/designerview.h"

#include <QApplication>
#include <QGestureEvent>
#include <QMimeData>
#include <QNativeGestureEvent>
#include <QPainter>
#include <QPinchGesture>
#include <QScrollBar>
#include <QWheelEvent>

#include <cmath>

#include "designer/designerscene.h"
#include "designer/format.h"
#include "designer/modeldocument.h"
#include "designer/nodeitem.h"
#include "designer/theme.h"

namespace ts {

namespace {
constexpr double kMinZoom = 0.1, kMaxZoom = 4.0;
constexpr double kGrid = 20;
} // namespace

DesignerView::DesignerView(DesignerScene* scene, QWidget* parent)
    : QGraphicsView(scene, parent), m_scene(scene)
{
    setRenderHints(QPainter::Antialiasing | QPainter::TextAntialiasing);
    setDragMode(RubberBandDrag);
    setRubberBandSelectionMode(Qt::IntersectsItemShape);
    setTransformationAnchor(AnchorUnderMouse);
    setResizeAnchor(AnchorViewCenter);
    setViewportUpdateMode(SmartViewportUpdate);
    setOptimizationFlags(DontSavePainterState | DontAdjustForAntialiasing);
    setAcceptDrops(true);
    setFocusPolicy(Qt::StrongFocus);
    setFrameShape(QFrame::NoFrame);
    // Panning is by wheel, touchpad, middle button or Space+drag: scroll bars only take room.
    setHorizontalScrollBarPolicy(Qt::ScrollBarAlwaysOff);
    setVerticalScrollBarPolicy(Qt::ScrollBarAlwaysOff);
    viewport()->grabGesture(Qt::PinchGesture);
    setAttribute(Qt::WA_AcceptTouchEvents);
    connect(scene->document(), &ModelDocument::layersChanged, this, [this] { updateSceneRect(); });
    connect(scene->document(), &ModelDocument::modelReset, this, [this] { updateSceneRect(); });
    updateSceneRect();
}

void DesignerView::updateSceneRect()
{
    // Generous room around the model so it can be panned freely; grows with the model.
    const QRectF content = m_scene->itemsBoundingRect();
    const QRectF r = content.adjusted(-3000, -3000, 3000, 3000).united(QRectF(-3000, -3000, 6000, 6000));
    if (r != sceneRect())
        setSceneRect(r);
}

double DesignerView::zoom() const
{
    return transform().m11();
}

void DesignerView::setZoom(double z, QPoint anchor)
{
    z = std::clamp(z, kMinZoom, kMaxZoom);
    const double current = zoom();
    if (current <= 0 || std::abs(z - current) < 1e-9)
        return;
    zoomBy(z / current, anchor);
}

void DesignerView::zoomBy(double factor, QPoint anchor)
{
    const double target = std::clamp(zoom() * factor, kMinZoom, kMaxZoom);
    factor = target / zoom();
    if (std::abs(factor - 1) < 1e-9)
        return;
    const QPoint a = anchor.x() < 0 ? viewport()->rect().center() : anchor;
    const QPointF before = mapToScene(a);
    const ViewportAnchor old = transformationAnchor();
    setTransformationAnchor(NoAnchor);
    scale(factor, factor);
    // Keep the scene point under the anchor where it was.
    const QPointF delta = mapFromScene(before) - QPointF(a);
    horizontalScrollBar()->setValue(horizontalScrollBar()->value() + static_cast<int>(std::round(delta.x())));
    verticalScrollBar()->setValue(verticalScrollBar()->value() + static_cast<int>(std::round(delta.y())));
    setTransformationAnchor(old);
    Q_EMIT zoomChanged(zoom());
}

void DesignerView::zoomIn()
{
    zoomBy(1.25);
}

void DesignerView::zoomOut()
{
    zoomBy(1 / 1.25);
}

void DesignerView::resetZoom()
{
    setZoom(1.0);
}

void DesignerView::fitToView()
{
    const QRectF content = m_scene->contentRect();
    if (content.isEmpty()) {
        resetTransform();
        centerOn(0, 0);
        Q_EMIT zoomChanged(zoom());
        return;
    }
    fitInView(content.adjusted(-40, -40, 40, 40), Qt::KeepAspectRatio);
    // Small models should not be blown up beyond a comfortable size.
    if (zoom() > 1.25)
        setZoom(1.25);
    if (zoom() < kMinZoom)
        setZoom(kMinZoom);
    centerOn(content.center());
    Q_EMIT zoomChanged(zoom());
}

void DesignerView::centerOnNode(const std::string& id)
{
    if (NodeItem* n = m_scene->node(id))
        centerOn(n->sceneBoundingRect().center());
}

QPointF DesignerView::placementPoint() const
{
    const QPointF c = mapToScene(viewport()->rect().center());
    return QPointF(std::round(c.x() / 10) * 10, std::round(c.y() / 10) * 10);
}

void DesignerView::wheelEvent(QWheelEvent* event)
{
    const bool touchpadScroll = !event->pixelDelta().isNull() && !(event->modifiers() & Qt::ControlModifier);
    if (touchpadScroll || (event->modifiers() & Qt::ShiftModifier)) {
        QGraphicsView::wheelEvent(event);  // pan
        return;
    }
    const double steps = event->angleDelta().y() / 120.0;
    if (steps == 0) {
        QGraphicsView::wheelEvent(event);
        return;
    }
    zoomBy(std::pow(1.15, steps), event->position().toPoint());
    event->accept();
}

bool DesignerView::gestureEvent(QGestureEvent* event)
{
    if (auto* pinch = static_cast<QPinchGesture*>(event->gesture(Qt::PinchGesture))) {
        if (pinch->changeFlags() & QPinchGesture::ScaleFactorChanged)
            zoomBy(pinch->scaleFactor(), viewport()->mapFromGlobal(pinch->centerPoint().toPoint()));
        event->accept(pinch);
        return true;
    }
    return false;
}

bool DesignerView::viewportEvent(QEvent* event)
{
    if (event->type() == QEvent::NativeGesture) {
        auto* g = static_cast<QNativeGestureEvent*>(event);
        if (g->gestureType() == Qt::ZoomNativeGesture) {
            zoomBy(1 + g->value(), g->position().toPoint());
            return true;
        }
    }
    if (event->type() == QEvent::Gesture)
        return gestureEvent(static_cast<QGestureEvent*>(event));
    return QGraphicsView::viewportEvent(event);
}

void DesignerView::mousePressEvent(QMouseEvent* event)
{
    if (event->button() == Qt::MiddleButton || (m_spaceHeld && event->button() == Qt::LeftButton)) {
        m_panning = true;
        m_panLast = event->position().toPoint();
        viewport()->setCursor(Qt::ClosedHandCursor);
        event->accept();
        return;
    }
    QGraphicsView::mousePressEvent(event);
}

void DesignerView::mouseMoveEvent(QMouseEvent* event)
{
    if (m_panning) {
        const QPoint p = event->position().toPoint();
        const QPoint d = p - m_panLast;
        m_panLast = p;
        horizontalScrollBar()->setValue(horizontalScrollBar()->value() - d.x());
        verticalScrollBar()->setValue(verticalScrollBar()->value() - d.y());
        event->accept();
        return;
    }
    QGraphicsView::mouseMoveEvent(event);
}

void DesignerView::mouseReleaseEvent(QMouseEvent* event)
{
    if (m_panning) {
        m_panning = false;
        viewport()->setCursor(m_spaceHeld ? Qt::OpenHandCursor : Qt::ArrowCursor);
        event->accept();
        return;
    }
    QGraphicsView::mouseReleaseEvent(event);
}

void DesignerView::keyPressEvent(QKeyEvent* event)
{
    if (event->key() == Qt::Key_Space && !event->isAutoRepeat()) {
        m_spaceHeld = true;
        viewport()->setCursor(Qt::OpenHandCursor);
        event->accept();
        return;
    }
    // Arrow keys nudge the selected layers (Shift: further); a run of nudges is one undo step.
    const int key = event->key();
    if ((key == Qt::Key_Left || key == Qt::Key_Right || key == Qt::Key_Up || key == Qt::Key_Down)
        && !(event->modifiers() & (Qt::ControlModifier | Qt::AltModifier | Qt::MetaModifier))) {
        const std::vector<std::string> ids = m_scene->selectedIds();
        if (!ids.empty()) {
            const double step = (event->modifiers() & Qt::ShiftModifier) ? 50 : 10;
            const QPointF d(key == Qt::Key_Left ? -step : key == Qt::Key_Right ? step : 0,
                            key == Qt::Key_Up ? -step : key == Qt::Key_Down ? step : 0);
            ModelDocument* doc = m_scene->document();
            std::vector<std::pair<std::string, QPointF>> moves;
            for (const std::string& id : ids)
                if (const LayerSpec* l = doc->layer(id))
                    moves.emplace_back(id, QPointF(l->x, l->y) + d);
            doc->moveLayers(moves, tr("Nudge %1").arg(counted(static_cast<int64_t>(moves.size()), "layer", "layers")), "nudge");
            event->accept();
            return;
        }
    }
    QGraphicsView::keyPressEvent(event);
}

void DesignerView::keyReleaseEvent(QKeyEvent* event)
{
    if (event->key() == Qt::Key_Space && !event->isAutoRepeat()) {
        m_spaceHeld = false;
        viewport()->unsetCursor();
        event->accept();
        return;
    }
    QGraphicsView::keyReleaseEvent(event);
}

void DesignerView::dragEnterEvent(QDragEnterEvent* event)
{
    if (event->mimeData()->hasFormat(QLatin1String(kLayerMimeType)))
        event->acceptProposedAction();
    else
        QGraphicsView::dragEnterEvent(event);
}

void DesignerView::dragMoveEvent(QDragMoveEvent* event)
{
    if (event->mimeData()->hasFormat(QLatin1String(kLayerMimeType)))
        event->acceptProposedAction();
    else
        QGraphicsView::dragMoveEvent(event);
}

void DesignerView::dropEvent(QDropEvent* event)
{
    const QMimeData* mime = event->mimeData();
    if (!mime->hasFormat(QLatin1String(kLayerMimeType))) {
        QGraphicsView::dropEvent(event);
        return;
    }
    const QString type = QString::fromUtf8(mime->data(QLatin1String(kLayerMimeType))).section(QLatin1Char('\n'), 0, 0);
    // The cursor holds the node by its header: put the top centre just above it, on the grid.
    const QPointF p = mapToScene(event->position().toPoint()) - QPointF(0, 10);
    event->acceptProposedAction();
    Q_EMIT layerDropped(type, QPointF(std::round(p.x() / 10) * 10, std::round(p.y() / 10) * 10));
}

void DesignerView::drawBackground(QPainter* painter, const QRectF& rect)
{
    const DesignerTheme& t = m_scene->theme();
    painter->fillRect(rect, t.canvas);
    // Dots on the grid; coarser when zoomed out so there are never too many.
    double step = kGrid;
    while (step * zoom() < 14)
        step *= 2;
    const double left = std::floor(rect.left() / step) * step;
    const double top = std::floor(rect.top() / step) * step;
    QVector<QPointF> dots;
    for (double x = left; x < rect.right(); x += step)
        for (double y = top; y < rect.bottom(); y += step)
            dots.append(QPointF(x, y));
    QPen pen(t.grid, 1.6 / zoom());
    pen.setCapStyle(Qt::RoundCap);
    painter->setPen(pen);
    painter->drawPoints(dots.constData(), static_cast<int>(dots.size()));
}

void DesignerView::drawForeground(QPainter* painter, const QRectF&)
{
    if (m_scene->nodeCount() > 0)
        return;
    // An empty model says how to start.
    painter->save();
    painter->resetTransform();
    const DesignerTheme& t = m_scene->theme();
    painter->setPen(t.nodeSubtext);
    QFont f = font();
    f.setPointSizeF(f.pointSizeF() * 1.15);
    painter->setFont(f);
    painter->drawText(viewport()->rect(), Qt::AlignCenter,
                      tr("Drag layers here from the palette\nor start from a template: File ▸ New from Template"));
    painter->restore();
}

void DesignerView::changeEvent(QEvent* event)
{
    if (event->type() == QEvent::PaletteChange || event->type() == QEvent::FontChange)
        m_scene->setTheme(DesignerTheme::fromPalette(palette(), font()));
    QGraphicsView::changeEvent(event);
}

} // namespace ts
