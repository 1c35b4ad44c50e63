#pragma once
// EdgeItem: a connection from a producer's output port to input `slot` of a consumer, drawn as
// a vertical S-curve with the tensor shape that flows along it in a pill at its middle.

#include <QGraphicsItem>
#include <QPainterPath>
#include <QString>

namespace ts {

class NodeItem;
class DesignerScene;

class EdgeItem : public QGraphicsItem {
public:
    enum { Type = UserType + 2 };

    EdgeItem(DesignerScene* scene, NodeItem* producer, NodeItem* consumer, int slot);
    int type() const override { return Type; }

    NodeItem* producer() const { return m_producer; }
    NodeItem* consumer() const { return m_consumer; }
    int slot() const { return m_slot; }
    QString label() const { return m_label; }
    bool labelOk() const { return m_ok; }
    void setLabel(const QString& label, bool ok);
    void updatePath();
    void themeChanged();  // fonts may have changed: re-measure the label
    QPointF labelCenter() const { return m_labelCenter; }

    QRectF boundingRect() const override;
    QPainterPath shape() const override;
    void paint(QPainter* painter, const QStyleOptionGraphicsItem* option, QWidget* widget) override;

private:
    QRectF labelRect() const;

    DesignerScene* m_scene;
    NodeItem* m_producer;
    NodeItem* m_consumer;
    int m_slot;
    QString m_label;
    bool m_ok = true;
    QPainterPath m_path;
    QPointF m_labelCenter;
    double m_labelWidth = 0;
};

// The curve between two port positions (also used for the connection being dragged).
QPainterPath connectionPath(QPointF from, QPointF to);

} // namespace ts
