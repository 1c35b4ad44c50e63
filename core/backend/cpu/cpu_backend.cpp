#include "backend/cpu/cpu_backend.h"

#include <omp.h>

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <unordered_map>

#include "backend/cpu/cpu_kernels.h"
#include "backend/registry.h"

namespace ts {

namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;
using dims = dnnl::memory::dims;

// Cache key: op id followed by the shapes and parameters that make a primitive unique.
struct Key {
    std::array<int64_t, 24> v{};
    int n = 0;
    Key& operator<<(int64_t x)
    {
        TS_ASSERT(n < static_cast<int>(v.size()));
        v[static_cast<std::size_t>(n++)] = x;
        return *this;
    }
    Key& operator<<(float x)
    {
        uint32_t bits;
        std::memcpy(&bits, &x, sizeof bits);
        return *this << static_cast<int64_t>(bits);
    }
    bool operator==(const Key& o) const { return n == o.n && std::equal(v.begin(), v.begin() + n, o.v.begin()); }
};

struct KeyHash {
    std::size_t operator()(const Key& k) const
    {
        uint64_t h = 1469598103934665603ull;
        for (int i = 0; i < k.n; ++i) h = (h ^ static_cast<uint64_t>(k.v[static_cast<std::size_t>(i)])) * 1099511628211ull;
        return static_cast<std::size_t>(h);
    }
};

enum PrimOp : int64_t {
    kDenseFwd = 1,
    kDenseDx,
    kDenseDw,
    kConvFwd,
    kConvBwdData,
    kConvBwdWeights,
    kBnFwd,
    kBnBwd,
    kEltFwd,
    kEltBwd,
    kSoftmaxFwd,
    kSoftmaxBwd,
};

// A cached primitive with its argument memories (created without buffers; the data handles are
// set on every call, which is cheap).
struct Prim {
    dnnl::primitive prim;
    std::unordered_map<int, dnnl::memory> args;
    std::size_t scratchpadBytes = 0;
    // When oneDNN runs faster on its own (blocked) weights layout: the caller's HWIO buffer is
    // reordered into `internal` before the run (inputs) or from it after the run (outputs).
    int convertArg = 0;  // 0: none
    bool convertAfter = false;
    dnnl::memory user, internal;
    dnnl::reorder convert;
};

[[maybe_unused]] bool isHostF32(const Tensor& t) { return t.defined() && t.hostAccessible() && t.dtype() == DType::F32; }
int64_t lastDim(const Tensor& t) { return t.shape().rank() == 0 ? 1 : t.shape()[-1]; }
const float* cf(const Tensor& t) { return t.data<float>(); }
float* mf(const Tensor& t) { return t.data<float>(); }

// Split [0, n) over the instance's threads when each gets at least `grain` items; chunk starts
// are multiples of `align` so vector loops stay aligned to their tails.
template <class F>
void parallelFor(int64_t n, int64_t grain, int64_t align, F&& f)
{
    const int maxThreads = omp_get_max_threads();
    const int64_t want = grain > 0 ? n / grain : 1;
    const int threads = static_cast<int>(std::min<int64_t>(maxThreads, want));
    if (threads <= 1 || omp_in_parallel()) {
        if (n > 0) f(int64_t(0), n);
        return;
    }
#pragma omp parallel num_threads(threads)
    {
        const int64_t t = omp_get_thread_num(), T = omp_get_num_threads();
        auto cut = [&](int64_t i) {
            if (i >= T) return n;
            return std::min(n, (n * i / T) / align * align);
        };
        const int64_t b = cut(t), e = cut(t + 1);
        if (e > b) f(b, e);
    }
}

// floatToBf16Bits and roundToDType(BF16) over the instance's threads.
void toBf16(const float* in, uint16_t* out, int64_t n)
{
    parallelFor(n, 1 << 14, 16, [&](int64_t b, int64_t e) { floatToBf16Bits(in + b, out + b, e - b); });
}

void roundBf16InPlace(float* p, int64_t n)
{
    parallelFor(n, 1 << 14, 16, [&](int64_t b, int64_t e) { roundToDType(p + b, p + b, e - b, DType::BF16); });
}

// oneDNN 2.6 runs bf16 matmuls and convolutions natively from AVX512-BF16 on (and emulates
// them, slower than f32, below it): only then is the native path worth taking.
bool nativeBf16()
{
    static const bool yes = [] {
        if (std::getenv("TS_CPU_EMULATE_BF16")) return false;  // diagnostic: round around f32 kernels
        const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
        const auto bf16 = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
        return (isa & bf16) == bf16;
    }();
    return yes;
}

// Convolutions in bf16 run natively everywhere, first layers too: oneDNN's bf16 kernels beat the
// own f32 direct kernel on rounded copies there (CNN bench: about 9% more samples/s).
bool nativeConvBf16(DType t) { return t == DType::BF16 && nativeBf16(); }

std::string readFirstLine(const char* path, const char* prefix)
{
    std::ifstream in(path);
    std::string line;
    const std::size_t len = std::strlen(prefix);
    while (std::getline(in, line))
        if (line.compare(0, len, prefix) == 0) return line;
    return {};
}

// "MemTotal:  24554464 kB" -> bytes
uint64_t meminfoBytes(const char* field)
{
    const std::string line = readFirstLine("/proc/meminfo", field);
    if (line.empty()) return 0;
    const std::size_t colon = line.find(':');
    if (colon == std::string::npos) return 0;
    return std::strtoull(line.c_str() + colon + 1, nullptr, 10) * 1024ull;
}

constexpr std::size_t kMaxCachedPrimitives = 512;

// Temporary buffer slots of an instance (each op uses its slots only while it runs).
enum TempSlot : std::size_t {
    kTempOnes,       // batch norm: scale 1 when gamma is undefined
    kTempZeros,      // batch norm: shift 0
    kTempMean,       // batch norm: mean when saveMean is undefined
    kTempVar,        // batch norm: variance
    kTempDGamma,     // batch norm backward: dgamma when undefined
    kTempDBeta,      // batch norm backward: dbeta when undefined
    kTempPartials,   // convolution backward weights: per-thread partial sums
    kTempFlipped,    // convolution backward data: flipped, transposed kernel
    kTempBf16A,      // bf16 compute: the first operand in bf16
    kTempBf16B,      // bf16 compute: the second operand in bf16
    kTempBf16C,      // bf16 compute: a third (dense backward: the weights)
    kTempRounded,    // bf16 compute: the bias, or dY for the bias gradient, rounded to bf16 values
    kTempSlots
};

} // namespace

std::string cpuModelName()
{
    std::string line = readFirstLine("/proc/cpuinfo", "model name");
    const std::size_t colon = line.find(':');
    if (colon == std::string::npos) return "CPU";
    std::string name = line.substr(colon + 1);
    const std::size_t b = name.find_first_not_of(" \t");
    const std::size_t e = name.find_last_not_of(" \t");
    return b == std::string::npos ? "CPU" : name.substr(b, e - b + 1);
}

int cpuHardwareThreads()
{
    const unsigned n = std::thread::hardware_concurrency();
    return n == 0 ? 1 : static_cast<int>(n);
}

// ====================================================================== Impl

struct CpuBackend::Impl {
    int deviceIndex = 0;
    int threads = 1;
    dnnl::engine engine;
    dnnl::stream stream;
    std::unordered_map<Key, Prim, KeyHash> prims;

    // One scratchpad shared by all primitives of this instance (they run one at a time).
    void* scratch = nullptr;
    std::size_t scratchBytes = 0;
    // Temporaries, by slot (see kTemp*).
    std::array<std::vector<float>, kTempSlots> temps;
    // Own register-tiled convolutions instead of oneDNN's (machines without AVX-512).
    bool tiledConv = cpuk::tiledConvPreferred() && !std::getenv("TS_CPU_ONEDNN_CONV");

    // Telemetry: /proc/stat deltas between samples.
    mutable std::mutex sampleMutex;
    mutable uint64_t lastBusy = 0, lastTotal = 0;

    ~Impl() { std::free(scratch); }

    std::string where() const { return "cpu:" + std::to_string(deviceIndex); }

    void ensureThreads() const
    {
        if (omp_get_max_threads() != threads) omp_set_num_threads(threads);
    }

    void* scratchpad(std::size_t bytes)
    {
        if (bytes > scratchBytes) {
            std::free(scratch);
            const std::size_t rounded = (bytes + 4095) / 4096 * 4096;
            scratch = std::aligned_alloc(64, rounded);
            if (!scratch) {
                scratchBytes = 0;
                throw std::bad_alloc();
            }
            scratchBytes = rounded;
        }
        return scratch;
    }

    float* temp(std::size_t slot, int64_t n)
    {
        auto& t = temps[slot];
        if (t.size() < static_cast<std::size_t>(n)) t.resize(static_cast<std::size_t>(n));
        return t.data();
    }

    // A bias rounded to bf16 values (it is an operand too), or null without one.
    const float* bf16Bias(const Tensor& b)
    {
        if (!b.defined()) return nullptr;
        float* out = temp(kTempRounded, b.numel());
        roundToDType(cf(b), out, b.numel(), DType::BF16);
        return out;
    }

    // `x` in bf16, in temporary slot `slot`.
    const uint16_t* bf16Copy(std::size_t slot, const Tensor& x)
    {
        auto* out = reinterpret_cast<uint16_t*>(temp(slot, (x.numel() + 1) / 2));
        toBf16(cf(x), out, x.numel());
        return out;
    }

    // A native bf16 forward (matmul or convolution primitive `p`): x and w in bf16, the bias
    // rounded, y written in f32 and rounded to bf16's values (what a 16-bit layer outputs).
    void bf16Forward(Prim& p, const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y)
    {
        const uint16_t* xb = bf16Copy(kTempBf16A, x);
        const uint16_t* wb = bf16Copy(kTempBf16B, w);
        if (const float* bias = bf16Bias(b))
            run(p, {{DNNL_ARG_SRC, xb}, {DNNL_ARG_WEIGHTS, wb}, {DNNL_ARG_BIAS, bias}, {DNNL_ARG_DST, y.raw()}});
        else
            run(p, {{DNNL_ARG_SRC, xb}, {DNNL_ARG_WEIGHTS, wb}, {DNNL_ARG_DST, y.raw()}});
        roundBf16InPlace(mf(y), y.numel());
    }

    dnnl::primitive_attr attr() const
    {
        dnnl::primitive_attr a;
        a.set_scratchpad_mode(dnnl::scratchpad_mode::user);
        return a;
    }

    // Registers a built primitive: one memory per (arg, desc), plus the scratchpad.
    Prim& store(const Key& key, dnnl::primitive prim, const dnnl::primitive_desc_base& pd,
                std::initializer_list<std::pair<int, dnnl::memory::desc>> args)
    {
        // Shapes seen by a run are few (train, eval and last partial batches); a model fed many
        // distinct shapes would otherwise grow the cache without bound.
        if (prims.size() >= kMaxCachedPrimitives) prims.clear();
        Prim p;
        p.prim = std::move(prim);
        for (const auto& [arg, md] : args) p.args.emplace(arg, dnnl::memory(md, engine, DNNL_MEMORY_NONE));
        const dnnl::memory::desc sp = pd.scratchpad_desc();
        p.scratchpadBytes = sp.get_size();
        if (p.scratchpadBytes) p.args.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(sp, engine, DNNL_MEMORY_NONE));
        return prims.emplace(key, std::move(p)).first->second;
    }

    Prim* find(const Key& key)
    {
        auto it = prims.find(key);
        return it == prims.end() ? nullptr : &it->second;
    }

    // Makes `arg` of a stored primitive go through a reorder between the caller's layout and
    // the one the primitive chose (no-op when they are the same).
    void convertLayout(Prim& p, int arg, const dnnl::memory::desc& userMd, bool after)
    {
        const dnnl::memory::desc internalMd = p.args.at(arg).get_desc();
        if (internalMd == userMd) return;
        p.convertArg = arg;
        p.convertAfter = after;
        p.user = dnnl::memory(userMd, engine, DNNL_MEMORY_NONE);
        p.internal = dnnl::memory(internalMd, engine);  // owns its buffer
        p.args[arg] = p.internal;
        p.convert = after ? dnnl::reorder(p.internal, p.user) : dnnl::reorder(p.user, p.internal);
    }

    void run(Prim& p, std::initializer_list<std::pair<int, const void*>> handles)
    {
        for (const auto& [arg, ptr] : handles) {
            if (arg == p.convertArg) p.user.set_data_handle(const_cast<void*>(ptr));
            else p.args.at(arg).set_data_handle(const_cast<void*>(ptr));
        }
        if (p.scratchpadBytes) p.args.at(DNNL_ARG_SCRATCHPAD).set_data_handle(scratchpad(p.scratchpadBytes));
        if (p.convertArg && !p.convertAfter) p.convert.execute(stream, p.user, p.internal);
        p.prim.execute(stream, p.args);
        if (p.convertArg && p.convertAfter) p.convert.execute(stream, p.internal, p.user);
        stream.wait();
    }

    template <class F>
    Status guard(const char* op, F&& f)
    {
        ensureThreads();
        try {
            return f();
        } catch (const dnnl::error& e) {
            return makeError(ErrorCode::Internal, where() + ": oneDNN " + op + " failed: " + e.what(),
                             "this shape or parameter combination may be unsupported by oneDNN 2.6; "
                             "run with ONEDNN_VERBOSE=1 for details, or use the reference backend");
        } catch (const std::bad_alloc&) {
            return makeError(ErrorCode::OutOfMemory, where() + ": out of memory in " + std::string(op),
                             "reduce the batch size or the model size");
        }
    }

    // ---- primitives

    // `in`: the operands' type (f32, or bf16 for mixed_bfloat16); results and bias are f32.
    Prim& denseFwd(int64_t n, int64_t in, int64_t out, bool bias, bool relu, dt inT = dt::f32)
    {
        Key key;
        key << int64_t(kDenseFwd) << n << in << out << int64_t(bias) << int64_t(relu) << int64_t(inT);
        if (Prim* p = find(key)) return *p;
        const dnnl::memory::desc src({n, in}, inT, tag::ab), wei({in, out}, inT, tag::ab),
            bia({1, out}, dt::f32, tag::ab), dst({n, out}, dt::f32, tag::ab);
        dnnl::primitive_attr a = attr();
        if (relu) {
            dnnl::post_ops po;
            po.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
            a.set_post_ops(po);
        }
        const auto desc = bias ? dnnl::matmul::desc(src, wei, bia, dst) : dnnl::matmul::desc(src, wei, dst);
        const dnnl::matmul::primitive_desc pd(desc, a, engine);
        if (bias)
            return store(key, dnnl::matmul(pd), pd,
                         {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_BIAS, bia}, {DNNL_ARG_DST, dst}});
        return store(key, dnnl::matmul(pd), pd, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}});
    }

    // dX (n, in) = dY (n, out) @ W^T, W^T read through strides (W is (in, out) row-major).
    Prim& denseDx(int64_t n, int64_t in, int64_t out, dt inT = dt::f32)
    {
        Key key;
        key << int64_t(kDenseDx) << n << in << out << int64_t(inT);
        if (Prim* p = find(key)) return *p;
        const dnnl::memory::desc src({n, out}, inT, tag::ab), wei({out, in}, inT, tag::ba),
            dst({n, in}, dt::f32, tag::ab);
        const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src, wei, dst), attr(), engine);
        return store(key, dnnl::matmul(pd), pd, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}});
    }

    // dW (in, out) (+)= X^T @ dY, X^T read through strides.
    Prim& denseDw(int64_t n, int64_t in, int64_t out, bool accumulate, dt inT = dt::f32)
    {
        Key key;
        key << int64_t(kDenseDw) << n << in << out << int64_t(accumulate) << int64_t(inT);
        if (Prim* p = find(key)) return *p;
        const dnnl::memory::desc src({in, n}, inT, tag::ba), wei({n, out}, inT, tag::ab),
            dst({in, out}, dt::f32, tag::ab);
        dnnl::primitive_attr a = attr();
        if (accumulate) {
            dnnl::post_ops po;
            po.append_sum(1.0f);
            a.set_post_ops(po);
        }
        const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src, wei, dst), a, engine);
        return store(key, dnnl::matmul(pd), pd, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}});
    }

    struct ConvShape {
        int64_t N, H, W, C, KH, KW, F, OH, OW;
        Conv2dParams p;
        dt in = dt::f32;  // the operands' type (bf16 for mixed_bfloat16); results are f32
        Key key(int64_t op, bool bias) const
        {
            Key k;
            k << op << N << H << W << C << KH << KW << F << OH << OW << int64_t(p.strideH) << int64_t(p.strideW)
              << int64_t(p.padTop) << int64_t(p.padBottom) << int64_t(p.padLeft) << int64_t(p.padRight)
              << int64_t(bias) << int64_t(in);
            return k;
        }
        cpuk::ConvGeom geom() const
        {
            return {N, H, W, C, KH, KW, F, OH, OW, p.strideH, p.strideW, p.padTop, p.padLeft};
        }
        dnnl::memory::desc src(dt t = dt::f32) const { return {{N, C, H, W}, t, tag::nhwc}; }
        dnnl::memory::desc wei(dt t = dt::f32) const { return {{F, C, KH, KW}, t, tag::hwio}; }
        // Weights: let oneDNN choose (the jit kernels want blocked weights; activations stay
        // NHWC, which they read directly). The reorder of the small weight tensor is cheap.
        dnnl::memory::desc weiAny(dt t = dt::f32) const { return {{F, C, KH, KW}, t, tag::any}; }
        dnnl::memory::desc bia() const { return {{F}, dt::f32, tag::a}; }
        dnnl::memory::desc dst(dt t = dt::f32) const { return {{N, F, OH, OW}, t, tag::nhwc}; }
        dims strides() const { return {p.strideH, p.strideW}; }
        dims padL() const { return {p.padTop, p.padLeft}; }
        dims padR() const { return {p.padBottom, p.padRight}; }
        dnnl::convolution_forward::primitive_desc fwdPd(const dnnl::engine& eng, const dnnl::primitive_attr& a,
                                                        bool bias) const
        {
            const auto d = bias ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training,
                                                                  dnnl::algorithm::convolution_direct, src(in), weiAny(in),
                                                                  bia(), dst(), strides(), padL(), padR())
                                : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training,
                                                                  dnnl::algorithm::convolution_direct, src(in), weiAny(in),
                                                                  dst(), strides(), padL(), padR());
            return dnnl::convolution_forward::primitive_desc(d, a, eng);
        }
    };

    Prim& convFwd(const ConvShape& s, bool bias)
    {
        const Key key = s.key(kConvFwd, bias);
        if (Prim* p = find(key)) return *p;
        const auto pd = s.fwdPd(engine, attr(), bias);
        Prim& p = bias ? store(key, dnnl::convolution_forward(pd), pd,
                               {{DNNL_ARG_SRC, s.src(s.in)}, {DNNL_ARG_WEIGHTS, pd.weights_desc()},
                                {DNNL_ARG_BIAS, s.bia()}, {DNNL_ARG_DST, s.dst()}})
                       : store(key, dnnl::convolution_forward(pd), pd,
                               {{DNNL_ARG_SRC, s.src(s.in)}, {DNNL_ARG_WEIGHTS, pd.weights_desc()}, {DNNL_ARG_DST, s.dst()}});
        convertLayout(p, DNNL_ARG_WEIGHTS, s.wei(s.in), false);
        return p;
    }

    Prim& convBwdData(const ConvShape& s)
    {
        const Key key = s.key(kConvBwdData, false);
        if (Prim* p = find(key)) return *p;
        const auto hint = s.fwdPd(engine, attr(), false);
        const dnnl::convolution_backward_data::desc d(dnnl::algorithm::convolution_direct, s.src(), s.weiAny(s.in),
                                                      s.dst(s.in), s.strides(), s.padL(), s.padR());
        const dnnl::convolution_backward_data::primitive_desc pd(d, attr(), engine, hint);
        Prim& p = store(key, dnnl::convolution_backward_data(pd), pd,
                        {{DNNL_ARG_DIFF_DST, s.dst(s.in)}, {DNNL_ARG_WEIGHTS, pd.weights_desc()}, {DNNL_ARG_DIFF_SRC, s.src()}});
        convertLayout(p, DNNL_ARG_WEIGHTS, s.wei(s.in), false);
        return p;
    }

    Prim& convBwdWeights(const ConvShape& s, bool bias)
    {
        const Key key = s.key(kConvBwdWeights, bias);
        if (Prim* p = find(key)) return *p;
        const auto hint = s.fwdPd(engine, attr(), bias);
        const auto d = bias ? dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, s.src(s.in),
                                                                       s.weiAny(), s.bia(), s.dst(s.in), s.strides(),
                                                                       s.padL(), s.padR())
                            : dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, s.src(s.in),
                                                                       s.weiAny(), s.dst(s.in), s.strides(), s.padL(),
                                                                       s.padR());
        const dnnl::convolution_backward_weights::primitive_desc pd(d, attr(), engine, hint);
        Prim& p = bias ? store(key, dnnl::convolution_backward_weights(pd), pd,
                               {{DNNL_ARG_SRC, s.src(s.in)}, {DNNL_ARG_DIFF_DST, s.dst(s.in)},
                                {DNNL_ARG_DIFF_WEIGHTS, pd.diff_weights_desc()}, {DNNL_ARG_DIFF_BIAS, s.bia()}})
                       : store(key, dnnl::convolution_backward_weights(pd), pd,
                               {{DNNL_ARG_SRC, s.src(s.in)}, {DNNL_ARG_DIFF_DST, s.dst(s.in)},
                                {DNNL_ARG_DIFF_WEIGHTS, pd.diff_weights_desc()}});
        convertLayout(p, DNNL_ARG_DIFF_WEIGHTS, s.wei(), true);
        return p;
    }

    // Batch norm sees channels-last (M, C) data as NHWC (M, C, 1, 1), which the jit kernels take.
    static dnnl::memory::desc bnData(int64_t M, int64_t C) { return {{M, C, 1, 1}, dt::f32, tag::nhwc}; }
    static dnnl::memory::desc bnVec(int64_t C) { return {{C}, dt::f32, tag::a}; }

    dnnl::batch_normalization_forward::primitive_desc bnFwdPd(int64_t M, int64_t C, float eps, bool training)
    {
        auto flags = dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift;
        if (!training) flags = flags | dnnl::normalization_flags::use_global_stats;
        const dnnl::batch_normalization_forward::desc d(
            training ? dnnl::prop_kind::forward_training : dnnl::prop_kind::forward_inference, bnData(M, C), eps, flags);
        return dnnl::batch_normalization_forward::primitive_desc(d, attr(), engine);
    }

    Prim& bnFwd(int64_t M, int64_t C, float eps, bool training)
    {
        Key key;
        key << int64_t(kBnFwd) << M << C << eps << int64_t(training);
        if (Prim* p = find(key)) return *p;
        const auto pd = bnFwdPd(M, C, eps, training);
        return store(key, dnnl::batch_normalization_forward(pd), pd,
                     {{DNNL_ARG_SRC, bnData(M, C)}, {DNNL_ARG_DST, bnData(M, C)}, {DNNL_ARG_MEAN, bnVec(C)},
                      {DNNL_ARG_VARIANCE, bnVec(C)}, {DNNL_ARG_SCALE, bnVec(C)}, {DNNL_ARG_SHIFT, bnVec(C)}});
    }

    Prim& bnBwd(int64_t M, int64_t C, float eps)
    {
        Key key;
        key << int64_t(kBnBwd) << M << C << eps;
        if (Prim* p = find(key)) return *p;
        const auto hint = bnFwdPd(M, C, eps, true);
        const dnnl::batch_normalization_backward::desc d(
            dnnl::prop_kind::backward, bnData(M, C), bnData(M, C), eps,
            dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift);
        const dnnl::batch_normalization_backward::primitive_desc pd(d, attr(), engine, hint);
        return store(key, dnnl::batch_normalization_backward(pd), pd,
                     {{DNNL_ARG_SRC, bnData(M, C)}, {DNNL_ARG_DIFF_DST, bnData(M, C)}, {DNNL_ARG_MEAN, bnVec(C)},
                      {DNNL_ARG_VARIANCE, bnVec(C)}, {DNNL_ARG_SCALE, bnVec(C)}, {DNNL_ARG_SHIFT, bnVec(C)},
                      {DNNL_ARG_DIFF_SRC, bnData(M, C)},
                      {DNNL_ARG_DIFF_SCALE, bnVec(C)}, {DNNL_ARG_DIFF_SHIFT, bnVec(C)}});
    }

    static dnnl::algorithm eltAlg(Activation act, bool useDst)
    {
        // Relu and LeakyRelu run as own loops (a select is cheaper than a primitive call).
        switch (act) {
        case Activation::Gelu: return dnnl::algorithm::eltwise_gelu_erf;
        case Activation::Sigmoid:
            return useDst ? dnnl::algorithm::eltwise_logistic_use_dst_for_bwd : dnnl::algorithm::eltwise_logistic;
        case Activation::Tanh: return useDst ? dnnl::algorithm::eltwise_tanh_use_dst_for_bwd : dnnl::algorithm::eltwise_tanh;
        case Activation::Relu:
        case Activation::LeakyRelu:
        case Activation::Linear:
        case Activation::Softmax: break;
        }
        TS_ASSERT(false);
        return dnnl::algorithm::eltwise_linear;
    }

    dnnl::eltwise_forward::primitive_desc eltFwdPd(dnnl::algorithm alg, float alpha, int64_t n)
    {
        const dnnl::memory::desc md({n}, dt::f32, tag::a);
        const dnnl::eltwise_forward::desc d(dnnl::prop_kind::forward_training, alg, md, alpha, 0.0f);
        return dnnl::eltwise_forward::primitive_desc(d, attr(), engine);
    }

    Prim& eltFwd(dnnl::algorithm alg, float alpha, int64_t n)
    {
        Key key;
        key << int64_t(kEltFwd) << int64_t(alg) << alpha << n;
        if (Prim* p = find(key)) return *p;
        const auto pd = eltFwdPd(alg, alpha, n);
        const dnnl::memory::desc md({n}, dt::f32, tag::a);
        return store(key, dnnl::eltwise_forward(pd), pd, {{DNNL_ARG_SRC, md}, {DNNL_ARG_DST, md}});
    }

    Prim& eltBwd(dnnl::algorithm alg, float alpha, int64_t n, bool useDst)
    {
        Key key;
        key << int64_t(kEltBwd) << int64_t(alg) << alpha << n;
        if (Prim* p = find(key)) return *p;
        const auto hint = eltFwdPd(alg, alpha, n);
        const dnnl::memory::desc md({n}, dt::f32, tag::a);
        const dnnl::eltwise_backward::desc d(alg, md, md, alpha, 0.0f);
        const dnnl::eltwise_backward::primitive_desc pd(d, attr(), engine, hint);
        return store(key, dnnl::eltwise_backward(pd), pd,
                     {{useDst ? DNNL_ARG_DST : DNNL_ARG_SRC, md}, {DNNL_ARG_DIFF_DST, md}, {DNNL_ARG_DIFF_SRC, md}});
    }

    dnnl::softmax_forward::primitive_desc softmaxFwdPd(int64_t rows, int64_t cols)
    {
        const dnnl::memory::desc md({rows, cols}, dt::f32, tag::ab);
        const dnnl::softmax_forward::desc d(dnnl::prop_kind::forward_training, md, 1);
        return dnnl::softmax_forward::primitive_desc(d, attr(), engine);
    }

    Prim& softmaxFwd(int64_t rows, int64_t cols)
    {
        Key key;
        key << int64_t(kSoftmaxFwd) << rows << cols;
        if (Prim* p = find(key)) return *p;
        const auto pd = softmaxFwdPd(rows, cols);
        const dnnl::memory::desc md({rows, cols}, dt::f32, tag::ab);
        return store(key, dnnl::softmax_forward(pd), pd, {{DNNL_ARG_SRC, md}, {DNNL_ARG_DST, md}});
    }

    Prim& softmaxBwd(int64_t rows, int64_t cols)
    {
        Key key;
        key << int64_t(kSoftmaxBwd) << rows << cols;
        if (Prim* p = find(key)) return *p;
        const auto hint = softmaxFwdPd(rows, cols);
        const dnnl::memory::desc md({rows, cols}, dt::f32, tag::ab);
        const dnnl::softmax_backward::desc d(md, md, 1);
        const dnnl::softmax_backward::primitive_desc pd(d, attr(), engine, hint);
        return store(key, dnnl::softmax_backward(pd), pd,
                     {{DNNL_ARG_DST, md}, {DNNL_ARG_DIFF_DST, md}, {DNNL_ARG_DIFF_SRC, md}});
    }
};

// ====================================================================== basics

CpuBackend::CpuBackend(int deviceIndex, const BackendOptions& options) : m_d(std::make_unique<Impl>())
{
    m_d->deviceIndex = deviceIndex;
    m_d->threads = std::max(1, options.threads);
    m_d->engine = dnnl::engine(dnnl::engine::kind::cpu, 0);
    m_d->stream = dnnl::stream(m_d->engine);
}

CpuBackend::~CpuBackend() = default;

Device CpuBackend::device() const { return Device{DeviceKind::Cpu, m_d->deviceIndex}; }

int CpuBackend::threads() const { return m_d->threads; }

DeviceInfo CpuBackend::info() const
{
    DeviceInfo d;
    d.device = device();
    d.name = device().toString() + " (" + cpuModelName() + ", " + std::to_string(m_d->threads) +
             (m_d->threads == 1 ? " thread)" : " threads)");
    d.memoryTotal = meminfoBytes("MemTotal");
    d.memoryFree = meminfoBytes("MemAvailable");
    return d;
}

bool CpuBackend::supportsOp(OpKind op) const { return op != OpKind::Count_; }

// 16-bit compute rounds the operands and results around the f32 kernels (computeRounded).
bool CpuBackend::supportsComputeType(DType t) const
{
    return t == DType::F32 || t == DType::F16 || t == DType::BF16;
}

Allocator& CpuBackend::allocator() { return hostAllocator(); }

void CpuBackend::bindThread() { omp_set_num_threads(m_d->threads); }

DeviceSample CpuBackend::sample() const
{
    DeviceSample s;
    s.memoryTotal = meminfoBytes("MemTotal");
    const uint64_t avail = meminfoBytes("MemAvailable");
    s.memoryUsed = s.memoryTotal > avail ? s.memoryTotal - avail : 0;
    // Whole-host CPU utilisation since the previous sample ("cpu" line of /proc/stat).
    const std::string line = readFirstLine("/proc/stat", "cpu ");
    if (!line.empty()) {
        std::vector<uint64_t> f;
        const char* p = line.c_str() + 3;
        char* end = nullptr;
        for (;;) {
            const uint64_t v = std::strtoull(p, &end, 10);
            if (end == p) break;
            f.push_back(v);
            p = end;
        }
        if (f.size() >= 4) {
            uint64_t total = 0;
            for (uint64_t v : f) total += v;
            const uint64_t idle = f[3] + (f.size() > 4 ? f[4] : 0);  // idle + iowait
            const uint64_t busy = total - idle;
            std::lock_guard lock(m_d->sampleMutex);
            if (m_d->lastTotal && total > m_d->lastTotal)
                s.utilisation = double(busy - m_d->lastBusy) / double(total - m_d->lastTotal);
            m_d->lastBusy = busy;
            m_d->lastTotal = total;
        }
    }
    return s;
}

// ====================================================================== GEMM / dense

Status CpuBackend::gemm(const Tensor& a, bool transA, const Tensor& b, bool transB, Tensor& c, float alpha,
                        float beta)
{
    TS_ASSERT(isHostF32(a) && isHostF32(b) && isHostF32(c));
    TS_ASSERT(a.shape().rank() == 2 && b.shape().rank() == 2 && c.shape().rank() == 2);
    const int64_t M = c.shape()[0], N = c.shape()[1];
    const int64_t K = transA ? a.shape()[0] : a.shape()[1];
    TS_ASSERT((transA ? a.shape()[1] : a.shape()[0]) == M);
    TS_ASSERT((transB ? b.shape()[1] : b.shape()[0]) == K);
    TS_ASSERT((transB ? b.shape()[0] : b.shape()[1]) == N);
    m_d->ensureThreads();
    if (M == 0 || N == 0) return okStatus();
    if (K == 0) {
        // Nothing to multiply: C = beta * C (beta == 0 never reads C).
        if (beta == 0.0f) std::fill(mf(c), mf(c) + c.numel(), 0.0f);
        else cpuk::scale(beta, mf(c), c.numel());
        return okStatus();
    }
    // oneDNN's sgemm is row-major; beta == 0 does not read C.
    const dnnl_status_t st = dnnl_sgemm(transA ? 'T' : 'N', transB ? 'T' : 'N', M, N, K, alpha, cf(a),
                                        a.shape()[1], cf(b), b.shape()[1], beta, mf(c), N);
    if (st != dnnl_success)
        return makeError(ErrorCode::Internal,
                         m_d->where() + ": oneDNN sgemm failed (status " + std::to_string(int(st)) + ") for " +
                             std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K),
                         "use the reference backend for this model and report the shapes");
    return okStatus();
}

Status CpuBackend::denseForward(const Tensor& x, const Tensor& w, const Tensor& b, Activation act, Tensor& y)
{
    TS_ASSERT(isHostF32(x) && isHostF32(w) && isHostF32(y));
    TS_ASSERT(act == Activation::Linear || act == Activation::Relu);
    const int64_t in = w.shape()[0], out = w.shape()[1];
    const int64_t n = in == 0 ? 0 : x.numel() / in;
    TS_ASSERT(y.numel() == n * out && (!b.defined() || b.numel() == out));
    if (m_computeType != DType::F32) {
        if (m_computeType == DType::BF16 && nativeBf16() && n > 0 && in > 0 && out > 0)
            return denseForwardBf16(x, w, b, act, y, n, in, out);
        // f16, bf16 without AVX512-BF16, and empty shapes: rounded operands around the f32 path.
        return computeRounded({x, w, b}, {y}, [&](const std::vector<Tensor>& r) { return denseForward(r[0], r[1], r[2], act, y); });
    }
    return m_d->guard("dense forward (matmul)", [&]() -> Status {
        if (n == 0 || out == 0) return okStatus();
        const bool relu = act == Activation::Relu;
        if (in == 0) {
            for (int64_t r = 0; r < n; ++r)
                for (int64_t o = 0; o < out; ++o) {
                    const float v = b.defined() ? cf(b)[o] : 0.0f;
                    mf(y)[r * out + o] = relu && !(v > 0) ? 0.0f : v;
                }
            return okStatus();
        }
        Prim& p = m_d->denseFwd(n, in, out, b.defined(), relu);
        if (b.defined())
            m_d->run(p, {{DNNL_ARG_SRC, x.raw()}, {DNNL_ARG_WEIGHTS, w.raw()}, {DNNL_ARG_BIAS, b.raw()},
                         {DNNL_ARG_DST, y.raw()}});
        else
            m_d->run(p, {{DNNL_ARG_SRC, x.raw()}, {DNNL_ARG_WEIGHTS, w.raw()}, {DNNL_ARG_DST, y.raw()}});
        return okStatus();
    });
}

Status CpuBackend::denseBackward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& dx, Tensor& dw,
                                 Tensor& db, bool accumulate)
{
    TS_ASSERT(isHostF32(x) && isHostF32(w) && isHostF32(dy));
    const int64_t in = w.shape()[0], out = w.shape()[1];
    const int64_t n = in == 0 ? 0 : x.numel() / in;
    TS_ASSERT(dy.numel() == n * out);
    TS_ASSERT(!dx.defined() || (isHostF32(dx) && dx.numel() == n * in));
    TS_ASSERT(!dw.defined() || (isHostF32(dw) && dw.numel() == in * out));
    TS_ASSERT(!db.defined() || (isHostF32(db) && db.numel() == out));
    if (m_computeType != DType::F32) {
        if (m_computeType == DType::BF16 && nativeBf16() && n > 0 && in > 0 && out > 0)
            return denseBackwardBf16(x, w, dy, dx, dw, db, accumulate, n, in, out);
        return computeRounded({x, w, dy}, {dx, dw, db}, [&](const std::vector<Tensor>& r) {
            return denseBackward(r[0], r[1], r[2], dx, dw, db, accumulate);
        });
    }
    return m_d->guard("dense backward (matmul)", [&]() -> Status {
        if (dx.defined() && n * in > 0) {
            if (out == 0) std::fill(mf(dx), mf(dx) + dx.numel(), 0.0f);
            else m_d->run(m_d->denseDx(n, in, out), {{DNNL_ARG_SRC, dy.raw()}, {DNNL_ARG_WEIGHTS, w.raw()},
                                                     {DNNL_ARG_DST, dx.raw()}});
        }
        if (dw.defined() && in * out > 0) {
            if (n == 0) {
                if (!accumulate) std::fill(mf(dw), mf(dw) + dw.numel(), 0.0f);
            } else {
                m_d->run(m_d->denseDw(n, in, out, accumulate),
                         {{DNNL_ARG_SRC, x.raw()}, {DNNL_ARG_WEIGHTS, dy.raw()}, {DNNL_ARG_DST, dw.raw()}});
            }
        }
        if (db.defined() && out > 0) cpuk::colSum(cf(dy), n, out, mf(db), accumulate);
        return okStatus();
    });
}

// mixed_bfloat16 on AVX512-BF16: oneDNN's bf16 matmuls read the operands converted to bf16
// (round to nearest even, as roundToDType), accumulate in f32 and write f32, which is then
// rounded to bf16 values: the same results as the reference's emulation, up to summation order.
Status CpuBackend::denseForwardBf16(const Tensor& x, const Tensor& w, const Tensor& b, Activation act, Tensor& y,
                                    int64_t n, int64_t in, int64_t out)
{
    return m_d->guard("dense forward (bf16 matmul)", [&]() -> Status {
        m_d->bf16Forward(m_d->denseFwd(n, in, out, b.defined(), act == Activation::Relu, dt::bf16), x, w, b, y);
        return okStatus();
    });
}

Status CpuBackend::denseBackwardBf16(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& dx, Tensor& dw,
                                     Tensor& db, bool accumulate, int64_t n, int64_t in, int64_t out)
{
    return m_d->guard("dense backward (bf16 matmul)", [&]() -> Status {
        const uint16_t* dyb = m_d->bf16Copy(kTempBf16A, dy);
        if (dx.defined()) {
            const uint16_t* wb = m_d->bf16Copy(kTempBf16C, w);
            m_d->run(m_d->denseDx(n, in, out, dt::bf16), {{DNNL_ARG_SRC, dyb}, {DNNL_ARG_WEIGHTS, wb}, {DNNL_ARG_DST, dx.raw()}});
            roundBf16InPlace(mf(dx), dx.numel());
        }
        if (dw.defined()) {
            const uint16_t* xb = m_d->bf16Copy(kTempBf16B, x);
            m_d->run(m_d->denseDw(n, in, out, accumulate, dt::bf16),
                     {{DNNL_ARG_SRC, xb}, {DNNL_ARG_WEIGHTS, dyb}, {DNNL_ARG_DST, dw.raw()}});
            roundBf16InPlace(mf(dw), dw.numel());
        }
        if (db.defined()) {
            float* dyr = m_d->temp(kTempRounded, dy.numel());
            roundToDType(cf(dy), dyr, dy.numel(), DType::BF16);
            cpuk::colSum(dyr, n, out, mf(db), accumulate);
            roundBf16InPlace(mf(db), db.numel());
        }
        return okStatus();
    });
}

// ====================================================================== convolution

Status CpuBackend::conv2dForward(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dParams& p,
                                 Tensor& y)
{
    TS_ASSERT(isHostF32(x) && isHostF32(w) && isHostF32(y));
    TS_ASSERT(x.shape().rank() == 4 && w.shape().rank() == 4 && y.shape().rank() == 4);
    const Impl::ConvShape s{x.shape()[0], x.shape()[1], x.shape()[2], x.shape()[3], w.shape()[0], w.shape()[1],
                            w.shape()[3], y.shape()[1], y.shape()[2], p};
    TS_ASSERT(w.shape()[2] == s.C && y.shape()[0] == s.N && y.shape()[3] == s.F);
    TS_ASSERT(!b.defined() || (isHostF32(b) && b.numel() == s.F));
    return m_d->guard("conv2d forward", [&]() -> Status {
        if (y.numel() == 0) return okStatus();
        const cpuk::ConvGeom g = s.geom();
        if (m_computeType != DType::F32 && !nativeConvBf16(m_computeType))
            return computeRounded({x, w, b}, {y}, [&](const std::vector<Tensor>& r) { return conv2dForward(r[0], r[1], r[2], p, y); });
        if (m_computeType == DType::BF16) {  // native bf16 (see denseForwardBf16)
            Impl::ConvShape sb = s;
            sb.in = dt::bf16;
            m_d->bf16Forward(m_d->convFwd(sb, b.defined()), x, w, b, y);
            return okStatus();
        }
        const float* bias = b.defined() ? cf(b) : nullptr;
        if (cpuk::smallConvApplies(g)) {
            parallelFor(g.N * g.OH, 8, 1, [&](int64_t r0, int64_t r1) {
                cpuk::smallConvForward(g, cf(x), cf(w), bias, mf(y), r0, r1);
            });
            return okStatus();
        }
        if (m_d->tiledConv && cpuk::tiledConvForwardApplies(g)) {
            parallelFor(g.N * g.OH, 4, 1, [&](int64_t r0, int64_t r1) {
                cpuk::tiledConvForward(g, cf(x), cf(w), bias, mf(y), r0, r1);
            });
            return okStatus();
        }
        Prim& prim = m_d->convFwd(s, b.defined());
        if (b.defined())
            m_d->run(prim, {{DNNL_ARG_SRC, x.raw()}, {DNNL_ARG_WEIGHTS, w.raw()}, {DNNL_ARG_BIAS, b.raw()},
                            {DNNL_ARG_DST, y.raw()}});
        else
            m_d->run(prim, {{DNNL_ARG_SRC, x.raw()}, {DNNL_ARG_WEIGHTS, w.raw()}, {DNNL_ARG_DST, y.raw()}});
        return okStatus();
    });
}

Status CpuBackend::conv2dBackwardData(const Tensor& dy, const Tensor& w, const Conv2dParams& p, Tensor& dx)
{
    TS_ASSERT(isHostF32(dy) && isHostF32(w) && isHostF32(dx));
    TS_ASSERT(dx.shape().rank() == 4 && w.shape().rank() == 4 && dy.shape().rank() == 4);
    const Impl::ConvShape s{dx.shape()[0], dx.shape()[1], dx.shape()[2], dx.shape()[3], w.shape()[0], w.shape()[1],
                            w.shape()[3], dy.shape()[1], dy.shape()[2], p};
    TS_ASSERT(w.shape()[2] == s.C && dy.shape()[0] == s.N && dy.shape()[3] == s.F);
    return m_d->guard("conv2d backward data", [&]() -> Status {
        if (dx.numel() == 0) return okStatus();
        if (dy.numel() == 0) {
            std::fill(mf(dx), mf(dx) + dx.numel(), 0.0f);
            return okStatus();
        }
        const cpuk::ConvGeom g = s.geom();
        if (m_computeType != DType::F32 && !nativeConvBf16(m_computeType))
            return computeRounded({dy, w}, {dx}, [&](const std::vector<Tensor>& r) { return conv2dBackwardData(r[0], r[1], p, dx); });
        if (m_computeType == DType::BF16) {
            Impl::ConvShape sb = s;
            sb.in = dt::bf16;
            const uint16_t* dyb = m_d->bf16Copy(kTempBf16A, dy);
            const uint16_t* wb = m_d->bf16Copy(kTempBf16B, w);
            m_d->run(m_d->convBwdData(sb), {{DNNL_ARG_DIFF_DST, dyb}, {DNNL_ARG_WEIGHTS, wb}, {DNNL_ARG_DIFF_SRC, dx.raw()}});
            roundBf16InPlace(mf(dx), dx.numel());
            return okStatus();
        }
        if (m_d->tiledConv && cpuk::tiledConvBackwardDataApplies(g)) {
            // dx is the forward convolution of dy with the flipped, transposed kernel.
            float* wf = m_d->temp(kTempFlipped, w.numel());
            cpuk::flipWeights(g, cf(w), wf);
            const cpuk::ConvGeom t = cpuk::backwardDataGeom(g);
            parallelFor(t.N * t.OH, 4, 1, [&](int64_t r0, int64_t r1) {
                cpuk::tiledConvForward(t, cf(dy), wf, nullptr, mf(dx), r0, r1);
            });
            return okStatus();
        }
        m_d->run(m_d->convBwdData(s),
                 {{DNNL_ARG_DIFF_DST, dy.raw()}, {DNNL_ARG_WEIGHTS, w.raw()}, {DNNL_ARG_DIFF_SRC, dx.raw()}});
        return okStatus();
    });
}

Status CpuBackend::conv2dBackwardWeights(const Tensor& x, const Tensor& dy, const Conv2dParams& p, Tensor& dw,
                                         Tensor& db)
{
    TS_ASSERT(isHostF32(x) && isHostF32(dy) && isHostF32(dw));
    TS_ASSERT(x.shape().rank() == 4 && dw.shape().rank() == 4 && dy.shape().rank() == 4);
    const Impl::ConvShape s{x.shape()[0], x.shape()[1], x.shape()[2], x.shape()[3], dw.shape()[0], dw.shape()[1],
                            dw.shape()[3], dy.shape()[1], dy.shape()[2], p};
    TS_ASSERT(dw.shape()[2] == s.C && dy.shape()[0] == s.N && dy.shape()[3] == s.F);
    TS_ASSERT(!db.defined() || (isHostF32(db) && db.numel() == s.F));
    return m_d->guard("conv2d backward weights", [&]() -> Status {
        if (dy.numel() == 0) {
            std::fill(mf(dw), mf(dw) + dw.numel(), 0.0f);
            if (db.defined()) std::fill(mf(db), mf(db) + db.numel(), 0.0f);
            return okStatus();
        }
        if (dw.numel() == 0) return okStatus();
        const cpuk::ConvGeom g = s.geom();
        if (m_computeType != DType::F32 && !nativeConvBf16(m_computeType))
            return computeRounded({x, dy}, {dw, db}, [&](const std::vector<Tensor>& r) { return conv2dBackwardWeights(r[0], r[1], p, dw, db); });
        if (m_computeType == DType::BF16) {
            Impl::ConvShape sb = s;
            sb.in = dt::bf16;
            const uint16_t* xb = m_d->bf16Copy(kTempBf16A, x);
            const uint16_t* dyb = m_d->bf16Copy(kTempBf16B, dy);
            Prim& prim = m_d->convBwdWeights(sb, db.defined());
            if (db.defined())
                m_d->run(prim, {{DNNL_ARG_SRC, xb}, {DNNL_ARG_DIFF_DST, dyb}, {DNNL_ARG_DIFF_WEIGHTS, dw.raw()},
                                {DNNL_ARG_DIFF_BIAS, db.raw()}});
            else
                m_d->run(prim, {{DNNL_ARG_SRC, xb}, {DNNL_ARG_DIFF_DST, dyb}, {DNNL_ARG_DIFF_WEIGHTS, dw.raw()}});
            roundBf16InPlace(mf(dw), dw.numel());
            if (db.defined()) roundBf16InPlace(mf(db), db.numel());
            return okStatus();
        }
        const bool small = cpuk::smallConvApplies(g);
        if (small || (m_d->tiledConv && cpuk::tiledConvBackwardWeightsApplies(g))) {
            // Each thread sums its own rows into a private buffer; the buffers are then added in
            // thread order, so the result depends only on the thread count.
            const int64_t rows = g.N * g.OH;
            const int threads = static_cast<int>(std::clamp<int64_t>(rows / 8, 1, omp_get_max_threads()));
            const int64_t wn = dw.numel(), stride = wn + g.F;
            float* part = m_d->temp(kTempPartials, stride * threads);
            std::fill(part, part + stride * threads, 0.0f);
            const bool bias = db.defined();
#pragma omp parallel num_threads(threads) if (threads > 1)
            {
                const int64_t t = omp_get_thread_num(), T = omp_get_num_threads();
                float* mine = part + t * stride;
                if (small)
                    cpuk::smallConvBackwardWeights(g, cf(x), cf(dy), mine, bias ? mine + wn : nullptr, rows * t / T,
                                                   rows * (t + 1) / T);
                else
                    cpuk::tiledConvBackwardWeights(g, cf(x), cf(dy), mine, bias ? mine + wn : nullptr, rows * t / T,
                                                   rows * (t + 1) / T);
            }
            std::copy(part, part + wn, mf(dw));
            if (bias) std::copy(part + wn, part + stride, mf(db));
            for (int t = 1; t < threads; ++t) {
                cpuk::axpy(1.0f, part + t * stride, mf(dw), wn);
                if (bias) cpuk::axpy(1.0f, part + t * stride + wn, mf(db), g.F);
            }
            return okStatus();
        }
        Prim& prim = m_d->convBwdWeights(s, db.defined());
        if (db.defined())
            m_d->run(prim, {{DNNL_ARG_SRC, x.raw()}, {DNNL_ARG_DIFF_DST, dy.raw()}, {DNNL_ARG_DIFF_WEIGHTS, dw.raw()},
                            {DNNL_ARG_DIFF_BIAS, db.raw()}});
        else
            m_d->run(prim, {{DNNL_ARG_SRC, x.raw()}, {DNNL_ARG_DIFF_DST, dy.raw()}, {DNNL_ARG_DIFF_WEIGHTS, dw.raw()}});
        return okStatus();
    });
}

// ====================================================================== pooling

namespace {
cpuk::PoolGeom poolGeom(const Tensor& x, const Tensor& y, const Pool2dParams& p)
{
    return {x.shape()[0], x.shape()[1], x.shape()[2], x.shape()[3], y.shape()[1], y.shape()[2],
            p.windowH, p.windowW, p.strideH, p.strideW, p.padTop, p.padLeft};
}
} // namespace

Status CpuBackend::pool2dForward(const Tensor& x, const Pool2dParams& p, Tensor& y, Tensor& workspace)
{
    TS_ASSERT(isHostF32(x) && isHostF32(y) && x.shape().rank() == 4 && y.shape().rank() == 4);
    TS_ASSERT(y.shape()[0] == x.shape()[0] && y.shape()[3] == x.shape()[3]);
    m_d->ensureThreads();
    const cpuk::PoolGeom g = poolGeom(x, y, p);
    if (y.numel() == 0) return okStatus();
    const int64_t perImage = std::max<int64_t>(1, g.OH * g.OW * g.C * int64_t(p.windowH) * p.windowW);
    const int64_t grain = std::max<int64_t>(1, 32768 / perImage);
    if (p.kind == PoolKind::Max) {
        TS_ASSERT(x.numel() <= std::numeric_limits<int32_t>::max());
        int32_t* ws = nullptr;
        std::vector<int32_t> local;
        if (workspace.defined()) {
            TS_ASSERT(workspace.hostAccessible() && workspace.dtype() == DType::I32 && workspace.numel() == y.numel());
            ws = workspace.data<int32_t>();
        } else {
            local.resize(static_cast<std::size_t>(y.numel()));
            ws = local.data();
        }
        parallelFor(g.N, grain, 1, [&](int64_t n0, int64_t n1) { cpuk::maxPoolForward(g, cf(x), mf(y), ws, n0, n1); });
    } else {
        parallelFor(g.N, grain, 1, [&](int64_t n0, int64_t n1) { cpuk::avgPoolForward(g, cf(x), mf(y), n0, n1); });
    }
    return okStatus();
}

Status CpuBackend::pool2dBackward(const Tensor& dy, const Tensor& workspace, const Pool2dParams& p, Tensor& dx)
{
    TS_ASSERT(isHostF32(dy) && isHostF32(dx) && dx.shape().rank() == 4 && dy.shape().rank() == 4);
    m_d->ensureThreads();
    const cpuk::PoolGeom g = poolGeom(dx, dy, p);
    if (dx.numel() == 0) return okStatus();
    const int64_t perImage = std::max<int64_t>(1, g.OH * g.OW * g.C * int64_t(p.windowH) * p.windowW);
    const int64_t grain = std::max<int64_t>(1, 32768 / perImage);
    if (p.kind == PoolKind::Max) {
        TS_ASSERT(workspace.defined() && workspace.dtype() == DType::I32 && workspace.numel() == dy.numel());
        const int32_t* ws = workspace.data<int32_t>();
        parallelFor(g.N, grain, 1,
                    [&](int64_t n0, int64_t n1) { cpuk::maxPoolBackward(g, cf(dy), ws, mf(dx), n0, n1); });
    } else {
        parallelFor(g.N, grain, 1, [&](int64_t n0, int64_t n1) { cpuk::avgPoolBackward(g, cf(dy), mf(dx), n0, n1); });
    }
    return okStatus();
}

Status CpuBackend::globalAvgPoolForward(const Tensor& x, Tensor& y)
{
    TS_ASSERT(isHostF32(x) && isHostF32(y) && x.shape().rank() == 4);
    const int64_t N = x.shape()[0], HW = x.shape()[1] * x.shape()[2], C = x.shape()[3];
    TS_ASSERT(y.numel() == N * C);
    m_d->ensureThreads();
    const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, HW * C));
    parallelFor(N, grain, 1, [&](int64_t n0, int64_t n1) { cpuk::globalAvgPoolForward(cf(x), mf(y), HW, C, n0, n1); });
    return okStatus();
}

Status CpuBackend::globalAvgPoolBackward(const Tensor& dy, Tensor& dx)
{
    TS_ASSERT(isHostF32(dy) && isHostF32(dx) && dx.shape().rank() == 4);
    const int64_t N = dx.shape()[0], HW = dx.shape()[1] * dx.shape()[2], C = dx.shape()[3];
    TS_ASSERT(dy.numel() == N * C);
    m_d->ensureThreads();
    const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, HW * C));
    parallelFor(N, grain, 1, [&](int64_t n0, int64_t n1) { cpuk::globalAvgPoolBackward(cf(dy), mf(dx), HW, C, n0, n1); });
    return okStatus();
}

// ====================================================================== batch norm

Status CpuBackend::batchNormForward(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& runningMean,
                                    Tensor& runningVar, bool training, float momentum, float epsilon, Tensor& y,
                                    Tensor& saveMean, Tensor& saveInvStd)
{
    TS_ASSERT(isHostF32(x) && isHostF32(y) && isHostF32(runningMean) && isHostF32(runningVar));
    const int64_t C = lastDim(x);
    const int64_t M = C == 0 ? 0 : x.numel() / C;
    TS_ASSERT(y.numel() == x.numel() && runningMean.numel() == C && runningVar.numel() == C);
    TS_ASSERT(!gamma.defined() || (isHostF32(gamma) && gamma.numel() == C));
    TS_ASSERT(!beta.defined() || (isHostF32(beta) && beta.numel() == C));
    return m_d->guard("batch norm forward", [&]() -> Status {
        if (C == 0 || M == 0) return okStatus();
        // Undefined gamma/beta mean scale 1 / offset 0.
        const float* scale = gamma.defined() ? cf(gamma) : nullptr;
        const float* shift = beta.defined() ? cf(beta) : nullptr;
        if (!scale) {
            float* ones = m_d->temp(kTempOnes, C);
            std::fill(ones, ones + C, 1.0f);
            scale = ones;
        }
        if (!shift) {
            float* zeros = m_d->temp(kTempZeros, C);
            std::fill(zeros, zeros + C, 0.0f);
            shift = zeros;
        }
        if (!training) {
            m_d->run(m_d->bnFwd(M, C, epsilon, false),
                     {{DNNL_ARG_SRC, x.raw()}, {DNNL_ARG_DST, y.raw()}, {DNNL_ARG_MEAN, runningMean.raw()},
                      {DNNL_ARG_VARIANCE, runningVar.raw()}, {DNNL_ARG_SCALE, scale}, {DNNL_ARG_SHIFT, shift}});
            return okStatus();
        }
        float* mean = saveMean.defined() ? mf(saveMean) : m_d->temp(kTempMean, C);
        float* var = m_d->temp(kTempVar, C);
        TS_ASSERT(!saveMean.defined() || (isHostF32(saveMean) && saveMean.numel() == C));
        TS_ASSERT(!saveInvStd.defined() || (isHostF32(saveInvStd) && saveInvStd.numel() == C));
        m_d->run(m_d->bnFwd(M, C, epsilon, true),
                 {{DNNL_ARG_SRC, x.raw()}, {DNNL_ARG_DST, y.raw()}, {DNNL_ARG_MEAN, mean}, {DNNL_ARG_VARIANCE, var},
                  {DNNL_ARG_SCALE, scale}, {DNNL_ARG_SHIFT, shift}});
        const double mom = momentum;
        const double unbias = M > 1 ? double(M) / double(M - 1) : 1.0;
        float* rm = mf(runningMean);
        float* rv = mf(runningVar);
        for (int64_t c = 0; c < C; ++c) {
            if (saveInvStd.defined()) mf(saveInvStd)[c] = float(1.0 / std::sqrt(double(var[c]) + double(epsilon)));
            rm[c] = float(mom * rm[c] + (1.0 - mom) * mean[c]);
            rv[c] = float(mom * rv[c] + (1.0 - mom) * double(var[c]) * unbias);
        }
        return okStatus();
    });
}

Status CpuBackend::batchNormBackward(const Tensor& x, const Tensor& gamma, const Tensor& saveMean,
                                     const Tensor& saveInvStd, const Tensor& dy, Tensor& dx, Tensor& dgamma,
                                     Tensor& dbeta)
{
    TS_ASSERT(isHostF32(x) && isHostF32(dy) && isHostF32(saveMean) && isHostF32(saveInvStd));
    const int64_t C = lastDim(x);
    const int64_t M = C == 0 ? 0 : x.numel() / C;
    TS_ASSERT(dy.numel() == x.numel() && saveMean.numel() == C && saveInvStd.numel() == C);
    TS_ASSERT(!dx.defined() || (isHostF32(dx) && dx.numel() == x.numel()));
    TS_ASSERT(!dgamma.defined() || (isHostF32(dgamma) && dgamma.numel() == C));
    TS_ASSERT(!dbeta.defined() || (isHostF32(dbeta) && dbeta.numel() == C));
    return m_d->guard("batch norm backward", [&]() -> Status {
        if (C == 0 || M == 0) return okStatus();
        const float* scale = gamma.defined() ? cf(gamma) : nullptr;
        if (!scale) {
            float* ones = m_d->temp(kTempOnes, C);
            std::fill(ones, ones + C, 1.0f);
            scale = ones;
        }
        // oneDNN wants the variance; the forward pass saved 1 / sqrt(var + eps). The backward
        // primitive depends on epsilon only through var + eps, so any epsilon works: use the one
        // that reproduces the saved invStd most exactly (var = 1 / invStd^2 - eps with eps 0).
        float* var = m_d->temp(kTempVar, C);
        const float* invStd = cf(saveInvStd);
        for (int64_t c = 0; c < C; ++c) var[c] = float(1.0 / (double(invStd[c]) * double(invStd[c])));
        // oneDNN 2.6 lists the shift as an input of the backward pass (unused by the math).
        float* shift = m_d->temp(kTempZeros, C);
        std::fill(shift, shift + C, 0.0f);
        float* dxp = dx.defined() ? mf(dx) : nullptr;
        std::vector<float> dxLocal;
        if (!dxp) {
            dxLocal.resize(static_cast<std::size_t>(x.numel()));
            dxp = dxLocal.data();
        }
        float* dg = dgamma.defined() ? mf(dgamma) : m_d->temp(kTempDGamma, C);
        float* dbt = dbeta.defined() ? mf(dbeta) : m_d->temp(kTempDBeta, C);
        m_d->run(m_d->bnBwd(M, C, 0.0f),
                 {{DNNL_ARG_SRC, x.raw()}, {DNNL_ARG_DIFF_DST, dy.raw()}, {DNNL_ARG_MEAN, saveMean.raw()},
                  {DNNL_ARG_VARIANCE, var}, {DNNL_ARG_SCALE, scale}, {DNNL_ARG_SHIFT, shift}, {DNNL_ARG_DIFF_SRC, dxp},
                  {DNNL_ARG_DIFF_SCALE, dg}, {DNNL_ARG_DIFF_SHIFT, dbt}});
        return okStatus();
    });
}

// ====================================================================== activations, softmax

Status CpuBackend::activationForward(Activation act, float alpha, const Tensor& x, Tensor& y)
{
    TS_ASSERT(isHostF32(x) && isHostF32(y) && x.numel() == y.numel());
    if (act == Activation::Softmax) return softmaxForward(x, y);
    return m_d->guard("activation forward (eltwise)", [&]() -> Status {
        const int64_t n = x.numel();
        if (n == 0) return okStatus();
        if (act == Activation::Linear) {
            cpuk::copy(cf(x), mf(y), n);
            return okStatus();
        }
        const float a = act == Activation::LeakyRelu ? alpha : 0.0f;
        if (act == Activation::Relu || act == Activation::LeakyRelu) {
            // A plain select: own loop, no primitive overhead on small tensors.
            parallelFor(n, 1 << 16, 64, [&](int64_t i, int64_t e) { cpuk::leakyRelu(a, cf(x) + i, mf(y) + i, e - i); });
            return okStatus();
        }
        m_d->run(m_d->eltFwd(Impl::eltAlg(act, false), a, n), {{DNNL_ARG_SRC, x.raw()}, {DNNL_ARG_DST, y.raw()}});
        return okStatus();
    });
}

Status CpuBackend::activationBackward(Activation act, float alpha, const Tensor& x, const Tensor& y,
                                      const Tensor& dy, Tensor& dx)
{
    TS_ASSERT(isHostF32(dy) && isHostF32(dx) && dy.numel() == dx.numel());
    if (act == Activation::Softmax) return softmaxBackward(y, dy, dx);
    return m_d->guard("activation backward (eltwise)", [&]() -> Status {
        const int64_t n = dy.numel();
        if (n == 0) return okStatus();
        if (act == Activation::Linear) {
            cpuk::copy(cf(dy), mf(dx), n);
            return okStatus();
        }
        // Same inputs as the reference: x for Relu/LeakyRelu/Gelu, y for Sigmoid/Tanh, the other
        // one when the preferred tensor is undefined.
        bool useDst;
        switch (act) {
        case Activation::Sigmoid:
        case Activation::Tanh: useDst = y.defined(); break;
        case Activation::Gelu: useDst = false; break;
        default: useDst = !x.defined(); break;
        }
        const Tensor& data = useDst ? y : x;
        TS_ASSERT(isHostF32(data) && data.numel() == n);
        TS_ASSERT(!(useDst && act == Activation::LeakyRelu && alpha <= 0.0f));
        const float a = act == Activation::LeakyRelu ? alpha : 0.0f;
        if (act == Activation::Relu || act == Activation::LeakyRelu) {
            const float* v = cf(data);
            parallelFor(n, 1 << 16, 64,
                        [&](int64_t i, int64_t e) { cpuk::leakyReluBackward(a, v + i, cf(dy) + i, mf(dx) + i, e - i); });
            return okStatus();
        }
        m_d->run(m_d->eltBwd(Impl::eltAlg(act, useDst), a, n, useDst),
                 {{useDst ? DNNL_ARG_DST : DNNL_ARG_SRC, data.raw()}, {DNNL_ARG_DIFF_DST, dy.raw()},
                  {DNNL_ARG_DIFF_SRC, dx.raw()}});
        return okStatus();
    });
}

Status CpuBackend::softmaxForward(const Tensor& x, Tensor& y)
{
    TS_ASSERT(isHostF32(x) && isHostF32(y) && x.numel() == y.numel());
    return m_d->guard("softmax forward", [&]() -> Status {
        const int64_t cols = lastDim(x);
        if (cols == 0 || x.numel() == 0) return okStatus();
        m_d->run(m_d->softmaxFwd(x.numel() / cols, cols), {{DNNL_ARG_SRC, x.raw()}, {DNNL_ARG_DST, y.raw()}});
        return okStatus();
    });
}

Status CpuBackend::softmaxBackward(const Tensor& y, const Tensor& dy, Tensor& dx)
{
    TS_ASSERT(isHostF32(y) && isHostF32(dy) && isHostF32(dx) && y.numel() == dy.numel() && dx.numel() == dy.numel());
    return m_d->guard("softmax backward", [&]() -> Status {
        const int64_t cols = lastDim(y);
        if (cols == 0 || y.numel() == 0) return okStatus();
        m_d->run(m_d->softmaxBwd(y.numel() / cols, cols),
                 {{DNNL_ARG_DST, y.raw()}, {DNNL_ARG_DIFF_DST, dy.raw()}, {DNNL_ARG_DIFF_SRC, dx.raw()}});
        return okStatus();
    });
}

// ====================================================================== dropout

Status CpuBackend::dropoutForward(const Tensor& x, float rate, uint64_t seed, Tensor& mask, Tensor& y)
{
    TS_ASSERT(isHostF32(x) && isHostF32(y) && x.numel() == y.numel());
    TS_ASSERT(mask.defined() && mask.dtype() == DType::U8 && mask.numel() == x.numel());
    m_d->ensureThreads();
    uint8_t* mk = mask.data<uint8_t>();
    parallelFor(x.numel(), 1 << 15, 64,
                [&](int64_t b, int64_t e) { cpuk::dropoutForward(cf(x), rate, seed, mk, mf(y), b, e); });
    return okStatus();
}

Status CpuBackend::dropoutBackward(const Tensor& dy, const Tensor& mask, float rate, Tensor& dx)
{
    TS_ASSERT(isHostF32(dy) && isHostF32(dx) && dy.numel() == dx.numel());
    TS_ASSERT(mask.defined() && mask.dtype() == DType::U8 && mask.numel() == dy.numel());
    m_d->ensureThreads();
    const uint8_t* mk = mask.data<uint8_t>();
    parallelFor(dy.numel(), 1 << 16, 64,
                [&](int64_t b, int64_t e) { cpuk::dropoutBackward(cf(dy) + b, mk + b, rate, mf(dx) + b, e - b); });
    return okStatus();
}

// ====================================================================== elementwise, concat

Status CpuBackend::add(const Tensor& a, const Tensor& b, Tensor& c)
{
    TS_ASSERT(isHostF32(a) && isHostF32(b) && isHostF32(c));
    TS_ASSERT(a.numel() == b.numel() && a.numel() == c.numel());
    m_d->ensureThreads();
    parallelFor(a.numel(), 1 << 16, 64,
                [&](int64_t i, int64_t e) { cpuk::add(cf(a) + i, cf(b) + i, mf(c) + i, e - i); });
    return okStatus();
}

Status CpuBackend::axpy(float alpha, const Tensor& x, Tensor& y)
{
    TS_ASSERT(isHostF32(x) && isHostF32(y) && x.numel() == y.numel());
    m_d->ensureThreads();
    parallelFor(x.numel(), 1 << 16, 64, [&](int64_t i, int64_t e) { cpuk::axpy(alpha, cf(x) + i, mf(y) + i, e - i); });
    return okStatus();
}

Status CpuBackend::scale(float alpha, Tensor& x)
{
    TS_ASSERT(isHostF32(x));
    m_d->ensureThreads();
    parallelFor(x.numel(), 1 << 16, 64, [&](int64_t i, int64_t e) { cpuk::scale(alpha, mf(x) + i, e - i); });
    return okStatus();
}

Status CpuBackend::concatForward(const std::vector<Tensor>& xs, Tensor& y)
{
    TS_ASSERT(isHostF32(y));
    const int64_t total = lastDim(y);
    const int64_t rows = total == 0 ? 0 : y.numel() / total;
    m_d->ensureThreads();
    float* Y = mf(y);
    const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, total));
    parallelFor(rows, grain, 1, [&](int64_t r0, int64_t r1) {
        int64_t offset = 0;
        for (const Tensor& x : xs) {
            const int64_t ci = lastDim(x);
            const float* X = cf(x);
            for (int64_t r = r0; r < r1; ++r)
                std::memcpy(Y + r * total + offset, X + r * ci, static_cast<std::size_t>(ci) * sizeof(float));
            offset += ci;
        }
    });
#ifndef NDEBUG
    int64_t sum = 0;
    for (const Tensor& x : xs) {
        TS_ASSERT(isHostF32(x) && x.numel() == rows * lastDim(x));
        sum += lastDim(x);
    }
    TS_ASSERT(sum == total);
#endif
    return okStatus();
}

Status CpuBackend::concatBackward(const Tensor& dy, std::vector<Tensor>& dxs)
{
    TS_ASSERT(isHostF32(dy));
    const int64_t total = lastDim(dy);
    const int64_t rows = total == 0 ? 0 : dy.numel() / total;
    m_d->ensureThreads();
    const float* DY = cf(dy);
    const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, total));
    parallelFor(rows, grain, 1, [&](int64_t r0, int64_t r1) {
        int64_t offset = 0;
        for (Tensor& dx : dxs) {
            const int64_t ci = lastDim(dx);
            float* DX = mf(dx);
            for (int64_t r = r0; r < r1; ++r)
                std::memcpy(DX + r * ci, DY + r * total + offset, static_cast<std::size_t>(ci) * sizeof(float));
            offset += ci;
        }
    });
#ifndef NDEBUG
    int64_t sum = 0;
    for (const Tensor& dx : dxs) {
        TS_ASSERT(isHostF32(dx) && dx.numel() == rows * lastDim(dx));
        sum += lastDim(dx);
    }
    TS_ASSERT(sum == total);
#endif
    return okStatus();
}

// ====================================================================== loss, metrics

Status CpuBackend::loss(const LossParams& p, const Tensor& pred, const Tensor& target, float* loss, Tensor& dpred)
{
    TS_ASSERT(isHostF32(pred) && target.defined() && target.hostAccessible());
    TS_ASSERT(pred.shape().rank() >= 1);
    constexpr double kProbEps = 1e-7;  // Keras backend.epsilon()
    const int64_t N = pred.shape()[0];
    const int64_t per = N == 0 ? 0 : pred.numel() / N;
    const int64_t nGlobal = p.globalBatch > 0 ? p.globalBatch : N;
    const double gscale = nGlobal > 0 ? double(p.gradScale) / double(nGlobal) : 0.0;
    const float* P = cf(pred);
    float* D = nullptr;
    if (dpred.defined()) {
        TS_ASSERT(isHostF32(dpred) && dpred.numel() == pred.numel());
        D = mf(dpred);
    }
    double total = 0;
    switch (p.kind) {
    case LossKind::SparseCategoricalCrossentropy:
    case LossKind::CategoricalCrossentropy: {
        const bool sparse = p.kind == LossKind::SparseCategoricalCrossentropy;
        const int64_t C = per;
        TS_ASSERT(sparse ? (target.dtype() == DType::I32 && target.numel() == N)
                         : (target.dtype() == DType::F32 && target.numel() == pred.numel()));
        if (sparse) {
            const int32_t* labels = target.data<int32_t>();
            for (int64_t r = 0; r < N; ++r)
                if (labels[r] < 0 || labels[r] >= C)
                    return makeError(ErrorCode::InvalidArgument,
                                     m_d->where() + ": sparse categorical crossentropy: label " +
                                         std::to_string(labels[r]) + " in batch row " + std::to_string(r) +
                                         " is outside [0, " + std::to_string(C) + ")",
                                     "labels must be class ids below the model's output width; check the "
                                     "label column and the last layer's units");
        }
        if (p.fromLogits) {
            total = sparse ? cpuk::sparseSoftmaxXent(P, target.data<int32_t>(), N, C, float(gscale), D)
                           : cpuk::softmaxXent(P, target.data<float>(), N, C, float(gscale), D);
            break;
        }
        // Probabilities (Keras): q = p / rowsum(p) clipped to [eps, 1 - eps].
        std::vector<double> g(static_cast<std::size_t>(C));
        for (int64_t r = 0; r < N; ++r) {
            const float* x = P + r * C;
            double s = 0;
            for (int64_t k = 0; k < C; ++k) s += x[k];
            double gq = 0;
            for (int64_t k = 0; k < C; ++k) {
                const double tk = sparse ? (target.data<int32_t>()[r] == k ? 1.0 : 0.0)
                                         : double(target.data<float>()[r * C + k]);
                const double q = double(x[k]) / s;
                const double qc = std::clamp(q, kProbEps, 1.0 - kProbEps);
                if (tk != 0.0) total -= tk * std::log(qc);
                const double gk = (q >= kProbEps && q <= 1.0 - kProbEps) ? -tk / q : 0.0;
                g[static_cast<std::size_t>(k)] = gk;
                gq += gk * q;
            }
            if (D)
                for (int64_t k = 0; k < C; ++k) D[r * C + k] = float(gscale * (g[static_cast<std::size_t>(k)] - gq) / s);
        }
        break;
    }
    case LossKind::BinaryCrossentropy: {
        TS_ASSERT(target.dtype() == DType::F32 && target.numel() == pred.numel());
        const float* Z = target.data<float>();
        const double inv = per > 0 ? 1.0 / double(per) : 0.0;
        for (int64_t i = 0; i < pred.numel(); ++i) {
            const double x = P[i], z = Z[i];
            double l, d;
            if (p.fromLogits) {
                const double e = std::exp(-std::abs(x));
                l = std::max(x, 0.0) - x * z + std::log1p(e);
                const double sig = x >= 0 ? 1.0 / (1.0 + e) : e / (1.0 + e);
                d = sig - z;
            } else {
                const double pc = std::clamp(x, kProbEps, 1.0 - kProbEps);
                l = -(z * std::log(pc) + (1.0 - z) * std::log(1.0 - pc));
                d = (x >= kProbEps && x <= 1.0 - kProbEps) ? -(z / x) + (1.0 - z) / (1.0 - x) : 0.0;
            }
            total += l * inv;
            if (D) D[i] = float(gscale * d * inv);
        }
        break;
    }
    case LossKind::MeanSquaredError: {
        TS_ASSERT(target.dtype() == DType::F32 && target.numel() == pred.numel());
        const float* T = target.data<float>();
        const double inv = per > 0 ? 1.0 / double(per) : 0.0;
        for (int64_t i = 0; i < pred.numel(); ++i) {
            const double e = double(P[i]) - T[i];
            total += e * e * inv;
            if (D) D[i] = float(gscale * 2.0 * e * inv);
        }
        break;
    }
    }
    if (loss) *loss = N > 0 ? float(total / double(N)) : 0.0f;
    return okStatus();
}

Status CpuBackend::argmaxMatches(const Tensor& pred, const Tensor& target, bool binaryFromLogits, int64_t* matches)
{
    TS_ASSERT(isHostF32(pred) && target.defined() && target.hostAccessible() && matches);
    *matches = countArgmaxMatches(pred, target, binaryFromLogits);
    return okStatus();
}

// ====================================================================== optimizers

Status CpuBackend::sgdUpdate(const SgdParams& p, Tensor& param, const Tensor& grad, Tensor& velocity)
{
    TS_ASSERT(isHostF32(param) && isHostF32(grad) && param.numel() == grad.numel());
    const bool useMomentum = p.momentum != 0.0f;
    TS_ASSERT(!useMomentum || (isHostF32(velocity) && velocity.numel() == param.numel()));
    m_d->ensureThreads();
    float* V = useMomentum ? mf(velocity) : nullptr;
    parallelFor(param.numel(), 1 << 15, 64, [&](int64_t i, int64_t e) {
        cpuk::sgd(p.lr, useMomentum ? p.momentum : 0.0f, p.nesterov, p.weightDecay, mf(param) + i, cf(grad) + i,
                  V ? V + i : nullptr, e - i);
    });
    return okStatus();
}

Status CpuBackend::adamUpdate(const AdamParams& p, Tensor& param, const Tensor& grad, Tensor& m, Tensor& v)
{
    TS_ASSERT(isHostF32(param) && isHostF32(grad) && isHostF32(m) && isHostF32(v));
    TS_ASSERT(param.numel() == grad.numel() && m.numel() == param.numel() && v.numel() == param.numel());
    TS_ASSERT(p.step >= 1);
    m_d->ensureThreads();
    const double bc1 = 1.0 - std::pow(double(p.beta1), double(p.step));
    const double bc2 = 1.0 - std::pow(double(p.beta2), double(p.step));
    cpuk::AdamConsts k;
    k.beta1 = p.beta1;
    k.beta2 = p.beta2;
    k.oneMinusBeta1 = float(1.0 - double(p.beta1));
    k.oneMinusBeta2 = float(1.0 - double(p.beta2));
    k.stepSize = float(double(p.lr) / bc1);
    k.invSqrtBc2 = float(1.0 / std::sqrt(bc2));
    k.epsilon = p.epsilon;
    k.decay = float(1.0 - double(p.lr) * double(p.weightDecay));
    parallelFor(param.numel(), 1 << 15, 64, [&](int64_t i, int64_t e) {
        cpuk::adam(k, mf(param) + i, cf(grad) + i, mf(m) + i, mf(v) + i, e - i);
    });
    return okStatus();
}

Status CpuBackend::rmspropUpdate(const RmspropParams& p, Tensor& param, const Tensor& grad, Tensor& ms, Tensor& mom,
                                 Tensor& mg)
{
    TS_ASSERT(isHostF32(param) && isHostF32(grad) && isHostF32(ms));
    TS_ASSERT(param.numel() == grad.numel() && ms.numel() == param.numel());
    const bool useMomentum = p.momentum > 0.0f;
    TS_ASSERT(!useMomentum || (isHostF32(mom) && mom.numel() == param.numel()));
    TS_ASSERT(!p.centered || (isHostF32(mg) && mg.numel() == param.numel()));
    m_d->ensureThreads();
    float* MOM = useMomentum ? mf(mom) : nullptr;
    float* MG = p.centered ? mf(mg) : nullptr;
    parallelFor(param.numel(), 1 << 15, 64, [&](int64_t i, int64_t e) {
        cpuk::rmsprop(p.lr, p.rho, p.momentum, p.epsilon, mf(param) + i, cf(grad) + i, mf(ms) + i,
                      MOM ? MOM + i : nullptr, MG ? MG + i : nullptr, e - i);
    });
    return okStatus();
}

Status CpuBackend::sumSquares(const Tensor& x, double* out)
{
    TS_ASSERT(isHostF32(x) && out);
    m_d->ensureThreads();
    // Fixed chunking per thread count keeps the sum deterministic.
    const int64_t n = x.numel();
    double partial[64] = {};
    const int64_t chunks = std::clamp<int64_t>(n / (1 << 16), 1, std::min<int64_t>(64, omp_get_max_threads()));
    parallelFor(chunks, 1, 1, [&](int64_t c0, int64_t c1) {
        for (int64_t c = c0; c < c1; ++c) {
            const int64_t b = n * c / chunks, e = n * (c + 1) / chunks;
            partial[c] = cpuk::sumSquares(cf(x) + b, e - b);
        }
    });
    double acc = 0;
    for (int64_t c = 0; c < chunks; ++c) acc += partial[c];
    *out = acc;
    return okStatus();
}

Status CpuBackend::copyFromHost(const void* src, Tensor& dst)
{
    TS_ASSERT(dst.defined() && dst.hostAccessible());
    if (dst.bytes()) std::memcpy(dst.raw(), src, dst.bytes());
    return okStatus();
}

Status CpuBackend::copyToHost(const Tensor& src, void* dst)
{
    TS_ASSERT(src.defined() && src.hostAccessible());
    if (src.bytes()) std::memcpy(dst, src.raw(), src.bytes());
    return okStatus();
}

// ====================================================================== factory

BackendFactory cpuBackendFactory()
{
    BackendFactory f;
    f.name = "cpu";
    f.kind = DeviceKind::Cpu;
    f.priority = 10;  // preferred over the reference kernels
    f.enumerate = [] {
        // Logical devices: cpu:N share the host's cores (Mirrored over cpu:0, cpu:1 splits them);
        // list one per hardware thread, each described with the whole host.
        const int hw = cpuHardwareThreads();
        const std::string model = cpuModelName();
        const uint64_t total = meminfoBytes("MemTotal"), avail = meminfoBytes("MemAvailable");
        std::vector<DeviceInfo> out;
        for (int i = 0; i < hw; ++i) {
            DeviceInfo d;
            d.device = Device{DeviceKind::Cpu, i};
            d.name = d.device.toString() + " (" + model + ", " + std::to_string(hw) +
                     (hw == 1 ? " thread)" : " threads)");
            d.memoryTotal = total;
            d.memoryFree = avail;
            out.push_back(std::move(d));
        }
        return out;
    };
    f.create = [](int deviceIndex, const BackendOptions& options) -> Result<std::unique_ptr<Backend>> {
        if (deviceIndex < 0)
            return makeError(ErrorCode::InvalidArgument, "cpu backend: bad device index " + std::to_string(deviceIndex),
                             "use a non-negative CPU device index, e.g. cpu:0");
        if (options.threads < 1)
            return makeError(ErrorCode::InvalidArgument,
                             "cpu backend: cpu:" + std::to_string(deviceIndex) + " given " +
                                 std::to_string(options.threads) + " threads",
                             "give each CPU device at least one thread");
        try {
            return std::unique_ptr<Backend>(std::make_unique<CpuBackend>(deviceIndex, options));
        } catch (const dnnl::error& e) {
            return makeError(ErrorCode::Internal,
                             "cpu backend: cannot create the oneDNN CPU engine for cpu:" + std::to_string(deviceIndex) +
                                 ": " + e.what(),
                             "use the reference backend (--backend reference)");
        }
    };
    return f;
}

} // namespace ts
