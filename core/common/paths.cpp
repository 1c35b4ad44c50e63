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

} // namespace ts
