#pragma once
// The profiler page: the timeline of a run's trace (or of a Chrome trace file from PyTorch,
// TensorFlow, Horovod...), with the selected span's details, statistics of a selected time range
// (time by category, top spans), the step-time breakdown per step, and the advisor's findings.
// Clicking a finding selects the time of the steps it is about and outlines the spans that
// caused it (input spans for "input-bound", all-reduce spans for "communication", ...).
// "Capture next N steps" only asks: the integrator connects captureRequested to the session.

#include <QString>
#include <QWidget>

#include <functional>
#include <memory>
#include <vector>

#include "profiler/timelinedata.h"
#include "telemetry/events.h"

class QAction;
class QCustomPlot;
class QLabel;
class QSpinBox;
class QTabWidget;
class QTextBrowser;
class QToolButton;
class QTreeWidget;

namespace ts {

namespace store {
class RunStore;
}

class TimelineWidget;

class ProfilerPanel : public QWidget {
    Q_OBJECT
public:
    explicit ProfilerPanel(QWidget* parent = nullptr);
    ~ProfilerPanel() override;

    // Loads a Chrome trace file (.json or .json.gz). On failure the current trace stays and
    // `error` names the file and what is wrong with it.
    bool openTraceFile(const QString& path, QString* error = nullptr);
    // The same on a pool thread (reading, summarising and laying out a 1M-span trace takes
    // seconds): the GUI stays live and the current trace stays shown until the new one is
    // ready; then traceLoaded, or loadFailed with the file and the reason. A newer request
    // supersedes an older one still loading.
    void openTraceFileInBackground(const QString& path);
    bool isLoading() const { return !m_loadingPath.isEmpty(); }
    // Loads a stored run's spans, step breakdowns and findings.
    bool openRun(store::RunStore& store, const QString& runId, QString* error = nullptr);
    // The same on a pool thread through its own read-only connection to `databasePath`, like
    // openTraceFileInBackground (loadFailed names the run id).
    void openRunInBackground(const QString& databasePath, const QString& runId);
    void clear();

    TimelineWidget* timeline() const { return m_timeline; }

    // A step of the loaded trace: its time on the timeline and its breakdown.
    struct Step {
        int64_t step = 0;
        int64_t startUs = 0, endUs = 0;
        telemetry::StepBreakdownEvent breakdown;
    };
    const std::vector<Step>& steps() const { return m_steps; }
    const std::vector<telemetry::FindingEvent>& findings() const { return m_findings; }
    // The statistics shown for the selected range (empty before a range is selected).
    const RangeStats& rangeStats() const { return m_rangeStats; }
    QString sourceDescription() const;  // what is loaded: the file or the run, and its format

    // Selects the time of finding `index`'s steps and outlines the spans that caused it.
    void selectFinding(int index);
    // Enables the capture control (the integrator enables it while a run is training).
    void setCaptureEnabled(bool enabled);

    // Child widgets, for the integrator's layout and for tests.
    QTreeWidget* findingsView() const { return m_findingsView; }
    QLabel* legend() const { return m_legend; }
    QTreeWidget* categoryView() const { return m_categoryView; }
    QTreeWidget* topSpansView() const { return m_topView; }
    QTextBrowser* detailsView() const { return m_details; }
    QCustomPlot* stepPlot() const { return m_stepPlot; }
    QTabWidget* tabs() const { return m_tabs; }
    QAction* openTraceAction() const { return m_openAction; }
    QSpinBox* captureStepsBox() const { return m_captureSteps; }
    QToolButton* captureButton() const { return m_captureButton; }

Q_SIGNALS:
    void captureRequested(int steps);
    // A trace or run was loaded (or cleared: empty description).
    void traceLoaded(const QString& description);
    void loadFailed(const QString& path, const QString& error);

private:
    // A trace file read, summarised and laid out: what openTraceFile shows. No GUI objects, so
    // it is built on any thread.
    struct PreparedTrace {
        QString error;  // empty: ok
        std::shared_ptr<const TimelineData> data;
        QString description;
        std::vector<Step> steps;
        std::vector<telemetry::FindingEvent> findings;
    };
    static PreparedTrace prepareTraceFile(const QString& path);
    static PreparedTrace prepareStoredRun(store::RunStore& store, const QString& runId);
    // Runs `prepare` on a pool thread, then shows its result (or emits loadFailed(what, ...)).
    void startBackgroundLoad(const QString& what, const QString& shownAs, std::function<PreparedTrace()> prepare);
    // Shows `prepared` at once (superseding a background load), or puts its error in `error`.
    bool showNow(PreparedTrace prepared, QString* error);
    void showPrepared(PreparedTrace prepared);
    void showLoaded();  // fills every view from m_data, m_steps, m_findings
    void load(std::vector<telemetry::SpanEvent> spans, const std::string& format, const QString& description,
              std::vector<Step> steps, std::vector<telemetry::FindingEvent> findings);
    void showSpanDetails(int span);
    void showRangeStats(int64_t t0Us, int64_t t1Us);
    void fillStepPlot();
    void fillFindings();
    void browseForTrace();
    void zoomToStep(int index);

    TimelineWidget* m_timeline;
    QLabel* m_info;
    QLabel* m_legend;
    QTabWidget* m_tabs;
    QTextBrowser* m_details;
    QLabel* m_rangeLabel;
    QTreeWidget* m_categoryView;
    QTreeWidget* m_topView;
    QCustomPlot* m_stepPlot;
    QTreeWidget* m_findingsView;
    QAction* m_openAction;
    QSpinBox* m_captureSteps;
    QToolButton* m_captureButton;

    std::shared_ptr<const TimelineData> m_data;
    QString m_loadingPath;  // the file (or run id) being read in the background, if any
    int m_loadSerial = 0;   // which background load is current
    QString m_browsedPath;  // picked in the file dialog: its failure is shown in a message box
    QString m_description;
    std::vector<Step> m_steps;
    std::vector<telemetry::FindingEvent> m_findings;
    RangeStats m_rangeStats;
};

} // namespace ts
