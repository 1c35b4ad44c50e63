#include "designer/editcommand.h"

namespace ts {

namespace {
// All mergeable edits share one QUndoCommand id; mergeWith() compares the keys.
constexpr int kMergeableId = 0x7453;
} // namespace

EditCommand::EditCommand(ModelDocument* doc, const QString& text, std::vector<LayerChange> changes,
                         std::optional<std::pair<ModelHeader, ModelHeader>> header,
                         std::string mergeKey)
    : QUndoCommand(text), m_doc(doc), m_changes(std::move(changes)), m_header(std::move(header)),
      m_mergeKey(std::move(mergeKey))
{
}

void EditCommand::redo()
{
    m_doc->apply(m_changes, true,
                 m_header ? std::optional<ModelHeader>(m_header->second) : std::nullopt);
}

void EditCommand::undo()
{
    m_doc->apply(m_changes, false,
                 m_header ? std::optional<ModelHeader>(m_header->first) : std::nullopt);
}

int EditCommand::id() const
{
    return m_mergeKey.empty() ? -1 : kMergeableId;
}

bool EditCommand::mergeWith(const QUndoCommand* other)
{
    const auto* o = dynamic_cast<const EditCommand*>(other);
    if (!o || o->m_mergeKey != m_mergeKey || o->m_changes.size() != m_changes.size()
        || o->m_header.has_value() != m_header.has_value())
        return false;
    // Only modifications of the same layers (same indices and ids) merge.
    for (std::size_t i = 0; i < m_changes.size(); ++i) {
        const LayerChange& a = m_changes[i];
        const LayerChange& b = o->m_changes[i];
        if (a.index != b.index || !a.before || !a.after || !b.before || !b.after
            || a.after->id != b.before->id)
            return false;
    }
    bool unchanged = true;
    for (std::size_t i = 0; i < m_changes.size(); ++i) {
        m_changes[i].after = o->m_changes[i].after;
        unchanged = unchanged && sameLayer(*m_changes[i].before, *m_changes[i].after);
    }
    if (m_header) {
        m_header->second = o->m_header->second;
        unchanged = unchanged && sameHeader(m_header->first, m_header->second);
    }
    setText(o->text());
    // Typing a value back to what it was leaves nothing to undo.
    setObsolete(unchanged);
    return true;
}

} // namespace ts
