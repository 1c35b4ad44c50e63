#include <locale.h>
#include <unistd.h>
#include <wchar.h>

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>
#include <algorithm>

#include "commands.h"
#include "common/result.h"
#include "common/utf8.h"
#include "telemetry/tracer.h"

namespace tscli {

void printError(const ts::Error& e)
{
    std::cerr << "error: " << ts::printableText(e.message) << "\n";
    if (!e.hint.empty()) std::cerr << "hint: " << ts::printableText(e.hint) << "\n";
}

void clearProgressLine()
{
    // The bar is at most ~100 columns wide (train_command.cpp's ConsoleListener::onStep).
    if (isatty(STDERR_FILENO)) std::fputs(("\r" + std::string(110, ' ') + "\r").c_str(), stderr);
}

namespace {

// The columns one code point takes; -1 where wcwidth knows none (a control character).
int columnsOf(char32_t cp)
{
    // C.UTF-8 is built into glibc (Debian 12 and later); set for this thread only, so the
    // program's own locale (numbers in printf) is untouched.
    static thread_local locale_t utf8 = newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(nullptr));
    if (!utf8) return 1;
    const locale_t before = uselocale(utf8);
    const int w = wcwidth(static_cast<wchar_t>(cp));
    uselocale(before);
    return w;
}

} // namespace

std::string column(const std::string& text, int width)
{
    struct Piece {
        std::size_t end;  // byte offset after this character
        int cols;         // columns up to and including it
    };
    std::vector<Piece> pieces;
    const auto* begin = reinterpret_cast<const unsigned char*>(text.data());
    const auto* end = begin + text.size();
    int cols = 0;
    for (const unsigned char* p = begin; p < end;) {
        int n = ts::utf8SequenceLength(p, end);
        char32_t cp = 0xFFFD;
        if (n == 0) {
            n = 1;  // not UTF-8 (stored names are): one column, as printableText would show it
        } else if (n == 1) {
            cp = *p;
        } else {
            cp = static_cast<char32_t>(p[0] & (0xFF >> (n + 1)));
            for (int i = 1; i < n; ++i) cp = (cp << 6) | (p[i] & 0x3F);
        }
        const int w = columnsOf(cp);
        cols += w < 0 ? 1 : w;  // unknown to glibc's tables (a newer emoji) or a control character: one column
        p += n;
        pieces.push_back({static_cast<std::size_t>(p - begin), cols});
    }
    if (cols <= width) return text + std::string(static_cast<std::size_t>(width - cols), ' ');
    // Longer: as many characters as fit in width - 3, then "...".
    std::size_t cut = 0;
    int used = 0;
    for (const Piece& piece : pieces) {
        if (piece.cols > width - 3) break;
        cut = piece.end;
        used = piece.cols;
    }
    return text.substr(0, cut) + "..." + std::string(static_cast<std::size_t>(std::max(0, width - 3 - used)), ' ');
}

std::string unrecordedRunId(const std::string& prefix)
{
    return prefix + "-" + std::to_string(::getpid()) + "-" + std::to_string(ts::telemetry::wallNowMicros());
}

} // namespace tscli
