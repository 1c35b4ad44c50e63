#include "session/localmachine.h"

#include "backend/registry.h"
#include "data/dataset.h"
#include "telemetry/sampler.h"

namespace ts {

QList<LocalDevice> localDevices()
{
    QList<LocalDevice> out;
    BackendRegistry& registry = BackendRegistry::instance();
    for (const std::string& name : registry.names()) {
        const BackendFactory* f = registry.find(name);
        if (!f || f != registry.preferred(f->kind)) continue;  // one entry per device
        for (const DeviceInfo& d : f->enumerate())
            out.append({QString::fromStdString(d.device.toString()), QString::fromStdString(d.name)});
    }
    return out;
}

QString defaultDataDirectory()
{
    return QString::fromStdString(defaultFashionMnistDir());
}

HostLoad HostLoadProbe::read()
{
    HostLoad h;
    auto j = telemetry::readCpuJiffies("/proc/stat");
    if (j.ok() && !j->total.empty() && !j->busy.empty()) {
        if (hasBaseline() && j->total[0] > m_total) h.load = static_cast<double>(j->busy[0] - m_busy) / static_cast<double>(j->total[0] - m_total);
        m_busy = j->busy[0];
        m_total = j->total[0];
    }
    // readKbField converts "kB" lines to bytes.
    auto total = telemetry::readKbField("/proc/meminfo", "MemTotal");
    auto avail = telemetry::readKbField("/proc/meminfo", "MemAvailable");
    h.memoryTotal = total.ok() ? *total : 0;
    h.memoryFree = avail.ok() ? *avail : 0;
    return h;
}

} // namespace ts
