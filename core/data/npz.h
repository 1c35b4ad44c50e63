#pragma once
// NumPy .npz archives (numpy.savez / savez_compressed): a zip file of .npy members, stored or
// deflated. Read with libzip; each member is parsed by readNpy (io/npy.h), so the same dtypes
// are accepted (f4, f8 -> f32; i4, i8 -> i32; u1, b1 -> u8; C order).

#include <map>
#include <string>
#include <vector>

#include "common/result.h"
#include "tensor/tensor.h"

namespace ts {

// The archive's array names ("x" for member "x.npy"), in archive order.
Result<std::vector<std::string>> listNpz(const std::string& path);

// Reads the named arrays (all if `names` is empty). NotFound names the archive, the missing
// array and the arrays present; a corrupt archive or member gives an error naming
// "<archive>[<member>]" and, from readNpy, what is wrong in it.
Result<std::map<std::string, Tensor>> readNpz(const std::string& path, const std::vector<std::string>& names = {});

// Writes an uncompressed .npz (for tests and tools); arrays as writeNpy writes them.
Status writeNpz(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& arrays);

} // namespace ts
