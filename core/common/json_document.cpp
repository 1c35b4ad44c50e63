#include "common/json_document.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace ts {
namespace {

// "syntax error while parsing value - invalid literal; last read: 'x'" without nlohmann's
// "[json.exception.parse_error.101] parse error at line 1, column 2: " prefix.
std::string parseErrorText(const std::string& what)
{
    const std::size_t at = what.find("parse error");
    if (at == std::string::npos) return what;
    const std::size_t colon = what.find(": ", at);
    return colon == std::string::npos ? what : what.substr(colon + 2);
}

// The byte offset where nesting first exceeds kMaxJsonDepth, or npos (strings skipped).
std::size_t tooDeepAt(const std::string& text)
{
    int depth = 0;
    bool inString = false;
    for (std::size_t i = 0; i < text.size(); ++i) {
        const char c = text[i];
        if (inString) {
            if (c == '\\') ++i;
            else if (c == '"') inString = false;
            continue;
        }
        if (c == '"') inString = true;
        else if (c == '[' || c == '{') {
            if (++depth > kMaxJsonDepth) return i + 1;
        } else if (c == ']' || c == '}') {
            --depth;
        }
    }
    return std::string::npos;
}

} // namespace

std::pair<std::size_t, std::size_t> jsonLineColumn(const std::string& text, std::size_t byte)
{
    const std::size_t end = std::min(byte > 0 ? byte - 1 : 0, text.size());
    std::size_t line = 1, lineStart = 0;
    for (std::size_t i = 0; i < end; ++i)
        if (text[i] == '\n') {
            ++line;
            lineStart = i + 1;
        }
    return {line, end - lineStart + 1};
}

Status checkJsonDepth(const std::string& text, const std::string& source)
{
    if (const std::size_t at = tooDeepAt(text); at != std::string::npos) {
        const auto [line, column] = jsonLineColumn(text, at);
        return makeError(ErrorCode::ParseError,
                         source + ":" + std::to_string(line) + ":" + std::to_string(column) + ": JSON nested more than " +
                             std::to_string(kMaxJsonDepth) + " levels deep",
                         "no model, configuration or trace nests that deep: check that this is the right file");
    }
    return okStatus();
}

Result<nlohmann::json> parseJsonDocument(const std::string& text, const std::string& source)
{
    TS_TRY(checkJsonDepth(text, source));
    try {
        return nlohmann::json::parse(text);
    } catch (const nlohmann::json::parse_error& e) {
        const auto [line, column] = jsonLineColumn(text, e.byte);
        return makeError(ErrorCode::ParseError,
                         source + ":" + std::to_string(line) + ":" + std::to_string(column) + ": JSON syntax error: " + parseErrorText(e.what()),
                         "fix the JSON at line " + std::to_string(line) + ", column " + std::to_string(column) +
                             " (a missing comma, quote or bracket is the usual cause)");
    } catch (const nlohmann::json::exception& e) {
        // out_of_range.406: a number beyond a double's range (1e999).
        std::string what = e.what();
        if (const auto b = what.find("] "); b != std::string::npos) what = what.substr(b + 2);
        return makeError(ErrorCode::ParseError, source + ": " + what, "numbers must fit a double (below about 1.8e308)");
    }
}

Result<std::string> readTextFile(const std::string& path, const std::string& what)
{
    std::error_code ec;
    const auto status = std::filesystem::status(path, ec);
    if (ec || !std::filesystem::exists(status))
        return makeError(ErrorCode::NotFound, path + ": no such " + what, "check the path");
    if (std::filesystem::is_directory(status))
        return makeError(ErrorCode::InvalidArgument, path + " is a folder, not a " + what, "name the file inside it");
    std::ifstream in(path, std::ios::binary);
    if (!in) return makeError(ErrorCode::IoError, path + ": cannot open: " + std::strerror(errno), "check that the file is readable");
    // Read in chunks up to the cap: a device or pipe (/dev/zero) must not fill memory.
    std::string text;
    char chunk[1 << 16];
    while (in.read(chunk, sizeof chunk) || in.gcount() > 0) {
        text.append(chunk, static_cast<std::size_t>(in.gcount()));
        if (text.size() > kMaxTextFileBytes)
            return makeError(ErrorCode::InvalidArgument,
                             path + ": larger than " + std::to_string(kMaxTextFileBytes >> 20) + " MiB, too large for a " + what,
                             "check that this is the right file");
    }
    if (in.bad()) return makeError(ErrorCode::IoError, path + ": read failed: " + std::strerror(errno), "check the disk and the file");
    return text;
}

Result<nlohmann::json> readJsonFile(const std::string& path, const std::string& what)
{
    TS_ASSIGN(std::string text, readTextFile(path, what));
    return parseJsonDocument(text, path);
}

} // namespace ts
