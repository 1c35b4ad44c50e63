#pragma once
// Element: one item flowing through an input pipeline (data/pipeline.h): one example's features
// and label before batch(), a whole batch after it. Elements share tensor storage freely (a
// source's element is a view on its loaded array), so stages never modify an input element's
// tensors in place: a map function that changes values writes a new tensor.

#include <cstdint>
#include <memory>
#include <string>

#include "tensor/tensor.h"

namespace ts {

struct Element {
    Tensor x;      // features: (...) for one example, (B, ...) after batch(); undefined before decode_image
    Tensor y;      // label: I32 scalar class id, or F32 (C) (one-hot, regression); batched (B) / (B, C)
    // Stable identity of the record in its source (row, line, file index), mixed with the
    // repetition count by repeat(). Random augmentation is seeded from (seed, epoch, key), so it
    // does not depend on thread timing, parallelism or the position after shuffle.
    uint64_t key = 0;
    // Where the element came from, for error messages: a file path (shared by every record of
    // the file). May be null for in-memory tensors.
    std::shared_ptr<const std::string> origin;
    // The labels' file where they come from another one (an npy source's y, IDX labels); null:
    // `origin` holds both.
    std::shared_ptr<const std::string> labelOrigin;
    // Position inside `origin` in human terms ("line 17", "row 4031"); empty: "element <key>".
    std::string position;

    // "'file.csv' line 17" / "'train-images.gz' row 42" / "element 42": for error messages.
    std::string where() const;
    // where() for a message about the label: the labels' own file when they have one.
    std::string labelWhere() const;
};

// What a map function gets besides the element.
struct MapContext {
    uint64_t seed = 0;   // the function's seed (its own, or derived from the pipeline's)
    int64_t epoch = 0;   // 0-based epoch (mixed with the repetition for repeat())
};

// splitmix64: the mixing step behind every seed in the pipeline.
uint64_t mixSeed(uint64_t x);
// The seed of one random decision on one element: a pure function of its arguments.
uint64_t elementSeed(uint64_t seed, int64_t epoch, uint64_t key);

// A tiny counter-based generator (splitmix64 stream): the same numbers on every platform and
// standard library, unlike std::uniform_int_distribution.
class SplitMix {
public:
    explicit SplitMix(uint64_t seed) : m_state(seed) {}
    uint64_t next();
    // Uniform in [0, n) by Lemire's multiply-shift (n >= 1).
    uint64_t below(uint64_t n);
    // Uniform in [0, 1).
    double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

private:
    uint64_t m_state;
};

} // namespace ts
