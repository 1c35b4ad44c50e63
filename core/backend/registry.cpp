#include "backend/registry.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <deque>
#include <cstdlib>
#include <filesystem>
#include <mutex>

namespace ts {

struct BackendRegistry::Impl {
    mutable std::mutex mutex;
    // A deque: find() hands out pointers that a later plugin load must not invalidate.
    std::deque<BackendFactory> factories;
    bool pluginsTried = false;  // loadDefaultPlugins() ran (lookups that miss load them once)
    std::vector<std::string> loadedPlugins;
    std::vector<std::string> pluginNotes;  // what each loaded plugin said it did (ts_plugin_status)
};

BackendRegistry::BackendRegistry() : m_d(std::make_shared<Impl>())
{
    // Explicit list: the built-in backends, ground truth first.
    add(referenceBackendFactory());
    add(cpuBackendFactory());
}

BackendRegistry& BackendRegistry::instance()
{
    static BackendRegistry registry;
    return registry;
}

void BackendRegistry::add(BackendFactory factory)
{
    std::lock_guard lock(m_d->mutex);
    auto it = std::find_if(m_d->factories.begin(), m_d->factories.end(),
                           [&](const BackendFactory& f) { return f.name == factory.name; });
    if (it != m_d->factories.end()) *it = std::move(factory);
    else m_d->factories.push_back(std::move(factory));
}

std::vector<std::string> BackendRegistry::names() const
{
    std::lock_guard lock(m_d->mutex);
    std::vector<std::string> out;
    for (const auto& f : m_d->factories) out.push_back(f.name);
    return out;
}

const BackendFactory* BackendRegistry::find(const std::string& name) const
{
    auto lookup = [&]() -> const BackendFactory* {
        std::lock_guard lock(m_d->mutex);
        for (const auto& f : m_d->factories)
            if (f.name == name) return &f;
        return nullptr;
    };
    if (const BackendFactory* f = lookup()) return f;
    // Plugins load on first need: the CUDA libraries take ~0.1 s and 200 MB of mappings to
    // load, which a CPU run should not pay.
    if (!loadPluginsOnce()) return nullptr;
    return lookup();
}

bool BackendRegistry::loadPluginsOnce() const
{
    {
        std::lock_guard lock(m_d->mutex);
        if (m_d->pluginsTried) return false;
    }
    const_cast<BackendRegistry*>(this)->loadDefaultPlugins();
    return true;
}

const BackendFactory* BackendRegistry::preferred(DeviceKind kind) const
{
    auto lookup = [&]() -> const BackendFactory* {
        std::lock_guard lock(m_d->mutex);
        const BackendFactory* best = nullptr;
        for (const auto& f : m_d->factories)
            if (f.kind == kind && (!best || f.priority > best->priority)) best = &f;
        return best;
    };
    if (const BackendFactory* f = lookup()) return f;
    if (!loadPluginsOnce()) return nullptr;
    return lookup();
}

Result<std::unique_ptr<Backend>> BackendRegistry::create(const std::string& name, int deviceIndex,
                                                         const BackendOptions& options) const
{
    const BackendFactory* f = find(name);
    if (!f) {
        std::string known, notes;
        for (const auto& n : names()) known += (known.empty() ? "" : ", ") + n;
        {
            std::lock_guard lock(m_d->mutex);
            for (const auto& n : m_d->pluginNotes) notes += "; " + n;
        }
        return makeError(ErrorCode::NotFound, "no backend named '" + name + "'",
                         "available backends: " + known + (notes.empty() ? std::string("; no plugin is loaded") : notes));
    }
    return f->create(deviceIndex, options);
}

Result<std::unique_ptr<Backend>> BackendRegistry::create(const Device& device,
                                                         const BackendOptions& options) const
{
    const BackendFactory* f = preferred(device.kind);
    if (!f)
        return makeError(ErrorCode::NotFound,
                         std::string("no backend can drive ") + (device.kind == DeviceKind::Cuda ? "GPU devices (gpu:N, also written cuda:N)" : "CPU devices"),
                         device.kind == DeviceKind::Cuda
                             ? "the CUDA plugin is not loaded or found no GPU; use cpu:N devices"
                             : "this build has no CPU backend");
    return f->create(device.index, options);
}

Status BackendRegistry::loadPlugin(const std::string& path)
{
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
        const char* err = dlerror();
        return makeError(ErrorCode::IoError, "cannot load plugin " + path + ": " + (err ? err : "?"),
                         "check that its libraries (e.g. CUDA) are installed, or remove the plugin");
    }
    using RegisterFn = void (*)(BackendRegistry*);
    auto fn = reinterpret_cast<RegisterFn>(dlsym(handle, "ts_register_backends"));
    if (!fn) {
        dlclose(handle);
        return makeError(ErrorCode::Unsupported, "plugin " + path + " has no ts_register_backends",
                         "it is not a TrainStudio backend plugin");
    }
    fn(this);
    // Optional: why a plugin registered nothing (e.g. no GPU), for the "no backend" error.
    using StatusFn = const char* (*)();
    auto status = reinterpret_cast<StatusFn>(dlsym(handle, "ts_plugin_status"));
    std::lock_guard lock(m_d->mutex);
    m_d->loadedPlugins.push_back(path);
    if (status && status()) m_d->pluginNotes.push_back(std::string(status()) + " (" + path + ")");
    return okStatus();
}

std::vector<std::string> BackendRegistry::loadDefaultPlugins()
{
    {
        std::lock_guard lock(m_d->mutex);
        m_d->pluginsTried = true;
    }
    namespace fs = std::filesystem;
    std::vector<fs::path> dirs;
    if (const char* env = std::getenv("TRAINSTUDIO_PLUGIN_PATH")) {
        std::string s = env;
        std::size_t start = 0;
        while (start <= s.size()) {
            std::size_t end = s.find(':', start);
            if (end == std::string::npos) end = s.size();
            if (end > start) dirs.emplace_back(s.substr(start, end - start));
            start = end + 1;
        }
    }
    std::error_code ec;
    fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    if (!ec) {
        dirs.push_back(exe.parent_path());
        dirs.push_back(exe.parent_path() / "plugins");
        dirs.push_back(exe.parent_path().parent_path() / "plugins");
        dirs.push_back(exe.parent_path().parent_path() / "lib" / "trainstudio");
    }
    std::vector<std::string> messages;
    for (const auto& dir : dirs) {
        if (!fs::is_directory(dir, ec)) continue;
        for (const auto& entry : fs::directory_iterator(dir, ec)) {
            const std::string fname = entry.path().filename().string();
            if (fname.rfind("libtrainstudio-", 0) != 0 || entry.path().extension() != ".so") continue;
            {
                std::lock_guard lock(m_d->mutex);
                if (std::find(m_d->loadedPlugins.begin(), m_d->loadedPlugins.end(), entry.path().string()) !=
                    m_d->loadedPlugins.end())
                    continue;
            }
            Status st = loadPlugin(entry.path().string());
            messages.push_back(st.ok() ? "loaded " + entry.path().string() : st.error().toString());
            if (!st.ok()) {
                std::lock_guard lock(m_d->mutex);
                m_d->pluginNotes.push_back(st.error().toString());
            }
        }
    }
    return messages;
}

} // namespace ts
