#include "session/trainingsession.h"

#include <QCoreApplication>
#include <QEventLoop>
#include <QMetaObject>

#include "distribute/cluster_spec.h"
#include "io/safetensors.h"
#include "model/spec.h"
#include "remote/auth.h"
#include "remote/coordinator.h"
#include "store/recording.h"
#include "store/run_store.h"
#include "telemetry/bus.h"
#include "train/backup.h"

namespace ts {

TrainingSession::TrainingSession(QObject* parent) : QObject(parent)
{
    m_dbPath = QString::fromStdString(store::defaultDatabasePath());
    m_timer.setInterval(33);
    connect(&m_timer, &QTimer::timeout, this, &TrainingSession::drain);
}

TrainingSession::~TrainingSession()
{
    stop(m_interrupted.load());
    if (m_engine.joinable()) m_engine.join();
}

void TrainingSession::setDatabasePath(const QString& path) { m_dbPath = path; }
void TrainingSession::setRefreshInterval(int ms) { m_timer.setInterval(std::max(1, ms)); }

bool TrainingSession::isActive() const
{
    return m_state == State::Preparing || m_state == State::Running || m_state == State::Paused || m_state == State::Stopping;
}

QString TrainingSession::defaultBackupFolder() { return QString::fromStdString(defaultBackupRoot()); }

QString TrainingSession::stateName(State s)
{
    switch (s) {
    case State::Idle: return tr("Idle");
    case State::Preparing: return tr("Preparing");
    case State::Running: return tr("Running");
    case State::Paused: return tr("Paused");
    case State::Stopping: return tr("Stopping");
    case State::Completed: return tr("Completed");
    case State::Cancelled: return tr("Stopped");
    case State::Failed: return tr("Failed");
    }
    return {};
}

void TrainingSession::setState(State s)
{
    if (m_state == s) return;
    m_state = s;
    Q_EMIT stateChanged(s);
}

uint64_t TrainingSession::droppedEvents() const { return m_sub ? m_sub->dropped() : 0; }

bool TrainingSession::start(const RunConfig& config, const QString& runName, QString* error, const RemoteSettings& remoteSettings)
{
    auto fail = [&](const QString& why) {
        if (error) *error = why;
        return false;
    };
    if (isActive()) return fail(tr("a run is already in progress; stop it first"));
    if (m_engine.joinable()) m_engine.join();  // the previous run's thread has finished its work
    // Open the database here, so that a bad path is reported before any work starts.
    auto probe = store::RunStore::open(m_dbPath.toStdString());
    if (!probe.ok())
        return fail(QString::fromStdString(probe.error().toString()));
    (void)probe->close();
    // A cluster strategy: check the cluster and the token here, so the form's problems and the
    // session agree; the pre-flight (network) runs on the engine thread.
    std::shared_ptr<remote::Coordinator> coordinator;
    const QString kind = QString::fromStdString(config.strategy.kind);
    if (kind == QLatin1String("multi-worker-mirrored") || kind == QLatin1String("parameter-server")) {
        const QStringList problems = remoteProblems(remoteSettings, kind);
        if (!problems.isEmpty()) return fail(problems.join(QLatin1Char('\n')));
        remote::CoordinatorOptions o;
        o.spec = *ClusterSpec::fromText(remoteSettings.tfConfig.toStdString(), "TF_CONFIG editor");
        o.token = *remote::loadToken(remoteSettings.tokenFile.trimmed().toStdString());
        o.tls.rootCa = remoteSettings.tlsCa.trimmed().toStdString();
        o.name = "TrainStudio";
        o.useEvaluator = config.validate;
        auto c = remote::Coordinator::create(std::move(o), config.strategy.kind);
        if (!c.ok()) return fail(QString::fromStdString(c.error().toString()));
        coordinator = std::move(c).value();
    }

    m_data.clear();
    m_runId.clear();
    m_error.clear();
    m_captureUntil = 0;
    m_stopRequested = false;
    m_pauseRequested = false;
    m_interrupted = false;
    m_bus = std::make_unique<telemetry::EventBus>();
    telemetry::SubscriberOptions so;
    so.name = "dashboard";
    so.capacity = 1 << 16;
    // Spans go to the store only; the profiler reads them from there.
    so.kinds = telemetry::kAllKinds & ~telemetry::kindMask<telemetry::SpanEvent, telemetry::PipelineSampleEvent>();
    so.wakeThreshold = std::numeric_limits<std::size_t>::max();  // drained by the timer, never woken
    m_sub = m_bus->subscribe(so);
    {
        std::lock_guard lock(m_trainerMutex);
        m_coordinator = coordinator;
    }
    m_remote = coordinator != nullptr;
    setState(State::Preparing);
    m_engine = std::thread([this, config, name = runName.toStdString()] {
        if (m_remote) engineRemote(config, name);
        else engineMain(config, name);
    });
    m_timer.start();
    return true;
}

void TrainingSession::engineMain(RunConfig config, std::string runName)
{
    auto post = [this](State s, const QString& message) {
        QMetaObject::invokeMethod(this, [this, s, message] { onEngineDone(s, message); }, Qt::QueuedConnection);
    };
    store::RecordingOptions ro;
    ro.name = runName;
    std::string warnings;
    ro.warn = [&warnings](const Error& e) { warnings += e.message + "\n"; };
    auto recordingOpened = store::RunRecording::open(m_dbPath.toStdString(), ro);
    if (!recordingOpened.ok()) {
        post(State::Failed, QString::fromStdString(recordingOpened.error().toString()));
        return;
    }
    auto recording = std::move(recordingOpened).value();
    PipelineOptions po;
    auto prepared = prepareRun(config, po);
    if (!prepared.ok()) {
        recording->prepareFailed(config, prepared.error());
        post(State::Failed, QString::fromStdString(prepared.error().toString()));
        return;
    }
    PreparedRun run = std::move(prepared).value();
    if (Status st = recording->begin(run, *m_bus); !st.ok()) {
        post(State::Failed, QString::fromStdString(st.error().toString()));
        return;
    }
    const QString runId = QString::fromStdString(recording->runId());
    if (run.pipeline) run.pipeline->setTelemetry(m_bus.get(), recording->runId());
    QMetaObject::invokeMethod(this, [this, runId] {
        m_runId = runId;
        if (m_state == State::Preparing) setState(State::Running);
        Q_EMIT runStarted(runId);
    }, Qt::QueuedConnection);
    {
        std::lock_guard lock(m_trainerMutex);
        m_trainer = run.trainer.get();
        m_recording = recording.get();
        if (m_pauseRequested) m_trainer->pause();
        if (m_stopRequested) m_trainer->cancel();
    }
    auto result = run.trainer->fit(*run.trainSource(), run.validationSource(), nullptr);
    {
        std::lock_guard lock(m_trainerMutex);
        m_trainer = nullptr;
        m_recording = nullptr;
    }
    recording->fitDone(result, m_interrupted);
    if (result.ok()) recording->keepWeights(run, run.config.saveWeights, result->steps);
    State end = State::Completed;
    QString message;
    if (!result.ok()) {
        end = result.error().code == ErrorCode::Cancelled ? State::Cancelled : State::Failed;
        message = QString::fromStdString(result.error().toString());
    } else if (result->cancelled) {
        end = State::Cancelled;
    }
    if (!warnings.empty() && message.isEmpty()) message = QString::fromStdString(warnings).trimmed();
    recording.reset();  // closes the store connection before the GUI is told
    post(end, message);
}

void TrainingSession::engineRemote(RunConfig config, std::string runName)
{
    auto post = [this](State s, const QString& message) {
        QMetaObject::invokeMethod(this, [this, s, message] { onEngineDone(s, message); }, Qt::QueuedConnection);
    };
    std::shared_ptr<remote::Coordinator> coordinator;
    {
        std::lock_guard lock(m_trainerMutex);
        coordinator = m_coordinator;
    }
    store::RecordingOptions ro;
    ro.name = runName;
    std::string warnings;
    ro.warn = [&warnings](const Error& e) { warnings += e.message + "\n"; };
    auto recordingOpened = store::RunRecording::open(m_dbPath.toStdString(), ro);
    if (!recordingOpened.ok()) {
        post(State::Failed, QString::fromStdString(recordingOpened.error().toString()));
        return;
    }
    auto recording = std::move(recordingOpened).value();
    // The workers get the model inline: they cannot read this machine's files.
    if (!config.modelFile.empty()) {
        auto m = loadModelFile(config.modelFile);
        if (!m.ok()) {
            recording->prepareFailed(config, m.error());
            post(State::Failed, QString::fromStdString(m.error().toString()));
            return;
        }
        config.model = std::move(m).value();
        config.modelFile.clear();
    }
    if (auto st = coordinator->preflight(); !st.ok()) {
        recording->prepareFailed(config, st.error());
        post(State::Failed, QString::fromStdString(st.error().toString()));
        return;
    }
    if (Status st = recording->beginRemote(config, *m_bus); !st.ok()) {
        post(State::Failed, QString::fromStdString(st.error().toString()));
        return;
    }
    const std::string runId = recording->runId();
    {
        std::lock_guard lock(m_trainerMutex);
        m_recording = recording.get();  // a capture flushes it
    }
    QMetaObject::invokeMethod(this, [this, id = QString::fromStdString(runId)] {
        m_runId = id;
        if (m_state == State::Preparing) setState(State::Running);
        Q_EMIT runStarted(id);
    }, Qt::QueuedConnection);
    auto result = coordinator->run(config, runId, *m_bus);
    {
        std::lock_guard lock(m_trainerMutex);
        m_recording = nullptr;
    }
    recording->setDevices(coordinator->devices());
    // The weights the run ended with (the chief's or the ps tasks'), kept with the run as a
    // local run's are, so the history can export them.
    if (result.ok())
        recording->keepWeights(coordinator->finalWeights(), weightsMetadata(config.model.name, result->steps), {}, result->steps);
    recording->fitDone(result, m_interrupted);
    State end = State::Completed;
    QString message;
    if (!result.ok()) {
        end = State::Failed;
        message = QString::fromStdString(result.error().toString());
    } else if (result->cancelled) {
        end = State::Cancelled;
    }
    if (!warnings.empty() && message.isEmpty()) message = QString::fromStdString(warnings).trimmed();
    recording.reset();
    post(end, message);
}

void TrainingSession::onEngineDone(State state, const QString& message)
{
    drain();  // the last events (final epoch, end state) before anyone looks
    m_timer.stop();
    if (m_bus && m_sub) m_bus->unsubscribe(m_sub);
    if (m_engine.joinable()) m_engine.join();
    {
        std::lock_guard lock(m_trainerMutex);
        m_coordinator.reset();
    }
    m_error = state == State::Failed ? message : QString();
    setState(state);
    Q_EMIT finished(state, message);
}

void TrainingSession::drain()
{
    if (!m_sub) return;
    std::vector<telemetry::Event> events;
    m_sub->drain(events);
    if (events.empty()) return;
    for (const auto& e : events) m_data.add(e);
    if (m_captureUntil > 0 && m_data.lastStep() >= m_captureUntil) {
        m_captureUntil = 0;
        // The trainer publishes the capture's last spans when its next step starts; then the
        // store commits them (it batches for up to a second), and the profiler reads them back.
        QTimer::singleShot(400, this, [this, id = m_runId] {
            Status flushed = okStatus();
            {
                std::lock_guard lock(m_trainerMutex);
                if (m_recording) flushed = m_recording->flush();
            }
            if (!flushed.ok()) {  // flush() hands the write error over: show it in the run's log
                telemetry::LogEvent e;
                e.stamp.runId = id.toStdString();
                e.stamp.step = m_data.lastStep();
                e.level = telemetry::LogLevel::Error;
                e.message = "the run store could not record the capture: " + flushed.error().toString();
                m_data.add(telemetry::Event(std::move(e)));
                Q_EMIT updated();
            }
            Q_EMIT captureFinished(id);
        });
    }
    // Paused/Running transitions come from the trainer itself.
    const auto s = m_data.state();
    if (s == telemetry::RunState::Paused && m_state == State::Running) setState(State::Paused);
    else if (s == telemetry::RunState::Running && m_state == State::Paused) setState(State::Running);
    Q_EMIT updated();
}

void TrainingSession::pause()
{
    if (m_remote) return;  // workers train in lockstep on their own machines: no pause there yet
    if (m_state != State::Running && m_state != State::Preparing) return;
    m_pauseRequested = true;
    std::lock_guard lock(m_trainerMutex);
    if (m_trainer) m_trainer->pause();
}

void TrainingSession::resume()
{
    m_pauseRequested = false;
    std::lock_guard lock(m_trainerMutex);
    if (m_trainer) m_trainer->resume();
}

void TrainingSession::stop(bool interrupted)
{
    if (!isActive()) return;
    m_interrupted = interrupted;
    m_stopRequested = true;
    {
        std::lock_guard lock(m_trainerMutex);
        if (m_trainer) m_trainer->cancel();
        if (m_coordinator) m_coordinator->cancel();
    }
    setState(State::Stopping);
}

bool TrainingSession::captureTrace(int steps, QString* error)
{
    auto fail = [&](const QString& why) {
        if (error) *error = why;
        return false;
    };
    if (steps <= 0) return fail(tr("capture at least one step"));
    std::lock_guard lock(m_trainerMutex);
    const bool training = m_remote ? m_coordinator && m_state == State::Running
                                   : m_trainer && (m_state == State::Running || m_state == State::Paused);
    if (!training) return fail(tr("no run is training; press Train first"));
    if (m_captureUntil > 0) return fail(tr("a capture is already in progress (until step %1)").arg(m_captureUntil));
    if (m_remote) {
        // Every training task traces its next steps and streams the spans back; the capture ends
        // at the chief's step as this session sees it.
        auto started = m_coordinator->captureTrace(steps);
        if (!started.ok()) return fail(QString::fromStdString(started.error().toString()));
        m_captureUntil = m_data.lastStep() + steps + 1;
        return true;
    }
    if (!m_trainer->requestTrace(steps))
        return fail(tr("this run cannot capture a trace (it already traces every step)"));
    m_captureUntil = m_trainer->stepCounter().load() + steps + 1;
    return true;
}

bool TrainingSession::waitForFinished(int ms)
{
    if (!isActive()) return true;
    // A nested event loop that sleeps until finished() or the timeout (never a polling loop:
    // that would take a core from the training).
    QEventLoop loop;
    connect(this, &TrainingSession::finished, &loop, &QEventLoop::quit);
    QTimer::singleShot(ms, &loop, &QEventLoop::quit);
    loop.exec();
    return !isActive();
}

} // namespace ts
