#pragma once
// safetensors (https://github.com/huggingface/safetensors): an 8-byte little-endian header
// length N, N bytes of JSON header
//   {"__metadata__": {"k": "v"}, "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}}
// padded with spaces to a multiple of 8, then the tensors' bytes (offsets relative to the end of
// the header). TrainStudio reads and writes F32, F16, BF16, I32 and U8 tensors.

#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/result.h"
#include "tensor/tensor.h"

namespace ts {

struct SafetensorsFile {
    std::map<std::string, Tensor> tensors;         // host tensors
    std::vector<std::string> order;                // tensor names in the header's order
    std::map<std::string, std::string> metadata;   // the "__metadata__" entry

    // The tensors with their names, in the header's order (what importParameters takes).
    std::vector<std::pair<std::string, Tensor>> inOrder() const
    {
        std::vector<std::pair<std::string, Tensor>> out;
        out.reserve(order.size());
        for (const auto& name : order) out.emplace_back(name, tensors.at(name));
        return out;
    }
};

// The metadata TrainStudio writes with a model's weights.
inline std::map<std::string, std::string> weightsMetadata(const std::string& model, int64_t step)
{
    return {{"format", "trainstudio"}, {"model", model}, {"step", std::to_string(step)}};
}

// Writes the tensors atomically: a reader sees the old file or the complete new one, never a
// partial write. The header keeps the given order; the data is laid out widest dtype first so
// each tensor is aligned to its element size. Tensors must be defined and host
// accessible, names unique, non-empty and not "__metadata__".
Status writeSafetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                        const std::map<std::string, std::string>& metadata = {});

// Validates the whole file before returning anything: header length, JSON, dtypes, shapes and
// offsets (in range, matching dtype and shape, no overlaps or gaps, covering the whole buffer,
// as the reference implementation requires). Errors name the file and the tensor.
Result<SafetensorsFile> readSafetensors(const std::string& path);

// The bytes writeSafetensors would write, in memory (for sending weights over the network);
// `label` names them in errors.
Result<std::string> encodeSafetensors(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                      const std::map<std::string, std::string>& metadata, const std::string& label);
// readSafetensors over bytes in memory, with the same validation; `label` names them in errors.
Result<SafetensorsFile> decodeSafetensors(std::string_view bytes, const std::string& label);

// Writes `parts` one after another to a temporary file in path's folder, fsyncs it and renames
// it over `path` (then fsyncs the folder), so a crash never leaves a half-written file behind.
// Shared by the writers in core/io.
Status writeFileAtomically(const std::string& path, const std::vector<std::string_view>& parts);

} // namespace ts
