#pragma once
// NodeItem: one layer on the canvas. It shows the layer's type, name, key attributes, parameter
// and FLOP counts, and a problem (red outline and message) when the analysis reports one. Ports:
// input ports along the top (one per input slot, plus a free one on merge layers), one output
// port at the bottom. Position = the layer's (x, y): the node's top centre.

#include <QGraphicsItem>
#include <QString>

#include <string>
#include <vector>

#include "model/spec.h"

namespace ts {

class DesignerScene;
class EdgeItem;
struct DesignerTheme;

// What the analysis says about one node, as shown on it.
struct NodeAnnotation {
    bool analysed = false;
    bool ok = true;            // false: this node or something it depends on has a problem
    QString outputShape;       // "256", "28×28×1", "?"
    int64_t params = 0, flops = 0;
    QString problem;           // this node's own problems (empty if none)
    QString problemDetail;     // full messages and hints, for the tooltip
    bool operator==(const NodeAnnotation&) const = default;
};

struct PortHit {
    enum Kind { None, Input, Output } kind = None;
    int slot = 0;
};

class NodeItem : public QGraphicsItem {
public:
    enum { Type = UserType + 1 };
    static constexpr double kWidth = 180;

    NodeItem(DesignerScene* scene, const LayerSpec& layer);
    int type() const override { return Type; }

    const std::string& id() const { return m_id; }
    const std::string& layerType() const { return m_type; }
    void setLayer(const LayerSpec& layer);  // content and position
    void setId(const std::string& id);
    bool setAnnotation(const NodeAnnotation& a);  // true if it changed
    const NodeAnnotation& annotation() const { return m_annotation; }
    bool hasProblem() const { return !m_annotation.problem.isEmpty(); }
    QString attributeSummary() const { return m_summary; }
    void themeChanged();

    // Input slots shown: the connected inputs plus a free one while more are allowed.
    int inputSlotCount() const;
    int connectedInputs() const { return m_inputCount; }
    QPointF inputPortPos(int slot) const;  // scene coordinates
    QPointF outputPortPos() const;
    PortHit portAt(QPointF scenePos, double radius = 10) const;
    void setHighlightedPort(PortHit hit);

    // Edges: incoming by slot (null where the producer is missing), outgoing in any order.
    std::vector<EdgeItem*>& inEdges() { return m_in; }
    std::vector<EdgeItem*>& outEdges() { return m_out; }
    // The producer ids the incoming edges were built from (to see when they must be rebuilt).
    std::vector<std::string>& inputIds() { return m_inputIds; }
    void updateEdges();
    void setSink(bool sink);  // no consumers: show the output shape below the node
    bool isSink() const { return m_sink; }

    QRectF boundingRect() const override;
    QPainterPath shape() const override;
    void paint(QPainter* painter, const QStyleOptionGraphicsItem* option, QWidget* widget) override;
    double height() const;

protected:
    QVariant itemChange(GraphicsItemChange change, const QVariant& value) override;
    void hoverMoveEvent(QGraphicsSceneHoverEvent* event) override;
    void hoverLeaveEvent(QGraphicsSceneHoverEvent* event) override;

private:
    const DesignerTheme& theme() const;
    void updateTooltip();

    DesignerScene* m_scene;
    std::string m_id, m_type, m_group;
    int m_minInputs = 1, m_maxInputs = 1, m_inputCount = 0;
    QString m_summary;
    NodeAnnotation m_annotation;
    std::vector<EdgeItem*> m_in, m_out;
    std::vector<std::string> m_inputIds;
    bool m_sink = true;
    PortHit m_highlight;
};

// A one-line summary of a layer's main attributes: "256 units · relu", "32 filters · 3×3".
QString layerSummary(const LayerSpec& layer);

} // namespace ts
