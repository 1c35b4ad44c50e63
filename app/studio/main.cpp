// trainstudio: the studio GUI.
//
//   trainstudio [FILE]                       open a model (ours or a Keras model.to_json())
//   trainstudio --template seed_mlp          start from a built-in template
//   trainstudio --screenshot OUT.png --open resources/models/seed_mlp.json [--select dense]
//                                            render the window to a PNG and exit (works with
//                                            QT_QPA_PLATFORM=offscreen on a headless machine)
//   trainstudio --tab train [--train [--epochs N] [--limit N]] [--db FILE]
//                                            open on a tab; start training the model at once
//   trainstudio --screenshot OUT.png --tab train --train [--shot-at-step N]
//                                            the dashboards of a real run (at the end, or at step N)
//   trainstudio --bench-dashboard [--pairs N] [--epochs N]
//                                            what the 30 Hz dashboards cost the training

#include <QApplication>
#include <QCommandLineParser>
#include <QSettings>
#include <QTemporaryDir>
#include <QTimer>

#include <algorithm>
#include <cstdio>
#include <limits>

#include "backend/registry.h"
#include "bench_dashboard.h"
#include "dashboard/dashboardwidget.h"
#include "designer/designerscene.h"
#include "session/trainingsession.h"
#include "setup/runsetuppanel.h"
#include "trainpage.h"
#include <QSpinBox>
#include "designer/format.h"
#include "designer/modeldocument.h"
#include "designer/theme.h"
#include "mainwindow.h"

int main(int argc, char** argv)
{
    QApplication app(argc, argv);
    QApplication::setOrganizationName(QStringLiteral("TrainStudio"));
    QApplication::setApplicationName(QStringLiteral("TrainStudio"));
    QApplication::setApplicationDisplayName(QStringLiteral("TrainStudio"));
    QApplication::setApplicationVersion(QStringLiteral("0.1.0"));
    QApplication::setDesktopFileName(QStringLiteral("trainstudio"));
    QApplication::setWindowIcon(ts::appIcon());
    // GPU backends are plugins: loaded before the run setup lists the devices.
    ts::BackendRegistry::instance().loadDefaultPlugins();

    QCommandLineParser parser;
    parser.setApplicationDescription(QStringLiteral("TrainStudio: design, train and watch neural networks"));
    parser.addHelpOption();
    parser.addVersionOption();
    parser.addPositionalArgument(QStringLiteral("file"), QStringLiteral("A model to open"), QStringLiteral("[file]"));
    const QCommandLineOption openOpt(QStringLiteral("open"), QStringLiteral("Open a model file."), QStringLiteral("file"));
    const QCommandLineOption templateOpt(QStringLiteral("template"),
                                         QStringLiteral("Start from a template: %1.").arg(ts::MainWindow::templateNames().join(QStringLiteral(", "))),
                                         QStringLiteral("name"));
    const QCommandLineOption shotOpt(QStringLiteral("screenshot"),
                                     QStringLiteral("Render the main window to a PNG and exit."), QStringLiteral("png"));
    const QCommandLineOption sizeOpt(QStringLiteral("size"), QStringLiteral("Window size for --screenshot (default 1440x900)."),
                                     QStringLiteral("WxH"), QStringLiteral("1440x900"));
    const QCommandLineOption selectOpt(QStringLiteral("select"), QStringLiteral("Select a layer (by name) after opening."),
                                       QStringLiteral("id"));
    const QCommandLineOption themeOpt(QStringLiteral("theme"), QStringLiteral("system, light or dark (this run only)."),
                                      QStringLiteral("mode"));
    const QCommandLineOption tabOpt(QStringLiteral("tab"), QStringLiteral("Open on a tab: design, train, profiler or runs."),
                                    QStringLiteral("name"));
    const QCommandLineOption trainOpt(QStringLiteral("train"), QStringLiteral("Start training the model at once."));
    const QCommandLineOption epochsOpt(QStringLiteral("epochs"), QStringLiteral("Epochs for --train / --bench-dashboard."),
                                       QStringLiteral("n"));
    const QCommandLineOption limitOpt(QStringLiteral("limit"), QStringLiteral("Training examples for --train (0: all)."),
                                      QStringLiteral("n"));
    const QCommandLineOption dbOpt(QStringLiteral("db"), QStringLiteral("Run database (default: the user's)."), QStringLiteral("file"));
    const QCommandLineOption shotStepOpt(QStringLiteral("shot-at-step"),
                                         QStringLiteral("With --screenshot and --train: take it at this step, not at the end."),
                                         QStringLiteral("n"));
    const QCommandLineOption captureOpt(QStringLiteral("capture"),
                                        QStringLiteral("With --train: trace N steps of the run (from step 10) into the profiler."),
                                        QStringLiteral("n"));
    const QCommandLineOption benchOpt(QStringLiteral("bench-dashboard"),
                                      QStringLiteral("Measure the dashboards' cost to training throughput and exit."));
    const QCommandLineOption pairsOpt(QStringLiteral("pairs"), QStringLiteral("Pairs for --bench-dashboard (default 4)."),
                                      QStringLiteral("n"), QStringLiteral("4"));
    parser.addOptions({openOpt, templateOpt, shotOpt, sizeOpt, selectOpt, themeOpt, tabOpt, trainOpt, epochsOpt, limitOpt, dbOpt,
                       shotStepOpt, benchOpt, pairsOpt, captureOpt});
    parser.process(app);

    // Values are checked before anything opens: a bad one is an error naming the flag (exit 2),
    // never a default put in its place, and never a dialog a headless --screenshot cannot close.
    auto refuse = [](const QString& flag, const QString& value, const QString& expected) {
        std::fprintf(stderr, "error: --%s %s: %s\nhint: trainstudio --help lists the options\n", qPrintable(flag), qPrintable(value),
                     qPrintable(expected));
        return 2;
    };
    auto wholeNumber = [&](const QCommandLineOption& opt, qlonglong least) -> bool {
        if (!parser.isSet(opt)) return true;
        bool isNumber = false;
        const qlonglong v = parser.value(opt).toLongLong(&isNumber);
        return isNumber && v >= least && v <= std::numeric_limits<int>::max();
    };
    for (const auto& [opt, least] : {std::pair{&epochsOpt, 1LL}, std::pair{&limitOpt, 0LL}, std::pair{&shotStepOpt, 0LL},
                                     std::pair{&captureOpt, 0LL}, std::pair{&pairsOpt, 1LL}})
        if (!wholeNumber(*opt, least))
            return refuse(opt->names().constFirst(), parser.value(*opt), QStringLiteral("expected a whole number >= %1").arg(least));
    const QStringList tabs{QStringLiteral("design"), QStringLiteral("train"), QStringLiteral("profiler"), QStringLiteral("runs")};
    if (parser.isSet(tabOpt) && !tabs.contains(parser.value(tabOpt)))
        return refuse(QStringLiteral("tab"), parser.value(tabOpt), QStringLiteral("expected one of ") + tabs.join(QStringLiteral(", ")));
    const QStringList themes{QStringLiteral("system"), QStringLiteral("light"), QStringLiteral("dark")};
    if (parser.isSet(themeOpt) && !themes.contains(parser.value(themeOpt), Qt::CaseInsensitive))
        return refuse(QStringLiteral("theme"), parser.value(themeOpt), QStringLiteral("expected system, light or dark"));
    if (parser.isSet(templateOpt) && !parser.value(templateOpt).isEmpty() && !ts::MainWindow::templateNames().contains(parser.value(templateOpt)))
        return refuse(QStringLiteral("template"), parser.value(templateOpt),
                      QStringLiteral("no such template; the templates are ") + ts::MainWindow::templateNames().join(QStringLiteral(", ")));
    if (parser.isSet(sizeOpt)) {
        const QStringList wh = parser.value(sizeOpt).split(QLatin1Char('x'));
        if (wh.size() != 2 || wh[0].toInt() < 200 || wh[1].toInt() < 200 || wh[0].toInt() > 16384 || wh[1].toInt() > 16384)
            return refuse(QStringLiteral("size"), parser.value(sizeOpt), QStringLiteral("expected WIDTHxHEIGHT, each 200 to 16384, e.g. 1440x900"));
    }

    // A screenshot must not depend on (or change) the user's saved layout, theme or recent files.
    QTemporaryDir scratchSettings;
    if (parser.isSet(shotOpt)) {
        QSettings::setDefaultFormat(QSettings::IniFormat);
        QSettings::setPath(QSettings::IniFormat, QSettings::UserScope, scratchSettings.path());
    }
    if (parser.isSet(themeOpt))
        ts::applyThemeMode(ts::themeModeFromString(parser.value(themeOpt)));

    if (parser.isSet(benchOpt))
        return benchDashboard(parser.value(pairsOpt).toInt(), parser.isSet(epochsOpt) ? parser.value(epochsOpt).toInt() : 4,
                              parser.value(dbOpt));

    ts::MainWindow window;
    if (parser.isSet(dbOpt)) window.setDatabasePath(parser.value(dbOpt));
    QString file = parser.value(openOpt);
    if (file.isEmpty() && !parser.positionalArguments().isEmpty())
        file = parser.positionalArguments().constFirst();
    bool ok = true;
    if (!file.isEmpty()) {
        QString error;
        ok = window.openFile(file, parser.isSet(shotOpt) ? &error : nullptr);
        if (!ok && parser.isSet(shotOpt)) {
            std::fprintf(stderr, "trainstudio: %s\n", qPrintable(error));
            return 1;
        }
    } else if (parser.isSet(templateOpt)) {
        ok = window.newFromTemplate(parser.value(templateOpt));
    } else if (!parser.isSet(shotOpt) || parser.isSet(trainOpt) || parser.isSet(tabOpt)) {
        window.newFromTemplate(QStringLiteral("seed_mlp"));  // something to look at and edit
    }
    if (parser.isSet(selectOpt)) {
        const std::string id = ts::toStdString(parser.value(selectOpt));
        const auto& layers = window.document()->spec().layers;
        if (std::none_of(layers.begin(), layers.end(), [&](const ts::LayerSpec& l) { return l.id == id; }))
            return refuse(QStringLiteral("select"), parser.value(selectOpt), QStringLiteral("the model has no layer of that name"));
        window.scene()->selectIds({id});
    }

    if (parser.isSet(tabOpt)) window.showTab(parser.value(tabOpt));
    if (parser.isSet(trainOpt)) {
        window.showTab(QStringLiteral("train"));
        ts::RunSetupPanel* setup = window.trainPage()->setup();
        if (parser.isSet(epochsOpt)) setup->findChild<QSpinBox*>(QStringLiteral("epochs"))->setValue(parser.value(epochsOpt).toInt());
        if (parser.isSet(limitOpt)) setup->findChild<QSpinBox*>(QStringLiteral("limit"))->setValue(parser.value(limitOpt).toInt());
        QString error;
        const int capture = parser.isSet(captureOpt) ? parser.value(captureOpt).toInt() : 0;
        bool captured = capture <= 0;
        if (capture > 0) {
            QObject::connect(window.session(), &ts::TrainingSession::updated, &window, [&window, capture, &captured] {
                static bool asked = false;
                if (!asked && window.session()->data().lastStep() >= 10) asked = window.session()->captureTrace(capture);
            });
            // The main window opens the capture in the profiler on captureReady; ours runs after it.
            QObject::connect(window.trainPage(), &ts::TrainPage::captureReady, &window, [&captured] { captured = true; },
                             Qt::QueuedConnection);
        }
        if (!window.trainPage()->startTraining(&error)) {
            std::fprintf(stderr, "trainstudio: cannot train: %s\n", qPrintable(error));
            if (parser.isSet(shotOpt)) return 1;
        } else if (parser.isSet(shotOpt)) {
            // The picture of a real run: wait for the step asked for, or the end.
            const QStringList wh = parser.value(sizeOpt).split(QLatin1Char('x'));
            if (wh.size() == 2) window.resize(wh[0].toInt(), wh[1].toInt());
            window.show();
            const int64_t at = parser.isSet(shotStepOpt) ? parser.value(shotStepOpt).toLongLong() : -1;
            ts::TrainingSession* s = window.session();
            while ((s->isActive() && (at < 0 || s->data().lastStep() < at)) || (!captured && s->isActive()))
                QApplication::processEvents(QEventLoop::WaitForMoreEvents);  // the session's 30 Hz tick wakes it
            if (parser.isSet(tabOpt)) window.showTab(parser.value(tabOpt));
            if (at >= 0) {
                window.trainPage()->dashboard()->setCrosshair(static_cast<double>(at) * 0.8);
                s->pause();
                s->waitForFinished(1500);  // let the last tick land; paused, the run stays active
            }
        }
    }
    if (parser.isSet(shotOpt)) {
        const QStringList wh = parser.value(sizeOpt).split(QLatin1Char('x'));
        QSize size(1440, 900);
        if (wh.size() == 2 && wh[0].toInt() > 0 && wh[1].toInt() > 0)
            size = QSize(wh[0].toInt(), wh[1].toInt());
        if (!window.saveScreenshot(parser.value(shotOpt), size)) {
            std::fprintf(stderr, "trainstudio: cannot write %s\n", qPrintable(parser.value(shotOpt)));
            return 1;
        }
        std::printf("%s\n", qPrintable(parser.value(shotOpt)));
        return ok ? 0 : 1;
    }
    window.show();
    const int code = app.exec();
    return code;
}
