#pragma once
// Small helpers for engine tests: build model specs in code, run training steps directly.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <thread>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/result.h"
#include "data/source.h"
#include "model/spec.h"
#include "tensor/tensor.h"

namespace tstest {

// A chain (or graph) built layer by layer; each layer consumes the previous unless `inputs` given.
class ModelBuilder {
public:
    explicit ModelBuilder(std::string name = "test") { m_spec.name = std::move(name); }
    ModelBuilder& input(std::vector<int64_t> shape, std::string id = "input")
    {
        ts::LayerSpec l;
        l.id = std::move(id);
        l.type = "Input";
        l.attrs["shape"] = shape;
        return add(std::move(l));
    }
    ModelBuilder& layer(std::string type, std::string id, nlohmann::json attrs = nlohmann::json::object(),
                        std::vector<std::string> inputs = {})
    {
        ts::LayerSpec l;
        l.id = std::move(id);
        l.type = std::move(type);
        l.attrs = std::move(attrs);
        l.inputs = inputs.empty() && !m_spec.layers.empty() ? std::vector<std::string>{m_spec.layers.back().id} : std::move(inputs);
        return add(std::move(l));
    }
    ModelBuilder& compile(std::string loss, bool fromLogits, nlohmann::json optimizer = {{"type", "sgd"}, {"learning_rate", 0.1}})
    {
        m_spec.compile.loss = std::move(loss);
        m_spec.compile.fromLogits = fromLogits;
        m_spec.compile.optimizer = std::move(optimizer);
        return *this;
    }
    ts::ModelSpec spec() const { return m_spec; }

private:
    ModelBuilder& add(ts::LayerSpec l)
    {
        m_spec.layers.push_back(std::move(l));
        return *this;
    }
    ts::ModelSpec m_spec;
};

inline ts::Tensor randomTensor(ts::Shape shape, uint64_t seed, float lo = -1.f, float hi = 1.f)
{
    ts::Tensor t = ts::Tensor::empty(std::move(shape));
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> d(lo, hi);
    float* p = t.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = d(rng);
    return t;
}

inline ts::Tensor randomLabels(int64_t n, int classes, uint64_t seed)
{
    ts::Tensor t = ts::Tensor::empty(ts::Shape{n}, ts::DType::I32);
    std::mt19937_64 rng(seed);
    for (int64_t i = 0; i < n; ++i) t.data<int32_t>()[i] = static_cast<int32_t>(rng() % static_cast<uint64_t>(classes));
    return t;
}

inline double maxAbsDiff(const ts::Tensor& a, const ts::Tensor& b)
{
    double m = 0;
    const auto va = a.toVector(), vb = b.toVector();
    if (va.size() != vb.size()) return INFINITY;
    for (std::size_t i = 0; i < va.size(); ++i) m = std::max(m, static_cast<double>(std::fabs(va[i] - vb[i])));
    return m;
}

inline std::string statusText(const ts::Status& st) { return st.ok() ? std::string() : st.error().toString(); }

// A source over fixed tensors, for tests that need exact control of the batches: in order, `batch`
// rows at a time (the last batch may be short). `slow`: 5 ms before each batch.
class TensorSource final : public ts::BatchSource {
public:
    TensorSource(ts::Tensor x, ts::Tensor y, int64_t batch) : m_x(std::move(x)), m_y(std::move(y)), m_batch(batch) {}
    ts::Status startEpoch(int64_t) override
    {
        m_pos = 0;
        return ts::okStatus();
    }
    ts::Result<std::optional<ts::Batch>> next() override
    {
        if (slow) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        const int64_t n = m_x.shape()[0];
        if (m_pos >= n) return std::optional<ts::Batch>();
        const int64_t e = std::min(n, m_pos + m_batch);
        ts::Batch b{m_x.rows(m_pos, e), m_y.rows(m_pos, e)};
        m_pos = e;
        return std::optional<ts::Batch>(b);
    }
    int64_t batchesPerEpoch() const override { return (m_x.shape()[0] + m_batch - 1) / m_batch; }
    int64_t examplesPerEpoch() const override { return m_x.shape()[0]; }
    bool slow = false;

private:
    ts::Tensor m_x, m_y;
    int64_t m_batch, m_pos = 0;
};

} // namespace tstest

// QVERIFY that a Status is ok (its error as the message) / that a difference report is empty.
#define CHECK_OK(expr)                                            \
    do {                                                          \
        ts::Status st_ = (expr);                                  \
        QVERIFY2(st_.ok(), tstest::statusText(st_).c_str());      \
    } while (0)

#define CHECK_SAME(msg)                                           \
    do {                                                          \
        const std::string m_ = (msg);                             \
        QVERIFY2(m_.empty(), m_.c_str());                         \
    } while (0)
