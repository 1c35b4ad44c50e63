#include "backend/reference/reference_backend.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "backend/registry.h"

namespace ts {

namespace {

constexpr double kProbEps = 1e-7;  // Keras backend.epsilon()

[[maybe_unused]] bool isHostF32(const Tensor& t) { return t.defined() && t.hostAccessible() && t.dtype() == DType::F32; }

// Rows of the last axis: (outer, inner) with inner = last dim.
int64_t lastDim(const Tensor& t) { return t.shape().rank() == 0 ? 1 : t.shape()[-1]; }

double sigmoid(double x) { return x >= 0 ? 1.0 / (1.0 + std::exp(-x)) : std::exp(x) / (1.0 + std::exp(x)); }

double geluForward(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }
double geluGrad(double x)
{
    const double cdf = 0.5 * (1.0 + std::erf(x / std::sqrt(2.0)));
    const double pdf = std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI);
    return cdf + x * pdf;
}

double activate(Activation act, double alpha, double x)
{
    switch (act) {
    case Activation::Linear: return x;
    case Activation::Relu: return x > 0 ? x : 0.0;
    case Activation::LeakyRelu: return x > 0 ? x : alpha * x;
    case Activation::Gelu: return geluForward(x);
    case Activation::Sigmoid: return sigmoid(x);
    case Activation::Tanh: return std::tanh(x);
    case Activation::Softmax: break;  // not elementwise; handled by the callers
    }
    TS_ASSERT(false);
    return x;
}

void softmaxRows(const float* x, float* y, int64_t rows, int64_t cols)
{
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * cols;
        float* yr = y + r * cols;
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < cols; ++j) mx = std::max(mx, double(xr[j]));
        double sum = 0;
        for (int64_t j = 0; j < cols; ++j) sum += std::exp(double(xr[j]) - mx);
        for (int64_t j = 0; j < cols; ++j) yr[j] = float(std::exp(double(xr[j]) - mx) / sum);
    }
}

void softmaxBackwardRows(const float* y, const float* dy, float* dx, int64_t rows, int64_t cols)
{
    for (int64_t r = 0; r < rows; ++r) {
        const float* yr = y + r * cols;
        const float* dyr = dy + r * cols;
        double dot = 0;
        for (int64_t j = 0; j < cols; ++j) dot += double(yr[j]) * dyr[j];
        for (int64_t j = 0; j < cols; ++j) dx[r * cols + j] = float(double(yr[j]) * (dyr[j] - dot));
    }
}

// Input coordinate of output position o and kernel tap k.
inline int64_t inCoord(int64_t o, int64_t k, int stride, int pad) { return o * stride - pad + k; }

} // namespace

ReferenceBackend::ReferenceBackend(int deviceIndex) : m_deviceIndex(deviceIndex) {}

Device ReferenceBackend::device() const { return Device{DeviceKind::Cpu, m_deviceIndex}; }

DeviceInfo ReferenceBackend::info() const
{
    DeviceInfo d;
    d.device = device();
    d.name = device().toString() + " (reference kernels, 1 thread)";
    const long pages = sysconf(_SC_PHYS_PAGES);
    const long avail = sysconf(_SC_AVPHYS_PAGES);
    const long pageSize = sysconf(_SC_PAGESIZE);
    if (pages > 0 && pageSize > 0) d.memoryTotal = uint64_t(pages) * uint64_t(pageSize);
    if (avail > 0 && pageSize > 0) d.memoryFree = uint64_t(avail) * uint64_t(pageSize);
    return d;
}

bool ReferenceBackend::supportsOp(OpKind op) const { return op != OpKind::Count_; }

// 16-bit compute is emulated: rounded operands, double accumulation, rounded results.
bool ReferenceBackend::supportsComputeType(DType t) const
{
    return t == DType::F32 || t == DType::F16 || t == DType::BF16;
}

Allocator& ReferenceBackend::allocator() { return hostAllocator(); }

// ---------------------------------------------------------------- GEMM / dense

Status ReferenceBackend::gemm(const Tensor& a, bool transA, const Tensor& b, bool transB, Tensor& c,
                              float alpha, float beta)
{
    TS_ASSERT(isHostF32(a) && isHostF32(b) && isHostF32(c));
    TS_ASSERT(a.shape().rank() == 2 && b.shape().rank() == 2 && c.shape().rank() == 2);
    const int64_t M = c.shape()[0], N = c.shape()[1];
    const int64_t K = transA ? a.shape()[0] : a.shape()[1];
    TS_ASSERT((transA ? a.shape()[1] : a.shape()[0]) == M);
    TS_ASSERT((transB ? b.shape()[1] : b.shape()[0]) == K);
    TS_ASSERT((transB ? b.shape()[0] : b.shape()[1]) == N);
    const float* A = a.data<float>();
    const float* B = b.data<float>();
    float* C = c.data<float>();
    for (int64_t i = 0; i < M; ++i) {
        for (int64_t j = 0; j < N; ++j) {
            double acc = 0;
            for (int64_t k = 0; k < K; ++k) {
                const double av = transA ? A[k * M + i] : A[i * K + k];
                const double bv = transB ? B[j * K + k] : B[k * N + j];
                acc += av * bv;
            }
            const double prev = beta == 0.0f ? 0.0 : double(beta) * C[i * N + j];
            C[i * N + j] = float(double(alpha) * acc + prev);
        }
    }
    return okStatus();
}

Status ReferenceBackend::denseForward(const Tensor& x, const Tensor& w, const Tensor& b, Activation act,
                                      Tensor& y)
{
    if (m_computeType != DType::F32)
        return computeRounded({x, w, b}, {y}, [&](const std::vector<Tensor>& r) { return denseForward(r[0], r[1], r[2], act, y); });
    TS_ASSERT(isHostF32(x) && isHostF32(w) && isHostF32(y));
    TS_ASSERT(act == Activation::Linear || act == Activation::Relu);
    const int64_t in = w.shape()[0], out = w.shape()[1];
    const int64_t n = x.numel() / in;
    TS_ASSERT(y.numel() == n * out);
    TS_ASSERT(!b.defined() || b.numel() == out);
    const float* X = x.data<float>();
    const float* W = w.data<float>();
    const float* Bv = b.defined() ? b.data<float>() : nullptr;
    float* Y = y.data<float>();
    for (int64_t r = 0; r < n; ++r) {
        for (int64_t o = 0; o < out; ++o) {
            double acc = Bv ? Bv[o] : 0.0;
            for (int64_t i = 0; i < in; ++i) acc += double(X[r * in + i]) * W[i * out + o];
            Y[r * out + o] = float(activate(act, 0.0, acc));
        }
    }
    return okStatus();
}

Status ReferenceBackend::denseBackward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& dx,
                                       Tensor& dw, Tensor& db, bool accumulate)
{
    if (m_computeType != DType::F32)
        return computeRounded({x, w, dy}, {dx, dw, db}, [&](const std::vector<Tensor>& r) { return denseBackward(r[0], r[1], r[2], dx, dw, db, accumulate); });
    TS_ASSERT(isHostF32(x) && isHostF32(w) && isHostF32(dy));
    const int64_t in = w.shape()[0], out = w.shape()[1];
    const int64_t n = x.numel() / in;
    TS_ASSERT(dy.numel() == n * out);
    const float* X = x.data<float>();
    const float* W = w.data<float>();
    const float* DY = dy.data<float>();
    if (dx.defined()) {
        TS_ASSERT(isHostF32(dx) && dx.numel() == n * in);
        float* DX = dx.data<float>();
        for (int64_t r = 0; r < n; ++r)
            for (int64_t i = 0; i < in; ++i) {
                double acc = 0;
                for (int64_t o = 0; o < out; ++o) acc += double(DY[r * out + o]) * W[i * out + o];
                DX[r * in + i] = float(acc);
            }
    }
    if (dw.defined()) {
        TS_ASSERT(isHostF32(dw) && dw.numel() == in * out);
        float* DW = dw.data<float>();
        for (int64_t i = 0; i < in; ++i)
            for (int64_t o = 0; o < out; ++o) {
                double acc = accumulate ? double(DW[i * out + o]) : 0.0;
                for (int64_t r = 0; r < n; ++r) acc += double(X[r * in + i]) * DY[r * out + o];
                DW[i * out + o] = float(acc);
            }
    }
    if (db.defined()) {
        TS_ASSERT(isHostF32(db) && db.numel() == out);
        float* DB = db.data<float>();
        for (int64_t o = 0; o < out; ++o) {
            double acc = accumulate ? double(DB[o]) : 0.0;
            for (int64_t r = 0; r < n; ++r) acc += DY[r * out + o];
            DB[o] = float(acc);
        }
    }
    return okStatus();
}

// ---------------------------------------------------------------- convolution

Status ReferenceBackend::conv2dForward(const Tensor& x, const Tensor& w, const Tensor& b,
                                       const Conv2dParams& p, Tensor& y)
{
    if (m_computeType != DType::F32)
        return computeRounded({x, w, b}, {y}, [&](const std::vector<Tensor>& r) { return conv2dForward(r[0], r[1], r[2], p, y); });
    TS_ASSERT(isHostF32(x) && isHostF32(w) && isHostF32(y));
    TS_ASSERT(x.shape().rank() == 4 && w.shape().rank() == 4 && y.shape().rank() == 4);
    const int64_t N = x.shape()[0], H = x.shape()[1], W = x.shape()[2], C = x.shape()[3];
    const int64_t KH = w.shape()[0], KW = w.shape()[1], F = w.shape()[3];
    const int64_t OH = y.shape()[1], OW = y.shape()[2];
    TS_ASSERT(w.shape()[2] == C && y.shape()[0] == N && y.shape()[3] == F);
    TS_ASSERT(!b.defined() || b.numel() == F);
    const float* X = x.data<float>();
    const float* Wt = w.data<float>();
    const float* Bv = b.defined() ? b.data<float>() : nullptr;
    float* Y = y.data<float>();
    for (int64_t n = 0; n < N; ++n)
        for (int64_t oh = 0; oh < OH; ++oh)
            for (int64_t ow = 0; ow < OW; ++ow)
                for (int64_t f = 0; f < F; ++f) {
                    double acc = Bv ? Bv[f] : 0.0;
                    for (int64_t kh = 0; kh < KH; ++kh) {
                        const int64_t ih = inCoord(oh, kh, p.strideH, p.padTop);
                        if (ih < 0 || ih >= H) continue;
                        for (int64_t kw = 0; kw < KW; ++kw) {
                            const int64_t iw = inCoord(ow, kw, p.strideW, p.padLeft);
                            if (iw < 0 || iw >= W) continue;
                            const float* xp = X + ((n * H + ih) * W + iw) * C;
                            const float* wp = Wt + (kh * KW + kw) * C * F + f;
                            for (int64_t c = 0; c < C; ++c) acc += double(xp[c]) * wp[c * F];
                        }
                    }
                    Y[((n * OH + oh) * OW + ow) * F + f] = float(acc);
                }
    return okStatus();
}

Status ReferenceBackend::conv2dBackwardData(const Tensor& dy, const Tensor& w, const Conv2dParams& p,
                                            Tensor& dx)
{
    if (m_computeType != DType::F32)
        return computeRounded({dy, w}, {dx}, [&](const std::vector<Tensor>& r) { return conv2dBackwardData(r[0], r[1], p, dx); });
    TS_ASSERT(isHostF32(dy) && isHostF32(w) && isHostF32(dx));
    const int64_t N = dx.shape()[0], H = dx.shape()[1], W = dx.shape()[2], C = dx.shape()[3];
    const int64_t KH = w.shape()[0], KW = w.shape()[1], F = w.shape()[3];
    const int64_t OH = dy.shape()[1], OW = dy.shape()[2];
    TS_ASSERT(w.shape()[2] == C && dy.shape()[0] == N && dy.shape()[3] == F);
    const float* DY = dy.data<float>();
    const float* Wt = w.data<float>();
    float* DX = dx.data<float>();
    // Gather form: each dx element sums the output positions whose window covers it.
    for (int64_t n = 0; n < N; ++n)
        for (int64_t ih = 0; ih < H; ++ih)
            for (int64_t iw = 0; iw < W; ++iw)
                for (int64_t c = 0; c < C; ++c) {
                    double acc = 0;
                    for (int64_t kh = 0; kh < KH; ++kh) {
                        const int64_t th = ih + p.padTop - kh;
                        if (th < 0 || th % p.strideH != 0) continue;
                        const int64_t oh = th / p.strideH;
                        if (oh >= OH) continue;
                        for (int64_t kw = 0; kw < KW; ++kw) {
                            const int64_t tw = iw + p.padLeft - kw;
                            if (tw < 0 || tw % p.strideW != 0) continue;
                            const int64_t ow = tw / p.strideW;
                            if (ow >= OW) continue;
                            const float* dyp = DY + ((n * OH + oh) * OW + ow) * F;
                            const float* wp = Wt + ((kh * KW + kw) * C + c) * F;
                            for (int64_t f = 0; f < F; ++f) acc += double(dyp[f]) * wp[f];
                        }
                    }
                    DX[((n * H + ih) * W + iw) * C + c] = float(acc);
                }
    return okStatus();
}

Status ReferenceBackend::conv2dBackwardWeights(const Tensor& x, const Tensor& dy, const Conv2dParams& p,
                                               Tensor& dw, Tensor& db)
{
    if (m_computeType != DType::F32)
        return computeRounded({x, dy}, {dw, db}, [&](const std::vector<Tensor>& r) { return conv2dBackwardWeights(r[0], r[1], p, dw, db); });
    TS_ASSERT(isHostF32(x) && isHostF32(dy) && isHostF32(dw));
    const int64_t N = x.shape()[0], H = x.shape()[1], W = x.shape()[2], C = x.shape()[3];
    const int64_t KH = dw.shape()[0], KW = dw.shape()[1], F = dw.shape()[3];
    const int64_t OH = dy.shape()[1], OW = dy.shape()[2];
    TS_ASSERT(dw.shape()[2] == C && dy.shape()[0] == N && dy.shape()[3] == F);
    const float* X = x.data<float>();
    const float* DY = dy.data<float>();
    float* DW = dw.data<float>();
    for (int64_t kh = 0; kh < KH; ++kh)
        for (int64_t kw = 0; kw < KW; ++kw)
            for (int64_t c = 0; c < C; ++c)
                for (int64_t f = 0; f < F; ++f) {
                    double acc = 0;
                    for (int64_t n = 0; n < N; ++n)
                        for (int64_t oh = 0; oh < OH; ++oh) {
                            const int64_t ih = inCoord(oh, kh, p.strideH, p.padTop);
                            if (ih < 0 || ih >= H) continue;
                            for (int64_t ow = 0; ow < OW; ++ow) {
                                const int64_t iw = inCoord(ow, kw, p.strideW, p.padLeft);
                                if (iw < 0 || iw >= W) continue;
                                acc += double(X[((n * H + ih) * W + iw) * C + c]) *
                                       DY[((n * OH + oh) * OW + ow) * F + f];
                            }
                        }
                    DW[((kh * KW + kw) * C + c) * F + f] = float(acc);
                }
    if (db.defined()) {
        TS_ASSERT(isHostF32(db) && db.numel() == F);
        float* DB = db.data<float>();
        const int64_t rows = N * OH * OW;
        for (int64_t f = 0; f < F; ++f) {
            double acc = 0;
            for (int64_t r = 0; r < rows; ++r) acc += DY[r * F + f];
            DB[f] = float(acc);
        }
    }
    return okStatus();
}

// ---------------------------------------------------------------- pooling

Status ReferenceBackend::pool2dForward(const Tensor& x, const Pool2dParams& p, Tensor& y,
                                       Tensor& workspace)
{
    TS_ASSERT(isHostF32(x) && isHostF32(y) && x.shape().rank() == 4 && y.shape().rank() == 4);
    const int64_t N = x.shape()[0], H = x.shape()[1], W = x.shape()[2], C = x.shape()[3];
    const int64_t OH = y.shape()[1], OW = y.shape()[2];
    TS_ASSERT(y.shape()[0] == N && y.shape()[3] == C);
    const bool isMax = p.kind == PoolKind::Max;
    int32_t* WS = nullptr;
    if (isMax && workspace.defined()) {
        TS_ASSERT(workspace.hostAccessible() && workspace.dtype() == DType::I32 &&
                  workspace.numel() == y.numel());
        WS = workspace.data<int32_t>();
    }
    const float* X = x.data<float>();
    float* Y = y.data<float>();
    for (int64_t n = 0; n < N; ++n)
        for (int64_t oh = 0; oh < OH; ++oh)
            for (int64_t ow = 0; ow < OW; ++ow)
                for (int64_t c = 0; c < C; ++c) {
                    double acc = 0;
                    int64_t count = 0;
                    int64_t best = -1;
                    float bestVal = 0;
                    for (int64_t kh = 0; kh < p.windowH; ++kh) {
                        const int64_t ih = inCoord(oh, kh, p.strideH, p.padTop);
                        if (ih < 0 || ih >= H) continue;
                        for (int64_t kw = 0; kw < p.windowW; ++kw) {
                            const int64_t iw = inCoord(ow, kw, p.strideW, p.padLeft);
                            if (iw < 0 || iw >= W) continue;
                            const int64_t idx = ((n * H + ih) * W + iw) * C + c;
                            const float v = X[idx];
                            ++count;
                            acc += v;
                            // Strict '>' keeps the first max in row-major window order.
                            if (best < 0 || v > bestVal) {
                                best = idx;
                                bestVal = v;
                            }
                        }
                    }
                    const int64_t o = ((n * OH + oh) * OW + ow) * C + c;
                    if (isMax) {
                        Y[o] = best < 0 ? 0.0f : bestVal;
                        if (WS) WS[o] = static_cast<int32_t>(best);
                    } else {
                        Y[o] = count == 0 ? 0.0f : float(acc / double(count));
                    }
                }
    return okStatus();
}

Status ReferenceBackend::pool2dBackward(const Tensor& dy, const Tensor& workspace, const Pool2dParams& p,
                                        Tensor& dx)
{
    TS_ASSERT(isHostF32(dy) && isHostF32(dx) && dx.shape().rank() == 4 && dy.shape().rank() == 4);
    const int64_t N = dx.shape()[0], H = dx.shape()[1], W = dx.shape()[2], C = dx.shape()[3];
    const int64_t OH = dy.shape()[1], OW = dy.shape()[2];
    const float* DY = dy.data<float>();
    float* DX = dx.data<float>();
    std::vector<double> acc(static_cast<std::size_t>(dx.numel()), 0.0);
    if (p.kind == PoolKind::Max) {
        TS_ASSERT(workspace.defined() && workspace.dtype() == DType::I32 && workspace.numel() == dy.numel());
        const int32_t* WS = workspace.data<int32_t>();
        for (int64_t o = 0; o < dy.numel(); ++o)
            if (WS[o] >= 0) acc[static_cast<std::size_t>(WS[o])] += DY[o];
    } else {
        for (int64_t n = 0; n < N; ++n)
            for (int64_t oh = 0; oh < OH; ++oh)
                for (int64_t ow = 0; ow < OW; ++ow) {
                    // Count of in-bounds taps (the same for every channel).
                    int64_t count = 0;
                    for (int64_t kh = 0; kh < p.windowH; ++kh) {
                        const int64_t ih = inCoord(oh, kh, p.strideH, p.padTop);
                        if (ih < 0 || ih >= H) continue;
                        for (int64_t kw = 0; kw < p.windowW; ++kw) {
                            const int64_t iw = inCoord(ow, kw, p.strideW, p.padLeft);
                            if (iw >= 0 && iw < W) ++count;
                        }
                    }
                    if (count == 0) continue;
                    for (int64_t kh = 0; kh < p.windowH; ++kh) {
                        const int64_t ih = inCoord(oh, kh, p.strideH, p.padTop);
                        if (ih < 0 || ih >= H) continue;
                        for (int64_t kw = 0; kw < p.windowW; ++kw) {
                            const int64_t iw = inCoord(ow, kw, p.strideW, p.padLeft);
                            if (iw < 0 || iw >= W) continue;
                            for (int64_t c = 0; c < C; ++c)
                                acc[static_cast<std::size_t>(((n * H + ih) * W + iw) * C + c)] +=
                                    double(DY[((n * OH + oh) * OW + ow) * C + c]) / double(count);
                        }
                    }
                }
    }
    for (int64_t i = 0; i < dx.numel(); ++i) DX[i] = float(acc[static_cast<std::size_t>(i)]);
    return okStatus();
}

Status ReferenceBackend::globalAvgPoolForward(const Tensor& x, Tensor& y)
{
    TS_ASSERT(isHostF32(x) && isHostF32(y) && x.shape().rank() == 4);
    const int64_t N = x.shape()[0], HW = x.shape()[1] * x.shape()[2], C = x.shape()[3];
    TS_ASSERT(y.numel() == N * C);
    const float* X = x.data<float>();
    float* Y = y.data<float>();
    for (int64_t n = 0; n < N; ++n)
        for (int64_t c = 0; c < C; ++c) {
            double acc = 0;
            for (int64_t s = 0; s < HW; ++s) acc += X[(n * HW + s) * C + c];
            Y[n * C + c] = HW == 0 ? 0.0f : float(acc / double(HW));
        }
    return okStatus();
}

Status ReferenceBackend::globalAvgPoolBackward(const Tensor& dy, Tensor& dx)
{
    TS_ASSERT(isHostF32(dy) && isHostF32(dx) && dx.shape().rank() == 4);
    const int64_t N = dx.shape()[0], HW = dx.shape()[1] * dx.shape()[2], C = dx.shape()[3];
    TS_ASSERT(dy.numel() == N * C);
    const float* DY = dy.data<float>();
    float* DX = dx.data<float>();
    for (int64_t n = 0; n < N; ++n)
        for (int64_t s = 0; s < HW; ++s)
            for (int64_t c = 0; c < C; ++c) DX[(n * HW + s) * C + c] = float(double(DY[n * C + c]) / double(HW));
    return okStatus();
}

// ---------------------------------------------------------------- batch norm

Status ReferenceBackend::batchNormForward(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                          Tensor& runningMean, Tensor& runningVar, bool training,
                                          float momentum, float epsilon, Tensor& y, Tensor& saveMean,
                                          Tensor& saveInvStd)
{
    TS_ASSERT(isHostF32(x) && isHostF32(y) && isHostF32(runningMean) && isHostF32(runningVar));
    const int64_t C = lastDim(x);
    const int64_t M = C == 0 ? 0 : x.numel() / C;
    TS_ASSERT(y.numel() == x.numel() && runningMean.numel() == C && runningVar.numel() == C);
    const float* X = x.data<float>();
    const float* G = gamma.defined() ? gamma.data<float>() : nullptr;
    const float* Bt = beta.defined() ? beta.data<float>() : nullptr;
    float* RM = runningMean.data<float>();
    float* RV = runningVar.data<float>();
    float* Y = y.data<float>();
    for (int64_t c = 0; c < C; ++c) {
        double mean, invStd;
        if (training) {
            TS_ASSERT(M > 0);
            double sum = 0;
            for (int64_t r = 0; r < M; ++r) sum += X[r * C + c];
            mean = sum / double(M);
            double sq = 0;
            for (int64_t r = 0; r < M; ++r) {
                const double d = X[r * C + c] - mean;
                sq += d * d;
            }
            const double var = sq / double(M);
            invStd = 1.0 / std::sqrt(var + double(epsilon));
            if (saveMean.defined()) saveMean.data<float>()[c] = float(mean);
            if (saveInvStd.defined()) saveInvStd.data<float>()[c] = float(invStd);
            const double unbiased = M > 1 ? sq / double(M - 1) : var;
            RM[c] = float(double(momentum) * RM[c] + (1.0 - double(momentum)) * mean);
            RV[c] = float(double(momentum) * RV[c] + (1.0 - double(momentum)) * unbiased);
        } else {
            mean = RM[c];
            invStd = 1.0 / std::sqrt(double(RV[c]) + double(epsilon));
        }
        const double g = G ? G[c] : 1.0;
        const double bt = Bt ? Bt[c] : 0.0;
        for (int64_t r = 0; r < M; ++r) Y[r * C + c] = float((X[r * C + c] - mean) * invStd * g + bt);
    }
    return okStatus();
}

Status ReferenceBackend::batchNormBackward(const Tensor& x, const Tensor& gamma, const Tensor& saveMean,
                                           const Tensor& saveInvStd, const Tensor& dy, Tensor& dx,
                                           Tensor& dgamma, Tensor& dbeta)
{
    TS_ASSERT(isHostF32(x) && isHostF32(dy) && isHostF32(saveMean) && isHostF32(saveInvStd));
    const int64_t C = lastDim(x);
    const int64_t M = C == 0 ? 0 : x.numel() / C;
    const float* X = x.data<float>();
    const float* G = gamma.defined() ? gamma.data<float>() : nullptr;
    const float* SM = saveMean.data<float>();
    const float* SI = saveInvStd.data<float>();
    const float* DY = dy.data<float>();
    for (int64_t c = 0; c < C; ++c) {
        const double mean = SM[c], invStd = SI[c];
        double sumDy = 0, sumDyXhat = 0;
        for (int64_t r = 0; r < M; ++r) {
            const double xhat = (X[r * C + c] - mean) * invStd;
            sumDy += DY[r * C + c];
            sumDyXhat += DY[r * C + c] * xhat;
        }
        if (dgamma.defined()) dgamma.data<float>()[c] = float(sumDyXhat);
        if (dbeta.defined()) dbeta.data<float>()[c] = float(sumDy);
        if (dx.defined()) {
            TS_ASSERT(isHostF32(dx) && dx.numel() == x.numel());
            float* DX = dx.data<float>();
            const double g = G ? G[c] : 1.0;
            // dx = g * invStd * (dy - mean(dy) - xhat * mean(dy * xhat))
            for (int64_t r = 0; r < M; ++r) {
                const double xhat = (X[r * C + c] - mean) * invStd;
                DX[r * C + c] =
                    float(g * invStd * (DY[r * C + c] - sumDy / double(M) - xhat * sumDyXhat / double(M)));
            }
        }
    }
    return okStatus();
}

// ---------------------------------------------------------------- activations, softmax

Status ReferenceBackend::activationForward(Activation act, float alpha, const Tensor& x, Tensor& y)
{
    TS_ASSERT(isHostF32(x) && isHostF32(y) && x.numel() == y.numel());
    if (act == Activation::Softmax) return softmaxForward(x, y);
    const float* X = x.data<float>();
    float* Y = y.data<float>();
    for (int64_t i = 0; i < x.numel(); ++i) Y[i] = float(activate(act, alpha, X[i]));
    return okStatus();
}

Status ReferenceBackend::activationBackward(Activation act, float alpha, const Tensor& x, const Tensor& y,
                                            const Tensor& dy, Tensor& dx)
{
    TS_ASSERT(isHostF32(dy) && isHostF32(dx) && dy.numel() == dx.numel());
    if (act == Activation::Softmax) return softmaxBackward(y, dy, dx);
    const float* X = x.defined() ? x.data<float>() : nullptr;
    const float* Y = y.defined() ? y.data<float>() : nullptr;
    const float* DY = dy.data<float>();
    float* DX = dx.data<float>();
    const int64_t n = dy.numel();
    for (int64_t i = 0; i < n; ++i) {
        double g = 1.0;
        switch (act) {
        case Activation::Linear: g = 1.0; break;
        case Activation::Relu: {
            TS_ASSERT(X || Y);
            const double v = X ? X[i] : Y[i];
            g = v > 0 ? 1.0 : 0.0;
            break;
        }
        case Activation::LeakyRelu: {
            // y has x's sign only for a positive slope.
            TS_ASSERT(X || (Y && alpha > 0));
            const double v = X ? X[i] : Y[i];
            g = v > 0 ? 1.0 : double(alpha);
            break;
        }
        case Activation::Gelu:
            TS_ASSERT(X);
            g = geluGrad(X[i]);
            break;
        case Activation::Sigmoid: {
            TS_ASSERT(X || Y);
            const double s = Y ? double(Y[i]) : sigmoid(X[i]);
            g = s * (1.0 - s);
            break;
        }
        case Activation::Tanh: {
            TS_ASSERT(X || Y);
            const double t = Y ? double(Y[i]) : std::tanh(double(X[i]));
            g = 1.0 - t * t;
            break;
        }
        case Activation::Softmax: break;
        }
        DX[i] = float(g * DY[i]);
    }
    return okStatus();
}

Status ReferenceBackend::softmaxForward(const Tensor& x, Tensor& y)
{
    TS_ASSERT(isHostF32(x) && isHostF32(y) && x.numel() == y.numel());
    const int64_t cols = lastDim(x);
    if (cols == 0) return okStatus();
    softmaxRows(x.data<float>(), y.data<float>(), x.numel() / cols, cols);
    return okStatus();
}

Status ReferenceBackend::softmaxBackward(const Tensor& y, const Tensor& dy, Tensor& dx)
{
    TS_ASSERT(isHostF32(y) && isHostF32(dy) && isHostF32(dx) && y.numel() == dy.numel());
    const int64_t cols = lastDim(y);
    if (cols == 0) return okStatus();
    softmaxBackwardRows(y.data<float>(), dy.data<float>(), dx.data<float>(), y.numel() / cols, cols);
    return okStatus();
}

// ---------------------------------------------------------------- dropout

Status ReferenceBackend::dropoutForward(const Tensor& x, float rate, uint64_t seed, Tensor& mask, Tensor& y)
{
    TS_ASSERT(isHostF32(x) && isHostF32(y) && x.numel() == y.numel());
    TS_ASSERT(mask.defined() && mask.dtype() == DType::U8 && mask.numel() == x.numel());
    const float* X = x.data<float>();
    uint8_t* Mk = mask.data<uint8_t>();
    float* Y = y.data<float>();
    const double keepScale = rate < 1.0f ? 1.0 / (1.0 - double(rate)) : 0.0;
    for (int64_t i = 0; i < x.numel(); ++i) {
        const bool keep = dropoutKeep(seed, static_cast<uint64_t>(i), rate);
        Mk[i] = keep ? 1 : 0;
        Y[i] = keep ? float(double(X[i]) * keepScale) : 0.0f;
    }
    return okStatus();
}

Status ReferenceBackend::dropoutBackward(const Tensor& dy, const Tensor& mask, float rate, Tensor& dx)
{
    TS_ASSERT(isHostF32(dy) && isHostF32(dx) && dy.numel() == dx.numel());
    TS_ASSERT(mask.defined() && mask.dtype() == DType::U8 && mask.numel() == dy.numel());
    const float* DY = dy.data<float>();
    const uint8_t* Mk = mask.data<uint8_t>();
    float* DX = dx.data<float>();
    const double keepScale = rate < 1.0f ? 1.0 / (1.0 - double(rate)) : 0.0;
    for (int64_t i = 0; i < dy.numel(); ++i) DX[i] = Mk[i] ? float(double(DY[i]) * keepScale) : 0.0f;
    return okStatus();
}

// ---------------------------------------------------------------- elementwise

Status ReferenceBackend::add(const Tensor& a, const Tensor& b, Tensor& c)
{
    TS_ASSERT(isHostF32(a) && isHostF32(b) && isHostF32(c));
    TS_ASSERT(a.numel() == b.numel() && a.numel() == c.numel());
    const float* A = a.data<float>();
    const float* B = b.data<float>();
    float* Cv = c.data<float>();
    for (int64_t i = 0; i < a.numel(); ++i) Cv[i] = A[i] + B[i];
    return okStatus();
}

Status ReferenceBackend::axpy(float alpha, const Tensor& x, Tensor& y)
{
    TS_ASSERT(isHostF32(x) && isHostF32(y) && x.numel() == y.numel());
    const float* X = x.data<float>();
    float* Y = y.data<float>();
    for (int64_t i = 0; i < x.numel(); ++i) Y[i] = float(double(Y[i]) + double(alpha) * X[i]);
    return okStatus();
}

Status ReferenceBackend::scale(float alpha, Tensor& x)
{
    TS_ASSERT(isHostF32(x));
    float* X = x.data<float>();
    for (int64_t i = 0; i < x.numel(); ++i) X[i] *= alpha;
    return okStatus();
}

// ---------------------------------------------------------------- concat

Status ReferenceBackend::concatForward(const std::vector<Tensor>& xs, Tensor& y)
{
    TS_ASSERT(isHostF32(y));
    const int64_t total = lastDim(y);
    const int64_t rows = total == 0 ? 0 : y.numel() / total;
    float* Y = y.data<float>();
    int64_t offset = 0;
    for (const Tensor& x : xs) {
        TS_ASSERT(isHostF32(x));
        const int64_t ci = lastDim(x);
        TS_ASSERT(x.numel() == rows * ci);
        const float* X = x.data<float>();
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t j = 0; j < ci; ++j) Y[r * total + offset + j] = X[r * ci + j];
        offset += ci;
    }
    TS_ASSERT(offset == total);
    return okStatus();
}

Status ReferenceBackend::concatBackward(const Tensor& dy, std::vector<Tensor>& dxs)
{
    TS_ASSERT(isHostF32(dy));
    const int64_t total = lastDim(dy);
    const int64_t rows = total == 0 ? 0 : dy.numel() / total;
    const float* DY = dy.data<float>();
    int64_t offset = 0;
    for (Tensor& dx : dxs) {
        TS_ASSERT(isHostF32(dx));
        const int64_t ci = lastDim(dx);
        TS_ASSERT(dx.numel() == rows * ci);
        float* DX = dx.data<float>();
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t j = 0; j < ci; ++j) DX[r * ci + j] = DY[r * total + offset + j];
        offset += ci;
    }
    TS_ASSERT(offset == total);
    return okStatus();
}

// ---------------------------------------------------------------- loss, metrics

Status ReferenceBackend::loss(const LossParams& p, const Tensor& pred, const Tensor& target, float* loss,
                              Tensor& dpred)
{
    TS_ASSERT(isHostF32(pred) && target.defined() && target.hostAccessible());
    TS_ASSERT(pred.shape().rank() >= 1);
    const int64_t N = pred.shape()[0];
    const int64_t per = N == 0 ? 0 : pred.numel() / N;
    const int64_t nGlobal = p.globalBatch > 0 ? p.globalBatch : N;
    const double gscale = nGlobal > 0 ? double(p.gradScale) / double(nGlobal) : 0.0;
    const float* P = pred.data<float>();
    float* D = nullptr;
    if (dpred.defined()) {
        TS_ASSERT(isHostF32(dpred) && dpred.numel() == pred.numel());
        D = dpred.data<float>();
    }
    double total = 0;

    switch (p.kind) {
    case LossKind::SparseCategoricalCrossentropy:
    case LossKind::CategoricalCrossentropy: {
        const bool sparse = p.kind == LossKind::SparseCategoricalCrossentropy;
        const int64_t C = per;
        TS_ASSERT(sparse ? (target.dtype() == DType::I32 && target.numel() == N)
                         : (target.dtype() == DType::F32 && target.numel() == pred.numel()));
        std::vector<double> t(static_cast<std::size_t>(C));
        std::vector<double> g(static_cast<std::size_t>(C));
        for (int64_t r = 0; r < N; ++r) {
            const float* x = P + r * C;
            std::fill(t.begin(), t.end(), 0.0);
            if (sparse) {
                const int32_t label = target.data<int32_t>()[r];
                if (label < 0 || label >= C)
                    return makeError(ErrorCode::InvalidArgument,
                                     "sparse categorical crossentropy: label " + std::to_string(label) +
                                         " in batch row " + std::to_string(r) + " is outside [0, " +
                                         std::to_string(C) + ")",
                                     "labels must be class ids below the model's output width; check "
                                     "the label column and the last layer's units");
                t[static_cast<std::size_t>(label)] = 1.0;
            } else {
                const float* tr = target.data<float>() + r * C;
                for (int64_t k = 0; k < C; ++k) t[static_cast<std::size_t>(k)] = tr[k];
            }
            double tsum = 0;
            for (double v : t) tsum += v;
            if (p.fromLogits) {
                double mx = -std::numeric_limits<double>::infinity();
                for (int64_t k = 0; k < C; ++k) mx = std::max(mx, double(x[k]));
                double se = 0;
                for (int64_t k = 0; k < C; ++k) se += std::exp(double(x[k]) - mx);
                const double lse = mx + std::log(se);
                for (int64_t k = 0; k < C; ++k)
                    if (t[static_cast<std::size_t>(k)] != 0.0) total += t[static_cast<std::size_t>(k)] * (lse - x[k]);
                if (D)
                    for (int64_t k = 0; k < C; ++k) {
                        const double sm = std::exp(double(x[k]) - lse);
                        D[r * C + k] = float(gscale * (sm * tsum - t[static_cast<std::size_t>(k)]));
                    }
            } else {
                double s = 0;
                for (int64_t k = 0; k < C; ++k) s += x[k];
                double gq = 0;  // sum_k g_k q_k
                for (int64_t k = 0; k < C; ++k) {
                    const double q = double(x[k]) / s;
                    const double qc = std::clamp(q, kProbEps, 1.0 - kProbEps);
                    const double tk = t[static_cast<std::size_t>(k)];
                    if (tk != 0.0) total -= tk * std::log(qc);
                    // The clip passes no gradient outside [eps, 1 - eps].
                    const double gk = (q >= kProbEps && q <= 1.0 - kProbEps) ? -tk / q : 0.0;
                    g[static_cast<std::size_t>(k)] = gk;
                    gq += gk * q;
                }
                if (D)
                    for (int64_t k = 0; k < C; ++k)
                        D[r * C + k] = float(gscale * (g[static_cast<std::size_t>(k)] - gq) / s);
            }
        }
        break;
    }
    case LossKind::BinaryCrossentropy: {
        TS_ASSERT(target.dtype() == DType::F32 && target.numel() == pred.numel());
        const float* Z = target.data<float>();
        const double inv = per > 0 ? 1.0 / double(per) : 0.0;
        for (int64_t i = 0; i < pred.numel(); ++i) {
            const double x = P[i], z = Z[i];
            double l, d;
            if (p.fromLogits) {
                l = std::max(x, 0.0) - x * z + std::log1p(std::exp(-std::abs(x)));
                d = sigmoid(x) - z;
            } else {
                const double pc = std::clamp(x, kProbEps, 1.0 - kProbEps);
                l = -(z * std::log(pc) + (1.0 - z) * std::log(1.0 - pc));
                d = (x >= kProbEps && x <= 1.0 - kProbEps) ? -(z / x) + (1.0 - z) / (1.0 - x) : 0.0;
            }
            total += l * inv;
            if (D) D[i] = float(gscale * d * inv);
        }
        break;
    }
    case LossKind::MeanSquaredError: {
        TS_ASSERT(target.dtype() == DType::F32 && target.numel() == pred.numel());
        const float* T = target.data<float>();
        const double inv = per > 0 ? 1.0 / double(per) : 0.0;
        for (int64_t i = 0; i < pred.numel(); ++i) {
            const double e = double(P[i]) - T[i];
            total += e * e * inv;
            if (D) D[i] = float(gscale * 2.0 * e * inv);
        }
        break;
    }
    }
    if (loss) *loss = N > 0 ? float(total / double(N)) : 0.0f;
    return okStatus();
}

Status ReferenceBackend::argmaxMatches(const Tensor& pred, const Tensor& target, bool binaryFromLogits,
                                       int64_t* matches)
{
    TS_ASSERT(isHostF32(pred) && target.defined() && target.hostAccessible() && matches);
    *matches = countArgmaxMatches(pred, target, binaryFromLogits);
    return okStatus();
}

// ---------------------------------------------------------------- optimizers

Status ReferenceBackend::sgdUpdate(const SgdParams& p, Tensor& param, const Tensor& grad, Tensor& velocity)
{
    TS_ASSERT(isHostF32(param) && isHostF32(grad) && param.numel() == grad.numel());
    const bool useMomentum = p.momentum != 0.0f;
    TS_ASSERT(!useMomentum || (isHostF32(velocity) && velocity.numel() == param.numel()));
    float* Pm = param.data<float>();
    const float* G = grad.data<float>();
    float* V = useMomentum ? velocity.data<float>() : nullptr;
    const double lr = p.lr, mu = p.momentum, wd = p.weightDecay;
    for (int64_t i = 0; i < param.numel(); ++i) {
        const double g = double(G[i]) + wd * Pm[i];
        if (useMomentum) {
            const double v = mu * V[i] + g;
            V[i] = float(v);
            Pm[i] = float(Pm[i] - lr * (p.nesterov ? g + mu * v : v));
        } else {
            Pm[i] = float(Pm[i] - lr * g);
        }
    }
    return okStatus();
}

Status ReferenceBackend::adamUpdate(const AdamParams& p, Tensor& param, const Tensor& grad, Tensor& m,
                                    Tensor& v)
{
    TS_ASSERT(isHostF32(param) && isHostF32(grad) && isHostF32(m) && isHostF32(v));
    TS_ASSERT(param.numel() == grad.numel() && m.numel() == param.numel() && v.numel() == param.numel());
    TS_ASSERT(p.step >= 1);
    float* Pm = param.data<float>();
    const float* G = grad.data<float>();
    float* Mv = m.data<float>();
    float* Vv = v.data<float>();
    const double lr = p.lr, b1 = p.beta1, b2 = p.beta2, eps = p.epsilon, wd = p.weightDecay;
    const double bc1 = 1.0 - std::pow(b1, double(p.step));
    const double bc2 = 1.0 - std::pow(b2, double(p.step));
    for (int64_t i = 0; i < param.numel(); ++i) {
        double w = Pm[i];
        w -= lr * wd * w;
        const double g = G[i];
        const double mi = b1 * Mv[i] + (1.0 - b1) * g;
        const double vi = b2 * Vv[i] + (1.0 - b2) * g * g;
        Mv[i] = float(mi);
        Vv[i] = float(vi);
        w -= lr * (mi / bc1) / (std::sqrt(vi / bc2) + eps);
        Pm[i] = float(w);
    }
    return okStatus();
}

Status ReferenceBackend::rmspropUpdate(const RmspropParams& p, Tensor& param, const Tensor& grad,
                                       Tensor& ms, Tensor& mom, Tensor& mg)
{
    TS_ASSERT(isHostF32(param) && isHostF32(grad) && isHostF32(ms));
    TS_ASSERT(param.numel() == grad.numel() && ms.numel() == param.numel());
    const bool useMomentum = p.momentum > 0.0f;
    TS_ASSERT(!useMomentum || (isHostF32(mom) && mom.numel() == param.numel()));
    TS_ASSERT(!p.centered || (isHostF32(mg) && mg.numel() == param.numel()));
    float* Pm = param.data<float>();
    const float* G = grad.data<float>();
    float* MS = ms.data<float>();
    float* MOM = useMomentum ? mom.data<float>() : nullptr;
    float* MG = p.centered ? mg.data<float>() : nullptr;
    const double lr = p.lr, rho = p.rho, mu = p.momentum, eps = p.epsilon;
    for (int64_t i = 0; i < param.numel(); ++i) {
        const double g = G[i];
        const double s = rho * MS[i] + (1.0 - rho) * g * g;
        MS[i] = float(s);
        double denom = s;
        if (MG) {
            const double a = rho * MG[i] + (1.0 - rho) * g;
            MG[i] = float(a);
            denom = s - a * a;
        }
        const double inc = lr * g / std::sqrt(denom + eps);
        if (MOM) {
            const double mv = mu * MOM[i] + inc;
            MOM[i] = float(mv);
            Pm[i] = float(Pm[i] - mv);
        } else {
            Pm[i] = float(Pm[i] - inc);
        }
    }
    return okStatus();
}

Status ReferenceBackend::sumSquares(const Tensor& x, double* out)
{
    TS_ASSERT(isHostF32(x) && out);
    const float* X = x.data<float>();
    double acc = 0;
    for (int64_t i = 0; i < x.numel(); ++i) acc += double(X[i]) * X[i];
    *out = acc;
    return okStatus();
}

Status ReferenceBackend::copyFromHost(const void* src, Tensor& dst)
{
    TS_ASSERT(dst.defined() && dst.hostAccessible());
    if (dst.bytes()) std::memcpy(dst.raw(), src, dst.bytes());
    return okStatus();
}

Status ReferenceBackend::copyToHost(const Tensor& src, void* dst)
{
    TS_ASSERT(src.defined() && src.hostAccessible());
    if (src.bytes()) std::memcpy(dst, src.raw(), src.bytes());
    return okStatus();
}

// ---------------------------------------------------------------- factory

BackendFactory referenceBackendFactory()
{
    BackendFactory f;
    f.name = "reference";
    f.kind = DeviceKind::Cpu;
    f.priority = 0;
    f.enumerate = [] { return std::vector<DeviceInfo>{ReferenceBackend(0).info()}; };
    f.create = [](int deviceIndex, const BackendOptions&) -> Result<std::unique_ptr<Backend>> {
        if (deviceIndex < 0)
            return makeError(ErrorCode::InvalidArgument,
                             "reference backend: bad device index " + std::to_string(deviceIndex),
                             "use a non-negative CPU device index, e.g. cpu:0");
        return std::unique_ptr<Backend>(std::make_unique<ReferenceBackend>(deviceIndex));
    };
    return f;
}

} // namespace ts
