#pragma once
// ReferenceBackend: naive, obviously-correct loops over host memory, accumulating in double.
// It defines what every op of backend.h means; the other backends are tested against it
// (tests/core/tst_ops.cpp) and it is itself checked by finite differences. Speed is a non-goal.
//
// Choices the interface leaves open, fixed here:
//  - gemm with beta == 0 never reads C (BLAS semantics: garbage/NaN in C is ignored).
//  - denseBackward: dw and db may be undefined (skipped), like dx.
//  - pool2d: a window with no in-bounds element (only possible with pads >= window) gives 0, and
//    for max pooling workspace index -1, which the backward pass skips.
//  - batchNorm: gamma/beta may be undefined (scale 1 / offset 0; Keras scale=False/center=False);
//    dgamma/dbeta may be undefined (skipped). The running variance takes the unbiased batch
//    variance var * M / (M - 1) (M = rows per channel; the biased one when M == 1). The backward
//    pass is the training-mode gradient through the batch statistics.
//  - activationForward/Backward with Softmax run the softmax over the last axis. Backward uses x
//    for Relu/LeakyRelu/Gelu and y for Sigmoid/Tanh, falling back to the other one when the
//    preferred tensor is undefined (Gelu always needs x).
//  - dropout rate >= 1 drops everything (y = 0) instead of dividing by zero.
//  - loss, probabilities (fromLogits = false), Keras semantics:
//      categorical (sparse or not): q = p / rowsum(p), clipped to [1e-7, 1 - 1e-7],
//        loss = -sum_k t_k log q_k; the clip passes no gradient outside the range.
//      binary: p clipped to [1e-7, 1 - 1e-7], loss = -(z log p + (1 - z) log(1 - p)).
//    logits: categorical loss = sum_k t_k (logsumexp(x) - x_k), dx = softmax(x) sum(t) - t;
//      binary loss = max(x, 0) - x z + log(1 + exp(-|x|)), dx = sigmoid(x) - z.
//    BCE and MSE average over all non-batch elements of a row (Keras' mean over the last axis,
//    then the batch mean), so a row's loss weight is 1 / (elements per row).
//    A sparse class id outside [0, C) is an InvalidArgument error naming the row.
//  - argmaxMatches: a row with one element (N, 1) is binary: predicted class = (p > 0.5), or
//    (x > 0) when binaryFromLogits; the target (F32 or I32) is true when > 0.5. Otherwise the
//    predicted class is the row argmax (first on ties) and the target is the I32 class id or the
//    argmax of the F32 target row.
//  - Optimizers, per element, in double, then rounded to float:
//      SGD (torch.optim.SGD, dampening 0): g += wd * p; if momentum > 0: v = momentum * v + g and
//        p -= lr * (nesterov ? g + momentum * v : v); else p -= lr * g (velocity unused).
//      Adam (torch.optim.Adam/AdamW): p -= lr * wd * p (decoupled, AdamW) first; then
//        m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2; mhat = m / (1 - b1^t);
//        vhat = v / (1 - b2^t); p -= lr * mhat / (sqrt(vhat) + eps).
//      RMSprop (Keras 3): ms = rho ms + (1 - rho) g^2; denom = ms, or when centered
//        mg = rho mg + (1 - rho) g and denom = ms - mg^2; inc = lr * g / sqrt(denom + eps);
//        with momentum > 0: mom = momentum * mom + inc, p -= mom; else p -= inc.
//        (mom and mg may be undefined when unused.)

#include "backend/backend.h"

namespace ts {

class ReferenceBackend final : public Backend {
public:
    explicit ReferenceBackend(int deviceIndex = 0);

    std::string name() const override { return "reference"; }
    Device device() const override;
    DeviceInfo info() const override;
    bool supportsOp(OpKind op) const override;
    bool supportsComputeType(DType t) const override;
    Allocator& allocator() override;

    Status gemm(const Tensor& a, bool transA, const Tensor& b, bool transB, Tensor& c, float alpha,
                float beta) override;
    Status denseForward(const Tensor& x, const Tensor& w, const Tensor& b, Activation act,
                        Tensor& y) override;
    Status denseBackward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& dx, Tensor& dw,
                         Tensor& db, bool accumulate) override;

    Status conv2dForward(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dParams& p,
                         Tensor& y) override;
    Status conv2dBackwardData(const Tensor& dy, const Tensor& w, const Conv2dParams& p,
                              Tensor& dx) override;
    Status conv2dBackwardWeights(const Tensor& x, const Tensor& dy, const Conv2dParams& p, Tensor& dw,
                                 Tensor& db) override;

    Status pool2dForward(const Tensor& x, const Pool2dParams& p, Tensor& y, Tensor& workspace) override;
    Status pool2dBackward(const Tensor& dy, const Tensor& workspace, const Pool2dParams& p,
                          Tensor& dx) override;
    Status globalAvgPoolForward(const Tensor& x, Tensor& y) override;
    Status globalAvgPoolBackward(const Tensor& dy, Tensor& dx) override;

    Status batchNormForward(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                            Tensor& runningMean, Tensor& runningVar, bool training, float momentum,
                            float epsilon, Tensor& y, Tensor& saveMean, Tensor& saveInvStd) override;
    Status batchNormBackward(const Tensor& x, const Tensor& gamma, const Tensor& saveMean,
                             const Tensor& saveInvStd, const Tensor& dy, Tensor& dx, Tensor& dgamma,
                             Tensor& dbeta) override;

    Status activationForward(Activation act, float alpha, const Tensor& x, Tensor& y) override;
    Status activationBackward(Activation act, float alpha, const Tensor& x, const Tensor& y,
                              const Tensor& dy, Tensor& dx) override;
    Status softmaxForward(const Tensor& x, Tensor& y) override;
    Status softmaxBackward(const Tensor& y, const Tensor& dy, Tensor& dx) override;

    Status dropoutForward(const Tensor& x, float rate, uint64_t seed, Tensor& mask, Tensor& y) override;
    Status dropoutBackward(const Tensor& dy, const Tensor& mask, float rate, Tensor& dx) override;

    Status add(const Tensor& a, const Tensor& b, Tensor& c) override;
    Status axpy(float alpha, const Tensor& x, Tensor& y) override;
    Status scale(float alpha, Tensor& x) override;

    Status concatForward(const std::vector<Tensor>& xs, Tensor& y) override;
    Status concatBackward(const Tensor& dy, std::vector<Tensor>& dxs) override;

    Status loss(const LossParams& p, const Tensor& pred, const Tensor& target, float* loss,
                Tensor& dpred) override;
    Status argmaxMatches(const Tensor& pred, const Tensor& target, bool binaryFromLogits,
                         int64_t* matches) override;

    Status sgdUpdate(const SgdParams& p, Tensor& param, const Tensor& grad, Tensor& velocity) override;
    Status adamUpdate(const AdamParams& p, Tensor& param, const Tensor& grad, Tensor& m,
                      Tensor& v) override;
    Status rmspropUpdate(const RmspropParams& p, Tensor& param, const Tensor& grad, Tensor& ms,
                         Tensor& mom, Tensor& mg) override;
    Status sumSquares(const Tensor& x, double* out) override;

    Status copyFromHost(const void* src, Tensor& dst) override;
    Status copyToHost(const Tensor& src, void* dst) override;

private:
    int m_deviceIndex;
};

} // namespace ts
