#pragma once
// PipelineSpec: a tf.data-style input pipeline as data: one source and a list of
// transformations. It round-trips through JSON (the "pipeline" section of a RunConfig), so the
// studio can show and edit it; data/pipeline.h builds a running Pipeline from it.
//
// {"source": {"kind": "idx", "dir": "/usr/share/datasets/fashion-mnist", "split": "train"},
//  "transformations": [
//     {"op": "map", "fn": "normalise", "num_parallel_calls": "AUTOTUNE"},
//     {"op": "shuffle", "buffer_size": 10000, "seed": 7, "reshuffle_each_iteration": true},
//     {"op": "batch", "size": 256, "drop_remainder": false},
//     {"op": "prefetch", "buffer_size": "AUTOTUNE"}],
//  "seed": 0, "deterministic": true, "skip_bad_records": false, "window_steps": 50,
//  "autotune": {"enabled": true, "cpu_budget": 0, "ram_budget_mb": 0}, "auto_shard": "auto"}
//
// Sources ("kind"): idx (files "images"/"labels", or "dir" + "split"), csv ("paths",
// "label_column", "feature_columns", "delimiter", "label_type"), npy ("x", "y"), npz ("paths",
// "x_key", "y_key"), image_folder ("root", "image_size": [h, w], "channels", "class_names"),
// tensors (C++ only: from_tensor_slices). Transformations ("op"): map, shuffle, batch, prefetch,
// cache, repeat, take, skip, shard, interleave; see TransformSpec. Counts written as "AUTOTUNE" (or -1)
// are tuned at run time.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/result.h"
#include "data/element.h"

namespace ts {

// num_parallel_calls / buffer_size / cycle_length value meaning "let the autotuner decide".
inline constexpr int64_t kAutotune = -1;

enum class SourceKind { Idx, Csv, Npy, Npz, ImageFolder, Tensors };
const char* sourceKindName(SourceKind kind);  // "idx", "csv", "npy", "npz", "image_folder", "tensors"

struct SourceSpec {
    SourceKind kind = SourceKind::Idx;
    // idx: {images, labels}; csv: one or more files; npy: {x.npy, y.npy}; npz: one or more
    // archives; image_folder: {root}. Several csv/npz files are read through interleave.
    std::vector<std::string> paths;
    // idx only: a folder with MNIST-style files (train-images-idx3-ubyte[.gz], ...) and the split
    // ("train" or "test") to read; used when paths is empty.
    std::string dir;
    std::string split = "train";
    // idx: element layout of x: "flat" (H*W) or "image" (H, W, 1). Either way x is u8; map
    // normalise (or cast) makes it f32.
    std::string layout = "flat";
    // csv
    std::string labelColumn = "label";
    std::vector<std::string> featureColumns;  // empty: every column except the label
    char delimiter = ',';
    bool floatLabels = false;                 // "label_type": "float" (y f32 (1)) or "int" (class ids)
    // npz: array names inside each archive; empty: "x"/"y", else "x_train"/"y_train".
    std::string xKey, yKey;
    // image_folder: every image is decoded to 8-bit (height, width, channels) (channels 1 or 3).
    int64_t height = 0, width = 0;
    int channels = 3;
    std::vector<std::string> classNames;      // empty: the root's sub-folders, sorted by name
    // tensors (from_tensor_slices): dimension 0 indexes the elements; y may be undefined.
    Tensor x, y;

    static SourceSpec idxDir(std::string dir, std::string split = "train", std::string layout = "flat");
    static SourceSpec idxFiles(std::string images, std::string labels, std::string layout = "flat");
    static SourceSpec csv(std::vector<std::string> paths, std::string labelColumn);
    static SourceSpec npy(std::string x, std::string y);
    static SourceSpec npz(std::vector<std::string> paths, std::string xKey = {}, std::string yKey = {});
    static SourceSpec imageFolder(std::string root, int64_t height, int64_t width, int channels = 3);
    static SourceSpec fromTensorSlices(Tensor x, Tensor y = {});
};

// A function applied by map(). Built-ins (data/transforms.h) carry their name and parameters so
// they round-trip through JSON; custom functions exist only in C++ and write {"fn": "custom:<name>"}.
using MapFn = std::function<Result<Element>(Element&&, const MapContext&)>;
struct MapFunction {
    std::string name;        // "normalise", "one_hot", ... or the custom function's label
    nlohmann::json params;   // the built-in's parameters (an object), null for custom functions
    MapFn fn;
    bool builtin = false;
    bool random = false;     // draws from MapContext::seed
};

enum class TransformKind { Map, Shuffle, Batch, Prefetch, Cache, Repeat, Take, Skip, Shard, Interleave };
const char* transformKindName(TransformKind kind);  // "map", "shuffle", ...

struct TransformSpec {
    TransformKind kind = TransformKind::Map;
    // map
    MapFunction fn;
    int64_t parallelism = 1;                // map, interleave: num_parallel_calls; kAutotune
    std::optional<bool> deterministic;      // map, interleave: unset = the pipeline's setting
    std::optional<uint64_t> seed;           // shuffle, random map functions: unset = derived from the pipeline's
    // shuffle: buffer_size; prefetch: buffer_size or kAutotune
    int64_t bufferSize = 0;
    bool reshuffleEachIteration = true;
    // batch
    int64_t batchSize = 0;
    bool dropRemainder = false;
    // cache: a file name, or empty for memory
    std::string cacheFile;
    // repeat (-1: forever), take, skip
    int64_t count = -1;
    // shard: elements are dealt in blocks of shardBlock (0: num_shards); shard i of n keeps the
    // positions [block * i / n, block * (i + 1) / n) of each block. With the default block that
    // is tf.data's position % num_shards == index; auto-sharding deals blocks of the global batch
    // so that every worker's batches are its share of the global ones.
    int64_t numShards = 1, shardIndex = 0, shardBlock = 0;
    // interleave (only directly after a csv/npz source): files read at once, and consecutive
    // elements taken from each; cycle_length kAutotune = min(files, cores). With
    // num_parallel_calls > 1 (or kAutotune) every open file is read ahead on its own thread; the
    // order is the sequential one either way.
    int64_t cycleLength = kAutotune, blockLength = 1;

    // "map(normalise)", "batch(256)", "prefetch(AUTOTUNE)": the stage's name in statistics.
    std::string label() const;

    static TransformSpec map(MapFunction fn, int64_t numParallelCalls = 1, std::optional<bool> deterministic = {});
    static TransformSpec shuffle(int64_t bufferSize, std::optional<uint64_t> seed = {}, bool reshuffleEachIteration = true);
    static TransformSpec batch(int64_t size, bool dropRemainder = false);
    static TransformSpec prefetch(int64_t bufferSize = kAutotune);
    static TransformSpec cache(std::string file = {});
    static TransformSpec repeat(int64_t count = -1);
    static TransformSpec take(int64_t count);
    static TransformSpec skip(int64_t count);
    static TransformSpec shard(int64_t numShards, int64_t index, int64_t block = 0);
    static TransformSpec interleave(int64_t cycleLength = kAutotune, int64_t blockLength = 1,
                             int64_t numParallelCalls = kAutotune, std::optional<bool> deterministic = {});
};

// How a multi-worker run divides a pipeline's data among its worker processes (tf.data's
// AutoShardPolicy, data/auto_shard.h): "auto" (file, else data), "file", "data" or "off".
enum class AutoShardPolicy { Auto, File, Data, Off };
const char* autoShardPolicyName(AutoShardPolicy policy);  // "auto", "file", "data", "off"

struct AutotuneOptions {
    bool enabled = true;           // tune kAutotune knobs; off: they take their starting values
    int cpuBudget = 0;             // threads for parallel stages together; 0 = the schedulable cores
    int64_t ramBudgetBytes = 0;    // bytes of buffered elements; 0 = half of physical RAM
    double intervalSeconds = 0.1;  // how often the tuner looks at the measured rates
};

struct PipelineSpec {
    SourceSpec source;
    std::vector<TransformSpec> ops;
    uint64_t seed = 0;             // derives every unset shuffle / random-map seed
    bool seedGiven = false;        // "seed" was written; otherwise the run's seed is used (as tf.random.set_seed)
    bool deterministic = true;     // parallel stages keep the sequential order
    bool skipBadRecords = false;   // drop and count undecodable records instead of failing
    int64_t windowSteps = 50;      // steps per stall verdict window
    AutotuneOptions autotune;
    AutoShardPolicy autoShard = AutoShardPolicy::Auto;  // multi-worker runs only ("auto_shard")

    PipelineSpec() = default;
    explicit PipelineSpec(SourceSpec s) : source(std::move(s)) {}

    // tf.data-style chaining: PipelineSpec(SourceSpec::csv(...)).map(...).batch(32).prefetch()
    PipelineSpec& map(MapFunction fn, int64_t numParallelCalls = 1, std::optional<bool> deterministic = {});
    PipelineSpec& shuffle(int64_t bufferSize, std::optional<uint64_t> seed = {}, bool reshuffleEachIteration = true);
    PipelineSpec& batch(int64_t size, bool dropRemainder = false);
    PipelineSpec& prefetch(int64_t bufferSize = kAutotune);
    PipelineSpec& cache(std::string file = {});
    PipelineSpec& repeat(int64_t count = -1);
    PipelineSpec& take(int64_t count);
    PipelineSpec& skip(int64_t count);
    PipelineSpec& shard(int64_t numShards, int64_t index);
    PipelineSpec& interleave(int64_t cycleLength = kAutotune, int64_t blockLength = 1,
                             int64_t numParallelCalls = kAutotune, std::optional<bool> deterministic = {});

    // The batch size of the (first) batch transformation, or 0 if there is none.
    int64_t batchSize() const;
    // The seed of ops[index] when it has none of its own: derived from the pipeline's seed and
    // the position, so editing one transformation does not reseed the others.
    uint64_t derivedSeed(std::size_t index) const;

    // Checks counts, ranges and placement (interleave right after a multi-file source, ...).
    // Errors name "<where>.transformations[i]" and say what to change.
    Status validate(const std::string& where = "pipeline") const;

    nlohmann::json toJson() const;
    // `where` prefixes every error ("run.json: pipeline"); unknown keys are errors (typos).
    static Result<PipelineSpec> fromJson(const nlohmann::json& j, const std::string& where = "pipeline");
};

} // namespace ts
