#pragma once
// EditCommand: the one kind of undo command the designer pushes. It records the layers an edit
// changes (before and after) and, if the edit touches them, the model-level fields, so undo and
// redo cost O(changed layers) and views update only those items.

#include <QUndoCommand>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "designer/modeldocument.h"

namespace ts {

class EditCommand : public QUndoCommand {
public:
    EditCommand(ModelDocument* doc, const QString& text, std::vector<LayerChange> changes,
                std::optional<std::pair<ModelHeader, ModelHeader>> header, std::string mergeKey);

    void redo() override;
    void undo() override;
    int id() const override;
    bool mergeWith(const QUndoCommand* other) override;

    const std::vector<LayerChange>& changes() const { return m_changes; }

private:
    ModelDocument* m_doc;
    std::vector<LayerChange> m_changes;
    std::optional<std::pair<ModelHeader, ModelHeader>> m_header;  // (before, after)
    std::string m_mergeKey;
};

} // namespace ts
