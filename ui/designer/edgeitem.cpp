#include "designer/edgeitem.h"

#include <QFontMetricsF>
#include <QPainter>
#include <QPainterPathStroker>
#include <QStyleOptionGraphicsItem>

#include <cmath>

#include "designer/designerscene.h"
#include "designer/nodeitem.h"
#include "designer/theme.h"

namespace ts {

namespace {
constexpr double kLabelHeight = 15;
} // namespace

QPainterPath connectionPath(QPointF from, QPointF to)
{
    QPainterPath path(from);
    // Vertical tangents at both ports; longer when the target is above the source.
    const double dy = to.y() - from.y();
    const double bend = std::max(30.0, std::abs(dy) * 0.5) + (dy < 0 ? 60 : 0);
    path.cubicTo(from + QPointF(0, bend), to - QPointF(0, bend), to);
    return path;
}

EdgeItem::EdgeItem(DesignerScene* scene, NodeItem* producer, NodeItem* consumer, int slot)
    : m_scene(scene), m_producer(producer), m_consumer(consumer), m_slot(slot)
{
    setFlags(ItemIsSelectable);
    setZValue(0);
    updatePath();
}

void EdgeItem::setLabel(const QString& label, bool ok)
{
    if (label == m_label && ok == m_ok)
        return;
    prepareGeometryChange();
    m_label = label;
    m_ok = ok;
    m_labelWidth = QFontMetricsF(m_scene->theme().smallFont).horizontalAdvance(m_label) + 12;
    update();
}

void EdgeItem::themeChanged()
{
    prepareGeometryChange();
    m_labelWidth = QFontMetricsF(m_scene->theme().smallFont).horizontalAdvance(m_label) + 12;
    update();
}

void EdgeItem::updatePath()
{
    prepareGeometryChange();
    // From below the output port to the rim of the input port, where the arrow head shows.
    const QPointF from = m_producer->outputPortPos() + QPointF(0, 5);
    const QPointF to = m_consumer->inputPortPos(m_slot) - QPointF(0, 6);
    m_path = connectionPath(from, to);
    m_labelCenter = m_path.pointAtPercent(0.5);
}

QRectF EdgeItem::labelRect() const
{
    return QRectF(m_labelCenter.x() - m_labelWidth / 2, m_labelCenter.y() - kLabelHeight / 2,
                  m_labelWidth, kLabelHeight);
}

QRectF EdgeItem::boundingRect() const
{
    QRectF r = m_path.boundingRect().adjusted(-6, -6, 6, 6);
    if (!m_label.isEmpty())
        r = r.united(labelRect().adjusted(-2, -2, 2, 2));
    return r;
}

QPainterPath EdgeItem::shape() const
{
    QPainterPathStroker stroker;
    stroker.setWidth(10);
    QPainterPath s = stroker.createStroke(m_path);
    if (!m_label.isEmpty())
        s.addRect(labelRect());
    return s;
}

void EdgeItem::paint(QPainter* p, const QStyleOptionGraphicsItem* option, QWidget*)
{
    const DesignerTheme& t = m_scene->theme();
    p->setRenderHint(QPainter::Antialiasing);
    const bool selected = isSelected();
    QPen pen(selected ? t.selection : (m_ok ? t.edge : t.error), selected ? 2.5 : 1.6);
    if (!m_ok)
        pen.setStyle(Qt::DashLine);
    p->setPen(pen);
    p->setBrush(Qt::NoBrush);
    p->drawPath(m_path);

    // Arrow head into the input port.
    const QPointF tip = m_path.pointAtPercent(1.0);
    p->setBrush(pen.color());
    p->setPen(Qt::NoPen);
    QPolygonF head;
    head << tip << tip + QPointF(-4, -8) << tip + QPointF(4, -8);
    p->drawPolygon(head);

    const double lod = option->levelOfDetailFromTransform(p->worldTransform());
    if (!m_label.isEmpty() && lod >= 0.35) {
        const QRectF r = labelRect();
        p->setBrush(t.edgeLabelFill);
        p->setPen(QPen(selected ? t.selection : (m_ok ? t.edge : t.error), 1.0));
        p->drawRoundedRect(r, kLabelHeight / 2, kLabelHeight / 2);
        p->setFont(t.smallFont);
        p->setPen(m_ok ? t.edgeLabelText : t.error);
        p->drawText(r, Qt::AlignCenter, m_label);
    }
}

} // namespace ts
