#include "store/process_identity.h"

#include <unistd.h>

#include <fstream>
#include <sstream>

namespace ts::store {

namespace {

std::string bootId()
{
    std::ifstream in("/proc/sys/kernel/random/boot_id");
    std::string id;
    std::getline(in, id);
    return id;
}

// Field 22 (starttime) and field 3 (state) of /proc/<pid>/stat. The command name (field 2) may
// hold spaces and parentheses, so parsing starts after its last ')'.
bool readStat(int64_t pid, std::string& startTicks, char& state)
{
    std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
    if (!in) return false;
    std::string line;
    std::getline(in, line);
    const auto close = line.rfind(')');
    if (close == std::string::npos) return false;
    std::istringstream fields(line.substr(close + 1));
    std::string f;
    // After ')': field 3 is the first token; starttime is field 22, the 20th token.
    for (int i = 3; i <= 22; ++i) {
        if (!(fields >> f)) return false;
        if (i == 3) state = f.empty() ? '?' : f[0];
    }
    startTicks = f;
    return true;
}

std::string hostName()
{
    char buf[256] = {};
    if (gethostname(buf, sizeof buf - 1) != 0) return {};
    return buf;
}

} // namespace

ProcessIdentity currentProcess()
{
    ProcessIdentity p;
    p.host = hostName();
    p.pid = static_cast<int64_t>(getpid());
    std::string ticks;
    char state = '?';
    const std::string boot = bootId();
    if (!boot.empty() && readStat(p.pid, ticks, state)) p.start = boot + "/" + ticks;
    return p;
}

Liveness processLiveness(const ProcessIdentity& writer)
{
    if (writer.pid <= 0 || writer.start.empty()) return Liveness::Unknown;
    if (writer.host != hostName()) return Liveness::Unknown;
    const auto slash = writer.start.find('/');
    if (slash == std::string::npos) return Liveness::Unknown;
    const std::string boot = bootId();
    if (boot.empty()) return Liveness::Unknown;
    if (writer.start.substr(0, slash) != boot) return Liveness::Gone;  // the machine rebooted since
    std::string ticks;
    char state = '?';
    if (!readStat(writer.pid, ticks, state)) return Liveness::Gone;
    if (ticks != writer.start.substr(slash + 1)) return Liveness::Gone;  // the pid was reused
    if (state == 'Z' || state == 'X') return Liveness::Gone;            // killed, not yet reaped
    return Liveness::Alive;
}

} // namespace ts::store
