#pragma once
// DesignerView: the canvas widget. Wheel zooms around the cursor (a touchpad's two-finger
// scroll pans; Ctrl+scroll zooms), pinch zooms (touchpad native gestures and touch screens),
// middle button or Space+drag pans, left drag on empty canvas selects with a rubber band.
// Layers dragged from the palette are dropped here.

#include <QGraphicsView>

#include <string>

class QGestureEvent;

namespace ts {

class DesignerScene;

class DesignerView : public QGraphicsView {
    Q_OBJECT
public:
    static constexpr const char* kLayerMimeType = "application/x-trainstudio-layer-type";

    explicit DesignerView(DesignerScene* scene, QWidget* parent = nullptr);
    DesignerScene* designerScene() const { return m_scene; }

    double zoom() const;  // 1.0 = 100 %
    void setZoom(double zoom, QPoint anchor = QPoint(-1, -1));  // anchor in viewport coordinates
    void zoomBy(double factor, QPoint anchor = QPoint(-1, -1));
    // The scene position a new layer should go to when it is not dropped (the visible centre).
    QPointF placementPoint() const;

public Q_SLOTS:
    void zoomIn();
    void zoomOut();
    void resetZoom();
    void fitToView();
    void centerOnNode(const std::string& id);

Q_SIGNALS:
    void zoomChanged(double zoom);
    // A layer type was dropped at a scene position (the node's top centre).
    void layerDropped(const QString& type, QPointF scenePos);

protected:
    void wheelEvent(QWheelEvent* event) override;
    bool viewportEvent(QEvent* event) override;
    void mousePressEvent(QMouseEvent* event) override;
    void mouseMoveEvent(QMouseEvent* event) override;
    void mouseReleaseEvent(QMouseEvent* event) override;
    void keyPressEvent(QKeyEvent* event) override;
    void keyReleaseEvent(QKeyEvent* event) override;
    void dragEnterEvent(QDragEnterEvent* event) override;
    void dragMoveEvent(QDragMoveEvent* event) override;
    void dropEvent(QDropEvent* event) override;
    void drawBackground(QPainter* painter, const QRectF& rect) override;
    void drawForeground(QPainter* painter, const QRectF& rect) override;
    void changeEvent(QEvent* event) override;

private:
    void updateSceneRect();
    bool gestureEvent(QGestureEvent* event);

    DesignerScene* m_scene;
    bool m_panning = false;
    bool m_spaceHeld = false;
    QPoint m_panLast;
};

} // namespace ts
