#include "cuda_kernels.h"

#include <climits>
#include <cmath>

namespace ts::cudak {

namespace {

constexpr int kThreads = 256;
constexpr double kProbEps = 1e-7;  // Keras backend.epsilon(), as in the reference

inline int gridFor(int64_t n)
{
    // Grid-stride loops: enough blocks to fill an H200 several times over, never more than needed.
    const int64_t blocks = (n + kThreads - 1) / kThreads;
    return static_cast<int>(blocks < 1 ? 1 : (blocks > 65535 * 4 ? 65535 * 4 : blocks));
}

#define TS_GRID_LOOP(i, n) \
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); i += int64_t(blockDim.x) * gridDim.x)

__device__ inline double sigmoidD(double x) { return x >= 0 ? 1.0 / (1.0 + exp(-x)) : exp(x) / (1.0 + exp(x)); }

__device__ inline double activateD(int act, double alpha, double x)
{
    switch (act) {
    case ActRelu: return x > 0 ? x : 0.0;
    case ActLeakyRelu: return x > 0 ? x : alpha * x;
    case ActGelu: return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
    case ActSigmoid: return sigmoidD(x);
    case ActTanh: return tanh(x);
    default: return x;
    }
}

__global__ void biasActivationKernel(float* y, const float* bias, int64_t rows, int64_t cols, int act)
{
    TS_GRID_LOOP(i, rows * cols)
    {
        // Same rounding as the reference: bias added in double before the activation.
        double v = double(y[i]) + (bias ? double(bias[i % cols]) : 0.0);
        y[i] = float(activateD(act, 0.0, v));
    }
}

__global__ void transposeKernel(const float* in, float* out, int64_t rows, int64_t cols)
{
    __shared__ float tile[32][33];  // +1 column: no shared-memory bank conflicts on the read-back
    const int64_t c0 = int64_t(blockIdx.x) * 32, r0 = int64_t(blockIdx.y) * 32;
    for (int k = threadIdx.y; k < 32; k += blockDim.y) {
        const int64_t r = r0 + k, c = c0 + threadIdx.x;
        if (r < rows && c < cols) tile[k][threadIdx.x] = in[r * cols + c];
    }
    __syncthreads();
    for (int k = threadIdx.y; k < 32; k += blockDim.y) {
        const int64_t c = c0 + k, r = r0 + threadIdx.x;
        if (r < rows && c < cols) out[c * rows + r] = tile[threadIdx.x][k];
    }
}

// Column reduction, pass 1: block (32 columns x 8 row lanes), blockIdx.y is one of `splits` row
// slices; each thread walks its rows in a fixed order and writes one partial per (lane, column).
constexpr int kLanes = 8;

inline int reduceSplits(int64_t rows)
{
    int64_t splits = rows / (kLanes * 64);
    if (splits < 1) splits = 1;
    if (splits > 64) splits = 64;
    return static_cast<int>(splits);
}

__global__ void columnReducePartial(int mode, const float* x, const float* dy, const double* mean, const float* meanF,
                                    const float* invStdF, int64_t rows, int64_t cols, double* scratch)
{
    const int64_t c = int64_t(blockIdx.x) * 32 + threadIdx.x;
    const int lane = int(blockIdx.y) * kLanes + int(threadIdx.y);
    const int lanes = int(gridDim.y) * kLanes;
    if (c >= cols) return;
    double a = 0, b = 0;
    const double m = mode == int(ColumnReduce::SumSqDev) ? mean[c] : (meanF ? double(meanF[c]) : 0.0);
    const double is = invStdF ? double(invStdF[c]) : 1.0;
    for (int64_t r = lane; r < rows; r += lanes) {
        const int64_t i = r * cols + c;
        if (mode == int(ColumnReduce::Sum)) {
            a += x[i];
        } else if (mode == int(ColumnReduce::SumSqDev)) {
            const double d = double(x[i]) - m;
            a += d * d;
        } else {
            const double g = dy[i];
            a += g;
            b += g * ((double(x[i]) - m) * is);
        }
    }
    scratch[(int64_t(lane) * cols + c) * 2] = a;
    scratch[(int64_t(lane) * cols + c) * 2 + 1] = b;
}

__global__ void columnReduceFinal(const double* scratch, int lanes, int64_t cols, double* a, double* b)
{
    TS_GRID_LOOP(c, cols)
    {
        double sa = 0, sb = 0;
        for (int l = 0; l < lanes; ++l) {
            sa += scratch[(int64_t(l) * cols + c) * 2];
            sb += scratch[(int64_t(l) * cols + c) * 2 + 1];
        }
        if (a) a[c] = sa;
        if (b) b[c] = sb;
    }
}

__global__ void storeColumnSumsKernel(const double* src, float* dst, int64_t cols, bool accumulate)
{
    TS_GRID_LOOP(c, cols) dst[c] = float((accumulate ? double(dst[c]) : 0.0) + src[c]);
}

__global__ void padKernel(const float* x, float* xp, int64_t N, int64_t H, int64_t W, int64_t C, int padTop,
                          int padLeft, int64_t HP, int64_t WP)
{
    TS_GRID_LOOP(i, N * HP * WP * C)
    {
        const int64_t c = i % C;
        int64_t t = i / C;
        const int64_t wp = t % WP;
        t /= WP;
        const int64_t hp = t % HP;
        const int64_t n = t / HP;
        const int64_t h = hp - padTop, w = wp - padLeft;
        xp[i] = (h >= 0 && h < H && w >= 0 && w < W) ? x[((n * H + h) * W + w) * C + c] : 0.0f;
    }
}

__global__ void cropKernel(const float* xp, float* x, int64_t N, int64_t H, int64_t W, int64_t C, int padTop,
                           int padLeft, int64_t HP, int64_t WP)
{
    TS_GRID_LOOP(i, N * H * W * C)
    {
        const int64_t c = i % C;
        int64_t t = i / C;
        const int64_t w = t % W;
        t /= W;
        const int64_t h = t % H;
        const int64_t n = t / H;
        x[i] = xp[((n * HP + h + padTop) * WP + w + padLeft) * C + c];
    }
}

__global__ void poolForwardKernel(const float* x, float* y, int32_t* ws, PoolGeom g, bool isMax)
{
    TS_GRID_LOOP(o, g.N * g.OH * g.OW * g.C)
    {
        const int64_t c = o % g.C;
        int64_t t = o / g.C;
        const int64_t ow = t % g.OW;
        t /= g.OW;
        const int64_t oh = t % g.OH;
        const int64_t n = t / g.OH;
        double acc = 0;
        int64_t count = 0, best = -1;
        float bestVal = 0;
        for (int kh = 0; kh < g.windowH; ++kh) {
            const int64_t ih = oh * g.strideH - g.padTop + kh;
            if (ih < 0 || ih >= g.H) continue;
            for (int kw = 0; kw < g.windowW; ++kw) {
                const int64_t iw = ow * g.strideW - g.padLeft + kw;
                if (iw < 0 || iw >= g.W) continue;
                const int64_t idx = ((n * g.H + ih) * g.W + iw) * g.C + c;
                const float v = x[idx];
                ++count;
                acc += v;
                if (best < 0 || v > bestVal) {  // strict '>': the first max wins, like the reference
                    best = idx;
                    bestVal = v;
                }
            }
        }
        if (isMax) {
            y[o] = best < 0 ? 0.0f : bestVal;
            if (ws) ws[o] = static_cast<int32_t>(best);
        } else {
            y[o] = count == 0 ? 0.0f : float(acc / double(count));
        }
    }
}

__device__ inline int64_t ceilDiv(int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -((-a) / b); }
__device__ inline int64_t floorDiv(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

__global__ void poolBackwardKernel(const float* dy, const int32_t* ws, float* dx, PoolGeom g, bool isMax)
{
    TS_GRID_LOOP(i, g.N * g.H * g.W * g.C)
    {
        const int64_t c = i % g.C;
        int64_t t = i / g.C;
        const int64_t iw = t % g.W;
        t /= g.W;
        const int64_t ih = t % g.H;
        const int64_t n = t / g.H;
        // Output rows whose window covers ih: oh*s - pad <= ih <= oh*s - pad + window - 1.
        const int64_t ohLo = max(int64_t(0), ceilDiv(ih + g.padTop - g.windowH + 1, g.strideH));
        const int64_t ohHi = min(g.OH - 1, floorDiv(ih + g.padTop, g.strideH));
        const int64_t owLo = max(int64_t(0), ceilDiv(iw + g.padLeft - g.windowW + 1, g.strideW));
        const int64_t owHi = min(g.OW - 1, floorDiv(iw + g.padLeft, g.strideW));
        double acc = 0;
        for (int64_t oh = ohLo; oh <= ohHi; ++oh)
            for (int64_t ow = owLo; ow <= owHi; ++ow) {
                const int64_t o = ((n * g.OH + oh) * g.OW + ow) * g.C + c;
                if (isMax) {
                    if (ws[o] == i) acc += dy[o];
                } else {
                    // In-bounds taps of this window (the same for every channel).
                    const int64_t h0 = max(int64_t(0), oh * g.strideH - g.padTop);
                    const int64_t h1 = min(g.H, oh * g.strideH - g.padTop + g.windowH);
                    const int64_t w0 = max(int64_t(0), ow * g.strideW - g.padLeft);
                    const int64_t w1 = min(g.W, ow * g.strideW - g.padLeft + g.windowW);
                    const int64_t count = (h1 - h0) * (w1 - w0);
                    if (count > 0) acc += double(dy[o]) / double(count);
                }
            }
        dx[i] = float(acc);
    }
}

__global__ void gapForwardKernel(const float* x, float* y, int64_t N, int64_t HW, int64_t C)
{
    TS_GRID_LOOP(o, N * C)
    {
        const int64_t n = o / C, c = o % C;
        double acc = 0;
        for (int64_t s = 0; s < HW; ++s) acc += x[(n * HW + s) * C + c];
        y[o] = HW == 0 ? 0.0f : float(acc / double(HW));
    }
}

__global__ void gapBackwardKernel(const float* dy, float* dx, int64_t N, int64_t HW, int64_t C)
{
    TS_GRID_LOOP(i, N * HW * C)
    {
        const int64_t c = i % C, n = i / (HW * C);
        dx[i] = float(double(dy[n * C + c]) / double(HW));
    }
}

__global__ void bnMeanKernel(const double* sums, double* mean, int64_t M, int64_t C)
{
    TS_GRID_LOOP(c, C) mean[c] = sums[c] / double(M);
}

__global__ void bnFinishKernel(const double* mean, const double* sq, int64_t M, int64_t C, float momentum,
                               float epsilon, float* rm, float* rv, float* saveMean, float* saveInvStd,
                               double* invStdOut)
{
    TS_GRID_LOOP(c, C)
    {
        const double var = sq[c] / double(M);
        const double invStd = 1.0 / sqrt(var + double(epsilon));
        invStdOut[c] = invStd;
        if (saveMean) saveMean[c] = float(mean[c]);
        if (saveInvStd) saveInvStd[c] = float(invStd);
        const double unbiased = M > 1 ? sq[c] / double(M - 1) : var;
        rm[c] = float(double(momentum) * rm[c] + (1.0 - double(momentum)) * mean[c]);
        rv[c] = float(double(momentum) * rv[c] + (1.0 - double(momentum)) * unbiased);
    }
}

__global__ void bnRunningKernel(const float* rm, const float* rv, float epsilon, double* mean, double* invStd,
                                int64_t C)
{
    TS_GRID_LOOP(c, C)
    {
        mean[c] = rm[c];
        invStd[c] = 1.0 / sqrt(double(rv[c]) + double(epsilon));
    }
}

__global__ void bnApplyKernel(const float* x, const double* mean, const double* invStd, const float* gamma,
                              const float* beta, float* y, int64_t M, int64_t C)
{
    TS_GRID_LOOP(i, M * C)
    {
        const int64_t c = i % C;
        const double g = gamma ? double(gamma[c]) : 1.0;
        const double b = beta ? double(beta[c]) : 0.0;
        y[i] = float((double(x[i]) - mean[c]) * invStd[c] * g + b);
    }
}

__global__ void bnGammaBetaKernel(const double* sumDy, const double* sumDyXhat, float* dgamma, float* dbeta,
                                  int64_t C)
{
    TS_GRID_LOOP(c, C)
    {
        if (dgamma) dgamma[c] = float(sumDyXhat[c]);
        if (dbeta) dbeta[c] = float(sumDy[c]);
    }
}

__global__ void bnBackwardKernel(const float* x, const float* gamma, const float* saveMean, const float* saveInvStd,
                                 const float* dy, const double* sumDy, const double* sumDyXhat, float* dx, int64_t M,
                                 int64_t C)
{
    TS_GRID_LOOP(i, M * C)
    {
        const int64_t c = i % C;
        const double mean = saveMean[c], invStd = saveInvStd[c];
        const double g = gamma ? double(gamma[c]) : 1.0;
        const double xhat = (double(x[i]) - mean) * invStd;
        dx[i] = float(g * invStd * (double(dy[i]) - sumDy[c] / double(M) - xhat * sumDyXhat[c] / double(M)));
    }
}

__global__ void activationForwardKernel(int act, float alpha, const float* x, float* y, int64_t n)
{
    TS_GRID_LOOP(i, n) y[i] = float(activateD(act, alpha, x[i]));
}

__global__ void activationBackwardKernel(int act, float alpha, const float* x, const float* y, const float* dy,
                                         float* dx, int64_t n)
{
    TS_GRID_LOOP(i, n)
    {
        double g = 1.0;
        switch (act) {
        case ActRelu: g = (x ? double(x[i]) : double(y[i])) > 0 ? 1.0 : 0.0; break;
        case ActLeakyRelu: g = (x ? double(x[i]) : double(y[i])) > 0 ? 1.0 : double(alpha); break;
        case ActGelu: {
            const double v = x[i];
            const double cdf = 0.5 * (1.0 + erf(v / sqrt(2.0)));
            const double pdf = exp(-0.5 * v * v) / sqrt(2.0 * M_PI);
            g = cdf + v * pdf;
            break;
        }
        case ActSigmoid: {
            const double s = y ? double(y[i]) : sigmoidD(x[i]);
            g = s * (1.0 - s);
            break;
        }
        case ActTanh: {
            const double t = y ? double(y[i]) : tanh(double(x[i]));
            g = 1.0 - t * t;
            break;
        }
        default: break;
        }
        dx[i] = float(g * double(dy[i]));
    }
}

// One warp per row: rows are short (class counts) and many.
__global__ void softmaxForwardKernel(const float* x, float* y, int64_t rows, int64_t cols)
{
    const int lane = threadIdx.x % 32;
    const int64_t warps = int64_t(gridDim.x) * blockDim.x / 32;
    // Warp-stride over rows; r is the same for the whole warp, so the shuffles stay converged.
    for (int64_t r = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32; r < rows; r += warps) {
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    double mx = -INFINITY;
    for (int64_t j = lane; j < cols; j += 32) mx = fmax(mx, double(xr[j]));
    for (int o = 16; o > 0; o /= 2) mx = fmax(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    double sum = 0;
    for (int64_t j = lane; j < cols; j += 32) sum += exp(double(xr[j]) - mx);
    for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    for (int64_t j = lane; j < cols; j += 32) yr[j] = float(exp(double(xr[j]) - mx) / sum);
    }
}

__global__ void softmaxBackwardKernel(const float* y, const float* dy, float* dx, int64_t rows, int64_t cols)
{
    const int lane = threadIdx.x % 32;
    const int64_t warps = int64_t(gridDim.x) * blockDim.x / 32;
    for (int64_t r = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32; r < rows; r += warps) {
    double dot = 0;
    for (int64_t j = lane; j < cols; j += 32) dot += double(y[r * cols + j]) * dy[r * cols + j];
    for (int o = 16; o > 0; o /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    for (int64_t j = lane; j < cols; j += 32)
        dx[r * cols + j] = float(double(y[r * cols + j]) * (double(dy[r * cols + j]) - dot));
    }
}

__device__ inline uint64_t splitmix64(uint64_t z)
{
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

__global__ void dropoutForwardKernel(const float* x, float rate, uint64_t seed, uint8_t* mask, float* y, int64_t n)
{
    const double keepScale = rate < 1.0f ? 1.0 / (1.0 - double(rate)) : 0.0;
    TS_GRID_LOOP(i, n)
    {
        const uint64_t h = splitmix64(seed ^ (uint64_t(i) * 0x9E3779B97F4A7C15ull));
        const float u = static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
        const bool keep = u >= rate;
        mask[i] = keep ? 1 : 0;
        y[i] = keep ? float(double(x[i]) * keepScale) : 0.0f;
    }
}

__global__ void dropoutBackwardKernel(const float* dy, const uint8_t* mask, float rate, float* dx, int64_t n)
{
    const double keepScale = rate < 1.0f ? 1.0 / (1.0 - double(rate)) : 0.0;
    TS_GRID_LOOP(i, n) dx[i] = mask[i] ? float(double(dy[i]) * keepScale) : 0.0f;
}

__global__ void addKernel(const float* a, const float* b, float* c, int64_t n)
{
    TS_GRID_LOOP(i, n) c[i] = a[i] + b[i];
}

__global__ void axpyKernel(float alpha, const float* x, float* y, int64_t n)
{
    TS_GRID_LOOP(i, n) y[i] = float(double(y[i]) + double(alpha) * double(x[i]));
}

__global__ void scaleKernel(float alpha, float* x, int64_t n)
{
    TS_GRID_LOOP(i, n) x[i] *= alpha;
}

__global__ void copyColumnsInKernel(const float* x, float* y, int64_t rows, int64_t ci, int64_t total, int64_t offset)
{
    TS_GRID_LOOP(i, rows * ci) y[(i / ci) * total + offset + i % ci] = x[i];
}

__global__ void copyColumnsOutKernel(const float* y, float* x, int64_t rows, int64_t ci, int64_t total, int64_t offset)
{
    TS_GRID_LOOP(i, rows * ci) x[i] = y[(i / ci) * total + offset + i % ci];
}

// One thread per row: rows are independent and per-row work is small (class counts).
__global__ void lossKernel(int kind, bool fromLogits, const float* pred, const void* target, int64_t N, int64_t per,
                           double gscale, double* rowLoss, float* dpred, int* badRow)
{
    TS_GRID_LOOP(r, N)
    {
        const float* x = pred + r * per;
        float* d = dpred ? dpred + r * per : nullptr;
        double total = 0;
        if (kind == LossSparseCce || kind == LossCce) {
            const bool sparse = kind == LossSparseCce;
            const int64_t C = per;
            int64_t label = -1;
            if (sparse) {
                label = static_cast<const int32_t*>(target)[r];
                if (label < 0 || label >= C) {
                    atomicMin(badRow, int(r));
                    rowLoss[r] = 0;
                    continue;
                }
            }
            const float* tr = sparse ? nullptr : static_cast<const float*>(target) + r * C;
            auto t = [&](int64_t k) { return sparse ? (k == label ? 1.0 : 0.0) : double(tr[k]); };
            double tsum = 0;
            for (int64_t k = 0; k < C; ++k) tsum += t(k);
            if (fromLogits) {
                double mx = -INFINITY;
                for (int64_t k = 0; k < C; ++k) mx = fmax(mx, double(x[k]));
                double se = 0;
                for (int64_t k = 0; k < C; ++k) se += exp(double(x[k]) - mx);
                const double lse = mx + log(se);
                for (int64_t k = 0; k < C; ++k)
                    if (t(k) != 0.0) total += t(k) * (lse - x[k]);
                if (d)
                    for (int64_t k = 0; k < C; ++k) d[k] = float(gscale * (exp(double(x[k]) - lse) * tsum - t(k)));
            } else {
                double s = 0;
                for (int64_t k = 0; k < C; ++k) s += x[k];
                double gq = 0;
                for (int64_t k = 0; k < C; ++k) {
                    const double q = double(x[k]) / s;
                    const double qc = fmin(fmax(q, kProbEps), 1.0 - kProbEps);
                    if (t(k) != 0.0) total -= t(k) * log(qc);
                    const double gk = (q >= kProbEps && q <= 1.0 - kProbEps) ? -t(k) / q : 0.0;
                    gq += gk * q;
                }
                if (d)
                    for (int64_t k = 0; k < C; ++k) {
                        const double q = double(x[k]) / s;
                        const double gk = (q >= kProbEps && q <= 1.0 - kProbEps) ? -t(k) / q : 0.0;
                        d[k] = float(gscale * (gk - gq) / s);
                    }
            }
        } else {
            const float* z = static_cast<const float*>(target) + r * per;
            const double inv = per > 0 ? 1.0 / double(per) : 0.0;
            for (int64_t k = 0; k < per; ++k) {
                const double xv = x[k], zv = z[k];
                double l, g;
                if (kind == LossMse) {
                    const double e = xv - zv;
                    l = e * e;
                    g = 2.0 * e;
                } else if (fromLogits) {
                    l = fmax(xv, 0.0) - xv * zv + log1p(exp(-fabs(xv)));
                    g = sigmoidD(xv) - zv;
                } else {
                    const double pc = fmin(fmax(xv, kProbEps), 1.0 - kProbEps);
                    l = -(zv * log(pc) + (1.0 - zv) * log(1.0 - pc));
                    g = (xv >= kProbEps && xv <= 1.0 - kProbEps) ? -(zv / xv) + (1.0 - zv) / (1.0 - xv) : 0.0;
                }
                total += l * inv;
                if (d) d[k] = float(gscale * g * inv);
            }
        }
        rowLoss[r] = total;
    }
}

__global__ void argmaxKernel(const float* pred, const void* target, bool targetIsI32, bool binaryFromLogits, int64_t N,
                             int64_t C, int32_t* match)
{
    TS_GRID_LOOP(r, N)
    {
        const float* p = pred + r * C;
        if (C == 1) {
            const bool predicted = binaryFromLogits ? p[0] > 0.0f : p[0] > 0.5f;
            const double t = targetIsI32 ? double(static_cast<const int32_t*>(target)[r])
                                         : double(static_cast<const float*>(target)[r]);
            match[r] = predicted == (t > 0.5) ? 1 : 0;
            continue;
        }
        int64_t best = 0;
        for (int64_t k = 1; k < C; ++k)
            if (p[k] > p[best]) best = k;
        int64_t expected;
        if (targetIsI32) {
            expected = static_cast<const int32_t*>(target)[r];
        } else {
            const float* t = static_cast<const float*>(target) + r * C;
            expected = 0;
            for (int64_t k = 1; k < C; ++k)
                if (t[k] > t[expected]) expected = k;
        }
        match[r] = best == expected ? 1 : 0;
    }
}

__global__ void sgdKernel(double lr, double mu, bool nesterov, double wd, float* p, const float* grad, float* v,
                          int64_t n)
{
    TS_GRID_LOOP(i, n)
    {
        const double g = double(grad[i]) + wd * p[i];
        if (v) {
            const double vi = mu * v[i] + g;
            v[i] = float(vi);
            p[i] = float(p[i] - lr * (nesterov ? g + mu * vi : vi));
        } else {
            p[i] = float(p[i] - lr * g);
        }
    }
}

__global__ void adamKernel(double lr, double b1, double b2, double eps, double wd, double bc1, double bc2, float* p,
                           const float* grad, float* m, float* v, int64_t n)
{
    TS_GRID_LOOP(i, n)
    {
        double w = p[i];
        w -= lr * wd * w;
        const double g = grad[i];
        const double mi = b1 * m[i] + (1.0 - b1) * g;
        const double vi = b2 * v[i] + (1.0 - b2) * g * g;
        m[i] = float(mi);
        v[i] = float(vi);
        w -= lr * (mi / bc1) / (sqrt(vi / bc2) + eps);
        p[i] = float(w);
    }
}

__global__ void rmspropKernel(double lr, double rho, double mu, double eps, float* p, const float* grad, float* ms,
                              float* mom, float* mg, int64_t n)
{
    TS_GRID_LOOP(i, n)
    {
        const double g = grad[i];
        const double s = rho * ms[i] + (1.0 - rho) * g * g;
        ms[i] = float(s);
        double denom = s;
        if (mg) {
            const double a = rho * mg[i] + (1.0 - rho) * g;
            mg[i] = float(a);
            denom = s - a * a;
        }
        const double inc = lr * g / sqrt(denom + eps);
        if (mom) {
            const double mv = mu * mom[i] + inc;
            mom[i] = float(mv);
            p[i] = float(p[i] - mv);
        } else {
            p[i] = float(p[i] - inc);
        }
    }
}

constexpr int kSumBlocksMax = 1024;

__global__ void sumSquaresKernel(const float* x, int64_t n, double* partials)
{
    __shared__ double sh[kThreads];
    double acc = 0;
    TS_GRID_LOOP(i, n) acc += double(x[i]) * double(x[i]);
    sh[threadIdx.x] = acc;
    __syncthreads();
    for (int s = kThreads / 2; s > 0; s /= 2) {
        if (int(threadIdx.x) < s) sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) partials[blockIdx.x] = sh[0];
}

inline cudaError_t launched() { return cudaGetLastError(); }

} // namespace

cudaError_t biasActivation(float* y, const float* bias, int64_t rows, int64_t cols, int act, cudaStream_t s)
{
    if (rows * cols == 0) return cudaSuccess;
    biasActivationKernel<<<gridFor(rows * cols), kThreads, 0, s>>>(y, bias, rows, cols, act);
    return launched();
}

cudaError_t transpose2d(const float* in, float* out, int64_t rows, int64_t cols, cudaStream_t s)
{
    if (rows * cols == 0) return cudaSuccess;
    const dim3 block(32, 8);
    const dim3 grid(static_cast<unsigned>((cols + 31) / 32), static_cast<unsigned>((rows + 31) / 32));
    transposeKernel<<<grid, block, 0, s>>>(in, out, rows, cols);
    return launched();
}

int64_t columnReduceScratch(int64_t rows, int64_t cols) { return int64_t(reduceSplits(rows)) * kLanes * cols * 2; }

cudaError_t columnReduce(ColumnReduce mode, const float* x, const float* dy, const double* mean, const float* meanF,
                         const float* invStdF, int64_t rows, int64_t cols, double* scratch, double* a, double* b,
                         cudaStream_t s)
{
    if (cols == 0) return cudaSuccess;
    const int splits = reduceSplits(rows);
    const dim3 block(32, kLanes);
    const dim3 grid(static_cast<unsigned>((cols + 31) / 32), static_cast<unsigned>(splits));
    columnReducePartial<<<grid, block, 0, s>>>(int(mode), x, dy, mean, meanF, invStdF, rows, cols, scratch);
    cudaError_t e = launched();
    if (e != cudaSuccess) return e;
    columnReduceFinal<<<gridFor(cols), kThreads, 0, s>>>(scratch, splits * kLanes, cols, a, b);
    return launched();
}

cudaError_t storeColumnSums(const double* src, float* dst, int64_t cols, bool accumulate, cudaStream_t s)
{
    if (cols == 0) return cudaSuccess;
    storeColumnSumsKernel<<<gridFor(cols), kThreads, 0, s>>>(src, dst, cols, accumulate);
    return launched();
}

cudaError_t padNhwc(const float* x, float* xp, int64_t N, int64_t H, int64_t W, int64_t C, int padTop, int padLeft,
                    int64_t HP, int64_t WP, cudaStream_t s)
{
    const int64_t n = N * HP * WP * C;
    if (n == 0) return cudaSuccess;
    padKernel<<<gridFor(n), kThreads, 0, s>>>(x, xp, N, H, W, C, padTop, padLeft, HP, WP);
    return launched();
}

cudaError_t cropNhwc(const float* xp, float* x, int64_t N, int64_t H, int64_t W, int64_t C, int padTop, int padLeft,
                     int64_t HP, int64_t WP, cudaStream_t s)
{
    const int64_t n = N * H * W * C;
    if (n == 0) return cudaSuccess;
    cropKernel<<<gridFor(n), kThreads, 0, s>>>(xp, x, N, H, W, C, padTop, padLeft, HP, WP);
    return launched();
}

cudaError_t pool2dForward(const float* x, float* y, int32_t* ws, const PoolGeom& g, bool isMax, cudaStream_t s)
{
    const int64_t n = g.N * g.OH * g.OW * g.C;
    if (n == 0) return cudaSuccess;
    poolForwardKernel<<<gridFor(n), kThreads, 0, s>>>(x, y, ws, g, isMax);
    return launched();
}

cudaError_t pool2dBackward(const float* dy, const int32_t* ws, float* dx, const PoolGeom& g, bool isMax, cudaStream_t s)
{
    const int64_t n = g.N * g.H * g.W * g.C;
    if (n == 0) return cudaSuccess;
    poolBackwardKernel<<<gridFor(n), kThreads, 0, s>>>(dy, ws, dx, g, isMax);
    return launched();
}

cudaError_t globalAvgPoolForward(const float* x, float* y, int64_t N, int64_t HW, int64_t C, cudaStream_t s)
{
    if (N * C == 0) return cudaSuccess;
    gapForwardKernel<<<gridFor(N * C), kThreads, 0, s>>>(x, y, N, HW, C);
    return launched();
}

cudaError_t globalAvgPoolBackward(const float* dy, float* dx, int64_t N, int64_t HW, int64_t C, cudaStream_t s)
{
    if (N * HW * C == 0) return cudaSuccess;
    gapBackwardKernel<<<gridFor(N * HW * C), kThreads, 0, s>>>(dy, dx, N, HW, C);
    return launched();
}

cudaError_t batchNormMean(const double* sums, double* meanOut, int64_t M, int64_t C, cudaStream_t s)
{
    if (C == 0) return cudaSuccess;
    bnMeanKernel<<<gridFor(C), kThreads, 0, s>>>(sums, meanOut, M, C);
    return launched();
}

cudaError_t batchNormFinish(const double* mean, const double* sq, int64_t M, int64_t C, float momentum, float epsilon,
                            float* runningMean, float* runningVar, float* saveMean, float* saveInvStd,
                            double* invStdOut, cudaStream_t s)
{
    if (C == 0) return cudaSuccess;
    bnFinishKernel<<<gridFor(C), kThreads, 0, s>>>(mean, sq, M, C, momentum, epsilon, runningMean, runningVar,
                                                   saveMean, saveInvStd, invStdOut);
    return launched();
}

cudaError_t batchNormRunning(const float* runningMean, const float* runningVar, float epsilon, double* mean,
                             double* invStd, int64_t C, cudaStream_t s)
{
    if (C == 0) return cudaSuccess;
    bnRunningKernel<<<gridFor(C), kThreads, 0, s>>>(runningMean, runningVar, epsilon, mean, invStd, C);
    return launched();
}

cudaError_t batchNormApply(const float* x, const double* mean, const double* invStd, const float* gamma,
                           const float* beta, float* y, int64_t M, int64_t C, cudaStream_t s)
{
    if (M * C == 0) return cudaSuccess;
    bnApplyKernel<<<gridFor(M * C), kThreads, 0, s>>>(x, mean, invStd, gamma, beta, y, M, C);
    return launched();
}

cudaError_t batchNormBackward(const float* x, const float* gamma, const float* saveMean, const float* saveInvStd,
                              const float* dy, const double* sumDy, const double* sumDyXhat, float* dx,
                              float* dgamma, float* dbeta, int64_t M, int64_t C, cudaStream_t s)
{
    if (C == 0) return cudaSuccess;
    if (dgamma || dbeta) {
        bnGammaBetaKernel<<<gridFor(C), kThreads, 0, s>>>(sumDy, sumDyXhat, dgamma, dbeta, C);
        cudaError_t e = launched();
        if (e != cudaSuccess) return e;
    }
    if (dx && M * C > 0) {
        bnBackwardKernel<<<gridFor(M * C), kThreads, 0, s>>>(x, gamma, saveMean, saveInvStd, dy, sumDy, sumDyXhat,
                                                             dx, M, C);
        return launched();
    }
    return cudaSuccess;
}

cudaError_t activationForward(int act, float alpha, const float* x, float* y, int64_t n, cudaStream_t s)
{
    if (n == 0) return cudaSuccess;
    activationForwardKernel<<<gridFor(n), kThreads, 0, s>>>(act, alpha, x, y, n);
    return launched();
}

cudaError_t activationBackward(int act, float alpha, const float* x, const float* y, const float* dy, float* dx,
                               int64_t n, cudaStream_t s)
{
    if (n == 0) return cudaSuccess;
    activationBackwardKernel<<<gridFor(n), kThreads, 0, s>>>(act, alpha, x, y, dy, dx, n);
    return launched();
}

cudaError_t softmaxForward(const float* x, float* y, int64_t rows, int64_t cols, cudaStream_t s)
{
    if (rows * cols == 0) return cudaSuccess;
    softmaxForwardKernel<<<gridFor(rows * 32), kThreads, 0, s>>>(x, y, rows, cols);
    return launched();
}

cudaError_t softmaxBackward(const float* y, const float* dy, float* dx, int64_t rows, int64_t cols, cudaStream_t s)
{
    if (rows * cols == 0) return cudaSuccess;
    softmaxBackwardKernel<<<gridFor(rows * 32), kThreads, 0, s>>>(y, dy, dx, rows, cols);
    return launched();
}

cudaError_t dropoutForward(const float* x, float rate, uint64_t seed, uint8_t* mask, float* y, int64_t n,
                           cudaStream_t s)
{
    if (n == 0) return cudaSuccess;
    dropoutForwardKernel<<<gridFor(n), kThreads, 0, s>>>(x, rate, seed, mask, y, n);
    return launched();
}

cudaError_t dropoutBackward(const float* dy, const uint8_t* mask, float rate, float* dx, int64_t n, cudaStream_t s)
{
    if (n == 0) return cudaSuccess;
    dropoutBackwardKernel<<<gridFor(n), kThreads, 0, s>>>(dy, mask, rate, dx, n);
    return launched();
}

cudaError_t add(const float* a, const float* b, float* c, int64_t n, cudaStream_t s)
{
    if (n == 0) return cudaSuccess;
    addKernel<<<gridFor(n), kThreads, 0, s>>>(a, b, c, n);
    return launched();
}

cudaError_t axpy(float alpha, const float* x, float* y, int64_t n, cudaStream_t s)
{
    if (n == 0) return cudaSuccess;
    axpyKernel<<<gridFor(n), kThreads, 0, s>>>(alpha, x, y, n);
    return launched();
}

cudaError_t scale(float alpha, float* x, int64_t n, cudaStream_t s)
{
    if (n == 0) return cudaSuccess;
    scaleKernel<<<gridFor(n), kThreads, 0, s>>>(alpha, x, n);
    return launched();
}

cudaError_t copyColumnsIn(const float* x, float* y, int64_t rows, int64_t ci, int64_t total, int64_t offset,
                          cudaStream_t s)
{
    if (rows * ci == 0) return cudaSuccess;
    copyColumnsInKernel<<<gridFor(rows * ci), kThreads, 0, s>>>(x, y, rows, ci, total, offset);
    return launched();
}

cudaError_t copyColumnsOut(const float* y, float* x, int64_t rows, int64_t ci, int64_t total, int64_t offset,
                           cudaStream_t s)
{
    if (rows * ci == 0) return cudaSuccess;
    copyColumnsOutKernel<<<gridFor(rows * ci), kThreads, 0, s>>>(y, x, rows, ci, total, offset);
    return launched();
}

cudaError_t loss(int kind, bool fromLogits, const float* pred, const void* target, int64_t N, int64_t per,
                 double gscale, double* rowLoss, float* dpred, int* badRow, cudaStream_t s)
{
    if (N == 0) return cudaSuccess;
    lossKernel<<<gridFor(N), kThreads, 0, s>>>(kind, fromLogits, pred, target, N, per, gscale, rowLoss, dpred, badRow);
    return launched();
}

cudaError_t argmaxMatches(const float* pred, const void* target, bool targetIsI32, bool binaryFromLogits, int64_t N,
                          int64_t C, int32_t* match, cudaStream_t s)
{
    if (N == 0) return cudaSuccess;
    argmaxKernel<<<gridFor(N), kThreads, 0, s>>>(pred, target, targetIsI32, binaryFromLogits, N, C, match);
    return launched();
}

cudaError_t sgdUpdate(float lr, float momentum, bool nesterov, float weightDecay, float* param, const float* grad,
                      float* velocity, int64_t n, cudaStream_t s)
{
    if (n == 0) return cudaSuccess;
    sgdKernel<<<gridFor(n), kThreads, 0, s>>>(lr, momentum, nesterov, weightDecay, param, grad, velocity, n);
    return launched();
}

cudaError_t adamUpdate(float lr, float beta1, float beta2, float epsilon, float weightDecay, double bc1, double bc2,
                       float* param, const float* grad, float* m, float* v, int64_t n, cudaStream_t s)
{
    if (n == 0) return cudaSuccess;
    adamKernel<<<gridFor(n), kThreads, 0, s>>>(lr, beta1, beta2, epsilon, weightDecay, bc1, bc2, param, grad, m, v, n);
    return launched();
}

cudaError_t rmspropUpdate(float lr, float rho, float momentum, float epsilon, bool centered, float* param,
                          const float* grad, float* ms, float* mom, float* mg, int64_t n, cudaStream_t s)
{
    if (n == 0) return cudaSuccess;
    rmspropKernel<<<gridFor(n), kThreads, 0, s>>>(lr, rho, momentum, epsilon, param, grad, ms,
                                                  momentum > 0.0f ? mom : nullptr, centered ? mg : nullptr, n);
    return launched();
}

int sumSquaresBlocks(int64_t n)
{
    const int64_t b = (n + kThreads - 1) / kThreads;
    return static_cast<int>(b < 1 ? 1 : (b > kSumBlocksMax ? kSumBlocksMax : b));
}

cudaError_t sumSquares(const float* x, int64_t n, double* partials, cudaStream_t s)
{
    sumSquaresKernel<<<sumSquaresBlocks(n), kThreads, 0, s>>>(x, n, partials);
    return launched();
}

} // namespace ts::cudak
