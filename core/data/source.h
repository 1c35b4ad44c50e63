#pragma once
// BatchSource: what the Trainer pulls batches from. The in-memory source (data/dataset.h) and the
// tf.data-style pipeline (data/pipeline.h) both implement it.
// Contract: used from one thread (the trainer's); startEpoch() then next() until it yields no
// batch. Batches are host tensors: x (B, ...features) F32, y (B) I32 class ids or (B, C) F32.
// next() returns an Error for bad data (naming file and record) and Cancelled after cancel().
// cancel() may be called from any thread and must make a blocked next() return promptly.

#include <atomic>
#include <cstdint>
#include <optional>

#include "common/result.h"
#include "tensor/tensor.h"

namespace ts {

struct Batch {
    Tensor x;
    Tensor y;
    // A sharded source (multi-worker: each process materialises only its share) serves rows
    // [offset, offset + size()) of a global batch of globalRows; -1: the batch is the whole one.
    int64_t globalRows = -1;
    int64_t offset = 0;
    // An auto-sharded pipeline (data/auto_shard.h) serves this process's own elements instead:
    // the global batch is the union of every process's batch, globalRows its nominal size (the
    // batch size) and offset 0. The true size is learnt in the step's all-reduce: at the end of
    // an epoch shards may run out unevenly, and an exhausted process joins the remaining steps
    // with an empty batch (x and y undefined).
    bool localShard = false;
    // localShard of a pipeline whose batch drops its remainder: a global batch short of
    // globalRows is dropped as well (no update; the step ends the epoch), as one process would.
    bool dropRemainder = false;
    int64_t size() const { return x.defined() ? x.shape()[0] : 0; }
    int64_t globalSize() const { return globalRows >= 0 ? globalRows : size(); }
};

class BatchSource {
public:
    virtual ~BatchSource() = default;
    virtual Status startEpoch(int64_t epoch) = 0;
    // std::nullopt at the end of the epoch.
    virtual Result<std::optional<Batch>> next() = 0;
    // Batches per epoch, or -1 if unknown.
    virtual int64_t batchesPerEpoch() const = 0;
    virtual int64_t examplesPerEpoch() const = 0;
    virtual void cancel() {}
    // An auto-sharded source: the empty local-shard batch (localShard, globalRows and
    // dropRemainder as its batches carry them) that a process whose shard has run out joins a
    // step with. Any other source: a default Batch (localShard false).
    virtual Batch emptyShard() const { return {}; }
    // > 0: every batch is a localShard of global batches of this many rows.
    int64_t shardedGlobalBatch() const
    {
        const Batch e = emptyShard();
        return e.localShard ? e.globalRows : 0;
    }
};

} // namespace ts
