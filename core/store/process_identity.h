#pragma once
// Who is writing a run: enough to tell later, from another process, whether that writer still
// runs. The pid alone is not enough (pids are reused), so the process start time (clock ticks
// since boot, /proc/<pid>/stat field 22) and the boot id come with it. Linux only (/proc);
// elsewhere liveness is Unknown and runs are never marked interrupted by guesswork.

#include <cstdint>
#include <string>

namespace ts::store {

struct ProcessIdentity {
    std::string host;
    int64_t pid = 0;
    std::string start;  // "<boot id>/<start ticks>", empty when unknown
};

ProcessIdentity currentProcess();

enum class Liveness { Alive, Gone, Unknown };

// Unknown for another host or an identity without a pid (written before schema 2).
Liveness processLiveness(const ProcessIdentity& writer);

} // namespace ts::store
