// trainstudio --bench-dashboard: the seed's MLP on Fashion-MNIST trained three ways per round:
// (E) the engine alone, as the CLI runs it — prepareRun, the run recorded into the store, no
// GUI; (S) through the studio's session — the bus also drained into RunData at 30 Hz, nothing
// drawn; (D) the whole window on the Train tab, the five dashboards replotting at 30 Hz. All
// record into the run store. The order rotates every round because the machine warms up; the
// result is the median throughput of each and the ratios to E.

#include <QApplication>
#include <QElapsedTimer>
#include <QString>
#include <QTemporaryDir>

#include <algorithm>
#include <ctime>
#include <functional>
#include <thread>
#include <cstdio>
#include <vector>

#include "bench_dashboard.h"
#include "dashboard/dashboardwidget.h"
#include "mainwindow.h"
#include "store/recording.h"
#include "telemetry/bus.h"
#include "session/trainingsession.h"
#include "setup/runsetuppanel.h"
#include "trainpage.h"

namespace {

double median(std::vector<double> v)
{
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[v.size() / 2];
}

// Mean training throughput of the epochs after the first (the first warms caches and threads).
double throughput(const ts::RunData& d)
{
    const auto& e = d.epochs();
    double sum = 0;
    int n = 0;
    for (std::size_t i = e.epoch.size() > 1 ? 1 : 0; i < e.epoch.size(); ++i) {
        sum += e.samplesPerSec[i];
        ++n;
    }
    return n ? sum / n : 0;
}

double runEngineOnly(const ts::RunConfig& cfg, const QString& db)
{
    auto recording = ts::store::RunRecording::open(db.toStdString(), {"bench engine", {}, nullptr});
    if (!recording.ok()) return 0;
    auto prepared = ts::prepareRun(cfg);
    if (!prepared.ok()) {
        std::fprintf(stderr, "trainstudio: %s\n", prepared.error().toString().c_str());
        return 0;
    }
    ts::telemetry::EventBus bus;
    ts::PreparedRun run = std::move(prepared).value();
    if (auto st = (*recording)->begin(run, bus); !st.ok()) {
        std::fprintf(stderr, "trainstudio: %s\n", st.error().toString().c_str());
        return 0;
    }
    // A listener that keeps the epochs' throughput, like RunData does from the bus.
    struct Epochs final : ts::TrainListener {
        std::vector<double> rates;
        void onEpoch(const ts::EpochEvent& e) override { rates.push_back(e.samplesPerSec); }
    } listener;
    auto fit = run.trainer->fit(*run.trainSource(), run.validationSource(), &listener);
    (*recording)->fitDone(fit);
    double sum = 0;
    int n = 0;
    for (std::size_t i = listener.rates.size() > 1 ? 1 : 0; i < listener.rates.size(); ++i, ++n) sum += listener.rates[i];
    return n ? sum / n : 0;
}

ts::RunConfig benchConfig(int epochs)
{
    ts::MainWindow w;
    w.newFromTemplate(QStringLiteral("seed_mlp"));
    w.showTab(QStringLiteral("train"));
    ts::RunConfig cfg = w.trainPage()->setup()->config();
    cfg.epochs = epochs;
    cfg.validate = false;
    return cfg;
}

// CPU time of the calling (GUI) thread: what the studio takes from the training, measured
// directly (the throughput ratio alone drowns in this machine's noise).
double threadCpuSeconds()
{
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

struct GuiCost {
    double cpu = 0, wall = 0;
};
GuiCost g_lastCost;

// The GUI thread's cost over the same epochs as the throughput (after the first): a short bench
// run would otherwise charge the window's first layout and paint to every frame. `atStart` runs
// when that window opens.
struct SteadyCost {
    QElapsedTimer wall;
    double cpu0 = -1;
    SteadyCost(ts::TrainingSession& session, QObject* context, std::function<void()> atStart = {})
    {
        QObject::connect(&session, &ts::TrainingSession::updated, context, [this, &session, atStart] {
            if (cpu0 >= 0 || session.data().epochs().epoch.empty()) return;
            cpu0 = threadCpuSeconds();
            wall.start();
            if (atStart) atStart();
        });
    }
    bool started() const { return cpu0 >= 0; }
    GuiCost cost() const { return started() ? GuiCost{threadCpuSeconds() - cpu0, wall.nsecsElapsed() * 1e-9} : GuiCost{}; }
};

double runOnce(bool withDashboards, int epochs, const QString& db)
{
    if (!withDashboards) {
        // The session alone: no window, nothing connected to its updates.
        ts::TrainingSession s;
        s.setDatabasePath(db);
        QString error;
        if (!s.start(benchConfig(epochs), QStringLiteral("bench session"), &error)) {
            std::fprintf(stderr, "trainstudio: %s\n", qPrintable(error));
            return 0;
        }
        SteadyCost steady(s, &s);
        s.waitForFinished(600000);
        g_lastCost = steady.cost();
        return throughput(s.data());
    }
    ts::MainWindow w;
    w.setConfirmStopOnClose(false);
    w.setDatabasePath(db);
    w.newFromTemplate(QStringLiteral("seed_mlp"));
    w.showTab(QStringLiteral("train"));
    // The same configuration benchConfig() builds, from this window's own setup form.
    ts::RunConfig cfg = w.trainPage()->setup()->config();
    cfg.epochs = epochs;
    cfg.validate = false;
    w.resize(1440, 900);
    w.show();
    QString error;
    if (!w.session()->start(cfg, QStringLiteral("bench dashboards"), &error)) {
        std::fprintf(stderr, "trainstudio: %s\n", qPrintable(error));
        return 0;
    }
    const ts::DashboardWidget* dash = w.trainPage()->dashboard();
    int frames1 = 0, incremental1 = 0;
    SteadyCost steady(*w.session(), &w, [&] {
        frames1 = dash->liveReplots();
        incremental1 = dash->incrementalDraws();
    });
    w.session()->waitForFinished(600000);
    g_lastCost = steady.cost();
    if (!steady.started()) return throughput(w.session()->data());  // a single epoch: nothing after it
    const int frames = dash->liveReplots() - frames1;
    std::printf("           dashboards after the first epoch: %d live frames in %.1f s (%.1f per second), %.2f ms per frame (five "
                "plots; %d of %d plot redraws drew only the new points)\n",
                frames, g_lastCost.wall, frames / std::max(1e-9, g_lastCost.wall), dash->frameMs(),
                dash->incrementalDraws() - incremental1, 5 * frames);
    return throughput(w.session()->data());
}

} // namespace

int benchDashboard(int pairs, int epochs, const QString& databasePath)
{
    QTemporaryDir dir;
    const QString db = databasePath.isEmpty() ? dir.filePath(QStringLiteral("bench.db")) : databasePath;
    const ts::RunConfig cfg = benchConfig(epochs);
    const char* names[] = {"engine only (CLI path)", "studio session", "window + dashboards"};
    std::vector<double> rates[3], guiShare[3];
    std::printf("Dashboard cost: seed MLP, Fashion-MNIST, %d epochs per run (the first excluded), strategy %s, %zu device(s)\n",
                epochs, cfg.strategy.kind.c_str(), cfg.strategy.devices.size());
    for (int p = 0; p < pairs; ++p) {
        for (int k = 0; k < 3; ++k) {
            const int mode = (p + k) % 3;  // each round starts with the next mode
            const double r = mode == 0 ? runEngineOnly(cfg, db) : runOnce(mode == 2, epochs, db);
            rates[mode].push_back(r);
            if (mode == 0) {
                std::printf("  round %d  %-24s %9.0f samples/s\n", p + 1, names[mode], r);
            } else {
                const double share = g_lastCost.wall > 0 ? g_lastCost.cpu / g_lastCost.wall : 0;
                guiShare[mode].push_back(share);
                std::printf("  round %d  %-24s %9.0f samples/s   GUI thread %.1f ms CPU per second (%.1f%% of one core)\n", p + 1,
                            names[mode], r, 1e3 * share, 100 * share);
            }
            std::fflush(stdout);
        }
    }
    const double e = median(rates[0]), s = median(rates[1]), d = median(rates[2]);
    std::printf("median samples/s: engine only %.0f, session %.0f (%.3fx), window + 30 Hz dashboards %.0f (%.3fx, slowdown %.1f%%)\n",
                e, s, e > 0 ? s / e : 0, d, e > 0 ? d / e : 0, e > 0 ? 100 * (1 - d / e) : 0);
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    std::printf("median GUI thread CPU: session %.1f%% of a core, window + dashboards %.1f%% of a core = %.1f%% of this "
                "machine's %d cores (the training's upper bound on what the dashboards cost it)\n",
                100 * median(guiShare[1]), 100 * median(guiShare[2]), 100 * median(guiShare[2]) / cores, cores);
    return e > 0 && s > 0 && d > 0 ? 0 : 1;
}
