#include "runs/runsmodel.h"

#include <QBrush>
#include <QColor>
#include <QDateTime>
#include <QSet>

#include <chrono>
#include <cmath>
#include <limits>
#include <unordered_map>

namespace ts {

namespace {

QString qs(const std::string& s)
{
    return QString::fromStdString(s);
}

int64_t nowUs()
{
    return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Device names, or a cluster ("worker ×2, ps ×1"), in one short line.
QString devicesText(const nlohmann::json& devices) { return qs(ts::store::devicesSummary(devices, false)); }

QString durationText(double seconds)
{
    if (seconds < 60)
        return QStringLiteral("%1 s").arg(seconds, 0, 'f', seconds < 10 ? 1 : 0);
    const auto s = static_cast<int64_t>(seconds);
    if (s < 3600)
        return QStringLiteral("%1m %2s").arg(s / 60).arg(s % 60, 2, 10, QLatin1Char('0'));
    return QStringLiteral("%1h %2m").arg(s / 3600).arg((s % 3600) / 60, 2, 10, QLatin1Char('0'));
}

double durationSeconds(const store::RunInfo& r)
{
    if (r.startedUs <= 0)
        return -1;
    const int64_t end = r.endedUs > 0 ? r.endedUs : (r.status == store::RunState::Running ? nowUs() : r.startedUs);
    return static_cast<double>(std::max<int64_t>(0, end - r.startedUs)) * 1e-6;
}

} // namespace

RunsModel::RunsModel(QObject* parent) : QAbstractTableModel(parent) {}

void RunsModel::setStore(store::RunStore* store)
{
    beginResetModel();
    m_store = store;
    m_rows.clear();
    endResetModel();
}

void RunsModel::fillDetails(Row& row)
{
    const std::string& id = row.info.id;
    auto full = m_store->run(id);
    if (full.ok())
        row.devices = devicesText(full->devices);
    row.bestName.clear();
    // The headline metric: validation accuracy when the run has one, else training accuracy,
    // else the lowest (validation) loss.
    struct Pick {
        const char* name;
        bool higherIsBetter;
    };
    static const Pick kPicks[] = {{"val_accuracy", true}, {"accuracy", true}, {"val_loss", false}, {"loss", false}};
    auto epochs = m_store->epochMetrics(id);
    if (epochs.ok()) {
        for (const Pick& pick : kPicks) {
            bool found = false;
            double best = 0;
            for (const store::EpochRow& e : *epochs) {
                const auto it = e.metrics.find(pick.name);
                if (it == e.metrics.end() || !std::isfinite(it->second))
                    continue;
                if (!found || (pick.higherIsBetter ? it->second > best : it->second < best))
                    best = it->second;
                found = true;
            }
            if (found) {
                row.bestName = QString::fromLatin1(pick.name);
                row.bestValue = best;
                break;
            }
        }
    }
    if (row.bestName.isEmpty() && row.info.lastStep > 0) {
        // No epoch finished yet: the lowest step loss so far (M4 keeps every bucket's minimum).
        store::SeriesQuery q;
        q.buckets = 512;
        auto loss = m_store->series(id, "loss", q);
        if (loss.ok() && !loss->points.empty()) {
            double best = std::numeric_limits<double>::infinity();
            for (const store::SeriesPoint& p : loss->points)
                if (std::isfinite(p.value))
                    best = std::min(best, p.value);
            if (std::isfinite(best)) {
                row.bestName = QStringLiteral("loss");
                row.bestValue = best;
            }
        }
    }
    row.statusKey = static_cast<int>(row.info.status);
    row.lastStep = row.info.lastStep;
    row.endedUs = row.info.endedUs;
}

bool RunsModel::refresh(QString* error)
{
    if (!m_store) {
        if (!m_rows.empty()) {
            beginResetModel();
            m_rows.clear();
            endResetModel();
        }
        return true;
    }
    std::vector<Row> fresh;
    Error failure;
    bool failed = false;
    const auto snapshot = m_store->withReadSnapshot([&] {
        auto runs = m_store->listRuns();
        if (!runs.ok()) {
            failure = runs.error();
            failed = true;
            return;
        }
        std::unordered_map<std::string, const Row*> old;
        for (const Row& r : m_rows)
            old.emplace(r.info.id, &r);
        fresh.reserve(runs->size());
        for (store::RunInfo& info : *runs) {
            Row row;
            const auto it = old.find(info.id);
            if (it != old.end()) {
                row = *it->second;
                row.info = std::move(info);
            } else {
                row.info = std::move(info);
            }
            // Finished runs keep their details; running ones are re-read as they progress.
            if (row.statusKey != static_cast<int>(row.info.status) || row.lastStep != row.info.lastStep ||
                row.endedUs != row.info.endedUs)
                fillDetails(row);
            fresh.push_back(std::move(row));
        }
    });
    if (!snapshot.ok() || failed) {
        if (error) {
            const Error& e = failed ? failure : snapshot.error();
            *error = tr("Could not read the run history in %1: %2").arg(qs(m_store->path()), qs(e.toString()));
        }
        return false;
    }

    // Apply the difference: removals, in-place updates, then new runs on top (newest first).
    QSet<QString> freshIds;
    for (const Row& r : fresh)
        freshIds.insert(qs(r.info.id));
    for (int i = static_cast<int>(m_rows.size()) - 1; i >= 0; --i) {
        if (freshIds.contains(qs(m_rows[static_cast<std::size_t>(i)].info.id)))
            continue;
        beginRemoveRows({}, i, i);
        m_rows.erase(m_rows.begin() + i);
        endRemoveRows();
    }
    std::unordered_map<std::string, std::size_t> position;
    for (std::size_t i = 0; i < m_rows.size(); ++i)
        position.emplace(m_rows[i].info.id, i);
    std::vector<Row> added;
    for (Row& r : fresh) {
        const auto it = position.find(r.info.id);
        if (it == position.end()) {
            added.push_back(std::move(r));
            continue;
        }
        const int i = static_cast<int>(it->second);
        m_rows[it->second] = std::move(r);
        Q_EMIT dataChanged(index(i, 0), index(i, ColumnCount - 1));
    }
    if (!added.empty()) {
        beginInsertRows({}, 0, static_cast<int>(added.size()) - 1);
        m_rows.insert(m_rows.begin(), std::make_move_iterator(added.begin()), std::make_move_iterator(added.end()));
        endInsertRows();
    }
    return true;
}

int RunsModel::rowOfRun(const QString& runId) const
{
    const std::string id = runId.toStdString();
    for (std::size_t i = 0; i < m_rows.size(); ++i)
        if (m_rows[i].info.id == id)
            return static_cast<int>(i);
    return -1;
}

QString RunsModel::runId(int row) const
{
    const store::RunInfo* info = runInfo(row);
    return info ? qs(info->id) : QString();
}

const store::RunInfo* RunsModel::runInfo(int row) const
{
    if (row < 0 || static_cast<std::size_t>(row) >= m_rows.size())
        return nullptr;
    return &m_rows[static_cast<std::size_t>(row)].info;
}

QString RunsModel::bestMetricText(int row) const
{
    if (row < 0 || static_cast<std::size_t>(row) >= m_rows.size())
        return {};
    return bestText(m_rows[static_cast<std::size_t>(row)]);
}

QString RunsModel::bestText(const Row& row)
{
    if (row.bestName.isEmpty())
        return {};
    return QStringLiteral("%1 %2").arg(row.bestName).arg(row.bestValue, 0, 'g', 4);
}

int RunsModel::rowCount(const QModelIndex& parent) const
{
    return parent.isValid() ? 0 : static_cast<int>(m_rows.size());
}

int RunsModel::columnCount(const QModelIndex& parent) const
{
    return parent.isValid() ? 0 : ColumnCount;
}

QVariant RunsModel::display(const Row& row, int column) const
{
    const store::RunInfo& r = row.info;
    switch (column) {
    case Name:
        return qs(r.name);
    case Model:
        return qs(r.modelName);
    case Strategy:
        return qs(r.strategy);
    case Devices:
        return row.devices;
    case Status:
        return QString::fromLatin1(store::statusName(r.status));
    case BestMetric:
        return bestText(row);
    case Duration: {
        const double s = durationSeconds(r);
        return s < 0 ? QString() : durationText(s);
    }
    case Started: {
        const int64_t us = r.startedUs > 0 ? r.startedUs : r.createdUs;
        return us > 0 ? QDateTime::fromMSecsSinceEpoch(us / 1000).toString(QStringLiteral("yyyy-MM-dd hh:mm")) : QString();
    }
    case Tags: {
        QStringList tags;
        for (const std::string& t : r.tags)
            tags << qs(t);
        return tags.join(QStringLiteral(", "));
    }
    default:
        return {};
    }
}

QVariant RunsModel::sortValue(const Row& row, int column) const
{
    const store::RunInfo& r = row.info;
    switch (column) {
    case BestMetric:
        return row.bestName.isEmpty() ? QVariant(std::numeric_limits<double>::lowest()) : QVariant(row.bestValue);
    case Duration:
        return durationSeconds(r);
    case Started:
        return static_cast<qlonglong>(r.startedUs > 0 ? r.startedUs : r.createdUs);
    default:
        return display(row, column).toString().toLower();
    }
}

QVariant RunsModel::data(const QModelIndex& index, int role) const
{
    if (!index.isValid() || index.parent().isValid() || index.row() >= rowCount() || index.column() >= ColumnCount)
        return {};
    const Row& row = m_rows[static_cast<std::size_t>(index.row())];
    const int column = index.column();
    switch (role) {
    case Qt::DisplayRole:
        return display(row, column);
    case Qt::EditRole:
        return column == Name ? QVariant(qs(row.info.name)) : display(row, column);
    case Qt::ToolTipRole:
        if (column == Status && !row.info.error.empty())
            return qs(row.info.error);
        if (column == Name)
            return tr("%1\nrun id %2").arg(qs(row.info.name), qs(row.info.id));
        if (column == BestMetric && !row.bestName.isEmpty())
            return tr("Best %1 over the run's epochs (or steps, before the first epoch ends)").arg(row.bestName);
        return display(row, column);
    case Qt::ForegroundRole:
        if (column == Status && (row.info.status == store::RunState::Failed || row.info.status == store::RunState::Interrupted))
            return QBrush(QColor(0xdc2626));
        if (column == Status && row.info.status == store::RunState::Running)
            return QBrush(QColor(0x2563eb));
        return {};
    case Qt::TextAlignmentRole:
        if (column == BestMetric || column == Duration)
            return QVariant::fromValue(Qt::AlignRight | Qt::AlignVCenter);
        return {};
    case RunIdRole:
        return qs(row.info.id);
    case SortRole:
        return sortValue(row, column);
    case StatusRole:
        return QString::fromLatin1(store::statusName(row.info.status));
    case TagsRole: {
        QStringList tags;
        for (const std::string& t : row.info.tags)
            tags << qs(t);
        return tags;
    }
    default:
        return {};
    }
}

QVariant RunsModel::headerData(int section, Qt::Orientation orientation, int role) const
{
    if (orientation != Qt::Horizontal || role != Qt::DisplayRole || section < 0 || section >= ColumnCount)
        return QAbstractTableModel::headerData(section, orientation, role);
    static const char* const kTitles[] = {QT_TR_NOOP("Name"),     QT_TR_NOOP("Model"),       QT_TR_NOOP("Strategy"),
                                          QT_TR_NOOP("Devices"),  QT_TR_NOOP("Status"),      QT_TR_NOOP("Best Metric"),
                                          QT_TR_NOOP("Duration"), QT_TR_NOOP("Started"),     QT_TR_NOOP("Tags")};
    return tr(kTitles[section]);
}

Qt::ItemFlags RunsModel::flags(const QModelIndex& index) const
{
    Qt::ItemFlags f = QAbstractTableModel::flags(index);
    if (index.isValid() && index.column() == Name && m_store && !m_store->readOnly())
        f |= Qt::ItemIsEditable;
    return f;
}

bool RunsModel::setData(const QModelIndex& index, const QVariant& value, int role)
{
    if (role != Qt::EditRole || !index.isValid() || index.row() >= rowCount() || index.column() != Name || !m_store)
        return false;
    Row& row = m_rows[static_cast<std::size_t>(index.row())];
    const QString name = value.toString().trimmed();
    if (name.isEmpty() || name.toStdString() == row.info.name)
        return false;
    const ts::Status renamed = m_store->renameRun(row.info.id, name.toStdString());
    if (!renamed.ok()) {
        Q_EMIT errorOccurred(tr("Could not rename run %1 in %2: %3")
                                 .arg(qs(row.info.id), qs(m_store->path()), qs(renamed.error().toString())));
        return false;
    }
    row.info.name = name.toStdString();
    Q_EMIT dataChanged(index, index);
    return true;
}

RunsFilterModel::RunsFilterModel(QObject* parent) : QSortFilterProxyModel(parent)
{
    setSortRole(RunsModel::SortRole);
    setSortCaseSensitivity(Qt::CaseInsensitive);
    setDynamicSortFilter(true);
}

void RunsFilterModel::setFilterWords(const QString& text)
{
    m_words = text.split(QLatin1Char(' '), Qt::SkipEmptyParts);
    invalidateFilter();
}

bool RunsFilterModel::filterAcceptsRow(int sourceRow, const QModelIndex& sourceParent) const
{
    if (m_words.isEmpty())
        return true;
    const QAbstractItemModel* src = sourceModel();
    QString haystack;
    for (int c = 0; c < src->columnCount(sourceParent); ++c)
        haystack += src->index(sourceRow, c, sourceParent).data(Qt::DisplayRole).toString() + QLatin1Char('\n');
    haystack += src->index(sourceRow, 0, sourceParent).data(RunsModel::RunIdRole).toString();
    for (const QString& w : m_words)
        if (!haystack.contains(w, Qt::CaseInsensitive))
            return false;
    return true;
}

} // namespace ts
