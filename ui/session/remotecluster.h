#pragma once
// The studio's view of a cluster of trainstudio-worker daemons: the TF_CONFIG the user edits,
// the token and TLS files, checks of them in words the setup form can show, and a pre-flight
// probe of every task that runs off the GUI thread.
// Contract: GUI thread only. ClusterProbe::start returns at once; finished() arrives on the GUI
// thread with one result per training task (reachable or what is wrong, naming the task and
// its address). Destroying a ClusterProbe while it runs waits for the probe's timeout at most.

#include <QList>
#include <QObject>
#include <QString>
#include <QStringList>

#include <thread>

namespace ts {

struct RemoteSettings {
    QString tfConfig;    // TF_CONFIG JSON ("cluster" lists the tasks; a "task" entry is ignored)
    QString tokenFile;   // empty: $TRAINSTUDIO_TOKEN
    QString tlsCa;       // empty: plain gRPC; else verify the workers' certificates with it
    bool isEmpty() const { return tfConfig.trimmed().isEmpty(); }
    bool operator==(const RemoteSettings&) const = default;
};

struct ClusterSummary {
    bool valid = false;
    QString error;                   // why not valid (names the editor and the line or entry)
    int chiefs = 0, workers = 0, ps = 0, evaluators = 0;
    QStringList trainingTasks;       // "chief:0 at host:port", in rank order
};

// Parses the editor's TF_CONFIG text (source name "TF_CONFIG editor").
ClusterSummary summarizeCluster(const QString& tfConfig);
// Writes each task's TF_CONFIG ("tf_config-worker-0.json", ...) into `dir` for machines that run
// their task themselves (train --tf-config FILE); the files written, or empty with `error` set.
QStringList exportTfConfigs(const QString& tfConfig, const QString& dir, QString* error);
// Whether the coordinator can run `strategy` ("multi-worker-mirrored", "parameter-server").
bool remoteStrategySupported(const QString& strategy);
// What stops `strategy` from running on these settings (cluster roles, token); empty if nothing.
QStringList remoteProblems(const RemoteSettings& settings, const QString& strategy);
struct PipelineSpec;
// Why `pipeline` cannot be divided among the processes that train with `strategy` (the workers
// for "parameter-server", chief and workers otherwise) as its auto_shard policy says (too few
// files, too small a batch), or empty.
QString inputShardingProblem(const ClusterSummary& cluster, const QString& strategy, const PipelineSpec& pipeline);

struct WorkerProbeResult {
    QString task, address;
    bool ok = false;
    QString detail;          // "host (pid 123), 2 device(s), TrainStudio 0.4.0"
    QString problem, hint;   // why not ok
};

class ClusterProbe : public QObject {
    Q_OBJECT
public:
    explicit ClusterProbe(QObject* parent = nullptr);
    ~ClusterProbe() override;
    // Starts a probe of every training task; false (with the reason) if the settings are
    // unusable or a probe is already running.
    bool start(const RemoteSettings& settings, const QString& strategy, int timeoutMs = 3000, QString* error = nullptr);
    bool isRunning() const { return m_running; }

Q_SIGNALS:
    void finished(const QList<ts::WorkerProbeResult>& results);

private:
    std::thread m_thread;
    bool m_running = false;
};

} // namespace ts

Q_DECLARE_METATYPE(ts::WorkerProbeResult)
