#include <locale.h>
#include <unistd.h>
#include <wchar.h>

#include <cstdio>
#include <iostream>
#include <string>
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
    // One pass: `fit` is where the text is cut if it turns out longer than width (the last
    // character that leaves room for "..."), `fitCols` its columns.
    const auto* begin = reinterpret_cast<const unsigned char*>(text.data());
    const auto* end = begin + text.size();
    std::size_t fit = 0;
    int cols = 0, fitCols = 0;
    for (const unsigned char* p = begin; p < end && cols <= width;) {
        char32_t cp = 0xFFFD;
        int n = ts::utf8Decode(p, end, cp);
        if (n == 0) n = 1;  // not UTF-8 (stored names are): one column, as printableText would show it
        const int w = cp < 0x80 ? 1 : columnsOf(cp);
        cols += w < 0 ? 1 : w;  // unknown to glibc's tables (a newer emoji) or a control character: one column
        p += n;
        if (cols <= width - 3) {
            fit = static_cast<std::size_t>(p - begin);
            fitCols = cols;
        }
    }
    if (cols <= width) return text + std::string(static_cast<std::size_t>(width - cols), ' ');
    return text.substr(0, fit) + "..." + std::string(static_cast<std::size_t>(std::max(0, width - 3 - fitCols)), ' ');
}

std::string unrecordedRunId(const std::string& prefix)
{
    return prefix + "-" + std::to_string(::getpid()) + "-" + std::to_string(ts::telemetry::wallNowMicros());
}

} // namespace tscli
