#pragma once
// Result<T> and Error: how every fallible call in core reports failure. An Error names the
// place (file, line, node, worker, device) in its message and says what to do in its hint.
// No exceptions cross core's public API; the engine thread boundary catches anything else.

#include <cassert>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace ts {

enum class ErrorCode {
    InvalidArgument,   // a value the caller gave is wrong (flag, attribute, config field)
    ParseError,        // malformed JSON / file contents
    NotFound,          // missing file, node, layer, device
    ShapeMismatch,     // shapes that cannot work together
    Unsupported,       // a backend/op/layer that does not exist here
    IoError,           // read/write failure, truncated file
    OutOfMemory,
    Cancelled,
    Internal,          // a broken invariant caught at a boundary (last: errorCodeFromName counts up to it)
};

const char* errorCodeName(ErrorCode code);
// The code errorCodeName gave `name`; nullopt for any other text (e.g. from an older peer).
std::optional<ErrorCode> errorCodeFromName(std::string_view name);

struct Error {
    ErrorCode code = ErrorCode::Internal;
    std::string message;  // what went wrong and where
    std::string hint;     // what to do about it (may be empty)

    // "message (hint: ...)" for logs and command lines.
    std::string toString() const;
};

inline Error makeError(ErrorCode code, std::string message, std::string hint = {})
{
    return Error{code, std::move(message), std::move(hint)};
}

template <typename T>
class [[nodiscard]] Result {
public:
    Result(T value) : m_v(std::in_place_index<0>, std::move(value)) {}
    Result(Error error) : m_v(std::in_place_index<1>, std::move(error)) {}

    bool ok() const { return m_v.index() == 0; }
    explicit operator bool() const { return ok(); }

    T& value() & { assert(ok()); return std::get<0>(m_v); }
    const T& value() const& { assert(ok()); return std::get<0>(m_v); }
    T&& value() && { assert(ok()); return std::get<0>(std::move(m_v)); }
    T* operator->() { return &value(); }
    const T* operator->() const { return &value(); }
    T& operator*() & { return value(); }
    const T& operator*() const& { return value(); }

    const Error& error() const { assert(!ok()); return std::get<1>(m_v); }
    Error&& takeError() { assert(!ok()); return std::get<1>(std::move(m_v)); }

private:
    std::variant<T, Error> m_v;
};

template <>
class [[nodiscard]] Result<void> {
public:
    Result() = default;
    Result(Error error) : m_error(std::move(error)) {}

    bool ok() const { return !m_error.has_value(); }
    explicit operator bool() const { return ok(); }
    const Error& error() const { assert(!ok()); return *m_error; }
    Error&& takeError() { assert(!ok()); return std::move(*m_error); }

private:
    std::optional<Error> m_error;
};

using Status = Result<void>;

inline Status okStatus() { return Status{}; }

} // namespace ts

// Propagate an error from an expression returning Result<...>/Status.
#define TS_TRY(expr)                                   \
    do {                                               \
        auto&& ts_try_r_ = (expr);                     \
        if (!ts_try_r_.ok()) return ts_try_r_.takeError(); \
    } while (0)

#define TS_CONCAT_INNER_(a, b) a##b
#define TS_CONCAT_(a, b) TS_CONCAT_INNER_(a, b)
// TS_ASSIGN(auto x, expr): declare x from a Result, or return its error.
#define TS_ASSIGN(decl, expr) TS_ASSIGN_IMPL_(TS_CONCAT_(ts_assign_r_, __LINE__), decl, expr)
#define TS_ASSIGN_IMPL_(tmp, decl, expr)        \
    auto tmp = (expr);                          \
    if (!tmp.ok()) return tmp.takeError();      \
    decl = std::move(tmp).value()

// Invariants (programming errors), active in debug builds and kept cheap.
#define TS_ASSERT(cond) assert(cond)
