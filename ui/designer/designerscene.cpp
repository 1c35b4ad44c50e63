#include "designer/designerscene.h"

#include <QApplication>
#include <QGraphicsPathItem>
#include <QGraphicsSceneMouseEvent>
#include <QUndoStack>

#include <algorithm>
#include <map>
#include <numeric>
#include <unordered_set>

#include "designer/edgeitem.h"
#include "designer/format.h"
#include "designer/modeldocument.h"

namespace ts {

DesignerScene::DesignerScene(ModelDocument* doc, QObject* parent)
    : QGraphicsScene(parent), m_doc(doc),
      m_theme(DesignerTheme::fromPalette(QApplication::palette(), QApplication::font()))
{
    // Items move and change often; a BSP index rebuilt on every move costs more than it saves
    // for the few hundred items a model has.
    setItemIndexMethod(NoIndex);
    connect(doc, &ModelDocument::modelReset, this, &DesignerScene::rebuild);
    connect(doc, &ModelDocument::layersChanged, this, &DesignerScene::applyDelta);
    connect(doc, &ModelDocument::analysisUpdated, this, &DesignerScene::annotate);
    rebuild();
    if (!doc->analysisPending())
        annotate();
}

DesignerScene::~DesignerScene()
{
    // Items reference the scene's theme while they are destroyed; clear them first.
    m_nodes.clear();
    clear();
}

void DesignerScene::setTheme(const DesignerTheme& theme)
{
    m_theme = theme;
    for (QGraphicsItem* item : items()) {
        if (auto* n = qgraphicsitem_cast<NodeItem*>(item))
            n->themeChanged();
        else if (auto* e = qgraphicsitem_cast<EdgeItem*>(item))
            e->themeChanged();
    }
    if (m_dragLine)
        m_dragLine->setPen(QPen(m_theme.dragLine, 2, Qt::DashLine));
    update();
}

NodeItem* DesignerScene::node(const std::string& id) const
{
    auto it = m_nodes.find(id);
    return it == m_nodes.end() ? nullptr : it->second;
}

EdgeItem* DesignerScene::edge(const std::string& consumer, int slot) const
{
    NodeItem* n = node(consumer);
    if (!n || slot < 0 || slot >= static_cast<int>(n->inEdges().size()))
        return nullptr;
    return n->inEdges()[static_cast<std::size_t>(slot)];
}

// ---- keeping the items in step with the document -------------------------------------------

void DesignerScene::rebuild()
{
    m_applying = true;
    rebuildItems();
    m_applying = false;
    if (m_annotatePending) {
        m_annotatePending = false;
        annotate();
    }
}

void DesignerScene::rebuildItems()
{
    m_drag = Drag{};
    m_dragLine = nullptr;
    m_hiddenEdge = nullptr;
    m_nodes.clear();
    m_dangling.clear();
    m_edgeCount = 0;
    clear();
    const ModelSpec& spec = m_doc->spec();
    for (const LayerSpec& l : spec.layers)
        if (!m_nodes.count(l.id))
            createNode(l);
    for (const LayerSpec& l : spec.layers)
        if (NodeItem* n = node(l.id); n && n->inputIds().empty())
            rebuildInputs(n, l);
}

NodeItem* DesignerScene::createNode(const LayerSpec& layer)
{
    auto* n = new NodeItem(this, layer);
    addItem(n);
    m_nodes[layer.id] = n;
    return n;
}

void DesignerScene::deleteEdge(EdgeItem* e)
{
    NodeItem* p = e->producer();
    NodeItem* c = e->consumer();
    auto& out = p->outEdges();
    out.erase(std::remove(out.begin(), out.end(), e), out.end());
    auto& in = c->inEdges();
    for (EdgeItem*& slot : in)
        if (slot == e)
            slot = nullptr;
    p->setSink(out.empty());
    if (m_hiddenEdge == e)
        m_hiddenEdge = nullptr;
    removeItem(e);
    delete e;
    --m_edgeCount;
}

void DesignerScene::removeNode(const std::string& id)
{
    NodeItem* n = node(id);
    if (!n)
        return;
    for (EdgeItem* e : std::vector<EdgeItem*>(n->inEdges()))
        if (e)
            deleteEdge(e);
    for (EdgeItem* e : std::vector<EdgeItem*>(n->outEdges())) {
        // The consumer still names this layer unless the same edit changes it too; remember it
        // so the edge comes back if a layer of this name appears again.
        m_dangling[id].push_back(e->consumer()->id());
        deleteEdge(e);
    }
    m_nodes.erase(id);
    removeItem(n);
    delete n;
}

void DesignerScene::rebuildInputs(NodeItem* n, const LayerSpec& layer)
{
    for (EdgeItem* e : std::vector<EdgeItem*>(n->inEdges()))
        if (e)
            deleteEdge(e);
    n->inEdges().assign(layer.inputs.size(), nullptr);
    n->inputIds() = layer.inputs;
    for (std::size_t s = 0; s < layer.inputs.size(); ++s) {
        NodeItem* p = node(layer.inputs[s]);
        if (!p || p == n) {
            m_dangling[layer.inputs[s]].push_back(layer.id);
            continue;
        }
        auto* e = new EdgeItem(this, p, n, static_cast<int>(s));
        const NodeAnnotation& a = p->annotation();
        e->setLabel(a.analysed ? (a.ok ? a.outputShape : QStringLiteral("?")) : QString(), a.ok);
        addItem(e);
        n->inEdges()[s] = e;
        p->outEdges().push_back(e);
        p->setSink(false);
        ++m_edgeCount;
    }
}

void DesignerScene::applyDelta(const DocumentDelta& delta)
{
    m_applying = true;
    applyDeltaItems(delta);
    m_applying = false;
    if (m_annotatePending) {
        m_annotatePending = false;
        annotate();
    }
}

void DesignerScene::applyDeltaItems(const DocumentDelta& delta)
{
    for (const std::string& id : delta.removed)
        removeNode(id);
    for (const auto& [from, to] : delta.renamed) {
        auto it = m_nodes.find(from);
        if (it == m_nodes.end())
            continue;
        NodeItem* n = it->second;
        m_nodes.erase(it);
        m_nodes[to] = n;
        n->setId(to);
    }
    std::vector<std::string> revisit;
    for (const std::string& id : delta.added) {
        const LayerSpec* l = m_doc->layer(id);
        if (!l || m_nodes.count(id))
            continue;
        createNode(*l);
    }
    for (const std::string& id : delta.added) {
        const LayerSpec* l = m_doc->layer(id);
        if (NodeItem* n = node(id); n && l)
            rebuildInputs(n, *l);
    }
    // Layers that named an added (or renamed-to) id before it existed get their edges now.
    auto revive = [&](const std::string& id) {
        auto it = m_dangling.find(id);
        if (it == m_dangling.end())
            return;
        std::vector<std::string> consumers = std::move(it->second);
        m_dangling.erase(it);
        for (const std::string& c : consumers)
            revisit.push_back(c);
    };
    for (const std::string& id : delta.added)
        revive(id);
    for (const auto& rename : delta.renamed)
        revive(rename.second);
    for (const std::string& id : delta.changed) {
        const LayerSpec* l = m_doc->layer(id);
        NodeItem* n = node(id);
        if (!l || !n)
            continue;
        n->setLayer(*l);
        if (n->inputIds() != l->inputs)
            rebuildInputs(n, *l);
        else
            n->updateEdges();  // the slot count may have changed the port positions
    }
    for (const std::string& id : revisit) {
        const LayerSpec* l = m_doc->layer(id);
        if (NodeItem* n = node(id); n && l)
            rebuildInputs(n, *l);
    }
}

void DesignerScene::updateEdgeLabels(NodeItem* producer)
{
    const NodeAnnotation& a = producer->annotation();
    for (EdgeItem* e : producer->outEdges())
        e->setLabel(a.ok ? a.outputShape : QStringLiteral("?"), a.ok);
}

void DesignerScene::annotate()
{
    if (m_applying) {
        m_annotatePending = true;
        return;
    }
    int updates = 0;
    for (const auto& [id, n] : m_nodes) {
        NodeAnnotation a;
        a.analysed = true;
        if (const NodeInfo* info = m_doc->nodeInfo(id)) {
            a.ok = info->ok;
            a.outputShape = info->ok ? shapeText(info->outputShape) : QStringLiteral("?");
            a.params = info->paramCount;
            a.flops = info->flops;
        } else {
            a.ok = false;
            a.outputShape = QStringLiteral("?");
        }
        QStringList messages, details;
        for (const Problem* p : m_doc->problemsOf(id)) {
            messages << problemTextForNode(p->message, id);
            details << toQString(p->message)
                           + (p->hint.empty() ? QString() : QStringLiteral("\nhint: ") + toQString(p->hint));
        }
        a.problem = messages.join(QStringLiteral("; "));
        a.problemDetail = details.join(QLatin1Char('\n'));
        const double heightBefore = n->height();
        if (n->setAnnotation(a)) {
            ++updates;
            updateEdgeLabels(n);
            if (n->height() != heightBefore)
                n->updateEdges();
        }
    }
    m_lastAnnotationUpdates = updates;
}

// ---- selection and deletion ----------------------------------------------------------------

std::vector<std::string> DesignerScene::selectedIds() const
{
    std::unordered_set<std::string> selected;
    for (QGraphicsItem* item : selectedItems())
        if (auto* n = qgraphicsitem_cast<NodeItem*>(item))
            selected.insert(n->id());
    std::vector<std::string> out;
    for (const LayerSpec& l : m_doc->spec().layers)
        if (selected.count(l.id))
            out.push_back(l.id);
    return out;
}

std::vector<EdgeItem*> DesignerScene::selectedEdges() const
{
    std::vector<EdgeItem*> out;
    for (QGraphicsItem* item : selectedItems())
        if (auto* e = qgraphicsitem_cast<EdgeItem*>(item))
            out.push_back(e);
    return out;
}

void DesignerScene::selectIds(const std::vector<std::string>& ids)
{
    {
        const QSignalBlocker blocker(this);
        clearSelection();
        for (const std::string& id : ids)
            if (NodeItem* n = node(id))
                n->setSelected(true);
    }
    Q_EMIT selectionChanged();
}

bool DesignerScene::deleteSelection()
{
    const std::vector<std::string> ids = selectedIds();
    const std::unordered_set<std::string> gone(ids.begin(), ids.end());
    // Connections first, by consumer from the last slot down, so slots stay valid.
    std::map<std::string, std::vector<int>> cuts;
    for (EdgeItem* e : selectedEdges())
        if (!gone.count(e->consumer()->id()) && !gone.count(e->producer()->id()))
            cuts[e->consumer()->id()].push_back(e->slot());
    if (ids.empty() && cuts.empty())
        return false;
    QUndoStack* undo = m_doc->undoStack();
    const bool macro = !cuts.empty();
    if (macro)
        undo->beginMacro(ids.empty() ? tr("Delete %1").arg(counted(static_cast<int64_t>(std::accumulate(
                                                                   cuts.begin(), cuts.end(), std::size_t(0),
                                                                   [](std::size_t s, const auto& c) { return s + c.second.size(); })),
                                                               "connection", "connections"))
                                     : tr("Delete selection"));
    for (auto& [consumer, cutSlots] : cuts) {
        std::sort(cutSlots.rbegin(), cutSlots.rend());
        for (int s : cutSlots)
            m_doc->disconnectInput(consumer, s);
    }
    if (!ids.empty())
        m_doc->removeLayers(ids);
    if (macro)
        undo->endMacro();
    return true;
}

QRectF DesignerScene::contentRect() const
{
    QRectF r;
    for (const auto& [id, n] : m_nodes)
        r = r.united(n->sceneBoundingRect());
    return r;
}

// ---- mouse: moving nodes and dragging connections ----------------------------------------

NodeItem* DesignerScene::nodeAt(QPointF pos) const
{
    for (QGraphicsItem* item : items(pos, Qt::IntersectsItemShape, Qt::DescendingOrder))
        if (auto* n = qgraphicsitem_cast<NodeItem*>(item))
            return n;
    return nullptr;
}

void DesignerScene::mousePressEvent(QGraphicsSceneMouseEvent* event)
{
    m_pressOnNode = false;
    if (event->button() == Qt::LeftButton) {
        // Ports first: they sit on the node's rim and take a generous grab radius.
        NodeItem* portNode = nullptr;
        PortHit hit;
        const QPointF pos = event->scenePos();
        for (QGraphicsItem* item : items(QRectF(pos - QPointF(12, 12), QSizeF(24, 24)),
                                         Qt::IntersectsItemBoundingRect, Qt::DescendingOrder)) {
            if (auto* n = qgraphicsitem_cast<NodeItem*>(item)) {
                hit = n->portAt(pos);
                if (hit.kind != PortHit::None) {
                    portNode = n;
                    break;
                }
            }
        }
        if (portNode) {
            m_drag = Drag{};
            m_drag.active = true;
            if (hit.kind == PortHit::Output) {
                m_drag.fromOutput = true;
                m_drag.anchor = portNode->id();
            } else {
                const auto& in = portNode->inEdges();
                EdgeItem* e = hit.slot < static_cast<int>(in.size()) ? in[static_cast<std::size_t>(hit.slot)] : nullptr;
                if (e) {
                    // Pick up the existing connection: drop it elsewhere or into empty space.
                    m_drag.fromOutput = true;
                    m_drag.anchor = e->producer()->id();
                    m_drag.detachConsumer = portNode->id();
                    m_drag.detachSlot = hit.slot;
                    m_hiddenEdge = e;
                    e->setVisible(false);
                } else {
                    m_drag.fromOutput = false;
                    m_drag.anchor = portNode->id();
                    m_drag.anchorSlot = hit.slot;
                }
            }
            if (!m_dragLine) {
                m_dragLine = new QGraphicsPathItem;
                m_dragLine->setZValue(10);
                addItem(m_dragLine);
            }
            m_dragLine->setPen(QPen(m_theme.dragLine, 2, Qt::DashLine));
            m_dragLine->setVisible(true);
            updateDrag(pos);
            event->accept();
            return;
        }
        m_pressOnNode = nodeAt(pos) != nullptr;
    }
    QGraphicsScene::mousePressEvent(event);
    m_userMoving = m_pressOnNode;
}

void DesignerScene::clearDragTarget()
{
    if (m_drag.target)
        m_drag.target->setHighlightedPort(PortHit{});
    m_drag.target = nullptr;
    m_drag.targetHit = PortHit{};
}

void DesignerScene::updateDrag(QPointF pos)
{
    NodeItem* anchor = node(m_drag.anchor);
    if (!anchor)
        return;
    clearDragTarget();
    const PortHit::Kind want = m_drag.fromOutput ? PortHit::Input : PortHit::Output;
    // A port within reach wins; otherwise the node under the cursor (the document picks a slot).
    for (QGraphicsItem* item : items(QRectF(pos - QPointF(16, 16), QSizeF(32, 32)),
                                     Qt::IntersectsItemBoundingRect, Qt::DescendingOrder)) {
        auto* n = qgraphicsitem_cast<NodeItem*>(item);
        if (!n || n == anchor)
            continue;
        const PortHit hit = n->portAt(pos, 16);
        if (hit.kind == want) {
            m_drag.target = n;
            m_drag.targetHit = hit;
            break;
        }
    }
    if (!m_drag.target) {
        NodeItem* n = nodeAt(pos);
        if (n && n != anchor) {
            m_drag.target = n;
            m_drag.targetHit = PortHit{want, -1};
        }
    }
    QPointF end = pos;
    if (m_drag.target && m_drag.targetHit.slot >= 0) {
        m_drag.target->setHighlightedPort(m_drag.targetHit);
        end = want == PortHit::Input ? m_drag.target->inputPortPos(m_drag.targetHit.slot)
                                     : m_drag.target->outputPortPos();
    }
    m_dragLine->setPath(m_drag.fromOutput
                            ? connectionPath(anchor->outputPortPos() + QPointF(0, 5), end)
                            : connectionPath(end, anchor->inputPortPos(m_drag.anchorSlot)));
}

void DesignerScene::finishDrag(QPointF pos)
{
    updateDrag(pos);
    const Drag drag = m_drag;
    const std::string target = drag.target ? drag.target->id() : std::string();
    const int slot = drag.targetHit.slot;
    clearDragTarget();
    m_drag = Drag{};
    if (m_dragLine)
        m_dragLine->setVisible(false);
    if (m_hiddenEdge) {
        m_hiddenEdge->setVisible(true);
        m_hiddenEdge = nullptr;
    }

    QString why;
    if (!drag.fromOutput) {
        if (!target.empty() && !m_doc->connectLayers(target, drag.anchor, drag.anchorSlot, &why))
            Q_EMIT message(tr("Cannot connect: %1").arg(why));
        return;
    }
    if (drag.detachConsumer.empty()) {
        if (!target.empty() && !m_doc->connectLayers(drag.anchor, target, slot, &why))
            Q_EMIT message(tr("Cannot connect: %1").arg(why));
        return;
    }
    // A picked-up connection: dropped in empty space it is removed, elsewhere it moves.
    if (target.empty()) {
        m_doc->disconnectInput(drag.detachConsumer, drag.detachSlot);
        return;
    }
    if (target == drag.detachConsumer && (slot == drag.detachSlot || slot < 0))
        return;
    if (target != drag.detachConsumer && !m_doc->canConnect(drag.anchor, target, slot, &why)) {
        Q_EMIT message(tr("Cannot connect: %1").arg(why));
        return;
    }
    QUndoStack* undo = m_doc->undoStack();
    undo->beginMacro(tr("Reconnect %1 → %2").arg(toQString(drag.anchor), toQString(target)));
    m_doc->disconnectInput(drag.detachConsumer, drag.detachSlot);
    int newSlot = slot;
    if (target == drag.detachConsumer && slot > drag.detachSlot)
        --newSlot;  // the slots after the removed one moved up
    m_doc->connectLayers(drag.anchor, target, newSlot, &why);
    undo->endMacro();
}

void DesignerScene::mouseMoveEvent(QGraphicsSceneMouseEvent* event)
{
    if (m_drag.active) {
        updateDrag(event->scenePos());
        event->accept();
        return;
    }
    QGraphicsScene::mouseMoveEvent(event);
}

void DesignerScene::mouseReleaseEvent(QGraphicsSceneMouseEvent* event)
{
    if (m_drag.active && event->button() == Qt::LeftButton) {
        finishDrag(event->scenePos());
        event->accept();
        return;
    }
    QGraphicsScene::mouseReleaseEvent(event);
    if (m_userMoving && event->button() == Qt::LeftButton) {
        m_userMoving = false;
        std::vector<std::pair<std::string, QPointF>> moves;
        for (QGraphicsItem* item : selectedItems())
            if (auto* n = qgraphicsitem_cast<NodeItem*>(item)) {
                const LayerSpec* l = m_doc->layer(n->id());
                if (l && (l->x != n->pos().x() || l->y != n->pos().y()))
                    moves.emplace_back(n->id(), n->pos());
            }
        if (!moves.empty())
            m_doc->moveLayers(moves);
    }
}

void DesignerScene::mouseDoubleClickEvent(QGraphicsSceneMouseEvent* event)
{
    if (NodeItem* n = nodeAt(event->scenePos())) {
        Q_EMIT nodeActivated(n->id());
        event->accept();
        return;
    }
    QGraphicsScene::mouseDoubleClickEvent(event);
}

} // namespace ts
