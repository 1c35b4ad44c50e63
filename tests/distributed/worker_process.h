#pragma once
// A trainstudio-worker daemon in its own process on an ephemeral loopback port (read back from
// --port-file), for the tests that need real processes (kill -9, SIGSTOP, several tasks).
// TS_WORKER_PATH is the daemon's path (tests/CMakeLists.txt defines it for distributed and ui).

#include <QDir>
#include <QElapsedTimer>
#include <QFile>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QProcess>
#include <QtTest>

#include <memory>
#include <string>

namespace tstest {

struct WorkerProcess {
    std::unique_ptr<QProcess> process;
    int port = 0;  // 0: it did not start listening within 20 s
    ~WorkerProcess()
    {
        if (process && process->state() != QProcess::NotRunning) {
            process->terminate();
            if (!process->waitForFinished(10000)) process->kill();
            process->waitForFinished();
        }
    }
    bool running() const { return process && process->state() == QProcess::Running; }
};

// Starts `trainstudio-worker --name name` with `token` (TRAINSTUDIO_TOKEN) and one OpenMP thread;
// its port file goes into `dir`. `port`: listen there (a restarted daemon) instead of any free port.
inline std::unique_ptr<WorkerProcess> spawnWorker(const QString& dir, const QString& name, const std::string& token,
                                                  const QStringList& extra = {}, int port = 0)
{
    auto w = std::make_unique<WorkerProcess>();
    w->process = std::make_unique<QProcess>();
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    env.insert("TRAINSTUDIO_TOKEN", QString::fromStdString(token));
    env.insert("OMP_NUM_THREADS", "1");
    w->process->setProcessEnvironment(env);
    w->process->setProcessChannelMode(QProcess::ForwardedErrorChannel);
    const QString portFile = dir + "/" + name + ".port";
    QFile::remove(portFile);
    QStringList args{"--listen", QString("127.0.0.1:%1").arg(port), "--name", name, "--port-file", portFile};
    // Backups under the test's folder, not the user's ~/.local/share (where a failed run's backup
    // would outlive the test and meet the next run of it).
    if (!extra.contains("--backup-root")) {
        const QString root = dir + "/" + name + "-backups";
        QDir().mkpath(root);
        args << "--backup-root" << root;
    }
    w->process->start(QStringLiteral(TS_WORKER_PATH), args + extra);
    QElapsedTimer t;
    t.start();
    while (t.elapsed() < 20000) {
        QFile f(portFile);
        if (f.open(QIODevice::ReadOnly)) {
            w->port = f.readAll().trimmed().toInt();
            if (w->port > 0) break;
        }
        QTest::qWait(50);
    }
    return w;
}

// Appends `p`'s standard output to `seen` until it contains `needle`, `ms` pass or `p` exits;
// true when the needle was seen while `p` still runs.
inline bool readUntil(QProcess& p, QString& seen, const QString& needle, int ms = 60000)
{
    QElapsedTimer wait;
    wait.start();
    while (!seen.contains(needle) && wait.elapsed() < ms && p.state() != QProcess::NotRunning) {
        p.waitForReadyRead(100);
        seen += QString::fromUtf8(p.readAllStandardOutput());
    }
    return seen.contains(needle) && p.state() == QProcess::Running;
}

// The runs recorded in `db`, as `trainstudio-cli runs list --json` prints them (TS_CLI_PATH).
inline QJsonArray recordedRuns(const QString& db)
{
    QProcess list;
    list.start(QStringLiteral(TS_CLI_PATH), {"runs", "list", "--json", "--db", db});
    if (!list.waitForFinished(30000)) return {};
    return QJsonDocument::fromJson(list.readAllStandardOutput()).array();
}

// A cluster of worker daemons, each in its own network namespace, and its coordinator, joined by
// a bridge (netns_cluster.sh): `roles` in cluster order ("ps", "worker", "evaluator"), then
// `CLI train --cluster ... trainArgs`, the token being `token`. available: false where
// unprivileged user and network namespaces (or iproute2's bridges and veth links) are not.
// cutAfter: once the coordinator prints it, its address goes away (netns_cluster.sh's
// TS_CUT_AFTER) and each daemon's "<name>.noticed" file says how many seconds it took to notice.
struct NetnsCluster {
    bool available = false;
    int rc = -1;                 // the coordinator's exit code
    QString out, err, logs;      // its stdout and stderr; everything, for failure messages
    QString dir;                 // where the script wrote its files (cluster.json, <name>.log)
};

inline NetnsCluster runInNetworkNamespaces(const QString& dir, const QStringList& roles, const QStringList& trainArgs, const std::string& token,
                                           const QString& cutAfter = {})
{
    NetnsCluster r;
    r.dir = dir;
    QProcess probe;
    probe.start("unshare", {"-rn", "sh", "-c", "ip link add ts-probe type bridge && ip link add ts-a type veth peer name ts-b && nsenter --help >/dev/null"});
    if (!probe.waitForFinished(10000) || probe.exitStatus() != QProcess::NormalExit || probe.exitCode() != 0) return r;
    r.available = true;
    QProcess p;
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    env.insert("TRAINSTUDIO_TOKEN", QString::fromStdString(token));
    env.insert("OMP_NUM_THREADS", "1");
    env.remove("TF_CONFIG");
    if (!cutAfter.isEmpty()) env.insert("TS_CUT_AFTER", cutAfter);
    p.setProcessEnvironment(env);
    p.setProcessChannelMode(QProcess::MergedChannels);
    p.start("unshare", QStringList{"-rn", "bash", QStringLiteral(TS_FIXTURES_DIR "/../distributed/netns_cluster.sh"), QStringLiteral(TS_WORKER_PATH),
                                   QStringLiteral(TS_CLI_PATH), dir} +
                           roles + QStringList{"--"} + trainArgs);
    const bool finished = p.waitForFinished(180000);
    auto read = [&](const QString& name) {
        QFile f(dir + "/" + name);
        return f.open(QIODevice::ReadOnly) ? QString::fromUtf8(f.readAll()).trimmed() : QString();
    };
    r.out = read("coordinator.out");
    r.err = read("coordinator.err");
    r.rc = finished && p.exitCode() == 0 && !read("coordinator.rc").isEmpty() ? read("coordinator.rc").toInt() : -1;
    r.logs = "script: " + QString::fromUtf8(p.readAll()) + "\ncluster: " + read("cluster.json") + "\ncoordinator: " + r.out + "\n" + r.err;
    for (const QString& log : QDir(dir).entryList({"*.log"}, QDir::Files, QDir::Name)) r.logs += "\n" + log + ": " + read(log);
    return r;
}

} // namespace tstest
