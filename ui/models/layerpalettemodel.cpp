#include "models/layerpalettemodel.h"

#include <QMimeData>

#include <algorithm>

#include "designer/designerview.h"
#include "designer/format.h"
#include "designer/theme.h"
#include "model/spec.h"

namespace ts {

namespace {
// Internal ids: 0 for group rows, group index + 1 for layer rows.
constexpr quintptr kGroupId = 0;

QString attributeTooltip(const LayerKind& k)
{
    QString tip = QStringLiteral("<b>%1</b><br>%2").arg(toQString(k.type).toHtmlEscaped(),
                                                        toQString(k.description).toHtmlEscaped());
    if (!k.attrs.empty()) {
        tip += QStringLiteral("<br><br>");
        QStringList rows;
        for (const AttrSpec& a : k.attrs)
            rows << QStringLiteral("<i>%1</i> (default %2): %3")
                        .arg(toQString(a.name), toQString(a.defaultValue.dump()).toHtmlEscaped(),
                             toQString(a.description).toHtmlEscaped());
        tip += rows.join(QStringLiteral("<br>"));
    }
    return tip;
}
} // namespace

LayerPaletteModel::LayerPaletteModel(QObject* parent) : QAbstractItemModel(parent)
{
    for (const std::string& g : groupOrder())
        m_groups.push_back(Group{g, {}});
    for (const LayerKind& k : layerCatalogue()) {
        auto it = std::find_if(m_groups.begin(), m_groups.end(),
                               [&](const Group& g) { return g.name == k.group; });
        if (it == m_groups.end()) {
            m_groups.push_back(Group{k.group, {}});
            it = m_groups.end() - 1;
        }
        it->kinds.push_back(&k);
    }
    m_groups.erase(std::remove_if(m_groups.begin(), m_groups.end(),
                                  [](const Group& g) { return g.kinds.empty(); }),
                   m_groups.end());
}

QModelIndex LayerPaletteModel::index(int row, int column, const QModelIndex& parent) const
{
    if (column != 0 || row < 0)
        return {};
    if (!parent.isValid())
        return row < static_cast<int>(m_groups.size()) ? createIndex(row, 0, kGroupId) : QModelIndex();
    if (parent.internalId() != kGroupId || parent.column() != 0)
        return {};
    const Group& g = m_groups[static_cast<std::size_t>(parent.row())];
    if (row >= static_cast<int>(g.kinds.size()))
        return {};
    return createIndex(row, 0, static_cast<quintptr>(parent.row()) + 1);
}

QModelIndex LayerPaletteModel::parent(const QModelIndex& child) const
{
    if (!child.isValid() || child.internalId() == kGroupId)
        return {};
    return createIndex(static_cast<int>(child.internalId() - 1), 0, kGroupId);
}

int LayerPaletteModel::rowCount(const QModelIndex& parent) const
{
    if (!parent.isValid())
        return static_cast<int>(m_groups.size());
    if (parent.column() != 0 || parent.internalId() != kGroupId)
        return 0;
    return static_cast<int>(m_groups[static_cast<std::size_t>(parent.row())].kinds.size());
}

int LayerPaletteModel::columnCount(const QModelIndex&) const
{
    return 1;
}

const LayerKind* LayerPaletteModel::kindAt(const QModelIndex& index) const
{
    if (!index.isValid() || index.internalId() == kGroupId)
        return nullptr;
    return m_groups[static_cast<std::size_t>(index.internalId() - 1)].kinds[static_cast<std::size_t>(index.row())];
}

QVariant LayerPaletteModel::data(const QModelIndex& index, int role) const
{
    if (!index.isValid())
        return {};
    if (index.internalId() == kGroupId) {
        const Group& g = m_groups[static_cast<std::size_t>(index.row())];
        switch (role) {
        case Qt::DisplayRole: return groupTitle(g.name);
        case Qt::ToolTipRole:
            return tr("%1 layers: drag one onto the canvas").arg(groupTitle(g.name));
        case Qt::DecorationRole: return groupIcon(g.name);
        case GroupRole: return toQString(g.name);
        case IsGroupRole: return true;
        case TypeRole:
        case DescriptionRole: return QString();
        default: return {};
        }
    }
    const LayerKind* k = kindAt(index);
    switch (role) {
    case Qt::DisplayRole:
    case TypeRole: return toQString(k->type);
    case DescriptionRole:
    case Qt::StatusTipRole: return toQString(k->description);
    case Qt::ToolTipRole: return attributeTooltip(*k);
    case Qt::DecorationRole: return groupIcon(k->group);
    case GroupRole: return toQString(k->group);
    case IsGroupRole: return false;
    default: return {};
    }
}

Qt::ItemFlags LayerPaletteModel::flags(const QModelIndex& index) const
{
    if (!index.isValid())
        return Qt::NoItemFlags;
    if (index.internalId() == kGroupId)
        return Qt::ItemIsEnabled;
    return Qt::ItemIsEnabled | Qt::ItemIsSelectable | Qt::ItemIsDragEnabled | Qt::ItemNeverHasChildren;
}

QHash<int, QByteArray> LayerPaletteModel::roleNames() const
{
    QHash<int, QByteArray> r = QAbstractItemModel::roleNames();
    r.insert(TypeRole, "type");
    r.insert(DescriptionRole, "description");
    r.insert(GroupRole, "group");
    r.insert(IsGroupRole, "isGroup");
    return r;
}

QStringList LayerPaletteModel::mimeTypes() const
{
    return {QLatin1String(DesignerView::kLayerMimeType), QStringLiteral("text/plain")};
}

QMimeData* LayerPaletteModel::mimeData(const QModelIndexList& indexes) const
{
    QStringList types;
    for (const QModelIndex& i : indexes)
        if (const LayerKind* k = kindAt(i))
            types << toQString(k->type);
    if (types.isEmpty())
        return nullptr;
    auto* mime = new QMimeData;
    mime->setData(QLatin1String(DesignerView::kLayerMimeType), types.join(QLatin1Char('\n')).toUtf8());
    mime->setText(types.join(QLatin1Char('\n')));
    return mime;
}

Qt::DropActions LayerPaletteModel::supportedDragActions() const
{
    return Qt::CopyAction;
}

QModelIndex LayerPaletteModel::indexOfType(const QString& type) const
{
    for (std::size_t g = 0; g < m_groups.size(); ++g)
        for (std::size_t k = 0; k < m_groups[g].kinds.size(); ++k)
            if (toQString(m_groups[g].kinds[k]->type) == type)
                return createIndex(static_cast<int>(k), 0, static_cast<quintptr>(g) + 1);
    return {};
}

// ---- search ------------------------------------------------------------------------------

LayerPaletteFilter::LayerPaletteFilter(QObject* parent) : QSortFilterProxyModel(parent)
{
    setRecursiveFilteringEnabled(true);
    setFilterCaseSensitivity(Qt::CaseInsensitive);
}

void LayerPaletteFilter::setQuery(const QString& query)
{
    const QStringList words = query.simplified().split(QLatin1Char(' '), Qt::SkipEmptyParts);
    if (words == m_words)
        return;
    m_words = words;
    invalidateFilter();
}

bool LayerPaletteFilter::filterAcceptsRow(int sourceRow, const QModelIndex& sourceParent) const
{
    if (m_words.isEmpty())
        return true;
    const QModelIndex i = sourceModel()->index(sourceRow, 0, sourceParent);
    if (i.data(LayerPaletteModel::IsGroupRole).toBool())
        return false;  // shown when one of its layers matches (recursive filtering)
    const QString hay = i.data(LayerPaletteModel::TypeRole).toString() + QLatin1Char(' ')
                        + i.data(LayerPaletteModel::DescriptionRole).toString() + QLatin1Char(' ')
                        + groupTitle(toStdString(i.data(LayerPaletteModel::GroupRole).toString()));
    for (const QString& w : m_words)
        if (!hay.contains(w, Qt::CaseInsensitive))
            return false;
    return true;
}

QModelIndex LayerPaletteFilter::firstMatch() const
{
    // A type that equals the query exactly wins ("dense" finds Dense before Conv2D's text).
    QModelIndex first;
    for (int g = 0; g < rowCount(); ++g) {
        const QModelIndex group = index(g, 0);
        for (int r = 0; r < rowCount(group); ++r) {
            const QModelIndex i = index(r, 0, group);
            if (!first.isValid())
                first = i;
            if (m_words.size() == 1
                && i.data(LayerPaletteModel::TypeRole).toString().compare(m_words.front(), Qt::CaseInsensitive) == 0)
                return i;
        }
    }
    return first;
}

} // namespace ts
