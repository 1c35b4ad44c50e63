#include "store/downsample.h"

#include <algorithm>
#include <cmath>

namespace ts::store {

M4Downsampler::M4Downsampler(int64_t step0, int64_t step1, int buckets)
    : m_step0(step0), m_step1(std::max(step0, step1)),
      m_span(static_cast<unsigned __int128>(static_cast<__int128>(std::max(step0, step1)) - step0) + 1),
      m_buckets(static_cast<std::size_t>(std::max(1, buckets)))
{
}

void M4Downsampler::add(int64_t step, double value)
{
    if (step < m_step0 || step > m_step1 || std::isnan(value)) return;
    // 128-bit so that a range spanning the whole int64 axis does not overflow.
    const auto offset = static_cast<unsigned __int128>(static_cast<__int128>(step) - m_step0);
    const auto index = static_cast<std::size_t>(offset * m_buckets.size() / m_span);
    Bucket& b = m_buckets[index];
    const SeriesPoint p{step, value};
    if (b.count++ == 0) {
        b.first = b.last = b.min = b.max = p;
    } else {
        if (step < b.first.step) b.first = p;
        if (step >= b.last.step) b.last = p;
        if (value < b.min.value || (value == b.min.value && step < b.min.step)) b.min = p;
        if (value > b.max.value || (value == b.max.value && step < b.max.step)) b.max = p;
    }
    ++m_samples;
}

std::vector<SeriesPoint> M4Downsampler::points() const
{
    std::vector<SeriesPoint> out;
    out.reserve(m_buckets.size() * 2);
    for (const Bucket& b : m_buckets) {
        if (b.count == 0) continue;
        SeriesPoint four[4] = {b.first, b.min, b.max, b.last};
        std::sort(std::begin(four), std::end(four), [](const SeriesPoint& a, const SeriesPoint& c) { return a.step < c.step; });
        for (const SeriesPoint& p : four)
            if (out.empty() || out.back().step != p.step) out.push_back(p);
    }
    return out;
}

std::vector<SeriesPoint> downsampleM4(const std::vector<SeriesPoint>& samples, int64_t step0, int64_t step1, int buckets)
{
    M4Downsampler m4(step0, step1, buckets);
    for (const SeriesPoint& p : samples) m4.add(p.step, p.value);
    return m4.points();
}

} // namespace ts::store
