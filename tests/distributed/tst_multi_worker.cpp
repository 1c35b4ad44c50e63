// MultiWorkerMirrored through the CLI: processes on loopback, each one task of a TF_CONFIG
// cluster, train to the same weights as one process with the same global batch; a worker killed
// with SIGKILL mid-run stops the others with an error naming it; bad setups are refused clearly.

#include <QtTest>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <condition_variable>
#include <map>
#include <mutex>

#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "remote/rendezvous.h"
#include "remote/sidecar_evaluation.h"
#include "train/run_config.h"
#include "store/run_store.h"

#include "distributed/local_evaluation.h"
#include "distributed/weight_diff.h"
#include "distributed/worker_process.h"

using namespace ts;
using tstest::maxDiff;

namespace {

const QString kToken = "multi-worker-test-token";

// A loopback port nobody listens on right now (bound to 0, read back, released).
int freePort()
{
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    ::close(fd);
    return ntohs(a.sin_port);
}

QString clusterJson(const std::vector<int>& ports)
{
    QStringList workers;
    for (std::size_t i = 1; i < ports.size(); ++i) workers << QString("\"127.0.0.1:%1\"").arg(ports[i]);
    return QString(R"({"cluster": {"chief": ["127.0.0.1:%1"], "worker": [%2]}})").arg(ports[0]).arg(workers.join(", "));
}

// The common flags: the seed's MLP, 20 steps of a global batch of 64, no validation.
QStringList trainArgs(int steps = 20)
{
    return {"train", "--model", "mlp", "--max-steps", QString::number(steps), "--batch-size", "64", "--limit", "1280",
            "--no-validation", "--seed", "3", "--threads", "1", "--quiet"};
}

std::unique_ptr<QProcess> startCli(const QStringList& args, const QString& tfConfig, bool withToken = true)
{
    auto p = std::make_unique<QProcess>();
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    env.remove("TF_CONFIG");
    env.remove("TRAINSTUDIO_TOKEN");
    if (!tfConfig.isEmpty()) env.insert("TF_CONFIG", tfConfig);
    if (withToken) env.insert("TRAINSTUDIO_TOKEN", kToken);
    env.insert("OMP_NUM_THREADS", "1");
    p->setProcessEnvironment(env);
    p->start(QStringLiteral(TS_CLI_PATH), args);
    return p;
}

struct Finished {
    int code = -1;
    QString out;
};

Finished finish(QProcess& p, int ms = 120000)
{
    Finished f;
    if (!p.waitForFinished(ms)) {
        p.kill();
        p.waitForFinished();
    }
    f.code = p.exitStatus() == QProcess::NormalExit ? p.exitCode() : -2;
    f.out = QString::fromUtf8(p.readAllStandardOutput()) + QString::fromUtf8(p.readAllStandardError());
    return f;
}

// A chief, one worker and an evaluator on free loopback ports.
QString clusterWithEvaluator()
{
    return QString(R"({"cluster": {"chief": ["127.0.0.1:%1"], "worker": ["127.0.0.1:%2"], "evaluator": ["127.0.0.1:%3"]}})")
        .arg(freePort())
        .arg(freePort())
        .arg(freePort());
}

// The JSON objects among a process's output lines.
std::vector<nlohmann::json> jsonLines(const QString& out)
{
    std::vector<nlohmann::json> lines;
    for (const QString& line : out.split('\n')) {
        auto j = nlohmann::json::parse(line.toStdString(), nullptr, false);
        if (j.is_object()) lines.push_back(std::move(j));
    }
    return lines;
}

// The "evaluation" lines of a chief's --json output, by epoch.
std::map<int, nlohmann::json> evaluations(const QString& out)
{
    std::map<int, nlohmann::json> byEpoch;
    for (auto& j : jsonLines(out))
        if (j.value("evaluation", false)) byEpoch[j["epoch"].get<int>()] = j;
    return byEpoch;
}

void writeFile(const QString& path, const QByteArray& bytes)
{
    QFile f(path);
    if (f.open(QIODevice::WriteOnly)) f.write(bytes);
}

// Rows [from, from + count) of a small 4-class CSV (3 features) for the pipeline tests.
QByteArray csvRows(int from, int count)
{
    QByteArray csv = "label,a,b,c\n";
    for (int i = from; i < from + count; ++i)
        csv += QByteArray::number(i % 4) + "," + QByteArray::number(std::sin(i * 0.7), 'g', 7) + "," +
               QByteArray::number(std::cos(i * 1.3), 'g', 7) + "," + QByteArray::number((i % 7) / 7.0 + (i % 4) * 0.3, 'g', 7) + "\n";
    return csv;
}

// A run of a small MLP on CSV files through a "pipeline" section, global batch 10, SGD (so a
// wrongly scaled gradient shows in the weights one to one).
QString writePipelineRun(const QDir& dir, const QString& name, const QStringList& csvFiles, const QString& autoShard,
                         const QString& validationCsv = {}, bool dropRemainder = false)
{
    writeFile(dir.filePath("tiny.json"), R"({"format": "trainstudio-model", "version": 1, "name": "tiny", "layers": [
        {"id": "input", "type": "Input", "attrs": {"shape": [3]}},
        {"id": "hidden", "type": "Dense", "inputs": ["input"], "attrs": {"units": 8, "activation": "relu"}},
        {"id": "head", "type": "Dense", "inputs": ["hidden"], "attrs": {"units": 4, "activation": "softmax"}}],
        "compile": {"loss": "sparse_categorical_crossentropy", "batch_size": 10}})");
    QStringList paths;
    for (const QString& f : csvFiles) paths << "\"" + f + "\"";
    const QString validation = validationCsv.isEmpty() ? QString()
                                                       : QString(R"(, "validation_pipeline": {"source": {"kind": "csv", "paths": ["%1"],
                                                             "label_column": "label"}, "transformations": [{"op": "batch", "size": 10}]})")
                                                             .arg(validationCsv);
    const QString run = QString(R"({"model_file": "%1", "epochs": 2, "seed": 5, "data": {"validate": false},
        "optimizer": {"type": "sgd", "learning_rate": 0.1, "momentum": 0.9},
        "pipeline": {"source": {"kind": "csv", "paths": [%2], "label_column": "label"}, "auto_shard": "%3",
                     "transformations": [{"op": "batch", "size": 10, "drop_remainder": %5}]}%4})")
                            .arg(dir.filePath("tiny.json"), paths.join(", "), autoShard, validation, dropRemainder ? "true" : "false");
    const QString path = dir.filePath(name);
    writeFile(path, run.toUtf8());
    return path;
}

} // namespace

class TestMultiWorker : public QObject {
    Q_OBJECT
private slots:
    void initTestCase();
    void sameWeightsAsOneProcess_data();
    void sameWeightsAsOneProcess();
    void mixedPrecisionAcrossProcesses();
    void killedWorkerIsNamed();
    void suspendedChiefSaysSo();
    void interruptedChiefStopsTheCluster();
    void interruptedWorkerIsNotRestarted();
    void dataErrorOnWorkerIsNotRestarted();
    void lostWhileFormingIsFormedAgain();
    void reformAtRejoinSharesTheBudget();
    void restartFromBackupEqualsContinuous();
    void separateNetworkNamespaces_data();
    void separateNetworkNamespaces();
    void refusedSetups();
    void autoShardedPipelineEqualsOneProcess_data();
    void autoShardedPipelineEqualsOneProcess();
    void unevenFileShardsJoin();
    void emptyShardJoins();
    void restartWithUnevenShardsEqualsContinuous();
    void evaluatorTaskValidatesEachEpoch();
    void chiefEvaluatesWithoutItsEvaluator();
    void evaluatorRejoinsAfterKill();
    void replayedEpochIsEvaluatedOnce();

private:
    QTemporaryDir m_dir;
    QString m_reference;
    QString runWithRestart(const QString& tag, const QStringList& args, const QStringList& chiefExtra, const QStringList& workerExtra,
                           bool killWorker, bool atOnce = false);
};

void TestMultiWorker::initTestCase()
{
    QVERIFY(m_dir.isValid());
    m_reference = m_dir.filePath("reference.safetensors");
    auto p = startCli(trainArgs() + QStringList{"--strategy", "one-device", "--no-record", "--save-weights", m_reference}, {});
    const Finished f = finish(*p);
    QVERIFY2(f.code == 0, qPrintable(f.out));
    // The comparison can tell runs apart: one step fewer is far outside the tolerance.
    const QString shorter = m_dir.filePath("reference-19.safetensors");
    QStringList args = trainArgs(19) + QStringList{"--strategy", "one-device", "--no-record", "--save-weights", shorter};
    const Finished g = finish(*startCli(args, {}));
    QVERIFY2(g.code == 0, qPrintable(g.out));
    const double oneStep = maxDiff(m_reference, shorter);
    qInfo("one step changes the weights by up to %g", oneStep);
    QVERIFY(oneStep > 1e-4 && oneStep < 1);
}

void TestMultiWorker::sameWeightsAsOneProcess_data()
{
    QTest::addColumn<int>("workers");
    QTest::addColumn<QString>("devices");
    QTest::newRow("2 processes x 1 replica") << 2 << "cpu:0";
    QTest::newRow("2 processes x 2 local replicas") << 2 << "cpu:0,cpu:1";
    QTest::newRow("4 processes x 1 replica") << 4 << "cpu:0";
}

void TestMultiWorker::sameWeightsAsOneProcess()
{
    QFETCH(int, workers);
    QFETCH(QString, devices);
    std::vector<int> ports;
    for (int i = 0; i < workers; ++i) ports.push_back(freePort());
    const QString cluster = clusterJson(ports);
    const QString db = m_dir.filePath(QString("runs-%1.db").arg(QTest::currentDataTag()).replace(' ', '_'));
    std::vector<std::unique_ptr<QProcess>> procs;
    std::vector<QString> weights;
    for (int t = 0; t < workers; ++t) {
        const QString task = t == 0 ? "chief:0" : QString("worker:%1").arg(t - 1);
        weights.push_back(m_dir.filePath(QString("w%1-%2-%3.safetensors").arg(t).arg(workers).arg(devices.count(',') + 1)));
        QStringList args = trainArgs();
        args.removeAll("--quiet");
        args << "--strategy" << "multi-worker-mirrored" << "--task" << task << "--devices" << devices << "--db" << db
             << "--save-weights" << weights.back();
        procs.push_back(startCli(args, cluster));
    }
    for (int t = 0; t < workers; ++t) {
        const Finished f = finish(*procs[static_cast<std::size_t>(t)]);
        QVERIFY2(f.code == 0, qPrintable(f.out));
        QVERIFY2(f.out.contains(QString("rank %1 of %2").arg(t).arg(workers)), qPrintable(f.out));
        // Only the chief records the run.
        QCOMPARE(f.out.contains("Recorded as run"), t == 0);
    }
    for (int t = 0; t < workers; ++t) {
        const double d = maxDiff(weights[static_cast<std::size_t>(t)], m_reference);
        qInfo("task %d: max |w - w(one process)| = %g", t, d);
        QVERIFY2(d <= 1e-5, qPrintable(QString("task %1 differs from one process by %2").arg(t).arg(d)));
    }
    // The processes agree with each other exactly: they apply the same all-reduced update.
    for (int t = 1; t < workers; ++t) QCOMPARE(maxDiff(weights[0], weights[static_cast<std::size_t>(t)]), 0.0);
}

// mixed_float16 across processes: each process scales its loss, checks the all-reduced gradients
// and agrees on every skipped step, so 2 processes x 1 replica equal one process with 2 replicas
// in the same policy (16-bit rounding happens per replica in both). A task with another policy
// is refused by the settings agreement.
void TestMultiWorker::mixedPrecisionAcrossProcesses()
{
    const QStringList mixed{"--precision", "mixed_float16"};
    const QString reference = m_dir.filePath("mixed-reference.safetensors");
    const Finished r = finish(*startCli(trainArgs() + mixed + QStringList{"--strategy", "mirrored", "--devices", "cpu:0,cpu:1",
                                                                          "--no-record", "--save-weights", reference},
                                        {}));
    QVERIFY2(r.code == 0, qPrintable(r.out));
    const double policy = maxDiff(reference, m_reference);
    qInfo("mixed_float16 vs float32 after 20 steps: max weight difference %g", policy);
    QVERIFY2(policy > 1e-6, "the policy changed nothing");

    const std::vector<int> ports = {freePort(), freePort()};
    const QString cluster = clusterJson(ports);
    std::vector<QString> weights;
    std::vector<std::unique_ptr<QProcess>> procs;
    for (int t = 0; t < 2; ++t) {
        weights.push_back(m_dir.filePath(QString("mixed-w%1.safetensors").arg(t)));
        procs.push_back(startCli(trainArgs() + mixed + QStringList{"--strategy", "multi-worker-mirrored", "--task", t == 0 ? "chief:0" : "worker:0",
                                                                   "--no-record", "--save-weights", weights.back()},
                                 cluster));
    }
    for (auto& p : procs) {
        const Finished f = finish(*p);
        QVERIFY2(f.code == 0, qPrintable(f.out));
    }
    for (const QString& w : weights) {
        const double d = maxDiff(w, reference);
        qInfo("%s: max |w - w(one process, 2 replicas)| = %g", qPrintable(QFileInfo(w).fileName()), d);
        QVERIFY2(d <= 1e-5, qPrintable(QString("%1 differs by %2").arg(w).arg(d)));
    }

    // A worker in float32 next to a chief in mixed_float16: refused, naming the setting.
    const std::vector<int> ports2 = {freePort(), freePort()};
    const QString cluster2 = clusterJson(ports2);
    QStringList base = trainArgs();
    base << "--strategy" << "multi-worker-mirrored" << "--no-record";
    auto chief = startCli(base + mixed + QStringList{"--task", "chief:0"}, cluster2);
    auto worker = startCli(base + QStringList{"--task", "worker:0"}, cluster2);
    const Finished fc = finish(*chief), fw = finish(*worker);
    QVERIFY(fc.code != 0 && fw.code != 0);
    QVERIFY2(fc.out.contains("precision") && fw.out.contains("precision"), qPrintable(fc.out + "\n---\n" + fw.out));
}

void TestMultiWorker::killedWorkerIsNamed()
{
    const std::vector<int> ports = {freePort(), freePort()};
    const QString cluster = clusterJson(ports);
    QStringList args = trainArgs(100000);
    args.removeAll("--quiet");
    args << "--strategy" << "multi-worker-mirrored" << "--no-record" << "--epochs" << "1000" << "--json";
    auto chief = startCli(args + QStringList{"--task", "chief:0"}, cluster);
    auto worker = startCli(args + QStringList{"--task", "worker:0"}, cluster);
    // Once the chief has finished an epoch (so mid-training, not during setup), SIGKILL the worker.
    QString seen;
    QVERIFY2(tstest::readUntil(*chief, seen, "\"epoch\":2"), qPrintable(seen));
    QCOMPARE(chief->state(), QProcess::Running);
    ::kill(static_cast<pid_t>(worker->processId()), SIGKILL);
    QElapsedTimer timer;
    timer.start();
    Finished f = finish(*chief, 30000);
    f.out = seen + f.out;
    const double secs = timer.elapsed() / 1000.0;
    finish(*worker);
    QCOMPARE(f.code, 1);
    for (const QString& line : f.out.split('\n'))
        if (line.startsWith("error:")) qInfo("%s (after %.1f s)", qPrintable(line), secs);
    QVERIFY2(f.out.contains("worker:0 at 127.0.0.1:" + QString::number(ports[1])), qPrintable(f.out));
    QVERIFY2(f.out.contains("stopped responding"), qPrintable(f.out));
    QVERIFY2(secs < 10.0, qPrintable(QString("detected after %1 s").arg(secs)));
}

// Backup and restore across processes: the chief backs up every 5 steps; a worker is killed with
// SIGKILL mid-run; the chief (--restarts 1) re-joins the cluster, the worker is started again
// (as its supervisor would), and both continue from the chief's backup. The worker's own backup
// folder stays empty: it gets the chief's state over the collective. Both end with exactly the
// weights of an uninterrupted 2-process run.
// The chief stopped (SIGSTOP) mid-run: the worker names the chief; the chief, continued after
// the worker gave up, says that it was the one not running instead of blaming the worker.
void TestMultiWorker::suspendedChiefSaysSo()
{
    const QString cluster = clusterJson({freePort(), freePort()});
    QStringList args = trainArgs(1000000);
    args << "--strategy" << "multi-worker-mirrored" << "--no-record" << "--epochs" << "100000";
    auto chief = startCli(args + QStringList{"--task", "chief:0"}, cluster);
    auto worker = startCli(args + QStringList{"--task", "worker:0"}, cluster);
    QTest::qWait(3000);  // joined and training (each epoch is 20 steps)
    QCOMPARE(chief->state(), QProcess::Running);
    QCOMPARE(worker->state(), QProcess::Running);
    ::kill(static_cast<pid_t>(chief->processId()), SIGSTOP);
    const Finished w = finish(*worker, 30000);
    ::kill(static_cast<pid_t>(chief->processId()), SIGCONT);
    const Finished c = finish(*chief, 30000);
    QVERIFY2(w.code == 1 && w.out.contains("chief:0") && w.out.contains("stopped responding"), qPrintable(w.out));
    QVERIFY2(c.code == 1 && c.out.contains("this process, rank 0 (chief:0") && c.out.contains("was not running"), qPrintable(c.out));
}

// Ctrl-C on the chief of a TF_CONFIG cluster: the chief records the run as cancelled and exits
// 130; the worker ends too, saying the run was stopped on the chief (not "restart the failed task").
void TestMultiWorker::interruptedChiefStopsTheCluster()
{
    QTemporaryDir dir;
    const QString db = dir.filePath("runs.db");
    const QString cluster = clusterJson({freePort(), freePort()});
    QStringList args = trainArgs(1000000);
    args << "--strategy" << "multi-worker-mirrored" << "--epochs" << "100000";
    auto chief = startCli(args + QStringList{"--task", "chief:0", "--db", db}, cluster);
    auto worker = startCli(args + QStringList{"--task", "worker:0", "--no-record"}, cluster);
    QTest::qWait(3000);
    QCOMPARE(chief->state(), QProcess::Running);
    ::kill(static_cast<pid_t>(chief->processId()), SIGINT);
    const Finished c = finish(*chief, 30000);
    const Finished w = finish(*worker, 30000);
    QVERIFY2(c.code == 130, qPrintable(c.out));
    QVERIFY2(w.code == 1 && w.out.contains("chief:0") && w.out.contains("the run was cancelled") &&
                 w.out.contains("stopped on that task"),
             qPrintable(w.out));
    const QJsonArray runs = tstest::recordedRuns(db);
    QCOMPARE(runs.size(), 1);
    QCOMPARE(runs[0].toObject().value("status").toString(), QStringLiteral("cancelled"));
}

// With --restarts, a task stopped on purpose (SIGTERM, Ctrl-C) is not a crash: the chief does not
// restart and wait for it (it did, then failed with "did not join"), and records the run as
// cancelled.
void TestMultiWorker::interruptedWorkerIsNotRestarted()
{
    QTemporaryDir dir;
    const QString db = dir.filePath("runs.db");
    const QString cluster = clusterJson({freePort(), freePort()});
    QStringList args = trainArgs(1000000);
    args << "--strategy" << "multi-worker-mirrored" << "--epochs" << "100000" << "--restarts" << "2" << "--collective-timeout" << "8";
    auto chief = startCli(args + QStringList{"--task", "chief:0", "--db", db, "--backup-dir", dir.filePath("chief-backup")}, cluster);
    auto worker = startCli(args + QStringList{"--task", "worker:0", "--no-record", "--backup-dir", dir.filePath("worker-backup")}, cluster);
    QTest::qWait(3000);
    QCOMPARE(worker->state(), QProcess::Running);
    QElapsedTimer timer;
    timer.start();
    ::kill(static_cast<pid_t>(worker->processId()), SIGTERM);
    const Finished w = finish(*worker, 30000);
    const Finished c = finish(*chief, 30000);
    QVERIFY2(w.code == 130, qPrintable(w.out));
    QVERIFY2(c.code == 1 && c.out.contains("stopped on that task") && !c.out.contains("restarting"), qPrintable(c.out));
    QVERIFY2(timer.elapsed() < 8000, "the chief waited for the stopped task to come back");
    const QJsonArray runs = tstest::recordedRuns(db);
    QCOMPARE(runs.size(), 1);
    QCOMPARE(runs[0].toObject().value("status").toString(), QStringLiteral("cancelled"));
}

// A bad CSV line in the worker's file shard, met mid-epoch: the worker fails as a local run
// would, and the chief learns the cause's kind with its reason (the group's abort key), so with
// --restarts neither starts again nor waits for a task that is not coming back.
void TestMultiWorker::dataErrorOnWorkerIsNotRestarted()
{
    const QDir dir(m_dir.path());
    writeFile(dir.filePath("good.csv"), csvRows(0, 100));
    QList<QByteArray> lines = csvRows(100, 100).split('\n');
    lines[51].replace(",", ",oops");  // row 150 (the header is line 0): its features are not numbers
    writeFile(dir.filePath("bad.csv"), lines.join('\n'));
    const QString config = writePipelineRun(dir, "bad_run.json", {dir.filePath("good.csv"), dir.filePath("bad.csv")}, "file");
    const QString cluster = clusterJson({freePort(), freePort()});
    const QStringList common = {"train", "--config", config, "--threads", "1", "--strategy", "multi-worker-mirrored", "--no-record",
                                "--restarts", "2", "--collective-timeout", "20"};
    QElapsedTimer timer;
    timer.start();
    auto chief = startCli(common + QStringList{"--task", "chief:0", "--backup-dir", dir.filePath("bad-chief")}, cluster);
    auto worker = startCli(common + QStringList{"--task", "worker:0", "--backup-dir", dir.filePath("bad-worker")}, cluster);
    const Finished w = finish(*worker, 30000), c = finish(*chief, 30000);
    QVERIFY2(w.code == 1 && w.out.contains("bad.csv' line") && w.out.contains("is not a number") && !w.out.contains("restarting"), qPrintable(w.out));
    QVERIFY2(c.code == 1 && c.out.contains("worker:0") && c.out.contains("is not a number") && !c.out.contains("restarting"), qPrintable(c.out));
    QVERIFY2(timer.elapsed() < 15000, "the chief waited for the failed task to come back");
    // A file of the worker's shard missing: refused after the cluster formed (each task opens its
    // own files), and the chief says why instead of, three seconds later, that the worker
    // stopped responding.
    const QString missing = writePipelineRun(dir, "missing_run.json", {dir.filePath("good.csv"), dir.filePath("no_such.csv")}, "file");
    const QString cluster2 = clusterJson({freePort(), freePort()});
    const QStringList refused = {"train", "--config", missing, "--threads", "1", "--strategy", "multi-worker-mirrored", "--no-record"};
    auto chief2 = startCli(refused + QStringList{"--task", "chief:0"}, cluster2);
    auto worker2 = startCli(refused + QStringList{"--task", "worker:0"}, cluster2);
    const Finished w2 = finish(*worker2, 30000), c2 = finish(*chief2, 30000);
    QVERIFY2(w2.code == 2 && w2.out.contains("no_such.csv' does not exist"), qPrintable(w2.out));
    // 2 while the chief still prepares (as a refusal), 1 if its first step already began.
    QVERIFY2((c2.code == 2 || c2.code == 1) && c2.out.contains("rank 1 (worker:0") && c2.out.contains("no_such.csv' does not exist") &&
                 !c2.out.contains("stopped responding"),
             qPrintable(c2.out));
}

namespace {
// Claims rank 1 (worker:0) of the group "train" at the rendezvous on `port` for five beats, then
// goes quiet: a task that died while the cluster formed. Empty once the claim was taken.
QString fakeLostWorker(int port)
{
    auto c = remote::RendezvousClient::connect("127.0.0.1:" + std::to_string(port), kToken.toStdString());
    if (!c.ok()) return QString::fromStdString(c.error().toString());
    QElapsedTimer t;
    t.start();
    int beats = 0;
    while (beats < 5 && t.elapsed() < 30000) {
        auto b = (*c)->heartbeat("train", 1, 2, std::chrono::seconds(3), "fake-worker", std::chrono::milliseconds(500));
        if (b.ok() && b->heldBy.empty()) ++beats;
        QTest::qWait(200);
    }
    return beats == 5 ? QString() : QString("the chief's rendezvous did not take the fake's claim");
}
} // namespace

// A task that claimed its rank and then died before the mesh connected (faked here: it beats for
// worker:0 at the chief's rendezvous for a second, then goes quiet) is named by the chief within
// seconds, where Gloo alone waited out its connect timeout; with --restarts the chief forms the
// cluster again, and the task's replacement joins and trains.
void TestMultiWorker::lostWhileFormingIsFormedAgain()
{
    QTemporaryDir dir;
    const std::vector<int> ports = {freePort(), freePort()};
    const QString cluster = clusterJson(ports);
    QStringList args = trainArgs();
    args << "--strategy" << "multi-worker-mirrored" << "--no-record" << "--collective-timeout" << "60";
    const QString named = QString("rank 1 (worker:0 at 127.0.0.1:%1) stopped responding while the cluster formed").arg(ports[1]);
    for (const bool restarts : {false, true}) {
        QStringList backup;
        if (restarts) backup << "--restarts" << "1";
        QElapsedTimer timer;
        timer.start();
        auto chief = startCli(args + backup + (restarts ? QStringList{"--backup-dir", dir.filePath("chief")} : QStringList{}) +
                                  QStringList{"--task", "chief:0"},
                              cluster);
        const QString fake = fakeLostWorker(ports[0]);
        QVERIFY2(fake.isEmpty(), qPrintable(fake));
        if (!restarts) {
            const Finished c = finish(*chief, 60000);
            QVERIFY2(c.code == 2 && c.out.contains(named), qPrintable(c.out));
            QVERIFY2(timer.elapsed() < 20000, qPrintable(QString("took %1 ms").arg(timer.elapsed())));
            continue;
        }
        QString err;
        while (!err.contains("forming it again") && timer.elapsed() < 60000 && chief->state() == QProcess::Running) {
            chief->waitForReadyRead(100);
            err += QString::fromUtf8(chief->readAllStandardError());
        }
        QVERIFY2(err.contains(named) && err.contains("forming it again (restart 1 of 1)"), qPrintable(err));
        auto worker = startCli(args + backup + QStringList{"--backup-dir", dir.filePath("worker"), "--task", "worker:0"}, cluster);
        const Finished c = finish(*chief);
        const Finished w = finish(*worker);
        QVERIFY2(c.code == 0 && w.code == 0, qPrintable(c.out + "\n---\n" + w.out));
    }
}

// Fit restarts and re-forming share --restarts: the worker is killed mid-run (restart 1 of 2),
// and while the chief re-joins a task claims the rank and dies (the fake): the chief forms the
// cluster again as restart 2 of 2, the worker is started again, and the run completes.
void TestMultiWorker::reformAtRejoinSharesTheBudget()
{
    QTemporaryDir dir;
    const std::vector<int> ports = {freePort(), freePort()};
    const QString cluster = clusterJson(ports);
    QStringList args = trainArgs(300);  // 15 epochs of 20 steps
    args.removeAll("--quiet");
    args << "--strategy" << "multi-worker-mirrored" << "--no-record" << "--json" << "--collective-timeout" << "60" << "--restarts" << "2";
    auto chief = startCli(args + QStringList{"--backup-dir", dir.filePath("chief"), "--task", "chief:0"}, cluster);
    const QStringList workerArgs = args + QStringList{"--backup-dir", dir.filePath("worker"), "--task", "worker:0"};
    auto worker = startCli(workerArgs, cluster);
    QString seen;
    QVERIFY2(tstest::readUntil(*chief, seen, "\"epoch\":3"), qPrintable(seen));
    ::kill(static_cast<pid_t>(worker->processId()), SIGKILL);
    finish(*worker);
    QString err;
    auto chiefSays = [&](const QString& needle) {
        QElapsedTimer wait;
        wait.start();
        while (!err.contains(needle) && wait.elapsed() < 60000 && chief->state() == QProcess::Running) {
            chief->waitForReadyRead(100);
            err += QString::fromUtf8(chief->readAllStandardError());
            seen += QString::fromUtf8(chief->readAllStandardOutput());
        }
        return err.contains(needle);
    };
    QVERIFY2(chiefSays("restarting it from its backup (restart 1 of 2)"), qPrintable(err));
    const QString fake = fakeLostWorker(ports[0]);
    QVERIFY2(fake.isEmpty(), qPrintable(fake));
    QVERIFY2(chiefSays("stopped responding while the cluster formed"), qPrintable(err));
    QVERIFY2(chiefSays("forming it again (restart 2 of 2)"), qPrintable(err));
    worker = startCli(workerArgs, cluster);
    const Finished c = finish(*chief);
    const Finished w = finish(*worker);
    QVERIFY2(c.code == 0 && w.code == 0, qPrintable(err + c.out + "\n---\n" + w.out));
    QVERIFY2((seen + c.out).contains("\"resumed\":true"), qPrintable(seen + c.out));
}

// A chief and worker:0 training with `args` (plus each one's extra flags); with `killWorker` the
// worker is SIGKILLed once the chief has finished epoch 3 and started again (`atOnce`: right
// away, as a supervisor would, before the chief has noticed: it must wait for the chief's next
// group, not join the one the chief still runs). Empty when both finish, resumed if killed;
// else what went wrong. Weights go to m_dir/<tag>-chief.safetensors and <tag>-worker.safetensors.
QString TestMultiWorker::runWithRestart(const QString& tag, const QStringList& args, const QStringList& chiefExtra,
                                        const QStringList& workerExtra, bool killWorker, bool atOnce)
{
    const std::vector<int> ports = {freePort(), freePort()};
    const QString cluster = clusterJson(ports);
    const QString chiefWeights = m_dir.filePath(tag + "-chief.safetensors");
    const QString workerWeights = m_dir.filePath(tag + "-worker.safetensors");
    auto chief = startCli(args + chiefExtra + QStringList{"--task", "chief:0", "--save-weights", chiefWeights}, cluster);
    const QStringList workerArgs = args + workerExtra + QStringList{"--task", "worker:0", "--save-weights", workerWeights};
    auto worker = startCli(workerArgs, cluster);
    QString seen;
    if (killWorker) {
        if (!tstest::readUntil(*chief, seen, "\"epoch\":3")) return QString("no epoch 3 before the kill: " + seen);
        ::kill(static_cast<pid_t>(worker->processId()), SIGKILL);
        finish(*worker);
        if (atOnce) worker = startCli(workerArgs, cluster);
        // The chief notices, says it restarts, and waits in the rendezvous for the worker.
        QString err;
        QElapsedTimer wait;
        wait.start();
        while (!err.contains("restarting it from its backup") && wait.elapsed() < 30000 && chief->state() == QProcess::Running) {
            chief->waitForReadyRead(100);
            err += QString::fromUtf8(chief->readAllStandardError());
            seen += QString::fromUtf8(chief->readAllStandardOutput());
        }
        seen += err;
        if (!err.contains("restarting it from its backup")) return QString("the chief did not restart: " + seen);
        if (!atOnce) worker = startCli(workerArgs, cluster);
    }
    const Finished c = finish(*chief);
    const Finished w = finish(*worker);
    seen += c.out;
    if (c.code != 0 || w.code != 0)  // the ends of the outputs: where the error is
        return QString("chief: %1 ...%2\nworker: %3 ...%4").arg(c.code).arg(seen.right(700)).arg(w.code).arg(w.out.right(700));
    if (killWorker && (!seen.contains("\"resumed\":true") || !w.out.contains("\"resumed\":true")))
        return QString("no resume reported\nchief: " + seen + "\nworker: " + w.out);
    // The chief resumed from its own file; the worker from the chief's state (no file of its own).
    if (killWorker && (!seen.contains("\"from\":\"the backup " + chiefExtra.last()) ||
                       !w.out.contains("\"backup\":null") || !w.out.contains("\"from\":\"the chief's backup\"")))
        return QString("resume sources not named\nchief: " + seen + "\nworker: " + w.out);
    for (const QString& line : (seen + w.out).split('\n'))
        if (line.contains("\"resumed\"") || line.contains("restart")) qInfo("%s: %s", qPrintable(tag), qPrintable(line.trimmed()));
    return QString();
}

void TestMultiWorker::restartFromBackupEqualsContinuous()
{
    const int steps = 300;  // 20 steps per epoch: 15 epochs
    QStringList args = trainArgs(steps);
    args.removeAll("--quiet");
    args << "--strategy" << "multi-worker-mirrored" << "--no-record" << "--json" << "--collective-timeout" << "20";
    auto run = [&](const QString& tag, const QStringList& chiefExtra, const QStringList& workerExtra, bool killWorker, bool atOnce = false) {
        return runWithRestart(tag, args, chiefExtra, workerExtra, killWorker, atOnce);
    };
    const QString continuous = run("continuous", {}, {}, false);
    QVERIFY2(continuous.isEmpty(), qPrintable(continuous));
    const QString chiefBackup = m_dir.filePath("backup-chief"), workerBackup = m_dir.filePath("backup-worker");
    const QStringList backup = {"--backup-every-steps", "5", "--restarts", "1"};
    const QString restarted = run("restarted", backup + QStringList{"--backup-dir", chiefBackup},
                                  backup + QStringList{"--backup-dir", workerBackup}, true);
    QVERIFY2(restarted.isEmpty(), qPrintable(restarted));
    QCOMPARE(maxDiff(m_dir.filePath("restarted-chief.safetensors"), m_dir.filePath("continuous-chief.safetensors")), 0.0);
    QCOMPARE(maxDiff(m_dir.filePath("restarted-worker.safetensors"), m_dir.filePath("continuous-chief.safetensors")), 0.0);
    const QString atOnce = run("at-once", backup + QStringList{"--backup-dir", chiefBackup + "-2"},
                               backup + QStringList{"--backup-dir", workerBackup + "-2"}, true, true);
    QVERIFY2(atOnce.isEmpty(), qPrintable(atOnce));
    QCOMPARE(maxDiff(m_dir.filePath("at-once-worker.safetensors"), m_dir.filePath("continuous-chief.safetensors")), 0.0);
    // Only the chief wrote a backup; the completed run deleted it.
    QVERIFY(!QFile::exists(chiefBackup + "/backup.safetensors"));
    QVERIFY(QDir(workerBackup).isEmpty());
}

void TestMultiWorker::separateNetworkNamespaces_data()
{
    QTest::addColumn<QString>("mode");
    QTest::newRow("train over a veth link") << "train";
    QTest::newRow("link cut mid-run") << "cut";
}

// The two tasks in their own network namespaces, joined by a veth pair (netns_pair.sh), so the
// traffic crosses a link with its own addresses. "train": the same weights as one process.
// "cut": the link goes down mid-run (packets vanish, nobody sends a reset); the chief must name
// the worker within 10 s. Skipped where unprivileged user namespaces are not allowed.
void TestMultiWorker::separateNetworkNamespaces()
{
    QFETCH(QString, mode);
    QProcess probe;
    probe.start("unshare", {"-rn", "sh", "-c", "ip link add ts-probe type veth peer name ts-probe-peer && nsenter --help >/dev/null"});
    if (!probe.waitForFinished(10000) || probe.exitStatus() != QProcess::NormalExit || probe.exitCode() != 0)
        QSKIP("no unprivileged user and network namespaces with veth links here (unshare -rn, iproute2)");
    QTemporaryDir out;
    QStringList args = {"-rn", "bash", QStringLiteral(TS_FIXTURES_DIR "/../distributed/netns_pair.sh"), mode,
                        QStringLiteral(TS_CLI_PATH), out.path()};
    args << trainArgs(mode == "cut" ? 100000 : 20);
    args.removeAll("--quiet");
    args << "--strategy" << "multi-worker-mirrored" << "--no-record" << "--json";
    if (mode == "cut") args << "--epochs" << "1000";
    QProcess p;
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    env.insert("TRAINSTUDIO_TOKEN", kToken);
    env.insert("OMP_NUM_THREADS", "1");
    p.setProcessEnvironment(env);
    p.setProcessChannelMode(QProcess::MergedChannels);
    p.start("unshare", args);
    QVERIFY(p.waitForFinished(180000));
    auto read = [&](const QString& name) {
        QFile f(out.filePath(name));
        return f.open(QIODevice::ReadOnly) ? QString::fromUtf8(f.readAll()).trimmed() : QString();
    };
    const QString logs = "script: " + QString::fromUtf8(p.readAll()) + "\nchief: " + read("chief.log") + "\nworker: " + read("worker.log");
    QVERIFY2(p.exitCode() == 0, qPrintable(logs));
    if (mode == "train") {
        QVERIFY2(read("chief.rc") == "0" && read("worker.rc") == "0", qPrintable(logs));
        for (const char* task : {"chief", "worker"}) {
            const double d = maxDiff(out.filePath(QString(task) + ".safetensors"), m_reference);
            qInfo("%s over the veth link: max |w - w(one process)| = %g", task, d);
            QVERIFY2(d <= 1e-5, qPrintable(logs));
        }
    } else {
        QVERIFY2(read("chief.rc") == "1", qPrintable(logs));
        const double secs = read("chief_end").toDouble() - read("cut_at").toDouble();
        QString error;
        for (const QString& line : read("chief.log").split('\n'))
            if (line.startsWith("error:")) error = line;
        qInfo("%s (%.1f s after the cut)", qPrintable(error), secs);
        QVERIFY2(error.contains("worker:0 at 10.77.0.2:23457"), qPrintable(logs));
        QVERIFY2(secs < 10.0, qPrintable(QString("detected %1 s after the cut").arg(secs)));
    }
}

void TestMultiWorker::refusedSetups()
{
    QStringList args = trainArgs();
    args << "--strategy" << "multi-worker-mirrored" << "--no-record";
    // No TF_CONFIG at all.
    Finished f = finish(*startCli(args, {}));
    QCOMPARE(f.code, 2);
    QVERIFY2(f.out.contains("TF_CONFIG is not set"), qPrintable(f.out));
    // Malformed TF_CONFIG: the message names the entry.
    f = finish(*startCli(args, R"({"cluster": {"worker": ["127.0.0.1:70000"]}, "task": {"type": "worker", "index": 0}})"));
    QCOMPARE(f.code, 2);
    QVERIFY2(f.out.contains("TF_CONFIG: cluster.worker[0]: bad address"), qPrintable(f.out));
    // ps tasks are not for this strategy.
    f = finish(*startCli(args, R"({"cluster": {"worker": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"]}, "task": {"type": "worker", "index": 0}})"));
    QCOMPARE(f.code, 2);
    QVERIFY2(f.out.contains("does not use ps tasks"), qPrintable(f.out));
    // No task.
    f = finish(*startCli(args, R"({"cluster": {"worker": ["127.0.0.1:1"]}})"));
    QCOMPARE(f.code, 2);
    QVERIFY2(f.out.contains("has no \"task\""), qPrintable(f.out));
    // No token.
    const QString one = QString(R"({"cluster": {"chief": ["127.0.0.1:%1"], "worker": ["127.0.0.1:%2"]}})").arg(freePort()).arg(freePort());
    f = finish(*startCli(args + QStringList{"--task", "worker:0"}, one, false));
    QCOMPARE(f.code, 2);
    QVERIFY2(f.out.contains("no shared token"), qPrintable(f.out));
    // A chief that never comes: the worker gives up after the timeout, naming where it looked.
    QElapsedTimer timer;
    timer.start();
    f = finish(*startCli(args + QStringList{"--task", "worker:0", "--collective-timeout", "2"}, one));
    QCOMPARE(f.code, 2);
    QVERIFY2(f.out.contains("rendezvous at 127.0.0.1:"), qPrintable(f.out));
    QVERIFY2(timer.elapsed() < 20000, "gave up after the timeout");
    // A local mistake fails at once, before waiting for the peers (nobody else is started here).
    timer.restart();
    QStringList badModel = args;
    badModel[badModel.indexOf("--model") + 1] = "no_such_model.json";
    f = finish(*startCli(badModel + QStringList{"--task", "worker:0"}, one));
    QVERIFY2(f.code == 2, qPrintable(f.out));
    QVERIFY2(f.out.contains("no_such_model.json"), qPrintable(f.out));
    QVERIFY2(timer.elapsed() < 10000, "waited for the peers before reading its own model");
    // The chief records a run whose worker never came, naming the worker.
    {
        QTemporaryDir dir;
        const QString db = dir.filePath("runs.db");
        QStringList chiefArgs = trainArgs();
        chiefArgs << "--strategy" << "multi-worker-mirrored" << "--db" << db << "--task" << "chief:0" << "--collective-timeout" << "2";
        f = finish(*startCli(chiefArgs, one));
        QVERIFY2(f.code == 2, qPrintable(f.out));
        const QJsonArray runs = tstest::recordedRuns(db);
        QCOMPARE(runs.size(), 1);
        QCOMPARE(runs[0].toObject().value("status").toString(), QStringLiteral("failed"));
        QVERIFY2(runs[0].toObject().value("error").toString().contains("worker:0"), qPrintable(runs[0].toObject().value("error").toString()));
    }
    // Ctrl-C while waiting for the peers: stops at once, nothing recorded.
    {
        auto waiting = startCli(args + QStringList{"--task", "worker:0", "--collective-timeout", "60"}, one);
        QVERIFY(waiting->waitForStarted());
        QTest::qWait(1000);
        timer.restart();
        ::kill(static_cast<pid_t>(waiting->processId()), SIGINT);
        f = finish(*waiting, 20000);
        QCOMPARE(f.code, 130);
        QVERIFY2(timer.elapsed() < 5000, "kept waiting for the peers after Ctrl-C");
    }
    // A chief and a worker started with `chiefExtra`/`workerExtra` (and their own TF_CONFIG
    // clusters): both must fail, saying every one of `needles`.
    auto bothRefuse = [&](const QStringList& chiefExtra, const QString& chiefCluster, const QStringList& workerExtra,
                          const QString& workerCluster, const QStringList& needles) {
        auto chief = startCli(args + QStringList{"--task", "chief:0"} + chiefExtra, chiefCluster);
        auto worker = startCli(args + QStringList{"--task", "worker:0"} + workerExtra, workerCluster);
        for (auto* p : {chief.get(), worker.get()}) {
            f = finish(*p);
            QVERIFY2(f.code != 0, qPrintable(f.out));
            for (const QString& needle : needles) QVERIFY2(f.out.contains(needle), qPrintable(f.out));
        }
    };
    // Tasks with different numbers of local replicas: both refuse, before any training step.
    {
        const QString cluster = clusterJson({freePort(), freePort()});
        bothRefuse({"--devices", "cpu:0,cpu:1"}, cluster, {"--devices", "cpu:0"}, cluster, {"different numbers of local replicas"});
        if (QTest::currentTestFailed()) return;
    }
    // --backup-dir on the chief only: both refuse at once, naming the setting (they waited in
    // the first backup's collective until the timeout and blamed a slow peer).
    {
        QTemporaryDir dir;
        const QString cluster = clusterJson({freePort(), freePort()});
        timer.restart();
        bothRefuse({"--backup-dir", dir.filePath("bk")}, cluster, {}, cluster, {"backup.enabled"});
        if (QTest::currentTestFailed()) return;
        QVERIFY2(timer.elapsed() < 20000, "the tasks only stopped at the collective timeout");
    }
    // Tasks given different clusters (the chief lists a second worker): both stop at once naming
    // both lists (Gloo failed inside its address exchange: "enforce fail ... 136 vs 68").
    {
        const int p0 = freePort(), p1 = freePort(), p2 = freePort();
        timer.restart();
        bothRefuse({}, clusterJson({p0, p1, p2}), {}, clusterJson({p0, p1}),
                   {"were given different clusters", QString("worker:1 at 127.0.0.1:%1").arg(p2)});
        if (QTest::currentTestFailed()) return;
        QVERIFY2(timer.elapsed() < 20000, "the tasks only stopped at the collective timeout");
    }
    // A task started twice: the run goes on with one copy; the other stops within seconds naming
    // the task (it hung in Gloo's connect for minutes, deaf to SIGTERM). Both copies before the
    // chief, so neither finds the rendezvous up at first.
    {
        // A run long enough (300 steps) that the extra copy sees the rendezvous before it ends:
        // with 20, the run sometimes finished between two of the copy's polls, and the copy then
        // found nothing listening.
        QStringList longer = trainArgs(300);
        longer << "--epochs" << "100" << "--strategy" << "multi-worker-mirrored" << "--no-record";
        const QString cluster = clusterJson({freePort(), freePort()});
        timer.restart();
        auto copyA = startCli(longer + QStringList{"--task", "worker:0"}, cluster);
        auto copyB = startCli(longer + QStringList{"--task", "worker:0"}, cluster);
        QTest::qWait(500);
        auto chief = startCli(longer + QStringList{"--task", "chief:0"}, cluster);
        f = finish(*chief);
        QVERIFY2(f.code == 0, qPrintable(f.out));
        const Finished a = finish(*copyA), b = finish(*copyB);
        QVERIFY2((a.code == 0) != (b.code == 0), qPrintable(a.out + "\n" + b.out));
        const Finished& extra = a.code == 0 ? b : a;
        QVERIFY2(extra.out.contains("rank 1 (worker:0 at 127.0.0.1:") && extra.out.contains("is already taken") &&
                     extra.out.contains("started twice"),
                 qPrintable(extra.out));
        QVERIFY2(timer.elapsed() < 25000, "the extra copy took too long to stop");
    }
    // --task without the strategy.
    f = finish(*startCli(trainArgs() + QStringList{"--task", "worker:0", "--no-record"}, {}));
    QCOMPARE(f.code, 2);
    QVERIFY2(f.out.contains("--tf-config and --task are for --strategy multi-worker-mirrored"), qPrintable(f.out));
}

// A "pipeline" section sharded by element: each process reads, maps and batches only its share
// of every global batch, and the run still equals one process with the same global batch of 10
// (SGD with momentum: a step that should apply nothing would show), also in the epoch's last,
// partial batch: 203 rows leave 3, all in worker 0's share, so the others join that step with
// empty batches and the gradient is rescaled to the mean of 3; 207 leave 7, spread over several
// workers; with drop_remainder the short batch is dropped by all, as one process drops it. The
// validation pipeline (23 rows, dealt element by element) is sharded too, and its loss is the
// one process's.
void TestMultiWorker::autoShardedPipelineEqualsOneProcess_data()
{
    QTest::addColumn<int>("workers");
    QTest::addColumn<QString>("devices");
    QTest::addColumn<int>("rows");
    QTest::addColumn<bool>("dropRemainder");
    QTest::newRow("2 processes, 203 rows") << 2 << "cpu:0" << 203 << false;
    QTest::newRow("3 processes, 207 rows") << 3 << "cpu:0" << 207 << false;
    QTest::newRow("2 processes x 2 local replicas, 207 rows") << 2 << "cpu:0,cpu:1" << 207 << false;
    QTest::newRow("2 processes, 207 rows, drop_remainder") << 2 << "cpu:0" << 207 << true;
}

void TestMultiWorker::autoShardedPipelineEqualsOneProcess()
{
    QFETCH(int, workers);
    QFETCH(QString, devices);
    QFETCH(int, rows);
    QFETCH(bool, dropRemainder);
    const QDir dir(m_dir.path());
    writeFile(dir.filePath("rows.csv"), csvRows(0, rows));
    writeFile(dir.filePath("val.csv"), csvRows(1000, 23));
    const QString config =
        writePipelineRun(dir, "sharded_run.json", {dir.filePath("rows.csv")}, "auto", dir.filePath("val.csv"), dropRemainder);
    const QString reference = dir.filePath(QString("pipeline-one-%1.safetensors").arg(QTest::currentDataTag()).replace(' ', '_'));
    const QStringList common = {"train", "--config", config, "--threads", "1", "--no-record"};
    const Finished one = finish(*startCli(common + QStringList{"--strategy", "one-device", "--json", "--save-weights", reference}, {}));
    QVERIFY2(one.code == 0, qPrintable(one.out));
    auto finalLine = [](const QString& out) { return nlohmann::json::parse(out.trimmed().split('\n').last().toStdString(), nullptr, false); };
    const auto oneFinal = finalLine(one.out);
    QVERIFY2(oneFinal.is_object() && oneFinal.contains("val_loss"), qPrintable(one.out));
    std::vector<int> ports;
    for (int i = 0; i < workers; ++i) ports.push_back(freePort());
    const QString cluster = clusterJson(ports);
    std::vector<std::unique_ptr<QProcess>> procs;
    std::vector<QString> weights;
    for (int t = 0; t < workers; ++t) {
        const QString task = t == 0 ? "chief:0" : QString("worker:%1").arg(t - 1);
        weights.push_back(dir.filePath(QString("pipeline-w%1-%2.safetensors").arg(t).arg(QTest::currentDataTag()).replace(' ', '_')));
        procs.push_back(startCli(common + QStringList{"--strategy", "multi-worker-mirrored", "--task", task, "--devices", devices,
                                                      "--save-weights", weights.back()} +
                                     (t == 0 ? QStringList{"--json"} : QStringList{}),
                                 cluster));
    }
    for (int t = 0; t < workers; ++t) {
        const Finished f = finish(*procs[static_cast<std::size_t>(t)]);
        QVERIFY2(f.code == 0, qPrintable(f.out));
        if (t == 0) {
            const auto chiefFinal = finalLine(f.out);
            QVERIFY2(chiefFinal.is_object() && chiefFinal.contains("val_loss"), qPrintable(f.out));
            const double a = chiefFinal["val_loss"].get<double>(), b = oneFinal["val_loss"].get<double>();
            qInfo("validation loss %.9g, one process %.9g", a, b);
            QVERIFY(std::fabs(a - b) <= 1e-5 * std::max(1.0, std::fabs(b)));
            QCOMPARE(chiefFinal["val_accuracy"].get<double>(), oneFinal["val_accuracy"].get<double>());
            QCOMPARE(chiefFinal["steps"].get<int>(), oneFinal["steps"].get<int>());
            continue;
        }
        // Each task says which elements it reads: its share of every block of 10.
        const int lo = 10 * t / workers, hi = 10 * (t + 1) / workers;
        QVERIFY2(f.out.contains(QString("takes elements [%1, %2) of every 10").arg(lo).arg(hi)), qPrintable(f.out));
        QVERIFY2(f.out.contains(QString("batch %1 of the global 10").arg(hi - lo)), qPrintable(f.out));
        QVERIFY2(f.out.contains(QString("validation pipeline: input auto-sharded by element: worker %1 of %2 takes element %1 of every %2")
                                    .arg(t)
                                    .arg(workers)),
                 qPrintable(f.out));
    }
    for (int t = 0; t < workers; ++t) {
        const double d = maxDiff(weights[static_cast<std::size_t>(t)], reference);
        qInfo("task %d: max |w - w(one process)| = %g", t, d);
        QVERIFY2(d <= 1e-5, qPrintable(QString("task %1 differs from one process by %2").arg(t).arg(d)));
    }
    for (int t = 1; t < workers; ++t) QCOMPARE(maxDiff(weights[0], weights[static_cast<std::size_t>(t)]), 0.0);
}

// Sharded by file, with files of different sizes: the smaller file's 50 rows last 10 local
// batches of 5, the larger's 150 rows 30, so its task joins 20 steps an epoch with empty batches;
// both end each epoch together after 30 steps, with the same weights, and the idle task says why:
// in the run's log when it is the chief, on its stderr when it is a worker (it records nothing).
void TestMultiWorker::unevenFileShardsJoin()
{
    const QDir dir(m_dir.path());
    writeFile(dir.filePath("small.csv"), csvRows(0, 50));
    writeFile(dir.filePath("large.csv"), csvRows(50, 150));
    for (const bool chiefIdles : {true, false}) {
        const QStringList files = chiefIdles ? QStringList{dir.filePath("small.csv"), dir.filePath("large.csv")}
                                             : QStringList{dir.filePath("large.csv"), dir.filePath("small.csv")};
        const QString config = writePipelineRun(dir, "file_run.json", files, "file");
        const QString cluster = clusterJson({freePort(), freePort()});
        const QString db = m_dir.filePath(chiefIdles ? "uneven-chief.db" : "uneven-worker.db");
        const QStringList common = {"train", "--config", config, "--threads", "1", "--strategy", "multi-worker-mirrored", "--db", db};
        const QString w0 = dir.filePath("uneven-chief.safetensors"), w1 = dir.filePath("uneven-worker.safetensors");
        auto chief = startCli(common + QStringList{"--task", "chief:0", "--save-weights", w0, "--json"}, cluster);
        auto worker = startCli(common + QStringList{"--task", "worker:0", "--save-weights", w1}, cluster);
        const Finished c = finish(*chief), w = finish(*worker);
        QVERIFY2(c.code == 0, qPrintable(c.out));
        QVERIFY2(w.code == 0, qPrintable(w.out));
        QVERIFY2(w.out.contains(chiefIdles ? "reads 1 of the 2 files (large.csv)" : "reads 1 of the 2 files (small.csv)"), qPrintable(w.out));
        QCOMPARE(maxDiff(w0, w1), 0.0);
        const auto last = nlohmann::json::parse(c.out.trimmed().split('\n').last().toStdString(), nullptr, false);
        QVERIFY2(!last.is_discarded() && last.value("final", false), qPrintable(c.out));
        QCOMPARE(last["steps"].get<int>(), 60);  // 2 epochs of the larger shard's 30 batches
        const char* idled = "ran out 20 of 30 steps before the end";
        if (!chiefIdles) {
            QVERIFY2(w.out.contains(QString("warning: epoch 1: this task's share of the input ") + idled), qPrintable(w.out));
            continue;
        }
        QVERIFY2(!w.out.contains("warning:"), qPrintable(w.out));
        auto store = ts::store::RunStore::open(db.toStdString());
        QVERIFY(store.ok());
        auto logs = store->logs(last["run_id"].get<std::string>());
        QVERIFY(logs.ok());
        std::string all;
        for (const auto& e : *logs) all += e.message + "\n";
        QVERIFY2(all.find("reads 1 of the 2 files (small.csv)") != std::string::npos, all.c_str());
        QVERIFY2(all.find(idled) != std::string::npos, all.c_str());
    }
}

// Three rows for two workers in batches of 10: worker 0 takes elements [0, 5) of every 10, so
// worker 1's part is empty. It says so and joins every step without data; the run equals one
// process on the three rows.
void TestMultiWorker::emptyShardJoins()
{
    const QDir dir(m_dir.path());
    writeFile(dir.filePath("three.csv"), csvRows(0, 3));
    const QString config = writePipelineRun(dir, "empty_run.json", {dir.filePath("three.csv")}, "auto");
    const QStringList common = {"train", "--config", config, "--threads", "1", "--no-record"};
    const QString reference = dir.filePath("three-one.safetensors"), w0 = dir.filePath("three-w0.safetensors"),
                  w1 = dir.filePath("three-w1.safetensors");
    const Finished one = finish(*startCli(common + QStringList{"--strategy", "one-device", "--quiet", "--save-weights", reference}, {}));
    QVERIFY2(one.code == 0, qPrintable(one.out));
    const QString cluster = clusterJson({freePort(), freePort()});
    auto chief = startCli(common + QStringList{"--strategy", "multi-worker-mirrored", "--task", "chief:0", "--save-weights", w0}, cluster);
    auto worker = startCli(common + QStringList{"--strategy", "multi-worker-mirrored", "--task", "worker:0", "--save-weights", w1}, cluster);
    const Finished w = finish(*worker), c = finish(*chief);
    QVERIFY2(c.code == 0, qPrintable(c.out));
    QVERIFY2(w.code == 0, qPrintable(w.out));
    QVERIFY2(w.out.contains("takes elements [5, 10) of every 10 from the source; batch 5 of the global 10; this task's part is empty, "
                            "so it joins the others' steps without data"),
             qPrintable(w.out));
    QVERIFY2(maxDiff(w0, reference) <= 1e-6, qPrintable(QString::number(maxDiff(w0, reference))));
    QCOMPARE(maxDiff(w0, w1), 0.0);
}

// Backup and restore with an auto-sharded pipeline whose shards differ (files of 150 and 50
// rows, 30 steps an epoch, the worker's file runs out after 10). The worker is killed after
// epoch 3; the chief stops at step 91, waiting for it, so the run resumes from the backup at step
// 78 (epoch 3, step 18), past the worker's 10 batches: the restarted worker runs out while
// skipping to it and joins at once. The run ends with the weights of an uninterrupted one.
void TestMultiWorker::restartWithUnevenShardsEqualsContinuous()
{
    const QDir dir(m_dir.path());
    writeFile(dir.filePath("restart-large.csv"), csvRows(0, 150));
    writeFile(dir.filePath("restart-small.csv"), csvRows(150, 50));
    const QString config =
        writePipelineRun(dir, "restart_run.json", {dir.filePath("restart-large.csv"), dir.filePath("restart-small.csv")}, "file");
    // 200 epochs of 30 steps: the kill lands mid-run, and each task's JSON lines (one per epoch)
    // stay within a pipe's 64 KiB while the test waits on the other task (at 600 the worker
    // blocked writing its output and the chief's all-reduce timed out); a backup every 13 steps
    // falls at a different step of each epoch.
    const QStringList args = {"train", "--config", config, "--epochs", "200", "--threads", "1", "--strategy", "multi-worker-mirrored",
                              "--no-record", "--json", "--collective-timeout", "20"};
    const QString continuous = runWithRestart("uneven-continuous", args, {}, {}, false);
    QVERIFY2(continuous.isEmpty(), qPrintable(continuous));
    const QStringList backup = {"--backup-every-steps", "13", "--restarts", "1"};
    const QString restarted = runWithRestart("uneven-restarted", args, backup + QStringList{"--backup-dir", m_dir.filePath("uneven-backup-chief")},
                                             backup + QStringList{"--backup-dir", m_dir.filePath("uneven-backup-worker")}, true);
    QVERIFY2(restarted.isEmpty(), qPrintable(restarted));
    QCOMPARE(maxDiff(m_dir.filePath("uneven-restarted-chief.safetensors"), m_dir.filePath("uneven-continuous-chief.safetensors")), 0.0);
    QCOMPARE(maxDiff(m_dir.filePath("uneven-restarted-worker.safetensors"), m_dir.filePath("uneven-continuous-chief.safetensors")), 0.0);
}

// TF's side-car evaluator in a TF_CONFIG cluster: all three tasks run the same command (the
// evaluator ignores the training flags). The chief sends its weights after each epoch, the
// evaluator evaluates them on its test split while the tasks train on, the chief prints and
// records each epoch's validation (the training tasks validate nothing), and the last one is the
// final weights': the same numbers a local evaluation of the saved weights gives.
void TestMultiWorker::evaluatorTaskValidatesEachEpoch()
{
    const QString cluster = clusterWithEvaluator();
    const QString db = m_dir.filePath("runs-evaluator.db");
    const QString weights = m_dir.filePath("evaluated.safetensors");
    const QStringList args = {"train", "--model", "mlp", "--epochs", "2", "--batch-size", "64", "--limit", "2560", "--seed", "3",
                              "--threads", "1", "--json", "--strategy", "multi-worker-mirrored", "--db", db};
    auto evaluator = startCli(args + QStringList{"--task", "evaluator:0"}, cluster);
    auto worker = startCli(args + QStringList{"--task", "worker:0", "--no-record"}, cluster);
    auto chief = startCli(args + QStringList{"--task", "chief:0", "--save-weights", weights}, cluster);
    const Finished c = finish(*chief), w = finish(*worker), e = finish(*evaluator);
    QVERIFY2(c.code == 0, qPrintable(c.out));
    QVERIFY2(w.code == 0, qPrintable(w.out));
    QVERIFY2(e.code == 0, qPrintable(e.out));
    QVERIFY2(e.out.contains("evaluator:0: the run completed"), qPrintable(e.out));
    QVERIFY2(!w.out.contains("evaluation") && !w.out.contains("val_accuracy\":0"), qPrintable(w.out));

    const auto byEpoch = evaluations(c.out);
    QVERIFY2(byEpoch.size() == 2 && byEpoch.count(1) && byEpoch.count(2), qPrintable(c.out));
    for (const auto& [epoch, j] : byEpoch) {
        QCOMPARE(QString::fromStdString(j["by"].get<std::string>()), QString("evaluator:0"));
        QCOMPARE(j["examples"].get<int>(), 10000);
    }
    // The training tasks did not validate: their epoch lines have none.
    const auto lines = jsonLines(c.out);
    for (const auto& j : lines)
        if (j.contains("steps") && !j.value("final", false)) QVERIFY2(j["val_accuracy"].is_null(), qPrintable(c.out));
    const nlohmann::json last = lines.back();
    QVERIFY2(last.value("final", false), qPrintable(c.out));
    QCOMPARE(last["val_accuracy"].get<double>(), byEpoch.at(2)["val_accuracy"].get<double>());
    QCOMPARE(last["evaluator"]["evaluations"]["evaluator:0"].get<int>(), 2);
    QCOMPARE(last["evaluator"]["skipped"].get<int>(), 0);
    QVERIFY2(!last["evaluator"].contains("evaluator_lost"), last.dump().c_str());

    // The evaluator evaluated the chief's final weights.
    auto here = tstest::evaluateWeightsFile(weights.toStdString());
    QVERIFY2(here.ok(), here.ok() ? "" : here.error().toString().c_str());
    QCOMPARE(byEpoch.at(2)["val_accuracy"].get<double>(), here->accuracy);
    QVERIFY(std::abs(byEpoch.at(2)["val_loss"].get<double>() - here->loss) < 1e-6);

    // Recorded: each epoch's training metrics with its validation.
    auto store = ts::store::RunStore::open(db.toStdString());
    QVERIFY(store.ok());
    auto rows = store->epochMetrics(last["run_id"].get<std::string>());
    QVERIFY(rows.ok());
    QCOMPARE(rows->size(), std::size_t{2});
    for (const auto& r : *rows) {
        QCOMPARE(r.metrics.at("val_accuracy"), byEpoch.at(static_cast<int>(r.epoch))["val_accuracy"].get<double>());
        QVERIFY(r.metrics.at("loss") > 0 && r.metrics.at("seconds") > 0 && r.metrics.at("samples_per_sec") > 0);
        QVERIFY(r.step > 0);
    }
}

// Without its evaluator the chief validates each epoch itself, on its own test split: an
// evaluator whose task fails (no test split on its machine) exits naming the missing file, one
// that is not there at all is reported with what to start; a run validated on a pipeline is
// validated by the training tasks, and one that does not validate is not validated (the
// evaluator of either is told it has nothing to do, and exits); and an evaluator whose chief
// never comes gives up after --collective-timeout.
void TestMultiWorker::chiefEvaluatesWithoutItsEvaluator()
{
    const QStringList args = {"train", "--model", "mlp", "--epochs", "2", "--batch-size", "64", "--limit", "1280", "--seed", "3",
                              "--threads", "1", "--json", "--strategy", "multi-worker-mirrored", "--no-record"};
    {
        const QString cluster = clusterWithEvaluator();
        QTemporaryDir empty;
        auto evaluator = startCli(args + QStringList{"--task", "evaluator:0", "--data", empty.path()}, cluster);
        auto worker = startCli(args + QStringList{"--task", "worker:0"}, cluster);
        auto chief = startCli(args + QStringList{"--task", "chief:0"}, cluster);
        const Finished c = finish(*chief), w = finish(*worker), e = finish(*evaluator);
        QVERIFY2(c.code == 0, qPrintable(c.out));
        QVERIFY2(w.code == 0, qPrintable(w.out));
        QVERIFY2(e.code == 1, qPrintable(e.out));
        QVERIFY2(e.out.contains("error: evaluator:0: IDX file '" + empty.path() + "/t10k-images-idx3-ubyte' does not exist"), qPrintable(e.out));
        QVERIFY2(c.out.contains("t10k-images-idx3-ubyte' does not exist; chief:0 evaluates from now on"), qPrintable(c.out));
        const auto byEpoch = evaluations(c.out);
        QVERIFY2(byEpoch.count(2) && byEpoch.at(2)["by"] == "chief:0" && byEpoch.at(2)["examples"] == 10000, qPrintable(c.out));
        const nlohmann::json last = jsonLines(c.out).back();
        QCOMPARE(last["val_accuracy"].get<double>(), byEpoch.at(2)["val_accuracy"].get<double>());
        QVERIFY2(last["evaluator"].contains("evaluator_lost"), last.dump().c_str());
    }
    {
        // Nobody at the evaluator's address.
        const QString cluster = clusterWithEvaluator();
        QElapsedTimer timer;
        timer.start();
        // A long connect time (--collective-timeout): the run's end must not wait it out.
        const QStringList patient = args + QStringList{"--collective-timeout", "120"};
        auto worker = startCli(patient + QStringList{"--task", "worker:0"}, cluster);
        auto chief = startCli(patient + QStringList{"--task", "chief:0"}, cluster);
        const Finished c = finish(*chief), w = finish(*worker);
        QVERIFY2(c.code == 0, qPrintable(c.out));
        QVERIFY2(w.code == 0, qPrintable(w.out));
        QVERIFY2(c.out.contains("nothing listens at 127.0.0.1:"), qPrintable(c.out));
        QVERIFY2(c.out.contains("start the evaluator there (the same train command, with task evaluator:0 of TF_CONFIG)"), qPrintable(c.out));
        QVERIFY2(timer.elapsed() < 60000, qPrintable(QString("took %1 ms").arg(timer.elapsed())));
        const nlohmann::json last = jsonLines(c.out).back();
        QVERIFY2(last.value("final", false) && last["val_accuracy"].is_number(), qPrintable(c.out));
        QVERIFY2(last["evaluator"]["evaluations"]["chief:0"].get<int>() >= 1, last.dump().c_str());
    }
    {
        // A run validated on its "validation_pipeline" (not the idx test split an evaluator
        // reads): the training tasks validate it themselves, as without an evaluator.
        const QDir dir(m_dir.path());
        writeFile(dir.filePath("eval-rows.csv"), csvRows(0, 60));
        writeFile(dir.filePath("eval-val.csv"), csvRows(1000, 23));
        const QString config = writePipelineRun(dir, "eval_pipeline_run.json", {dir.filePath("eval-rows.csv")}, "auto", dir.filePath("eval-val.csv"));
        const QString cluster = clusterWithEvaluator();
        const QStringList common = {"train", "--config", config, "--threads", "1", "--no-record", "--json", "--strategy", "multi-worker-mirrored"};
        // Its evaluator is told so, and ends at once instead of waiting for weights.
        auto evaluator = startCli(common + QStringList{"--task", "evaluator:0"}, cluster);
        auto worker = startCli(common + QStringList{"--task", "worker:0"}, cluster);
        auto chief = startCli(common + QStringList{"--task", "chief:0"}, cluster);
        const Finished c = finish(*chief), w = finish(*worker), e = finish(*evaluator);
        QVERIFY2(c.code == 0, qPrintable(c.out));
        QVERIFY2(w.code == 0, qPrintable(w.out));
        QVERIFY2(c.out.contains("note: the cluster's evaluator is not used: the run validates on its \"validation_pipeline\""), qPrintable(c.out));
        QVERIFY2(!c.out.contains("nothing listens") && evaluations(c.out).empty(), qPrintable(c.out));
        const nlohmann::json last = jsonLines(c.out).back();
        QVERIFY2(last.value("final", false) && last["val_loss"].is_number() && !last.contains("evaluator"), qPrintable(c.out));
        QVERIFY2(e.code == 0, qPrintable(e.out));
        QVERIFY2(e.out.contains("evaluator:0 has nothing to evaluate: the run validates on its \"validation_pipeline\""), qPrintable(e.out));
    }
    {
        // A run that does not validate: the same, with the evaluator started after the chief
        // (which waits for its worker meanwhile).
        const QString cluster = clusterWithEvaluator();
        const QStringList quiet = args + QStringList{"--no-validation"};
        auto chief = startCli(quiet + QStringList{"--task", "chief:0"}, cluster);
        QTest::qWait(1000);
        auto evaluator = startCli(quiet + QStringList{"--task", "evaluator:0"}, cluster);
        QTest::qWait(1000);
        auto worker = startCli(quiet + QStringList{"--task", "worker:0"}, cluster);
        const Finished e = finish(*evaluator), c = finish(*chief), w = finish(*worker);
        QVERIFY2(c.code == 0, qPrintable(c.out));
        QVERIFY2(w.code == 0, qPrintable(w.out));
        QVERIFY2(c.out.contains("note: the cluster's evaluator is not used: the run does not validate"), qPrintable(c.out));
        QVERIFY2(e.code == 0, qPrintable(e.out));
        QVERIFY2(e.out.contains("evaluator:0 has nothing to evaluate: the run does not validate"), qPrintable(e.out));
    }
    {
        // An evaluator whose chief never comes.
        QElapsedTimer timer;
        timer.start();
        const Finished e = finish(*startCli(args + QStringList{"--task", "evaluator:0", "--collective-timeout", "2"}, clusterWithEvaluator()));
        QVERIFY2(e.code == 1, qPrintable(e.out));
        QVERIFY2(e.out.contains("did not start an evaluation within 2 s"), qPrintable(e.out));
        QVERIFY2(e.out.contains("hint: start the chief too"), qPrintable(e.out));
        QVERIFY(timer.elapsed() < 15000);
    }
}

// An evaluator killed mid-run (SIGKILL) and started again, as its supervisor would: the chief
// evaluates the epochs in between itself, then the new evaluator takes over again (a rejoin).
void TestMultiWorker::evaluatorRejoinsAfterKill()
{
    const QString cluster = clusterWithEvaluator();
    // Small batches: epochs of a second or more, so the new evaluator is up before the run ends.
    const QStringList args = {"train", "--model", "mlp", "--epochs", "8", "--batch-size", "16", "--seed", "3", "--threads", "1",
                              "--json", "--strategy", "multi-worker-mirrored", "--no-record"};
    auto evaluator = startCli(args + QStringList{"--task", "evaluator:0"}, cluster);
    auto worker = startCli(args + QStringList{"--task", "worker:0"}, cluster);
    auto chief = startCli(args + QStringList{"--task", "chief:0"}, cluster);
    QString seen;
    QVERIFY2(tstest::readUntil(*chief, seen, "\"by\":\"evaluator:0\",\"epoch\":1"), qPrintable(seen));
    ::kill(static_cast<pid_t>(evaluator->processId()), SIGKILL);
    finish(*evaluator);
    auto again = startCli(args + QStringList{"--task", "evaluator:0"}, cluster);
    Finished c = finish(*chief);
    c.out = seen + c.out;
    const Finished w = finish(*worker), e = finish(*again);
    QVERIFY2(c.code == 0, qPrintable(c.out));
    QVERIFY2(w.code == 0, qPrintable(w.out));
    QVERIFY2(e.code == 0, qPrintable(e.out));
    QVERIFY2(c.out.contains("answers again: it evaluates from epoch"), qPrintable(c.out));
    // Lost at the first evaluation after the kill (epoch 2, or 3 on a machine slow to read the
    // chief's output), which the chief evaluated itself; the last epoch is the new evaluator's.
    // An epoch may be skipped while an evaluation runs.
    const nlohmann::json last = jsonLines(c.out).back();
    QVERIFY2(last.value("final", false), qPrintable(c.out));
    const int lostAt = last["evaluator"]["evaluator_lost"]["epoch"].get<int>();
    QVERIFY2(lostAt == 2 || lostAt == 3, last.dump().c_str());
    const auto byEpoch = evaluations(c.out);
    QVERIFY2(byEpoch.count(lostAt) && byEpoch.at(lostAt)["by"] == "chief:0", qPrintable(c.out));
    QVERIFY2(byEpoch.count(8) && byEpoch.at(8)["by"] == "evaluator:0", qPrintable(c.out));
    QCOMPARE(last["evaluator"]["rejoins"].get<int>(), 1);
}

// The chief's side (SidecarEvaluation) when an epoch is submitted again while its first weights
// are being evaluated, as a run restarted from its backup replays epochs: the first result is of
// the failed attempt's weights, and only the latest weights' result is reported and counted.
void TestMultiWorker::replayedEpochIsEvaluatedOnce()
{
    // Nobody at the evaluator's address: the chief evaluates here, which takes a while.
    auto spec = ClusterSpec::fromText(
        R"({"cluster": {"chief": ["127.0.0.1:1"], "evaluator": ["127.0.0.1:2"]}, "task": {"type": "chief", "index": 0}})", "test");
    QVERIFY2(spec.ok(), spec.ok() ? "" : spec.error().toString().c_str());
    const RunConfig cfg = tstest::mirroredSeedMlpRun();
    remote::SidecarOptions so;
    so.runId = "replayed";
    so.token = kToken.toStdString();
    so.who = "chief:0";
    so.connectTimeout = std::chrono::milliseconds(0);  // no attempts before the first epoch
    std::mutex mutex;
    std::condition_variable cv;
    std::vector<remote::SidecarResult> results;
    bool noted = false;
    auto made = remote::SidecarEvaluation::create(
        cfg, *spec, so,
        [&](const remote::SidecarResult& r) {
            std::lock_guard lock(mutex);
            results.push_back(r);
        },
        [&](const std::string&) {
            std::lock_guard lock(mutex);
            noted = true;  // said as the first evaluation begins: it is evaluated here
            cv.notify_all();
        });
    QVERIFY2(made.ok(), made.ok() ? "" : made.error().toString().c_str());
    auto& evaluation = **made;
    auto first = tstest::seedMlpTrainer(), second = tstest::seedMlpTrainer();
    QVERIFY(first.ok() && second.ok() && (*first)->strategy().initialise(1).ok() && (*second)->strategy().initialise(2).ok());
    auto failedAttempt = (*first)->encodeWeights("weights 1"), replayed = (*second)->encodeWeights("weights 2");
    QVERIFY(failedAttempt.ok() && replayed.ok());
    evaluation.submit(1, *failedAttempt);
    {
        std::unique_lock lock(mutex);
        QVERIFY(cv.wait_for(lock, std::chrono::seconds(30), [&] { return noted; }));
    }
    const uint64_t latest = evaluation.submit(1, *replayed);
    const nlohmann::json summary = evaluation.finish("done");
    QCOMPARE(summary["skipped"].get<int>(), 0);  // the first was in progress, not waiting
    std::lock_guard lock(mutex);
    QCOMPARE(results.size(), std::size_t{1});
    QCOMPARE(results[0].submission, latest);
    QVERIFY2(results[0].value.has_value(), results[0].error.toString().c_str());
    QCOMPARE(summary["evaluations"]["chief:0"].get<int>(), 1);
    auto here = tstest::evaluateOnTestSplit(**second);
    QVERIFY(here.ok());
    QVERIFY2(std::abs(here->accuracy - results[0].value->accuracy) < 1e-9,
             qPrintable(QString("%1 against %2").arg(here->accuracy).arg(results[0].value->accuracy)));
}

QTEST_GUILESS_MAIN(TestMultiWorker)
#include "tst_multi_worker.moc"
