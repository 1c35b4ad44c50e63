#include "tensor/tensor.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <cstdlib>
#include <cstring>
#include <new>
#include <sstream>

namespace ts {

std::size_t dtypeSize(DType t)
{
    switch (t) {
    case DType::F32: return 4;
    case DType::F16: return 2;
    case DType::BF16: return 2;
    case DType::I32: return 4;
    case DType::U8: return 1;
    }
    return 0;
}

const char* dtypeName(DType t)
{
    switch (t) {
    case DType::F32: return "f32";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::I32: return "i32";
    case DType::U8: return "u8";
    }
    return "?";
}

int64_t Shape::numel() const { return product(0, rank()); }

int64_t Shape::product(int first, int last) const
{
    int64_t n = 1;
    for (int i = first; i < last; ++i) n *= m_dims[static_cast<std::size_t>(i)];
    return n;
}

std::string Shape::toString() const
{
    std::ostringstream os;
    os << '(';
    for (std::size_t i = 0; i < m_dims.size(); ++i) {
        if (i) os << ", ";
        os << m_dims[i];
    }
    if (m_dims.size() == 1) os << ',';
    os << ')';
    return os.str();
}

std::string Device::toString() const
{
    return std::string(kind == DeviceKind::Cpu ? "cpu:" : "gpu:") + std::to_string(index);
}

Result<Device> Device::parse(const std::string& text)
{
    auto colon = text.find(':');
    std::string kind = text.substr(0, colon);
    Device d;
    if (kind == "cpu" || kind == "CPU") d.kind = DeviceKind::Cpu;
    else if (kind == "gpu" || kind == "cuda" || kind == "GPU") d.kind = DeviceKind::Cuda;
    else
        return makeError(ErrorCode::InvalidArgument, "unknown device '" + text + "'",
                         "write devices as cpu:N or gpu:N, e.g. cpu:0,cpu:1");
    if (colon != std::string::npos) {
        const std::string idx = text.substr(colon + 1);
        char* end = nullptr;
        long v = std::strtol(idx.c_str(), &end, 10);
        if (idx.empty() || *end != '\0' || v < 0 || v > 4096)
            return makeError(ErrorCode::InvalidArgument, "bad device index in '" + text + "'",
                             "the index after ':' must be a non-negative integer");
        d.index = static_cast<int>(v);
    }
    return d;
}

namespace {
class HostAllocator final : public Allocator {
public:
    void* allocate(std::size_t bytes) override
    {
        const std::size_t rounded = (bytes + 63) / 64 * 64;
        return std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
    }
    void deallocate(void* p, std::size_t) override { std::free(p); }
    Device device() const override { return Device{DeviceKind::Cpu, 0}; }
    bool hostAccessible() const override { return true; }
};
} // namespace

Allocator& hostAllocator()
{
    static HostAllocator a;
    return a;
}

Storage::Storage(Allocator& alloc, std::size_t bytes)
    : m_alloc(&alloc), m_data(alloc.allocate(bytes)), m_bytes(bytes)
{
}

Storage::~Storage()
{
    if (m_data) m_alloc->deallocate(m_data, m_bytes);
}

Result<Tensor> Tensor::create(Shape shape, DType dtype, Allocator& alloc)
{
    for (int64_t d : shape.dims())
        if (d < 0)
            return makeError(ErrorCode::InvalidArgument, "negative dimension in shape " + shape.toString());
    Tensor t;
    t.m_shape = std::move(shape);
    t.m_dtype = dtype;
    auto st = std::make_shared<Storage>(alloc, t.bytes());
    if (!st->data())
        return makeError(ErrorCode::OutOfMemory,
                         "out of memory on " + alloc.device().toString() + " allocating " +
                             std::to_string(t.bytes()) + " bytes for a tensor of shape " + t.m_shape.toString(),
                         "lower the per-replica batch size or use a smaller model");
    t.m_storage = std::move(st);
    return t;
}

Tensor Tensor::empty(Shape shape, DType dtype)
{
    auto r = create(std::move(shape), dtype, hostAllocator());
    if (!r.ok()) throw std::bad_alloc();
    return std::move(r).value();
}

Tensor Tensor::zeros(Shape shape, DType dtype)
{
    Tensor t = empty(std::move(shape), dtype);
    std::memset(t.raw(), 0, t.bytes());
    return t;
}

Tensor Tensor::fromVector(Shape shape, const std::vector<float>& values)
{
    Tensor t = empty(std::move(shape), DType::F32);
    TS_ASSERT(static_cast<int64_t>(values.size()) == t.numel());
    std::memcpy(t.raw(), values.data(), values.size() * sizeof(float));
    return t;
}

Device Tensor::device() const { return m_storage ? m_storage->allocator().device() : Device{}; }

bool Tensor::hostAccessible() const { return !m_storage || m_storage->allocator().hostAccessible(); }

void* Tensor::raw() const
{
    return m_storage ? static_cast<char*>(m_storage->data()) + m_offset : nullptr;
}

Tensor Tensor::reshaped(Shape shape) const
{
    TS_ASSERT(shape.numel() == numel());
    Tensor t = *this;
    t.m_shape = std::move(shape);
    return t;
}

Tensor Tensor::rows(int64_t begin, int64_t end) const
{
    TS_ASSERT(m_shape.rank() >= 1 && begin >= 0 && begin <= end && end <= m_shape[0]);
    Tensor t = *this;
    const int64_t rowElems = m_shape.product(1, m_shape.rank());
    t.m_offset += static_cast<std::size_t>(begin * rowElems) * dtypeSize(m_dtype);
    t.m_shape[0] = end - begin;
    return t;
}

Tensor Tensor::clone() const
{
    if (!defined()) return {};
    TS_ASSERT(hostAccessible());
    auto r = create(m_shape, m_dtype, m_storage->allocator());
    if (!r.ok()) throw std::bad_alloc();
    std::memcpy(r->raw(), raw(), bytes());
    return std::move(r).value();
}

void Tensor::fill(float value)
{
    TS_ASSERT(hostAccessible() && m_dtype == DType::F32);
    float* p = data<float>();
    for (int64_t i = 0, n = numel(); i < n; ++i) p[i] = value;
}

std::vector<float> Tensor::toVector() const
{
    TS_ASSERT(hostAccessible());
    std::vector<float> v(static_cast<std::size_t>(numel()));
    if (m_dtype == DType::F32) {
        std::memcpy(v.data(), raw(), bytes());
    } else if (m_dtype == DType::I32) {
        const int32_t* p = data<int32_t>();
        for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(p[i]);
    } else if (m_dtype == DType::U8) {
        const uint8_t* p = data<uint8_t>();
        for (std::size_t i = 0; i < v.size(); ++i) v[i] = p[i];
    }
    return v;
}

namespace {

// IEEE 754 binary16 to binary32, subnormals, infinities and NaN included.
float halfToFloat(uint16_t h)
{
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0x1f) bits = sign | 0x7f800000u | (mant << 13);
    else if (exp != 0) bits = sign | ((exp + 112u) << 23) | (mant << 13);
    else if (mant == 0) bits = sign;
    else {  // subnormal: normalise the mantissa
        int e = -1;
        do {
            ++e;
            mant <<= 1;
        } while ((mant & 0x400u) == 0);
        bits = sign | (static_cast<uint32_t>(112 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

} // namespace

namespace {

// The float bits of the bf16 value nearest to the float with bits `x` (ties to even; a NaN stays
// a quiet NaN). The one place the bf16 rounding rule lives: scalar, array and bits forms use it.
inline uint32_t bf16RoundedBits(uint32_t x)
{
    const bool nan = (x & 0x7fffffffu) > 0x7f800000u;
    x = nan ? (x | 0x400000u) : x + 0x7fffu + ((x >> 16) & 1u);
    return x & 0xffff0000u;
}

} // namespace

uint16_t floatToHalfBits(float v)
{
    uint32_t x;
    std::memcpy(&x, &v, sizeof x);
    const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
    x &= 0x7fffffffu;
    if (x > 0x7f800000u) return sign | 0x7e00u;  // NaN (quiet)
    const uint32_t e = x >> 23;                  // biased f32 exponent
    if (e > 142) return sign | 0x7c00u;          // 2^16 and beyond: inf
    if (e < 113) {
        // Below 2^-14: a subnormal half, in units of 2^-24 (values under 2^-25 round to zero).
        if (e < 102) return sign;
        const uint32_t mant = (x & 0x7fffffu) | 0x800000u;
        const uint32_t shift = 126 - e;
        uint32_t r = mant >> shift;
        const uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1u))) ++r;
        return static_cast<uint16_t>(sign | r);
    }
    uint32_t h = ((e - 112) << 10) | ((x & 0x7fffffu) >> 13);
    const uint32_t rem = x & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry may reach inf: correct
    return static_cast<uint16_t>(sign | h);
}

float roundToDType(float v, DType t)
{
    switch (t) {
    case DType::F32: return v;
    case DType::F16: return halfToFloat(floatToHalfBits(v));
    case DType::BF16: {
        uint32_t x;
        std::memcpy(&x, &v, sizeof x);
        x = bf16RoundedBits(x);
        std::memcpy(&v, &x, sizeof v);
        return v;
    }
    case DType::I32:
    case DType::U8: break;
    }
    TS_ASSERT(false);
    return v;
}

namespace {

// One copy per ISA level (ifunc): the default build targets baseline x86-64, and mixed-precision
// steps round every dense and convolution operand and result.
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void roundBf16Array(const float* in, float* out,
                                                                                                 int64_t n)
{
    for (int64_t i = 0; i < n; ++i) {
        uint32_t x;
        std::memcpy(&x, &in[i], sizeof x);
        x = bf16RoundedBits(x);
        std::memcpy(&out[i], &x, sizeof x);
    }
}

__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void bf16BitsArray(const float* in, uint16_t* out,
                                                                                                int64_t n)
{
    for (int64_t i = 0; i < n; ++i) {
        uint32_t x;
        std::memcpy(&x, &in[i], sizeof x);
        out[i] = static_cast<uint16_t>(bf16RoundedBits(x) >> 16);
    }
}

#if defined(__x86_64__)
// F16C's conversions are IEEE round-to-nearest-even with subnormals, overflow to inf and quiet
// NaNs: the scalar floatToHalfBits exactly (tst_ops halfRoundingMatchesHardware checks it).
__attribute__((target("avx,f16c"))) int64_t roundF16Hardware(const float* in, float* out, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
    }
    return i;
}
#endif

} // namespace

void roundToDType(const float* in, float* out, int64_t n, DType t)
{
    if (t == DType::BF16) {
        roundBf16Array(in, out, n);
        return;
    }
    int64_t i = 0;
#if defined(__x86_64__)
    static const bool f16c = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
    if (t == DType::F16 && f16c) i = roundF16Hardware(in, out, n);
#endif
    for (; i < n; ++i) out[i] = roundToDType(in[i], t);
}

void floatToBf16Bits(const float* in, uint16_t* out, int64_t n) { bf16BitsArray(in, out, n); }

int64_t Tensor::firstNonFinite() const
{
    assert(hostAccessible());
    // A value is NaN or infinite when its exponent bits are all ones.
    auto scan = [this]<typename Bits>(Bits mask) -> int64_t {
        const Bits* v = data<Bits>();
        const int64_t n = numel();
        constexpr int64_t kBlock = 4096;  // branch-free inside a block, so the compiler vectorises it
        for (int64_t b = 0; b < n; b += kBlock) {
            const int64_t e = std::min(n, b + kBlock);
            bool any = false;
            for (int64_t i = b; i < e; ++i) any |= (v[i] & mask) == mask;
            if (!any) continue;
            for (int64_t i = b; i < e; ++i)
                if ((v[i] & mask) == mask) return i;
        }
        return -1;
    };
    switch (m_dtype) {
    case DType::F32: return scan(uint32_t{0x7f800000u});
    case DType::F16: return scan(uint16_t{0x7c00u});
    case DType::BF16: return scan(uint16_t{0x7f80u});
    default: return -1;
    }
}

float Tensor::floatAt(int64_t flatIndex) const
{
    assert(hostAccessible() && flatIndex >= 0 && flatIndex < numel());
    switch (m_dtype) {
    case DType::F32: return data<float>()[flatIndex];
    case DType::F16: return halfToFloat(data<uint16_t>()[flatIndex]);
    case DType::BF16: {
        const uint32_t bits = static_cast<uint32_t>(data<uint16_t>()[flatIndex]) << 16;
        float f;
        std::memcpy(&f, &bits, sizeof f);
        return f;
    }
    default: assert(false && "floatAt on an integer tensor"); return 0.f;
    }
}

const char* nonFiniteName(float v)
{
    if (std::isnan(v)) return "NaN";
    return v < 0 ? "-inf" : "inf";
}

Result<Tensor> Tensor::widenedToF32() const
{
    assert(hostAccessible());
    if (m_dtype == DType::F32) return *this;
    if (m_dtype != DType::F16 && m_dtype != DType::BF16)
        return makeError(ErrorCode::InvalidArgument, std::string("cannot widen ") + dtypeName(m_dtype) + " to f32");
    TS_ASSIGN(Tensor out, Tensor::create(m_shape, DType::F32));
    const uint16_t* in = data<uint16_t>();
    float* o = out.data<float>();
    const int64_t n = numel();
    if (m_dtype == DType::BF16) {
        for (int64_t i = 0; i < n; ++i) {
            const uint32_t bits = static_cast<uint32_t>(in[i]) << 16;  // bf16 is float's upper half
            std::memcpy(&o[i], &bits, sizeof(float));
        }
    } else {
        for (int64_t i = 0; i < n; ++i) o[i] = halfToFloat(in[i]);
    }
    return out;
}

} // namespace ts
