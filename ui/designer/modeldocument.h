#pragma once
// ModelDocument: the one source of truth the designer edits: a ModelSpec, its undo history and
// its analysis. The canvas, the inspector and the problem list are views of it. Every edit is an
// EditCommand on the undo stack that records the layers it changes (before and after), so undo,
// redo and the views' updates touch only what changed. Shape inference (analyzeModel) runs once
// per event-loop pass after structural edits, never per keystroke in a loop.

#include <QObject>
#include <QPointF>
#include <QString>

#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "model/spec.h"

class QTimer;
class QUndoStack;

namespace ts {

// What one apply of an edit changed, for views to update only the items concerned. Views
// process removed, then renamed, then added, then changed.
struct DocumentDelta {
    std::vector<std::string> removed;  // ids that no longer exist
    std::vector<std::pair<std::string, std::string>> renamed;  // (old id, new id)
    std::vector<std::string> added;    // ids that are new
    std::vector<std::string> changed;  // ids (current) whose type, attrs, inputs or position changed
    bool structural = false;           // anything other than positions changed
    bool header = false;               // name, outputs or compile settings changed
};

// The model-level fields (everything in ModelSpec except the layers).
struct ModelHeader {
    std::string name;
    std::vector<std::string> outputs;
    CompileSpec compile;
};

// One layer's change: removal (after empty), insertion (before empty) or modification, at
// `index` in ModelSpec::layers at the time it is applied.
struct LayerChange {
    int index = -1;
    std::optional<LayerSpec> before, after;
};

bool sameLayer(const LayerSpec& a, const LayerSpec& b);
bool sameLayerIgnoringPosition(const LayerSpec& a, const LayerSpec& b);
bool sameHeader(const ModelHeader& a, const ModelHeader& b);

class ModelDocument : public QObject {
    Q_OBJECT
public:
    explicit ModelDocument(QObject* parent = nullptr);
    ~ModelDocument() override;

    const ModelSpec& spec() const { return m_spec; }
    ModelHeader header() const;
    const LayerSpec* layer(const std::string& id) const;  // null if absent; O(1)
    int indexOf(const std::string& id) const;             // -1 if absent; O(1)
    bool contains(const std::string& id) const { return indexOf(id) >= 0; }
    // Ids of the layers that take `id` as an input (O(layers)).
    std::vector<std::string> consumersOf(const std::string& id) const;
    QUndoStack* undoStack() const { return m_undo; }

    // The analysis of the current spec. After an edit it is recomputed on the next event-loop
    // pass (analysisUpdated() follows); these calls bring it up to date at once if needed.
    const GraphAnalysis& analysis();
    const NodeInfo* nodeInfo(const std::string& id);  // null for an excluded/unknown node
    std::vector<const Problem*> problemsOf(const std::string& id);
    bool analysisPending() const { return m_analysisDirty; }
    int analysisCount() const { return m_analysisCount; }  // how often analyzeModel ran

    // Files. reset() replaces the model and clears the history (it is then unmodified unless
    // `modified`, e.g. for an imported Keras file that has never been saved in our format).
    void reset(ModelSpec spec, const QString& filePath = {}, bool modified = false);
    // Opens our format; a Keras model.to_json() file is imported (no file path: saving asks
    // for one). Duplicate or empty ids in the file are renamed as an undoable edit.
    Status open(const QString& path);
    Status save(const QString& path);
    QString filePath() const { return m_filePath; }
    bool isModified() const;
    // Where the last open() came from when it was a Keras import (else empty).
    QString importedFrom() const { return m_importedFrom; }

    // Edits. Each pushes one undoable command, or nothing (returning false / empty) when it
    // would change nothing or is not allowed (`why` then says why).
    std::string addLayer(const std::string& type, QPointF pos, const std::string& connectFrom = {});
    bool removeLayers(const std::vector<std::string>& ids);
    // Connects `from`'s output to input `slot` of `to`: slot < inputs.size() replaces that
    // input, slot == inputs.size() appends; -1 picks (single-input: replace; merge: append).
    // Refuses self-loops, cycles, inputs to Input layers and too many inputs.
    bool connectLayers(const std::string& from, const std::string& to, int slot = -1,
                       QString* why = nullptr);
    bool canConnect(const std::string& from, const std::string& to, int slot = -1,
                    QString* why = nullptr) const;
    bool disconnectInput(const std::string& to, int slot);
    // Sets one attribute (null removes it: the catalogue default applies). Consecutive edits
    // of the same attribute merge into one undo step (typing "256" is one step).
    bool setAttribute(const std::string& id, const std::string& name, const nlohmann::json& value);
    bool renameLayer(const std::string& id, const std::string& newId, QString* why = nullptr);
    // Moves layers (positions are the layer's top centre). `mergeKey` merges consecutive
    // moves with the same key (keyboard nudges).
    bool moveLayers(const std::vector<std::pair<std::string, QPointF>>& positions,
                    const QString& text = {}, const std::string& mergeKey = {});
    // Inserts copies (paste, duplicate): ids that are taken get fresh ones, inputs are remapped
    // inside the set and dropped when they point outside it, positions shift by `offset`.
    // Returns the new ids.
    std::vector<std::string> insertLayers(std::vector<LayerSpec> layers, QPointF offset,
                                          const QString& text);
    bool setHeader(const ModelHeader& header, const QString& text, const std::string& mergeKey = {});
    // Lays the graph out top to bottom (designer/autolayout.h) as one undoable edit.
    bool autoLayout();

    // A Keras-style fresh id for a new layer of `type`: "dense", "dense_1", ...
    std::string uniqueId(const std::string& type) const;
    static std::string baseIdForType(const std::string& type);  // "MaxPooling2D" -> "max_pooling2d"
    static bool isValidId(const std::string& id, QString* why = nullptr);

    // Clipboard form of some layers: our model format holding just those layers.
    nlohmann::json layersToJson(const std::vector<std::string>& ids) const;
    static Result<std::vector<LayerSpec>> layersFromJson(const std::string& text);

Q_SIGNALS:
    void modelReset();
    void layersChanged(const ts::DocumentDelta& delta);
    void headerChanged();
    void analysisUpdated();
    void filePathChanged(const QString& path);
    void modifiedChanged(bool modified);

private:
    friend class EditCommand;
    // Applies changes (forward: as recorded; backward: reversed and swapped) and a header.
    void apply(const std::vector<LayerChange>& changes, bool forward,
               const std::optional<ModelHeader>& header);
    void push(const QString& text, std::vector<LayerChange> changes,
              std::optional<std::pair<ModelHeader, ModelHeader>> header = std::nullopt,
              const std::string& mergeKey = {});
    void rebuildIndex() const;
    void scheduleAnalysis();
    void runAnalysis();
    std::vector<LayerChange> idFixes() const;
    std::optional<LayerChange> connectionChange(const std::string& from, const std::string& to,
                                                int slot, QString* why) const;

    ModelSpec m_spec;
    QUndoStack* m_undo = nullptr;
    QTimer* m_analysisTimer = nullptr;
    QString m_filePath;
    QString m_importedFrom;
    mutable std::unordered_map<std::string, int> m_index;
    mutable bool m_indexDirty = true;
    GraphAnalysis m_analysis;
    std::unordered_map<std::string, int> m_nodeIndex;  // id -> m_analysis.nodes index
    std::unordered_map<std::string, std::vector<int>> m_problemIndex;  // id -> problems
    bool m_analysisDirty = true;
    int m_analysisCount = 0;
};

} // namespace ts

Q_DECLARE_METATYPE(ts::DocumentDelta)
