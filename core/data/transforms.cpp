#include "data/transforms.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <set>

#include "data/image_folder.h"

namespace ts {

namespace {

using json = nlohmann::json;

Error elementError(const Element& e, const std::string& what, std::string hint = {})
{
    return makeError(ErrorCode::InvalidArgument, e.where() + ": " + what, std::move(hint));
}

// Reads element i of a host tensor as float.
inline float loadAt(const Tensor& t, int64_t i)
{
    switch (t.dtype()) {
    case DType::F32: return t.data<float>()[i];
    case DType::I32: return static_cast<float>(t.data<int32_t>()[i]);
    case DType::U8: return static_cast<float>(t.data<uint8_t>()[i]);
    default: return 0.f;
    }
}

bool numericDType(DType t) { return t == DType::F32 || t == DType::I32 || t == DType::U8; }

// (H, W, C) view of an image element: rank 2 -> C = 1.
struct ImageDims {
    int64_t h = 0, w = 0, c = 1;
};

Result<ImageDims> imageDims(const Element& e, const char* fn)
{
    if (!e.x.defined())
        return elementError(e, std::string(fn) + ": the element has no features (is the image decoded?)",
                            "put map decode_image before it");
    const Shape& s = e.x.shape();
    if (s.rank() == 2) return ImageDims{s[0], s[1], 1};
    if (s.rank() == 3) return ImageDims{s[0], s[1], s[2]};
    return elementError(e, std::string(fn) + " needs an image of shape (H, W) or (H, W, C), got " + s.toString(),
                        "use layout \"image\" for idx sources, or map reshape to (H, W, C) first");
}

MapFunction makeBuiltin(std::string name, json params, MapFn fn, bool random = false)
{
    MapFunction f;
    f.name = std::move(name);
    f.params = std::move(params);
    f.fn = std::move(fn);
    f.builtin = true;
    f.random = random;
    return f;
}

const char* dtypeJsonName(DType t) { return dtypeName(t); }

} // namespace

MapFunction normaliseFn(float scale, std::vector<float> mean, std::vector<float> stddev)
{
    json params = json::object();
    if (scale >= 0) params["scale"] = scale;
    if (!mean.empty()) params["mean"] = mean;
    if (!stddev.empty()) params["std"] = stddev;
    for (float& s : stddev)
        if (s == 0.f) s = 1.f;  // guarded again in builtinMapFunction; keeps a C++ caller's zero from dividing
    auto fn = [scale, mean, stddev](Element&& e, const MapContext&) -> Result<Element> {
        if (!e.x.defined()) return elementError(e, "normalise: the element has no features", "put map decode_image first");
        if (!numericDType(e.x.dtype()))
            return elementError(e, std::string("normalise: x is ") + dtypeName(e.x.dtype()) + "; expected u8, i32 or f32");
        const Shape& s = e.x.shape();
        const int64_t channels = s.rank() > 0 ? s[-1] : 1;
        const std::size_t groups = std::max(mean.size(), stddev.size());
        if (groups > 1 && static_cast<int64_t>(groups) != channels)
            return elementError(e, "normalise: " + std::to_string(groups) + " per-channel values for x of shape " +
                                       s.toString() + " (last dimension " + std::to_string(channels) + ")",
                                "give one mean/std per channel, or a single value");
        const float sc = scale >= 0 ? scale : (e.x.dtype() == DType::U8 ? 1.f / 255.f : 1.f);
        TS_ASSIGN(Tensor out, Tensor::create(s, DType::F32));
        float* o = out.data<float>();
        const int64_t n = e.x.numel();
        auto meanAt = [&](int64_t c) { return mean.empty() ? 0.f : mean[mean.size() == 1 ? 0 : static_cast<std::size_t>(c)]; };
        auto stdAt = [&](int64_t c) { return stddev.empty() ? 1.f : stddev[stddev.size() == 1 ? 0 : static_cast<std::size_t>(c)]; };
        if (groups <= 1) {
            const float m = meanAt(0), inv = 1.f / stdAt(0);
            if (e.x.dtype() == DType::U8) {
                // One multiply-add per value vectorises; a lookup table per element did not.
                const float a = sc * inv, b = -m * inv;
                const uint8_t* p = e.x.data<uint8_t>();
                for (int64_t i = 0; i < n; ++i) o[i] = static_cast<float>(p[i]) * a + b;
            } else if (e.x.dtype() == DType::F32) {
                const float* p = e.x.data<float>();
                for (int64_t i = 0; i < n; ++i) o[i] = (p[i] * sc - m) * inv;
            } else {
                for (int64_t i = 0; i < n; ++i) o[i] = (loadAt(e.x, i) * sc - m) * inv;
            }
        } else {
            for (int64_t i = 0; i < n; ++i) {
                const int64_t c = i % channels;
                o[i] = (loadAt(e.x, i) * sc - meanAt(c)) / stdAt(c);
            }
        }
        e.x = std::move(out);
        return std::move(e);
    };
    return makeBuiltin("normalise", std::move(params), std::move(fn));
}

MapFunction oneHotFn(int64_t depth)
{
    auto fn = [depth](Element&& e, const MapContext&) -> Result<Element> {
        if (!e.y.defined()) return elementError(e, "one_hot: the element has no label");
        if (e.y.numel() != 1 || (e.y.dtype() != DType::I32 && e.y.dtype() != DType::U8))
            return elementError(e, "one_hot: the label must be one integer class id, got " + std::string(dtypeName(e.y.dtype())) +
                                       " of shape " + e.y.shape().toString());
        const int64_t label = e.y.dtype() == DType::I32 ? e.y.data<int32_t>()[0] : e.y.data<uint8_t>()[0];
        if (label < 0 || label >= depth)
            return elementError(e, "one_hot: label " + std::to_string(label) + " is outside [0, " + std::to_string(depth) + ")",
                                "raise depth to the number of classes");
        TS_ASSIGN(Tensor out, Tensor::create(Shape{depth}, DType::F32));
        std::fill_n(out.data<float>(), depth, 0.f);
        out.data<float>()[label] = 1.f;
        e.y = std::move(out);
        return std::move(e);
    };
    return makeBuiltin("one_hot", json{{"depth", depth}}, std::move(fn));
}

MapFunction randomFlipFn(FlipMode mode)
{
    const char* modeName = mode == FlipMode::Horizontal ? "horizontal" : mode == FlipMode::Vertical ? "vertical" : "horizontal_and_vertical";
    auto fn = [mode](Element&& e, const MapContext& ctx) -> Result<Element> {
        TS_ASSIGN(ImageDims d, imageDims(e, "random_flip"));
        SplitMix rng(elementSeed(ctx.seed, ctx.epoch, e.key));
        const uint64_t r = rng.next();
        const bool flipH = (mode != FlipMode::Vertical) && (r & 1);
        const bool flipV = (mode != FlipMode::Horizontal) && (r & 2);
        if (!flipH && !flipV) return std::move(e);
        TS_ASSIGN(Tensor out, Tensor::create(e.x.shape(), e.x.dtype()));
        const std::size_t px = static_cast<std::size_t>(d.c) * dtypeSize(e.x.dtype());
        const auto* src = static_cast<const uint8_t*>(e.x.raw());
        auto* dst = static_cast<uint8_t*>(out.raw());
        for (int64_t i = 0; i < d.h; ++i) {
            const int64_t si = flipV ? d.h - 1 - i : i;
            const uint8_t* srow = src + static_cast<std::size_t>(si * d.w) * px;
            uint8_t* drow = dst + static_cast<std::size_t>(i * d.w) * px;
            if (!flipH) {
                std::memcpy(drow, srow, static_cast<std::size_t>(d.w) * px);
            } else {
                for (int64_t j = 0; j < d.w; ++j)
                    std::memcpy(drow + static_cast<std::size_t>(j) * px, srow + static_cast<std::size_t>(d.w - 1 - j) * px, px);
            }
        }
        e.x = std::move(out);
        return std::move(e);
    };
    return makeBuiltin("random_flip", json{{"mode", modeName}}, std::move(fn), true);
}

MapFunction randomCropFn(int64_t height, int64_t width, int64_t padding)
{
    auto fn = [height, width, padding](Element&& e, const MapContext& ctx) -> Result<Element> {
        TS_ASSIGN(ImageDims d, imageDims(e, "random_crop"));
        const int64_t ph = d.h + 2 * padding, pw = d.w + 2 * padding;
        if (height > ph || width > pw)
            return elementError(e, "random_crop: a " + std::to_string(height) + "x" + std::to_string(width) +
                                       " window does not fit the " + std::to_string(ph) + "x" + std::to_string(pw) +
                                       " padded image",
                                "crop to at most the image size plus twice the padding");
        SplitMix rng(elementSeed(ctx.seed, ctx.epoch, e.key) ^ 0xC0FFEEull);
        const int64_t oy = static_cast<int64_t>(rng.below(static_cast<uint64_t>(ph - height + 1))) - padding;
        const int64_t ox = static_cast<int64_t>(rng.below(static_cast<uint64_t>(pw - width + 1))) - padding;
        Shape shape = e.x.shape().rank() == 2 ? Shape{height, width} : Shape{height, width, d.c};
        TS_ASSIGN(Tensor out, Tensor::create(shape, e.x.dtype()));
        const std::size_t px = static_cast<std::size_t>(d.c) * dtypeSize(e.x.dtype());
        const auto* src = static_cast<const uint8_t*>(e.x.raw());
        auto* dst = static_cast<uint8_t*>(out.raw());
        std::memset(dst, 0, out.bytes());
        for (int64_t i = 0; i < height; ++i) {
            const int64_t si = oy + i;
            if (si < 0 || si >= d.h) continue;
            const int64_t j0 = std::max<int64_t>(0, -ox), j1 = std::min<int64_t>(width, d.w - ox);
            if (j1 <= j0) continue;
            std::memcpy(dst + static_cast<std::size_t>(i * width + j0) * px,
                        src + static_cast<std::size_t>(si * d.w + ox + j0) * px, static_cast<std::size_t>(j1 - j0) * px);
        }
        e.x = std::move(out);
        return std::move(e);
    };
    return makeBuiltin("random_crop", json{{"size", {height, width}}, {"padding", padding}}, std::move(fn), true);
}

MapFunction castFn(DType dtype, const std::string& target)
{
    const bool onY = target == "y";
    auto fn = [dtype, onY](Element&& e, const MapContext&) -> Result<Element> {
        Tensor& t = onY ? e.y : e.x;
        if (!t.defined()) return elementError(e, std::string("cast: the element has no ") + (onY ? "label" : "features"));
        if (t.dtype() == dtype) return std::move(e);
        if (!numericDType(t.dtype()) || !numericDType(dtype))
            return elementError(e, std::string("cast: cannot convert ") + dtypeName(t.dtype()) + " to " + dtypeName(dtype));
        TS_ASSIGN(Tensor out, Tensor::create(t.shape(), dtype));
        const int64_t n = t.numel();
        for (int64_t i = 0; i < n; ++i) {
            const float v = loadAt(t, i);
            switch (dtype) {
            case DType::F32: out.data<float>()[i] = v; break;
            case DType::I32: out.data<int32_t>()[i] = static_cast<int32_t>(std::lrint(v)); break;
            case DType::U8: out.data<uint8_t>()[i] = static_cast<uint8_t>(std::clamp(std::lrint(v), 0L, 255L)); break;
            default: break;
            }
        }
        t = std::move(out);
        return std::move(e);
    };
    return makeBuiltin("cast", json{{"dtype", dtypeJsonName(dtype)}, {"target", onY ? "y" : "x"}}, std::move(fn));
}

MapFunction reshapeFn(std::vector<int64_t> shape)
{
    auto fn = [shape](Element&& e, const MapContext&) -> Result<Element> {
        if (!e.x.defined()) return elementError(e, "reshape: the element has no features");
        std::vector<int64_t> dims = shape;
        int64_t known = 1;
        int inferred = -1;
        for (std::size_t i = 0; i < dims.size(); ++i) {
            if (dims[i] == -1) inferred = static_cast<int>(i);
            else known *= dims[i];
        }
        if (inferred >= 0 && known > 0 && e.x.numel() % known == 0) dims[static_cast<std::size_t>(inferred)] = e.x.numel() / known;
        Shape s(dims);
        if (s.numel() != e.x.numel())
            return elementError(e, "reshape: x of shape " + e.x.shape().toString() + " (" + std::to_string(e.x.numel()) +
                                       " values) cannot become " + Shape(shape).toString());
        e.x = e.x.reshaped(std::move(s));
        return std::move(e);
    };
    return makeBuiltin("reshape", json{{"shape", shape}}, std::move(fn));
}

MapFunction decodeImageFn(int64_t height, int64_t width, int channels)
{
    auto fn = [height, width, channels](Element&& e, const MapContext&) -> Result<Element> {
        if (!e.origin) return elementError(e, "decode_image: the element names no image file");
        auto img = decodeImageFile(*e.origin, height, width, channels);
        if (!img.ok()) {
            Error err = img.takeError();
            err.message = e.where() + ": " + err.message;
            return err;
        }
        e.x = std::move(img).value();
        return std::move(e);
    };
    return makeBuiltin("decode_image", json{{"image_size", {height, width}}, {"channels", channels}}, std::move(fn));
}

MapFunction customMapFn(std::string label, MapFn fn, bool random)
{
    MapFunction f;
    f.name = std::move(label);
    f.fn = std::move(fn);
    f.random = random;
    return f;
}

std::vector<std::string> builtinMapNames()
{
    return {"normalise", "one_hot", "random_flip", "random_crop", "cast", "reshape", "decode_image"};
}

Result<MapFunction> builtinMapFunction(const std::string& name, const nlohmann::json& params, const std::string& where)
{
    const json p = params.is_null() ? json::object() : params;
    auto fail = [&](const std::string& what, const std::string& hint = {}) {
        return makeError(ErrorCode::ParseError, where + ": " + name + ": " + what, hint);
    };
    auto allow = [&](std::set<std::string> keys) -> Status {
        for (auto it = p.begin(); it != p.end(); ++it)
            if (!keys.count(it.key())) {
                std::string list;
                for (const auto& k : keys) list += (list.empty() ? "" : ", ") + k;
                return fail("unknown parameter \"" + it.key() + "\"", list.empty() ? "it takes no parameters" : "parameters: " + list);
            }
        return okStatus();
    };
    auto floats = [&](const char* key, std::vector<float>& out) -> Status {
        if (!p.contains(key)) return okStatus();
        const json& v = p[key];
        if (v.is_number()) out = {v.get<float>()};
        else if (v.is_array() && !v.empty() && std::all_of(v.begin(), v.end(), [](const json& e) { return e.is_number(); }))
            for (const auto& e : v) out.push_back(e.get<float>());
        else return fail(std::string("\"") + key + "\" must be a number or a list of numbers, got " + v.dump());
        return okStatus();
    };
    auto intPair = [&](const char* key, int64_t& a, int64_t& b) -> Status {
        if (!p.contains(key) || !p[key].is_array() || p[key].size() != 2 || !p[key][0].is_number_integer() ||
            !p[key][1].is_number_integer())
            return fail(std::string("\"") + key + "\" must be [height, width]");
        a = p[key][0].get<int64_t>();
        b = p[key][1].get<int64_t>();
        if (a < 1 || b < 1) return fail(std::string("\"") + key + "\" must be positive");
        return okStatus();
    };
    auto dtypeOf = [&](const std::string& s) -> Result<DType> {
        if (s == "f32" || s == "float32") return DType::F32;
        if (s == "i32" || s == "int32") return DType::I32;
        if (s == "u8" || s == "uint8") return DType::U8;
        return fail("dtype \"" + s + "\" is not f32, i32 or u8");
    };

    if (name == "normalise" || name == "normalize") {
        TS_TRY(allow({"scale", "mean", "std"}));
        float scale = -1.f;
        if (p.contains("scale")) {
            if (!p["scale"].is_number()) return fail("\"scale\" must be a number");
            scale = p["scale"].get<float>();
        }
        std::vector<float> mean, sd;
        TS_TRY(floats("mean", mean));
        TS_TRY(floats("std", sd));
        for (float s : sd)
            if (s == 0.f) return fail("\"std\" holds a zero", "a standard deviation of 0 would divide by zero");
        if (!mean.empty() && !sd.empty() && mean.size() != sd.size() && mean.size() != 1 && sd.size() != 1)
            return fail("\"mean\" has " + std::to_string(mean.size()) + " values but \"std\" has " + std::to_string(sd.size()));
        return normaliseFn(scale, mean, sd);
    }
    if (name == "one_hot") {
        TS_TRY(allow({"depth"}));
        if (!p.contains("depth") || !p["depth"].is_number_integer() || p["depth"].get<int64_t>() < 1)
            return fail("needs \"depth\" (the number of classes, >= 1)");
        return oneHotFn(p["depth"].get<int64_t>());
    }
    if (name == "random_flip") {
        TS_TRY(allow({"mode"}));
        const std::string mode = p.value("mode", std::string("horizontal"));
        if (mode == "horizontal") return randomFlipFn(FlipMode::Horizontal);
        if (mode == "vertical") return randomFlipFn(FlipMode::Vertical);
        if (mode == "horizontal_and_vertical") return randomFlipFn(FlipMode::Both);
        return fail("\"mode\" \"" + mode + "\" is not horizontal, vertical or horizontal_and_vertical");
    }
    if (name == "random_crop") {
        TS_TRY(allow({"size", "padding"}));
        int64_t h = 0, w = 0;
        TS_TRY(intPair("size", h, w));
        int64_t pad = 0;
        if (p.contains("padding")) {
            if (!p["padding"].is_number_integer() || p["padding"].get<int64_t>() < 0) return fail("\"padding\" must be an integer >= 0");
            pad = p["padding"].get<int64_t>();
        }
        return randomCropFn(h, w, pad);
    }
    if (name == "cast") {
        TS_TRY(allow({"dtype", "target"}));
        if (!p.contains("dtype") || !p["dtype"].is_string()) return fail("needs \"dtype\" (f32, i32 or u8)");
        TS_ASSIGN(DType t, dtypeOf(p["dtype"].get<std::string>()));
        const std::string target = p.value("target", std::string("x"));
        if (target != "x" && target != "y") return fail("\"target\" must be \"x\" or \"y\"");
        return castFn(t, target);
    }
    if (name == "reshape") {
        TS_TRY(allow({"shape"}));
        if (!p.contains("shape") || !p["shape"].is_array() || p["shape"].empty())
            return fail("needs \"shape\", e.g. [28, 28, 1]");
        std::vector<int64_t> dims;
        int inferred = 0;
        for (const auto& d : p["shape"]) {
            if (!d.is_number_integer() || d.get<int64_t>() == 0 || d.get<int64_t>() < -1)
                return fail("\"shape\" entries must be positive integers or one -1");
            if (d.get<int64_t>() == -1) ++inferred;
            dims.push_back(d.get<int64_t>());
        }
        if (inferred > 1) return fail("\"shape\" may infer one dimension (-1), not " + std::to_string(inferred));
        return reshapeFn(dims);
    }
    if (name == "decode_image") {
        TS_TRY(allow({"image_size", "channels"}));
        int64_t h = 0, w = 0;
        TS_TRY(intPair("image_size", h, w));
        const int64_t c = p.value("channels", int64_t{3});
        if (c != 1 && c != 3) return fail("\"channels\" must be 1 or 3");
        return decodeImageFn(h, w, static_cast<int>(c));
    }
    std::string list;
    for (const auto& n : builtinMapNames()) list += (list.empty() ? "" : ", ") + n;
    return makeError(ErrorCode::ParseError, where + ".fn: unknown map function \"" + name + "\"", "built-ins: " + list);
}

} // namespace ts
