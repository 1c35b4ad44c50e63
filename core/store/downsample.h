#pragma once
// Downsampling a metric series for a plot without losing its peaks: M4 (Jugel et al., VLDB 2014).
// The step range [step0, step1] is cut into `buckets` equal buckets (one per pixel column, say);
// each non-empty bucket keeps its first, minimum, maximum and last sample. A line drawn through
// the result covers the same pixels as one drawn through every sample, so spikes (a loss blow-up
// at one step) survive any zoom level. At most 4 points per bucket, in step order.

#include <cstdint>
#include <vector>

namespace ts::store {

struct SeriesPoint {
    int64_t step = 0;
    double value = 0;
    bool operator==(const SeriesPoint&) const = default;
};

class M4Downsampler {
public:
    // buckets >= 1; step1 >= step0. Samples outside the range are ignored.
    M4Downsampler(int64_t step0, int64_t step1, int buckets);

    // Samples may arrive in any order; NaN values are skipped (they draw nothing).
    void add(int64_t step, double value);
    // The kept samples in step order, each once.
    std::vector<SeriesPoint> points() const;
    int64_t samples() const { return m_samples; }

private:
    struct Bucket {
        int64_t count = 0;
        SeriesPoint first, last, min, max;
    };
    int64_t m_step0, m_step1;
    unsigned __int128 m_span;
    std::vector<Bucket> m_buckets;
    int64_t m_samples = 0;
};

// Convenience over M4Downsampler for an in-memory series.
std::vector<SeriesPoint> downsampleM4(const std::vector<SeriesPoint>& samples, int64_t step0, int64_t step1, int buckets);

} // namespace ts::store
