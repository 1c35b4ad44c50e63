#include "data/element.h"

namespace ts {

std::string Element::where() const
{
    std::string s;
    if (origin) s = "'" + *origin + "' ";
    s += position.empty() ? "element " + std::to_string(key) : position;
    return s;
}

std::string Element::labelWhere() const
{
    if (!labelOrigin) return where();
    return "'" + *labelOrigin + "' " + (position.empty() ? "element " + std::to_string(key) : position);
}

uint64_t mixSeed(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

uint64_t elementSeed(uint64_t seed, int64_t epoch, uint64_t key)
{
    return mixSeed(mixSeed(mixSeed(seed) ^ static_cast<uint64_t>(epoch)) ^ key);
}

uint64_t SplitMix::next()
{
    m_state += 0x9E3779B97F4A7C15ull;
    uint64_t z = m_state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint64_t SplitMix::below(uint64_t n)
{
    return static_cast<uint64_t>((static_cast<unsigned __int128>(next()) * n) >> 64);
}

} // namespace ts
