#include "common/paths.h"

#include <cstdlib>
#include <filesystem>

namespace ts {

std::string userDataDir()
{
    namespace fs = std::filesystem;
    const char* xdg = std::getenv("XDG_DATA_HOME");
    fs::path base;
    if (xdg && *xdg && fs::path(xdg).is_absolute()) {
        base = xdg;
    } else {
        const char* home = std::getenv("HOME");
        base = fs::path(home && *home ? home : ".") / ".local" / "share";
    }
    return (base / "trainstudio").string();
}

bool pathIsInside(const std::string& path, const std::string& folder)
{
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::path root = fs::weakly_canonical(fs::absolute(folder, ec), ec);
    if (ec || root.empty()) return false;
    const fs::path p = fs::weakly_canonical(fs::absolute(path, ec), ec);
    if (ec) return false;
    const fs::path rel = p.lexically_relative(root);
    return !rel.empty() && *rel.begin() != "..";
}

std::string missingFileHint(const std::string& path)
{
    std::error_code ec;
    const std::filesystem::path p(path);
    if (p.is_absolute()) return "check the path";
    const std::filesystem::path cwd = std::filesystem::current_path(ec);
    if (ec) return "check the path (a relative path is read from the current folder)";
    return "check the path: a relative path is read from the current folder, " + cwd.string();
}

} // namespace ts
