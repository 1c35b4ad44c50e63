#include "store/step_series.h"

#include <algorithm>
#include <cstring>

namespace ts::store {

namespace {

void putVarint(std::string& out, int64_t v)
{
    uint64_t z = (static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63);  // zigzag
    while (z >= 0x80) {
        out += static_cast<char>((z & 0x7f) | 0x80);
        z >>= 7;
    }
    out += static_cast<char>(z);
}

bool getVarint(const unsigned char*& p, const unsigned char* end, int64_t& v)
{
    uint64_t z = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (p == end) return false;
        const unsigned char b = *p++;
        z |= static_cast<uint64_t>(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            v = static_cast<int64_t>(z >> 1) ^ -static_cast<int64_t>(z & 1);
            return true;
        }
    }
    return false;
}

} // namespace

void encodeStepSamples(const StepSample* samples, std::size_t count, std::string& out)
{
    out.reserve(out.size() + 1 + count * 14);
    out += static_cast<char>(1);
    int64_t step = 0, epoch = 0, wall = 0;
    for (std::size_t i = 0; i < count; ++i) {
        const StepSample& s = samples[i];
        putVarint(out, s.step - step);
        putVarint(out, s.epoch - epoch);
        putVarint(out, s.wallUs - wall);
        step = s.step;
        epoch = s.epoch;
        wall = s.wallUs;
        uint64_t bits;
        std::memcpy(&bits, &s.value, sizeof bits);
        char le[8];
        for (int b = 0; b < 8; ++b) le[b] = static_cast<char>(bits >> (8 * b));
        out.append(le, 8);
    }
}

bool decodeStepSamples(std::string_view blob, int64_t lo, int64_t hi, std::vector<StepSample>& out)
{
    const auto* p = reinterpret_cast<const unsigned char*>(blob.data());
    const auto* end = p + blob.size();
    if (p == end || *p++ != 1) return false;
    StepSample s;
    while (p != end) {
        int64_t ds, de, dw;
        if (!getVarint(p, end, ds) || !getVarint(p, end, de) || !getVarint(p, end, dw) || end - p < 8) return false;
        s.step += ds;
        s.epoch += de;
        s.wallUs += dw;
        uint64_t bits = 0;
        for (int b = 0; b < 8; ++b) bits |= static_cast<uint64_t>(p[b]) << (8 * b);
        p += 8;
        if (s.step < lo || s.step > hi) continue;
        std::memcpy(&s.value, &bits, sizeof bits);
        out.push_back(s);
    }
    return true;
}

void sortKeepLast(std::vector<StepSample>& samples)
{
    bool sorted = true;
    for (std::size_t i = 1; i < samples.size() && sorted; ++i) sorted = samples[i - 1].step < samples[i].step;
    if (sorted) return;
    std::stable_sort(samples.begin(), samples.end(), [](const StepSample& a, const StepSample& b) { return a.step < b.step; });
    // Of equal steps the stable sort kept the given order: keep the last of each run.
    std::size_t w = 0;
    for (std::size_t i = 0; i < samples.size(); ++i) {
        if (i + 1 < samples.size() && samples[i + 1].step == samples[i].step) continue;
        samples[w++] = samples[i];
    }
    samples.resize(w);
}

} // namespace ts::store
