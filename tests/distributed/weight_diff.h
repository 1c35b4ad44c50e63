#pragma once
// Comparing weight files in the distributed tests (one process against several, local against
// coordinated).

#include <QString>

#include <algorithm>
#include <cmath>

#include "io/safetensors.h"

namespace tstest {

// Largest |a - b| over all tensors of two weight files (which must hold the same names/sizes);
// 1e9 when either cannot be read or they hold different tensors.
inline double maxDiff(const QString& a, const QString& b)
{
    auto fa = ts::readSafetensors(a.toStdString());
    auto fb = ts::readSafetensors(b.toStdString());
    if (!fa.ok() || !fb.ok()) return 1e9;
    if (fa->tensors.size() != fb->tensors.size() || fa->tensors.empty()) return 1e9;
    double worst = 0;
    for (const auto& [name, x] : fa->tensors) {
        auto it = fb->tensors.find(name);
        if (it == fb->tensors.end() || x.numel() != it->second.numel()) return 1e9;
        const ts::Tensor& y = it->second;
        for (int64_t k = 0; k < x.numel(); ++k) worst = std::max(worst, std::fabs(double(x.data<float>()[k]) - double(y.data<float>()[k])));
    }
    return worst;
}

} // namespace tstest
