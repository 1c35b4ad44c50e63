#include "common/result.h"

namespace ts {

const char* errorCodeName(ErrorCode code)
{
    switch (code) {
    case ErrorCode::InvalidArgument: return "invalid argument";
    case ErrorCode::ParseError: return "parse error";
    case ErrorCode::NotFound: return "not found";
    case ErrorCode::ShapeMismatch: return "shape mismatch";
    case ErrorCode::Unsupported: return "unsupported";
    case ErrorCode::IoError: return "I/O error";
    case ErrorCode::OutOfMemory: return "out of memory";
    case ErrorCode::Cancelled: return "cancelled";
    case ErrorCode::Internal: return "internal error";
    }
    return "error";
}

std::optional<ErrorCode> errorCodeFromName(std::string_view name)
{
    for (int i = 0; i <= static_cast<int>(ErrorCode::Internal); ++i)
        if (name == errorCodeName(static_cast<ErrorCode>(i))) return static_cast<ErrorCode>(i);
    return std::nullopt;
}

std::string Error::toString() const
{
    std::string s = message;
    if (!hint.empty()) s += " (hint: " + hint + ")";
    return s;
}

} // namespace ts
