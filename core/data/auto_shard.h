#pragma once
// Auto-sharding: how one worker process of a multi-worker run turns the run's pipeline into the
// pipeline that reads only its part of the data (tf.data's AutoShardPolicy), so the input work is
// divided instead of every task reading, decoding and mapping every element.
//
//  - file: the source's files are dealt round-robin (worker w of n reads files w, w + n, ...);
//    needs a csv or npz source with at least n files.
//  - data: a shard of the elements is inserted as early as the meaning allows: after the last
//    take, skip or shard before the batch (their counts refer to the whole dataset), so the
//    maps, caches and shuffles after it see only this worker's elements. Elements are dealt in
//    blocks of the global batch B: worker w keeps positions [B*w/n, B*(w+1)/n) of each block, so
//    without a shuffle the union of the workers' k-th batches is the k-th batch one process
//    would train on.
//  - auto: file when the source has at least n files and nothing before the batch counts
//    elements, else data.
//  - off: the pipeline is unchanged; every worker runs all of it and trains on its rows of each
//    global batch (the run then equals one process exactly, at the cost of the input work).
// The batch becomes the worker's share of the global batch, B*(w+1)/n - B*w/n rows. A cache file
// after the shard point gets a suffix naming the policy and the part (".shard-data-b64-1-of-2"),
// so tasks on one disk keep their own and a changed sharding never replays a stale cache.
// Shards may hold different numbers of batches (files of different sizes, the last partial
// batch); the trainer's processes agree on the end of each epoch in the step's all-reduce.
// Pure functions, no I/O.

#include <cstdint>
#include <string>

#include "common/result.h"
#include "data/pipeline_config.h"

namespace ts {

struct ShardedPipeline {
    PipelineSpec spec;                                 // this worker's pipeline
    AutoShardPolicy policy = AutoShardPolicy::Off;     // what was applied: File, Data or Off
    int64_t globalBatch = 0;                           // rows of one global step
    int64_t localBatch = 0;                            // this worker's share of them
    std::string description;                           // one line for the run's log
};

// `spec` must contain a batch transformation. InvalidArgument (prefixed with `where`) when the
// policy cannot apply: a global batch smaller than the workers, "file" with too few files.
// `roundRobin`: by element, deal single elements (position % n == w) instead of blocks of the
// global batch: for evaluation, which only sums, so that small data still reaches every worker.
Result<ShardedPipeline> autoShardPipeline(const PipelineSpec& spec, int workers, int index, const std::string& where = "pipeline",
                                          bool roundRobin = false);

} // namespace ts
