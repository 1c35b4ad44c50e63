#pragma once
// Backup and restore of a training run (Keras' BackupAndRestore): the chief writes the complete
// training state — weights, optimizer state, the data position and the epoch's running totals —
// into one safetensors file in the backup folder, each epoch or every N steps, replacing the
// previous one atomically. A run started again with the same folder resumes from it and then
// continues bit-for-bit like the uninterrupted run: batch order and augmentation are functions of
// (seed, epoch), dropout of (seed, step), and Adam's bias correction of the step, so the position
// is the whole random state. A run that completes deletes its backup, as Keras does.
// Contract: plain functions, any thread; errors name the file and say what to do. A backup
// written by a different run configuration (model, data, optimizer, batch, seed, replicas) is
// refused with the settings that differ, never silently mixed in.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/result.h"
#include "tensor/tensor.h"

namespace ts {

struct BackupConfig {
    std::string dir;           // empty: no backups
    int64_t everySteps = 0;    // > 0: after every N global steps; 0: after each epoch
    int restarts = 0;          // a failed run is started again (resuming) up to this many times
    bool enabled() const { return !dir.empty(); }
};

// Where the trainer is: `step` global steps done; in 1-based `epoch`, `stepInEpoch` of its steps
// done, with the running totals the epoch's metrics are computed from.
struct TrainingPosition {
    int64_t step = 0;
    int64_t epoch = 1;
    int64_t stepInEpoch = 0;
    double lossSum = 0;
    int64_t correct = 0;
    int64_t seen = 0;
    double inputWaitSeconds = 0;
    double epochSeconds = 0;
};

struct TrainingState {
    TrainingPosition position;
    nlohmann::json fingerprint;   // the settings the state only makes sense with (see backupFingerprint)
    std::string model;
    std::vector<std::pair<std::string, Tensor>> parameters;  // host tensors, Keras names
    std::vector<std::pair<std::string, Tensor>> optimizer;   // host tensors, e.g. "adam/m"
};

// Whether `backup` is usable: the step interval must be >= 0. Checked by the Trainer and, before
// any task starts, by the coordinator.
Status checkBackupConfig(const BackupConfig& backup);

// Failures a restart from the backup can get past (a peer that died or was cut off, I/O);
// configuration and data errors would only fail again.
bool restartableFailure(const Error& error);

// Where trainstudio-worker keeps remote tasks' backups by default:
// $XDG_DATA_HOME/trainstudio/backups, or ~/.local/share/trainstudio/backups.
std::string defaultBackupRoot();

// A coordinated run's backup folder is a name under each daemon's --backup-root: relative and
// without "..", so a coordinator cannot make a daemon write elsewhere. `source` leads the message.
Status checkRemoteBackupName(const std::string& dir, const std::string& source);

// Makes the daemon's backup root if needed; an error whose message is the OS's reason alone
// ("Permission denied") when it is not a folder this user can write. Checked at startup and again before each task keeps backups.
Status ensureBackupRoot(const std::string& root);

// The backup file inside a backup folder.
std::string backupPath(const std::string& dir);

// Writes `state` to `path` atomically (the previous backup stays complete until the rename).
Status writeTrainingState(const std::string& path, const TrainingState& state);
// Reads and checks a backup: format, version, the position's fields. Errors name the file.
Result<TrainingState> readTrainingState(const std::string& path);

// Refuses a backup whose fingerprint differs from the run's, naming the settings that differ.
Status checkFingerprint(const std::string& path, const nlohmann::json& saved, const nlohmann::json& current);

// The position as a small F32 tensor whose bytes hold the fields (bit copies, not conversions),
// so multi-worker processes can receive the chief's with a broadcast; and back.
Tensor encodePosition(const TrainingPosition& position);
TrainingPosition decodePosition(const Tensor& encoded);

} // namespace ts
