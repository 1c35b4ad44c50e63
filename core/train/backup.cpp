#include "train/backup.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <limits>
#include <type_traits>
#include <filesystem>
#include <map>

#include <unistd.h>
#include <zlib.h>

#include "common/paths.h"
#include "io/safetensors.h"

namespace ts {
namespace {

constexpr const char* kFormat = "trainstudio-training-state";
constexpr const char* kVersion = "1";
constexpr const char* kOptimizerPrefix = "optimizer/";

// CRC-32 (zlib) of every tensor's name and bytes in order: a backup damaged on disk (a bad
// sector, a copy cut short and padded) is refused instead of resuming from garbage weights.
// 2.4 MB (the seed MLP with Adam) takes about 0.6 ms here, beside ~5 ms to write and fsync.
std::string tensorsChecksum(const std::vector<std::pair<std::string, Tensor>>& tensors)
{
    uLong crc = crc32(0L, Z_NULL, 0);
    for (const auto& [name, t] : tensors) {
        crc = crc32(crc, reinterpret_cast<const Bytef*>(name.data()), static_cast<uInt>(name.size()));
        const auto* p = static_cast<const Bytef*>(t.raw());
        for (std::size_t left = t.bytes(); left > 0;) {
            const uInt n = static_cast<uInt>(std::min<std::size_t>(left, 1u << 30));
            crc = crc32(crc, p, n);
            p += n;
            left -= n;
        }
    }
    char hex[16];
    std::snprintf(hex, sizeof hex, "%08lx", static_cast<unsigned long>(crc));
    return std::string("crc32:") + hex;
}

Error damaged(const std::string& path, const std::string& what)
{
    return makeError(ErrorCode::InvalidArgument, path + ": the backup is damaged: " + what,
                     "delete it (or move it aside) to start the run from the beginning");
}

// Fields of the position in encode order; doubles and int64s are both 8 bytes.
constexpr int kPositionFields = 8;

// A metadata field parsed whole as T (int64_t, at least `min`; or double); errors name the file.
template <typename T>
Result<T> field(const std::string& path, const std::map<std::string, std::string>& meta, const std::string& key,
                T min = std::numeric_limits<T>::lowest())
{
    auto it = meta.find(key);
    if (it == meta.end())
        return makeError(ErrorCode::InvalidArgument, path + ": the backup has no '" + key + "'",
                         "the file is damaged or not a TrainStudio backup; delete it to start the run from the beginning");
    try {
        std::size_t used = 0;
        const T v = std::is_integral_v<T> ? static_cast<T>(std::stoll(it->second, &used)) : static_cast<T>(std::stod(it->second, &used));
        if (used != it->second.size() || v < min) throw std::invalid_argument(key);
        return v;
    } catch (const std::exception&) {
        return makeError(ErrorCode::InvalidArgument, path + ": the backup's '" + key + "' is '" + it->second + "'",
                         "the file is damaged; delete it to start the run from the beginning");
    }
}

// Exact text for a double (17 significant digits round-trip).
std::string exact(double v)
{
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    return buf;
}

} // namespace

Status checkBackupConfig(const BackupConfig& backup)
{
    if (!backup.enabled()) return okStatus();
    if (backup.everySteps < 0)
        return makeError(ErrorCode::InvalidArgument, "backup every " + std::to_string(backup.everySteps) + " steps",
                         "use a step count >= 1, or 0 to back up after each epoch");
    return okStatus();
}

bool restartableFailure(const Error& e)
{
    switch (e.code) {
    case ErrorCode::InvalidArgument:
    case ErrorCode::ParseError:
    case ErrorCode::NotFound:
    case ErrorCode::ShapeMismatch:
    case ErrorCode::Unsupported:
    case ErrorCode::OutOfMemory:
    case ErrorCode::Cancelled:  // stopped on purpose (here, or on a peer task): not a crash
        return false;
    default:
        return true;
    }
}

std::string defaultBackupRoot() { return (std::filesystem::path(userDataDir()) / "backups").string(); }

Status checkRemoteBackupName(const std::string& dir, const std::string& source)
{
    const std::filesystem::path rel(dir);
    bool bad = rel.is_absolute() || rel.empty();
    for (const auto& part : rel) bad |= part == "..";
    if (bad)
        return makeError(ErrorCode::InvalidArgument,
                         source + ": backup.dir '" + dir + "' must be a relative folder name without '..' (a remote task keeps its backups under its "
                                  "worker's --backup-root)",
                         "name a folder, e.g. --backup-dir my-run: each daemon keeps it under its --backup-root");
    return okStatus();
}

Status ensureBackupRoot(const std::string& root)
{
    std::error_code ec;
    std::filesystem::create_directories(root, ec);
    if (!ec && ::access(root.c_str(), W_OK | X_OK) == 0) return okStatus();
    return makeError(ErrorCode::IoError, ec ? ec.message() : std::string(std::strerror(errno)));
}

std::string backupPath(const std::string& dir) { return (std::filesystem::path(dir) / "backup.safetensors").string(); }

Status writeTrainingState(const std::string& path, const TrainingState& state)
{
    const TrainingPosition& p = state.position;
    std::map<std::string, std::string> meta = {
        {"format", kFormat},
        {"version", kVersion},
        {"model", state.model},
        {"fingerprint", state.fingerprint.dump()},
        {"step", std::to_string(p.step)},
        {"epoch", std::to_string(p.epoch)},
        {"step_in_epoch", std::to_string(p.stepInEpoch)},
        {"loss_sum", exact(p.lossSum)},
        {"correct", std::to_string(p.correct)},
        {"seen", std::to_string(p.seen)},
        {"input_wait_seconds", exact(p.inputWaitSeconds)},
        {"epoch_seconds", exact(p.epochSeconds)},
    };
    std::vector<std::pair<std::string, Tensor>> tensors = state.parameters;
    for (const auto& [name, t] : state.optimizer) tensors.emplace_back(kOptimizerPrefix + name, t);
    meta["checksum"] = tensorsChecksum(tensors);
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
    return writeSafetensors(path, tensors, meta);
}

Result<TrainingState> readTrainingState(const std::string& path)
{
    auto read = readSafetensors(path);
    if (!read.ok()) {
        if (read.error().code == ErrorCode::ParseError || read.error().code == ErrorCode::InvalidArgument)
            return damaged(path, read.error().message);
        return read.takeError();  // unreadable: its own message says why
    }
    SafetensorsFile file = std::move(read).value();
    const auto& meta = file.metadata;
    auto format = meta.find("format");
    if (format == meta.end() || format->second != kFormat)
        return makeError(ErrorCode::InvalidArgument, path + ": not a TrainStudio training backup (no format '" + std::string(kFormat) + "')",
                         "point the backup folder at a folder of its own, or delete the file");
    if (meta.count("version") == 0 || meta.at("version") != kVersion)
        return makeError(ErrorCode::Unsupported,
                         path + ": backup version '" + (meta.count("version") ? meta.at("version") : "?") + "' is not " + kVersion,
                         "it was written by another TrainStudio version; delete it to start the run from the beginning");
    TrainingState s;
    TrainingPosition& p = s.position;
    TS_ASSIGN(p.step, field<int64_t>(path, meta, "step", 0));
    TS_ASSIGN(p.epoch, field<int64_t>(path, meta, "epoch", 1));
    TS_ASSIGN(p.stepInEpoch, field<int64_t>(path, meta, "step_in_epoch", 0));
    TS_ASSIGN(p.lossSum, field<double>(path, meta, "loss_sum"));
    TS_ASSIGN(p.correct, field<int64_t>(path, meta, "correct", 0));
    TS_ASSIGN(p.seen, field<int64_t>(path, meta, "seen", 0));
    TS_ASSIGN(p.inputWaitSeconds, field<double>(path, meta, "input_wait_seconds"));
    TS_ASSIGN(p.epochSeconds, field<double>(path, meta, "epoch_seconds"));
    if (p.stepInEpoch > p.step)
        return makeError(ErrorCode::InvalidArgument, path + ": the backup is at step " + std::to_string(p.stepInEpoch) +
                                                         " of its epoch but only " + std::to_string(p.step) + " steps in all",
                         "the file is damaged; delete it (or move it aside) to start the run from the beginning");
    s.model = meta.count("model") ? meta.at("model") : "";
    try {
        s.fingerprint = nlohmann::json::parse(meta.count("fingerprint") ? meta.at("fingerprint") : "null");
    } catch (const std::exception&) {
        return makeError(ErrorCode::InvalidArgument, path + ": the backup's run fingerprint is not JSON",
                         "the file is damaged; delete it to start the run from the beginning");
    }
    if (auto sum = meta.find("checksum"); sum != meta.end()) {  // absent in backups written before it existed
        if (const std::string actual = tensorsChecksum(file.inOrder()); actual != sum->second)
            return damaged(path, "its tensors' checksum is " + actual + ", the file records " + sum->second);
    }
    const std::string prefix = kOptimizerPrefix;
    for (const auto& name : file.order) {
        if (name.rfind(prefix, 0) == 0) s.optimizer.emplace_back(name.substr(prefix.size()), file.tensors.at(name));
        else s.parameters.emplace_back(name, file.tensors.at(name));
    }
    return s;
}

Status checkFingerprint(const std::string& path, const nlohmann::json& saved, const nlohmann::json& current)
{
    if (saved == current) return okStatus();
    std::string changed;
    auto note = [&](const std::string& key) { changed += (changed.empty() ? "" : ", ") + key; };
    if (saved.is_object() && current.is_object()) {
        for (auto it = current.begin(); it != current.end(); ++it)
            if (!saved.contains(it.key()) || saved.at(it.key()) != it.value()) note(it.key());
        for (auto it = saved.begin(); it != saved.end(); ++it)
            if (!current.contains(it.key())) note(it.key());
    }
    return makeError(ErrorCode::InvalidArgument,
                     path + ": the backup was written by a run with other settings" + (changed.empty() ? "" : " (" + changed + ")"),
                     "resume with the settings the backup was made with, or delete the backup (or choose another backup "
                     "folder) to start this run from the beginning");
}

Tensor encodePosition(const TrainingPosition& p)
{
    Tensor t = Tensor::zeros(Shape{2 * kPositionFields}, DType::F32);
    auto* out = reinterpret_cast<unsigned char*>(t.data<float>());
    const int64_t ints[] = {p.step, p.epoch, p.stepInEpoch, p.correct, p.seen};
    const double reals[] = {p.lossSum, p.inputWaitSeconds, p.epochSeconds};
    static_assert(std::size(ints) + std::size(reals) == kPositionFields);
    std::memcpy(out, ints, sizeof ints);
    std::memcpy(out + sizeof ints, reals, sizeof reals);
    return t;
}

TrainingPosition decodePosition(const Tensor& t)
{
    const auto* in = reinterpret_cast<const unsigned char*>(t.data<float>());
    int64_t ints[5];
    double reals[3];
    std::memcpy(ints, in, sizeof ints);
    std::memcpy(reals, in + sizeof ints, sizeof reals);
    TrainingPosition p;
    p.step = ints[0];
    p.epoch = ints[1];
    p.stepInEpoch = ints[2];
    p.correct = ints[3];
    p.seen = ints[4];
    p.lossSum = reals[0];
    p.inputWaitSeconds = reals[1];
    p.epochSeconds = reals[2];
    return p;
}

} // namespace ts
