#pragma once
// What the run setup shows about this machine — its devices, its load and memory, the default
// data folder — asked of the engine here, so setup widgets need no engine headers.
// Contract: plain functions and a small value-holding probe; call from the GUI thread (device
// enumeration may load backend plugins on first use). Nothing here throws; a reading that
// cannot be taken comes back as "unknown" (negative load, zero memory).

#include <QList>
#include <QString>

#include <cstdint>

namespace ts {

struct LocalDevice {
    QString id;    // "cpu:0", "cuda:1": what a run configuration's devices list takes
    QString name;  // the backend's description of it
};

// Every device of this machine, one entry each (from the preferred backend of each kind).
QList<LocalDevice> localDevices();

// The folder runs read Fashion-MNIST from when the configuration names none.
QString defaultDataDirectory();

struct HostLoad {
    double load = -1;          // busy share of all cores since the previous reading (0..1); < 0: unknown
    uint64_t memoryTotal = 0;  // bytes; 0: unknown
    uint64_t memoryFree = 0;   // bytes available to new processes
};

// Reads /proc: the load is measured between two calls, so the first reading has none.
class HostLoadProbe {
public:
    HostLoad read();
    bool hasBaseline() const { return m_total > 0; }

private:
    uint64_t m_busy = 0, m_total = 0;  // the previous /proc/stat counters of all cores together
};

} // namespace ts
