// ClusterSpec: TF_CONFIG accepted verbatim (text, file, environment), exported per task, and
// every malformed document rejected with a message naming the entry at fault.

#include <QtTest>

#include <cstdlib>
#include <fstream>

#include "distribute/cluster_spec.h"

using namespace ts;

class TestClusterSpec : public QObject {
    Q_OBJECT
private slots:
    void parsesTensorFlowExample();
    void exportsPerTaskAndRoundTrips();
    void writesOneFilePerTask();
    void parsesTaskIds_data();
    void parsesTaskIds();
    void readsFileAndEnvironment();
    void hostPortSyntax_data();
    void hostPortSyntax();
    void rejectsMalformed_data();
    void rejectsMalformed();
    void strategyRoles();
    void tasksSharingAHost();
};

namespace {
// The example from TensorFlow's multi-worker guide, byte for byte.
const char* kTfExample = R"({"cluster": {"chief": ["host1:port"], "worker": ["host2:port", "host3:port"]}, "task": {"type": "worker", "index": 1}})";

const char* kValid = R"({"cluster": {"chief": ["10.0.0.1:2222"], "worker": ["10.0.0.2:2222", "10.0.0.3:2222"],
                          "ps": ["10.0.0.4:2222"], "evaluator": ["10.0.0.5:2222"]},
                          "task": {"type": "worker", "index": 1}, "environment": "cloud", "rpc_layer": "grpc"})";
} // namespace

void TestClusterSpec::parsesTensorFlowExample()
{
    // TF's own example uses the placeholder "port": a port must be a number, and the error says which entry.
    auto bad = ClusterSpec::fromText(kTfExample, "TF_CONFIG");
    QVERIFY(!bad.ok());
    QVERIFY2(bad.error().message.find("cluster.chief[0]") != std::string::npos, bad.error().message.c_str());
    QVERIFY(bad.error().message.find("1..65535") != std::string::npos);

    auto spec = ClusterSpec::fromText(kValid, "TF_CONFIG");
    QVERIFY2(spec.ok(), spec.ok() ? "" : spec.error().toString().c_str());
    QCOMPARE(spec->count("chief"), 1);
    QCOMPARE(spec->count("worker"), 2);
    QCOMPARE(spec->count("ps"), 1);
    QCOMPARE(spec->count("evaluator"), 1);
    QVERIFY(spec->hasTask());
    QCOMPARE(spec->task().type, std::string("worker"));
    QCOMPARE(spec->task().index, 1);
    QCOMPARE(*spec->address(spec->task()), std::string("10.0.0.3:2222"));
    // Rank order: chief first, then workers.
    QCOMPARE(spec->numTrainingWorkers(), 3);
    QCOMPARE(*spec->trainingRank({"chief", 0}), 0);
    QCOMPARE(*spec->trainingRank({"worker", 1}), 2);
    QVERIFY(!spec->trainingRank({"ps", 0}).ok());
    QCOMPARE(spec->coordinator().type, std::string("chief"));
    // A quoted index (some launchers write one) is accepted.
    auto quoted = ClusterSpec::fromText(R"({"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": "1"}})", "t");
    QVERIFY(quoted.ok());
    QCOMPARE(quoted->task().index, 1);
    QCOMPARE(quoted->coordinator().toString(), std::string("worker:0"));
}

void TestClusterSpec::exportsPerTaskAndRoundTrips()
{
    auto spec = ClusterSpec::fromText(kValid, "TF_CONFIG");
    QVERIFY(spec.ok());
    auto text = spec->tfConfigFor({"ps", 0});
    QVERIFY(text.ok());
    auto j = nlohmann::json::parse(*text);
    QCOMPARE(j["task"]["type"].get<std::string>(), std::string("ps"));
    QCOMPARE(j["task"]["index"].get<int>(), 0);
    QCOMPARE(j["environment"].get<std::string>(), std::string("cloud"));
    QCOMPARE(j["rpc_layer"].get<std::string>(), std::string("grpc"));
    auto back = ClusterSpec::fromText(*text, "exported");
    QVERIFY(back.ok());
    QCOMPARE(back->toJson()["cluster"], spec->toJson()["cluster"]);
    QCOMPARE(back->task().toString(), std::string("ps:0"));
    // Exporting for a task that does not exist fails and says so.
    auto none = spec->tfConfigFor({"worker", 2});
    QVERIFY(!none.ok());
    QVERIFY2(none.error().message.find("task.index 2 is out of range for worker (2 entries)") != std::string::npos, none.error().message.c_str());
    // Without a task, toJson has none.
    auto noTask = ClusterSpec::fromText(R"({"cluster": {"worker": ["a:1"]}})", "t");
    QVERIFY(noTask.ok());
    QVERIFY(!noTask->hasTask());
    QVERIFY(!noTask->toJson().contains("task"));
}

// Export…/`cluster --out-dir`: every task's TF_CONFIG in its own file, each read back as that task.
void TestClusterSpec::writesOneFilePerTask()
{
    auto spec = ClusterSpec::fromText(R"({"cluster": {"worker": ["h1:1", "h2:1"], "ps": ["h3:1"], "chief": ["h0:1"]}})", "test");
    QVERIFY(spec.ok());
    std::vector<std::string> names;
    for (const auto& t : spec->tasks()) names.push_back(t.toString());
    QCOMPARE(names, (std::vector<std::string>{"chief:0", "worker:0", "worker:1", "ps:0"}));
    QTemporaryDir dir;
    const std::string out = dir.filePath("nested/tf").toStdString();  // made as needed
    auto written = spec->writeTfConfigs(out);
    QVERIFY2(written.ok(), written.ok() ? "" : written.error().toString().c_str());
    QCOMPARE(written->size(), std::size_t(4));
    QCOMPARE(written->at(2), out + "/tf_config-worker-1.json");
    for (const auto& t : spec->tasks()) {
        auto back = ClusterSpec::fromFile(out + "/" + ClusterSpec::tfConfigFileName(t));
        QVERIFY2(back.ok(), back.ok() ? "" : back.error().toString().c_str());
        QVERIFY(back->hasTask());
        QCOMPARE(back->task(), t);
        QCOMPARE(back->addresses("worker"), spec->addresses("worker"));
    }
    // A folder that cannot be made is named.
    const QString file = dir.filePath("plain-file");
    QFile f(file);
    QVERIFY(f.open(QIODevice::WriteOnly));
    f.close();
    auto refused = spec->writeTfConfigs(file.toStdString());
    QVERIFY(!refused.ok());
    QVERIFY2(refused.error().message.find(file.toStdString()) != std::string::npos, refused.error().message.c_str());
}

void TestClusterSpec::parsesTaskIds_data()
{
    QTest::addColumn<QString>("text");
    QTest::addColumn<QString>("type");  // empty: refused
    QTest::addColumn<int>("index");
    QTest::newRow("worker") << "worker:1" << "worker" << 1;
    QTest::newRow("chief") << "chief:0" << "chief" << 0;
    for (const char* bad : {"worker", "worker:", ":1", "worker:-1", "worker: 1", "worker:1x", "worker:12345678"})
        QTest::newRow(bad) << bad << "" << 0;
}

void TestClusterSpec::parsesTaskIds()
{
    QFETCH(QString, text);
    QFETCH(QString, type);
    QFETCH(int, index);
    auto t = parseTaskId(text.toStdString());
    QCOMPARE(t.ok(), !type.isEmpty());
    if (!t.ok()) {
        QVERIFY2(t.error().message.find("expected type:index") != std::string::npos, t.error().message.c_str());
        return;
    }
    QCOMPARE(QString::fromStdString(t->type), type);
    QCOMPARE(t->index, index);
}

void TestClusterSpec::readsFileAndEnvironment()
{
    QTemporaryDir dir;
    const std::string path = dir.filePath("tf_config.json").toStdString();
    {
        std::ofstream out(path);
        out << kValid;
    }
    auto f = ClusterSpec::fromFile(path);
    QVERIFY(f.ok());
    QCOMPARE(f->source(), path);
    auto missing = ClusterSpec::fromFile(path + ".nope");
    QVERIFY(!missing.ok());
    QVERIFY(missing.error().message.find(path + ".nope") != std::string::npos);

    ::unsetenv("TF_CONFIG");
    auto unset = ClusterSpec::fromEnvironment();
    QVERIFY(!unset.ok());
    QCOMPARE(unset.error().code, ErrorCode::NotFound);
    ::setenv("TF_CONFIG", R"({"cluster": {"worker": ["localhost:5000", "localhost:5001"]}, "task": {"type": "worker", "index": 0}})", 1);
    auto env = ClusterSpec::fromEnvironment();
    ::unsetenv("TF_CONFIG");
    QVERIFY(env.ok());
    QCOMPARE(env->count("worker"), 2);
    QCOMPARE(env->source(), std::string("TF_CONFIG"));
}

void TestClusterSpec::hostPortSyntax_data()
{
    QTest::addColumn<QString>("text");
    QTest::addColumn<bool>("ok");
    QTest::addColumn<QString>("host");
    QTest::addColumn<int>("port");
    QTest::newRow("ipv4") << "127.0.0.1:2222" << true << "127.0.0.1" << 2222;
    QTest::newRow("name") << "worker-0.svc:65535" << true << "worker-0.svc" << 65535;
    QTest::newRow("ipv6") << "[::1]:80" << true << "::1" << 80;
    QTest::newRow("no port") << "localhost" << false << "" << 0;
    QTest::newRow("empty port") << "localhost:" << false << "" << 0;
    QTest::newRow("port 0") << "localhost:0" << false << "" << 0;
    QTest::newRow("port too big") << "localhost:65536" << false << "" << 0;
    QTest::newRow("port not a number") << "localhost:http" << false << "" << 0;
    QTest::newRow("empty host") << ":22" << false << "" << 0;
    QTest::newRow("bare ipv6") << "::1:22" << false << "" << 0;
    QTest::newRow("unclosed ipv6") << "[::1:22" << false << "" << 0;
    QTest::newRow("url") << "grpc://a:22" << false << "" << 0;
}

void TestClusterSpec::hostPortSyntax()
{
    QFETCH(QString, text);
    QFETCH(bool, ok);
    auto hp = HostPort::parse(text.toStdString());
    QCOMPARE(hp.ok(), ok);
    if (ok) {
        QFETCH(QString, host);
        QFETCH(int, port);
        QCOMPARE(QString::fromStdString(hp->host), host);
        QCOMPARE(hp->port, port);
        QCOMPARE(QString::fromStdString(hp->toString()), text);
    } else {
        QVERIFY(hp.error().message.find(text.toStdString()) != std::string::npos);
    }
}

void TestClusterSpec::rejectsMalformed_data()
{
    QTest::addColumn<QString>("json");
    QTest::addColumn<QString>("expected");
    QTest::newRow("not json") << "{cluster:" << "src:1:2: JSON syntax error";
    QTest::newRow("not an object") << "[1]" << "must be a JSON object";
    QTest::newRow("no cluster") << R"({"task": {"type": "worker", "index": 0}})" << "\"cluster\" is missing";
    QTest::newRow("unknown top key") << R"({"cluster": {"worker": ["a:1"]}, "tsak": {}})" << "unknown key \"tsak\"";
    QTest::newRow("unknown role") << R"({"cluster": {"workers": ["a:1"]}})" << "unknown role \"workers\"";
    QTest::newRow("role not a list") << R"({"cluster": {"worker": "a:1"}})" << "cluster.worker must be a list";
    QTest::newRow("entry not a string") << R"({"cluster": {"worker": ["a:1", 7]}})" << "cluster.worker[1] must be a \"host:port\" string";
    QTest::newRow("bad address") << R"({"cluster": {"worker": ["a:1", "b"]}})" << "cluster.worker[1]: bad address \"b\": no :port";
    QTest::newRow("duplicate") << R"({"cluster": {"chief": ["h:1"], "worker": ["h:2", "H:1"]}})" << "address H:1 is used twice, by cluster.chief[0] (written h:1) and cluster.worker[1]";
    QTest::newRow("loopback alias") << R"({"cluster": {"worker": ["127.0.0.1:7170", "localhost:7170"]}})"
                                    << "address localhost:7170 is used twice, by cluster.worker[0] (written 127.0.0.1:7170) and cluster.worker[1]";
    QTest::newRow("role given twice") << R"({"cluster": {"chief": ["a:1"], "chief": ["b:1"]}})"
                                      << "src: \"chief\" is given twice in one object (at cluster.chief)";
    QTest::newRow("task given twice") << R"({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 0, "index": 1}})"
                                      << "\"index\" is given twice in one object (at task.index)";
    QTest::newRow("two chiefs") << R"({"cluster": {"chief": ["a:1", "b:1"]}})" << "at most one chief";
    QTest::newRow("empty cluster") << R"({"cluster": {}})" << "lists no tasks";
    QTest::newRow("task type") << R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "master", "index": 0}})" << "task.type \"master\" is not a role";
    QTest::newRow("task role absent") << R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "ps", "index": 0}})" << "no \"ps\" entries";
    QTest::newRow("index out of range") << R"({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 2}})" << "task.index 2 is out of range for worker (2 entries)";
    QTest::newRow("negative index") << R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": -1}})" << "task.index -1 is out of range";
    QTest::newRow("index not int") << R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": "x"}})" << "task.index \"x\" is not an integer";
    QTest::newRow("task unknown key") << R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "idx": 0}})" << "task: unknown key \"idx\"";
}

void TestClusterSpec::rejectsMalformed()
{
    QFETCH(QString, json);
    QFETCH(QString, expected);
    auto spec = ClusterSpec::fromText(json.toStdString(), "src");
    QVERIFY(!spec.ok());
    const std::string msg = spec.error().message;
    QVERIFY2(msg.find(expected.toStdString()) != std::string::npos, msg.c_str());
    QVERIFY2(msg.rfind("src", 0) == 0, "the message starts with the source");
    QVERIFY2(!spec.error().hint.empty(), ("no hint for: " + msg).c_str());  // every error says what to do
}

void TestClusterSpec::strategyRoles()
{
    auto mwm = ClusterSpec::fromText(R"({"cluster": {"chief": ["a:1"], "worker": ["a:2"]}})", "c.json");
    QVERIFY(mwm.ok());
    QVERIFY(mwm->validateFor("multi-worker-mirrored").ok());
    auto ps = mwm->validateFor("parameter-server");
    QVERIFY(!ps.ok());
    QVERIFY2(ps.error().message.find("c.json: parameter-server needs at least one ps task") != std::string::npos, ps.error().message.c_str());

    auto withPs = ClusterSpec::fromText(R"({"cluster": {"worker": ["a:2"], "ps": ["a:3"]}})", "c.json");
    QVERIFY(withPs.ok());
    QVERIFY(withPs->validateFor("parameter-server").ok());
    auto m = withPs->validateFor("multi-worker-mirrored");
    QVERIFY(!m.ok());
    QVERIFY(m.error().message.find("does not use ps tasks") != std::string::npos);

    auto onlyPs = ClusterSpec::fromText(R"({"cluster": {"ps": ["a:3"]}})", "c.json");
    QVERIFY(onlyPs.ok());
    auto noWorker = onlyPs->validateFor("parameter-server");
    QVERIFY(!noWorker.ok());
    QVERIFY(noWorker.error().message.find("at least one worker") != std::string::npos);
    QVERIFY(!onlyPs->validateFor("multi-worker-mirrored").ok());
    QVERIFY(!onlyPs->validateFor("mirrored").ok());
}

// Tasks on one machine share its cores when the user gives no --threads (each took all of them:
// two daemons on 2 cores trained 10x slower). Loopback names are one host; ps tasks do not count.
void TestClusterSpec::tasksSharingAHost()
{
    auto spec = ClusterSpec::fromText(R"({"cluster": {"chief": ["localhost:1000"], "worker": ["127.0.0.1:1001", "10.0.0.2:1000", "10.0.0.2:1001", "10.0.0.3:1000"],
                                                      "ps": ["10.0.0.3:2000"]}})",
                                      "TF_CONFIG");
    QVERIFY2(spec.ok(), spec.ok() ? "" : spec.error().toString().c_str());
    QCOMPARE(spec->trainingTasksSharingHost({"chief", 0}), 2);
    QCOMPARE(spec->trainingTasksSharingHost({"worker", 0}), 2);
    QCOMPARE(spec->trainingTasksSharingHost({"worker", 2}), 2);
    QCOMPARE(spec->trainingTasksSharingHost({"worker", 3}), 1);
    QCOMPARE(spec->sharedHostThreads({"chief", 0}, 2), 1);
    QCOMPARE(spec->sharedHostThreads({"worker", 1}, 16), 8);
    QCOMPARE(spec->sharedHostThreads({"worker", 3}, 16), 0);  // alone on its host: no change
    QCOMPARE(spec->sharedHostThreads({"chief", 0}, 1), 1);    // never below one thread
}

QTEST_GUILESS_MAIN(TestClusterSpec)
#include "tst_cluster_spec.moc"
