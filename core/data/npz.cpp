#include "data/npz.h"

#include <sys/mman.h>
#include <unistd.h>
#include <zip.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "common/paths.h"
#include "io/npy.h"

namespace ts {

namespace {

struct ZipCloser {
    zip_t* z = nullptr;
    ~ZipCloser()
    {
        if (z) zip_discard(z);  // read-only: nothing to write back
    }
};

struct FdCloser {
    int fd = -1;
    ~FdCloser()
    {
        if (fd >= 0) ::close(fd);
    }
};

Result<zip_t*> openArchive(const std::string& path, int flags)
{
    std::error_code ec;
    if ((flags & ZIP_CREATE) == 0 && !std::filesystem::exists(path, ec))
        return makeError(ErrorCode::NotFound, ".npz file '" + path + "' does not exist", missingFileHint(path));
    int err = 0;
    zip_t* z = zip_open(path.c_str(), flags, &err);
    if (!z) {
        zip_error_t ze;
        zip_error_init_with_code(&ze, err);
        std::string msg = zip_error_strerror(&ze);
        zip_error_fini(&ze);
        return makeError(err == ZIP_ER_NOENT ? ErrorCode::NotFound : ErrorCode::ParseError,
                         "'" + path + "' is not a readable .npz (zip) archive: " + msg,
                         "write it with numpy.savez or numpy.savez_compressed");
    }
    return z;
}

std::string arrayName(const std::string& member)
{
    const std::string suffix = ".npy";
    if (member.size() > suffix.size() && member.compare(member.size() - suffix.size(), suffix.size(), suffix) == 0)
        return member.substr(0, member.size() - suffix.size());
    return member;
}

void replaceAll(std::string& s, const std::string& from, const std::string& to)
{
    if (from.empty()) return;
    for (std::size_t pos = 0; (pos = s.find(from, pos)) != std::string::npos; pos += to.size()) s.replace(pos, from.size(), to);
}

// Extracts one member into an anonymous memory file and parses it with readNpy, so .npz members
// get exactly the checks (and messages) of .npy files; the messages then name archive[member].
Result<Tensor> readMember(zip_t* z, zip_uint64_t index, const std::string& path, const std::string& member)
{
    const std::string label = path + "[" + member + "]";
    zip_stat_t st;
    zip_stat_init(&st);
    if (zip_stat_index(z, index, 0, &st) != 0)
        return makeError(ErrorCode::ParseError, "cannot read the directory entry of " + label + ": " + zip_strerror(z));
    zip_file_t* zf = zip_fopen_index(z, index, 0);
    if (!zf)
        return makeError(ErrorCode::ParseError, "cannot open " + label + ": " + zip_strerror(z),
                         "the archive is corrupt or uses an unsupported compression method");
    FdCloser fd{static_cast<int>(::memfd_create("ts-npz-member", MFD_CLOEXEC))};
    if (fd.fd < 0) {
        zip_fclose(zf);
        return makeError(ErrorCode::IoError, "cannot create a memory file for " + label + ": " + std::strerror(errno));
    }
    std::vector<char> buf(1 << 20);
    uint64_t total = 0;
    for (;;) {
        const zip_int64_t n = zip_fread(zf, buf.data(), buf.size());
        if (n < 0) {
            std::string msg = zip_file_strerror(zf);
            zip_fclose(zf);
            return makeError(ErrorCode::IoError, "cannot read " + label + " at byte " + std::to_string(total) + ": " + msg,
                             "the archive is truncated or corrupt; write it again");
        }
        if (n == 0) break;
        const char* p = buf.data();
        for (zip_int64_t left = n; left > 0;) {
            const ssize_t w = ::write(fd.fd, p, static_cast<std::size_t>(left));
            if (w < 0) {
                zip_fclose(zf);
                return makeError(ErrorCode::IoError, "cannot buffer " + label + ": " + std::strerror(errno));
            }
            p += w;
            left -= w;
        }
        total += static_cast<uint64_t>(n);
    }
    zip_fclose(zf);
    if ((st.valid & ZIP_STAT_SIZE) && total != st.size)
        return makeError(ErrorCode::IoError, label + " is truncated: its directory entry says " + std::to_string(st.size) +
                                                 " bytes, " + std::to_string(total) + " could be read");
    const std::string fdPath = "/proc/self/fd/" + std::to_string(fd.fd);
    auto t = readNpy(fdPath);
    if (!t.ok()) {
        Error e = t.takeError();
        replaceAll(e.message, fdPath, label);
        replaceAll(e.hint, fdPath, label);
        return e;
    }
    return std::move(t).value();
}

} // namespace

Result<std::vector<std::string>> listNpz(const std::string& path)
{
    TS_ASSIGN(zip_t* raw, openArchive(path, ZIP_RDONLY | ZIP_CHECKCONS));
    ZipCloser z{raw};
    std::vector<std::string> names;
    const zip_int64_t n = zip_get_num_entries(z.z, 0);
    for (zip_int64_t i = 0; i < n; ++i) {
        const char* name = zip_get_name(z.z, static_cast<zip_uint64_t>(i), 0);
        if (name) names.push_back(arrayName(name));
    }
    return names;
}

Result<std::map<std::string, Tensor>> readNpz(const std::string& path, const std::vector<std::string>& names)
{
    TS_ASSIGN(zip_t* raw, openArchive(path, ZIP_RDONLY | ZIP_CHECKCONS));
    ZipCloser z{raw};
    const zip_int64_t n = zip_get_num_entries(z.z, 0);
    std::map<std::string, zip_uint64_t> members;  // array name -> index
    std::map<std::string, std::string> memberName;
    std::string present;
    for (zip_int64_t i = 0; i < n; ++i) {
        const char* name = zip_get_name(z.z, static_cast<zip_uint64_t>(i), 0);
        if (!name) continue;
        const std::string a = arrayName(name);
        members[a] = static_cast<zip_uint64_t>(i);
        memberName[a] = name;
        present += (present.empty() ? "" : ", ") + a;
    }
    std::map<std::string, Tensor> out;
    std::vector<std::string> wanted = names;
    if (wanted.empty())
        for (const auto& [a, _] : members) wanted.push_back(a);
    for (const auto& a : wanted) {
        const auto it = members.find(a);
        if (it == members.end())
            return makeError(ErrorCode::NotFound, ".npz file '" + path + "' has no array '" + a + "'",
                             present.empty() ? std::string("the archive is empty") : "arrays present: " + present);
        TS_ASSIGN(Tensor t, readMember(z.z, it->second, path, memberName[a]));
        out[a] = std::move(t);
    }
    return out;
}

Status writeNpz(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& arrays)
{
    namespace fs = std::filesystem;
    // writeNpy writes each array to a temporary file; zip_close() then stores them (uncompressed,
    // as numpy.savez does) before the files are removed.
    const fs::path tmpDir = fs::path(path).parent_path().empty() ? fs::current_path() : fs::path(path).parent_path();
    std::vector<std::string> tmpFiles;
    auto cleanup = [&] {
        std::error_code ec;
        for (const auto& f : tmpFiles) fs::remove(f, ec);
    };
    for (std::size_t i = 0; i < arrays.size(); ++i) {
        const std::string tmp = (tmpDir / (".ts-npz-" + std::to_string(::getpid()) + "-" + std::to_string(i) + ".npy")).string();
        Status st = writeNpy(tmp, arrays[i].second);
        tmpFiles.push_back(tmp);
        if (!st.ok()) {
            cleanup();
            return st;
        }
    }
    auto opened = openArchive(path, ZIP_CREATE | ZIP_TRUNCATE);
    if (!opened.ok()) {
        cleanup();
        return opened.takeError();
    }
    zip_t* z = opened.value();
    for (std::size_t i = 0; i < arrays.size(); ++i) {
        zip_source_t* src = zip_source_file(z, tmpFiles[i].c_str(), 0, -1);
        const std::string member = arrays[i].first + ".npy";
        if (!src || zip_file_add(z, member.c_str(), src, ZIP_FL_OVERWRITE) < 0) {
            if (src) zip_source_free(src);
            std::string msg = zip_strerror(z);
            zip_discard(z);
            cleanup();
            return makeError(ErrorCode::IoError, "cannot add " + member + " to '" + path + "': " + msg);
        }
        zip_set_file_compression(z, static_cast<zip_uint64_t>(i), ZIP_CM_STORE, 0);
    }
    if (zip_close(z) != 0) {
        std::string msg = zip_strerror(z);
        zip_discard(z);
        cleanup();
        return makeError(ErrorCode::IoError, "cannot write '" + path + "': " + msg);
    }
    cleanup();
    return okStatus();
}

} // namespace ts
