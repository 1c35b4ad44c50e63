// trainstudio-cli runs list|show|compare|delete|export on a small database built through the
// store API, the read-only fallback for a newer schema, a damaged database, a missing
// checkpoint, and `train` recording its run (default database, --db, --no-record).

#include <QtTest>
#include <QRegularExpression>

#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QProcess>
#include <QTemporaryDir>

#include <sqlite3.h>

#include <filesystem>
#include <fstream>

#include "data/dataset.h"
#include "io/safetensors.h"
#include "store/run_store.h"
#include "store/schema.h"
#include "telemetry/chrome_trace.h"

namespace st = ts::store;
namespace tl = ts::telemetry;

class TestRunsCli : public QObject {
    Q_OBJECT
private slots:
    void init();
    void listAndFilter();
    void showRun();
    void exportRun();
    void exportMissingCheckpoint();
    void compareRuns();
    void deleteRun();
    void renameAndTag();
    void newerSchemaReadOnly();
    void badDatabases();
    void trainRecordsRuns();
    void damagedDatabaseRefusesTraining();

private:
    struct Run {
        int code;
        QString out, err;
    };
    Run cli(const QStringList& args, const QStringList& env = {}, int timeoutMs = 120000);
    QJsonDocument json(const Run& r);
    QString db() const { return m_dir->filePath("runs.db"); }
    std::unique_ptr<QTemporaryDir> m_dir;
    std::string m_done, m_failed;
    std::string m_weights;
};

TestRunsCli::Run TestRunsCli::cli(const QStringList& args, const QStringList& env, int timeoutMs)
{
    QProcess p;
    QProcessEnvironment e = QProcessEnvironment::systemEnvironment();
    for (const QString& kv : env) e.insert(kv.section('=', 0, 0), kv.section('=', 1));
    p.setProcessEnvironment(e);
    p.start(QStringLiteral(TS_CLI_PATH), args);
    if (!p.waitForFinished(timeoutMs)) {
        p.kill();
        p.waitForFinished();
        return {-1, QString::fromUtf8(p.readAllStandardOutput()), QStringLiteral("timed out")};
    }
    return {p.exitStatus() == QProcess::NormalExit ? p.exitCode() : -2, QString::fromUtf8(p.readAllStandardOutput()),
            QString::fromUtf8(p.readAllStandardError())};
}

QJsonDocument TestRunsCli::json(const Run& r)
{
    QJsonParseError err;
    QJsonDocument d = QJsonDocument::fromJson(r.out.toUtf8(), &err);
    if (err.error != QJsonParseError::NoError) qWarning("not JSON: %s\n%s", qPrintable(r.out), qPrintable(r.err));
    return d;
}

// Two runs: a completed one with metrics, epochs, spans and final weights, and a failed one.
void TestRunsCli::init()
{
    m_dir = std::make_unique<QTemporaryDir>();
    QVERIFY(m_dir->isValid());
    auto store = st::RunStore::open(db().toStdString());
    QVERIFY(store.ok());
    st::NewRun spec;
    spec.name = "baseline mlp";
    spec.model = {{"name", "seed_mlp"}};
    spec.config = {{"epochs", 2}, {"batch_size", 256}};
    spec.strategy = "one-device";
    spec.tags = {"baseline"};
    auto done = store->createRun(spec);
    QVERIFY(done.ok());
    m_done = done->id;
    QVERIFY(store->setRunStatus(m_done, st::RunState::Running).ok());
    for (int64_t s = 1; s <= 40; ++s) {
        tl::StepMetricsEvent e;
        e.stamp.runId = m_done;
        e.stamp.step = s;
        e.epoch = s <= 20 ? 1 : 2;
        e.loss = 2.0 / static_cast<double>(s);
        e.metrics["accuracy"] = 0.5 + static_cast<double>(s) / 100;
        e.learningRate = 1e-3;
        e.samplesPerSec = 5000;
        store->record(e);
    }
    for (int64_t ep = 1; ep <= 2; ++ep) {
        tl::EpochMetricsEvent e;
        e.stamp.runId = m_done;
        e.stamp.step = ep * 20;
        e.epoch = ep;
        e.metrics = {{"loss", 1.0 / static_cast<double>(ep)}, {"val_accuracy", 0.7 + 0.05 * static_cast<double>(ep)}};
        e.seconds = 2;
        store->record(e);
    }
    tl::SpanEvent sp;
    sp.stamp.runId = m_done;
    sp.stamp.lane = {"local", "cpu:0", "main"};
    sp.name = "forward/dense";
    sp.category = "forward";
    sp.startUs = 1'700'000'000'000'000;
    sp.durationUs = 250;
    store->record(sp);
    tl::FindingEvent f;
    f.stamp.runId = m_done;
    f.kind = "input-bound";
    f.severity = "moderate";
    f.message = "8% of the step waits for input";
    f.recommendation = "add prefetch";
    store->record(f);
    // A checkpoint the store keeps (in its own folder), as training without --save-weights does.
    std::filesystem::create_directories(store->runFilesDir(m_done));
    m_weights = (std::filesystem::path(store->runFilesDir(m_done)) / "final.safetensors").string();
    QVERIFY(ts::writeSafetensors(m_weights, {{"dense/kernel", ts::Tensor::fromVector(ts::Shape({3}), {1.f, 2.f, 3.f})}}).ok());
    QVERIFY(store->addCheckpoint(m_done, m_weights, 40, "final").ok());
    QVERIFY(store->setRunStatus(m_done, st::RunState::Completed).ok());

    spec.name = "cnn diverged";
    spec.model = {{"name", "small_cnn"}};
    spec.strategy = "mirrored";
    spec.tags = {};
    auto failed = store->createRun(spec);
    QVERIFY(failed.ok());
    m_failed = failed->id;
    for (int64_t s = 1; s <= 5; ++s) {
        tl::StepMetricsEvent e;
        e.stamp.runId = m_failed;
        e.stamp.step = s;
        e.loss = static_cast<double>(s);
        store->record(e);
    }
    QVERIFY(store->setRunStatus(m_failed, st::RunState::Failed, "loss became NaN at step 6").ok());
    QVERIFY(store->close().ok());
}

void TestRunsCli::listAndFilter()
{
    Run r = cli({"runs", "list", "--db", db(), "--json"});
    QCOMPARE(r.code, 0);
    QJsonArray a = json(r).array();
    QCOMPARE(a.size(), 2);
    QCOMPARE(a[0].toObject()["name"].toString(), QString("cnn diverged"));  // newest first
    QCOMPARE(a[0].toObject()["status"].toString(), QString("failed"));
    QCOMPARE(a[1].toObject()["id"].toString(), QString::fromStdString(m_done));
    QCOMPARE(a[1].toObject()["last_step"].toInt(), 40);
    QCOMPARE(a[1].toObject()["tags"].toArray()[0].toString(), QString("baseline"));

    r = cli({"runs", "list", "--db", db(), "--json", "--status", "completed"});
    QCOMPARE(json(r).array().size(), 1);
    r = cli({"runs", "list", "--db", db(), "--json", "--model", "small_cnn"});
    QCOMPARE(json(r).array().size(), 1);
    r = cli({"runs", "list", "--db", db(), "--json", "--tag", "baseline", "--strategy", "mirrored"});
    QCOMPARE(json(r).array().size(), 0);

    r = cli({"runs", "list", "--db", db()});
    QCOMPARE(r.code, 0);
    QVERIFY(r.out.contains("baseline mlp"));
    QVERIFY(r.out.contains("completed"));
    QVERIFY(r.out.contains(QString::fromStdString(m_failed.substr(0, 8))));

    r = cli({"runs", "list", "--db", db(), "--status", "sleeping"});
    QCOMPARE(r.code, 2);
    QVERIFY(r.err.contains("unknown status 'sleeping'"));

    // Names in other scripts: cut by character (never inside a UTF-8 sequence) and padded by
    // terminal columns (a CJK character takes two), so the STATUS column stays aligned.
    {
        auto store = st::RunStore::open(db().toStdString());
        QVERIFY(store.ok());
        st::NewRun wide;
        wide.name = "学習実行";  // 4 characters, 8 columns
        wide.model = {{"name", "モデルモデルモデルモデル"}};  // 12 characters, 24 columns: cut to 14
        wide.strategy = "one-device";
        QVERIFY(store->createRun(wide).ok());
        wide.name = "é" + std::string(40, 'x');  // longer than 30 columns, a 2-byte first character
        wide.model = {{"name", "m"}};
        QVERIFY(store->createRun(wide).ok());
        QVERIFY(store->close().ok());
    }
    r = cli({"runs", "list", "--db", db()});
    QCOMPARE(r.code, 0);
    const QStringList lines = r.out.split('\n', Qt::SkipEmptyParts);
    const int statusAt = lines[0].indexOf("STATUS");
    bool sawWide = false, sawLong = false;
    for (const QString& line : lines.mid(1)) {
        // Display columns before the status: a CJK character counts two.
        int cols = 0;
        const QString head = line.left(line.indexOf(QRegularExpression("(completed|failed|created|running)")));
        for (const QChar c : head) cols += c.unicode() >= 0x3000 && c.unicode() <= 0x9FFF ? 2 : 1;
        QVERIFY2(cols == statusAt, qPrintable(line));
        if (line.contains("学習実行")) {
            sawWide = true;
            QVERIFY2(line.contains("モデルモデ...   one-device"), qPrintable(line));  // 10 columns + "..." + 1 of padding, in 14
        }
        if (line.contains("éxxx")) {
            sawLong = true;
            QVERIFY2(line.contains("é" + QString(26, 'x') + "..."), qPrintable(line));
        }
    }
    QVERIFY(sawWide && sawLong);
}

void TestRunsCli::showRun()
{
    Run r = cli({"runs", "show", QString::fromStdString(m_done.substr(0, 8)), "--db", db(), "--json"});
    QCOMPARE(r.code, 0);
    QJsonObject o = json(r).object();
    QCOMPARE(o["id"].toString(), QString::fromStdString(m_done));
    QCOMPARE(o["config"].toObject()["batch_size"].toInt(), 256);
    QCOMPARE(o["epochs"].toArray().size(), 2);
    QCOMPARE(o["metrics"].toObject()["loss"].toObject()["samples"].toInt(), 40);
    QCOMPARE(o["metrics"].toObject()["loss"].toObject()["max"].toDouble(), 2.0);
    QCOMPARE(o["checkpoints"].toArray()[0].toObject()["state"].toString(), QString("ok"));
    QCOMPARE(o["findings"].toArray()[0].toObject()["recommendation"].toString(), QString("add prefetch"));

    r = cli({"runs", "show", "cnn diverged", "--db", db()});  // by name, text output
    QCOMPARE(r.code, 0);
    QVERIFY(r.out.contains("failed: loss became NaN at step 6"));
    QVERIFY(r.out.contains("small_cnn"));

    r = cli({"runs", "show", "nonexistent", "--db", db()});
    QCOMPARE(r.code, 2);  // a run that is not there is bad input, like a bad option
    QVERIFY(r.err.contains("no run 'nonexistent'"));
    QVERIFY(r.err.contains("hint:"));
}

void TestRunsCli::exportRun()
{
    const QString csv = m_dir->filePath("m.csv"), ecsv = m_dir->filePath("e.csv");
    const QString trace = m_dir->filePath("t.json"), w = m_dir->filePath("w.safetensors");
    Run r = cli({"runs", "export", "baseline mlp", "--db", db(), "--csv", csv, "--epochs-csv", ecsv, "--trace", trace,
                 "--weights", w, "--json"});
    QCOMPARE(r.code, 0);
    QCOMPARE(json(r).object()["written"].toObject().size(), 4);
    QFile f(csv);
    QVERIFY(f.open(QIODevice::ReadOnly));
    const QStringList lines = QString::fromUtf8(f.readAll()).split('\n', Qt::SkipEmptyParts);
    QCOMPARE(lines.size(), 41);
    QCOMPARE(lines[0], QString("wall_time,step,epoch,loss,accuracy,learning_rate,samples_per_sec"));
    QVERIFY(lines[40].contains(",40,2,0.05,0.9,0.001,5000"));
    QFile e(ecsv);
    QVERIFY(e.open(QIODevice::ReadOnly));
    QCOMPARE(QString::fromUtf8(e.readAll()).split('\n', Qt::SkipEmptyParts).size(), 3);
    auto t = tl::readChromeTrace(trace.toStdString());
    QVERIFY2(t.ok(), t.ok() ? "" : t.error().toString().c_str());
    QCOMPARE(t->spans.size(), std::size_t(1));
    QCOMPARE(t->spans[0].name, std::string("forward/dense"));
    auto weights = ts::readSafetensors(w.toStdString());
    QVERIFY(weights.ok());
    QCOMPARE(weights->tensors.at("dense/kernel").data<float>()[2], 3.f);

    r = cli({"runs", "export", "baseline mlp", "--db", db(), "--csv", "-"});
    QCOMPARE(r.code, 0);
    QVERIFY(r.out.startsWith("wall_time,step,epoch,loss"));

    r = cli({"runs", "export", "baseline mlp", "--db", db()});
    QCOMPARE(r.code, 2);
    QVERIFY(r.err.contains("nothing to export"));

    // Two exports into one file: refused before either is written (the later replaced the earlier).
    const QString both = m_dir->filePath("both.out");
    r = cli({"runs", "export", "baseline mlp", "--db", db(), "--trace", both, "--csv", both});
    QCOMPARE(r.code, 2);
    QVERIFY2(r.err.contains("--csv and --trace name the same file"), qPrintable(r.err));
    QVERIFY(!QFile::exists(both));
}

void TestRunsCli::exportMissingCheckpoint()
{
    std::filesystem::remove(m_weights);
    const QString csv = m_dir->filePath("m.csv"), w = m_dir->filePath("w.safetensors");
    Run r = cli({"runs", "export", QString::fromStdString(m_done), "--db", db(), "--weights", w, "--csv", csv});
    QCOMPARE(r.code, 1);
    QVERIFY2(r.err.contains(QString::fromStdString(m_weights)), qPrintable(r.err));
    QVERIFY(r.err.contains("is missing"));
    QVERIFY(QFile::exists(csv));  // the rest of the history still exports
    QVERIFY(!QFile::exists(w));
    r = cli({"runs", "show", QString::fromStdString(m_done), "--db", db(), "--json"});
    QCOMPARE(r.code, 0);
    QCOMPARE(json(r).object()["checkpoints"].toArray()[0].toObject()["state"].toString(), QString("missing"));
}

void TestRunsCli::compareRuns()
{
    Run r = cli({"runs", "compare", QString::fromStdString(m_done), QString::fromStdString(m_failed), "--db", db(), "--json",
                 "--buckets", "4"});
    QCOMPARE(r.code, 0);
    QJsonArray a = json(r).array();
    QCOMPARE(a.size(), 2);
    QCOMPARE(a[0].toObject()["samples"].toInt(), 40);
    QCOMPARE(a[1].toObject()["samples"].toInt(), 5);
    QCOMPARE(a[1].toObject()["step1"].toInt(), 40);  // one shared step axis
    QCOMPARE(a[1].toObject()["max"].toDouble(), 5.0);
    QVERIFY(a[0].toObject()["points"].toArray().size() <= 16);
    r = cli({"runs", "compare", "baseline mlp", "cnn diverged", "--db", db(), "--metric", "loss"});
    QCOMPARE(r.code, 0);
    QVERIFY(r.out.contains("cnn diverged"));
    r = cli({"runs", "compare", "baseline mlp", "--db", db()});
    QCOMPARE(r.code, 2);
}

void TestRunsCli::deleteRun()
{
    const std::string own = m_dir->filePath("own.trace.json").toStdString();
    {
        auto store = st::RunStore::open(db().toStdString());
        QVERIFY(store.ok());
        std::ofstream(own) << "{}";
        QVERIFY(store->addFile(m_done, "trace", own).ok());
    }
    Run r = cli({"runs", "delete", "baseline mlp", "nonexistent", "--db", db()});
    QCOMPARE(r.code, 2);  // nothing deleted when one name is wrong
    QVERIFY(std::filesystem::exists(m_weights));
    r = cli({"runs", "delete", "baseline mlp", "--db", db(), "--json"});
    QCOMPARE(r.code, 0);
    // The store's checkpoint goes; a trace the user wrote elsewhere (--trace) is theirs and stays.
    QCOMPARE(json(r).array()[0].toObject()["removed_files"].toArray().size(), 1);
    QCOMPARE(json(r).array()[0].toObject()["kept_files"].toArray().size(), 1);
    QVERIFY(!std::filesystem::exists(m_weights));
    QVERIFY(std::filesystem::exists(own));
    r = cli({"runs", "list", "--db", db(), "--json"});
    QCOMPARE(json(r).array().size(), 1);
}

void TestRunsCli::renameAndTag()
{
    Run r = cli({"runs", "rename", "cnn diverged", "cnn lr 0.1", "--db", db()});
    QCOMPARE(r.code, 0);
    r = cli({"runs", "tag", "cnn lr 0.1", "--add", "bad", "--add", "lr-sweep", "--db", db(), "--json"});
    QCOMPARE(r.code, 0);
    QCOMPARE(json(r).object()["tags"].toArray().size(), 2);
    r = cli({"runs", "list", "--db", db(), "--json", "--tag", "lr-sweep"});
    QCOMPARE(json(r).array()[0].toObject()["name"].toString(), QString("cnn lr 0.1"));

    // Another run's name is refused (both would become ambiguous to `runs show NAME`); a run
    // keeps its own name; refusals are bad input (exit 2) with a hint.
    r = cli({"runs", "rename", "cnn lr 0.1", "baseline mlp", "--db", db()});
    QCOMPARE(r.code, 2);
    QVERIFY2(r.err.contains("is already named 'baseline mlp'") && r.err.contains("hint: "), qPrintable(r.err));
    r = cli({"runs", "show", "baseline mlp", "--db", db()});
    QCOMPARE(r.code, 0);
    r = cli({"runs", "rename", "cnn lr 0.1", "cnn lr 0.1", "--db", db()});
    QCOMPARE(r.code, 0);
    r = cli({"runs", "compare", "cnn lr 0.1", "--db", db()});
    QCOMPARE(r.code, 2);
    QVERIFY2(r.err.contains("hint: usage: trainstudio-cli runs compare RUN RUN"), qPrintable(r.err));
    r = cli({"runs", "tag", "no such run", "--add", "x", "--db", db()});
    QCOMPARE(r.code, 2);
    // Tags are shown joined by commas: one holding a comma is refused. Ids match in any case.
    r = cli({"runs", "tag", "cnn lr 0.1", "--add", "a,b", "--db", db()});
    QVERIFY2(r.code == 2 && r.err.contains("cannot hold a comma"), qPrintable(r.err));
    r = cli({"runs", "show", QString::fromStdString(m_done).toUpper().left(8), "--db", db()});
    QVERIFY2(r.code == 0, qPrintable(r.err));
    r = cli({"runs", "rename", "cnn lr 0.1", QString::fromStdString(m_done).toUpper().left(8), "--db", db()});
    QVERIFY2(r.code == 2 && r.err.contains("is the start of run"), qPrintable(r.err));
    r = cli({"runs", "list", "--strategy", "Mirrored", "--db", db()});
    QVERIFY2(r.code == 2 && r.err.contains("unknown strategy 'Mirrored'"), qPrintable(r.err));
    // Standard output holds one export: two CSVs, or a CSV and --json's summary, are refused.
    for (const QStringList& mixed : {QStringList{"--csv", "-", "--epochs-csv", "-"}, QStringList{"--csv", "-", "--json"},
                                     QStringList{"--weights", "-"}}) {
        r = cli(QStringList{"runs", "export", "cnn lr 0.1", "--db", db()} + mixed);
        QVERIFY2(r.code == 2 && r.out.isEmpty() && r.err.contains("hint: usage:"), qPrintable(mixed.join(' ') + ": " + r.err));
    }
}

void TestRunsCli::newerSchemaReadOnly()
{
    {
        sqlite3* raw = nullptr;
        QCOMPARE(sqlite3_open(db().toUtf8().constData(), &raw), SQLITE_OK);
        const std::string sql = "PRAGMA user_version = " + std::to_string(st::schemaVersion() + 1);
        QCOMPARE(sqlite3_exec(raw, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK);
        sqlite3_close(raw);
    }
    Run r = cli({"runs", "list", "--db", db(), "--json"});
    QCOMPARE(r.code, 0);
    QCOMPARE(json(r).array().size(), 2);
    QVERIFY(r.err.contains("newer TrainStudio"));
    QVERIFY(r.err.contains("read-only"));
    r = cli({"runs", "delete", "baseline mlp", "--db", db()});
    QCOMPARE(r.code, 1);
    QVERIFY(r.err.contains("newer TrainStudio"));
    r = cli({"runs", "list", "--db", db(), "--json"});
    QCOMPARE(json(r).array().size(), 2);  // no data loss
}

void TestRunsCli::badDatabases()
{
    const QString garbage = m_dir->filePath("garbage.db");
    {
        QFile f(garbage);
        QVERIFY(f.open(QIODevice::WriteOnly));
        f.write(QByteArray(8192, 'x'));
    }
    Run r = cli({"runs", "list", "--db", garbage});
    QCOMPARE(r.code, 1);
    QVERIFY2(r.err.contains(garbage), qPrintable(r.err));
    QVERIFY(r.err.contains("hint:"));
    r = cli({"runs", "list", "--db", m_dir->filePath("missing.db")});
    QCOMPARE(r.code, 2);
    QVERIFY(r.err.contains("no run database at"));
    QVERIFY(!QFile::exists(m_dir->filePath("missing.db")));  // listing creates nothing
}

void TestRunsCli::trainRecordsRuns()
{
    if (!QFile::exists(QString::fromStdString(ts::defaultFashionMnistDir() + "/train-images-idx3-ubyte.gz")))
        QSKIP("Fashion-MNIST is not installed (dataset-fashion-mnist)");
    const QStringList small = {"--limit", "256", "--validation-limit", "128", "--epochs", "1", "--batch-size", "64",
                               "--threads", "1", "--quiet"};
    // The default database: $XDG_DATA_HOME/trainstudio/runs.db.
    const QString xdg = m_dir->filePath("xdg");
    Run r = cli(QStringList{"train", "--run-name", "recorded", "--tag", "smoke"} + small, {"XDG_DATA_HOME=" + xdg});
    QVERIFY2(r.code == 0, qPrintable(r.err));
    const QString defaultDb = xdg + "/trainstudio/runs.db";
    QVERIFY(QFile::exists(defaultDb));
    r = cli({"runs", "show", "recorded", "--json"}, {"XDG_DATA_HOME=" + xdg});
    QCOMPARE(r.code, 0);
    QJsonObject o = json(r).object();
    QCOMPARE(o["status"].toString(), QString("completed"));
    QCOMPARE(o["model"].toString(), QString("seed_mlp"));
    QCOMPARE(o["last_step"].toInt(), 4);
    QCOMPARE(o["tags"].toArray()[0].toString(), QString("smoke"));
    QVERIFY(o["config_hash"].toString().startsWith("fnv1a64:"));
    QCOMPARE(o["config"].toObject()["batch_size"].toInt(), 64);
    QCOMPARE(o["epochs"].toArray().size(), 1);
    QVERIFY(o["epochs"].toArray()[0].toObject()["metrics"].toObject().contains("val_accuracy"));
    QCOMPARE(o["metrics"].toObject()["loss"].toObject()["samples"].toInt(), 4);
    const QJsonObject cp = o["checkpoints"].toArray()[0].toObject();
    QCOMPARE(cp["kind"].toString(), QString("final"));
    QCOMPARE(cp["state"].toString(), QString("ok"));
    QVERIFY(cp["path"].toString().startsWith(xdg + "/trainstudio/runs-files/"));
    const QString w = m_dir->filePath("exported.safetensors");
    r = cli({"runs", "export", "recorded", "--weights", w}, {"XDG_DATA_HOME=" + xdg});
    QCOMPARE(r.code, 0);
    QVERIFY(ts::readSafetensors(w.toStdString()).ok());

    // --db, --json gives the run id; --save-weights becomes the final checkpoint; the --trace
    // file belongs to the run and its spans are in the database too.
    const QString saved = m_dir->filePath("saved.safetensors");
    const QString trace = m_dir->filePath("train.trace.json");
    r = cli(QStringList{"train", "--db", db(), "--json", "--save-weights", saved, "--trace", trace} + small);
    QVERIFY2(r.code == 0, qPrintable(r.err));
    const QStringList outLines = r.out.split('\n', Qt::SkipEmptyParts);
    const QString id = QJsonDocument::fromJson(outLines.last().toUtf8()).object()["run_id"].toString();
    QCOMPARE(id.size(), 36);
    r = cli({"runs", "show", id, "--db", db(), "--json"});
    o = json(r).object();
    // The store keeps its own copies: the user's paths are theirs to reuse.
    const QString kept = o["checkpoints"].toArray()[0].toObject()["path"].toString();
    const QString keptTrace = o["files"].toArray()[0].toObject()["path"].toString();
    QCOMPARE(kept, m_dir->filePath("runs-files/" + id + "/final.safetensors"));
    QCOMPARE(keptTrace, m_dir->filePath("runs-files/" + id + "/trace.json"));
    QCOMPARE(std::filesystem::file_size(kept.toStdString()), std::filesystem::file_size(saved.toStdString()));
    QCOMPARE(o["records"].toObject()["step_breakdowns"].toInt(), 4);
    QVERIFY(o["records"].toObject()["spans"].toInt() >= 4);
    const QString reexported = m_dir->filePath("again.trace.json");
    r = cli({"runs", "export", id, "--db", db(), "--trace", reexported});
    QCOMPARE(r.code, 0);
    auto t = tl::readChromeTrace(reexported.toStdString());
    QVERIFY(t.ok());
    // Tracer counters are stored as spans too; the export turns them into counter events.
    QVERIFY(!t->spans.empty());
    QVERIFY(static_cast<int>(t->spans.size()) <= o["records"].toObject()["spans"].toInt());
    // --no-record leaves the database alone; a failed run is recorded as failed.
    r = cli(QStringList{"train", "--db", db(), "--no-record"} + small);
    QCOMPARE(r.code, 0);
    r = cli(QStringList{"train", "--db", db(), "--data", m_dir->filePath("no-such-folder")} + small);
    QVERIFY(r.code != 0);
    r = cli({"runs", "list", "--db", db(), "--json"});
    QJsonArray a = json(r).array();
    QCOMPARE(a.size(), 4);  // the two from init(), the --db run, the failed one
    QCOMPARE(a[0].toObject()["status"].toString(), QString("failed"));
    QVERIFY(a[0].toObject()["error"].toString().contains("no-such-folder"));
    // Overwriting the user's file in place (cp, safetensors' save_file) leaves the record whole.
    {
        QFile inPlace(saved);
        QVERIFY(inPlace.open(QIODevice::ReadWrite));
        QVERIFY(inPlace.write("garbage!") == 8);
    }
    r = cli({"runs", "show", id, "--db", db(), "--json"});
    QCOMPARE(json(r).object()["checkpoints"].toArray()[0].toObject()["state"].toString(), QString("ok"));
    // Another run saving to the same paths leaves this run's record whole (it read "changed").
    r = cli(QStringList{"train", "--db", db(), "--seed", "5", "--save-weights", saved, "--trace", trace} + small);
    QVERIFY2(r.code == 0, qPrintable(r.err));
    r = cli({"runs", "show", id, "--db", db(), "--json"});
    QCOMPARE(json(r).object()["checkpoints"].toArray()[0].toObject()["state"].toString(), QString("ok"));
    const QString back = m_dir->filePath("back.safetensors");
    r = cli({"runs", "export", id, "--db", db(), "--weights", back});
    QVERIFY2(r.code == 0, qPrintable(r.err));
    // A run name the store refuses (the start of another run's id) says so, not "repair it".
    r = cli(QStringList{"train", "--db", db(), "--run-name", id.left(8)} + small);
    QVERIFY2(r.code == 2 && r.err.contains("is the start of run") && r.err.contains("hint: choose a name that is not a run id") &&
                 !r.err.contains("repair"),
             qPrintable(r.err));
    // Deleting the traced run leaves the files the user asked for (--save-weights, --trace).
    r = cli({"runs", "delete", id, "--db", db()});
    QCOMPARE(r.code, 0);
    QVERIFY(QFile::exists(saved));
    QVERIFY(QFile::exists(trace));
    QVERIFY(!QFile::exists(kept));
}

// A database with a damaged page opens, but the new run cannot be inserted: train refuses
// before training (it used to train, warn, and print "Recorded as run  in ..." with no id), and
// the runs already stored are still there.
void TestRunsCli::damagedDatabaseRefusesTraining()
{
    if (!QFile::exists(QString::fromStdString(ts::defaultFashionMnistDir() + "/train-images-idx3-ubyte.gz")))
        QSKIP("Fashion-MNIST is not installed (dataset-fashion-mnist)");
    int64_t page = 0, pageSize = 0;
    {
        sqlite3* raw = nullptr;
        QCOMPARE(sqlite3_open(db().toUtf8().constData(), &raw), SQLITE_OK);
        sqlite3_stmt* st = nullptr;
        QCOMPARE(sqlite3_prepare_v2(raw, "SELECT rootpage, (SELECT page_size FROM pragma_page_size) FROM sqlite_master WHERE name = 'runs_by_created'",
                                    -1, &st, nullptr),
                 SQLITE_OK);
        QCOMPARE(sqlite3_step(st), SQLITE_ROW);
        page = sqlite3_column_int64(st, 0);
        pageSize = sqlite3_column_int64(st, 1);
        sqlite3_finalize(st);
        sqlite3_close(raw);
    }
    QVERIFY(page > 1 && pageSize >= 512);
    QVERIFY(!QFile::exists(db() + "-wal") || QFileInfo(db() + "-wal").size() == 0);
    {
        QFile f(db());
        QVERIFY(f.open(QIODevice::ReadWrite));
        QVERIFY(f.seek((page - 1) * pageSize));
        f.write(QByteArray(static_cast<int>(pageSize), '\xff'));  // the index's root page: not a b-tree page
    }
    const Run r = cli({"train", "--db", db(), "--limit", "256", "--validation-limit", "128", "--epochs", "1", "--threads", "1"});
    QCOMPARE(r.code, 2);
    QVERIFY2(r.err.contains("cannot record the run: run database '" + db() + "'") && r.err.contains("--no-record") && r.err.contains(".recover"),
             qPrintable(r.err));
    QVERIFY2(!r.out.contains("Recorded as run") && !r.out.contains("Trained"), qPrintable(r.out));
    sqlite3* raw = nullptr;
    QCOMPARE(sqlite3_open(db().toUtf8().constData(), &raw), SQLITE_OK);
    sqlite3_stmt* st = nullptr;
    QCOMPARE(sqlite3_prepare_v2(raw, "SELECT name FROM runs NOT INDEXED ORDER BY name", -1, &st, nullptr), SQLITE_OK);
    QStringList names;
    while (sqlite3_step(st) == SQLITE_ROW) names << QString::fromUtf8(reinterpret_cast<const char*>(sqlite3_column_text(st, 0)));
    sqlite3_finalize(st);
    sqlite3_close(raw);
    QCOMPARE(names, (QStringList{"baseline mlp", "cnn diverged"}));
}

QTEST_APPLESS_MAIN(TestRunsCli)
#include "tst_runs_cli.moc"
