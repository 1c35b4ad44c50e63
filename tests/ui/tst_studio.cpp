// The trainstudio executable's command line: --screenshot renders the designer offscreen (how
// the README's picture is made), and a model it cannot open is a clear error, not a crash.

#include <QImage>
#include <QProcess>
#include <QTemporaryDir>
#include <QtTest>

class TestStudio : public QObject {
    Q_OBJECT
private slots:
    void screenshotOfSeedModel();
    void screenshotOfBrokenModel();

private:
    struct Run {
        int code;
        QString err;
    };
    Run studio(const QStringList& args)
    {
        QProcess p;
        p.start(QStringLiteral(TS_STUDIO_PATH), args);
        if (!p.waitForFinished(60000)) {
            p.kill();
            p.waitForFinished();
            return {-1, QStringLiteral("timed out")};
        }
        return {p.exitStatus() == QProcess::NormalExit ? p.exitCode() : -2, QString::fromUtf8(p.readAllStandardError())};
    }
    QTemporaryDir m_dir;
};

void TestStudio::screenshotOfSeedModel()
{
    const QString png = m_dir.filePath("designer.png");
    const Run r = studio({"--screenshot", png, "--size", "1000x700", "--open",
                          QStringLiteral(TS_SOURCE_DIR "/resources/models/seed_mlp.json"), "--select", "dense"});
    QVERIFY2(r.code == 0, qPrintable(r.err));
    const QImage img(png);
    QVERIFY(!img.isNull());
    QCOMPARE(img.size() / img.devicePixelRatio(), QSize(1000, 700));
    // Not a blank window: the canvas, palette and inspector draw many distinct colours.
    QSet<QRgb> colours;
    for (int y = 0; y < img.height(); y += 7)
        for (int x = 0; x < img.width(); x += 7) colours.insert(img.pixel(x, y));
    QVERIFY2(colours.size() > 20, qPrintable(QString::number(colours.size())));
}

void TestStudio::screenshotOfBrokenModel()
{
    QFile f(m_dir.filePath("broken.json"));
    QVERIFY(f.open(QIODevice::WriteOnly));
    f.write("{\"format\": \"trainstudio-model\", \"layers\": [\n  {\"id\": \"a\",, }\n]}\n");
    f.close();
    const QString png = m_dir.filePath("broken.png");
    const Run r = studio({"--screenshot", png, "--open", f.fileName()});
    QCOMPARE(r.code, 1);
    QVERIFY2(r.err.contains("broken.json"), qPrintable(r.err));
    QVERIFY(!QFile::exists(png));
}

QTEST_GUILESS_MAIN(TestStudio)
#include "tst_studio.moc"
