#include "store/recording.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <filesystem>
#include <iostream>

#include "io/safetensors.h"
#include "store/bus_sink.h"
#include "telemetry/advisor_sink.h"
#include "train/run_config.h"

namespace ts::store {

RunRecording::RunRecording(RunStore store, RecordingOptions options)
    : m_store(std::move(store)), m_options(std::move(options))
{
}

RunRecording::~RunRecording()
{
    if (m_advisor) m_advisor->stop();
    if (m_sink) (void)m_sink->stop();
    Status s = m_store.close();
    if (!s.ok()) warn(s.error());
}

Result<std::unique_ptr<RunRecording>> RunRecording::open(const std::string& path, RecordingOptions options)
{
    auto store = RunStore::open(path);
    if (!store.ok()) return store.takeError();
    return std::make_unique<RunRecording>(std::move(store).value(), std::move(options));
}

void RunRecording::warn(const Error& e, bool incomplete) const
{
    if (incomplete) ++m_problems;
    if (m_options.warn) {
        m_options.warn(e);
        return;
    }
    std::cerr << "warning: recording the run: " << e.message << "\n";
    if (!e.hint.empty()) std::cerr << "hint: " << e.hint << "\n";
}

uint64_t RunRecording::droppedEvents() const { return m_sink ? m_sink->busDropped() : m_dropped; }

Status RunRecording::begin(PreparedRun& run, telemetry::EventBus& bus)
{
    TS_TRY(create(run.config, &run));
    m_sink = std::make_unique<StoreSink>(bus, m_store);
    // Advice as the run goes: findings after every epoch land in the store with the run.
    m_advisor = std::make_unique<telemetry::AdvisorSink>(bus, m_id, run.trainer->strategy().numReplicas());
    run.trainer->setTelemetry(&bus, m_id, false);
    m_bus = &bus;
    return okStatus();
}

void RunRecording::attach(PreparedRun& run)
{
    if (!m_sink) return;
    run.trainer->setTelemetry(m_bus, m_id, false);
}

Status RunRecording::beginRemote(const RunConfig& config, telemetry::EventBus& bus)
{
    TS_TRY(create(config, nullptr));
    m_sink = std::make_unique<StoreSink>(bus, m_store);
    return okStatus();
}

void RunRecording::prepareFailed(const RunConfig& config, const Error& error)
{
    if (Status c = create(config, nullptr); !c.ok()) {
        warn(c.error());
        return;
    }
    Status s = m_store.setRunStatus(m_id, RunState::Failed, error.toString());
    if (!s.ok()) warn(s.error());
}

void RunRecording::fitDone(const Result<FitResult>& result, bool interrupted)
{
    if (!m_sink) return;
    if (m_advisor) m_advisor->stop();  // its last findings go onto the bus before the store drains it
    Status s = m_sink->stop();
    if (!s.ok()) warn(s.error());
    m_dropped = m_sink->busDropped();
    if (m_dropped > 0)
        warn(makeError(ErrorCode::Internal, std::to_string(m_dropped) + " telemetry event(s) were dropped",
                       "the store fell behind the run; its plots have gaps"),
             false);
    // The trainer published the final state; set it again in case the bus dropped it.
    RunState state = !result.ok() ? (result.error().code == ErrorCode::Cancelled ? RunState::Cancelled : RunState::Failed)
                                  : (result->cancelled ? RunState::Cancelled : RunState::Completed);
    if (interrupted && state == RunState::Cancelled) state = RunState::Interrupted;
    s = m_store.setRunStatus(m_id, state, result.ok() ? std::string() : result.error().toString());
    if (!s.ok()) warn(s.error());
}

void RunRecording::setDevices(const nlohmann::json& devices)
{
    if (m_id.empty() || !devices.is_array() || devices.empty()) return;
    if (Status s = m_store.setRunDevices(m_id, devices); !s.ok()) warn(s.error());
}

std::string RunRecording::ownFile(const std::string& fileName)
{
    const std::filesystem::path dir = m_store.runFilesDir(m_id);
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);  // a failure shows when the file is written
    return (dir / fileName).string();
}

void RunRecording::saveCheckpoint(const std::string& fileName, int64_t step, const std::string& kind,
                                  const std::function<Status(const std::string&)>& write)
{
    const std::string path = ownFile(fileName);
    Status s = write(path);
    if (!s.ok()) {
        warn(s.error());
        return;
    }
    auto c = m_store.addCheckpoint(m_id, path, step, kind);
    if (!c.ok()) warn(c.error());
}

namespace {

// The store's own copy of a file the user also has: a clone where the file system can share the
// blocks (btrfs, XFS), else a full copy. Not a hard link: tools that overwrite a file in place
// (cp, safetensors' save_file) would change the recorded one with it.
Status keepCopy(const std::string& from, const std::string& to)
{
    namespace fs = std::filesystem;
    std::error_code ec;
    fs::remove(to, ec);
    const int in = ::open(from.c_str(), O_RDONLY | O_CLOEXEC);
    if (in >= 0) {
        const int out = ::open(to.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        const bool cloned = out >= 0 && ::ioctl(out, FICLONE, in) == 0;
        if (out >= 0) ::close(out);
        ::close(in);
        if (cloned) return okStatus();
        fs::remove(to, ec);
    }
    fs::copy_file(from, to, fs::copy_options::overwrite_existing, ec);
    if (ec) return makeError(ErrorCode::IoError, "cannot keep a copy of " + from + " with the run as " + to + ": " + ec.message(),
                             "check the free space and permissions of the run store's folder");
    return okStatus();
}

} // namespace

void RunRecording::keepWeights(PreparedRun& run, const std::string& savedPath, int64_t step)
{
    if (m_id.empty()) return;
    // The user's --save-weights file is theirs to overwrite: recorded under its own name, the
    // next run saving there replaced this run's weights. The store keeps its own copy.
    saveCheckpoint("final.safetensors", step, "final", [&](const std::string& path) {
        return savedPath.empty() ? run.trainer->saveWeights(path) : keepCopy(savedPath, path);
    });
}

void RunRecording::keepWeights(const std::vector<std::pair<std::string, Tensor>>& weights, const std::map<std::string, std::string>& metadata,
                               const std::string& savedPath, int64_t step)
{
    if (m_id.empty() || weights.empty()) return;
    saveCheckpoint("final.safetensors", step, "final", [&](const std::string& path) {
        return savedPath.empty() ? writeSafetensors(path, weights, metadata) : keepCopy(savedPath, path);
    });
}

void RunRecording::checkpoint(PreparedRun& run, int64_t epoch, int64_t step)
{
    if (m_id.empty()) return;
    saveCheckpoint("epoch-" + std::to_string(epoch) + ".safetensors", step, "periodic",
                   [&](const std::string& path) { return run.trainer->saveWeights(path); });
}

void RunRecording::keepFile(const std::string& kind, const std::string& path)
{
    if (m_id.empty()) return;
    // A copy kept by the store, as the weights are: the user's path is theirs to reuse.
    const std::string own = ownFile(kind + std::filesystem::path(path).extension().string());
    if (Status s = keepCopy(path, own); !s.ok()) {
        warn(s.error());
        return;
    }
    auto f = m_store.addFile(m_id, kind, own);
    if (!f.ok()) warn(f.error());
}

Status RunRecording::create(const RunConfig& config, const PreparedRun* run)
{
    NewRun spec;
    spec.name = m_options.name;
    spec.tags = m_options.tags;
    spec.config = config.toJson();
    spec.model = run ? modelToJson(run->model) : (config.modelFile.empty() ? modelToJson(config.model) : nlohmann::json());
    if (spec.model.is_null() && !config.modelFile.empty())
        spec.model = {{"name", std::filesystem::path(config.modelFile).stem().string()}};
    spec.seed = config.seed;
    spec.strategy = config.strategy.kind;
    if (run && !run->model.name.empty()) {
        // The model design is the run's project: runs of one design group together.
        spec.project = run->model.name;
        Status p = m_store.upsertProject(run->model.name, modelToJson(run->model));
        if (!p.ok()) warn(p.error());
    }
    nlohmann::json devices = nlohmann::json::array();
    if (run)
        for (const auto& d : run->trainer->strategy().devices())
            devices.push_back({{"device", d.device.toString()}, {"name", d.name}, {"memory_total", d.memoryTotal}});
    else
        for (const auto& d : config.strategy.devices) devices.push_back({{"device", d.toString()}});
    spec.devices = devices;
    auto info = m_store.createRun(spec);
    if (!info.ok()) {
        // A refused name or tag (InvalidArgument) has its own hint; anything else is the database.
        if (info.error().code == ErrorCode::InvalidArgument)
            return makeError(ErrorCode::InvalidArgument, "cannot record the run: " + info.error().message,
                             info.error().hint.empty() ? "choose another --run-name or --tag" : info.error().hint);
        return makeError(info.error().code, "cannot record the run: " + info.error().message,
                         "repair it (sqlite3 '" + m_store.path() + "' .recover | sqlite3 repaired.db), choose another database, "
                         "or train without recording");
    }
    m_id = info->id;
    return okStatus();
}

} // namespace ts::store
