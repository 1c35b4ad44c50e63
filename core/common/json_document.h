#pragma once
// Reading JSON documents the user hands us (models, run configurations, TF_CONFIG, traces):
// syntax errors with line and column, numbers too large for a double, and nesting deep enough to
// exhaust the stack later (printing and walking the tree recurse) all come back as a ParseError
// naming the source, instead of a library exception or a crash.

#include <string>

#include <nlohmann/json.hpp>

#include "common/result.h"

namespace ts {

// Deeper nesting than any model, configuration or trace we write; well inside the stack.
inline constexpr int kMaxJsonDepth = 512;

// `source` names the text in messages (a path, "TF_CONFIG", "the TF_CONFIG editor").
Result<nlohmann::json> parseJsonDocument(const std::string& text, const std::string& source);

// ParseError if `text` nests deeper than kMaxJsonDepth (a scan, no parse): for callers that
// parse themselves.
Status checkJsonDepth(const std::string& text, const std::string& source);

// Reads and parses a file: NotFound / IoError name the path (a directory is refused as such).
Result<nlohmann::json> readJsonFile(const std::string& path, const std::string& what = "file");

// Larger than any model, configuration, TF_CONFIG, token or certificate we read this way.
inline constexpr std::size_t kMaxTextFileBytes = std::size_t{64} << 20;

// The file's bytes; the same errors as readJsonFile for a missing, unreadable or directory path,
// and InvalidArgument for more than kMaxTextFileBytes (a device like /dev/zero never ends).
Result<std::string> readTextFile(const std::string& path, const std::string& what = "file");

// Line and column (1-based) of the character before byte offset `byte` (nlohmann's error offset).
std::pair<std::size_t, std::size_t> jsonLineColumn(const std::string& text, std::size_t byte);

} // namespace ts
