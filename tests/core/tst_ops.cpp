// Every backend against the reference, op by op, and the reference's backward ops against
// finite differences. Part 1 iterates the registry (cpu today; cuda when its plugin loads), so a
// new backend is covered without editing this file. Part 2 pins the reference itself: central
// differences for every backward op, plus hand-computed values for the semantics that gradients
// cannot see (tie-breaking, running statistics, optimizer formulas, loss scaling).

#include <QtTest>

#include <cmath>
#include <cstring>
#include <immintrin.h>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/reference/reference_backend.h"
#include "backend/registry.h"
#include "train_util.h"

using namespace ts;

Q_DECLARE_METATYPE(ts::Shape)

namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();

uint64_t fnv1a(const std::string& s)
{
    uint64_t h = 1469598103934665603ull;
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
    return h;
}

// Deterministic per test row, so a failure reproduces.
std::mt19937 rngFor(const std::string& tag) { return std::mt19937(static_cast<uint32_t>(fnv1a(tag))); }

Tensor randomTensor(Shape shape, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f)
{
    Tensor t = Tensor::empty(std::move(shape));
    std::uniform_real_distribution<float> u(lo, hi);
    float* p = t.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = u(rng);
    return t;
}

Tensor filled(Shape shape, float v)
{
    Tensor t = Tensor::empty(std::move(shape));
    t.fill(v);
    return t;
}

// Values spread evenly over (-1, 1) in random order (at least 0.005 apart for <= 400 elements): max pooling's argmax and relu's kinks stay put under
// a finite-difference step of 1e-3.
Tensor distinctTensor(Shape shape, std::mt19937& rng)
{
    Tensor t = Tensor::empty(std::move(shape));
    std::vector<float> v(static_cast<std::size_t>(t.numel()));
    const double spacing = 2.0 / double(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = float(-1.0 + (double(i) + 0.5) * spacing);
    std::shuffle(v.begin(), v.end(), rng);
    std::memcpy(t.raw(), v.data(), v.size() * sizeof(float));
    return t;
}

std::string fmt(double v) { return QString::number(v, 'g', 9).toStdString(); }

// Empty when every element matches: |a - e| <= atol + rtol * |e| (NaN only matches NaN).
std::string compare(const Tensor& actual, const Tensor& expected, double rtol, double atol, const std::string& what)
{
    if (actual.shape() != expected.shape() || actual.dtype() != expected.dtype())
        return what + ": shape/dtype differ " + actual.shape().toString() + " vs " + expected.shape().toString();
    int64_t bad = 0, first = -1;
    double worst = 0;
    for (int64_t i = 0; i < actual.numel(); ++i) {
        double a, e;
        switch (actual.dtype()) {
        case DType::F32: a = actual.data<float>()[i]; e = expected.data<float>()[i]; break;
        case DType::I32: a = actual.data<int32_t>()[i]; e = expected.data<int32_t>()[i]; break;
        case DType::U8: a = actual.data<uint8_t>()[i]; e = expected.data<uint8_t>()[i]; break;
        default: return what + ": unsupported dtype in compare";
        }
        bool ok;
        if (std::isnan(e) || std::isnan(a)) ok = std::isnan(e) && std::isnan(a);
        else ok = std::abs(a - e) <= atol + rtol * std::abs(e);
        if (!ok) {
            if (first < 0) first = i;
            ++bad;
            if (!std::isnan(a) && !std::isnan(e)) worst = std::max(worst, std::abs(a - e));
        }
    }
    if (bad == 0) return {};
    auto val = [](const Tensor& t, int64_t i) {
        if (t.dtype() == DType::F32) return fmt(t.data<float>()[i]);
        if (t.dtype() == DType::I32) return std::to_string(t.data<int32_t>()[i]);
        return std::to_string(int(t.data<uint8_t>()[i]));
    };
    return what + ": " + std::to_string(bad) + " of " + std::to_string(actual.numel()) +
           " elements differ; first at flat index " + std::to_string(first) + ": got " + val(actual, first) +
           ", expected " + val(expected, first) + "; max abs error " + fmt(worst);
}

std::string compareScalar(double a, double e, double rtol, double atol, const std::string& what)
{
    if (std::abs(a - e) <= atol + rtol * std::abs(e)) return {};
    return what + ": got " + fmt(a) + ", expected " + fmt(e);
}

// ------------------------------------------------------------------ device helpers

// A tensor on backend `be` holding `host`'s values (copyFromHost, so device backends are covered).
Tensor upload(Backend& be, const Tensor& host)
{
    auto r = Tensor::create(host.shape(), host.dtype(), be.allocator());
    if (!r.ok()) qFatal("upload: %s", r.error().toString().c_str());
    Tensor t = std::move(r).value();
    Status st = be.copyFromHost(host.raw(), t);
    if (!st.ok()) qFatal("copyFromHost: %s", st.error().toString().c_str());
    return t;
}

Tensor download(Backend& be, const Tensor& dev)
{
    Tensor h = Tensor::empty(dev.shape(), dev.dtype());
    Status st = be.synchronize();
    if (st.ok()) st = be.copyToHost(dev, h.raw());
    if (!st.ok()) qFatal("copyToHost: %s", st.error().toString().c_str());
    return h;
}

Tensor intTensor(Shape shape, const std::vector<int32_t>& v)
{
    Tensor t = Tensor::empty(std::move(shape), DType::I32);
    std::memcpy(t.raw(), v.data(), v.size() * sizeof(int32_t));
    return t;
}

std::vector<std::string>& otherBackends()
{
    static std::vector<std::string> names;
    return names;
}


// Every cross-backend test: rows = (other backend) x (case of a static case list).
template <typename Case>
void addRows(const std::vector<Case>& cases)
{
    QTest::addColumn<QString>("backend");
    QTest::addColumn<int>("index");
    if (otherBackends().empty()) {
        QTest::newRow("no-other-backend") << QString() << 0;
        return;
    }
    for (const auto& b : otherBackends())
        for (std::size_t i = 0; i < cases.size(); ++i)
            QTest::newRow((b + ": " + cases[i].name).c_str()) << QString::fromStdString(b) << int(i);
}

// Rows = (other backend) x (f16, bf16) x (case).
template <typename Case>
void addComputeTypeRows(const std::vector<Case>& cases)
{
    QTest::addColumn<QString>("backend");
    QTest::addColumn<int>("index");
    QTest::addColumn<int>("computeType");
    if (otherBackends().empty()) {
        QTest::newRow("no-other-backend") << QString() << 0 << int(DType::F16);
        return;
    }
    for (const auto& b : otherBackends())
        for (DType t : {DType::F16, DType::BF16})
            for (std::size_t i = 0; i < cases.size(); ++i)
                QTest::newRow((b + ": " + dtypeName(t) + " " + cases[i].name).c_str()) << QString::fromStdString(b) << int(i) << int(t);
}

// Empty when every element of `t` is a value of type `type` (what a 16-bit result must be).
std::string representable(const Tensor& t, DType type, const std::string& what)
{
    for (int64_t i = 0; i < t.numel(); ++i) {
        const float v = t.data<float>()[i];
        if (!std::isnan(v) && roundToDType(v, type) != v)
            return what + "[" + std::to_string(i) + "] = " + fmt(v) + " is not a " + dtypeName(type) + " value";
    }
    return {};
}

} // namespace

// Opens the row's backend as `be` (skipping the row when it cannot be created or lacks `op`) and
// binds `c` to the row's case from `cases`.
#define OPEN_BACKEND(cases, op)                                                                      \
    QFETCH(QString, backend);                                                                        \
    QFETCH(int, index);                                                                              \
    if (backend.isEmpty()) QSKIP("no backend other than 'reference' is registered");                 \
    auto beResult_ = BackendRegistry::instance().create(backend.toStdString(), 0, BackendOptions{}); \
    if (!beResult_.ok())                                                                             \
        QSKIP(qPrintable("cannot create backend: " + QString::fromStdString(beResult_.error().toString()))); \
    std::unique_ptr<Backend> bePtr_ = std::move(beResult_).value();                                  \
    Backend& be = *bePtr_;                                                                           \
    be.bindThread();                                                                                 \
    if (!be.supportsOp(op)) QSKIP(qPrintable(QString("backend lacks op ") + opKindName(op)));        \
    const auto& c = cases[static_cast<std::size_t>(index)];                                          \
    ReferenceBackend ref;                                                                            \
    auto rng = rngFor(std::string(QTest::currentDataTag()).substr(backend.size()));                  \
    (void)rng


namespace {

// ------------------------------------------------------------------ cases

struct GemmCase {
    std::string name;
    int64_t m, k, n;
    bool ta, tb;
    float alpha, beta;
};
const std::vector<GemmCase> kGemm = {
    {"1x1x1", 1, 1, 1, false, false, 1.0f, 0.0f},
    {"7x13x5", 7, 13, 5, false, false, 1.0f, 0.0f},
    {"7x13x5 transA", 7, 13, 5, true, false, 1.0f, 0.0f},
    {"7x13x5 transB", 7, 13, 5, false, true, 1.0f, 0.0f},
    {"7x13x5 transA transB", 7, 13, 5, true, true, 1.0f, 0.0f},
    {"64x64x64 beta 1", 64, 64, 64, false, false, 1.0f, 1.0f},
    {"33x129x17 alpha 0.5 beta -2 transB", 33, 129, 17, false, true, 0.5f, -2.0f},
    {"1x300x10 batch 1", 1, 300, 10, false, false, 1.0f, 0.0f},
};

struct DenseCase {
    std::string name;
    int64_t n, in, out;
    bool bias;
    Activation act;
    bool accumulate;
};
const std::vector<DenseCase> kDense = {
    {"1x1x1", 1, 1, 1, true, Activation::Linear, false},
    {"batch 1 784x10", 1, 784, 10, true, Activation::Linear, false},
    {"7x13x5 relu", 7, 13, 5, true, Activation::Relu, false},
    {"32x65x33 no bias", 32, 65, 33, false, Activation::Linear, false},
    {"17x9x8 accumulate", 17, 9, 8, true, Activation::Relu, true},
    {"5x3x300 relu no bias accumulate", 5, 3, 300, false, Activation::Relu, true},
};

struct ConvCase {
    std::string name;
    int64_t n, h, w, c, f, kh, kw;
    int sh, sw, pt, pb, pl, pr;
    bool bias;
    int64_t oh() const { return (h + pt + pb - kh) / sh + 1; }
    int64_t ow() const { return (w + pl + pr - kw) / sw + 1; }
    Conv2dParams params() const
    {
        Conv2dParams p;
        p.strideH = sh; p.strideW = sw; p.padTop = pt; p.padBottom = pb; p.padLeft = pl; p.padRight = pr;
        return p;
    }
};
const std::vector<ConvCase> kConv = {
    {"3x3 valid", 2, 7, 7, 3, 4, 3, 3, 1, 1, 0, 0, 0, 0, true},
    {"3x3 same", 2, 7, 7, 3, 4, 3, 3, 1, 1, 1, 1, 1, 1, true},
    {"3x3 stride 2 same asymmetric", 2, 8, 8, 5, 6, 3, 3, 2, 2, 0, 1, 0, 1, true},
    {"4x4 same asymmetric odd", 1, 7, 9, 3, 5, 4, 4, 1, 1, 1, 2, 1, 2, true},
    {"3x3 stride 2 odd same", 3, 9, 7, 6, 7, 3, 3, 2, 2, 1, 1, 1, 1, false},
    {"5x5 batch 1 C1 F8 same", 1, 6, 6, 1, 8, 5, 5, 1, 1, 2, 2, 2, 2, true},
    {"1x1 C13 F11 no bias", 2, 5, 4, 13, 11, 1, 1, 1, 1, 0, 0, 0, 0, false},
    {"2x3 stride (2,1) valid", 2, 9, 8, 5, 3, 2, 3, 2, 1, 0, 0, 0, 0, true},
    {"3x3 stride 2 valid 11x10", 1, 11, 10, 5, 3, 3, 3, 2, 2, 0, 0, 0, 0, true},
};

struct PoolCase {
    std::string name;
    PoolKind kind;
    int64_t n, h, w, c;
    int wh, ww, sh, sw, pt, pb, pl, pr;
    bool ties;  // inputs quantised to a few values, so windows hold equal maxima
    int64_t oh() const { return (h + pt + pb - wh) / sh + 1; }
    int64_t ow() const { return (w + pl + pr - ww) / sw + 1; }
    Pool2dParams params() const
    {
        Pool2dParams p;
        p.kind = kind; p.windowH = wh; p.windowW = ww; p.strideH = sh; p.strideW = sw;
        p.padTop = pt; p.padBottom = pb; p.padLeft = pl; p.padRight = pr;
        return p;
    }
};
const std::vector<PoolCase> kPool = {
    {"max 2x2 s2 8x8x3", PoolKind::Max, 2, 8, 8, 3, 2, 2, 2, 2, 0, 0, 0, 0, false},
    {"max 2x2 s2 7x7x5 valid", PoolKind::Max, 2, 7, 7, 5, 2, 2, 2, 2, 0, 0, 0, 0, false},
    {"max 3x3 s2 same 7x7", PoolKind::Max, 1, 7, 7, 4, 3, 3, 2, 2, 1, 1, 1, 1, false},
    {"max 2x2 s1 same asymmetric", PoolKind::Max, 2, 5, 6, 3, 2, 2, 1, 1, 0, 1, 0, 1, false},
    {"max 2x2 s2 same odd asymmetric", PoolKind::Max, 1, 7, 5, 17, 2, 2, 2, 2, 0, 1, 0, 1, false},
    {"max 3x3 s2 ties", PoolKind::Max, 2, 9, 9, 3, 3, 3, 2, 2, 1, 1, 1, 1, true},
    {"max 2x2 s2 batch 1 C1", PoolKind::Max, 1, 6, 6, 1, 2, 2, 2, 2, 0, 0, 0, 0, false},
    {"avg 2x2 s2 8x8x3", PoolKind::Avg, 2, 8, 8, 3, 2, 2, 2, 2, 0, 0, 0, 0, false},
    {"avg 3x3 s2 same 7x7", PoolKind::Avg, 1, 7, 7, 4, 3, 3, 2, 2, 1, 1, 1, 1, false},
    {"avg 2x2 s1 same asymmetric", PoolKind::Avg, 2, 5, 6, 3, 2, 2, 1, 1, 0, 1, 0, 1, false},
    {"avg 3x2 s(2,1) valid C17", PoolKind::Avg, 1, 7, 5, 17, 3, 2, 2, 1, 0, 0, 0, 0, false},
};

struct GapCase {
    std::string name;
    int64_t n, h, w, c;
};
const std::vector<GapCase> kGap = {
    {"2x5x5x3", 2, 5, 5, 3},
    {"1x1x1x7", 1, 1, 1, 7},
    {"3x7x4x17", 3, 7, 4, 17},
};

struct BnCase {
    std::string name;
    Shape shape;
    bool training;
    float momentum, epsilon;
};
const std::vector<BnCase> kBn = {
    {"2d 16x5 training", Shape{16, 5}, true, 0.99f, 1e-3f},
    {"2d 7x3 training momentum 0.9", Shape{7, 3}, true, 0.9f, 1e-5f},
    {"4d 2x5x5x7 training", Shape{2, 5, 5, 7}, true, 0.99f, 1e-3f},
    {"4d batch 1 1x3x3x5 training", Shape{1, 3, 3, 5}, true, 0.99f, 1e-3f},
    {"4d 3x4x4x17 training", Shape{3, 4, 4, 17}, true, 0.9f, 1e-3f},
    {"2d 16x5 inference", Shape{16, 5}, false, 0.99f, 1e-3f},
    {"4d 2x5x5x7 inference", Shape{2, 5, 5, 7}, false, 0.99f, 1e-3f},
};

struct ActCase {
    std::string name;
    Activation act;
    float alpha;
    Shape shape;
};
std::vector<ActCase> makeActCases()
{
    std::vector<ActCase> out;
    const std::vector<std::pair<Activation, float>> acts = {
        {Activation::Linear, 0.0f}, {Activation::Relu, 0.0f},    {Activation::LeakyRelu, 0.2f},
        {Activation::LeakyRelu, 0.3f}, {Activation::Gelu, 0.0f}, {Activation::Sigmoid, 0.0f},
        {Activation::Tanh, 0.0f},   {Activation::Softmax, 0.0f},
    };
    const std::vector<Shape> shapes = {Shape{1}, Shape{7, 13}, Shape{2, 5, 5, 9}};
    for (const auto& [a, alpha] : acts)
        for (const auto& s : shapes)
            out.push_back({std::string(activationName(a)) + (alpha != 0 ? " " + QString::number(double(alpha)).toStdString() : "") + " " + s.toString(),
                           a, alpha, s});
    return out;
}
const std::vector<ActCase> kAct = makeActCases();

struct SoftmaxCase {
    std::string name;
    Shape shape;
    float spread;  // logit magnitude: large values test the max-subtraction
};
const std::vector<SoftmaxCase> kSoftmax = {
    {"1x1", Shape{1, 1}, 1.0f},
    {"7x10", Shape{7, 10}, 3.0f},
    {"3x4x5 last axis", Shape{3, 4, 5}, 3.0f},
    {"5x33 large logits", Shape{5, 33}, 60.0f},
};

struct DropoutCase {
    std::string name;
    Shape shape;
    float rate;
    uint64_t seed;
};
const std::vector<DropoutCase> kDropout = {
    {"rate 0", Shape{7, 13}, 0.0f, 1},
    {"rate 0.1", Shape{7, 13}, 0.1f, 2},
    {"rate 0.5 4d", Shape{2, 5, 5, 9}, 0.5f, 3},
    {"rate 0.9 large seed", Shape{1001}, 0.9f, 0xDEADBEEFCAFEF00Dull},
};

struct EltCase {
    std::string name;
    int64_t n;
};
const std::vector<EltCase> kElt = {{"1", 1}, {"37", 37}, {"4099", 4099}};

struct ConcatCase {
    std::string name;
    std::vector<Shape> inputs;
};
const std::vector<ConcatCase> kConcat = {
    {"single", {Shape{4, 6}}},
    {"2d 7x3 + 7x5", {Shape{7, 3}, Shape{7, 5}}},
    {"4d three inputs", {Shape{2, 3, 3, 4}, Shape{2, 3, 3, 1}, Shape{2, 3, 3, 7}}},
    {"batch 1", {Shape{1, 2}, Shape{1, 9}}},
};

struct LossCase {
    std::string name;
    LossKind kind;
    bool fromLogits;
    Shape shape;
    bool softTargets = false;  // categorical: random distributions instead of one-hot
    float spread = 2.0f;       // logit magnitude; large values push probabilities into the clip
    int64_t globalBatch = 0;
    float gradScale = 1.0f;
};
const std::vector<LossCase> kLoss = {
    {"sparse cce logits 7x10", LossKind::SparseCategoricalCrossentropy, true, Shape{7, 10}},
    {"sparse cce logits batch 1", LossKind::SparseCategoricalCrossentropy, true, Shape{1, 3}},
    {"sparse cce logits global batch scaled", LossKind::SparseCategoricalCrossentropy, true, Shape{5, 4}, false,
     2.0f, 20, 128.0f},
    {"sparse cce logits large", LossKind::SparseCategoricalCrossentropy, true, Shape{6, 10}, false, 40.0f},
    {"sparse cce probs 7x10", LossKind::SparseCategoricalCrossentropy, false, Shape{7, 10}},
    {"sparse cce probs clipped", LossKind::SparseCategoricalCrossentropy, false, Shape{6, 10}, false, 40.0f},
    {"cce logits one-hot", LossKind::CategoricalCrossentropy, true, Shape{7, 10}},
    {"cce logits soft", LossKind::CategoricalCrossentropy, true, Shape{5, 3}, true},
    {"cce probs soft", LossKind::CategoricalCrossentropy, false, Shape{5, 3}, true},
    {"cce probs clipped global batch", LossKind::CategoricalCrossentropy, false, Shape{4, 6}, false, 40.0f, 16,
     1.0f},
    {"bce logits 9x1", LossKind::BinaryCrossentropy, true, Shape{9, 1}},
    {"bce logits 4x5", LossKind::BinaryCrossentropy, true, Shape{4, 5}},
    {"bce logits large", LossKind::BinaryCrossentropy, true, Shape{4, 5}, false, 40.0f},
    {"bce probs 9x1", LossKind::BinaryCrossentropy, false, Shape{9, 1}},
    {"bce probs 2x3x4 clipped", LossKind::BinaryCrossentropy, false, Shape{2, 3, 4}, false, 40.0f},
    {"mse 8x4", LossKind::MeanSquaredError, true, Shape{8, 4}},
    {"mse 1x1 scaled", LossKind::MeanSquaredError, false, Shape{1, 1}, false, 2.0f, 4, 0.5f},
};

struct ArgmaxCase {
    std::string name;
    int mode;  // 0 sparse, 1 one-hot F32, 2 binary logits, 3 binary probabilities, 4 binary I32 targets
    int64_t n, c;
};
const std::vector<ArgmaxCase> kArgmax = {
    {"sparse 37x10", 0, 37, 10},  {"sparse batch 1", 0, 1, 4},        {"one-hot 23x7", 1, 23, 7},
    {"binary logits 31", 2, 31, 1}, {"binary probabilities 31", 3, 31, 1}, {"binary i32 targets 17", 4, 17, 1},
};

struct OptCase {
    std::string name;
    int kind;  // 0 sgd, 1 adam, 2 rmsprop
    SgdParams sgd;
    AdamParams adam;
    RmspropParams rms;
    int64_t n = 37;
};
std::vector<OptCase> makeOptCases()
{
    std::vector<OptCase> out;
    auto sgd = [&](std::string name, float lr, float mom, bool nest, float wd) {
        OptCase c{name, 0, {}, {}, {}};
        c.sgd.lr = lr; c.sgd.momentum = mom; c.sgd.nesterov = nest; c.sgd.weightDecay = wd;
        out.push_back(c);
    };
    sgd("sgd plain", 0.1f, 0.0f, false, 0.0f);
    sgd("sgd momentum", 0.05f, 0.9f, false, 0.0f);
    sgd("sgd nesterov", 0.05f, 0.9f, true, 0.0f);
    sgd("sgd momentum weight decay", 0.05f, 0.8f, false, 1e-2f);
    sgd("sgd nesterov weight decay", 0.05f, 0.8f, true, 1e-2f);
    auto adam = [&](std::string name, float lr, float wd, float eps) {
        OptCase c{name, 1, {}, {}, {}};
        c.adam.lr = lr; c.adam.weightDecay = wd; c.adam.epsilon = eps;
        out.push_back(c);
    };
    adam("adam", 1e-2f, 0.0f, 1e-7f);
    adam("adamw", 1e-2f, 1e-1f, 1e-7f);
    adam("adam eps 1e-3", 1e-3f, 0.0f, 1e-3f);
    auto rms = [&](std::string name, float lr, float mom, bool centered) {
        OptCase c{name, 2, {}, {}, {}};
        c.rms.lr = lr; c.rms.momentum = mom; c.rms.centered = centered;
        out.push_back(c);
    };
    rms("rmsprop", 1e-2f, 0.0f, false);
    rms("rmsprop centered", 1e-2f, 0.0f, true);
    rms("rmsprop momentum", 1e-2f, 0.9f, false);
    rms("rmsprop centered momentum", 1e-2f, 0.9f, true);
    OptCase big = out[1];
    big.name = "sgd momentum 1000";
    big.n = 1000;
    out.push_back(big);
    OptCase bigAdam = out[5];
    bigAdam.name = "adam 1000";
    bigAdam.n = 1000;
    out.push_back(bigAdam);
    return out;
}
const std::vector<OptCase> kOpt = makeOptCases();

struct CopyCase {
    std::string name;
    DType dtype;
    int64_t n;
};
const std::vector<CopyCase> kCopy = {
    {"f32 1", DType::F32, 1}, {"f32 4099", DType::F32, 4099}, {"i32 37", DType::I32, 37}, {"u8 1001", DType::U8, 1001}};

// Loss inputs shared by the cross-backend and finite-difference tests.
struct LossInputs {
    Tensor pred, target;
};
LossInputs makeLossInputs(const LossCase& c, std::mt19937& rng)
{
    LossInputs in;
    const int64_t n = c.shape[0];
    const int64_t per = c.shape.numel() / n;
    Tensor logits = randomTensor(c.shape, rng, -c.spread, c.spread);
    ReferenceBackend ref;
    const bool categorical = c.kind == LossKind::SparseCategoricalCrossentropy ||
                             c.kind == LossKind::CategoricalCrossentropy;
    if (c.fromLogits || c.kind == LossKind::MeanSquaredError) {
        in.pred = logits;
    } else if (categorical) {
        in.pred = Tensor::empty(c.shape);
        (void)ref.softmaxForward(logits, in.pred);
    } else {
        in.pred = Tensor::empty(c.shape);
        (void)ref.activationForward(Activation::Sigmoid, 0.0f, logits, in.pred);
    }
    std::uniform_int_distribution<int32_t> cls(0, int32_t(per) - 1);
    std::uniform_real_distribution<float> u01(0.0f, 1.0f);
    switch (c.kind) {
    case LossKind::SparseCategoricalCrossentropy: {
        std::vector<int32_t> labels(static_cast<std::size_t>(n));
        for (auto& l : labels) l = cls(rng);
        in.target = intTensor(Shape{n}, labels);
        break;
    }
    case LossKind::CategoricalCrossentropy: {
        in.target = Tensor::zeros(c.shape);
        float* t = in.target.data<float>();
        for (int64_t r = 0; r < n; ++r) {
            if (c.softTargets) {
                double s = 0;
                for (int64_t k = 0; k < per; ++k) s += (t[r * per + k] = u01(rng) + 0.05f);
                for (int64_t k = 0; k < per; ++k) t[r * per + k] = float(t[r * per + k] / s);
            } else {
                t[r * per + cls(rng)] = 1.0f;
            }
        }
        break;
    }
    case LossKind::BinaryCrossentropy: {
        in.target = Tensor::empty(c.shape);
        float* t = in.target.data<float>();
        // Hard labels plus a few soft ones (label smoothing).
        for (int64_t i = 0; i < in.target.numel(); ++i)
            t[i] = i % 5 == 4 ? u01(rng) : (u01(rng) < 0.5f ? 0.0f : 1.0f);
        break;
    }
    case LossKind::MeanSquaredError: in.target = randomTensor(c.shape, rng, -2.0f, 2.0f); break;
    }
    return in;
}

// ------------------------------------------------------------------ finite differences

// Central differences of `objective` with respect to every element of host tensor `x`, compared
// to `analytic`: |num - ana| <= atol + rtol * max(|num|, |ana|).
std::string checkGradient(const std::function<double()>& objective, Tensor& x, const Tensor& analytic,
                          const std::string& what, float eps = 1e-3f, double rtol = 1e-2, double atol = 1e-3)
{
    if (analytic.shape() != x.shape()) return what + ": gradient shape differs";
    float* p = x.data<float>();
    for (int64_t i = 0; i < x.numel(); ++i) {
        const float v = p[i];
        const float hi = v + eps, lo = v - eps;
        p[i] = hi;
        const double fp = objective();
        p[i] = lo;
        const double fm = objective();
        p[i] = v;
        const double num = (fp - fm) / (double(hi) - double(lo));
        const double ana = analytic.data<float>()[i];
        if (!(std::abs(num - ana) <= atol + rtol * std::max(std::abs(num), std::abs(ana))))
            return what + ": element " + std::to_string(i) + " analytic " + fmt(ana) + " numeric " + fmt(num);
    }
    return {};
}

double dot(const Tensor& a, const Tensor& b)
{
    double s = 0;
    for (int64_t i = 0; i < a.numel(); ++i) s += double(a.data<float>()[i]) * b.data<float>()[i];
    return s;
}

} // namespace

class TstOps : public QObject {
    Q_OBJECT

private slots:
    void initTestCase();

    // ---- part 1: every backend against the reference
    void gemm_data() { addRows(kGemm); }
    void gemm();
    void denseForward_data() { addRows(kDense); }
    void denseForward();
    void denseBackward_data() { addRows(kDense); }
    void denseBackward();
    void conv2dForward_data() { addRows(kConv); }
    void conv2dForward();
    void conv2dBackwardData_data() { addRows(kConv); }
    void conv2dBackwardData();
    void conv2dBackwardWeights_data() { addRows(kConv); }
    void conv2dBackwardWeights();
    void pool2dForward_data() { addRows(kPool); }
    void pool2dForward();
    void pool2dBackward_data() { addRows(kPool); }
    void pool2dBackward();
    void globalAvgPool_data() { addRows(kGap); }
    void globalAvgPool();
    void batchNormForward_data() { addRows(kBn); }
    void batchNormForward();
    void batchNormBackward_data() { addRows(kBn); }
    void batchNormBackward();
    void activationForward_data() { addRows(kAct); }
    void activationForward();
    void activationBackward_data() { addRows(kAct); }
    void activationBackward();
    void softmax_data() { addRows(kSoftmax); }
    void softmax();
    void dropout_data() { addRows(kDropout); }
    void dropout();
    void elementwise_data() { addRows(kElt); }
    void elementwise();
    void concat_data() { addRows(kConcat); }
    void concat();
    void loss_data() { addRows(kLoss); }
    void loss();
    void argmaxMatches_data() { addRows(kArgmax); }
    void argmaxMatches();
    void optimizer_data() { addRows(kOpt); }
    void optimizer();
    void sumSquares_data() { addRows(kElt); }
    void sumSquares();
    void copies_data() { addRows(kCopy); }
    void copies();
    // Mixed precision: dense and convolution ops in a 16-bit compute type, against the reference
    // in the same type (operands and results rounded to it).
    void mixedDense_data() { addComputeTypeRows(kDense); }
    void mixedDense();
    void mixedConv_data() { addComputeTypeRows(kConv); }
    void mixedConv();

    // ---- part 2: the reference's backward ops against finite differences
    void fdDense_data();
    void fdDense();
    void fdConv_data();
    void fdConv();
    void fdPool_data();
    void fdPool();
    void fdGlobalAvgPool();
    void fdBatchNorm_data();
    void fdBatchNorm();
    void fdActivation_data();
    void fdActivation();
    void fdLoss_data();
    void fdLoss();
    void fdConcat();
    void fdDropout();

    // ---- part 3: reference semantics that gradients cannot see
    void activationNames();
    void dropoutMaskStatistics();
    void maxPoolTiesPickFirst();
    void avgPoolCountsInBoundsOnly();
    void batchNormRunningStats();
    void sgdMatchesTorch();
    void adamFirstStep();
    void rmspropKerasForm();
    void lossValues();
    void lossGradientScaling();
    void lossRejectsBadLabel();
    void argmaxSemantics();
    void referenceFactory();
    void roundingToHalfTypes();
    void halfRoundingMatchesHardware();
    void computeTypeOverflowsLikeF16();
    void computeTypeIsChecked();
};

void TstOps::initTestCase()
{
    // A CUDA build's plugin joins the comparison when it sits next to the test or on the plugin path.
    for (const auto& msg : BackendRegistry::instance().loadDefaultPlugins()) qInfo("%s", msg.c_str());
    for (const auto& name : BackendRegistry::instance().names())
        if (name != "reference") otherBackends().push_back(name);
}

// ====================================================================== part 1

void TstOps::gemm()
{
    OPEN_BACKEND(kGemm, OpKind::Gemm);
    Tensor a = randomTensor(c.ta ? Shape{c.k, c.m} : Shape{c.m, c.k}, rng);
    Tensor b = randomTensor(c.tb ? Shape{c.n, c.k} : Shape{c.k, c.n}, rng);
    // beta == 0 must not read C: NaN there would otherwise leak into the result.
    Tensor c0 = c.beta == 0.0f ? filled(Shape{c.m, c.n}, kNaN) : randomTensor(Shape{c.m, c.n}, rng);
    Tensor expect = c0.clone();
    CHECK_OK(ref.gemm(a, c.ta, b, c.tb, expect, c.alpha, c.beta));
    Tensor dc = upload(be, c0);
    CHECK_OK(be.gemm(upload(be, a), c.ta, upload(be, b), c.tb, dc, c.alpha, c.beta));
    CHECK_SAME(compare(download(be, dc), expect, 1e-4, 1e-4, "C"));
}

void TstOps::denseForward()
{
    OPEN_BACKEND(kDense, OpKind::DenseForward);
    Tensor x = randomTensor(Shape{c.n, c.in}, rng);
    Tensor w = randomTensor(Shape{c.in, c.out}, rng);
    Tensor b = c.bias ? randomTensor(Shape{c.out}, rng) : Tensor();
    Tensor y = filled(Shape{c.n, c.out}, kNaN);
    CHECK_OK(ref.denseForward(x, w, b, c.act, y));
    Tensor dy = upload(be, filled(Shape{c.n, c.out}, kNaN));
    CHECK_OK(be.denseForward(upload(be, x), upload(be, w), c.bias ? upload(be, b) : Tensor(), c.act, dy));
    CHECK_SAME(compare(download(be, dy), y, 1e-4, 1e-4, "Y"));
}

void TstOps::denseBackward()
{
    OPEN_BACKEND(kDense, OpKind::DenseBackward);
    Tensor x = randomTensor(Shape{c.n, c.in}, rng);
    Tensor w = randomTensor(Shape{c.in, c.out}, rng);
    Tensor gy = randomTensor(Shape{c.n, c.out}, rng);
    // Accumulating outputs start from the same random values; overwritten ones from NaN.
    Tensor dw0 = c.accumulate ? randomTensor(Shape{c.in, c.out}, rng) : filled(Shape{c.in, c.out}, kNaN);
    Tensor db0 = c.accumulate ? randomTensor(Shape{c.out}, rng) : filled(Shape{c.out}, kNaN);
    Tensor dx = filled(Shape{c.n, c.in}, kNaN), dw = dw0.clone(), db = db0.clone();
    Tensor noDb;
    CHECK_OK(ref.denseBackward(x, w, gy, dx, dw, c.bias ? db : noDb, c.accumulate));
    Tensor ddx = upload(be, filled(Shape{c.n, c.in}, kNaN)), ddw = upload(be, dw0), ddb = upload(be, db0);
    Tensor dNoDb;
    CHECK_OK(be.denseBackward(upload(be, x), upload(be, w), upload(be, gy), ddx, ddw, c.bias ? ddb : dNoDb,
                              c.accumulate));
    CHECK_SAME(compare(download(be, ddx), dx, 1e-4, 1e-4, "dX"));
    CHECK_SAME(compare(download(be, ddw), dw, 1e-4, 1e-4, "dW"));
    if (c.bias) CHECK_SAME(compare(download(be, ddb), db, 1e-4, 1e-4, "db"));

    // dX skipped when undefined: dW alone must still be right.
    Tensor noDx;
    Tensor ddw2 = upload(be, dw0);
    CHECK_OK(be.denseBackward(upload(be, x), upload(be, w), upload(be, gy), noDx, ddw2, dNoDb, c.accumulate));
    CHECK_SAME(compare(download(be, ddw2), dw, 1e-4, 1e-4, "dW without dX"));
}

void TstOps::conv2dForward()
{
    OPEN_BACKEND(kConv, OpKind::Conv2dForward);
    Tensor x = randomTensor(Shape{c.n, c.h, c.w, c.c}, rng);
    Tensor w = randomTensor(Shape{c.kh, c.kw, c.c, c.f}, rng);
    Tensor b = c.bias ? randomTensor(Shape{c.f}, rng) : Tensor();
    const Shape ys{c.n, c.oh(), c.ow(), c.f};
    Tensor y = filled(ys, kNaN);
    CHECK_OK(ref.conv2dForward(x, w, b, c.params(), y));
    Tensor dy = upload(be, filled(ys, kNaN));
    CHECK_OK(be.conv2dForward(upload(be, x), upload(be, w), c.bias ? upload(be, b) : Tensor(), c.params(), dy));
    CHECK_SAME(compare(download(be, dy), y, 1e-4, 1e-4, "Y"));
}

void TstOps::conv2dBackwardData()
{
    OPEN_BACKEND(kConv, OpKind::Conv2dBackwardData);
    Tensor w = randomTensor(Shape{c.kh, c.kw, c.c, c.f}, rng);
    Tensor gy = randomTensor(Shape{c.n, c.oh(), c.ow(), c.f}, rng);
    const Shape xs{c.n, c.h, c.w, c.c};
    Tensor dx = filled(xs, kNaN);
    CHECK_OK(ref.conv2dBackwardData(gy, w, c.params(), dx));
    Tensor ddx = upload(be, filled(xs, kNaN));
    CHECK_OK(be.conv2dBackwardData(upload(be, gy), upload(be, w), c.params(), ddx));
    CHECK_SAME(compare(download(be, ddx), dx, 1e-4, 1e-4, "dX"));
}

void TstOps::conv2dBackwardWeights()
{
    OPEN_BACKEND(kConv, OpKind::Conv2dBackwardWeights);
    Tensor x = randomTensor(Shape{c.n, c.h, c.w, c.c}, rng);
    Tensor gy = randomTensor(Shape{c.n, c.oh(), c.ow(), c.f}, rng);
    const Shape ws{c.kh, c.kw, c.c, c.f};
    Tensor dw = filled(ws, kNaN), db = filled(Shape{c.f}, kNaN), noDb;
    CHECK_OK(ref.conv2dBackwardWeights(x, gy, c.params(), dw, c.bias ? db : noDb));
    Tensor ddw = upload(be, filled(ws, kNaN)), ddb = upload(be, filled(Shape{c.f}, kNaN)), dNoDb;
    CHECK_OK(be.conv2dBackwardWeights(upload(be, x), upload(be, gy), c.params(), ddw, c.bias ? ddb : dNoDb));
    CHECK_SAME(compare(download(be, ddw), dw, 1e-4, 1e-4, "dW"));
    if (c.bias) CHECK_SAME(compare(download(be, ddb), db, 1e-4, 1e-4, "db"));
}

namespace {
Tensor poolInput(const PoolCase& c, std::mt19937& rng)
{
    Tensor x = randomTensor(Shape{c.n, c.h, c.w, c.c}, rng);
    if (c.ties)
        for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = std::round(x.data<float>()[i]);
    return x;
}
} // namespace

void TstOps::pool2dForward()
{
    OPEN_BACKEND(kPool, OpKind::Pool2dForward);
    Tensor x = poolInput(c, rng);
    const Shape ys{c.n, c.oh(), c.ow(), c.c};
    const bool isMax = c.kind == PoolKind::Max;
    Tensor y = filled(ys, kNaN);
    Tensor ws = isMax ? Tensor::zeros(ys, DType::I32) : Tensor();
    CHECK_OK(ref.pool2dForward(x, c.params(), y, ws));
    Tensor dy = upload(be, filled(ys, kNaN));
    Tensor dws = isMax ? upload(be, intTensor(ys, std::vector<int32_t>(std::size_t(ys.numel()), -7))) : Tensor();
    CHECK_OK(be.pool2dForward(upload(be, x), c.params(), dy, dws));
    CHECK_SAME(compare(download(be, dy), y, 1e-6, 1e-6, "Y"));
    // The contract fixes the workspace to the flat input index of the first max.
    if (isMax) CHECK_SAME(compare(download(be, dws), ws, 0, 0, "workspace (flat input index)"));
}

void TstOps::pool2dBackward()
{
    OPEN_BACKEND(kPool, OpKind::Pool2dBackward);
    Tensor x = poolInput(c, rng);
    const Shape xs{c.n, c.h, c.w, c.c}, ys{c.n, c.oh(), c.ow(), c.c};
    const bool isMax = c.kind == PoolKind::Max;
    Tensor y = Tensor::empty(ys);
    Tensor ws = isMax ? Tensor::zeros(ys, DType::I32) : Tensor();
    CHECK_OK(ref.pool2dForward(x, c.params(), y, ws));
    Tensor gy = randomTensor(ys, rng);
    Tensor dx = filled(xs, kNaN);
    CHECK_OK(ref.pool2dBackward(gy, ws, c.params(), dx));

    // Through the backend's own forward, so its workspace is what its backward reads.
    Tensor ddx = upload(be, filled(xs, kNaN));
    Tensor dws = isMax ? upload(be, Tensor::zeros(ys, DType::I32)) : Tensor();
    if (be.supportsOp(OpKind::Pool2dForward)) {
        Tensor dy = upload(be, Tensor::zeros(ys));
        CHECK_OK(be.pool2dForward(upload(be, x), c.params(), dy, dws));
    } else if (isMax) {
        dws = upload(be, ws);
    }
    CHECK_OK(be.pool2dBackward(upload(be, gy), dws, c.params(), ddx));
    CHECK_SAME(compare(download(be, ddx), dx, 1e-5, 1e-6, "dX"));
    if (isMax) {
        // And from the reference's workspace: the index format is part of the contract.
        Tensor ddx2 = upload(be, filled(xs, kNaN));
        CHECK_OK(be.pool2dBackward(upload(be, gy), upload(be, ws), c.params(), ddx2));
        CHECK_SAME(compare(download(be, ddx2), dx, 1e-5, 1e-6, "dX from the reference workspace"));
    }
}

void TstOps::globalAvgPool()
{
    OPEN_BACKEND(kGap, OpKind::GlobalAvgPoolForward);
    Tensor x = randomTensor(Shape{c.n, c.h, c.w, c.c}, rng);
    Tensor y = filled(Shape{c.n, c.c}, kNaN);
    CHECK_OK(ref.globalAvgPoolForward(x, y));
    Tensor dy = upload(be, filled(Shape{c.n, c.c}, kNaN));
    CHECK_OK(be.globalAvgPoolForward(upload(be, x), dy));
    CHECK_SAME(compare(download(be, dy), y, 1e-5, 1e-6, "Y"));
    if (!be.supportsOp(OpKind::GlobalAvgPoolBackward)) QSKIP("backend lacks global_avg_pool_backward");
    Tensor gy = randomTensor(Shape{c.n, c.c}, rng);
    Tensor dx = filled(x.shape(), kNaN);
    CHECK_OK(ref.globalAvgPoolBackward(gy, dx));
    Tensor ddx = upload(be, filled(x.shape(), kNaN));
    CHECK_OK(be.globalAvgPoolBackward(upload(be, gy), ddx));
    CHECK_SAME(compare(download(be, ddx), dx, 1e-5, 1e-7, "dX"));
}

void TstOps::batchNormForward()
{
    OPEN_BACKEND(kBn, OpKind::BatchNormForward);
    const int64_t C = c.shape[-1];
    Tensor x = randomTensor(c.shape, rng, -2.0f, 3.0f);
    Tensor gamma = randomTensor(Shape{C}, rng, 0.5f, 1.5f);
    Tensor beta = randomTensor(Shape{C}, rng);
    Tensor rm0 = randomTensor(Shape{C}, rng), rv0 = randomTensor(Shape{C}, rng, 0.5f, 2.0f);
    // Inference leaves saveMean/saveInvStd alone: start them equal on both sides.
    Tensor sm0 = c.training ? filled(Shape{C}, kNaN) : filled(Shape{C}, 42.0f);
    Tensor y = filled(c.shape, kNaN), rm = rm0.clone(), rv = rv0.clone(), sm = sm0.clone(), si = sm0.clone();
    CHECK_OK(ref.batchNormForward(x, gamma, beta, rm, rv, c.training, c.momentum, c.epsilon, y, sm, si));
    Tensor dy = upload(be, filled(c.shape, kNaN)), drm = upload(be, rm0), drv = upload(be, rv0);
    Tensor dsm = upload(be, sm0), dsi = upload(be, sm0);
    CHECK_OK(be.batchNormForward(upload(be, x), upload(be, gamma), upload(be, beta), drm, drv, c.training,
                                 c.momentum, c.epsilon, dy, dsm, dsi));
    CHECK_SAME(compare(download(be, dy), y, 1e-4, 1e-4, "Y"));
    CHECK_SAME(compare(download(be, drm), rm, 1e-5, 1e-6, "running mean"));
    CHECK_SAME(compare(download(be, drv), rv, 1e-4, 1e-6, "running variance"));
    CHECK_SAME(compare(download(be, dsm), sm, 1e-5, 1e-5, "saveMean"));
    CHECK_SAME(compare(download(be, dsi), si, 1e-4, 1e-5, "saveInvStd"));
}

void TstOps::batchNormBackward()
{
    OPEN_BACKEND(kBn, OpKind::BatchNormBackward);
    const int64_t C = c.shape[-1];
    Tensor x = randomTensor(c.shape, rng, -2.0f, 3.0f);
    Tensor gamma = randomTensor(Shape{C}, rng, 0.5f, 1.5f);
    Tensor beta = randomTensor(Shape{C}, rng);
    Tensor rm = Tensor::zeros(Shape{C}), rv = filled(Shape{C}, 1.0f);
    Tensor y = Tensor::empty(c.shape), sm = Tensor::empty(Shape{C}), si = Tensor::empty(Shape{C});
    // The backward pass is the training-mode gradient; statistics come from a training forward.
    CHECK_OK(ref.batchNormForward(x, gamma, beta, rm, rv, true, c.momentum, c.epsilon, y, sm, si));
    Tensor gy = randomTensor(c.shape, rng);
    Tensor dx = filled(c.shape, kNaN), dg = filled(Shape{C}, kNaN), db = filled(Shape{C}, kNaN);
    CHECK_OK(ref.batchNormBackward(x, gamma, sm, si, gy, dx, dg, db));
    Tensor ddx = upload(be, filled(c.shape, kNaN));
    Tensor ddg = upload(be, filled(Shape{C}, kNaN)), ddb = upload(be, filled(Shape{C}, kNaN));
    CHECK_OK(be.batchNormBackward(upload(be, x), upload(be, gamma), upload(be, sm), upload(be, si),
                                  upload(be, gy), ddx, ddg, ddb));
    CHECK_SAME(compare(download(be, ddx), dx, 1e-3, 1e-4, "dX"));
    CHECK_SAME(compare(download(be, ddg), dg, 1e-4, 1e-4, "dgamma"));
    CHECK_SAME(compare(download(be, ddb), db, 1e-4, 1e-4, "dbeta"));
}

void TstOps::activationForward()
{
    OPEN_BACKEND(kAct, OpKind::ActivationForward);
    Tensor x = randomTensor(c.shape, rng, -4.0f, 4.0f);
    Tensor y = filled(c.shape, kNaN);
    CHECK_OK(ref.activationForward(c.act, c.alpha, x, y));
    Tensor dy = upload(be, filled(c.shape, kNaN));
    CHECK_OK(be.activationForward(c.act, c.alpha, upload(be, x), dy));
    CHECK_SAME(compare(download(be, dy), y, 1e-5, 1e-6, "Y"));
}

void TstOps::activationBackward()
{
    OPEN_BACKEND(kAct, OpKind::ActivationBackward);
    Tensor x = randomTensor(c.shape, rng, -4.0f, 4.0f);
    Tensor y = Tensor::empty(c.shape);
    CHECK_OK(ref.activationForward(c.act, c.alpha, x, y));
    Tensor gy = randomTensor(c.shape, rng);
    Tensor dx = filled(c.shape, kNaN);
    CHECK_OK(ref.activationBackward(c.act, c.alpha, x, y, gy, dx));
    Tensor ddx = upload(be, filled(c.shape, kNaN));
    CHECK_OK(be.activationBackward(c.act, c.alpha, upload(be, x), upload(be, y), upload(be, gy), ddx));
    CHECK_SAME(compare(download(be, ddx), dx, 1e-5, 1e-6, "dX"));
}

void TstOps::softmax()
{
    OPEN_BACKEND(kSoftmax, OpKind::SoftmaxForward);
    Tensor x = randomTensor(c.shape, rng, -c.spread, c.spread);
    Tensor y = filled(c.shape, kNaN);
    CHECK_OK(ref.softmaxForward(x, y));
    Tensor dy = upload(be, filled(c.shape, kNaN));
    CHECK_OK(be.softmaxForward(upload(be, x), dy));
    CHECK_SAME(compare(download(be, dy), y, 1e-5, 1e-7, "Y"));
    if (!be.supportsOp(OpKind::SoftmaxBackward)) QSKIP("backend lacks softmax_backward");
    Tensor gy = randomTensor(c.shape, rng);
    Tensor dx = filled(c.shape, kNaN);
    CHECK_OK(ref.softmaxBackward(y, gy, dx));
    Tensor ddx = upload(be, filled(c.shape, kNaN));
    CHECK_OK(be.softmaxBackward(upload(be, y), upload(be, gy), ddx));
    CHECK_SAME(compare(download(be, ddx), dx, 1e-4, 1e-6, "dX"));
}

void TstOps::dropout()
{
    OPEN_BACKEND(kDropout, OpKind::DropoutForward);
    Tensor x = randomTensor(c.shape, rng);
    Tensor y = filled(c.shape, kNaN);
    Tensor mask = Tensor::zeros(c.shape, DType::U8);
    CHECK_OK(ref.dropoutForward(x, c.rate, c.seed, mask, y));
    Tensor dy = upload(be, filled(c.shape, kNaN));
    Tensor dmask = upload(be, Tensor::zeros(c.shape, DType::U8));
    CHECK_OK(be.dropoutForward(upload(be, x), c.rate, c.seed, dmask, dy));
    CHECK_SAME(compare(download(be, dmask), mask, 0, 0, "mask"));
    CHECK_SAME(compare(download(be, dy), y, 1e-6, 1e-7, "Y"));
    if (!be.supportsOp(OpKind::DropoutBackward)) QSKIP("backend lacks dropout_backward");
    Tensor gy = randomTensor(c.shape, rng);
    Tensor dx = filled(c.shape, kNaN);
    CHECK_OK(ref.dropoutBackward(gy, mask, c.rate, dx));
    Tensor ddx = upload(be, filled(c.shape, kNaN));
    CHECK_OK(be.dropoutBackward(upload(be, gy), upload(be, mask), c.rate, ddx));
    CHECK_SAME(compare(download(be, ddx), dx, 1e-6, 1e-7, "dX"));
}

void TstOps::elementwise()
{
    OPEN_BACKEND(kElt, OpKind::Add);
    const Shape s{c.n};
    Tensor a = randomTensor(s, rng), b = randomTensor(s, rng);
    Tensor sum = filled(s, kNaN);
    CHECK_OK(ref.add(a, b, sum));
    Tensor da = upload(be, a), db = upload(be, b), dsum = upload(be, filled(s, kNaN));
    CHECK_OK(be.add(da, db, dsum));
    CHECK_SAME(compare(download(be, dsum), sum, 1e-6, 1e-7, "a + b"));
    // c may alias an input.
    CHECK_OK(be.add(da, db, da));
    CHECK_SAME(compare(download(be, da), sum, 1e-6, 1e-7, "a += b (aliased)"));

    if (!be.supportsOp(OpKind::Axpy) || !be.supportsOp(OpKind::Scale)) QSKIP("backend lacks axpy or scale");
    Tensor y = b.clone();
    CHECK_OK(ref.axpy(-0.75f, a, y));
    Tensor dy = upload(be, b);
    CHECK_OK(be.axpy(-0.75f, upload(be, a), dy));
    CHECK_SAME(compare(download(be, dy), y, 1e-6, 1e-7, "axpy"));
    CHECK_OK(ref.scale(3.5f, y));
    CHECK_OK(be.scale(3.5f, dy));
    CHECK_SAME(compare(download(be, dy), y, 1e-6, 1e-7, "scale"));
}

void TstOps::concat()
{
    OPEN_BACKEND(kConcat, OpKind::ConcatForward);
    std::vector<Tensor> xs, dxs;
    Shape ys = c.inputs[0];
    ys[-1] = 0;
    for (const auto& s : c.inputs) {
        xs.push_back(randomTensor(s, rng));
        dxs.push_back(upload(be, xs.back()));
        ys[-1] += s[-1];
    }
    Tensor y = filled(ys, kNaN);
    CHECK_OK(ref.concatForward(xs, y));
    Tensor dy = upload(be, filled(ys, kNaN));
    CHECK_OK(be.concatForward(dxs, dy));
    CHECK_SAME(compare(download(be, dy), y, 0, 0, "Y"));
    if (!be.supportsOp(OpKind::ConcatBackward)) QSKIP("backend lacks concat_backward");
    Tensor gy = randomTensor(ys, rng);
    std::vector<Tensor> gx, dgx;
    for (const auto& s : c.inputs) {
        gx.push_back(filled(s, kNaN));
        dgx.push_back(upload(be, filled(s, kNaN)));
    }
    CHECK_OK(ref.concatBackward(gy, gx));
    CHECK_OK(be.concatBackward(upload(be, gy), dgx));
    for (std::size_t i = 0; i < gx.size(); ++i)
        CHECK_SAME(compare(download(be, dgx[i]), gx[i], 0, 0, "dX" + std::to_string(i)));
}

void TstOps::loss()
{
    OPEN_BACKEND(kLoss, OpKind::Loss);
    LossInputs in = makeLossInputs(c, rng);
    LossParams p;
    p.kind = c.kind;
    p.fromLogits = c.fromLogits;
    p.globalBatch = c.globalBatch;
    p.gradScale = c.gradScale;
    float l = kNaN, dl = kNaN;
    Tensor g = filled(c.shape, kNaN);
    CHECK_OK(ref.loss(p, in.pred, in.target, &l, g));
    Tensor dg = upload(be, filled(c.shape, kNaN));
    CHECK_OK(be.loss(p, upload(be, in.pred), upload(be, in.target), &dl, dg));
    CHECK_SAME(compareScalar(dl, l, 1e-5, 1e-6, "loss"));
    CHECK_SAME(compare(download(be, dg), g, 1e-4, 1e-6, "dPred"));
    // Without dpred only the loss is computed.
    float dl2 = kNaN;
    Tensor none;
    CHECK_OK(be.loss(p, upload(be, in.pred), upload(be, in.target), &dl2, none));
    CHECK_SAME(compareScalar(dl2, l, 1e-5, 1e-6, "loss without dPred"));
}

void TstOps::argmaxMatches()
{
    OPEN_BACKEND(kArgmax, OpKind::ArgmaxMatches);
    Tensor pred, target;
    std::uniform_int_distribution<int32_t> cls(0, int32_t(c.c) - 1);
    std::uniform_real_distribution<float> u01(0.0f, 1.0f);
    const bool fromLogits = c.mode == 2;
    switch (c.mode) {
    case 0: case 1: {
        pred = randomTensor(Shape{c.n, c.c}, rng);
        std::vector<int32_t> labels(std::size_t(c.n));
        // Roughly half the rows match: the label is the argmax or a random class.
        for (int64_t r = 0; r < c.n; ++r) {
            const float* row = pred.data<float>() + r * c.c;
            labels[std::size_t(r)] = r % 2 ? int32_t(std::max_element(row, row + c.c) - row) : cls(rng);
        }
        if (c.mode == 0) {
            target = intTensor(Shape{c.n}, labels);
        } else {
            target = Tensor::zeros(Shape{c.n, c.c});
            for (int64_t r = 0; r < c.n; ++r) target.data<float>()[r * c.c + labels[std::size_t(r)]] = 1.0f;
        }
        break;
    }
    case 2: case 3: case 4: {
        pred = fromLogits ? randomTensor(Shape{c.n, 1}, rng, -3, 3) : randomTensor(Shape{c.n, 1}, rng, 0, 1);
        if (c.mode == 4) {
            std::vector<int32_t> labels(std::size_t(c.n));
            for (auto& v : labels) v = u01(rng) < 0.5f ? 0 : 1;
            target = intTensor(Shape{c.n, 1}, labels);
        } else {
            target = Tensor::empty(Shape{c.n, 1});
            for (int64_t r = 0; r < c.n; ++r) target.data<float>()[r] = u01(rng) < 0.5f ? 0.0f : 1.0f;
        }
        break;
    }
    }
    int64_t expect = -1, got = -2;
    CHECK_OK(ref.argmaxMatches(pred, target, fromLogits, &expect));
    CHECK_OK(be.argmaxMatches(upload(be, pred), upload(be, target), fromLogits, &got));
    QCOMPARE(got, expect);
}

void TstOps::optimizer()
{
    auto opOf = [](int i) {
        const int kind = kOpt[std::size_t(i)].kind;
        return kind == 0 ? OpKind::SgdUpdate : kind == 1 ? OpKind::AdamUpdate : OpKind::RmspropUpdate;
    };
    OPEN_BACKEND(kOpt, opOf(index));
    const Shape s{c.n};
    Tensor p = randomTensor(s, rng);
    // Zero state, like a fresh optimizer; the steps fill it.
    Tensor s1 = Tensor::zeros(s), s2 = Tensor::zeros(s), s3 = Tensor::zeros(s);
    Tensor dp = upload(be, p), ds1 = upload(be, s1), ds2 = upload(be, s2), ds3 = upload(be, s3);
    for (int step = 1; step <= 6; ++step) {
        // Gradients of mixed magnitude, including tiny ones where eps matters.
        Tensor g = randomTensor(s, rng);
        for (int64_t i = 0; i < c.n; i += 5) g.data<float>()[i] *= 1e-4f;
        Tensor dg = upload(be, g);
        switch (c.kind) {
        case 0:
            CHECK_OK(ref.sgdUpdate(c.sgd, p, g, s1));
            CHECK_OK(be.sgdUpdate(c.sgd, dp, dg, ds1));
            break;
        case 1: {
            AdamParams ap = c.adam;
            ap.step = step;
            CHECK_OK(ref.adamUpdate(ap, p, g, s1, s2));
            CHECK_OK(be.adamUpdate(ap, dp, dg, ds1, ds2));
            break;
        }
        default:
            CHECK_OK(ref.rmspropUpdate(c.rms, p, g, s1, s2, s3));
            CHECK_OK(be.rmspropUpdate(c.rms, dp, dg, ds1, ds2, ds3));
            break;
        }
    }
    CHECK_SAME(compare(download(be, dp), p, 1e-5, 1e-6, "param after 6 steps"));
    CHECK_SAME(compare(download(be, ds1), s1, 1e-4, 1e-7, "state 1"));
    CHECK_SAME(compare(download(be, ds2), s2, 1e-4, 1e-7, "state 2"));
    CHECK_SAME(compare(download(be, ds3), s3, 1e-4, 1e-7, "state 3"));
}

void TstOps::sumSquares()
{
    OPEN_BACKEND(kElt, OpKind::SumSquares);
    Tensor x = randomTensor(Shape{c.n}, rng, -3.0f, 3.0f);
    double expect = -1, got = -2;
    CHECK_OK(ref.sumSquares(x, &expect));
    CHECK_OK(be.sumSquares(upload(be, x), &got));
    CHECK_SAME(compareScalar(got, expect, 1e-6, 1e-12, "sum of squares"));
    // NaN must surface (the NaN guard relies on it).
    x.data<float>()[c.n / 2] = kNaN;
    CHECK_OK(be.sumSquares(upload(be, x), &got));
    QVERIFY2(std::isnan(got), "sumSquares hides a NaN");
}

void TstOps::copies()
{
    OPEN_BACKEND(kCopy, OpKind::CopyFromHost);
    if (!be.supportsOp(OpKind::CopyToHost)) QSKIP("backend lacks copy_to_host");
    Tensor h = Tensor::empty(Shape{c.n}, c.dtype);
    auto* bytes = static_cast<uint8_t*>(h.raw());
    for (std::size_t i = 0; i < h.bytes(); ++i) bytes[i] = uint8_t(rng());
    if (c.dtype == DType::F32)  // keep the floats finite so compare() means something
        for (int64_t i = 0; i < c.n; ++i) h.data<float>()[i] = float(i) * 0.5f - 3.0f;
    Tensor back = download(be, upload(be, h));
    QCOMPARE(std::memcmp(back.raw(), h.raw(), h.bytes()), 0);
}

// ====================================================================== part 2

void TstOps::fdDense_data()
{
    QTest::addColumn<int>("n");
    QTest::addColumn<int>("in");
    QTest::addColumn<int>("out");
    QTest::addColumn<bool>("bias");
    QTest::newRow("1x1x1") << 1 << 1 << 1 << true;
    QTest::newRow("3x5x4") << 3 << 5 << 4 << true;
    QTest::newRow("4x7x3 no bias") << 4 << 7 << 3 << false;
}

void TstOps::fdDense()
{
    QFETCH(int, n);
    QFETCH(int, in);
    QFETCH(int, out);
    QFETCH(bool, bias);
    auto rng = rngFor(QTest::currentDataTag());
    ReferenceBackend ref;
    Tensor x = randomTensor(Shape{n, in}, rng), w = randomTensor(Shape{in, out}, rng);
    Tensor b = bias ? randomTensor(Shape{out}, rng) : Tensor();
    Tensor r = randomTensor(Shape{n, out}, rng);
    Tensor y = Tensor::empty(Shape{n, out});
    auto objective = [&] {
        (void)ref.denseForward(x, w, b, Activation::Linear, y);
        return dot(y, r);
    };
    Tensor dx = Tensor::empty(x.shape()), dw = Tensor::empty(w.shape()), db = Tensor::empty(Shape{out}), noDb;
    CHECK_OK(ref.denseBackward(x, w, r, dx, dw, bias ? db : noDb, false));
    CHECK_SAME(checkGradient(objective, x, dx, "dX"));
    CHECK_SAME(checkGradient(objective, w, dw, "dW"));
    if (bias) CHECK_SAME(checkGradient(objective, b, db, "db"));
}

void TstOps::fdConv_data()
{
    QTest::addColumn<int>("index");
    // Small versions of the cross-backend cases: every stride/padding variant.
    const std::vector<int> picks = {0, 1, 2, 3, 4, 7};
    for (int i : picks) QTest::newRow(kConv[std::size_t(i)].name.c_str()) << i;
}

void TstOps::fdConv()
{
    QFETCH(int, index);
    ConvCase c = kConv[std::size_t(index)];
    c.n = std::min<int64_t>(c.n, 2);
    c.c = std::min<int64_t>(c.c, 3);
    c.f = std::min<int64_t>(c.f, 3);
    auto rng = rngFor(QTest::currentDataTag());
    ReferenceBackend ref;
    Tensor x = randomTensor(Shape{c.n, c.h, c.w, c.c}, rng), w = randomTensor(Shape{c.kh, c.kw, c.c, c.f}, rng);
    Tensor b = c.bias ? randomTensor(Shape{c.f}, rng) : Tensor();
    const Shape ys{c.n, c.oh(), c.ow(), c.f};
    Tensor r = randomTensor(ys, rng), y = Tensor::empty(ys);
    auto objective = [&] {
        (void)ref.conv2dForward(x, w, b, c.params(), y);
        return dot(y, r);
    };
    Tensor dx = Tensor::empty(x.shape()), dw = Tensor::empty(w.shape()), db = Tensor::empty(Shape{c.f}), noDb;
    CHECK_OK(ref.conv2dBackwardData(r, w, c.params(), dx));
    CHECK_OK(ref.conv2dBackwardWeights(x, r, c.params(), dw, c.bias ? db : noDb));
    CHECK_SAME(checkGradient(objective, x, dx, "dX"));
    CHECK_SAME(checkGradient(objective, w, dw, "dW"));
    if (c.bias) CHECK_SAME(checkGradient(objective, b, db, "db"));
}

void TstOps::fdPool_data()
{
    QTest::addColumn<int>("index");
    for (std::size_t i = 0; i < kPool.size(); ++i)
        if (!kPool[i].ties) QTest::newRow(kPool[i].name.c_str()) << int(i);
}

void TstOps::fdPool()
{
    QFETCH(int, index);
    PoolCase c = kPool[std::size_t(index)];
    c.c = std::min<int64_t>(c.c, 3);
    auto rng = rngFor(QTest::currentDataTag());
    ReferenceBackend ref;
    Tensor x = distinctTensor(Shape{c.n, c.h, c.w, c.c}, rng);
    const Shape ys{c.n, c.oh(), c.ow(), c.c};
    Tensor r = randomTensor(ys, rng), y = Tensor::empty(ys);
    Tensor ws = c.kind == PoolKind::Max ? Tensor::empty(ys, DType::I32) : Tensor();
    auto objective = [&] {
        (void)ref.pool2dForward(x, c.params(), y, ws);
        return dot(y, r);
    };
    objective();
    Tensor dx = Tensor::empty(x.shape());
    CHECK_OK(ref.pool2dBackward(r, ws, c.params(), dx));
    CHECK_SAME(checkGradient(objective, x, dx, "dX"));
}

void TstOps::fdGlobalAvgPool()
{
    auto rng = rngFor("gap");
    ReferenceBackend ref;
    Tensor x = randomTensor(Shape{2, 3, 4, 3}, rng), r = randomTensor(Shape{2, 3}, rng), y = Tensor::empty(Shape{2, 3});
    auto objective = [&] {
        (void)ref.globalAvgPoolForward(x, y);
        return dot(y, r);
    };
    Tensor dx = Tensor::empty(x.shape());
    CHECK_OK(ref.globalAvgPoolBackward(r, dx));
    CHECK_SAME(checkGradient(objective, x, dx, "dX"));
}

void TstOps::fdBatchNorm_data()
{
    QTest::addColumn<Shape>("shape");
    QTest::newRow("2d 6x3") << Shape{6, 3};
    QTest::newRow("4d 2x3x3x2") << Shape{2, 3, 3, 2};
    QTest::newRow("4d batch 1 1x2x3x4") << Shape{1, 2, 3, 4};
}

void TstOps::fdBatchNorm()
{
    QFETCH(Shape, shape);
    const int64_t C = shape[-1];
    auto rng = rngFor(QTest::currentDataTag());
    ReferenceBackend ref;
    Tensor x = randomTensor(shape, rng, -2.0f, 2.0f);
    Tensor gamma = randomTensor(Shape{C}, rng, 0.5f, 1.5f), beta = randomTensor(Shape{C}, rng);
    Tensor r = randomTensor(shape, rng), y = Tensor::empty(shape);
    Tensor rm = Tensor::zeros(Shape{C}), rv = filled(Shape{C}, 1.0f);
    Tensor sm = Tensor::empty(Shape{C}), si = Tensor::empty(Shape{C});
    auto objective = [&] {
        (void)ref.batchNormForward(x, gamma, beta, rm, rv, true, 0.9f, 1e-3f, y, sm, si);
        return dot(y, r);
    };
    objective();
    Tensor dx = Tensor::empty(shape), dg = Tensor::empty(Shape{C}), db = Tensor::empty(Shape{C});
    CHECK_OK(ref.batchNormBackward(x, gamma, sm, si, r, dx, dg, db));
    CHECK_SAME(checkGradient(objective, x, dx, "dX"));
    CHECK_SAME(checkGradient(objective, gamma, dg, "dgamma"));
    CHECK_SAME(checkGradient(objective, beta, db, "dbeta"));
}

void TstOps::fdActivation_data()
{
    QTest::addColumn<int>("act");
    QTest::addColumn<float>("alpha");
    QTest::newRow("linear") << int(Activation::Linear) << 0.0f;
    QTest::newRow("relu") << int(Activation::Relu) << 0.0f;
    QTest::newRow("leaky_relu 0.2") << int(Activation::LeakyRelu) << 0.2f;
    QTest::newRow("gelu") << int(Activation::Gelu) << 0.0f;
    QTest::newRow("sigmoid") << int(Activation::Sigmoid) << 0.0f;
    QTest::newRow("tanh") << int(Activation::Tanh) << 0.0f;
    QTest::newRow("softmax (activation op)") << int(Activation::Softmax) << 0.0f;
    QTest::newRow("softmax (softmax op)") << -1 << 0.0f;
}

void TstOps::fdActivation()
{
    QFETCH(int, act);
    QFETCH(float, alpha);
    auto rng = rngFor(QTest::currentDataTag());
    ReferenceBackend ref;
    const Shape s{4, 6};
    // Distinct values keep relu's kink out of the difference stencil.
    Tensor x = distinctTensor(s, rng);
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] *= 2.5f;
    Tensor r = randomTensor(s, rng), y = Tensor::empty(s);
    const Activation a = act < 0 ? Activation::Softmax : Activation(act);
    auto forward = [&] {
        if (act < 0) (void)ref.softmaxForward(x, y);
        else (void)ref.activationForward(a, alpha, x, y);
    };
    auto objective = [&] {
        forward();
        return dot(y, r);
    };
    forward();
    Tensor dx = Tensor::empty(s);
    if (act < 0) CHECK_OK(ref.softmaxBackward(y, r, dx));
    else CHECK_OK(ref.activationBackward(a, alpha, x, y, r, dx));
    CHECK_SAME(checkGradient(objective, x, dx, "dX"));
    // Either forward tensor suffices where the maths allows: the backward must agree.
    forward();  // y of the unperturbed x again
    if (a == Activation::Relu || a == Activation::LeakyRelu || a == Activation::Sigmoid || a == Activation::Tanh) {
        Tensor dxOnlyY = Tensor::empty(s), dxOnlyX = Tensor::empty(s);
        CHECK_OK(ref.activationBackward(a, alpha, Tensor(), y, r, dxOnlyY));
        CHECK_OK(ref.activationBackward(a, alpha, x, Tensor(), r, dxOnlyX));
        CHECK_SAME(compare(dxOnlyY, dx, 1e-6, 1e-7, "dX from y only"));
        CHECK_SAME(compare(dxOnlyX, dx, 1e-5, 1e-7, "dX from x only"));
    }
}

void TstOps::fdLoss_data()
{
    QTest::addColumn<int>("index");
    for (std::size_t i = 0; i < kLoss.size(); ++i)
        if (kLoss[i].spread <= 2.0f)  // clipped cases have zero-gradient plateaus by design
            QTest::newRow(kLoss[i].name.c_str()) << int(i);
}

void TstOps::fdLoss()
{
    QFETCH(int, index);
    const LossCase& c = kLoss[std::size_t(index)];
    auto rng = rngFor(QTest::currentDataTag());
    ReferenceBackend ref;
    LossInputs in = makeLossInputs(c, rng);
    LossParams p;
    p.kind = c.kind;
    p.fromLogits = c.fromLogits;
    p.globalBatch = c.globalBatch;
    p.gradScale = c.gradScale;
    const int64_t n = c.shape[0];
    const double nGlobal = c.globalBatch > 0 ? double(c.globalBatch) : double(n);
    // The loss is the local mean; dpred is d(gradScale * sum / N_global).
    const double toObjective = c.gradScale * double(n) / nGlobal;
    Tensor none;
    auto objective = [&] {
        float l = 0;
        (void)ref.loss(p, in.pred, in.target, &l, none);
        return double(l) * toObjective;
    };
    Tensor g = Tensor::empty(c.shape);
    float l = 0;
    CHECK_OK(ref.loss(p, in.pred, in.target, &l, g));
    QVERIFY(std::isfinite(l) && l >= 0);
    // Probabilities sit close to 0 where -log is steep: a smaller step keeps the truncation error
    // of the central difference below the tolerance.
    const bool probs = !c.fromLogits && c.kind != LossKind::MeanSquaredError;
    CHECK_SAME(checkGradient(objective, in.pred, g, "dPred", probs ? 2e-4f : 2e-3f, 1e-2, 2e-3 * toObjective));
    // The target of BCE/MSE/CCE with soft labels is differentiable too, but no op returns its
    // gradient; nothing further to check.
}

void TstOps::fdConcat()
{
    auto rng = rngFor("concat");
    ReferenceBackend ref;
    std::vector<Tensor> xs = {randomTensor(Shape{2, 2, 3}, rng), randomTensor(Shape{2, 2, 1}, rng),
                              randomTensor(Shape{2, 2, 4}, rng)};
    Tensor r = randomTensor(Shape{2, 2, 8}, rng), y = Tensor::empty(Shape{2, 2, 8});
    auto objective = [&] {
        (void)ref.concatForward(xs, y);
        return dot(y, r);
    };
    std::vector<Tensor> dxs = {Tensor::empty(xs[0].shape()), Tensor::empty(xs[1].shape()), Tensor::empty(xs[2].shape())};
    CHECK_OK(ref.concatBackward(r, dxs));
    for (std::size_t i = 0; i < xs.size(); ++i) CHECK_SAME(checkGradient(objective, xs[i], dxs[i], "dX" + std::to_string(i)));
}

void TstOps::fdDropout()
{
    auto rng = rngFor("dropout");
    ReferenceBackend ref;
    const Shape s{5, 7};
    Tensor x = randomTensor(s, rng), r = randomTensor(s, rng), y = Tensor::empty(s);
    Tensor mask = Tensor::empty(s, DType::U8);
    auto objective = [&] {
        (void)ref.dropoutForward(x, 0.4f, 1234, mask, y);
        return dot(y, r);
    };
    objective();
    Tensor dx = Tensor::empty(s);
    CHECK_OK(ref.dropoutBackward(r, mask, 0.4f, dx));
    CHECK_SAME(checkGradient(objective, x, dx, "dX"));
}

// ====================================================================== part 3

void TstOps::activationNames()
{
    for (Activation a : {Activation::Linear, Activation::Relu, Activation::LeakyRelu, Activation::Gelu,
                         Activation::Sigmoid, Activation::Tanh, Activation::Softmax}) {
        auto r = parseActivation(activationName(a));
        QVERIFY(r.ok());
        QCOMPARE(int(*r), int(a));
    }
    QVERIFY(parseActivation("None").ok() && *parseActivation("None") == Activation::Linear);
    auto bad = parseActivation("swish2");
    QVERIFY(!bad.ok());
    QCOMPARE(int(bad.error().code), int(ErrorCode::InvalidArgument));
    QVERIFY(bad.error().message.find("swish2") != std::string::npos);
    QVERIFY(bad.error().hint.find("leaky_relu") != std::string::npos);
    QCOMPARE(std::string(opKindName(OpKind::Conv2dBackwardWeights)), std::string("conv2d_backward_weights"));
}

void TstOps::dropoutMaskStatistics()
{
    for (float rate : {0.1f, 0.5f, 0.9f}) {
        int64_t kept = 0;
        const int64_t n = 200000;
        for (int64_t i = 0; i < n; ++i) kept += dropoutKeep(99, uint64_t(i), rate);
        QVERIFY2(std::abs(double(kept) / n - (1.0 - rate)) < 0.005, qPrintable(QString::number(kept)));
    }
    for (int64_t i = 0; i < 1000; ++i) {
        QVERIFY(dropoutKeep(7, uint64_t(i), 0.0f));
        QVERIFY(!dropoutKeep(7, uint64_t(i), 1.0f));
        QCOMPARE(dropoutKeep(7, uint64_t(i), 0.5f), dropoutKeep(7, uint64_t(i), 0.5f));
    }
    // Different seeds give different masks.
    int differ = 0;
    for (int64_t i = 0; i < 1000; ++i) differ += dropoutKeep(1, uint64_t(i), 0.5f) != dropoutKeep(2, uint64_t(i), 0.5f);
    QVERIFY(differ > 400 && differ < 600);
    // Pinned values: a GPU kernel must reproduce these bits.
    std::string bits;
    for (int64_t i = 0; i < 32; ++i) bits += dropoutKeep(42, uint64_t(i), 0.5f) ? '1' : '0';
    QCOMPARE(bits, std::string("10000001100111110110101101110110"));
}

void TstOps::maxPoolTiesPickFirst()
{
    ReferenceBackend ref;
    // (1, 2, 2, 2): channel 0 all equal, channel 1 max at (1, 0) and (1, 1).
    Tensor x = Tensor::fromVector(Shape{1, 2, 2, 2}, {5, 1, 5, 2, 5, 3, 5, 3});
    Pool2dParams p;
    Tensor y = Tensor::empty(Shape{1, 1, 1, 2}), ws = Tensor::empty(Shape{1, 1, 1, 2}, DType::I32);
    CHECK_OK(ref.pool2dForward(x, p, y, ws));
    QCOMPARE(y.data<float>()[0], 5.0f);
    QCOMPARE(y.data<float>()[1], 3.0f);
    QCOMPARE(ws.data<int32_t>()[0], 0);  // (0,0,c0)
    QCOMPARE(ws.data<int32_t>()[1], 5);  // (1,0,c1), before (1,1,c1) = 7
    Tensor dy = Tensor::fromVector(Shape{1, 1, 1, 2}, {2, 3}), dx = Tensor::empty(x.shape());
    CHECK_OK(ref.pool2dBackward(dy, ws, p, dx));
    QCOMPARE(dx.toVector(), (std::vector<float>{2, 0, 0, 0, 0, 3, 0, 0}));
    // Flat index is into the whole input: batch 1 of two.
    Tensor x2 = Tensor::fromVector(Shape{2, 2, 2, 1}, {0, 0, 0, 0, 1, 4, 2, 3});
    Tensor y2 = Tensor::empty(Shape{2, 1, 1, 1}), ws2 = Tensor::empty(Shape{2, 1, 1, 1}, DType::I32);
    CHECK_OK(ref.pool2dForward(x2, p, y2, ws2));
    QCOMPARE(ws2.data<int32_t>()[0], 0);
    QCOMPARE(ws2.data<int32_t>()[1], 5);
}

void TstOps::avgPoolCountsInBoundsOnly()
{
    ReferenceBackend ref;
    Tensor x = filled(Shape{1, 3, 3, 1}, 1.0f);
    Pool2dParams p;
    p.kind = PoolKind::Avg;
    p.windowH = p.windowW = 3;
    p.strideH = p.strideW = 1;
    p.padTop = p.padBottom = p.padLeft = p.padRight = 1;
    Tensor y = Tensor::empty(Shape{1, 3, 3, 1});
    Tensor none;
    CHECK_OK(ref.pool2dForward(x, p, y, none));
    for (float v : y.toVector()) QCOMPARE(v, 1.0f);
    // Corner output covers 4 inputs: each gets 1/4 of its gradient.
    Tensor dy = Tensor::zeros(Shape{1, 3, 3, 1});
    dy.data<float>()[0] = 1.0f;
    Tensor dx = Tensor::empty(x.shape());
    CHECK_OK(ref.pool2dBackward(dy, none, p, dx));
    QCOMPARE(dx.toVector(), (std::vector<float>{0.25f, 0.25f, 0, 0.25f, 0.25f, 0, 0, 0, 0}));
}

void TstOps::batchNormRunningStats()
{
    ReferenceBackend ref;
    // One channel, values 1..4: mean 2.5, biased var 1.25, unbiased var 5/3.
    Tensor x = Tensor::fromVector(Shape{4, 1}, {1, 2, 3, 4});
    Tensor gamma = filled(Shape{1}, 2.0f), beta = filled(Shape{1}, 0.5f);
    Tensor rm = filled(Shape{1}, 1.0f), rv = filled(Shape{1}, 1.0f);
    Tensor y = Tensor::empty(x.shape()), sm = Tensor::empty(Shape{1}), si = Tensor::empty(Shape{1});
    CHECK_OK(ref.batchNormForward(x, gamma, beta, rm, rv, true, 0.9f, 0.0f, y, sm, si));
    QCOMPARE(sm.data<float>()[0], 2.5f);
    CHECK_SAME(compareScalar(si.data<float>()[0], 1.0 / std::sqrt(1.25), 1e-6, 0, "saveInvStd"));
    CHECK_SAME(compareScalar(rm.data<float>()[0], 0.9 * 1.0 + 0.1 * 2.5, 1e-6, 0, "running mean"));
    CHECK_SAME(compareScalar(rv.data<float>()[0], 0.9 * 1.0 + 0.1 * (5.0 / 3.0), 1e-6, 0, "running var"));
    CHECK_SAME(compareScalar(y.data<float>()[0], 2.0 * (1 - 2.5) / std::sqrt(1.25) + 0.5, 1e-6, 0, "y"));
    // Inference uses the running statistics and leaves the saved ones alone.
    sm.fill(-1.0f);
    CHECK_OK(ref.batchNormForward(x, gamma, beta, rm, rv, false, 0.9f, 1e-3f, y, sm, si));
    QCOMPARE(sm.data<float>()[0], -1.0f);
    const double rmv = rm.data<float>()[0], rvv = rv.data<float>()[0];
    CHECK_SAME(compareScalar(y.data<float>()[3], 2.0 * (4 - rmv) / std::sqrt(rvv + 1e-3) + 0.5, 1e-6, 0, "y inference"));
    QCOMPARE(rm.data<float>()[0], float(rmv));
}

void TstOps::sgdMatchesTorch()
{
    // torch.optim.SGD([p], lr=0.1, momentum=0.9[, nesterov=True]) with p=1 and constant grad 1.
    ReferenceBackend ref;
    for (bool nesterov : {false, true}) {
        SgdParams sp;
        sp.lr = 0.1f;
        sp.momentum = 0.9f;
        sp.nesterov = nesterov;
        Tensor p = filled(Shape{1}, 1.0f), g = filled(Shape{1}, 1.0f), v = Tensor::zeros(Shape{1});
        CHECK_OK(ref.sgdUpdate(sp, p, g, v));
        CHECK_SAME(compareScalar(p.data<float>()[0], nesterov ? 0.81 : 0.9, 1e-6, 0, "step 1"));
        CHECK_OK(ref.sgdUpdate(sp, p, g, v));
        CHECK_SAME(compareScalar(p.data<float>()[0], nesterov ? 0.539 : 0.71, 1e-6, 0, "step 2"));
        CHECK_SAME(compareScalar(v.data<float>()[0], 1.9, 1e-6, 0, "velocity"));
    }
    // Weight decay is L2 on the gradient: g' = 1 + 0.5 * 2.
    SgdParams sp;
    sp.lr = 0.1f;
    sp.weightDecay = 0.5f;
    Tensor p = filled(Shape{1}, 2.0f), g = filled(Shape{1}, 1.0f), none;
    CHECK_OK(ref.sgdUpdate(sp, p, g, none));
    CHECK_SAME(compareScalar(p.data<float>()[0], 1.8, 1e-6, 0, "weight decay"));
}

void TstOps::adamFirstStep()
{
    ReferenceBackend ref;
    AdamParams ap;
    ap.lr = 0.01f;
    ap.epsilon = 1e-8f;
    Tensor p = Tensor::fromVector(Shape{2}, {1.0f, -1.0f}), g = Tensor::fromVector(Shape{2}, {0.3f, -2.0f});
    Tensor m = Tensor::zeros(Shape{2}), v = Tensor::zeros(Shape{2});
    CHECK_OK(ref.adamUpdate(ap, p, g, m, v));
    // Bias correction makes the first step lr * sign(g).
    CHECK_SAME(compareScalar(p.data<float>()[0], 0.99, 1e-6, 0, "p0"));
    CHECK_SAME(compareScalar(p.data<float>()[1], -0.99, 1e-6, 0, "p1"));
    CHECK_SAME(compareScalar(m.data<float>()[0], 0.03, 1e-6, 0, "m"));
    CHECK_SAME(compareScalar(v.data<float>()[1], 0.004, 1e-4, 0, "v"));  // 1 - 0.999f is not 1e-3
    // AdamW decays first: p = 1 - 0.01 * 0.1 * 1, then the Adam step.
    ap.weightDecay = 0.1f;
    Tensor p2 = filled(Shape{1}, 1.0f), g2 = filled(Shape{1}, 0.5f), m2 = Tensor::zeros(Shape{1}), v2 = Tensor::zeros(Shape{1});
    CHECK_OK(ref.adamUpdate(ap, p2, g2, m2, v2));
    CHECK_SAME(compareScalar(p2.data<float>()[0], 1.0 - 0.001 - 0.01, 1e-6, 0, "adamw"));
}

void TstOps::rmspropKerasForm()
{
    ReferenceBackend ref;
    RmspropParams rp;
    rp.lr = 0.1f;
    rp.rho = 0.9f;
    rp.epsilon = 1e-7f;
    Tensor p = filled(Shape{1}, 1.0f), g = filled(Shape{1}, 2.0f), ms = Tensor::zeros(Shape{1}), none;
    CHECK_OK(ref.rmspropUpdate(rp, p, g, ms, none, none));
    // ms = 0.1 * 4 = 0.4; p -= 0.1 * 2 / sqrt(0.4 + 1e-7)
    CHECK_SAME(compareScalar(ms.data<float>()[0], 0.4, 1e-6, 0, "ms"));
    CHECK_SAME(compareScalar(p.data<float>()[0], 1.0 - 0.2 / std::sqrt(0.4 + 1e-7), 1e-6, 0, "p"));
    // Centered with momentum: mg = 0.2, denom = 0.4 - 0.04; mom = 0.2 / sqrt(0.36 + eps).
    rp.centered = true;
    rp.momentum = 0.5f;
    Tensor p2 = filled(Shape{1}, 1.0f), ms2 = Tensor::zeros(Shape{1}), mom = Tensor::zeros(Shape{1}), mg = Tensor::zeros(Shape{1});
    CHECK_OK(ref.rmspropUpdate(rp, p2, g, ms2, mom, mg));
    const double inc = 0.2 / std::sqrt(0.36 + 1e-7);
    CHECK_SAME(compareScalar(mg.data<float>()[0], 0.2, 1e-6, 0, "mg"));
    CHECK_SAME(compareScalar(mom.data<float>()[0], inc, 1e-6, 0, "mom"));
    CHECK_SAME(compareScalar(p2.data<float>()[0], 1.0 - inc, 1e-6, 0, "p centered"));
    CHECK_OK(ref.rmspropUpdate(rp, p2, g, ms2, mom, mg));
    const double ms3 = 0.9 * 0.4 + 0.1 * 4, mg3 = 0.9 * 0.2 + 0.1 * 2;
    const double inc2 = 0.2 / std::sqrt(ms3 - mg3 * mg3 + 1e-7);
    CHECK_SAME(compareScalar(p2.data<float>()[0], 1.0 - inc - (0.5 * inc + inc2), 1e-6, 0, "p step 2"));
}

void TstOps::lossValues()
{
    ReferenceBackend ref;
    Tensor none;
    float l = 0;
    LossParams p;
    // Uniform logits: log(C).
    Tensor logits = Tensor::zeros(Shape{3, 4});
    CHECK_OK(ref.loss(p, logits, intTensor(Shape{3}, {0, 1, 3}), &l, none));
    CHECK_SAME(compareScalar(l, std::log(4.0), 1e-6, 0, "sparse cce uniform"));
    // Probabilities are normalised then clipped like Keras: a zero probability costs -log(1e-7).
    p.fromLogits = false;
    Tensor probs = Tensor::fromVector(Shape{1, 3}, {0.0f, 0.5f, 0.5f});
    CHECK_OK(ref.loss(p, probs, intTensor(Shape{1}, {0}), &l, none));
    CHECK_SAME(compareScalar(l, -std::log(1e-7), 1e-5, 0, "sparse cce clipped"));
    Tensor unnorm = Tensor::fromVector(Shape{1, 2}, {1.0f, 3.0f});
    CHECK_OK(ref.loss(p, unnorm, intTensor(Shape{1}, {1}), &l, none));
    CHECK_SAME(compareScalar(l, -std::log(0.75), 1e-6, 0, "sparse cce normalises"));
    // BCE from logits 0: log 2; mean over the row's elements then rows.
    p.kind = LossKind::BinaryCrossentropy;
    p.fromLogits = true;
    CHECK_OK(ref.loss(p, Tensor::zeros(Shape{2, 3}), filled(Shape{2, 3}, 1.0f), &l, none));
    CHECK_SAME(compareScalar(l, std::log(2.0), 1e-6, 0, "bce logits"));
    // Stable for large logits: x = 100, z = 0 costs 100.
    CHECK_OK(ref.loss(p, filled(Shape{1, 1}, 100.0f), Tensor::zeros(Shape{1, 1}), &l, none));
    CHECK_SAME(compareScalar(l, 100.0, 1e-6, 0, "bce large logit"));
    p.fromLogits = false;
    CHECK_OK(ref.loss(p, Tensor::fromVector(Shape{1, 2}, {0.8f, 0.0f}), Tensor::fromVector(Shape{1, 2}, {1.0f, 1.0f}), &l, none));
    CHECK_SAME(compareScalar(l, 0.5 * (-std::log(0.8) - std::log(1e-7)), 1e-5, 0, "bce probs clipped"));
    // MSE: per-row mean of squares, then the batch mean.
    p.kind = LossKind::MeanSquaredError;
    CHECK_OK(ref.loss(p, Tensor::fromVector(Shape{2, 2}, {1, 2, 3, 4}), Tensor::fromVector(Shape{2, 2}, {0, 0, 0, 0}), &l, none));
    CHECK_SAME(compareScalar(l, ((1 + 4) / 2.0 + (9 + 16) / 2.0) / 2.0, 1e-6, 0, "mse"));
}

void TstOps::lossGradientScaling()
{
    // Two replicas with half the batch each and globalBatch = N sum to the single-replica gradient.
    auto rng = rngFor("scaling");
    ReferenceBackend ref;
    Tensor x = randomTensor(Shape{6, 5}, rng);
    Tensor labels = intTensor(Shape{6}, {0, 1, 2, 3, 4, 0});
    LossParams p;
    p.gradScale = 8.0f;
    Tensor full = Tensor::empty(x.shape());
    float lFull = 0, lA = 0, lB = 0;
    CHECK_OK(ref.loss(p, x, labels, &lFull, full));
    p.globalBatch = 6;
    Tensor a = Tensor::empty(Shape{3, 5}), b = Tensor::empty(Shape{3, 5});
    CHECK_OK(ref.loss(p, x.rows(0, 3), labels.rows(0, 3), &lA, a));
    CHECK_OK(ref.loss(p, x.rows(3, 6), labels.rows(3, 6), &lB, b));
    CHECK_SAME(compareScalar(0.5 * (lA + lB), lFull, 1e-6, 0, "mean of replica losses"));
    CHECK_SAME(compare(a, full.rows(0, 3).clone(), 1e-6, 1e-7, "replica 0 gradient"));
    CHECK_SAME(compare(b, full.rows(3, 6).clone(), 1e-6, 1e-7, "replica 1 gradient"));
    // The loss value ignores gradScale.
    LossParams plain;
    float lPlain = 0;
    Tensor none;
    CHECK_OK(ref.loss(plain, x, labels, &lPlain, none));
    QCOMPARE(lPlain, lFull);
}

void TstOps::lossRejectsBadLabel()
{
    ReferenceBackend ref;
    LossParams p;
    float l = 0;
    Tensor none;
    Status st = ref.loss(p, Tensor::zeros(Shape{2, 3}), intTensor(Shape{2}, {1, 3}), &l, none);
    QVERIFY(!st.ok());
    QCOMPARE(int(st.error().code), int(ErrorCode::InvalidArgument));
    QVERIFY(st.error().message.find("row 1") != std::string::npos);
}

void TstOps::argmaxSemantics()
{
    ReferenceBackend ref;
    int64_t m = -1;
    // Ties pick the first class.
    Tensor pred = Tensor::fromVector(Shape{3, 3}, {1, 1, 0, 0, 2, 2, 0, 0, 5});
    CHECK_OK(ref.argmaxMatches(pred, intTensor(Shape{3}, {0, 1, 2}), false, &m));
    QCOMPARE(m, int64_t(3));
    Tensor oneHot = Tensor::fromVector(Shape{3, 3}, {0, 1, 0, 0, 1, 0, 0, 0, 1});
    CHECK_OK(ref.argmaxMatches(pred, oneHot, false, &m));
    QCOMPARE(m, int64_t(2));
    Tensor bin = Tensor::fromVector(Shape{4, 1}, {0.7f, 0.2f, 0.5f, -1.0f});
    Tensor t = Tensor::fromVector(Shape{4, 1}, {1, 0, 1, 0});
    CHECK_OK(ref.argmaxMatches(bin, t, false, &m));
    QCOMPARE(m, int64_t(3));  // 0.5 is not > 0.5
    CHECK_OK(ref.argmaxMatches(bin, t, true, &m));
    QCOMPARE(m, int64_t(3));  // 0.2 > 0 predicts 1
}

void TstOps::referenceFactory()
{
    const BackendFactory* f = BackendRegistry::instance().find("reference");
    QVERIFY(f);
    QCOMPARE(int(f->kind), int(DeviceKind::Cpu));
    const auto devices = f->enumerate();
    QCOMPARE(devices.size(), std::size_t(1));
    QCOMPARE(devices[0].device.toString(), std::string("cpu:0"));
    auto be = BackendRegistry::instance().create("reference", 3, BackendOptions{});
    QVERIFY(be.ok());
    QCOMPARE((*be)->device().index, 3);
    QCOMPARE((*be)->name(), std::string("reference"));
    for (int op = 0; op < int(OpKind::Count_); ++op) QVERIFY((*be)->supportsOp(OpKind(op)));
    QVERIFY(!BackendRegistry::instance().create("reference", -1, BackendOptions{}).ok());
}

// ====================================================================== mixed precision

namespace {
// 16-bit results may differ by one unit in the last place where two f32 sums in different
// orders straddle a rounding boundary: 2^-8 relative for bf16, 2^-11 for f16.
double mixedRtol(DType t) { return t == DType::BF16 ? 8e-3 : 1e-3; }
} // namespace

// After OPEN_BACKEND: the row's compute type as `type`, set on `be` and `ref` (skipping the row
// when the backend lacks it).
#define OPEN_COMPUTE_TYPE()                                                                              \
    QFETCH(int, computeType);                                                                            \
    const DType type = DType(computeType);                                                               \
    if (!be.supportsComputeType(type)) QSKIP(qPrintable(QString("backend computes no ") + dtypeName(type))); \
    CHECK_OK(be.setComputeType(type));                                                                   \
    CHECK_OK(ref.setComputeType(type))

void TstOps::mixedDense()
{
    OPEN_BACKEND(kDense, OpKind::DenseForward);
    OPEN_COMPUTE_TYPE();
    QCOMPARE(int(be.computeType()), computeType);
    const double rtol = mixedRtol(type), atol = 1e-3;
    Tensor x = randomTensor(Shape{c.n, c.in}, rng);
    Tensor w = randomTensor(Shape{c.in, c.out}, rng);
    Tensor b = c.bias ? randomTensor(Shape{c.out}, rng) : Tensor();
    Tensor y = filled(Shape{c.n, c.out}, kNaN);
    CHECK_OK(ref.denseForward(x, w, b, c.act, y));
    CHECK_SAME(representable(y, type, "reference Y"));
    Tensor dy = upload(be, filled(Shape{c.n, c.out}, kNaN));
    CHECK_OK(be.denseForward(upload(be, x), upload(be, w), c.bias ? upload(be, b) : Tensor(), c.act, dy));
    const Tensor got = download(be, dy);
    CHECK_SAME(compare(got, y, rtol, atol, "Y"));
    CHECK_SAME(representable(got, type, "Y"));

    Tensor gy = randomTensor(Shape{c.n, c.out}, rng);
    Tensor dw0 = c.accumulate ? randomTensor(Shape{c.in, c.out}, rng) : filled(Shape{c.in, c.out}, kNaN);
    Tensor db0 = c.accumulate ? randomTensor(Shape{c.out}, rng) : filled(Shape{c.out}, kNaN);
    Tensor dx = filled(Shape{c.n, c.in}, kNaN), dw = dw0.clone(), db = db0.clone(), noDb;
    CHECK_OK(ref.denseBackward(x, w, gy, dx, dw, c.bias ? db : noDb, c.accumulate));
    Tensor ddx = upload(be, filled(Shape{c.n, c.in}, kNaN)), ddw = upload(be, dw0), ddb = upload(be, db0), dNoDb;
    CHECK_OK(be.denseBackward(upload(be, x), upload(be, w), upload(be, gy), ddx, ddw, c.bias ? ddb : dNoDb, c.accumulate));
    const Tensor gdx = download(be, ddx), gdw = download(be, ddw);
    CHECK_SAME(compare(gdx, dx, rtol, atol, "dX"));
    CHECK_SAME(compare(gdw, dw, rtol, atol, "dW"));
    CHECK_SAME(representable(gdx, type, "dX"));
    CHECK_SAME(representable(gdw, type, "dW"));
    if (c.bias) {
        const Tensor gdb = download(be, ddb);
        CHECK_SAME(compare(gdb, db, rtol, atol, "db"));
        CHECK_SAME(representable(gdb, type, "db"));
    }
    // Back to float32: the same instance computes exactly as before.
    CHECK_OK(be.setComputeType(DType::F32));
    CHECK_OK(ref.setComputeType(DType::F32));
    Tensor y32 = filled(Shape{c.n, c.out}, kNaN), dy32 = upload(be, filled(Shape{c.n, c.out}, kNaN));
    CHECK_OK(ref.denseForward(x, w, b, c.act, y32));
    CHECK_OK(be.denseForward(upload(be, x), upload(be, w), c.bias ? upload(be, b) : Tensor(), c.act, dy32));
    CHECK_SAME(compare(download(be, dy32), y32, 1e-4, 1e-4, "Y in f32 again"));
}

void TstOps::mixedConv()
{
    OPEN_BACKEND(kConv, OpKind::Conv2dForward);
    OPEN_COMPUTE_TYPE();
    const double rtol = mixedRtol(type), atol = 1e-3;
    Tensor x = randomTensor(Shape{c.n, c.h, c.w, c.c}, rng);
    Tensor w = randomTensor(Shape{c.kh, c.kw, c.c, c.f}, rng);
    Tensor b = c.bias ? randomTensor(Shape{c.f}, rng) : Tensor();
    const Shape ys{c.n, c.oh(), c.ow(), c.f};
    Tensor y = filled(ys, kNaN);
    CHECK_OK(ref.conv2dForward(x, w, b, c.params(), y));
    Tensor dy = upload(be, filled(ys, kNaN));
    CHECK_OK(be.conv2dForward(upload(be, x), upload(be, w), c.bias ? upload(be, b) : Tensor(), c.params(), dy));
    const Tensor gotY = download(be, dy);
    CHECK_SAME(compare(gotY, y, rtol, atol, "Y"));
    CHECK_SAME(representable(gotY, type, "Y"));

    Tensor gy = randomTensor(ys, rng);
    const Shape xs{c.n, c.h, c.w, c.c};
    Tensor dx = filled(xs, kNaN);
    CHECK_OK(ref.conv2dBackwardData(gy, w, c.params(), dx));
    Tensor ddx = upload(be, filled(xs, kNaN));
    CHECK_OK(be.conv2dBackwardData(upload(be, gy), upload(be, w), c.params(), ddx));
    const Tensor gotDx = download(be, ddx);
    CHECK_SAME(compare(gotDx, dx, rtol, atol, "dX"));
    CHECK_SAME(representable(gotDx, type, "dX"));

    const Shape ws{c.kh, c.kw, c.c, c.f};
    Tensor dw = filled(ws, kNaN), db = filled(Shape{c.f}, kNaN), noDb;
    CHECK_OK(ref.conv2dBackwardWeights(x, gy, c.params(), dw, c.bias ? db : noDb));
    Tensor ddw = upload(be, filled(ws, kNaN)), ddb = upload(be, filled(Shape{c.f}, kNaN)), dNoDb;
    CHECK_OK(be.conv2dBackwardWeights(upload(be, x), upload(be, gy), c.params(), ddw, c.bias ? ddb : dNoDb));
    const Tensor gotDw = download(be, ddw);
    // dW sums over the whole batch: allow the 16-bit unit of its largest element.
    CHECK_SAME(compare(gotDw, dw, rtol, atol * 4, "dW"));
    CHECK_SAME(representable(gotDw, type, "dW"));
    if (c.bias) {
        const Tensor gotDb = download(be, ddb);
        CHECK_SAME(compare(gotDb, db, rtol, atol * 4, "db"));
        CHECK_SAME(representable(gotDb, type, "db"));
    }
}

void TstOps::roundingToHalfTypes()
{
    const float inf = std::numeric_limits<float>::infinity();
    // f16: 10 mantissa bits, largest finite 65504, ties to even, subnormals down to 2^-24.
    QCOMPARE(roundToDType(65504.0f, DType::F16), 65504.0f);
    QCOMPARE(roundToDType(65519.0f, DType::F16), 65504.0f);
    QCOMPARE(roundToDType(65520.0f, DType::F16), inf);  // the tie with 65536 goes to even: inf
    QCOMPARE(roundToDType(-1e6f, DType::F16), -inf);
    QCOMPARE(roundToDType(1.0f + std::ldexp(1.0f, -11), DType::F16), 1.0f);                   // tie: even
    QCOMPARE(roundToDType(1.0f + 3 * std::ldexp(1.0f, -11), DType::F16), 1.0f + std::ldexp(1.0f, -9));
    QCOMPARE(roundToDType(1.0f + std::ldexp(1.2f, -11), DType::F16), 1.0f + std::ldexp(1.0f, -10));
    QCOMPARE(roundToDType(std::ldexp(1.0f, -24), DType::F16), std::ldexp(1.0f, -24));         // smallest subnormal
    QCOMPARE(roundToDType(std::ldexp(1.0f, -25), DType::F16), 0.0f);                          // tie with 0: even
    QCOMPARE(roundToDType(std::ldexp(1.5f, -25), DType::F16), std::ldexp(1.0f, -24));
    QCOMPARE(roundToDType(std::ldexp(3.0f, -25), DType::F16), std::ldexp(1.0f, -23));         // 1.5 units: even
    QCOMPARE(roundToDType(std::ldexp(1.0f, -14) * (1 + 1.0f / 4096), DType::F16), std::ldexp(1.0f, -14));
    QVERIFY(std::signbit(roundToDType(-1e-10f, DType::F16)));
    QVERIFY(std::isnan(roundToDType(kNaN, DType::F16)));
    // bf16: float's exponent, 7 mantissa bits.
    QCOMPARE(roundToDType(1.0f + std::ldexp(1.0f, -8), DType::BF16), 1.0f);
    QCOMPARE(roundToDType(1.0f + 3 * std::ldexp(1.0f, -8), DType::BF16), 1.0f + std::ldexp(1.0f, -6));
    QCOMPARE(roundToDType(65520.0f, DType::BF16), 65536.0f);
    QVERIFY(std::abs(roundToDType(1e30f, DType::BF16) / 1e30f - 1) < 4e-3);
    QCOMPARE(roundToDType(std::numeric_limits<float>::max(), DType::BF16), inf);
    QVERIFY(std::isnan(roundToDType(kNaN, DType::BF16)));
    QCOMPARE(roundToDType(-inf, DType::BF16), -inf);
    QCOMPARE(roundToDType(0.1f, DType::F32), 0.1f);
    // The array form agrees with the scalar one, in place too.
    std::mt19937 rng(5);
    std::vector<float> v(4099);
    for (float& f : v) f = std::ldexp(std::uniform_real_distribution<float>(-1, 1)(rng), int(rng() % 60) - 30);
    for (DType t : {DType::F16, DType::BF16}) {
        std::vector<float> out(v.size()), inPlace = v;
        roundToDType(v.data(), out.data(), int64_t(v.size()), t);
        roundToDType(inPlace.data(), inPlace.data(), int64_t(v.size()), t);
        for (std::size_t i = 0; i < v.size(); ++i) {
            QCOMPARE(out[i], roundToDType(v[i], t));
            QCOMPARE(inPlace[i], out[i]);
        }
    }
}

namespace {
__attribute__((target("f16c"))) uint16_t hardwareHalf(float v)
{
    return static_cast<uint16_t>(_cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT));
}
} // namespace

void TstOps::halfRoundingMatchesHardware()
{
    // The x86 F16C conversion is IEEE round-to-nearest-even: every float's f16 bits must match.
    if (!__builtin_cpu_supports("f16c")) QSKIP("this CPU has no F16C instructions to compare with");
    std::mt19937 rng(11);
    int64_t checked = 0;
    auto check = [&](uint32_t bits) {
        float v;
        std::memcpy(&v, &bits, sizeof v);
        const uint16_t want = hardwareHalf(v), got = floatToHalfBits(v);
        if (std::isnan(v)) return (got & 0x7c00u) == 0x7c00u && (got & 0x3ffu) != 0;  // any NaN
        if (want != got) {
            qWarning("float bits 0x%08x: f16 0x%04x, hardware 0x%04x", bits, got, want);
            return false;
        }
        ++checked;
        return true;
    };
    // Every float whose exponent is in or next to f16's range, at a stride, plus random ones.
    for (uint32_t bits = 0x32000000u; bits < 0x48000000u; bits += 0x101u) {
        QVERIFY(check(bits));
        QVERIFY(check(bits | 0x80000000u));
    }
    for (int i = 0; i < 200000; ++i) QVERIFY(check(static_cast<uint32_t>(rng())));
    QVERIFY(checked > 500000);
}

void TstOps::computeTypeOverflowsLikeF16()
{
    // 300 x 300 = 90000 is beyond f16's 65504: inf, as a GPU's f16 matmul gives; bf16 keeps it.
    ReferenceBackend ref;
    const Tensor x = filled(Shape{2, 1}, 300.0f), w = filled(Shape{1, 3}, 300.0f);
    Tensor y = filled(Shape{2, 3}, kNaN);
    CHECK_OK(ref.setComputeType(DType::F16));
    CHECK_OK(ref.denseForward(x, w, Tensor(), Activation::Linear, y));
    for (float v : y.toVector()) QCOMPARE(v, std::numeric_limits<float>::infinity());
    CHECK_OK(ref.setComputeType(DType::BF16));
    CHECK_OK(ref.denseForward(x, w, Tensor(), Activation::Linear, y));
    for (float v : y.toVector()) QCOMPARE(v, 90112.0f);  // 90000 in bf16
    // Inputs are rounded too: 1 + 2^-9 is 1 in bf16, so the product is 1, not 1.00195.
    const Tensor a = filled(Shape{1, 1}, 1.0f + std::ldexp(1.0f, -9)), one = filled(Shape{1, 1}, 1.0f);
    Tensor z = filled(Shape{1, 1}, kNaN);
    CHECK_OK(ref.denseForward(a, one, Tensor(), Activation::Linear, z));
    QCOMPARE(z.toVector()[0], 1.0f);
    CHECK_OK(ref.setComputeType(DType::F32));
    CHECK_OK(ref.denseForward(a, one, Tensor(), Activation::Linear, z));
    QCOMPARE(z.toVector()[0], 1.0f + std::ldexp(1.0f, -9));
}

void TstOps::computeTypeIsChecked()
{
    ReferenceBackend ref;
    for (DType t : {DType::F32, DType::F16, DType::BF16}) QVERIFY(ref.supportsComputeType(t));
    const Status st = ref.setComputeType(DType::I32);
    QVERIFY(!st.ok());
    QCOMPARE(int(st.error().code), int(ErrorCode::Unsupported));
    QVERIFY2(QString::fromStdString(st.error().message).contains("cannot compute in i32"), st.error().message.c_str());
    QVERIFY(QString::fromStdString(st.error().hint).contains("float32"));
    QCOMPARE(int(ref.computeType()), int(DType::F32));  // unchanged
}

QTEST_APPLESS_MAIN(TstOps)
#include "tst_ops.moc"
