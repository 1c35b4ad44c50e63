#pragma once
// DType, Shape, Device and Tensor. A Tensor is a contiguous, row-major view on a reference-counted
// Storage owned by an Allocator of the device it lives on. Copies of a Tensor share storage
// (like a shared_ptr); clone() copies the data. Tensors are not thread-safe to mutate from two
// threads at once; sharing read-only views across threads is fine.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "common/result.h"

namespace ts {

enum class DType : uint8_t { F32, F16, BF16, I32, U8 };

std::size_t dtypeSize(DType t);
const char* dtypeName(DType t);  // "f32", "f16", "bf16", "i32", "u8"

// `v` rounded to the nearest value of F16 or BF16 (ties to even), as a float: what a 16-bit
// tensor would hold. F16 overflows to +-inf beyond 65504 (from 65520 on) and keeps subnormals;
// NaN stays NaN. F32 returns `v`. Other dtypes are a programming error.
float roundToDType(float v, DType t);
// The same over n floats; `in` may equal `out`.
void roundToDType(const float* in, float* out, int64_t n, DType t);
// IEEE 754 binary16 bits of `v`, rounded to nearest even (the inverse of widening).
uint16_t floatToHalfBits(float v);
// "NaN", "inf" or "-inf" for a value that is not finite (messages that report one).
const char* nonFiniteName(float v);
// bf16 bits of n floats, rounded as roundToDType(BF16) rounds (for kernels that read bf16).
void floatToBf16Bits(const float* in, uint16_t* out, int64_t n);

class Shape {
public:
    Shape() = default;
    Shape(std::initializer_list<int64_t> dims) : m_dims(dims) {}
    explicit Shape(std::vector<int64_t> dims) : m_dims(std::move(dims)) {}

    int rank() const { return static_cast<int>(m_dims.size()); }
    int64_t operator[](int i) const { return m_dims[static_cast<std::size_t>(i < 0 ? i + rank() : i)]; }
    int64_t& operator[](int i) { return m_dims[static_cast<std::size_t>(i < 0 ? i + rank() : i)]; }
    int64_t numel() const;
    const std::vector<int64_t>& dims() const { return m_dims; }
    // Product of dims from `first` (inclusive) to `last` (exclusive).
    int64_t product(int first, int last) const;
    std::string toString() const;  // "(256, 784)"
    bool operator==(const Shape& o) const = default;

private:
    std::vector<int64_t> m_dims;
};

enum class DeviceKind : uint8_t { Cpu, Cuda };

struct Device {
    DeviceKind kind = DeviceKind::Cpu;
    int index = 0;
    std::string toString() const;  // "cpu:0", "gpu:1"
    bool operator==(const Device& o) const = default;
    // Parses "cpu:0", "cpu", "gpu:1", "cuda:1".
    static Result<Device> parse(const std::string& text);
};

// Contract: allocate() returns memory aligned to at least 64 bytes or nullptr on failure;
// deallocate() accepts exactly what allocate() returned. Implementations are thread-safe.
class Allocator {
public:
    virtual ~Allocator() = default;
    virtual void* allocate(std::size_t bytes) = 0;
    virtual void deallocate(void* p, std::size_t bytes) = 0;
    virtual Device device() const = 0;
    // Whether the CPU may read/write this memory directly.
    virtual bool hostAccessible() const = 0;
};

Allocator& hostAllocator();

class Storage {
public:
    Storage(Allocator& alloc, std::size_t bytes);
    ~Storage();
    Storage(const Storage&) = delete;
    Storage& operator=(const Storage&) = delete;

    void* data() const { return m_data; }
    std::size_t bytes() const { return m_bytes; }
    Allocator& allocator() const { return *m_alloc; }

private:
    Allocator* m_alloc;
    void* m_data;
    std::size_t m_bytes;
};

class Tensor {
public:
    Tensor() = default;

    // Uninitialised; an error (OutOfMemory) if the allocator cannot provide the memory.
    static Result<Tensor> create(Shape shape, DType dtype, Allocator& alloc = hostAllocator());
    // Host tensors for tests and setup code: abort-free but assume the host has the memory.
    static Tensor empty(Shape shape, DType dtype = DType::F32);
    static Tensor zeros(Shape shape, DType dtype = DType::F32);
    static Tensor fromVector(Shape shape, const std::vector<float>& values);

    bool defined() const { return static_cast<bool>(m_storage); }
    const Shape& shape() const { return m_shape; }
    DType dtype() const { return m_dtype; }
    int64_t numel() const { return m_shape.numel(); }
    std::size_t bytes() const { return static_cast<std::size_t>(numel()) * dtypeSize(m_dtype); }
    Device device() const;
    bool hostAccessible() const;

    void* raw() const;
    template <typename T>
    T* data() const { return static_cast<T*>(raw()); }

    // Same storage, new shape with the same element count.
    Tensor reshaped(Shape shape) const;
    // Rows [begin, end) of the first dimension, sharing storage.
    Tensor rows(int64_t begin, int64_t end) const;
    // Deep copy on the same allocator.
    Tensor clone() const;
    // Host-only helpers (assert hostAccessible()).
    void fill(float value);
    std::vector<float> toVector() const;
    // Host-only: an F32 copy of an F16 or BF16 tensor (exact: every half value is a float);
    // F32 is returned as is. An error for other dtypes or when memory runs out.
    Result<Tensor> widenedToF32() const;
    // Host-only: the flat index of the first NaN or infinity in an F32, F16 or BF16 tensor, or
    // -1 when every value is finite (and always for integer dtypes). Data files and weight files
    // are checked with it where they are read: one NaN in the data spreads through the weights
    // within a step, while a ReLU can still hide it from the loss.
    int64_t firstNonFinite() const;
    // Host-only: element `flatIndex` of an F32, F16 or BF16 tensor as a float.
    float floatAt(int64_t flatIndex) const;

    std::shared_ptr<Storage> storage() const { return m_storage; }

private:
    std::shared_ptr<Storage> m_storage;
    std::size_t m_offset = 0;  // bytes
    Shape m_shape;
    DType m_dtype = DType::F32;
};

} // namespace ts
