#pragma once
// Built-in map functions of the input pipeline. Each returns a MapFunction that carries its name
// and parameters, so a pipeline using it round-trips through JSON. Image functions work on x of
// shape (H, W) or (H, W, C) (channels-last, as Keras); they never modify the input's tensors.
// Random functions draw from elementSeed(seed, epoch, element key): the same element in the
// same epoch gets the same augmentation whatever the thread count or shuffle order.

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/result.h"
#include "data/pipeline_config.h"

namespace ts {

// x' = (x * scale - mean) / std as f32. scale < 0 means "automatic": 1/255 for u8 input, else 1.
// mean/std hold one value, or one per channel (the last dimension of x); empty = 0 / 1.
MapFunction normaliseFn(float scale = -1.f, std::vector<float> mean = {}, std::vector<float> stddev = {});
// y (an integer class id in [0, depth)) -> f32 one-hot vector of length depth.
MapFunction oneHotFn(int64_t depth);
enum class FlipMode { Horizontal, Vertical, Both };
// Mirrors x left-right (and/or up-down) with probability 1/2 each.
MapFunction randomFlipFn(FlipMode mode = FlipMode::Horizontal);
// Pads x by `padding` zeros on every side, then cuts a random (height, width) window.
MapFunction randomCropFn(int64_t height, int64_t width, int64_t padding = 0);
// Converts x (target "x") or y (target "y") to f32, i32 or u8 (u8: rounded and clamped to 0..255).
MapFunction castFn(DType dtype, const std::string& target = "x");
// Gives x a new shape with the same element count (one dimension may be -1).
MapFunction reshapeFn(std::vector<int64_t> shape);
// Reads the image file named by the element's origin (PNG or JPEG, by content) and decodes it to
// u8 (height, width, channels), resized bilinearly. The image_folder source emits undecoded
// elements; the pipeline inserts this right after it unless the transformations name it.
MapFunction decodeImageFn(int64_t height, int64_t width, int channels);
// A C++ function under a label (shown in statistics; not loadable from JSON).
MapFunction customMapFn(std::string label, MapFn fn, bool random = false);

// Builds a built-in from its JSON name and parameters ({"fn": "random_crop", "size": [24, 24],
// "padding": 4} without "op"/"fn"/"num_parallel_calls"/"deterministic"/"seed"). Errors name
// `where` and the bad key.
Result<MapFunction> builtinMapFunction(const std::string& name, const nlohmann::json& params, const std::string& where);
// The names builtinMapFunction accepts, for the studio's editor.
std::vector<std::string> builtinMapNames();

} // namespace ts
