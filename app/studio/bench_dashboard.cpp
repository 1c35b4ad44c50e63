// trainstudio --bench-dashboard: the seed's MLP on Fashion-MNIST trained through the studio's
// session twice per pair: (A) the session alone — the bus drained into RunData at 30 Hz but
// nothing drawn — and (B) the whole window on the Train tab, the five dashboards replotting at
// 30 Hz. Both record into the run store. Pairs alternate the order (ABBA) because the machine
// warms up; the result is the median throughput of each and their ratio.

#include <QApplication>
#include <QString>
#include <QTemporaryDir>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "bench_dashboard.h"
#include "mainwindow.h"
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

double runOnce(bool withDashboards, int epochs, const QString& db)
{
    ts::MainWindow w;
    w.setConfirmStopOnClose(false);
    w.setDatabasePath(db);
    w.newFromTemplate(QStringLiteral("seed_mlp"));
    w.showTab(QStringLiteral("train"));
    ts::RunConfig cfg = w.trainPage()->setup()->config();
    cfg.epochs = epochs;
    cfg.validate = false;
    if (withDashboards) {
        w.resize(1440, 900);
        w.show();
    }
    QString error;
    if (!w.session()->start(cfg, withDashboards ? QStringLiteral("bench dashboards") : QStringLiteral("bench session"), &error)) {
        std::fprintf(stderr, "trainstudio: %s\n", qPrintable(error));
        return 0;
    }
    w.session()->waitForFinished(600000);
    return throughput(w.session()->data());
}

} // namespace

int benchDashboard(int pairs, int epochs, const QString& databasePath)
{
    QTemporaryDir dir;
    const QString db = databasePath.isEmpty() ? dir.filePath(QStringLiteral("bench.db")) : databasePath;
    std::vector<double> a, b;
    std::printf("Dashboard overhead: seed MLP, Fashion-MNIST, %d epochs per run (first excluded), default strategy\n", epochs);
    for (int p = 0; p < pairs; ++p) {
        // ABBA: even pairs run A first, odd pairs B first.
        const bool aFirst = p % 2 == 0;
        for (int k = 0; k < 2; ++k) {
            const bool dash = (k == 0) != aFirst;
            const double r = runOnce(dash, epochs, db);
            (dash ? b : a).push_back(r);
            std::printf("  pair %d %-22s %9.0f samples/s\n", p + 1, dash ? "window + dashboards" : "session only", r);
            std::fflush(stdout);
        }
    }
    const double ma = median(a), mb = median(b);
    std::printf("median: session only %.0f samples/s, with dashboards at 30 Hz %.0f samples/s: ratio %.3f (slowdown %.1f%%)\n", ma, mb,
                ma > 0 ? mb / ma : 0, ma > 0 ? 100 * (1 - mb / ma) : 0);
    return ma > 0 && mb > 0 ? 0 : 1;
}
