#pragma once
// A trainstudio-worker daemon in its own process on an ephemeral loopback port (read back from
// --port-file), for the tests that need real processes (kill -9, SIGSTOP, several tasks).
// TS_WORKER_PATH is the daemon's path (tests/CMakeLists.txt defines it for distributed and ui).

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
    w->process->start(QStringLiteral(TS_WORKER_PATH), QStringList{"--listen", QString("127.0.0.1:%1").arg(port), "--name", name,
                                                                  "--port-file", portFile} + extra);
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

} // namespace tstest
