#pragma once
// CudaBackend: ts::Backend on one NVIDIA GPU. cuBLAS for gemm and dense layers, cuDNN 9 for the
// three convolution passes, own kernels (cuda_kernels.h) for the rest. All work is queued on the
// device's one stream (cuda_device.h); ops return once queued, synchronize() waits, and the ops
// that hand a value to the host (loss, argmaxMatches, sumSquares, copyToHost) wait themselves.
//
// Numerics: float32 throughout with TF32 off (cuBLAS default math, cuDNN FMA math), so results
// match the reference to float rounding; every reduction is deterministic (fixed order, cuDNN
// algorithms chosen among the deterministic ones).
// Choices beyond the reference's: tensors passed to ops must live on this device, except a loss or
// argmax target on the host, which is copied up first. Asymmetric conv padding (Keras "same" with
// stride 2) is applied by an explicit pad/crop around cuDNN, which takes symmetric padding only.

#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include <cublas_v2.h>
#include <cudnn.h>

#include "backend/backend.h"
#include "cuda_device.h"

namespace ts::cuda {

// Name and memory of a device without creating a backend (no cuBLAS/cuDNN handles).
Result<DeviceInfo> deviceInfo(int device);

class CudaBackend final : public Backend {
public:
    static Result<std::unique_ptr<Backend>> create(int deviceIndex, const BackendOptions& options);
    ~CudaBackend() override;
    CudaBackend(const CudaBackend&) = delete;
    CudaBackend& operator=(const CudaBackend&) = delete;

    std::string name() const override { return "cuda"; }
    Device device() const override { return Device{DeviceKind::Cuda, m_ctx->index}; }
    DeviceInfo info() const override;
    bool supportsOp(OpKind op) const override { return op != OpKind::Count_; }
    Allocator& allocator() override { return *m_ctx->allocator; }
    void bindThread() override;
    Status synchronize() override;
    DeviceSample sample() const override;

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

    // For tests and telemetry: the device's caching allocator.
    CachingAllocator& cachingAllocator() { return *m_ctx->allocator; }

private:
    explicit CudaBackend(DeviceContext* ctx);
    Status init();
    // Scratch tensor on this device (from the caching allocator; freed into its cache).
    Result<Tensor> scratch(Shape shape, DType dtype);
    // `t` itself when on this device, else a device copy of the host tensor.
    Result<Tensor> onDevice(const Tensor& t);
    Status check(cudaError_t err, const char* what) const;
    Status check(cublasStatus_t st, const char* what) const;
    Status check(cudnnStatus_t st, const char* what) const;
    Status colSums(const Tensor& m, int64_t rows, int64_t cols, Tensor& out, bool accumulate);
    // Runs one convolution pass with the plan's current algorithm, moving down its candidates
    // while cuDNN answers CUDNN_STATUS_NOT_SUPPORTED.
    template <typename Candidates, typename Run>
    Status runConv(Candidates& c, const char* what, Run&& run);

    // cuDNN descriptors and the algorithms chosen for one convolution geometry, cached so a
    // steady-state step plans nothing.
    struct ConvPlan;
    Result<ConvPlan*> convPlan(int64_t N, int64_t H, int64_t W, int64_t C, int64_t KH, int64_t KW, int64_t F,
                               int64_t OH, int64_t OW, const Conv2dParams& p);

    // Pinned staging for host-to-device copies: copyFromHost returns once the bytes are in a
    // pinned slot, and the DMA runs on the stream behind the queued kernels (a pageable copy
    // would wait for them). Two slots, each reused after its previous copy's event.
    struct Staging {
        void* host = nullptr;
        std::size_t capacity = 0;
        cudaEvent_t done = nullptr;
    };
    Staging m_staging[2];
    int m_nextStaging = 0;

    DeviceContext* m_ctx;
    cublasHandle_t m_cublas = nullptr;
    cudnnHandle_t m_cudnn = nullptr;
    std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int,
                        int, int>,
             std::unique_ptr<ConvPlan>>
        m_convPlans;
};

} // namespace ts::cuda
