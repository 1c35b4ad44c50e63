#pragma once
// The layer palette as a Qt tree model: catalogue groups (core, convolution, pooling,
// normalisation, activation, merge) with their layer kinds below, each with its one-line
// description. Layer rows drag as DesignerView::kLayerMimeType. LayerPaletteFilter is the
// search: every word must appear in the type, the description or the group.

#include <QAbstractItemModel>
#include <QSortFilterProxyModel>

#include <string>
#include <vector>

namespace ts {

struct LayerKind;

class LayerPaletteModel : public QAbstractItemModel {
    Q_OBJECT
public:
    enum Role {
        TypeRole = Qt::UserRole + 1,  // "Dense" (empty for group rows)
        DescriptionRole,              // one line
        GroupRole,                    // "core"
        IsGroupRole,                  // bool
    };

    explicit LayerPaletteModel(QObject* parent = nullptr);

    QModelIndex index(int row, int column, const QModelIndex& parent = {}) const override;
    QModelIndex parent(const QModelIndex& child) const override;
    int rowCount(const QModelIndex& parent = {}) const override;
    int columnCount(const QModelIndex& parent = {}) const override;
    QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
    Qt::ItemFlags flags(const QModelIndex& index) const override;
    QHash<int, QByteArray> roleNames() const override;
    QStringList mimeTypes() const override;
    QMimeData* mimeData(const QModelIndexList& indexes) const override;
    Qt::DropActions supportedDragActions() const override;

    QModelIndex indexOfType(const QString& type) const;

private:
    struct Group {
        std::string name;
        std::vector<const LayerKind*> kinds;
    };
    const LayerKind* kindAt(const QModelIndex& index) const;
    std::vector<Group> m_groups;
};

class LayerPaletteFilter : public QSortFilterProxyModel {
    Q_OBJECT
public:
    explicit LayerPaletteFilter(QObject* parent = nullptr);
    void setQuery(const QString& query);
    QString query() const { return m_words.join(QLatin1Char(' ')); }
    // The first layer row that matches (in palette order), or invalid.
    QModelIndex firstMatch() const;

protected:
    bool filterAcceptsRow(int sourceRow, const QModelIndex& sourceParent) const override;

private:
    QStringList m_words;
};

} // namespace ts
