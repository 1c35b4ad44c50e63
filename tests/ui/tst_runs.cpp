// The run history page over a real store built with the core API: the model under
// QAbstractItemModelTester (and its sort/filter proxy), refresh while another connection writes
// without losing the selection, rename / tag / delete reaching the store, exports writing their
// files (and naming the run when they cannot), and the compare view's one graph per run.

#include <QtTest>

#include <QAbstractItemModelTester>
#include <QComboBox>
#include <QFile>
#include <QLineEdit>
#include <QMessageBox>
#include <QAbstractButton>
#include <QTableView>
#include <QTemporaryDir>

#include <qcustomplot.h>

#include <chrono>
#include <fstream>

#include "io/safetensors.h"
#include "runs/runcompareview.h"
#include "runs/runhistorypanel.h"
#include "runs/runsmodel.h"
#include "store/run_store.h"
#include "telemetry/chrome_trace.h"
#include "ui/ui_helpers.h"

using namespace ts;
namespace st = ts::store;
namespace tl = ts::telemetry;

namespace {

struct RunSpec {
    std::string name, strategy;
    nlohmann::json devices;
    int steps;
    double valAccuracy;  // < 0: no epoch metrics
    std::vector<std::string> tags;
};

// A completed run with `steps` steps of decreasing loss, one epoch and a few spans.
std::string addRun(st::RunStore& store, const RunSpec& r)
{
    st::NewRun spec;
    spec.name = r.name;
    spec.model = {{"name", "seed_mlp"}};
    spec.strategy = r.strategy;
    spec.devices = r.devices;
    spec.tags = r.tags;
    auto run = store.createRun(spec);
    if (!run.ok())
        return {};
    const std::string id = run->id;
    if (!store.setRunStatus(id, st::RunState::Running).ok())
        return {};
    std::vector<tl::Event> events;
    for (int s = 1; s <= r.steps; ++s) {
        tl::StepMetricsEvent m;
        m.stamp.runId = id;
        m.stamp.step = s;
        m.stamp.wallTimeUs = 1'700'000'000'000'000 + s * 1000;
        m.epoch = 1;
        m.loss = 2.0 / s;
        m.metrics["accuracy"] = 1.0 - 1.0 / (s + 1);
        events.push_back(m);
        tl::SpanEvent span;
        span.stamp.runId = id;
        span.stamp.step = s;
        span.name = "forward";
        span.category = "forward";
        span.startUs = m.stamp.wallTimeUs - 500;
        span.durationUs = 300;
        events.push_back(span);
    }
    if (r.valAccuracy >= 0) {
        tl::EpochMetricsEvent e;
        e.stamp.runId = id;
        e.stamp.step = r.steps;
        e.epoch = 1;
        e.metrics = {{"loss", 2.0 / r.steps}, {"val_accuracy", r.valAccuracy}};
        e.seconds = 1;
        events.push_back(e);
    }
    store.recordEvents(std::move(events));
    if (!store.setRunStatus(id, st::RunState::Completed).ok())
        return {};
    return id;
}

int rowOfName(const QAbstractItemModel& m, const QString& name)
{
    for (int r = 0; r < m.rowCount(); ++r)
        if (m.index(r, RunsModel::Name).data().toString() == name)
            return r;
    return -1;
}

QStringList namesInOrder(const QAbstractItemModel& m)
{
    QStringList names;
    for (int r = 0; r < m.rowCount(); ++r)
        names << m.index(r, RunsModel::Name).data().toString();
    return names;
}

} // namespace

class TestRuns : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void initTestCase();
    void init();
    void cleanup();
    void modelShowsTheRuns();
    void sortAndFilter();
    void refreshKeepsSelectionWhileAWriterWrites();
    void renameTagDeleteReachTheStore();
    void exportsWriteFiles();
    void compareViewHasOneGraphPerRun();
    void compareReadsTheZoomedStepsAtPixelResolution();
    void compareByEpochAndTime();
    void badDatabaseNamesTheFile();

private:
    QTemporaryDir m_dir;
    QString m_db;
    std::unique_ptr<st::RunStore> m_writer;  // stands in for a training process's connection
    QString m_adam, m_mirrored, m_sgd;
    int m_case = 0;
};

void TestRuns::initTestCase()
{
    uitest::isolateSettings();
    QVERIFY(m_dir.isValid());
}

void TestRuns::init()
{
    m_db = m_dir.filePath(QStringLiteral("runs%1.db").arg(++m_case));
    auto store = st::RunStore::open(m_db.toStdString());
    QVERIFY2(store.ok(), store.ok() ? "" : store.error().toString().c_str());
    m_writer = std::make_unique<st::RunStore>(std::move(*store));
    m_adam = QString::fromStdString(addRun(*m_writer, {"adam baseline", "OneDevice", {"cpu:0"}, 40, 0.81, {"baseline"}}));
    m_mirrored = QString::fromStdString(addRun(*m_writer, {"mirrored 2 cpus", "Mirrored", {"cpu:0", "cpu:1"}, 60, 0.86, {}}));
    // Devices as runs record them (objects with the task in multi-worker runs): shown by name.
    m_sgd = QString::fromStdString(addRun(*m_writer, {"sgd short", "OneDevice",
                                                      nlohmann::json::array({{{"device", "cpu:0"}, {"name", "cpu:0 (EPYC)"}, {"task", "worker:1"}}}),
                                                      10, -1, {}}));
    QVERIFY(!m_adam.isEmpty() && !m_mirrored.isEmpty() && !m_sgd.isEmpty());
    QVERIFY(m_writer->flush().ok());
}

void TestRuns::cleanup()
{
    m_writer.reset();
}

void TestRuns::modelShowsTheRuns()
{
    RunHistoryPanel panel;
    QString error;
    QVERIFY2(panel.setDatabase(m_db, &error), qPrintable(error));
    RunsModel* model = panel.model();
    QAbstractItemModelTester tester(model, QAbstractItemModelTester::FailureReportingMode::QtTest);
    QAbstractItemModelTester proxyTester(panel.proxyModel(), QAbstractItemModelTester::FailureReportingMode::QtTest);
    QCOMPARE(model->rowCount(), 3);
    QCOMPARE(model->columnCount(), int(RunsModel::ColumnCount));
    QCOMPARE(model->headerData(RunsModel::BestMetric, Qt::Horizontal).toString(), QStringLiteral("Best Metric"));

    const int m = model->rowOfRun(m_mirrored);
    QVERIFY(m >= 0);
    auto cell = [&](int row, int column) { return model->index(row, column).data().toString(); };
    QCOMPARE(cell(m, RunsModel::Name), QStringLiteral("mirrored 2 cpus"));
    QCOMPARE(cell(m, RunsModel::Model), QStringLiteral("seed_mlp"));
    QCOMPARE(cell(m, RunsModel::Strategy), QStringLiteral("Mirrored"));
    QCOMPARE(cell(m, RunsModel::Devices), QStringLiteral("cpu:0, cpu:1"));
    QCOMPARE(cell(model->rowOfRun(m_sgd), RunsModel::Devices), QStringLiteral("worker:1 cpu:0"));
    QCOMPARE(cell(m, RunsModel::Status), QStringLiteral("completed"));
    QCOMPARE(cell(m, RunsModel::BestMetric), QStringLiteral("val_accuracy 0.86"));
    QVERIFY(!cell(m, RunsModel::Duration).isEmpty());
    QVERIFY(!cell(m, RunsModel::Started).isEmpty());
    QCOMPARE(model->index(m, 0).data(RunsModel::RunIdRole).toString(), m_mirrored);
    // No epoch finished: the best step loss (2/10 at step 10).
    QCOMPARE(cell(model->rowOfRun(m_sgd), RunsModel::BestMetric), QStringLiteral("loss 0.2"));
    QCOMPARE(cell(model->rowOfRun(m_adam), RunsModel::Tags), QStringLiteral("baseline"));
    // Sort values are numbers where the column is.
    QCOMPARE(model->index(m, RunsModel::BestMetric).data(RunsModel::SortRole).toDouble(), 0.86);
    QVERIFY(model->index(m, RunsModel::Name).flags() & Qt::ItemIsEditable);

    // A refresh with nothing new changes nothing the tester would object to.
    panel.refresh();
    QCOMPARE(model->rowCount(), 3);
}

void TestRuns::sortAndFilter()
{
    RunHistoryPanel panel;
    QVERIFY(panel.setDatabase(m_db));
    RunsFilterModel* proxy = panel.proxyModel();
    QAbstractItemModelTester tester(proxy, QAbstractItemModelTester::FailureReportingMode::QtTest);
    proxy->sort(RunsModel::BestMetric, Qt::DescendingOrder);
    QCOMPARE(namesInOrder(*proxy), (QStringList{"mirrored 2 cpus", "adam baseline", "sgd short"}));
    proxy->sort(RunsModel::Name, Qt::AscendingOrder);
    QCOMPARE(namesInOrder(*proxy), (QStringList{"adam baseline", "mirrored 2 cpus", "sgd short"}));

    // The filter box: every word must match some column, case-insensitively.
    QTest::keyClicks(panel.filterField(), "onedevice");
    QCOMPARE(namesInOrder(*proxy), (QStringList{"adam baseline", "sgd short"}));
    panel.filterField()->setText(QStringLiteral("ONEDEVICE short"));
    QCOMPARE(namesInOrder(*proxy), (QStringList{"sgd short"}));
    panel.filterField()->setText(QStringLiteral("baseline"));  // a tag
    QCOMPARE(namesInOrder(*proxy), (QStringList{"adam baseline"}));
    panel.filterField()->setText(m_mirrored.left(8));  // the run id
    QCOMPARE(namesInOrder(*proxy), (QStringList{"mirrored 2 cpus"}));
    panel.filterField()->clear();
    QCOMPARE(proxy->rowCount(), 3);
}

void TestRuns::refreshKeepsSelectionWhileAWriterWrites()
{
    RunHistoryPanel panel;
    panel.setAutoRefreshInterval(0);
    QVERIFY(panel.setDatabase(m_db));
    panel.resize(900, 600);
    panel.show();
    QVERIFY(QTest::qWaitForWindowExposed(&panel));
    QAbstractItemModelTester tester(panel.model(), QAbstractItemModelTester::FailureReportingMode::QtTest);
    panel.view()->sortByColumn(RunsModel::Name, Qt::AscendingOrder);
    panel.selectRuns({m_mirrored});
    QCOMPARE(panel.selectedRunIds(), QStringList{m_mirrored});

    // The "training process" starts a run and writes steps; the panel refreshes meanwhile.
    st::NewRun spec;
    spec.name = "a live run";
    spec.model = {{"name", "seed_mlp"}};
    auto live = m_writer->createRun(spec);
    QVERIFY(live.ok());
    QVERIFY(m_writer->setRunStatus(live->id, st::RunState::Running).ok());
    for (int s = 1; s <= 5; ++s) {
        tl::StepMetricsEvent m;
        m.stamp.runId = live->id;
        m.stamp.step = s;
        m.loss = 1.0 / s;
        m_writer->record(m);
        QElapsedTimer t;
        t.start();
        panel.refresh();
        QVERIFY2(t.elapsed() < 1000, "a refresh waited for the writer");
    }
    QVERIFY(m_writer->flush().ok());
    panel.refresh();
    QCOMPARE(panel.model()->rowCount(), 4);
    const int liveRow = panel.model()->rowOfRun(QString::fromStdString(live->id));
    QCOMPARE(panel.model()->index(liveRow, RunsModel::Status).data().toString(), QStringLiteral("running"));
    QCOMPARE(panel.model()->index(liveRow, RunsModel::BestMetric).data().toString(), QStringLiteral("loss 0.2"));
    QCOMPARE(panel.selectedRunIds(), QStringList{m_mirrored});
    QCOMPARE(rowOfName(*panel.proxyModel(), "a live run"), 0);  // sorted into place

    // Another process's change (a rename) shows up in place; the selection stays.
    QVERIFY(m_writer->renameRun(m_mirrored.toStdString(), "mirrored renamed").ok());
    panel.refresh();
    QCOMPARE(panel.selectedRunIds(), QStringList{m_mirrored});
    QVERIFY(rowOfName(*panel.model(), "mirrored renamed") >= 0);
}

void TestRuns::renameTagDeleteReachTheStore()
{
    RunHistoryPanel panel;
    QVERIFY(panel.setDatabase(m_db));
    QAbstractItemModelTester tester(panel.model(), QAbstractItemModelTester::FailureReportingMode::QtTest);
    QString error;
    QVERIFY2(panel.renameRun(m_adam, QStringLiteral("adam, lr 1e-3"), &error), qPrintable(error));
    QCOMPARE(m_writer->run(m_adam.toStdString())->name, std::string("adam, lr 1e-3"));
    QVERIFY(rowOfName(*panel.model(), "adam, lr 1e-3") >= 0);
    // Editing the name cell renames too.
    const QModelIndex name = panel.model()->index(panel.model()->rowOfRun(m_sgd), RunsModel::Name);
    QVERIFY(panel.model()->setData(name, QStringLiteral("sgd edited")));
    QCOMPARE(m_writer->run(m_sgd.toStdString())->name, std::string("sgd edited"));
    QVERIFY(!panel.renameRun(m_sgd, QStringLiteral("  "), &error));
    QVERIFY(error.contains(m_sgd));

    QVERIFY2(panel.setRunTags(m_mirrored, {"best", " fast ", ""}, &error), qPrintable(error));
    QCOMPARE(m_writer->run(m_mirrored.toStdString())->tags, (std::vector<std::string>{"best", "fast"}));
    QCOMPARE(panel.model()->index(panel.model()->rowOfRun(m_mirrored), RunsModel::Tags).data().toString(),
             QStringLiteral("best, fast"));

    // Delete asks first: Cancel keeps the run, Delete removes it.
    auto answerDelete = [](QMessageBox::ButtonRole role) {
        auto* poll = new QTimer;
        poll->setInterval(10);
        QObject::connect(poll, &QTimer::timeout, [poll, role] {
            auto* box = qobject_cast<QMessageBox*>(QApplication::activeModalWidget());
            if (!box)
                return;
            for (QAbstractButton* b : box->buttons())
                if (box->buttonRole(b) == role) {
                    poll->deleteLater();
                    b->click();
                    return;
                }
        });
        poll->start();
    };
    panel.selectRuns({m_adam});
    answerDelete(QMessageBox::RejectRole);
    panel.findChild<QAction*>("deleteRunAction")->trigger();
    QVERIFY(m_writer->run(m_adam.toStdString()).ok());
    answerDelete(QMessageBox::DestructiveRole);
    panel.findChild<QAction*>("deleteRunAction")->trigger();
    QVERIFY(!m_writer->run(m_adam.toStdString()).ok());
    QCOMPARE(panel.model()->rowOfRun(m_adam), -1);

    QVERIFY2(panel.deleteRun(m_sgd, true, &error), qPrintable(error));
    QVERIFY(!m_writer->run(m_sgd.toStdString()).ok());
    QCOMPARE(panel.model()->rowCount(), 1);
    QCOMPARE(panel.model()->rowOfRun(m_sgd), -1);
    QVERIFY(!panel.deleteRun(m_sgd, true, &error));
    QVERIFY2(error.contains(m_sgd), qPrintable(error));
}

void TestRuns::exportsWriteFiles()
{
    // The adam run gets final weights.
    const QString weights = m_dir.filePath(QStringLiteral("final%1.safetensors").arg(m_case));
    QVERIFY(ts::writeSafetensors(weights.toStdString(), {{"dense/kernel", ts::Tensor::fromVector(ts::Shape({2, 2}), {1, 2, 3, 4})}}).ok());
    QVERIFY(m_writer->addCheckpoint(m_adam.toStdString(), weights.toStdString(), 40, "final").ok());

    RunHistoryPanel panel;
    QVERIFY(panel.setDatabase(m_db));
    QString error;
    const QString csv = m_dir.filePath("adam.csv");
    QVERIFY2(panel.exportMetricsCsv(m_adam, csv, &error), qPrintable(error));
    QFile csvFile(csv);
    QVERIFY(csvFile.open(QIODevice::ReadOnly));
    const QList<QByteArray> lines = csvFile.readAll().trimmed().split('\n');
    QCOMPARE(lines.size(), 41);  // header + 40 steps
    QVERIFY2(lines[0].startsWith("wall_time,step,epoch,loss"), lines[0].constData());

    const QString trace = m_dir.filePath("adam.trace.json");
    QVERIFY2(panel.exportTrace(m_adam, trace, &error), qPrintable(error));
    auto read = tl::readChromeTrace(trace.toStdString());
    QVERIFY2(read.ok(), read.ok() ? "" : read.error().toString().c_str());
    QCOMPARE(read->spans.size(), std::size_t(40));

    const QString out = m_dir.filePath("adam.safetensors");
    QVERIFY2(panel.exportWeights(m_adam, out, &error), qPrintable(error));
    auto tensors = ts::readSafetensors(out.toStdString());
    QVERIFY2(tensors.ok(), tensors.ok() ? "" : tensors.error().toString().c_str());

    // Train From Its Weights hands the run's final checkpoint to the setup.
    QSignalSpy startFrom(&panel, &RunHistoryPanel::startFromWeightsRequested);
    QVERIFY2(panel.trainFromWeights(m_adam, &error), qPrintable(error));
    QCOMPARE(startFrom.count(), 1);
    QCOMPARE(startFrom.at(0).at(0).toString(), m_adam);
    QCOMPARE(startFrom.at(0).at(1).toString(), weights);
    QVERIFY(!panel.trainFromWeights(m_sgd, &error));
    QVERIFY2(error.contains(m_sgd) && error.contains("no recorded weights"), qPrintable(error));
    QCOMPARE(startFrom.count(), 1);

    // A run without weights, and a folder that does not exist: errors name the run and file.
    QVERIFY(!panel.exportWeights(m_sgd, m_dir.filePath("sgd.safetensors"), &error));
    QVERIFY2(error.contains(m_sgd), qPrintable(error));
    QVERIFY(!panel.exportMetricsCsv(m_adam, QStringLiteral("/nonexistent-dir/adam.csv"), &error));
    QVERIFY2(error.contains("/nonexistent-dir/adam.csv"), qPrintable(error));
    QVERIFY(!QFile::exists(m_dir.filePath("sgd.safetensors")));
}

void TestRuns::compareViewHasOneGraphPerRun()
{
    RunHistoryPanel panel;
    QVERIFY(panel.setDatabase(m_db));
    panel.resize(900, 700);
    panel.show();
    QVERIFY(QTest::qWaitForWindowExposed(&panel));
    QSignalSpy compare(&panel, &RunHistoryPanel::compareRequested);
    const QStringList ids{m_adam, m_mirrored, m_sgd};
    QString error;
    QVERIFY2(panel.compareRuns(ids, &error), qPrintable(error));
    QCOMPARE(compare.count(), 1);
    QCOMPARE(compare.at(0).at(0).toStringList(), ids);
    RunCompareView* view = panel.compareView();
    QCOMPARE(view->metric(), QStringLiteral("loss"));
    QVERIFY(view->availableMetrics().contains("accuracy"));
    QCOMPARE(view->plot()->graphCount(), 3);
    QCOMPARE(view->plot()->graph(0)->name(), QStringLiteral("adam baseline"));
    QCOMPARE(view->plot()->graph(1)->dataCount(), 60);  // mirrored: every step (fewer than a pixel each)
    QCOMPARE(view->plot()->graph(2)->dataCount(), 10);
    QCOMPARE(view->plot()->graph(2)->data()->at(0)->value, 2.0);

    QVERIFY(view->setMetric(QStringLiteral("accuracy"), &error));
    QCOMPARE(view->plot()->graphCount(), 3);
    QCOMPARE(view->metricBox()->currentText(), QStringLiteral("accuracy"));

    // Selecting two rows and pressing Compare overlays those two.
    panel.selectRuns({m_adam, m_sgd});
    QCOMPARE(panel.selectedRunIds().size(), 2);
    panel.findChild<QAction*>("compareRunsAction")->trigger();
    QCOMPARE(view->plot()->graphCount(), 2);
    QCOMPARE(compare.count(), 2);

    // Deleting a compared run takes it out of the plot.
    QVERIFY(panel.deleteRun(m_sgd, true, &error));
    QCOMPARE(view->plot()->graphCount(), 1);
}

void TestRuns::compareReadsTheZoomedStepsAtPixelResolution()
{
    // 20'000 steps do not fit in a plot's width: the store downsamples them (M4) and the view
    // asks again for the visible steps when the user zooms.
    st::NewRun spec;
    spec.name = "long run";
    spec.model = {{"name", "seed_mlp"}};
    auto run = m_writer->createRun(spec);
    QVERIFY(run.ok());
    std::vector<tl::Event> events;
    for (int s = 1; s <= 20'000; ++s) {
        tl::StepMetricsEvent m;
        m.stamp.runId = run->id;
        m.stamp.step = s;
        m.loss = s == 12'345 ? 50.0 : 1.0 + (s % 7) * 0.01;  // one spike
        events.push_back(m);
    }
    m_writer->recordEvents(std::move(events));
    QVERIFY(m_writer->flush().ok());

    RunCompareView view;
    view.resize(800, 400);
    view.setStore(m_writer.get());
    view.show();
    QVERIFY(QTest::qWaitForWindowExposed(&view));
    QString error;
    QVERIFY2(view.setRuns({QString::fromStdString(run->id)}, &error), qPrintable(error));
    QCPGraph* g = view.plot()->graph(0);
    QVERIFY(g->dataCount() < 4 * 800);  // at most four points per pixel column
    double peak = 0;
    for (auto it = g->data()->constBegin(); it != g->data()->constEnd(); ++it)
        peak = std::max(peak, it->value);
    QCOMPARE(peak, 50.0);  // the spike survives downsampling

    view.plot()->xAxis->setRange(12'300, 12'400);
    // Re-read once the zoom settles: only the visible steps, every one of them.
    QTRY_VERIFY(view.plot()->graph(0)->data()->constBegin()->key >= 12'299);
    QCPGraph* zoomed = view.plot()->graph(0);
    QVERIFY(zoomed->dataCount() >= 100);
    QVERIFY2(zoomed->data()->constBegin()->key >= 12'299, qPrintable(QStringLiteral("%1 .. %2, %3 points").arg(zoomed->data()->constBegin()->key).arg((zoomed->data()->constEnd() - 1)->key).arg(zoomed->dataCount())));
    QVERIFY((zoomed->data()->constEnd() - 1)->key <= 12'401);
    QCOMPARE(view.plot()->xAxis->range().lower, 12'300.0);  // the user's range is kept
}

void TestRuns::compareByEpochAndTime()
{
    // Two runs of two epochs each, with 20 and 5 steps per epoch (batch sizes differing 4x):
    // against step they end at 40 and 10, against epoch both at 2.
    auto add = [this](const std::string& name, int stepsPerEpoch) {
        st::NewRun spec;
        spec.name = name;
        spec.model = {{"name", "seed_mlp"}};
        auto run = m_writer->createRun(spec);
        if (!run.ok() || !m_writer->setRunStatus(run->id, st::RunState::Running).ok())
            return std::string();
        const int64_t t0 = std::chrono::duration_cast<std::chrono::microseconds>(
                               std::chrono::system_clock::now().time_since_epoch()).count();
        std::vector<tl::Event> events;
        for (int s = 1; s <= 2 * stepsPerEpoch; ++s) {
            tl::StepMetricsEvent m;
            m.stamp.runId = run->id;
            m.stamp.step = s;
            m.stamp.wallTimeUs = t0 + int64_t(s) * 10'000;  // 10 ms a step
            m.epoch = 1 + (s - 1) / stepsPerEpoch;
            m.loss = 1.0 / s;
            events.push_back(m);
            if (s % stepsPerEpoch == 0) {
                tl::EpochMetricsEvent e;
                e.stamp.runId = run->id;
                e.stamp.step = s;
                e.stamp.wallTimeUs = m.stamp.wallTimeUs;
                e.epoch = s / stepsPerEpoch;
                e.metrics = {{"loss", m.loss}};
                events.push_back(e);
            }
        }
        m_writer->recordEvents(std::move(events));
        return run->id;
    };
    const QString small = QString::fromStdString(add("batch 64", 20));
    const QString big = QString::fromStdString(add("batch 256", 5));
    QVERIFY(!small.isEmpty() && !big.isEmpty());
    QVERIFY(m_writer->flush().ok());

    RunCompareView view;
    view.resize(800, 400);
    view.setStore(m_writer.get());
    QString error;
    QVERIFY2(view.setRuns({small, big}, &error), qPrintable(error));
    auto lastKey = [&view](int g) { return (view.plot()->graph(g)->data()->constEnd() - 1)->key; };
    auto firstKey = [&view](int g) { return view.plot()->graph(g)->data()->constBegin()->key; };
    QCOMPARE(lastKey(0), 40.0);
    QCOMPARE(lastKey(1), 10.0);

    QVERIFY2(view.setXAxis(RunCompareView::XAxis::Epoch, &error), qPrintable(error));
    QCOMPARE(view.xAxisBox()->currentIndex(), 1);
    QCOMPARE(view.plot()->xAxis->label(), QStringLiteral("epoch"));
    QCOMPARE(view.plot()->graphCount(), 2);
    QCOMPARE(lastKey(0), 2.0);
    QCOMPARE(lastKey(1), 2.0);
    QCOMPARE(firstKey(0), 1.0 / 20);  // step 1 of 20 per epoch
    QCOMPARE(firstKey(1), 1.0 / 5);

    // Zooming to epoch 1.5 .. 2 re-reads each run's own steps of that range.
    view.plot()->xAxis->setRange(1.5, 2.0);
    QTRY_VERIFY(firstKey(0) >= 1.45);
    QVERIFY(view.plot()->graph(0)->dataCount() >= 10);  // steps 30..40 of the 64-batch run
    QVERIFY(firstKey(1) >= 1.3);

    // Against time since the start: 10 ms a step, so the 40-step run ends near 0.4 s.
    QVERIFY2(view.setXAxis(RunCompareView::XAxis::RelativeTime, &error), qPrintable(error));
    QCOMPARE(view.plot()->xAxis->label(), QStringLiteral("seconds since start"));
    QVERIFY2(lastKey(0) > 0.35 && lastKey(0) < 5.0, qPrintable(QString::number(lastKey(0))));
    QVERIFY2(lastKey(1) > 0.05 && lastKey(1) < lastKey(0), qPrintable(QString::number(lastKey(1))));
    QVERIFY(std::is_sorted(view.plot()->graph(0)->data()->constBegin(), view.plot()->graph(0)->data()->constEnd(),
                           [](const QCPGraphData& a, const QCPGraphData& b) { return a.key < b.key; }));
}

void TestRuns::badDatabaseNamesTheFile()
{
    const QString bad = m_dir.filePath("not_a_db.db");
    std::ofstream(bad.toStdString()) << "this is not an SQLite database, just text long enough to have a header";
    RunHistoryPanel panel;
    QVERIFY(panel.setDatabase(m_db));
    QString error;
    QVERIFY(!panel.setDatabase(bad, &error));
    QVERIFY2(error.contains("not_a_db.db"), qPrintable(error));
    QCOMPARE(panel.databasePath(), m_db);  // the open one stays
    QCOMPARE(panel.model()->rowCount(), 3);
}

QTEST_MAIN(TestRuns)
#include "tst_runs.moc"
