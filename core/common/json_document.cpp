#include "common/json_document.h"

#include "common/paths.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

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

// Finds a key given twice in one object while nlohmann parses (it keeps the last silently, so a
// TF_CONFIG with two "chief" lists trained with the second). Frames follow the nesting; the path
// names where the first repeated key is ("cluster.chief", "layers[].attrs.units").
class DuplicateKeys {
public:
    bool onEvent(int /*depth*/, nlohmann::json::parse_event_t event, nlohmann::json& parsed)
    {
        using E = nlohmann::json::parse_event_t;
        switch (event) {
        case E::object_start: m_frames.push_back({false, {}, {}}); break;
        case E::array_start: m_frames.push_back({true, {}, {}}); break;
        case E::object_end:
        case E::array_end:
            if (!m_frames.empty()) m_frames.pop_back();
            break;
        case E::key:
            if (!m_frames.empty() && !m_frames.back().array) {
                Frame& f = m_frames.back();
                f.key = parsed.get<std::string>();
                // Objects are small (a model's layer, a cluster): a scan beats a hash set.
                if (m_first.empty() && std::find(f.keys.begin(), f.keys.end(), f.key) != f.keys.end()) m_first = path();
                f.keys.push_back(f.key);
            }
            break;
        case E::value: break;
        }
        return true;
    }
    const std::string& first() const { return m_first; }  // empty: none

private:
    struct Frame {
        bool array;
        std::string key;                // the current member's (objects)
        std::vector<std::string> keys;  // seen so far (objects)
    };
    std::string path() const
    {
        std::string out;
        for (const Frame& f : m_frames) {
            if (f.array) out += "[]";
            else out += (out.empty() ? "" : ".") + f.key;
        }
        return out;
    }
    std::vector<Frame> m_frames;
    std::string m_first;
};

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
        DuplicateKeys duplicates;
        nlohmann::json j = nlohmann::json::parse(text, [&duplicates](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
            return duplicates.onEvent(depth, event, parsed);
        });
        if (!duplicates.first().empty()) {
            const std::string& where = duplicates.first();
            const std::string key = where.substr(where.find_last_of(".]") == std::string::npos ? 0 : where.find_last_of(".]") + 1);
            return makeError(ErrorCode::ParseError, source + ": \"" + key + "\" is given twice in one object (at " + where + ")",
                             "keep one \"" + key + "\": JSON readers differ in which one they take");
        }
        return j;
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
        return makeError(ErrorCode::NotFound, path + ": no such " + what, missingFileHint(path));
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
