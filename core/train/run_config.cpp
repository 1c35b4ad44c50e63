#include "train/run_config.h"

#include "distribute/agreement.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <limits>

#include <unistd.h>

#include "common/json_keys.h"
#include "data/auto_shard.h"
#include "distribute/communicator.h"
#include "optim/optimizer.h"

namespace ts {

nlohmann::json RunConfig::toJson() const
{
    nlohmann::json devices = nlohmann::json::array();
    for (const auto& d : strategy.devices) devices.push_back(d.toString());
    nlohmann::json j = {
        {"data", {{"source", "idx"}, {"dir", dataDir.empty() ? defaultFashionMnistDir() : dataDir}, {"limit", limit},
                  {"validation_limit", validationLimit}, {"shuffle", shuffle}, {"validate", validate}}},
        {"strategy", {{"type", strategy.kind}, {"devices", devices}, {"threads", strategy.threads}, {"backend", strategy.backend},
                      {"partition", strategy.partition.toJson()}}},
        {"epochs", epochs}, {"max_steps", maxSteps}, {"batch_size", batchSize}, {"seed", seed},
        {"optimizer", optimizer}, {"schedule", schedule}, {"loss", loss},
        {"load_weights", loadWeights}, {"save_weights", saveWeights}};
    if (!modelFile.empty()) j["model_file"] = modelFile;
    else j["model"] = modelToJson(model);
    if (pipeline) j["pipeline"] = pipeline->toJson();
    if (validationPipeline) j["validation_pipeline"] = validationPipeline->toJson();
    if (backup.enabled() || backup.restarts > 0)
        j["backup"] = {{"dir", backup.dir}, {"every_steps", backup.everySteps}, {"restarts", backup.restarts}};
    // Only when set, so that runs without it keep the configuration (and its hash) they always had.
    if (precision) j["precision"] = precision->toJson();
    return j;
}

namespace {

// The fingerprints hold the precision the run trains in (resolved by prepareRun from the
// configuration or the model), present only when mixed: "float32" given or left to a float32
// model is the same run, and backups made before the key existed stay resumable.
nlohmann::json withResolvedPrecision(nlohmann::json j, const StrategyConfig& strategy)
{
    j.erase("precision");
    if (strategy.precision.policy != PrecisionPolicy::Float32) j["precision"] = strategy.precision.toJson();
    return j;
}

} // namespace

nlohmann::json RunConfig::backupFingerprint() const
{
    nlohmann::json j = withResolvedPrecision(toJson(), strategy);
    for (const char* key : {"epochs", "max_steps", "save_weights", "backup"}) j.erase(key);
    // A pipeline without a seed of its own draws with the run's: written so, a backup made
    // before pipelines took the run's seed (its fingerprint said "seed": 0) still resumes.
    for (const char* key : {"pipeline", "validation_pipeline"})
        if (j.contains(key) && j[key].is_object() && !j[key].contains("seed")) j[key]["seed"] = seed;
    return j;
}

nlohmann::json RunConfig::clusterFingerprint() const
{
    nlohmann::json j = withResolvedPrecision(toJson(), strategy);
    for (const char* key : {"save_weights", "load_weights", "backup"}) j.erase(key);
    // Each task may keep its backup where it likes, but whether there are backups, how often, and
    // how many restarts must agree: a backup is a collective (the chief's state reaches everyone),
    // so a task without --backup-dir left the others waiting in it until the collective timeout.
    j["backup"] = {{"enabled", backup.enabled()}, {"every_steps", backup.enabled() ? backup.everySteps : 0},
                   {"restarts", backup.enabled() ? backup.restarts : 0}};
    j["data"].erase("dir");
    for (const char* key : {"devices", "threads", "backend"}) j["strategy"].erase(key);
    return j;
}

Result<RunConfig> RunConfig::fromJson(const nlohmann::json& j, const std::string& source, bool modelGiven)
{
    if (!j.is_object()) return makeError(ErrorCode::ParseError, source + ": a run configuration must be a JSON object");
    RunConfig c;
    c.source = source;
    TS_TRY(checkJsonKeys(j,
                         {"model_file", "model", "data", "strategy", "epochs", "max_steps", "batch_size", "seed", "optimizer",
                          "schedule", "loss", "load_weights", "save_weights", "pipeline", "validation_pipeline", "backup", "precision"},
                         source));
    // Types and ranges first, each naming its key: the library's own messages ("type_error.302")
    // name none, and a negative count used to fall back to the default silently.
    auto kindAt = [&](const nlohmann::json& obj, const std::string& at, const char* key, nlohmann::json::value_t want,
                      const char* what) -> Status {
        if (!obj.contains(key) || obj[key].is_null()) return okStatus();
        const auto& v = obj[key];
        const bool ok = want == nlohmann::json::value_t::number_integer ? v.is_number_integer() : v.type() == want;
        if (ok) return okStatus();
        return makeError(ErrorCode::ParseError, source + ": \"" + at + key + "\" must be " + what + ", not " + v.dump(),
                         std::string("write it as ") + what);
    };
    auto intIn = [&](const nlohmann::json& obj, const std::string& at, const char* key, int64_t lo, int64_t hi, bool minusOneIsDefault,
                     const char* hint) -> Status {
        TS_TRY(kindAt(obj, at, key, nlohmann::json::value_t::number_integer, "a whole number"));
        if (!obj.contains(key) || obj[key].is_null()) return okStatus();
        if (obj[key].is_number_unsigned() && obj[key].get<uint64_t>() > static_cast<uint64_t>(hi))
            return makeError(ErrorCode::InvalidArgument, source + ": \"" + at + key + "\" is " + obj[key].dump(), hint);
        const int64_t v = obj[key].get<int64_t>();
        if ((v < lo || v > hi) && !(minusOneIsDefault && v == -1))
            return makeError(ErrorCode::InvalidArgument, source + ": \"" + at + key + "\" is " + std::to_string(v), hint);
        return okStatus();
    };
    using T = nlohmann::json::value_t;
    constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
    for (const char* key : {"model_file", "loss", "load_weights", "save_weights"}) TS_TRY(kindAt(j, "", key, T::string, "a string"));
    for (const char* key : {"data", "strategy", "backup"}) TS_TRY(kindAt(j, "", key, T::object, "an object"));
    TS_TRY(intIn(j, "", "epochs", 1, 1000000, true, "use 1 or more epochs (or leave it out for the model's)"));
    TS_TRY(intIn(j, "", "max_steps", 0, kMax, false, "use 0 (no limit) or a step count"));
    TS_TRY(intIn(j, "", "batch_size", 1, int64_t{1} << 31, true, "use a global batch of 1 or more (or leave it out for the model's)"));
    TS_TRY(intIn(j, "", "seed", 0, kMax, false, "use a seed of 0 or more"));
    if (j.contains("data") && j["data"].is_object()) {
        const auto& d = j["data"];
        TS_TRY(checkJsonKeys(d, {"source", "dir", "limit", "validation_limit", "shuffle", "validate"}, source + ": data"));
        for (const char* key : {"source", "dir"}) TS_TRY(kindAt(d, "data.", key, T::string, "a string"));
        for (const char* key : {"shuffle", "validate"}) TS_TRY(kindAt(d, "data.", key, T::boolean, "true or false"));
        TS_TRY(intIn(d, "data.", "limit", 0, kMax, false, "use 0 (all examples) or a count"));
        TS_TRY(intIn(d, "data.", "validation_limit", 0, kMax, false, "use 0 (all examples) or a count"));
    }
    if (j.contains("strategy") && j["strategy"].is_object()) {
        const auto& st = j["strategy"];
        TS_TRY(checkJsonKeys(st, {"type", "devices", "threads", "backend", "partition"}, source + ": strategy"));
        for (const char* key : {"type", "backend"}) TS_TRY(kindAt(st, "strategy.", key, T::string, "a string"));
        TS_TRY(kindAt(st, "strategy.", "devices", T::array, "a list of device names like \"cpu:0\""));
        TS_TRY(intIn(st, "strategy.", "threads", 0, kMaxThreads, false, "use 0 (all cores) or a thread count up to 1024"));
        if (st.contains("type") && st["type"].is_string()) {
            const std::string t = st["type"].get<std::string>();
            if (t != "one-device" && t != "mirrored" && t != "multi-worker-mirrored" && t != "parameter-server")
                return makeError(ErrorCode::InvalidArgument, source + ": strategy.type '" + t + "' is not a strategy",
                                 "use one-device, mirrored, multi-worker-mirrored or parameter-server");
        }
        if (st.contains("devices") && st["devices"].is_array())
            for (const auto& d : st["devices"])
                if (!d.is_string())
                    return makeError(ErrorCode::ParseError, source + ": strategy.devices holds " + d.dump(), "write devices as strings like \"cpu:0\"");
    }
    try {
        if (j.contains("model_file")) c.modelFile = j["model_file"].get<std::string>();
        if (j.contains("model")) {
            TS_ASSIGN(c.model, modelFromJson(j["model"], source + ": model"));
        } else if (c.modelFile.empty() && !modelGiven) {
            return makeError(ErrorCode::InvalidArgument, source + ": no \"model\" or \"model_file\"",
                             "name the model file, e.g. \"model_file\": \"resources/models/seed_mlp.json\" (or give --model)");
        }
        if (j.contains("data")) {
            const auto& d = j["data"];
            const std::string kind = d.value("source", std::string("idx"));
            if (kind != "idx")
                return makeError(ErrorCode::Unsupported, source + ": data.source '" + kind + "' is not supported here",
                                 "use \"idx\" (a folder of MNIST-style IDX files)");
            c.dataDir = d.value("dir", std::string());
            c.limit = d.value("limit", int64_t{0});
            c.validationLimit = d.value("validation_limit", int64_t{0});
            c.shuffle = d.value("shuffle", true);
            c.validate = d.value("validate", true);
        }
        if (j.contains("strategy")) {
            const auto& s = j["strategy"];
            c.strategy.kind = s.value("type", std::string("one-device"));
            c.strategy.threads = s.value("threads", 0);
            c.strategy.backend = s.value("backend", std::string());
            for (const auto& d : s.value("devices", nlohmann::json::array())) {
                auto dev = Device::parse(d.get<std::string>());
                if (!dev.ok()) {
                    Error e = dev.takeError();
                    e.message = source + ": strategy.devices: " + e.message;
                    return e;
                }
                if (std::find(c.strategy.devices.begin(), c.strategy.devices.end(), *dev) != c.strategy.devices.end())
                    return makeError(ErrorCode::InvalidArgument, source + ": strategy.devices lists " + dev->toString() + " twice",
                                     "list each device once (a replica per device)");
                c.strategy.devices.push_back(*dev);
            }
            if (s.contains("partition")) {
                TS_ASSIGN(c.strategy.partition, PartitionOptions::fromJson(s["partition"], source + ": strategy.partition"));
            }
        }
        c.epochs = j.value("epochs", int64_t{-1});
        c.maxSteps = j.value("max_steps", int64_t{0});
        c.batchSize = j.value("batch_size", int64_t{-1});
        c.seed = j.value("seed", uint64_t{0});
        if (j.contains("precision") && !j["precision"].is_null()) {  // null: unset, the model's policy
            TS_ASSIGN(c.precision, PrecisionConfig::fromJson(j["precision"], source));
        }
        if (j.contains("optimizer")) {
            c.optimizer = j["optimizer"];
            // Checked here, so the error names this file (the trainer builds it much later).
            if (!c.optimizer.is_null())
                if (auto opt = Optimizer::create(c.optimizer); !opt.ok()) {
                    Error e = opt.takeError();
                    e.message = source + ": " + e.message;
                    return e;
                }
        }
        if (j.contains("schedule")) c.schedule = j["schedule"];
        c.loss = j.value("loss", std::string());
        c.loadWeights = j.value("load_weights", std::string());
        c.saveWeights = j.value("save_weights", std::string());
        if (j.contains("backup") && !j["backup"].is_null()) {
            const auto& b = j["backup"];
            TS_TRY(checkJsonKeys(b, {"dir", "every_steps", "restarts"}, source + ": backup"));
            c.backup.dir = b.value("dir", std::string());
            c.backup.everySteps = b.value("every_steps", int64_t{0});
            c.backup.restarts = b.value("restarts", 0);
            if (c.backup.everySteps < 0)
                return makeError(ErrorCode::InvalidArgument, source + ": backup.every_steps is " + std::to_string(c.backup.everySteps),
                                 "use a step count >= 1, or 0 to back up after each epoch");
            if (c.backup.restarts < 0 || c.backup.restarts > 100)
                return makeError(ErrorCode::InvalidArgument, source + ": backup.restarts is " + std::to_string(c.backup.restarts),
                                 "use 0 (no automatic restart) to 100");
        }
        if (j.contains("pipeline") && !j["pipeline"].is_null()) {
            TS_ASSIGN(PipelineSpec p, PipelineSpec::fromJson(j["pipeline"], source + ": pipeline"));
            c.pipeline = std::move(p);
        }
        if (j.contains("validation_pipeline") && !j["validation_pipeline"].is_null()) {
            TS_ASSIGN(PipelineSpec p, PipelineSpec::fromJson(j["validation_pipeline"], source + ": validation_pipeline"));
            c.validationPipeline = std::move(p);
        }
        // Two cache ops writing one file would each find the other's data there ("made by
        // another pipeline") after the first epoch: one file per cache.
        std::map<std::string, std::string> caches;  // file -> where
        for (const auto& [p, name] : {std::pair{&c.pipeline, "pipeline"}, std::pair{&c.validationPipeline, "validation_pipeline"}}) {
            if (!*p) continue;
            for (std::size_t i = 0; i < (*p)->ops.size(); ++i) {
                const TransformSpec& op = (*p)->ops[i];
                if (op.kind != TransformKind::Cache || op.cacheFile.empty()) continue;
                const std::string at = std::string(name) + ".transformations[" + std::to_string(i) + "]";
                std::error_code ec;
                const std::string key = std::filesystem::weakly_canonical(op.cacheFile, ec).string();
                const auto [it, fresh] = caches.emplace(ec ? op.cacheFile : key, at);
                if (!fresh)
                    return makeError(ErrorCode::InvalidArgument,
                                     source + ": " + at + " caches into '" + op.cacheFile + "', which " + it->second + " caches into too",
                                     "give each cache its own file (or leave \"filename\" out to cache in memory)");
            }
        }
    } catch (const nlohmann::json::exception& e) {
        return makeError(ErrorCode::ParseError, source + ": " + e.what());
    }
    return c;
}

namespace {

// The processes that train this run: multi-worker mirrored's ranks, parameter-server's
// workers, else 1.
int trainingProcesses(const StrategyConfig& s)
{
    return s.crossProcess ? s.crossProcess->size() : s.parameterStore ? s.numWorkers : 1;
}

struct InputShare {
    int workers = 1;
    int index = 0;
    bool lockstep = false;    // the processes train every step together (an empty part can join them)
    bool roundRobin = false;  // deal single elements (evaluation)
};

// A pipeline for training or validation: batch(batchSize) appended (before trailing prefetches)
// when it has none, built, and its first batch checked against the model.
// `stepLimited`: the run stops after max_steps, so an endless (repeat without a count) training
// pipeline is fine; Keras likewise refuses an infinite dataset without steps_per_epoch.
// `share.workers` > 1: this process is worker `share.index` of a multi-worker run, and builds its
// auto-sharded part of the pipeline (data/auto_shard.h); `spec` stays the run's whole pipeline.
Result<std::unique_ptr<Pipeline>> buildPipeline(PipelineSpec& spec, int64_t batchSize, const GraphAnalysis& analysis, LossKind loss,
                                                const Shape& inShape, const PipelineOptions& options, const std::string& what,
                                                bool stepLimited, InputShare share = {})
{
    if (spec.batchSize() == 0) {
        std::size_t at = spec.ops.size();
        while (at > 0 && spec.ops[at - 1].kind == TransformKind::Prefetch) --at;
        spec.ops.insert(spec.ops.begin() + static_cast<std::ptrdiff_t>(at), TransformSpec::batch(batchSize));
    }
    PipelineOptions po = options;
    po.featureShape = inShape;
    ShardedPipeline sharded;
    const PipelineSpec* built = &spec;
    if (share.workers > 1) {
        TS_ASSIGN(sharded, autoShardPipeline(spec, share.workers, share.index, what, share.roundRobin));
        if (sharded.policy != AutoShardPolicy::Off) {
            built = &sharded.spec;
            po.globalBatch = sharded.globalBatch;
        }
        po.note = what + ": " + sharded.description;
    }
    TS_ASSIGN(std::unique_ptr<Pipeline> p, Pipeline::create(*built, po));
    if (p->endless() && !stepLimited)
        return makeError(ErrorCode::InvalidArgument,
                         what + ": repeat() without a count makes it endless, so " +
                             (what.rfind("validation", 0) == 0 ? std::string("validation would never finish")
                                                               : std::string("the first epoch would never end")),
                         what.rfind("validation", 0) == 0
                             ? "give repeat a count (or drop it) in the validation pipeline"
                             : "give repeat a count, or stop the run after a number of steps with max_steps (--max-steps)");
    // Read the first batch now: a missing file, a wrong shape or out-of-range labels are reported
    // before any training, naming the pipeline.
    auto first = p->peek();
    if (!first.ok()) {
        Error e = first.takeError();
        // The whole pipeline may well have data while this task's part of it has none.
        if (built != &spec && e.code == ErrorCode::InvalidArgument && e.message == kNoBatchMessage) {
            if (share.lockstep) {
                // It joins the others' steps with empty batches; the tasks with data check it
                // against the model.
                p->setNote(po.note + "; this task's part is empty, so it joins the others' steps without data");
                return p;
            }
            e.message = "this task's part of the input is empty (" + sharded.description + ")";
            e.hint = "give the pipeline more data (or files) than there are workers, use fewer workers, or set auto_shard \"off\"";
        }
        e.message = what + ": " + e.message;
        return e;
    }
    if (analysis.outputNodes.size() == 1) {
        // The labels against the loss and the output (class ids were checked against the output
        // as batch() stacked them): refused here, before the run is recorded, not at step 1.
        const NodeInfo& out = analysis.nodes[static_cast<std::size_t>(analysis.outputNodes[0])];
        if (Status st = checkLossTargets(loss, out.outputShape, first->y); !st.ok()) {
            Error e = st.takeError();
            e.message = what + ": " + e.message + " (output node '" + out.id + "' produces " + out.outputShape.toString() + ")";
            if (first->y.dtype() == DType::F32) e.hint = "match one_hot's depth to the model's output, or " + e.hint;
            return e;
        }
    }
    return p;
}

// The test split in file order, in batches of at least 1000 (fewer with validation_limit).
Result<std::unique_ptr<InMemoryBatchSource>> validationSource(const InMemoryDataset& test, const RunConfig& cfg,
                                                              const Shape& inShape)
{
    InMemoryBatchOptions vo;
    vo.batchSize = std::min<int64_t>(std::max<int64_t>(cfg.batchSize, 1000), test.size());
    vo.shuffle = false;
    vo.limit = cfg.validationLimit;
    vo.featureShape = inShape;
    if (cfg.validationLimit > 0) vo.batchSize = std::min(vo.batchSize, cfg.validationLimit);
    return InMemoryBatchSource::create(test, vo);
}

std::string idxFile(const std::string& dir, const std::string& base)
{
    std::error_code ec;
    const std::filesystem::path gz = std::filesystem::path(dir) / (base + ".gz");
    return std::filesystem::is_regular_file(gz, ec) ? gz.string() : (std::filesystem::path(dir) / base).string();
}

// The run's own settings beside a pipeline apply to it, as flags override a configuration's
// fields: an explicit batch size replaces the batch op's, a limit takes the first N elements of
// the source (after a leading interleave), shuffle off drops the shuffles.
void applyRunSettings(PipelineSpec& spec, int64_t explicitBatch, int64_t limit, bool shuffle)
{
    // Random transformations keep the seeds their positions gave them before ops move (a limit
    // or --no-shuffle must not reseed the augmentation).
    if (limit > 0 || !shuffle)
        for (std::size_t i = 0; i < spec.ops.size(); ++i) {
            TransformSpec& op = spec.ops[i];
            if (!op.seed && (op.kind == TransformKind::Shuffle || (op.kind == TransformKind::Map && op.fn.random)))
                op.seed = spec.derivedSeed(i);
        }
    for (TransformSpec& op : spec.ops)
        if (op.kind == TransformKind::Batch && explicitBatch > 0) op.batchSize = explicitBatch;
    if (limit > 0) {
        const bool interleaved = !spec.ops.empty() && spec.ops.front().kind == TransformKind::Interleave;
        spec.ops.insert(spec.ops.begin() + (interleaved ? 1 : 0), TransformSpec::take(limit));
    }
    if (!shuffle)
        std::erase_if(spec.ops, [](const TransformSpec& op) { return op.kind == TransformKind::Shuffle; });
}

Status preparePipelines(PreparedRun& run, const GraphAnalysis& analysis, const LossSpec& loss, const Shape& inShape,
                        const PipelineOptions& modelOptions, int64_t explicitBatch)
{
    RunConfig& cfg = run.config;
    PipelineSpec& spec = *cfg.pipeline;
    // A pipeline without a seed of its own takes the run's (--seed), as tf.data's ops take the
    // global seed; written into the recorded pipeline, so a rerun of it draws the same.
    for (PipelineSpec* p : {&spec, cfg.validationPipeline ? &*cfg.validationPipeline : nullptr})
        if (p && !p->seedGiven) {
            p->seed = cfg.seed;
            p->seedGiven = true;
        }
    applyRunSettings(spec, explicitBatch, cfg.limit, cfg.shuffle);
    if (cfg.validationPipeline) applyRunSettings(*cfg.validationPipeline, 0, cfg.validationLimit, true);
    // Folded into the pipelines, which the run records: a rerun of the recorded configuration
    // must not apply them twice.
    cfg.limit = 0;
    cfg.shuffle = true;
    if (cfg.validationPipeline) cfg.validationLimit = 0;
    if (spec.batchSize() > 0) cfg.batchSize = spec.batchSize();
    TS_TRY(checkModelFitsLabels(analysis, loss, 0, "the input pipeline"));
    // A loss that reads class ids: batch() checks each one against the output as it stacks them.
    PipelineOptions options = modelOptions;
    if (loss.kind == LossKind::SparseCategoricalCrossentropy && analysis.outputNodes.size() == 1) {
        const NodeInfo& out = analysis.nodes[static_cast<std::size_t>(analysis.outputNodes[0])];
        if (out.outputShape.rank() == 1) options.classCount = out.outputShape[0];
    }
    // Multi-worker and parameter-server processes each read their part of the data. Validation
    // is shared only where the processes sum it in lockstep (multi-worker mirrored).
    const int processes = trainingProcesses(cfg.strategy);
    if (processes > 1 && (cfg.strategy.processRank < 0 || cfg.strategy.processRank >= processes))
        return makeError(ErrorCode::InvalidArgument, "worker " + std::to_string(cfg.strategy.processRank) + " is not in the cluster's 0.." +
                                                         std::to_string(processes - 1));
    const bool lockstep = cfg.strategy.crossProcess != nullptr;
    const InputShare share{processes, cfg.strategy.processRank, lockstep};
    TS_ASSIGN(run.pipeline, buildPipeline(spec, cfg.batchSize, analysis, loss.kind, inShape, options, "training pipeline", cfg.maxSteps > 0, share));
    if (cfg.validationPipeline) {
        PipelineOptions vo = options;
        vo.lane.thread = "validation input";
        TS_ASSIGN(run.validationPipeline, buildPipeline(*cfg.validationPipeline, std::max<int64_t>(cfg.batchSize, 1000),
                                                        analysis, loss.kind, inShape, vo, "validation pipeline", false,
                                                        lockstep ? InputShare{processes, cfg.strategy.processRank, true, true} : InputShare{}));
    } else if (cfg.validate && spec.source.kind == SourceKind::Idx && spec.source.paths.empty()) {
        // The idx folder's test split, scaled to [0, 1] like normalise's default.
        const std::string& dir = spec.source.dir;
        TS_ASSIGN(InMemoryDataset test, loadIdxDataset(idxFile(dir, "t10k-images-idx3-ubyte"),
                                                       idxFile(dir, "t10k-labels-idx1-ubyte"), /*flatten=*/true));
        auto data = std::make_shared<IdxFolder>();
        data->test = std::move(test);
        run.data = std::move(data);
        TS_ASSIGN(run.validation, validationSource(run.data->test, cfg, inShape));
    }
    return okStatus();
}

} // namespace

// Instead of an allocation failure deep in initialisation that blames the batch size.
Status checkModelFitsMemory(const GraphAnalysis& analysis, const std::string& what)
{
    const long pages = sysconf(_SC_PHYS_PAGES), pageSize = sysconf(_SC_PAGE_SIZE);
    if (pages <= 0 || pageSize <= 0) return okStatus();
    const double memory = static_cast<double>(pages) * static_cast<double>(pageSize);
    const double needed = static_cast<double>(analysis.totalParams) * 2 * sizeof(float);
    if (needed <= memory) return okStatus();
    const NodeInfo* largest = nullptr;
    for (const auto& n : analysis.nodes)
        if (!largest || n.paramCount > largest->paramCount) largest = &n;
    auto gib = [](double b) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.1f GiB", b / (1024.0 * 1024 * 1024));
        return std::string(buf);
    };
    return makeError(ErrorCode::OutOfMemory,
                     what + ": " + std::to_string(analysis.totalParams) + " parameters need " + gib(needed) +
                         " for their float32 weights and gradients, more than this machine's " + gib(memory) + " of memory (node '" +
                         largest->id + "' holds " + std::to_string(largest->paramCount) + " of them)",
                     "make node '" + largest->id + "' smaller (its units, filters or kernel size), or train on a machine with more memory");
}

Result<PreparedRun> prepareRun(const RunConfig& cfgIn, const PipelineOptions& pipelineOptions)
{
    PreparedRun run;
    run.config = cfgIn;
    RunConfig& cfg = run.config;
    if (!cfg.modelFile.empty()) {
        auto model = loadModelFile(cfg.modelFile);
        if (!model.ok()) {
            // Named in a configuration: say which (a relative path there is read from the current
            // folder, not the configuration's).
            Error e = model.takeError();
            if (e.code == ErrorCode::NotFound && !cfg.source.empty()) e.message = cfg.source + ": model_file " + e.message;
            return e;
        }
        run.model = std::move(model).value();
    } else {
        run.model = cfg.model;
    }
    if (cfg.epochs < 0) cfg.epochs = run.model.compile.epochs;
    if (cfg.batchSize < 0) cfg.batchSize = run.model.compile.batchSize;
    if (cfg.batchSize < 1)
        return makeError(ErrorCode::InvalidArgument, "batch size must be >= 1, got " + std::to_string(cfg.batchSize),
                         "pass --batch-size N with N >= 1");
    if (cfg.epochs < 1)
        return makeError(ErrorCode::InvalidArgument, "epochs must be >= 1, got " + std::to_string(cfg.epochs),
                         "pass --epochs N with N >= 1");
    if (cfg.optimizer.is_null()) cfg.optimizer = run.model.compile.optimizer;
    if (cfg.precision) cfg.strategy.precision = *cfg.precision;
    else cfg.strategy.precision.policy = run.model.compile.precision;

    // The model first: its problems are cheaper to report than a data load.
    const GraphAnalysis analysis = analyzeModel(run.model);
    TS_TRY(problemsToStatus(analysis, cfg.modelFile.empty() ? run.model.name : cfg.modelFile));
    if (analysis.inputNodes.size() != 1)
        return makeError(ErrorCode::Unsupported, "the model needs exactly one Input node");
    TS_TRY(checkModelFitsMemory(analysis, cfg.modelFile.empty() ? "model '" + run.model.name + "'" : cfg.modelFile));
    const Shape inShape = analysis.nodes[static_cast<std::size_t>(analysis.inputNodes[0])].outputShape;
    if (cfg.strategy.crossProcess) {
        // Before any data loads or weights move: every process must run the same settings, or
        // the run fails far from the cause (a broadcast of the wrong size) or, with only the
        // learning rate different, finishes with weights no single configuration gives.
        RunConfig fp = cfg;
        fp.modelFile.clear();
        fp.model = run.model;
        if (fp.loss.empty()) fp.loss = run.model.compile.loss;
        TS_TRY(agreeOnSettings(*cfg.strategy.crossProcess, cfg.strategy.processRank, cfg.strategy.processNames, fp.clusterFingerprint()));
    }

    TrainConfig tc;
    tc.epochs = cfg.epochs;
    tc.maxSteps = cfg.maxSteps;
    tc.seed = cfg.seed;
    tc.optimizer = cfg.optimizer;
    tc.schedule = cfg.schedule;
    tc.loss = cfg.loss;
    tc.strategy = cfg.strategy;
    tc.backup = cfg.backup;
    if (cfg.backup.enabled()) tc.backupFingerprint = cfg.backupFingerprint();
    TS_ASSIGN(LossSpec loss, parseLoss(cfg.loss.empty() ? run.model.compile.loss : cfg.loss, run.model.compile.fromLogits));
    if (cfg.pipeline) {
        TS_TRY(preparePipelines(run, analysis, loss, inShape, pipelineOptions, cfgIn.batchSize));
    } else {
        const std::string dir = cfg.dataDir.empty() ? defaultFashionMnistDir() : cfg.dataDir;
        TS_ASSIGN(IdxFolder folder, loadIdxFolder(dir, /*flatten=*/true, /*testRequired=*/cfg.validate));
        run.data = std::make_shared<IdxFolder>(std::move(folder));
        const int64_t perExample = run.data->train.x.shape().product(1, run.data->train.x.shape().rank());
        if (perExample != inShape.numel())
            return makeError(ErrorCode::ShapeMismatch,
                             "the data in " + dir + " has " + std::to_string(perExample) +
                                 " values per example but the model's Input expects " + inShape.toString(),
                             "set the Input shape to (" + std::to_string(perExample) + ") or (28, 28, 1) for images");

        TS_TRY(checkModelFitsLabels(analysis, loss, run.data->train.numClasses, dir));

        InMemoryBatchOptions to;
        to.batchSize = cfg.batchSize;
        to.shuffle = cfg.shuffle;
        to.seed = cfg.seed;
        to.limit = cfg.limit;
        to.featureShape = inShape;
        // Multi-worker and parameter-server processes gather only the rows they train on.
        const int64_t processes = trainingProcesses(cfg.strategy);
        if (processes > 1 && processes <= cfg.batchSize) {
            to.shardIndex = cfg.strategy.processRank;
            to.shardCount = processes;
        }
        auto trainSrc = InMemoryBatchSource::create(run.data->train, to);
        if (!trainSrc.ok()) {
            Error e = trainSrc.takeError();
            e.message = "training data (" + dir + "): " + e.message;
            return e;
        }
        run.train = std::move(trainSrc).value();
        if (cfg.validate) {
            TS_ASSIGN(run.validation, validationSource(run.data->test, cfg, inShape));
            if (cfg.strategy.crossProcess && processes > 1) {
                // Validation is summed across the processes too: each evaluates its rows.
                InMemoryBatchOptions vo = run.validation->options();
                if (processes <= vo.batchSize) {
                    vo.shardIndex = cfg.strategy.processRank;
                    vo.shardCount = processes;
                    TS_ASSIGN(run.validation, InMemoryBatchSource::create(run.data->test, vo));
                }
            }
        }
    }
    if (cfg.strategy.kind == "mirrored" && !cfg.strategy.devices.empty() &&
        cfg.batchSize < static_cast<int64_t>(cfg.strategy.devices.size()))
        return makeError(ErrorCode::InvalidArgument,
                         "global batch " + std::to_string(cfg.batchSize) + " is smaller than the " +
                             std::to_string(cfg.strategy.devices.size()) + " replicas",
                         "use a batch size of at least one example per replica");

    TS_ASSIGN(run.trainer, Trainer::create(run.model, tc));
    TS_TRY(run.trainer->initialise());
    if (!cfg.loadWeights.empty()) TS_TRY(run.trainer->loadWeights(cfg.loadWeights));
    return run;
}

} // namespace ts
