// trainstudio: the studio GUI.
//
//   trainstudio [FILE]                       open a model (ours or a Keras model.to_json())
//   trainstudio --template seed_mlp          start from a built-in template
//   trainstudio --screenshot OUT.png --open resources/models/seed_mlp.json [--select dense]
//                                            render the window to a PNG and exit (works with
//                                            QT_QPA_PLATFORM=offscreen on a headless machine)

#include <QApplication>
#include <QCommandLineParser>
#include <QSettings>
#include <QTemporaryDir>
#include <QTimer>

#include <cstdio>

#include "designer/designerscene.h"
#include "designer/format.h"
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
    parser.addOptions({openOpt, templateOpt, shotOpt, sizeOpt, selectOpt, themeOpt});
    parser.process(app);

    // A screenshot must not depend on (or change) the user's saved layout, theme or recent files.
    QTemporaryDir scratchSettings;
    if (parser.isSet(shotOpt)) {
        QSettings::setDefaultFormat(QSettings::IniFormat);
        QSettings::setPath(QSettings::IniFormat, QSettings::UserScope, scratchSettings.path());
    }
    if (parser.isSet(themeOpt))
        ts::applyThemeMode(ts::themeModeFromString(parser.value(themeOpt)));

    ts::MainWindow window;
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
    } else if (!parser.isSet(shotOpt)) {
        window.newFromTemplate(QStringLiteral("seed_mlp"));  // something to look at and edit
    }
    if (parser.isSet(selectOpt))
        window.scene()->selectIds({ts::toStdString(parser.value(selectOpt))});

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
    return app.exec();
}
