#include "data/idx.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>

namespace ts {

namespace {

const char* const kMissingHint =
    "install the Debian package dataset-fashion-mnist (files in /usr/share/datasets/fashion-mnist) "
    "or pass --data DIR with the IDX files";

std::string hexBytes(const unsigned char* p, std::size_t n)
{
    std::string s;
    char buf[4];
    for (std::size_t i = 0; i < n; ++i) {
        std::snprintf(buf, sizeof buf, "%s%02x", i ? " " : "", p[i]);
        s += buf;
    }
    return s;
}

const char* idxTypeName(unsigned char t)
{
    switch (t) {
    case 0x08: return "unsigned byte";
    case 0x09: return "signed byte";
    case 0x0B: return "int16";
    case 0x0C: return "int32";
    case 0x0D: return "float32";
    case 0x0E: return "float64";
    }
    return "unknown";
}

// Owns a gzFile so every early return closes it.
struct GzCloser {
    gzFile f;
    ~GzCloser()
    {
        if (f) gzclose(f);
    }
};

// Reads up to n bytes; returns the count read, or -1 on a zlib/stream error (message in err).
int64_t gzReadFully(gzFile f, void* dst, std::size_t n, std::string& err)
{
    // gzread takes an unsigned int length: read in chunks well below that limit.
    constexpr std::size_t kChunk = std::size_t(1) << 30;
    auto* p = static_cast<unsigned char*>(dst);
    std::size_t done = 0;
    while (done < n) {
        const unsigned want = static_cast<unsigned>(std::min(kChunk, n - done));
        const int got = gzread(f, p + done, want);
        if (got < 0) {
            int code = 0;
            const char* msg = gzerror(f, &code);
            err = code == Z_ERRNO ? std::strerror(errno) : (msg ? msg : "zlib error");
            return -1;
        }
        if (got == 0) {
            // A truncated gzip stream ends with Z_BUF_ERROR ("unexpected end of file").
            int code = 0;
            const char* msg = gzerror(f, &code);
            if (code != Z_OK && msg) err = msg;
            break;
        }
        done += static_cast<std::size_t>(got);
    }
    return static_cast<int64_t>(done);
}

} // namespace

Result<IdxArray> readIdx(const std::string& path)
{
    std::error_code ec;
    const auto st = std::filesystem::status(path, ec);
    if (!std::filesystem::exists(st))
        return makeError(ErrorCode::NotFound, "IDX file '" + path + "' does not exist", kMissingHint);
    if (!std::filesystem::is_regular_file(st))
        return makeError(ErrorCode::IoError, "IDX path '" + path + "' is not a regular file");

    GzCloser gz{gzopen(path.c_str(), "rb")};
    if (!gz.f)
        return makeError(ErrorCode::IoError,
                         "cannot open IDX file '" + path + "': " + std::strerror(errno),
                         "check the file's permissions");
    gzbuffer(gz.f, 256 * 1024);

    std::string zerr;
    unsigned char magic[4] = {};
    const int64_t gotMagic = gzReadFully(gz.f, magic, 4, zerr);
    if (gotMagic < 0)
        return makeError(ErrorCode::IoError, "cannot read IDX file '" + path + "': " + zerr,
                         "the file is not a valid gzip stream; download it again");
    if (gotMagic < 4)
        return makeError(ErrorCode::IoError,
                         "IDX file '" + path + "' is truncated: expected a 4-byte magic number, found " +
                             std::to_string(gotMagic) + " bytes");
    if (magic[0] != 0 || magic[1] != 0)
        return makeError(ErrorCode::ParseError,
                         "'" + path + "' is not an IDX file: wrong magic number, found bytes " +
                             hexBytes(magic, 4) + ", expected 00 00 08 <rank>",
                         "pass the images-idx3-ubyte / labels-idx1-ubyte files (optionally .gz)");
    if (magic[2] != 0x08)
        return makeError(ErrorCode::ParseError,
                         "IDX file '" + path + "' holds " + idxTypeName(magic[2]) + " elements (type byte " +
                             hexBytes(&magic[2], 1) + "); only unsigned-byte data (type 08) is supported");
    if (magic[3] == 0)
        return makeError(ErrorCode::ParseError,
                         "IDX file '" + path + "' declares rank 0 (magic bytes " + hexBytes(magic, 4) +
                             "); a dataset needs at least one dimension");

    const int rank = magic[3];
    std::vector<unsigned char> dimBytes(static_cast<std::size_t>(rank) * 4);
    const int64_t gotDims = gzReadFully(gz.f, dimBytes.data(), dimBytes.size(), zerr);
    if (gotDims < 0)
        return makeError(ErrorCode::IoError, "cannot read IDX file '" + path + "': " + zerr);
    if (gotDims < static_cast<int64_t>(dimBytes.size()))
        return makeError(ErrorCode::IoError,
                         "IDX file '" + path + "' is truncated: expected " + std::to_string(dimBytes.size()) +
                             " bytes of dimensions for rank " + std::to_string(rank) + ", found " +
                             std::to_string(gotDims));

    IdxArray out;
    out.dims.reserve(static_cast<std::size_t>(rank));
    int64_t total = 1;
    for (int i = 0; i < rank; ++i) {
        const unsigned char* b = &dimBytes[static_cast<std::size_t>(i) * 4];
        const int64_t d = (int64_t(b[0]) << 24) | (int64_t(b[1]) << 16) | (int64_t(b[2]) << 8) | int64_t(b[3]);
        out.dims.push_back(d);
        // Cap at 2^48 bytes: far beyond any real dataset, and keeps size_t/int64 math safe.
        constexpr int64_t kMaxElements = int64_t(1) << 48;
        if (d != 0 && total > kMaxElements / d) {
            std::string dims;
            for (int k = 0; k < rank; ++k) {
                const unsigned char* q = &dimBytes[static_cast<std::size_t>(k) * 4];
                dims += (k ? " x " : "") + std::to_string((uint32_t(q[0]) << 24) | (uint32_t(q[1]) << 16) |
                                                          (uint32_t(q[2]) << 8) | uint32_t(q[3]));
            }
            return makeError(ErrorCode::ParseError,
                             "IDX file '" + path + "' has dimensions " + dims +
                                 " whose product overflows (more than 2^48 elements)",
                             "the header is corrupt; download the file again");
        }
        total *= d;
    }

    // Grown as the data arrives, not sized from the header: a corrupt header that claims
    // terabytes then fails as truncated after reading what is there, instead of allocating it.
    int64_t got = 0;
    try {
        constexpr int64_t kChunk = int64_t(64) << 20;
        while (got < total) {
            const int64_t n = std::min(kChunk, total - got);
            out.data.resize(static_cast<std::size_t>(got + n));
            const int64_t r = gzReadFully(gz.f, out.data.data() + got, static_cast<std::size_t>(n), zerr);
            if (r < 0)
                return makeError(ErrorCode::IoError, "cannot read the data of IDX file '" + path + "': " + zerr,
                                 "the file is corrupt; download it again");
            got += r;
            if (r < n) break;
        }
    } catch (const std::bad_alloc&) {
        return makeError(ErrorCode::OutOfMemory,
                         "IDX file '" + path + "' holds " + std::to_string(total) + " values, more than this machine's memory",
                         "use a smaller dataset, or a machine with more memory");
    }
    out.data.resize(static_cast<std::size_t>(got));
    if (got < total)
        return makeError(ErrorCode::IoError,
                         "IDX file '" + path + "' is truncated: expected " + std::to_string(total) +
                             " bytes of data, found " + std::to_string(got) + (zerr.empty() ? "" : " (" + zerr + ")"),
                         "the file is incomplete; download it again");

    // Extra bytes mean the header's dimensions do not describe the file: refuse rather than guess.
    unsigned char extra[4096];
    const int64_t trailing = gzReadFully(gz.f, extra, sizeof extra, zerr);
    if (trailing < 0)
        return makeError(ErrorCode::IoError, "cannot read IDX file '" + path + "' to its end: " + zerr);
    if (trailing > 0)
        return makeError(ErrorCode::ParseError,
                         "IDX file '" + path + "' has " + (trailing == int64_t(sizeof extra) ? "at least " : "") +
                             std::to_string(trailing) + " bytes after the " + std::to_string(total) +
                             " data bytes its dimensions describe",
                         "the header does not match the data; the file is corrupt");
    return out;
}

} // namespace ts
