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
    void badFlagValuesAreRefused_data();
    void badFlagValuesAreRefused();

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

// A bad value is an error naming the flag, exit 2: before, --epochs abc trained one epoch, --limit
// -5 all 60,000 examples, and --template bogus in --screenshot mode waited forever in a dialog.
void TestStudio::badFlagValuesAreRefused_data()
{
    QTest::addColumn<QStringList>("args");
    QTest::addColumn<QString>("mention");
    const QString png = m_dir.filePath("never.png");
    QTest::newRow("template") << QStringList{"--template", "bogus", "--screenshot", png} << "--template bogus: no such template";
    QTest::newRow("epochs") << QStringList{"--train", "--epochs", "abc", "--screenshot", png} << "--epochs abc: expected a whole number >= 1";
    QTest::newRow("limit") << QStringList{"--train", "--limit", "-5", "--screenshot", png} << "--limit -5";
    QTest::newRow("tab") << QStringList{"--tab", "nonsense", "--screenshot", png} << "--tab nonsense: expected one of design";
    QTest::newRow("theme") << QStringList{"--theme", "purple", "--screenshot", png} << "--theme purple";
    QTest::newRow("size") << QStringList{"--size", "0x0", "--screenshot", png} << "--size 0x0";
    QTest::newRow("select") << QStringList{"--template", "seed_mlp", "--select", "nosuch", "--screenshot", png} << "--select nosuch";
}

void TestStudio::badFlagValuesAreRefused()
{
    QFETCH(QStringList, args);
    QFETCH(QString, mention);
    const Run r = studio(args);
    QVERIFY2(r.code == 2, qPrintable(QString::number(r.code) + ": " + r.err));
    QVERIFY2(r.err.contains("error: " + mention) && r.err.contains("hint: "), qPrintable(r.err));
    QVERIFY(!QFile::exists(m_dir.filePath("never.png")));
}

QTEST_GUILESS_MAIN(TestStudio)
#include "tst_studio.moc"
