#pragma once
// Names and tags the user types end up in JSON (exports, `runs --json`, the store's snapshots),
// which must be valid UTF-8: refuse other bytes where they enter instead of failing later. Text
// taken from files (a CSV header, a value) is shown in messages through printableText(), so a
// terminal never receives escape sequences or binary from a damaged or hostile file.

#include <cstdio>
#include <string>
#include <string_view>

namespace ts {

// The well-formed UTF-8 sequence at p: its length (1-4 bytes) and code point, or 0 if it is not
// one (overlong forms, surrogates, code points above U+10FFFF, a truncated sequence).
inline int utf8Decode(const unsigned char* p, const unsigned char* end, char32_t& codePoint)
{
    const unsigned char c = *p;
    int n = 0;
    unsigned cp = 0;
    if (c < 0x80) {
        codePoint = c;
        return 1;
    }
    if (c >= 0xC2 && c <= 0xDF) { n = 1; cp = c & 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) { n = 2; cp = c & 0x0F; }
    else if (c >= 0xF0 && c <= 0xF4) { n = 3; cp = c & 0x07; }
    else return 0;
    if (end - p <= n) return 0;
    for (int i = 1; i <= n; ++i) {
        if ((p[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (p[i] & 0x3F);
    }
    if ((n == 2 && cp < 0x800) || (n == 3 && (cp < 0x10000 || cp > 0x10FFFF)) || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    codePoint = cp;
    return n + 1;
}

// The length of the well-formed UTF-8 sequence at p (1-4 bytes), 0 if it is not one.
inline int utf8SequenceLength(const unsigned char* p, const unsigned char* end)
{
    char32_t cp = 0;
    return utf8Decode(p, end, cp);
}

// ASCII letters in lower case, other bytes (UTF-8 sequences included) unchanged: run ids, type
// and class names compared without case.
inline std::string lowerAscii(std::string s)
{
    for (char& c : s)
        if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    return s;
}

// Well-formed UTF-8 (no overlong forms, surrogates or code points above U+10FFFF).
inline bool isValidUtf8(std::string_view s)
{
    const auto* p = reinterpret_cast<const unsigned char*>(s.data());
    const auto* end = p + s.size();
    while (p < end) {
        const int n = utf8SequenceLength(p, end);
        if (n == 0) return false;
        p += n;
    }
    return true;
}

// `s` with control characters (but newline and tab) and bytes that are not UTF-8 written as
// \xNN, e.g. "ESC[31m" from a file header becomes "\x1b[31m".
inline std::string printableText(std::string_view s)
{
    std::string out;
    out.reserve(s.size());
    const auto* p = reinterpret_cast<const unsigned char*>(s.data());
    const auto* end = p + s.size();
    while (p < end) {
        const int n = utf8SequenceLength(p, end);
        const bool control = (n == 1 && ((*p < 0x20 && *p != '\n' && *p != '\t') || *p == 0x7F)) ||
                             (n == 2 && p[0] == 0xC2 && p[1] <= 0x9F);  // C1 controls: a terminal acts on some
        if (n == 0 || control) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\x%02x", *p);
            out += buf;
            ++p;
            continue;
        }
        out.append(reinterpret_cast<const char*>(p), static_cast<std::size_t>(n));
        p += n;
    }
    return out;
}

} // namespace ts
