#pragma once
// Where TrainStudio keeps this user's files: $XDG_DATA_HOME/trainstudio (when absolute, as the
// XDG spec requires), else ~/.local/share/trainstudio. The run database and the workers' backups
// live under it. Plain function, any thread; nothing is created.

#include <string>

namespace ts {

std::string userDataDir();

} // namespace ts
