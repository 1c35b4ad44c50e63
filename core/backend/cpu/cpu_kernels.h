#pragma once
// The CPU backend's own loops: single-threaded kernels over a range of elements (or rows), so the
// caller decides how to split work across OpenMP threads. Each kernel is compiled for AVX-512,
// AVX2+FMA and baseline x86-64 and picks the best at load time (GCC target_clones / explicit
// intrinsics where the auto-vectoriser cannot help, e.g. sqrt under -fmath-errno).

#include <cstdint>

namespace ts::cpuk {

// Elementwise (ranges are [0, n) of the passed pointers; callers offset them).
void add(const float* a, const float* b, float* c, int64_t n);  // c may alias a or b
void axpy(float alpha, const float* x, float* y, int64_t n);
void scale(float alpha, float* x, int64_t n);
void copy(const float* x, float* y, int64_t n);
double sumSquares(const float* x, int64_t n);
// y = x > 0 ? x : alpha * x (relu: alpha 0); dx = (v > 0 ? 1 : alpha) * dy, v the forward x (or y).
void leakyRelu(float alpha, const float* x, float* y, int64_t n);
void leakyReluBackward(float alpha, const float* v, const float* dy, float* dx, int64_t n);

// db[c] (+)= sum_r dy[r * cols + c] for rows [0, rows).
void colSum(const float* dy, int64_t rows, int64_t cols, float* db, bool accumulate);

// Dropout over flat elements [begin, end) of the whole tensor (pointers are to element 0).
void dropoutForward(const float* x, float rate, uint64_t seed, uint8_t* mask, float* y, int64_t begin,
                    int64_t end);
void dropoutBackward(const float* dy, const uint8_t* mask, float rate, float* dx, int64_t n);

// Optimizers: one fused pass per parameter (see reference_backend.h for the formulas).
struct AdamConsts {
    float beta1, beta2, oneMinusBeta1, oneMinusBeta2;
    float stepSize;     // lr / (1 - beta1^t)
    float invSqrtBc2;   // 1 / sqrt(1 - beta2^t)
    float epsilon;
    float decay;        // 1 - lr * weightDecay
};
void adam(const AdamConsts& k, float* p, const float* g, float* m, float* v, int64_t n);
void sgd(float lr, float momentum, bool nesterov, float weightDecay, float* p, const float* g,
         float* velocity, int64_t n);
void rmsprop(float lr, float rho, float momentum, float epsilon, float* p, const float* g, float* ms,
             float* mom, float* mg, int64_t n);

// Pooling, NHWC, over images [n0, n1) (flat indices in the workspace are into the whole tensor).
struct PoolGeom {
    int64_t N, H, W, C, OH, OW;
    int windowH, windowW, strideH, strideW, padTop, padLeft;
};
void maxPoolForward(const PoolGeom& g, const float* x, float* y, int32_t* ws, int64_t n0, int64_t n1);
// Overwrites dx for images [n0, n1) (windows never cross images).
void maxPoolBackward(const PoolGeom& g, const float* dy, const int32_t* ws, float* dx, int64_t n0,
                     int64_t n1);
void avgPoolForward(const PoolGeom& g, const float* x, float* y, int64_t n0, int64_t n1);
void avgPoolBackward(const PoolGeom& g, const float* dy, float* dx, int64_t n0, int64_t n1);

// Direct convolution for few input channels (first layers: grey/RGB images), where oneDNN's
// kernels are far from their best. NHWC x/y, HWIO w; needs F % 8 == 0 and F <= 64.
struct ConvGeom {
    int64_t N, H, W, C, KH, KW, F, OH, OW;
    int strideH, strideW, padTop, padLeft;
};
bool smallConvApplies(const ConvGeom& g);
// Output rows [r0, r1) of the flattened (N * OH) row range.
void smallConvForward(const ConvGeom& g, const float* x, const float* w, const float* b, float* y, int64_t r0,
                      int64_t r1);
// Adds this row range's contribution to dw (KH*KW*C*F, HWIO) and db (F, may be null).
void smallConvBackwardWeights(const ConvGeom& g, const float* x, const float* dy, float* dw, float* db, int64_t r0,
                              int64_t r1);

// General NHWC convolution by register-tiled implicit GEMM (3 x 32 or 6 x 16 accumulator tiles),
// used on machines without AVX-512: on AVX2 (Zen 3) it ran the small CNN's training step 1.4x
// faster than oneDNN 2.6's NHWC kernels (backward weights above all). Needs F % 8 == 0 (forward,
// backward weights) or C % 8 == 0 (backward data, stride 1 only).
bool tiledConvPreferred();
bool tiledConvForwardApplies(const ConvGeom& g);
bool tiledConvBackwardDataApplies(const ConvGeom& g);
bool tiledConvBackwardWeightsApplies(const ConvGeom& g);
// Output rows [r0, r1) of the flattened (N * OH) range; b may be null.
void tiledConvForward(const ConvGeom& g, const float* x, const float* w, const float* b, float* y, int64_t r0,
                      int64_t r1);
// The backward-data pass as a forward convolution of dy: geometry and flipped, transposed weights
// (KH, KW, F, C) for it.
ConvGeom backwardDataGeom(const ConvGeom& g);
void flipWeights(const ConvGeom& g, const float* w, float* wFlipped);
// Adds output rows [r0, r1)'s contribution to dw (HWIO) and db (may be null).
void tiledConvBackwardWeights(const ConvGeom& g, const float* x, const float* dy, float* dw, float* db, int64_t r0,
                              int64_t r1);

// Global average pool, images [n0, n1).
void globalAvgPoolForward(const float* x, float* y, int64_t HW, int64_t C, int64_t n0, int64_t n1);
void globalAvgPoolBackward(const float* dy, float* dx, int64_t HW, int64_t C, int64_t n0, int64_t n1);

// Softmax cross-entropy from logits for rows [0, rows): returns the sum of row losses; writes
// dx = gscale * (softmax * sum(t) - t) if dx is non-null. Sparse labels must be in range.
double sparseSoftmaxXent(const float* logits, const int32_t* labels, int64_t rows, int64_t C,
                         float gscale, float* dx);
double softmaxXent(const float* logits, const float* targets, int64_t rows, int64_t C, float gscale,
                   float* dx);

} // namespace ts::cpuk
