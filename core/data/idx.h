#pragma once
// IDX files (the MNIST family's format): big-endian header, magic 00 00 <type> <rank>, then
// <rank> big-endian uint32 dimensions, then the elements in row-major order.
// Only unsigned-byte data (type 0x08) is read; that is what MNIST and Fashion-MNIST use.

#include <cstdint>
#include <string>
#include <vector>

#include "common/result.h"

namespace ts {

struct IdxArray {
    std::vector<int64_t> dims;  // e.g. {60000, 28, 28}
    std::vector<uint8_t> data;  // product(dims) bytes, row-major
};

// Reads a gzipped (.gz) or raw IDX file; zlib reads raw files transparently, so the name's
// extension does not matter. Errors: NotFound (missing file), IoError (unreadable, truncated,
// corrupt gzip stream), ParseError (wrong magic, element type other than unsigned byte,
// dimension product overflow, trailing bytes). Every message names the file.
Result<IdxArray> readIdx(const std::string& path);

} // namespace ts
