#pragma once
// The CUDA backend's own kernels: everything cuBLAS and cuDNN do not cover with the reference's
// exact semantics (pooling's first-max workspace, batch norm's unbiased running variance, Keras
// losses, the optimizers, dropout's counter-based mask). Plain C++17 on raw device pointers, so
// nvcc never sees core's C++20 headers. Every launcher enqueues on `stream` and returns the launch
// error (cudaGetLastError); none synchronises.
// Numerics: per-element maths and every reduction accumulate in double, like the reference; the
// reductions use a fixed split and order (no atomics), so results are deterministic run to run.

#include <cstdint>

#include <cuda_runtime.h>

namespace ts::cudak {

// Activation codes, in the order of ts::Activation (Linear .. Tanh); Softmax is not elementwise.
enum ActCode : int { ActLinear = 0, ActRelu, ActLeakyRelu, ActGelu, ActSigmoid, ActTanh };

// y[r, c] = act(y[r, c] + bias[c]) for r < rows; bias may be null.
cudaError_t biasActivation(float* y, const float* bias, int64_t rows, int64_t cols, int act, cudaStream_t s);
// out[c, r] = in[r, c] (in is rows x cols).
cudaError_t transpose2d(const float* in, float* out, int64_t rows, int64_t cols, cudaStream_t s);

// Per-column sums of a (rows x cols) row-major matrix, in double, deterministic. `scratch` must hold
// columnReduceScratch(rows, cols) doubles. Modes:
//  Sum:        a[c] = sum_r x[r, c]
//  SumSqDev:   a[c] = sum_r (x[r, c] - mean[c])^2
//  BnBackward: a[c] = sum_r dy[r, c], b[c] = sum_r dy[r, c] * (x[r, c] - mean[c]) * invStd[c]
enum class ColumnReduce { Sum, SumSqDev, BnBackward };
int64_t columnReduceScratch(int64_t rows, int64_t cols);
cudaError_t columnReduce(ColumnReduce mode, const float* x, const float* dy, const double* mean,
                         const float* meanF, const float* invStdF, int64_t rows, int64_t cols,
                         double* scratch, double* a, double* b, cudaStream_t s);
// dst[c] = (accumulate ? dst[c] : 0) + src[c], rounded to float.
cudaError_t storeColumnSums(const double* src, float* dst, int64_t cols, bool accumulate, cudaStream_t s);

// NHWC zero padding into a (N, HP, WP, C) buffer, and the inverse crop.
cudaError_t padNhwc(const float* x, float* xp, int64_t N, int64_t H, int64_t W, int64_t C, int padTop,
                    int padLeft, int64_t HP, int64_t WP, cudaStream_t s);
cudaError_t cropNhwc(const float* xp, float* x, int64_t N, int64_t H, int64_t W, int64_t C, int padTop,
                     int padLeft, int64_t HP, int64_t WP, cudaStream_t s);

struct PoolGeom {
    int64_t N, H, W, C, OH, OW;
    int windowH, windowW, strideH, strideW, padTop, padLeft;
};
// Max: first max in row-major window order, workspace = flat input index (-1 for an empty window,
// output 0); ws may be null. Avg: mean over in-bounds taps (0 for none).
cudaError_t pool2dForward(const float* x, float* y, int32_t* ws, const PoolGeom& g, bool isMax, cudaStream_t s);
// Gather form (each dx element sums the windows covering it): deterministic, no atomics.
cudaError_t pool2dBackward(const float* dy, const int32_t* ws, float* dx, const PoolGeom& g, bool isMax,
                           cudaStream_t s);
cudaError_t globalAvgPoolForward(const float* x, float* y, int64_t N, int64_t HW, int64_t C, cudaStream_t s);
cudaError_t globalAvgPoolBackward(const float* dy, float* dx, int64_t N, int64_t HW, int64_t C, cudaStream_t s);

// Batch norm over the leading dims of (M x C). sums = column sums of x (Sum), sq = of (x-mean)^2.
// Training finish: mean/invStd (double, C each) written to stats[0..C) and stats[C..2C), saveMean/
// saveInvStd (may be null) and the running stats updated like the reference.
cudaError_t batchNormMean(const double* sums, double* meanOut, int64_t M, int64_t C, cudaStream_t s);
cudaError_t batchNormFinish(const double* mean, const double* sq, int64_t M, int64_t C, float momentum,
                            float epsilon, float* runningMean, float* runningVar, float* saveMean,
                            float* saveInvStd, double* invStdOut, cudaStream_t s);
// Inference: mean/invStd from the running stats.
cudaError_t batchNormRunning(const float* runningMean, const float* runningVar, float epsilon, double* mean,
                             double* invStd, int64_t C, cudaStream_t s);
cudaError_t batchNormApply(const float* x, const double* mean, const double* invStd, const float* gamma,
                           const float* beta, float* y, int64_t M, int64_t C, cudaStream_t s);
// dgamma/dbeta (may be null) from sumDyXhat/sumDy, and dx (may be null).
cudaError_t batchNormBackward(const float* x, const float* gamma, const float* saveMean, const float* saveInvStd,
                              const float* dy, const double* sumDy, const double* sumDyXhat, float* dx,
                              float* dgamma, float* dbeta, int64_t M, int64_t C, cudaStream_t s);

cudaError_t activationForward(int act, float alpha, const float* x, float* y, int64_t n, cudaStream_t s);
// x or y may be null where the reference allows it (see reference_backend.h).
cudaError_t activationBackward(int act, float alpha, const float* x, const float* y, const float* dy, float* dx,
                               int64_t n, cudaStream_t s);
cudaError_t softmaxForward(const float* x, float* y, int64_t rows, int64_t cols, cudaStream_t s);
cudaError_t softmaxBackward(const float* y, const float* dy, float* dx, int64_t rows, int64_t cols, cudaStream_t s);

// The mask bit is ts::dropoutKeep(seed, i, rate), reproduced bit for bit.
cudaError_t dropoutForward(const float* x, float rate, uint64_t seed, uint8_t* mask, float* y, int64_t n,
                           cudaStream_t s);
cudaError_t dropoutBackward(const float* dy, const uint8_t* mask, float rate, float* dx, int64_t n, cudaStream_t s);

cudaError_t add(const float* a, const float* b, float* c, int64_t n, cudaStream_t s);
cudaError_t axpy(float alpha, const float* x, float* y, int64_t n, cudaStream_t s);
cudaError_t scale(float alpha, float* x, int64_t n, cudaStream_t s);
// Columns [offset, offset + ci) of y (rows x total) from/to x (rows x ci).
cudaError_t copyColumnsIn(const float* x, float* y, int64_t rows, int64_t ci, int64_t total, int64_t offset,
                          cudaStream_t s);
cudaError_t copyColumnsOut(const float* y, float* x, int64_t rows, int64_t ci, int64_t total, int64_t offset,
                           cudaStream_t s);

// Loss kinds in the order of ts::LossKind.
enum LossCode : int { LossSparseCce = 0, LossCce, LossBce, LossMse };
// rowLoss[r] = the row's loss (double); dpred written when non-null with gscale = gradScale / N_global.
// A sparse label outside [0, C) lowers *badRow (atomicMin) to that row: the caller writes INT_MAX
// first and reads back the smallest bad row, the one the reference names.
cudaError_t loss(int kind, bool fromLogits, const float* pred, const void* target, int64_t N, int64_t per,
                 double gscale, double* rowLoss, float* dpred, int* badRow, cudaStream_t s);
// match[r] = 1 when row r's prediction matches (see reference argmaxMatches); targetIsI32 selects the
// target's dtype.
cudaError_t argmaxMatches(const float* pred, const void* target, bool targetIsI32, bool binaryFromLogits,
                          int64_t N, int64_t C, int32_t* match, cudaStream_t s);

cudaError_t sgdUpdate(float lr, float momentum, bool nesterov, float weightDecay, float* param, const float* grad,
                      float* velocity, int64_t n, cudaStream_t s);
cudaError_t adamUpdate(float lr, float beta1, float beta2, float epsilon, float weightDecay, double bc1, double bc2,
                       float* param, const float* grad, float* m, float* v, int64_t n, cudaStream_t s);
cudaError_t rmspropUpdate(float lr, float rho, float momentum, float epsilon, bool centered, float* param,
                          const float* grad, float* ms, float* mom, float* mg, int64_t n, cudaStream_t s);
// partials[b] for b < sumSquaresBlocks(n); the host adds them in order.
int sumSquaresBlocks(int64_t n);
cudaError_t sumSquares(const float* x, int64_t n, double* partials, cudaStream_t s);

} // namespace ts::cudak
