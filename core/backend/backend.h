#pragma once
// Backend: one instance runs ops on one device (a logical CPU device with its share of threads,
// or one GPU). Contract:
//  - Threading: an instance is used by one thread at a time (the replica thread that owns it);
//    call bindThread() once from that thread before running ops. Different instances may run
//    concurrently.
//  - Memory: every Tensor passed to an op was allocated by allocator() of this instance (or, for
//    host-accessible backends, by any host allocator). Ops never allocate outputs: the caller
//    passes outputs of the right shape. Tensors are contiguous, row-major, channels-last (NHWC)
//    for images, DType::F32 unless an op says otherwise. Shapes are validated by the caller
//    (model/shape inference); ops assert invariants and return an Error only for run-time
//    failures (out of memory, device errors).
//  - Ops that the backend lacks return false from supportsOp(); calling one is a programming
//    error. Callers check supportsOp() and fall back (see backend/registry.h).
//  - Determinism: the same inputs give the same outputs on the same backend and thread count.
//  - Reference semantics: backend/reference defines every op's meaning; other backends are
//    tested against it (tests/core/tst_ops.cpp).

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/result.h"
#include "tensor/tensor.h"

namespace ts {

enum class OpKind {
    Gemm,
    DenseForward,
    DenseBackward,
    Conv2dForward,
    Conv2dBackwardData,
    Conv2dBackwardWeights,
    Pool2dForward,
    Pool2dBackward,
    GlobalAvgPoolForward,
    GlobalAvgPoolBackward,
    BatchNormForward,
    BatchNormBackward,
    ActivationForward,
    ActivationBackward,
    SoftmaxForward,
    SoftmaxBackward,
    DropoutForward,
    DropoutBackward,
    Add,
    Axpy,
    Scale,
    ConcatForward,
    ConcatBackward,
    Loss,
    ArgmaxMatches,
    SgdUpdate,
    AdamUpdate,
    RmspropUpdate,
    SumSquares,
    CopyFromHost,
    CopyToHost,
    Count_
};
const char* opKindName(OpKind k);

// Dropout's mask bit for flat element `index`: a pure counter-based hash of (seed, index) so every
// backend (CPU threads, GPU kernels) draws the same mask without sharing RNG state. True = keep.
// Exactly: h = splitmix64(seed ^ (index * 0x9E3779B97F4A7C15)); u = (h >> 40) * 2^-24;
// keep = u >= rate, where splitmix64(z) is SplitMix64's output for state z (z += 0x9E3779B97F4A7C15,
// then the (30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB), 31 xor-shift-multiply rounds).
// A GPU kernel must reproduce this bit for bit (see backend.cpp).
bool dropoutKeep(uint64_t seed, uint64_t index, float rate);

// Backend::argmaxMatches over host memory: predictions (N, C) against targets, as its contract
// says. The host backends share it (it is counting, not a kernel to cross-check); a device
// backend counts on its device by the same rule.
int64_t countArgmaxMatches(const Tensor& pred, const Tensor& target, bool binaryFromLogits);

enum class Activation { Linear, Relu, LeakyRelu, Gelu, Sigmoid, Tanh, Softmax };
const char* activationName(Activation a);
Result<Activation> parseActivation(const std::string& name);  // Keras names

enum class PoolKind { Max, Avg };

// Explicit padding, computed by shape inference from Keras' "same"/"valid".
struct Conv2dParams {
    int strideH = 1, strideW = 1;
    int padTop = 0, padBottom = 0, padLeft = 0, padRight = 0;
};

struct Pool2dParams {
    PoolKind kind = PoolKind::Max;
    int windowH = 2, windowW = 2;
    int strideH = 2, strideW = 2;
    int padTop = 0, padBottom = 0, padLeft = 0, padRight = 0;
    // Avg pooling divides by the number of in-bounds elements (Keras/TF semantics), not the window.
};

enum class LossKind {
    SparseCategoricalCrossentropy,  // targets: I32 class ids (N)
    CategoricalCrossentropy,        // targets: F32 one-hot/probabilities (N, C)
    BinaryCrossentropy,             // targets: F32 in [0,1], same shape as predictions
    MeanSquaredError,               // targets: F32, same shape as predictions
};

struct LossParams {
    LossKind kind = LossKind::SparseCategoricalCrossentropy;
    // Predictions are logits (softmax/sigmoid folded into the loss, numerically stable) rather
    // than probabilities. For probabilities the loss clips to [eps, 1-eps] like Keras (eps 1e-7).
    bool fromLogits = true;
    // Gradients are scaled by gradScale / N_global where N_global is the global batch size, so
    // replicas' gradients sum to the gradient of the global mean loss.
    float gradScale = 1.0f;
    int64_t globalBatch = 0;  // 0 means "this batch"
};

struct AdamParams {
    float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, epsilon = 1e-7f;
    float weightDecay = 0.0f;  // decoupled (AdamW): p -= lr * wd * p
    int64_t step = 1;          // 1-based step for bias correction
};

struct SgdParams {
    float lr = 0.01f, momentum = 0.0f;
    bool nesterov = false;
    float weightDecay = 0.0f;  // L2 added to the gradient
};

struct RmspropParams {
    float lr = 1e-3f, rho = 0.9f, momentum = 0.0f, epsilon = 1e-7f;
    bool centered = false;
};

struct BackendOptions {
    int threads = 1;  // CPU threads this instance may use
};

struct DeviceInfo {
    Device device;
    std::string name;          // "cpu:0 (Intel Xeon, 1 thread)"
    uint64_t memoryTotal = 0;  // bytes; 0 if unknown
    uint64_t memoryFree = 0;
};

// Utilisation sample of this instance's device, for telemetry.
struct DeviceSample {
    double utilisation = -1;  // 0..1, -1 unknown
    uint64_t memoryUsed = 0;
    uint64_t memoryTotal = 0;
    double temperatureC = -1;
    double powerW = -1;
};

class Backend {
public:
    virtual ~Backend() = default;

    virtual std::string name() const = 0;  // "reference", "cpu", "cuda"
    virtual Device device() const = 0;
    virtual DeviceInfo info() const = 0;
    virtual bool supportsOp(OpKind op) const = 0;
    virtual Allocator& allocator() = 0;
    virtual void bindThread() {}
    // Wait for queued work (no-op for synchronous backends).
    virtual Status synchronize() { return okStatus(); }
    virtual DeviceSample sample() const { return {}; }

    // Mixed precision (Keras' mixed_float16 / mixed_bfloat16 policies): the type that dense and
    // convolution layers compute in. F32, the default, is plain float32. In F16 or BF16 the ops
    // denseForward, denseBackward, conv2dForward, conv2dBackwardData and conv2dBackwardWeights
    // read every operand rounded to that type (roundToDType), accumulate in at least f32 and
    // round what they write to it, so a value beyond f16's range becomes inf as it does on a
    // GPU. Tensors stay F32 in memory (variables are f32) and every other op is unaffected.
    // setComputeType() returns Unsupported, naming the device, for a type the backend lacks.
    virtual bool supportsComputeType(DType t) const { return t == DType::F32; }
    Status setComputeType(DType t);
    DType computeType() const { return m_computeType; }

    // C = alpha * op(A) @ op(B) + beta * C. A (M,K) or (K,M) if transA; B (K,N) or (N,K).
    virtual Status gemm(const Tensor& a, bool transA, const Tensor& b, bool transB, Tensor& c,
                        float alpha, float beta) = 0;

    // Y = act(X @ W + b). X (N, in), W (in, out) [Keras layout], b (out) or undefined, Y (N, out).
    // act is Linear or Relu (others are separate ops).
    virtual Status denseForward(const Tensor& x, const Tensor& w, const Tensor& b, Activation act,
                                Tensor& y) = 0;
    // dX = dY @ W^T (skipped if dx undefined), dW = X^T @ dY (+= if accumulate), db = colsum(dY)
    // (skipped if db undefined; += if accumulate).
    virtual Status denseBackward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& dx,
                                 Tensor& dw, Tensor& db, bool accumulate) = 0;

    // X (N,H,W,C) NHWC; W (KH,KW,C,F) [Keras layout]; b (F) or undefined; Y (N,OH,OW,F).
    virtual Status conv2dForward(const Tensor& x, const Tensor& w, const Tensor& b,
                                 const Conv2dParams& p, Tensor& y) = 0;
    virtual Status conv2dBackwardData(const Tensor& dy, const Tensor& w, const Conv2dParams& p,
                                      Tensor& dx) = 0;
    // dW, db (db may be undefined); overwrites (no accumulate).
    virtual Status conv2dBackwardWeights(const Tensor& x, const Tensor& dy, const Conv2dParams& p,
                                         Tensor& dw, Tensor& db) = 0;

    // X (N,H,W,C), Y (N,OH,OW,C). workspace: I32 tensor of Y's shape for max pooling (the flat
    // input index of each max), undefined for avg. Ties pick the first max in row-major order.
    virtual Status pool2dForward(const Tensor& x, const Pool2dParams& p, Tensor& y,
                                 Tensor& workspace) = 0;
    virtual Status pool2dBackward(const Tensor& dy, const Tensor& workspace, const Pool2dParams& p,
                                  Tensor& dx) = 0;
    // X (N,H,W,C) -> Y (N,C): mean over H,W.
    virtual Status globalAvgPoolForward(const Tensor& x, Tensor& y) = 0;
    virtual Status globalAvgPoolBackward(const Tensor& dy, Tensor& dx) = 0;

    // Channels-last: X (..., C), statistics over all leading dims. Training: normalise with batch
    // statistics (biased variance), write saveMean/saveInvStd (C), and update running stats:
    // running = momentum * running + (1 - momentum) * batch (unbiased variance, like Keras).
    // Inference: normalise with the running stats (saveMean/saveInvStd untouched).
    virtual Status batchNormForward(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                    Tensor& runningMean, Tensor& runningVar, bool training,
                                    float momentum, float epsilon, Tensor& y, Tensor& saveMean,
                                    Tensor& saveInvStd) = 0;
    virtual Status batchNormBackward(const Tensor& x, const Tensor& gamma, const Tensor& saveMean,
                                     const Tensor& saveInvStd, const Tensor& dy, Tensor& dx,
                                     Tensor& dgamma, Tensor& dbeta) = 0;

    // Elementwise activations (not Softmax). alpha: LeakyRelu slope (Keras default 0.3 for the
    // layer, 0.2 for the function; the caller chooses). Gelu is the exact erf form.
    virtual Status activationForward(Activation act, float alpha, const Tensor& x, Tensor& y) = 0;
    // Gradient given the forward input x and output y (either may be used).
    virtual Status activationBackward(Activation act, float alpha, const Tensor& x, const Tensor& y,
                                      const Tensor& dy, Tensor& dx) = 0;

    // Softmax over the last axis.
    virtual Status softmaxForward(const Tensor& x, Tensor& y) = 0;
    virtual Status softmaxBackward(const Tensor& y, const Tensor& dy, Tensor& dx) = 0;

    // Inverted dropout: mask (U8, same shape) = keep with probability 1-rate, y = x*mask/(1-rate).
    // The mask bit of flat element i is a pure function of (seed, i) — see reference — so every
    // backend draws the same mask.
    virtual Status dropoutForward(const Tensor& x, float rate, uint64_t seed, Tensor& mask,
                                  Tensor& y) = 0;
    virtual Status dropoutBackward(const Tensor& dy, const Tensor& mask, float rate, Tensor& dx) = 0;

    // c = a + b (same shapes; c may alias a or b).
    virtual Status add(const Tensor& a, const Tensor& b, Tensor& c) = 0;
    // y += alpha * x
    virtual Status axpy(float alpha, const Tensor& x, Tensor& y) = 0;
    // x *= alpha
    virtual Status scale(float alpha, Tensor& x) = 0;

    // Concatenate along the last axis: inputs (..., Ci) -> y (..., sum Ci).
    virtual Status concatForward(const std::vector<Tensor>& xs, Tensor& y) = 0;
    // Split dy (..., sum Ci) into dxs (..., Ci) (overwrites).
    virtual Status concatBackward(const Tensor& dy, std::vector<Tensor>& dxs) = 0;

    // Mean loss over the batch rows of this call written to *loss (host float; the sum of
    // per-sample losses divided by the local batch), and dPred = d(gradScale * sum/N_global)/dPred
    // written if dpred is defined. Predictions (N, C) (or (N, ...) for BCE/MSE).
    virtual Status loss(const LossParams& p, const Tensor& pred, const Tensor& target, float* loss,
                        Tensor& dpred) = 0;
    // Number of rows whose argmax matches the target (I32 class ids for sparse, or the argmax of
    // F32 one-hot targets; for BCE-style single outputs, (pred > 0.5 or logit > 0) == target).
    virtual Status argmaxMatches(const Tensor& pred, const Tensor& target, bool binaryFromLogits,
                                 int64_t* matches) = 0;

    virtual Status sgdUpdate(const SgdParams& p, Tensor& param, const Tensor& grad,
                             Tensor& velocity) = 0;
    virtual Status adamUpdate(const AdamParams& p, Tensor& param, const Tensor& grad, Tensor& m,
                              Tensor& v) = 0;
    // ms: mean square; mom: momentum buffer (used if momentum > 0); mg: mean gradient (centered).
    virtual Status rmspropUpdate(const RmspropParams& p, Tensor& param, const Tensor& grad,
                                 Tensor& ms, Tensor& mom, Tensor& mg) = 0;
    // Sum of squares (for gradient norms and NaN checks); written to host double.
    virtual Status sumSquares(const Tensor& x, double* out) = 0;

    virtual Status copyFromHost(const void* src, Tensor& dst) = 0;
    virtual Status copyToHost(const Tensor& src, void* dst) = 0;

protected:
    // For host backends without native 16-bit kernels: runs `op` on copies of `inputs` rounded to
    // the compute type (undefined inputs pass through), with the compute type F32 meanwhile, then
    // rounds the defined `outputs` in place. OutOfMemory if the copies cannot be allocated.
    Status computeRounded(const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                          const std::function<Status(const std::vector<Tensor>&)>& op);

    DType m_computeType = DType::F32;

private:
    std::vector<Tensor> m_roundScratch;  // computeRounded's operand copies, reused
};

} // namespace ts
