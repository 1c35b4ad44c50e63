#include "backend/cpu/cpu_kernels.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

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

namespace {

TS_CLONES void leakyReluDistinct(float alpha, const float* __restrict x, float* __restrict y, int64_t n)
{
    if (alpha == 0.0f)
        for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
    else
        for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.0f ? x[i] : alpha * x[i];
}

TS_CLONES void leakyReluInPlace(float alpha, float* __restrict y, int64_t n)
{
    if (alpha == 0.0f)
        for (int64_t i = 0; i < n; ++i) y[i] = y[i] > 0.0f ? y[i] : 0.0f;
    else
        for (int64_t i = 0; i < n; ++i) y[i] = y[i] > 0.0f ? y[i] : alpha * y[i];
}

TS_CLONES void leakyReluBackwardDistinct(float alpha, const float* __restrict v, const float* __restrict dy,
                                         float* __restrict dx, int64_t n)
{
    for (int64_t i = 0; i < n; ++i) dx[i] = (v[i] > 0.0f ? 1.0f : alpha) * dy[i];
}

// dx overwrites dy (in-place backward); v is the forward input or output, a different buffer.
TS_CLONES void leakyReluBackwardInPlace(float alpha, const float* __restrict v, float* __restrict d, int64_t n)
{
    for (int64_t i = 0; i < n; ++i) d[i] = (v[i] > 0.0f ? 1.0f : alpha) * d[i];
}

} // namespace

// Exact aliasing (in-place) gets its own loop: GCC's runtime overlap check would send it to the
// scalar fallback.
void leakyRelu(float alpha, const float* x, float* y, int64_t n)
{
    if (x == y) leakyReluInPlace(alpha, y, n);
    else leakyReluDistinct(alpha, x, y, n);
}

void leakyReluBackward(float alpha, const float* v, const float* dy, float* dx, int64_t n)
{
    if (dx == dy && v != dx) leakyReluBackwardInPlace(alpha, v, dx, n);
    else if (v != dx && dy != dx) leakyReluBackwardDistinct(alpha, v, dy, dx, n);
    else
        for (int64_t i = 0; i < n; ++i) dx[i] = (v[i] > 0.0f ? 1.0f : alpha) * dy[i];
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

// ---------------------------------------------------------------- small-channel convolution

namespace {

// 8-float GCC vector: ymm in the AVX2/AVX-512 clones, two xmm in the baseline one. The helpers are
// always inlined, so the vector ABI note GCC gives for baseline callers does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"
typedef float v8f __attribute__((vector_size(32)));

__attribute__((always_inline)) inline v8f load8(const float* p)
{
    v8f v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

__attribute__((always_inline)) inline void store8(float* p, v8f v) { std::memcpy(p, &v, sizeof v); }

// One output pixel with bounds checks (windows that reach into the padding), all F = 8 * FV
// channels held in registers across the taps.
template <int FV>
__attribute__((always_inline)) inline void convPixelChecked(const ConvGeom& g, const float* x, const float* w, const float* b, float* y, int64_t n,
                             int64_t oh, int64_t ow)
{
    v8f acc[FV];
    for (int j = 0; j < FV; ++j) acc[j] = b ? load8(b + 8 * j) : v8f{};
    const int64_t C = g.C, F = g.F;
    for (int64_t kh = 0; kh < g.KH; ++kh) {
        const int64_t ih = oh * g.strideH - g.padTop + kh;
        if (ih < 0 || ih >= g.H) continue;
        for (int64_t kw = 0; kw < g.KW; ++kw) {
            const int64_t iw = ow * g.strideW - g.padLeft + kw;
            if (iw < 0 || iw >= g.W) continue;
            const float* xp = x + ((n * g.H + ih) * g.W + iw) * C;
            const float* wp = w + (kh * g.KW + kw) * C * F;
            for (int64_t c = 0; c < C; ++c) {
                const float xv = xp[c];
                for (int j = 0; j < FV; ++j) acc[j] += xv * load8(wp + c * F + 8 * j);
            }
        }
    }
    for (int j = 0; j < FV; ++j) store8(y + 8 * j, acc[j]);
}

// Output columns whose whole window lies inside the input: [lo, hi).
__attribute__((always_inline)) inline void interiorRange(int64_t out, int64_t in, int64_t k, int stride, int pad, int64_t& lo, int64_t& hi)
{
    lo = (pad + stride - 1) / stride;                       // first o with o * s - pad >= 0
    hi = in - k + pad < 0 ? 0 : (in - k + pad) / stride + 1;  // last o with o * s - pad + k <= in
    hi = std::min(hi, out);
    lo = std::min(lo, hi);
}

template <int FV>
__attribute__((always_inline)) inline void convRows(const ConvGeom& g, const float* x, const float* w, const float* b, float* y, int64_t r0,
                     int64_t r1)
{
    const int64_t C = g.C, F = g.F, T = g.KH * g.KW * C;
    std::vector<int64_t> xoff(static_cast<std::size_t>(T));
    for (int64_t kh = 0, t = 0; kh < g.KH; ++kh)
        for (int64_t kw = 0; kw < g.KW; ++kw)
            for (int64_t c = 0; c < C; ++c, ++t) xoff[static_cast<std::size_t>(t)] = (kh * g.W + kw) * C + c;
    const int64_t* off = xoff.data();
    int64_t owLo, owHi;
    interiorRange(g.OW, g.W, g.KW, g.strideW, g.padLeft, owLo, owHi);
    const int64_t xStep = g.strideW * C;
    for (int64_t r = r0; r < r1; ++r) {
        const int64_t n = r / g.OH, oh = r % g.OH;
        const int64_t ih0 = oh * g.strideH - g.padTop;
        float* yRow = y + r * g.OW * F;
        const bool rowInside = ih0 >= 0 && ih0 + g.KH <= g.H;
        const int64_t lo = rowInside ? owLo : g.OW, hi = rowInside ? owHi : g.OW;
        for (int64_t ow = 0; ow < lo; ++ow) convPixelChecked<FV>(g, x, w, b, yRow + ow * F, n, oh, ow);
        // Interior: two pixels at a time share the weight loads; flat tap list, no bounds checks.
        const float* xBase = x + ((n * g.H + ih0) * g.W + (lo * g.strideW - g.padLeft)) * C;
        int64_t ow = lo;
        for (; ow + 2 <= hi; ow += 2, xBase += 2 * xStep) {
            v8f a0[FV], a1[FV];
            for (int j = 0; j < FV; ++j) a0[j] = a1[j] = b ? load8(b + 8 * j) : v8f{};
            const float* x1 = xBase + xStep;
            for (int64_t t = 0; t < T; ++t) {
                const float v0 = xBase[off[t]], v1 = x1[off[t]];
                const float* wt = w + t * F;
                for (int j = 0; j < FV; ++j) {
                    const v8f wv = load8(wt + 8 * j);
                    a0[j] += v0 * wv;
                    a1[j] += v1 * wv;
                }
            }
            for (int j = 0; j < FV; ++j) {
                store8(yRow + ow * F + 8 * j, a0[j]);
                store8(yRow + (ow + 1) * F + 8 * j, a1[j]);
            }
        }
        for (; ow < g.OW; ++ow) convPixelChecked<FV>(g, x, w, b, yRow + ow * F, n, oh, ow);
    }
}

// dw[t] += sum over the row's pixels of x(tap t) * dy(pixel), all F channels in registers; two
// pixel streams (when registers allow) hide the FMA latency.
template <int FV>
__attribute__((always_inline)) inline void convBwdWeightsRows(const ConvGeom& g, const float* x, const float* dy, float* dw, float* db, int64_t r0,
                               int64_t r1)
{
    constexpr int S = FV <= 4 ? 2 : 1;
    const int64_t C = g.C, F = g.F, OW = g.OW;
    // Per kw: the output columns whose tap lands inside the input row.
    std::vector<int64_t> los(static_cast<std::size_t>(g.KW)), his(static_cast<std::size_t>(g.KW));
    for (int64_t kw = 0; kw < g.KW; ++kw) {
        const int64_t o = kw - g.padLeft;
        int64_t lo = o >= 0 ? 0 : (-o + g.strideW - 1) / g.strideW;
        int64_t hi = g.W - 1 - o < 0 ? 0 : (g.W - 1 - o) / g.strideW + 1;
        hi = std::min(hi, OW);
        los[static_cast<std::size_t>(kw)] = std::min(lo, hi);
        his[static_cast<std::size_t>(kw)] = hi;
    }
    const int64_t xs = g.strideW * C;
    for (int64_t r = r0; r < r1; ++r) {
        const int64_t n = r / g.OH, oh = r % g.OH;
        const float* dyRow = dy + r * OW * F;
        if (db) {
            v8f s[FV];
            for (int j = 0; j < FV; ++j) s[j] = v8f{};
            for (int64_t ow = 0; ow < OW; ++ow)
                for (int j = 0; j < FV; ++j) s[j] += load8(dyRow + ow * F + 8 * j);
            for (int j = 0; j < FV; ++j) store8(db + 8 * j, load8(db + 8 * j) + s[j]);
        }
        for (int64_t kh = 0; kh < g.KH; ++kh) {
            const int64_t ih = oh * g.strideH - g.padTop + kh;
            if (ih < 0 || ih >= g.H) continue;
            const float* xRow = x + (n * g.H + ih) * g.W * C;
            for (int64_t kw = 0; kw < g.KW; ++kw) {
                const int64_t lo = los[static_cast<std::size_t>(kw)], hi = his[static_cast<std::size_t>(kw)];
                if (lo >= hi) continue;
                for (int64_t c = 0; c < C; ++c) {
                    v8f acc[S][FV];
                    for (int k = 0; k < S; ++k)
                        for (int j = 0; j < FV; ++j) acc[k][j] = v8f{};
                    const float* xp = xRow + (lo * g.strideW + kw - g.padLeft) * C + c;
                    const float* dp = dyRow + lo * F;
                    int64_t ow = lo;
                    for (; ow + S <= hi; ow += S, xp += S * xs, dp += S * F)
                        for (int k = 0; k < S; ++k) {
                            const float xv = xp[k * xs];
                            for (int j = 0; j < FV; ++j) acc[k][j] += xv * load8(dp + k * F + 8 * j);
                        }
                    for (; ow < hi; ++ow, xp += xs, dp += F)
                        for (int j = 0; j < FV; ++j) acc[0][j] += xp[0] * load8(dp + 8 * j);
                    float* dwp = dw + ((kh * g.KW + kw) * C + c) * F;
                    for (int j = 0; j < FV; ++j) {
                        v8f sum = acc[0][j];
                        for (int k = 1; k < S; ++k) sum += acc[k][j];
                        store8(dwp + 8 * j, load8(dwp + 8 * j) + sum);
                    }
                }
            }
        }
    }
}

} // namespace

bool smallConvApplies(const ConvGeom& g)
{
    return g.C >= 1 && g.C <= 4 && g.F % 8 == 0 && g.F >= 8 && g.F <= 64;
}

TS_CLONES void smallConvForward(const ConvGeom& g, const float* x, const float* w, const float* b, float* y,
                                int64_t r0, int64_t r1)
{
    switch (g.F / 8) {
    case 1: return convRows<1>(g, x, w, b, y, r0, r1);
    case 2: return convRows<2>(g, x, w, b, y, r0, r1);
    case 3: return convRows<3>(g, x, w, b, y, r0, r1);
    case 4: return convRows<4>(g, x, w, b, y, r0, r1);
    case 5: return convRows<5>(g, x, w, b, y, r0, r1);
    case 6: return convRows<6>(g, x, w, b, y, r0, r1);
    case 7: return convRows<7>(g, x, w, b, y, r0, r1);
    case 8: return convRows<8>(g, x, w, b, y, r0, r1);
    default: break;
    }
}

TS_CLONES void smallConvBackwardWeights(const ConvGeom& g, const float* x, const float* dy, float* dw, float* db,
                                        int64_t r0, int64_t r1)
{
    switch (g.F / 8) {
    case 1: return convBwdWeightsRows<1>(g, x, dy, dw, db, r0, r1);
    case 2: return convBwdWeightsRows<2>(g, x, dy, dw, db, r0, r1);
    case 3: return convBwdWeightsRows<3>(g, x, dy, dw, db, r0, r1);
    case 4: return convBwdWeightsRows<4>(g, x, dy, dw, db, r0, r1);
    case 5: return convBwdWeightsRows<5>(g, x, dy, dw, db, r0, r1);
    case 6: return convBwdWeightsRows<6>(g, x, dy, dw, db, r0, r1);
    case 7: return convBwdWeightsRows<7>(g, x, dy, dw, db, r0, r1);
    case 8: return convBwdWeightsRows<8>(g, x, dy, dw, db, r0, r1);
    default: break;
    }
}

// ---------------------------------------------------------------- tiled NHWC convolution

namespace {

// Register tiles: P pixels (forward) or input channels (backward weights) x FB vectors of 8
// filters, P * FB = 12 accumulators. 3 x 32 needs fewer broadcasts per FMA than 6 x 16 (on Zen
// the broadcasts compete with the FMAs for the FP pipes), so it is used when F allows.
template <int P, int FB>
__attribute__((always_inline)) inline void tileFma(const float* const* px, int64_t C, const float* w, int64_t F,
                                                   v8f (&acc)[P][FB])
{
    const float* pp[P];
    for (int p = 0; p < P; ++p) pp[p] = px[p];
    for (int64_t c = 0; c < C; ++c, w += F) {
        v8f wv[FB];
        for (int fb = 0; fb < FB; ++fb) wv[fb] = load8(w + 8 * fb);
        for (int p = 0; p < P; ++p) {
            const float xv = pp[p][c];
            for (int fb = 0; fb < FB; ++fb) acc[p][fb] += xv * wv[fb];
        }
    }
}

// One tile of P output pixels (same output row, consecutive columns from ow0) x 8*FB filters.
// Taps that fall into the padding read a row of zeros, so every tap runs the same inner loop.
// (Splitting the channels into L1-sized weight chunks measured slower: shorter inner loops and
// partial sums through memory cost more than the L2 weight traffic they save.)
template <int P, int FB>
__attribute__((always_inline)) inline void convTile(const ConvGeom& g, const float* x, const float* w, const float* b,
                                                    float* y, const float* zeros, int64_t n, int64_t oh, int64_t ow0,
                                                    int64_t f0)
{
    v8f acc[P][FB];
    for (int p = 0; p < P; ++p)
        for (int fb = 0; fb < FB; ++fb) acc[p][fb] = b ? load8(b + f0 + 8 * fb) : v8f{};
    const float* px[P];
    for (int64_t kh = 0; kh < g.KH; ++kh) {
        const int64_t ih = oh * g.strideH - g.padTop + kh;
        if (ih < 0 || ih >= g.H) continue;
        const float* xRow = x + (n * g.H + ih) * g.W * g.C;
        for (int64_t kw = 0; kw < g.KW; ++kw) {
            for (int p = 0; p < P; ++p) {
                const int64_t iw = (ow0 + p) * g.strideW - g.padLeft + kw;
                px[p] = iw >= 0 && iw < g.W ? xRow + iw * g.C : zeros;
            }
            tileFma<P, FB>(px, g.C, w + (kh * g.KW + kw) * g.C * g.F + f0, g.F, acc);
        }
    }
    float* yo = y + ((n * g.OH + oh) * g.OW + ow0) * g.F + f0;
    for (int p = 0; p < P; ++p)
        for (int fb = 0; fb < FB; ++fb) store8(yo + p * g.F + 8 * fb, acc[p][fb]);
}

template <int PMAX, int FB>
__attribute__((always_inline)) inline void convRowBlock(const ConvGeom& g, const float* x, const float* w,
                                                        const float* b, float* y, const float* zeros, int64_t n,
                                                        int64_t oh, int64_t f0)
{
    int64_t ow = 0;
    for (; ow + PMAX <= g.OW; ow += PMAX) convTile<PMAX, FB>(g, x, w, b, y, zeros, n, oh, ow, f0);
    switch (g.OW - ow) {
    case 1: convTile<1, FB>(g, x, w, b, y, zeros, n, oh, ow, f0); break;
    case 2: if constexpr (PMAX > 2) convTile<2, FB>(g, x, w, b, y, zeros, n, oh, ow, f0); break;
    case 3: if constexpr (PMAX > 3) convTile<3, FB>(g, x, w, b, y, zeros, n, oh, ow, f0); break;
    case 4: if constexpr (PMAX > 4) convTile<4, FB>(g, x, w, b, y, zeros, n, oh, ow, f0); break;
    case 5: if constexpr (PMAX > 5) convTile<5, FB>(g, x, w, b, y, zeros, n, oh, ow, f0); break;
    default: break;
    }
}

// dw[(tap, c0 + i), 8 fb] += sum_p xp[p][c0 + i] * dy[p, 8 fb] over a chunk of pixels.
template <int CT, int FB>
__attribute__((always_inline)) inline void weightTile(const float* const* xp, const float* dy, int64_t pixels,
                                                      int64_t F, int64_t c0, float* dw)
{
    v8f acc[CT][FB];
    for (int i = 0; i < CT; ++i)
        for (int fb = 0; fb < FB; ++fb) acc[i][fb] = load8(dw + i * F + 8 * fb);
    for (int64_t p = 0; p < pixels; ++p) {
        v8f d[FB];
        for (int fb = 0; fb < FB; ++fb) d[fb] = load8(dy + p * F + 8 * fb);
        const float* xr = xp[p] + c0;
        for (int i = 0; i < CT; ++i) {
            const float xv = xr[i];
            for (int fb = 0; fb < FB; ++fb) acc[i][fb] += xv * d[fb];
        }
    }
    for (int i = 0; i < CT; ++i)
        for (int fb = 0; fb < FB; ++fb) store8(dw + i * F + 8 * fb, acc[i][fb]);
}

template <int CMAX, int FB>
__attribute__((always_inline)) inline void weightTiles(const float* const* xp, const float* dy, int64_t pixels,
                                                       int64_t C, int64_t F, float* dwTap)
{
    int64_t c = 0;
    for (; c + CMAX <= C; c += CMAX) weightTile<CMAX, FB>(xp, dy, pixels, F, c, dwTap + c * F);
    switch (C - c) {
    case 1: weightTile<1, FB>(xp, dy, pixels, F, c, dwTap + c * F); break;
    case 2: if constexpr (CMAX > 2) weightTile<2, FB>(xp, dy, pixels, F, c, dwTap + c * F); break;
    case 3: if constexpr (CMAX > 3) weightTile<3, FB>(xp, dy, pixels, F, c, dwTap + c * F); break;
    case 4: if constexpr (CMAX > 4) weightTile<4, FB>(xp, dy, pixels, F, c, dwTap + c * F); break;
    case 5: if constexpr (CMAX > 5) weightTile<5, FB>(xp, dy, pixels, F, c, dwTap + c * F); break;
    default: break;
    }
}

} // namespace

bool tiledConvPreferred()
{
    // With AVX-512, oneDNN's own kernels are the better choice.
    return kIsa == Isa::Avx2;
}

bool tiledConvForwardApplies(const ConvGeom& g) { return g.F % 8 == 0 && g.C >= 1; }

bool tiledConvBackwardDataApplies(const ConvGeom& g)
{
    return g.strideH == 1 && g.strideW == 1 && g.C % 8 == 0 && g.padTop < g.KH && g.padLeft < g.KW;
}

bool tiledConvBackwardWeightsApplies(const ConvGeom& g) { return g.F % 8 == 0 && g.C >= 1; }

TS_CLONES void tiledConvForward(const ConvGeom& g, const float* x, const float* w, const float* b, float* y,
                                int64_t r0, int64_t r1)
{
    const std::vector<float> zeros(static_cast<std::size_t>(g.C), 0.0f);
    for (int64_t r = r0; r < r1; ++r) {
        const int64_t n = r / g.OH, oh = r % g.OH;
        int64_t f0 = 0;
        for (; f0 + 32 <= g.F; f0 += 32) convRowBlock<3, 4>(g, x, w, b, y, zeros.data(), n, oh, f0);
        for (; f0 + 16 <= g.F; f0 += 16) convRowBlock<6, 2>(g, x, w, b, y, zeros.data(), n, oh, f0);
        if (f0 < g.F) convRowBlock<6, 1>(g, x, w, b, y, zeros.data(), n, oh, f0);
    }
}

ConvGeom backwardDataGeom(const ConvGeom& g)
{
    ConvGeom t = g;
    t.H = g.OH;
    t.W = g.OW;
    t.C = g.F;
    t.F = g.C;
    t.OH = g.H;
    t.OW = g.W;
    t.padTop = static_cast<int>(g.KH - 1 - g.padTop);
    t.padLeft = static_cast<int>(g.KW - 1 - g.padLeft);
    return t;
}

void flipWeights(const ConvGeom& g, const float* w, float* wf)
{
    for (int64_t kh = 0; kh < g.KH; ++kh)
        for (int64_t kw = 0; kw < g.KW; ++kw) {
            const float* src = w + ((g.KH - 1 - kh) * g.KW + (g.KW - 1 - kw)) * g.C * g.F;
            float* dst = wf + (kh * g.KW + kw) * g.F * g.C;
            for (int64_t c = 0; c < g.C; ++c)
                for (int64_t f = 0; f < g.F; ++f) dst[f * g.C + c] = src[c * g.F + f];
        }
}

TS_CLONES void tiledConvBackwardWeights(const ConvGeom& g, const float* x, const float* dy, float* dw, float* db,
                                        int64_t r0, int64_t r1)
{
    const std::vector<float> zeros(static_cast<std::size_t>(g.C), 0.0f);
    // Chunks of whole output rows, about 48 pixels: the chunk's dy (48 x F floats) stays in L1
    // while every (tap, channel tile, filter block) passes over it.
    const int64_t rowsPerChunk = std::max<int64_t>(1, 48 / std::max<int64_t>(1, g.OW));
    std::vector<const float*> xp(static_cast<std::size_t>(rowsPerChunk * g.OW));
    for (int64_t c0 = r0; c0 < r1; c0 += rowsPerChunk) {
        const int64_t c1 = std::min(r1, c0 + rowsPerChunk);
        const int64_t pixels = (c1 - c0) * g.OW;
        const float* dyChunk = dy + c0 * g.OW * g.F;
        if (db)
            for (int64_t p = 0; p < pixels; ++p) {
                const float* d = dyChunk + p * g.F;
                for (int64_t f = 0; f < g.F; f += 8) store8(db + f, load8(db + f) + load8(d + f));
            }
        for (int64_t kh = 0; kh < g.KH; ++kh)
            for (int64_t kw = 0; kw < g.KW; ++kw) {
                int64_t p = 0;
                for (int64_t r = c0; r < c1; ++r) {
                    const int64_t n = r / g.OH, oh = r % g.OH;
                    const int64_t ih = oh * g.strideH - g.padTop + kh;
                    const bool rowOk = ih >= 0 && ih < g.H;
                    const float* xRow = x + (n * g.H + ih) * g.W * g.C;
                    for (int64_t ow = 0; ow < g.OW; ++ow, ++p) {
                        const int64_t iw = ow * g.strideW - g.padLeft + kw;
                        xp[static_cast<std::size_t>(p)] = rowOk && iw >= 0 && iw < g.W ? xRow + iw * g.C : zeros.data();
                    }
                }
                float* dwTap = dw + (kh * g.KW + kw) * g.C * g.F;
                int64_t f0 = 0;
                for (; f0 + 32 <= g.F; f0 += 32) weightTiles<3, 4>(xp.data(), dyChunk + f0, pixels, g.C, g.F, dwTap + f0);
                for (; f0 + 16 <= g.F; f0 += 16) weightTiles<6, 2>(xp.data(), dyChunk + f0, pixels, g.C, g.F, dwTap + f0);
                if (f0 < g.F) weightTiles<6, 1>(xp.data(), dyChunk + f0, pixels, g.C, g.F, dwTap + f0);
            }
    }
}

void globalAvgPoolForward(const float* x, float* y, int64_t HW, int64_t C, int64_t n0, int64_t n1)
{
    std::vector<double> sums(static_cast<std::size_t>(C));
    double* acc = sums.data();
    for (int64_t n = n0; n < n1; ++n) {
        std::fill(acc, acc + C, 0.0);
        for (int64_t s = 0; s < HW; ++s) accumulateDouble(x + (n * HW + s) * C, acc, C);
        for (int64_t c = 0; c < C; ++c) y[n * C + c] = HW == 0 ? 0.0f : static_cast<float>(acc[c] / double(HW));
    }
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
        // One exp per element: the row's exp(x - max) go through dx (or a small buffer).
        float local[64];
        float* e = dx ? dx + r * C : (C <= 64 ? local : nullptr);
        float se = 0;
        if (e) {
            for (int64_t k = 0; k < C; ++k) se += (e[k] = std::exp(x[k] - mx));
        } else {
            for (int64_t k = 0; k < C; ++k) se += std::exp(x[k] - mx);
        }
        const float lse = mx + std::log(se);
        const int32_t label = labels[r];
        total += double(lse) - double(x[label]);
        if (dx) {
            const float s = gscale / se;
            for (int64_t k = 0; k < C; ++k) e[k] *= s;
            e[label] -= gscale;
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
