#pragma once
// Outputs the CLI writes (weights, traces, CSV exports) must never land on what a run reads or
// the store keeps: writing a CSV over the run database, or weights over the model file, would
// destroy them. Checked before any work, with the file named.

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include "common/paths.h"
#include "common/result.h"

namespace tscli {

struct Protected {
    std::string what;  // "the run database", "the model file"
    std::string path;  // a file (its SQLite -wal/-shm companions are covered for a database)
};

// Whether two paths name one file, whether it exists yet or not ("-" is standard output): the
// same inode when both exist (hard links, bind mounts), else the same resolved path (a -wal
// file SQLite has not made yet is still the database's).
inline bool samePath(const std::string& a, const std::string& b)
{
    namespace fs = std::filesystem;
    if (a.empty() || b.empty() || a == "-" || b == "-") return false;
    std::error_code ec;
    if (fs::exists(a, ec) && fs::exists(b, ec)) return fs::equivalent(a, b, ec);
    return fs::weakly_canonical(fs::absolute(a, ec), ec) == fs::weakly_canonical(fs::absolute(b, ec), ec);
}

// `flag` names the option in messages ("--save-weights"). "-" (standard output) and paths that
// do not exist yet are fine unless they lie inside one of `dirs` (folders the store owns).
inline ts::Status checkOutputPath(const std::string& out, const std::string& flag, const std::vector<Protected>& files,
                                  const std::vector<Protected>& dirs = {})
{
    namespace fs = std::filesystem;
    if (out.empty() || out == "-") return ts::okStatus();
    std::error_code ec;
    if (fs::is_directory(out, ec))
        return ts::makeError(ts::ErrorCode::InvalidArgument, flag + " " + out + " is a folder", "name a file (inside it, if you like)");
    for (const Protected& p : files) {
        if (p.path.empty()) continue;
        for (const std::string& suffix : {std::string(), std::string("-wal"), std::string("-shm")}) {
            const std::string candidate = p.path + suffix;
            if (samePath(out, candidate))
                return ts::makeError(ts::ErrorCode::InvalidArgument, flag + " " + out + " is " + p.what + (suffix.empty() ? "" : " (" + suffix.substr(1) + " file)") +
                                         ": writing there would destroy it",
                                     "choose another file name");
        }
    }
    for (const Protected& d : dirs) {
        if (!d.path.empty() && ts::pathIsInside(out, d.path))
            return ts::makeError(ts::ErrorCode::InvalidArgument, flag + " " + out + " lies in " + d.what + " (" + d.path + ")",
                                 "the store keeps its checkpoints there; write somewhere else");
    }
    // Written at the end of a run: a folder that is missing or not writable would lose the result
    // after all the work, so it is tried now (a file made and removed at once).
    const fs::path target = fs::weakly_canonical(fs::absolute(out, ec), ec);
    const fs::path parent = target.has_parent_path() ? target.parent_path() : fs::current_path(ec);
    if (!fs::exists(parent, ec))
        return ts::makeError(ts::ErrorCode::InvalidArgument, flag + " " + out + ": the folder " + parent.string() + " does not exist",
                             "create it first (mkdir -p " + parent.string() + ") or choose another path");
    if (!fs::is_directory(parent, ec))
        return ts::makeError(ts::ErrorCode::InvalidArgument, flag + " " + out + ": " + parent.string() + " is not a folder",
                             "choose a path inside a folder");
    const fs::path probe = parent / (".trainstudio-probe-" + std::to_string(::getpid()));
    const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return ts::makeError(ts::ErrorCode::InvalidArgument, flag + " " + out + ": cannot write in " + parent.string() + ": " + std::strerror(errno),
                             "choose a folder this user can write");
    ::close(fd);
    ::unlink(probe.c_str());
    return ts::okStatus();
}

} // namespace tscli
