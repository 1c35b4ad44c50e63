#pragma once
// Step metrics are stored packed (schema 3): one row per run, metric and batch of steps, its
// samples in one blob, instead of one row per metric and step. A training step records four or
// more metrics, and the writer's cost was per row (a B-tree insert each); packed, a batch of
// hundreds of steps costs a handful of rows, and a plot reads a long series without stepping
// SQLite through a row per sample.
//
// Blob format "v1": a version byte (1), then per sample, in step order: the step, epoch and
// wall time as zigzag varints of the difference to the previous sample's (the first to 0), and
// the value as 8 little-endian bytes of its IEEE double (NaN kept as NaN).

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace ts::store {

struct StepSample {
    int64_t step = 0, epoch = 0, wallUs = 0;
    double value = 0;
};

// At most this many samples go into one row, so a zoomed query decodes little beyond its range.
inline constexpr std::size_t kStepBlockSamples = 4096;

// Appends the encoding of `samples` (sorted by step) to `out`.
void encodeStepSamples(const StepSample* samples, std::size_t count, std::string& out);
// Appends the samples of `blob` with lo <= step <= hi to `out`; false if it is damaged.
bool decodeStepSamples(std::string_view blob, int64_t lo, int64_t hi, std::vector<StepSample>& out);

// Sorts samples by step and keeps, of several with one step, the last given (a re-recorded step
// replaces the earlier value, as the old one-row-per-step table's INSERT OR REPLACE did).
void sortKeepLast(std::vector<StepSample>& samples);

} // namespace ts::store
