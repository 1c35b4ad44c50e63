#pragma once
// Small helpers shared by the benchmark commands (bench_command.cpp, bench_suites.cpp).

#include <algorithm>
#include <chrono>
#include <fstream>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace tscli {

inline double median(std::vector<double> v)
{
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// A 95% bootstrap confidence interval of the median of `v` (percentile method, 2000 resamples,
// fixed seed so that a report can be reproduced from its numbers). Pair ratios on a noisy VM are
// far from normal (a neighbour only ever slows a run), so no t-interval.
inline std::pair<double, double> medianInterval95(const std::vector<double>& v)
{
    if (v.size() < 2) return {median(v), median(v)};
    std::mt19937_64 rng(20261203);
    std::uniform_int_distribution<std::size_t> pick(0, v.size() - 1);
    std::vector<double> medians, sample(v.size());
    for (int i = 0; i < 2000; ++i) {
        for (double& x : sample) x = v[pick(rng)];
        medians.push_back(median(sample));
    }
    std::sort(medians.begin(), medians.end());
    return {medians[49], medians[1949]};
}

// OpenBLAS 0.3.21 does not recognise every current CPU and then falls back to a slow SSE3
// kernel; name the kernel that fits this CPU's vector width (for the PyTorch references).
inline std::string openblasCoreType()
{
    std::ifstream in("/proc/cpuinfo");
    std::string line;
    while (std::getline(in, line))
        if (line.rfind("flags", 0) == 0) return line.find(" avx512f") != std::string::npos ? "SkylakeX" : "Haswell";
    return "Haswell";
}

} // namespace tscli
