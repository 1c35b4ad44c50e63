#pragma once
// Where TrainStudio keeps this user's files: $XDG_DATA_HOME/trainstudio (when absolute, as the
// XDG spec requires), else ~/.local/share/trainstudio. The run database and the workers' backups
// live under it. Plain function, any thread; nothing is created.

#include <string>

namespace ts {

std::string userDataDir();

// Whether `path` is `folder` or lies under it, comparing absolute paths with symlinks and ".."
// resolved (the parts that exist). False when either cannot be resolved.
bool pathIsInside(const std::string& path, const std::string& folder);

// The hint for a file that is not there: check the path, and for a relative one, which folder
// it was read from (the current folder), since a path copied from a config often assumes another.
std::string missingFileHint(const std::string& path);

} // namespace ts
