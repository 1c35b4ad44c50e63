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
    for (ErrorCode c : {ErrorCode::InvalidArgument, ErrorCode::ParseError, ErrorCode::NotFound, ErrorCode::ShapeMismatch, ErrorCode::Unsupported,
                        ErrorCode::IoError, ErrorCode::OutOfMemory, ErrorCode::Cancelled, ErrorCode::Internal})
        if (name == errorCodeName(c)) return c;
    return std::nullopt;
}

std::string Error::toString() const
{
    std::string s = message;
    if (!hint.empty()) s += " (hint: " + hint + ")";
    return s;
}

} // namespace ts
