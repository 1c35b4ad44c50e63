#pragma once
// TrainPage: the studio's Train tab — the run setup on the left, the live dashboards on the
// right, and the run controls (Train, Pause/Resume, Stop, Capture N steps) above them. It drives
// the engine only through the TrainingSession it is given (which the main window owns, so a
// closing window can stop the run).

#include <QWidget>

#include "model/spec.h"
#include "session/rundata.h"

class QLabel;
class QPushButton;
class QSpinBox;

namespace ts {

class DashboardWidget;
class RunSetupPanel;
class TrainingSession;

class TrainPage : public QWidget {
    Q_OBJECT
public:
    TrainPage(TrainingSession* session, QWidget* parent = nullptr);

    RunSetupPanel* setup() const { return m_setup; }
    DashboardWidget* dashboard() const { return m_dashboard; }
    QPushButton* trainButton() const { return m_train; }
    QPushButton* pauseButton() const { return m_pause; }
    QPushButton* stopButton() const { return m_stop; }
    QPushButton* captureButton() const { return m_capture; }
    QLabel* statusLabel() const { return m_status; }

    // The model to train (the designer's document); `blockedReason` non-empty disables Train.
    void setModel(const ModelSpec& model, const QString& blockedReason);
    // Starts a run with the form's configuration; false with the reason (also shown) if not.
    bool startTraining(QString* error = nullptr);
    // Shows a recorded run in the dashboards (the live run is not affected).
    void showRecordedRun(RunData data, const QString& title);
    // Back to the live (or last) run of the session.
    void showLiveRun();

Q_SIGNALS:
    // A trace capture of the running run finished: the profiler can load it from the store.
    void captureReady(const QString& runId);
    void runFinished(const QString& runId);

private:
    void updateControls();

    TrainingSession* m_session;
    RunSetupPanel* m_setup;
    DashboardWidget* m_dashboard;
    QPushButton *m_train, *m_pause, *m_stop, *m_capture, *m_live;
    QSpinBox* m_captureSteps;
    QLabel* m_status;
    QLabel* m_title;
    QString m_blocked;
    RunData m_recorded;
    bool m_showingRecorded = false;
};

} // namespace ts
