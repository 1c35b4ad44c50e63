#include "runs/runhistorypanel.h"

#include <QAction>
#include <QDir>
#include <QFileDialog>
#include <QHeaderView>
#include <QInputDialog>
#include <QItemSelectionModel>
#include <QLabel>
#include <QLineEdit>
#include <QMenu>
#include <QMessageBox>
#include <QPushButton>
#include <QRegularExpression>
#include <QSaveFile>
#include <QSplitter>
#include <QTableView>
#include <QTimer>
#include <QToolBar>
#include <QToolButton>
#include <QVBoxLayout>

#include <algorithm>
#include <sstream>

#include "runs/runcompareview.h"
#include "runs/runsmodel.h"
#include "store/export.h"
#include "store/run_store.h"

namespace ts {

namespace {

QString qs(const std::string& s)
{
    return QString::fromStdString(s);
}

enum ExportKind { ExportCsv, ExportTrace, ExportWeights };

} // namespace

RunHistoryPanel::RunHistoryPanel(QWidget* parent)
    : QWidget(parent), m_model(new RunsModel(this)), m_proxy(new RunsFilterModel(this)), m_view(new QTableView(this)),
      m_filter(new QLineEdit(this)), m_compare(new RunCompareView(this)), m_status(new QLabel(this)),
      m_autoRefresh(new QTimer(this))
{
    setObjectName(QStringLiteral("runHistoryPanel"));
    m_proxy->setSourceModel(m_model);

    m_openAction = new QAction(tr("Open"), this);
    m_openAction->setToolTip(tr("Open the run in the dashboards and the profiler"));
    m_compareAction = new QAction(tr("Compare"), this);
    m_compareAction->setToolTip(tr("Overlay a metric of the selected runs"));
    m_renameAction = new QAction(tr("Rename…"), this);
    m_tagAction = new QAction(tr("Tags…"), this);
    m_tagAction->setToolTip(tr("Set the run's tags (comma-separated)"));
    m_deleteAction = new QAction(tr("Delete…"), this);
    m_deleteAction->setToolTip(tr("Delete the selected runs and their files"));
    m_exportCsvAction = new QAction(tr("Metrics as CSV…"), this);
    m_exportTraceAction = new QAction(tr("Chrome Trace…"), this);
    m_exportWeightsAction = new QAction(tr("Final Weights (safetensors)…"), this);
    m_trainFromAction = new QAction(tr("Train From Its Weights"), this);
    m_trainFromAction->setToolTip(tr("Set the run's final weights as the next run's starting point (fine-tune or continue it)"));
    m_refreshAction = new QAction(tr("Refresh"), this);
    const std::pair<QAction*, const char*> names[] = {
        {m_trainFromAction, "trainFromWeightsAction"},
        {m_openAction, "openRunAction"},       {m_compareAction, "compareRunsAction"},
        {m_renameAction, "renameRunAction"},   {m_tagAction, "tagRunAction"},
        {m_deleteAction, "deleteRunAction"},   {m_exportCsvAction, "exportCsvAction"},
        {m_exportTraceAction, "exportTraceAction"}, {m_exportWeightsAction, "exportWeightsAction"},
        {m_refreshAction, "refreshRunsAction"}};
    for (const auto& [action, name] : names)
        action->setObjectName(QString::fromLatin1(name));

    connect(m_openAction, &QAction::triggered, this, [this] {
        const QStringList ids = selectedRunIds();
        if (!ids.isEmpty())
            Q_EMIT openRunRequested(ids.first());
    });
    connect(m_compareAction, &QAction::triggered, this, [this] {
        QString error;
        if (!compareRuns(selectedRunIds(), &error))
            showMessage(error, true);
    });
    connect(m_renameAction, &QAction::triggered, this, &RunHistoryPanel::askRename);
    connect(m_tagAction, &QAction::triggered, this, &RunHistoryPanel::askTags);
    connect(m_deleteAction, &QAction::triggered, this, &RunHistoryPanel::askDelete);
    connect(m_exportCsvAction, &QAction::triggered, this, [this] { askExport(ExportCsv); });
    connect(m_exportTraceAction, &QAction::triggered, this, [this] { askExport(ExportTrace); });
    connect(m_exportWeightsAction, &QAction::triggered, this, [this] { askExport(ExportWeights); });
    connect(m_refreshAction, &QAction::triggered, this, &RunHistoryPanel::refresh);
    connect(m_trainFromAction, &QAction::triggered, this, [this] {
        const QStringList ids = selectedRunIds();
        QString error;
        if (ids.size() == 1 && !trainFromWeights(ids.first(), &error)) showMessage(error, true);
    });

    auto* toolbar = new QToolBar(this);
    toolbar->addAction(m_openAction);
    toolbar->addAction(m_compareAction);
    toolbar->addSeparator();
    toolbar->addAction(m_renameAction);
    toolbar->addAction(m_tagAction);
    toolbar->addAction(m_deleteAction);
    auto* exportMenu = new QMenu(tr("Export"), this);
    exportMenu->addAction(m_exportCsvAction);
    exportMenu->addAction(m_exportTraceAction);
    exportMenu->addAction(m_exportWeightsAction);
    auto* exportButton = new QToolButton(toolbar);
    exportButton->setObjectName(QStringLiteral("exportButton"));
    exportButton->setText(tr("Export"));
    exportButton->setMenu(exportMenu);
    exportButton->setPopupMode(QToolButton::InstantPopup);
    toolbar->addWidget(exportButton);
    toolbar->addAction(m_trainFromAction);
    toolbar->addSeparator();
    toolbar->addAction(m_refreshAction);
    m_filter->setObjectName(QStringLiteral("runsFilter"));
    m_filter->setPlaceholderText(tr("Filter runs (name, model, strategy, status, tag…)"));
    m_filter->setClearButtonEnabled(true);
    m_filter->setMaximumWidth(360);
    toolbar->addWidget(m_filter);
    connect(m_filter, &QLineEdit::textChanged, m_proxy, &RunsFilterModel::setFilterWords);

    m_view->setObjectName(QStringLiteral("runsView"));
    m_view->setModel(m_proxy);
    m_view->setSortingEnabled(true);
    m_view->sortByColumn(RunsModel::Started, Qt::DescendingOrder);
    m_view->setSelectionBehavior(QAbstractItemView::SelectRows);
    m_view->setSelectionMode(QAbstractItemView::ExtendedSelection);
    m_view->setEditTriggers(QAbstractItemView::EditKeyPressed | QAbstractItemView::SelectedClicked);
    m_view->verticalHeader()->hide();
    m_view->horizontalHeader()->setStretchLastSection(true);
    m_view->horizontalHeader()->setSectionResizeMode(QHeaderView::Interactive);
    m_view->setAlternatingRowColors(true);
    m_view->setWordWrap(false);
    m_view->setContextMenuPolicy(Qt::ActionsContextMenu);
    m_view->addActions({m_openAction, m_compareAction, m_renameAction, m_tagAction, m_deleteAction});
    m_view->addAction(exportMenu->menuAction());
    connect(m_view, &QTableView::doubleClicked, this, [this](const QModelIndex& index) {
        if (index.isValid())
            Q_EMIT openRunRequested(index.data(RunsModel::RunIdRole).toString());
    });
    connect(m_view->selectionModel(), &QItemSelectionModel::selectionChanged, this, &RunHistoryPanel::updateActions);
    connect(m_model, &RunsModel::errorOccurred, this, [this](const QString& message) { showMessage(message, true); });
    connect(m_compare, &RunCompareView::errorOccurred, this, [this](const QString& message) { showMessage(message, true); });

    m_status->setObjectName(QStringLiteral("runsStatus"));
    m_status->setTextInteractionFlags(Qt::TextSelectableByMouse);
    m_status->setWordWrap(true);

    auto* split = new QSplitter(Qt::Vertical, this);
    split->addWidget(m_view);
    split->addWidget(m_compare);
    split->setStretchFactor(0, 3);
    split->setStretchFactor(1, 2);
    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(0, 0, 0, 0);
    layout->setSpacing(2);
    layout->addWidget(toolbar);
    layout->addWidget(split, 1);
    layout->addWidget(m_status);

    m_autoRefresh->setInterval(2000);
    connect(m_autoRefresh, &QTimer::timeout, this, [this] {
        if (m_store && isVisible())
            refresh();
    });
    updateActions();
    showMessage(tr("No run database open."));
}

RunHistoryPanel::~RunHistoryPanel()
{
    // The views hold a pointer to the store: detach them before it closes.
    m_compare->setStore(nullptr);
    m_model->setStore(nullptr);
}

bool RunHistoryPanel::setDatabase(const QString& path, QString* error)
{
    store::OpenOptions options;
    auto opened = store::RunStore::open(path.toStdString(), options);
    QString note;
    if (!opened.ok()) {
        // A database from a newer TrainStudio can still be read.
        store::OpenOptions readOnly;
        readOnly.readOnly = true;
        auto ro = store::RunStore::open(path.toStdString(), readOnly);
        if (!ro.ok()) {
            if (error)
                *error = tr("Could not open the run database %1: %2").arg(QDir::toNativeSeparators(path), qs(opened.error().toString()));
            return false;
        }
        note = tr(" (read-only: %1)").arg(qs(opened.error().message));
        opened = std::move(ro);
    }
    auto next = std::make_unique<store::RunStore>(std::move(*opened));
    m_compare->setStore(next.get());
    m_model->setStore(next.get());
    m_store = std::move(next);
    QString refreshError;
    if (!m_model->refresh(&refreshError)) {
        showMessage(refreshError, true);
        if (error)
            *error = refreshError;
        updateActions();
        return false;
    }
    for (int c = 0; c < RunsModel::ColumnCount - 1; ++c)
        m_view->resizeColumnToContents(c);
    m_autoRefresh->start();
    updateActions();
    showMessage(tr("%n run(s) in %1", nullptr, m_model->rowCount()).arg(QDir::toNativeSeparators(path)) + note);
    return true;
}

QString RunHistoryPanel::databasePath() const
{
    return m_store ? qs(m_store->path()) : QString();
}

void RunHistoryPanel::setAutoRefreshInterval(int ms)
{
    if (ms <= 0) {
        m_autoRefresh->stop();
        return;
    }
    m_autoRefresh->setInterval(ms);
    if (m_store)
        m_autoRefresh->start();
}

void RunHistoryPanel::refresh()
{
    if (!m_store)
        return;
    QString error;
    // The model updates rows in place, so the view's selection survives.
    if (!m_model->refresh(&error)) {
        showMessage(error, true);
        Q_EMIT errorOccurred(error);
        return;
    }
    updateActions();
}

QStringList RunHistoryPanel::selectedRunIds() const
{
    QStringList ids;
    const QModelIndexList rows = m_view->selectionModel()->selectedRows();
    QList<QModelIndex> sorted(rows.begin(), rows.end());
    std::sort(sorted.begin(), sorted.end(), [](const QModelIndex& a, const QModelIndex& b) { return a.row() < b.row(); });
    for (const QModelIndex& index : sorted)
        ids << index.data(RunsModel::RunIdRole).toString();
    return ids;
}

void RunHistoryPanel::selectRuns(const QStringList& runIds)
{
    QItemSelection selection;
    for (const QString& id : runIds) {
        const int row = m_model->rowOfRun(id);
        if (row < 0)
            continue;
        const QModelIndex index = m_proxy->mapFromSource(m_model->index(row, 0));
        if (index.isValid())
            selection.select(index, index.siblingAtColumn(RunsModel::ColumnCount - 1));
    }
    m_view->selectionModel()->select(selection, QItemSelectionModel::ClearAndSelect | QItemSelectionModel::Rows);
    if (!selection.isEmpty())
        m_view->selectionModel()->setCurrentIndex(selection.indexes().first(), QItemSelectionModel::NoUpdate);
}

QString RunHistoryPanel::runLabel(const QString& runId) const
{
    const store::RunInfo* info = m_model->runInfo(m_model->rowOfRun(runId));
    return info ? tr("“%1” (%2)").arg(qs(info->name), runId) : runId;
}

void RunHistoryPanel::updateActions()
{
    const int n = static_cast<int>(selectedRunIds().size());
    const bool writable = m_store && !m_store->readOnly();
    m_openAction->setEnabled(n == 1);
    m_compareAction->setEnabled(n >= 1);
    m_renameAction->setEnabled(n == 1 && writable);
    m_tagAction->setEnabled(n == 1 && writable);
    m_deleteAction->setEnabled(n >= 1 && writable);
    m_exportCsvAction->setEnabled(n == 1);
    m_exportTraceAction->setEnabled(n == 1);
    m_exportWeightsAction->setEnabled(n == 1);
    m_trainFromAction->setEnabled(n == 1);
    m_refreshAction->setEnabled(m_store != nullptr);
}

void RunHistoryPanel::showMessage(const QString& text, bool error)
{
    m_status->setText(text);
    m_status->setStyleSheet(error ? QStringLiteral("color: #dc2626;") : QString());
}

bool RunHistoryPanel::renameRun(const QString& runId, const QString& name, QString* error)
{
    if (!m_store || name.trimmed().isEmpty()) {
        if (error)
            *error = !m_store ? tr("No run database is open: open the run history’s database first.") : tr("Run %1: type a name that is not empty.").arg(runId);
        return false;
    }
    const Status s = m_store->renameRun(runId.toStdString(), name.trimmed().toStdString());
    if (!s.ok()) {
        if (error)
            *error = tr("Could not rename run %1 in %2: %3").arg(runId, qs(m_store->path()), qs(s.error().toString()));
        return false;
    }
    refresh();
    return true;
}

bool RunHistoryPanel::setRunTags(const QString& runId, const QStringList& tags, QString* error)
{
    if (!m_store) {
        if (error)
            *error = tr("No run database is open: open the run history’s database first.");
        return false;
    }
    std::vector<std::string> list;
    for (const QString& t : tags)
        if (!t.trimmed().isEmpty())
            list.push_back(t.trimmed().toStdString());
    const Status s = m_store->setTags(runId.toStdString(), list);
    if (!s.ok()) {
        if (error)
            *error = tr("Could not set the tags of run %1 in %2: %3").arg(runId, qs(m_store->path()), qs(s.error().toString()));
        return false;
    }
    refresh();
    return true;
}

bool RunHistoryPanel::deleteRun(const QString& runId, bool removeFiles, QString* error)
{
    if (!m_store) {
        if (error)
            *error = tr("No run database is open: open the run history’s database first.");
        return false;
    }
    auto report = m_store->deleteRun(runId.toStdString(), removeFiles);
    if (!report.ok()) {
        if (error)
            *error = tr("Could not delete run %1 from %2: %3").arg(runId, qs(m_store->path()), qs(report.error().toString()));
        return false;
    }
    if (m_compare->runs().contains(runId)) {
        QStringList rest = m_compare->runs();
        rest.removeAll(runId);
        m_compare->setRuns(rest);
    }
    refresh();
    QString message = tr("Deleted run %1; %n file(s) removed", nullptr, static_cast<int>(report->removedFiles.size())).arg(runId);
    if (!report->keptFiles.empty()) {
        QStringList kept;
        for (const std::string& k : report->keptFiles)
            kept << qs(k);
        message += tr("; kept: %1").arg(kept.join(QStringLiteral("; ")));
    }
    showMessage(message);
    return true;
}

bool RunHistoryPanel::exportMetricsCsv(const QString& runId, const QString& path, QString* error)
{
    if (!m_store) {
        if (error)
            *error = tr("No run database is open: open the run history’s database first.");
        return false;
    }
    std::ostringstream out;
    const Status s = store::exportStepMetricsCsv(*m_store, runId.toStdString(), out);
    if (!s.ok()) {
        if (error)
            *error = tr("Could not export the metrics of run %1: %2").arg(runId, qs(s.error().toString()));
        return false;
    }
    // Written beside and renamed into place: a failed export never leaves half a file.
    QSaveFile file(path);
    const std::string text = out.str();
    if (!file.open(QIODevice::WriteOnly) || file.write(text.data(), static_cast<qint64>(text.size())) != static_cast<qint64>(text.size()) ||
        !file.commit()) {
        if (error)
            *error = tr("Could not write %1: %2 (choose a folder you can write to)").arg(QDir::toNativeSeparators(path), file.errorString());
        return false;
    }
    showMessage(tr("Exported the metrics of run %1 to %2").arg(runId, QDir::toNativeSeparators(path)));
    return true;
}

bool RunHistoryPanel::exportTrace(const QString& runId, const QString& path, QString* error)
{
    if (!m_store) {
        if (error)
            *error = tr("No run database is open: open the run history’s database first.");
        return false;
    }
    auto spans = store::exportChromeTrace(*m_store, runId.toStdString(), path.toStdString());
    if (!spans.ok()) {
        if (error)
            *error = tr("Could not export the trace of run %1 to %2: %3")
                         .arg(runId, QDir::toNativeSeparators(path), qs(spans.error().toString()));
        return false;
    }
    showMessage(tr("Exported %n span(s) of run %1 to %2", nullptr, static_cast<int>(*spans)).arg(runId, QDir::toNativeSeparators(path)));
    return true;
}

bool RunHistoryPanel::exportWeights(const QString& runId, const QString& path, QString* error)
{
    if (!m_store) {
        if (error)
            *error = tr("No run database is open: open the run history’s database first.");
        return false;
    }
    auto checkpoint = store::exportFinalWeights(*m_store, runId.toStdString(), path.toStdString());
    if (!checkpoint.ok()) {
        if (error)
            *error = tr("Could not export the weights of run %1 to %2: %3")
                         .arg(runId, QDir::toNativeSeparators(path), qs(checkpoint.error().toString()));
        return false;
    }
    showMessage(tr("Exported the %1 weights of run %2 (step %3) to %4")
                    .arg(qs(checkpoint->kind), runId)
                    .arg(checkpoint->step)
                    .arg(QDir::toNativeSeparators(path)));
    return true;
}

bool RunHistoryPanel::trainFromWeights(const QString& runId, QString* error)
{
    if (!m_store) {
        if (error)
            *error = tr("No run database is open: open the run history’s database first.");
        return false;
    }
    auto checkpoint = store::finalCheckpoint(*m_store, runId.toStdString());
    if (!checkpoint.ok()) {
        if (error)
            *error = tr("Cannot train from the weights of run %1: %2").arg(runId, qs(checkpoint.error().toString()));
        return false;
    }
    const QString path = qs(checkpoint->path);
    showMessage(tr("The next run starts from the %1 weights of run %2 (step %3): %4")
                    .arg(qs(checkpoint->kind), runId)
                    .arg(checkpoint->step)
                    .arg(QDir::toNativeSeparators(path)));
    Q_EMIT startFromWeightsRequested(runId, path);
    return true;
}

bool RunHistoryPanel::compareRuns(const QStringList& runIds, QString* error)
{
    if (runIds.isEmpty()) {
        if (error)
            *error = tr("Select one or more runs to compare.");
        return false;
    }
    if (!m_compare->setRuns(runIds, error))
        return false;
    Q_EMIT compareRequested(runIds);
    return true;
}

void RunHistoryPanel::askRename()
{
    const QStringList ids = selectedRunIds();
    if (ids.size() != 1)
        return;
    const store::RunInfo* info = m_model->runInfo(m_model->rowOfRun(ids.first()));
    bool ok = false;
    const QString name = QInputDialog::getText(this, tr("Rename Run"), tr("New name of run %1:").arg(ids.first()),
                                               QLineEdit::Normal, info ? qs(info->name) : QString(), &ok);
    if (!ok)
        return;
    QString error;
    if (!renameRun(ids.first(), name, &error))
        showMessage(error, true);
}

void RunHistoryPanel::askTags()
{
    const QStringList ids = selectedRunIds();
    if (ids.size() != 1)
        return;
    const store::RunInfo* info = m_model->runInfo(m_model->rowOfRun(ids.first()));
    QStringList current;
    if (info)
        for (const std::string& t : info->tags)
            current << qs(t);
    bool ok = false;
    const QString text = QInputDialog::getText(this, tr("Run Tags"), tr("Tags of %1, comma-separated:").arg(runLabel(ids.first())),
                                               QLineEdit::Normal, current.join(QStringLiteral(", ")), &ok);
    if (!ok)
        return;
    QString error;
    if (!setRunTags(ids.first(), text.split(QLatin1Char(','), Qt::SkipEmptyParts), &error))
        showMessage(error, true);
}

void RunHistoryPanel::askDelete()
{
    const QStringList ids = selectedRunIds();
    if (ids.isEmpty())
        return;
    QStringList labels;
    for (const QString& id : ids)
        labels << runLabel(id);
    QMessageBox box(QMessageBox::Warning, tr("Delete Runs"),
                    tr("Delete %n run(s) and everything recorded for them?", nullptr, static_cast<int>(ids.size())),
                    QMessageBox::NoButton, this);
    box.setInformativeText(labels.join(QLatin1Char('\n')) +
                           tr("\n\nThe checkpoints the store keeps for them are deleted too, unless another run uses them; "
                              "weights and traces you saved elsewhere (--save-weights, --trace) stay."));
    QPushButton* remove = box.addButton(tr("Delete"), QMessageBox::DestructiveRole);
    box.addButton(QMessageBox::Cancel);
    box.setDefaultButton(QMessageBox::Cancel);
    box.exec();
    if (box.clickedButton() != remove)
        return;
    for (const QString& id : ids) {
        QString error;
        if (!deleteRun(id, true, &error)) {
            showMessage(error, true);
            return;
        }
    }
}

void RunHistoryPanel::askExport(int kind)
{
    const QStringList ids = selectedRunIds();
    if (ids.size() != 1)
        return;
    const QString id = ids.first();
    const store::RunInfo* info = m_model->runInfo(m_model->rowOfRun(id));
    QString base = info ? qs(info->name) : id;
    base.replace(QRegularExpression(QStringLiteral("[^A-Za-z0-9._-]+")), QStringLiteral("_"));
    QString path, error;
    bool ok = false;
    switch (kind) {
    case ExportCsv:
        path = QFileDialog::getSaveFileName(this, tr("Export Metrics"), base + QStringLiteral(".csv"), tr("CSV (*.csv)"));
        ok = path.isEmpty() || exportMetricsCsv(id, path, &error);
        break;
    case ExportTrace:
        path = QFileDialog::getSaveFileName(this, tr("Export Chrome Trace"), base + QStringLiteral(".trace.json"),
                                            tr("Chrome trace (*.json)"));
        ok = path.isEmpty() || exportTrace(id, path, &error);
        break;
    default:
        path = QFileDialog::getSaveFileName(this, tr("Export Weights"), base + QStringLiteral(".safetensors"),
                                            tr("safetensors (*.safetensors)"));
        ok = path.isEmpty() || exportWeights(id, path, &error);
        break;
    }
    if (!ok) {
        showMessage(error, true);
        QMessageBox::warning(this, tr("Export"), error);
    }
}

} // namespace ts
