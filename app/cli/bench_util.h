#pragma once
// Small helpers shared by the benchmark commands (bench_command.cpp, bench_suites.cpp).

#include <algorithm>
#include <chrono>
#include <vector>

namespace tscli {

inline double median(std::vector<double> v)
{
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

} // namespace tscli
