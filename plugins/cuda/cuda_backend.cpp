#include "cuda_backend.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "cuda_kernels.h"
#include "nvml_probe.h"

namespace ts::cuda {

namespace {

[[maybe_unused]] bool onGpu(const Tensor& t) { return t.defined() && !t.hostAccessible(); }
[[maybe_unused]] bool isGpuF32(const Tensor& t) { return onGpu(t) && t.dtype() == DType::F32; }
int64_t lastDim(const Tensor& t) { return t.shape().rank() == 0 ? 1 : t.shape()[-1]; }
float* fptr(const Tensor& t) { return t.defined() ? t.data<float>() : nullptr; }

int actCode(Activation a)
{
    switch (a) {
    case Activation::Linear: return cudak::ActLinear;
    case Activation::Relu: return cudak::ActRelu;
    case Activation::LeakyRelu: return cudak::ActLeakyRelu;
    case Activation::Gelu: return cudak::ActGelu;
    case Activation::Sigmoid: return cudak::ActSigmoid;
    case Activation::Tanh: return cudak::ActTanh;
    case Activation::Softmax: break;
    }
    return cudak::ActLinear;
}

std::string gib(uint64_t bytes)
{
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f GiB", double(bytes) / double(1ull << 30));
    return buf;
}

} // namespace

struct CudaBackend::ConvPlan {
    bool symmetric = true;
    int64_t HP = 0, WP = 0;  // padded input extent when the padding is asymmetric
    cudnnTensorDescriptor_t xDesc = nullptr, yDesc = nullptr;
    cudnnFilterDescriptor_t wDesc = nullptr;
    cudnnConvolutionDescriptor_t convDesc = nullptr;
    // Deterministic algorithms in cuDNN's heuristic order (with their workspace sizes); a pass
    // starts at the first and moves on, for good, when cuDNN reports one unsupported at run time.
    template <typename Algo>
    struct Candidates {
        std::vector<std::pair<Algo, std::size_t>> list;
        std::size_t current = 0;
    };
    Candidates<cudnnConvolutionFwdAlgo_t> fwd;
    Candidates<cudnnConvolutionBwdDataAlgo_t> bwdData;
    Candidates<cudnnConvolutionBwdFilterAlgo_t> bwdFilter;

    ~ConvPlan()
    {
        if (xDesc) cudnnDestroyTensorDescriptor(xDesc);
        if (yDesc) cudnnDestroyTensorDescriptor(yDesc);
        if (wDesc) cudnnDestroyFilterDescriptor(wDesc);
        if (convDesc) cudnnDestroyConvolutionDescriptor(convDesc);
    }
};

Result<std::unique_ptr<Backend>> CudaBackend::create(int deviceIndex, const BackendOptions&)
{
    TS_ASSIGN(DeviceContext* ctx, deviceContext(deviceIndex));
    std::unique_ptr<CudaBackend> be(new CudaBackend(ctx));
    TS_TRY(be->init());
    return std::unique_ptr<Backend>(std::move(be));
}

CudaBackend::CudaBackend(DeviceContext* ctx) : m_ctx(ctx) {}

CudaBackend::~CudaBackend()
{
    cudaStreamSynchronize(m_ctx->stream);  // staged copies still read the pinned slots
    for (Staging& st : m_staging) {
        if (st.done) cudaEventDestroy(st.done);
        if (st.host) cudaFreeHost(st.host);
    }
    m_convPlans.clear();
    if (m_cudnn) cudnnDestroy(m_cudnn);
    if (m_cublas) cublasDestroy(m_cublas);
}

Status CudaBackend::init()
{
    TS_TRY(check(cudaSetDevice(m_ctx->index), "cudaSetDevice"));
    TS_TRY(check(cublasCreate(&m_cublas), "cublasCreate"));
    TS_TRY(check(cublasSetStream(m_cublas, m_ctx->stream), "cublasSetStream"));
    // Plain FP32 (no TF32 tensor-op rounding) so results match the reference to float rounding.
    TS_TRY(check(cublasSetMathMode(m_cublas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode"));
    TS_TRY(check(cudnnCreate(&m_cudnn), "cudnnCreate"));
    TS_TRY(check(cudnnSetStream(m_cudnn, m_ctx->stream), "cudnnSetStream"));
    return okStatus();
}

Status CudaBackend::check(cudaError_t err, const char* what) const
{
    if (err == cudaSuccess) return okStatus();
    (void)cudaGetLastError();
    return cudaFailure(err, what, m_ctx->index);
}

Status CudaBackend::check(cublasStatus_t st, const char* what) const
{
    if (st == CUBLAS_STATUS_SUCCESS) return okStatus();
    if (st == CUBLAS_STATUS_ALLOC_FAILED)
        return makeError(ErrorCode::OutOfMemory,
                         "CUDA out of memory on gpu:" + std::to_string(m_ctx->index) + " in " + what,
                         "lower the per-replica batch");
    return makeError(ErrorCode::Internal,
                     std::string("cuBLAS error ") + std::to_string(int(st)) + " (" + cublasGetStatusString(st) +
                         ") on gpu:" + std::to_string(m_ctx->index) + " in " + what,
                     "check the driver and that cuBLAS 13 is the one loaded (ldd libtrainstudio-cuda.so)");
}

Status CudaBackend::check(cudnnStatus_t st, const char* what) const
{
    if (st == CUDNN_STATUS_SUCCESS) return okStatus();
    return makeError(ErrorCode::Internal,
                     std::string("cuDNN error ") + std::to_string(int(st)) + " (" + cudnnGetErrorString(st) +
                         ") on gpu:" + std::to_string(m_ctx->index) + " in " + what,
                     "check that cuDNN 9 for CUDA 13 is the one loaded (ldd libtrainstudio-cuda.so)");
}

void CudaBackend::bindThread() { cudaSetDevice(m_ctx->index); }

Status CudaBackend::synchronize() { return check(cudaStreamSynchronize(m_ctx->stream), "cudaStreamSynchronize"); }

Result<DeviceInfo> deviceInfo(int device)
{
    TS_ASSIGN(DeviceContext* ctx, deviceContext(device));
    DeviceInfo d;
    d.device = Device{DeviceKind::Cuda, device};
    const cudaDeviceProp& p = ctx->props;
    d.name = d.device.toString() + " (" + p.name + ", sm_" + std::to_string(p.major) + std::to_string(p.minor) +
             ", " + gib(p.totalGlobalMem) + ")";
    d.memoryTotal = p.totalGlobalMem;
    int prev = -1;
    cudaGetDevice(&prev);
    if (prev != device) cudaSetDevice(device);
    std::size_t freeB = 0, totalB = 0;
    if (cudaMemGetInfo(&freeB, &totalB) == cudaSuccess) d.memoryFree = freeB;
    else (void)cudaGetLastError();
    if (prev >= 0 && prev != device) cudaSetDevice(prev);
    return d;
}

DeviceInfo CudaBackend::info() const
{
    auto d = deviceInfo(m_ctx->index);
    if (d.ok()) return *d;
    DeviceInfo fallback;  // the context exists (this backend holds it), so only memoryFree is lost
    fallback.device = device();
    fallback.name = device().toString() + " (" + m_ctx->props.name + ")";
    fallback.memoryTotal = m_ctx->props.totalGlobalMem;
    return fallback;
}

DeviceSample CudaBackend::sample() const { return NvmlProbe::instance().sample(m_ctx->index); }

Result<Tensor> CudaBackend::scratch(Shape shape, DType dtype)
{
    auto r = Tensor::create(shape, dtype, *m_ctx->allocator);
    if (r.ok()) return r;
    const auto [asked, freeB] = m_ctx->allocator->lastFailure();
    return makeError(ErrorCode::OutOfMemory,
                     "CUDA out of memory on gpu:" + std::to_string(m_ctx->index) + " allocating " + gib(asked) +
                         "; free " + gib(freeB),
                     "lower the per-replica batch");
}

Result<Tensor> CudaBackend::onDevice(const Tensor& t)
{
    if (!t.defined() || !t.hostAccessible()) return t;
    TS_ASSIGN(Tensor d, scratch(t.shape(), t.dtype()));
    TS_TRY(copyFromHost(t.raw(), d));
    return d;
}

Status CudaBackend::colSums(const Tensor& m, int64_t rows, int64_t cols, Tensor& out, bool accumulate)
{
    // Double scratch as byte tensors (DType has no f64): partials, then the sums.
    TS_ASSIGN(Tensor part, scratch(Shape{cudak::columnReduceScratch(rows, cols) * 8}, DType::U8));
    TS_ASSIGN(Tensor sums, scratch(Shape{cols * 8}, DType::U8));
    auto* a = static_cast<double*>(sums.raw());
    TS_TRY(check(cudak::columnReduce(cudak::ColumnReduce::Sum, m.data<float>(), nullptr, nullptr, nullptr, nullptr,
                                     rows, cols, static_cast<double*>(part.raw()), a, nullptr, m_ctx->stream),
                 "column sums"));
    return check(cudak::storeColumnSums(a, out.data<float>(), cols, accumulate, m_ctx->stream), "column sums");
}

// ---------------------------------------------------------------- GEMM / dense

Status CudaBackend::gemm(const Tensor& a, bool transA, const Tensor& b, bool transB, Tensor& c, float alpha,
                         float beta)
{
    TS_ASSERT(isGpuF32(a) && isGpuF32(b) && isGpuF32(c));
    const int64_t M = c.shape()[0], N = c.shape()[1];
    const int64_t K = transA ? a.shape()[0] : a.shape()[1];
    if (M == 0 || N == 0) return okStatus();
    // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands.
    // cuBLAS checks leading dimensions (>= 1) even when K == 0 leaves them unused.
    const int lda = int(std::max<int64_t>(1, transA ? M : K)), ldb = int(std::max<int64_t>(1, transB ? K : N));
    return check(cublasSgemm(m_cublas, transB ? CUBLAS_OP_T : CUBLAS_OP_N, transA ? CUBLAS_OP_T : CUBLAS_OP_N, int(N),
                             int(M), int(K), &alpha, b.data<float>(), ldb, a.data<float>(), lda, &beta,
                             c.data<float>(), int(N)),
                 "cublasSgemm");
}

Status CudaBackend::denseForward(const Tensor& x, const Tensor& w, const Tensor& b, Activation act, Tensor& y)
{
    TS_ASSERT(isGpuF32(x) && isGpuF32(w) && isGpuF32(y));
    TS_ASSERT(act == Activation::Linear || act == Activation::Relu);
    const int64_t in = w.shape()[0], out = w.shape()[1];
    const int64_t n = in == 0 ? 0 : x.numel() / in;
    Tensor x2 = x.reshaped(Shape{n, in});
    Tensor y2 = y.reshaped(Shape{n, out});
    TS_TRY(gemm(x2, false, w, false, y2, 1.0f, 0.0f));
    if (!b.defined() && act == Activation::Linear) return okStatus();
    return check(cudak::biasActivation(y.data<float>(), fptr(b), n, out, actCode(act), m_ctx->stream),
                 "dense bias/activation");
}

Status CudaBackend::denseBackward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& dx, Tensor& dw,
                                  Tensor& db, bool accumulate)
{
    TS_ASSERT(isGpuF32(x) && isGpuF32(w) && isGpuF32(dy));
    const int64_t in = w.shape()[0], out = w.shape()[1];
    const int64_t n = in == 0 ? 0 : x.numel() / in;
    Tensor x2 = x.reshaped(Shape{n, in});
    Tensor dy2 = dy.reshaped(Shape{n, out});
    if (dx.defined()) {
        Tensor dx2 = dx.reshaped(Shape{n, in});
        TS_TRY(gemm(dy2, false, w, true, dx2, 1.0f, 0.0f));
    }
    if (dw.defined()) {
        if (n == 0 && !accumulate) TS_TRY(check(cudaMemsetAsync(dw.raw(), 0, dw.bytes(), m_ctx->stream), "memset"));
        else TS_TRY(gemm(x2, true, dy2, false, dw, 1.0f, accumulate ? 1.0f : 0.0f));
    }
    if (db.defined()) TS_TRY(colSums(dy2, n, out, db, accumulate));
    return okStatus();
}

// ---------------------------------------------------------------- convolution

Result<CudaBackend::ConvPlan*> CudaBackend::convPlan(int64_t N, int64_t H, int64_t W, int64_t C, int64_t KH,
                                                      int64_t KW, int64_t F, int64_t OH, int64_t OW,
                                                      const Conv2dParams& p)
{
    const auto key = std::make_tuple(N, H, W, C, KH, KW, F, OH, OW, p.strideH, p.strideW,
                                     p.padTop * 4096 + p.padBottom, p.padLeft * 4096 + p.padRight);
    auto it = m_convPlans.find(key);
    if (it != m_convPlans.end()) return it->second.get();

    auto plan = std::make_unique<ConvPlan>();
    plan->symmetric = p.padTop == p.padBottom && p.padLeft == p.padRight;
    const int64_t Hin = plan->symmetric ? H : H + p.padTop + p.padBottom;
    const int64_t Win = plan->symmetric ? W : W + p.padLeft + p.padRight;
    plan->HP = Hin;
    plan->WP = Win;
    const int padH = plan->symmetric ? p.padTop : 0, padW = plan->symmetric ? p.padLeft : 0;
    const std::string geom = "conv " + std::to_string(KH) + "x" + std::to_string(KW) + " " + std::to_string(C) +
                             "->" + std::to_string(F) + " on " + std::to_string(H) + "x" + std::to_string(W);

    TS_TRY(check(cudnnCreateTensorDescriptor(&plan->xDesc), "cudnnCreateTensorDescriptor"));
    TS_TRY(check(cudnnCreateTensorDescriptor(&plan->yDesc), "cudnnCreateTensorDescriptor"));
    TS_TRY(check(cudnnCreateFilterDescriptor(&plan->wDesc), "cudnnCreateFilterDescriptor"));
    TS_TRY(check(cudnnCreateConvolutionDescriptor(&plan->convDesc), "cudnnCreateConvolutionDescriptor"));
    TS_TRY(check(cudnnSetTensor4dDescriptor(plan->xDesc, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, int(N), int(C), int(Hin),
                                            int(Win)),
                 "cudnnSetTensor4dDescriptor(x)"));
    TS_TRY(check(cudnnSetTensor4dDescriptor(plan->yDesc, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, int(N), int(F), int(OH),
                                            int(OW)),
                 "cudnnSetTensor4dDescriptor(y)"));
    // KRSC filter (F, KH, KW, C): the Keras kernel (KH, KW, C, F) transposed as a (KH*KW*C, F) matrix.
    TS_TRY(check(cudnnSetFilter4dDescriptor(plan->wDesc, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NHWC, int(F), int(C), int(KH),
                                            int(KW)),
                 "cudnnSetFilter4dDescriptor"));
    TS_TRY(check(cudnnSetConvolution2dDescriptor(plan->convDesc, padH, padW, p.strideH, p.strideW, 1, 1,
                                                 CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
                 "cudnnSetConvolution2dDescriptor"));
    // FMA math: no TF32, so values match the float reference.
    TS_TRY(check(cudnnSetConvolutionMathType(plan->convDesc, CUDNN_FMA_MATH), "cudnnSetConvolutionMathType"));
    int n = 0, c = 0, oh = 0, ow = 0;
    TS_TRY(check(cudnnGetConvolution2dForwardOutputDim(plan->convDesc, plan->xDesc, plan->wDesc, &n, &c, &oh, &ow),
                 "cudnnGetConvolution2dForwardOutputDim"));
    if (oh != OH || ow != OW)
        return makeError(ErrorCode::Internal,
                         geom + ": cuDNN computes a " + std::to_string(oh) + "x" + std::to_string(ow) +
                             " output where the model expects " + std::to_string(OH) + "x" + std::to_string(OW),
                         "report this geometry; the cpu backend computes it");

    // Heuristic order, keeping every deterministic algorithm it reports as usable.
    constexpr int kMax = 16;
    int got = 0;
    {
        cudnnConvolutionFwdAlgoPerf_t perf[kMax];
        TS_TRY(check(cudnnGetConvolutionForwardAlgorithm_v7(m_cudnn, plan->xDesc, plan->wDesc, plan->convDesc,
                                                            plan->yDesc, kMax, &got, perf),
                     "cudnnGetConvolutionForwardAlgorithm_v7"));
        for (int i = 0; i < got; ++i)
            if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].determinism == CUDNN_DETERMINISTIC)
                plan->fwd.list.emplace_back(perf[i].algo, perf[i].memory);
        if (plan->fwd.list.empty()) return makeError(ErrorCode::Unsupported, geom + ": cuDNN offers no forward algorithm");
    }
    {
        cudnnConvolutionBwdDataAlgoPerf_t perf[kMax];
        TS_TRY(check(cudnnGetConvolutionBackwardDataAlgorithm_v7(m_cudnn, plan->wDesc, plan->yDesc, plan->convDesc,
                                                                 plan->xDesc, kMax, &got, perf),
                     "cudnnGetConvolutionBackwardDataAlgorithm_v7"));
        for (int i = 0; i < got; ++i)
            if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].determinism == CUDNN_DETERMINISTIC)
                plan->bwdData.list.emplace_back(perf[i].algo, perf[i].memory);
        if (plan->bwdData.list.empty())
            return makeError(ErrorCode::Unsupported, geom + ": cuDNN offers no deterministic backward-data algorithm");
    }
    {
        cudnnConvolutionBwdFilterAlgoPerf_t perf[kMax];
        TS_TRY(check(cudnnGetConvolutionBackwardFilterAlgorithm_v7(m_cudnn, plan->xDesc, plan->yDesc, plan->convDesc,
                                                                   plan->wDesc, kMax, &got, perf),
                     "cudnnGetConvolutionBackwardFilterAlgorithm_v7"));
        for (int i = 0; i < got; ++i)
            if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].determinism == CUDNN_DETERMINISTIC)
                plan->bwdFilter.list.emplace_back(perf[i].algo, perf[i].memory);
        if (plan->bwdFilter.list.empty())
            return makeError(ErrorCode::Unsupported,
                             geom + ": cuDNN offers no deterministic backward-filter algorithm");
    }
    ConvPlan* raw = plan.get();
    m_convPlans.emplace(key, std::move(plan));
    return raw;
}

template <typename Candidates, typename Run>
Status CudaBackend::runConv(Candidates& c, const char* what, Run&& run)
{
    while (c.current < c.list.size()) {
        const auto [algo, wsBytes] = c.list[c.current];
        TS_ASSIGN(Tensor ws, scratch(Shape{int64_t(wsBytes)}, DType::U8));
        const cudnnStatus_t st = run(algo, ws.raw(), wsBytes);
        // cuDNN 9 refines NOT_SUPPORTED (3000) into sub-codes 3001..3999 (layout, shape, ...).
        const bool unsupported = int(st) >= int(CUDNN_STATUS_NOT_SUPPORTED) && int(st) < int(CUDNN_STATUS_NOT_SUPPORTED) + 1000;
        if (!unsupported) return check(st, what);
        ++c.current;  // the heuristics offered one this geometry cannot run: the next, from now on
    }
    return makeError(ErrorCode::Unsupported,
                     std::string(what) + ": none of cuDNN's deterministic algorithms runs this convolution on gpu:" +
                         std::to_string(m_ctx->index),
                     "report the layer's shapes; the cpu backend computes it");
}

Status CudaBackend::conv2dForward(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dParams& p, Tensor& y)
{
    TS_ASSERT(isGpuF32(x) && isGpuF32(w) && isGpuF32(y));
    const int64_t N = x.shape()[0], H = x.shape()[1], W = x.shape()[2], C = x.shape()[3];
    const int64_t KH = w.shape()[0], KW = w.shape()[1], F = w.shape()[3];
    const int64_t OH = y.shape()[1], OW = y.shape()[2];
    if (y.numel() == 0) return okStatus();
    TS_ASSIGN(ConvPlan * plan, convPlan(N, H, W, C, KH, KW, F, OH, OW, p));
    cudaStream_t s = m_ctx->stream;
    TS_ASSIGN(Tensor wT, scratch(Shape{F, KH * KW * C}, DType::F32));
    TS_TRY(check(cudak::transpose2d(w.data<float>(), wT.data<float>(), KH * KW * C, F, s), "conv weight transpose"));
    Tensor xin = x;
    if (!plan->symmetric) {
        TS_ASSIGN(xin, scratch(Shape{N, plan->HP, plan->WP, C}, DType::F32));
        TS_TRY(check(cudak::padNhwc(x.data<float>(), xin.data<float>(), N, H, W, C, p.padTop, p.padLeft, plan->HP,
                                    plan->WP, s),
                     "conv input padding"));
    }
    const float one = 1.0f, zero = 0.0f;
    TS_TRY(runConv(plan->fwd, "cudnnConvolutionForward", [&](cudnnConvolutionFwdAlgo_t algo, void* ws, std::size_t n) {
        return cudnnConvolutionForward(m_cudnn, &one, plan->xDesc, xin.raw(), plan->wDesc, wT.raw(), plan->convDesc,
                                       algo, ws, n, &zero, plan->yDesc, y.raw());
    }));
    if (!b.defined()) return okStatus();
    return check(cudak::biasActivation(y.data<float>(), b.data<float>(), N * OH * OW, F, cudak::ActLinear, s),
                 "conv bias");
}

Status CudaBackend::conv2dBackwardData(const Tensor& dy, const Tensor& w, const Conv2dParams& p, Tensor& dx)
{
    TS_ASSERT(isGpuF32(dy) && isGpuF32(w) && isGpuF32(dx));
    const int64_t N = dx.shape()[0], H = dx.shape()[1], W = dx.shape()[2], C = dx.shape()[3];
    const int64_t KH = w.shape()[0], KW = w.shape()[1], F = w.shape()[3];
    const int64_t OH = dy.shape()[1], OW = dy.shape()[2];
    cudaStream_t s = m_ctx->stream;
    if (dx.numel() == 0) return okStatus();
    if (dy.numel() == 0) return check(cudaMemsetAsync(dx.raw(), 0, dx.bytes(), s), "memset");
    TS_ASSIGN(ConvPlan * plan, convPlan(N, H, W, C, KH, KW, F, OH, OW, p));
    TS_ASSIGN(Tensor wT, scratch(Shape{F, KH * KW * C}, DType::F32));
    TS_TRY(check(cudak::transpose2d(w.data<float>(), wT.data<float>(), KH * KW * C, F, s), "conv weight transpose"));
    Tensor dxin = dx;
    if (!plan->symmetric) {
        TS_ASSIGN(dxin, scratch(Shape{N, plan->HP, plan->WP, C}, DType::F32));
    }
    const float one = 1.0f, zero = 0.0f;
    TS_TRY(runConv(plan->bwdData, "cudnnConvolutionBackwardData",
                   [&](cudnnConvolutionBwdDataAlgo_t algo, void* ws, std::size_t n) {
                       return cudnnConvolutionBackwardData(m_cudnn, &one, plan->wDesc, wT.raw(), plan->yDesc, dy.raw(),
                                                           plan->convDesc, algo, ws, n, &zero, plan->xDesc, dxin.raw());
                   }));
    if (plan->symmetric) return okStatus();
    return check(cudak::cropNhwc(dxin.data<float>(), dx.data<float>(), N, H, W, C, p.padTop, p.padLeft, plan->HP,
                                 plan->WP, s),
                 "conv gradient crop");
}

Status CudaBackend::conv2dBackwardWeights(const Tensor& x, const Tensor& dy, const Conv2dParams& p, Tensor& dw,
                                          Tensor& db)
{
    TS_ASSERT(isGpuF32(x) && isGpuF32(dy) && isGpuF32(dw));
    const int64_t N = x.shape()[0], H = x.shape()[1], W = x.shape()[2], C = x.shape()[3];
    const int64_t KH = dw.shape()[0], KW = dw.shape()[1], F = dw.shape()[3];
    const int64_t OH = dy.shape()[1], OW = dy.shape()[2];
    cudaStream_t s = m_ctx->stream;
    if (dy.numel() == 0) {
        TS_TRY(check(cudaMemsetAsync(dw.raw(), 0, dw.bytes(), s), "memset"));
        if (db.defined()) TS_TRY(check(cudaMemsetAsync(db.raw(), 0, db.bytes(), s), "memset"));
        return okStatus();
    }
    TS_ASSIGN(ConvPlan * plan, convPlan(N, H, W, C, KH, KW, F, OH, OW, p));
    Tensor xin = x;
    if (!plan->symmetric) {
        TS_ASSIGN(xin, scratch(Shape{N, plan->HP, plan->WP, C}, DType::F32));
        TS_TRY(check(cudak::padNhwc(x.data<float>(), xin.data<float>(), N, H, W, C, p.padTop, p.padLeft, plan->HP,
                                    plan->WP, s),
                     "conv input padding"));
    }
    TS_ASSIGN(Tensor dwT, scratch(Shape{F, KH * KW * C}, DType::F32));
    const float one = 1.0f, zero = 0.0f;
    TS_TRY(runConv(plan->bwdFilter, "cudnnConvolutionBackwardFilter",
                   [&](cudnnConvolutionBwdFilterAlgo_t algo, void* ws, std::size_t n) {
                       return cudnnConvolutionBackwardFilter(m_cudnn, &one, plan->xDesc, xin.raw(), plan->yDesc,
                                                             dy.raw(), plan->convDesc, algo, ws, n, &zero, plan->wDesc,
                                                             dwT.raw());
                   }));
    TS_TRY(check(cudak::transpose2d(dwT.data<float>(), dw.data<float>(), F, KH * KW * C, s), "conv weight transpose"));
    if (!db.defined()) return okStatus();
    return colSums(dy, N * OH * OW, F, db, false);
}

// ---------------------------------------------------------------- pooling

namespace {
cudak::PoolGeom poolGeom(const Shape& xs, const Shape& ys, const Pool2dParams& p)
{
    return cudak::PoolGeom{xs[0], xs[1], xs[2], xs[3], ys[1], ys[2], p.windowH, p.windowW, p.strideH, p.strideW,
                           p.padTop, p.padLeft};
}
} // namespace

Status CudaBackend::pool2dForward(const Tensor& x, const Pool2dParams& p, Tensor& y, Tensor& workspace)
{
    TS_ASSERT(isGpuF32(x) && isGpuF32(y));
    const bool isMax = p.kind == PoolKind::Max;
    int32_t* ws = isMax && workspace.defined() ? workspace.data<int32_t>() : nullptr;
    return check(cudak::pool2dForward(x.data<float>(), y.data<float>(), ws, poolGeom(x.shape(), y.shape(), p), isMax,
                                      m_ctx->stream),
                 "pool2d forward");
}

Status CudaBackend::pool2dBackward(const Tensor& dy, const Tensor& workspace, const Pool2dParams& p, Tensor& dx)
{
    TS_ASSERT(isGpuF32(dy) && isGpuF32(dx));
    const bool isMax = p.kind == PoolKind::Max;
    TS_ASSERT(!isMax || (workspace.defined() && workspace.dtype() == DType::I32));
    return check(cudak::pool2dBackward(dy.data<float>(), isMax ? workspace.data<int32_t>() : nullptr, dx.data<float>(),
                                       poolGeom(dx.shape(), dy.shape(), p), isMax, m_ctx->stream),
                 "pool2d backward");
}

Status CudaBackend::globalAvgPoolForward(const Tensor& x, Tensor& y)
{
    TS_ASSERT(isGpuF32(x) && isGpuF32(y) && x.shape().rank() == 4);
    return check(cudak::globalAvgPoolForward(x.data<float>(), y.data<float>(), x.shape()[0],
                                             x.shape()[1] * x.shape()[2], x.shape()[3], m_ctx->stream),
                 "global average pool forward");
}

Status CudaBackend::globalAvgPoolBackward(const Tensor& dy, Tensor& dx)
{
    TS_ASSERT(isGpuF32(dy) && isGpuF32(dx) && dx.shape().rank() == 4);
    return check(cudak::globalAvgPoolBackward(dy.data<float>(), dx.data<float>(), dx.shape()[0],
                                              dx.shape()[1] * dx.shape()[2], dx.shape()[3], m_ctx->stream),
                 "global average pool backward");
}

// ---------------------------------------------------------------- batch norm

Status CudaBackend::batchNormForward(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& runningMean,
                                     Tensor& runningVar, bool training, float momentum, float epsilon, Tensor& y,
                                     Tensor& saveMean, Tensor& saveInvStd)
{
    TS_ASSERT(isGpuF32(x) && isGpuF32(y) && isGpuF32(runningMean) && isGpuF32(runningVar));
    const int64_t C = lastDim(x);
    const int64_t M = C == 0 ? 0 : x.numel() / C;
    if (C == 0) return okStatus();
    cudaStream_t s = m_ctx->stream;
    // stats: mean (C doubles), invStd (C), column sums (C), squared deviations (C).
    TS_ASSIGN(Tensor stats, scratch(Shape{4 * C * 8}, DType::U8));
    auto* mean = static_cast<double*>(stats.raw());
    double* invStd = mean + C;
    double* sums = mean + 2 * C;
    double* sq = mean + 3 * C;
    if (training) {
        TS_ASSERT(M > 0);
        TS_ASSIGN(Tensor part, scratch(Shape{cudak::columnReduceScratch(M, C) * 8}, DType::U8));
        auto* partial = static_cast<double*>(part.raw());
        const float* X = x.data<float>();
        // Two passes (mean, then squared deviations), as the reference computes the variance.
        TS_TRY(check(cudak::columnReduce(cudak::ColumnReduce::Sum, X, nullptr, nullptr, nullptr, nullptr, M, C, partial,
                                         sums, nullptr, s),
                     "batch norm mean"));
        TS_TRY(check(cudak::batchNormMean(sums, mean, M, C, s), "batch norm mean"));
        TS_TRY(check(cudak::columnReduce(cudak::ColumnReduce::SumSqDev, X, nullptr, mean, nullptr, nullptr, M, C,
                                         partial, sq, nullptr, s),
                     "batch norm variance"));
        TS_TRY(check(cudak::batchNormFinish(mean, sq, M, C, momentum, epsilon, runningMean.data<float>(),
                                            runningVar.data<float>(), fptr(saveMean), fptr(saveInvStd), invStd, s),
                     "batch norm statistics"));
    } else {
        TS_TRY(check(cudak::batchNormRunning(runningMean.data<float>(), runningVar.data<float>(), epsilon, mean,
                                             invStd, C, s),
                     "batch norm running statistics"));
    }
    return check(cudak::batchNormApply(x.data<float>(), mean, invStd, fptr(gamma), fptr(beta), y.data<float>(), M, C,
                                       s),
                 "batch norm apply");
}

Status CudaBackend::batchNormBackward(const Tensor& x, const Tensor& gamma, const Tensor& saveMean,
                                      const Tensor& saveInvStd, const Tensor& dy, Tensor& dx, Tensor& dgamma,
                                      Tensor& dbeta)
{
    TS_ASSERT(isGpuF32(x) && isGpuF32(dy) && isGpuF32(saveMean) && isGpuF32(saveInvStd));
    const int64_t C = lastDim(x);
    const int64_t M = C == 0 ? 0 : x.numel() / C;
    if (C == 0) return okStatus();
    cudaStream_t s = m_ctx->stream;
    TS_ASSIGN(Tensor sums, scratch(Shape{2 * C * 8}, DType::U8));
    auto* sumDy = static_cast<double*>(sums.raw());
    double* sumDyXhat = sumDy + C;
    TS_ASSIGN(Tensor part, scratch(Shape{cudak::columnReduceScratch(M, C) * 8}, DType::U8));
    TS_TRY(check(cudak::columnReduce(cudak::ColumnReduce::BnBackward, x.data<float>(), dy.data<float>(), nullptr,
                                     saveMean.data<float>(), saveInvStd.data<float>(), M, C,
                                     static_cast<double*>(part.raw()), sumDy, sumDyXhat, s),
                 "batch norm backward sums"));
    return check(cudak::batchNormBackward(x.data<float>(), fptr(gamma), saveMean.data<float>(),
                                          saveInvStd.data<float>(), dy.data<float>(), sumDy, sumDyXhat, fptr(dx),
                                          fptr(dgamma), fptr(dbeta), M, C, s),
                 "batch norm backward");
}

// ---------------------------------------------------------------- activations, softmax

Status CudaBackend::activationForward(Activation act, float alpha, const Tensor& x, Tensor& y)
{
    TS_ASSERT(isGpuF32(x) && isGpuF32(y) && x.numel() == y.numel());
    if (act == Activation::Softmax) return softmaxForward(x, y);
    return check(cudak::activationForward(actCode(act), alpha, x.data<float>(), y.data<float>(), x.numel(),
                                          m_ctx->stream),
                 "activation forward");
}

Status CudaBackend::activationBackward(Activation act, float alpha, const Tensor& x, const Tensor& y,
                                       const Tensor& dy, Tensor& dx)
{
    TS_ASSERT(isGpuF32(dy) && isGpuF32(dx) && dy.numel() == dx.numel());
    if (act == Activation::Softmax) return softmaxBackward(y, dy, dx);
    const float* X = fptr(x);
    const float* Y = fptr(y);
    // Same tensor preferences as the reference: x for Relu/LeakyRelu/Gelu, y for Sigmoid/Tanh.
    if (act == Activation::Sigmoid || act == Activation::Tanh) {
        if (Y) X = nullptr;
    } else if (act == Activation::LeakyRelu) {
        if (X) Y = nullptr;
    } else if (X) {
        Y = nullptr;
    }
    TS_ASSERT(act == Activation::Linear || X || Y);
    TS_ASSERT(act != Activation::Gelu || X);
    return check(cudak::activationBackward(actCode(act), alpha, X, Y, dy.data<float>(), dx.data<float>(), dy.numel(),
                                           m_ctx->stream),
                 "activation backward");
}

Status CudaBackend::softmaxForward(const Tensor& x, Tensor& y)
{
    TS_ASSERT(isGpuF32(x) && isGpuF32(y) && x.numel() == y.numel());
    const int64_t cols = lastDim(x);
    if (cols == 0) return okStatus();
    return check(cudak::softmaxForward(x.data<float>(), y.data<float>(), x.numel() / cols, cols, m_ctx->stream),
                 "softmax forward");
}

Status CudaBackend::softmaxBackward(const Tensor& y, const Tensor& dy, Tensor& dx)
{
    TS_ASSERT(isGpuF32(y) && isGpuF32(dy) && isGpuF32(dx));
    const int64_t cols = lastDim(y);
    if (cols == 0) return okStatus();
    return check(cudak::softmaxBackward(y.data<float>(), dy.data<float>(), dx.data<float>(), y.numel() / cols, cols,
                                        m_ctx->stream),
                 "softmax backward");
}

// ---------------------------------------------------------------- dropout, elementwise, concat

Status CudaBackend::dropoutForward(const Tensor& x, float rate, uint64_t seed, Tensor& mask, Tensor& y)
{
    TS_ASSERT(isGpuF32(x) && isGpuF32(y) && onGpu(mask) && mask.dtype() == DType::U8);
    return check(cudak::dropoutForward(x.data<float>(), rate, seed, mask.data<uint8_t>(), y.data<float>(), x.numel(),
                                       m_ctx->stream),
                 "dropout forward");
}

Status CudaBackend::dropoutBackward(const Tensor& dy, const Tensor& mask, float rate, Tensor& dx)
{
    TS_ASSERT(isGpuF32(dy) && isGpuF32(dx) && onGpu(mask) && mask.dtype() == DType::U8);
    return check(cudak::dropoutBackward(dy.data<float>(), mask.data<uint8_t>(), rate, dx.data<float>(), dy.numel(),
                                        m_ctx->stream),
                 "dropout backward");
}

Status CudaBackend::add(const Tensor& a, const Tensor& b, Tensor& c)
{
    TS_ASSERT(isGpuF32(a) && isGpuF32(b) && isGpuF32(c) && a.numel() == b.numel() && a.numel() == c.numel());
    return check(cudak::add(a.data<float>(), b.data<float>(), c.data<float>(), a.numel(), m_ctx->stream), "add");
}

Status CudaBackend::axpy(float alpha, const Tensor& x, Tensor& y)
{
    TS_ASSERT(isGpuF32(x) && isGpuF32(y) && x.numel() == y.numel());
    return check(cudak::axpy(alpha, x.data<float>(), y.data<float>(), x.numel(), m_ctx->stream), "axpy");
}

Status CudaBackend::scale(float alpha, Tensor& x)
{
    TS_ASSERT(isGpuF32(x));
    return check(cudak::scale(alpha, x.data<float>(), x.numel(), m_ctx->stream), "scale");
}

Status CudaBackend::concatForward(const std::vector<Tensor>& xs, Tensor& y)
{
    TS_ASSERT(isGpuF32(y));
    const int64_t total = lastDim(y);
    const int64_t rows = total == 0 ? 0 : y.numel() / total;
    int64_t offset = 0;
    for (const Tensor& x : xs) {
        TS_ASSERT(isGpuF32(x));
        const int64_t ci = lastDim(x);
        TS_TRY(check(cudak::copyColumnsIn(x.data<float>(), y.data<float>(), rows, ci, total, offset, m_ctx->stream),
                     "concat forward"));
        offset += ci;
    }
    TS_ASSERT(offset == total);
    return okStatus();
}

Status CudaBackend::concatBackward(const Tensor& dy, std::vector<Tensor>& dxs)
{
    TS_ASSERT(isGpuF32(dy));
    const int64_t total = lastDim(dy);
    const int64_t rows = total == 0 ? 0 : dy.numel() / total;
    int64_t offset = 0;
    for (Tensor& dx : dxs) {
        TS_ASSERT(isGpuF32(dx));
        const int64_t ci = lastDim(dx);
        TS_TRY(check(cudak::copyColumnsOut(dy.data<float>(), dx.data<float>(), rows, ci, total, offset, m_ctx->stream),
                     "concat backward"));
        offset += ci;
    }
    TS_ASSERT(offset == total);
    return okStatus();
}

// ---------------------------------------------------------------- loss, metrics

Status CudaBackend::loss(const LossParams& p, const Tensor& pred, const Tensor& target, float* loss, Tensor& dpred)
{
    TS_ASSERT(isGpuF32(pred) && target.defined() && pred.shape().rank() >= 1);
    const int64_t N = pred.shape()[0];
    const int64_t per = N == 0 ? 0 : pred.numel() / N;
    const int64_t nGlobal = p.globalBatch > 0 ? p.globalBatch : N;
    const double gscale = nGlobal > 0 ? double(p.gradScale) / double(nGlobal) : 0.0;
    if (dpred.defined()) TS_ASSERT(isGpuF32(dpred) && dpred.numel() == pred.numel());
    // The kernel reads sparse labels as int32 and dense targets as float: the reference's checks.
    TS_ASSERT(p.kind == LossKind::SparseCategoricalCrossentropy ? (target.dtype() == DType::I32 && target.numel() == N)
                                                               : (target.dtype() == DType::F32 && target.numel() == pred.numel()));
    if (N == 0) {
        if (loss) *loss = 0.0f;
        return okStatus();
    }
    TS_ASSIGN(Tensor t, onDevice(target));
    cudaStream_t s = m_ctx->stream;
    TS_ASSIGN(Tensor rows, scratch(Shape{N * 8 + 8}, DType::U8));
    auto* rowLoss = static_cast<double*>(rows.raw());
    int* badRow = reinterpret_cast<int*>(rowLoss + N);
    const int init = INT_MAX;
    TS_TRY(check(cudaMemcpyAsync(badRow, &init, sizeof init, cudaMemcpyHostToDevice, s), "loss setup"));
    int kind = cudak::LossSparseCce;
    switch (p.kind) {
    case LossKind::SparseCategoricalCrossentropy: kind = cudak::LossSparseCce; break;
    case LossKind::CategoricalCrossentropy: kind = cudak::LossCce; break;
    case LossKind::BinaryCrossentropy: kind = cudak::LossBce; break;
    case LossKind::MeanSquaredError: kind = cudak::LossMse; break;
    }
    TS_TRY(check(cudak::loss(kind, p.fromLogits, pred.data<float>(), t.raw(), N, per, gscale, rowLoss, fptr(dpred),
                             badRow, s),
                 "loss"));
    std::vector<double> host(static_cast<std::size_t>(N));
    int bad = INT_MAX;
    TS_TRY(check(cudaMemcpyAsync(host.data(), rowLoss, std::size_t(N) * sizeof(double), cudaMemcpyDeviceToHost, s),
                 "loss readback"));
    TS_TRY(check(cudaMemcpyAsync(&bad, badRow, sizeof bad, cudaMemcpyDeviceToHost, s), "loss readback"));
    TS_TRY(synchronize());
    if (bad != INT_MAX) {
        int32_t label = 0;
        TS_TRY(check(cudaMemcpy(&label, static_cast<const int32_t*>(t.raw()) + bad, sizeof label, cudaMemcpyDeviceToHost),
                     "loss readback"));
        return makeError(ErrorCode::InvalidArgument,
                         "sparse categorical crossentropy: label " + std::to_string(label) + " in batch row " +
                             std::to_string(bad) + " is outside [0, " + std::to_string(per) + ")",
                         "labels must be class ids below the model's output width; check the label column and the "
                         "last layer's units");
    }
    double total = 0;
    for (double v : host) total += v;
    if (loss) *loss = float(total / double(N));
    return okStatus();
}

Status CudaBackend::argmaxMatches(const Tensor& pred, const Tensor& target, bool binaryFromLogits, int64_t* matches)
{
    TS_ASSERT(isGpuF32(pred) && target.defined() && matches);
    const int64_t N = pred.shape()[0];
    const int64_t C = N == 0 ? 0 : pred.numel() / N;
    *matches = 0;
    if (N == 0) return okStatus();
    TS_ASSIGN(Tensor t, onDevice(target));
    TS_ASSIGN(Tensor flags, scratch(Shape{N}, DType::I32));
    TS_TRY(check(cudak::argmaxMatches(pred.data<float>(), t.raw(), t.dtype() == DType::I32, binaryFromLogits, N, C,
                                      flags.data<int32_t>(), m_ctx->stream),
                 "argmax matches"));
    std::vector<int32_t> host(static_cast<std::size_t>(N));
    TS_TRY(copyToHost(flags, host.data()));
    int64_t count = 0;
    for (int32_t f : host) count += f;
    *matches = count;
    return okStatus();
}

// ---------------------------------------------------------------- optimizers

Status CudaBackend::sgdUpdate(const SgdParams& p, Tensor& param, const Tensor& grad, Tensor& velocity)
{
    TS_ASSERT(isGpuF32(param) && isGpuF32(grad) && param.numel() == grad.numel());
    const bool useMomentum = p.momentum != 0.0f;
    TS_ASSERT(!useMomentum || (isGpuF32(velocity) && velocity.numel() == param.numel()));
    return check(cudak::sgdUpdate(p.lr, p.momentum, p.nesterov, p.weightDecay, param.data<float>(), grad.data<float>(),
                                  useMomentum ? velocity.data<float>() : nullptr, param.numel(), m_ctx->stream),
                 "sgd update");
}

Status CudaBackend::adamUpdate(const AdamParams& p, Tensor& param, const Tensor& grad, Tensor& m, Tensor& v)
{
    TS_ASSERT(isGpuF32(param) && isGpuF32(grad) && isGpuF32(m) && isGpuF32(v));
    TS_ASSERT(p.step >= 1);
    const double bc1 = 1.0 - std::pow(double(p.beta1), double(p.step));
    const double bc2 = 1.0 - std::pow(double(p.beta2), double(p.step));
    return check(cudak::adamUpdate(p.lr, p.beta1, p.beta2, p.epsilon, p.weightDecay, bc1, bc2, param.data<float>(),
                                   grad.data<float>(), m.data<float>(), v.data<float>(), param.numel(), m_ctx->stream),
                 "adam update");
}

Status CudaBackend::rmspropUpdate(const RmspropParams& p, Tensor& param, const Tensor& grad, Tensor& ms, Tensor& mom,
                                  Tensor& mg)
{
    TS_ASSERT(isGpuF32(param) && isGpuF32(grad) && isGpuF32(ms));
    TS_ASSERT(p.momentum <= 0.0f || isGpuF32(mom));
    TS_ASSERT(!p.centered || isGpuF32(mg));
    return check(cudak::rmspropUpdate(p.lr, p.rho, p.momentum, p.epsilon, p.centered, param.data<float>(),
                                      grad.data<float>(), ms.data<float>(), fptr(mom), fptr(mg), param.numel(),
                                      m_ctx->stream),
                 "rmsprop update");
}

Status CudaBackend::sumSquares(const Tensor& x, double* out)
{
    TS_ASSERT(isGpuF32(x) && out);
    const int blocks = cudak::sumSquaresBlocks(x.numel());
    TS_ASSIGN(Tensor part, scratch(Shape{int64_t(blocks) * 8}, DType::U8));
    TS_TRY(check(cudak::sumSquares(x.data<float>(), x.numel(), static_cast<double*>(part.raw()), m_ctx->stream),
                 "sum of squares"));
    std::vector<double> host(static_cast<std::size_t>(blocks));
    TS_TRY(copyToHost(part, host.data()));
    double acc = 0;
    for (double v : host) acc += v;
    *out = acc;
    return okStatus();
}

// ---------------------------------------------------------------- copies

Status CudaBackend::copyFromHost(const void* src, Tensor& dst)
{
    TS_ASSERT(dst.defined());
    if (dst.bytes() == 0) return okStatus();
    if (dst.hostAccessible()) {
        std::memcpy(dst.raw(), src, dst.bytes());
        return okStatus();
    }
    const std::size_t bytes = dst.bytes();
    constexpr std::size_t kStageMin = 64 * 1024;  // below this the pageable path costs as little
    if (bytes >= kStageMin) {
        Staging& st = m_staging[m_nextStaging];
        m_nextStaging ^= 1;
        if (st.done) TS_TRY(check(cudaEventSynchronize(st.done), "waiting for a staging buffer"));
        else TS_TRY(check(cudaEventCreateWithFlags(&st.done, cudaEventDisableTiming), "cudaEventCreate"));
        if (st.capacity < bytes) {
            if (st.host) cudaFreeHost(st.host);
            st.host = nullptr;
            st.capacity = 0;
            if (cudaMallocHost(&st.host, bytes) == cudaSuccess) st.capacity = bytes;
            else (void)cudaGetLastError();  // no pinned memory to spare: the pageable path below
        }
        if (st.host) {
            std::memcpy(st.host, src, bytes);
            TS_TRY(check(cudaMemcpyAsync(dst.raw(), st.host, bytes, cudaMemcpyHostToDevice, m_ctx->stream),
                         "host-to-device copy"));
            return check(cudaEventRecord(st.done, m_ctx->stream), "cudaEventRecord");
        }
    }
    // Pageable source: the call returns once the bytes are staged, so the caller may reuse `src`.
    return check(cudaMemcpyAsync(dst.raw(), src, bytes, cudaMemcpyHostToDevice, m_ctx->stream), "host-to-device copy");
}

Status CudaBackend::copyToHost(const Tensor& src, void* dst)
{
    TS_ASSERT(src.defined());
    if (src.bytes() == 0) return okStatus();
    if (src.hostAccessible()) {
        TS_TRY(synchronize());  // queued kernels never write host tensors, but keep the order obvious
        std::memcpy(dst, src.raw(), src.bytes());
        return okStatus();
    }
    TS_TRY(check(cudaMemcpyAsync(dst, src.raw(), src.bytes(), cudaMemcpyDeviceToHost, m_ctx->stream),
                 "device-to-host copy"));
    return synchronize();
}

} // namespace ts::cuda
