#include "designer/modeldocument.h"

#include <QFile>
#include <QFileInfo>
#include <QTimer>
#include <QUndoStack>

#include <algorithm>
#include <cctype>
#include <set>
#include <unordered_set>

#include "designer/autolayout.h"
#include "designer/editcommand.h"
#include "designer/format.h"

namespace ts {

using nlohmann::json;

bool sameLayerIgnoringPosition(const LayerSpec& a, const LayerSpec& b)
{
    return a.id == b.id && a.type == b.type && a.inputs == b.inputs && a.attrs == b.attrs;
}

bool sameLayer(const LayerSpec& a, const LayerSpec& b)
{
    return sameLayerIgnoringPosition(a, b) && a.x == b.x && a.y == b.y;
}

bool sameHeader(const ModelHeader& a, const ModelHeader& b)
{
    return a.name == b.name && a.outputs == b.outputs && a.compile == b.compile;
}

ModelDocument::ModelDocument(QObject* parent)
    : QObject(parent), m_undo(new QUndoStack(this)), m_analysisTimer(new QTimer(this))
{
    qRegisterMetaType<ts::DocumentDelta>();
    m_analysisTimer->setSingleShot(true);
    m_analysisTimer->setInterval(0);  // coalesces all edits of one event-loop pass
    connect(m_analysisTimer, &QTimer::timeout, this, &ModelDocument::runAnalysis);
    connect(m_undo, &QUndoStack::cleanChanged, this,
            [this](bool clean) { Q_EMIT modifiedChanged(!clean); });
    scheduleAnalysis();
}

ModelDocument::~ModelDocument() = default;

ModelHeader ModelDocument::header() const
{
    return ModelHeader{m_spec.name, m_spec.outputs, m_spec.compile};
}

void ModelDocument::rebuildIndex() const
{
    m_index.clear();
    m_index.reserve(m_spec.layers.size());
    for (std::size_t i = 0; i < m_spec.layers.size(); ++i)
        m_index.emplace(m_spec.layers[i].id, static_cast<int>(i));  // first occurrence wins
    m_indexDirty = false;
}

int ModelDocument::indexOf(const std::string& id) const
{
    if (m_indexDirty)
        rebuildIndex();
    auto it = m_index.find(id);
    return it == m_index.end() ? -1 : it->second;
}

const LayerSpec* ModelDocument::layer(const std::string& id) const
{
    const int i = indexOf(id);
    return i < 0 ? nullptr : &m_spec.layers[static_cast<std::size_t>(i)];
}

std::vector<std::string> ModelDocument::consumersOf(const std::string& id) const
{
    std::vector<std::string> out;
    for (const LayerSpec& l : m_spec.layers)
        if (std::find(l.inputs.begin(), l.inputs.end(), id) != l.inputs.end())
            out.push_back(l.id);
    return out;
}

bool ModelDocument::isModified() const
{
    return !m_undo->isClean();
}

// ---- analysis --------------------------------------------------------------------------------

void ModelDocument::scheduleAnalysis()
{
    m_analysisDirty = true;
    m_analysisTimer->start();
}

void ModelDocument::runAnalysis()
{
    m_analysisTimer->stop();
    if (!m_analysisDirty)
        return;
    m_analysis = analyzeModel(m_spec);
    ++m_analysisCount;
    m_nodeIndex.clear();
    m_nodeIndex.reserve(m_analysis.nodes.size());
    for (std::size_t i = 0; i < m_analysis.nodes.size(); ++i)
        m_nodeIndex.emplace(m_analysis.nodes[i].id, static_cast<int>(i));
    m_problemIndex.clear();
    for (std::size_t i = 0; i < m_analysis.problems.size(); ++i)
        m_problemIndex[m_analysis.problems[i].nodeId].push_back(static_cast<int>(i));
    m_analysisDirty = false;
    Q_EMIT analysisUpdated();
}

const GraphAnalysis& ModelDocument::analysis()
{
    if (m_analysisDirty)
        runAnalysis();
    return m_analysis;
}

const NodeInfo* ModelDocument::nodeInfo(const std::string& id)
{
    analysis();
    auto it = m_nodeIndex.find(id);
    return it == m_nodeIndex.end() ? nullptr : &m_analysis.nodes[static_cast<std::size_t>(it->second)];
}

std::vector<const Problem*> ModelDocument::problemsOf(const std::string& id)
{
    analysis();
    std::vector<const Problem*> out;
    auto it = m_problemIndex.find(id);
    if (it != m_problemIndex.end())
        for (int k : it->second)
            out.push_back(&m_analysis.problems[static_cast<std::size_t>(k)]);
    return out;
}

// ---- applying edits --------------------------------------------------------------------------

void ModelDocument::apply(const std::vector<LayerChange>& changes, bool forward,
                          const std::optional<ModelHeader>& header)
{
    DocumentDelta delta;
    std::set<std::string> removed, added;
    auto step = [&](const LayerChange& c) {
        const std::optional<LayerSpec>& from = forward ? c.before : c.after;
        const std::optional<LayerSpec>& to = forward ? c.after : c.before;
        auto& layers = m_spec.layers;
        const auto at = layers.begin() + c.index;
        if (from && !to) {
            Q_ASSERT(c.index < static_cast<int>(layers.size()) && at->id == from->id);
            layers.erase(at);
            m_indexDirty = true;
            if (!added.erase(from->id))
                removed.insert(from->id);
            delta.structural = true;
        } else if (!from && to) {
            layers.insert(at, *to);
            m_indexDirty = true;
            if (!removed.erase(to->id))
                added.insert(to->id);
            delta.structural = true;
        } else if (from && to) {
            Q_ASSERT(at->id == from->id);
            *at = *to;
            if (from->id != to->id) {
                m_indexDirty = true;
                delta.renamed.emplace_back(from->id, to->id);
            }
            delta.changed.push_back(to->id);
            delta.structural = delta.structural || !sameLayerIgnoringPosition(*from, *to);
        }
    };
    if (forward)
        for (const LayerChange& c : changes)
            step(c);
    else
        for (auto it = changes.rbegin(); it != changes.rend(); ++it)
            step(*it);
    if (header) {
        delta.header = true;
        m_spec.name = header->name;
        m_spec.outputs = header->outputs;
        m_spec.compile = header->compile;
        delta.structural = true;  // outputs take part in the analysis
    }
    delta.removed.assign(removed.begin(), removed.end());
    delta.added.assign(added.begin(), added.end());
    // A layer removed and re-added in one edit (id reuse) shows up in both lists, which views
    // handle in order; changed ids that were removed afterwards are dropped.
    delta.changed.erase(std::remove_if(delta.changed.begin(), delta.changed.end(),
                                       [&](const std::string& id) { return removed.count(id) > 0; }),
                        delta.changed.end());
    std::sort(delta.changed.begin(), delta.changed.end());
    delta.changed.erase(std::unique(delta.changed.begin(), delta.changed.end()), delta.changed.end());

    if (delta.structural)
        scheduleAnalysis();
    Q_EMIT layersChanged(delta);
    if (delta.header)
        Q_EMIT headerChanged();
}

void ModelDocument::push(const QString& text, std::vector<LayerChange> changes,
                         std::optional<std::pair<ModelHeader, ModelHeader>> header,
                         const std::string& mergeKey)
{
    m_undo->push(new EditCommand(this, text, std::move(changes), std::move(header), mergeKey));
}

// ---- files -----------------------------------------------------------------------------------

void ModelDocument::reset(ModelSpec spec, const QString& filePath, bool modified)
{
    m_spec = std::move(spec);
    m_indexDirty = true;
    m_undo->clear();
    if (modified)
        m_undo->resetClean();  // no clean state in the history: unsaved until saved
    else
        m_undo->setClean();
    if (filePath != m_filePath) {
        m_filePath = filePath;
        Q_EMIT filePathChanged(m_filePath);
    }
    m_importedFrom.clear();
    // Views rebuild their items first, then annotate them from the fresh analysis.
    m_analysisDirty = true;
    Q_EMIT modelReset();
    runAnalysis();
    Q_EMIT modifiedChanged(modified);
}

std::vector<LayerChange> ModelDocument::idFixes() const
{
    // Duplicate or empty ids cannot be told apart on the canvas; rename the later ones.
    std::vector<LayerChange> changes;
    std::unordered_set<std::string> seen;
    std::unordered_set<std::string> all;
    for (const LayerSpec& l : m_spec.layers)
        all.insert(l.id);
    for (std::size_t i = 0; i < m_spec.layers.size(); ++i) {
        const LayerSpec& l = m_spec.layers[i];
        if (!l.id.empty() && seen.insert(l.id).second)
            continue;
        const std::string base = baseIdForType(l.type.empty() ? std::string("layer") : l.type);
        std::string id = base;
        for (int k = 1; all.count(id); ++k)
            id = base + "_" + std::to_string(k);
        all.insert(id);
        seen.insert(id);
        LayerSpec fixed = l;
        fixed.id = id;
        changes.push_back(LayerChange{static_cast<int>(i), l, fixed});
    }
    return changes;
}

Status ModelDocument::open(const QString& path)
{
    QFile f(path);
    if (!f.open(QIODevice::ReadOnly))
        return makeError(ErrorCode::IoError,
                         toStdString(path) + ": cannot open: " + toStdString(f.errorString()),
                         "check that the file exists and is readable");
    const std::string text = f.readAll().toStdString();
    TS_ASSIGN(ModelSpec spec, parseModelText(text, toStdString(path)));
    // Our files carry "format"; anything else parseModelText accepted is a Keras import.
    bool keras = true;
    try {
        const json j = json::parse(text);
        keras = !(j.is_object() && (j.contains("format") || j.contains("layers")));
    } catch (const json::exception&) {
    }
    if (keras) {
        reset(std::move(spec), QString(), true);
        m_importedFrom = path;
    } else {
        reset(std::move(spec), QFileInfo(path).absoluteFilePath());
    }
    std::vector<LayerChange> fixes = idFixes();
    if (!fixes.empty())
        push(tr("Rename duplicate ids (%1)").arg(counted(static_cast<int64_t>(fixes.size()), "layer", "layers")),
             std::move(fixes));
    return okStatus();
}

Status ModelDocument::save(const QString& path)
{
    TS_TRY(saveModelFile(m_spec, toStdString(path)));
    const QString abs = QFileInfo(path).absoluteFilePath();
    if (abs != m_filePath) {
        m_filePath = abs;
        Q_EMIT filePathChanged(m_filePath);
    }
    m_importedFrom.clear();
    m_undo->setClean();
    return okStatus();
}

// ---- ids -------------------------------------------------------------------------------------

std::string ModelDocument::baseIdForType(const std::string& type)
{
    // Keras' to_snake_case: "(.)([A-Z][a-z]+)" -> "\1_\2", then "([a-z])([A-Z])" -> "\1_\2".
    std::string s;
    for (std::size_t i = 0; i < type.size(); ++i) {
        const char c = type[i];
        if (i > 0 && std::isupper(static_cast<unsigned char>(c)) && i + 1 < type.size()
            && std::islower(static_cast<unsigned char>(type[i + 1])))
            s += '_';
        s += c;
    }
    std::string out;
    for (std::size_t i = 0; i < s.size(); ++i) {
        const char c = s[i];
        if (i > 0 && std::isupper(static_cast<unsigned char>(c))
            && std::islower(static_cast<unsigned char>(s[i - 1])))
            out += '_';
        out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    }
    return out.empty() ? std::string("layer") : out;
}

std::string ModelDocument::uniqueId(const std::string& type) const
{
    const std::string base = baseIdForType(type);
    if (!contains(base))
        return base;
    for (int k = 1;; ++k) {
        std::string id = base + "_" + std::to_string(k);
        if (!contains(id))
            return id;
    }
}

bool ModelDocument::isValidId(const std::string& id, QString* why)
{
    auto fail = [why](const QString& m) {
        if (why)
            *why = m;
        return false;
    };
    if (id.empty())
        return fail(tr("a layer name cannot be empty"));
    // The id is the Keras layer name and the weight prefix ("<id>/kernel").
    for (char c : id)
        if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.'))
            return fail(tr("use letters, digits, '_', '-' and '.' only"));
    return true;
}

// ---- edits -----------------------------------------------------------------------------------

std::string ModelDocument::addLayer(const std::string& type, QPointF pos,
                                    const std::string& connectFrom)
{
    const LayerKind* kind = findLayerKind(type);
    if (!kind)
        return {};
    LayerSpec l;
    l.id = uniqueId(type);
    l.type = type;
    // Required attributes start at the catalogue's suggestion so the node is valid at once.
    for (const AttrSpec& a : kind->attrs)
        if (a.required && !a.defaultValue.is_null())
            l.attrs[a.name] = a.defaultValue;
    if (!connectFrom.empty() && kind->maxInputs != 0 && contains(connectFrom))
        l.inputs.push_back(connectFrom);
    l.x = pos.x();
    l.y = pos.y();
    const QString text = tr("Add %1 '%2'").arg(toQString(type), toQString(l.id));
    const std::string id = l.id;
    push(text, {LayerChange{static_cast<int>(m_spec.layers.size()), std::nullopt, std::move(l)}});
    return id;
}

bool ModelDocument::removeLayers(const std::vector<std::string>& ids)
{
    std::unordered_set<std::string> gone;
    std::vector<int> indices;
    for (const std::string& id : ids) {
        const int i = indexOf(id);
        if (i >= 0 && gone.insert(id).second)
            indices.push_back(i);
    }
    if (indices.empty())
        return false;
    std::vector<LayerChange> changes;
    // Consumers lose the connections first (same indices), then removals from the back.
    for (std::size_t i = 0; i < m_spec.layers.size(); ++i) {
        const LayerSpec& l = m_spec.layers[i];
        if (gone.count(l.id))
            continue;
        LayerSpec after = l;
        after.inputs.erase(std::remove_if(after.inputs.begin(), after.inputs.end(),
                                          [&](const std::string& in) { return gone.count(in) > 0; }),
                           after.inputs.end());
        if (after.inputs != l.inputs)
            changes.push_back(LayerChange{static_cast<int>(i), l, std::move(after)});
    }
    std::sort(indices.rbegin(), indices.rend());
    for (int i : indices)
        changes.push_back(LayerChange{i, m_spec.layers[static_cast<std::size_t>(i)], std::nullopt});
    std::optional<std::pair<ModelHeader, ModelHeader>> header;
    ModelHeader h = this->header();
    ModelHeader h2 = h;
    h2.outputs.erase(std::remove_if(h2.outputs.begin(), h2.outputs.end(),
                                    [&](const std::string& o) { return gone.count(o) > 0; }),
                     h2.outputs.end());
    if (h2.outputs != h.outputs)
        header = std::make_pair(h, h2);
    const QString text = indices.size() == 1
                             ? tr("Delete '%1'").arg(toQString(m_spec.layers[static_cast<std::size_t>(indices[0])].id))
                             : tr("Delete %1 layers").arg(indices.size());
    push(text, std::move(changes), std::move(header));
    return true;
}

std::optional<LayerChange> ModelDocument::connectionChange(const std::string& from,
                                                          const std::string& to, int slot,
                                                          QString* why) const
{
    auto fail = [why](const QString& m) {
        if (why)
            *why = m;
        return std::optional<LayerChange>();
    };
    const int fi = indexOf(from), ti = indexOf(to);
    if (fi < 0 || ti < 0)
        return fail(tr("no such layer"));
    if (from == to)
        return fail(tr("a layer cannot take its own output"));
    const LayerSpec& target = m_spec.layers[static_cast<std::size_t>(ti)];
    const LayerKind* kind = findLayerKind(target.type);
    const int maxInputs = kind ? kind->maxInputs : -1;
    if (maxInputs == 0)
        return fail(tr("'%1' is an %2 layer: it takes no inputs")
                        .arg(toQString(to), toQString(target.type)));
    // A cycle: `to` already feeds `from` (directly or not).
    {
        std::unordered_map<std::string, std::vector<std::string>> consumers;
        for (const LayerSpec& l : m_spec.layers)
            for (const std::string& in : l.inputs)
                consumers[in].push_back(l.id);
        std::vector<std::string> stack{to};
        std::unordered_set<std::string> seen{to};
        while (!stack.empty()) {
            const std::string v = stack.back();
            stack.pop_back();
            if (v == from)
                return fail(tr("connecting '%1' to '%2' would make a cycle")
                                .arg(toQString(from), toQString(to)));
            for (const std::string& c : consumers[v])
                if (seen.insert(c).second)
                    stack.push_back(c);
        }
    }
    LayerSpec after = target;
    const int count = static_cast<int>(after.inputs.size());
    if (slot < 0)
        slot = (maxInputs == 1) ? 0 : count;
    slot = std::min(slot, count);
    if (slot == count) {
        if (maxInputs > 0 && count >= maxInputs)
            return fail(tr("'%1' takes at most %2").arg(toQString(to), counted(maxInputs, "input", "inputs")));
        after.inputs.push_back(from);
    } else {
        if (after.inputs[static_cast<std::size_t>(slot)] == from)
            return fail(tr("already connected"));
        after.inputs[static_cast<std::size_t>(slot)] = from;
    }
    return LayerChange{ti, target, std::move(after)};
}

bool ModelDocument::canConnect(const std::string& from, const std::string& to, int slot,
                               QString* why) const
{
    return connectionChange(from, to, slot, why).has_value();
}

bool ModelDocument::connectLayers(const std::string& from, const std::string& to, int slot,
                                  QString* why)
{
    std::optional<LayerChange> change = connectionChange(from, to, slot, why);
    if (!change)
        return false;
    push(tr("Connect %1 → %2").arg(toQString(from), toQString(to)), {std::move(*change)});
    return true;
}

bool ModelDocument::disconnectInput(const std::string& to, int slot)
{
    const int ti = indexOf(to);
    if (ti < 0)
        return false;
    const LayerSpec& target = m_spec.layers[static_cast<std::size_t>(ti)];
    if (slot < 0 || slot >= static_cast<int>(target.inputs.size()))
        return false;
    LayerSpec after = target;
    const std::string from = after.inputs[static_cast<std::size_t>(slot)];
    after.inputs.erase(after.inputs.begin() + slot);
    push(tr("Disconnect %1 → %2").arg(toQString(from), toQString(to)),
         {LayerChange{ti, target, std::move(after)}});
    return true;
}

bool ModelDocument::setAttribute(const std::string& id, const std::string& name, const json& value)
{
    const int i = indexOf(id);
    if (i < 0)
        return false;
    const LayerSpec& before = m_spec.layers[static_cast<std::size_t>(i)];
    LayerSpec after = before;
    if (!after.attrs.is_object())
        after.attrs = json::object();
    if (value.is_null())
        after.attrs.erase(name);
    else
        after.attrs[name] = value;
    if (after.attrs == before.attrs)
        return false;
    const QString text = value.is_null()
                             ? tr("Reset %1.%2").arg(toQString(id), toQString(name))
                             : tr("Set %1.%2 = %3").arg(toQString(id), toQString(name),
                                                        toQString(value.dump()));
    push(text, {LayerChange{i, before, std::move(after)}}, std::nullopt, "attr:" + id + ":" + name);
    return true;
}

bool ModelDocument::renameLayer(const std::string& id, const std::string& newId, QString* why)
{
    const int i = indexOf(id);
    if (i < 0 || id == newId)
        return false;
    if (!isValidId(newId, why))
        return false;
    if (contains(newId)) {
        if (why)
            *why = tr("there is already a layer named '%1'").arg(toQString(newId));
        return false;
    }
    std::vector<LayerChange> changes;
    for (std::size_t k = 0; k < m_spec.layers.size(); ++k) {
        const LayerSpec& l = m_spec.layers[k];
        LayerSpec after = l;
        if (static_cast<int>(k) == i)
            after.id = newId;
        std::replace(after.inputs.begin(), after.inputs.end(), id, newId);
        if (!sameLayer(after, l))
            changes.push_back(LayerChange{static_cast<int>(k), l, std::move(after)});
    }
    std::optional<std::pair<ModelHeader, ModelHeader>> header;
    ModelHeader h = this->header();
    ModelHeader h2 = h;
    std::replace(h2.outputs.begin(), h2.outputs.end(), id, newId);
    if (h2.outputs != h.outputs)
        header = std::make_pair(h, h2);
    push(tr("Rename %1 → %2").arg(toQString(id), toQString(newId)), std::move(changes),
         std::move(header));
    return true;
}

bool ModelDocument::moveLayers(const std::vector<std::pair<std::string, QPointF>>& positions,
                               const QString& text, const std::string& mergeKey)
{
    std::vector<LayerChange> changes;
    for (const auto& [id, pos] : positions) {
        const int i = indexOf(id);
        if (i < 0)
            continue;
        const LayerSpec& before = m_spec.layers[static_cast<std::size_t>(i)];
        if (before.x == pos.x() && before.y == pos.y())
            continue;
        LayerSpec after = before;
        after.x = pos.x();
        after.y = pos.y();
        changes.push_back(LayerChange{i, before, std::move(after)});
    }
    if (changes.empty())
        return false;
    std::sort(changes.begin(), changes.end(),
              [](const LayerChange& a, const LayerChange& b) { return a.index < b.index; });
    const QString t = !text.isEmpty() ? text
                      : changes.size() == 1
                          ? tr("Move '%1'").arg(toQString(changes.front().before->id))
                          : tr("Move %1 layers").arg(changes.size());
    push(t, std::move(changes), std::nullopt, mergeKey);
    return true;
}

std::vector<std::string> ModelDocument::insertLayers(std::vector<LayerSpec> layers, QPointF offset,
                                                     const QString& text)
{
    if (layers.empty())
        return {};
    // New ids: keep a pasted id if it is free, else a fresh Keras-style one.
    std::unordered_map<std::string, std::string> rename;
    std::unordered_set<std::string> taken;
    auto isFree = [&](const std::string& id) { return !contains(id) && !taken.count(id); };
    for (LayerSpec& l : layers) {
        std::string id = l.id;
        if (id.empty() || !isFree(id) || !isValidId(id)) {
            const std::string base = baseIdForType(l.type);
            id = base;
            for (int k = 1; !isFree(id); ++k)
                id = base + "_" + std::to_string(k);
        }
        taken.insert(id);
        rename[l.id] = id;
    }
    std::vector<LayerChange> changes;
    std::vector<std::string> ids;
    int index = static_cast<int>(m_spec.layers.size());
    for (LayerSpec& l : layers) {
        const std::string oldId = l.id;
        l.id = rename[oldId];
        std::vector<std::string> inputs;
        for (const std::string& in : l.inputs) {
            auto it = rename.find(in);
            if (it != rename.end())
                inputs.push_back(it->second);
        }
        l.inputs = std::move(inputs);
        l.x += offset.x();
        l.y += offset.y();
        ids.push_back(l.id);
        changes.push_back(LayerChange{index++, std::nullopt, std::move(l)});
    }
    push(text.isEmpty() ? tr("Insert %1").arg(counted(static_cast<int64_t>(ids.size()), "layer", "layers")) : text,
         std::move(changes));
    return ids;
}

bool ModelDocument::setHeader(const ModelHeader& h, const QString& text, const std::string& mergeKey)
{
    const ModelHeader before = header();
    if (sameHeader(before, h))
        return false;
    push(text, {}, std::make_pair(before, h), mergeKey.empty() ? std::string() : "header:" + mergeKey);
    return true;
}

bool ModelDocument::autoLayout()
{
    const auto positions = autoLayoutPositions(m_spec);
    std::vector<std::pair<std::string, QPointF>> moves;
    moves.reserve(positions.size());
    for (std::size_t i = 0; i < positions.size(); ++i)
        moves.emplace_back(m_spec.layers[i].id, QPointF(positions[i].first, positions[i].second));
    return moveLayers(moves, tr("Auto-layout"));
}

// ---- clipboard -------------------------------------------------------------------------------

json ModelDocument::layersToJson(const std::vector<std::string>& ids) const
{
    ModelSpec part;
    part.name = m_spec.name;
    for (const std::string& id : ids)
        if (const LayerSpec* l = layer(id))
            part.layers.push_back(*l);
    json j = modelToJson(part);
    j.erase("compile");
    return j;
}

Result<std::vector<LayerSpec>> ModelDocument::layersFromJson(const std::string& text)
{
    TS_ASSIGN(ModelSpec spec, parseModelText(text, "clipboard"));
    return spec.layers;
}

} // namespace ts
