// ParameterServerStrategy across processes: the partitioner (round-robin, by size with a minimum
// shard, splitting along the first dimension); 2 workers with 1 and with 2 ps tasks (all
// trainstudio-worker daemons on loopback) train the seed's MLP on Fashion-MNIST to >= 0.85 test
// accuracy with the run recorded; the parameter service refuses calls without the token and
// oversized ones; a ps killed mid-run is detected and named.

#include <algorithm>
#include <limits>

#include <QtTest>

#include <filesystem>

#include <cmath>
#include <csignal>
#include <set>

#include <nlohmann/json.hpp>

#include "data/dataset.h"
#include "distribute/partitioner.h"
#include "distributed/local_evaluation.h"
#include "distributed/worker_process.h"
#include "io/safetensors.h"
#include "parameter_server.grpc.pb.h"
#include "train/run_config.h"
#include "worker.grpc.pb.h"
#include "remote/ps_client.h"
#include "remote/worker_service.h"
#include "store/run_store.h"
#include "train/trainer.h"

using namespace ts;
using namespace ts::remote;

namespace {

const std::string kToken = "ps-test-token";
constexpr int kEpochs = 4;

// The seed's MLP (784-256-10), as Program names its variables.
std::vector<VariableInfo> mlpVariables()
{
    return {{"dense/kernel", {784, 256}}, {"dense/bias", {256}}, {"dense_1/kernel", {256, 10}}, {"dense_1/bias", {10}}};
}

// Every element of every variable is held by exactly one slice, and slices are whole rows.
void checkCovers(const PartitionPlan& plan, const std::vector<VariableInfo>& vars)
{
    std::vector<std::vector<int>> seen(vars.size());
    for (std::size_t v = 0; v < vars.size(); ++v) seen[v].assign(static_cast<std::size_t>(vars[v].numel()), 0);
    for (const auto& ps : plan.perPs)
        for (const auto& s : ps) {
            const auto& v = vars[static_cast<std::size_t>(s.variable)];
            QCOMPARE(s.name, v.name);
            const int64_t rowSize = v.numel() / (v.shape.empty() ? 1 : v.shape[0]);
            QCOMPARE(s.offset, s.rowBegin * rowSize);
            QCOMPARE(s.count, (s.rowEnd - s.rowBegin) * rowSize);
            for (int64_t i = s.offset; i < s.offset + s.count; ++i) ++seen[static_cast<std::size_t>(s.variable)][static_cast<std::size_t>(i)];
        }
    for (std::size_t v = 0; v < vars.size(); ++v)
        for (int c : seen[v]) QCOMPARE(c, 1);
}

using tstest::WorkerProcess;

std::unique_ptr<WorkerProcess> spawnWorker(const QString& dir, const QString& name) { return tstest::spawnWorker(dir, name, kToken); }

struct Cluster {
    std::vector<std::unique_ptr<WorkerProcess>> workers, ps;
    QString file;
};

// `psExtra`: more arguments for the ps tasks' daemons.
Cluster startCluster(const QString& dir, int workers, int ps, const QStringList& psExtra = {})
{
    Cluster c;
    QStringList w, p;
    for (int i = 0; i < ps; ++i) {
        c.ps.push_back(tstest::spawnWorker(dir, QString("ps%1").arg(i), kToken, psExtra));
        p << QString("\"127.0.0.1:%1\"").arg(c.ps.back()->port);
    }
    for (int i = 0; i < workers; ++i) {
        c.workers.push_back(spawnWorker(dir, QString("worker%1").arg(i)));
        w << QString("\"127.0.0.1:%1\"").arg(c.workers.back()->port);
    }
    c.file = dir + "/cluster.json";
    QFile f(c.file);
    f.open(QIODevice::WriteOnly);
    f.write(QString(R"({"cluster": {"worker": [%1], "ps": [%2]}})").arg(w.join(", ")).arg(p.join(", ")).toUtf8());
    return c;
}

// One ps task and two workers, worker 0's daemon with --backup-root `backupRoot` (worker 0 writes
// a parameter-server run's backups).
struct BackedUpCluster {
    std::unique_ptr<WorkerProcess> ps, w0, w1;
    QString file;
};

BackedUpCluster startBackedUpCluster(const QString& dir, const QString& backupRoot)
{
    BackedUpCluster c;
    c.ps = spawnWorker(dir, "ps0");
    c.w0 = tstest::spawnWorker(dir, "worker0", kToken, {"--backup-root", backupRoot});
    c.w1 = spawnWorker(dir, "worker1");
    c.file = dir + "/cluster.json";
    QFile f(c.file);
    f.open(QIODevice::WriteOnly);
    f.write(QString(R"({"cluster": {"worker": ["127.0.0.1:%1", "127.0.0.1:%2"], "ps": ["127.0.0.1:%3"]}})")
                .arg(c.w0->port).arg(c.w1->port).arg(c.ps->port).toUtf8());
    return c;
}

std::unique_ptr<QProcess> startCoordinator(const QStringList& args)
{
    auto p = std::make_unique<QProcess>();
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    env.insert("TRAINSTUDIO_TOKEN", QString::fromStdString(kToken));
    env.insert("OMP_NUM_THREADS", "1");
    env.remove("TF_CONFIG");
    p->setProcessEnvironment(env);
    p->start(QStringLiteral(TS_CLI_PATH), args);
    return p;
}

// Fashion-MNIST and the seed's MLP: each worker takes half of every global batch of 64 and
// pushes an update per step (1876 updates per epoch over both workers).
QStringList trainArgs(const QString& cluster, int epochs)
{
    return {"train", "--cluster", cluster, "--strategy", "parameter-server", "--model", "mlp", "--epochs", QString::number(epochs),
            "--batch-size", "64", "--threads", "1"};
}

// A finished coordinator's --json summary (its last line; discarded JSON when it printed none),
// with its stdout appended to `out` and its stderr in `err`.
nlohmann::json finishedSummary(QProcess& coord, QString& out, QString& err)
{
    out += QString::fromUtf8(coord.readAllStandardOutput());
    err = QString::fromUtf8(coord.readAllStandardError());
    return nlohmann::json::parse(out.trimmed().split('\n').last().toStdString(), nullptr, false);
}

// The seed's MLP with the weights in `weights` scores `accuracy` on the whole test split here.
void checkScoresLocally(const QString& weights, double accuracy)
{
    auto local = tstest::evaluateWeightsFile(weights.toStdString());
    QVERIFY2(local.ok(), local.ok() ? "" : local.error().toString().c_str());
    QCOMPARE(local->examples, int64_t(10000));
    QVERIFY2(std::abs(local->accuracy - accuracy) < 1e-9, qPrintable(QString("%1 vs %2").arg(local->accuracy).arg(accuracy)));
}

} // namespace

class TestParameterServer : public QObject {
    Q_OBJECT
private slots:
    void partitionRoundRobin();
    void partitionBySize();
    void partitionSplitsAlongFirstDimension();
    void partitionRejectsBadOptions();
    void trainsWithOnePs();
    void trainsWithTwoPs();
    void psTaskWithoutVariables();
    void refusesPushWithoutToken();
    void psTaskAppliesPushesAndRefusesMalformedOnes();
    void snapshotRestoresTheOptimizer_data();
    void snapshotRestoresTheOptimizer();
    void restartedRunResumesFromBackup();
    void killedPsIsNamed();
    void killedWorkersStepsGoToTheOther();
    void silentWorkersStepsGoToTheOther();
    void stoppedWorkersStepsGoToTheOther();
    void lostWorkerRejoins_data();
    void lostWorkerRejoins();
    void slowWorkerTakesFewerSteps();
    void silentPsIsNamed();
    void smallValidationSet();
    void interruptedRunKeepsWeights();
    void pipelineShardsByFile();
    void mixedPrecisionWorkers();
    void evaluatorTask_data();
    void evaluatorTask();
    void failingEvaluatorDoesNotRejoin();
    void separateNetworkNamespaces();
    void evaluatorNotNeededWithoutValidation();
    void cutOffCoordinatorStopsTheTasks();

private:
    void trainEndToEnd(int ps, const QStringList& extra, const QStringList& psExtra = {});
    void killedTaskIsNamed(bool killPs, int signal = SIGKILL);
    void lostWorkerIsReplaced(int signal);
};

void TestParameterServer::partitionRoundRobin()
{
    const auto vars = mlpVariables();
    auto plan = partitionVariables(vars, 2, {});
    QVERIFY(plan.ok());
    QCOMPARE(plan->numPs(), 2);
    QCOMPARE(plan->perPs[0].size(), std::size_t(2));
    QCOMPARE(plan->perPs[0][0].toString(), std::string("dense/kernel[0:784]"));
    QCOMPARE(plan->perPs[0][1].toString(), std::string("dense_1/kernel[0:256]"));
    QCOMPARE(plan->perPs[1][0].toString(), std::string("dense/bias[0:256]"));
    QCOMPARE(plan->perPs[1][1].toString(), std::string("dense_1/bias[0:10]"));
    QCOMPARE(plan->elementsOn(0), int64_t(784 * 256 + 256 * 10));
    QCOMPARE(plan->elementsOn(1), int64_t(256 + 10));
    checkCovers(*plan, vars);
    // More ps than variables: the last ps holds nothing; one ps holds everything.
    auto wide = partitionVariables(vars, 5, {});
    QVERIFY(wide.ok());
    QVERIFY(wide->perPs[4].empty());
    checkCovers(*wide, vars);
    auto one = partitionVariables(vars, 1, {});
    QCOMPARE(one->perPs[0].size(), vars.size());
}

void TestParameterServer::partitionBySize()
{
    const auto vars = mlpVariables();
    PartitionOptions o;
    o.policy = "by-size";
    o.minShardBytes = 256 << 10;
    // dense/kernel is 784 KiB: 3 shards of >= 256 KiB would fit, but there are only 2 ps tasks.
    auto plan = partitionVariables(vars, 2, o);
    QVERIFY(plan.ok());
    QCOMPARE(plan->perPs[0][0].toString(), std::string("dense/kernel[0:392]"));
    QCOMPARE(plan->perPs[1][0].toString(), std::string("dense/kernel[392:784]"));
    QCOMPARE(plan->perPs[1][0].offset, int64_t(392 * 256));
    // The small ones stay whole, each on the ps that holds less at that point.
    QCOMPARE(plan->perPs[0][1].toString(), std::string("dense/bias[0:256]"));
    QCOMPARE(plan->perPs[1][1].toString(), std::string("dense_1/kernel[0:256]"));
    QCOMPARE(plan->perPs[0][2].toString(), std::string("dense_1/bias[0:10]"));
    checkCovers(*plan, vars);
    // A minimum shard above the variable's size keeps it whole.
    o.minShardBytes = 1 << 20;
    auto whole = partitionVariables(vars, 2, o);
    QVERIFY(whole.ok());
    QCOMPARE(whole->perPs[0][0].toString(), std::string("dense/kernel[0:784]"));
    QCOMPARE(whole->perPs[1].size(), std::size_t(3));  // the rest balance onto the other ps
    checkCovers(*whole, vars);
    // 300 KiB minimum: 784 KiB gives 2 shards even with 4 ps tasks.
    o.minShardBytes = 300 << 10;
    auto two = partitionVariables(vars, 4, o);
    QVERIFY(two.ok());
    int kernelShards = 0;
    for (const auto& ps : two->perPs)
        for (const auto& s : ps) kernelShards += s.name == "dense/kernel";
    QCOMPARE(kernelShards, 2);
    checkCovers(*two, vars);
    // Whole rows: 3 rows of 400 KB with a 512 KiB minimum make 2 shards by bytes, but 1 + 2 rows
    // would leave a 400 KB one; the variable stays whole.
    o.minShardBytes = 512 << 10;
    const std::vector<VariableInfo> wide = {{"wide", {3, 100000}}};
    auto rows = partitionVariables(wide, 2, o);
    QVERIFY(rows.ok());
    QCOMPARE(rows->perPs[0].size(), std::size_t(1));
    QCOMPARE(rows->perPs[0][0].toString(), std::string("wide[0:3]"));
    QVERIFY(rows->perPs[1].empty());
    // 4 rows: 2 shards of 2 rows (800 KB each).
    auto even = partitionVariables({{"wide", {4, 100000}}}, 2, o);
    QVERIFY(even.ok());
    QCOMPARE(even->perPs[0][0].toString(), std::string("wide[0:2]"));
    QCOMPARE(even->perPs[1][0].toString(), std::string("wide[2:4]"));
}

void TestParameterServer::partitionSplitsAlongFirstDimension()
{
    PartitionOptions o;
    o.policy = "by-size";
    o.minShardBytes = 4;
    // Uneven rows: 7 rows of 3 over 3 ps -> 2, 2, 3 rows, on distinct ps tasks.
    const std::vector<VariableInfo> vars = {{"w", {7, 3}}, {"b", {2}}, {"s", {}}};
    auto plan = partitionVariables(vars, 3, o);
    QVERIFY(plan.ok());
    std::vector<std::string> w;
    for (int p = 0; p < 3; ++p) {
        int here = 0;
        for (const auto& s : plan->perPs[static_cast<std::size_t>(p)])
            if (s.name == "w") {
                w.push_back(s.toString());
                ++here;
            }
        QVERIFY(here <= 1);
    }
    QCOMPARE(w, (std::vector<std::string>{"w[0:2]", "w[2:4]", "w[4:7]"}));
    // No more shards than rows (b has 2), and a scalar is one shard.
    int bShards = 0, sShards = 0;
    for (const auto& ps : plan->perPs)
        for (const auto& s : ps) {
            bShards += s.name == "b";
            sShards += s.name == "s";
        }
    QCOMPARE(bShards, 2);
    QCOMPARE(sShards, 1);
    checkCovers(*plan, vars);
}

void TestParameterServer::partitionRejectsBadOptions()
{
    QVERIFY(!partitionVariables(mlpVariables(), 0, {}).ok());
    PartitionOptions bad;
    bad.policy = "fixed";
    auto r = partitionVariables(mlpVariables(), 2, bad);
    QVERIFY(!r.ok());
    QVERIFY2(r.error().message.find("unknown partitioner 'fixed'") != std::string::npos, r.error().message.c_str());
    QVERIFY(!partitionVariables({{"w", {0, 3}}}, 1, {}).ok());
    auto j = PartitionOptions::fromJson({{"policy", "by-size"}, {"min_shard_bytes", 2}}, "strategy.partition");
    QVERIFY(!j.ok());
    QVERIFY2(j.error().message.find("strategy.partition.min_shard_bytes") != std::string::npos, j.error().message.c_str());
    auto k = PartitionOptions::fromJson({{"policy", "by-size"}, {"shards", 2}}, "strategy.partition");
    QVERIFY(!k.ok());
    auto ok = PartitionOptions::fromJson({{"policy", "by-size"}, {"min_shard_bytes", 65536}}, "strategy.partition");
    QVERIFY(ok.ok());
    QCOMPARE(ok->minShardBytes, int64_t(65536));
    QCOMPARE(PartitionOptions::fromJson(ok->toJson(), "x")->policy, std::string("by-size"));
    // The run configuration carries it (strategy.partition) to every task.
    RunConfig cfg;
    cfg.model = *loadModelFile(std::string(TS_SOURCE_DIR) + "/resources/models/seed_mlp.json");
    cfg.strategy.kind = "parameter-server";
    cfg.strategy.partition = *ok;
    auto back = RunConfig::fromJson(cfg.toJson(), "run.json");
    QVERIFY(back.ok());
    QCOMPARE(back->strategy.partition.policy, std::string("by-size"));
    QCOMPARE(back->strategy.partition.minShardBytes, int64_t(65536));
    nlohmann::json badJson = cfg.toJson();
    badJson["strategy"]["partition"]["policy"] = "random";
    auto refused = RunConfig::fromJson(badJson, "run.json");
    QVERIFY(!refused.ok());
    QVERIFY2(refused.error().message.find("run.json: strategy.partition.policy: unknown partitioner 'random'") != std::string::npos,
             refused.error().message.c_str());
}

void TestParameterServer::trainEndToEnd(int ps, const QStringList& extra, const QStringList& psExtra)
{
    QTemporaryDir dir;
    Cluster c = startCluster(dir.path(), 2, ps, psExtra);
    for (const auto& w : c.workers) QVERIFY(w->port > 0);
    for (const auto& p : c.ps) QVERIFY(p->port > 0);
    const QString db = dir.filePath("runs.db");
    const QString weights = dir.filePath("final.safetensors");
    QElapsedTimer timer;
    timer.start();
    // 4 epochs: 2 or 3 reach only 0.86 here, too close to the bar for an asynchronous run.
    auto coord = startCoordinator(trainArgs(c.file, kEpochs) + extra + QStringList{"--db", db, "--json", "--save-weights", weights});
    QVERIFY(coord->waitForFinished(120000));
    const double secs = timer.elapsed() / 1000.0;
    // --json's lines are on stdout (the last is the summary); warnings go to stderr.
    const QString out = QString::fromUtf8(coord->readAllStandardOutput());
    QVERIFY2(coord->exitCode() == 0, qPrintable(out + QString::fromUtf8(coord->readAllStandardError())));
    const auto j = nlohmann::json::parse(out.trimmed().split('\n').last().toStdString(), nullptr, false);
    QVERIFY2(!j.is_discarded() && j.value("final", false), qPrintable(out));
    const double acc = j.value("val_accuracy", 0.0);
    // The coordinator evaluates the ps tasks' weights after every epoch: the run reaches the
    // accuracy at its best epoch. Asynchronous updates make the last epoch wobble by about a
    // point (0.849-0.876 at the end of 4 epochs here).
    double best = acc;
    int evaluated = 0;
    for (const QString& line : out.trimmed().split('\n')) {
        const auto e = nlohmann::json::parse(line.toStdString(), nullptr, false);
        if (e.is_discarded() || !e.is_object() || !e.contains("val_accuracy") || e.value("final", false)) continue;
        best = std::max(best, e.value("val_accuracy", 0.0));
        ++evaluated;
    }
    QCOMPARE(evaluated, kEpochs);  // one evaluation per epoch
    const auto& tasks = j["tasks"];
    const int64_t steps0 = tasks["worker:0"].value("steps", int64_t{0}), steps1 = tasks["worker:1"].value("steps", int64_t{0});
    int64_t updates = 0;
    for (int p = 0; p < ps; ++p) {
        const std::string name = "ps:" + std::to_string(p);
        QVERIFY2(tasks.contains(name), j.dump().c_str());
        // Every push reaches every ps: each applied one update per worker step.
        QCOMPARE(tasks[name].value("updates", int64_t{-1}), steps0 + steps1);
        updates = tasks[name].value("updates", int64_t{0});
    }
    qInfo("%d ps: test accuracy %.4f (best epoch %.4f) after %lld updates in %.1f s; staleness mean %.2f / %.2f, max %lld / %lld (worker 0 / 1)", ps, acc,
          best, static_cast<long long>(updates), secs, tasks["worker:0"].value("staleness_mean", -1.0), tasks["worker:1"].value("staleness_mean", -1.0),
          static_cast<long long>(tasks["worker:0"].value("staleness_max", int64_t{-1})),
          static_cast<long long>(tasks["worker:1"].value("staleness_max", int64_t{-1})));
    // 60000 examples, each worker 32 of every 64: 938 batches per worker and pass, so an epoch
    // is 1876 steps, handed to whichever worker asks (ps:0's schedule): both train a share.
    QCOMPARE(steps0 + steps1, int64_t(kEpochs * 1876));
    QVERIFY2(steps0 > kEpochs * 1876 / 4 && steps1 > kEpochs * 1876 / 4, qPrintable(QString("%1 / %2 steps").arg(steps0).arg(steps1)));
    QCOMPARE(tasks["ps:0"].value("steps_completed", int64_t{-1}), int64_t(kEpochs * 1876));
    QCOMPARE(j["steps"].get<int64_t>(), steps0 + steps1);
    QCOMPARE(tasks["worker:0"].value("pushes", int64_t{0}), steps0);
    QVERIFY2(best >= 0.85, qPrintable(QString("best test accuracy %1 (last %2)").arg(best).arg(acc)));
    QVERIFY2(acc >= 0.83, qPrintable(QString("test accuracy at the end %1").arg(acc)));
    // Asynchronous: with two workers pushing, some pushes find updates applied since their pull.
    QVERIFY(tasks["worker:0"].value("staleness_max", int64_t{0}) + tasks["worker:1"].value("staleness_max", int64_t{0}) > 0);
    QVERIFY2(secs < 60.0, qPrintable(QString("took %1 s").arg(secs)));

    // The run is recorded: completed, parameter-server, the final test accuracy in its last epoch,
    // each worker's staleness next to the step metrics.
    const std::string runId = j["run_id"].get<std::string>();
    auto store = store::RunStore::open(db.toStdString());
    QVERIFY2(store.ok(), store.ok() ? "" : store.error().toString().c_str());
    auto info = store->run(runId);
    QVERIFY(info.ok());
    QCOMPARE(info->strategy, std::string("parameter-server"));
    QCOMPARE(info->status, store::RunState::Completed);
    auto epochs = store->epochMetrics(runId);
    QVERIFY(epochs.ok());
    QCOMPARE(epochs->size(), std::size_t(kEpochs));
    QCOMPARE(epochs->back().metrics.at("val_accuracy"), acc);
    auto names = store->metricNames(runId);
    QVERIFY(names.ok());
    for (const char* m : {"loss", "accuracy", "staleness", "staleness/worker:0", "staleness/worker:1"})
        QVERIFY2(std::find(names->begin(), names->end(), m) != names->end(), m);
    // "staleness" is the worst worker's at each recorded step (it was worker 0's alone).
    {
        store::SeriesQuery all;
        all.buckets = 0;
        auto worst = store->series(runId, "staleness", all);
        auto w0 = store->series(runId, "staleness/worker:0", all);
        auto w1 = store->series(runId, "staleness/worker:1", all);
        QVERIFY(worst.ok() && w0.ok() && w1.ok());
        // A worker's series starts at its first report, so the steps are matched, not indices.
        std::map<int64_t, double> expected;
        for (const auto* s : {&*w0, &*w1})
            for (const auto& p : s->points) expected[p.step] = std::max(expected.count(p.step) ? expected[p.step] : 0.0, p.value);
        QCOMPARE(worst->points.size(), expected.size());
        for (const auto& p : worst->points) QCOMPARE(p.value, expected[p.step]);
    }
    // Every ps task streams telemetry too (it sent none): its host and process samples on its
    // lane, and its shard's load each second as counter tracks (busy %, updates/s, ...).
    {
        auto samples = store->deviceSamples(runId);
        auto spans = store->spans(runId);
        QVERIFY(samples.ok() && spans.ok());
        for (int p = 0; p < ps; ++p) {
            const std::string name = "ps:" + std::to_string(p);
            int host = 0, busyTrack = 0, updatesTrack = 0;
            double updatesPerSec = 0;
            for (const auto& d : *samples)
                if (d.stamp.lane.worker == name && d.stamp.lane.device.empty() && d.processCpu >= 0) ++host;
            for (const auto& sp : *spans) {
                if (sp.stamp.lane.worker != name || sp.category != "counter") continue;
                const double v = std::stod(sp.args.at("value"));
                if (sp.name == "ps busy %") {
                    ++busyTrack;
                    QVERIFY2(v >= 0 && v <= 100, qPrintable(QString::number(v)));
                } else if (sp.name == "ps updates/s") {
                    ++updatesTrack;
                    updatesPerSec = std::max(updatesPerSec, v);
                }
            }
            qInfo("%s: %d host samples, %d busy-%% counters, up to %.0f updates/s", name.c_str(), host, busyTrack, updatesPerSec);
            QVERIFY2(host >= 2, name.c_str());
            QVERIFY2(busyTrack >= 2 && updatesTrack == busyTrack, name.c_str());
            QVERIFY2(updatesPerSec > 10, name.c_str());
        }
    }
    auto kept = store->checkpoints(runId);
    QVERIFY(kept.ok() && kept->size() == 1);
    // The store keeps its own copy of the --save-weights file.
    QVERIFY2(kept->front().path.ends_with("/final.safetensors") &&
                 std::filesystem::file_size(kept->front().path) == std::filesystem::file_size(weights.toStdString()),
             kept->front().path.c_str());

    // The saved weights are the ones evaluated: loaded into a local model they score the same.
    checkScoresLocally(weights, acc);
    if (QTest::currentTestFailed()) return;
}

// mixed_float16 on parameter-server workers: each worker scales its own loss and pushes unscaled
// gradients (a step whose gradients overflow pushes nothing); the run trains, and the loss scale
// reaches the recorded step metrics.
void TestParameterServer::mixedPrecisionWorkers()
{
    QTemporaryDir dir;
    Cluster c = startCluster(dir.path(), 2, 1);
    QVERIFY(c.ps[0]->port > 0 && c.workers[0]->port > 0 && c.workers[1]->port > 0);
    const QString db = dir.filePath("runs.db");
    auto coord = startCoordinator(trainArgs(c.file, 2) + QStringList{"--limit", "6400", "--precision", "mixed_float16", "--db", db, "--json"});
    QVERIFY(coord->waitForFinished(120000));
    const QString out = QString::fromUtf8(coord->readAllStandardOutput());
    QVERIFY2(coord->exitCode() == 0, qPrintable(out + QString::fromUtf8(coord->readAllStandardError())));
    const auto j = nlohmann::json::parse(out.trimmed().split('\n').last().toStdString(), nullptr, false);
    QVERIFY2(!j.is_discarded() && j.value("final", false), qPrintable(out));
    QVERIFY2(j.value("val_accuracy", 0.0) > 0.7, qPrintable(out));
    const auto& tasks = j["tasks"];
    // A step whose gradients overflow pushes nothing. At Keras' 2^15 that is rare for this MLP
    // but not impossible with stale weights (one run in 18 saw a skip): a few, not none.
    int64_t skipped = 0;
    for (const char* w : {"worker:0", "worker:1"}) {
        const int64_t steps = tasks[w].value("steps", int64_t{0}), pushes = tasks[w].value("pushes", int64_t{-1});
        QVERIFY2(steps > 0 && pushes <= steps && pushes >= steps - steps / 50, qPrintable(QString("%1: %2 pushes for %3 steps").arg(w).arg(pushes).arg(steps)));
        skipped += steps - pushes;
    }
    auto store = store::RunStore::open(db.toStdString());
    QVERIFY(store.ok());
    const std::string runId = j["run_id"].get<std::string>();
    auto info = store->run(runId);
    QVERIFY(info.ok());
    QCOMPARE(info->config.value("precision", nlohmann::json()), nlohmann::json("mixed_float16"));
    store::SeriesQuery all;
    all.buckets = 0;
    auto scale = store->series(runId, "loss_scale", all);
    QVERIFY2(scale.ok() && !scale->points.empty(), scale.ok() ? "no loss_scale points" : scale.error().toString().c_str());
    // Each skip halves the skipping worker's scale, and 2000 good steps would be needed to
    // double it: every recorded scale is 2^15 down to 2^(15 - skips), and 2^15 when none skipped.
    for (const auto& p : scale->points) {
        int exponent = 0;
        QVERIFY2(std::frexp(p.value, &exponent) == 0.5 && exponent - 1 <= 15 && exponent - 1 >= 15 - skipped,
                 qPrintable(QString("loss scale %1 with %2 skipped steps").arg(p.value).arg(skipped)));
    }

    // A fixed scale that overflows every step: each worker's epoch changed no weight, and the
    // coordinator says so naming the worker (before, only a local run's CLI said it).
    QFile huge(dir.filePath("huge_scale.json"));
    QVERIFY(huge.open(QIODevice::WriteOnly));
    huge.write(R"({"precision": {"policy": "mixed_float16", "loss_scale": 1e30}})");
    huge.close();
    // 100 steps: each worker gets some of epoch 1's, however slowly it starts.
    auto flat = startCoordinator(trainArgs(c.file, 1) + QStringList{"--limit", "6400", "--config", huge.fileName(), "--no-record", "--no-validation"});
    QVERIFY(flat->waitForFinished(120000));
    const QString flatErr = QString::fromUtf8(flat->readAllStandardError());
    QVERIFY2(flat->exitCode() == 0, qPrintable(flatErr));
    for (const char* w : {"worker:0", "worker:1"})
        QVERIFY2(flatErr.contains(QString("warning: %1: epoch 1: all ").arg(w)) && flatErr.contains("steps were skipped"), qPrintable(flatErr));
}

// TF's side-car evaluator: the cluster's evaluator task evaluates the ps tasks' weights on its
// own machine after each epoch and at the end. Killed or silent, it is named and the coordinator
// takes over, and the run goes on.
void TestParameterServer::evaluatorTask_data()
{
    QTest::addColumn<int>("signal");  // sent to the evaluator's daemon after epoch 1 (0: none)
    // With --restarts 1, the killed daemon started again on its port (as a supervisor would).
    QTest::addColumn<bool>("restartDaemon");
    QTest::newRow("evaluates every epoch") << 0 << false;
    QTest::newRow("killed after epoch 1") << int(SIGKILL) << false;
    QTest::newRow("stopped after epoch 1") << int(SIGSTOP) << false;
    QTest::newRow("killed after epoch 1, its daemon restarted: rejoins") << int(SIGKILL) << true;
}

void TestParameterServer::evaluatorTask()
{
    QFETCH(int, signal);
    QFETCH(bool, restartDaemon);
    const bool kill = signal != 0;
    QTemporaryDir dir;
    // Backups (worker 0's daemon keeps them) make --restarts possible.
    Cluster c;
    BackedUpCluster b;
    int ports[3];  // worker 0, worker 1, ps 0
    if (restartDaemon) {
        b = startBackedUpCluster(dir.path(), dir.filePath("w0-backups"));
        ports[0] = b.w0->port, ports[1] = b.w1->port, ports[2] = b.ps->port;
    } else {
        c = startCluster(dir.path(), 2, 1);
        ports[0] = c.workers[0]->port, ports[1] = c.workers[1]->port, ports[2] = c.ps[0]->port;
    }
    auto ev = spawnWorker(dir.path(), "evaluator0");
    QVERIFY(ports[0] > 0 && ports[1] > 0 && ports[2] > 0 && ev->port > 0);
    const QString cluster = dir.filePath("cluster.json");
    {
        QFile f(cluster);
        QVERIFY(f.open(QIODevice::WriteOnly));
        f.write(QString(R"({"cluster": {"worker": ["127.0.0.1:%1", "127.0.0.1:%2"], "ps": ["127.0.0.1:%3"], "evaluator": ["127.0.0.1:%4"]}})")
                    .arg(ports[0]).arg(ports[1]).arg(ports[2]).arg(ev->port).toUtf8());
    }
    // Rejoining takes a probe (every 0.5 s) after the loss at epoch 2: longer epochs leave time
    // for it before the final evaluation.
    const int epochs = restartDaemon ? 4 : 3;
    const QString weights = dir.filePath("final.safetensors");
    QStringList args = trainArgs(cluster, epochs) + QStringList{"--limit", restartDaemon ? "25600" : "12800", "--db", dir.filePath("runs.db"),
                                                                "--json", "--save-weights", weights};
    if (restartDaemon) args += QStringList{"--backup-dir", "run-r", "--backup-every-steps", "500", "--restarts", "1"};
    auto coord = startCoordinator(args);
    QString out;
    if (kill) {
        QVERIFY2(tstest::readUntil(*coord, out, "\"epoch\":1"), qPrintable(out + coord->readAllStandardError()));
        ::kill(static_cast<pid_t>(ev->process->processId()), signal);
    }
    if (restartDaemon) {
        const int port = ev->port;
        ev->process->waitForFinished();
        ev = tstest::spawnWorker(dir.path(), "evaluator0", kToken, {}, port);
        QCOMPARE(ev->port, port);
    }
    const bool finished = coord->waitForFinished(120000);
    if (signal == SIGSTOP) ::kill(static_cast<pid_t>(ev->process->processId()), SIGCONT);  // so it can be shut down
    QVERIFY(finished);
    QString err;
    const auto j = finishedSummary(*coord, out, err);
    QVERIFY2(coord->exitCode() == 0 && !j.is_discarded() && j.value("final", false), qPrintable(out + err));
    const auto& tasks = j["tasks"];
    // Every epoch was evaluated (by one or the other).
    int evaluated = 0;
    for (const QString& line : out.trimmed().split('\n')) {
        const auto e = nlohmann::json::parse(line.toStdString(), nullptr, false);
        if (!e.is_discarded() && e.is_object() && e.contains("val_accuracy") && !e.value("final", false)) ++evaluated;
    }
    QCOMPARE(evaluated, epochs);
    const double acc = j.value("val_accuracy", 0.0);
    QVERIFY2(acc > 0.7, qPrintable(out));
    if (restartDaemon) {
        // Lost at epoch 2 (the coordinator evaluated it), back with a new task for a later epoch
        // or the final weights, which it evaluated.
        QCOMPARE(tasks["evaluator_lost"].value("task", ""), std::string("evaluator:0"));
        QVERIFY2(tasks.contains("rejoined") && tasks["rejoined"].size() == 1 && tasks["rejoined"][0].value("task", "") == "evaluator:0",
                 qPrintable(out));
        QVERIFY2(tasks["rejoined"][0].value("at_epoch", int64_t{0}) >= 2, qPrintable(out));
        QCOMPARE(tasks["evaluation"].value("by", ""), std::string("evaluator:0"));
        QVERIFY(tasks["evaluator:0"].value("evaluations", int64_t{0}) >= 1);
        QCOMPARE(j.value("rejoins", 0), 1);
        QVERIFY2(err.contains("answers again: evaluator:0 evaluates the run again with a new task (restart 1 of 1)"), qPrintable(err));
        for (const QString& line : err.split('\n'))
            if (line.contains("evaluator:0")) qInfo("%s", qPrintable(line));
        qInfo("rejoined at epoch %lld of %d", static_cast<long long>(tasks["rejoined"][0].value("at_epoch", int64_t{0})), epochs);
    } else if (!kill) {
        QCOMPARE(tasks["evaluation"].value("by", ""), std::string("evaluator:0"));
        // Each epoch and the final weights.
        QCOMPARE(tasks["evaluator:0"].value("evaluations", int64_t{0}), int64_t(epochs + 1));
        QVERIFY2(!tasks.contains("evaluator_lost"), qPrintable(out));
        QVERIFY2(!err.contains("evaluator"), qPrintable(err));
    } else {
        QCOMPARE(tasks["evaluation"].value("by", ""), std::string("coordinator"));
        QCOMPARE(tasks["evaluator_lost"].value("task", ""), std::string("evaluator:0"));
        const QString named = QString("evaluator:0 at 127.0.0.1:%1").arg(ev->port);
        QVERIFY2(err.contains(named) && err.contains("the coordinator evaluates the run from now on"), qPrintable(err));
        for (const QString& line : err.split('\n'))
            if (line.contains("evaluator:0")) qInfo("%s", qPrintable(line));
    }
    // The final evaluation is of the final weights (after every worker's last push).
    checkScoresLocally(weights, acc);
}

// With --restarts, an evaluator whose task fails (here: the data folder has no test split) is
// not taken back although its daemon still answers: a new task would fail the same way and
// spend the restarts a lost worker may need. Nor can the coordinator, on the same folder,
// evaluate: the run trains on without validation and says so.
void TestParameterServer::failingEvaluatorDoesNotRejoin()
{
    QTemporaryDir dir;
    BackedUpCluster c = startBackedUpCluster(dir.path(), dir.filePath("w0-backups"));
    auto ev = spawnWorker(dir.path(), "evaluator0");
    QVERIFY(c.ps->port > 0 && c.w0->port > 0 && c.w1->port > 0 && ev->port > 0);
    const QString data = dir.filePath("train-only");
    QVERIFY(QDir().mkpath(data));
    for (const char* f : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"})
        QVERIFY(QFile::link(QString::fromStdString(defaultFashionMnistDir()) + "/" + f, data + "/" + f));
    const QString cluster = dir.filePath("cluster.json");
    {
        QFile f(cluster);
        QVERIFY(f.open(QIODevice::WriteOnly));
        f.write(QString(R"({"cluster": {"worker": ["127.0.0.1:%1", "127.0.0.1:%2"], "ps": ["127.0.0.1:%3"], "evaluator": ["127.0.0.1:%4"]}})")
                    .arg(c.w0->port).arg(c.w1->port).arg(c.ps->port).arg(ev->port).toUtf8());
    }
    constexpr int epochs = 3;
    auto coord = startCoordinator(trainArgs(cluster, epochs) + QStringList{"--limit", "12800", "--db", dir.filePath("runs.db"), "--json",
                                                                          "--data", data, "--backup-dir", "run-r", "--backup-every-steps",
                                                                          "500", "--restarts", "1"});
    QVERIFY(coord->waitForFinished(120000));
    QString out, err;
    const auto j = finishedSummary(*coord, out, err);
    QVERIFY2(coord->exitCode() == 0 && !j.is_discarded() && j.value("final", false), qPrintable(out + err));
    const auto& tasks = j["tasks"];
    QCOMPARE(tasks["evaluator_lost"].value("task", ""), std::string("evaluator:0"));
    QVERIFY2(tasks["evaluator_lost"].value("why", "").find("t10k") != std::string::npos, qPrintable(out));
    QVERIFY2(!tasks.contains("rejoined"), qPrintable(out));
    QCOMPARE(j.value("rejoins", -1), 0);
    QCOMPARE(j["epochs"].get<int64_t>(), int64_t(epochs));
    QVERIFY2(!err.contains("answers again"), qPrintable(err));
    QVERIFY2(err.contains("the run goes on without validation"), qPrintable(err));
    QVERIFY(!j.contains("val_accuracy"));
}

// The ps task, both workers and the evaluator as daemons in their own network namespaces, the
// coordinator in another, joined by a bridge: every pull, push, claim and control call crosses a
// link with its own addresses, as between machines.
void TestParameterServer::separateNetworkNamespaces()
{
    QTemporaryDir dir;
    const auto r = tstest::runInNetworkNamespaces(dir.path(), {"ps", "worker", "worker", "evaluator"},
                                                  trainArgs("", 3).mid(3) + QStringList{"--limit", "12800", "--no-record", "--json"}, kToken);
    if (!r.available) QSKIP("no unprivileged user and network namespaces with bridges and veth links here (unshare -rn, iproute2)");
    QVERIFY2(r.rc == 0, qPrintable(r.logs));
    const auto j = nlohmann::json::parse(r.out.split('\n').last().toStdString(), nullptr, false);
    QVERIFY2(!j.is_discarded() && j.value("final", false), qPrintable(r.logs));
    const auto& tasks = j["tasks"];
    QCOMPARE(tasks["ps:0"].value("steps_completed", int64_t{0}), int64_t(3 * 400));
    QVERIFY2(tasks["worker:0"].value("steps", int64_t{0}) > 0 && tasks["worker:1"].value("steps", int64_t{0}) > 0, qPrintable(r.logs));
    QCOMPARE(tasks["evaluation"].value("by", ""), std::string("evaluator:0"));
    QVERIFY2(j.value("val_accuracy", 0.0) > 0.7, qPrintable(r.logs));
    // Who talked to whom, as each daemon saw it: the coordinator from 10.77.0.1, worker 0 (10.77.0.3) initialised ps:0.
    QFile ps(dir.filePath("ps0.log"));
    QVERIFY(ps.open(QIODevice::ReadOnly));
    const QString psLog = QString::fromUtf8(ps.readAll());
    QVERIFY2(psLog.contains("starting ps:0 of run") && psLog.contains("for ipv4:10.77.0.1:"), qPrintable(psLog));
    QVERIFY2(psLog.contains("by ipv4:10.77.0.3:"), qPrintable(psLog));
}

// The coordinator's machine cut off mid-run (its address gone: no reset, no closed socket) while
// the daemons still reach each other: every task notices that nobody follows it any more (its
// event stream's pings or data go unanswered) and is cancelled, the idle evaluator too, instead
// of training for nobody until TCP gives up many minutes later. (A worker may fail first when its
// ps task was cancelled before it noticed: stopped either way.)
void TestParameterServer::cutOffCoordinatorStopsTheTasks()
{
    QTemporaryDir dir;
    const auto r = tstest::runInNetworkNamespaces(dir.path(), {"ps", "worker", "worker", "evaluator"},
                                                  trainArgs("", 1000).mid(3) + QStringList{"--limit", "6400", "--no-record", "--json"}, kToken,
                                                  "\"epoch\":1");
    if (!r.available) QSKIP("no unprivileged user and network namespaces with bridges and veth links here (unshare -rn, iproute2)");
    QVERIFY2(r.rc == 1, qPrintable(r.logs));  // the coordinator lost every task
    for (const char* name : {"ps0", "worker0", "worker1", "evaluator0"}) {
        QFile f(dir.filePath(QString(name) + ".noticed"));
        QVERIFY2(f.open(QIODevice::ReadOnly), qPrintable(r.logs));
        const QString secs = QString::fromUtf8(f.readAll()).trimmed();
        qInfo("%s ended its task %s s after its coordinator was cut off", name, qPrintable(secs));
        // Pinged after 10 s without traffic, 5 s to answer; the poll adds a moment.
        QFile log(dir.filePath(QString(name) + ".log"));
        QVERIFY(log.open(QIODevice::ReadOnly));
        QVERIFY2(secs != "never" && secs.toDouble() < 25.0, qPrintable(QString(name) + ": " + secs + "\n" + QString::fromUtf8(log.readAll())));
    }
}

// A run that does not validate has nothing for an evaluator to do: it is neither probed nor
// started (here nothing listens at its address), and the CLI says so.
void TestParameterServer::evaluatorNotNeededWithoutValidation()
{
    QTemporaryDir dir;
    Cluster c = startCluster(dir.path(), 2, 1);
    QVERIFY(c.ps[0]->port > 0 && c.workers[0]->port > 0 && c.workers[1]->port > 0);
    int unused = 0;
    {
        auto gone = spawnWorker(dir.path(), "gone");  // a port nobody listens at once it exits
        unused = gone->port;
    }
    QVERIFY(unused > 0);
    {
        QFile f(c.file);
        QVERIFY(f.open(QIODevice::WriteOnly));
        f.write(QString(R"({"cluster": {"worker": ["127.0.0.1:%1", "127.0.0.1:%2"], "ps": ["127.0.0.1:%3"], "evaluator": ["127.0.0.1:%4"]}})")
                    .arg(c.workers[0]->port).arg(c.workers[1]->port).arg(c.ps[0]->port).arg(unused).toUtf8());
    }
    auto coord = startCoordinator(trainArgs(c.file, 1) + QStringList{"--limit", "3200", "--no-validation", "--no-record", "--json"});
    QVERIFY(coord->waitForFinished(120000));
    const QString out = QString::fromUtf8(coord->readAllStandardOutput()), err = QString::fromUtf8(coord->readAllStandardError());
    QVERIFY2(coord->exitCode() == 0, qPrintable(out + err));
    QVERIFY2(err.contains("the evaluator task is not started: the run does not validate"), qPrintable(err));
    const auto j = nlohmann::json::parse(out.trimmed().split('\n').last().toStdString(), nullptr, false);
    QVERIFY2(!j.is_discarded() && j.value("final", false) && !j["tasks"].contains("evaluation"), qPrintable(out));

    // A run that validates is not held up by it either (TF's side-car evaluator is not needed to
    // train): the pre-flight warns, and the coordinator evaluates.
    auto validating = startCoordinator(trainArgs(c.file, 1) + QStringList{"--limit", "3200", "--no-record", "--json"});
    QVERIFY(validating->waitForFinished(120000));
    QString out2, err2;
    const auto v = finishedSummary(*validating, out2, err2);
    QVERIFY2(validating->exitCode() == 0 && !v.is_discarded() && v.value("final", false), qPrintable(out2 + err2));
    const QString named = QString("warning: pre-flight: evaluator:0 at 127.0.0.1:%1").arg(unused);
    QVERIFY2(err2.contains(named) && err2.contains("the run goes on without it"), qPrintable(err2));
    QCOMPARE(v["tasks"]["evaluation"].value("by", ""), std::string("coordinator"));
    QCOMPARE(v["tasks"]["evaluator_lost"].value("epoch", int64_t{-1}), int64_t(0));
    QVERIFY(v.value("val_accuracy", 0.0) > 0.4);  // 0.1 by chance; 0.6-0.7 after this one short epoch
}

void TestParameterServer::trainsWithOnePs()
{
    // The ps daemon bounds messages to 256 KiB: the MLP's 0.81 MB shard travels in 4 parts.
    trainEndToEnd(1, {}, {"--max-message-bytes", "262144"});
}

void TestParameterServer::trainsWithTwoPs()
{
    // by-size with a 64 KiB minimum: dense/kernel is split over both ps tasks.
    trainEndToEnd(2, {"--partitioner", "by-size", "--min-shard-bytes", "65536"});
}

// Round-robin with more ps tasks than variables leaves a ps task without any (TF allows it): it
// holds an empty shard and the run trains as usual. Its layout used to be taken for a values part
// and refused until the workers gave up after 60 s.
void TestParameterServer::psTaskWithoutVariables()
{
    QTemporaryDir dir;
    Cluster c = startCluster(dir.path(), 2, 3);
    for (const auto& p : c.ps) QVERIFY(p->port > 0);
    // One Dense layer: a kernel (ps:0) and a bias (ps:1); ps:2 gets nothing.
    const QString model = dir.filePath("linear.json");
    {
        QFile f(model);
        QVERIFY(f.open(QIODevice::WriteOnly));
        f.write(R"({"format": "trainstudio-model", "version": 1, "name": "linear",
                    "layers": [{"id": "input", "type": "Input", "attrs": {"shape": [784]}},
                               {"id": "dense", "type": "Dense", "inputs": ["input"], "attrs": {"activation": "softmax", "units": 10}}],
                    "outputs": ["dense"],
                    "compile": {"optimizer": {"type": "adam", "learning_rate": 0.001}, "loss": "sparse_categorical_crossentropy", "metrics": ["accuracy"]}})");
    }
    QStringList args = trainArgs(c.file, 1);
    args[args.indexOf("mlp")] = model;
    auto coord = startCoordinator(args + QStringList{"--limit", "3200", "--no-record", "--json"});
    QVERIFY(coord->waitForFinished(60000));
    QString out, err;
    const auto j = finishedSummary(*coord, out, err);
    QVERIFY2(coord->exitCode() == 0 && !j.is_discarded() && j.value("final", false), qPrintable(out + err));
    const auto& tasks = j["tasks"];
    const int64_t steps = tasks["worker:0"].value("steps", int64_t{0}) + tasks["worker:1"].value("steps", int64_t{0});
    QVERIFY2(steps > 0 && steps == tasks["ps:0"].value("steps_completed", int64_t{-1}), j.dump().c_str());
    for (const char* ps : {"ps:0", "ps:1", "ps:2"}) QVERIFY2(tasks[ps].value("updates", int64_t{-1}) == steps, j.dump().c_str());
    QCOMPARE(tasks["ps:0"].value("elements", int64_t{-1}), int64_t{7840});
    QCOMPARE(tasks["ps:1"].value("elements", int64_t{-1}), int64_t{10});
    QCOMPARE(tasks["ps:2"].value("elements", int64_t{-1}), int64_t{0});
}

void TestParameterServer::refusesPushWithoutToken()
{
    WorkerOptions o;
    o.token = kToken;
    o.maxMessageBytes = 1 << 20;
    auto daemon = std::move(WorkerDaemon::start(o)).value();
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(64 << 20);
    auto stub = ParameterServer::NewStub(
        grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(daemon->port()), grpc::InsecureChannelCredentials(), args));
    auto push = [&](const std::string& token, std::size_t bytes) {
        grpc::ClientContext ctx;
        if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
        PushRequest req;
        req.set_run_id("run-1");
        req.set_worker("worker:0");
        req.set_learning_rate(0.001f);
        req.set_grads(std::string(bytes, '\0'));
        req.set_last(true);
        PushReply reply;
        return stub->Push(&ctx, req, &reply);
    };
    QCOMPARE(push("", 1024).error_code(), grpc::StatusCode::UNAUTHENTICATED);
    QCOMPARE(push("wrong-token", 1024).error_code(), grpc::StatusCode::UNAUTHENTICATED);
    {
        grpc::ClientContext ctx;
        PullRequest req;
        req.set_run_id("run-1");
        PullReply reply;
        QCOMPARE(stub->Pull(&ctx, req, &reply).error_code(), grpc::StatusCode::UNAUTHENTICATED);
        QVERIFY(reply.values().empty());
    }
    {
        grpc::ClientContext ctx;
        InitializeRequest req;
        req.set_run_id("run-1");
        req.add_slices("w[0:1]");
        req.add_slice_sizes(1);
        req.set_values(std::string(4, '\0'));
        req.set_last(true);
        InitializeReply reply;
        QCOMPARE(stub->Initialize(&ctx, req, &reply).error_code(), grpc::StatusCode::UNAUTHENTICATED);
    }
    {
        // The step schedule's calls: a stranger can neither take steps nor release a worker.
        grpc::ClientContext claimCtx, releaseCtx;
        ClaimRequest claim;
        claim.set_run_id("run-1");
        claim.set_worker("worker:0");
        ClaimReply claimed;
        QCOMPARE(stub->ClaimStep(&claimCtx, claim, &claimed).error_code(), grpc::StatusCode::UNAUTHENTICATED);
        QCOMPARE(claimed.count(), int64_t(0));
        ReleaseRequest release;
        release.set_run_id("run-1");
        release.set_worker("worker:1");
        ReleaseReply released;
        QCOMPARE(stub->Release(&releaseCtx, release, &released).error_code(), grpc::StatusCode::UNAUTHENTICATED);
    }
    // With the token: over the 1 MiB bound is refused by gRPC; a run this daemon serves no ps
    // task of is refused by the service.
    QCOMPARE(push(kToken, 2 << 20).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    const grpc::Status st = push(kToken, 1024);
    QCOMPARE(st.error_code(), grpc::StatusCode::UNAVAILABLE);
    QVERIFY2(st.error_message().find("no ps task of run run-1") != std::string::npos, st.error_message().c_str());
}

void TestParameterServer::psTaskAppliesPushesAndRefusesMalformedOnes()
{
    WorkerOptions o;
    o.token = kToken;
    auto daemon = std::move(WorkerDaemon::start(o)).value();
    const std::string addr = "127.0.0.1:" + std::to_string(daemon->port());
    auto channel = grpc::CreateChannel(addr, grpc::InsecureChannelCredentials());
    auto control = Worker::NewStub(channel);
    auto ps = ParameterServer::NewStub(channel);
    auto ctx = [](grpc::ClientContext& c) {
        c.AddMetadata("authorization", "Bearer " + kToken);
        c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    };
    // A ps task of a parameter-server run with plain SGD (lr 0.5): an update is easy to predict.
    RunConfig cfg;
    cfg.model = *loadModelFile(std::string(TS_SOURCE_DIR) + "/resources/models/seed_mlp.json");
    cfg.strategy.kind = "parameter-server";
    cfg.optimizer = {{"type", "sgd"}, {"learning_rate", 0.5}};
    {
        grpc::ClientContext c;
        ctx(c);
        StartTaskRequest req;
        req.set_run_id("run-ps");
        req.set_run_config_json(cfg.toJson().dump());
        req.set_cluster_json(R"({"cluster": {"worker": ["127.0.0.1:1"], "ps": [")" + addr + R"("]}})");
        req.set_task_type("ps");
        req.set_task_index(0);
        StartTaskReply reply;
        const grpc::Status st = control->StartTask(&c, req, &reply);
        QVERIFY2(st.ok(), st.error_message().c_str());
    }
    auto pull = [&](PullReply& reply, int64_t maxBytes = 0) {
        grpc::ClientContext c;
        ctx(c);
        PullRequest req;
        req.set_run_id("run-ps");
        req.set_describe(true);
        req.set_max_bytes(maxBytes);
        return ps->Pull(&c, req, &reply);
    };
    // Hosted but not initialised yet: a worker waits (FAILED_PRECONDITION), then worker 0 initialises.
    QElapsedTimer t;
    t.start();
    grpc::Status st;
    PullReply before;
    while ((st = pull(before)).error_code() == grpc::StatusCode::UNAVAILABLE && t.elapsed() < 10000) QTest::qWait(20);
    QCOMPARE(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    // Initialisation in parts: the layout, then the values in order.
    auto init = [&](bool layout, int64_t offset, const std::vector<float>& values, bool last, InitializeReply* out = nullptr) {
        grpc::ClientContext c;
        ctx(c);
        InitializeRequest req;
        req.set_run_id("run-ps");
        if (layout) {
            req.add_slices("w[0:2]");
            req.add_slice_sizes(2);
        }
        req.set_offset(offset);
        req.set_values(std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float)));
        req.set_last(last);
        InitializeReply reply;
        const grpc::Status s = ps->Initialize(&c, req, &reply);
        if (out) *out = reply;
        return s;
    };
    QCOMPARE(init(false, 0, {1.f, 2.f}, true).error_code(), grpc::StatusCode::FAILED_PRECONDITION);  // values before the layout
    InitializeReply layoutReply;
    QVERIFY(init(true, 0, {}, false, &layoutReply).ok());
    QCOMPARE(layoutReply.max_part_bytes(), int64_t(4 << 20));  // the daemon's default bound
    QCOMPARE(init(false, 1, {2.f}, false).error_code(), grpc::StatusCode::INVALID_ARGUMENT);     // out of order
    QCOMPARE(init(false, 0, {1.f, 2.f, 3.f}, true).error_code(), grpc::StatusCode::INVALID_ARGUMENT);  // beyond the shard
    QCOMPARE(init(false, 0, {1.f}, true).error_code(), grpc::StatusCode::INVALID_ARGUMENT);      // ends at 1 of 2
    QCOMPARE(pull(before).error_code(), grpc::StatusCode::FAILED_PRECONDITION);                    // still not served
    QVERIFY(init(false, 1, {2.f}, true).ok());                                                     // the rest
    QCOMPARE(init(true, 0, {1.f, 2.f}, true).error_code(), grpc::StatusCode::ALREADY_EXISTS);
    // Initialised without a step schedule (worker 0 gives one only to ps:0 of a training run):
    // claims are refused and say why; a claim must name its worker.
    auto claim = [&](const std::string& worker, ClaimReply* out) {
        grpc::ClientContext c;
        ctx(c);
        ClaimRequest req;
        req.set_run_id("run-ps");
        req.set_worker(worker);
        return ps->ClaimStep(&c, req, out);
    };
    {
        ClaimReply reply;
        const grpc::Status refused = claim("worker:0", &reply);
        QCOMPARE(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
        QVERIFY2(refused.error_message().find("schedules no steps") != std::string::npos, refused.error_message().c_str());
        QCOMPARE(claim("", &reply).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    }
    auto push = [&](int64_t offset, const std::vector<float>& g, float lr, int64_t pulled, bool last = true, PushReply* out = nullptr) {
        grpc::ClientContext c;
        ctx(c);
        PushRequest req;
        req.set_run_id("run-ps");
        req.set_worker("worker:0");
        req.set_pulled_version(pulled);
        req.set_learning_rate(lr);
        req.set_offset(offset);
        req.set_grads(std::string(reinterpret_cast<const char*>(g.data()), g.size() * sizeof(float)));
        req.set_last(last);
        PushReply reply;
        const grpc::Status s = ps->Push(&c, req, &reply);
        if (out) *out = reply;
        return s;
    };
    QCOMPARE(push(0, {1.f, 1.f, 1.f}, 0.5f, 0).error_code(), grpc::StatusCode::INVALID_ARGUMENT);  // a value too many
    QCOMPARE(push(1, {1.f, 1.f}, 0.5f, 0).error_code(), grpc::StatusCode::INVALID_ARGUMENT);       // past the end
    QCOMPARE(push(-1, {1.f}, 0.5f, 0).error_code(), grpc::StatusCode::INVALID_ARGUMENT);           // before the start
    QCOMPARE(push(0, {1.f, 1.f}, std::nanf(""), 0).error_code(), grpc::StatusCode::INVALID_ARGUMENT); // NaN rate
    QCOMPARE(push(0, {1.f, 1.f}, 0.5f, 7).error_code(), grpc::StatusCode::INVALID_ARGUMENT);        // unseen version
    // Two pushes computed from version 0, the first in two parts: it counts once, when its last
    // part arrives; the second finds one update applied since (staleness 1).
    PushReply r0, r1, r2;
    QVERIFY(push(0, {2.f}, 0.5f, 0, false, &r0).ok());
    QCOMPARE(r0.version(), int64_t(0));
    QVERIFY(push(1, {4.f}, 0.5f, 0, true, &r1).ok());
    QCOMPARE(r1.version(), int64_t(1));
    QCOMPARE(r1.staleness(), int64_t(0));
    QVERIFY(push(0, {2.f, 0.f}, 0.5f, 0, true, &r2).ok());
    QCOMPARE(r2.version(), int64_t(2));
    QCOMPARE(r2.staleness(), int64_t(1));
    PullReply layoutOnly, after;
    QVERIFY(pull(layoutOnly).ok());
    QVERIFY(layoutOnly.values().empty());
    QCOMPARE(layoutOnly.elements(), int64_t(2));
    QVERIFY(pull(after, 1 << 20).ok());
    QCOMPARE(after.version(), int64_t(2));
    QCOMPARE(after.slices(0), std::string("w[0:2]"));
    QCOMPARE(after.slice_sizes(0), int64_t(2));
    QCOMPARE(after.values().size(), std::size_t(8));
    PullReply tiny;
    QCOMPARE(pull(tiny, 100).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);  // a bound no value fits
    // A negative bound is no bound at all (INT64_MIN wrapped around to "send everything").
    QCOMPARE(pull(tiny, std::numeric_limits<int64_t>::min()).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    float w[2];
    std::memcpy(w, after.values().data(), sizeof w);
    // SGD with the run's optimizer: w - 0.5 * g, twice.
    QCOMPARE(w[0], 1.f - 0.5f * 2.f - 0.5f * 2.f);
    QCOMPARE(w[1], 2.f - 0.5f * 4.f);
    // The coordinator stops a ps task with Cancel ("done": the run is over); it reports what it
    // applied, and ends as completed.
    {
        grpc::ClientContext c;
        ctx(c);
        CancelRequest req;
        req.set_run_id("run-ps");
        req.set_reason("done");
        CancelReply reply;
        QVERIFY(control->Cancel(&c, req, &reply).ok());
    }
    std::string state;
    for (t.restart(); t.elapsed() < 10000 && state != "completed"; QTest::qWait(20)) {
        grpc::ClientContext c;
        ctx(c);
        HeartbeatPong pong;
        if (control->Heartbeat(&c, HeartbeatPing(), &pong).ok()) state = pong.state();
    }
    QCOMPARE(state, std::string("completed"));
    PullReply gone;
    QCOMPARE(pull(gone).error_code(), grpc::StatusCode::UNAVAILABLE);
}

// A backup's side on the ps tasks: two ps tasks with Adam hold three variables (one split over
// both). Run A takes one update, is snapshotted, then takes a second. Run B starts from the
// snapshot (values, Adam's moments, the update count) and takes the same second update: its
// values equal run A's bit for bit. A second worker of run B reads worker 0's position back.
// "in parts": run B's daemons bound messages to 64 KiB and its clients to 96 KiB, so its 244 KB
// of variables (732 KB with Adam's moments) cross in parts; run A's take one message each.
void TestParameterServer::snapshotRestoresTheOptimizer_data()
{
    QTest::addColumn<int>("bound");
    QTest::addColumn<int>("clientBound");
    QTest::addColumn<int>("rows");
    QTest::addColumn<int>("cols");
    QTest::addColumn<int>("bias");
    QTest::newRow("one part") << (4 << 20) << (64 << 20) << 6 << 4 << 5;
    QTest::newRow("in parts") << (64 << 10) << (96 << 10) << 300 << 200 << 1000;
}

void TestParameterServer::snapshotRestoresTheOptimizer()
{
    QFETCH(int, bound);
    QFETCH(int, clientBound);
    QFETCH(int, rows);
    QFETCH(int, cols);
    QFETCH(int, bias);
    std::vector<std::unique_ptr<WorkerDaemon>> daemons;
    for (int i = 0; i < 4; ++i) {
        WorkerOptions o;
        o.token = kToken;
        if (i >= 2) o.maxMessageBytes = bound;  // run B's
        auto d = WorkerDaemon::start(o);
        QVERIFY2(d.ok(), d.ok() ? "" : d.error().toString().c_str());
        daemons.push_back(std::move(d).value());
    }
    auto address = [&](int i) { return "127.0.0.1:" + std::to_string(daemons[static_cast<std::size_t>(i)]->port()); };
    RunConfig cfg;
    cfg.model = *loadModelFile(std::string(TS_SOURCE_DIR) + "/resources/models/seed_mlp.json");
    cfg.strategy.kind = "parameter-server";
    cfg.optimizer = {{"type", "adam"}, {"learning_rate", 0.01}};
    PartitionOptions partition;
    partition.policy = "by-size";
    partition.minShardBytes = 32;
    // Run `run` on daemons first and first + 1 as ps:0 and ps:1; returns its cluster.
    auto startRun = [&](const std::string& run, int first) -> ClusterSpec {
        const std::string json = R"({"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"], "ps": [")" + address(first) + R"(", ")" +
                                 address(first + 1) + R"("]}})";
        for (int i = 0; i < 2; ++i) {
            auto control = Worker::NewStub(grpc::CreateChannel(address(first + i), grpc::InsecureChannelCredentials()));
            grpc::ClientContext c;
            c.AddMetadata("authorization", "Bearer " + kToken);
            StartTaskRequest req;
            req.set_run_id(run);
            req.set_run_config_json(cfg.toJson().dump());
            req.set_cluster_json(json);
            req.set_task_type("ps");
            req.set_task_index(i);
            StartTaskReply reply;
            const grpc::Status st = control->StartTask(&c, req, &reply);
            if (!st.ok()) qWarning("StartTask: %s", st.error_message().c_str());
        }
        return *ClusterSpec::fromText(json, "test cluster");
    };
    auto connect = [&](const std::string& run, const ClusterSpec& spec, const std::string& worker) {
        PsClientOptions po;
        po.spec = spec;
        po.runId = run;
        po.token = kToken;
        po.worker = worker;
        po.partition = partition;
        if (run != "run-a") po.maxMessageBytes = clientBound;
        return std::move(RemoteParameterStore::connect(po)).value();
    };
    // Three variables and their gradients, in buffers the stores read and write.
    const std::vector<VariableInfo> infos{{"a", {rows, cols}}, {"b", {bias}}, {"c", {3, 2}}};
    std::size_t total = 0;
    for (const auto& v : infos) total += static_cast<std::size_t>(v.numel());
    struct Vars {
        std::vector<VariableInfo> infos;
        std::vector<std::vector<float>> values, grads;
        explicit Vars(const std::vector<VariableInfo>& i) : infos(i)
        {
            for (const auto& v : infos) {
                values.emplace_back(static_cast<std::size_t>(v.numel()));
                grads.emplace_back(static_cast<std::size_t>(v.numel()));
            }
        }
        std::vector<StoreVariable> list()
        {
            std::vector<StoreVariable> out;
            for (std::size_t i = 0; i < infos.size(); ++i) out.push_back({infos[i], values[i].data(), grads[i].data()});
            return out;
        }
        void setGrads(float scale)
        {
            for (std::size_t v = 0; v < grads.size(); ++v)
                for (std::size_t i = 0; i < grads[v].size(); ++i) grads[v][i] = scale * std::sin(float(i + 7 * v) + scale);
        }
    };
    Vars a(infos);
    for (std::size_t v = 0; v < a.values.size(); ++v)
        for (std::size_t i = 0; i < a.values[v].size(); ++i) a.values[v][i] = 0.1f * float(i) - float(v);
    const ClusterSpec specA = startRun("run-a", 0);
    auto storeA = connect("run-a", specA, "worker:0");
    QVERIFY(storeA->begin(a.list(), true, nullptr).ok());
    QVERIFY(storeA->plan().perPs[0].size() + storeA->plan().perPs[1].size() > 3);  // a variable is split
    QCOMPARE(storeA->resumePosition(), std::string());
    a.setGrads(1.f);
    QVERIFY(storeA->push(0.01f).ok());
    auto snap = storeA->snapshot();
    QVERIFY2(snap.ok(), snap.ok() ? "" : snap.error().toString().c_str());
    QCOMPARE(snap->updates, int64_t(1));
    QCOMPARE(snap->optimizer.size(), std::size_t(2));  // Adam's m and v, over all the values
    for (const auto& [name, flat] : snap->optimizer) QCOMPARE(flat.size(), total);
    const auto snapValues = a.values;  // the snapshot wrote its values into the buffers
    a.setGrads(-2.f);
    QVERIFY(storeA->push(0.01f).ok());
    QVERIFY(storeA->flush().ok());
    QVERIFY(storeA->pull().ok());

    Vars b(infos);
    b.values = snapValues;
    const ClusterSpec specB = startRun("run-b", 2);
    auto storeB = connect("run-b", specB, "worker:0");
    StoreResume resume{*snap, "worker 0's position"};
    QVERIFY(storeB->begin(b.list(), true, &resume).ok());
    auto again = storeB->snapshot();
    QVERIFY(again.ok());
    QCOMPARE(again->updates, int64_t(1));
    for (std::size_t i = 0; i < 2; ++i) QVERIFY(again->optimizer[i] == snap->optimizer[i]);
    Vars other(infos);
    auto storeB1 = connect("run-b", specB, "worker:1");
    QVERIFY(storeB1->begin(other.list(), false, nullptr).ok());
    QCOMPARE(storeB1->resumePosition(), std::string("worker 0's position"));
    QVERIFY(other.values == snapValues);
    b.setGrads(-2.f);
    QVERIFY(storeB->push(0.01f).ok());
    QVERIFY(storeB->flush().ok());
    QVERIFY(storeB->pull().ok());
    QVERIFY(b.values == a.values);  // the same second update, bit for bit
    QVERIFY(b.values != snapValues);
    // An update in parts counts once.
    const StalenessStats stale = storeB->staleness();
    QCOMPARE(stale.pushes, int64_t(1));
    QCOMPARE(stale.max, int64_t(0));
    auto end = storeB->snapshot();
    QVERIFY(end.ok());
    QCOMPARE(end->updates, int64_t(2));

    // A state of the wrong size is refused before any ps is touched, naming the tensor.
    Vars c(infos);
    StoreResume wrong = resume;
    wrong.state.optimizer[0].second.pop_back();
    auto storeC = connect("run-c", specB, "worker:0");
    Status refused = storeC->begin(c.list(), true, &wrong);
    QVERIFY(!refused.ok());
    const std::string expected = "has " + std::to_string(total - 1) + " values, this model's variables have " + std::to_string(total);
    QVERIFY2(refused.error().message.find(expected) != std::string::npos, refused.error().message.c_str());
}

// --backup-dir and --restarts with a parameter-server run: worker 0's daemon backs the run up
// every 10 steps (its weights and the ps tasks' optimizer state and step schedule) under its
// --backup-root; the ps task is killed with SIGKILL after the first epoch and started again; the
// coordinator restarts the run, worker 0 starts the new ps task from its backup, and the run
// completes the steps after it. (Asynchronous updates: not bit for bit.)
void TestParameterServer::restartedRunResumesFromBackup()
{
    if (!QFileInfo(QString::fromStdString(defaultFashionMnistDir())).isDir()) QSKIP("Fashion-MNIST is not installed");
    QTemporaryDir dir;
    const QString root = dir.filePath("w0-backups");
    BackedUpCluster c = startBackedUpCluster(dir.path(), root);
    auto& ps = c.ps;
    QVERIFY(c.ps->port > 0 && c.w0->port > 0 && c.w1->port > 0);
    const QString cluster = c.file;
    // 3200 examples in global batches of 64: 50 steps an epoch for each worker, 150 in all.
    auto coord = startCoordinator(trainArgs(cluster, 3) + QStringList{"--limit", "3200", "--db", dir.filePath("runs.db"), "--json", "--backup-dir",
                                                                      "run-p", "--backup-every-steps", "10", "--restarts", "1"});
    QString out;
    QVERIFY2(tstest::readUntil(*coord, out, "\"epoch\":1"), qPrintable(out + coord->readAllStandardError()));
    QVERIFY(QFile::exists(root + "/run-p/backup.safetensors"));
    // A lost worker no longer stops a parameter-server run (its steps go to the other): the ps
    // task is what a run cannot do without.
    const int port = ps->port;
    ::kill(static_cast<pid_t>(ps->process->processId()), SIGKILL);
    ps->process->waitForFinished();
    ps = tstest::spawnWorker(dir.path(), "ps0", kToken, {}, port);
    QCOMPARE(ps->port, port);
    QVERIFY(coord->waitForFinished(120000));
    QString err;
    const auto final = finishedSummary(*coord, out, err);
    QVERIFY2(coord->exitCode() == 0 && !final.is_discarded() && final.value("final", false), qPrintable(out + err));
    qInfo("restarted parameter-server run: %s", final.dump().c_str());
    QCOMPARE(final["restarts"].get<int>(), 1);
    // ps:0 handed out all 300 steps (2 x 50 a pass, 3 epochs); the last attempt's workers
    // trained those after the backup. The run's steps count from its start, as a resumed local
    // run's do.
    const int after0 = final["tasks"]["worker:0"]["steps"].get<int>(), after1 = final["tasks"]["worker:1"]["steps"].get<int>();
    QCOMPARE(final["tasks"]["ps:0"]["steps_completed"].get<int>(), 300);
    QVERIFY2(after0 + after1 < 300, qPrintable(QString::number(after0 + after1)));
    QCOMPARE(final["steps"].get<int>(), 300);
    QVERIFY2(final["val_accuracy"].get<double>() > 0.7, qPrintable(out));
    // The completed run deleted worker 0's backup.
    QVERIFY(!QFile::exists(root + "/run-p/backup.safetensors"));
    // Both workers resumed from the same step of worker 0's backup (a multiple of 10, past the first epoch).
    auto store = ts::store::RunStore::open(dir.filePath("runs.db").toStdString());
    QVERIFY(store.ok());
    auto logs = store->logs(final["run_id"].get<std::string>());
    QVERIFY(logs.ok());
    bool restarting = false;
    std::set<std::string> resumedAt;
    int resumed = 0;
    for (const auto& l : *logs) {
        restarting |= l.message.find("restarting the run from its backup") != std::string::npos;
        const auto at = l.message.find("resumed from ");
        if (at == std::string::npos) continue;
        const auto after = l.message.find(" after step ", at);
        QVERIFY2(after != std::string::npos, l.message.c_str());
        resumedAt.insert(l.message.substr(after, l.message.find(' ', after + 12) - after));
        ++resumed;
        qInfo("%s", l.message.c_str());
    }
    QVERIFY(restarting);
    QVERIFY2(resumed == 2 && resumedAt.size() == 1, qPrintable(out));
    // The backup (taken when worker 0 claimed a step past the next multiple of 10) holds the
    // steps completed by then; the resumed run trained the rest.
    const int step = std::stoi(resumedAt.begin()->substr(12));
    QVERIFY2(step >= 50 && step < 300, qPrintable(QString::number(step)));
    QCOMPARE(after0 + after1, 300 - step);
}

void TestParameterServer::killedPsIsNamed()
{
    killedTaskIsNamed(true);
}

void TestParameterServer::killedWorkersStepsGoToTheOther()
{
    lostWorkerIsReplaced(SIGKILL);
}

// SIGSTOP: worker 1 keeps its sockets open and its step held; only the heartbeat notices, and
// until then worker 0 trains alone (at the end, it waits for that step).
void TestParameterServer::silentWorkersStepsGoToTheOther()
{
    lostWorkerIsReplaced(SIGSTOP);
}

// SIGTERM: worker 1's daemon shuts down in order, cancelling its task. That is not the run's
// cancellation: the worker is lost at once, and its held steps go to worker 0 (the run was
// recorded as cancelled, or waited for the held steps while a restarted daemon answered).
void TestParameterServer::stoppedWorkersStepsGoToTheOther()
{
    lostWorkerIsReplaced(SIGTERM);
}

// A worker that stalls (SIGSTOP for 1.5 s, under the 3 s heartbeat) does not hold the epoch
// back: worker 0 takes the steps meanwhile, so it ends with many more; nobody is lost, and
// every step of every epoch is trained once.
void TestParameterServer::slowWorkerTakesFewerSteps()
{
    QTemporaryDir dir;
    Cluster c = startCluster(dir.path(), 2, 1);
    QVERIFY(c.ps[0]->port > 0 && c.workers[0]->port > 0 && c.workers[1]->port > 0);
    auto coord = startCoordinator(trainArgs(c.file, 6) + QStringList{"--limit", "6400", "--no-record", "--json"});
    QString out;
    QVERIFY2(tstest::readUntil(*coord, out, "\"epoch\":1"), qPrintable(out + coord->readAllStandardError()));
    const auto pid = static_cast<pid_t>(c.workers[1]->process->processId());
    ::kill(pid, SIGSTOP);
    QTest::qWait(1500);
    ::kill(pid, SIGCONT);
    QVERIFY(coord->waitForFinished(120000));
    QString err;
    const auto j = finishedSummary(*coord, out, err);
    QVERIFY2(coord->exitCode() == 0 && !j.is_discarded() && j.value("final", false), qPrintable(out + err));
    const auto& tasks = j["tasks"];
    QVERIFY2(!tasks.contains("lost"), qPrintable(out + err));
    QCOMPARE(tasks["ps:0"].value("steps_completed", int64_t{0}), int64_t(1200));
    const int64_t s0 = tasks["worker:0"].value("steps", int64_t{0}), s1 = tasks["worker:1"].value("steps", int64_t{0});
    qInfo("worker:1 stalled for 1.5 s: worker:0 trained %lld steps, worker:1 %lld", static_cast<long long>(s0), static_cast<long long>(s1));
    QCOMPARE(s0 + s1, int64_t(1200));
    // Before steps were scheduled each worker trained 600, the stall only delaying the end.
    QVERIFY2(s0 >= s1 + 100, qPrintable(QString("%1 vs %2 steps").arg(s0).arg(s1)));
}

// TF's ClusterCoordinator goes on when a worker is lost: the coordinator names it in a warning
// within 10 s, ps:0 hands the step it held and its share of the rest to worker 0, and the run
// completes every step of every epoch, recorded and evaluated as usual.
void TestParameterServer::lostWorkerIsReplaced(int signal)
{
    QTemporaryDir dir;
    Cluster c = startCluster(dir.path(), 2, 1);
    QVERIFY(c.ps[0]->port > 0 && c.workers[0]->port > 0 && c.workers[1]->port > 0);
    const QString db = dir.filePath("runs.db");
    // 6400 examples: 100 batches a pass for each worker, 200 steps an epoch, 1200 in all.
    auto coord = startCoordinator(trainArgs(c.file, 6) + QStringList{"--limit", "6400", "--db", db, "--json"});
    QString out;
    QVERIFY2(tstest::readUntil(*coord, out, "\"epoch\":1"), qPrintable(out + coord->readAllStandardError()));
    WorkerProcess& victim = *c.workers[1];
    const int64_t killedUs = QDateTime::currentMSecsSinceEpoch() * 1000;
    ::kill(static_cast<pid_t>(victim.process->processId()), signal);
    const bool finished = coord->waitForFinished(120000);
    if (signal == SIGSTOP) ::kill(static_cast<pid_t>(victim.process->processId()), SIGCONT);  // so it can be shut down
    QVERIFY(finished);
    out += QString::fromUtf8(coord->readAllStandardOutput());
    const QString err = QString::fromUtf8(coord->readAllStandardError());
    QVERIFY2(coord->exitCode() == 0, qPrintable(out + err));
    // The warning on stderr names the worker and its address.
    const QString named = QString("warning: worker:1 at 127.0.0.1:%1").arg(victim.port);
    QVERIFY2(err.contains(named) && err.contains("the run goes on without worker:1"), qPrintable(err));
    if (signal == SIGSTOP) QVERIFY2(err.contains("stopped responding"), qPrintable(err));
    if (signal == SIGTERM) QVERIFY2(err.contains(named + ": its task was stopped on its machine"), qPrintable(err));
    const auto j = nlohmann::json::parse(out.trimmed().split('\n').last().toStdString(), nullptr, false);
    QVERIFY2(!j.is_discarded() && j.value("final", false), qPrintable(out));
    const auto& tasks = j["tasks"];
    QCOMPARE(tasks["ps:0"].value("steps_completed", int64_t{0}), int64_t(1200));
    QCOMPARE(j["steps"].get<int64_t>(), int64_t(1200));  // the lost worker's steps too
    QCOMPARE(j["epochs"].get<int64_t>(), int64_t(6));
    QVERIFY2(tasks.contains("lost") && tasks["lost"].size() == 1 && tasks["lost"][0].value("task", "") == "worker:1", qPrintable(out));
    QVERIFY(!tasks.contains("worker:1"));  // it never reported an end
    const int64_t steps0 = tasks["worker:0"].value("steps", int64_t{0});
    QVERIFY2(steps0 > 600, qPrintable(QString::number(steps0)));
    QVERIFY2(j.value("val_accuracy", 0.0) > 0.7, qPrintable(out));
    // Recorded: completed, six epochs, and the warning, written within 10 s of the loss.
    auto store = ts::store::RunStore::open(db.toStdString());
    QVERIFY(store.ok());
    const std::string runId = j["run_id"].get<std::string>();
    auto info = store->run(runId);
    QVERIFY(info.ok());
    QCOMPARE(info->status, ts::store::RunState::Completed);
    auto epochs = store->epochMetrics(runId);
    QVERIFY(epochs.ok());
    QCOMPARE(epochs->size(), std::size_t(6));
    // The run's throughput is that of its epochs, which count the lost worker's steps too (not
    // worker:0's alone, the only worker that reported an end).
    double samples = 0, seconds = 0;
    for (const auto& row : *epochs) {
        samples += row.metrics.at("samples_per_sec") * row.metrics.at("seconds");
        seconds += row.metrics.at("seconds");
    }
    QVERIFY(seconds > 0);
    const double runRate = j.value("samples_per_sec", 0.0);
    QVERIFY2(std::abs(runRate - samples / seconds) <= 1e-6 * runRate, qPrintable(QString("%1 against %2").arg(runRate).arg(samples / seconds)));
    QVERIFY2(std::abs(runRate - tasks["worker:0"].value("samples_per_sec", 0.0)) > 1e-6 * runRate, qPrintable(out));
    auto logs = store->logs(runId);
    QVERIFY(logs.ok());
    int64_t noticedUs = -1;
    for (const auto& l : *logs)
        if (l.message.find("the run goes on without worker:1") != std::string::npos) noticedUs = l.stamp.wallTimeUs;
    QVERIFY(noticedUs > 0);
    const double secs = static_cast<double>(noticedUs - killedUs) / 1e6;
    qInfo("worker:1 lost (signal %d) after %.1f s; worker:0 trained %lld of the 1200 steps", signal, secs, static_cast<long long>(steps0));
    QVERIFY2(secs < 10.0, qPrintable(QString("noticed after %1 s").arg(secs)));
}

// With --restarts, a lost worker whose daemon comes back (here: killed with SIGKILL and started
// again on its port, as a supervisor would) rejoins: the coordinator starts a new task on it and
// ps:0 hands it steps again, as TF's ClusterCoordinator uses a recovered worker. The run
// completes every step, and both the loss and the rejoin are in its summary and its log.
void TestParameterServer::lostWorkerRejoins_data()
{
    QTest::addColumn<bool>("restartDaemon");
    QTest::addColumn<int>("victim");
    QTest::newRow("killed, its daemon restarted") << true << 1;
    QTest::newRow("silent, then answering again") << false << 1;  // SIGSTOP: its old task is stopped first
    // Worker 0 initialises the ps tasks and writes the backups: its new task joins without either.
    QTest::newRow("worker 0 killed, its daemon restarted") << true << 0;
}

void TestParameterServer::lostWorkerRejoins()
{
    QFETCH(bool, restartDaemon);
    QFETCH(int, victim);
    QTemporaryDir dir;
    const QString root = dir.filePath("w0-backups");
    BackedUpCluster c = startBackedUpCluster(dir.path(), root);
    auto& w1 = victim == 0 ? c.w0 : c.w1;
    const QString name = QString("worker:%1").arg(victim);
    QVERIFY(c.ps->port > 0 && c.w0->port > 0 && c.w1->port > 0);
    const QString cluster = c.file;
    const QString db = dir.filePath("runs.db");
    // 32000 examples: 500 batches a pass for each worker, 1000 steps an epoch, 6000 in all (10000
    // for the silent worker, whose 4 s pause comes first): long enough to come back while the
    // run trains.
    const int epochs = restartDaemon ? 6 : 10;
    auto coord = startCoordinator(trainArgs(cluster, epochs) + QStringList{"--limit", "32000", "--db", db, "--json", "--backup-dir", "run-r",
                                                                      "--backup-every-steps", "500", "--restarts", "1"});
    QString out;
    QVERIFY2(tstest::readUntil(*coord, out, "\"epoch\":1"), qPrintable(out + coord->readAllStandardError()));
    const int port = w1->port;
    if (restartDaemon) {
        ::kill(static_cast<pid_t>(w1->process->processId()), SIGKILL);
        w1->process->waitForFinished();
        w1 = tstest::spawnWorker(dir.path(), QString("worker%1").arg(victim), kToken, victim == 0 ? QStringList{"--backup-root", root} : QStringList{},
                                 port);
        QCOMPARE(w1->port, port);
    } else {
        // Silent past the 3 s heartbeat limit: dropped; then it answers again with its old task.
        ::kill(static_cast<pid_t>(w1->process->processId()), SIGSTOP);
        QTest::qWait(4000);
        ::kill(static_cast<pid_t>(w1->process->processId()), SIGCONT);
    }
    QVERIFY(coord->waitForFinished(120000));
    out += QString::fromUtf8(coord->readAllStandardOutput());
    const QString err = QString::fromUtf8(coord->readAllStandardError());
    QVERIFY2(coord->exitCode() == 0, qPrintable(out + err));
    QVERIFY2(err.contains("the run goes on without " + name) && err.contains(name + " rejoins the run with a new task (restart 1 of 1)"),
             qPrintable(err));
    const auto j = nlohmann::json::parse(out.trimmed().split('\n').last().toStdString(), nullptr, false);
    QVERIFY2(!j.is_discarded() && j.value("final", false), qPrintable(out));
    const auto& tasks = j["tasks"];
    QCOMPARE(tasks["ps:0"].value("steps_completed", int64_t{0}), int64_t(1000 * epochs));
    QCOMPARE(j["steps"].get<int64_t>(), int64_t(1000 * epochs));  // the old task's steps too
    const std::string who = name.toStdString(), other = victim == 0 ? "worker:1" : "worker:0";
    QVERIFY2(tasks.contains("lost") && tasks["lost"].size() == 1 && tasks["lost"][0].value("task", "") == who, qPrintable(out));
    QVERIFY2(tasks.contains("rejoined") && tasks["rejoined"].size() == 1 && tasks["rejoined"][0].value("task", "") == who, qPrintable(out));
    // The new task trained steps after it rejoined (and reported its end, which the lost one never did).
    const int64_t stepsOther = tasks[other].value("steps", int64_t{0}), stepsBack = tasks[who].value("steps", int64_t{0});
    qInfo("%s rejoined at step %lld; afterwards it trained %lld steps, %s %lld in all", who.c_str(),
          static_cast<long long>(tasks["rejoined"][0].value("at_step", int64_t{0})), static_cast<long long>(stepsBack), other.c_str(),
          static_cast<long long>(stepsOther));
    QVERIFY2(stepsBack >= 100, qPrintable(out));
    // Worker 0 writes the backups (a rejoined worker 0 too) and deletes them when the run completes.
    QVERIFY(!QFile::exists(root + "/run-r/backup.safetensors"));
    QCOMPARE(j["restarts"].get<int>(), 0);  // the run itself was not restarted
    QCOMPARE(j["rejoins"].get<int>(), 1);
    QCOMPARE(j["epochs"].get<int64_t>(), int64_t(epochs));
    QVERIFY2(j.value("val_accuracy", 0.0) > 0.7, qPrintable(out));
    auto store = ts::store::RunStore::open(db.toStdString());
    QVERIFY(store.ok());
    auto info = store->run(j["run_id"].get<std::string>());
    QVERIFY(info.ok());
    QCOMPARE(info->status, ts::store::RunState::Completed);
}

// SIGSTOP: the ps keeps its sockets open but answers nothing; only the heartbeat notices.
void TestParameterServer::silentPsIsNamed()
{
    killedTaskIsNamed(true, SIGSTOP);
}

void TestParameterServer::killedTaskIsNamed(bool killPs, int signal)
{
    QTemporaryDir dir;
    Cluster c = startCluster(dir.path(), 2, 1);
    QVERIFY(c.ps[0]->port > 0 && c.workers[0]->port > 0 && c.workers[1]->port > 0);
    auto coord = startCoordinator(trainArgs(c.file, 1000) + QStringList{"--no-record", "--limit", "6400"});
    QString seen;
    // Once worker 0 has finished an epoch (training, not setting up), SIGKILL the ps or worker 1.
    QVERIFY2(tstest::readUntil(*coord, seen, "Epoch 1:"), qPrintable(seen + coord->readAllStandardError()));
    QCOMPARE(coord->state(), QProcess::Running);
    WorkerProcess& victim = killPs ? *c.ps[0] : *c.workers[1];
    ::kill(static_cast<pid_t>(victim.process->processId()), signal);
    QElapsedTimer timer;
    timer.start();
    const bool finished = coord->waitForFinished(30000);
    const double secs = timer.elapsed() / 1000.0;
    if (signal == SIGSTOP) ::kill(static_cast<pid_t>(victim.process->processId()), SIGCONT);  // so it can be shut down
    QVERIFY(finished);
    const QString out = seen + QString::fromUtf8(coord->readAllStandardOutput()) + QString::fromUtf8(coord->readAllStandardError());
    QCOMPARE(coord->exitCode(), 1);
    for (const QString& line : out.split('\n'))
        if (line.startsWith("error:")) qInfo("%s (after %.1f s)", qPrintable(line), secs);
    if (signal == SIGSTOP) QVERIFY2(out.contains("stopped responding"), qPrintable(out));
    QVERIFY2(out.contains(QString("%1 at 127.0.0.1:%2").arg(killPs ? "ps:0" : "worker:1").arg(victim.port)), qPrintable(out));
    QVERIFY2(secs < 10.0, qPrintable(QString("detected after %1 s: ").arg(secs) + out));
}

// --validation-limit under 1000 (the coordinator's validation batch) used to fail the run with
// "batch size 1000 is larger than the 300 examples" of a size the user never gave.
void TestParameterServer::smallValidationSet()
{
    QTemporaryDir dir;
    Cluster c = startCluster(dir.path(), 2, 1);
    QVERIFY(c.ps[0]->port > 0 && c.workers[0]->port > 0 && c.workers[1]->port > 0);
    auto coord = startCoordinator(trainArgs(c.file, 1) + QStringList{"--no-record", "--json", "--limit", "640", "--validation-limit", "300"});
    QVERIFY(coord->waitForFinished(60000));
    const QString out = QString::fromUtf8(coord->readAllStandardOutput());
    const QString err = QString::fromUtf8(coord->readAllStandardError());
    QVERIFY2(coord->exitCode() == 0, qPrintable(out + err));
    const QStringList lines = out.trimmed().split('\n');
    const auto last = nlohmann::json::parse(lines.last().toStdString(), nullptr, false);
    QVERIFY2(last.is_object() && last.value("final", false), qPrintable(out));
    QVERIFY2(last["val_accuracy"].is_number(), qPrintable(out));
}

// Ctrl-C on the coordinator of a parameter-server run: every task stops, the run is cancelled,
// and --save-weights still gets the weights so far (it got nothing).
void TestParameterServer::interruptedRunKeepsWeights()
{
    QTemporaryDir dir;
    Cluster c = startCluster(dir.path(), 2, 1);
    QVERIFY(c.ps[0]->port > 0 && c.workers[0]->port > 0 && c.workers[1]->port > 0);
    const QString weights = dir.filePath("so-far.safetensors");
    auto coord = startCoordinator(trainArgs(c.file, 1000) + QStringList{"--no-record", "--limit", "6400", "--save-weights", weights});
    QString seen;
    QVERIFY2(tstest::readUntil(*coord, seen, "Epoch 1:"), qPrintable(seen + coord->readAllStandardError()));
    ::kill(static_cast<pid_t>(coord->processId()), SIGINT);
    QVERIFY(coord->waitForFinished(30000));
    seen += QString::fromUtf8(coord->readAllStandardOutput()) + QString::fromUtf8(coord->readAllStandardError());
    QVERIFY2(coord->exitCode() == 130, qPrintable(seen));
    QVERIFY2(seen.contains("Cancelled after") && !seen.contains("Cancelled after 0 step"), qPrintable(seen));
    auto loaded = ts::readSafetensors(weights.toStdString());
    QVERIFY2(loaded.ok(), loaded.ok() ? "" : loaded.error().toString().c_str());
    QVERIFY(!loaded->tensors.empty());
}

// A "pipeline" section over two CSV files of 50 and 150 rows, sharded by file: each worker
// reads only its file, over and over, in batches of 5 (its half of the global 10): 10 and 30
// batches a pass, so an epoch is 40 steps, which ps:0 learns once both passes ended.
void TestParameterServer::pipelineShardsByFile()
{
    QTemporaryDir dir;
    auto rows = [](int from, int count) {
        QByteArray csv = "label,a,b,c\n";
        for (int i = from; i < from + count; ++i)
            csv += QByteArray::number(i % 4) + "," + QByteArray::number(std::sin(i * 0.7), 'g', 7) + "," +
                   QByteArray::number(std::cos(i * 1.3), 'g', 7) + "," + QByteArray::number((i % 4) * 0.3, 'g', 7) + "\n";
        return csv;
    };
    auto write = [&](const QString& name, const QByteArray& bytes) {
        QFile f(dir.filePath(name));
        QVERIFY(f.open(QIODevice::WriteOnly));
        f.write(bytes);
    };
    write("small.csv", rows(0, 50));
    write("large.csv", rows(50, 150));
    write("tiny.json", R"({"format": "trainstudio-model", "version": 1, "name": "tiny", "layers": [
        {"id": "input", "type": "Input", "attrs": {"shape": [3]}},
        {"id": "head", "type": "Dense", "inputs": ["input"], "attrs": {"units": 4, "activation": "softmax"}}],
        "compile": {"loss": "sparse_categorical_crossentropy", "batch_size": 10}})");
    write("run.json", QString(R"({"model_file": "%1", "epochs": 2, "data": {"validate": false},
        "pipeline": {"source": {"kind": "csv", "paths": ["%2", "%3"], "label_column": "label"},
                     "transformations": [{"op": "shuffle", "buffer_size": 200}, {"op": "batch", "size": 10}]}})")
                          .arg(dir.filePath("tiny.json"), dir.filePath("small.csv"), dir.filePath("large.csv"))
                          .toUtf8());
    Cluster c = startCluster(dir.path(), 2, 1);
    auto coord = startCoordinator({"train", "--cluster", c.file, "--strategy", "parameter-server", "--config", dir.filePath("run.json"),
                                   "--threads", "1", "--no-record", "--json"});
    QVERIFY(coord->waitForFinished(120000));
    // --json's lines are on stdout (the last is the summary); warnings go to stderr.
    const QString out = QString::fromUtf8(coord->readAllStandardOutput());
    QVERIFY2(coord->exitCode() == 0, qPrintable(out + QString::fromUtf8(coord->readAllStandardError())));
    const auto j = nlohmann::json::parse(out.trimmed().split('\n').last().toStdString(), nullptr, false);
    QVERIFY2(!j.is_discarded() && j.value("final", false), qPrintable(out));
    const auto& tasks = j["tasks"];
    // 2 epochs of 40 steps, taken by whichever worker asks, each pushed as one update. Steps are
    // handed out before the length is known: a few past the 80th may have been trained too.
    const int64_t s0 = tasks["worker:0"].value("steps", int64_t{0}), s1 = tasks["worker:1"].value("steps", int64_t{0});
    QVERIFY2(s0 + s1 >= 80 && s0 + s1 <= 100, qPrintable(QString("%1 + %2 steps").arg(s0).arg(s1)));
    QVERIFY(s0 > 0 && s1 > 0);
    QCOMPARE(tasks["ps:0"].value("steps_completed", int64_t{0}), s0 + s1);
    QCOMPARE(tasks["ps:0"].value("updates", int64_t{0}), s0 + s1);
    int epochs = 0;
    for (const QString& line : out.trimmed().split('\n')) {
        const auto e = nlohmann::json::parse(line.toStdString(), nullptr, false);
        if (!e.is_discarded() && e.is_object() && e.contains("epoch") && !e.value("final", false)) ++epochs;
    }
    QCOMPARE(epochs, 2);
}

QTEST_GUILESS_MAIN(TestParameterServer)
#include "tst_parameter_server.moc"
