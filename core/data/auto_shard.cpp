#include "data/auto_shard.h"

#include <algorithm>
#include <cassert>
#include <filesystem>

namespace ts {

namespace {

bool countsElements(TransformKind k)
{
    return k == TransformKind::Take || k == TransformKind::Skip || k == TransformKind::Shard;
}

} // namespace

Result<ShardedPipeline> autoShardPipeline(const PipelineSpec& spec, int workers, int index, const std::string& where, bool roundRobin)
{
    assert(workers >= 1 && index >= 0 && index < workers);
    ShardedPipeline out;
    out.spec = spec;
    const auto batchOp = std::find_if(spec.ops.begin(), spec.ops.end(), [](const TransformSpec& op) { return op.kind == TransformKind::Batch; });
    const std::size_t batchAt = static_cast<std::size_t>(batchOp - spec.ops.begin());
    if (batchOp == spec.ops.end())
        return makeError(ErrorCode::Internal, where + ": auto-sharding needs the pipeline's batch transformation");
    const int64_t global = spec.ops[batchAt].batchSize;
    out.globalBatch = out.localBatch = global;
    if (workers == 1 || spec.autoShard == AutoShardPolicy::Off) {
        out.description = workers == 1 ? "one worker: the whole pipeline"
                                       : "auto_shard \"off\": every worker reads the whole pipeline and trains on its rows of each batch";
        return out;
    }
    const int64_t n = workers, w = index;
    if (global < n)
        return makeError(ErrorCode::InvalidArgument,
                         where + ": a global batch of " + std::to_string(global) + " cannot be shared by " + std::to_string(n) +
                             " workers (each needs at least one row of every batch)",
                         "use a batch size of at least " + std::to_string(n));

    const SourceSpec& src = spec.source;
    const bool multiFile = (src.kind == SourceKind::Csv || src.kind == SourceKind::Npz) && src.paths.size() > 1;
    bool counted = false;  // a take/skip/shard before the batch
    std::size_t shardAt = !spec.ops.empty() && spec.ops[0].kind == TransformKind::Interleave ? 1 : 0;
    for (std::size_t i = 0; i < batchAt; ++i)
        if (countsElements(spec.ops[i].kind)) {
            counted = true;
            shardAt = i + 1;
        }

    AutoShardPolicy policy = spec.autoShard;
    if (policy == AutoShardPolicy::Auto)
        policy = multiFile && static_cast<int64_t>(src.paths.size()) >= n && !counted ? AutoShardPolicy::File : AutoShardPolicy::Data;
    if (policy == AutoShardPolicy::File) {
        if (!multiFile)
            return makeError(ErrorCode::InvalidArgument,
                             where + ": auto_shard \"file\" deals a source's files to the workers, but the " + sourceKindName(src.kind) +
                                 " source reads " + (src.kind == SourceKind::ImageFolder ? "one folder" : "one file"),
                             "use auto_shard \"data\" (or \"auto\") to shard by element");
        if (static_cast<int64_t>(src.paths.size()) < n)
            return makeError(ErrorCode::InvalidArgument,
                             where + ": auto_shard \"file\" needs at least one file per worker, but the " + sourceKindName(src.kind) +
                                 " source lists " + std::to_string(src.paths.size()) + " files for " + std::to_string(n) + " workers",
                             "split the data into at least " + std::to_string(n) + " files, or use auto_shard \"data\" (or \"auto\")");
        shardAt = 0;  // every cache sees only this worker's files
    }

    out.policy = policy;
    const int64_t block = roundRobin ? n : global;  // by element: elements dealt per round
    out.localBatch = global * (w + 1) / n - global * w / n;
    std::vector<TransformSpec>& ops = out.spec.ops;
    ops[batchAt].batchSize = out.localBatch;
    std::string detail;
    if (policy == AutoShardPolicy::File) {
        std::vector<std::string> mine;
        std::string names;
        for (std::size_t f = static_cast<std::size_t>(w); f < src.paths.size(); f += static_cast<std::size_t>(n)) {
            mine.push_back(src.paths[f]);
            if (mine.size() <= 3) names += (names.empty() ? "" : ", ") + std::filesystem::path(src.paths[f]).filename().string();
        }
        if (mine.size() > 3) names += ", ...";
        out.spec.source.paths = std::move(mine);
        detail = "by file: worker " + std::to_string(w) + " of " + std::to_string(n) + " reads " +
                 std::to_string(out.spec.source.paths.size()) + " of the " + std::to_string(src.paths.size()) + " files (" + names + ")";
        if (counted) detail += "; the take/skip/shard before the batch apply to these files alone";
    } else {
        // Every worker must see the elements before the shard in the same order, or the shards
        // overlap (tf.data's DATA policy has the same condition).
        for (std::size_t i = 0; i < shardAt; ++i) {
            const TransformSpec& op = spec.ops[i];
            if ((op.kind == TransformKind::Map || op.kind == TransformKind::Interleave) && op.parallelism != 1 &&
                !op.deterministic.value_or(spec.deterministic))
                return makeError(ErrorCode::InvalidArgument,
                                 where + ": auto-sharding by element after " + spec.ops[shardAt - 1].label() +
                                     " needs the elements before it in a fixed order, but " + op.label() +
                                     " runs in parallel with deterministic false, so the workers' shards would overlap",
                                 "make " + op.label() + " deterministic, move it after " + spec.ops[shardAt - 1].label() +
                                     ", or set auto_shard \"off\"");
        }
        ops.insert(ops.begin() + static_cast<std::ptrdiff_t>(shardAt), TransformSpec::shard(n, w, block));
        detail = "by element: worker " + std::to_string(w) + " of " + std::to_string(n) +
                 (roundRobin ? " takes element " + std::to_string(w) + " of every " + std::to_string(n)
                             : " takes elements [" + std::to_string(global * w / n) + ", " + std::to_string(global * (w + 1) / n) +
                                   ") of every " + std::to_string(global)) +
                 (shardAt > 0 ? " after " + spec.ops[shardAt - 1].label() : std::string(" from the source"));
    }
    const std::string cacheSuffix = ".shard-" + std::string(policy == AutoShardPolicy::File ? "file" : "data-b" + std::to_string(block)) +
                                    "-" + std::to_string(w) + "-of-" + std::to_string(n);
    for (std::size_t i = shardAt; i < ops.size(); ++i)
        if (ops[i].kind == TransformKind::Cache && !ops[i].cacheFile.empty()) ops[i].cacheFile += cacheSuffix;
    out.description = "input auto-sharded " + detail + "; batch " + std::to_string(out.localBatch) + " of the global " +
                      std::to_string(global);
    return out;
}

} // namespace ts
