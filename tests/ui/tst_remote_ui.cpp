// The studio on remote workers (issue 6 with 7): the TF_CONFIG editor enables MultiWorkerMirrored
// when the cluster allows it and explains what is missing, Check workers names a worker that
// does not answer, and a run started from the Train tab trains on two trainstudio-worker
// daemons, streams live into the dashboards, can be stopped, and is recorded here.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <QCheckBox>
#include <QComboBox>
#include <QFile>
#include <QLabel>
#include <QListWidget>
#include <QPlainTextEdit>
#include <QProcess>

#include <algorithm>
#include <QPushButton>
#include <QSignalSpy>
#include <QSpinBox>
#include <QStandardItemModel>
#include <QTableWidget>
#include <QTemporaryDir>
#include <QtTest>

#include <set>

#include "distributed/worker_process.h"
#include "dashboard/dashboardwidget.h"
#include "data/dataset.h"
#include "io/safetensors.h"
#include "mainwindow.h"
#include "remote/worker_client.h"
#include "session/trainingsession.h"
#include "setup/runsetuppanel.h"
#include "store/run_store.h"
#include "trainpage.h"
#include "ui_helpers.h"

using namespace ts;
using State = TrainingSession::State;

namespace {

const char* kToken = "studio-remote-test-token";

using tstest::WorkerProcess;

std::unique_ptr<WorkerProcess> spawnWorker(const QString& dir, const QString& name) { return tstest::spawnWorker(dir, name, kToken); }

// A loopback port nobody listens on.
int deadPort()
{
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    ::bind(fd, reinterpret_cast<sockaddr*>(&a), len);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    ::close(fd);  // bound, never listened: connecting is refused
    return ntohs(a.sin_port);
}

QString cluster(int chief, int worker)
{
    return QString(R"({"cluster": {"chief": ["127.0.0.1:%1"], "worker": ["127.0.0.1:%2"]}})").arg(chief).arg(worker);
}

// The run lists one "final" checkpoint (at `step`, unless -1) whose file holds the seed MLP's weights.
bool hasFinalWeights(store::RunStore& store, const std::string& runId, int64_t step)
{
    auto kept = store.checkpoints(runId);
    if (!kept.ok() || kept->size() != 1 || kept->front().kind != "final" || (step >= 0 && kept->front().step != step)) {
        qWarning("checkpoints of %s: %s", runId.c_str(), kept.ok() ? std::to_string(kept->size()).c_str() : kept.error().toString().c_str());
        return false;
    }
    auto file = readSafetensors(kept->front().path);
    if (!file.ok()) qWarning("%s", file.error().toString().c_str());
    return file.ok() && file->tensors.size() == 4;  // two Dense layers: kernel and bias each
}

bool itemEnabled(QComboBox* box, int index)
{
    return qobject_cast<QStandardItemModel*>(box->model())->item(index)->isEnabled();
}

} // namespace

class TestRemoteUi : public QObject {
    Q_OBJECT
private slots:
    void initTestCase();
    void clusterEditorEnablesStrategies();
    void checkWorkersNamesTheUnreachableOne();
    void trainsOnRemoteWorkersFromTheGui();
    void stopEndsTheRemoteRun();
    void trainsWithParameterServerFromTheGui();

private:
    std::unique_ptr<MainWindow> window(int epochs, int limit);
    // The same, set up to train on the cluster `tfConfig` with `strategy` and this test's token.
    std::unique_ptr<MainWindow> remoteWindow(int epochs, int limit, const QString& tfConfig, const char* strategy);
    QString db() const { return m_dir.filePath("runs.db"); }
    QString tokenFile() const { return m_dir.filePath("token"); }
    void startWorkers();
    QTemporaryDir m_dir;
    std::unique_ptr<WorkerProcess> m_chief, m_worker;
};

void TestRemoteUi::initTestCase()
{
    uitest::isolateSettings();
    QVERIFY(m_dir.isValid());
    QFile f(tokenFile());
    QVERIFY(f.open(QIODevice::WriteOnly));
    f.write(QByteArray(kToken) + "\n");
}

void TestRemoteUi::startWorkers()
{
    if (m_chief && m_chief->running() && m_worker->running()) return;
    m_chief = spawnWorker(m_dir.path(), "chief");
    m_worker = spawnWorker(m_dir.path(), "worker");
    QVERIFY(m_chief->port > 0 && m_worker->port > 0);
}

std::unique_ptr<MainWindow> TestRemoteUi::window(int epochs, int limit)
{
    return uitest::trainingWindow(db(), epochs, limit);
}

std::unique_ptr<MainWindow> TestRemoteUi::remoteWindow(int epochs, int limit, const QString& tfConfig, const char* strategy)
{
    auto w = window(epochs, limit);
    RunSetupPanel* setup = w->trainPage()->setup();
    setup->setPersistent(false);
    RemoteSettings r;
    r.tfConfig = tfConfig;
    r.tokenFile = tokenFile();
    setup->setRemoteSettings(r);
    setup->setStrategy(strategy);
    return w;
}

void TestRemoteUi::clusterEditorEnablesStrategies()
{
    RunSetupPanel setup;
    setup.setPersistent(false);
    setup.setModel(uitest::resourceModel("seed_mlp"));
    auto* strategy = setup.findChild<QComboBox*>("strategy");
    auto* state = setup.findChild<QLabel*>("clusterState");
    // No cluster: the two remote strategies are disabled, with the reason.
    QVERIFY(!itemEnabled(strategy, 2));
    QVERIFY(!itemEnabled(strategy, 3));
    QVERIFY(qobject_cast<QStandardItemModel*>(strategy->model())->item(2)->toolTip().contains("TF_CONFIG"));

    // A broken TF_CONFIG is explained with its line.
    setup.findChild<QPlainTextEdit*>("tfConfig")->setPlainText("{\"cluster\": {\"worker\": [\"a:1\",]\n}}");
    QVERIFY2(state->text().contains("TF_CONFIG editor") && state->text().contains("line"), qPrintable(state->text()));
    QVERIFY(!itemEnabled(strategy, 2));
    // A bad address names the entry.
    setup.findChild<QPlainTextEdit*>("tfConfig")->setPlainText(R"({"cluster": {"worker": ["nohostport"]}})");
    QVERIFY2(state->text().contains("nohostport"), qPrintable(state->text()));

    // A valid two-task cluster: MultiWorkerMirrored is enabled, ParameterServer needs ps tasks.
    RemoteSettings r;
    r.tfConfig = cluster(7001, 7002);
    setup.setRemoteSettings(r);
    QVERIFY(itemEnabled(strategy, 2));
    QVERIFY(!itemEnabled(strategy, 3));
    QCOMPARE(setup.workerTable()->rowCount(), 2);
    QCOMPARE(setup.workerTable()->item(0, 0)->text(), QString("chief:0"));
    QCOMPARE(setup.workerTable()->item(1, 1)->text(), QString("127.0.0.1:7002"));
    setup.setStrategy("multi-worker-mirrored");
    QCOMPARE(setup.replicaCount(), 2);
    QVERIFY(!setup.deviceList()->isEnabled());
    // Without a token (none in the environment either) the run cannot start: said so.
    qunsetenv("TRAINSTUDIO_TOKEN");
    QVERIFY2(setup.problems().join('\n').contains("TRAINSTUDIO_TOKEN"), qPrintable(setup.problems().join('\n')));
    r.tokenFile = tokenFile();
    setup.setRemoteSettings(r);
    QVERIFY2(setup.problems().isEmpty(), qPrintable(setup.problems().join('\n')));
    // The global batch is split over the two workers.
    setup.findChild<QSpinBox*>("batch")->setValue(255);
    QVERIFY2(setup.problems().join('\n').contains("not divisible by the 2 replicas"), qPrintable(setup.problems().join('\n')));
    setup.findChild<QSpinBox*>("batch")->setValue(256);
    // With the tf.data pipeline, the input sharding is a choice; by file needs more than the one
    // IDX dataset, and the form says so before the run starts.
    auto* autoShard = setup.findChild<QComboBox*>("autoShard");
    QVERIFY(autoShard && !autoShard->isEnabled());
    setup.findChild<QCheckBox*>("usePipeline")->setChecked(true);
    QVERIFY(autoShard->isEnabled());
    QVERIFY(!itemEnabled(autoShard, autoShard->findData("file")));  // one IDX dataset: no files to deal
    autoShard->setCurrentIndex(autoShard->findData("file"));          // as a loaded configuration may say
    QVERIFY2(setup.problems().join('\n').contains("Input sharding: the input pipeline: auto_shard \"file\""),
             qPrintable(setup.problems().join('\n')));
    autoShard->setCurrentIndex(autoShard->findData("off"));
    QVERIFY2(setup.problems().isEmpty(), qPrintable(setup.problems().join('\n')));
    QCOMPARE(setup.config().pipeline->autoShard, AutoShardPolicy::Off);
    autoShard->setCurrentIndex(autoShard->findData("auto"));
    setup.findChild<QCheckBox*>("usePipeline")->setChecked(false);
    // The configuration leaves the devices to the workers.
    const RunConfig c = setup.config();
    QCOMPARE(c.strategy.kind, std::string("multi-worker-mirrored"));
    QVERIFY(c.strategy.devices.empty());
    // An evaluator evaluates a multi-worker-mirrored cluster's run as a parameter-server one's.
    auto* clusterState = setup.findChild<QLabel*>("clusterState");
    r.tfConfig = R"({"cluster": {"worker": ["127.0.0.1:7001"], "evaluator": ["127.0.0.1:7004"]}})";
    setup.setRemoteSettings(r);
    QVERIFY2(clusterState->text().contains("1 training task(s), an evaluator task"), qPrintable(clusterState->text()));
    r.tfConfig = R"({"cluster": {"worker": ["127.0.0.1:7001"], "ps": ["127.0.0.1:7003"], "evaluator": ["127.0.0.1:7004"]}})";
    setup.setRemoteSettings(r);
    QVERIFY2(clusterState->text().contains("1 ps task(s), an evaluator task"), qPrintable(clusterState->text()));
    // ps tasks in the cluster: MultiWorkerMirrored does not use them, and says so.
    r.tfConfig = R"({"cluster": {"worker": ["127.0.0.1:7001"], "ps": ["127.0.0.1:7003"]}})";
    setup.setRemoteSettings(r);
    QVERIFY(!itemEnabled(strategy, 2));
    QVERIFY2(setup.problems().join('\n').contains("ps"), qPrintable(setup.problems().join('\n')));
    // ... and ParameterServer is what such a cluster is for.
    QVERIFY(itemEnabled(strategy, 3));
    auto* partitioner = setup.findChild<QComboBox*>("partitioner");
    auto* minShard = setup.findChild<QSpinBox*>("minShard");
    QVERIFY(partitioner && minShard);
    QVERIFY(!partitioner->isEnabled());  // MultiWorkerMirrored has no ps tasks to place variables on
    setup.setStrategy("parameter-server");
    QVERIFY2(setup.problems().isEmpty(), qPrintable(setup.problems().join('\n')));
    QCOMPARE(setup.config().strategy.kind, std::string("parameter-server"));
    // Where the variables go: round-robin by default (TF without a partitioner); by size, with
    // its minimum shard, splits large ones.
    QVERIFY(partitioner->isEnabled());
    QVERIFY(!minShard->isEnabled());
    QCOMPARE(setup.config().strategy.partition.policy, std::string("round-robin"));
    partitioner->setCurrentIndex(partitioner->findData("by-size"));
    QVERIFY(minShard->isEnabled());
    QCOMPARE(minShard->value(), 256);  // KiB, TF's default
    minShard->setValue(64);
    RunConfig psConfig = setup.config();
    QCOMPARE(psConfig.strategy.partition.policy, std::string("by-size"));
    QCOMPARE(psConfig.strategy.partition.minShardBytes, int64_t(64 << 10));
    // ... and a run's configuration brings them back ("Train again", a loaded run).
    partitioner->setCurrentIndex(0);
    minShard->setValue(512);
    setup.setConfig(psConfig);
    QCOMPARE(partitioner->currentData().toString(), QString("by-size"));
    QCOMPARE(minShard->value(), 64);
    QCOMPARE(setup.config().strategy.partition.toJson(), psConfig.strategy.partition.toJson());
    // Export… writes each task's TF_CONFIG for machines that run their task themselves.
    QVERIFY(setup.findChild<QPushButton*>("exportTfConfig"));
    QTemporaryDir exportDir;
    const QStringList written = setup.exportTfConfigsTo(exportDir.path());
    QCOMPARE(written.size(), 2);
    QVERIFY2(state->text().startsWith("Wrote 2 TF_CONFIG file(s)"), qPrintable(state->text()));
    QFile ps(exportDir.filePath("tf_config-ps-0.json"));
    QVERIFY(ps.open(QIODevice::ReadOnly));
    QVERIFY2(ps.readAll().contains(R"("task":{"index":0,"type":"ps"})"), qPrintable(written.join(' ')));
    // ... and says why it cannot.
    QVERIFY(setup.exportTfConfigsTo(exportDir.filePath("tf_config-ps-0.json")).isEmpty());
    QVERIFY2(state->text().startsWith("Export: cannot make the folder"), qPrintable(state->text()));

    // The session refuses a remote strategy without a usable cluster, with the same words.
    TrainingSession session;
    session.setDatabasePath(db());
    QString error;
    QVERIFY(!session.start(c, {}, &error, RemoteSettings{}));
    QVERIFY2(error.contains("TF_CONFIG"), qPrintable(error));
    QCOMPARE(session.state(), State::Idle);
}

void TestRemoteUi::checkWorkersNamesTheUnreachableOne()
{
    startWorkers();
    RunSetupPanel setup;
    setup.setPersistent(false);
    setup.setModel(uitest::resourceModel("seed_mlp"));
    const int dead = deadPort();
    RemoteSettings r;
    r.tfConfig = cluster(m_chief->port, dead);
    r.tokenFile = tokenFile();
    setup.setRemoteSettings(r);
    QSignalSpy done(setup.clusterProbe(), &ClusterProbe::finished);
    QTest::mouseClick(setup.findChild<QPushButton*>("checkWorkers"), Qt::LeftButton);
    QTRY_COMPARE_WITH_TIMEOUT(done.count(), 1, 15000);
    QTableWidget* t = setup.workerTable();
    QCOMPARE(t->rowCount(), 2);
    QVERIFY2(t->item(0, 2)->text().startsWith("ready"), qPrintable(t->item(0, 2)->text()));
    const QString bad = t->item(1, 2)->text();
    QVERIFY2(bad.contains(QString("worker:0 at 127.0.0.1:%1").arg(dead)) && bad.contains("unreachable"), qPrintable(bad));
    QVERIFY2(setup.findChild<QLabel*>("clusterState")->text().contains("1 of 2"), qPrintable(setup.findChild<QLabel*>("clusterState")->text()));

    // A wrong token is refused by the worker, and the table says so.
    QFile f(m_dir.filePath("wrong-token"));
    QVERIFY(f.open(QIODevice::WriteOnly));
    f.write("not-the-token");
    f.close();
    r.tfConfig = cluster(m_chief->port, m_worker->port);
    r.tokenFile = f.fileName();
    setup.setRemoteSettings(r);
    setup.checkWorkers();
    QTRY_COMPARE_WITH_TIMEOUT(done.count(), 2, 15000);
    QVERIFY2(!t->item(0, 2)->text().startsWith("ready"), qPrintable(t->item(0, 2)->text()));
}

void TestRemoteUi::trainsOnRemoteWorkersFromTheGui()
{
    if (!QFileInfo(QString::fromStdString(defaultFashionMnistDir())).isDir())
        QSKIP("Fashion-MNIST is not installed (dataset-fashion-mnist)");
    startWorkers();
    // With an evaluator task: it evaluates the chief's weights after each epoch.
    auto ev = spawnWorker(m_dir.path(), "mwm-ev0");
    QVERIFY(ev->port > 0);
    const QString tfConfig = QString(R"({"cluster": {"chief": ["127.0.0.1:%1"], "worker": ["127.0.0.1:%2"], "evaluator": ["127.0.0.1:%3"]}})")
                                 .arg(m_chief->port)
                                 .arg(m_worker->port)
                                 .arg(ev->port);
    auto w = remoteWindow(2, 4096, tfConfig, "multi-worker-mirrored");
    TrainPage* page = w->trainPage();
    RunSetupPanel* setup = page->setup();
    QVERIFY2(setup->problems().isEmpty(), qPrintable(setup->problems().join('\n')));
    QVERIFY(page->trainButton()->isEnabled());
    QSignalSpy finished(w->session(), &TrainingSession::finished);
    QTest::mouseClick(page->trainButton(), Qt::LeftButton);
    QVERIFY(w->session()->isRemote());
    QTRY_VERIFY_WITH_TIMEOUT(page->dashboard()->lossPointCount() > 0, 60000);
    QVERIFY(!page->pauseButton()->isEnabled());  // the workers cannot pause (yet): not offered
    QTRY_COMPARE_WITH_TIMEOUT(finished.count(), 1, 120000);
    QCOMPARE(finished.at(0).at(0).value<State>(), State::Completed);
    const RunData& live = w->session()->data();
    // The chief's steps: 4096 examples / 256 per global batch = 16 steps per epoch.
    QCOMPARE(live.steps().step.size(), std::size_t(32));
    QCOMPARE(live.epochs().epoch.size(), std::size_t(2));
    QCOMPARE(live.epochs().valAccuracy.size(), std::size_t(2));  // both epochs, by the evaluator
    QVERIFY(live.epochs().valAccuracy.back() > 0.5);
    QVERIFY(live.steps().loss.back() < live.steps().loss.front());
    // Each worker's host on its own lane (named after the task), not one merged "host".
    QVERIFY(live.devices().count("chief:0 host") == 1);
    QVERIFY(live.devices().count("worker:0 host") == 1);
    QVERIFY(live.devices().count("host") == 0);

    auto store = store::RunStore::open(db().toStdString(), {.readOnly = true});
    QVERIFY(store.ok());
    auto info = store->run(w->session()->runId().toStdString());
    QVERIFY(info.ok());
    QCOMPARE(int(info->status), int(telemetry::RunState::Completed));
    QCOMPARE(info->strategy, std::string("multi-worker-mirrored"));
    QCOMPARE(info->lastStep, int64_t(32));
    // The chief's weights are kept with the run, as a local run's are, so the history can export them.
    QVERIFY(hasFinalWeights(*store, w->session()->runId().toStdString(), 32));
    // The evaluator evaluated and was stopped with the run.
    auto epochs = store->epochMetrics(w->session()->runId().toStdString());
    QVERIFY(epochs.ok() && epochs->size() == 2);
    for (const auto& e : *epochs) QVERIFY(e.metrics.count("val_accuracy"));
    auto evaluator = remote::WorkerClient::connect("evaluator:0", "127.0.0.1:" + std::to_string(ev->port), kToken);
    QVERIFY(evaluator.ok());
    auto pulse = (*evaluator)->heartbeat(std::chrono::seconds(5));
    QVERIFY2(pulse.ok() && pulse->state == "completed", pulse.ok() ? pulse->state.c_str() : pulse.error().message.c_str());
}

void TestRemoteUi::stopEndsTheRemoteRun()
{
    if (!QFileInfo(QString::fromStdString(defaultFashionMnistDir())).isDir())
        QSKIP("Fashion-MNIST is not installed (dataset-fashion-mnist)");
    startWorkers();
    auto w = remoteWindow(50, 0, cluster(m_chief->port, m_worker->port), "multi-worker-mirrored");
    TrainPage* page = w->trainPage();
    RunSetupPanel* setup = page->setup();
    QSignalSpy finished(w->session(), &TrainingSession::finished);
    QTest::mouseClick(page->trainButton(), Qt::LeftButton);
    QTRY_VERIFY_WITH_TIMEOUT(page->dashboard()->lossPointCount() > 0, 60000);
    // Capture trace works on a remote run too (it was disabled): every task's spans are recorded.
    auto* capture = page->findChild<QPushButton*>(QStringLiteral("captureButton"));
    QVERIFY(capture);
    QTRY_VERIFY_WITH_TIMEOUT(capture->isEnabled(), 10000);
    QSignalSpy captured(w->session(), &TrainingSession::captureFinished);
    QTest::mouseClick(capture, Qt::LeftButton);
    QTRY_COMPARE_WITH_TIMEOUT(captured.count(), 1, 60000);
    {
        auto store = store::RunStore::open(db().toStdString(), {.readOnly = true});
        QVERIFY(store.ok());
        auto spans = store->spans(w->session()->runId().toStdString());
        QVERIFY(spans.ok());
        std::set<std::string> tasks;
        for (const auto& sp : *spans)
            if (sp.name == "all-reduce") tasks.insert(sp.stamp.lane.worker);
        QVERIFY2(tasks == std::set<std::string>({"chief:0", "worker:0"}), qPrintable(QString::number(spans->size())));
    }
    QTest::mouseClick(page->stopButton(), Qt::LeftButton);
    QTRY_COMPARE_WITH_TIMEOUT(finished.count(), 1, 30000);
    QCOMPARE(finished.at(0).at(0).value<State>(), State::Cancelled);
    auto store = store::RunStore::open(db().toStdString(), {.readOnly = true});
    QVERIFY(store.ok());
    auto info = store->run(w->session()->runId().toStdString());
    QVERIFY(info.ok());
    QCOMPARE(int(info->status), int(telemetry::RunState::Cancelled));
    QVERIFY(info->lastStep > 0);
    QVERIFY(hasFinalWeights(*store, w->session()->runId().toStdString(), -1));  // the weights so far
    // The workers are idle again: a new check finds both ready.
    // (A worker reports busy until its task has wound down: check again for a few seconds.)
    QSignalSpy done(setup->clusterProbe(), &ClusterProbe::finished);
    bool ready = false;
    for (int attempt = 0; attempt < 10 && !ready; ++attempt) {
        if (attempt) QTest::qWait(500);
        setup->checkWorkers();
        QTRY_COMPARE_WITH_TIMEOUT(done.count(), attempt + 1, 15000);
        ready = setup->workerTable()->item(0, 2)->text().startsWith("ready") && setup->workerTable()->item(1, 2)->text().startsWith("ready");
    }
    QVERIFY2(ready, qPrintable(setup->workerTable()->item(0, 2)->text() + " / " + setup->workerTable()->item(1, 2)->text()));
}

void TestRemoteUi::trainsWithParameterServerFromTheGui()
{
    if (!QFileInfo(QString::fromStdString(defaultFashionMnistDir())).isDir())
        QSKIP("Fashion-MNIST is not installed (dataset-fashion-mnist)");
    // One ps task, two workers and an evaluator, each its own trainstudio-worker process.
    auto ps = spawnWorker(m_dir.path(), "ps0");
    auto w0 = spawnWorker(m_dir.path(), "w0");
    auto w1 = spawnWorker(m_dir.path(), "w1");
    auto ev = spawnWorker(m_dir.path(), "ev0");
    QVERIFY(ps->port > 0 && w0->port > 0 && w1->port > 0 && ev->port > 0);
    const QString tfConfig =
        QString(R"({"cluster": {"worker": ["127.0.0.1:%1", "127.0.0.1:%2"], "ps": ["127.0.0.1:%3"], "evaluator": ["127.0.0.1:%4"]}})")
            .arg(w0->port)
            .arg(w1->port)
            .arg(ps->port)
            .arg(ev->port);
    auto w = remoteWindow(1, 4096, tfConfig, "parameter-server");
    TrainPage* page = w->trainPage();
    RunSetupPanel* setup = page->setup();
    // Variables by size (one ps task: one shard each): the tasks accept the studio's partitioner.
    // Its mapping to the configuration is checked in clusterEditorEnablesStrategies, the split in
    // tst_parameter_server trainsWithTwoPs.
    auto* partitioner = setup->findChild<QComboBox*>("partitioner");
    partitioner->setCurrentIndex(partitioner->findData("by-size"));
    setup->findChild<QSpinBox*>("minShard")->setValue(64);
    QVERIFY2(setup->problems().isEmpty(), qPrintable(setup->problems().join('\n')));
    QVERIFY(page->trainButton()->isEnabled());
    QSignalSpy finished(w->session(), &TrainingSession::finished);
    QTest::mouseClick(page->trainButton(), Qt::LeftButton);
    QVERIFY(w->session()->isRemote());
    QTRY_VERIFY_WITH_TIMEOUT(page->dashboard()->lossPointCount() > 0, 60000);
    QTRY_COMPARE_WITH_TIMEOUT(finished.count(), 1, 120000);
    QVERIFY2(finished.at(0).at(0).value<State>() == State::Completed, qPrintable(finished.at(0).at(1).toString()));
    const RunData& live = w->session()->data();
    QVERIFY(!live.steps().step.empty());
    // That it learned is in the evaluation below: the step losses of 32 asynchronous steps are
    // a worker's running mean from wherever its first step fell (a late first step starts low,
    // and stale updates can raise it again: seen 1.39 at step 8 and 1.39 at step 31).

    auto store = store::RunStore::open(db().toStdString(), {.readOnly = true});
    QVERIFY(store.ok());
    const std::string id = w->session()->runId().toStdString();
    auto info = store->run(id);
    QVERIFY(info.ok());
    QCOMPARE(int(info->status), int(telemetry::RunState::Completed));
    QCOMPARE(info->strategy, std::string("parameter-server"));
    // The workers' staleness is recorded with the run.
    auto metrics = store->metricNames(id);
    QVERIFY(metrics.ok());
    QVERIFY2(std::find(metrics->begin(), metrics->end(), "staleness") != metrics->end(), "no staleness metric");
    QVERIFY(hasFinalWeights(*store, id, -1));  // pulled from the ps task
    // The evaluator task evaluated the epoch and was stopped with the run ("completed"), and the
    // run's epoch has its test accuracy.
    auto epochs = store->epochMetrics(id);
    QVERIFY(epochs.ok() && !epochs->empty());
    QVERIFY(epochs->back().metrics.count("val_accuracy"));
    QVERIFY2(epochs->back().metrics.at("val_accuracy") > 0.5, qPrintable(QString::number(epochs->back().metrics.at("val_accuracy"))));  // 0.1 by chance
    auto evaluator = remote::WorkerClient::connect("evaluator:0", "127.0.0.1:" + std::to_string(ev->port), kToken);
    QVERIFY(evaluator.ok());
    auto pulse = (*evaluator)->heartbeat(std::chrono::seconds(5));
    QVERIFY2(pulse.ok() && pulse->state == "completed", pulse.ok() ? pulse->state.c_str() : pulse.error().message.c_str());
}

QTEST_MAIN(TestRemoteUi)
#include "tst_remote_ui.moc"
