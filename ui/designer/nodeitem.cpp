#include "designer/nodeitem.h"

#include <QCursor>
#include <QFontMetricsF>
#include <QGraphicsSceneHoverEvent>
#include <QPainter>
#include <QStyleOptionGraphicsItem>

#include <cmath>

#include "designer/designerscene.h"
#include "designer/edgeitem.h"
#include "designer/format.h"
#include "designer/theme.h"

namespace ts {

using nlohmann::json;

namespace {

constexpr double kHeader = 22;
constexpr double kRow = 18;
constexpr double kBody = kHeader + 2 * kRow + 6;  // 64
constexpr double kProblemBand = 20;
constexpr double kPortRadius = 5;
constexpr double kPillGap = 8, kPillHeight = 16;

QString numberText(const json& v)
{
    if (v.is_number_integer())
        return QString::number(v.get<int64_t>());
    if (v.is_number())
        return QString::number(v.get<double>(), 'g', 6);
    if (v.is_string())
        return toQString(v.get<std::string>());
    if (v.is_boolean())
        return v.get<bool>() ? QStringLiteral("true") : QStringLiteral("false");
    return toQString(v.dump());
}

QString dimsText(const json& v)
{
    if (v.is_number_integer())
        return QStringLiteral("%1×%1").arg(v.get<int64_t>());
    if (!v.is_array())
        return numberText(v);
    QStringList parts;
    for (const json& d : v)
        parts << numberText(d);
    return parts.join(QChar(0x00D7));
}

bool isOne(const json& v)
{
    if (v.is_number_integer())
        return v.get<int64_t>() == 1;
    if (v.is_array()) {
        for (const json& d : v)
            if (!d.is_number_integer() || d.get<int64_t>() != 1)
                return false;
        return true;
    }
    return false;
}

} // namespace

QString layerSummary(const LayerSpec& layer)
{
    const LayerKind* kind = findLayerKind(layer.type);
    auto get = [&](const char* name) -> json {
        if (layer.attrs.is_object() && layer.attrs.contains(name))
            return layer.attrs[name];
        if (kind)
            for (const AttrSpec& a : kind->attrs)
                if (a.name == name)
                    return a.defaultValue;
        return nullptr;
    };
    const std::string& t = layer.type;
    QStringList parts;
    auto activation = [&] {
        const json a = get("activation");
        if (a.is_string() && a.get<std::string>() != "linear")
            parts << toQString(a.get<std::string>());
    };
    auto padding = [&] {
        const json p = get("padding");
        if (p.is_string() && p.get<std::string>() == "same")
            parts << QStringLiteral("same");
    };
    if (t == "Input") {
        parts << QStringLiteral("shape ") + dimsText(get("shape"));
    } else if (t == "Dense") {
        parts << QStringLiteral("%1 units").arg(numberText(get("units")));
        activation();
        if (get("use_bias") == json(false))
            parts << QStringLiteral("no bias");
    } else if (t == "Conv2D") {
        parts << QStringLiteral("%1 filters").arg(numberText(get("filters")))
              << dimsText(get("kernel_size"));
        const json s = get("strides");
        if (!s.is_null() && !isOne(s))
            parts << QStringLiteral("stride ") + dimsText(s);
        padding();
        activation();
    } else if (t == "MaxPooling2D" || t == "AveragePooling2D") {
        parts << dimsText(get("pool_size"));
        const json s = get("strides");
        if (!s.is_null())
            parts << QStringLiteral("stride ") + dimsText(s);
        padding();
    } else if (t == "Reshape") {
        parts << QStringLiteral("to ") + dimsText(get("target_shape"));
    } else if (t == "Dropout") {
        parts << QStringLiteral("rate ") + numberText(get("rate"));
    } else if (t == "BatchNormalization") {
        parts << QStringLiteral("momentum ") + numberText(get("momentum"))
              << QStringLiteral("ε ") + numberText(get("epsilon"));
    } else if (t == "Activation") {
        parts << numberText(get("activation"));
    } else if (t == "LeakyReLU") {
        parts << QStringLiteral("alpha ") + numberText(get("alpha"));
    } else if (t == "Flatten") {
        parts << QStringLiteral("to one feature vector");
    } else if (t == "ReLU") {
        parts << QStringLiteral("max(x, 0)");
    } else if (t == "Softmax") {
        parts << QStringLiteral("over the last axis");
    } else if (t == "GlobalAveragePooling2D") {
        parts << QStringLiteral("mean over height, width");
    } else if (t == "Add") {
        parts << QStringLiteral("elementwise sum");
    } else if (t == "Concatenate") {
        parts << QStringLiteral("along the last axis");
    } else if (!kind) {
        parts << QStringLiteral("unknown layer type");
    }
    return parts.join(QStringLiteral(" · "));
}

NodeItem::NodeItem(DesignerScene* scene, const LayerSpec& layer) : m_scene(scene)
{
    setFlags(ItemIsSelectable | ItemIsMovable | ItemSendsGeometryChanges);
    setAcceptHoverEvents(true);
    setCacheMode(DeviceCoordinateCache);
    setZValue(1);
    setLayer(layer);
}

const DesignerTheme& NodeItem::theme() const
{
    return m_scene->theme();
}

void NodeItem::setId(const std::string& id)
{
    m_id = id;
    updateTooltip();
    update();
}

void NodeItem::setLayer(const LayerSpec& layer)
{
    const LayerKind* kind = findLayerKind(layer.type);
    const QString summary = layerSummary(layer);
    const int inputs = static_cast<int>(layer.inputs.size());
    const int oldSlots = inputSlotCount();
    if (layer.id != m_id) {
        m_id = layer.id;
        updateTooltip();
        update();
    }
    if (layer.type != m_type || summary != m_summary || inputs != m_inputCount) {
        m_type = layer.type;
        m_group = kind ? kind->group : std::string();
        m_minInputs = kind ? kind->minInputs : 1;
        m_maxInputs = kind ? kind->maxInputs : -1;
        m_inputCount = inputs;
        m_summary = summary;
        if (inputSlotCount() != oldSlots)
            prepareGeometryChange();
        updateTooltip();
        update();
    }
    const QPointF pos(layer.x, layer.y);
    if (this->pos() != pos)
        setPos(pos);
}

bool NodeItem::setAnnotation(const NodeAnnotation& a)
{
    if (a == m_annotation)
        return false;
    if (a.problem.isEmpty() != m_annotation.problem.isEmpty())
        prepareGeometryChange();
    m_annotation = a;
    updateTooltip();
    update();
    return true;
}

void NodeItem::setSink(bool sink)
{
    if (sink == m_sink)
        return;
    prepareGeometryChange();
    m_sink = sink;
    update();
}

void NodeItem::themeChanged()
{
    update();
}

void NodeItem::updateTooltip()
{
    const LayerKind* kind = findLayerKind(m_type);
    QString tip = QStringLiteral("<b>%1</b> &nbsp;%2").arg(toQString(m_type).toHtmlEscaped(),
                                                         toQString(m_id).toHtmlEscaped());
    if (kind)
        tip += QStringLiteral("<br>") + toQString(kind->description).toHtmlEscaped();
    if (m_annotation.analysed && m_annotation.ok)
        tip += QStringLiteral("<br>output %1 · %2 params · %3 FLOPs")
                   .arg(m_annotation.outputShape, exactCount(m_annotation.params),
                        exactCount(m_annotation.flops));
    if (!m_annotation.problemDetail.isEmpty())
        tip += QStringLiteral("<br><span style='color:#dc2626'>%1</span>")
                   .arg(m_annotation.problemDetail.toHtmlEscaped().replace(QLatin1Char('\n'),
                                                                          QStringLiteral("<br>")));
    setToolTip(tip);
}

double NodeItem::height() const
{
    return kBody + (hasProblem() ? kProblemBand : 0);
}

int NodeItem::inputSlotCount() const
{
    if (m_maxInputs == 0)
        return 0;
    int slotCount = m_inputCount;
    if (m_maxInputs < 0 || m_inputCount < m_maxInputs)
        ++slotCount;  // a free port to connect to
    return std::max(slotCount, std::max(m_minInputs, 1));
}

QPointF NodeItem::inputPortPos(int slot) const
{
    const int k = std::max(1, inputSlotCount());
    const double x = -kWidth / 2 + kWidth * (slot + 1) / (k + 1);
    return mapToScene(QPointF(x, 0));
}

QPointF NodeItem::outputPortPos() const
{
    return mapToScene(QPointF(0, height()));
}

PortHit NodeItem::portAt(QPointF scenePos, double radius) const
{
    PortHit best;
    double bestDist = radius;
    auto consider = [&](QPointF p, PortHit::Kind kind, int slot) {
        const double d = std::hypot(p.x() - scenePos.x(), p.y() - scenePos.y());
        if (d <= bestDist) {
            bestDist = d;
            best.kind = kind;
            best.slot = slot;
        }
    };
    for (int s = 0; s < inputSlotCount(); ++s)
        consider(inputPortPos(s), PortHit::Input, s);
    consider(outputPortPos(), PortHit::Output, 0);
    return best;
}

void NodeItem::setHighlightedPort(PortHit hit)
{
    if (hit.kind == m_highlight.kind && hit.slot == m_highlight.slot)
        return;
    m_highlight = hit;
    update();
}

void NodeItem::updateEdges()
{
    for (EdgeItem* e : m_in)
        if (e)
            e->updatePath();
    for (EdgeItem* e : m_out)
        e->updatePath();
}

QRectF NodeItem::boundingRect() const
{
    const double bottom = height() + kPortRadius + 2 + (m_sink ? kPillGap + kPillHeight + 2 : 0);
    return QRectF(-kWidth / 2 - 4, -kPortRadius - 3, kWidth + 8, bottom + kPortRadius + 3);
}

QPainterPath NodeItem::shape() const
{
    QPainterPath p;
    p.addRoundedRect(QRectF(-kWidth / 2, -kPortRadius - 2, kWidth, height() + 2 * kPortRadius + 4), 6, 6);
    return p;
}

void NodeItem::paint(QPainter* p, const QStyleOptionGraphicsItem* option, QWidget*)
{
    const DesignerTheme& t = theme();
    const double h = height();
    const QRectF body(-kWidth / 2, 0, kWidth, h);
    const QColor accent = t.groupColor(m_group);
    const bool selected = isSelected();
    const double lod = option->levelOfDetailFromTransform(p->worldTransform());
    p->setRenderHint(QPainter::Antialiasing);

    // Body, header band and outline.
    QPainterPath bodyPath;
    bodyPath.addRoundedRect(body, 6, 6);
    p->fillPath(bodyPath, t.nodeFill);
    {
        p->save();
        p->setClipPath(bodyPath);
        QColor band = accent;
        band.setAlphaF(t.dark ? 0.35f : 0.16f);
        p->fillRect(QRectF(body.left(), 0, kWidth, kHeader), band);
        p->fillRect(QRectF(body.left(), 0, 4, h), accent);
        if (hasProblem())
            p->fillRect(QRectF(body.left(), kBody, kWidth, kProblemBand), t.errorFill);
        p->restore();
    }
    QPen outline(hasProblem() ? t.error : selected ? t.selection : t.nodeBorder,
                 hasProblem() || selected ? 2.0 : 1.0);
    if (hasProblem() && selected)
        outline.setStyle(Qt::DashLine);
    p->setPen(outline);
    p->setBrush(Qt::NoBrush);
    p->drawPath(bodyPath);
    if (hasProblem() && selected) {
        p->setPen(QPen(t.selection, 1.0));
        p->drawRoundedRect(body.adjusted(-3, -3, 3, 3), 8, 8);
    }

    if (lod >= 0.35) {
        // Header: type (bold) and name.
        const double left = body.left() + 10, right = body.right() - 8;
        p->setFont(t.titleFont);
        p->setPen(t.nodeText);
        const QFontMetricsF titleFm(t.titleFont);
        const QString type = toQString(m_type);
        const double typeWidth = std::min(titleFm.horizontalAdvance(type), (right - left) * 0.6);
        p->drawText(QRectF(left, 0, typeWidth + 1, kHeader), Qt::AlignVCenter | Qt::AlignLeft,
                    titleFm.elidedText(type, Qt::ElideRight, typeWidth + 1));
        p->setFont(t.bodyFont);
        p->setPen(t.nodeSubtext);
        const QFontMetricsF bodyFm(t.bodyFont);
        const double idLeft = left + typeWidth + 8;
        p->drawText(QRectF(idLeft, 0, right - idLeft, kHeader), Qt::AlignVCenter | Qt::AlignRight,
                    bodyFm.elidedText(toQString(m_id), Qt::ElideMiddle, right - idLeft));

        // Attributes.
        p->setPen(t.nodeText);
        p->drawText(QRectF(left, kHeader + 2, right - left, kRow), Qt::AlignVCenter | Qt::AlignLeft,
                    bodyFm.elidedText(m_summary, Qt::ElideRight, right - left));

        // Parameters and FLOPs.
        QString stats;
        if (m_annotation.analysed && m_annotation.ok) {
            QStringList parts;
            if (m_annotation.params > 0)
                parts << compactCount(m_annotation.params) + QStringLiteral(" params");
            if (m_annotation.flops > 0)
                parts << compactCount(m_annotation.flops) + QStringLiteral(" FLOPs");
            stats = parts.isEmpty() ? QStringLiteral("no weights, no arithmetic")
                                    : parts.join(QStringLiteral(" · "));
        } else if (m_annotation.analysed) {
            stats = QStringLiteral("shape unknown");
        }
        p->setFont(t.smallFont);
        p->setPen(t.nodeSubtext);
        const QFontMetricsF smallFm(t.smallFont);
        p->drawText(QRectF(left, kHeader + kRow + 2, right - left, kRow),
                    Qt::AlignVCenter | Qt::AlignLeft, smallFm.elidedText(stats, Qt::ElideRight, right - left));

        if (hasProblem()) {
            p->setPen(t.error);
            p->setFont(t.bodyFont);
            p->drawText(QRectF(left, kBody, right - left, kProblemBand), Qt::AlignVCenter | Qt::AlignLeft,
                        bodyFm.elidedText(QStringLiteral("⚠ ") + m_annotation.problem,
                                          Qt::ElideRight, right - left));
        }
    }

    // Ports.
    auto port = [&](QPointF c, bool highlighted, bool filled) {
        p->setPen(QPen(highlighted ? t.portHover : t.port, highlighted ? 2.0 : 1.2));
        p->setBrush(filled ? (highlighted ? t.portHover : t.port) : t.nodeFill);
        const double r = highlighted ? kPortRadius + 1.5 : kPortRadius;
        p->drawEllipse(c, r, r);
    };
    const int slotCount = inputSlotCount();
    for (int s = 0; s < slotCount; ++s) {
        const double x = -kWidth / 2 + kWidth * (s + 1) / (slotCount + 1);
        port(QPointF(x, 0), m_highlight.kind == PortHit::Input && m_highlight.slot == s,
             s < m_inputCount);
    }
    port(QPointF(0, h), m_highlight.kind == PortHit::Output, !m_out.empty());

    // A sink shows its output shape below itself (other nodes show it on their edges).
    if (m_sink && m_annotation.analysed && lod >= 0.35) {
        const QString text = m_annotation.ok ? m_annotation.outputShape : QStringLiteral("?");
        p->setFont(t.smallFont);
        const QFontMetricsF fm(t.smallFont);
        const double w = fm.horizontalAdvance(text) + 14;
        const QRectF pill(-w / 2, h + kPillGap, w, kPillHeight);
        p->setPen(QPen(t.edge, 1.2));
        p->drawLine(QPointF(0, h + kPortRadius), QPointF(0, pill.top()));
        p->setBrush(t.edgeLabelFill);
        p->setPen(QPen(m_annotation.ok ? t.edge : t.error, 1.0));
        p->drawRoundedRect(pill, kPillHeight / 2, kPillHeight / 2);
        p->setPen(m_annotation.ok ? t.edgeLabelText : t.error);
        p->drawText(pill, Qt::AlignCenter, text);
    }
}

QVariant NodeItem::itemChange(GraphicsItemChange change, const QVariant& value)
{
    if (change == ItemPositionChange && m_scene && m_scene->isUserMoving()) {
        // Snap to the grid while dragging, so saved positions stay tidy.
        const QPointF p = value.toPointF();
        return QPointF(std::round(p.x() / 10) * 10, std::round(p.y() / 10) * 10);
    }
    if (change == ItemPositionHasChanged)
        updateEdges();
    if (change == ItemSelectedHasChanged)
        setZValue(value.toBool() ? 2 : 1);
    return QGraphicsItem::itemChange(change, value);
}

void NodeItem::hoverMoveEvent(QGraphicsSceneHoverEvent* event)
{
    const PortHit hit = portAt(event->scenePos());
    setHighlightedPort(hit);
    setCursor(hit.kind == PortHit::None ? Qt::ArrowCursor : Qt::CrossCursor);
    QGraphicsItem::hoverMoveEvent(event);
}

void NodeItem::hoverLeaveEvent(QGraphicsSceneHoverEvent* event)
{
    setHighlightedPort(PortHit{});
    unsetCursor();
    QGraphicsItem::hoverLeaveEvent(event);
}

} // namespace ts
