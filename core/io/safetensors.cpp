#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include <nlohmann/json.hpp>

#include "common/paths.h"

namespace ts {

namespace {

// The reference implementation refuses headers above 100 MB; so do we (a corrupt length must
// not make us allocate gigabytes).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

const char* safetensorsDtypeName(DType t)
{
    switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::I32: return "I32";
    case DType::U8: return "U8";
    }
    return "?";
}

bool parseSafetensorsDtype(const std::string& s, DType& out)
{
    for (DType t : {DType::F32, DType::F16, DType::BF16, DType::I32, DType::U8})
        if (s == safetensorsDtypeName(t)) {
            out = t;
            return true;
        }
    return false;
}

struct FileCloser {
    void operator()(std::FILE* f) const
    {
        if (f) std::fclose(f);
    }
};
using FilePtr = std::unique_ptr<std::FILE, FileCloser>;

Status writeAll(int fd, const char* p, std::size_t n, const std::string& tmp)
{
    while (n > 0) {
        const ssize_t w = ::write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return makeError(ErrorCode::IoError, "cannot write '" + tmp + "': " + std::strerror(errno),
                             errno == ENOSPC ? "the disk is full" : "");
        }
        p += w;
        n -= static_cast<std::size_t>(w);
    }
    return okStatus();
}

} // namespace

Status writeFileAtomically(const std::string& path, const std::vector<std::string_view>& parts)
{
    namespace fs = std::filesystem;
    const fs::path target(path);
    const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
    std::string tmpName = ".";
    tmpName += target.filename().string();
    tmpName += ".tmp.XXXXXX";
    std::string tmp = (dir / tmpName).string();
    const int fd = ::mkstemp(tmp.data());
    if (fd < 0)
        return makeError(ErrorCode::IoError,
                         "cannot create a temporary file in '" + dir.string() + "' to write '" + path +
                             "': " + std::strerror(errno),
                         errno == ENOENT ? "create the folder first" : "check the folder's permissions");
    // mkstemp creates 0600; a weights file is an ordinary document.
    ::fchmod(fd, 0644);

    auto fail = [&](Error e) -> Status {
        ::close(fd);
        ::unlink(tmp.c_str());
        return e;
    };
    for (std::string_view part : parts) {
        Status s = writeAll(fd, part.data(), part.size(), tmp);
        if (!s.ok()) return fail(s.takeError());
    }
    if (::fsync(fd) != 0)
        return fail(makeError(ErrorCode::IoError, "cannot flush '" + tmp + "' to disk: " + std::strerror(errno)));
    if (::close(fd) != 0) {
        const int err = errno;
        ::unlink(tmp.c_str());
        return makeError(ErrorCode::IoError, "cannot close '" + tmp + "': " + std::strerror(err));
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
        const int err = errno;
        ::unlink(tmp.c_str());
        return makeError(ErrorCode::IoError,
                         "cannot rename '" + tmp + "' to '" + path + "': " + std::strerror(err),
                         err == EISDIR ? "the target is a folder; choose a file name" : "");
    }
    // Make the rename itself durable.
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
        ::fsync(dfd);
        ::close(dfd);
    }
    return okStatus();
}

namespace {

// A safetensors file's bytes as views: the length and header held here, the tensors' data where
// it lies (no copy). `path` names the destination in errors.
struct Encoded {
    char len[8];
    std::string text;
    std::vector<std::string_view> parts;
};

Status encodeParts(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                   const std::map<std::string, std::string>& metadata, Encoded& out)
{
    nlohmann::ordered_json header = nlohmann::ordered_json::object();
    if (!metadata.empty()) {
        nlohmann::ordered_json meta = nlohmann::ordered_json::object();
        for (const auto& [k, v] : metadata) meta[k] = v;
        header["__metadata__"] = std::move(meta);
    }
    // The header lists tensors in the caller's order; the data is laid out widest dtype first
    // (stable), like the reference writer, so every tensor starts aligned to its element size
    // for readers that map the file and use the bytes in place.
    std::vector<std::size_t> layout(tensors.size());
    for (std::size_t i = 0; i < layout.size(); ++i) layout[i] = i;
    std::stable_sort(layout.begin(), layout.end(), [&](std::size_t a, std::size_t b) {
        return dtypeSize(tensors[a].second.dtype()) > dtypeSize(tensors[b].second.dtype());
    });
    std::vector<uint64_t> offsets(tensors.size());
    uint64_t offset = 0;
    for (std::size_t i : layout) {
        offsets[i] = offset;
        offset += tensors[i].second.bytes();
    }

    for (std::size_t i = 0; i < tensors.size(); ++i) {
        const auto& [name, t] = tensors[i];
        const std::string where = "tensor '" + name + "' for '" + path + "'";
        if (name.empty())
            return makeError(ErrorCode::InvalidArgument, "a tensor for '" + path + "' has an empty name");
        if (name == "__metadata__")
            return makeError(ErrorCode::InvalidArgument,
                             "'__metadata__' is reserved in safetensors and cannot name a tensor (writing '" +
                                 path + "')");
        if (header.contains(name))
            return makeError(ErrorCode::InvalidArgument, "tensor name '" + name + "' appears twice (writing '" +
                                                             path + "')");
        if (!t.defined()) return makeError(ErrorCode::InvalidArgument, where + " is undefined");
        if (!t.hostAccessible())
            return makeError(ErrorCode::InvalidArgument, where + " lives on " + t.device().toString(),
                             "copy it to the host before saving");
        nlohmann::ordered_json entry;
        entry["dtype"] = safetensorsDtypeName(t.dtype());
        entry["shape"] = t.shape().dims();
        entry["data_offsets"] = {offsets[i], offsets[i] + t.bytes()};
        header[name] = std::move(entry);
    }

    std::string& text = out.text;
    try {
        text = header.dump();
    } catch (const nlohmann::json::exception& e) {
        // Only invalid UTF-8 in a name or a metadata string gets here.
        return makeError(ErrorCode::InvalidArgument,
                         "cannot encode the safetensors header for '" + path + "': " + e.what(),
                         "tensor names and metadata must be valid UTF-8");
    }
    text.append((8 - text.size() % 8) % 8, ' ');
    char* len = out.len;
    uint64_t n = text.size();
    for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((n >> (8 * i)) & 0xFF);

    std::vector<std::string_view>& parts = out.parts;
    parts.reserve(tensors.size() + 2);
    parts.emplace_back(len, 8);
    parts.emplace_back(text);
    for (std::size_t i : layout) {
        const Tensor& t = tensors[i].second;
        parts.emplace_back(static_cast<const char*>(t.raw()), t.bytes());
    }
    return okStatus();
}

} // namespace

Status writeSafetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                        const std::map<std::string, std::string>& metadata)
{
    Encoded e;
    TS_TRY(encodeParts(path, tensors, metadata, e));
    return writeFileAtomically(path, e.parts);
}

Result<std::string> encodeSafetensors(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                      const std::map<std::string, std::string>& metadata, const std::string& label)
{
    Encoded e;
    TS_TRY(encodeParts(label, tensors, metadata, e));
    std::size_t total = 0;
    for (const auto& p : e.parts) total += p.size();
    std::string bytes;
    bytes.reserve(total);
    for (const auto& p : e.parts) bytes.append(p);
    return bytes;
}

namespace {

struct Span {
    uint64_t begin, end;
    std::string name;
};
struct Layout {
    SafetensorsFile file;     // tensors allocated, not yet filled
    std::vector<Span> spans;  // by offset, contiguous, covering the data buffer
};

// Validates the JSON header `text` against a data buffer of `bufferSize` bytes.
Result<Layout> parseLayout(const std::string& text, uint64_t bufferSize, const std::string& path)
{
    Layout layout;
    nlohmann::ordered_json header;
    try {
        header = nlohmann::ordered_json::parse(text);
    } catch (const nlohmann::json::exception& e) {
        return makeError(ErrorCode::ParseError,
                         "safetensors file '" + path + "' has a malformed JSON header: " + e.what());
    }
    if (!header.is_object())
        return makeError(ErrorCode::ParseError,
                         "safetensors file '" + path + "': the header is JSON but not an object");

    SafetensorsFile& out = layout.file;
    std::vector<Span>& spans = layout.spans;

    for (const auto& [name, v] : header.items()) {
        if (name == "__metadata__") {
            if (!v.is_object())
                return makeError(ErrorCode::ParseError,
                                 "safetensors file '" + path + "': \"__metadata__\" must be an object of strings");
            for (const auto& [k, s] : v.items()) {
                if (!s.is_string())
                    return makeError(ErrorCode::ParseError, "safetensors file '" + path + "': metadata entry '" + k +
                                                                "' is not a string");
                out.metadata[k] = s.get<std::string>();
            }
            continue;
        }
        const std::string where = "tensor '" + name + "' in safetensors file '" + path + "'";
        if (!v.is_object())
            return makeError(ErrorCode::ParseError, where + ": its header entry is not an object");
        const auto dt = v.find("dtype");
        const auto sh = v.find("shape");
        const auto off = v.find("data_offsets");
        if (dt == v.end() || sh == v.end() || off == v.end())
            return makeError(ErrorCode::ParseError, where + ": the header entry needs dtype, shape and data_offsets");
        if (!dt->is_string()) return makeError(ErrorCode::ParseError, where + ": dtype is not a string");
        DType dtype;
        if (!parseSafetensorsDtype(dt->get<std::string>(), dtype))
            return makeError(ErrorCode::Unsupported,
                             where + " has dtype " + dt->get<std::string>() + "; supported: F32, F16, BF16, I32, U8",
                             "convert the tensor before saving (e.g. .float() or .int() in PyTorch)");
        if (!sh->is_array()) return makeError(ErrorCode::ParseError, where + ": shape is not an array");
        std::vector<int64_t> dims;
        uint64_t numel = 1;
        for (const auto& d : *sh) {
            if (!d.is_number_unsigned())
                return makeError(ErrorCode::ParseError,
                                 where + ": shape " + sh->dump() + " holds something other than non-negative integers");
            const uint64_t dv = d.get<uint64_t>();
            if (dv > (uint64_t(1) << 48) || (dv != 0 && numel > (uint64_t(1) << 48) / dv))
                return makeError(ErrorCode::ParseError, where + ": shape " + sh->dump() + " is impossibly large");
            numel *= dv;
            dims.push_back(static_cast<int64_t>(dv));
        }
        if (!off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
            !(*off)[1].is_number_unsigned())
            return makeError(ErrorCode::ParseError,
                             where + ": data_offsets " + off->dump() + " is not a pair of non-negative integers");
        const uint64_t begin = (*off)[0].get<uint64_t>();
        const uint64_t end = (*off)[1].get<uint64_t>();
        if (begin > end || end > bufferSize)
            return makeError(ErrorCode::ParseError,
                             where + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                                 "] lie outside the " + std::to_string(bufferSize) + "-byte data buffer",
                             "the file is truncated or its header is corrupt");
        const uint64_t expected = numel * dtypeSize(dtype);
        if (end - begin != expected)
            return makeError(ErrorCode::ParseError,
                             where + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                                 "] span " + std::to_string(end - begin) + " bytes but " + dt->get<std::string>() +
                                 " " + Shape(dims).toString() + " needs " + std::to_string(expected));
        TS_ASSIGN(Tensor t, Tensor::create(Shape(std::move(dims)), dtype));
        out.tensors.emplace(name, std::move(t));
        out.order.push_back(name);
        spans.push_back({begin, end, name});
    }

    std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
        return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    uint64_t pos = 0;
    const Span* prev = nullptr;
    for (const Span& s : spans) {
        if (s.begin < pos)
            return makeError(ErrorCode::ParseError,
                             "tensor '" + s.name + "' in safetensors file '" + path + "' overlaps tensor '" +
                                 prev->name + "' (bytes " + std::to_string(s.begin) + " < " + std::to_string(pos) + ")");
        if (s.begin > pos)
            return makeError(ErrorCode::ParseError,
                             "safetensors file '" + path + "' has " + std::to_string(s.begin - pos) +
                                 " unused bytes before tensor '" + s.name + "' (offset " + std::to_string(pos) + ")");
        pos = s.end;
        prev = &s;
    }
    if (pos != bufferSize)
        return makeError(ErrorCode::ParseError,
                         "safetensors file '" + path + "' has " + std::to_string(bufferSize - pos) +
                             " bytes after the last tensor's data that no tensor covers");

    return layout;
}

// The 8-byte little-endian header length at the start of a file.
uint64_t headerLength(const unsigned char* len)
{
    uint64_t headerLen = 0;
    for (int i = 7; i >= 0; --i) headerLen = (headerLen << 8) | len[i];
    return headerLen;
}

} // namespace

Result<SafetensorsFile> readSafetensors(const std::string& path)
{
    namespace fs = std::filesystem;
    std::error_code ec;
    const auto st = fs::status(path, ec);
    if (!fs::exists(st)) return makeError(ErrorCode::NotFound, "safetensors file '" + path + "' does not exist", missingFileHint(path));
    if (!fs::is_regular_file(st))
        return makeError(ErrorCode::IoError, "safetensors path '" + path + "' is not a regular file");
    const uint64_t fileSize = fs::file_size(path, ec);
    if (ec) return makeError(ErrorCode::IoError, "cannot stat '" + path + "': " + ec.message());

    FilePtr f(std::fopen(path.c_str(), "rb"));
    if (!f) return makeError(ErrorCode::IoError, "cannot open '" + path + "': " + std::strerror(errno));

    if (fileSize < 8)
        return makeError(ErrorCode::ParseError,
                         "safetensors file '" + path + "' is " + std::to_string(fileSize) +
                             " bytes, too short for the 8-byte header length",
                         "the file is truncated or not a safetensors file");
    unsigned char len[8];
    if (std::fread(len, 1, 8, f.get()) != 8)
        return makeError(ErrorCode::IoError, "cannot read the header length of '" + path + "'");
    const uint64_t headerLen = headerLength(len);
    if (headerLen > fileSize - 8)
        return makeError(ErrorCode::ParseError,
                         "safetensors file '" + path + "' declares a " + std::to_string(headerLen) +
                             "-byte header but only " + std::to_string(fileSize - 8) + " bytes follow the length",
                         "the file is truncated or not a safetensors file");
    if (headerLen > kMaxHeaderBytes)
        return makeError(ErrorCode::ParseError, "safetensors file '" + path + "' declares a " +
                                                    std::to_string(headerLen) + "-byte header (limit 100 MB)",
                         "the file is damaged or not a safetensors file");
    std::string text(static_cast<std::size_t>(headerLen), '\0');
    if (std::fread(text.data(), 1, text.size(), f.get()) != text.size())
        return makeError(ErrorCode::IoError, "cannot read the header of '" + path + "'");

    TS_ASSIGN(Layout layout, parseLayout(text, fileSize - 8 - headerLen, path));
    SafetensorsFile& out = layout.file;
    // Offsets are contiguous now, so one sequential pass reads everything.
    for (const Span& s : layout.spans) {
        Tensor& t = out.tensors.at(s.name);
        const std::size_t n = static_cast<std::size_t>(s.end - s.begin);
        if (n > 0 && std::fread(t.raw(), 1, n, f.get()) != n)
            return makeError(ErrorCode::IoError, "cannot read tensor '" + s.name + "' from safetensors file '" + path +
                                                     "'" + (std::ferror(f.get()) ? ": " + std::string(std::strerror(errno)) : ""));
    }
    return std::move(layout.file);
}

Result<SafetensorsFile> decodeSafetensors(std::string_view bytes, const std::string& label)
{
    if (bytes.size() < 8)
        return makeError(ErrorCode::ParseError, "safetensors file '" + label + "' is " + std::to_string(bytes.size()) +
                                                    " bytes, too short for the 8-byte header length",
                         "the file is truncated or not a safetensors file");
    const uint64_t headerLen = headerLength(reinterpret_cast<const unsigned char*>(bytes.data()));
    if (headerLen > bytes.size() - 8 || headerLen > kMaxHeaderBytes)
        return makeError(ErrorCode::ParseError, "safetensors file '" + label + "' declares a " + std::to_string(headerLen) +
                                                    "-byte header but " + std::to_string(bytes.size() - 8) + " bytes follow the length",
                         "the bytes are truncated or not a safetensors file");
    const std::string text(bytes.substr(8, static_cast<std::size_t>(headerLen)));
    const std::string_view data = bytes.substr(8 + static_cast<std::size_t>(headerLen));
    TS_ASSIGN(Layout layout, parseLayout(text, data.size(), label));
    for (const Span& s : layout.spans)
        if (s.end > s.begin) std::memcpy(layout.file.tensors.at(s.name).raw(), data.data() + s.begin, static_cast<std::size_t>(s.end - s.begin));
    return std::move(layout.file);
}

} // namespace ts
