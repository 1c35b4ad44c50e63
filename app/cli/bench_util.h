#pragma once
// Small helpers shared by the benchmark commands (bench_command.cpp, bench_suites.cpp).

#include <algorithm>
#include <chrono>
#include <fstream>
#include <string>
#include <vector>

namespace tscli {

inline double median(std::vector<double> v)
{
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
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
