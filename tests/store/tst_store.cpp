// The SQLite run store: schema migrations from a version-1 database, refusal of a newer schema,
// damaged files, crash safety (a child process killed with SIGKILL mid-write), readers not
// blocking the writer, M4 downsampling, compare, delete with files, exports, the bus sink.
// `TS_STORE_BENCH=1 tst_store benchmark` measures the write rate and the 1M-sample plot load.

#include <QtTest>

#include <QElapsedTimer>
#include <QFile>
#include <QProcess>
#include <QTemporaryDir>

#include <sqlite3.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "io/safetensors.h"
#include "store/bus_sink.h"
#include "store/downsample.h"
#include "store/export.h"
#include "store/hash.h"
#include "store/run_store.h"
#include "store/schema.h"
#include "telemetry/bus.h"
#include "telemetry/chrome_trace.h"

namespace st = ts::store;
namespace tl = ts::telemetry;

namespace {

int64_t nowUs()
{
    return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

tl::StepMetricsEvent stepEvent(const std::string& run, int64_t step, double loss, int64_t epoch = 1)
{
    tl::StepMetricsEvent e;
    e.stamp.runId = run;
    e.stamp.step = step;
    e.stamp.wallTimeUs = 1'700'000'000'000'000 + step * 1000;
    e.epoch = epoch;
    e.loss = loss;
    e.metrics["accuracy"] = 1.0 - loss / 10;
    e.samplesPerSec = 1000;
    e.learningRate = 1e-3;
    return e;
}

// Raw SQLite access, independent of the code under test.
struct Raw {
    sqlite3* db = nullptr;
    explicit Raw(const std::string& path) { sqlite3_open(path.c_str(), &db); }
    ~Raw() { sqlite3_close(db); }
    QString text(const std::string& sql)
    {
        sqlite3_stmt* s = nullptr;
        if (sqlite3_prepare_v2(db, sql.c_str(), -1, &s, nullptr) != SQLITE_OK) return "prepare error: " + QString(sqlite3_errmsg(db));
        QString out;
        if (sqlite3_step(s) == SQLITE_ROW) out = QString::fromUtf8(reinterpret_cast<const char*>(sqlite3_column_text(s, 0)));
        sqlite3_finalize(s);
        return out;
    }
    QStringList column(const std::string& sql)
    {
        sqlite3_stmt* s = nullptr;
        QStringList out;
        if (sqlite3_prepare_v2(db, sql.c_str(), -1, &s, nullptr) != SQLITE_OK) return {"prepare error"};
        while (sqlite3_step(s) == SQLITE_ROW) {
            QStringList row;
            for (int c = 0; c < sqlite3_column_count(s); ++c)
                row << QString::fromUtf8(reinterpret_cast<const char*>(sqlite3_column_text(s, c)));
            out << row.join('|');
        }
        sqlite3_finalize(s);
        return out;
    }
    bool exec(const std::string& sql) { return sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr) == SQLITE_OK; }
};

std::string readAll(const std::string& path)
{
    std::ifstream in(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The crash-safety child: writes events as fast as it can, reporting each committed step on
// stdout, until the parent kills it.
int crashChild(const char* path)
{
    st::OpenOptions opts;
    opts.batchMs = 5;
    auto store = st::RunStore::open(path, opts);
    if (!store.ok()) {
        std::fprintf(stderr, "child: %s\n", store.error().toString().c_str());
        return 3;
    }
    st::NewRun spec;
    spec.name = "killed mid-write";
    spec.model = {{"name", "seed_mlp"}};
    auto run = store->createRun(spec);
    if (!run.ok() || !store->setRunStatus(run->id, st::RunState::Running).ok()) return 4;
    std::printf("run %s\n", run->id.c_str());
    std::fflush(stdout);
    for (int64_t step = 1;; ++step) {
        std::vector<tl::Event> batch;
        batch.push_back(stepEvent(run->id, step, 1.0 / static_cast<double>(step)));
        tl::SpanEvent span;
        span.stamp.runId = run->id;
        span.stamp.step = step;
        span.name = "forward";
        span.category = "forward";
        span.startUs = nowUs();
        span.durationUs = 10;
        batch.push_back(span);
        tl::DeviceSampleEvent dev;
        dev.stamp.runId = run->id;
        dev.stamp.step = step;
        dev.stamp.lane.device = "cpu:0";
        dev.utilisation = 0.5;
        dev.perCore = {0.4, 0.6};
        batch.push_back(dev);
        store->recordEvents(std::move(batch));
        if (step % 500 == 0) {
            if (!store->flush().ok()) return 5;
            std::printf("committed %lld\n", static_cast<long long>(step));
            std::fflush(stdout);
        }
    }
}

} // namespace

class TestStore : public QObject {
    Q_OBJECT
private slots:
    void init();
    void recordAndQuery();
    void listFilters();
    void resolveAndEdit();
    void migratesVersion1Fixture();
    void migratesVersion2Fixture();
    void rerecordedStepsKeepTheLastValue();
    void resumedRunDropsReplayedRecords();
    void refusesNewerSchema();
    void readOnlyFileIsSaid();
    void damagedFiles();
    void crashLeavesConsistentDatabase();
    void readersDoNotBlockWriter();
    void twoProcessesCreateOneDatabase();
    void m4KeepsExtremes();
    void downsampledSeriesKeepsPeaks();
    void compareRuns();
    void deleteRemovesFiles();
    void missingCheckpointKeepsHistory();
    void movedHistoryKeepsItsFiles();
    void exports();
    void busSink();
    void busSinkAbsorbsHeldUpWriter();
    void configHashIsCanonical();
    void benchmark();

private:
    std::string dbPath() const { return m_dir->filePath("runs.db").toStdString(); }
    std::unique_ptr<QTemporaryDir> m_dir;
};

void TestStore::init()
{
    m_dir = std::make_unique<QTemporaryDir>();
    QVERIFY(m_dir->isValid());
}

void TestStore::recordAndQuery()
{
    auto store = st::RunStore::open(dbPath());
    QVERIFY2(store.ok(), store.ok() ? "" : store.error().toString().c_str());
    QCOMPARE(store->fileSchemaVersion(), 0);
    st::NewRun spec;
    spec.name = "first";
    spec.project = "fashion";
    spec.model = {{"name", "seed_mlp"}, {"layers", nlohmann::json::array()}};
    spec.config = {{"epochs", 2}, {"batch_size", 256}};
    spec.seed = 42;
    spec.strategy = "mirrored";
    spec.devices = {"cpu:0", "cpu:1"};
    spec.tags = {"b", "a", "a", ""};  // duplicates and the empty tag are dropped
    auto run = store->createRun(spec);
    QVERIFY(run.ok());
    QCOMPARE(run->id.size(), std::size_t(36));
    QCOMPARE(run->id[14], '4');  // UUID v4 text form
    QVERIFY(store->upsertProject("fashion", {{"name", "seed_mlp"}}).ok());
    QVERIFY(store->upsertProject("fashion", {{"name", "seed_mlp"}, {"v", 2}}).ok());

    const std::string id = run->id;
    std::vector<tl::Event> events;
    tl::RunStateEvent running;
    running.stamp.runId = id;
    running.state = st::RunState::Running;
    events.push_back(running);
    for (int64_t s = 1; s <= 100; ++s) events.push_back(stepEvent(id, s, 5.0 - s * 0.01, s <= 50 ? 1 : 2));
    tl::EpochMetricsEvent ep;
    ep.stamp.runId = id;
    ep.stamp.step = 50;
    ep.epoch = 1;
    ep.metrics = {{"loss", 4.6}, {"val_loss", std::nan("")}, {"val_accuracy", 0.7}};
    ep.seconds = 1.5;
    ep.samplesPerSec = 9000;
    events.push_back(ep);
    tl::StepBreakdownEvent bd;
    bd.stamp.runId = id;
    bd.stamp.step = 10;
    bd.stamp.lane.device = "cpu:0";
    bd.stepSeconds = 0.01;
    bd.input = 0.002;
    bd.forward = 0.003;
    bd.backward = 0.004;
    bd.other = 0.001;
    events.push_back(bd);
    tl::DeviceSampleEvent dev;
    dev.stamp.runId = id;
    dev.stamp.step = 12;
    dev.stamp.lane.device = "";
    dev.perCore = {0.5, 0.25};
    dev.processCpu = 1.5;
    dev.memoryUsed = 123456;
    dev.memoryTotal = 999999;
    events.push_back(dev);
    tl::PipelineSampleEvent pipe;
    pipe.stamp.runId = id;
    pipe.stamp.step = 13;
    pipe.stage = "map(normalise)";
    pipe.produced = 256;
    pipe.queueDepth = 3;
    pipe.queueCapacity = 8;
    pipe.parallelism = 2;
    events.push_back(pipe);
    for (int i = 0; i < 3; ++i) {
        tl::SpanEvent sp;
        sp.stamp.runId = id;
        sp.stamp.step = 20 + i;
        sp.stamp.lane = {"local", "cpu:0", i == 2 ? "replica 1" : "replica 0"};
        sp.name = i == 0 ? "forward/dense" : "all-reduce";
        sp.category = i == 0 ? "forward" : "communication";
        sp.startUs = 1000 + i * 100;
        sp.durationUs = 50;
        if (i == 1) sp.args = {{"bytes", "4096"}};
        events.push_back(sp);
    }
    tl::FindingEvent f;
    f.stamp.runId = id;
    f.kind = "input-bound";
    f.severity = "high";
    f.message = "32% of the step time waits for input";
    f.recommendation = "add prefetch";
    f.firstStep = 1;
    f.lastStep = 100;
    events.push_back(f);
    tl::LogEvent log;
    log.stamp.runId = id;
    log.level = tl::LogLevel::Warning;
    log.message = "slow disk";
    events.push_back(log);
    tl::ErrorEvent err;
    err.stamp.runId = id;
    err.message = "NaN in gradients";
    err.hint = "lower the learning rate";
    err.where = "node dense_1";
    events.push_back(err);
    store->recordEvents(std::move(events));
    QVERIFY(store->flush().ok());
    QVERIFY(store->setRunStatus(id, st::RunState::Completed).ok());

    auto info = store->run(id);
    QVERIFY(info.ok());
    QCOMPARE(info->name, std::string("first"));
    QCOMPARE(info->status, st::RunState::Completed);
    QCOMPARE(info->modelName, std::string("seed_mlp"));
    QCOMPARE(info->strategy, std::string("mirrored"));
    QCOMPARE(info->seed, uint64_t(42));
    QCOMPARE(info->configHash, st::configHash(spec.config));
    QCOMPARE(info->config, spec.config);
    QCOMPARE(info->devices, spec.devices);
    QCOMPARE(info->tags, (std::vector<std::string>{"a", "b"}));
    QCOMPARE(info->lastStep, int64_t(100));
    QVERIFY(info->startedUs > 0 && info->endedUs >= info->startedUs);
    {
        // A parameter-server run's steps come from its reporting worker, its epochs end at ps:0's
        // count of every worker's steps: the run's last step is the larger (it listed 31 of 32).
        st::NewRun ps;
        ps.name = "ps";
        ps.strategy = "parameter-server";
        auto psRun = store->createRun(ps);
        QVERIFY(psRun.ok());
        for (int64_t step : {1, 3, 30, 31}) {
            tl::StepMetricsEvent e;
            e.stamp.runId = psRun->id;
            e.stamp.step = step;
            e.epoch = 1;
            e.loss = 1.0;
            store->record(e);
        }
        tl::EpochMetricsEvent epoch;
        epoch.stamp.runId = psRun->id;
        epoch.stamp.step = 32;
        epoch.epoch = 1;
        epoch.metrics = {{"loss", 1.0}};
        store->record(epoch);
        QVERIFY(store->flush().ok());
        QCOMPARE(store->run(psRun->id)->lastStep, int64_t(32));
    }

    auto names = store->metricNames(id);
    QVERIFY(names.ok());
    QCOMPARE(*names, (std::vector<std::string>{"accuracy", "learning_rate", "loss", "samples_per_sec"}));
    auto loss = store->series(id, "loss");
    QVERIFY(loss.ok());
    QCOMPARE(loss->samples, int64_t(100));
    QCOMPARE(loss->points.front().step, int64_t(1));
    QCOMPARE(loss->points.back().value, 4.0);
    auto epochs = store->epochMetrics(id);
    QVERIFY(epochs.ok());
    QCOMPARE(epochs->size(), std::size_t(1));
    QCOMPARE(epochs->at(0).metrics.at("val_accuracy"), 0.7);
    QVERIFY(std::isnan(epochs->at(0).metrics.at("val_loss")));  // NaN survives as NULL
    QCOMPARE(epochs->at(0).metrics.at("seconds"), 1.5);
    auto bds = store->breakdowns(id);
    QVERIFY(bds.ok() && bds->size() == 1);
    QCOMPARE(bds->at(0).backward, 0.004);
    auto devs = store->deviceSamples(id);
    QVERIFY(devs.ok() && devs->size() == 1);
    QCOMPARE(devs->at(0).perCore, (std::vector<double>{0.5, 0.25}));
    QCOMPARE(devs->at(0).memoryUsed, uint64_t(123456));
    QCOMPARE(devs->at(0).utilisation, -1.0);
    auto pipes = store->pipelineSamples(id);
    QVERIFY(pipes.ok() && pipes->size() == 1);
    QCOMPARE(pipes->at(0).stage, std::string("map(normalise)"));
    auto spans = store->spans(id);
    QVERIFY(spans.ok());
    QCOMPARE(spans->size(), std::size_t(3));
    QCOMPARE(spans->at(1).args.at("bytes"), std::string("4096"));
    QCOMPARE(spans->at(2).stamp.lane.thread, std::string("replica 1"));
    auto window = store->spans(id, 1210, 1220);  // only the third span overlaps
    QVERIFY(window.ok() && window->size() == 1);
    auto finds = store->findings(id);
    QVERIFY(finds.ok() && finds->size() == 1);
    QCOMPARE(finds->at(0).recommendation, std::string("add prefetch"));
    auto logs = store->logs(id);
    QVERIFY(logs.ok() && logs->size() == 2);
    QCOMPARE(logs->at(1).level, tl::LogLevel::Error);
    QVERIFY(logs->at(1).message.find("node dense_1") != std::string::npos);
    auto projects = store->projects();
    QVERIFY(projects.ok() && projects->size() == 1);
    QCOMPARE(projects->at(0).spec.value("v", 0), 2);
    auto counts = store->counts(id);
    QVERIFY(counts.ok());
    QCOMPARE(counts->steps, int64_t(100));
    QCOMPARE(counts->epochs, int64_t(1));
    QCOMPARE(counts->breakdowns, int64_t(1));
    QCOMPARE(counts->deviceSamples, int64_t(1));
    QCOMPARE(counts->pipelineSamples, int64_t(1));
    QCOMPARE(counts->spans, int64_t(3));
    QCOMPARE(counts->findings, int64_t(1));
    QCOMPARE(counts->logs, int64_t(2));
    QCOMPARE(counts->checkpoints, int64_t(0));
    auto integrity = store->integrityCheck();
    QVERIFY(integrity.ok());
    QCOMPARE(integrity->at(0), std::string("ok"));
    QVERIFY(store->close().ok());
    Raw raw(dbPath());
    QCOMPARE(raw.text("PRAGMA journal_mode"), QString("wal"));
    QCOMPARE(raw.text("PRAGMA user_version").toInt(), st::schemaVersion());
}

void TestStore::listFilters()
{
    auto store = st::RunStore::open(dbPath());
    QVERIFY(store.ok());
    auto make = [&](const char* name, const char* model, const char* strategy, std::vector<std::string> tags) {
        st::NewRun spec;
        spec.name = name;
        spec.model = {{"name", model}};
        spec.strategy = strategy;
        spec.tags = std::move(tags);
        auto r = store->createRun(spec);
        return r.ok() ? r->id : std::string();
    };
    const std::string a = make("Baseline MLP", "seed_mlp", "one-device", {"baseline"});
    const std::string b = make("mlp wide", "seed_mlp", "mirrored", {});
    const std::string c = make("cnn try", "small_cnn", "mirrored", {"baseline", "cnn"});
    QVERIFY(!a.empty() && !b.empty() && !c.empty());
    QVERIFY(store->setRunStatus(a, st::RunState::Completed).ok());
    QVERIFY(store->setRunStatus(b, st::RunState::Running).ok());
    QVERIFY(store->setRunStatus(c, st::RunState::Failed, "out of memory on cpu:1").ok());

    auto ids = [&](const st::RunFilter& f) {
        std::vector<std::string> out;
        auto r = store->listRuns(f);
        if (r.ok())
            for (const auto& i : *r) out.push_back(i.id);
        return out;
    };
    QCOMPARE(ids({}), (std::vector<std::string>{c, b, a}));  // newest first
    st::RunFilter f;
    f.status = st::RunState::Failed;
    QCOMPARE(ids(f), (std::vector<std::string>{c}));
    f = {};
    f.status = st::RunState::Running;  // our own process writes it: alive, not interrupted
    QCOMPARE(ids(f), (std::vector<std::string>{b}));
    f = {};
    f.nameContains = "MLP";
    QCOMPARE(ids(f), (std::vector<std::string>{b, a}));
    f = {};
    f.tag = "baseline";
    QCOMPARE(ids(f), (std::vector<std::string>{c, a}));
    f = {};
    f.strategy = "mirrored";
    f.model = "seed_mlp";
    QCOMPARE(ids(f), (std::vector<std::string>{b}));
    f = {};
    f.limit = 2;
    QCOMPARE(ids(f), (std::vector<std::string>{c, b}));
    auto failed = store->run(c);
    QVERIFY(failed.ok());
    QCOMPARE(failed->error, std::string("out of memory on cpu:1"));
}

void TestStore::resolveAndEdit()
{
    auto store = st::RunStore::open(dbPath());
    QVERIFY(store.ok());
    st::NewRun spec;
    spec.id = "abcd1234-0000-4000-8000-000000000001";
    spec.name = "alpha";
    QVERIFY(store->createRun(spec).ok());
    spec.id = "abcd5678-0000-4000-8000-000000000002";
    spec.name = "beta";
    QVERIFY(store->createRun(spec).ok());
    auto dup = store->createRun(spec);  // the same id twice
    QVERIFY(!dup.ok());
    QVERIFY(QString::fromStdString(dup.error().message).contains("already used"));

    QCOMPARE(*store->resolveRunId("abcd1"), std::string("abcd1234-0000-4000-8000-000000000001"));
    QCOMPARE(*store->resolveRunId("beta"), std::string("abcd5678-0000-4000-8000-000000000002"));
    auto ambiguous = store->resolveRunId("abcd");
    QVERIFY(!ambiguous.ok());
    QVERIFY(QString::fromStdString(ambiguous.error().message).contains("matches 2 runs"));
    auto missing = store->resolveRunId("gamma");
    QVERIFY(!missing.ok());
    QCOMPARE(missing.error().code, ts::ErrorCode::NotFound);

    const std::string id = *store->resolveRunId("alpha");
    QVERIFY(store->renameRun(id, "alpha v2").ok());
    QVERIFY(store->addTag(id, "keep").ok());
    QVERIFY(store->addTag(id, "best").ok());
    QVERIFY(store->removeTag(id, "keep").ok());
    auto info = store->run(id);
    QCOMPARE(info->name, std::string("alpha v2"));
    QCOMPARE(info->tags, std::vector<std::string>{"best"});
    QVERIFY(store->setTags(id, {"x", "y"}).ok());
    QCOMPARE(store->run(id)->tags, (std::vector<std::string>{"x", "y"}));
    // A comma is refused in new tags; a tag recorded with one before that rule does not block
    // editing the others (the studio saves the whole list).
    QVERIFY(!store->addTag(id, "a,b").ok());
    QVERIFY(!store->setTags(id, {"x", "c,d"}).ok());
    QVERIFY(store->flush().ok());
    {
        Raw raw(dbPath());
        QVERIFY(raw.exec("INSERT INTO run_tags (run, tag) SELECT rid, 'old,tag' FROM runs WHERE id = '" + id + "'"));
    }
    QVERIFY(store->setTags(id, {"old,tag", "x", "y", "z"}).ok());
    QCOMPARE(store->run(id)->tags.size(), std::size_t(4));
    QVERIFY(store->setTags(id, {"x", "y"}).ok());
    QVERIFY(!store->renameRun("no-such-run", "x").ok());
    // Names and tags end up in JSON exports: bytes that are not UTF-8 are refused, and the run
    // keeps its name.
    const ts::Status badName = store->renameRun(id, "bad\xff");
    QVERIFY(!badName.ok());
    QVERIFY2(badName.error().message.find("UTF-8") != std::string::npos, badName.error().message.c_str());
    QVERIFY(!store->addTag(id, "\xc3\x28").ok());
    QVERIFY(!store->setTags(id, {"ok", "\xed\xa0\x80"}).ok());  // an encoded surrogate
    QVERIFY(store->renameRun(id, "alpha v2 \xc3\xa9").ok());   // é is fine
    QCOMPARE(store->run(id)->name, std::string("alpha v2 \xc3\xa9"));
    QCOMPARE(store->run(id)->tags, (std::vector<std::string>{"x", "y"}));
    QVERIFY(store->renameRun(id, "alpha v2").ok());
    // A name that starts another run's id would make that run the one found by it: refused.
    const ts::Status idName = store->renameRun(id, "abcd5");
    QVERIFY(!idName.ok());
    QVERIFY2(idName.error().message.find("abcd5678-0000-4000-8000-000000000002") != std::string::npos, idName.error().message.c_str());
    QCOMPARE(store->run(id)->name, std::string("alpha v2"));
    QVERIFY(store->renameRun(id, "abcd1").ok());  // its own id: found either way
    QVERIFY(store->renameRun(id, "abc").ok());    // shorter than an id prefix lookup
    QVERIFY(store->renameRun(id, "alpha v2").ok());
    st::NewRun clash;
    clash.name = "abcd5678-0000-4000-8000-000000000002";
    QVERIFY(!store->createRun(clash).ok());
    // A failed task leaves the batch's other work alone.
    store->record(stepEvent(id, 1, 1.0));
    QVERIFY(!store->setRunStatus("no-such-run", st::RunState::Completed).ok());
    QCOMPARE(store->series(id, "loss")->samples, int64_t(1));
    // A reader of the same file still open (the studio's history, another process): closing the
    // writer folds the WAL into the database, so the .db file copied alone holds the edits.
    auto reader = st::RunStore::open(dbPath(), [] { st::OpenOptions o; o.readOnly = true; return o; }());
    QVERIFY(reader.ok());
    QVERIFY(store->renameRun(id, "alpha v3").ok());
    QVERIFY(store->close().ok());
    const std::string copy = dbPath() + ".copy";
    std::filesystem::copy_file(dbPath(), copy, std::filesystem::copy_options::overwrite_existing);
    auto copied = st::RunStore::open(copy, [] { st::OpenOptions o; o.readOnly = true; return o; }());
    QVERIFY(copied.ok());
    QCOMPARE(copied->run(id)->name, std::string("alpha v3"));
    QCOMPARE(copied->series(id, "loss")->samples, int64_t(1));
}

void TestStore::migratesVersion1Fixture()
{
    const std::string fixture = readAll(TS_FIXTURES_DIR "/store/v1_runs.sql");
    QVERIFY(!fixture.empty());
    {
        Raw raw(dbPath());
        QVERIFY(raw.exec(fixture));
        QCOMPARE(raw.text("PRAGMA user_version"), QString("1"));
        // Migration 1 as shipped must still produce exactly the fixture's schema.
        const std::string fresh = m_dir->filePath("fresh.db").toStdString();
        Raw v1(fresh);
        QVERIFY(v1.exec(st::migrationSql(1)));
        const char* q = "SELECT type, name, tbl_name, sql FROM sqlite_schema ORDER BY name";
        QCOMPARE(v1.column(q), raw.column(q));
    }
    auto store = st::RunStore::open(dbPath());
    QVERIFY2(store.ok(), store.ok() ? "" : store.error().toString().c_str());
    QCOMPARE(store->fileSchemaVersion(), 1);
    {
        Raw raw(dbPath());
        QCOMPARE(raw.text("PRAGMA user_version").toInt(), st::schemaVersion());
    }
    auto runs = store->listRuns();
    QVERIFY(runs.ok());
    QCOMPARE(runs->size(), std::size_t(2));
    // The model name column is back-filled from the model snapshot.
    st::RunFilter f;
    f.model = "seed_mlp";
    auto mlp = store->listRuns(f);
    QVERIFY(mlp.ok() && mlp->size() == 1);
    const std::string id = mlp->at(0).id;
    QCOMPARE(mlp->at(0).name, std::string("baseline"));
    QCOMPARE(mlp->at(0).status, st::RunState::Completed);
    QCOMPARE(mlp->at(0).lastStep, int64_t(4));
    auto loss = store->series(id, "loss");
    QVERIFY(loss.ok());
    QCOMPARE(loss->points.size(), std::size_t(4));
    QCOMPARE(loss->points.back().value, 0.8);
    auto epochs = store->epochMetrics(id);
    QVERIFY(epochs.ok() && epochs->size() == 2);
    QCOMPARE(epochs->at(1).metrics.at("val_accuracy"), 0.78);
    auto failed = store->run(*store->resolveRunId("broken lr"));
    QVERIFY(failed.ok());
    QCOMPARE(failed->error, std::string("loss became NaN at step 3"));
    QCOMPARE(failed->devices, nlohmann::json({"cpu:0", "cpu:1"}));
    auto failedLoss = store->series(failed->id, "loss");  // its last loss was NaN (NULL)
    QVERIFY(failedLoss.ok());
    QCOMPARE(failedLoss->points.size(), std::size_t(3));
    QVERIFY(std::isnan(failedLoss->points[2].value));
    // The upgraded database takes the newer kinds of records, for old runs too.
    QVERIFY(store->addTag(id, "imported").ok());
    tl::DeviceSampleEvent dev;
    dev.stamp.runId = id;
    dev.utilisation = 0.9;
    store->record(dev);
    QVERIFY(store->flush().ok());
    QCOMPARE(store->deviceSamples(id)->size(), std::size_t(1));
    QCOMPARE(store->run(id)->tags, std::vector<std::string>{"imported"});
    QCOMPARE(store->integrityCheck()->at(0), std::string("ok"));
    // The v1 checkpoint's file is long gone: an error about that file only.
    auto cps = store->checkpoints(id);
    QVERIFY(cps.ok() && cps->size() == 1);
    ts::Status v = store->verifyCheckpoint(cps->at(0));
    QVERIFY(!v.ok());
    QVERIFY(QString::fromStdString(v.error().message).contains("/nonexistent/trainstudio-v1/final.safetensors"));
}

void TestStore::migratesVersion2Fixture()
{
    const std::string fixture = readAll(TS_FIXTURES_DIR "/store/v2_runs.sql");
    QVERIFY(!fixture.empty());
    // Every step metric row of the fixture, as SQL reads it before the upgrade.
    QStringList rows;
    {
        Raw raw(dbPath());
        QVERIFY(raw.exec(fixture));
        QCOMPARE(raw.text("PRAGMA user_version"), QString("2"));
        // Migrations 1 and 2 as shipped must still produce exactly the fixture's schema.
        const std::string fresh = m_dir->filePath("fresh.db").toStdString();
        Raw v2(fresh);
        QVERIFY(v2.exec(st::migrationSql(1)));
        QVERIFY(v2.exec(st::migrationSql(2)));
        const char* q = "SELECT type, name, tbl_name, sql FROM sqlite_schema ORDER BY name";
        QCOMPARE(v2.column(q), raw.column(q));
        rows = raw.column("SELECT r.id, m.name, m.step, m.epoch, m.wall_us, "
                          "CASE WHEN m.value IS NULL THEN 'nan' ELSE printf('%.17g', m.value) END "
                          "FROM step_metrics m JOIN runs r ON r.rid = m.run ORDER BY r.id, m.name, m.step");
    }
    QCOMPARE(rows.size(), 24 + 5);
    auto store = st::RunStore::open(dbPath());
    QVERIFY2(store.ok(), store.ok() ? "" : store.error().toString().c_str());
    QCOMPARE(store->fileSchemaVersion(), 2);
    {
        Raw raw(dbPath());
        QCOMPARE(raw.text("PRAGMA user_version").toInt(), st::schemaVersion());
        QCOMPARE(raw.text("SELECT count(*) FROM step_metrics"), QString("0"));  // moved, not copied
        QCOMPARE(raw.text("SELECT count(*) FROM step_series"), QString("6"));  // one row per run and metric
    }
    // The packed series answer exactly what the rows held.
    std::map<std::string, std::map<std::string, std::vector<QStringList>>> byRun;  // run -> metric -> rows
    for (const QString& r : rows) {
        const QStringList f = r.split('|');
        byRun[f[0].toStdString()][f[1].toStdString()].push_back(f);
    }
    for (const auto& [id, metrics] : byRun) {
        auto names = store->metricNames(id);
        QVERIFY(names.ok());
        QCOMPARE(names->size(), metrics.size());
        for (const auto& [name, expected] : metrics) {
            auto s = store->series(id, name);
            QVERIFY2(s.ok(), s.ok() ? "" : s.error().toString().c_str());
            QCOMPARE(s->points.size(), expected.size());
            QCOMPARE(s->samples, int64_t(expected.size()));
            QCOMPARE(s->step0, expected.front()[2].toLongLong());
            QCOMPARE(s->step1, expected.back()[2].toLongLong());
            for (std::size_t i = 0; i < expected.size(); ++i) {
                QCOMPARE(s->points[i].step, expected[i][2].toLongLong());
                const double v = s->points[i].value;
                if (expected[i][5] == "nan") QVERIFY(std::isnan(v));
                else QCOMPARE(v, expected[i][5].toDouble());
            }
        }
        // forEachStep: every step once, with every metric recorded at it, its epoch and time.
        std::size_t seen = 0;
        QVERIFY(store->forEachStep(id, [&](int64_t step, int64_t epoch, int64_t wall, const std::map<std::string, double>& m) {
            for (const auto& [name, expected] : metrics)
                for (const QStringList& e : expected)
                    if (e[2].toLongLong() == step) {
                        ++seen;
                        QVERIFY(m.count(name));
                        QCOMPARE(epoch, e[3].toLongLong());
                        QCOMPARE(wall, e[4].toLongLong());
                    }
        }).ok());
        std::size_t total = 0;
        for (const auto& [name, expected] : metrics) total += expected.size();
        QCOMPARE(seen, total);
    }
    const std::string recorded = "95473d80-6b9c-49e4-b817-241bdd830afd";
    auto run = store->run(recorded);
    QVERIFY(run.ok());
    QCOMPARE(run->name, std::string("v2 baseline"));
    QCOMPARE(run->lastStep, int64_t(6));
    QCOMPARE(run->tags, std::vector<std::string>{"fixture"});
    auto counts = store->counts(recorded);
    QVERIFY(counts.ok());
    QCOMPARE(counts->steps, int64_t(6));
    QCOMPARE(counts->breakdowns, int64_t(6));
    QCOMPARE(counts->spans, int64_t(34));
    QCOMPARE(store->spans(recorded)->size(), std::size_t(34));
    QCOMPARE(store->epochMetrics(recorded)->size(), std::size_t(2));
    QCOMPARE(store->findings(recorded)->size(), std::size_t(2));
    // A zoom into the middle of the packed rows.
    st::SeriesQuery zoom;
    zoom.step0 = 2;
    zoom.step1 = 4;
    auto z = store->series(recorded, "loss", zoom);
    QVERIFY(z.ok());
    QCOMPARE(z->points.size(), std::size_t(3));
    QCOMPARE(z->points.front().step, int64_t(2));
    // The hand-made run: rows inserted out of order come back in step order, NaN kept.
    auto nan = store->run("0b5e7a3c-2f4d-4e6a-9b1c-3d5e7f9a1b2c");
    QVERIFY(nan.ok());
    QCOMPARE(nan->lastStep, int64_t(3));
    auto loss = store->series(nan->id, "loss");
    QVERIFY(loss.ok() && loss->points.size() == 3);
    QCOMPARE(loss->points[1].value, 9.5);
    QVERIFY(std::isnan(loss->points[2].value));
    // The upgraded database takes new steps for the old runs.
    store->record(stepEvent(nan->id, 4, 0.5));
    QVERIFY(store->flush().ok());
    QCOMPARE(store->run(nan->id)->lastStep, int64_t(4));
    QCOMPARE(store->series(nan->id, "loss")->points.size(), std::size_t(4));
    QCOMPARE(store->integrityCheck()->at(0), std::string("ok"));
}

void TestStore::rerecordedStepsKeepTheLastValue()
{
    // A step recorded again in a later batch (a resumed run re-running its last steps) replaces
    // the earlier value in every query, as one row per step used to.
    auto store = st::RunStore::open(dbPath());
    QVERIFY(store.ok());
    const std::string id = store->createRun({})->id;
    for (int64_t s = 1; s <= 10; ++s) store->record(stepEvent(id, s, 1.0));
    QVERIFY(store->flush().ok());
    for (int64_t s = 8; s <= 12; ++s) store->record(stepEvent(id, s, 2.0));
    QVERIFY(store->flush().ok());
    store->record(stepEvent(id, 5, 3.0));
    store->record(stepEvent(id, 5, 4.0));  // twice in one batch: the later one
    QVERIFY(store->flush().ok());
    auto s = store->series(id, "loss");
    QVERIFY(s.ok());
    QCOMPARE(s->points.size(), std::size_t(12));
    for (const auto& p : s->points)
        QCOMPARE(p.value, p.step == 5 ? 4.0 : p.step >= 8 ? 2.0 : 1.0);
    QCOMPARE(store->run(id)->lastStep, int64_t(12));
    std::vector<std::pair<int64_t, double>> steps;
    QVERIFY(store->forEachStep(id, [&](int64_t step, int64_t, int64_t, const std::map<std::string, double>& m) {
        steps.emplace_back(step, m.at("loss"));
    }).ok());
    QCOMPARE(steps.size(), std::size_t(12));
    for (std::size_t i = 0; i < steps.size(); ++i) {
        QCOMPARE(steps[i].first, int64_t(i + 1));
        QCOMPARE(steps[i].second, s->points[i].value);
    }
    st::SeriesQuery q;
    q.buckets = 3;
    auto d = store->series(id, "loss", q);
    QVERIFY(d.ok());
    QCOMPARE(d->samples, int64_t(12));
}

// train --restarts: the failed attempt recorded steps past its backup; the next attempt resumes
// after the backup's step (a Running state with resumedAfterStep) and records them again. Each
// step, breakdown and epoch counts once, the curve holds the new attempt's values, and the run
// that then completes shows no error from the failed attempt.
void TestStore::resumedRunDropsReplayedRecords()
{
    auto store = st::RunStore::open(dbPath());
    QVERIFY(store.ok());
    const std::string id = store->createRun({})->id;
    auto attempt = [&](int64_t from, int64_t to, double loss) {
        for (int64_t s = from; s <= to; ++s) {
            store->record(stepEvent(id, s, loss, (s - 1) / 10 + 1));
            tl::StepBreakdownEvent b;
            b.stamp = stepEvent(id, s, loss).stamp;
            b.stepSeconds = loss;
            store->record(b);
            if (s % 10 == 0) {
                tl::EpochMetricsEvent e;
                e.stamp = b.stamp;
                e.epoch = s / 10;
                e.metrics["loss"] = loss;
                store->record(e);
            }
        }
    };
    attempt(1, 30, 1.0);
    QVERIFY(store->flush().ok());  // steps 1-30 in the file
    attempt(31, 35, 1.0);          // and 31-35 in the batch the resume marker joins
    tl::RunStateEvent failed;
    failed.stamp = stepEvent(id, 35, 0).stamp;
    failed.state = tl::RunState::Failed;
    failed.message = "rank 1 stopped responding";
    store->record(failed);
    tl::RunStateEvent resumed;
    resumed.stamp = stepEvent(id, 25, 0).stamp;
    resumed.state = tl::RunState::Running;
    resumed.resumedAfterStep = 25;  // mid-block and mid-epoch
    store->record(resumed);
    attempt(26, 40, 2.0);
    tl::RunStateEvent done;
    done.stamp = stepEvent(id, 40, 0).stamp;
    done.state = tl::RunState::Completed;
    store->record(done);
    QVERIFY(store->flush().ok());

    auto counts = store->counts(id);
    QVERIFY(counts.ok());
    QCOMPARE(counts->steps, int64_t(40));
    QCOMPARE(counts->breakdowns, int64_t(40));
    QCOMPARE(counts->epochs, int64_t(4));
    auto s = store->series(id, "loss");
    QVERIFY(s.ok());
    QCOMPARE(s->points.size(), std::size_t(40));
    for (std::size_t i = 0; i < s->points.size(); ++i) {
        QCOMPARE(s->points[i].step, int64_t(i + 1));
        QCOMPARE(s->points[i].value, s->points[i].step > 25 ? 2.0 : 1.0);
    }
    auto epochs = store->epochMetrics(id);
    QVERIFY(epochs.ok());
    QCOMPARE(epochs->size(), std::size_t(4));
    QCOMPARE(epochs->at(2).metrics.at("loss"), 2.0);  // epoch 3 (steps 21-30) was redone
    QCOMPARE(epochs->at(1).metrics.at("loss"), 1.0);  // epoch 2 ended before the backup
    auto run = store->run(id);
    QVERIFY(run.ok());
    QCOMPARE(run->status, st::RunState::Completed);
    QCOMPARE(run->error, std::string());
}

void TestStore::refusesNewerSchema()
{
    {
        auto store = st::RunStore::open(dbPath());
        QVERIFY(store.ok());
        st::NewRun spec;
        spec.name = "from the future";
        QVERIFY(store->createRun(spec).ok());
    }
    const int newer = st::schemaVersion() + 1;
    {
        Raw raw(dbPath());
        QVERIFY(raw.exec("PRAGMA user_version = " + std::to_string(newer)));
    }
    const std::string before = readAll(dbPath());
    auto rw = st::RunStore::open(dbPath());
    QVERIFY(!rw.ok());
    QCOMPARE(rw.error().code, ts::ErrorCode::Unsupported);
    const QString msg = QString::fromStdString(rw.error().message);
    QVERIFY2(msg.contains(QString("created by a newer TrainStudio (schema %1 > %2)").arg(newer).arg(st::schemaVersion())),
             qPrintable(msg));
    QVERIFY(msg.contains(QString::fromStdString(dbPath())));
    QCOMPARE(readAll(dbPath()), before);  // not modified
    // Read-only still shows the runs (migrations only add, so the columns we read exist).
    st::OpenOptions ro;
    ro.readOnly = true;
    auto store = st::RunStore::open(dbPath(), ro);
    QVERIFY2(store.ok(), store.ok() ? "" : store.error().toString().c_str());
    QCOMPARE(store->fileSchemaVersion(), newer);
    auto runs = store->listRuns();
    QVERIFY(runs.ok() && runs->size() == 1);
    QCOMPARE(runs->at(0).name, std::string("from the future"));
    st::NewRun spec;
    QVERIFY(!store->createRun(spec).ok());  // read-only: refused, not crashed
    QCOMPARE(readAll(dbPath()), before);
}

void TestStore::damagedFiles()
{
    // Not a database at all.
    const std::string garbage = m_dir->filePath("garbage.db").toStdString();
    {
        std::ofstream out(garbage);
        for (int i = 0; i < 200; ++i) out << "this is not an SQLite database, just text\n";
    }
    const std::string before = readAll(garbage);
    auto g = st::RunStore::open(garbage);
    QVERIFY(!g.ok());
    QVERIFY2(QString::fromStdString(g.error().message).contains(QString::fromStdString(garbage)), g.error().message.c_str());
    QVERIFY(!g.error().hint.empty());
    QCOMPARE(readAll(garbage), before);

    // Another program's SQLite database.
    const std::string foreign = m_dir->filePath("foreign.db").toStdString();
    {
        Raw raw(foreign);
        QVERIFY(raw.exec("CREATE TABLE contacts (name TEXT); INSERT INTO contacts VALUES ('x');"));
    }
    auto f = st::RunStore::open(foreign);
    QVERIFY(!f.ok());
    QVERIFY(QString::fromStdString(f.error().message).contains("another program"));
    {
        Raw raw(foreign);
        QCOMPARE(raw.text("SELECT name FROM contacts"), QString("x"));
        QCOMPARE(raw.text("PRAGMA user_version"), QString("0"));
    }

    // A run database whose pages were overwritten (a disk error, a bad copy): from page 4 on
    // (the schema's pages), or only its second half (metric pages; the schema is intact).
    for (const bool schemaHit : {true, false}) {
        const std::string file = m_dir->filePath(schemaHit ? "damaged1.db" : "damaged2.db").toStdString();
        {
            auto store = st::RunStore::open(file);
            QVERIFY(store.ok());
            st::NewRun spec;
            spec.name = "damaged";
            auto run = store->createRun(spec);
            std::vector<tl::Event> ev;
            for (int64_t s = 1; s <= 20000; ++s) ev.push_back(stepEvent(run->id, s, 1.0));
            store->recordEvents(std::move(ev));
            QVERIFY(store->close().ok());
        }
        std::string bytes = readAll(file);
        QVERIFY(bytes.size() > 64 * 1024);
        const std::size_t from = schemaHit ? 3 * 4096 : bytes.size() / 2;
        for (std::size_t i = from; i < bytes.size() - 4096; ++i) bytes[i] = static_cast<char>(0xA5 ^ (i * 31));
        {
            std::ofstream out(file, std::ios::binary | std::ios::trunc);
            out << bytes;
        }
        const QString path = QString::fromStdString(file);
        auto d = st::RunStore::open(file);
        if (!d.ok()) {
            qInfo("damaged database refused at open: %s", d.error().toString().c_str());
            QVERIFY2(QString::fromStdString(d.error().message).contains(path), d.error().message.c_str());
            continue;
        }
        // Opened: the damage shows as errors naming the file, never a crash.
        bool reported = false;
        auto runs = d->listRuns();
        // The runs table is intact when only metric pages are hit: the list still works.
        if (!schemaHit) QVERIFY2(runs.ok() && runs->size() == 1, runs.ok() ? "" : runs.error().toString().c_str());
        if (!runs.ok()) {
            qInfo("damaged database: %s", runs.error().toString().c_str());
            reported = QString::fromStdString(runs.error().message).contains(path);
        } else {
            for (const auto& r : *runs) {
                auto se = d->series(r.id, "loss", {});
                if (!se.ok()) {
                    qInfo("damaged database: %s", se.error().toString().c_str());
                    reported = QString::fromStdString(se.error().message).contains(path);
                }
            }
        }
        auto check = d->integrityCheck();
        if (check.ok() && !check->empty() && check->at(0) != "ok") reported = true;
        if (!check.ok()) reported = reported || QString::fromStdString(check.error().message).contains(path);
        QVERIFY(reported);
    }
}

void TestStore::crashLeavesConsistentDatabase()
{
    const QString exe = QFileInfo("/proc/self/exe").canonicalFilePath();
    QProcess child;
    child.setProcessChannelMode(QProcess::SeparateChannels);
    child.start(exe, {"--crash-child", QString::fromStdString(dbPath())});
    QVERIFY(child.waitForStarted(10000));
    QString runId;
    long long committed = 0;
    QElapsedTimer timer;
    timer.start();
    // Kill it once a few batches are committed, while it keeps writing.
    while (committed < 3000 && timer.elapsed() < 30000) {
        if (!child.canReadLine() && !child.waitForReadyRead(5000)) break;
        while (child.canReadLine()) {
            const QString line = QString::fromUtf8(child.readLine()).trimmed();
            if (line.startsWith("run ")) runId = line.mid(4);
            if (line.startsWith("committed ")) committed = line.mid(10).toLongLong();
        }
    }
    child.kill();  // SIGKILL
    QVERIFY(child.waitForFinished(10000));
    QVERIFY2(committed >= 3000, qPrintable("child stopped early: " + QString::fromUtf8(child.readAllStandardError())));
    QCOMPARE(child.exitStatus(), QProcess::CrashExit);
    const std::string id = runId.toStdString();

    {
        Raw raw(dbPath());
        QCOMPARE(raw.text("PRAGMA integrity_check"), QString("ok"));
        QCOMPARE(raw.text("SELECT status FROM runs WHERE id = '" + id + "'"), QString("running"));
    }
    // Read-only: the row still says running, but its writer is gone.
    {
        st::OpenOptions ro;
        ro.readOnly = true;
        auto store = st::RunStore::open(dbPath(), ro);
        QVERIFY(store.ok());
        QCOMPARE(store->run(id)->status, st::RunState::Interrupted);
    }
    auto store = st::RunStore::open(dbPath());
    QVERIFY2(store.ok(), store.ok() ? "" : store.error().toString().c_str());
    auto run = store->run(id);
    QVERIFY(run.ok());
    QCOMPARE(run->status, st::RunState::Interrupted);
    QVERIFY(QString::fromStdString(run->error).contains("pid"));
    QVERIFY(run->endedUs > 0);
    {
        Raw raw(dbPath());
        QCOMPARE(raw.text("SELECT status FROM runs WHERE id = '" + id + "'"), QString("interrupted"));
    }
    // Every step up to the last reported commit is there, with no gaps.
    auto loss = store->series(id, "loss");
    QVERIFY(loss.ok());
    QVERIFY2(loss->samples >= committed, qPrintable(QString("%1 < %2").arg(loss->samples).arg(committed)));
    QCOMPARE(loss->step0, int64_t(1));
    QCOMPARE(loss->step1, loss->samples);
    QCOMPARE(loss->points[static_cast<std::size_t>(committed - 1)].value, 1.0 / static_cast<double>(committed));
    QVERIFY(store->deviceSamples(id)->size() >= static_cast<std::size_t>(committed));
    QVERIFY(store->spans(id)->size() >= static_cast<std::size_t>(committed));
    QCOMPARE(store->integrityCheck()->at(0), std::string("ok"));
    // A new run in the same database works as usual.
    st::NewRun spec;
    spec.name = "after the crash";
    QVERIFY(store->createRun(spec).ok());
}

// Two processes that record into the same new --db at the same moment both open it: the second
// one's switch to WAL journaling met the first's lock ("database is locked") in 3 of 4 tries.
void TestStore::twoProcessesCreateOneDatabase()
{
    for (int round = 0; round < 6; ++round) {
        const std::string path = m_dir->filePath(QString("fresh-%1.db").arg(round)).toStdString();
        const pid_t child = ::fork();
        QVERIFY(child >= 0);
        if (child == 0) {
            auto store = st::RunStore::open(path);
            if (!store.ok()) std::fprintf(stderr, "child: %s\n", store.error().message.c_str());
            ::_exit(store.ok() ? 0 : 1);
        }
        auto store = st::RunStore::open(path);
        int status = 0;
        QCOMPARE(::waitpid(child, &status, 0), child);
        QVERIFY2(store.ok(), store.ok() ? "" : store.error().message.c_str());
        QVERIFY(WIFEXITED(status));
        QCOMPARE(WEXITSTATUS(status), 0);
    }
}

void TestStore::readersDoNotBlockWriter()
{
    auto writer = st::RunStore::open(dbPath());
    QVERIFY(writer.ok());
    st::NewRun spec;
    spec.name = "busy";
    const std::string id = writer->createRun(spec)->id;
    std::vector<tl::Event> ev;
    for (int64_t s = 1; s <= 1000; ++s) ev.push_back(stepEvent(id, s, 1.0));
    writer->recordEvents(std::move(ev));
    QVERIFY(writer->flush().ok());

    st::OpenOptions ro;
    ro.readOnly = true;
    auto reader = st::RunStore::open(dbPath(), ro);
    QVERIFY(reader.ok());
    // A reader holding a snapshot (a long read) while the writer commits 20 batches.
    int64_t inside = -1;
    qint64 writeMs = -1;
    QVERIFY(reader->withReadSnapshot([&] {
        QElapsedTimer t;
        t.start();
        for (int b = 0; b < 20; ++b) {
            std::vector<tl::Event> batch;
            for (int64_t s = 0; s < 500; ++s) batch.push_back(stepEvent(id, 1001 + b * 500 + s, 2.0));
            writer->recordEvents(std::move(batch));
            QVERIFY(writer->flush().ok());
        }
        writeMs = t.elapsed();
        inside = reader->series(id, "loss")->samples;
    }).ok());
    QCOMPARE(inside, int64_t(1000));  // the snapshot
    QVERIFY2(writeMs < 5000, qPrintable(QString("writes took %1 ms behind a reader").arg(writeMs)));
    QCOMPARE(reader->series(id, "loss")->samples, int64_t(11000));

    // Readers hammering the database from another thread while the writer writes: no errors
    // (no SQLITE_BUSY) on either side.
    std::atomic<bool> stop{false};
    std::atomic<int> reads{0}, readErrors{0};
    std::thread t([&] {
        auto r2 = st::RunStore::open(dbPath(), ro);
        if (!r2.ok()) {
            ++readErrors;
            return;
        }
        st::SeriesQuery q;
        q.buckets = 100;
        while (!stop) {
            if (!r2->listRuns().ok() || !r2->series(id, "loss", q).ok()) ++readErrors;
            ++reads;
        }
    });
    for (int b = 0; b < 10; ++b) {
        std::vector<tl::Event> batch;
        for (int64_t s = 0; s < 1000; ++s) batch.push_back(stepEvent(id, 20001 + b * 1000 + s, 3.0));
        writer->recordEvents(std::move(batch));
    }
    QVERIFY(writer->flush().ok());
    stop = true;
    t.join();
    QCOMPARE(readErrors.load(), 0);
    QVERIFY(reads.load() > 0);
    QCOMPARE(writer->droppedEvents(), uint64_t(0));
    QCOMPARE(writer->series(id, "loss")->samples, int64_t(21000));
}

void TestStore::m4KeepsExtremes()
{
    // Steps 0..9 into 2 buckets ([0,4], [5,9]): first, min, max, last of each, in step order.
    std::vector<st::SeriesPoint> s;
    const double v[10] = {5, 1, 9, 3, 4, 2, 2, 8, 0, 6};
    for (int i = 0; i < 10; ++i) s.push_back({i, v[i]});
    auto p = st::downsampleM4(s, 0, 9, 2);
    const std::vector<st::SeriesPoint> expected = {{0, 5}, {1, 1}, {2, 9}, {4, 4}, {5, 2}, {7, 8}, {8, 0}, {9, 6}};
    QCOMPARE(p, expected);
    // Fewer samples than 4 per bucket: all kept. NaN skipped. Out of range ignored.
    std::vector<st::SeriesPoint> few = {{1, 1}, {2, std::nan("")}, {3, 3}, {100, 7}};
    QCOMPARE(st::downsampleM4(few, 0, 10, 5), (std::vector<st::SeriesPoint>{{1, 1}, {3, 3}}));
    // A range spanning the whole int64 axis does not overflow.
    st::M4Downsampler wide(std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), 4);
    wide.add(std::numeric_limits<int64_t>::max(), 1);
    wide.add(std::numeric_limits<int64_t>::min(), 2);
    QCOMPARE(wide.points().size(), std::size_t(2));
}

void TestStore::downsampledSeriesKeepsPeaks()
{
    auto store = st::RunStore::open(dbPath());
    QVERIFY(store.ok());
    st::NewRun spec;
    const std::string id = store->createRun(spec)->id;
    std::vector<tl::Event> ev;
    const int64_t n = 30000;
    for (int64_t s = 1; s <= n; ++s) {
        double loss = 2.0 + std::sin(static_cast<double>(s) * 0.01);
        if (s == 17777) loss = 1000;  // a blow-up at one step
        if (s == 23333) loss = -1000;
        ev.push_back(stepEvent(id, s, loss));
    }
    store->recordEvents(std::move(ev));
    QVERIFY(store->flush().ok());
    st::SeriesQuery q;
    q.buckets = 300;
    auto s = store->series(id, "loss", q);
    QVERIFY(s.ok());
    QCOMPARE(s->samples, n);
    QVERIFY(s->downsampled);
    QVERIFY(s->points.size() <= 4 * 300);
    QCOMPARE(s->points.front().step, int64_t(1));
    QCOMPARE(s->points.back().step, n);
    auto has = [](const st::Series& se, int64_t step, double v) {
        for (const auto& p : se.points)
            if (p.step == step && p.value == v) return true;
        return false;
    };
    QVERIFY(has(*s, 17777, 1000));
    QVERIFY(has(*s, 23333, -1000));
    QVERIFY(std::is_sorted(s->points.begin(), s->points.end(), [](auto& a, auto& b) { return a.step < b.step; }));
    // Zoomed in: the range is honoured and the spike is still there.
    q.step0 = 17000;
    q.step1 = 18000;
    q.buckets = 50;
    auto z = store->series(id, "loss", q);
    QVERIFY(z.ok());
    QCOMPARE(z->samples, int64_t(1001));
    QVERIFY(has(*z, 17777, 1000));
    QVERIFY(z->points.front().step >= 17000 && z->points.back().step <= 18000);
    // Raw (no buckets) returns every sample.
    q.buckets = 0;
    QCOMPARE(store->series(id, "loss", q)->points.size(), std::size_t(1001));
    // An unknown metric is an empty series, not an error.
    auto none = store->series(id, "no_such_metric");
    QVERIFY(none.ok() && none->points.empty());
}

void TestStore::compareRuns()
{
    auto store = st::RunStore::open(dbPath());
    QVERIFY(store.ok());
    const std::string a = store->createRun({})->id;
    const std::string b = store->createRun({})->id;
    std::vector<tl::Event> ev;
    for (int64_t s = 1; s <= 100; ++s) ev.push_back(stepEvent(a, s, 100.0 - static_cast<double>(s)));
    for (int64_t s = 1; s <= 50; ++s) ev.push_back(stepEvent(b, s, static_cast<double>(s)));
    store->recordEvents(std::move(ev));
    QVERIFY(store->flush().ok());
    st::SeriesQuery q;
    q.buckets = 10;
    auto c = store->compare({a, b}, "loss", q);
    QVERIFY(c.ok());
    QCOMPARE(c->size(), std::size_t(2));
    QCOMPARE(c->at(0).runId, a);
    QCOMPARE(c->at(0).step0, int64_t(1));
    QCOMPARE(c->at(1).step0, int64_t(1));
    QCOMPARE(c->at(0).step1, int64_t(100));
    QCOMPARE(c->at(1).step1, int64_t(100));  // one shared axis
    QCOMPARE(c->at(0).samples, int64_t(100));
    QCOMPARE(c->at(1).samples, int64_t(50));
    QCOMPARE(c->at(1).points.back(), (st::SeriesPoint{50, 50.0}));
    QCOMPARE(c->at(0).points.back(), (st::SeriesPoint{100, 0.0}));
    q.buckets = 0;
    auto raw = store->compare({b, a}, "accuracy", q);
    QVERIFY(raw.ok());
    QCOMPARE(raw->at(0).points.size(), std::size_t(50));
    QCOMPARE(raw->at(1).points.size(), std::size_t(100));
    QVERIFY(!store->compare({a, "no-such-run"}, "loss", q).ok());
}

// A database file this user may not write: SQLite opens it read-only without a word, and a
// training run then "recorded" nothing (empty run id, exit 0). Opening for writing says so; a
// reader still gets in. Root ignores file permissions, so as root the check runs as nobody.
void TestStore::readOnlyFileIsSaid()
{
    const std::string path = dbPath();
    {
        auto store = st::RunStore::open(path);
        QVERIFY(store.ok());
        QVERIFY(store->createRun({}).ok());
    }
    namespace fs = std::filesystem;
    fs::permissions(path, fs::perms::owner_read | fs::perms::group_read | fs::perms::others_read);
    // Only the file is read-only; the folder stays writable (a reader of a WAL database makes its
    // -shm file there).
    fs::permissions(fs::path(path).parent_path(), fs::perms::owner_all | fs::perms::group_all | fs::perms::others_all);
    // 0: refused for writing, naming the file, and readable; 1-3: which expectation failed.
    auto check = [&path]() -> int {
        auto rw = st::RunStore::open(path);
        if (rw.ok()) return 1;
        if (rw.error().code != ts::ErrorCode::Unsupported || rw.error().message.find("read-only") == std::string::npos ||
            rw.error().message.find(path) == std::string::npos)
            return 2;
        st::OpenOptions ro;
        ro.readOnly = true;
        auto reader = st::RunStore::open(path, ro);
        return reader.ok() && reader->listRuns().ok() && reader->listRuns()->size() == 1 ? 0 : 3;
    };
    int result = -1;
    if (::geteuid() != 0) {
        result = check();
    } else {
        const pid_t child = ::fork();
        QVERIFY(child >= 0);
        if (child == 0) {
            if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(4);
            ::_exit(check());
        }
        int status = 0;
        QCOMPARE(::waitpid(child, &status, 0), child);
        QVERIFY(WIFEXITED(status));
        result = WEXITSTATUS(status);
        if (result == 4) QSKIP("cannot become nobody to test file permissions");
    }
    fs::permissions(path, fs::perms::owner_read | fs::perms::owner_write);
    QVERIFY2(result == 0, qPrintable(QString("expectation %1 failed").arg(result)));

    // On read-only media (no -shm file can be made next to it) it is still read: opened immutable.
    const QString mountPoint = m_dir->filePath("media");
    QVERIFY(QDir().mkpath(mountPoint));
    if (::geteuid() != 0 || ::mount("tmpfs", mountPoint.toUtf8().constData(), "tmpfs", 0, "size=4m") != 0)
        QSKIP("cannot mount a tmpfs to test read-only media (needs root)");
    const std::string onMedia = mountPoint.toStdString() + "/copy of runs.db";  // a space: the URI is escaped
    fs::copy_file(path, onMedia);
    const bool readOnly = ::mount(nullptr, mountPoint.toUtf8().constData(), nullptr, MS_REMOUNT | MS_RDONLY, nullptr) == 0;
    st::OpenOptions ro;
    ro.readOnly = true;
    auto reader = readOnly ? st::RunStore::open(onMedia, ro) : ts::Result<st::RunStore>(ts::makeError(ts::ErrorCode::Internal, "no remount"));
    const bool listed = reader.ok() && reader->listRuns().ok() && reader->listRuns()->size() == 1;
    const std::string why = reader.ok() ? std::string() : reader.error().message;
    reader = ts::makeError(ts::ErrorCode::Internal, "closed");  // before unmounting
    ::umount2(mountPoint.toUtf8().constData(), MNT_DETACH);
    QVERIFY2(readOnly, "could not remount the tmpfs read-only");
    QVERIFY2(listed, why.c_str());
}

void TestStore::deleteRemovesFiles()
{
    auto store = st::RunStore::open(dbPath());
    QVERIFY(store.ok());
    const std::string a = store->createRun({})->id;
    const std::string b = store->createRun({})->id;
    store->record(stepEvent(a, 1, 1.0));
    store->record(stepEvent(b, 1, 2.0));
    namespace fs = std::filesystem;
    const fs::path dirA = store->runFilesDir(a);
    fs::create_directories(dirA);
    auto weights = [](const std::string& path, float v) {
        return ts::writeSafetensors(path, {{"dense/kernel", ts::Tensor::fromVector(ts::Shape({2, 2}), {v, v, v, v})}});
    };
    const std::string own = (dirA / "final.safetensors").string();
    const fs::path root = st::RunStore::filesRoot(dbPath());
    const std::string shared = (root / "shared.safetensors").string();
    const std::string changed = (root / "changed.safetensors").string();
    // Files the user named (--save-weights, --trace) outside the store's folder are theirs.
    const std::string trace = m_dir->filePath("a.trace.json").toStdString();
    const std::string exported = m_dir->filePath("exported.safetensors").toStdString();
    QVERIFY(weights(own, 1).ok());
    QVERIFY(weights(shared, 2).ok());
    QVERIFY(weights(changed, 3).ok());
    QVERIFY(weights(exported, 5).ok());
    { std::ofstream(trace) << "{\"traceEvents\": []}"; }
    QVERIFY(store->addCheckpoint(a, own, 10, "final").ok());
    QVERIFY(store->addCheckpoint(a, shared, 5).ok());
    QVERIFY(store->addCheckpoint(b, shared, 5).ok());
    QVERIFY(store->addCheckpoint(a, changed, 7).ok());
    QVERIFY(store->addFile(a, "trace", trace).ok());
    QVERIFY(store->addCheckpoint(a, exported, 10, "final").ok());
    QVERIFY(weights(changed, 4).ok());  // overwritten after it was recorded

    // Not while it is being recorded (its writer would go on writing files nothing refers to).
    auto refused = store->deleteRun(a);
    QVERIFY(!refused.ok());
    QVERIFY2(refused.error().message.find("is still being recorded (by process " + std::to_string(::getpid())) != std::string::npos,
             refused.error().message.c_str());
    QVERIFY(fs::exists(own));
    QVERIFY(store->setRunStatus(a, st::RunState::Completed).ok());
    auto report = store->deleteRun(a);
    QVERIFY2(report.ok(), report.ok() ? "" : report.error().toString().c_str());
    QVERIFY(!fs::exists(own));
    QVERIFY(!fs::exists(dirA));  // the store's own folder for the run, now empty
    QVERIFY(fs::exists(trace));
    QVERIFY(fs::exists(exported));
    QVERIFY(fs::exists(shared));
    QVERIFY(fs::exists(changed));
    QCOMPARE(report->removedFiles.size(), std::size_t(1));
    QCOMPARE(report->keptFiles.size(), std::size_t(4));
    QVERIFY(!store->run(a).ok());
    QVERIFY(!store->series(a, "loss").ok());
    Raw raw(dbPath());
    QCOMPARE(raw.text("SELECT count(*) FROM step_metrics WHERE run NOT IN (SELECT rid FROM runs)"), QString("0"));
    QCOMPARE(raw.text("SELECT count(*) FROM step_series WHERE run NOT IN (SELECT rid FROM runs)"), QString("0"));
    QCOMPARE(raw.text("SELECT count(*) FROM checkpoints"), QString("1"));  // b's
    // The other run is untouched and can still be deleted (its shared file goes with it now).
    QCOMPARE(store->series(b, "loss")->samples, int64_t(1));
    QVERIFY(store->setRunStatus(b, st::RunState::Completed).ok());
    auto rb = store->deleteRun(b);
    QVERIFY(rb.ok());
    QVERIFY(!fs::exists(shared));
    QVERIFY(!store->deleteRun(a).ok());  // already gone: an error, not a crash
}

void TestStore::missingCheckpointKeepsHistory()
{
    auto store = st::RunStore::open(dbPath());
    QVERIFY(store.ok());
    const std::string id = store->createRun({})->id;
    for (int64_t s = 1; s <= 10; ++s) store->record(stepEvent(id, s, 1.0));
    const std::string path = m_dir->filePath("w.safetensors").toStdString();
    QVERIFY(ts::writeSafetensors(path, {{"w", ts::Tensor::fromVector(ts::Shape({1}), {1.f})}}).ok());
    QVERIFY(store->addCheckpoint(id, path, 10, "final").ok());
    QVERIFY(!store->addCheckpoint(id, m_dir->filePath("nope.safetensors").toStdString(), 1).ok());
    std::filesystem::remove(path);
    auto cps = store->checkpoints(id);
    QVERIFY(cps.ok() && cps->size() == 1);
    ts::Status v = store->verifyCheckpoint(cps->at(0));
    QVERIFY(!v.ok());
    QCOMPARE(v.error().code, ts::ErrorCode::NotFound);
    QVERIFY(QString::fromStdString(v.error().message).contains(QString::fromStdString(path)));
    auto exported = st::exportFinalWeights(*store, id, m_dir->filePath("out.safetensors").toStdString());
    QVERIFY(!exported.ok());
    QVERIFY(QString::fromStdString(exported.error().message).contains(QString::fromStdString(path)));
    QVERIFY(!QFile::exists(m_dir->filePath("out.safetensors")));
    // Everything else still works.
    QCOMPARE(store->series(id, "loss")->samples, int64_t(10));
    QVERIFY(store->listRuns().ok());
    std::ostringstream csv;
    QVERIFY(st::exportStepMetricsCsv(*store, id, csv).ok());
    QVERIFY(store->setRunStatus(id, st::RunState::Cancelled).ok());
    QVERIFY(store->deleteRun(id).ok());
}

// A database moved with its -files folder (another machine, a new home folder) still finds the
// checkpoints the store wrote there, exports them and deletes them with the run: they are
// recorded relative to the database's folder. Files elsewhere keep their absolute paths.
void TestStore::movedHistoryKeepsItsFiles()
{
    const QString from = m_dir->filePath("before"), to = m_dir->filePath("after");
    QVERIFY(QDir().mkpath(from));
    const std::string db = (from + "/history.db").toStdString();
    std::string id, own;
    const std::string outside = m_dir->filePath("user.safetensors").toStdString();
    QVERIFY(ts::writeSafetensors(outside, {{"w", ts::Tensor::fromVector(ts::Shape({1}), {2.f})}}).ok());
    {
        auto store = st::RunStore::open(db);
        QVERIFY(store.ok());
        id = store->createRun({})->id;
        std::filesystem::create_directories(store->runFilesDir(id));
        own = store->runFilesDir(id) + "/final.safetensors";
        QVERIFY(ts::writeSafetensors(own, {{"w", ts::Tensor::fromVector(ts::Shape({1}), {1.f})}}).ok());
        QVERIFY(store->addCheckpoint(id, own, 10, "final").ok());
        QVERIFY(store->addFile(id, "trace", outside).ok());
        QCOMPARE(store->checkpoints(id)->at(0).path, own);  // read back absolute
        QVERIFY(store->setRunStatus(id, st::RunState::Completed).ok());
    }
    QVERIFY(QDir().rename(from, to));
    auto moved = st::RunStore::open((to + "/history.db").toStdString());
    QVERIFY(moved.ok());
    const auto cps = moved->checkpoints(id);
    QVERIFY(cps.ok() && cps->size() == 1);
    QCOMPARE(QString::fromStdString(cps->at(0).path), to + "/history-files/" + QString::fromStdString(id) + "/final.safetensors");
    QVERIFY2(moved->verifyCheckpoint(cps->at(0)).ok(), moved->verifyCheckpoint(cps->at(0)).error().message.c_str());
    QVERIFY(st::exportFinalWeights(*moved, id, m_dir->filePath("back.safetensors").toStdString()).ok());
    QCOMPARE(moved->files(id)->at(0).path, outside);
    auto report = moved->deleteRun(id);
    QVERIFY(report.ok());
    QCOMPARE(report->removedFiles.size(), std::size_t(1));
    QVERIFY(!QFile::exists(QString::fromStdString(cps->at(0).path)));
    QVERIFY(QFile::exists(QString::fromStdString(outside)));
}

void TestStore::exports()
{
    auto store = st::RunStore::open(dbPath());
    QVERIFY(store.ok());
    st::NewRun spec;
    spec.name = "export me";
    const std::string id = store->createRun(spec)->id;
    QVERIFY(store->setRunStatus(id, st::RunState::Running).ok());
    for (int64_t s = 1; s <= 10; ++s) store->record(stepEvent(id, s, 1.0 / static_cast<double>(s)));
    tl::StepMetricsEvent extra;  // a metric recorded only at some steps
    extra.stamp.runId = id;
    extra.stamp.step = 11;
    extra.loss = 0.05;
    extra.metrics["grad,norm"] = 3.5;
    store->record(extra);
    tl::EpochMetricsEvent ep;
    ep.stamp.runId = id;
    ep.stamp.step = 10;
    ep.epoch = 1;
    ep.metrics = {{"loss", 0.3}, {"val_accuracy", 0.8}};
    store->record(ep);
    for (int i = 0; i < 3; ++i) {
        tl::SpanEvent sp;
        sp.stamp.runId = id;
        sp.stamp.lane = {"local", "cpu:0", "main"};
        sp.name = i == 1 ? "backward/dense" : "forward/dense";
        sp.category = i == 1 ? "backward" : "forward";
        sp.startUs = 1'700'000'000'000'000 + i * 1000;
        sp.durationUs = 400;
        store->record(sp);
    }
    const std::string w = m_dir->filePath("final.safetensors").toStdString();
    QVERIFY(ts::writeSafetensors(w, {{"dense/kernel", ts::Tensor::fromVector(ts::Shape({2}), {1.f, 2.f})}}).ok());
    QVERIFY(store->addCheckpoint(id, w, 11, "final").ok());
    QVERIFY(store->setRunStatus(id, st::RunState::Completed).ok());

    std::ostringstream csv;
    QVERIFY(st::exportStepMetricsCsv(*store, id, csv).ok());
    QStringList lines = QString::fromStdString(csv.str()).split('\n', Qt::SkipEmptyParts);
    QCOMPARE(lines.size(), 12);
    QCOMPARE(lines[0], QString("wall_time,step,epoch,loss,accuracy,\"grad,norm\",learning_rate,samples_per_sec"));
    QVERIFY(lines[1].startsWith("1700000000.001000,1,1,1,0.9,,0.001,1000"));
    QVERIFY(lines[11].contains(",11,0,0.05,"));
    QVERIFY(lines[11].contains(",3.5,"));
    std::ostringstream ecsv;
    QVERIFY(st::exportEpochMetricsCsv(*store, id, ecsv).ok());
    QVERIFY(QString::fromStdString(ecsv.str()).startsWith("epoch,step,wall_time,loss,samples_per_sec,seconds,val_accuracy\n1,10,"));

    const std::string tracePath = m_dir->filePath("run.trace.json").toStdString();
    auto n = st::exportChromeTrace(*store, id, tracePath);
    QVERIFY2(n.ok(), n.ok() ? "" : n.error().toString().c_str());
    QCOMPARE(*n, std::size_t(3));
    auto trace = tl::readChromeTrace(tracePath);
    QVERIFY2(trace.ok(), trace.ok() ? "" : trace.error().toString().c_str());
    QCOMPARE(trace->spans.size(), std::size_t(3));
    QCOMPARE(trace->spans[1].name, std::string("backward/dense"));
    QCOMPARE(trace->spans[1].durationUs, int64_t(400));

    const std::string out = m_dir->filePath("exported.safetensors").toStdString();
    auto cp = st::exportFinalWeights(*store, id, out);
    QVERIFY(cp.ok());
    QCOMPARE(cp->step, int64_t(11));
    QCOMPARE(readAll(out), readAll(w));
    auto back = ts::readSafetensors(out);
    QVERIFY(back.ok());
    QCOMPARE(back->tensors.at("dense/kernel").data<float>()[1], 2.f);
}

void TestStore::busSink()
{
    auto store = st::RunStore::open(dbPath());
    QVERIFY(store.ok());
    const std::string id = store->createRun({})->id;
    tl::EventBus bus;
    st::StoreSink sink(bus, *store);
    tl::RunStateEvent running;
    running.stamp.runId = id;
    running.state = st::RunState::Running;
    bus.publish(running);
    for (int64_t s = 1; s <= 2000; ++s) bus.publish(tl::Event(stepEvent(id, s, 1.0)));
    tl::RunStateEvent done;
    done.stamp.runId = id;
    done.state = st::RunState::Completed;
    bus.publish(done);
    // Events of a run the store has not seen (a remote worker's) get a stub run.
    bus.publish(tl::Event(stepEvent("remote-run-1", 1, 1.0)));
    QVERIFY(sink.stop().ok());
    QCOMPARE(sink.busDropped(), uint64_t(0));
    QCOMPARE(sink.forwarded(), uint64_t(2003));
    QCOMPARE(store->series(id, "loss")->samples, int64_t(2000));
    QCOMPARE(store->run(id)->status, st::RunState::Completed);
    auto stub = store->run("remote-run-1");
    QVERIFY(stub.ok());
    QCOMPARE(stub->name, std::string("remote-run-1"));
}

void TestStore::busSinkAbsorbsHeldUpWriter()
{
    // Another process holds the database's write lock for a while: the writer cannot commit,
    // so it stops draining the bus; the sink's standby thread moves the backlog into the
    // store's write queue before the small bus queue overflows.
    auto store = st::RunStore::open(dbPath());
    QVERIFY(store.ok());
    const std::string id = store->createRun({})->id;
    tl::EventBus bus;
    st::StoreSinkOptions so;
    so.capacity = 1024;
    st::StoreSink sink(bus, *store, so);
    Raw other(dbPath());
    QVERIFY(other.exec("BEGIN IMMEDIATE"));
    int64_t step = 0;
    for (int chunk = 0; chunk < 25; ++chunk) {
        for (int i = 0; i < 200; ++i) bus.publish(tl::Event(stepEvent(id, ++step, 1.0)));
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    QVERIFY(other.exec("COMMIT"));
    QVERIFY(sink.stop().ok());
    QCOMPARE(sink.busDropped(), uint64_t(0));
    QCOMPARE(sink.forwarded(), uint64_t(5000));
    QCOMPARE(store->series(id, "loss")->samples, int64_t(5000));
}

void TestStore::configHashIsCanonical()
{
    const nlohmann::json a = nlohmann::json::parse(R"({"epochs": 2, "optimizer": {"type": "adam", "learning_rate": 0.001}})");
    const nlohmann::json b = nlohmann::json::parse(R"({"optimizer": {"learning_rate": 0.001, "type": "adam"}, "epochs": 2})");
    const nlohmann::json c = nlohmann::json::parse(R"({"optimizer": {"learning_rate": 0.01, "type": "adam"}, "epochs": 2})");
    QCOMPARE(st::configHash(a), st::configHash(b));
    QVERIFY(st::configHash(a) != st::configHash(c));
    QVERIFY(QString::fromStdString(st::configHash(a)).contains(QRegularExpression("^fnv1a64:[0-9a-f]{16}$")));
    QCOMPARE(st::fnv1a64(""), 0xcbf29ce484222325ull);
    QCOMPARE(st::fnv1a64("a"), 0xaf63dc4c8601ec8cull);  // the published FNV-1a test vector
}

void TestStore::benchmark()
{
    const bool full = qEnvironmentVariableIsSet("TS_STORE_BENCH");
    const int64_t steps = full ? 1'000'000 : 20'000;
    auto store = st::RunStore::open(dbPath());
    QVERIFY(store.ok());
    const std::string id = store->createRun({})->id;
    QElapsedTimer t;
    t.start();
    // Published as a trainer does: one event per step, from a loop.
    for (int64_t s = 1; s <= steps; ++s) store->record(stepEvent(id, s, 1.0 + std::sin(static_cast<double>(s) * 1e-3)));
    const double recordSec = static_cast<double>(t.nsecsElapsed()) / 1e9;
    QVERIFY(store->flush().ok());
    const double writeSec = static_cast<double>(t.nsecsElapsed()) / 1e9;
    QCOMPARE(store->droppedEvents(), uint64_t(0));
    st::SeriesQuery q;
    q.buckets = 2000;
    t.restart();
    auto s = store->series(id, "loss", q);
    const double loadSec = static_cast<double>(t.nsecsElapsed()) / 1e9;
    QVERIFY(s.ok());
    QCOMPARE(s->samples, steps);
    q.step0 = steps / 2;
    q.step1 = steps / 2 + steps / 10;
    t.restart();
    auto z = store->series(id, "loss", q);
    const double zoomSec = static_cast<double>(t.nsecsElapsed()) / 1e9;
    QVERIFY(z.ok());
    const auto dbBytes = std::filesystem::file_size(dbPath()) + std::filesystem::file_size(dbPath() + "-wal");
    qInfo("store bench: %lld step events (%lld metric rows) recorded in %.3f s (caller), committed in %.3f s: %.0f events/s, "
          "%.0f rows/s; %.1f MB on disk",
          static_cast<long long>(steps), static_cast<long long>(steps * 4), recordSec, writeSec,
          static_cast<double>(steps) / writeSec, static_cast<double>(steps * 4) / writeSec, static_cast<double>(dbBytes) / 1e6);
    qInfo("store bench: load %lld-sample series into 2000 M4 buckets: %.1f ms (%zu points); 10%% zoom: %.1f ms",
          static_cast<long long>(steps), loadSec * 1e3, s->points.size(), zoomSec * 1e3);
    if (!full) QVERIFY(loadSec < 5.0);  // loose: a shared CI machine
}

int main(int argc, char** argv)
{
    if (argc >= 3 && std::strcmp(argv[1], "--crash-child") == 0) return crashChild(argv[2]);
    TestStore tc;
    QTEST_SET_MAIN_SOURCE_PATH
    return QTest::qExec(&tc, argc, argv);
}

#include "tst_store.moc"
