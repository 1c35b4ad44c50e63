// trainstudio-worker and the coordinator (trainstudio-cli train --cluster): the control service
// refuses unauthenticated, oversized and malformed requests; binds loopback unless told; a
// coordinated run on two worker daemons completes and is recorded; pre-flight names an
// unreachable worker; kill -9 of a worker mid-run is reported, naming it, within 10 s.

#include <QtTest>

#include <csignal>
#include <set>

#include <nlohmann/json.hpp>

#include "distributed/worker_process.h"
#include "remote/worker_client.h"
#include "store/run_store.h"
#include "remote/worker_service.h"
#include "worker.grpc.pb.h"

using namespace ts;
using namespace ts::remote;

namespace {

const std::string kToken = "worker-test-token";

std::unique_ptr<Worker::Stub> stubFor(int port)
{
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(64 << 20);
    return Worker::NewStub(grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials(), args));
}

void withToken(grpc::ClientContext& ctx, const std::string& token)
{
    ctx.AddMetadata("authorization", "Bearer " + token);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
}

std::unique_ptr<WorkerDaemon> startDaemon()
{
    WorkerOptions o;
    o.token = kToken;
    o.maxMessageBytes = 1 << 20;
    auto d = WorkerDaemon::start(o);
    if (!d.ok()) qFatal("%s", d.error().toString().c_str());
    return std::move(d).value();
}

using tstest::WorkerProcess;

std::unique_ptr<WorkerProcess> spawnWorker(const QString& dir, const QString& name) { return tstest::spawnWorker(dir, name, kToken); }

QString writeCluster(const QString& dir, const std::vector<int>& ports)
{
    QStringList workers;
    for (std::size_t i = 1; i < ports.size(); ++i) workers << QString("\"127.0.0.1:%1\"").arg(ports[i]);
    const QString path = dir + "/cluster.json";
    QFile f(path);
    f.open(QIODevice::WriteOnly);
    f.write(QString(R"({"cluster": {"chief": ["127.0.0.1:%1"], "worker": [%2]}})").arg(ports[0]).arg(workers.join(", ")).toUtf8());
    return path;
}

// The chief and worker daemons of a two-task cluster, and its cluster file (empty when a daemon
// did not start).
QString startDaemonPair(const QString& dir, std::unique_ptr<WorkerProcess>& chief, std::unique_ptr<WorkerProcess>& worker)
{
    chief = spawnWorker(dir, "chief");
    worker = spawnWorker(dir, "worker");
    if (chief->port <= 0 || worker->port <= 0) return {};
    return writeCluster(dir, {chief->port, worker->port});
}

// The state a daemon reports in its heartbeat ("idle", "running", "cancelled", ...), or "" when
// it does not answer.
std::string daemonState(int port)
{
    auto client = stubFor(port);
    grpc::ClientContext ctx;
    withToken(ctx, kToken);
    ts::remote::HeartbeatPong pong;
    return client->Heartbeat(&ctx, ts::remote::HeartbeatPing(), &pong).ok() ? pong.state() : std::string();
}

std::unique_ptr<QProcess> startCoordinator(const QStringList& args)
{
    auto p = std::make_unique<QProcess>();
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    env.insert("TRAINSTUDIO_TOKEN", QString::fromStdString(kToken));
    env.remove("TF_CONFIG");
    p->setProcessEnvironment(env);
    p->start(QStringLiteral(TS_CLI_PATH), args);
    return p;
}

QStringList coordinatorArgs(const QString& cluster, int steps)
{
    return {"train", "--cluster", cluster, "--model", "mlp", "--max-steps", QString::number(steps), "--batch-size", "64",
            "--limit", "1280", "--no-validation", "--threads", "1", "--epochs", "1000"};
}

} // namespace

class TestWorker : public QObject {
    Q_OBJECT
private slots:
    void refusesUnauthenticated();
    void tokenIsChecked_data();
    void tokenIsChecked();
    void refusesOversizedAndMalformed();
    void bindsLoopbackUnlessAllowed();
    void servesTls();
    void coordinatedRunIsRecorded();
    void preflightNamesUnreachableWorker();
    void killedWorkerIsNamed();
    void restartedRunResumesFromBackup();
    void killedCoordinatorCancelsTasks();
    void interruptedCoordinatorRecordsCancelled();
};

void TestWorker::tokenIsChecked_data()
{
    QTest::addColumn<QByteArray>("fileContents");  // "-": no file (the variable is used)
    QTest::addColumn<QByteArray>("env");           // "-": unset
    QTest::addColumn<QString>("token");            // empty: refused
    QTest::addColumn<QString>("error");
    QTest::addColumn<QString>("hint");
    QTest::newRow("file") << QByteArray("  s3cret\n") << QByteArray("-") << "s3cret" << "" << "";
    QTest::newRow("variable") << QByteArray("-") << QByteArray("s3cret") << "s3cret" << "" << "";
    QTest::newRow("neither") << QByteArray("-") << QByteArray("-") << "" << "neither --token-file nor $TRAINSTUDIO_TOKEN" << "--token-file";
    QTest::newRow("empty file") << QByteArray(" \n") << QByteArray("-") << "" << "token file %1 is empty" << "into %1";
    QTest::newRow("empty variable") << QByteArray("-") << QByteArray("") << "" << "$TRAINSTUDIO_TOKEN is empty (set, but to nothing)"
                                    << "export TRAINSTUDIO_TOKEN=";
    // gRPC aborted the process on the first call with such a token ("Illegal header value").
    QTest::newRow("two lines") << QByteArray("abc\ndef\n") << QByteArray("-") << "" << "token file %1: character 4 of the token is a line break"
                               << "one line of printable ASCII";
    QTest::newRow("control character") << QByteArray("-") << QByteArray("ab\x01") << ""
                                       << "$TRAINSTUDIO_TOKEN: character 3 of the token is a control character (0x01)" << "openssl rand";
    QTest::newRow("not ascii") << QByteArray("gr\xc3\xbc\xc3\x9f") << QByteArray("-") << "" << "character 3 of the token is not ASCII (0xc3)" << "";
}

void TestWorker::tokenIsChecked()
{
    QFETCH(QByteArray, fileContents);
    QFETCH(QByteArray, env);
    QFETCH(QString, token);
    QFETCH(QString, error);
    QFETCH(QString, hint);
    QTemporaryDir dir;
    QString file;
    if (fileContents != "-") {
        file = dir.filePath("token");
        QFile f(file);
        QVERIFY(f.open(QIODevice::WriteOnly));
        f.write(fileContents);
    }
    const QByteArray saved = qgetenv("TRAINSTUDIO_TOKEN");
    const bool had = qEnvironmentVariableIsSet("TRAINSTUDIO_TOKEN");
    if (env == "-") qunsetenv("TRAINSTUDIO_TOKEN");
    else qputenv("TRAINSTUDIO_TOKEN", env);
    auto got = loadToken(file.toStdString());
    if (had) qputenv("TRAINSTUDIO_TOKEN", saved);
    else qunsetenv("TRAINSTUDIO_TOKEN");
    if (!token.isEmpty()) {
        QVERIFY2(got.ok(), got.ok() ? "" : got.error().toString().c_str());
        QCOMPARE(QString::fromStdString(*got), token);
        return;
    }
    QVERIFY(!got.ok());
    QCOMPARE(got.error().code, ErrorCode::InvalidArgument);
    QVERIFY2(QString::fromStdString(got.error().message).contains(QString(error).replace("%1", file)), got.error().toString().c_str());
    QVERIFY2(QString::fromStdString(got.error().hint).contains(QString(hint).replace("%1", file)), got.error().toString().c_str());
}

void TestWorker::refusesUnauthenticated()
{
    auto daemon = startDaemon();
    auto stub = stubFor(daemon->port());
    for (const std::string& token : {std::string(), std::string("wrong-token"), kToken + "x"}) {
        grpc::ClientContext ctx;
        if (!token.empty()) withToken(ctx, token);
        ts::remote::IdentifyReply reply;
        const grpc::Status st = stub->Identify(&ctx, ts::remote::IdentifyRequest(), &reply);
        QCOMPARE(st.error_code(), grpc::StatusCode::UNAUTHENTICATED);
        QVERIFY(reply.worker().empty());
    }
    {
        grpc::ClientContext ctx;
        ts::remote::StartTaskRequest req;
        req.set_run_id("r");
        ts::remote::StartTaskReply reply;
        QCOMPARE(stub->StartTask(&ctx, req, &reply).error_code(), grpc::StatusCode::UNAUTHENTICATED);
    }
    {
        grpc::ClientContext ctx;
        ts::remote::HeartbeatPong pong;
        QCOMPARE(stub->Heartbeat(&ctx, ts::remote::HeartbeatPing(), &pong).error_code(), grpc::StatusCode::UNAUTHENTICATED);
    }
    // With the token: who it is, its devices, idle.
    grpc::ClientContext ctx;
    withToken(ctx, kToken);
    ts::remote::IdentifyReply reply;
    const grpc::Status st = stub->Identify(&ctx, ts::remote::IdentifyRequest(), &reply);
    QVERIFY2(st.ok(), st.error_message().c_str());
    QCOMPARE(reply.worker(), "127.0.0.1:" + std::to_string(daemon->port()));
    QVERIFY(!reply.version().empty());
    QVERIFY(reply.devices_size() >= 1);
    QCOMPARE(reply.devices(0).kind(), std::string("cpu"));
    QVERIFY(reply.devices(0).memory_bytes() > 0);
    QCOMPARE(reply.state(), std::string("idle"));
}

void TestWorker::refusesOversizedAndMalformed()
{
    auto daemon = startDaemon();
    auto stub = stubFor(daemon->port());
    auto start = [&](const std::string& config, const std::string& cluster, const std::string& type = "worker", int index = 0) {
        grpc::ClientContext ctx;
        withToken(ctx, kToken);
        ts::remote::StartTaskRequest req;
        req.set_run_id("run-1");
        req.set_run_config_json(config);
        req.set_cluster_json(cluster);
        req.set_task_type(type);
        req.set_task_index(index);
        ts::remote::StartTaskReply reply;
        return stub->StartTask(&ctx, req, &reply);
    };
    const std::string cluster = R"({"cluster": {"worker": ["127.0.0.1:1"]}})";
    // Over the 1 MiB bound: refused by gRPC before any parsing.
    grpc::Status st = start(std::string(2 << 20, ' ') + "{}", cluster);
    QCOMPARE(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    st = start("{not json", cluster);
    QCOMPARE(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    QVERIFY2(st.error_message().find("not valid JSON") != std::string::npos, st.error_message().c_str());
    st = start(R"({"epochs": 1, "bogus": 2})", cluster);
    QCOMPARE(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    QVERIFY2(st.error_message().find("unknown key \"bogus\"") != std::string::npos, st.error_message().c_str());
    st = start(R"({"model_file": "/etc/passwd"})", cluster);
    QCOMPARE(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    QVERIFY2(st.error_message().find("must inline its model") != std::string::npos, st.error_message().c_str());
    st = start(R"({"save_weights": "/tmp/x.safetensors"})", cluster);
    QCOMPARE(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    st = start("{}", R"({"cluster": {"worker": ["nohost"]}})");
    QCOMPARE(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    QVERIFY2(st.error_message().find("cluster.worker[0]: bad address") != std::string::npos, st.error_message().c_str());
    st = start("{}", cluster, "worker", 3);
    QCOMPARE(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    QVERIFY2(st.error_message().find("task.index 3 is out of range") != std::string::npos, st.error_message().c_str());
    // Still serving, still idle.
    grpc::ClientContext ctx;
    withToken(ctx, kToken);
    ts::remote::HeartbeatPong pong;
    QVERIFY(stub->Heartbeat(&ctx, ts::remote::HeartbeatPing(), &pong).ok());
    QCOMPARE(pong.state(), std::string("idle"));
}

void TestWorker::bindsLoopbackUnlessAllowed()
{
    WorkerOptions o;
    o.token = kToken;
    o.listen = "0.0.0.0:0";
    auto d = WorkerDaemon::start(o);
    QVERIFY(!d.ok());
    QVERIFY2(d.error().message.find("0.0.0.0:0: not a loopback address") != std::string::npos, d.error().message.c_str());
    QVERIFY(d.error().hint.find("--allow-remote") != std::string::npos);
    o.listen = "127.0.0.1:0";
    o.token.clear();
    QVERIFY(!WorkerDaemon::start(o).ok());
    QVERIFY(isLoopbackHost("127.0.0.1") && isLoopbackHost("::1") && isLoopbackHost("localhost") && !isLoopbackHost("10.0.0.1"));
    // A typo is not an address, whatever --allow-remote says; a taken port is not shared.
    o.token = kToken;
    o.listen = "999.1.1.1:7171";
    auto typo = WorkerDaemon::start(o);
    QVERIFY(!typo.ok());
    QVERIFY2(typo.error().message.find("'999.1.1.1' is not an address") != std::string::npos, typo.error().message.c_str());
    o.listen = "127.0.0.1:0";
    auto first = std::move(WorkerDaemon::start(o)).value();
    o.listen = "127.0.0.1:" + std::to_string(first->port());
    auto second = WorkerDaemon::start(o);
    QVERIFY(!second.ok());
    const std::string taken = "port " + std::to_string(first->port()) + " is in use by another program";
    QVERIFY2(second.error().message.find(taken) != std::string::npos, second.error().message.c_str());
    QVERIFY2(second.error().hint.find("ss -ltnp") != std::string::npos, second.error().hint.c_str());
    // An address of another machine (TEST-NET-1, never this one's) is named as such.
    o.allowRemote = true;
    o.listen = "192.0.2.1:7172";
    auto elsewhere = WorkerDaemon::start(o);
    QVERIFY(!elsewhere.ok());
    QVERIFY2(elsewhere.error().message.find("192.0.2.1 is not an address of this machine") != std::string::npos,
             elsewhere.error().message.c_str());
}

void TestWorker::servesTls()
{
    const std::string dir = std::string(TS_FIXTURES_DIR) + "/tls/";
    WorkerOptions o;
    o.token = kToken;
    o.tls.certificate = dir + "server.crt";
    o.tls.privateKey = dir + "server.key";
    auto daemon = std::move(WorkerDaemon::start(o)).value();
    const std::string addr = "127.0.0.1:" + std::to_string(daemon->port());
    TlsFiles ca;
    ca.rootCa = dir + "server.crt";
    auto secure = std::move(WorkerClient::connect("worker:0 at " + addr, addr, kToken, ca)).value();
    auto who = secure->identify(std::chrono::seconds(5));
    QVERIFY2(who.ok(), who.ok() ? "" : who.error().toString().c_str());
    QCOMPARE(who->state, std::string("idle"));
    auto plain = std::move(WorkerClient::connect("worker:0 at " + addr, addr, kToken)).value();
    auto refused = plain->identify(std::chrono::seconds(2));
    QVERIFY(!refused.ok());
    QVERIFY2(refused.error().message.rfind("worker:0 at " + addr + ": unreachable", 0) == 0, refused.error().message.c_str());
    // A certificate without its key is a configuration error, said before listening.
    o.tls.privateKey.clear();
    QVERIFY(!WorkerDaemon::start(o).ok());
    // Files that are not PEM are named as such (gRPC would only fail to listen, or connect).
    o.tls.privateKey = std::string(TS_SOURCE_DIR) + "/README.md";
    auto notPem = WorkerDaemon::start(o);
    QVERIFY(!notPem.ok());
    QVERIFY2(notPem.error().message.find("README.md is not a PEM TLS private key") != std::string::npos, notPem.error().message.c_str());
    TlsFiles badCa;
    badCa.rootCa = dir;  // a folder
    auto folder = WorkerClient::connect("worker:0 at " + addr, addr, kToken, badCa);
    QVERIFY(!folder.ok());
    QVERIFY2(folder.error().message.find("is a folder, not a TLS CA certificate") != std::string::npos, folder.error().message.c_str());
}

void TestWorker::coordinatedRunIsRecorded()
{
    QTemporaryDir dir;
    std::unique_ptr<WorkerProcess> chief, worker;
    const QString cluster = startDaemonPair(dir.path(), chief, worker);
    QVERIFY(!cluster.isEmpty());
    const QString db = dir.filePath("runs.db");
    // 300 steps (~0.5 s): long enough for the workers' 10 Hz device samplers to report.
    auto coord = startCoordinator(coordinatorArgs(cluster, 300) + QStringList{"--db", db, "--json"});
    QVERIFY(coord->waitForFinished(120000));
    const QString out = QString::fromUtf8(coord->readAllStandardOutput()) + QString::fromUtf8(coord->readAllStandardError());
    QVERIFY2(coord->exitCode() == 0, qPrintable(out));
    const QString last = out.trimmed().split('\n').last();
    const auto j = nlohmann::json::parse(last.toStdString(), nullptr, false);
    QVERIFY2(!j.is_discarded() && j.value("final", false), qPrintable(out));
    QCOMPARE(j["steps"].get<int>(), 300);
    QCOMPARE(j["workers"].get<int>(), 2);
    const QString runId = QString::fromStdString(j["run_id"].get<std::string>());
    // The one merged run is in the store, completed, with the chief's step metrics.
    QProcess show;
    show.start(QStringLiteral(TS_CLI_PATH), {"runs", "show", runId, "--db", db, "--json"});
    QVERIFY(show.waitForFinished(30000));
    const QString shown = QString::fromUtf8(show.readAllStandardOutput());
    QVERIFY2(show.exitCode() == 0, qPrintable(shown + show.readAllStandardError()));
    QVERIFY2(shown.contains("completed"), qPrintable(shown));
    QVERIFY2(shown.contains("multi-worker-mirrored"), qPrintable(shown));
    // Device samples from both workers, each on its worker's lane; the chief's step breakdowns.
    auto store = ts::store::RunStore::open(db.toStdString());
    QVERIFY2(store.ok(), store.ok() ? "" : store.error().toString().c_str());
    auto samples = store->deviceSamples(runId.toStdString());
    QVERIFY(samples.ok());
    std::set<std::string> lanes;
    for (const auto& d : *samples) lanes.insert(d.stamp.lane.worker);
    QVERIFY2(lanes.count("chief:0") && lanes.count("worker:0"), qPrintable(QString::number(samples->size())));
    auto breakdowns = store->breakdowns(runId.toStdString());
    QVERIFY(breakdowns.ok());
    QVERIFY(!breakdowns->empty());
    QCOMPARE(breakdowns->front().stamp.lane.worker, std::string("chief:0"));
    QVERIFY(breakdowns->front().communication > 0);
    // The run lists the devices each task trained on (it listed none).
    auto run = store->run(runId.toStdString());
    QVERIFY(run.ok());
    std::set<std::string> tasks;
    for (const auto& d : run->devices) {
        QVERIFY2(d.value("device", "").rfind("cpu:", 0) == 0, run->devices.dump().c_str());
        tasks.insert(d.value("task", ""));
    }
    QVERIFY2(tasks == std::set<std::string>({"chief:0", "worker:0"}), run->devices.dump().c_str());
}

// --restarts with daemons: the worker daemon is killed with SIGKILL mid-run and started again on
// its port (as systemd would); the coordinator waits for it, starts the run again, the tasks
// resume from the chief daemon's backup (under its --backup-root), and the run ends exactly as
// an uninterrupted one: same steps, same last-epoch loss and accuracy (bit-equal sums).
void TestWorker::restartedRunResumesFromBackup()
{
    QTemporaryDir dir;
    const QString root = dir.filePath("chief-backups");
    auto run = [&](const QString& tag, const QStringList& extra, bool kill, nlohmann::json& final, QString& out) {
        auto chief = tstest::spawnWorker(dir.path(), tag + "-chief", kToken, {"--backup-root", root});
        auto worker = spawnWorker(dir.path(), tag + "-worker");
        QVERIFY(chief->port > 0 && worker->port > 0);
        const QString cluster = writeCluster(dir.path(), {chief->port, worker->port});
        auto coord = startCoordinator(coordinatorArgs(cluster, 400) + extra + QStringList{"--db", dir.filePath("runs.db"), "--json"});
        if (kill) {
            QVERIFY2(tstest::readUntil(*coord, out, "\"epoch\":3"), qPrintable(out));
            const int port = worker->port;
            ::kill(static_cast<pid_t>(worker->process->processId()), SIGKILL);
            worker->process->waitForFinished();
            worker = tstest::spawnWorker(dir.path(), tag + "-worker", kToken, {}, port);
            QCOMPARE(worker->port, port);
        }
        QVERIFY(coord->waitForFinished(120000));
        out += QString::fromUtf8(coord->readAllStandardOutput()) + QString::fromUtf8(coord->readAllStandardError());
        QVERIFY2(coord->exitCode() == 0, qPrintable(out));
        final = nlohmann::json::parse(out.trimmed().split('\n').last().toStdString(), nullptr, false);
        QVERIFY2(!final.is_discarded() && final.value("final", false), qPrintable(out));
    };
    nlohmann::json continuous, restarted;
    QString outA, outB;
    run("a", {}, false, continuous, outA);
    if (QTest::currentTestFailed()) return;
    run("b", {"--backup-dir", "run-b", "--backup-every-steps", "5", "--restarts", "1"}, true, restarted, outB);
    if (QTest::currentTestFailed()) return;
    qInfo("restarted run: %s", restarted.dump().c_str());
    QCOMPARE(restarted["restarts"].get<int>(), 1);
    QCOMPARE(restarted["steps"].get<int>(), 400);
    QCOMPARE(restarted["epochs"].get<int>(), continuous["epochs"].get<int>());
    QCOMPARE(restarted["loss"].get<double>(), continuous["loss"].get<double>());
    QCOMPARE(restarted["accuracy"].get<double>(), continuous["accuracy"].get<double>());
    // The backup was under the chief daemon's root, and the completed run deleted it.
    QVERIFY(QDir(root + "/run-b").exists());
    QVERIFY(!QFile::exists(root + "/run-b/backup.safetensors"));
    // One recorded run, completed, whose log says it restarted.
    auto store = ts::store::RunStore::open(dir.filePath("runs.db").toStdString());
    QVERIFY(store.ok());
    const std::string runId = restarted["run_id"].get<std::string>();
    auto logs = store->logs(runId);
    QVERIFY(logs.ok());
    bool said = false;
    for (const auto& l : *logs) said |= l.message.find("restarting the run from its backup") != std::string::npos;
    QVERIFY(said);

    // A backup folder that tries to leave the worker's root is refused, naming the setting.
    auto chief = tstest::spawnWorker(dir.path(), "c-chief", kToken, {"--backup-root", root});
    auto worker = spawnWorker(dir.path(), "c-worker");
    const QString cluster = writeCluster(dir.path(), {chief->port, worker->port});
    auto coord = startCoordinator(coordinatorArgs(cluster, 20) + QStringList{"--no-record", "--backup-dir", "../elsewhere"});
    QVERIFY(coord->waitForFinished(60000));
    const QString refused = QString::fromUtf8(coord->readAllStandardOutput()) + QString::fromUtf8(coord->readAllStandardError());
    QCOMPARE(coord->exitCode(), 1);
    QVERIFY2(refused.contains("backup.dir '../elsewhere' must be a relative folder name without '..'"), qPrintable(refused));
}

void TestWorker::preflightNamesUnreachableWorker()
{
    QTemporaryDir dir;
    auto chief = spawnWorker(dir.path(), "chief");
    QVERIFY(chief->port > 0);
    // A port where nothing listens (ours, just released).
    auto gone = spawnWorker(dir.path(), "gone");
    const int deadPort = gone->port;
    gone.reset();
    const QString cluster = writeCluster(dir.path(), {chief->port, deadPort});
    auto coord = startCoordinator(coordinatorArgs(cluster, 20) + QStringList{"--no-record"});
    QVERIFY(coord->waitForFinished(60000));
    const QString out = QString::fromUtf8(coord->readAllStandardOutput()) + QString::fromUtf8(coord->readAllStandardError());
    QCOMPARE(coord->exitCode(), 2);
    QVERIFY2(out.contains(QString("pre-flight: worker:0 at 127.0.0.1:%1: unreachable: nothing listens at 127.0.0.1:%1 (connection refused)")
                              .arg(deadPort)),
             qPrintable(out));
    QVERIFY2(out.contains("is trainstudio-worker running at"), qPrintable(out));
}

void TestWorker::killedWorkerIsNamed()
{
    QTemporaryDir dir;
    std::unique_ptr<WorkerProcess> chief, worker;
    const QString cluster = startDaemonPair(dir.path(), chief, worker);
    QVERIFY(!cluster.isEmpty());
    auto coord = startCoordinator(coordinatorArgs(cluster, 1000000) + QStringList{"--no-record"});
    QElapsedTimer wait;
    wait.start();
    QString seen;
    // Once the chief has finished two epochs (training, not setting up), SIGKILL the worker.
    while (!seen.contains("Epoch 2:") && wait.elapsed() < 60000 && coord->state() != QProcess::NotRunning) {
        coord->waitForReadyRead(200);
        seen += QString::fromUtf8(coord->readAllStandardOutput());
    }
    QVERIFY2(seen.contains("Epoch 2:"), qPrintable(seen));
    QCOMPARE(coord->state(), QProcess::Running);
    ::kill(static_cast<pid_t>(worker->process->processId()), SIGKILL);
    QElapsedTimer timer;
    timer.start();
    QVERIFY(coord->waitForFinished(30000));
    const double secs = timer.elapsed() / 1000.0;
    const QString out = seen + QString::fromUtf8(coord->readAllStandardOutput()) + QString::fromUtf8(coord->readAllStandardError());
    QCOMPARE(coord->exitCode(), 1);
    for (const QString& line : out.split('\n'))
        if (line.startsWith("error:")) qInfo("%s (after %.1f s)", qPrintable(line), secs);
    QVERIFY2(out.contains(QString("worker:0 at 127.0.0.1:%1").arg(worker->port)), qPrintable(out));
    QVERIFY2(secs < 10.0, qPrintable(QString("detected after %1 s: ").arg(secs) + out));
    // The chief's daemon survives its failed task and is idle for the next run.
    auto stub = stubFor(chief->port);
    QElapsedTimer idle;
    idle.start();
    std::string state;
    while (idle.elapsed() < 15000) {
        grpc::ClientContext ctx;
        withToken(ctx, kToken);
        ts::remote::HeartbeatPong pong;
        if (stub->Heartbeat(&ctx, ts::remote::HeartbeatPing(), &pong).ok()) state = pong.state();
        if (state != "running") break;
        QTest::qWait(100);
    }
    QVERIFY2(state == "failed" || state == "cancelled", state.c_str());
}

void TestWorker::killedCoordinatorCancelsTasks()
{
    QTemporaryDir dir;
    std::unique_ptr<WorkerProcess> chief, worker;
    const QString cluster = startDaemonPair(dir.path(), chief, worker);
    QVERIFY(!cluster.isEmpty());
    auto coord = startCoordinator(coordinatorArgs(cluster, 1000000) + QStringList{"--no-record"});
    QElapsedTimer wait;
    wait.start();
    QString seen;
    while (!seen.contains("Epoch 2:") && wait.elapsed() < 60000 && coord->state() != QProcess::NotRunning) {
        coord->waitForReadyRead(200);
        seen += QString::fromUtf8(coord->readAllStandardOutput());
    }
    QVERIFY2(seen.contains("Epoch 2:"), qPrintable(seen));
    ::kill(static_cast<pid_t>(coord->processId()), SIGKILL);
    coord->waitForFinished();
    // Both daemons stop the orphaned tasks (they would otherwise train for nobody) and stay up.
    for (int port : {chief->port, worker->port}) {
        QElapsedTimer t;
        t.start();
        std::string state = "running";
        while (state == "running" && t.elapsed() < 10000) {
            QTest::qWait(100);
            if (const std::string now = daemonState(port); !now.empty()) state = now;
        }
        qInfo("daemon on port %d: %s after %.1f s", port, state.c_str(), t.elapsed() / 1000.0);
        QVERIFY2(state == "cancelled" || state == "failed", state.c_str());
    }
}

// Ctrl-C on the coordinator: every task stops at its next step, the run is recorded as
// cancelled (not left running for the next open to call interrupted), exit status 130.
void TestWorker::interruptedCoordinatorRecordsCancelled()
{
    QTemporaryDir dir;
    std::unique_ptr<WorkerProcess> chief, worker;
    const QString cluster = startDaemonPair(dir.path(), chief, worker);
    QVERIFY(!cluster.isEmpty());
    const QString db = dir.filePath("runs.db");
    auto coord = startCoordinator(coordinatorArgs(cluster, 1000000) + QStringList{"--db", db});
    QString seen;
    QVERIFY2(tstest::readUntil(*coord, seen, "Epoch 2:"), qPrintable(seen));
    ::kill(static_cast<pid_t>(coord->processId()), SIGINT);
    QVERIFY(coord->waitForFinished(30000));
    seen += QString::fromUtf8(coord->readAllStandardOutput());
    const QString err = QString::fromUtf8(coord->readAllStandardError());
    QCOMPARE(coord->exitStatus(), QProcess::NormalExit);
    QVERIFY2(coord->exitCode() == 130, qPrintable(seen + err));
    QVERIFY2(seen.contains("Cancelled after"), qPrintable(seen + err));
    // After two epochs at least: the steps the chief reported (it said 0: no "final" event).
    const QRegularExpression after("Cancelled after (\\d+) step");
    const auto m = after.match(seen);
    QVERIFY2(m.hasMatch() && m.captured(1).toLongLong() > 0, qPrintable(seen));
    const QJsonArray runs = tstest::recordedRuns(db);
    QCOMPARE(runs.size(), 1);
    QCOMPARE(runs[0].toObject().value("status").toString(), QStringLiteral("cancelled"));
    QVERIFY(runs[0].toObject().value("last_step").toInt() > 0);
    // The daemons stopped their tasks as cancelled and stay up for the next run.
    for (int port : {chief->port, worker->port}) {
        const std::string state = daemonState(port);
        QVERIFY2(state == "cancelled", state.c_str());
    }
}

QTEST_GUILESS_MAIN(TestWorker)
#include "tst_worker.moc"
