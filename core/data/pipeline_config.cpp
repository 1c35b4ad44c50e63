#include "data/pipeline_config.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <set>

#include "common/limits.h"
#include "common/json_keys.h"
#include "data/transforms.h"

namespace ts {

namespace {
// The hint of a pipeline error that has no more specific one.
constexpr const char* kPipelineHint = "fix the value at that key; core/data/pipeline_config.h lists every source's and op's settings and their ranges";
} // namespace

const char* sourceKindName(SourceKind kind)
{
    switch (kind) {
    case SourceKind::Idx: return "idx";
    case SourceKind::Csv: return "csv";
    case SourceKind::Npy: return "npy";
    case SourceKind::Npz: return "npz";
    case SourceKind::ImageFolder: return "image_folder";
    case SourceKind::Tensors: return "tensors";
    }
    return "unknown";
}

const char* transformKindName(TransformKind kind)
{
    switch (kind) {
    case TransformKind::Map: return "map";
    case TransformKind::Shuffle: return "shuffle";
    case TransformKind::Batch: return "batch";
    case TransformKind::Prefetch: return "prefetch";
    case TransformKind::Cache: return "cache";
    case TransformKind::Repeat: return "repeat";
    case TransformKind::Take: return "take";
    case TransformKind::Skip: return "skip";
    case TransformKind::Shard: return "shard";
    case TransformKind::Interleave: return "interleave";
    }
    return "unknown";
}

// ---------------------------------------------------------------------------------------------
// SourceSpec / TransformSpec constructors

SourceSpec SourceSpec::idxDir(std::string dir, std::string split, std::string layout)
{
    SourceSpec s;
    s.kind = SourceKind::Idx;
    s.dir = std::move(dir);
    s.split = std::move(split);
    s.layout = std::move(layout);
    return s;
}

SourceSpec SourceSpec::idxFiles(std::string images, std::string labels, std::string layout)
{
    SourceSpec s;
    s.kind = SourceKind::Idx;
    s.paths = {std::move(images), std::move(labels)};
    s.layout = std::move(layout);
    return s;
}

SourceSpec SourceSpec::csv(std::vector<std::string> paths, std::string labelColumn)
{
    SourceSpec s;
    s.kind = SourceKind::Csv;
    s.paths = std::move(paths);
    s.labelColumn = std::move(labelColumn);
    return s;
}

SourceSpec SourceSpec::npy(std::string x, std::string y)
{
    SourceSpec s;
    s.kind = SourceKind::Npy;
    s.paths = {std::move(x)};
    if (!y.empty()) s.paths.push_back(std::move(y));
    return s;
}

SourceSpec SourceSpec::npz(std::vector<std::string> paths, std::string xKey, std::string yKey)
{
    SourceSpec s;
    s.kind = SourceKind::Npz;
    s.paths = std::move(paths);
    s.xKey = std::move(xKey);
    s.yKey = std::move(yKey);
    return s;
}

SourceSpec SourceSpec::imageFolder(std::string root, int64_t height, int64_t width, int channels)
{
    SourceSpec s;
    s.kind = SourceKind::ImageFolder;
    s.paths = {std::move(root)};
    s.height = height;
    s.width = width;
    s.channels = channels;
    return s;
}

SourceSpec SourceSpec::fromTensorSlices(Tensor x, Tensor y)
{
    SourceSpec s;
    s.kind = SourceKind::Tensors;
    s.x = std::move(x);
    s.y = std::move(y);
    return s;
}

namespace {

std::string countText(int64_t v) { return v == kAutotune ? std::string("AUTOTUNE") : std::to_string(v); }

} // namespace

std::string TransformSpec::label() const
{
    switch (kind) {
    case TransformKind::Map: return "map(" + fn.name + ")";
    case TransformKind::Shuffle: return "shuffle(" + std::to_string(bufferSize) + ")";
    case TransformKind::Batch: return "batch(" + std::to_string(batchSize) + ")";
    case TransformKind::Prefetch: return "prefetch(" + countText(bufferSize) + ")";
    case TransformKind::Cache: return cacheFile.empty() ? std::string("cache(memory)") : "cache(" + cacheFile + ")";
    case TransformKind::Repeat: return count < 0 ? std::string("repeat") : "repeat(" + std::to_string(count) + ")";
    case TransformKind::Take: return "take(" + std::to_string(count) + ")";
    case TransformKind::Skip: return "skip(" + std::to_string(count) + ")";
    case TransformKind::Shard:
        return "shard(" + std::to_string(numShards) + ", " + std::to_string(shardIndex) +
               (shardBlock > 0 && shardBlock != numShards ? ", block " + std::to_string(shardBlock) : std::string()) + ")";
    case TransformKind::Interleave: return "interleave(" + countText(cycleLength) + ")";
    }
    return "?";
}

const char* autoShardPolicyName(AutoShardPolicy policy)
{
    switch (policy) {
    case AutoShardPolicy::Auto: return "auto";
    case AutoShardPolicy::File: return "file";
    case AutoShardPolicy::Data: return "data";
    case AutoShardPolicy::Off: return "off";
    }
    return "?";
}

TransformSpec TransformSpec::map(MapFunction fn, int64_t numParallelCalls, std::optional<bool> deterministic)
{
    TransformSpec o;
    o.kind = TransformKind::Map;
    o.fn = std::move(fn);
    o.parallelism = numParallelCalls;
    o.deterministic = deterministic;
    return o;
}

TransformSpec TransformSpec::shuffle(int64_t bufferSize, std::optional<uint64_t> seed, bool reshuffleEachIteration)
{
    TransformSpec o;
    o.kind = TransformKind::Shuffle;
    o.bufferSize = bufferSize;
    o.seed = seed;
    o.reshuffleEachIteration = reshuffleEachIteration;
    return o;
}

TransformSpec TransformSpec::batch(int64_t size, bool dropRemainder)
{
    TransformSpec o;
    o.kind = TransformKind::Batch;
    o.batchSize = size;
    o.dropRemainder = dropRemainder;
    return o;
}

TransformSpec TransformSpec::prefetch(int64_t bufferSize)
{
    TransformSpec o;
    o.kind = TransformKind::Prefetch;
    o.bufferSize = bufferSize;
    return o;
}

TransformSpec TransformSpec::cache(std::string file)
{
    TransformSpec o;
    o.kind = TransformKind::Cache;
    o.cacheFile = std::move(file);
    return o;
}

TransformSpec TransformSpec::repeat(int64_t count)
{
    TransformSpec o;
    o.kind = TransformKind::Repeat;
    o.count = count;
    return o;
}

TransformSpec TransformSpec::take(int64_t count)
{
    TransformSpec o;
    o.kind = TransformKind::Take;
    o.count = count;
    return o;
}

TransformSpec TransformSpec::skip(int64_t count)
{
    TransformSpec o;
    o.kind = TransformKind::Skip;
    o.count = count;
    return o;
}

TransformSpec TransformSpec::shard(int64_t numShards, int64_t index, int64_t block)
{
    TransformSpec o;
    o.kind = TransformKind::Shard;
    o.numShards = numShards;
    o.shardIndex = index;
    o.shardBlock = block;
    return o;
}

TransformSpec TransformSpec::interleave(int64_t cycleLength, int64_t blockLength, int64_t numParallelCalls,
                          std::optional<bool> deterministic)
{
    TransformSpec o;
    o.kind = TransformKind::Interleave;
    o.cycleLength = cycleLength;
    o.blockLength = blockLength;
    o.parallelism = numParallelCalls;
    o.deterministic = deterministic;
    return o;
}

PipelineSpec& PipelineSpec::map(MapFunction fn, int64_t numParallelCalls, std::optional<bool> deterministic)
{
    ops.push_back(TransformSpec::map(std::move(fn), numParallelCalls, deterministic));
    return *this;
}
PipelineSpec& PipelineSpec::shuffle(int64_t bufferSize, std::optional<uint64_t> seed, bool reshuffleEachIteration)
{
    ops.push_back(TransformSpec::shuffle(bufferSize, seed, reshuffleEachIteration));
    return *this;
}
PipelineSpec& PipelineSpec::batch(int64_t size, bool dropRemainder)
{
    ops.push_back(TransformSpec::batch(size, dropRemainder));
    return *this;
}
PipelineSpec& PipelineSpec::prefetch(int64_t bufferSize)
{
    ops.push_back(TransformSpec::prefetch(bufferSize));
    return *this;
}
PipelineSpec& PipelineSpec::cache(std::string file)
{
    ops.push_back(TransformSpec::cache(std::move(file)));
    return *this;
}
PipelineSpec& PipelineSpec::repeat(int64_t count)
{
    ops.push_back(TransformSpec::repeat(count));
    return *this;
}
PipelineSpec& PipelineSpec::take(int64_t count)
{
    ops.push_back(TransformSpec::take(count));
    return *this;
}
PipelineSpec& PipelineSpec::skip(int64_t count)
{
    ops.push_back(TransformSpec::skip(count));
    return *this;
}
PipelineSpec& PipelineSpec::shard(int64_t numShards, int64_t index)
{
    ops.push_back(TransformSpec::shard(numShards, index));
    return *this;
}
PipelineSpec& PipelineSpec::interleave(int64_t cycleLength, int64_t blockLength, int64_t numParallelCalls,
                                       std::optional<bool> deterministic)
{
    ops.push_back(TransformSpec::interleave(cycleLength, blockLength, numParallelCalls, deterministic));
    return *this;
}

uint64_t PipelineSpec::derivedSeed(std::size_t index) const
{
    return mixSeed(seed ^ mixSeed(0xD1B54A32D192ED03ull * (index + 1)));
}

int64_t PipelineSpec::batchSize() const
{
    for (const auto& op : ops)
        if (op.kind == TransformKind::Batch) return op.batchSize;
    return 0;
}

// ---------------------------------------------------------------------------------------------
// Validation

Status PipelineSpec::validate(const std::string& where) const
{
    const std::string src = where + ".source";
    auto bad = [](std::string msg, std::string hint = {}) {
        return makeError(ErrorCode::InvalidArgument, std::move(msg), hint.empty() ? std::string(kPipelineHint) : std::move(hint));
    };
    const SourceSpec& s = source;
    switch (s.kind) {
    case SourceKind::Idx:
        if (s.paths.empty() && s.dir.empty())
            return bad(src + ": an idx source needs \"dir\" (with \"split\") or \"images\" and \"labels\"",
                       "e.g. {\"kind\": \"idx\", \"dir\": \"/usr/share/datasets/fashion-mnist\", \"split\": \"train\"}");
        if (!s.paths.empty() && s.paths.size() != 2)
            return bad(src + ": an idx source takes two files (images, labels), got " + std::to_string(s.paths.size()));
        if (s.paths.empty() && s.split != "train" && s.split != "test")
            return bad(src + ".split: '" + s.split + "' is not \"train\" or \"test\"");
        if (s.layout != "flat" && s.layout != "image")
            return bad(src + ".layout: '" + s.layout + "' is not \"flat\" or \"image\"");
        break;
    case SourceKind::Csv:
        if (s.paths.empty()) return bad(src + ": a csv source needs \"paths\" (one or more CSV files)");
        if (s.labelColumn.empty()) return bad(src + ".label_column: empty", "name the column that holds the labels");
        break;
    case SourceKind::Npy:
        if (s.paths.empty() || s.paths.size() > 2)
            return bad(src + ": an npy source takes \"x\" (features .npy) and optionally \"y\" (labels .npy)");
        break;
    case SourceKind::Npz:
        if (s.paths.empty()) return bad(src + ": an npz source needs \"paths\" (one or more .npz files)");
        break;
    case SourceKind::ImageFolder:
        if (s.paths.size() != 1) return bad(src + ": an image_folder source takes one \"root\" folder");
        if (s.height < 1 || s.width < 1)
            return bad(src + ".image_size: every image is resized to a fixed size; give [height, width] >= 1",
                       "e.g. \"image_size\": [32, 32]");
        if (s.channels != 1 && s.channels != 3)
            return bad(src + ".channels: " + std::to_string(s.channels) + " is not 1 (grey) or 3 (RGB)");
        break;
    case SourceKind::Tensors:
        if (!s.x.defined() || s.x.shape().rank() < 1)
            return bad(src + ": from_tensor_slices needs an x tensor of rank >= 1 (dimension 0 indexes the elements)");
        if (!s.x.hostAccessible() || (s.y.defined() && !s.y.hostAccessible()))
            return bad(src + ": from_tensor_slices needs host tensors");
        if (s.y.defined() && (s.y.shape().rank() < 1 || s.y.shape()[0] != s.x.shape()[0]))
            return makeError(ErrorCode::ShapeMismatch,
                             src + ": x has " + std::to_string(s.x.shape()[0]) + " elements but y has shape " +
                                 s.y.shape().toString(),
                             "x and y need the same size in dimension 0");
        break;
    }

    for (std::size_t i = 0; i < ops.size(); ++i) {
        const TransformSpec& o = ops[i];
        const std::string at = where + ".transformations[" + std::to_string(i) + "] (" + transformKindName(o.kind) + ")";
        auto parallelOk = [](int64_t p) { return (p >= 1 && p <= kMaxThreads) || p == kAutotune; };
        switch (o.kind) {
        case TransformKind::Map:
            if (!o.fn.fn) return bad(at + ": no function", "name a built-in (normalise, one_hot, random_flip, ...)");
            if (!parallelOk(o.parallelism))
                return bad(at + ".num_parallel_calls: " + std::to_string(o.parallelism) + " (use 1 to 1024 or \"AUTOTUNE\")");
            if (o.fn.builtin && o.fn.name == "decode_image") {
                if (s.kind != SourceKind::ImageFolder)
                    return bad(at + ": decode_image reads the files of an image_folder source, but the source is " +
                               sourceKindName(s.kind));
            }
            break;
        case TransformKind::Shuffle:
            if (o.bufferSize < 1)
                return bad(at + ".buffer_size: " + std::to_string(o.bufferSize) + " (use >= 1)",
                           "a buffer as large as the dataset gives a full shuffle");
            break;
        case TransformKind::Batch:
            if (o.batchSize < 1) return bad(at + ".size: " + std::to_string(o.batchSize) + " (use >= 1)");
            break;
        case TransformKind::Prefetch:
            if (!parallelOk(o.bufferSize))
                return bad(at + ".buffer_size: " + std::to_string(o.bufferSize) + " (use >= 1 or \"AUTOTUNE\")");
            break;
        case TransformKind::Cache: break;
        case TransformKind::Repeat:
            if (o.count < -1) return bad(at + ".count: " + std::to_string(o.count) + " (use >= 0, or -1 for ever)");
            break;
        case TransformKind::Take:
        case TransformKind::Skip:
            if (o.count < -1) return bad(at + ".count: " + std::to_string(o.count) + " (use >= 0, or -1 for all)");
            break;
        case TransformKind::Shard:
            if (o.numShards < 1) return bad(at + ".num_shards: " + std::to_string(o.numShards) + " (use >= 1)");
            if (o.shardIndex < 0 || o.shardIndex >= o.numShards)
                return bad(at + ".index: " + std::to_string(o.shardIndex) + " is not in [0, " +
                           std::to_string(o.numShards) + ")",
                           "each worker takes one index from 0 to num_shards - 1");
            if (o.shardBlock != 0 && o.shardBlock < o.numShards)
                return bad(at + ".block: " + std::to_string(o.shardBlock) + " is smaller than num_shards " + std::to_string(o.numShards),
                           "deal blocks of at least num_shards elements (or leave block out: one element each)");
            break;
        case TransformKind::Interleave:
            if (i != 0 || (s.kind != SourceKind::Csv && s.kind != SourceKind::Npz))
                return bad(at + ": interleave reads the files of a csv or npz source and must come first",
                           "list the files in source.paths and put interleave first in the transformations");
            if (!(o.cycleLength >= 1 || o.cycleLength == kAutotune))
                return bad(at + ".cycle_length: " + std::to_string(o.cycleLength) + " (use >= 1 or \"AUTOTUNE\")");
            if (o.blockLength < 1) return bad(at + ".block_length: " + std::to_string(o.blockLength) + " (use >= 1)");
            if (!parallelOk(o.parallelism))
                return bad(at + ".num_parallel_calls: " + std::to_string(o.parallelism) + " (use 1 to 1024 or \"AUTOTUNE\")");
            break;
        }
    }
    if (windowSteps < 1) return bad(where + ".window_steps: " + std::to_string(windowSteps) + " (use >= 1)");
    if (autotune.intervalSeconds <= 0) return bad(where + ".autotune.interval_seconds must be > 0");
    if (autotune.cpuBudget < 0 || autotune.ramBudgetBytes < 0) return bad(where + ".autotune: budgets must be >= 0 (0 = default)");
    return okStatus();
}

// ---------------------------------------------------------------------------------------------
// JSON

namespace {

using json = nlohmann::json;

nlohmann::json countJson(int64_t v) { return v == kAutotune ? json("AUTOTUNE") : json(v); }

Error jsonError(const std::string& at, const std::string& what, const std::string& hint = {})
{
    return makeError(ErrorCode::ParseError, at + ": " + what, hint.empty() ? std::string(kPipelineHint) : hint);
}


// A value quoted in a message: long lists and objects are cut short.
std::string shown(const json& v)
{
    std::string text = v.dump();
    return text.size() <= 60 ? text : text.substr(0, 57) + "...";
}

// The hint for a value of the wrong JSON type: the usual slip is a number or a boolean written
// in quotes ("size": "64").
std::string typeHint(const json& v, const std::string& key, const std::string& want)
{
    if (v.is_string()) {
        const std::string t = v.get<std::string>();
        if (t == "true" || t == "false") return "write it without quotes: \"" + key + "\": " + t;
        char* end = nullptr;
        errno = 0;
        (void)std::strtod(t.c_str(), &end);
        if (!t.empty() && end && *end == '\0' && errno == 0) return "write the number without quotes: \"" + key + "\": " + t;
    }
    return "\"" + key + "\" takes " + want;
}

Result<int64_t> getInt(const json& j, const std::string& key, const std::string& at, bool allowAutotune, int64_t def)
{
    if (!j.contains(key)) return def;
    const json& v = j[key];
    if (v.is_number_integer()) return v.get<int64_t>();
    // A whole float within int64 (converting one beyond it is undefined behaviour).
    if (v.is_number_float() && std::fabs(v.get<double>()) < 9.2e18 &&
        v.get<double>() == static_cast<double>(static_cast<int64_t>(v.get<double>())))
        return static_cast<int64_t>(v.get<double>());
    if (allowAutotune && v.is_string() && (v.get<std::string>() == "AUTOTUNE" || v.get<std::string>() == "autotune"))
        return kAutotune;
    const std::string want = "an integer" + std::string(allowAutotune ? " or \"AUTOTUNE\"" : "");
    return jsonError(at + "." + key, "expected " + want + ", got " + shown(v), typeHint(v, key, want));
}

Result<std::string> getString(const json& j, const std::string& key, const std::string& at, std::string def)
{
    if (!j.contains(key)) return def;
    if (!j[key].is_string()) return jsonError(at + "." + key, "expected a string, got " + shown(j[key]), "write it in quotes");
    return j[key].get<std::string>();
}

Result<bool> getBool(const json& j, const std::string& key, const std::string& at, bool def)
{
    if (!j.contains(key)) return def;
    if (!j[key].is_boolean())
        return jsonError(at + "." + key, "expected true or false, got " + shown(j[key]), typeHint(j[key], key, "true or false"));
    return j[key].get<bool>();
}

Result<std::vector<std::string>> getStrings(const json& j, const std::string& key, const std::string& at)
{
    std::vector<std::string> out;
    if (!j.contains(key)) return out;
    const json& v = j[key];
    if (v.is_string()) return std::vector<std::string>{v.get<std::string>()};
    if (!v.is_array())
        return jsonError(at + "." + key, "expected a string or a list of strings, got " + shown(v), "e.g. \"" + key + "\": [\"a.csv\", \"b.csv\"]");
    for (const auto& e : v) {
        if (!e.is_string()) return jsonError(at + "." + key, "expected strings, got " + shown(e), "write each one in quotes");
        out.push_back(e.get<std::string>());
    }
    return out;
}

Result<SourceSpec> sourceFromJson(const json& j, const std::string& at)
{
    if (!j.is_object()) return jsonError(at, "expected an object with \"kind\"");
    TS_ASSIGN(std::string kind, getString(j, "kind", at, ""));
    SourceSpec s;
    if (kind == "idx") {
        TS_TRY(checkJsonKeys(j, {"kind", "dir", "split", "images", "labels", "layout"}, at));
        s.kind = SourceKind::Idx;
        TS_ASSIGN(s.dir, getString(j, "dir", at, ""));
        TS_ASSIGN(s.split, getString(j, "split", at, "train"));
        TS_ASSIGN(s.layout, getString(j, "layout", at, "flat"));
        TS_ASSIGN(std::string images, getString(j, "images", at, ""));
        TS_ASSIGN(std::string labels, getString(j, "labels", at, ""));
        if (!images.empty() || !labels.empty()) {
            if (images.empty() || labels.empty()) return jsonError(at, "give both \"images\" and \"labels\"");
            s.paths = {images, labels};
        }
    } else if (kind == "csv") {
        TS_TRY(checkJsonKeys(j, {"kind", "paths", "path", "label_column", "feature_columns", "delimiter", "label_type"}, at));
        s.kind = SourceKind::Csv;
        TS_ASSIGN(s.paths, getStrings(j, j.contains("paths") ? "paths" : "path", at));
        TS_ASSIGN(s.labelColumn, getString(j, "label_column", at, "label"));
        TS_ASSIGN(s.featureColumns, getStrings(j, "feature_columns", at));
        TS_ASSIGN(std::string delim, getString(j, "delimiter", at, ","));
        if (delim == "\\t" || delim == "tab") delim = "\t";
        if (delim.size() != 1)
            return jsonError(at + ".delimiter", "expected one character, got \"" + delim + "\"", "e.g. \",\", \";\" or \"\\t\" (a tab)");
        s.delimiter = delim[0];
        TS_ASSIGN(std::string lt, getString(j, "label_type", at, "int"));
        if (lt != "int" && lt != "float") return jsonError(at + ".label_type", "expected \"int\" or \"float\", got \"" + lt + "\"");
        s.floatLabels = lt == "float";
    } else if (kind == "npy") {
        TS_TRY(checkJsonKeys(j, {"kind", "x", "y"}, at));
        s.kind = SourceKind::Npy;
        TS_ASSIGN(std::string x, getString(j, "x", at, ""));
        TS_ASSIGN(std::string y, getString(j, "y", at, ""));
        if (x.empty()) return jsonError(at, "an npy source needs \"x\" (the features .npy file)");
        s.paths = {x};
        if (!y.empty()) s.paths.push_back(y);
    } else if (kind == "npz") {
        TS_TRY(checkJsonKeys(j, {"kind", "paths", "path", "x_key", "y_key"}, at));
        s.kind = SourceKind::Npz;
        TS_ASSIGN(s.paths, getStrings(j, j.contains("paths") ? "paths" : "path", at));
        TS_ASSIGN(s.xKey, getString(j, "x_key", at, ""));
        TS_ASSIGN(s.yKey, getString(j, "y_key", at, ""));
    } else if (kind == "image_folder") {
        TS_TRY(checkJsonKeys(j, {"kind", "root", "image_size", "channels", "class_names"}, at));
        s.kind = SourceKind::ImageFolder;
        TS_ASSIGN(std::string root, getString(j, "root", at, ""));
        if (root.empty()) return jsonError(at, "an image_folder source needs \"root\"");
        s.paths = {root};
        if (!j.contains("image_size") || !j["image_size"].is_array() || j["image_size"].size() != 2 ||
            !j["image_size"][0].is_number_integer() || !j["image_size"][1].is_number_integer())
            return jsonError(at + ".image_size", "expected [height, width]", "every image is resized to this size");
        s.height = j["image_size"][0].get<int64_t>();
        s.width = j["image_size"][1].get<int64_t>();
        TS_ASSIGN(int64_t ch, getInt(j, "channels", at, false, 3));
        s.channels = static_cast<int>(ch);
        TS_ASSIGN(s.classNames, getStrings(j, "class_names", at));
    } else if (kind == "tensors") {
        return jsonError(at, "a \"tensors\" source (from_tensor_slices) holds data and exists only in C++",
                         "save the arrays with numpy.savez and use {\"kind\": \"npz\"}");
    } else {
        return jsonError(at + ".kind", kind.empty() ? "missing" : "unknown source kind \"" + kind + "\"",
                         "use idx, csv, npy, npz or image_folder");
    }
    return s;
}

json sourceToJson(const SourceSpec& s)
{
    json j = {{"kind", sourceKindName(s.kind)}};
    switch (s.kind) {
    case SourceKind::Idx:
        if (s.paths.size() == 2) {
            j["images"] = s.paths[0];
            j["labels"] = s.paths[1];
        } else {
            j["dir"] = s.dir;
            j["split"] = s.split;
        }
        j["layout"] = s.layout;
        break;
    case SourceKind::Csv: {
        j["paths"] = s.paths;
        j["label_column"] = s.labelColumn;
        if (!s.featureColumns.empty()) j["feature_columns"] = s.featureColumns;
        j["delimiter"] = std::string(1, s.delimiter);
        j["label_type"] = s.floatLabels ? "float" : "int";
        break;
    }
    case SourceKind::Npy:
        j["x"] = s.paths.empty() ? std::string() : s.paths[0];
        if (s.paths.size() > 1) j["y"] = s.paths[1];
        break;
    case SourceKind::Npz:
        j["paths"] = s.paths;
        if (!s.xKey.empty()) j["x_key"] = s.xKey;
        if (!s.yKey.empty()) j["y_key"] = s.yKey;
        break;
    case SourceKind::ImageFolder:
        j["root"] = s.paths.empty() ? std::string() : s.paths[0];
        j["image_size"] = {s.height, s.width};
        j["channels"] = s.channels;
        if (!s.classNames.empty()) j["class_names"] = s.classNames;
        break;
    case SourceKind::Tensors:
        j["x_shape"] = s.x.defined() ? s.x.shape().dims() : std::vector<int64_t>{};
        if (s.y.defined()) j["y_shape"] = s.y.shape().dims();
        break;
    }
    return j;
}

Result<TransformSpec> opFromJson(const json& j, const std::string& at)
{
    if (!j.is_object()) return jsonError(at, "expected an object with \"op\"");
    TS_ASSIGN(std::string op, getString(j, "op", at, ""));
    TransformSpec o;
    auto optSeed = [&](TransformSpec& spec) -> Status {
        if (!j.contains("seed") || j["seed"].is_null()) return okStatus();
        // Unsigned 64-bit (derived seeds recorded with a run fill all 64 bits), not negative.
        if (!j["seed"].is_number_unsigned() && (!j["seed"].is_number_integer() || j["seed"].get<int64_t>() < 0))
            return jsonError(at + ".seed", "expected a non-negative integer, got " + shown(j["seed"]), typeHint(j["seed"], "seed", "a whole number >= 0"));
        spec.seed = j["seed"].get<uint64_t>();
        return okStatus();
    };
    auto optDeterministic = [&](TransformSpec& spec) -> Status {
        if (!j.contains("deterministic") || j["deterministic"].is_null()) return okStatus();
        TS_ASSIGN(bool d, getBool(j, "deterministic", at, true));
        spec.deterministic = d;
        return okStatus();
    };
    if (op == "map") {
        TS_ASSIGN(std::string fn, getString(j, "fn", at, ""));
        if (fn.empty()) return jsonError(at, "a map needs \"fn\"", "built-ins: normalise, one_hot, random_flip, random_crop, cast, reshape, decode_image");
        if (fn.rfind("custom:", 0) == 0)
            return jsonError(at + ".fn", "\"" + fn + "\" is a C++ function and cannot be loaded from JSON",
                             "replace it with a built-in, or build this pipeline in C++");
        json params = json::object();
        for (auto it = j.begin(); it != j.end(); ++it)
            if (it.key() != "op" && it.key() != "fn" && it.key() != "num_parallel_calls" && it.key() != "deterministic" &&
                it.key() != "seed")
                params[it.key()] = it.value();
        TS_ASSIGN(MapFunction f, builtinMapFunction(fn, params, at));
        TS_ASSIGN(int64_t p, getInt(j, "num_parallel_calls", at, true, 1));
        o = TransformSpec::map(std::move(f), p);
        TS_TRY(optSeed(o));
        TS_TRY(optDeterministic(o));
    } else if (op == "shuffle") {
        TS_TRY(checkJsonKeys(j, {"op", "buffer_size", "seed", "reshuffle_each_iteration"}, at));
        if (!j.contains("buffer_size")) return jsonError(at, "a shuffle needs \"buffer_size\"", "the dataset size gives a full shuffle");
        TS_ASSIGN(int64_t b, getInt(j, "buffer_size", at, false, 0));
        TS_ASSIGN(bool r, getBool(j, "reshuffle_each_iteration", at, true));
        o = TransformSpec::shuffle(b, std::nullopt, r);
        TS_TRY(optSeed(o));
    } else if (op == "batch") {
        TS_TRY(checkJsonKeys(j, {"op", "size", "batch_size", "drop_remainder"}, at));
        const char* key = j.contains("size") ? "size" : "batch_size";
        if (!j.contains(key)) return jsonError(at, "a batch needs \"size\"");
        TS_ASSIGN(int64_t b, getInt(j, key, at, false, 0));
        TS_ASSIGN(bool d, getBool(j, "drop_remainder", at, false));
        o = TransformSpec::batch(b, d);
    } else if (op == "prefetch") {
        TS_TRY(checkJsonKeys(j, {"op", "buffer_size"}, at));
        TS_ASSIGN(int64_t b, getInt(j, "buffer_size", at, true, kAutotune));
        o = TransformSpec::prefetch(b);
    } else if (op == "cache") {
        TS_TRY(checkJsonKeys(j, {"op", "file", "filename"}, at));
        TS_ASSIGN(std::string f, getString(j, j.contains("file") ? "file" : "filename", at, ""));
        o = TransformSpec::cache(f);
    } else if (op == "repeat") {
        TS_TRY(checkJsonKeys(j, {"op", "count"}, at));
        TS_ASSIGN(int64_t c, getInt(j, "count", at, false, -1));
        o = TransformSpec::repeat(c);
    } else if (op == "take" || op == "skip") {
        TS_TRY(checkJsonKeys(j, {"op", "count"}, at));
        if (!j.contains("count")) return jsonError(at, "a " + op + " needs \"count\"");
        TS_ASSIGN(int64_t c, getInt(j, "count", at, false, 0));
        o = op == "take" ? TransformSpec::take(c) : TransformSpec::skip(c);
    } else if (op == "shard") {
        TS_TRY(checkJsonKeys(j, {"op", "num_shards", "index", "block"}, at));
        if (!j.contains("num_shards") || !j.contains("index"))
            return jsonError(at, "a shard needs \"num_shards\" and \"index\"", "e.g. one shard per worker: index = the worker's rank");
        TS_ASSIGN(int64_t n, getInt(j, "num_shards", at, false, 1));
        TS_ASSIGN(int64_t i, getInt(j, "index", at, false, 0));
        TS_ASSIGN(int64_t b, getInt(j, "block", at, false, 0));
        o = TransformSpec::shard(n, i, b);
    } else if (op == "interleave") {
        TS_TRY(checkJsonKeys(j, {"op", "cycle_length", "block_length", "num_parallel_calls", "deterministic"}, at));
        TS_ASSIGN(int64_t c, getInt(j, "cycle_length", at, true, kAutotune));
        TS_ASSIGN(int64_t b, getInt(j, "block_length", at, false, 1));
        TS_ASSIGN(int64_t p, getInt(j, "num_parallel_calls", at, true, kAutotune));
        o = TransformSpec::interleave(c, b, p);
        TS_TRY(optDeterministic(o));
    } else {
        return jsonError(at + ".op", op.empty() ? "missing" : "unknown transformation \"" + op + "\"",
                         "use map, shuffle, batch, prefetch, cache, repeat, take, skip, shard or interleave");
    }
    return o;
}

json opToJson(const TransformSpec& o)
{
    json j = {{"op", transformKindName(o.kind)}};
    switch (o.kind) {
    case TransformKind::Map:
        j["fn"] = o.fn.builtin ? o.fn.name : "custom:" + o.fn.name;
        if (o.fn.params.is_object())
            for (auto it = o.fn.params.begin(); it != o.fn.params.end(); ++it) j[it.key()] = it.value();
        j["num_parallel_calls"] = countJson(o.parallelism);
        if (o.deterministic) j["deterministic"] = *o.deterministic;
        if (o.seed) j["seed"] = *o.seed;
        break;
    case TransformKind::Shuffle:
        j["buffer_size"] = o.bufferSize;
        if (o.seed) j["seed"] = *o.seed;
        j["reshuffle_each_iteration"] = o.reshuffleEachIteration;
        break;
    case TransformKind::Batch:
        j["size"] = o.batchSize;
        j["drop_remainder"] = o.dropRemainder;
        break;
    case TransformKind::Prefetch: j["buffer_size"] = countJson(o.bufferSize); break;
    case TransformKind::Cache:
        if (!o.cacheFile.empty()) j["file"] = o.cacheFile;
        break;
    case TransformKind::Repeat:
    case TransformKind::Take:
    case TransformKind::Skip: j["count"] = o.count; break;
    case TransformKind::Shard:
        j["num_shards"] = o.numShards;
        j["index"] = o.shardIndex;
        if (o.shardBlock > 0 && o.shardBlock != o.numShards) j["block"] = o.shardBlock;
        break;
    case TransformKind::Interleave:
        j["cycle_length"] = countJson(o.cycleLength);
        j["block_length"] = o.blockLength;
        j["num_parallel_calls"] = countJson(o.parallelism);
        if (o.deterministic) j["deterministic"] = *o.deterministic;
        break;
    }
    return j;
}

} // namespace

nlohmann::json PipelineSpec::toJson() const
{
    json ops_ = json::array();
    for (const auto& o : ops) ops_.push_back(opToJson(o));
    json out = {{"source", sourceToJson(source)},
            {"transformations", ops_},
            {"deterministic", deterministic},
            {"skip_bad_records", skipBadRecords},
            {"window_steps", windowSteps},
            {"autotune",
             {{"enabled", autotune.enabled},
              {"cpu_budget", autotune.cpuBudget},
              {"ram_budget_mb", autotune.ramBudgetBytes / (1024 * 1024)},
              {"interval_seconds", autotune.intervalSeconds}}},
            {"auto_shard", autoShardPolicyName(autoShard)}};
    // Unwritten, a pipeline takes the run's seed where it is prepared (prepareRun): a worker
    // given this JSON must do the same, not read 0 as a seed given.
    if (seedGiven) out["seed"] = seed;
    return out;
}

Result<PipelineSpec> PipelineSpec::fromJson(const nlohmann::json& j, const std::string& where)
{
    if (!j.is_object()) return jsonError(where, "expected an object with \"source\" and \"transformations\"");
    TS_TRY(checkJsonKeys(j, {"source", "transformations", "seed", "deterministic", "skip_bad_records", "window_steps", "autotune", "auto_shard"},
                         where));
    PipelineSpec p;
    if (!j.contains("source")) return jsonError(where, "missing \"source\"", "e.g. {\"kind\": \"idx\", \"dir\": \"...\"}");
    TS_ASSIGN(p.source, sourceFromJson(j["source"], where + ".source"));
    if (j.contains("transformations")) {
        const json& t = j["transformations"];
        if (!t.is_array()) return jsonError(where + ".transformations", "expected a list");
        for (std::size_t i = 0; i < t.size(); ++i) {
            TS_ASSIGN(TransformSpec o, opFromJson(t[i], where + ".transformations[" + std::to_string(i) + "]"));
            p.ops.push_back(std::move(o));
        }
    }
    if (j.contains("seed")) {
        if (!j["seed"].is_number_unsigned() && (!j["seed"].is_number_integer() || j["seed"].get<int64_t>() < 0))
            return jsonError(where + ".seed", "expected a non-negative integer, got " + shown(j["seed"]), typeHint(j["seed"], "seed", "a whole number >= 0"));
        p.seed = j["seed"].get<uint64_t>();
        p.seedGiven = true;
    }
    TS_ASSIGN(p.deterministic, getBool(j, "deterministic", where, true));
    TS_ASSIGN(p.skipBadRecords, getBool(j, "skip_bad_records", where, false));
    TS_ASSIGN(p.windowSteps, getInt(j, "window_steps", where, false, 50));
    if (j.contains("autotune")) {
        const json& a = j["autotune"];
        const std::string at = where + ".autotune";
        if (a.is_boolean()) {
            p.autotune.enabled = a.get<bool>();
        } else {
            if (!a.is_object()) return jsonError(at, "expected an object or true/false");
            TS_TRY(checkJsonKeys(a, {"enabled", "cpu_budget", "ram_budget_mb", "interval_seconds"}, at));
            TS_ASSIGN(p.autotune.enabled, getBool(a, "enabled", at, true));
            TS_ASSIGN(int64_t cpu, getInt(a, "cpu_budget", at, false, 0));
            TS_ASSIGN(int64_t ram, getInt(a, "ram_budget_mb", at, false, 0));
            // Bounded before use: 5e9 cores wrapped as an int, 9e15 MB overflowed into "must be >= 0".
            if (cpu < 0 || cpu > 4096)
                return jsonError(at + ".cpu_budget", "expected 0 (every core) to 4096 cores, got " + std::to_string(cpu), "the cores the pipeline may use");
            if (ram < 0 || ram > (int64_t{1} << 30))
                return jsonError(at + ".ram_budget_mb", "expected 0 (the default) to 1073741824 MB, got " + std::to_string(ram),
                                 "the memory the pipeline's buffers may use, in MB");
            p.autotune.cpuBudget = static_cast<int>(cpu);
            p.autotune.ramBudgetBytes = ram * 1024 * 1024;
            if (a.contains("interval_seconds")) {
                if (!a["interval_seconds"].is_number()) return jsonError(at + ".interval_seconds", "expected a number");
                p.autotune.intervalSeconds = a["interval_seconds"].get<double>();
            }
        }
    }
    if (j.contains("auto_shard")) {
        const json& a = j["auto_shard"];
        const std::string name = a.is_string() ? a.get<std::string>() : std::string();
        bool known = false;
        for (AutoShardPolicy policy : {AutoShardPolicy::Auto, AutoShardPolicy::File, AutoShardPolicy::Data, AutoShardPolicy::Off})
            if (name == autoShardPolicyName(policy)) {
                p.autoShard = policy;
                known = true;
            }
        if (!known)
            return jsonError(where + ".auto_shard", "expected \"auto\", \"file\", \"data\" or \"off\", got " + shown(a),
                             "\"auto\" shards by file when there are enough files, else by element");
    }
    TS_TRY(p.validate(where));
    return p;
}

} // namespace ts
