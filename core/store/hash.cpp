#include "store/hash.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

namespace ts::store {

namespace {

std::string hex64(uint64_t v)
{
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
    return buf;
}

} // namespace

uint64_t fnv1a64(std::string_view data, uint64_t h)
{
    for (unsigned char c : data) {
        h ^= c;
        h *= 0x100000001b3ull;
    }
    return h;
}

std::string configHash(const nlohmann::json& config)
{
    return "fnv1a64:" + hex64(fnv1a64(config.dump()));
}

Result<std::string> fileChecksum(const std::string& path)
{
    struct Closer {
        void operator()(std::FILE* f) const { std::fclose(f); }
    };
    std::unique_ptr<std::FILE, Closer> f(std::fopen(path.c_str(), "rb"));
    if (!f) {
        const int err = errno;
        return makeError(err == ENOENT ? ErrorCode::NotFound : ErrorCode::IoError,
                         "cannot read '" + path + "': " + std::strerror(err));
    }
    std::vector<char> buf(1 << 16);
    uint64_t h = 0xcbf29ce484222325ull;
    while (true) {
        const std::size_t n = std::fread(buf.data(), 1, buf.size(), f.get());
        h = fnv1a64(std::string_view(buf.data(), n), h);
        if (n < buf.size()) {
            if (std::ferror(f.get())) return makeError(ErrorCode::IoError, "error reading '" + path + "'");
            break;
        }
    }
    return "fnv1a64:" + hex64(h);
}

} // namespace ts::store
