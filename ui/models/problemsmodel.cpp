#include "models/problemsmodel.h"

#include <QApplication>
#include <QStyle>

#include "designer/format.h"
#include "designer/modeldocument.h"

namespace ts {

namespace {
bool sameProblems(const std::vector<Problem>& a, const std::vector<Problem>& b)
{
    if (a.size() != b.size())
        return false;
    for (std::size_t i = 0; i < a.size(); ++i)
        if (a[i].nodeId != b[i].nodeId || a[i].message != b[i].message || a[i].hint != b[i].hint)
            return false;
    return true;
}
} // namespace

ProblemsModel::ProblemsModel(ModelDocument* doc, QObject* parent)
    : QAbstractListModel(parent), m_doc(doc)
{
    connect(doc, &ModelDocument::analysisUpdated, this, &ProblemsModel::refresh);
    refresh();
}

void ProblemsModel::refresh()
{
    const std::vector<Problem>& now = m_doc->analysis().problems;
    if (sameProblems(now, m_problems))
        return;  // typing that changes no problem leaves the list (and its selection) alone
    beginResetModel();
    m_problems = now;
    endResetModel();
}

int ProblemsModel::rowCount(const QModelIndex& parent) const
{
    return parent.isValid() ? 0 : static_cast<int>(m_problems.size());
}

QVariant ProblemsModel::data(const QModelIndex& index, int role) const
{
    if (!checkIndex(index, CheckIndexOption::IndexIsValid | CheckIndexOption::ParentIsInvalid))
        return {};
    const Problem& p = m_problems[static_cast<std::size_t>(index.row())];
    switch (role) {
    case Qt::DisplayRole:
    case MessageRole: return toQString(p.message);
    case Qt::ToolTipRole:
        return p.hint.empty() ? toQString(p.message)
                              : toQString(p.message) + QStringLiteral("\nhint: ") + toQString(p.hint);
    case HintRole: return toQString(p.hint);
    case NodeIdRole: return toQString(p.nodeId);
    case IsShapeErrorRole: return p.code == ErrorCode::ShapeMismatch;
    case Qt::DecorationRole:
        return QApplication::style()->standardIcon(QStyle::SP_MessageBoxWarning);
    default: return {};
    }
}

QHash<int, QByteArray> ProblemsModel::roleNames() const
{
    QHash<int, QByteArray> r = QAbstractListModel::roleNames();
    r.insert(NodeIdRole, "nodeId");
    r.insert(MessageRole, "message");
    r.insert(HintRole, "hint");
    r.insert(IsShapeErrorRole, "isShapeError");
    return r;
}

} // namespace ts
