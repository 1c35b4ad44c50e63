#pragma once
// The run history page: every run of a database as a sortable, filterable table, with open,
// compare, rename, tag, delete and export (metrics CSV, Chrome trace, final weights), and a
// compare plot that overlays one metric of the selected runs.
// The database may be written by a training run at the same time (in this process or another):
// the table refreshes itself every few seconds without losing the selection, and its reads never
// block the writer (WAL; see RunsModel). The operations below without a dialog are what the
// actions call after asking; they are public for the integrator and for tests.

#include <QStringList>
#include <QWidget>

#include <memory>

class QAction;
class QLabel;
class QLineEdit;
class QTableView;
class QTimer;

namespace ts {

namespace store {
class RunStore;
}

class RunsModel;
class RunsFilterModel;
class RunCompareView;

class RunHistoryPanel : public QWidget {
    Q_OBJECT
public:
    explicit RunHistoryPanel(QWidget* parent = nullptr);
    ~RunHistoryPanel() override;

    // Opens the run database at `path` (created when missing). A database that cannot be opened
    // for writing (a newer TrainStudio wrote it) is opened read-only: browse, compare and export
    // work, rename/tag/delete are disabled. On failure the previous database stays open.
    bool setDatabase(const QString& path, QString* error = nullptr);
    QString databasePath() const;
    store::RunStore* store() const { return m_store.get(); }
    // Re-reads the runs, keeping the selection.
    void refresh();
    // How often the table refreshes itself (0: never). Default 2000 ms.
    void setAutoRefreshInterval(int ms);

    RunsModel* model() const { return m_model; }
    RunsFilterModel* proxyModel() const { return m_proxy; }
    QTableView* view() const { return m_view; }
    QLineEdit* filterField() const { return m_filter; }
    RunCompareView* compareView() const { return m_compare; }

    QStringList selectedRunIds() const;  // in table order
    void selectRuns(const QStringList& runIds);

    bool renameRun(const QString& runId, const QString& name, QString* error = nullptr);
    bool setRunTags(const QString& runId, const QStringList& tags, QString* error = nullptr);
    // Deletes the run's history; with removeFiles also its checkpoints and trace files (those no
    // other run uses and that did not change since).
    bool deleteRun(const QString& runId, bool removeFiles, QString* error = nullptr);
    bool exportMetricsCsv(const QString& runId, const QString& path, QString* error = nullptr);
    bool exportTrace(const QString& runId, const QString& path, QString* error = nullptr);
    bool exportWeights(const QString& runId, const QString& path, QString* error = nullptr);
    // Emits startFromWeightsRequested with the run's final checkpoint (checked against its
    // checksum), for a new run that continues from it.
    bool trainFromWeights(const QString& runId, QString* error = nullptr);
    // Overlays the runs in the compare view and emits compareRequested.
    bool compareRuns(const QStringList& runIds, QString* error = nullptr);

Q_SIGNALS:
    void openRunRequested(const QString& runId);
    void compareRequested(const QStringList& runIds);
    void startFromWeightsRequested(const QString& runId, const QString& weightsPath);
    // Something the user asked for failed; the message names the run and the file.
    void errorOccurred(const QString& message);

private:
    void updateActions();
    void showMessage(const QString& text, bool error = false);
    QString runLabel(const QString& runId) const;
    // The dialogs behind the actions.
    void askRename();
    void askTags();
    void askDelete();
    void askExport(int kind);

    std::unique_ptr<store::RunStore> m_store;
    RunsModel* m_model;
    RunsFilterModel* m_proxy;
    QTableView* m_view;
    QLineEdit* m_filter;
    RunCompareView* m_compare;
    QLabel* m_status;
    QTimer* m_autoRefresh;
    QAction* m_openAction;
    QAction* m_compareAction;
    QAction* m_renameAction;
    QAction* m_tagAction;
    QAction* m_deleteAction;
    QAction* m_exportCsvAction;
    QAction* m_exportTraceAction;
    QAction* m_exportWeightsAction;
    QAction* m_trainFromAction;
    QAction* m_refreshAction;
};

} // namespace ts
