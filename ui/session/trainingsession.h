#pragma once
// TrainingSession: the studio's only door to the engine (ui/ never drives a Trainer itself).
// It prepares and runs one training run on an engine thread, records it into the run store,
// and bridges its telemetry to the GUI: a timer drains the bus subscription ~30 times a second
// into RunData and emits updated() once per tick that brought something, never one signal per
// step, so the GUI costs the training the same at 100 or 100 000 steps/s.
// Contract:
//  - Threading: every method is called on the GUI thread; signals are emitted on it.
//  - One run at a time: start() refuses while a run is active. stop() returns at once; the run
//    ends at its next step boundary (finished() follows). The destructor stops and joins.
//  - Errors: start() returns what is wrong with the setup (database, model, data, devices) as
//    text naming the file/node/device; failures during the run arrive as finished(Failed, why)
//    and are recorded with the run. Nothing recorded is lost when the run fails or is stopped.

#include <QObject>
#include <QString>
#include <QTimer>

#include <atomic>
#include <memory>
#include <mutex>
#include <thread>

#include "session/remotecluster.h"
#include "session/rundata.h"
#include "train/run_config.h"

namespace ts::telemetry {
class EventBus;
class Subscription;
}

namespace ts {

class Trainer;
namespace store {
class RunRecording;
}
namespace remote {
class Coordinator;
}

class TrainingSession : public QObject {
    Q_OBJECT
public:
    enum class State { Idle, Preparing, Running, Paused, Stopping, Completed, Cancelled, Failed };
    Q_ENUM(State)

    explicit TrainingSession(QObject* parent = nullptr);
    ~TrainingSession() override;

    // The run store runs are recorded into (default: store::defaultDatabasePath()).
    void setDatabasePath(const QString& path);
    QString databasePath() const { return m_dbPath; }
    // Telemetry drain period in ms (default 33: ~30 Hz).
    void setRefreshInterval(int ms);
    int refreshInterval() const { return m_timer.interval(); }

    // A multi-worker-mirrored or parameter-server configuration runs on the trainstudio-worker
    // daemons that `remote` describes (pre-flight first; the run is recorded here).
    bool start(const RunConfig& config, const QString& runName = {}, QString* error = nullptr,
               const RemoteSettings& remote = {});
    void pause();
    void resume();
    // `interrupted`: the app is closing; the run is recorded as interrupted, not cancelled.
    void stop(bool interrupted = false);
    // Traces the next `steps` steps of the running run (spans go to the store with the run).
    bool captureTrace(int steps, QString* error = nullptr);
    // Blocks (processing events) until the run has finished or `ms` passed; true if finished.
    bool waitForFinished(int ms);

    State state() const { return m_state; }
    bool isActive() const;
    // The run trains on remote workers (pause is local-only; a capture traces every training task).
    bool isRemote() const { return m_remote; }
    static QString stateName(State s);
    // Where a local run's backups go unless the user picks a folder (the engine's default,
    // under this user's data folder).
    static QString defaultBackupFolder();
    QString runId() const { return m_runId; }
    QString errorMessage() const { return m_error; }
    // The live run's telemetry (the last run's after it ended).
    const RunData& data() const { return m_data; }
    // Steps of the pending capture (0: none).
    int64_t captureUntilStep() const { return m_captureUntil; }
    uint64_t droppedEvents() const;

Q_SIGNALS:
    void stateChanged(ts::TrainingSession::State state);
    void runStarted(const QString& runId);
    void updated();
    void captureFinished(const QString& runId);
    void finished(ts::TrainingSession::State state, const QString& message);

private:
    void drain();
    void setState(State s);
    void engineMain(RunConfig config, std::string runName);
    void engineRemote(RunConfig config, std::string runName);
    void onEngineDone(State state, const QString& message);

    QString m_dbPath;
    QTimer m_timer;
    State m_state = State::Idle;
    QString m_runId, m_error;
    RunData m_data;
    int64_t m_captureUntil = 0;
    std::unique_ptr<telemetry::EventBus> m_bus;
    std::shared_ptr<telemetry::Subscription> m_sub;
    std::thread m_engine;
    std::mutex m_trainerMutex;       // guards m_trainer against the engine thread's teardown
    Trainer* m_trainer = nullptr;
    store::RunRecording* m_recording = nullptr;  // the run's, while it trains (same mutex)
    std::shared_ptr<remote::Coordinator> m_coordinator;  // set for remote runs, for stop()
    bool m_remote = false;
    std::atomic<bool> m_stopRequested{false}, m_pauseRequested{false}, m_interrupted{false};
};

} // namespace ts
