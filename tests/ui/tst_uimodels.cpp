// The studio's item models under QAbstractItemModelTester: the layer palette (groups, kinds,
// descriptions, drag data), its search filter, and the problem list as the document changes.
// Plus the palette widget: typing filters, Enter adds the best match.

#include <QtTest>

#include <QAbstractItemModelTester>
#include <QLineEdit>
#include <QMimeData>
#include <QTreeView>
#include <QUndoStack>

#include <set>

#include "designer/designerview.h"
#include "designer/modeldocument.h"
#include "designer/palettewidget.h"
#include "model/spec.h"
#include "models/layerpalettemodel.h"
#include "models/problemsmodel.h"
#include "ui/ui_helpers.h"

using namespace ts;

class TestUiModels : public QObject {
    Q_OBJECT
private Q_SLOTS:
    void initTestCase() { uitest::isolateSettings(); }
    void paletteHasEveryLayerGrouped();
    void paletteDragData();
    void paletteSearch_data();
    void paletteSearch();
    void paletteWidgetTypingAndEnter();
    void problemsFollowTheDocument();
};

namespace {

QStringList visibleTypes(const QAbstractItemModel& m)
{
    QStringList types;
    for (int g = 0; g < m.rowCount(); ++g) {
        const QModelIndex group = m.index(g, 0);
        for (int r = 0; r < m.rowCount(group); ++r)
            types << m.index(r, 0, group).data(LayerPaletteModel::TypeRole).toString();
    }
    return types;
}

} // namespace

void TestUiModels::paletteHasEveryLayerGrouped()
{
    LayerPaletteModel model;
    QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::QtTest);
    QStringList groups;
    for (int g = 0; g < model.rowCount(); ++g)
        groups << model.index(g, 0).data(LayerPaletteModel::GroupRole).toString();
    QCOMPARE(groups, (QStringList{QStringLiteral("core"), QStringLiteral("convolution"), QStringLiteral("pooling"),
                                  QStringLiteral("normalisation"), QStringLiteral("activation"), QStringLiteral("merge")}));
    QCOMPARE(model.index(0, 0).data().toString(), QStringLiteral("Core"));
    QVERIFY(!model.index(0, 0).data(Qt::DecorationRole).value<QIcon>().isNull());

    const QStringList types = visibleTypes(model);
    QCOMPARE(types.size(), static_cast<int>(layerCatalogue().size()));
    for (const LayerKind& k : layerCatalogue()) {
        const QModelIndex i = model.indexOfType(QString::fromStdString(k.type));
        QVERIFY2(i.isValid(), k.type.c_str());
        QCOMPARE(i.data(LayerPaletteModel::DescriptionRole).toString(), QString::fromStdString(k.description));
        QCOMPARE(i.parent().data(LayerPaletteModel::GroupRole).toString(), QString::fromStdString(k.group));
        QVERIFY(i.data(Qt::ToolTipRole).toString().contains(QString::fromStdString(k.description).toHtmlEscaped()));
        QVERIFY(model.flags(i) & Qt::ItemIsDragEnabled);
    }
    QVERIFY(!(model.flags(model.index(0, 0)) & Qt::ItemIsDragEnabled));
}

void TestUiModels::paletteDragData()
{
    LayerPaletteModel model;
    const QModelIndex dense = model.indexOfType(QStringLiteral("Dense"));
    std::unique_ptr<QMimeData> mime(model.mimeData({dense}));
    QVERIFY(mime);
    QCOMPARE(QString::fromUtf8(mime->data(QLatin1String(DesignerView::kLayerMimeType))), QStringLiteral("Dense"));
    QVERIFY(model.mimeTypes().contains(QLatin1String(DesignerView::kLayerMimeType)));
    QVERIFY(!model.mimeData({model.index(0, 0)}));  // a group is not a layer
}

void TestUiModels::paletteSearch_data()
{
    QTest::addColumn<QString>("query");
    QTest::addColumn<QStringList>("expected");
    QTest::newRow("empty") << QString() << QStringList();  // everything
    QTest::newRow("type") << QStringLiteral("conv") << QStringList{QStringLiteral("Conv2D")};
    QTest::newRow("case") << QStringLiteral("DENSE") << QStringList{QStringLiteral("Dense")};
    QTest::newRow("group") << QStringLiteral("merge")
                           << QStringList{QStringLiteral("Add"), QStringLiteral("Concatenate")};
    QTest::newRow("description") << QStringLiteral("randomly") << QStringList{QStringLiteral("Dropout")};
    QTest::newRow("words") << QStringLiteral("pool mean")
                           << QStringList{QStringLiteral("AveragePooling2D"), QStringLiteral("GlobalAveragePooling2D")};
    QTest::newRow("none") << QStringLiteral("transformer") << QStringList{QStringLiteral("<none>")};
}

void TestUiModels::paletteSearch()
{
    QFETCH(QString, query);
    QFETCH(QStringList, expected);
    LayerPaletteModel model;
    LayerPaletteFilter filter;
    filter.setSourceModel(&model);
    QAbstractItemModelTester tester(&filter, QAbstractItemModelTester::FailureReportingMode::QtTest);
    filter.setQuery(query);
    const QStringList types = visibleTypes(filter);
    if (expected.isEmpty())
        QCOMPARE(types.size(), static_cast<int>(layerCatalogue().size()));
    else if (expected == QStringList{QStringLiteral("<none>")})
        QVERIFY(types.isEmpty());
    else
        QCOMPARE(types, expected);
    // Groups without a match are hidden.
    for (int g = 0; g < filter.rowCount(); ++g)
        QVERIFY(filter.rowCount(filter.index(g, 0)) > 0);
    if (!types.isEmpty())
        QCOMPARE(filter.firstMatch().data(LayerPaletteModel::TypeRole).toString(), types.front());
}

void TestUiModels::paletteWidgetTypingAndEnter()
{
    PaletteWidget palette;
    palette.resize(260, 600);
    palette.show();
    QVERIFY(QTest::qWaitForWindowExposed(&palette));
    QSignalSpy activated(&palette, &PaletteWidget::layerActivated);
    QTest::keyClicks(palette.searchField(), QStringLiteral("batchnorm"));
    QCOMPARE(visibleTypes(*palette.view()->model()), QStringList{QStringLiteral("BatchNormalization")});
    QTest::keyClick(palette.searchField(), Qt::Key_Return);
    QCOMPARE(activated.count(), 1);
    QCOMPARE(activated.at(0).at(0).toString(), QStringLiteral("BatchNormalization"));
    palette.searchField()->clear();
    QCOMPARE(visibleTypes(*palette.view()->model()).size(), static_cast<int>(layerCatalogue().size()));
    // Double-clicking a row adds that layer.
    const QRect r = palette.rectOfType(QStringLiteral("Flatten"));
    QVERIFY(!r.isEmpty());
    QTest::mouseClick(palette.view()->viewport(), Qt::LeftButton, {}, r.center());
    QTest::mouseDClick(palette.view()->viewport(), Qt::LeftButton, {}, r.center());
    QTRY_COMPARE(activated.count(), 2);
    QCOMPARE(activated.at(1).at(0).toString(), QStringLiteral("Flatten"));
}

void TestUiModels::problemsFollowTheDocument()
{
    ModelDocument doc;
    ProblemsModel problems(&doc);
    QAbstractItemModelTester tester(&problems, QAbstractItemModelTester::FailureReportingMode::QtTest);
    QCOMPARE(problems.rowCount(), 1);  // an empty model: "has no layers"
    QVERIFY(problems.index(0, 0).data(ProblemsModel::NodeIdRole).toString().isEmpty());

    Result<ModelSpec> seed = loadModelFile(uitest::sourcePath("resources/models/seed_mlp.json"));
    QVERIFY(seed.ok());
    doc.reset(seed.value());
    QCOMPARE(problems.rowCount(), 0);

    QVERIFY(doc.disconnectInput("dense", 0));
    QTRY_VERIFY(problems.rowCount() > 0);
    bool named = false;
    for (int r = 0; r < problems.rowCount(); ++r) {
        const QModelIndex i = problems.index(r, 0);
        named = named || i.data(ProblemsModel::NodeIdRole).toString() == QLatin1String("dense");
        QVERIFY(!i.data(ProblemsModel::MessageRole).toString().isEmpty());
        QVERIFY(!i.data(ProblemsModel::HintRole).toString().isEmpty());
        QVERIFY(i.data(Qt::ToolTipRole).toString().contains(QLatin1String("hint:")));
    }
    QVERIFY(named);

    QVERIFY(doc.setAttribute("input", "shape", nlohmann::json::array({28, 28, 1})));
    doc.undoStack()->undo();
    doc.undoStack()->undo();
    QTRY_COMPARE(problems.rowCount(), 0);

    // A shape error is flagged as one.
    QVERIFY(doc.setAttribute("input", "shape", nlohmann::json::array({28, 28, 1})));
    QTRY_COMPARE(problems.rowCount(), 1);
    QVERIFY(problems.index(0, 0).data(ProblemsModel::IsShapeErrorRole).toBool());
}

QTEST_MAIN(TestUiModels)
#include "tst_uimodels.moc"
