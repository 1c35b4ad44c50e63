#include "backend/cpu/cpu_kernels.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

// One copy per ISA level, chosen by the loader (ifunc). The default build targets baseline x86-64,
// so without this the loops would run with 4-wide SSE.
#define TS_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))

namespace ts::cpuk {

namespace {

enum class Isa { Base, Avx2, Avx512 };

Isa detectIsa()
{
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return Isa::Avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::Avx2;
    return Isa::Base;
}

const Isa kIsa = detectIsa();

TS_CLONES void addDistinct(const float* __restrict a, const float* __restrict b, float* __restrict c,
                           int64_t n)
{
    for (int64_t i = 0; i < n; ++i) c[i] = a[i] + b[i];
}

TS_CLONES void addInPlace(float* __restrict c, const float* __restrict b, int64_t n)
{
    for (int64_t i = 0; i < n; ++i) c[i] += b[i];
}

// SplitMix64-based keep bit; must match dropoutKeep() in backend.cpp bit for bit (the op test
// compares masks with the reference backend, which calls dropoutKeep itself).
inline bool keepBit(uint64_t seed, uint64_t index, float rate)
{
    uint64_t z = seed ^ (index * 0x9E3779B97F4A7C15ull);
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float u = static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
    return u >= rate;
}

// ---- Adam: explicit intrinsics (GCC will not vectorise sqrt under -fmath-errno).

__attribute__((target("avx512f"))) int64_t adamAvx512(const AdamConsts& k, float* __restrict p,
                                                      const float* __restrict g, float* __restrict m,
                                                      float* __restrict v, int64_t n)
{
    const __m512 b1 = _mm512_set1_ps(k.beta1), b2 = _mm512_set1_ps(k.beta2);
    const __m512 c1 = _mm512_set1_ps(k.oneMinusBeta1), c2 = _mm512_set1_ps(k.oneMinusBeta2);
    const __m512 step = _mm512_set1_ps(k.stepSize), isb = _mm512_set1_ps(k.invSqrtBc2);
    const __m512 eps = _mm512_set1_ps(k.epsilon), decay = _mm512_set1_ps(k.decay);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 gi = _mm512_loadu_ps(g + i);
        const __m512 mi = _mm512_add_ps(_mm512_mul_ps(b1, _mm512_loadu_ps(m + i)), _mm512_mul_ps(c1, gi));
        const __m512 vi =
            _mm512_add_ps(_mm512_mul_ps(b2, _mm512_loadu_ps(v + i)), _mm512_mul_ps(_mm512_mul_ps(c2, gi), gi));
        _mm512_storeu_ps(m + i, mi);
        _mm512_storeu_ps(v + i, vi);
        const __m512 den = _mm512_add_ps(_mm512_mul_ps(_mm512_maskz_sqrt_ps(0xFFFF, vi), isb), eps);
        const __m512 w = _mm512_mul_ps(_mm512_loadu_ps(p + i), decay);
        _mm512_storeu_ps(p + i, _mm512_sub_ps(w, _mm512_div_ps(_mm512_mul_ps(step, mi), den)));
    }
    return i;
}

__attribute__((target("avx2,fma"))) int64_t adamAvx2(const AdamConsts& k, float* __restrict p,
                                                     const float* __restrict g, float* __restrict m,
                                                     float* __restrict v, int64_t n)
{
    const __m256 b1 = _mm256_set1_ps(k.beta1), b2 = _mm256_set1_ps(k.beta2);
    const __m256 c1 = _mm256_set1_ps(k.oneMinusBeta1), c2 = _mm256_set1_ps(k.oneMinusBeta2);
    const __m256 step = _mm256_set1_ps(k.stepSize), isb = _mm256_set1_ps(k.invSqrtBc2);
    const __m256 eps = _mm256_set1_ps(k.epsilon), decay = _mm256_set1_ps(k.decay);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 gi = _mm256_loadu_ps(g + i);
        const __m256 mi = _mm256_add_ps(_mm256_mul_ps(b1, _mm256_loadu_ps(m + i)), _mm256_mul_ps(c1, gi));
        const __m256 vi =
            _mm256_add_ps(_mm256_mul_ps(b2, _mm256_loadu_ps(v + i)), _mm256_mul_ps(_mm256_mul_ps(c2, gi), gi));
        _mm256_storeu_ps(m + i, mi);
        _mm256_storeu_ps(v + i, vi);
        const __m256 den = _mm256_add_ps(_mm256_mul_ps(_mm256_sqrt_ps(vi), isb), eps);
        const __m256 w = _mm256_mul_ps(_mm256_loadu_ps(p + i), decay);
        _mm256_storeu_ps(p + i, _mm256_sub_ps(w, _mm256_div_ps(_mm256_mul_ps(step, mi), den)));
    }
    return i;
}

// ---- RMSprop, same reason. inc = lr * g / sqrt(denom + eps).

__attribute__((target("avx512f"))) int64_t rmspropAvx512(float lr, float rho, float momentum, float epsilon,
                                                         float* __restrict p, const float* __restrict g,
                                                         float* __restrict ms, float* __restrict mom,
                                                         float* __restrict mg, int64_t n)
{
    const __m512 vr = _mm512_set1_ps(rho), vc = _mm512_set1_ps(1.0f - rho), vlr = _mm512_set1_ps(lr);
    const __m512 veps = _mm512_set1_ps(epsilon), vmu = _mm512_set1_ps(momentum);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 gi = _mm512_loadu_ps(g + i);
        const __m512 s = _mm512_add_ps(_mm512_mul_ps(vr, _mm512_loadu_ps(ms + i)), _mm512_mul_ps(_mm512_mul_ps(vc, gi), gi));
        _mm512_storeu_ps(ms + i, s);
        __m512 den = s;
        if (mg) {
            const __m512 a = _mm512_add_ps(_mm512_mul_ps(vr, _mm512_loadu_ps(mg + i)), _mm512_mul_ps(vc, gi));
            _mm512_storeu_ps(mg + i, a);
            den = _mm512_sub_ps(s, _mm512_mul_ps(a, a));
        }
        const __m512 inc = _mm512_div_ps(_mm512_mul_ps(vlr, gi), _mm512_maskz_sqrt_ps(0xFFFF, _mm512_add_ps(den, veps)));
        if (mom) {
            const __m512 mv = _mm512_add_ps(_mm512_mul_ps(vmu, _mm512_loadu_ps(mom + i)), inc);
            _mm512_storeu_ps(mom + i, mv);
            _mm512_storeu_ps(p + i, _mm512_sub_ps(_mm512_loadu_ps(p + i), mv));
        } else {
            _mm512_storeu_ps(p + i, _mm512_sub_ps(_mm512_loadu_ps(p + i), inc));
        }
    }
    return i;
}

__attribute__((target("avx2,fma"))) int64_t rmspropAvx2(float lr, float rho, float momentum, float epsilon,
                                                        float* __restrict p, const float* __restrict g,
                                                        float* __restrict ms, float* __restrict mom,
                                                        float* __restrict mg, int64_t n)
{
    const __m256 vr = _mm256_set1_ps(rho), vc = _mm256_set1_ps(1.0f - rho), vlr = _mm256_set1_ps(lr);
    const __m256 veps = _mm256_set1_ps(epsilon), vmu = _mm256_set1_ps(momentum);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 gi = _mm256_loadu_ps(g + i);
        const __m256 s = _mm256_add_ps(_mm256_mul_ps(vr, _mm256_loadu_ps(ms + i)), _mm256_mul_ps(_mm256_mul_ps(vc, gi), gi));
        _mm256_storeu_ps(ms + i, s);
        __m256 den = s;
        if (mg) {
            const __m256 a = _mm256_add_ps(_mm256_mul_ps(vr, _mm256_loadu_ps(mg + i)), _mm256_mul_ps(vc, gi));
            _mm256_storeu_ps(mg + i, a);
            den = _mm256_sub_ps(s, _mm256_mul_ps(a, a));
        }
        const __m256 inc = _mm256_div_ps(_mm256_mul_ps(vlr, gi), _mm256_sqrt_ps(_mm256_add_ps(den, veps)));
        if (mom) {
            const __m256 mv = _mm256_add_ps(_mm256_mul_ps(vmu, _mm256_loadu_ps(mom + i)), inc);
            _mm256_storeu_ps(mom + i, mv);
            _mm256_storeu_ps(p + i, _mm256_sub_ps(_mm256_loadu_ps(p + i), mv));
        } else {
            _mm256_storeu_ps(p + i, _mm256_sub_ps(_mm256_loadu_ps(p + i), inc));
        }
    }
    return i;
}

// ---- pooling helpers

struct Window {
    int64_t h0, h1, w0, w1;  // in-bounds input rows [h0, h1), cols [w0, w1)
};

inline Window window(const PoolGeom& g, int64_t oh, int64_t ow)
{
    const int64_t hs = oh * g.strideH - g.padTop, ws = ow * g.strideW - g.padLeft;
    return {std::max<int64_t>(hs, 0), std::min<int64_t>(hs + g.windowH, g.H), std::max<int64_t>(ws, 0),
            std::min<int64_t>(ws + g.windowW, g.W)};
}

TS_CLONES void accumulate(const float* __restrict x, float* __restrict y, int64_t C)
{
    for (int64_t c = 0; c < C; ++c) y[c] += x[c];
}

TS_CLONES void scaledAccumulate(const float* __restrict x, float s, float* __restrict y, int64_t C)
{
    for (int64_t c = 0; c < C; ++c) y[c] += x[c] * s;
}

TS_CLONES void accumulateDouble(const float* __restrict x, double* __restrict acc, int64_t C)
{
    for (int64_t c = 0; c < C; ++c) acc[c] += x[c];
}

} // namespace

// ---------------------------------------------------------------- elementwise

void add(const float* a, const float* b, float* c, int64_t n)
{
    if (c == a && c == b) scale(2.0f, c, n);
    else if (c == a) addInPlace(c, b, n);
    else if (c == b) addInPlace(c, a, n);
    else addDistinct(a, b, c, n);
}

TS_CLONES void axpy(float alpha, const float* __restrict x, float* __restrict y, int64_t n)
{
    for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

TS_CLONES void scale(float alpha, float* __restrict x, int64_t n)
{
    for (int64_t i = 0; i < n; ++i) x[i] *= alpha;
}

void copy(const float* x, float* y, int64_t n)
{
    if (x != y && n > 0) std::memcpy(y, x, static_cast<std::size_t>(n) * sizeof(float));
}

TS_CLONES double sumSquares(const float* __restrict x, int64_t n)
{
    double acc = 0;
#pragma omp simd reduction(+ : acc)
    for (int64_t i = 0; i < n; ++i) acc += double(x[i]) * double(x[i]);
    return acc;
}

TS_CLONES void colSum(const float* __restrict dy, int64_t rows, int64_t cols, float* __restrict db,
                      bool accumulate)
{
    if (!accumulate)
        for (int64_t c = 0; c < cols; ++c) db[c] = 0.0f;
    for (int64_t r = 0; r < rows; ++r) {
        const float* row = dy + r * cols;
        for (int64_t c = 0; c < cols; ++c) db[c] += row[c];
    }
}

// ---------------------------------------------------------------- dropout

TS_CLONES void dropoutForward(const float* __restrict x, float rate, uint64_t seed, uint8_t* __restrict mask,
                              float* __restrict y, int64_t begin, int64_t end)
{
    const double keepScale = rate < 1.0f ? 1.0 / (1.0 - double(rate)) : 0.0;
    for (int64_t i = begin; i < end; ++i) {
        const bool keep = keepBit(seed, static_cast<uint64_t>(i), rate);
        mask[i] = keep ? 1 : 0;
        y[i] = keep ? static_cast<float>(double(x[i]) * keepScale) : 0.0f;
    }
}

TS_CLONES void dropoutBackward(const float* __restrict dy, const uint8_t* __restrict mask, float rate,
                               float* __restrict dx, int64_t n)
{
    const double keepScale = rate < 1.0f ? 1.0 / (1.0 - double(rate)) : 0.0;
    for (int64_t i = 0; i < n; ++i)
        dx[i] = mask[i] ? static_cast<float>(double(dy[i]) * keepScale) : 0.0f;
}

// ---------------------------------------------------------------- optimizers

void adam(const AdamConsts& k, float* p, const float* g, float* m, float* v, int64_t n)
{
    int64_t i = 0;
    if (kIsa == Isa::Avx512) i = adamAvx512(k, p, g, m, v, n);
    else if (kIsa == Isa::Avx2) i = adamAvx2(k, p, g, m, v, n);
    for (; i < n; ++i) {
        const float gi = g[i];
        const float mi = k.beta1 * m[i] + k.oneMinusBeta1 * gi;
        const float vi = k.beta2 * v[i] + k.oneMinusBeta2 * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] = p[i] * k.decay - k.stepSize * mi / (std::sqrt(vi) * k.invSqrtBc2 + k.epsilon);
    }
}

TS_CLONES void sgd(float lr, float momentum, bool nesterov, float weightDecay, float* __restrict p,
                   const float* __restrict g, float* __restrict velocity, int64_t n)
{
    if (momentum == 0.0f) {
        for (int64_t i = 0; i < n; ++i) p[i] -= lr * (g[i] + weightDecay * p[i]);
    } else if (nesterov) {
        for (int64_t i = 0; i < n; ++i) {
            const float gi = g[i] + weightDecay * p[i];
            const float vi = momentum * velocity[i] + gi;
            velocity[i] = vi;
            p[i] -= lr * (gi + momentum * vi);
        }
    } else {
        for (int64_t i = 0; i < n; ++i) {
            const float gi = g[i] + weightDecay * p[i];
            const float vi = momentum * velocity[i] + gi;
            velocity[i] = vi;
            p[i] -= lr * vi;
        }
    }
}

void rmsprop(float lr, float rho, float momentum, float epsilon, float* p, const float* g, float* ms,
             float* mom, float* mg, int64_t n)
{
    int64_t i = 0;
    if (kIsa == Isa::Avx512) i = rmspropAvx512(lr, rho, momentum, epsilon, p, g, ms, mom, mg, n);
    else if (kIsa == Isa::Avx2) i = rmspropAvx2(lr, rho, momentum, epsilon, p, g, ms, mom, mg, n);
    for (; i < n; ++i) {
        const float gi = g[i];
        const float s = rho * ms[i] + (1.0f - rho) * gi * gi;
        ms[i] = s;
        float den = s;
        if (mg) {
            const float a = rho * mg[i] + (1.0f - rho) * gi;
            mg[i] = a;
            den = s - a * a;
        }
        const float inc = lr * gi / std::sqrt(den + epsilon);
        if (mom) {
            const float mv = momentum * mom[i] + inc;
            mom[i] = mv;
            p[i] -= mv;
        } else {
            p[i] -= inc;
        }
    }
}

// ---------------------------------------------------------------- pooling

namespace {

// Every window lies inside the input (no padding reached): the common "valid" pooling.
bool windowsInBounds(const PoolGeom& g)
{
    return g.padTop == 0 && g.padLeft == 0 && (g.OH - 1) * g.strideH + g.windowH <= g.H &&
           (g.OW - 1) * g.strideW + g.windowW <= g.W;
}

// Max over a KH x KW window (compile-time sizes) for one output pixel, vectorised over C; the
// window is read in row-major order so the first max wins ties.
template <int KH, int KW>
inline void maxWindow(const float* __restrict x, int64_t rowStride, int64_t C, int32_t base, float* __restrict y,
                      int32_t* __restrict ws)
{
    for (int64_t c = 0; c < C; ++c) {
        float best = x[c];
        int32_t bi = base + static_cast<int32_t>(c);
        for (int kh = 0; kh < KH; ++kh)
            for (int kw = 0; kw < KW; ++kw) {
                if (kh == 0 && kw == 0) continue;
                const int64_t off = kh * rowStride + kw * C;
                const float v = x[off + c];
                const bool gt = v > best;
                best = gt ? v : best;
                bi = gt ? base + static_cast<int32_t>(off + c) : bi;
            }
        y[c] = best;
        ws[c] = bi;
    }
}

template <int KH, int KW>
TS_CLONES void maxPoolFixed(const PoolGeom& g, const float* x, float* y, int32_t* ws, int64_t n0, int64_t n1)
{
    const int64_t C = g.C, rowStride = g.W * C;
    for (int64_t n = n0; n < n1; ++n)
        for (int64_t oh = 0; oh < g.OH; ++oh)
            for (int64_t ow = 0; ow < g.OW; ++ow) {
                const int64_t o = ((n * g.OH + oh) * g.OW + ow) * C;
                const int64_t base = ((n * g.H + oh * g.strideH) * g.W + ow * g.strideW) * C;
                maxWindow<KH, KW>(x + base, rowStride, C, static_cast<int32_t>(base), y + o, ws + o);
            }
}

TS_CLONES void maxPoolGeneric(const PoolGeom& g, const float* x, float* y, int32_t* ws, int64_t n0, int64_t n1)
{
    const int64_t C = g.C;
    for (int64_t n = n0; n < n1; ++n)
        for (int64_t oh = 0; oh < g.OH; ++oh)
            for (int64_t ow = 0; ow < g.OW; ++ow) {
                const int64_t o = ((n * g.OH + oh) * g.OW + ow) * C;
                float* __restrict yo = y + o;
                int32_t* __restrict wo = ws + o;
                const Window w = window(g, oh, ow);
                if (w.h0 >= w.h1 || w.w0 >= w.w1) {
                    for (int64_t c = 0; c < C; ++c) {
                        yo[c] = 0.0f;
                        wo[c] = -1;
                    }
                    continue;
                }
                bool first = true;
                for (int64_t ih = w.h0; ih < w.h1; ++ih)
                    for (int64_t iw = w.w0; iw < w.w1; ++iw) {
                        const int64_t base = ((n * g.H + ih) * g.W + iw) * C;
                        const float* __restrict xp = x + base;
                        const int32_t b = static_cast<int32_t>(base);
                        if (first) {
                            for (int64_t c = 0; c < C; ++c) {
                                yo[c] = xp[c];
                                wo[c] = b + static_cast<int32_t>(c);
                            }
                        } else {
                            for (int64_t c = 0; c < C; ++c) {
                                const float v = xp[c], best = yo[c];
                                const bool gt = v > best;  // strict: the first max in window order wins
                                yo[c] = gt ? v : best;
                                wo[c] = gt ? b + static_cast<int32_t>(c) : wo[c];
                            }
                        }
                        first = false;
                    }
            }
}

// Windows tile the input without overlap: every input element gets at most one gradient, so dx
// is written exactly once (no zero fill + scatter).
TS_CLONES void maxPoolBackwardTiled(const PoolGeom& g, const float* dy, const int32_t* ws, float* dx, int64_t n0,
                                    int64_t n1)
{
    const int64_t C = g.C;
    const int64_t coveredH = g.OH * g.strideH, coveredW = g.OW * g.strideW;  // stride == window here
    for (int64_t n = n0; n < n1; ++n) {
        for (int64_t ih = 0; ih < g.H; ++ih) {
            float* __restrict row = dx + (n * g.H + ih) * g.W * C;
            if (ih >= coveredH) {
                for (int64_t i = 0; i < g.W * C; ++i) row[i] = 0.0f;
                continue;
            }
            const int64_t oh = ih / g.strideH;
            for (int64_t ow = 0; ow < g.OW; ++ow) {
                const int64_t o = ((n * g.OH + oh) * g.OW + ow) * C;
                const float* __restrict d = dy + o;
                const int32_t* __restrict w = ws + o;
                for (int64_t kw = 0; kw < g.windowW; ++kw) {
                    const int64_t iw = ow * g.strideW + kw;
                    const int32_t base = static_cast<int32_t>(((n * g.H + ih) * g.W + iw) * C);
                    float* __restrict out = row + iw * C;
                    for (int64_t c = 0; c < C; ++c) out[c] = w[c] == base + static_cast<int32_t>(c) ? d[c] : 0.0f;
                }
            }
            for (int64_t i = coveredW * C; i < g.W * C; ++i) row[i] = 0.0f;
        }
    }
}

TS_CLONES void maxPoolBackwardGeneric(const PoolGeom& g, const float* dy, const int32_t* ws, float* dx, int64_t n0,
                                      int64_t n1)
{
    const int64_t C = g.C;
    const int64_t image = g.H * g.W * C;
    std::memset(dx + n0 * image, 0, static_cast<std::size_t>((n1 - n0) * image) * sizeof(float));
    for (int64_t n = n0; n < n1; ++n)
        for (int64_t oh = 0; oh < g.OH; ++oh)
            for (int64_t ow = 0; ow < g.OW; ++ow) {
                const int64_t o = ((n * g.OH + oh) * g.OW + ow) * C;
                const float* __restrict d = dy + o;
                const int32_t* __restrict w = ws + o;
                const Window win = window(g, oh, ow);
                // Every tap tests its own flat index against the argmax: vectorises over C and
                // handles overlapping windows (+=).
                for (int64_t ih = win.h0; ih < win.h1; ++ih)
                    for (int64_t iw = win.w0; iw < win.w1; ++iw) {
                        const int64_t base = ((n * g.H + ih) * g.W + iw) * C;
                        float* __restrict out = dx + base;
                        const int32_t b = static_cast<int32_t>(base);
                        for (int64_t c = 0; c < C; ++c) out[c] += w[c] == b + static_cast<int32_t>(c) ? d[c] : 0.0f;
                    }
            }
}

} // namespace

void maxPoolForward(const PoolGeom& g, const float* x, float* y, int32_t* ws, int64_t n0, int64_t n1)
{
    if (windowsInBounds(g)) {
        if (g.windowH == 2 && g.windowW == 2) return maxPoolFixed<2, 2>(g, x, y, ws, n0, n1);
        if (g.windowH == 3 && g.windowW == 3) return maxPoolFixed<3, 3>(g, x, y, ws, n0, n1);
    }
    maxPoolGeneric(g, x, y, ws, n0, n1);
}

void maxPoolBackward(const PoolGeom& g, const float* dy, const int32_t* ws, float* dx, int64_t n0, int64_t n1)
{
    if (windowsInBounds(g) && g.strideH == g.windowH && g.strideW == g.windowW)
        return maxPoolBackwardTiled(g, dy, ws, dx, n0, n1);
    maxPoolBackwardGeneric(g, dy, ws, dx, n0, n1);
}

void avgPoolForward(const PoolGeom& g, const float* x, float* y, int64_t n0, int64_t n1)
{
    const int64_t C = g.C;
    for (int64_t n = n0; n < n1; ++n)
        for (int64_t oh = 0; oh < g.OH; ++oh)
            for (int64_t ow = 0; ow < g.OW; ++ow) {
                float* yo = y + ((n * g.OH + oh) * g.OW + ow) * C;
                std::fill(yo, yo + C, 0.0f);
                const Window w = window(g, oh, ow);
                const int64_t count = std::max<int64_t>(w.h1 - w.h0, 0) * std::max<int64_t>(w.w1 - w.w0, 0);
                if (count == 0) continue;
                for (int64_t ih = w.h0; ih < w.h1; ++ih)
                    for (int64_t iw = w.w0; iw < w.w1; ++iw)
                        accumulate(x + ((n * g.H + ih) * g.W + iw) * C, yo, C);
                scale(1.0f / static_cast<float>(count), yo, C);
            }
}

void avgPoolBackward(const PoolGeom& g, const float* dy, float* dx, int64_t n0, int64_t n1)
{
    const int64_t C = g.C;
    const int64_t image = g.H * g.W * C;
    std::memset(dx + n0 * image, 0, static_cast<std::size_t>((n1 - n0) * image) * sizeof(float));
    for (int64_t n = n0; n < n1; ++n)
        for (int64_t oh = 0; oh < g.OH; ++oh)
            for (int64_t ow = 0; ow < g.OW; ++ow) {
                const float* dyo = dy + ((n * g.OH + oh) * g.OW + ow) * C;
                const Window w = window(g, oh, ow);
                const int64_t count = std::max<int64_t>(w.h1 - w.h0, 0) * std::max<int64_t>(w.w1 - w.w0, 0);
                if (count == 0) continue;
                const float s = 1.0f / static_cast<float>(count);
                for (int64_t ih = w.h0; ih < w.h1; ++ih)
                    for (int64_t iw = w.w0; iw < w.w1; ++iw)
                        scaledAccumulate(dyo, s, dx + ((n * g.H + ih) * g.W + iw) * C, C);
            }
}

void globalAvgPoolForward(const float* x, float* y, int64_t HW, int64_t C, int64_t n0, int64_t n1)
{
    double stack[256];
    double* acc = C <= 256 ? stack : new double[static_cast<std::size_t>(C)];
    for (int64_t n = n0; n < n1; ++n) {
        std::fill(acc, acc + C, 0.0);
        for (int64_t s = 0; s < HW; ++s) accumulateDouble(x + (n * HW + s) * C, acc, C);
        for (int64_t c = 0; c < C; ++c) y[n * C + c] = HW == 0 ? 0.0f : static_cast<float>(acc[c] / double(HW));
    }
    if (acc != stack) delete[] acc;
}

void globalAvgPoolBackward(const float* dy, float* dx, int64_t HW, int64_t C, int64_t n0, int64_t n1)
{
    const float inv = HW == 0 ? 0.0f : 1.0f / static_cast<float>(HW);
    for (int64_t n = n0; n < n1; ++n)
        for (int64_t s = 0; s < HW; ++s) {
            float* d = dx + (n * HW + s) * C;
            const float* g = dy + n * C;
            for (int64_t c = 0; c < C; ++c) d[c] = g[c] * inv;
        }
}

// ---------------------------------------------------------------- softmax cross-entropy

double sparseSoftmaxXent(const float* logits, const int32_t* labels, int64_t rows, int64_t C, float gscale,
                         float* dx)
{
    double total = 0;
    for (int64_t r = 0; r < rows; ++r) {
        const float* x = logits + r * C;
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t k = 0; k < C; ++k) mx = std::max(mx, x[k]);
        float se = 0;
        for (int64_t k = 0; k < C; ++k) se += std::exp(x[k] - mx);
        const float lse = mx + std::log(se);
        const int32_t label = labels[r];
        total += double(lse) - double(x[label]);
        if (dx) {
            float* d = dx + r * C;
            for (int64_t k = 0; k < C; ++k) d[k] = gscale * std::exp(x[k] - lse);
            d[label] -= gscale;
        }
    }
    return total;
}

double softmaxXent(const float* logits, const float* targets, int64_t rows, int64_t C, float gscale, float* dx)
{
    double total = 0;
    for (int64_t r = 0; r < rows; ++r) {
        const float* x = logits + r * C;
        const float* t = targets + r * C;
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t k = 0; k < C; ++k) mx = std::max(mx, x[k]);
        float se = 0;
        float tsum = 0;
        for (int64_t k = 0; k < C; ++k) {
            se += std::exp(x[k] - mx);
            tsum += t[k];
        }
        const float lse = mx + std::log(se);
        for (int64_t k = 0; k < C; ++k)
            if (t[k] != 0.0f) total += double(t[k]) * (double(lse) - double(x[k]));
        if (dx) {
            float* d = dx + r * C;
            for (int64_t k = 0; k < C; ++k) d[k] = gscale * (std::exp(x[k] - lse) * tsum - t[k]);
        }
    }
    return total;
}

} // namespace ts::cpuk
