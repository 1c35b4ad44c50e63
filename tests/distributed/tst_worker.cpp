// trainstudio-worker and the coordinator (trainstudio-cli train --cluster): the control service
// refuses unauthenticated, oversized and malformed requests; binds loopback unless told; a
// coordinated run on two worker daemons completes and is recorded; pre-flight names an
// unreachable worker; kill -9 of a worker mid-run is reported, naming it, within 10 s.

#include <QtTest>

#include <filesystem>

#include <atomic>
#include <cmath>
#include <mutex>
#include <csignal>
#include <fstream>
#include <set>
#include <thread>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "data/dataset.h"
#include "distributed/local_evaluation.h"
#include "distributed/loopback_listener.h"
#include "distributed/weight_diff.h"
#include "distributed/worker_process.h"
#include "io/safetensors.h"
#include "model/spec.h"
#include "remote/coordinator.h"
#include "remote/task_telemetry.h"
#include "remote/worker_client.h"
#include "telemetry/bus.h"
#include "train/run_config.h"
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

// A cluster of a (never started) chief and an evaluator at `evaluator`.
std::string clusterWithEvaluatorAt(const std::string& evaluator)
{
    return R"({"cluster": {"chief": ["127.0.0.1:1"], "evaluator": [")" + evaluator + R"("]}})";
}

using tstest::WorkerProcess;
using tstest::maxDiff;

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

// Writes `bytes` to `path`; false if it cannot be opened.
bool writeFile(const QString& path, const QByteArray& bytes)
{
    QFile f(path);
    if (!f.open(QIODevice::WriteOnly)) return false;
    return f.write(bytes) == bytes.size();
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
    void tfConfigTaskAtDaemonIsRefused();
    void tokenIsChecked_data();
    void tokenIsChecked();
    void refusesOversizedAndMalformed();
    void bindsLoopbackUnlessAllowed();
    void servesTls();
    void coordinatedRunIsRecorded();
    void daemonsInSeparateNetworkNamespaces();
    void coordinatedRunStartsFromWeights();
    void initialWeightsArriveInParts();
    void multiWorkerEvaluatorEvaluatesSentWeights();
    void taskWithoutStreamIsCancelled();
    void multiWorkerRunWithEvaluator_data();
    void multiWorkerRunWithEvaluator();
    void reservationHoldsTheWorker();
    void crossedCoordinatorsOneWins();
    void taskTelemetryIsPublished();
    void coordinatedRunStreamsTraceAndPipeline();
    void captureOnRemoteWorkers();
    void preflightNamesUnreachableWorker();
    void preflightNamesForeignServer();
    void killedWorkerIsNamed();
    void refusedRunExitsTwo();
    void dataErrorMidRunIsNotRestarted();
    void stoppedDaemonIsNamed();
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

// A TF_CONFIG task whose chief address is a daemon's (the two share one cluster format) hears
// at once that a daemon answers there, instead of waiting out the join; the daemon logs it.
void TestWorker::tfConfigTaskAtDaemonIsRefused()
{
    QTemporaryDir dir;
    auto daemon = spawnWorker(dir.path(), "daemon");
    QVERIFY(daemon->port > 0);
    int workerPort = 0;
    {
        tstest::LoopbackListener free;  // a port nobody uses once it closes
        workerPort = free.port;
    }
    QVERIFY(workerPort > 0);
    const QString tf = dir.filePath("tf.json");
    QFile f(tf);
    QVERIFY(f.open(QIODevice::WriteOnly));
    f.write(QString(R"({"cluster": {"chief": ["127.0.0.1:%1"], "worker": ["127.0.0.1:%2"]}, "task": {"type": "worker", "index": 0}})")
                .arg(daemon->port)
                .arg(workerPort)
                .toUtf8());
    f.close();
    QElapsedTimer timer;
    timer.start();
    auto task = startCoordinator({"train", "--strategy", "multi-worker-mirrored", "--tf-config", tf, "--model", "mlp", "--max-steps", "5",
                                  "--no-record", "--collective-timeout", "60"});
    QVERIFY(task->waitForFinished(30000));
    const QString err = QString::fromUtf8(task->readAllStandardError());
    QCOMPARE(task->exitCode(), 2);
    QVERIFY2(err.contains(QString("a trainstudio-worker daemon answers at rank 0 (chief:0 at 127.0.0.1:%1)'s address").arg(daemon->port)),
             qPrintable(err));
    QVERIFY2(err.contains("train --cluster"), qPrintable(err));
    QVERIFY2(timer.elapsed() < 15000, qPrintable(QString("took %1 ms").arg(timer.elapsed())));
    QVERIFY(daemon->running());
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
    {
        grpc::ClientContext ctx;
        ts::remote::EvaluateRequest req;
        req.set_run_id("r");
        ts::remote::EvaluateReply reply;
        QCOMPARE(stub->Evaluate(&ctx, req, &reply).error_code(), grpc::StatusCode::UNAUTHENTICATED);
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
    // A multi-worker-mirrored run has no ps tasks.
    RunConfig mwm;
    mwm.model = *loadModelFile(std::string(TS_SOURCE_DIR) + "/resources/models/seed_mlp.json");
    mwm.strategy.kind = "multi-worker-mirrored";
    st = start(mwm.toJson().dump(), R"({"cluster": {"worker": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"]}})", "ps", 0);
    QCOMPARE(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    QVERIFY2(st.error_message().find("multi-worker-mirrored does not use ps tasks") != std::string::npos, st.error_message().c_str());
    // A backup folder must stay under the daemon's --backup-root.
    for (const char* dir : {"../elsewhere", "/tmp/abs"}) {
        RunConfig escaping = mwm;
        escaping.backup.dir = dir;
        st = start(escaping.toJson().dump(), cluster);
        QCOMPARE(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
        QVERIFY2(st.error_message().find(std::string("backup.dir '") + dir + "' must be a relative folder name without '..'") != std::string::npos,
                 st.error_message().c_str());
    }
    // Evaluate names what is wrong: no such run here (this daemon runs none).
    {
        grpc::ClientContext ctx;
        withToken(ctx, kToken);
        ts::remote::EvaluateRequest req;
        req.set_run_id("run-1");
        req.set_epoch(1);
        ts::remote::EvaluateReply reply;
        st = stub->Evaluate(&ctx, req, &reply);
        QCOMPARE(st.error_code(), grpc::StatusCode::NOT_FOUND);
        QVERIFY2(st.error_message().find("no run run-1 on this worker") != std::string::npos, st.error_message().c_str());
    }
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

    // The daemon refuses a port file it could not write before it serves anything.
    QTemporaryDir dir;
    for (const auto& [portFile, says] : {std::pair{dir.path(), QString("is a folder")}, std::pair{dir.filePath("none/w.port"), QString("does not exist")}}) {
        QProcess daemon;
        daemon.start(QStringLiteral(TS_WORKER_PATH), {"--listen", "127.0.0.1:0", "--port-file", portFile});
        QVERIFY(daemon.waitForFinished(10000));
        QCOMPARE(daemon.exitCode(), 2);
        const QString err = QString::fromUtf8(daemon.readAllStandardError());
        QVERIFY2(err.contains("--port-file " + portFile) && err.contains(says) && err.contains("hint:"), qPrintable(err));
    }
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
    // A key that is not the certificate's: said so, not "is the port in use?" (gRPC only fails to listen).
    o.tls.privateKey = dir + "other.key";
    auto mismatched = WorkerDaemon::start(o);
    QVERIFY(!mismatched.ok());
    QVERIFY2(mismatched.error().message.find("with the TLS certificate " + dir + "server.crt and key " + dir + "other.key") != std::string::npos,
             mismatched.error().toString().c_str());
    QVERIFY2(mismatched.error().hint.find("must be the private key of --tls-cert") != std::string::npos, mismatched.error().hint.c_str());
    TlsFiles badCa;
    badCa.rootCa = dir;  // a folder
    auto folder = WorkerClient::connect("worker:0 at " + addr, addr, kToken, badCa);
    QVERIFY(!folder.ok());
    QVERIFY2(folder.error().message.find("is a folder, not a TLS CA certificate") != std::string::npos, folder.error().message.c_str());
}

// The chief and worker daemons in their own network namespaces, the coordinator in another,
// joined by a bridge: control, rendezvous and Gloo's pairs cross a link with their own
// addresses, as between machines, and the run still equals one process with the same global batch.
void TestWorker::daemonsInSeparateNetworkNamespaces()
{
    QTemporaryDir dir;
    const QString weights = dir.filePath("remote.safetensors");
    QStringList args = coordinatorArgs("", 200).mid(3);  // after "train --cluster FILE"
    const auto r = tstest::runInNetworkNamespaces(dir.path(), {"chief", "worker"},
                                                  args + QStringList{"--no-record", "--json", "--save-weights", weights}, kToken);
    if (!r.available) QSKIP("no unprivileged user and network namespaces with bridges and veth links here (unshare -rn, iproute2)");
    QVERIFY2(r.rc == 0, qPrintable(r.logs));
    const auto j = nlohmann::json::parse(r.out.split('\n').last().toStdString(), nullptr, false);
    QVERIFY2(!j.is_discarded() && j.value("final", false) && j.value("steps", 0) == 200, qPrintable(r.logs));
    // The coordinator reached each daemon from its own address.
    for (const char* name : {"chief0.log", "worker0.log"}) {
        QFile f(dir.filePath(name));
        QVERIFY(f.open(QIODevice::ReadOnly));
        const QString log = QString::fromUtf8(f.readAll());
        QVERIFY2(log.contains("for ipv4:10.77.0.1:"), qPrintable(log));
    }
    const QString local = dir.filePath("local.safetensors");
    QProcess one;
    one.start(QStringLiteral(TS_CLI_PATH), QStringList{"train"} + args +
                                               QStringList{"--strategy", "mirrored", "--devices", "cpu:0,cpu:1", "--no-record", "--save-weights", local});
    QVERIFY(one.waitForFinished(120000));
    QVERIFY2(one.exitCode() == 0, one.readAllStandardError().constData());
    const double diff = maxDiff(weights, local);
    qInfo("daemons in separate network namespaces vs one process: max |w - w'| = %g", diff);
    QVERIFY2(diff < 1e-5, qPrintable(QString("coordinated vs one process: %1").arg(diff)));
}

void TestWorker::coordinatedRunIsRecorded()
{
    QTemporaryDir dir;
    std::unique_ptr<WorkerProcess> chief, worker;
    const QString cluster = startDaemonPair(dir.path(), chief, worker);
    QVERIFY(!cluster.isEmpty());
    const QString db = dir.filePath("runs.db");
    // 300 steps (~0.5 s): long enough for the workers' 10 Hz device samplers to report.
    const QString weights = dir.filePath("remote.safetensors");
    auto coord = startCoordinator(coordinatorArgs(cluster, 300) + QStringList{"--db", db, "--json", "--save-weights", weights});
    QVERIFY(coord->waitForFinished(120000));
    // --json's lines are on stdout (the last is the summary); warnings go to stderr.
    const QString out = QString::fromUtf8(coord->readAllStandardOutput());
    QVERIFY2(coord->exitCode() == 0, qPrintable(out + QString::fromUtf8(coord->readAllStandardError())));
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

    // The chief sent its weights back: --save-weights has them, the run lists them, and they are
    // one process's with the same global batch (two replicas as threads).
    auto kept = store->checkpoints(runId.toStdString());
    QVERIFY(kept.ok());
    QCOMPARE(kept->size(), std::size_t(1));
    QCOMPARE(kept->front().kind, std::string("final"));
    // The store keeps its own copy of the --save-weights file.
    QVERIFY2(kept->front().path.ends_with("/final.safetensors") &&
                 std::filesystem::file_size(kept->front().path) == std::filesystem::file_size(weights.toStdString()),
             kept->front().path.c_str());
    QCOMPARE(kept->front().step, int64_t(300));
    const QString local = dir.filePath("local.safetensors");
    QProcess one;
    QStringList oneArgs = coordinatorArgs(cluster, 300);
    oneArgs.remove(1, 2);  // --cluster FILE
    one.start(QStringLiteral(TS_CLI_PATH), oneArgs + QStringList{"--strategy", "mirrored", "--devices", "cpu:0,cpu:1", "--no-record", "--save-weights", local});
    QVERIFY(one.waitForFinished(120000));
    QVERIFY2(one.exitCode() == 0, one.readAllStandardError().constData());
    const double diff = maxDiff(weights, local);
    QVERIFY2(diff < 1e-5, qPrintable(QString("coordinated vs one process: %1").arg(diff)));

    // Without --save-weights the run keeps them in its folder, as a local run does (the studio's way).
    auto again = startCoordinator(coordinatorArgs(cluster, 20) + QStringList{"--db", db, "--json"});
    QVERIFY(again->waitForFinished(120000));
    QVERIFY2(again->exitCode() == 0, again->readAllStandardError().constData());
    const auto j2 = nlohmann::json::parse(QString::fromUtf8(again->readAllStandardOutput()).trimmed().split('\n').last().toStdString(), nullptr, false);
    QVERIFY(!j2.is_discarded() && j2.contains("run_id"));
    auto keptAgain = store->checkpoints(j2["run_id"].get<std::string>());
    QVERIFY(keptAgain.ok() && keptAgain->size() == 1);
    QVERIFY2(keptAgain->front().path.find("final.safetensors") != std::string::npos, keptAgain->front().path.c_str());
    auto file = readSafetensors(keptAgain->front().path);
    QVERIFY2(file.ok(), file.ok() ? "" : file.error().toString().c_str());
    QCOMPARE(file->metadata["step"], std::string("20"));
    QCOMPARE(file->metadata["model"], std::string("seed_mlp"));
}

// --load-weights with --cluster: the coordinator reads the file and every task starts from it,
// so 20 more steps on two daemons equal one process with two replicas from the same file; a file
// that is not weights, weights of another model and a parameter-server run are refused.
void TestWorker::coordinatedRunStartsFromWeights()
{
    QTemporaryDir dir;
    std::unique_ptr<WorkerProcess> chief, worker;
    const QString cluster = startDaemonPair(dir.path(), chief, worker);
    QVERIFY(!cluster.isEmpty());
    const QString start = dir.filePath("start.safetensors"), remote = dir.filePath("remote.safetensors"), local = dir.filePath("local.safetensors");
    auto run = [](const QStringList& args) {
        auto p = startCoordinator(args);
        p->waitForFinished(120000);
        return std::pair{p->exitCode(), QString::fromUtf8(p->readAllStandardOutput() + p->readAllStandardError())};
    };
    QStringList localArgs = coordinatorArgs(cluster, 20);
    localArgs.remove(1, 2);  // --cluster FILE
    auto [c0, o0] = run(localArgs + QStringList{"--strategy", "one-device", "--no-record", "--save-weights", start});
    QVERIFY2(c0 == 0, qPrintable(o0));
    auto [c1, o1] = run(coordinatorArgs(cluster, 20) + QStringList{"--no-record", "--load-weights", start, "--save-weights", remote});
    QVERIFY2(c1 == 0, qPrintable(o1));
    auto [c2, o2] = run(localArgs + QStringList{"--strategy", "mirrored", "--devices", "cpu:0,cpu:1", "--no-record", "--load-weights", start,
                                                "--save-weights", local});
    QVERIFY2(c2 == 0, qPrintable(o2));
    const double diff = maxDiff(remote, local);
    QVERIFY2(diff < 1e-5, qPrintable(QString("from the same weights, coordinated vs one process: %1").arg(diff)));
    QVERIFY(maxDiff(remote, start) > 1e-3);  // and they trained

    auto [c3, o3] = run(coordinatorArgs(cluster, 20) + QStringList{"--no-record", "--load-weights", cluster});
    QVERIFY2(c3 == 2 && o3.contains(cluster) && o3.contains("not a safetensors file"), qPrintable(o3));
    const QString cnn = dir.filePath("cnn.safetensors");
    auto [c4, o4] = run(QStringList{"train", "--model", "cnn", "--max-steps", "1", "--limit", "256", "--no-validation", "--no-record", "--save-weights", cnn});
    QVERIFY2(c4 == 0, qPrintable(o4));
    auto [c5, o5] = run(coordinatorArgs(cluster, 20) + QStringList{"--no-record", "--load-weights", cnn});
    QVERIFY2(c5 != 0 && o5.contains("chief:0") && o5.contains("the model expects (784, 256)"), qPrintable(o5));
    // Weights beyond the daemons' message limit (4 MiB): the limit and the flag are named.
    auto model = nlohmann::json::parse(std::ifstream(std::string(TS_SOURCE_DIR) + "/resources/models/seed_mlp.json"));
    for (auto& layer : model["layers"])
        if (layer["attrs"].value("units", 0) == 256) layer["attrs"]["units"] = 2048;
    const QString bigModel = dir.filePath("big.json"), big = dir.filePath("big.safetensors");
    std::ofstream(bigModel.toStdString()) << model.dump();
    auto [c7, o7] = run(QStringList{"train", "--model", bigModel, "--max-steps", "1", "--limit", "256", "--no-validation", "--no-record", "--save-weights", big});
    QVERIFY2(c7 == 0, qPrintable(o7));
    QStringList bigArgs = coordinatorArgs(cluster, 1);
    bigArgs[bigArgs.indexOf("mlp")] = bigModel;
    // 6.5 MB of weights, over the daemons' 4 MiB message limit: they travel in parts, and the run
    // starts from them (one step on 2 daemons equals one process's from the same file).
    const QString bigRemote = dir.filePath("big-remote.safetensors"), bigLocal = dir.filePath("big-local.safetensors");
    auto [c8, o8] = run(bigArgs + QStringList{"--no-record", "--load-weights", big, "--save-weights", bigRemote});
    QVERIFY2(c8 == 0, qPrintable(o8));
    QStringList bigLocalArgs = bigArgs;
    bigLocalArgs.remove(1, 2);
    auto [c11, o11] = run(bigLocalArgs + QStringList{"--strategy", "mirrored", "--devices", "cpu:0,cpu:1", "--no-record", "--load-weights", big,
                                                     "--save-weights", bigLocal});
    QVERIFY2(c11 == 0, qPrintable(o11));
    const double bigDiff = maxDiff(bigRemote, bigLocal);
    QVERIFY2(bigDiff < 1e-5, qPrintable(QString("6.5 MB from the same file, coordinated vs one process: %1").arg(bigDiff)));

    const QString psCluster = dir.filePath("ps.json");
    QFile psFile(psCluster);
    QVERIFY(psFile.open(QIODevice::WriteOnly));
    psFile.write(QString(R"({"cluster": {"worker": ["127.0.0.1:%1"], "ps": ["127.0.0.1:%2"]}})").arg(chief->port).arg(worker->port).toUtf8());
    psFile.close();
    // A parameter-server run starts from them too: worker 0 imports them and they become the ps
    // task's initial values. One step of one worker is one optimizer step from the file, as in
    // one process (later steps are asynchronous, so only the first is exact).
    const QString psOut = dir.filePath("ps.safetensors"), oneStep = dir.filePath("one-step.safetensors");
    auto [c6, o6] = run(coordinatorArgs(psCluster, 1) + QStringList{"--no-record", "--strategy", "parameter-server", "--load-weights", start,
                                                                     "--save-weights", psOut});
    QVERIFY2(c6 == 0, qPrintable(o6));
    QStringList oneArgs = coordinatorArgs(psCluster, 1);
    oneArgs.remove(1, 2);
    auto [c9, o9] = run(oneArgs + QStringList{"--strategy", "one-device", "--no-record", "--load-weights", start, "--save-weights", oneStep});
    QVERIFY2(c9 == 0, qPrintable(o9));
    const double psDiff = maxDiff(psOut, oneStep);
    QVERIFY2(psDiff < 1e-5, qPrintable(QString("one parameter-server step from the file vs one process: %1").arg(psDiff)));
    QVERIFY(maxDiff(psOut, start) > 1e-4);  // it did take the step
    auto [c10, o10] = run(coordinatorArgs(psCluster, 1) + QStringList{"--no-record", "--strategy", "parameter-server", "--load-weights", cnn});
    QVERIFY2(c10 != 0 && o10.contains("worker:0") && o10.contains("the model expects (784, 256)"), qPrintable(o10));
}

// SendWeights: a file larger than the daemon's message limit arrives in parts and is checked on
// arrival; one over --max-weights-bytes, a cut one, and a StartTask claiming weights that were
// never sent (or were dropped by a Cancel) are refused, naming the file and the flag.
void TestWorker::initialWeightsArriveInParts()
{
    WorkerOptions o;
    o.token = kToken;
    o.maxMessageBytes = 1 << 20;
    o.maxWeightsBytes = 3 << 20;
    auto daemon = WorkerDaemon::start(o);
    QVERIFY(daemon.ok());
    auto client = WorkerClient::connect("worker:0 at here", "127.0.0.1:" + std::to_string((*daemon)->port()), kToken);
    QVERIFY(client.ok());
    WorkerClient& c = **client;
    // 2.4 MB: over the 1 MiB message limit, so only parts get through.
    std::vector<std::pair<std::string, Tensor>> tensors{{"w", Tensor::fromVector(Shape({600000}), std::vector<float>(600000, 0.5f))}};
    auto bytes = encodeSafetensors(tensors, {}, "w.safetensors");
    QVERIFY(bytes.ok());
    Status sent = c.sendWeights("r1", "w.safetensors", *bytes);
    QVERIFY2(sent.ok(), sent.ok() ? "" : sent.error().toString().c_str());
    Status big = c.sendWeights("r1", "big.safetensors", std::string(4 << 20, 'x'));
    QVERIFY(!big.ok());
    QVERIFY2(big.error().message.find("big.safetensors is 4194304 bytes, more than this worker holds (--max-weights-bytes 3145728)") != std::string::npos,
             big.error().message.c_str());
    QVERIFY2(big.error().hint.find("--max-weights-bytes") != std::string::npos, big.error().hint.c_str());
    Status cut = c.sendWeights("r1", "cut.safetensors", bytes->substr(0, bytes->size() - 100));
    QVERIFY(!cut.ok());
    QVERIFY2(cut.error().message.find("refused the initial weights") != std::string::npos &&
                 cut.error().message.find("'cut.safetensors'") != std::string::npos && cut.error().message.find("truncated") != std::string::npos,
             cut.error().message.c_str());
    // A StartTask that says the weights were sent, when none are kept for its run.
    RunConfig cfg;
    cfg.model = *loadModelFile(std::string(TS_SOURCE_DIR) + "/resources/models/seed_mlp.json");
    cfg.strategy.kind = "multi-worker-mirrored";
    const std::string cluster = R"({"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": 0}})";
    StartTaskOptions start;
    start.initialWeightsSent = true;
    start.initialWeightsName = "w.safetensors";
    QVERIFY(c.sendWeights("r1", "w.safetensors", *bytes).ok());
    (void)c.cancel("r1");  // the run's weights are dropped with it
    Status st = c.startTask("r1", cfg.toJson(), cluster, "worker", 0, start);
    QVERIFY(!st.ok());
    QVERIFY2(st.error().message.find("no initial weights were sent for this run") != std::string::npos, st.error().message.c_str());
    QVERIFY(c.sendWeights("r1", "w.safetensors", *bytes).ok());
    st = c.startTask("r2", cfg.toJson(), cluster, "worker", 0, start);  // another run's weights
    QVERIFY(!st.ok());
    QVERIFY2(st.error().message.find("no initial weights were sent for this run") != std::string::npos, st.error().message.c_str());
    // Only a parameter-server worker joins a run in progress.
    StartTaskOptions join;
    join.joinRunning = true;
    st = c.startTask("r3", cfg.toJson(), cluster, "worker", 0, join);
    QVERIFY(!st.ok());
    QVERIFY2(st.error().message.find("only a parameter-server worker joins a run in progress") != std::string::npos, st.error().message.c_str());
}

// A coordinator that dies between StartTask and opening the task's event stream leaves a task
// nobody watches: a serving one (an evaluator, a ps task) would wait for it forever. It is
// cancelled as when its stream breaks ("left"), and the worker is free again.
void TestWorker::taskWithoutStreamIsCancelled()
{
    std::mutex mutex;
    std::vector<std::string> states;
    WorkerOptions o;
    o.token = kToken;
    o.firstStreamSeconds = 1;
    o.onTaskState = [&](const std::string& state, const std::string&, const std::string&) {
        std::lock_guard lock(mutex);
        states.push_back(state);
    };
    auto started = WorkerDaemon::start(o);
    QVERIFY2(started.ok(), started.ok() ? "" : started.error().toString().c_str());
    auto daemon = std::move(started).value();
    const std::string here = "127.0.0.1:" + std::to_string(daemon->port());
    auto client = WorkerClient::connect("evaluator:0 at " + here, here, kToken);
    QVERIFY(client.ok());
    const RunConfig cfg = tstest::mirroredSeedMlpRun(500);
    const std::string cluster = clusterWithEvaluatorAt(here);
    Status st = (*client)->startTask("n1", cfg.toJson(), cluster, "evaluator", 0);
    QVERIFY2(st.ok(), st.ok() ? "" : st.error().toString().c_str());
    QCOMPARE(daemonState(daemon->port()), std::string("running"));
    QTRY_VERIFY_WITH_TIMEOUT(daemonState(daemon->port()) != "running", 15000);
    const auto last = [&] {
        std::lock_guard lock(mutex);
        return states.empty() ? std::string("no state") : states.back();
    };
    QTRY_COMPARE(last(), std::string("left"));  // said after the state changed
    // Free for the next run, whose stream is opened: that one is not cancelled.
    st = (*client)->startTask("n2", cfg.toJson(), cluster, "evaluator", 0);
    QVERIFY2(st.ok(), st.ok() ? "" : st.error().toString().c_str());
    std::thread reader([&] { (void)(*client)->streamEvents("n2", [](const WorkerEvent&) {}); });
    QTest::qWait(2500);
    QCOMPARE(daemonState(daemon->port()), std::string("running"));
    QVERIFY((*client)->cancel("n2", "done").ok());
    reader.join();
    QTRY_COMPARE(last(), std::string("completed"));
}

// A multi-worker-mirrored run's evaluator task evaluates the weights sent to it (the chief's after
// an epoch, which the coordinator forwards) and nothing else: it has no ps tasks to pull from.
void TestWorker::multiWorkerEvaluatorEvaluatesSentWeights()
{
    auto daemon = startDaemon();
    const std::string here = "127.0.0.1:" + std::to_string(daemon->port());
    auto client = WorkerClient::connect("evaluator:0 at " + here, here, kToken);
    QVERIFY(client.ok());
    WorkerClient& c = **client;
    const RunConfig cfg = tstest::mirroredSeedMlpRun(2000);
    const std::string cluster = clusterWithEvaluatorAt(here);
    // Only the chief sends its weights after each epoch.
    StartTaskOptions sends;
    sends.sendEpochWeights = true;
    Status st = c.startTask("e1", cfg.toJson(), cluster, "evaluator", 0, sends);
    QVERIFY(!st.ok());
    QVERIFY2(st.error().message.find("only the chief of a multi-worker-mirrored run sends its weights after each epoch") != std::string::npos,
             st.error().message.c_str());
    st = c.startTask("e1", cfg.toJson(), cluster, "evaluator", 0);
    QVERIFY2(st.ok(), st.ok() ? "" : st.error().toString().c_str());
    std::mutex mutex;
    std::vector<WorkerEvent> events;
    std::thread reader([&] {
        (void)c.streamEvents("e1", [&](const WorkerEvent& e) {
            std::lock_guard lock(mutex);
            events.push_back(e);
        });
    });
    // Nothing to pull, and no weights sent yet.
    st = c.requestEvaluation("e1", 1, 1);
    QVERIFY(!st.ok());
    QVERIFY2(st.error().message.find("it has no ps tasks to pull from") != std::string::npos, st.error().message.c_str());
    st = c.requestEvaluation("e1", 1, 2, true);
    QVERIFY(!st.ok());
    QVERIFY2(st.error().message.find("no weights were sent for run e1") != std::string::npos, st.error().message.c_str());
    // A model's initial weights: its evaluation equals a local one of the same weights.
    auto local = tstest::seedMlpTrainer();
    QVERIFY(local.ok());
    QVERIFY((*local)->strategy().initialise(7).ok());
    auto params = (*local)->strategy().exportParameters();
    QVERIFY(params.ok());
    auto bytes = encodeSafetensors(*params, {}, "epoch 1");
    QVERIFY(bytes.ok());
    st = c.sendWeights("e1", "the chief's weights after epoch 1", *bytes, false);  // beside a running evaluator task of its run
    QVERIFY2(st.ok(), st.ok() ? "" : st.error().toString().c_str());
    QVERIFY(c.requestEvaluation("e1", 1, 3, true).ok());
    st = c.requestEvaluation("e1", 2, 4, true);  // taken by the one before
    QVERIFY(!st.ok());
    QVERIFY2(st.error().message.find("no weights were sent for run e1") != std::string::npos, st.error().message.c_str());
    nlohmann::json result;
    QTRY_VERIFY_WITH_TIMEOUT(([&] {
                                 std::lock_guard lock(mutex);
                                 for (const auto& e : events)
                                     if (e.kind == "evaluation") result = e.fields;
                                 return !result.is_null();
                             }()),
                             30000);
    QCOMPARE(result.value("seq", int64_t{0}), int64_t(3));
    QVERIFY2(!result.contains("error"), result.dump().c_str());
    QCOMPARE(result.value("examples", int64_t{0}), int64_t(2000));
    auto expected = tstest::evaluateOnTestSplit(**local, 2000);
    QVERIFY(expected.ok());
    QVERIFY2(std::abs(expected->accuracy - result.value("val_accuracy", -1.0)) < 1e-9 && std::abs(expected->loss - result.value("val_loss", -1.0)) < 1e-6,
             qPrintable(QString("%1 %2 against %3").arg(expected->accuracy).arg(expected->loss).arg(QString::fromStdString(result.dump()))));
    QVERIFY(c.cancel("e1", "done").ok());
    reader.join();
}

// A multi-worker-mirrored run on daemons with an evaluator task (TF's side-car evaluator): the
// chief and the worker do not validate; after each epoch the chief's weights go, through the
// coordinator, to the evaluator, which evaluates them on its machine. Killed as soon as its task
// started (before the training tasks' first epoch), the coordinator evaluates every epoch itself.
void TestWorker::multiWorkerRunWithEvaluator_data()
{
    QTest::addColumn<bool>("killEvaluator");
    QTest::newRow("evaluates every epoch") << false;
    QTest::newRow("killed at its start") << true;
}

void TestWorker::multiWorkerRunWithEvaluator()
{
    QFETCH(bool, killEvaluator);
    QTemporaryDir dir;
    std::unique_ptr<WorkerProcess> chief, worker;
    QString cluster = startDaemonPair(dir.path(), chief, worker);
    QVERIFY(!cluster.isEmpty());
    auto evaluator = tstest::spawnWorker(dir.path(), "evaluator0", kToken);
    QVERIFY(evaluator->port > 0);
    {
        QFile f(cluster);
        QVERIFY(f.open(QIODevice::WriteOnly));
        f.write(QString(R"({"cluster": {"chief": ["127.0.0.1:%1"], "worker": ["127.0.0.1:%2"], "evaluator": ["127.0.0.1:%3"]}})")
                    .arg(chief->port).arg(worker->port).arg(evaluator->port).toUtf8());
    }
    constexpr int epochs = 3;
    const QString weights = dir.filePath("final.safetensors");
    QProcess coord;
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    env.insert("TRAINSTUDIO_TOKEN", QString::fromStdString(kToken));
    env.remove("TF_CONFIG");
    coord.setProcessEnvironment(env);
    coord.start(QStringLiteral(TS_CLI_PATH), {"train", "--cluster", cluster, "--strategy", "multi-worker-mirrored", "--model", "mlp", "--epochs",
                                              QString::number(epochs), "--limit", "12800", "--threads", "1", "--no-record", "--json",
                                              "--save-weights", weights});
    QString out;
    if (killEvaluator) {
        // Started first: once the chief runs, the coordinator has the evaluator's task (its
        // StartTask returned), and the chief has not yet joined the worker, let alone ended an epoch.
        QElapsedTimer wait;
        wait.start();
        while (daemonState(chief->port) != "running" && wait.elapsed() < 30000) QTest::qWait(2);
        QVERIFY2(daemonState(chief->port) == "running", "the chief's task did not start within 30 s");
        ::kill(static_cast<pid_t>(evaluator->process->processId()), SIGKILL);
    }
    QVERIFY(coord.waitForFinished(120000));
    out += QString::fromUtf8(coord.readAllStandardOutput());
    const QString err = QString::fromUtf8(coord.readAllStandardError());
    QVERIFY2(coord.exitCode() == 0, qPrintable(out + err));
    const auto lines = out.trimmed().split('\n');
    const auto j = nlohmann::json::parse(lines.last().toStdString(), nullptr, false);
    QVERIFY2(!j.is_discarded() && j.value("final", false), qPrintable(out));
    int evaluated = 0;
    for (const QString& line : lines) {
        const auto e = nlohmann::json::parse(line.toStdString(), nullptr, false);
        if (!e.is_discarded() && e.is_object() && e.contains("epoch") && e.contains("val_accuracy") && !e.value("final", false)) ++evaluated;
    }
    QCOMPARE(evaluated, epochs);
    QVERIFY2(j.contains("tasks"), qPrintable(out));
    const auto& tasks = j["tasks"];
    if (!killEvaluator) {
        QCOMPARE(tasks["evaluation"].value("by", ""), std::string("evaluator:0"));
        QCOMPARE(tasks["evaluator:0"].value("evaluations", int64_t{0}), int64_t(epochs));
        QVERIFY2(!err.contains("evaluator"), qPrintable(err));
    } else {
        QCOMPARE(tasks["evaluation"].value("by", ""), std::string("coordinator"));
        QCOMPARE(tasks["evaluator_lost"].value("task", ""), std::string("evaluator:0"));
        QCOMPARE(tasks["evaluator_lost"].value("epoch", int64_t{0}), int64_t(1));
        QVERIFY2(err.contains("the coordinator evaluates the run from now on"), qPrintable(err));
    }
    // The last epoch's evaluation is of the final weights.
    auto local = tstest::evaluateWeightsFile(weights.toStdString());
    QVERIFY2(local.ok(), local.ok() ? "" : local.error().toString().c_str());
    QVERIFY2(std::abs(local->accuracy - j.value("val_accuracy", -1.0)) < 1e-9, qPrintable(QString("%1 against %2").arg(local->accuracy).arg(j.value("val_accuracy", -1.0))));
}

// --restarts with daemons: the worker daemon is killed with SIGKILL mid-run and started again on
// its port (as systemd would); the coordinator waits for it, starts the run again, the tasks
// resume from the chief daemon's backup (under its --backup-root), and the run ends exactly as
// an uninterrupted one: same steps, same last-epoch loss and accuracy (bit-equal sums).
// Reserve holds an idle worker for one run: others are refused with the run and who holds it,
// until that run starts, cancels the reservation, or lets it lapse.
void TestWorker::reservationHoldsTheWorker()
{
    auto daemon = startDaemon();
    auto client = WorkerClient::connect("worker:0 at here", "127.0.0.1:" + std::to_string(daemon->port()), kToken);
    QVERIFY(client.ok());
    WorkerClient& c = **client;
    // The heartbeat carries the daemon's clock: the same machine's, so the estimate is within
    // its error and nothing is applied.
    auto pulse = c.heartbeat(std::chrono::seconds(5));
    QVERIFY(pulse.ok());
    QVERIFY(pulse->roundTripUs > 0);
    QVERIFY2(std::llabs(pulse->clockOffsetUs) <= pulse->roundTripUs, qPrintable(QString::number(pulse->clockOffsetUs)));
    QCOMPARE(significantClockOffset(pulse->clockOffsetUs, pulse->roundTripUs), int64_t(0));
    QVERIFY(c.reserve("r1", "coordinator A", 30).ok());
    QVERIFY(c.reserve("r1", "coordinator A", 30).ok());  // the same run again: refreshed
    auto who = c.identify(std::chrono::seconds(5));
    QVERIFY(who.ok());
    QVERIFY(who->reserved);
    QCOMPARE(who->runId, std::string("r1"));
    QCOMPARE(who->coordinator, std::string("coordinator A"));
    Status taken = c.reserve("r2", "coordinator B", 30);
    QVERIFY(!taken.ok());
    QVERIFY2(taken.error().message.find("worker:0 at here is busy: this worker is reserved for run r1 by coordinator A") == 0,
             taken.error().message.c_str());
    QVERIFY2(taken.error().hint.find("another coordinator uses this worker") != std::string::npos, taken.error().hint.c_str());
    // Released by its run's cancel: free at once.
    QVERIFY(c.cancel("r1", "failed").ok());
    who = c.identify(std::chrono::seconds(5));
    QVERIFY(who.ok() && !who->reserved && who->state == "idle");
    QVERIFY(c.reserve("r2", "coordinator B", 1).ok());
    QVERIFY(!c.reserve("r3", "coordinator C", 30).ok());
    QTest::qWait(1300);  // r2's reservation lapses without a StartTask
    QVERIFY(c.reserve("r3", "coordinator C", 30).ok());
    for (int bad : {0, 61}) QVERIFY(!c.reserve("r4", "x", bad).ok());
    // A capture for a run this worker does not have is refused, naming it.
    auto capture = c.captureTrace("r9", 5, false);
    QVERIFY(!capture.ok());
    QVERIFY2(capture.error().message.find("no run r9 on this worker") != std::string::npos, capture.error().message.c_str());
}

// Two coordinators started at once on the same two workers, with the chief and worker roles
// crossed: one gets both workers and trains, the other is refused naming the run that holds
// them (each could take one worker and wait for the other's, and both failed).
void TestWorker::crossedCoordinatorsOneWins()
{
    QTemporaryDir dir;
    std::unique_ptr<WorkerProcess> a, b;
    QVERIFY(!startDaemonPair(dir.path(), a, b).isEmpty());
    auto clusterFile = [&](const QString& name, int chief, int worker) {
        const QString path = dir.filePath(name);
        QFile f(path);
        f.open(QIODevice::WriteOnly);
        f.write(QString(R"({"cluster": {"chief": ["127.0.0.1:%1"], "worker": ["127.0.0.1:%2"]}})").arg(chief).arg(worker).toUtf8());
        return path;
    };
    const QString ab = clusterFile("ab.json", a->port, b->port), ba = clusterFile("ba.json", b->port, a->port);
    for (int round = 0; round < 2; ++round) {
        auto first = startCoordinator(coordinatorArgs(ab, 1500) + QStringList{"--no-record"});
        auto second = startCoordinator(coordinatorArgs(ba, 1500) + QStringList{"--no-record"});
        QVERIFY(first->waitForFinished(120000) && second->waitForFinished(120000));
        const QString outFirst = QString::fromUtf8(first->readAllStandardOutput() + first->readAllStandardError());
        const QString outSecond = QString::fromUtf8(second->readAllStandardOutput() + second->readAllStandardError());
        const int won = (first->exitCode() == 0) + (second->exitCode() == 0);
        QVERIFY2(won == 1, qPrintable(QString("round %1: %2 of 2 trained\n%3\n---\n%4").arg(round).arg(won).arg(outFirst, outSecond)));
        const QString loser = first->exitCode() == 0 ? outSecond : outFirst;
        for (const QString& line : loser.split(QLatin1Char('\n')))
            if (line.startsWith("error:")) qInfo("round %d: %s", round, qPrintable(line));
        QVERIFY2(loser.contains(" is busy") || loser.contains(" is reserved"), qPrintable(loser));
        QVERIFY2(loser.contains("for trainstudio-cli on") || loser.contains("by trainstudio-cli on"), qPrintable(loser));
        QVERIFY2(loser.contains("hint:"), qPrintable(loser));
        // Both workers are free for the next round.
        for (int port : {a->port, b->port}) {
            QElapsedTimer t;
            t.start();
            while (daemonState(port) == "running" && t.elapsed() < 10000) QTest::qWait(100);
        }
    }
}

// What a task streams besides its metrics lands on the coordinator's bus on its lane; a ps shard
// busy >= 80% for 5 intervals in a row gives one "ps-bound" finding per streak.
void TestWorker::taskTelemetryIsPublished()
{
    telemetry::EventBus bus;
    auto sub = bus.subscribe();
    PsLoad load;
    auto event = [](const std::string& worker, const std::string& kind, int64_t step, double wall, nlohmann::json fields) {
        WorkerEvent e;
        e.worker = worker;
        e.kind = kind;
        e.step = step;
        e.wallTime = wall;
        e.fields = std::move(fields);
        return e;
    };
    // 12 one-second intervals: busy 0.9 s of each for 6, then 0.1 s for 2, then 0.9 s for 4.
    double busy = 0;
    int findingsSeen = 0;
    for (int t = 0; t <= 12; ++t) {
        if (t > 0) busy += t <= 6 || t > 8 ? 0.9 : 0.1;
        QVERIFY(publishTaskTelemetry("r", event("ps:0", "ps", 100 * t, 1000.0 + t,
                                                {{"busy_seconds", busy}, {"updates", 400 * t}, {"pulls", 410 * t},
                                                 {"bytes_in", 1000000 * t}, {"bytes_out", 2000000 * t}}),
                                     false, bus, load));
    }
    std::map<std::string, std::vector<double>> tracks;
    for (const auto& ev : sub->drain()) {
        if (const auto* c = std::get_if<telemetry::SpanEvent>(&ev)) {
            QCOMPARE(c->category, std::string("counter"));
            QCOMPARE(c->stamp.lane.worker, std::string("ps:0"));
            tracks[c->name].push_back(std::stod(c->args.at("value")));
        } else if (const auto* f = std::get_if<telemetry::FindingEvent>(&ev)) {
            ++findingsSeen;
            QCOMPARE(f->kind, std::string("ps-bound"));
            QVERIFY2(f->message.find("ps:0 was busy 90%") == 0, f->message.c_str());
            QCOMPARE(f->firstStep, int64_t(100));  // the streak's first interval ended at step 100
            QCOMPARE(f->lastStep, int64_t(500));   // said after 5 intervals, once
        }
    }
    QCOMPARE(findingsSeen, 1);  // the second streak lasted 4 intervals only
    QCOMPARE(tracks["ps busy %"].size(), std::size_t(12));  // none before the first interval
    QCOMPARE(qRound(tracks["ps busy %"][0]), 90);
    QCOMPARE(qRound(tracks["ps busy %"][7]), 10);
    QCOMPARE(qRound(tracks["ps updates/s"][3]), 400);
    QCOMPARE(qRound(tracks["ps MB/s out"][3]), 2);

    // Spans keep their device and thread and take the task's lane; a resume rewinds the run only
    // from the primary task; a malformed batch is skipped.
    QVERIFY(publishTaskTelemetry("r", event("worker:1", "spans", 7, 1.0,
                                            {{"spans", {{{"name", "forward"}, {"category", "forward"}, {"device", "cpu:0"},
                                                         {"thread", "replica 0"}, {"step", 7}, {"start_us", 5}, {"duration_us", 9},
                                                         {"args", {{"k", "v"}}}},
                                                        "not a span"}}}),
                                 false, bus, load));
    QVERIFY(publishTaskTelemetry("r", event("worker:1", "spans", 7, 1.0, {{"spans", 3}}), false, bus, load));
    QVERIFY(publishTaskTelemetry("r", event("worker:1", "resumed", 40, 1.0, {{"after_step", 30}}), false, bus, load));
    QVERIFY(publishTaskTelemetry("r", event("chief:0", "resumed", 40, 1.0, {{"after_step", 30}}), true, bus, load));
    QVERIFY(publishTaskTelemetry("r", event("worker:1", "log", 3, 1.0, {{"level", 2}, {"message", "slow input"}}), false, bus, load));
    QVERIFY(!publishTaskTelemetry("r", event("worker:1", "step", 3, 1.0, {}), false, bus, load));
    int spans = 0, resumes = 0, logs = 0;
    for (const auto& ev : sub->drain()) {
        if (const auto* sp = std::get_if<telemetry::SpanEvent>(&ev)) {
            ++spans;
            QCOMPARE(sp->stamp.lane, (telemetry::Lane{"worker:1", "cpu:0", "replica 0"}));
            QCOMPARE(sp->stamp.step, int64_t(7));
            QCOMPARE(sp->durationUs, int64_t(9));
            QCOMPARE(sp->args.at("k"), std::string("v"));
        } else if (const auto* r = std::get_if<telemetry::RunStateEvent>(&ev)) {
            ++resumes;
            QCOMPARE(r->stamp.lane.worker, std::string("chief:0"));
            QCOMPARE(r->resumedAfterStep, int64_t(30));
        } else if (const auto* l = std::get_if<telemetry::LogEvent>(&ev)) {
            ++logs;
            QCOMPARE(l->level, telemetry::LogLevel::Warning);
            QCOMPARE(l->message, std::string("worker:1: slow input"));
        }
    }
    QCOMPARE(spans, 1);
    QCOMPARE(resumes, 1);
    QCOMPARE(logs, 1);

    // A task whose clock runs 5 ms ahead: its spans move onto this machine's clock.
    QVERIFY(publishTaskTelemetry("r", event("worker:1", "spans", 8, 1.0,
                                            {{"spans", {{{"name", "forward"}, {"step", 8}, {"start_us", 10000}, {"wall_us", 10000},
                                                         {"duration_us", 9}}}}}),
                                 false, bus, load, 5000));
    auto shifted = sub->drain();
    QCOMPARE(shifted.size(), std::size_t(1));
    QCOMPARE(std::get<telemetry::SpanEvent>(shifted[0]).startUs, int64_t(5000));
    QCOMPARE(std::get<telemetry::SpanEvent>(shifted[0]).stamp.wallTimeUs, int64_t(5000));
    // Offsets within the estimate's error (half the round trip, at least 1 ms) are not applied.
    QCOMPARE(significantClockOffset(400, 300), int64_t(0));
    QCOMPARE(significantClockOffset(-900, 200), int64_t(0));
    QCOMPARE(significantClockOffset(-5000, 800), int64_t(-5000));
    QCOMPARE(significantClockOffset(3000, 4000), int64_t(0));
}

// `train --cluster --trace FILE` with a "pipeline" section: every task's spans reach the file and
// the store on its own lanes, and every task's input stages are recorded (a coordinated run
// recorded neither, and --trace wrote nothing).
void TestWorker::coordinatedRunStreamsTraceAndPipeline()
{
    const std::string data = defaultFashionMnistDir();
    if (!QFileInfo::exists(QString::fromStdString(data) + "/train-images-idx3-ubyte") &&
        !QFileInfo::exists(QString::fromStdString(data) + "/train-images-idx3-ubyte.gz"))
        QSKIP("Fashion-MNIST not installed (Debian package dataset-fashion-mnist)");
    QTemporaryDir dir;
    std::unique_ptr<WorkerProcess> chief, worker;
    const QString cluster = startDaemonPair(dir.path(), chief, worker);
    QVERIFY(!cluster.isEmpty());
    const QString config = dir.filePath("run.json");
    QFile f(config);
    QVERIFY(f.open(QIODevice::WriteOnly));
    f.write(QString(R"({"model_file": "%1", "epochs": 2, "batch_size": 64,
        "pipeline": {"source": {"kind": "idx", "dir": "%2"}, "window_steps": 5,
          "transformations": [{"op": "take", "count": 3200}, {"op": "map", "fn": "normalise"}, {"op": "prefetch", "buffer_size": 2}]}})")
                .arg(QStringLiteral(TS_SOURCE_DIR "/resources/models/seed_mlp.json"), QString::fromStdString(data))
                .toUtf8());
    f.close();
    const QString db = dir.filePath("runs.db"), trace = dir.filePath("trace.json");
    auto coord = startCoordinator({"train", "--cluster", cluster, "--config", config, "--threads", "1", "--no-validation", "--db", db, "--json",
                               "--trace", trace});
    QVERIFY(coord->waitForFinished(120000));
    // --json's lines are on stdout (the last is the summary); warnings go to stderr.
    const QString out = QString::fromUtf8(coord->readAllStandardOutput());
    QVERIFY2(coord->exitCode() == 0, qPrintable(out + QString::fromUtf8(coord->readAllStandardError())));
    const auto j = nlohmann::json::parse(out.trimmed().split('\n').last().toStdString(), nullptr, false);
    QVERIFY2(!j.is_discarded() && j.value("final", false), qPrintable(out));
    QCOMPARE(j["steps"].get<int>(), 100);  // 2 epochs of 3200 / 64
    const std::string runId = j["run_id"].get<std::string>();
    // The trace file: each task's replica lane with its step spans.
    QFile t(trace);
    QVERIFY(t.open(QIODevice::ReadOnly));
    const auto doc = nlohmann::json::parse(t.readAll().toStdString(), nullptr, false);
    QVERIFY(!doc.is_discarded());
    const auto& events = doc.is_object() ? doc["traceEvents"] : doc;
    std::map<int, std::string> processNames;
    std::map<int, int> allReduces;
    for (const auto& e : events) {
        if (e.value("ph", "") == "M" && e.value("name", "") == "process_name") processNames[e.value("pid", -1)] = e["args"].value("name", "");
        if (e.value("ph", "") == "X" && e.value("name", "") == "all-reduce") ++allReduces[e.value("pid", -1)];
    }
    std::set<std::string> tracedTasks;
    for (const auto& [pid, n] : allReduces) {
        // A step's each, and one per epoch in which every task's input shard reports it has run
        // out (the pipeline is auto-sharded: 1600 elements, 50 batches of 32 per task).
        QVERIFY2(n == 102, qPrintable(QString("%1 all-reduce spans in process %2").arg(n).arg(QString::fromStdString(processNames[pid]))));
        tracedTasks.insert(processNames[pid]);
    }
    QVERIFY2(tracedTasks.size() == 2, nlohmann::json(processNames).dump().c_str());
    // The store: the spans of both tasks, and both tasks' pipeline stages.
    auto store = ts::store::RunStore::open(db.toStdString());
    QVERIFY(store.ok());
    auto spans = store->spans(runId);
    QVERIFY(spans.ok());
    std::set<std::string> spanLanes, pipelineLanes;
    for (const auto& sp : *spans) spanLanes.insert(sp.stamp.lane.worker);
    QVERIFY2(spanLanes.count("chief:0") && spanLanes.count("worker:0"), qPrintable(QString::number(spans->size())));
    auto pipeline = store->pipelineSamples(runId);
    QVERIFY(pipeline.ok());
    for (const auto& p : *pipeline) pipelineLanes.insert(p.stamp.lane.worker);
    QVERIFY2(pipelineLanes == std::set<std::string>({"chief:0", "worker:0"}), qPrintable(QString::number(pipeline->size())));
}

// The studio's Capture on a remote run: every training task traces its next steps and streams
// the spans back; a capture with no run in progress is refused.
void TestWorker::captureOnRemoteWorkers()
{
    QTemporaryDir dir;
    std::unique_ptr<WorkerProcess> chief, worker;
    const QString cluster = startDaemonPair(dir.path(), chief, worker);
    QVERIFY(!cluster.isEmpty());
    CoordinatorOptions o;
    auto spec = ClusterSpec::fromFile(cluster.toStdString());
    QVERIFY(spec.ok());
    o.spec = *spec;
    o.token = kToken;
    auto c = Coordinator::create(std::move(o), "multi-worker-mirrored");
    QVERIFY(c.ok());
    Coordinator& coordinator = **c;
    auto refused = coordinator.captureTrace(5);
    QVERIFY(!refused.ok());
    QVERIFY2(refused.error().message.find("no run is training") != std::string::npos, refused.error().toString().c_str());
    auto cfg = RunConfig::fromJson({{"model_file", TS_SOURCE_DIR "/resources/models/seed_mlp.json"}, {"epochs", 1000}, {"max_steps", 3000},
                                    {"batch_size", 64}, {"data", {{"limit", 1280}}}}, "test");
    QVERIFY2(cfg.ok(), cfg.ok() ? "" : cfg.error().toString().c_str());
    QVERIFY(cfg.ok());
    auto model = loadModelFile(cfg->modelFile);  // the workers get the model inline
    QVERIFY(model.ok());
    cfg->model = *model;
    cfg->modelFile.clear();
    cfg->validate = false;
    cfg->strategy.threads = 1;
    telemetry::EventBus bus;
    telemetry::SubscriberOptions so;
    so.capacity = 1 << 17;
    auto sub = bus.subscribe(so);
    Result<FitResult> result = makeError(ErrorCode::Internal, "not run");
    std::thread runner([&] { result = coordinator.run(*cfg, "capture-test", bus); });
    // Wait for step 50 on the chief, then capture 5 steps.
    int64_t chiefStep = 0;
    std::vector<telemetry::Event> seen;
    QElapsedTimer wait;
    wait.start();
    while (chiefStep < 50 && wait.elapsed() < 60000) {
        sub->wait(std::chrono::milliseconds(100));
        for (auto& ev : sub->drain()) {
            if (const auto* m = std::get_if<telemetry::StepMetricsEvent>(&ev)) chiefStep = std::max(chiefStep, m->stamp.step);
            seen.push_back(std::move(ev));
        }
    }
    auto started = coordinator.captureTrace(5);
    const int64_t askedAt = chiefStep;
    if (!started.ok()) coordinator.cancel();
    runner.join();
    QVERIFY2(started.ok(), started.ok() ? "" : started.error().toString().c_str());
    QCOMPARE(*started, 2);
    QVERIFY2(result.ok(), result.ok() ? "" : result.error().toString().c_str());
    for (auto& ev : sub->drain()) seen.push_back(std::move(ev));
    std::map<std::string, std::set<int64_t>> tracedSteps;  // task -> steps with a "step" span
    for (const auto& ev : seen)
        if (const auto* sp = std::get_if<telemetry::SpanEvent>(&ev); sp && sp->name == "all-reduce")
            tracedSteps[sp->stamp.lane.worker].insert(sp->stamp.step);
    QCOMPARE(tracedSteps.size(), std::size_t(2));
    for (const auto& [task, steps] : tracedSteps) {
        QVERIFY2(steps.size() == 5, qPrintable(QString::fromStdString(task) + ": " + QString::number(steps.size()) + " steps traced"));
        QVERIFY2(*steps.begin() > askedAt, qPrintable(QString::fromStdString(task)));
    }
}

void TestWorker::restartedRunResumesFromBackup()
{
    QTemporaryDir dir;
    const QString root = dir.filePath("chief-backups");
    // signal: 0, or how a daemon is stopped mid-run (SIGKILL: it dies; SIGTERM: it shuts down in
    // order, as on a reboot, and its peer must hear a lost task, not a cancelled run); chief: the
    // chief's daemon (rank 0, which serves the rendezvous and keeps the backup) instead of the
    // worker's. Either is started again on its port.
    QString warnings;  // the last run's stderr
    auto run = [&](const QString& tag, const QStringList& extra, int signal, nlohmann::json& final, QString& out, bool chiefStops = false) {
        auto chief = tstest::spawnWorker(dir.path(), tag + "-chief", kToken, {"--backup-root", root});
        auto worker = spawnWorker(dir.path(), tag + "-worker");
        QVERIFY(chief->port > 0 && worker->port > 0);
        const QString cluster = writeCluster(dir.path(), {chief->port, worker->port});
        auto coord = startCoordinator(coordinatorArgs(cluster, 400) + extra + QStringList{"--db", dir.filePath("runs.db"), "--json"});
        if (signal) {
            QVERIFY2(tstest::readUntil(*coord, out, "\"epoch\":3"), qPrintable(out));
            auto& stopped = chiefStops ? chief : worker;
            const int port = stopped->port;
            ::kill(static_cast<pid_t>(stopped->process->processId()), signal);
            QVERIFY2(stopped->process->waitForFinished(30000), "the stopped daemon did not exit");
            stopped = chiefStops ? tstest::spawnWorker(dir.path(), tag + "-chief", kToken, {"--backup-root", root}, port)
                                 : tstest::spawnWorker(dir.path(), tag + "-worker", kToken, {}, port);
            QCOMPARE(stopped->port, port);
        }
        QVERIFY(coord->waitForFinished(120000));
        out += QString::fromUtf8(coord->readAllStandardOutput());  // the summary is its last line; warnings go to stderr
        warnings = QString::fromUtf8(coord->readAllStandardError());
        QVERIFY2(coord->exitCode() == 0, qPrintable(out + warnings));
        final = nlohmann::json::parse(out.trimmed().split('\n').last().toStdString(), nullptr, false);
        QVERIFY2(!final.is_discarded() && final.value("final", false), qPrintable(out));
    };
    nlohmann::json continuous, restarted, stopped;
    QString outA, outB, outC;
    run("a", {}, 0, continuous, outA);
    if (QTest::currentTestFailed()) return;
    run("b", {"--backup-dir", "run-b", "--backup-every-steps", "5", "--restarts", "1"}, SIGKILL, restarted, outB);
    if (QTest::currentTestFailed()) return;
    // A daemon stopped in order: restarted alike (the peer's broken all-reduce arriving first read
    // as the user's cancel, and the run ended without restarting).
    run("c", {"--backup-dir", "run-c", "--backup-every-steps", "5", "--restarts", "1"}, SIGTERM, stopped, outC);
    if (QTest::currentTestFailed()) return;
    QCOMPARE(stopped["restarts"].get<int>(), 1);
    QCOMPARE(stopped["steps"].get<int>(), 400);
    QCOMPARE(stopped["loss"].get<double>(), continuous["loss"].get<double>());
    // Said as a lost task, never as the run cancelled there (the peer's broken all-reduce, when
    // its error comes first, quotes what the stopped task told it).
    QVERIFY2(warnings.contains("its trainstudio-worker shut down") && !warnings.contains("the run was cancelled"), qPrintable(warnings));
    // The chief's daemon stopped and started again: it knows only the restarted run, whose group
    // ("<run>/restart-1") its rendezvous must serve (it refused it as a TF_CONFIG task's).
    nlohmann::json chiefBack;
    QString outD;
    run("d", {"--backup-dir", "run-d", "--backup-every-steps", "5", "--restarts", "1"}, SIGTERM, chiefBack, outD, true);
    if (QTest::currentTestFailed()) return;
    QCOMPARE(chiefBack["restarts"].get<int>(), 1);
    QCOMPARE(chiefBack["steps"].get<int>(), 400);
    QCOMPARE(chiefBack["loss"].get<double>(), continuous["loss"].get<double>());
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
    // The steps the failed attempt recorded after the backup were replayed: the chief's resume
    // rewinds the record, so every step is there once (they were 317 when the rewind reached the
    // store after the first replayed steps); the failed attempt's breakdowns up to the backup
    // stay (its last batch was cut off with its stream).
    auto counts = store->counts(runId);
    QVERIFY(counts.ok());
    QCOMPARE(counts->steps, int64_t(400));
    QCOMPARE(counts->breakdowns, int64_t(400));  // the failed attempt's last ones were cut off

    // A backup made with other settings is refused by the chief, and the run's error is the
    // chief's reason (the settings that differ), not the worker's pointer to it ("the chief could
    // not restore the run's backup (its error says why)"), whichever arrives first.
    {
        auto c = tstest::spawnWorker(dir.path(), "d-chief", kToken, {"--backup-root", root});
        auto w = spawnWorker(dir.path(), "d-worker");
        const QString cl = writeCluster(dir.path(), {c->port, w->port});
        auto first = startCoordinator(coordinatorArgs(cl, 1000000) + QStringList{"--no-record", "--backup-dir", "run-d", "--backup-every-steps", "5"});
        QString seen;
        QVERIFY2(tstest::readUntil(*first, seen, "Epoch 2:"), qPrintable(seen));
        ::kill(static_cast<pid_t>(first->processId()), SIGINT);  // cancelled: the backup stays
        QVERIFY(first->waitForFinished(30000));
        QVERIFY(QFile::exists(root + "/run-d/backup.safetensors"));
        for (int attempt = 0; attempt < 3; ++attempt) {
            auto other = startCoordinator(coordinatorArgs(cl, 1000000) +
                                          QStringList{"--no-record", "--backup-dir", "run-d", "--backup-every-steps", "5", "--learning-rate", "0.01"});
            QVERIFY(other->waitForFinished(60000));
            const QString err = QString::fromUtf8(other->readAllStandardError());
            QCOMPARE(other->exitCode(), 1);
            QVERIFY2(err.contains("error: chief:0 at") && err.contains("other settings"), qPrintable(err));
        }
    }

    // A backup folder that tries to leave the worker's root is refused by the coordinator before
    // any daemon is reserved (the daemons check it too: refusesOversizedAndMalformed).
    auto chief = tstest::spawnWorker(dir.path(), "c-chief", kToken, {"--backup-root", root});
    auto worker = spawnWorker(dir.path(), "c-worker");
    const QString cluster = writeCluster(dir.path(), {chief->port, worker->port});
    auto coord = startCoordinator(coordinatorArgs(cluster, 20) + QStringList{"--no-record", "--backup-dir", "../elsewhere"});
    QVERIFY(coord->waitForFinished(60000));
    const QString refused = QString::fromUtf8(coord->readAllStandardOutput()) + QString::fromUtf8(coord->readAllStandardError());
    QCOMPARE(coord->exitCode(), 2);
    QVERIFY2(refused.contains("--backup-dir: backup.dir '../elsewhere' must be a relative folder name without '..'"), qPrintable(refused));

    // A backup root that cannot hold backups (gone, a file in its place) is named as the
    // daemon's --backup-root, not as the coordinator's --backup-dir, before the task starts.
    QVERIFY(QDir(root).removeRecursively());
    {
        QFile blocker(root);
        QVERIFY(blocker.open(QIODevice::WriteOnly));
    }
    auto blocked = startCoordinator(coordinatorArgs(cluster, 20) + QStringList{"--no-record", "--backup-dir", "mlp"});
    QVERIFY(blocked->waitForFinished(60000));
    const QString unusable = QString::fromUtf8(blocked->readAllStandardOutput()) + QString::fromUtf8(blocked->readAllStandardError());
    QCOMPARE(blocked->exitCode(), 1);
    QVERIFY2(unusable.contains("this worker cannot keep backups: its --backup-root " + root + " is not a folder it can write"), qPrintable(unusable));
    // And a daemon started with such a root says so at once instead of serving.
    QProcess daemon;
    daemon.start(QStringLiteral(TS_WORKER_PATH), {"--listen", "127.0.0.1:0", "--backup-root", root});
    QVERIFY(daemon.waitForFinished(20000));
    QCOMPARE(daemon.exitCode(), 2);
    const QString startup = QString::fromUtf8(daemon.readAllStandardError());
    QVERIFY2(startup.contains("error: --backup-root " + root + " is not a folder this user can write"), qPrintable(startup));
}

// A port where a web server answers (HTTP/1: gRPC fails to parse HTTP/2) is named as another
// program, not as an unreachable worker.
void TestWorker::preflightNamesForeignServer()
{
    tstest::LoopbackListener listener;
    QVERIFY(listener.port > 0);
    const int port = listener.port;
    std::atomic<bool> stop{false};
    std::thread web([&] {
        while (!stop) {
            const int c = ::accept(listener.fd, nullptr, nullptr);
            if (c < 0) break;
            char buf[512];
            (void)::recv(c, buf, sizeof buf, 0);
            const char reply[] = "HTTP/1.0 400 Bad Request\r\nContent-Length: 0\r\n\r\n";
            (void)::send(c, reply, sizeof reply - 1, MSG_NOSIGNAL);
            ::close(c);
        }
    });
    QTemporaryDir dir;
    auto probe = startCoordinator({"cluster", writeCluster(dir.path(), {port}), "--probe", "--json"});
    const bool finished = probe->waitForFinished(60000);
    stop = true;
    listener.stopAccepting();
    web.join();
    QVERIFY(finished);
    const QString probed = QString::fromUtf8(probe->readAllStandardOutput());
    QCOMPARE(probe->exitCode(), 1);
    const auto j = nlohmann::json::parse(probed.trimmed().toStdString(), nullptr, false);
    QVERIFY2(!j.is_discarded() && j["tasks"].size() == 1, qPrintable(probed));
    const std::string problem = j["tasks"][0].value("problem", "");
    QVERIFY2(problem.find("something answers at 127.0.0.1:" + std::to_string(port) + ", but it is not a trainstudio-worker") !=
                 std::string::npos,
             problem.c_str());
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
    // `cluster --probe` asks the same without starting anything: the chief ready, the worker not.
    auto probe = startCoordinator({"cluster", cluster, "--probe", "--json"});
    QVERIFY(probe->waitForFinished(60000));
    const QString probed = QString::fromUtf8(probe->readAllStandardOutput());
    QCOMPARE(probe->exitCode(), 1);
    const auto j = nlohmann::json::parse(probed.trimmed().toStdString(), nullptr, false);
    QVERIFY2(!j.is_discarded() && !j.value("ready", true), qPrintable(probed));
    QCOMPARE(j["tasks"].size(), std::size_t(2));
    QVERIFY(j["tasks"][0].value("ready", false));
    QCOMPARE(j["tasks"][0].value("pid", 0), int(chief->process->processId()));
    QVERIFY(!j["tasks"][1].value("ready", true));
    QVERIFY2(j["tasks"][1].value("problem", "").find("nothing listens at 127.0.0.1:" + std::to_string(deadPort)) != std::string::npos,
             qPrintable(probed));
    // ... and exits 0 once every task is ready.
    auto second = spawnWorker(dir.path(), "second");
    QVERIFY(second->port > 0);
    probe = startCoordinator({"cluster", writeCluster(dir.path(), {chief->port, second->port}), "--probe"});
    QVERIFY(probe->waitForFinished(60000));
    const QString ready = QString::fromUtf8(probe->readAllStandardOutput());
    QCOMPARE(probe->exitCode(), 0);
    QCOMPARE(ready.count("ready    "), 2);
}

// A daemon stopped in order (SIGTERM: a reboot, systemctl stop) cancels its task. That is not
// the user's Stop: the run fails naming the task (it was recorded as cancelled, and --restarts
// did not start it again).
void TestWorker::stoppedDaemonIsNamed()
{
    QTemporaryDir dir;
    auto chief = spawnWorker(dir.path(), "chief");
    QVERIFY(chief->port > 0);
    const QString cluster = writeCluster(dir.path(), {chief->port});
    auto coord = startCoordinator(coordinatorArgs(cluster, 1000000) + QStringList{"--no-record"});
    QString seen;
    QVERIFY2(tstest::readUntil(*coord, seen, "Epoch 2:"), qPrintable(seen));
    ::kill(static_cast<pid_t>(chief->process->processId()), SIGTERM);
    QVERIFY(coord->waitForFinished(30000));
    const QString out = seen + QString::fromUtf8(coord->readAllStandardOutput()) + QString::fromUtf8(coord->readAllStandardError());
    QVERIFY2(coord->exitCode() == 1, qPrintable(out));
    QVERIFY2(out.contains(QString("chief:0 at 127.0.0.1:%1: its task was stopped on its machine (its trainstudio-worker shut down)").arg(chief->port)),
             qPrintable(out));
}

// A run the tasks refuse before training (a model the data does not fit) is bad input, exit 2
// as for a local run (it was 1 with --cluster, 2 locally and with TF_CONFIG).
void TestWorker::refusedRunExitsTwo()
{
    QTemporaryDir dir;
    std::unique_ptr<WorkerProcess> chief, worker;
    const QString cluster = startDaemonPair(dir.path(), chief, worker);
    QVERIFY(!cluster.isEmpty());
    const QString model = dir.filePath("wide_input.json");
    QVERIFY(writeFile(model, R"({"format": "trainstudio-model", "version": 1, "name": "m", "layers": [
        {"id": "input", "type": "Input", "attrs": {"shape": [100]}},
        {"id": "head", "type": "Dense", "inputs": ["input"], "attrs": {"units": 10, "activation": "softmax"}}]})"));
    QStringList args = coordinatorArgs(cluster, 20);
    args[args.indexOf("--model") + 1] = model;
    auto coord = startCoordinator(args + QStringList{"--no-record"});
    QVERIFY(coord->waitForFinished(60000));
    const QString err = QString::fromUtf8(coord->readAllStandardError());
    QVERIFY2(coord->exitCode() == 2, qPrintable(err));
    QVERIFY2(err.contains(QRegularExpression("error: (chief|worker):0 at 127.0.0.1:")) && err.contains("(100,)"), qPrintable(err));
    // Not restarted either: it would be refused again.
    auto again = startCoordinator(args + QStringList{"--no-record", "--backup-dir", "refused", "--restarts", "2"});
    QVERIFY(again->waitForFinished(60000));
    const QString err2 = QString::fromUtf8(again->readAllStandardError());
    QVERIFY2(again->exitCode() == 2 && !err2.contains("restarting the run"), qPrintable(err2));
}

// A bad CSV line met mid-epoch in one task's file shard fails the run as it fails a local one
// (exit 1, the file and line named), and --restarts does not start it again: the same line would
// fail it again. The task that meets it sends its error's code and tells its peer, whose broken
// collective would otherwise read as a lost task (restartable).
void TestWorker::dataErrorMidRunIsNotRestarted()
{
    QTemporaryDir dir;
    std::unique_ptr<WorkerProcess> chief, worker;
    const QString cluster = startDaemonPair(dir.path(), chief, worker);
    QVERIFY(!cluster.isEmpty());
    auto rows = [](int from, int bad) {
        QByteArray csv = "label,a,b,c\n";
        for (int i = from; i < from + 200; ++i)
            csv += QByteArray::number(i % 4) + "," + QByteArray::number(std::sin(i * 0.7), 'g', 6) + "," +
                   (i == bad ? QByteArray("oops") : QByteArray::number(std::cos(i * 1.3), 'g', 6)) + "," + QByteArray::number((i % 7) / 7.0, 'g', 6) + "\n";
        return csv;
    };
    // Files are dealt round-robin: the chief reads good.csv, the worker bad.csv.
    QVERIFY(writeFile(dir.filePath("good.csv"), rows(0, -1)));
    QVERIFY(writeFile(dir.filePath("bad.csv"), rows(200, 250)));
    const QString model = dir.filePath("tiny.json");
    QVERIFY(writeFile(model, R"({"format": "trainstudio-model", "version": 1, "name": "tiny", "layers": [
        {"id": "input", "type": "Input", "attrs": {"shape": [3]}},
        {"id": "head", "type": "Dense", "inputs": ["input"], "attrs": {"units": 4, "activation": "softmax"}}]})"));
    const QString config = dir.filePath("run.json");
    QVERIFY(writeFile(config, QString(R"({"model_file": "%1", "epochs": 2, "batch_size": 10, "data": {"validate": false},
        "pipeline": {"source": {"kind": "csv", "paths": ["%2", "%3"], "label_column": "label"}, "auto_shard": "file",
                     "transformations": [{"op": "batch", "size": 10}]}})")
                                  .arg(model, dir.filePath("good.csv"), dir.filePath("bad.csv"))
                                  .toUtf8()));
    auto coord = startCoordinator({"train", "--cluster", cluster, "--config", config, "--threads", "1", "--no-record", "--backup-dir", "bad",
                                   "--backup-every-steps", "2", "--restarts", "2"});
    QVERIFY(coord->waitForFinished(60000));
    const QString err = QString::fromUtf8(coord->readAllStandardOutput()) + QString::fromUtf8(coord->readAllStandardError());
    QVERIFY2(coord->exitCode() == 1, qPrintable(err));
    QVERIFY2(err.contains("bad.csv' line 52") && err.contains("'oops' is not a number"), qPrintable(err));
    QVERIFY2(!err.contains("restarting the run"), qPrintable(err));
}

void TestWorker::killedWorkerIsNamed()
{
    QTemporaryDir dir;
    std::unique_ptr<WorkerProcess> chief, worker;
    const QString cluster = startDaemonPair(dir.path(), chief, worker);
    QVERIFY(!cluster.isEmpty());
    auto coord = startCoordinator(coordinatorArgs(cluster, 1000000) + QStringList{"--no-record"});
    QString seen;
    // Once the chief has finished two epochs (training, not setting up), SIGKILL the worker.
    QVERIFY2(tstest::readUntil(*coord, seen, "Epoch 2:"), qPrintable(seen));
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
    // Said as what happened (it read "closed the connection at once: it may serve TLS").
    QVERIFY2(out.contains("the connection broke while the task ran") || out.contains("stopped responding"), qPrintable(out));
    QVERIFY2(!out.contains("TLS"), qPrintable(out));
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
    QString seen;
    QVERIFY2(tstest::readUntil(*coord, seen, "Epoch 2:"), qPrintable(seen));
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
