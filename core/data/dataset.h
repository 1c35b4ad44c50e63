#pragma once
// Whole datasets held in host memory (Fashion-MNIST is 180 MB as float) and the BatchSource
// that serves them in (optionally shuffled) batches.

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/result.h"
#include "data/source.h"
#include "tensor/tensor.h"

namespace ts {

struct InMemoryDataset {
    Tensor x;                // F32 (N, ...features)
    Tensor y;                // I32 (N) class ids
    int64_t numClasses = 0;  // 1 + the largest label
    std::string source;      // where it came from: "<images file> + <labels file>"
    int64_t size() const { return x.defined() ? x.shape()[0] : 0; }
};

// Images (N, H, W) of bytes scaled to [0, 1] as byte / 255.f; x is (N, H*W) if `flatten`,
// else (N, H, W, 1) (NHWC, Keras' layout). Rank-4 images (N, H, W, C) stay NHWC, rank-2 stay (N, D).
// The label file must hold exactly N labels; an error names both files otherwise.
Result<InMemoryDataset> loadIdxDataset(const std::string& imagesPath, const std::string& labelsPath,
                                       bool flatten);

struct IdxFolder {
    InMemoryDataset train;
    InMemoryDataset test;
};

// Loads train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte and
// t10k-labels-idx1-ubyte from `dir`, each gzipped (".gz", preferred when both exist) or raw.
// An error names the folder and every missing file. Without `testRequired` (a run that does not
// validate) the t10k files are loaded when present, and `test` stays empty when they are not.
Result<IdxFolder> loadIdxFolder(const std::string& dir, bool flatten, bool testRequired = true);

// $TRAINSTUDIO_FMNIST_DIR if set and non-empty, else /usr/share/datasets/fashion-mnist
// (where the Debian package dataset-fashion-mnist installs it).
std::string defaultFashionMnistDir();

struct InMemoryBatchOptions {
    int64_t batchSize = 32;
    bool shuffle = true;
    uint64_t seed = 0;
    bool dropRemainder = false;  // drop the last partial batch instead of serving it
    int64_t limit = 0;           // use only examples [0, limit); 0 = all; larger than N = all
    Shape featureShape;          // per-example shape of x in batches, e.g. (28, 28, 1); empty = keep
    // Serve only shard shardIndex of shardCount of every batch: rows [B * i / n, B * (i + 1) / n)
    // of the global batch of B (Batch::globalRows, Batch::offset say which). Multi-worker
    // processes gather just the rows they train on; the order is the same in every shard.
    int64_t shardIndex = 0;
    int64_t shardCount = 1;
};

// Serves an InMemoryDataset. The epoch order is a pure function of (seed, epoch): an
// std::mt19937_64 seeded with splitmix64(seed) ^ splitmix64(epoch + 0x9E3779B97F4A7C15) drives a
// Fisher-Yates shuffle whose index j in [0, i] is the high 64 bits of rng() * (i + 1) (Lemire's
// multiply-shift; unlike std::uniform_int_distribution it is the same on every standard library).
// Batches are copies: a consumer may keep or modify them. Buffers are recycled only when no
// consumer still holds a reference to them.
class InMemoryBatchSource final : public BatchSource {
public:
    using Options = InMemoryBatchOptions;

    // InvalidArgument for a batch size < 1 or larger than the (limited) dataset, a negative
    // limit, or an empty dataset; ShapeMismatch if featureShape does not hold one example of x
    // or x and y disagree on N.
    static Result<std::unique_ptr<InMemoryBatchSource>> create(const InMemoryDataset& dataset,
                                                               const Options& options);

    Status startEpoch(int64_t epoch) override;
    Result<std::optional<Batch>> next() override;
    int64_t batchesPerEpoch() const override;
    int64_t examplesPerEpoch() const override;
    // Sticky: every later next() returns Cancelled.
    void cancel() override { m_cancelled.store(true, std::memory_order_relaxed); }

    // The example indices of the current epoch, in serving order.
    const std::vector<int64_t>& epochOrder() const { return m_order; }
    const Options& options() const { return m_options; }

private:
    InMemoryBatchSource(const InMemoryDataset& dataset, const Options& options, int64_t count);

    struct Buffers {
        Tensor x;
        Tensor y;
    };
    Result<Buffers> acquireBuffers(int64_t rows);

    InMemoryDataset m_data;
    Options m_options;
    int64_t m_count = 0;  // examples used per epoch (after limit)
    Shape m_xRowShape;    // per-example shape of x in batches
    Shape m_yRowShape;
    std::size_t m_xRowBytes = 0;
    std::size_t m_yRowBytes = 0;
    std::vector<int64_t> m_order;
    int64_t m_cursor = 0;
    bool m_started = false;
    Buffers m_pool[2];  // recycled when their storage is no longer shared with a consumer
    int m_nextSlot = 0;
    std::atomic<bool> m_cancelled{false};
};

} // namespace ts
