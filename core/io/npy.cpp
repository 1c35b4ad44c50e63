#include "io/npy.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <string_view>
#include <vector>

#include "common/paths.h"
#include "io/safetensors.h"  // writeFileAtomically

namespace ts {

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr std::size_t kMagicLen = 6;

struct FileCloser {
    void operator()(std::FILE* f) const
    {
        if (f) std::fclose(f);
    }
};

// The header is a Python dict literal, e.g. {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }.
// numpy writes it with repr(); this parser accepts exactly that subset: string keys, and values that
// are strings, True/False or tuples of non-negative integers.
struct HeaderValue {
    enum Kind { String, Bool, Tuple } kind = String;
    std::string str;
    bool boolean = false;
    std::vector<int64_t> ints;
};

class HeaderParser {
public:
    explicit HeaderParser(std::string_view s) : m_s(s) {}

    bool parse(std::map<std::string, HeaderValue>& out, std::string& err)
    {
        skipSpace();
        if (!eat('{')) return fail(err, "expected '{'");
        for (;;) {
            skipSpace();
            if (eat('}')) break;
            std::string key;
            if (!parseString(key)) return fail(err, "expected a quoted key");
            skipSpace();
            if (!eat(':')) return fail(err, "expected ':' after '" + key + "'");
            skipSpace();
            HeaderValue v;
            if (!parseValue(v)) return fail(err, "cannot read the value of '" + key + "'");
            out[key] = std::move(v);
            skipSpace();
            if (eat(',')) continue;
            if (eat('}')) break;
            return fail(err, "expected ',' or '}' after the value of '" + key + "'");
        }
        skipSpace();
        if (m_pos != m_s.size()) return fail(err, "unexpected text after the closing '}'");
        return true;
    }

private:
    bool fail(std::string& err, const std::string& what)
    {
        err = what + " at offset " + std::to_string(m_pos);
        return false;
    }
    void skipSpace()
    {
        while (m_pos < m_s.size() && (m_s[m_pos] == ' ' || m_s[m_pos] == '\n' || m_s[m_pos] == '\t' || m_s[m_pos] == '\r'))
            ++m_pos;
    }
    bool eat(char c)
    {
        if (m_pos < m_s.size() && m_s[m_pos] == c) {
            ++m_pos;
            return true;
        }
        return false;
    }
    bool eatWord(std::string_view w)
    {
        if (m_s.substr(m_pos, w.size()) == w) {
            m_pos += w.size();
            return true;
        }
        return false;
    }
    bool parseString(std::string& out)
    {
        if (m_pos >= m_s.size() || (m_s[m_pos] != '\'' && m_s[m_pos] != '"')) return false;
        const char q = m_s[m_pos++];
        const std::size_t end = m_s.find(q, m_pos);
        if (end == std::string_view::npos) return false;
        out = std::string(m_s.substr(m_pos, end - m_pos));
        m_pos = end + 1;
        return true;
    }
    bool parseInt(int64_t& out)
    {
        const std::size_t start = m_pos;
        int64_t v = 0;
        while (m_pos < m_s.size() && m_s[m_pos] >= '0' && m_s[m_pos] <= '9') {
            if (v > (std::numeric_limits<int64_t>::max() - 9) / 10) return false;
            v = v * 10 + (m_s[m_pos++] - '0');
        }
        eat('L');  // Python 2 longs
        out = v;
        return m_pos > start;
    }
    bool parseValue(HeaderValue& v)
    {
        if (eatWord("True")) {
            v.kind = HeaderValue::Bool;
            v.boolean = true;
            return true;
        }
        if (eatWord("False")) {
            v.kind = HeaderValue::Bool;
            return true;
        }
        if (eat('(')) {
            v.kind = HeaderValue::Tuple;
            for (;;) {
                skipSpace();
                if (eat(')')) return true;
                int64_t d;
                if (!parseInt(d)) return false;
                v.ints.push_back(d);
                skipSpace();
                if (eat(',')) continue;
                if (eat(')')) return true;
                return false;
            }
        }
        v.kind = HeaderValue::String;
        return parseString(v.str);
    }

    std::string_view m_s;
    std::size_t m_pos = 0;
};

enum class NpyType { F4, F8, I4, I8, U1, B1 };

} // namespace

Result<Tensor> readNpy(const std::string& path)
{
    namespace fs = std::filesystem;
    std::error_code ec;
    const auto st = fs::status(path, ec);
    if (!fs::exists(st)) return makeError(ErrorCode::NotFound, ".npy file '" + path + "' does not exist", missingFileHint(path));
    if (!fs::is_regular_file(st))
        return makeError(ErrorCode::IoError, ".npy path '" + path + "' is not a regular file");
    const uint64_t fileSize = fs::file_size(path, ec);
    if (ec) return makeError(ErrorCode::IoError, "cannot stat '" + path + "': " + ec.message());
    std::unique_ptr<std::FILE, FileCloser> f(std::fopen(path.c_str(), "rb"));
    if (!f) return makeError(ErrorCode::IoError, "cannot open '" + path + "': " + std::strerror(errno));

    unsigned char pre[12] = {};
    const std::size_t got = std::fread(pre, 1, 10, f.get());
    if (got < 8 || std::memcmp(pre, kMagic, kMagicLen) != 0) {
        std::string found;
        char buf[4];
        for (std::size_t i = 0; i < std::min<std::size_t>(got, 6); ++i) {
            std::snprintf(buf, sizeof buf, "%s%02x", i ? " " : "", pre[i]);
            found += buf;
        }
        return makeError(ErrorCode::ParseError,
                         "'" + path + "' is not a .npy file: it starts with bytes " + (found.empty() ? "(none)" : found) +
                             ", expected 93 4e 55 4d 50 59 (\\x93NUMPY)",
                         "write it with numpy.save");
    }
    const int major = pre[6];
    const int minor = pre[7];
    std::size_t prefix = 0;
    uint64_t headerLen = 0;
    if (major == 1) {
        if (got < 10) return makeError(ErrorCode::IoError, ".npy file '" + path + "' is truncated inside its preamble");
        headerLen = pre[8] | (uint64_t(pre[9]) << 8);
        prefix = 10;
    } else if (major == 2 || major == 3) {
        if (std::fread(pre + 10, 1, 2, f.get()) != 2)
            return makeError(ErrorCode::IoError, ".npy file '" + path + "' is truncated inside its preamble");
        headerLen = pre[8] | (uint64_t(pre[9]) << 8) | (uint64_t(pre[10]) << 16) | (uint64_t(pre[11]) << 24);
        prefix = 12;
    } else {
        return makeError(ErrorCode::Unsupported,
                         ".npy file '" + path + "' has format version " + std::to_string(major) + "." +
                             std::to_string(minor) + "; versions 1.0, 2.0 and 3.0 are supported");
    }
    if (prefix + headerLen > fileSize)
        return makeError(ErrorCode::IoError, ".npy file '" + path + "' is truncated: its header needs " +
                                                 std::to_string(headerLen) + " bytes, " +
                                                 std::to_string(fileSize - prefix) + " remain");
    std::string header(static_cast<std::size_t>(headerLen), '\0');
    if (std::fread(header.data(), 1, header.size(), f.get()) != header.size())
        return makeError(ErrorCode::IoError, "cannot read the header of '" + path + "'");

    std::map<std::string, HeaderValue> dict;
    std::string perr;
    if (!HeaderParser(header).parse(dict, perr))
        return makeError(ErrorCode::ParseError, ".npy file '" + path + "' has a malformed header (" + perr + "): " + header);
    const auto descrIt = dict.find("descr");
    const auto fortranIt = dict.find("fortran_order");
    const auto shapeIt = dict.find("shape");
    if (descrIt == dict.end() || fortranIt == dict.end() || shapeIt == dict.end())
        return makeError(ErrorCode::ParseError,
                         ".npy file '" + path + "': the header lacks 'descr', 'fortran_order' or 'shape': " + header);
    if (descrIt->second.kind != HeaderValue::String)
        return makeError(ErrorCode::Unsupported,
                         ".npy file '" + path + "' holds a structured dtype; only plain numeric arrays are supported");
    if (fortranIt->second.kind != HeaderValue::Bool || shapeIt->second.kind != HeaderValue::Tuple)
        return makeError(ErrorCode::ParseError,
                         ".npy file '" + path + "': 'fortran_order' must be True/False and 'shape' a tuple: " + header);
    if (fortranIt->second.boolean)
        return makeError(ErrorCode::Unsupported,
                         ".npy file '" + path + "' is stored in Fortran (column-major) order; only C order is supported",
                         "re-save it with numpy.save(path, numpy.ascontiguousarray(a))");

    const std::string descr = descrIt->second.str;
    NpyType type;
    std::size_t itemSize;
    DType dtype;
    const std::string code = descr.size() == 3 ? descr.substr(1) : std::string();
    const char order = descr.empty() ? '?' : descr[0];
    // '<' little-endian, '=' native (little-endian on every host we build for), '|' not applicable.
    const bool littleOk = order == '<' || order == '=';
    const bool byteOk = littleOk || order == '|';
    if (code == "f4" && littleOk) type = NpyType::F4, itemSize = 4, dtype = DType::F32;
    else if (code == "f8" && littleOk) type = NpyType::F8, itemSize = 8, dtype = DType::F32;
    else if (code == "i4" && littleOk) type = NpyType::I4, itemSize = 4, dtype = DType::I32;
    else if (code == "i8" && littleOk) type = NpyType::I8, itemSize = 8, dtype = DType::I32;
    else if (code == "u1" && byteOk) type = NpyType::U1, itemSize = 1, dtype = DType::U8;
    else if (code == "b1" && byteOk) type = NpyType::B1, itemSize = 1, dtype = DType::U8;
    else
        return makeError(ErrorCode::Unsupported,
                         ".npy file '" + path + "' has dtype '" + descr +
                             "'; supported: <f4, <f8, <i4, <i8, |u1, |b1",
                         order == '>' ? "big-endian data: re-save with a.astype(a.dtype.newbyteorder('<'))"
                                      : "convert it first, e.g. numpy.save(path, a.astype(numpy.float32))");

    uint64_t numel = 1;
    for (int64_t d : shapeIt->second.ints) {
        if (d > (int64_t(1) << 48) || (d != 0 && numel > (uint64_t(1) << 48) / static_cast<uint64_t>(d)))
        {
            std::string dims;
            for (int64_t e : shapeIt->second.ints) dims += (dims.empty() ? "" : ", ") + std::to_string(e);
            return makeError(ErrorCode::ParseError, ".npy file '" + path + "' has an impossibly large shape (" + dims + ")",
                             "its header is damaged (over 2^48 elements); write the file again with numpy.save");
        }
        numel *= static_cast<uint64_t>(d);
    }
    const uint64_t dataBytes = numel * itemSize;
    const uint64_t available = fileSize - prefix - headerLen;
    if (available < dataBytes)
        return makeError(ErrorCode::IoError,
                         ".npy file '" + path + "' is truncated: expected " + std::to_string(dataBytes) +
                             " bytes of data, found " + std::to_string(available),
                         "the file was cut short (an interrupted copy or download); write or copy it again");
    if (available > dataBytes)
        return makeError(ErrorCode::ParseError,
                         ".npy file '" + path + "' has " + std::to_string(available - dataBytes) +
                             " bytes after the data its header describes",
                         "its header does not match its data; write it again with numpy.save");

    TS_ASSIGN(Tensor t, Tensor::create(Shape(shapeIt->second.ints), dtype));
    const std::size_t n = static_cast<std::size_t>(numel);
    auto readInto = [&](void* dst, std::size_t bytes) -> Status {
        if (bytes > 0 && std::fread(dst, 1, bytes, f.get()) != bytes)
            return makeError(ErrorCode::IoError, "cannot read the data of '" + path + "'");
        return okStatus();
    };
    switch (type) {
    case NpyType::F4:
    case NpyType::I4:
    case NpyType::U1:
        TS_TRY(readInto(t.raw(), static_cast<std::size_t>(dataBytes)));
        break;
    case NpyType::B1: {
        TS_TRY(readInto(t.raw(), n));
        uint8_t* p = t.data<uint8_t>();
        for (std::size_t i = 0; i < n; ++i) p[i] = p[i] != 0;
        break;
    }
    case NpyType::F8: {
        std::vector<double> tmp(n);
        TS_TRY(readInto(tmp.data(), n * 8));
        float* p = t.data<float>();
        for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<float>(tmp[i]);
        break;
    }
    case NpyType::I8: {
        std::vector<int64_t> tmp(n);
        TS_TRY(readInto(tmp.data(), n * 8));
        int32_t* p = t.data<int32_t>();
        for (std::size_t i = 0; i < n; ++i) {
            if (tmp[i] < std::numeric_limits<int32_t>::min() || tmp[i] > std::numeric_limits<int32_t>::max())
                return makeError(ErrorCode::InvalidArgument,
                                 ".npy file '" + path + "': element " + std::to_string(i) + " = " +
                                     std::to_string(tmp[i]) + " does not fit in int32",
                                 "TrainStudio stores integers as int32; rescale or re-encode the values");
            p[i] = static_cast<int32_t>(tmp[i]);
        }
        break;
    }
    }
    return t;
}

Status writeNpy(const std::string& path, const Tensor& tensor)
{
    if (!tensor.defined())
        return makeError(ErrorCode::InvalidArgument, "cannot write an undefined tensor to '" + path + "'");
    if (!tensor.hostAccessible())
        return makeError(ErrorCode::InvalidArgument,
                         "the tensor for '" + path + "' lives on " + tensor.device().toString(),
                         "copy it to the host before saving");
    const char* descr = nullptr;
    switch (tensor.dtype()) {
    case DType::F32: descr = "<f4"; break;
    case DType::I32: descr = "<i4"; break;
    case DType::U8: descr = "|u1"; break;
    default:
        return makeError(ErrorCode::Unsupported,
                         std::string("cannot write a ") + dtypeName(tensor.dtype()) + " tensor to .npy file '" + path +
                             "'; supported: f32, i32, u8",
                         "convert it to f32 first");
    }
    std::string shape = "(";
    const auto& dims = tensor.shape().dims();
    for (std::size_t i = 0; i < dims.size(); ++i) shape += (i ? ", " : "") + std::to_string(dims[i]);
    if (dims.size() == 1) shape += ",";
    shape += ")";
    std::string header = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";

    // numpy pads with spaces and ends with '\n' so the data starts at a multiple of 64 bytes.
    std::size_t prefix = 10;
    if ((prefix + header.size() + 1 + 63) / 64 * 64 - prefix > 65535) prefix = 12;
    const std::size_t total = (prefix + header.size() + 1 + 63) / 64 * 64;
    header.append(total - prefix - header.size() - 1, ' ');
    header.push_back('\n');

    std::string pre(kMagic, kMagicLen);
    const uint64_t hl = header.size();
    if (prefix == 10) {
        pre += '\x01';
        pre += '\x00';
        pre += static_cast<char>(hl & 0xFF);
        pre += static_cast<char>((hl >> 8) & 0xFF);
    } else {
        pre += '\x02';
        pre += '\x00';
        for (int i = 0; i < 4; ++i) pre += static_cast<char>((hl >> (8 * i)) & 0xFF);
    }
    return writeFileAtomically(path, {pre, header, std::string_view(static_cast<const char*>(tensor.raw()), tensor.bytes())});
}

} // namespace ts
