#pragma once
// RunsModel: the run history of a RunStore as a table, one row per run. refresh() re-reads the
// store and applies the difference (rows inserted, removed, changed in place) instead of
// resetting, so a view keeps its selection and scroll position while a training run writes new
// rows. Reads go through the store's read-only connection inside one read snapshot (WAL), so a
// refresh never blocks the writer, in this process or another.
// The Name column is editable: editing it renames the run in the store.

#include <QAbstractTableModel>
#include <QHash>
#include <QSortFilterProxyModel>
#include <QString>

#include <vector>

#include "store/run_store.h"

namespace ts {

class RunsModel : public QAbstractTableModel {
    Q_OBJECT
public:
    enum Column { Name, Model, Strategy, Devices, Status, BestMetric, Duration, Started, Tags, ColumnCount };
    enum Role {
        RunIdRole = Qt::UserRole + 1,  // QString
        SortRole,                      // the raw value a column sorts by (numbers for numbers)
        StatusRole,                    // QString: "running", "completed", ...
        TagsRole,                      // QStringList
    };

    explicit RunsModel(QObject* parent = nullptr);

    // The store to show (not owned; nullptr empties the model). Call refresh() after.
    void setStore(store::RunStore* store);
    store::RunStore* store() const { return m_store; }
    // Re-reads the runs. On failure the rows stay as they were and `error` says why.
    bool refresh(QString* error = nullptr);

    int rowOfRun(const QString& runId) const;  // -1: not shown
    QString runId(int row) const;
    const store::RunInfo* runInfo(int row) const;
    // "val_accuracy 0.873": the run's best value of its headline metric (see bestMetric()).
    QString bestMetricText(int row) const;

    int rowCount(const QModelIndex& parent = {}) const override;
    int columnCount(const QModelIndex& parent = {}) const override;
    QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
    QVariant headerData(int section, Qt::Orientation orientation, int role = Qt::DisplayRole) const override;
    Qt::ItemFlags flags(const QModelIndex& index) const override;
    bool setData(const QModelIndex& index, const QVariant& value, int role = Qt::EditRole) override;

Q_SIGNALS:
    // A write through the model (rename) failed; the message names the run and the database.
    void errorOccurred(const QString& message);

private:
    struct Row {
        store::RunInfo info;
        QString devices;
        QString bestName;   // metric name, empty when the run has none yet
        double bestValue = 0;
        // What the cached details were computed from: recomputed when any of it changes.
        int statusKey = -1;
        int64_t lastStep = -2, endedUs = -1;
    };
    static QString bestText(const Row& row);
    void fillDetails(Row& row);
    QVariant display(const Row& row, int column) const;
    QVariant sortValue(const Row& row, int column) const;

    store::RunStore* m_store = nullptr;
    std::vector<Row> m_rows;
};

// Sorts by RunsModel::SortRole and filters on every column's text (and the tags): each word of
// the filter must match somewhere in the row, case-insensitively.
class RunsFilterModel : public QSortFilterProxyModel {
    Q_OBJECT
public:
    explicit RunsFilterModel(QObject* parent = nullptr);
    void setFilterWords(const QString& text);

protected:
    bool filterAcceptsRow(int sourceRow, const QModelIndex& sourceParent) const override;

private:
    QStringList m_words;
};

} // namespace ts
