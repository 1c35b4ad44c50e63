#pragma once
// CpuBackend: the fast CPU backend. oneDNN 2.6 primitives (matmul, convolution, batch norm,
// eltwise, softmax) for the heavy ops, own vectorised loops (cpu_kernels.h) for the rest.
// Primitives are cached per instance, keyed by op, shapes and parameters, so a steady-state
// training step builds nothing. Threads: each instance owns a share of the cores
// (BackendOptions::threads) and applies it to the OpenMP thread that drives it.
// Convolutions: first layers with few input channels use own direct kernels; on machines without
// AVX-512 the others use own register-tiled kernels (faster there than oneDNN 2.6's), unless the
// environment sets TS_CPU_ONEDNN_CONV=1 (a diagnostic switch back to oneDNN for every conv).
// Mixed precision (setComputeType): bf16 dense and convolution ops run oneDNN's bf16 kernels on
// CPUs with AVX512-BF16 (TS_CPU_EMULATE_BF16=1 turns that off); f16, and bf16 elsewhere, round
// the operands and results around the f32 kernels (Backend::computeRounded).

#include <memory>

#include "backend/backend.h"

namespace ts {

class CpuBackend final : public Backend {
public:
    CpuBackend(int deviceIndex, const BackendOptions& options);
    ~CpuBackend() override;
    CpuBackend(const CpuBackend&) = delete;
    CpuBackend& operator=(const CpuBackend&) = delete;

    std::string name() const override { return "cpu"; }
    Device device() const override;
    DeviceInfo info() const override;
    bool supportsOp(OpKind op) const override;
    bool supportsComputeType(DType t) const override;
    Allocator& allocator() override;
    void bindThread() override;
    DeviceSample sample() const override;

    int threads() const;

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
    Status conv2dBackwardWeights(const Tensor& x, const Tensor& dy, const Conv2dParams& p,
                                 Tensor& dw, Tensor& db) override;

    Status pool2dForward(const Tensor& x, const Pool2dParams& p, Tensor& y,
                         Tensor& workspace) override;
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

    Status dropoutForward(const Tensor& x, float rate, uint64_t seed, Tensor& mask,
                          Tensor& y) override;
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

    Status sgdUpdate(const SgdParams& p, Tensor& param, const Tensor& grad,
                     Tensor& velocity) override;
    Status adamUpdate(const AdamParams& p, Tensor& param, const Tensor& grad, Tensor& m,
                      Tensor& v) override;
    Status rmspropUpdate(const RmspropParams& p, Tensor& param, const Tensor& grad, Tensor& ms,
                         Tensor& mom, Tensor& mg) override;
    Status sumSquares(const Tensor& x, double* out) override;

    Status copyFromHost(const void* src, Tensor& dst) override;
    Status copyToHost(const Tensor& src, void* dst) override;

private:
    // mixed_bfloat16 on AVX512-BF16, for shapes with no empty dimension (checked by the callers).
    Status denseForwardBf16(const Tensor& x, const Tensor& w, const Tensor& b, Activation act, Tensor& y,
                            int64_t n, int64_t in, int64_t out);
    Status denseBackwardBf16(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& dx, Tensor& dw,
                             Tensor& db, bool accumulate, int64_t n, int64_t in, int64_t out);

    struct Impl;
    std::unique_ptr<Impl> m_d;
};

// Host facts used by info()/enumerate(): "AMD EPYC 7B13" style model name, and /proc/meminfo.
std::string cpuModelName();
int cpuHardwareThreads();

} // namespace ts
