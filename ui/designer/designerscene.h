#pragma once
// DesignerScene: the canvas as a view of a ModelDocument. It keeps one NodeItem per layer and
// one EdgeItem per connection, updates only the items an edit touched (DocumentDelta), and
// annotates them from the document's analysis (shapes on edges, params/FLOPs and problems on
// nodes), again touching only items whose annotation changed. User gestures (moving nodes,
// dragging connections between ports, deleting) become document edits; the scene never changes
// the model behind the document's back.

#include <QGraphicsScene>

#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "designer/nodeitem.h"
#include "designer/theme.h"

class QGraphicsPathItem;

namespace ts {

class EdgeItem;
class ModelDocument;
struct DocumentDelta;

class DesignerScene : public QGraphicsScene {
    Q_OBJECT
public:
    explicit DesignerScene(ModelDocument* doc, QObject* parent = nullptr);
    ~DesignerScene() override;

    ModelDocument* document() const { return m_doc; }
    const DesignerTheme& theme() const { return m_theme; }
    void setTheme(const DesignerTheme& theme);

    NodeItem* node(const std::string& id) const;
    EdgeItem* edge(const std::string& consumer, int slot) const;
    int nodeCount() const { return static_cast<int>(m_nodes.size()); }
    int edgeCount() const { return m_edgeCount; }

    std::vector<std::string> selectedIds() const;  // selected layers, in model order
    std::vector<EdgeItem*> selectedEdges() const;
    void selectIds(const std::vector<std::string>& ids);  // replaces the selection
    // Deletes the selected layers and connections as one undoable edit.
    bool deleteSelection();
    // The layers' bounding rectangle (empty if there are none).
    QRectF contentRect() const;
    bool isUserMoving() const { return m_userMoving; }
    // How many node items were repainted or re-annotated by the last analysis (for tests and
    // the "only what changed" promise).
    int lastAnnotationUpdates() const { return m_lastAnnotationUpdates; }

Q_SIGNALS:
    // A short message for the status bar (e.g. why a connection was refused).
    void message(const QString& text);
    void nodeActivated(const std::string& id);  // double-click on a node

protected:
    void mousePressEvent(QGraphicsSceneMouseEvent* event) override;
    void mouseMoveEvent(QGraphicsSceneMouseEvent* event) override;
    void mouseReleaseEvent(QGraphicsSceneMouseEvent* event) override;
    void mouseDoubleClickEvent(QGraphicsSceneMouseEvent* event) override;

private:
    void rebuild();
    void rebuildItems();
    void applyDelta(const DocumentDelta& delta);
    void applyDeltaItems(const DocumentDelta& delta);
    void annotate();
    NodeItem* createNode(const LayerSpec& layer);
    void removeNode(const std::string& id);
    void rebuildInputs(NodeItem* node, const LayerSpec& layer);
    void deleteEdge(EdgeItem* edge);
    void updateEdgeLabels(NodeItem* producer);
    NodeItem* nodeAt(QPointF scenePos) const;

    // The connection being dragged from a port.
    struct Drag {
        bool active = false;
        bool fromOutput = true;      // dragging from an output port towards an input
        std::string anchor;          // the node the drag started from (producer or consumer)
        int anchorSlot = 0;          // consumer slot when dragging from an input
        std::string detachConsumer;  // picked up an existing edge: its consumer and slot
        int detachSlot = -1;
        NodeItem* target = nullptr;
        PortHit targetHit;
    };
    void updateDrag(QPointF scenePos);
    void finishDrag(QPointF scenePos);
    void clearDragTarget();

    ModelDocument* m_doc;
    DesignerTheme m_theme;
    std::unordered_map<std::string, NodeItem*> m_nodes;
    // Consumers whose input names a layer that does not exist (yet): producer id -> consumers.
    std::unordered_map<std::string, std::vector<std::string>> m_dangling;
    int m_edgeCount = 0;
    Drag m_drag;
    QGraphicsPathItem* m_dragLine = nullptr;
    EdgeItem* m_hiddenEdge = nullptr;
    bool m_userMoving = false;
    // An analysis can arrive while an edit is being applied (a slot reacting to a selection
    // change asks for it): annotate once the items are consistent again.
    bool m_applying = false;
    bool m_annotatePending = false;
    bool m_pressOnNode = false;
    int m_lastAnnotationUpdates = 0;
};

} // namespace ts
