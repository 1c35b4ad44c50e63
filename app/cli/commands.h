#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace CLI { class App; }
namespace ts {
namespace store { class RunRecording; }
struct Error;
struct FitResult;
struct PreparedRun;
struct RunConfig;
class TrainListener;
template <typename T> class Result;
namespace telemetry { class EventBus; class TraceFileSink; }
}

namespace tscli {

struct TrainOptions {
    std::string model;
    std::string data;
    std::string config;
    int epochs = -1;
    long long maxSteps = 0;
    long long batchSize = -1;
    std::string optimizer;
    double learningRate = -1;
    std::string strategy;  // empty: the configuration's, else one-device
    std::string devices;
    std::string precision;  // empty: the configuration's, else float32
    int threads = 0;
    unsigned long long seed = 0;
    bool seedGiven = false;  // --seed given (else the configuration's seed)
    bool noShuffle = false;
    bool noValidation = false;
    long long limit = 0;
    long long validationLimit = 0;
    std::string loadWeights;
    std::string saveWeights;
    std::string backend;
    bool json = false;
    bool quiet = false;
    // Run store: every run is recorded into the default database unless --no-record.
    std::string db;
    bool noRecord = false;
    std::string runName;
    std::vector<std::string> tags;
    // Telemetry: write the run's Chrome trace (per-layer spans with traceLayers).
    std::string trace;
    bool traceLayers = false;
    int checkpointEvery = 0;  // epochs between checkpoints kept with the recorded run (0: final only)
    // Backup and restore (train/backup.h): resume from / back up into this folder; every N steps
    // (-1: the config's, 0: each epoch); restart a failed run up to N times (-1: the config's).
    std::string backupDir;
    long long backupEverySteps = -1;
    int restarts = -1;
    // multi-worker-mirrored: this process is one task of the cluster in TF_CONFIG (the env var,
    // or the file --tf-config); --task overrides its "task". Token: --token-file or env.
    std::string tfConfig;
    std::string task;
    std::string tokenFile;
    std::string cluster;            // coordinator: TF_CONFIG-style file of trainstudio-worker addresses
    std::string tlsCa;              // coordinator: verify the workers' TLS certificates with this CA
    double collectiveTimeout = 30;  // seconds before a silent transfer fails
    std::string partitioner;        // parameter-server: round-robin | by-size (empty: the config's)
    long long minShardBytes = 0;    // parameter-server with by-size (0: the config's)
};

struct BenchOptions {
    std::string models = "mlp,cnn";
    int threads = 2;
    int pairs = 3;
    int epochs = 2;
    std::string torchDir;
    std::string python = "/usr/bin/python3";
    bool noTorch = false;
    std::string strategy = "one-device";
    long long limit = 0;
    bool json = false;
    std::string suite = "train";  // train | pipeline | overhead | store | distributed (bench_suites.cpp)
    bool busy = false;            // train: also measure with one core taken by a busy process
    std::string precision = "float32";  // train: our policy; a mixed one is measured next to our float32 too
};
int runBenchSuite(const BenchOptions& o);

// trainstudio-cli runs list|show|compare|delete|export|rename|tag (runs_command.cpp).
struct RunsOptions {
    std::string action;                 // the sub-subcommand given
    std::string db;
    bool json = false;
    std::vector<std::string> runs;      // run ids, id prefixes or names
    std::string run;                    // the one run of show/export/rename/tag
    std::string status, name, tag, strategy, model;  // list filters
    int limit = 0;
    std::string metric = "loss";        // compare
    int buckets = 0;
    bool keepFiles = false;             // delete
    std::string csv, epochsCsv, trace, weights;  // export
    std::string newName;                // rename
    std::vector<std::string> addTags, removeTags;  // tag
};

// Records one `train` invocation into the run store (store/recording.h).
using TrainRecording = ts::store::RunRecording;
// Null when --no-record; an error when the database cannot be opened.
ts::Result<std::unique_ptr<TrainRecording>> openTrainRecording(const TrainOptions& o);

// trainstudio-cli trace summary FILE [--json] (trace_command.cpp).
struct TraceOptions {
    std::string file;
    bool json = false;
    int top = 10;
};
void addTraceCommand(CLI::App& app, TraceOptions& o);
int runTrace(const TraceOptions& o);

// trainstudio-cli cluster [FILE] ... (cluster_command.cpp): checks a TF_CONFIG cluster, exports
// each task's TF_CONFIG.
struct ClusterOptions {
    std::string file, strategy, task, outDir;
    bool json = false;
    bool probe = false;           // ask every task's trainstudio-worker whether it is ready
    std::string tokenFile, tlsCa;  // for --probe
};
void addClusterCommand(CLI::App& app, ClusterOptions& o);
int runCluster(const ClusterOptions& o);

void addTrainCommand(CLI::App& app, TrainOptions& o);
void addRunsCommand(CLI::App& app, RunsOptions& o);
int runRuns(const RunsOptions& o);
void addBenchCommand(CLI::App& app, BenchOptions& o);
int runTrain(const TrainOptions& o);
// train --cluster FILE (coordinator.cpp): pre-flight, start the tasks on the workers, merge their
// streams into one recorded run. `cfg` is the run built from the flags.
int runCoordinated(const TrainOptions& o, ts::RunConfig cfg, TrainRecording* recording);
// --trace: writes the trace file (also for a failed run: the timeline up to the failure is what
// one wants to see), says so unless --quiet/--json, and lists it with the recorded run.
// --trace FILE (and --trace-layers): the sink on `bus`, opened before any work so a bad path fails
// first; null without --trace.
ts::Result<std::unique_ptr<ts::telemetry::TraceFileSink>> openTraceFile(ts::telemetry::EventBus& bus, const TrainOptions& o);
void finishTraceFile(ts::telemetry::TraceFileSink& sink, const TrainOptions& o, TrainRecording* recording);
// After a completed run: "Recorded as run ..." (0), or an error when recording it had problems (1).
int recordedLine(const TrainRecording* recording, const TrainOptions& o);
int runValidate(const std::string& file, bool json);
int runBench(const BenchOptions& o);

// "error: ..." and "hint: ..." on stderr, with control characters and bytes that are not UTF-8
// escaped (messages quote file contents: a CSV header could hold terminal escape sequences).
void printError(const ts::Error& e);

// Blanks train's progress bar (stderr, on a terminal) so that a line printed next starts clean.
void clearProgressLine();
// `text` fitted to `width` terminal columns: cut at a character (not inside a UTF-8 sequence)
// with "..." when longer, padded with spaces when shorter. Wide characters (CJK, emoji) count
// two columns, combining marks none (glibc's wcwidth under C.UTF-8).
std::string column(const std::string& text, int width);

// The id of a run the store does not record (--no-record, the evaluator task): prefix-pid-time.
std::string unrecordedRunId(const std::string& prefix);

} // namespace tscli
