#pragma once
// The document's problems (analyzeModel's validation) as a list model: one row per problem with
// its message, hint and the node it names, refreshed when the analysis changes.

#include <QAbstractListModel>

#include <vector>

#include "model/spec.h"

namespace ts {

class ModelDocument;

class ProblemsModel : public QAbstractListModel {
    Q_OBJECT
public:
    enum Role {
        NodeIdRole = Qt::UserRole + 1,  // QString, empty for model-level problems
        MessageRole,
        HintRole,
        IsShapeErrorRole,  // bool: a shape arithmetic problem (ErrorCode::ShapeMismatch)
    };

    explicit ProblemsModel(ModelDocument* doc, QObject* parent = nullptr);

    int rowCount(const QModelIndex& parent = {}) const override;
    QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
    QHash<int, QByteArray> roleNames() const override;

private:
    void refresh();

    ModelDocument* m_doc;
    std::vector<Problem> m_problems;
};

} // namespace ts
