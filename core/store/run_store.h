#pragma once
// RunStore: the run history in one SQLite database (WAL): runs with their configuration
// snapshot, metrics, device/pipeline samples, trace spans, checkpoints and advisor findings.
//
// Threads and connections:
//  - Writes go through one writer thread with its own connection. record()/recordEvents() only
//    queue (never block on the disk); the writer commits one transaction per batch (every
//    `batchMs`, or sooner when `batchEvents` are waiting). Synchronous calls (createRun,
//    setRunStatus, rename, tags, checkpoints, delete) are queued behind the events already
//    recorded, so their effects follow those events.
//  - Queries use a second, read-only connection (guarded by a mutex; the calls are
//    thread-safe). WAL lets readers, in this process or another, read while the writer commits;
//    neither blocks the other.
// Crash safety: a process killed mid-write leaves the database intact (SQLite's journal); what
// was committed stays. Each run being written records its writer (host, pid, process start);
// the next read-write open marks runs whose writer is gone as "interrupted", and queries
// report them as interrupted even before that (and through read-only opens).
//
// Bad input: a file that is not a run database or is damaged, or a database written by a newer
// TrainStudio (read-write open refused; read-only open allowed, as migrations only add), gives
// an Error naming the file. A missing or changed checkpoint file is an error about that file
// only; the run's other history stays readable.

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/background_thread.h"
#include "common/result.h"
#include "store/downsample.h"
#include "telemetry/events.h"

namespace ts::store {

using telemetry::RunState;

// "created", "running", ... (the names stored in the database and printed by the CLI).
const char* statusName(RunState s);
std::optional<RunState> parseStatus(const std::string& s);
bool isTerminal(RunState s);

struct OpenOptions {
    bool readOnly = false;     // no writer thread, no migrations; queries only
    bool create = true;        // create the file (and its folder) when missing (read-write only)
    // Longest time an event waits before its batch is committed. Each commit rewrites the
    // partly filled pages it touches and wakes the writer (kHelperPeriod: see there), so one
    // commit a second costs far less than twenty; nothing live reads the store (dashboards read
    // the bus) and flush() still commits at once. A run killed hard loses at most this much.
    int batchMs = static_cast<int>(kHelperPeriod.count());
    std::size_t batchEvents = 4096;    // commit sooner when this many events are waiting
    std::size_t maxQueuedEvents = 4'000'000;  // beyond this, events are dropped (and counted)
};

struct NewRun {
    std::string id;            // empty: a new random UUID (v4 format)
    std::string name;          // empty: "<model name> <date time>"
    std::string project;
    nlohmann::json model;      // the model spec snapshot (our JSON format)
    nlohmann::json config;     // the full run configuration (RunConfig::toJson)
    uint64_t seed = 0;
    std::string strategy;
    nlohmann::json devices;    // device names, or the cluster (TF_CONFIG's "cluster")
    std::vector<std::string> tags;
};

struct RunInfo {
    std::string id, name, project, modelName, strategy;
    std::string configHash;    // configHash(config): "fnv1a64:<16 hex>"
    uint64_t seed = 0;
    RunState status = RunState::Created;
    std::string error;         // why it failed
    int64_t createdUs = 0, startedUs = 0, endedUs = 0;  // 0: not yet
    std::vector<std::string> tags;
    int64_t lastStep = 0;      // highest step with a recorded "loss" (0: none; -1: unreadable, a
                               // damaged database: series() names the problem)
    // Filled by run() only (listRuns leaves them null: they can be large).
    nlohmann::json model, config, devices;
};

struct RunFilter {
    std::optional<RunState> status;
    std::string nameContains;  // case-insensitive substring of the name
    std::string tag;           // exact tag
    std::string strategy;      // exact strategy
    std::string model;         // exact model name
    std::string project;       // exact project
    int limit = 0;             // 0: all; newest first
};

struct ProjectInfo {
    std::string name;
    nlohmann::json spec;
    int64_t createdUs = 0, updatedUs = 0;
};

struct SeriesQuery {
    int64_t step0 = std::numeric_limits<int64_t>::min();  // range; the default is the whole run
    int64_t step1 = std::numeric_limits<int64_t>::max();
    int buckets = 0;           // > 0: M4 downsampling into this many buckets; 0: every sample
};

struct Series {
    std::string runId, metric;
    int64_t step0 = 0, step1 = 0;   // the range used (resolved from the data when open-ended)
    int64_t samples = 0;            // samples in the range (before downsampling)
    bool downsampled = false;
    std::vector<SeriesPoint> points;
};

struct EpochRow {
    int64_t epoch = 0, step = 0, wallUs = 0;
    std::map<std::string, double> metrics;  // "loss", "accuracy", "val_loss", ..., "seconds", "samples_per_sec"
};

struct Checkpoint {
    int64_t id = 0;
    std::string runId;
    int64_t step = 0;
    std::string kind;          // "final", "periodic", "best"
    std::string path;
    std::string checksum;      // fileChecksum() when recorded
    int64_t bytes = 0;
    int64_t createdUs = 0;
};

struct RunFile {
    int64_t id = 0;
    std::string runId, kind, path, checksum;  // kind: "trace", "log", ...
    int64_t bytes = 0, createdUs = 0;
};

// How much of each kind of record a run has (for a run's overview page, `runs show`).
struct RunCounts {
    int64_t steps = 0;         // steps with a recorded loss
    int64_t epochs = 0;
    int64_t breakdowns = 0, deviceSamples = 0, pipelineSamples = 0, spans = 0;
    int64_t findings = 0, logs = 0, checkpoints = 0, files = 0;
};

struct DeleteReport {
    std::vector<std::string> removedFiles;
    std::vector<std::string> keptFiles;   // "path (why)": shared with another run, changed since, ...
};

class RunStore {
public:
    // Opens (creating and migrating when needed) the database at `path`.
    static Result<RunStore> open(const std::string& path, const OpenOptions& options = {});

    RunStore(RunStore&&) noexcept;
    RunStore& operator=(RunStore&&) noexcept;
    ~RunStore();  // close()

    const std::string& path() const;
    bool readOnly() const;
    int fileSchemaVersion() const;     // the database's user_version when opened

    // --- writing ---------------------------------------------------------------------------
    Result<RunInfo> createRun(const NewRun& run);
    // Status transitions; Running stamps the start (first time) and claims the run for this
    // process, terminal states stamp the end; `error` is kept for Failed.
    Status setRunStatus(const std::string& runId, RunState status, const std::string& error = {});
    // The devices the run trained on (a JSON array), for runs whose devices are known only once
    // they started (remote workers).
    Status setRunDevices(const std::string& runId, const nlohmann::json& devices);
    // Queue telemetry events (any thread, never waits for the disk). Events of a run this
    // database does not know create a minimal run entry (named after its id).
    void record(telemetry::Event event);
    void recordEvents(std::vector<telemetry::Event> events);
    // A source the writer thread pulls from itself at every batch (a bus subscription), so no
    // thread of the caller's has to wake up to hand events over. `drain` appends what is ready
    // to its argument and returns how many; it runs on the writer thread, also while the
    // call that adds it has not returned. Returns an id for removeSource().
    using EventSource = std::function<std::size_t(std::vector<telemetry::Event>&)>;
    int addSource(EventSource drain);
    // Drains the source into the write queue now, from the calling thread: for its owner when
    // the source's buffer fills because the writer is held up (slow disk, a lock held by
    // another process), which the queue absorbs (up to maxQueuedEvents).
    void pullSource(int id);
    // Stops pulling from the source after one last drain, and waits until everything it gave
    // is committed (like flush(), whose status it returns).
    Status removeSource(int id);
    // Waits until everything queued before the call is committed. Returns the first write
    // error since the previous flush, if any.
    Status flush();
    // The run starts again after `step` (train --restarts resumed it from a backup): the
    // per-step records of its failed attempt beyond that step (step metrics, epochs, step
    // breakdowns) are dropped, so replayed steps are not counted twice and curves do not run
    // backwards. What happened in time stays: logs, trace spans, device and pipeline samples,
    // findings. Ordered after the events published before the call.
    Status rewindRun(const std::string& runId, int64_t step);
    // Flushes, stops the writer and closes the connections. Idempotent.
    Status close();
    // Events dropped because the queue was full or their batch could not be written.
    uint64_t droppedEvents() const;

    Status upsertProject(const std::string& name, const nlohmann::json& spec);
    Status renameRun(const std::string& runId, const std::string& name);
    Status setTags(const std::string& runId, const std::vector<std::string>& tags);
    Status addTag(const std::string& runId, const std::string& tag);
    Status removeTag(const std::string& runId, const std::string& tag);
    // Records a checkpoint file (already written, e.g. by writeSafetensors) with its checksum.
    Result<Checkpoint> addCheckpoint(const std::string& runId, const std::string& path, int64_t step,
                                     const std::string& kind = "periodic");
    // Records another file that belongs to the run (a trace file...), with its checksum.
    Result<RunFile> addFile(const std::string& runId, const std::string& kind, const std::string& path);
    // Deletes the run and everything recorded for it; with removeFiles, also its checkpoint and
    // other files, except those another run references or that changed since they were recorded.
    Result<DeleteReport> deleteRun(const std::string& runId, bool removeFiles = true);
    // Marks runs whose writer process is gone as interrupted; returns how many. open() calls it.
    Result<int> markInterruptedRuns();
    // Where the store keeps files it writes for a run (final weights): "<db folder>/<db name
    // without extension>-files/<run id>".
    std::string runFilesDir(const std::string& runId) const;
    // The folder holding every run's files for the database at `dbPath`: "<db folder>/<db name
    // without extension>-files" (what writers of other files must keep out of).
    static std::string filesRoot(const std::string& dbPath);

    // --- reading ---------------------------------------------------------------------------
    // Full id, a unique prefix of one (>= 4 characters), or a unique run name.
    Result<std::string> resolveRunId(const std::string& idPrefixOrName);
    Result<RunInfo> run(const std::string& runId);
    Result<std::vector<RunInfo>> listRuns(const RunFilter& filter = {});
    Result<std::vector<ProjectInfo>> projects();
    Result<std::vector<std::string>> metricNames(const std::string& runId);
    Result<Series> series(const std::string& runId, const std::string& metric, const SeriesQuery& query = {});
    // The same metric of several runs over one step range (the union of theirs when open-ended).
    Result<std::vector<Series>> compare(const std::vector<std::string>& runIds, const std::string& metric,
                                        const SeriesQuery& query = {});
    Result<std::vector<EpochRow>> epochMetrics(const std::string& runId);
    Result<RunCounts> counts(const std::string& runId);
    // Calls `row` for each step in order with every metric recorded at that step.
    Status forEachStep(const std::string& runId,
                       const std::function<void(int64_t step, int64_t epoch, int64_t wallUs,
                                                const std::map<std::string, double>& metrics)>& row);
    Result<std::vector<telemetry::StepBreakdownEvent>> breakdowns(const std::string& runId, int limit = 0);
    Result<std::vector<telemetry::DeviceSampleEvent>> deviceSamples(const std::string& runId, int limit = 0);
    Result<std::vector<telemetry::PipelineSampleEvent>> pipelineSamples(const std::string& runId, int limit = 0);
    // Spans overlapping [t0Us, t1Us] (wall-clock microseconds), in start order.
    Result<std::vector<telemetry::SpanEvent>> spans(const std::string& runId,
                                                    int64_t t0Us = std::numeric_limits<int64_t>::min(),
                                                    int64_t t1Us = std::numeric_limits<int64_t>::max());
    Result<std::vector<telemetry::FindingEvent>> findings(const std::string& runId);
    // Log lines and errors (ErrorEvents come back as LogLevel::Error with "hint"/"where" kept).
    Result<std::vector<telemetry::LogEvent>> logs(const std::string& runId, int limit = 0);
    Result<std::vector<Checkpoint>> checkpoints(const std::string& runId);
    Result<std::vector<RunFile>> files(const std::string& runId);
    // The checkpoint file exists and still has its recorded checksum; errors name the file.
    Status verifyCheckpoint(const Checkpoint& checkpoint);
    // PRAGMA integrity_check: "ok", or the problems found.
    Result<std::vector<std::string>> integrityCheck();
    // Runs `fn` with a read transaction held: every query inside sees one snapshot of the
    // database, whatever the writer commits meanwhile (which it keeps doing: WAL).
    Status withReadSnapshot(const std::function<void()>& fn);

private:
    struct Impl;
    explicit RunStore(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> m;
};

// $XDG_DATA_HOME/trainstudio/runs.db, or ~/.local/share/trainstudio/runs.db.
std::string defaultDatabasePath();

// A run's recorded devices in one line: "cpu:0, cpu:1", "worker:0 cpu:0, ..." (objects as runs
// record them, with the task in multi-worker runs), or a cluster "worker ×2, ps ×1". `withNames`:
// the devices' long names where recorded ("cpu:0 (AMD EPYC, 2 threads)").
std::string devicesSummary(const nlohmann::json& devices, bool withNames);

// A random UUID in the v4 text form (8-4-4-4-12 lowercase hex).
std::string newRunId();

} // namespace ts::store
