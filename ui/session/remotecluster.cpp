#include "session/remotecluster.h"

#include <QMetaObject>

#include "data/auto_shard.h"
#include "distribute/cluster_spec.h"
#include "remote/auth.h"
#include "remote/coordinator.h"

namespace ts {
namespace {

const char* kEditorSource = "TF_CONFIG editor";

QString text(const Error& e)
{
    return QString::fromStdString(e.message) + (e.hint.empty() ? QString() : QStringLiteral(" (") + QString::fromStdString(e.hint) + QStringLiteral(")"));
}

remote::TlsFiles tlsOf(const RemoteSettings& s)
{
    remote::TlsFiles tls;
    tls.rootCa = s.tlsCa.trimmed().toStdString();
    return tls;
}

} // namespace

ClusterSummary summarizeCluster(const QString& tfConfig)
{
    ClusterSummary out;
    if (tfConfig.trimmed().isEmpty()) {
        out.error = QObject::tr("no cluster: paste a TF_CONFIG such as {\"cluster\": {\"worker\": [\"host1:7070\", \"host2:7070\"]}}");
        return out;
    }
    auto spec = ClusterSpec::fromText(tfConfig.toStdString(), kEditorSource);
    if (!spec.ok()) {
        out.error = text(spec.error());
        return out;
    }
    out.valid = true;
    out.chiefs = spec->count("chief");
    out.workers = spec->count("worker");
    out.ps = spec->count("ps");
    out.evaluators = spec->count("evaluator");
    for (const TaskId& id : spec->trainingTasks())
        out.trainingTasks << QString::fromStdString(id.toString() + " at " + *spec->address(id));
    return out;
}

QStringList exportTfConfigs(const QString& tfConfig, const QString& dir, QString* error)
{
    auto fail = [&](const QString& why) {
        if (error) *error = why;
        return QStringList();
    };
    if (tfConfig.trimmed().isEmpty()) return fail(QObject::tr("no cluster to export: describe the tasks first"));
    auto spec = ClusterSpec::fromText(tfConfig.toStdString(), kEditorSource);
    if (!spec.ok()) return fail(text(spec.error()));
    auto written = spec->writeTfConfigs(dir.toStdString());
    if (!written.ok()) return fail(text(written.error()));
    QStringList out;
    for (const auto& path : *written) out << QString::fromStdString(path);
    return out;
}

bool remoteStrategySupported(const QString& strategy)
{
    return remote::Coordinator::supportsStrategy(strategy.toStdString());
}

QStringList remoteProblems(const RemoteSettings& settings, const QString& strategy)
{
    QStringList p;
    auto spec = ClusterSpec::fromText(settings.tfConfig.toStdString(), kEditorSource);
    if (settings.isEmpty())
        p << QObject::tr("Workers: describe the cluster in the TF_CONFIG editor (Remote workers) first.");
    else if (!spec.ok())
        p << QObject::tr("Workers: %1").arg(text(spec.error()));
    else if (auto st = spec->validateFor(strategy.toStdString()); !st.ok())
        p << QObject::tr("Workers: %1").arg(text(st.error()));
    if (!remoteStrategySupported(strategy))
        p << QObject::tr("Strategy: remote workers cannot run %1 in this version; choose MultiWorkerMirrored.").arg(strategy);
    if (auto token = remote::loadToken(settings.tokenFile.trimmed().toStdString()); !token.ok())
        p << QObject::tr("Workers: %1").arg(text(token.error()));
    return p;
}

QString inputShardingProblem(const ClusterSummary& cluster, const QString& strategy, const PipelineSpec& pipeline)
{
    const int workers = strategy == QLatin1String("parameter-server") ? cluster.workers : static_cast<int>(cluster.trainingTasks.size());
    if (!cluster.valid || workers < 2 || pipeline.batchSize() == 0) return {};
    auto sharded = autoShardPipeline(pipeline, workers, 0, "the input pipeline");
    return sharded.ok() ? QString() : text(sharded.error());
}

ClusterProbe::ClusterProbe(QObject* parent) : QObject(parent)
{
    qRegisterMetaType<ts::WorkerProbeResult>();
    qRegisterMetaType<QList<ts::WorkerProbeResult>>();
}

ClusterProbe::~ClusterProbe()
{
    if (m_thread.joinable()) m_thread.join();
}

bool ClusterProbe::start(const RemoteSettings& settings, const QString& strategy, int timeoutMs, QString* error)
{
    auto fail = [&](const QString& why) {
        if (error) *error = why;
        return false;
    };
    if (m_running) return fail(tr("a check is already running"));
    const QStringList problems = remoteProblems(settings, strategy);
    if (!problems.isEmpty()) return fail(problems.join(QLatin1Char('\n')));
    remote::CoordinatorOptions o;
    o.spec = *ClusterSpec::fromText(settings.tfConfig.toStdString(), kEditorSource);
    o.token = *remote::loadToken(settings.tokenFile.trimmed().toStdString());
    o.tls = tlsOf(settings);
    auto c = remote::Coordinator::create(std::move(o), strategy.toStdString());
    if (!c.ok()) return fail(text(c.error()));
    if (m_thread.joinable()) m_thread.join();
    m_running = true;
    m_thread = std::thread([this, coordinator = std::shared_ptr<remote::Coordinator>(std::move(c).value()), timeoutMs] {
        QList<WorkerProbeResult> results;
        for (const auto& p : coordinator->probe(std::chrono::milliseconds(timeoutMs))) {
            WorkerProbeResult r;
            r.task = QString::fromStdString(p.id.toString());
            r.address = QString::fromStdString(p.address);
            r.ok = p.ok;
            r.problem = QString::fromStdString(p.problem);
            r.hint = QString::fromStdString(p.hint);
            if (!p.identity.version.empty())
                r.detail = tr("%1 (pid %2), %3 device(s), TrainStudio %4, %5")
                               .arg(QString::fromStdString(p.identity.hostname))
                               .arg(p.identity.pid)
                               .arg(p.identity.devices.size())
                               .arg(QString::fromStdString(p.identity.version), QString::fromStdString(p.identity.state));
            results << r;
        }
        QMetaObject::invokeMethod(this, [this, results] {
            m_running = false;
            Q_EMIT finished(results);
        }, Qt::QueuedConnection);
    });
    return true;
}

} // namespace ts
