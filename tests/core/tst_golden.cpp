// Golden tests against PyTorch (tests/fixtures/golden, written by ../shared/bench/torch_golden.py
// in float64): 10 optimizer steps of small models on Fashion-MNIST batches; every step's loss
// within 1e-4 relative and the final weights within 1e-4 absolute, on every CPU backend.

#include <QtTest>

#include <fstream>

#include "data/dataset.h"
#include "io/npy.h"
#include "train/trainer.h"

using namespace ts;

class TestGolden : public QObject {
    Q_OBJECT
private slots:
    void initTestCase();
    void reproducesPytorch_data();
    void reproducesPytorch();

private:
    std::shared_ptr<IdxFolder> m_data;
};

namespace {

std::string fixture(const std::string& rel) { return std::string(TS_FIXTURES_DIR) + "/golden/" + rel; }

// meta.json's Keras-style layer list -> our spec (a chain).
ModelSpec specFromMeta(const nlohmann::json& meta)
{
    ModelSpec s;
    s.name = "golden";
    std::string prev;
    for (const auto& l : meta["model"]) {
        LayerSpec ls;
        ls.type = l["type"].get<std::string>();
        ls.id = l.value("name", std::string("input"));
        for (auto it = l.begin(); it != l.end(); ++it)
            if (it.key() != "type" && it.key() != "name") ls.attrs[it.key()] = it.value();
        if (!prev.empty()) ls.inputs = {prev};
        prev = ls.id;
        s.layers.push_back(ls);
    }
    s.compile.loss = "sparse_categorical_crossentropy";
    s.compile.fromLogits = true;
    s.compile.optimizer = meta["optimizer"];
    return s;
}

} // namespace

void TestGolden::initTestCase()
{
    auto d = loadIdxFolder(defaultFashionMnistDir(), true);
    if (!d.ok()) QSKIP(qPrintable(QString::fromStdString("Fashion-MNIST not available: " + d.error().toString())));
    m_data = std::make_shared<IdxFolder>(std::move(d).value());
}

void TestGolden::reproducesPytorch_data()
{
    QTest::addColumn<QString>("caseName");
    QTest::addColumn<QString>("backend");
    for (const char* be : {"reference", "cpu"})
        for (const char* c : {"mlp_adam", "mlp_sgd_momentum", "cnn_adam"})
            QTest::newRow((std::string(c) + "/" + be).c_str()) << QString(c) << QString(be);
}

void TestGolden::reproducesPytorch()
{
    QFETCH(QString, caseName);
    QFETCH(QString, backend);
    const std::string name = caseName.toStdString();
    std::ifstream in(fixture(name + "/meta.json"));
    QVERIFY2(in.good(), "missing golden fixture");
    const nlohmann::json meta = nlohmann::json::parse(in);
    const ModelSpec spec = specFromMeta(meta);
    TrainConfig tc;
    tc.strategy.backend = backend.toStdString();
    tc.strategy.threads = 2;
    auto trainer = Trainer::create(spec, tc);
    QVERIFY2(trainer.ok(), trainer.ok() ? "" : trainer.error().toString().c_str());
    Trainer& t = **trainer;
    QVERIFY(t.initialise().ok());
    std::vector<std::pair<std::string, Tensor>> init;
    for (const auto& p : meta["parameters"]) {
        auto arr = readNpy(fixture(name + "/init/" + p.get<std::string>() + ".npy"));
        QVERIFY2(arr.ok(), arr.ok() ? "" : arr.error().toString().c_str());
        init.emplace_back(p.get<std::string>(), *arr);
    }
    Status st = t.strategy().importParameters(init, "golden init");
    QVERIFY2(st.ok(), st.ok() ? "" : st.error().toString().c_str());

    const GraphAnalysis& g = t.graph();
    const Shape inShape = g.nodes[static_cast<std::size_t>(g.inputNodes[0])].outputShape;
    const int64_t per = inShape.numel();
    const auto& steps = meta["steps"];
    const auto& losses = meta["losses"];
    int64_t step = 0;
    for (const auto& idx : steps) {
        const int64_t n = static_cast<int64_t>(idx.size());
        std::vector<int64_t> dims = {n};
        for (int64_t d : inShape.dims()) dims.push_back(d);
        Batch b{Tensor::empty(Shape(dims)), Tensor::empty(Shape{n}, DType::I32)};
        for (int64_t i = 0; i < n; ++i) {
            const int64_t row = idx[static_cast<std::size_t>(i)].get<int64_t>();
            std::memcpy(b.x.data<float>() + i * per, m_data->train.x.data<float>() + row * per, static_cast<std::size_t>(per) * 4);
            b.y.data<int32_t>()[i] = m_data->train.y.data<int32_t>()[row];
        }
        auto r = t.strategy().trainStep(b, t.baseLearningRate(), step + 1, 0);
        QVERIFY2(r.ok(), r.ok() ? "" : r.error().toString().c_str());
        const double ours = r->lossSum / static_cast<double>(r->count);
        const double ref = losses[static_cast<std::size_t>(step)].get<double>();
        if (std::fabs(ours - ref) > 1e-4 * std::fabs(ref))
            QFAIL(qPrintable(QString("step %1: loss %2, PyTorch %3").arg(step + 1).arg(ours, 0, 'g', 10).arg(ref, 0, 'g', 10)));
        ++step;
    }
    auto finalParams = t.strategy().exportParameters();
    QVERIFY(finalParams.ok());
    for (const auto& [pname, tensor] : *finalParams) {
        auto ref = readNpy(fixture(name + "/final/" + pname + ".npy"));
        QVERIFY(ref.ok());
        QCOMPARE(ref->shape(), tensor.shape());
        const auto a = tensor.toVector(), b = ref->toVector();
        double worst = 0;
        for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, static_cast<double>(std::fabs(a[i] - b[i])));
        QVERIFY2(worst < 1e-4, qPrintable(QString("%1: max |diff| %2").arg(QString::fromStdString(pname)).arg(worst)));
    }
}

QTEST_APPLESS_MAIN(TestGolden)
#include "tst_golden.moc"
