#pragma once
// NumPy .npy files (format versions 1.0, 2.0 and 3.0), C order only.

#include <string>

#include "common/result.h"
#include "tensor/tensor.h"

namespace ts {

// Reads a host tensor. dtypes: <f4 -> F32; <f8 -> F32 (rounded to nearest float); <i4 -> I32;
// <i8 -> I32 (an error names the first element outside int32's range); |u1 -> U8; |b1 -> U8 (0/1).
// Fortran-order arrays, big-endian and structured dtypes are refused with a message saying how
// to re-save the array. Errors name the file.
Result<Tensor> readNpy(const std::string& path);

// Writes a version 1.0 file (2.0 if the header would not fit) atomically, like numpy.save:
// F32 as <f4, I32 as <i4, U8 as |u1. Other dtypes give Unsupported.
Status writeNpy(const std::string& path, const Tensor& tensor);

} // namespace ts
