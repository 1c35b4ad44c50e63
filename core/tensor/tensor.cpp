#include "tensor/tensor.h"

#include <cassert>
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
