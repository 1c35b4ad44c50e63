// Engine tests: layer gradients through the graph executor against central finite differences,
// Mirrored == OneDevice, determinism, trainer errors and cancellation.

#include <QtTest>

#include <thread>

#include "backend/registry.h"
#include "data/dataset.h"
#include "distribute/communicator.h"
#include "distribute/strategy.h"
#include "io/safetensors.h"
#include "nn/program.h"
#include "optim/precision.h"
#include "train/trainer.h"
#include "train_util.h"

using namespace ts;
using tstest::ModelBuilder;
using tstest::TensorSource;

Q_DECLARE_METATYPE(ts::ModelSpec)

class TestTraining : public QObject {
    Q_OBJECT
private slots:
    void gradients_data();
    void gradients();
    void mirroredEqualsOneDevice_data();
    void mirroredEqualsOneDevice();
    void deterministicGivenSeed();
    void lossDecreasesOnEveryBackend();
    void mixedPrecisionTrains_data();
    void mixedPrecisionTrains();
    void lossScaleSkipsAndHalvesOnOverflow();
    void lossScaleGrowsAfterFiniteSteps();
    void lossScaleIsBackedUp();
    void precisionConfigRoundTrips();
    void float32LayersStayFullPrecision_data();
    void float32LayersStayFullPrecision();
    void badBatchSizes();
    void modelOutputMustFitLabels();
    void classIdTargetsForOneOutput();
    void unknownStrategyAndDuplicateDevices();
    void cancelStopsPromptly();
    void weightsRoundTrip();
    void halfPrecisionWeightsWiden();
    void resumeEqualsContinuous_data();
    void resumeEqualsContinuous();
    void backupRefusesOtherSettingsAndDamagedFiles();
    void joinStepMatchesOneProcess();
};

namespace {

struct Labels {
    Tensor y;
};

// Classification head: Flatten (if needed) + Dense(classes).
ModelSpec gradCase(const std::string& name)
{
    ModelBuilder b(name);
    const nlohmann::json relu = {{"units", 6}, {"activation", "relu"}};
    auto head = [&](ModelBuilder& m, bool flatten) -> ModelBuilder& {
        if (flatten) m.layer("Flatten", "flat");
        return m.layer("Dense", "out", {{"units", 4}});
    };
    if (name == "dense_relu") return head(b.input({5}).layer("Dense", "d", relu), false).compile("sparse_categorical_crossentropy", true).spec();
    for (const char* act : {"tanh", "sigmoid", "gelu", "leaky_relu", "linear"})
        if (name == std::string("dense_") + act)
            return head(b.input({5}).layer("Dense", "d", {{"units", 6}, {"activation", act}}), false).compile("sparse_categorical_crossentropy", true).spec();
    if (name == "dense_softmax_folded")
        return b.input({5}).layer("Dense", "d", {{"units", 6}, {"activation", "tanh"}}).layer("Dense", "out", {{"units", 4}, {"activation", "softmax"}})
            .compile("sparse_categorical_crossentropy", false).spec();
    if (name == "softmax_layer_folded")
        return b.input({5}).layer("Dense", "d", {{"units", 4}}).layer("Softmax", "sm").compile("sparse_categorical_crossentropy", false).spec();
    if (name == "softmax_layer_mse")
        return b.input({5}).layer("Dense", "d", {{"units", 4}}).layer("Softmax", "sm").compile("mean_squared_error", false).spec();
    if (name == "categorical_ce")
        return b.input({5}).layer("Dense", "d", {{"units", 6}, {"activation", "tanh"}}).layer("Dense", "out", {{"units", 4}, {"activation", "softmax"}})
            .compile("categorical_crossentropy", false).spec();
    if (name == "binary_ce_sigmoid")
        return b.input({5}).layer("Dense", "d", {{"units", 6}, {"activation", "tanh"}}).layer("Dense", "out", {{"units", 4}, {"activation", "sigmoid"}})
            .compile("binary_crossentropy", false).spec();
    if (name == "binary_ce_logits")
        return b.input({5}).layer("Dense", "d", {{"units", 6}, {"activation", "tanh"}}).layer("Dense", "out", {{"units", 4}})
            .compile("binary_crossentropy", true).spec();
    if (name == "mse")
        return b.input({5}).layer("Dense", "d", {{"units", 6}, {"activation", "tanh"}}).layer("Dense", "out", {{"units", 4}})
            .compile("mean_squared_error", false).spec();
    if (name == "activation_layers")
        return head(b.input({5}).layer("Dense", "d", {{"units", 6}}).layer("ReLU", "r").layer("Dense", "d2", {{"units", 6}})
                        .layer("LeakyReLU", "lr", {{"alpha", 0.1}}).layer("Activation", "t", {{"activation", "tanh"}}), false)
            .compile("sparse_categorical_crossentropy", true).spec();
    b.input({6, 6, 2});
    const nlohmann::json conv = {{"filters", 3}, {"kernel_size", {3, 3}}, {"padding", "same"}, {"activation", "tanh"}};
    if (name == "conv_same") return head(b.layer("Conv2D", "c", conv), true).compile("sparse_categorical_crossentropy", true).spec();
    if (name == "conv_valid_stride2_relu")
        return head(b.layer("Conv2D", "c", {{"filters", 3}, {"kernel_size", {3, 2}}, {"strides", {2, 2}}, {"padding", "valid"}, {"activation", "relu"}}), true)
            .compile("sparse_categorical_crossentropy", true).spec();
    if (name == "conv_same_stride2_nobias")
        return head(b.layer("Conv2D", "c", {{"filters", 3}, {"kernel_size", {3, 3}}, {"strides", {2, 2}}, {"padding", "same"}, {"use_bias", false}}), true)
            .compile("sparse_categorical_crossentropy", true).spec();
    if (name == "maxpool") return head(b.layer("Conv2D", "c", conv).layer("MaxPooling2D", "p"), true).compile("sparse_categorical_crossentropy", true).spec();
    if (name == "avgpool_same")
        return head(b.layer("Conv2D", "c", conv).layer("AveragePooling2D", "p", {{"pool_size", {3, 3}}, {"strides", {2, 2}}, {"padding", "same"}}), true)
            .compile("sparse_categorical_crossentropy", true).spec();
    if (name == "global_avg_pool") return head(b.layer("Conv2D", "c", conv).layer("GlobalAveragePooling2D", "g"), false).compile("sparse_categorical_crossentropy", true).spec();
    if (name == "reshape")
        return head(b.layer("Conv2D", "c", conv).layer("Reshape", "r", {{"target_shape", {12, 9}}}), true).compile("sparse_categorical_crossentropy", true).spec();
    if (name == "dropout") return head(b.layer("Conv2D", "c", conv).layer("Dropout", "dr", {{"rate", 0.3}}), true).compile("sparse_categorical_crossentropy", true).spec();
    if (name == "batchnorm") return head(b.layer("Conv2D", "c", conv).layer("BatchNormalization", "bn"), true).compile("sparse_categorical_crossentropy", true).spec();
    if (name == "residual_add")
        return head(b.layer("Conv2D", "c", conv)
                        .layer("Conv2D", "c2", conv)
                        .layer("Add", "add", {}, {"c", "c2"})
                        .layer("ReLU", "r"), true)
            .compile("sparse_categorical_crossentropy", true).spec();
    if (name == "concatenate")
        return head(b.layer("Conv2D", "c", conv)
                        .layer("Conv2D", "c2", {{"filters", 2}, {"kernel_size", {1, 1}}, {"activation", "sigmoid"}})
                        .layer("Concatenate", "cat", {}, {"c", "c2"}), true)
            .compile("sparse_categorical_crossentropy", true).spec();
    qFatal("unknown gradient case %s", name.c_str());
}

Tensor targetsFor(const ModelSpec& spec, int64_t n, const GraphAnalysis& g)
{
    const int classes = static_cast<int>(g.nodes[static_cast<std::size_t>(g.outputNodes[0])].outputShape[0]);
    if (spec.compile.loss == "sparse_categorical_crossentropy") return tstest::randomLabels(n, classes, 99);
    Tensor t = Tensor::zeros(Shape{n, classes});
    std::mt19937 rng(5);
    for (int64_t i = 0; i < n; ++i) {
        if (spec.compile.loss == "categorical_crossentropy") t.data<float>()[i * classes + static_cast<int>(rng() % classes)] = 1.f;
        else
            for (int c = 0; c < classes; ++c) t.data<float>()[i * classes + c] = spec.compile.loss == "binary_crossentropy" ? static_cast<float>(rng() % 2) : static_cast<float>(rng() % 100) / 50.f - 1.f;
    }
    return t;
}

ModelSpec mlp(int64_t in = 20, int64_t hidden = 32, int64_t classes = 10, nlohmann::json opt = {{"type", "adam"}, {"learning_rate", 0.01}})
{
    return ModelBuilder("mlp")
        .input({in})
        .layer("Dense", "dense", {{"units", hidden}, {"activation", "relu"}})
        .layer("Dense", "dense_1", {{"units", classes}, {"activation", "softmax"}})
        .compile("sparse_categorical_crossentropy", false, opt)
        .spec();
}


// A learnable rule: 512 rows of 20 features, the class is the argmax of the first 4.
std::pair<Tensor, Tensor> argmaxRule()
{
    Tensor x = tstest::randomTensor(Shape{512, 20}, 4);
    Tensor y = Tensor::empty(Shape{512}, DType::I32);
    for (int i = 0; i < 512; ++i) {
        const float* r = x.data<float>() + i * 20;
        y.data<int32_t>()[i] = static_cast<int32_t>(std::max_element(r, r + 4) - r);
    }
    return {x, y};
}

std::vector<float> trainAndExport(const ModelSpec& spec, StrategyConfig sc, const Tensor& x, const Tensor& y, int64_t batch, int64_t steps)
{
    TrainConfig tc;
    tc.epochs = 100;
    tc.maxSteps = steps;
    tc.seed = 7;
    tc.strategy = std::move(sc);
    auto t = Trainer::create(spec, tc);
    if (!t.ok()) qFatal("%s", t.error().toString().c_str());
    if (!(*t)->initialise().ok()) qFatal("init failed");
    TensorSource src(x, y, batch);
    auto r = (*t)->fit(src, nullptr, nullptr);
    if (!r.ok()) qFatal("%s", r.error().toString().c_str());
    std::vector<float> out;
    auto params = (*t)->strategy().exportParameters();
    for (auto& [name, tensor] : *params)
        for (float v : tensor.toVector()) out.push_back(v);
    return out;
}

} // namespace

void TestTraining::gradients_data()
{
    QTest::addColumn<QString>("backendName");
    QTest::addColumn<QString>("caseName");
    const char* cases[] = {"dense_relu", "dense_tanh", "dense_sigmoid", "dense_gelu", "dense_leaky_relu", "dense_linear",
                           "dense_softmax_folded", "softmax_layer_folded", "softmax_layer_mse", "categorical_ce",
                           "binary_ce_sigmoid", "binary_ce_logits", "mse", "activation_layers", "conv_same",
                           "conv_valid_stride2_relu", "conv_same_stride2_nobias", "maxpool", "avgpool_same",
                           "global_avg_pool", "reshape", "dropout", "batchnorm", "residual_add", "concatenate"};
    for (const char* be : {"reference", "cpu"})
        for (const char* c : cases) QTest::newRow((std::string(be) + "/" + c).c_str()) << QString(be) << QString(c);
}

void TestTraining::gradients()
{
    QFETCH(QString, backendName);
    QFETCH(QString, caseName);
    const ModelSpec spec = gradCase(caseName.toStdString());
    auto graph = std::make_shared<GraphAnalysis>(analyzeModel(spec));
    QVERIFY2(graph->ok(), problemsToStatus(*graph, spec.name).ok() ? "" : problemsToStatus(*graph, spec.name).error().toString().c_str());
    auto be = BackendRegistry::instance().create(backendName.toStdString(), 0, BackendOptions{1});
    QVERIFY(be.ok());
    (*be)->bindThread();
    auto loss = parseLoss(spec.compile.loss, spec.compile.fromLogits);
    QVERIFY(loss.ok());
    auto prog = Program::create(graph, **be, *loss);
    QVERIFY2(prog.ok(), prog.ok() ? "" : prog.error().toString().c_str());
    Program& p = **prog;
    QVERIFY(p.initialiseParameters(3).ok());
    const int64_t n = 5;
    const Shape inShape = graph->nodes[static_cast<std::size_t>(graph->inputNodes[0])].outputShape;
    std::vector<int64_t> dims = {n};
    for (int64_t d : inShape.dims()) dims.push_back(d);
    const Tensor x = tstest::randomTensor(Shape(dims), 11);
    const Tensor y = targetsFor(spec, n, *graph);

    auto lossAt = [&]() -> double {
        float l = 0;
        if (!p.forward(x, true, 1234).ok()) qFatal("forward failed");
        if (!p.lossAndBackward(y, false, n, &l, nullptr).ok()) qFatal("loss failed");
        return l;
    };
    float l0 = 0;
    QVERIFY(p.forward(x, true, 1234).ok());
    Status st = p.lossAndBackward(y, true, n, &l0, nullptr);
    QVERIFY2(st.ok(), st.ok() ? "" : st.error().toString().c_str());
    QVERIFY(std::isfinite(l0));
    const Tensor grads = p.gradientArena().clone();
    Tensor params = p.trainableArena();
    float* pv = params.data<float>();
    const double eps = 2e-3;
    int checked = 0, kinks = 0;
    auto centralDifference = [&](int64_t i, double h) {
        const float orig = pv[i];
        pv[i] = static_cast<float>(orig + h);
        const double lp = lossAt();
        pv[i] = static_cast<float>(orig - h);
        const double lm = lossAt();
        pv[i] = orig;
        return (lp - lm) / (2 * h);
    };
    for (const ParamSlot& slot : p.params()) {
        if (!slot.spec.trainable) continue;
        const int64_t cnt = slot.spec.shape.numel();
        const int64_t stride = std::max<int64_t>(1, cnt / 10);
        for (int64_t k = 0; k < cnt; k += stride) {
            const int64_t i = slot.offset + k;
            const double fd = centralDifference(i, eps);
            const double fdHalf = centralDifference(i, eps / 2);
            const double tol = 2e-3 + 3e-2 * std::fabs(fdHalf);
            // Two step sizes that disagree mean a kink (relu, a max switching) inside the step:
            // finite differences say nothing there.
            if (std::fabs(fd - fdHalf) > tol / 2) {
                ++kinks;
                continue;
            }
            const double an = grads.data<float>()[i];
            if (std::fabs(fdHalf - an) > tol)
                QFAIL(qPrintable(QString("%1[%2]: analytic %3, finite difference %4").arg(QString::fromStdString(slot.name)).arg(k).arg(an).arg(fdHalf)));
            ++checked;
        }
    }
    QVERIFY2(kinks * 5 <= checked, qPrintable(QString("%1 of %2 checks hit kinks").arg(kinks).arg(checked + kinks)));
    QVERIFY(checked > 10);
}

void TestTraining::mirroredEqualsOneDevice_data()
{
    QTest::addColumn<int>("replicas");
    QTest::addColumn<int>("batch");
    QTest::addColumn<QString>("optimizer");
    QTest::newRow("2 replicas, adam, batch 32") << 2 << 32 << "adam";
    QTest::newRow("2 replicas, sgd+nesterov, odd batch 31") << 2 << 31 << "sgd";
    QTest::newRow("3 replicas, rmsprop, batch 30") << 3 << 30 << "rmsprop";
}

void TestTraining::mirroredEqualsOneDevice()
{
    QFETCH(int, replicas);
    QFETCH(int, batch);
    QFETCH(QString, optimizer);
    nlohmann::json opt = {{"type", optimizer.toStdString()}, {"learning_rate", 0.01}};
    if (optimizer == "sgd") opt = {{"type", "sgd"}, {"learning_rate", 0.05}, {"momentum", 0.9}, {"nesterov", true}};
    const ModelSpec spec = mlp(20, 32, 10, opt);
    const int64_t n = static_cast<int64_t>(batch) * 20;
    const Tensor x = tstest::randomTensor(Shape{n, 20}, 1);
    const Tensor y = tstest::randomLabels(n, 10, 2);
    StrategyConfig one;
    one.kind = "one-device";
    one.threads = 2;
    StrategyConfig mir;
    mir.kind = "mirrored";
    mir.threads = replicas;
    for (int r = 0; r < replicas; ++r) mir.devices.push_back(Device{DeviceKind::Cpu, r});
    const auto a = trainAndExport(spec, one, x, y, batch, 20);
    const auto b = trainAndExport(spec, mir, x, y, batch, 20);
    QCOMPARE(a.size(), b.size());
    double worst = 0;
    for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, static_cast<double>(std::fabs(a[i] - b[i])));
    QVERIFY2(worst < 1e-5, qPrintable(QString("max weight difference after 20 steps: %1").arg(worst)));
}

void TestTraining::deterministicGivenSeed()
{
    const ModelSpec spec = mlp();
    const Tensor x = tstest::randomTensor(Shape{256, 20}, 1);
    const Tensor y = tstest::randomLabels(256, 10, 2);
    StrategyConfig mir;
    mir.kind = "mirrored";
    mir.threads = 2;
    const auto a = trainAndExport(spec, mir, x, y, 32, 16);
    const auto b = trainAndExport(spec, mir, x, y, 32, 16);
    QVERIFY(a == b);  // bit-identical
}

void TestTraining::lossDecreasesOnEveryBackend()
{
    const ModelSpec spec = mlp(20, 32, 4, {{"type", "adam"}, {"learning_rate", 0.01}});
    const auto [x, y] = argmaxRule();
    for (const std::string be : {"reference", "cpu"}) {
        TrainConfig tc;
        tc.epochs = 15;
        tc.strategy.backend = be;
        auto t = Trainer::create(spec, tc);
        QVERIFY(t.ok());
        QVERIFY((*t)->initialise().ok());
        TensorSource src(x, y, 32);
        auto first = (*t)->evaluate(src);
        auto r = (*t)->fit(src, &src, nullptr);
        QVERIFY2(r.ok(), r.ok() ? "" : r.error().toString().c_str());
        QVERIFY2(r->last.valLoss < 0.5 * first->loss, qPrintable(QString("%1: loss %2 -> %3").arg(QString::fromStdString(be)).arg(first->loss).arg(r->last.valLoss)));
        QVERIFY(r->last.valAccuracy > 0.9);
    }
}

void TestTraining::mixedPrecisionTrains_data()
{
    QTest::addColumn<QString>("backend");
    QTest::addColumn<QString>("policy");
    for (const char* be : {"reference", "cpu"})
        for (const char* p : {"mixed_bfloat16", "mixed_float16"}) QTest::newRow((std::string(be) + " " + p).c_str()) << be << p;
}

void TestTraining::mixedPrecisionTrains()
{
    // The learnable rule of lossDecreasesOnEveryBackend, trained in 16-bit compute: it learns as
    // float32 does, and the weights do differ from float32's (the policy is not a no-op).
    QFETCH(QString, backend);
    QFETCH(QString, policy);
    const ModelSpec spec = mlp(20, 32, 4, {{"type", "adam"}, {"learning_rate", 0.01}});
    const auto [x, y] = argmaxRule();
    auto train = [&](PrecisionPolicy p, std::vector<float>* weights, std::vector<StepEvent>* steps) {
        struct Steps : TrainListener {
            std::vector<StepEvent>* out;
            void onStep(const StepEvent& e) override
            {
                if (out) out->push_back(e);
            }
        } listener;
        listener.out = steps;
        TrainConfig tc;
        tc.epochs = 15;
        tc.seed = 3;
        tc.strategy.backend = backend.toStdString();
        tc.strategy.precision.policy = p;
        auto t = Trainer::create(spec, tc);
        if (!t.ok()) qFatal("%s", t.error().toString().c_str());
        if (!(*t)->initialise().ok()) qFatal("init failed");
        TensorSource src(x, y, 32);
        auto r = (*t)->fit(src, &src, &listener);
        if (!r.ok()) qFatal("%s", r.error().toString().c_str());
        auto params = (*t)->strategy().exportParameters();
        if (!params.ok()) qFatal("%s", params.error().toString().c_str());
        for (auto& [name, tensor] : *params)
            for (float v : tensor.toVector()) weights->push_back(v);
        return r->last;
    };
    std::vector<float> w32, w16;
    std::vector<StepEvent> steps;
    const EpochEvent f32 = train(PrecisionPolicy::Float32, &w32, nullptr);
    const PrecisionPolicy p = policy == "mixed_float16" ? PrecisionPolicy::MixedFloat16 : PrecisionPolicy::MixedBfloat16;
    const EpochEvent mixed = train(p, &w16, &steps);
    QVERIFY2(mixed.valAccuracy > 0.9 && mixed.valAccuracy > f32.valAccuracy - 0.03,
             qPrintable(QString("accuracy %1 against float32's %2").arg(mixed.valAccuracy).arg(f32.valAccuracy)));
    QVERIFY2(std::abs(mixed.valLoss - f32.valLoss) < 0.1 * f32.valLoss + 0.02,
             qPrintable(QString("loss %1 against float32's %2").arg(mixed.valLoss).arg(f32.valLoss)));
    QCOMPARE(w16.size(), w32.size());
    QVERIFY(w16 != w32);
    // Variables stay float32: the weights are not all 16-bit values.
    const DType t = p == PrecisionPolicy::MixedFloat16 ? DType::F16 : DType::BF16;
    QVERIFY(std::any_of(w16.begin(), w16.end(), [&](float v) { return roundToDType(v, t) != v; }));
    // Loss scaling is reported under mixed_float16 only: Keras' 2^15 start, nothing skipped here.
    QVERIFY(!steps.empty());
    for (const StepEvent& e : steps) {
        QCOMPARE(e.lossScale, p == PrecisionPolicy::MixedFloat16 ? 32768.0 : 0.0);
        QCOMPARE(e.skippedSteps, int64_t(0));
    }
}

namespace {
Result<std::unique_ptr<Strategy>> scaledStrategy(const ModelSpec& spec, PrecisionConfig precision)
{
    GraphAnalysis graph = analyzeModel(spec);
    TS_TRY(problemsToStatus(graph, spec.name));
    StrategyConfig sc;
    sc.kind = "one-device";
    sc.threads = 1;
    sc.precision = precision;
    auto loss = parseLoss(spec.compile.loss, spec.compile.fromLogits);
    if (!loss.ok()) return loss.takeError();
    TS_ASSIGN(auto s, Strategy::create(sc, std::make_shared<const GraphAnalysis>(std::move(graph)), *loss, spec.compile.optimizer));
    TS_TRY(s->initialise(5));
    return s;
}

std::vector<float> flatParams(Strategy& s)
{
    std::vector<float> out;
    auto params = s.exportParameters();  // kept: a range-for over *temporary would dangle
    if (!params.ok()) qFatal("%s", params.error().toString().c_str());
    for (auto& [name, t] : *params)
        for (float v : t.toVector()) out.push_back(v);
    return out;
}
} // namespace

void TestTraining::lossScaleSkipsAndHalvesOnOverflow()
{
    // Injected overflow: a loss scale of 2^40 makes the scaled gradients overflow f16 in the
    // dense layers' backward pass. Each such step must leave the weights alone and halve the
    // scale, until the gradients fit; then steps apply again.
    const ModelSpec spec = mlp(20, 32, 10, {{"type", "sgd"}, {"learning_rate", 0.1}});
    PrecisionConfig pc;
    pc.policy = PrecisionPolicy::MixedFloat16;
    pc.initialScale = std::ldexp(1.0f, 40);
    auto s = scaledStrategy(spec, pc);
    QVERIFY2(s.ok(), s.ok() ? "" : s.error().toString().c_str());
    Strategy& st = **s;
    Batch batch;
    batch.x = tstest::randomTensor(Shape{32, 20}, 8);
    batch.y = tstest::randomLabels(32, 10, 9);
    float expectScale = pc.initialScale;
    int skipped = 0;
    for (int step = 1; step <= 45; ++step) {
        const std::vector<float> before = flatParams(st);
        auto r = st.trainStep(batch, 0.1f, step, 1);
        QVERIFY2(r.ok(), r.ok() ? "" : r.error().toString().c_str());
        QCOMPARE(r->lossScale, expectScale);
        QVERIFY(std::isfinite(r->lossSum));  // the loss itself is never scaled
        if (!r->skipped) {
            QVERIFY2(flatParams(st) != before, "a finite step must update the weights");
            break;
        }
        ++skipped;
        QCOMPARE(r->skippedSteps, int64_t(skipped));
        QVERIFY2(flatParams(st) == before, qPrintable(QString("skipped step %1 changed the weights").arg(step)));
        expectScale /= 2;
    }
    // f16's range ends at 2^16, and the gradients are far below 1 even for this batch: at least
    // 2^40 / 2^(16+something) must go, and the search ends well before the scale reaches 1.
    QVERIFY2(skipped >= 20 && skipped < 40, qPrintable(QString("%1 steps skipped").arg(skipped)));

    // Without loss scaling in f16, the same tiny gradients partly flush to zero: the scale is what
    // keeps them (the reason for mixed_float16's LossScaleOptimizer).
    QVERIFY(roundToDType(1e-8f, DType::F16) == 0.0f);
    QVERIFY(roundToDType(1e-8f * 32768.0f, DType::F16) != 0.0f);
}

void TestTraining::lossScaleGrowsAfterFiniteSteps()
{
    PrecisionConfig pc;
    pc.policy = PrecisionPolicy::MixedFloat16;
    pc.initialScale = 1024;
    pc.growthSteps = 3;
    LossScaler scaler(pc);
    QCOMPARE(scaler.scale(), 1024.0f);
    QVERIFY(scaler.update(true));
    QVERIFY(scaler.update(true));
    QCOMPARE(scaler.scale(), 1024.0f);
    QVERIFY(scaler.update(true));
    QCOMPARE(scaler.scale(), 2048.0f);  // doubled after 3 finite steps in a row
    QVERIFY(scaler.update(true));
    QVERIFY(!scaler.update(false));     // skipped: halve, and the run of finite steps restarts
    QCOMPARE(scaler.scale(), 1024.0f);
    QVERIFY(scaler.update(true));
    QVERIFY(scaler.update(true));
    QCOMPARE(scaler.scale(), 1024.0f);
    QVERIFY(scaler.update(true));
    QCOMPARE(scaler.scale(), 2048.0f);
    QCOMPARE(scaler.skippedSteps(), int64_t(1));
    // Never below 1; a fixed scale never moves but still skips non-finite steps.
    PrecisionConfig small = pc;
    small.initialScale = 2;
    LossScaler s2(small);
    for (int i = 0; i < 5; ++i) QVERIFY(!s2.update(false));
    QCOMPARE(s2.scale(), 1.0f);
    PrecisionConfig fixed = pc;
    fixed.dynamic = false;
    LossScaler s3(fixed);
    QVERIFY(!s3.update(false));
    for (int i = 0; i < 10; ++i) QVERIFY(s3.update(true));
    QCOMPARE(s3.scale(), 1024.0f);
    // Keras' defaults.
    const PrecisionConfig keras;
    QCOMPARE(keras.initialScale, 32768.0f);
    QCOMPARE(keras.growthSteps, int64_t(2000));
    QVERIFY(keras.dynamic);
}

void TestTraining::lossScaleIsBackedUp()
{
    const ModelSpec spec = mlp(20, 32, 10, {{"type", "adam"}, {"learning_rate", 0.01}});
    PrecisionConfig pc;
    pc.policy = PrecisionPolicy::MixedFloat16;
    pc.initialScale = std::ldexp(1.0f, 36);  // a few skipped steps first, so the state is not the start's
    auto a = scaledStrategy(spec, pc);
    QVERIFY(a.ok());
    Batch batch;
    batch.x = tstest::randomTensor(Shape{32, 20}, 8);
    batch.y = tstest::randomLabels(32, 10, 9);
    StepStats last;
    for (int step = 1; step <= 30; ++step) {
        auto r = (*a)->trainStep(batch, 0.01f, step, 1);
        QVERIFY(r.ok());
        last = *r;
    }
    QVERIFY(last.skippedSteps > 0);
    auto state = (*a)->exportOptimizerState();
    QVERIFY(state.ok());
    const auto it = std::find_if(state->begin(), state->end(), [](const auto& p) { return p.first == "loss_scale/state"; });
    QVERIFY(it != state->end());
    QCOMPARE(it->second.toVector()[2], float(last.skippedSteps));

    // A new strategy resumes with the same scale (the next step uses it, then goes on alike).
    auto b = scaledStrategy(spec, pc);
    QVERIFY(b.ok());
    QVERIFY((*b)->importParameters(*(*a)->exportParameters(), "a").ok());
    const Status imported = (*b)->importOptimizerState(*state, "backup");
    QVERIFY2(imported.ok(), imported.ok() ? "" : imported.error().toString().c_str());
    auto ra = (*a)->trainStep(batch, 0.01f, 31, 1);
    auto rb = (*b)->trainStep(batch, 0.01f, 31, 1);
    QVERIFY(ra.ok() && rb.ok());
    QCOMPARE(rb->lossScale, ra->lossScale);
    QCOMPARE(rb->skippedSteps, ra->skippedSteps);
    QVERIFY(flatParams(**a) == flatParams(**b));

    // A float32 run refuses a backup with a loss scale, and a mixed_float16 one needs it.
    auto f32 = scaledStrategy(spec, PrecisionConfig{});
    QVERIFY(f32.ok());
    const Status refused = (*f32)->importOptimizerState(*state, "backup.safetensors");
    QVERIFY(!refused.ok());
    QVERIFY2(QString::fromStdString(refused.error().message).contains("backup.safetensors holds a loss scale"), refused.error().message.c_str());
    std::vector<std::pair<std::string, Tensor>> without;
    for (const auto& p : *state)
        if (p.first != "loss_scale/state") without.push_back(p);
    const Status missing = (*b)->importOptimizerState(without, "old.safetensors");
    QVERIFY(!missing.ok());
    QVERIFY2(QString::fromStdString(missing.error().message).contains("no loss-scale state"), missing.error().message.c_str());
}

void TestTraining::float32LayersStayFullPrecision_data()
{
    QTest::addColumn<QString>("backend");
    for (const char* be : {"reference", "cpu"}) QTest::newRow(be) << be;
}

// Keras' dtype="float32" on a layer of a mixed model (attrs dtype): that layer computes in full
// precision. With every layer pinned the run is float32's exactly; with the output layer pinned
// it is neither float32's nor the all-16-bit run's.
void TestTraining::float32LayersStayFullPrecision()
{
    QFETCH(QString, backend);
    const auto [x, y] = argmaxRule();
    auto run = [&](PrecisionPolicy p, std::initializer_list<const char*> pinned) {
        ModelSpec spec = mlp(20, 32, 4);
        for (LayerSpec& l : spec.layers)
            for (const char* id : pinned)
                if (l.id == id) l.attrs["dtype"] = "float32";
        StrategyConfig sc;
        sc.backend = backend.toStdString();
        sc.precision.policy = p;
        return trainAndExport(spec, sc, x, y, 32, 20);
    };
    const std::vector<float> f32 = run(PrecisionPolicy::Float32, {});
    QCOMPARE(run(PrecisionPolicy::MixedBfloat16, {"dense", "dense_1"}), f32);
    QCOMPARE(run(PrecisionPolicy::MixedFloat16, {"dense", "dense_1"}), f32);  // the loss scale is a power of 2
    const std::vector<float> outputPinned = run(PrecisionPolicy::MixedBfloat16, {"dense_1"});
    const std::vector<float> all16 = run(PrecisionPolicy::MixedBfloat16, {});
    QVERIFY(outputPinned != f32);
    QVERIFY(outputPinned != all16);
    // The pin is per layer: after the pinned first layer the backend computes in the policy's
    // type again (left at float32, this run would be float32's).
    QVERIFY(run(PrecisionPolicy::MixedBfloat16, {"dense"}) != f32);
}

void TestTraining::precisionConfigRoundTrips()
{
    auto parse = [](const nlohmann::json& j) { return PrecisionConfig::fromJson(j, "run.json"); };
    QCOMPARE(int(parse("mixed_bfloat16")->policy), int(PrecisionPolicy::MixedBfloat16));
    QCOMPARE(int(parse(nullptr)->policy), int(PrecisionPolicy::Float32));
    QCOMPARE(int(parse("mixed_float16")->computeType()), int(DType::F16));
    QVERIFY(parse("mixed_float16")->scalesLoss());
    QVERIFY(!parse("mixed_bfloat16")->scalesLoss());
    auto custom = parse({{"policy", "mixed_float16"}, {"initial_scale", 1024}, {"growth_steps", 10}});
    QVERIFY(custom.ok());
    QCOMPARE(custom->initialScale, 1024.0f);
    QCOMPARE(custom->growthSteps, int64_t(10));
    auto again = parse(custom->toJson());
    QVERIFY(again.ok());
    QCOMPARE(again->initialScale, 1024.0f);
    QCOMPARE(again->growthSteps, int64_t(10));
    QVERIFY(again->dynamic);
    auto fixed = parse({{"policy", "mixed_float16"}, {"loss_scale", 128}});
    QVERIFY(fixed.ok() && !fixed->dynamic && fixed->initialScale == 128.0f);
    QVERIFY(!parse(fixed->toJson())->dynamic);
    QCOMPARE(parse("mixed_bfloat16")->toJson(), nlohmann::json("mixed_bfloat16"));
    // Errors name the key, the file and what to write.
    auto bad = [&](const nlohmann::json& j, const char* mention) {
        auto r = parse(j);
        if (r.ok()) return QString("accepted ") + QString::fromStdString(j.dump());
        const QString text = QString::fromStdString(r.error().toString());
        return text.contains(mention) && text.contains("run.json") ? QString() : text;
    };
    QCOMPARE(bad("float16", "mixed_float16"), QString());
    QCOMPARE(bad({{"policy", "mixed_float16"}, {"loss_scale", -1}}, "loss_scale is -1"), QString());
    QCOMPARE(bad({{"policy", "mixed_float16"}, {"loss_scale", "auto"}}, "dynamic"), QString());
    QCOMPARE(bad({{"policy", "mixed_float16"}, {"growth_steps", 0}}, "growth_steps"), QString());
    QCOMPARE(bad({{"policy", "mixed_float16"}, {"loss_scale", 8}, {"initial_scale", 8}}, "drop one"), QString());
    QCOMPARE(bad({{"policy", "mixed_float16"}, {"initial_scale", 1e39}}, "initial_scale is 1e+39, more than a float holds"), QString());
    QCOMPARE(bad({{"policy", "mixed_float16"}, {"loss_scale", 1e300}}, "loss_scale is 1e+300, more than a float holds"), QString());
    QCOMPARE(bad({{"polcy", "mixed_float16"}}, "polcy"), QString());
    QCOMPARE(bad(42, "policy name"), QString());
}

void TestTraining::badBatchSizes()
{
    InMemoryDataset ds;
    ds.x = tstest::randomTensor(Shape{10, 4}, 1);
    ds.y = tstest::randomLabels(10, 3, 1);
    ds.numClasses = 3;
    InMemoryBatchOptions o;
    o.batchSize = 0;
    auto r0 = InMemoryBatchSource::create(ds, o);
    QVERIFY(!r0.ok());
    QVERIFY(QString::fromStdString(r0.error().message).contains("batch size"));
    o.batchSize = 11;
    auto r1 = InMemoryBatchSource::create(ds, o);
    QVERIFY(!r1.ok());
    QVERIFY(QString::fromStdString(r1.error().message).contains("11"));
}

void TestTraining::modelOutputMustFitLabels()
{
    const ModelSpec spec = mlp(20, 8, 5);
    const GraphAnalysis g = analyzeModel(spec);
    auto loss = parseLoss("sparse_categorical_crossentropy", false);
    Status st = checkModelFitsLabels(g, *loss, 10, "data/");
    QVERIFY(!st.ok());
    QVERIFY(QString::fromStdString(st.error().message).contains("dense_1"));
    QVERIFY(QString::fromStdString(st.error().hint).contains("10"));
    QVERIFY(checkModelFitsLabels(g, *loss, 5, "data/").ok());
}

// Class ids (i32) for a loss that reads one value per output, on a one-output model, are the
// targets as floats (Keras casts y_true). Before, the kernels read the ids' bits as floats (about
// 4e-45 for 3) in release builds, and a regression on the ids trained towards 0.
void TestTraining::classIdTargetsForOneOutput()
{
    auto oneOutput = [](const char* loss, const char* activation) {
        return ModelBuilder("one")
            .input({2})
            .layer("Dense", "out", {{"units", 1}, {"activation", activation}})
            .compile(loss, false, {{"type", "sgd"}, {"learning_rate", 0.05}})
            .spec();
    };
    Tensor x = Tensor::empty(Shape{8, 2});
    for (int i = 0; i < 16; ++i) x.data<float>()[i] = (i % 3) * 0.5f;
    Tensor ids = Tensor::empty(Shape{8}, DType::I32);
    Tensor floats = Tensor::empty(Shape{8, 1});
    for (int i = 0; i < 8; ++i) {
        ids.data<int32_t>()[i] = i % 2;
        floats.data<float>()[i] = float(i % 2);
    }
    for (const std::string be : {"reference", "cpu"}) {
        // binary_crossentropy on ids equals it on the same values as floats, step for step.
        for (const char* loss : {"binary_crossentropy", "mean_squared_error"}) {
            const ModelSpec spec = oneOutput(loss, loss == std::string("binary_crossentropy") ? "sigmoid" : "linear");
            StrategyConfig sc;
            sc.backend = be;
            QCOMPARE(trainAndExport(spec, sc, x, ids, 4, 6), trainAndExport(spec, sc, x, floats, 4, 6));
        }
        // A regression on the ids reaches them: every label 3, prediction about 3.
        TrainConfig tc;
        tc.epochs = 200;
        tc.strategy.backend = be;
        auto t = Trainer::create(oneOutput("mean_squared_error", "linear"), tc);
        QVERIFY(t.ok() && (*t)->initialise().ok());
        Tensor threes = Tensor::empty(Shape{8}, DType::I32);
        Tensor threesF = Tensor::empty(Shape{8, 1});
        for (int i = 0; i < 8; ++i) {
            threes.data<int32_t>()[i] = 3;
            threesF.data<float>()[i] = 3.f;
        }
        TensorSource src(x, threes, 8), check(x, threesF, 8);  // validated against float targets
        auto r = (*t)->fit(src, &check, nullptr);
        QVERIFY2(r.ok(), r.ok() ? "" : r.error().toString().c_str());
        QVERIFY2(r->last.valLoss < 0.1, qPrintable(QString::number(r->last.valLoss)));  // towards 0 it would be 9
        // A regression has no accuracy (it reported 0.0000): NaN, which the CLI and store leave out.
        QVERIFY(std::isnan(r->last.accuracy) && std::isnan(r->last.valAccuracy));
    }
    // Targets a loss cannot read are refused by name, not read in the wrong dtype.
    auto refused = [&](const ModelSpec& spec, const Tensor& y, const char* mention) {
        TrainConfig tc;
        tc.epochs = 1;
        auto t = Trainer::create(spec, tc);
        if (!t.ok() || !(*t)->initialise().ok()) return QString("no trainer");
        TensorSource src(x, y, 8);
        auto r = (*t)->fit(src, nullptr, nullptr);
        if (r.ok()) return QString("trained");
        return QString::fromStdString(r.error().message).contains(mention) ? QString() : QString::fromStdString(r.error().toString());
    };
    const ModelSpec two = ModelBuilder("two").input({2}).layer("Dense", "out", {{"units", 2}, {"activation", "softmax"}})
                              .compile("categorical_crossentropy", false, {{"type", "sgd"}}).spec();
    QCOMPARE(refused(two, ids, "categorical_crossentropy needs one-hot label rows of 2, but the labels are class ids"), QString());
    const ModelSpec sparse = ModelBuilder("sparse").input({2}).layer("Dense", "out", {{"units", 2}, {"activation", "softmax"}})
                                 .compile("sparse_categorical_crossentropy", false, {{"type", "sgd"}}).spec();
    QCOMPARE(refused(sparse, floats, "sparse_categorical_crossentropy needs one class id per example, but the labels are f32 targets (8, 1)"),
             QString());
}

void TestTraining::unknownStrategyAndDuplicateDevices()
{
    TrainConfig tc;
    tc.strategy.kind = "tpu";
    auto t = Trainer::create(mlp(), tc);
    QVERIFY(!t.ok());
    QVERIFY(QString::fromStdString(t.error().message).contains("tpu"));
    tc.strategy.kind = "mirrored";
    tc.strategy.devices = {Device{DeviceKind::Cpu, 0}, Device{DeviceKind::Cpu, 0}};
    t = Trainer::create(mlp(), tc);
    QVERIFY(!t.ok());
    QVERIFY(QString::fromStdString(t.error().message).contains("cpu:0"));
    tc.strategy.devices = {Device{DeviceKind::Cuda, 0}};
    tc.strategy.kind = "one-device";
    t = Trainer::create(mlp(), tc);
    if (BackendRegistry::instance().preferred(DeviceKind::Cuda) == nullptr) {
        QVERIFY(!t.ok());
        QVERIFY(QString::fromStdString(t.error().message).contains("gpu:0"));
    }
    auto bad = Optimizer::create(nlohmann::json{{"type", "adam"}, {"learning_rte", 0.1}});
    QVERIFY(!bad.ok());
    QVERIFY(QString::fromStdString(bad.error().message).contains("learning_rte"));
    // Keras settings this engine does not implement: accepted at their defaults (as Keras writes
    // them), refused otherwise; they were dropped silently (clipnorm 1e-9 trained as plain Adam).
    const nlohmann::json kerasDefaults = {{"type", "adam"}, {"decay", 0.0}, {"clipnorm", nullptr}, {"clipvalue", nullptr},
                                          {"global_clipnorm", nullptr}, {"use_ema", false}, {"ema_momentum", 0.99},
                                          {"amsgrad", false}, {"gradient_accumulation_steps", nullptr}, {"jit_compile", true}};
    QVERIFY(Optimizer::create(kerasDefaults).ok());
    for (const auto& [key, value] : std::vector<std::pair<std::string, nlohmann::json>>{
             {"clipnorm", 1e-9}, {"clipvalue", 1.0}, {"global_clipnorm", 1.0}, {"decay", 0.9}, {"use_ema", true}, {"amsgrad", true},
             {"gradient_accumulation_steps", 4}, {"loss_scale_factor", 128}}) {
        nlohmann::json cfg = {{"type", "adam"}};
        cfg[key] = value;
        auto refused = Optimizer::create(cfg);
        QVERIFY2(!refused.ok(), key.c_str());
        QVERIFY2(refused.error().message.find(key + " = ") != std::string::npos && !refused.error().hint.empty(), refused.error().toString().c_str());
    }
    auto noEpsilon = Optimizer::create(nlohmann::json{{"type", "adam"}, {"epsilon", 0}});
    QVERIFY(!noEpsilon.ok());
    QVERIFY2(noEpsilon.error().message.find("'epsilon' = 0 is out of range") != std::string::npos, noEpsilon.error().message.c_str());
}

void TestTraining::cancelStopsPromptly()
{
    const Tensor x = tstest::randomTensor(Shape{4096, 20}, 1);
    const Tensor y = tstest::randomLabels(4096, 10, 2);
    TrainConfig tc;
    tc.epochs = 1000;
    tc.strategy.kind = "mirrored";
    tc.strategy.threads = 2;
    auto t = Trainer::create(mlp(), tc);
    QVERIFY(t.ok());
    QVERIFY((*t)->initialise().ok());
    TensorSource src(x, y, 8);
    src.slow = true;
    Trainer* trainer = t->get();
    std::thread stopper([trainer] {
        std::this_thread::sleep_for(std::chrono::milliseconds(150));
        trainer->cancel();
    });
    const auto t0 = std::chrono::steady_clock::now();
    auto r = trainer->fit(src, nullptr, nullptr);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    stopper.join();
    QVERIFY2(r.ok(), r.ok() ? "" : r.error().toString().c_str());
    QVERIFY(r->cancelled);
    QVERIFY(r->steps > 0);
    QVERIFY2(secs < 2.0, qPrintable(QString("fit took %1 s to stop").arg(secs)));
}

void TestTraining::weightsRoundTrip()
{
    QTemporaryDir dir;
    const std::string path = (dir.path() + "/w.safetensors").toStdString();
    TrainConfig tc;
    tc.seed = 1;
    auto a = Trainer::create(mlp(), tc);
    QVERIFY((*a)->initialise().ok());
    QVERIFY((*a)->saveWeights(path).ok());
    tc.seed = 2;
    auto b = Trainer::create(mlp(), tc);
    QVERIFY((*b)->initialise().ok());
    QVERIFY((*b)->loadWeights(path).ok());
    auto pa = (*a)->strategy().exportParameters();
    auto pb = (*b)->strategy().exportParameters();
    QCOMPARE(pa->size(), pb->size());
    QCOMPARE(pa->at(0).first, std::string("dense/kernel"));
    for (std::size_t i = 0; i < pa->size(); ++i) QCOMPARE(tstest::maxAbsDiff(pa->at(i).second, pb->at(i).second), 0.0);
    // A model with another shape refuses these weights, naming the tensor.
    auto c = Trainer::create(mlp(20, 16, 10), tc);
    QVERIFY((*c)->initialise().ok());
    Status st = (*c)->loadWeights(path);
    QVERIFY(!st.ok());
    QVERIFY(QString::fromStdString(st.error().message).contains("dense/kernel"));
}

// F16 and BF16 weights (saved for size, or by mixed-precision training) load as the exact f32
// values they stand for; integer weights are refused as such, not as "a different model".
void TestTraining::halfPrecisionWeightsWiden()
{
    auto bits = [](DType dt, std::vector<uint16_t> v) {
        Tensor t = Tensor::empty(Shape{int64_t(v.size())}, dt);
        std::memcpy(t.raw(), v.data(), v.size() * 2);
        return t;
    };
    auto f16 = bits(DType::F16, {0x3C00, 0xC000, 0x7BFF, 0x0001, 0x03FF, 0x7C00, 0x8000, 0x3555}).widenedToF32();
    QVERIFY(f16.ok());
    const std::vector<float> want{1.0f, -2.0f, 65504.0f, std::ldexp(1.0f, -24), std::ldexp(1023.0f, -24),
                                  std::numeric_limits<float>::infinity(), -0.0f, 0.333251953125f};
    QCOMPARE(f16->toVector(), want);
    QVERIFY(std::signbit(f16->toVector()[6]));
    QVERIFY(std::isnan(bits(DType::F16, {0x7E00}).widenedToF32()->toVector()[0]));
    QCOMPARE(bits(DType::BF16, {0x3F80, 0xC040}).widenedToF32()->toVector(), (std::vector<float>{1.0f, -3.0f}));

    QTemporaryDir dir;
    TrainConfig tc;
    tc.seed = 1;
    auto a = Trainer::create(mlp(), tc);
    QVERIFY((*a)->initialise().ok());
    auto pa = (*a)->strategy().exportParameters();
    QVERIFY(pa.ok());
    std::vector<std::pair<std::string, Tensor>> half;
    std::vector<std::vector<float>> expected;
    for (const auto& [name, t] : *pa) {
        Tensor h = Tensor::empty(t.shape(), DType::BF16);
        std::vector<float> e(static_cast<std::size_t>(t.numel()));
        for (int64_t i = 0; i < t.numel(); ++i) {
            uint32_t b;
            std::memcpy(&b, t.data<float>() + i, 4);
            h.data<uint16_t>()[i] = static_cast<uint16_t>(b >> 16);  // truncate: exactly representable
            b &= 0xffff0000u;
            std::memcpy(&e[static_cast<std::size_t>(i)], &b, 4);
        }
        half.emplace_back(name, h);
        expected.push_back(std::move(e));
    }
    const std::string path = (dir.path() + "/bf16.safetensors").toStdString();
    QVERIFY(writeSafetensors(path, half, {}).ok());
    tc.seed = 2;
    auto b = Trainer::create(mlp(), tc);
    QVERIFY((*b)->initialise().ok());
    Status loaded = (*b)->loadWeights(path);
    QVERIFY2(loaded.ok(), loaded.ok() ? "" : loaded.error().toString().c_str());
    auto pb = (*b)->strategy().exportParameters();
    for (std::size_t i = 0; i < pb->size(); ++i) QCOMPARE(pb->at(i).second.toVector(), expected[i]);

    // Integer tensors of the right shape: named as the wrong kind of values.
    std::vector<std::pair<std::string, Tensor>> ints;
    for (const auto& [name, t] : *pa) ints.emplace_back(name, Tensor::zeros(t.shape(), DType::I32));
    const std::string intPath = (dir.path() + "/i32.safetensors").toStdString();
    QVERIFY(writeSafetensors(intPath, ints, {}).ok());
    Status st = (*b)->loadWeights(intPath);
    QVERIFY(!st.ok());
    QVERIFY2(QString::fromStdString(st.error().message).contains("i32 values"), st.error().message.c_str());

    // Weights that are not finite (saved from a diverged run) are refused, naming tensor and index;
    // the scan sees the exponent bits of every floating dtype and passes integers.
    QCOMPARE(bits(DType::F16, {0x3C00, 0x7BFF, 0xFC00}).firstNonFinite(), int64_t(2));
    QCOMPARE(bits(DType::BF16, {0x7F7F, 0x7FC0}).firstNonFinite(), int64_t(1));
    QCOMPARE(bits(DType::F16, {0x3C00, 0x7BFF}).firstNonFinite(), int64_t(-1));
    Tensor far = Tensor::zeros(Shape{10000});
    QCOMPARE(far.firstNonFinite(), int64_t(-1));
    far.data<float>()[9001] = std::numeric_limits<float>::infinity();
    QCOMPARE(far.firstNonFinite(), int64_t(9001));
    QCOMPARE(std::string(nonFiniteName(far.floatAt(9001))), std::string("inf"));
    QCOMPARE(Tensor::zeros(Shape{3}, DType::I32).firstNonFinite(), int64_t(-1));
    std::vector<std::pair<std::string, Tensor>> diverged;
    for (const auto& [name, t] : *pa) diverged.emplace_back(name, t.clone());
    diverged.back().second.data<float>()[3] = std::nanf("");
    const std::string nanPath = (dir.path() + "/nan.safetensors").toStdString();
    QVERIFY(writeSafetensors(nanPath, diverged, {}).ok());
    st = (*b)->loadWeights(nanPath);
    QVERIFY(!st.ok());
    const std::string named = "tensor '" + diverged.back().first + "' holds NaN at index 3 of ";
    QVERIFY2(QString::fromStdString(st.error().message).contains(QString::fromStdString(named)), st.error().message.c_str());
    QVERIFY2(QString::fromStdString(st.error().hint).contains("diverged"), st.error().hint.c_str());
}

namespace {

// Cancels the run right after global step `at` (a crash between backups, without killing the test).
class CancelAt final : public TrainListener {
public:
    CancelAt(Trainer*& trainer, int64_t at) : m_trainer(trainer), m_at(at) {}
    void onStep(const StepEvent& e) override
    {
        if (e.step == m_at) m_trainer->cancel();
    }
    void onEpoch(const EpochEvent& e) override
    {
        last = e;
        epochs.push_back(e);
    }
    void onResume(const TrainingPosition& p, const ResumeSource&) override { resumedAt = p; }
    EpochEvent last;
    std::vector<EpochEvent> epochs;
    std::optional<TrainingPosition> resumedAt;

private:
    Trainer*& m_trainer;
    int64_t m_at;
};

struct BackupRun {
    Result<FitResult> fit = makeError(ErrorCode::Internal, "not run");
    std::vector<float> weights;
    EpochEvent last;
    std::vector<EpochEvent> epochs;
    std::optional<TrainingPosition> resumedAt;
};

// One fit() of a 3-epoch run with dropout over shuffled data (a fresh Trainer and source, as a
// restarted process would have), cancelled after step `cancelAt` (0: never).
BackupRun runWithBackup(const StrategyConfig& sc, const nlohmann::json& opt, const BackupConfig& backup, int64_t cancelAt)
{
    const ModelSpec spec = ModelBuilder("dropout-mlp")
                               .input({20})
                               .layer("Dense", "dense", {{"units", 32}, {"activation", "relu"}})
                               .layer("Dropout", "dropout", {{"rate", 0.3}})
                               .layer("Dense", "dense_1", {{"units", 10}, {"activation", "softmax"}})
                               .compile("sparse_categorical_crossentropy", false, opt)
                               .spec();
    InMemoryDataset data;
    data.x = tstest::randomTensor(Shape{300, 20}, 11);
    data.y = tstest::randomLabels(300, 10, 12);
    data.numClasses = 10;
    InMemoryBatchOptions bo;
    bo.batchSize = 32;  // 10 batches per epoch, the last one short
    bo.seed = 5;
    auto src = InMemoryBatchSource::create(data, bo);
    if (!src.ok()) qFatal("%s", src.error().toString().c_str());
    TrainConfig tc;
    tc.epochs = 3;
    tc.seed = 9;
    tc.strategy = sc;
    tc.backup = backup;
    tc.backupFingerprint = {{"model", "dropout-mlp"}, {"optimizer", opt}};
    BackupRun out;
    auto t = Trainer::create(spec, tc);
    if (!t.ok()) {
        out.fit = t.takeError();
        return out;
    }
    if (!(*t)->initialise().ok()) qFatal("init failed");
    Trainer* trainer = t->get();
    CancelAt listener(trainer, cancelAt);
    out.fit = trainer->fit(**src, nullptr, &listener);
    auto params = trainer->strategy().exportParameters();
    for (auto& [name, tensor] : *params)
        for (float v : tensor.toVector()) out.weights.push_back(v);
    out.last = listener.last;
    out.epochs = listener.epochs;
    out.resumedAt = listener.resumedAt;
    return out;
}

} // namespace

void TestTraining::resumeEqualsContinuous_data()
{
    QTest::addColumn<QString>("strategy");
    QTest::addColumn<QString>("optimizer");
    QTest::addColumn<int>("everySteps");
    QTest::addColumn<int>("cancelAt");
    QTest::addColumn<int>("resumeStep");
    // Every 7 steps, stopped after 17: resumes after step 14, mid-epoch 2 (steps 11..20).
    QTest::newRow("one-device, adam, every 7 steps") << "one-device" << "adam" << 7 << 17 << 14;
    QTest::newRow("mirrored x2, sgd+momentum, every 7 steps") << "mirrored" << "sgd" << 7 << 17 << 14;
    QTest::newRow("mirrored x2, rmsprop, every epoch") << "mirrored" << "rmsprop" << 0 << 25 << 20;
}

void TestTraining::resumeEqualsContinuous()
{
    QFETCH(QString, strategy);
    QFETCH(QString, optimizer);
    QFETCH(int, everySteps);
    QFETCH(int, cancelAt);
    QFETCH(int, resumeStep);
    nlohmann::json opt = {{"type", optimizer.toStdString()}, {"learning_rate", 0.01}};
    if (optimizer == "sgd") opt = {{"type", "sgd"}, {"learning_rate", 0.05}, {"momentum", 0.9}};
    StrategyConfig sc;
    sc.kind = strategy.toStdString();
    sc.threads = 2;
    if (sc.kind == "mirrored") sc.devices = {Device{DeviceKind::Cpu, 0}, Device{DeviceKind::Cpu, 1}};
    QTemporaryDir dir;
    BackupConfig backup;
    backup.dir = (dir.path() + "/backup").toStdString();
    backup.everySteps = everySteps;

    const BackupRun continuous = runWithBackup(sc, opt, BackupConfig{}, 0);
    QVERIFY2(continuous.fit.ok(), continuous.fit.ok() ? "" : continuous.fit.error().toString().c_str());
    QCOMPARE(continuous.fit->steps, int64_t{30});

    const BackupRun interrupted = runWithBackup(sc, opt, backup, cancelAt);
    QVERIFY2(interrupted.fit.ok(), interrupted.fit.ok() ? "" : interrupted.fit.error().toString().c_str());
    QVERIFY(interrupted.fit->cancelled);
    QCOMPARE(interrupted.fit->steps, int64_t{cancelAt});
    QVERIFY(QFile::exists(QString::fromStdString(backupPath(backup.dir))));
    QVERIFY(interrupted.weights != continuous.weights);

    const BackupRun resumed = runWithBackup(sc, opt, backup, 0);
    QVERIFY2(resumed.fit.ok(), resumed.fit.ok() ? "" : resumed.fit.error().toString().c_str());
    QVERIFY(resumed.resumedAt.has_value());
    QCOMPARE(resumed.fit->resumedFromStep, int64_t{resumeStep});
    QCOMPARE(resumed.resumedAt->step, int64_t{resumeStep});
    QCOMPARE(resumed.fit->steps, int64_t{30});
    QCOMPARE(resumed.fit->epochs, int64_t{3});
    // Bit-for-bit: the weights, and the last epoch's metrics (its running totals were restored).
    QCOMPARE(resumed.weights.size(), continuous.weights.size());
    QVERIFY2(resumed.weights == continuous.weights, "the resumed run's weights differ from the uninterrupted run's");
    QCOMPARE(resumed.last.loss, continuous.last.loss);
    QCOMPARE(resumed.last.accuracy, continuous.last.accuracy);
    QCOMPARE(resumed.last.steps, int64_t{10});
    // The epoch resumed mid-way counts all its steps, but this process ran only those after the
    // resume: a loss scale that skipped every one of them is said as such.
    const int64_t resumedEpoch = resumeStep / 10 + 1, after = resumedEpoch * 10 - resumeStep;
    QCOMPARE(resumed.epochs.front().epoch, resumedEpoch);
    QCOMPARE(resumed.epochs.front().steps, int64_t{10});
    QCOMPARE(resumed.epochs.front().stepsRun, after);
    QCOMPARE(resumed.epochs.back().stepsRun, int64_t{10});
    QVERIFY(!allStepsSkipped(resumed.epochs.front()));
    EpochEvent flat = resumed.epochs.front();
    flat.skippedSteps = flat.stepsRun;
    flat.lossScale = 1e30;
    const auto said = allStepsSkipped(flat);
    QVERIFY(said.has_value());
    QCOMPARE(QString::fromStdString(said->message),
             QString("epoch %1: all %2 steps%3 were skipped (their float16 gradients overflowed at loss scale 1e+30), "
                     "so the weights did not change").arg(resumedEpoch).arg(after).arg(after < 10 ? " since the resume" : ""));
    // A completed run deletes its backup: the next run with this folder starts from the beginning.
    QVERIFY(!QFile::exists(QString::fromStdString(backupPath(backup.dir))));
}

void TestTraining::backupRefusesOtherSettingsAndDamagedFiles()
{
    const nlohmann::json adam = {{"type", "adam"}, {"learning_rate", 0.01}};
    StrategyConfig sc;
    sc.threads = 2;
    QTemporaryDir dir;
    BackupConfig backup;
    backup.dir = (dir.path() + "/backup").toStdString();
    backup.everySteps = 5;
    const BackupRun interrupted = runWithBackup(sc, adam, backup, 6);
    QVERIFY(interrupted.fit.ok() && interrupted.fit->cancelled);
    const QString file = QString::fromStdString(backupPath(backup.dir));
    QVERIFY(QFile::exists(file));

    // Another optimizer setting: refused, naming the file and the setting; the backup is kept.
    const BackupRun other = runWithBackup(sc, {{"type", "adam"}, {"learning_rate", 0.02}}, backup, 0);
    QVERIFY(!other.fit.ok());
    const QString msg = QString::fromStdString(other.fit.error().toString());
    QVERIFY2(msg.contains(file) && msg.contains("optimizer") && msg.contains("delete the backup"), qPrintable(msg));
    QVERIFY(QFile::exists(file));

    // Parameter-server runs cannot back up (their optimizer state is on the ps tasks).
    StrategyConfig ps;
    ps.kind = "parameter-server";
    const BackupRun psRun = runWithBackup(ps, adam, backup, 0);
    QVERIFY(!psRun.fit.ok());
    QVERIFY2(psRun.fit.error().message.find("parameter-server") != std::string::npos, psRun.fit.error().toString().c_str());

    // Bytes flipped inside the tensor data (the header still parses): the checksum refuses it
    // rather than resuming from garbage weights; the file is kept.
    {
        QFile f(file);
        QVERIFY(f.open(QIODevice::ReadWrite));
        QVERIFY(f.seek(f.size() - 64));
        QVERIFY(f.write(QByteArray(16, '\xff')) == 16);
    }
    const BackupRun flipped = runWithBackup(sc, adam, backup, 0);
    QVERIFY(!flipped.fit.ok());
    const QString flippedMsg = QString::fromStdString(flipped.fit.error().toString());
    QVERIFY2(flippedMsg.contains(file) && flippedMsg.contains("damaged") && flippedMsg.contains("checksum") &&
                 flippedMsg.contains("start the run from the beginning"),
             qPrintable(flippedMsg));
    QVERIFY(QFile::exists(file));

    // A truncated backup: a clear error naming it, not a crash.
    {
        QFile f(file);
        QVERIFY(f.open(QIODevice::ReadWrite));
        QVERIFY(f.resize(f.size() / 2));
    }
    const BackupRun damaged = runWithBackup(sc, adam, backup, 0);
    QVERIFY(!damaged.fit.ok());
    const QString damagedMsg = QString::fromStdString(damaged.fit.error().toString());
    QVERIFY2(damagedMsg.contains(file) && damagedMsg.contains("the backup is damaged") && damagedMsg.contains("delete it"),
             qPrintable(damagedMsg));

    // A folder that cannot be created.
    QFile blocker(dir.path() + "/file");
    QVERIFY(blocker.open(QIODevice::WriteOnly));
    blocker.close();
    BackupConfig bad = backup;
    bad.dir = (dir.path() + "/file/backup").toStdString();
    const BackupRun unwritable = runWithBackup(sc, adam, bad, 0);
    QVERIFY(!unwritable.fit.ok());
    QVERIFY2(unwritable.fit.error().message.find("cannot create the backup folder") != std::string::npos,
             unwritable.fit.error().toString().c_str());
}

// Multi-worker ranks as threads, one step on local-shard batches (auto-sharded input): rank 0's
// shard has run out (an empty batch), rank 1 brings 4 rows of a nominal 8. The gradient becomes
// the mean over the 4 rows and the batch-norm moving statistics come from rank 1 alone, so both
// ranks hold what one process stepping on those 4 rows holds. A step without rows anywhere then
// applies nothing (SGD with momentum would still move the weights) and counts no rows.
void TestTraining::joinStepMatchesOneProcess()
{
    const ModelSpec spec = ModelBuilder("bn")
                               .input({5})
                               .layer("Dense", "d", {{"units", 6}})
                               .layer("BatchNormalization", "bn")
                               .layer("Dense", "out", {{"units", 3}, {"activation", "softmax"}})
                               .compile("sparse_categorical_crossentropy", false, {{"type", "sgd"}, {"learning_rate", 0.1}, {"momentum", 0.9}})
                               .spec();
    Batch rows;
    rows.x = tstest::randomTensor(Shape{4, 5}, 11);
    rows.y = tstest::randomLabels(4, 3, 12);
    auto exportAll = [](Trainer& t) {
        std::vector<float> out;
        auto params = t.strategy().exportParameters();
        if (params.ok())
            for (auto& [name, tensor] : *params)
                for (float v : tensor.toVector()) out.push_back(v);
        return out;
    };
    TrainConfig tc;
    tc.seed = 7;
    auto one = Trainer::create(spec, tc);
    QVERIFY(one.ok());
    QVERIFY((*one)->initialise().ok());
    const std::vector<float> before = exportAll(**one);
    auto oneStep = (*one)->strategy().trainStep(rows, 0.1f, 1, 99);
    QVERIFY(oneStep.ok());
    const std::vector<float> expected = exportAll(**one);

    std::shared_ptr<Communicator> comm = makeLocalCommunicator(2);
    struct RankResult {
        std::string error;
        int64_t count = -1, emptyCount = -1;
        std::vector<float> after, afterEmpty;
    };
    RankResult results[2];
    auto rank = [&](int r) {
        RankResult& out = results[r];
        TrainConfig rc = tc;
        rc.strategy.kind = "multi-worker-mirrored";
        rc.strategy.crossProcess = comm;
        rc.strategy.processRank = r;
        auto t = Trainer::create(spec, rc);
        if (!t.ok()) { out.error = t.error().toString(); comm->abort(makeError(ErrorCode::Internal, out.error)); return; }
        if (Status st = (*t)->initialise(); !st.ok()) { out.error = st.error().toString(); comm->abort(makeError(ErrorCode::Internal, out.error)); return; }
        Batch mine;
        if (r == 1) mine = rows;
        mine.localShard = true;
        mine.globalRows = 8;
        auto st = (*t)->strategy().trainStep(mine, 0.1f, 1, 99);
        if (!st.ok()) { out.error = st.error().toString(); comm->abort(makeError(ErrorCode::Internal, out.error)); return; }
        out.count = st->count;
        out.after = exportAll(**t);
        Batch none;
        none.localShard = true;
        none.globalRows = 8;
        auto empty = (*t)->strategy().trainStep(none, 0.1f, 2, 100);
        if (!empty.ok()) { out.error = empty.error().toString(); comm->abort(makeError(ErrorCode::Internal, out.error)); return; }
        out.emptyCount = empty->count;
        out.afterEmpty = exportAll(**t);
    };
    std::thread other(rank, 1);
    rank(0);
    other.join();
    for (const RankResult& r : results) {
        QVERIFY2(r.error.empty(), r.error.c_str());
        QCOMPARE(r.count, int64_t(4));
        QCOMPARE(r.emptyCount, int64_t(0));
        QCOMPARE(r.after.size(), expected.size());
        double worst = 0, moved = 0;
        for (std::size_t i = 0; i < expected.size(); ++i) {
            worst = std::max(worst, std::fabs(double(r.after[i]) - double(expected[i])));
            moved = std::max(moved, std::fabs(double(expected[i]) - double(before[i])));
        }
        QVERIFY2(worst <= 1e-6, qPrintable(QString("differs from one process by %1").arg(worst)));
        QVERIFY(moved > 1e-3);  // the step did change the weights and statistics
        QCOMPARE(r.afterEmpty, r.after);
    }
}

QTEST_APPLESS_MAIN(TestTraining)
#include "tst_training.moc"
