#pragma once
// RunConfig: the one JSON document that describes a run (model, data, strategy and devices,
// hyper-parameters, seed). The studio edits it, the CLI builds it from flags, the store
// snapshots it. prepareRun() turns it into a ready Trainer and its data sources.
//
// {"model_file": "resources/models/seed_mlp.json",        // or "model": {...spec...}
//  "data": {"source": "idx", "dir": "/usr/share/datasets/fashion-mnist", "limit": 0,
//           "validation_limit": 0, "shuffle": true, "validate": true},
//  "strategy": {"type": "mirrored", "devices": ["cpu:0", "cpu:1"], "threads": 0, "backend": "",
//               "partition": {"policy": "round-robin", "min_shard_bytes": 262144}},  // parameter-server
//  "epochs": 10, "max_steps": 0, "batch_size": 256, "seed": 0,
//  "optimizer": {"type": "adam", "learning_rate": 0.001},   // null: the model's compile settings
//  "schedule": null, "loss": "", "load_weights": "", "save_weights": "",
//  "backup": {"dir": "", "every_steps": 0, "restarts": 0},  // optional: train/backup.h
//  "precision": "mixed_bfloat16",     // optional: Keras' policy (optim/precision.h); the model's by default
//  "pipeline": {...},                 // optional: a tf.data-style input pipeline (data/pipeline_config.h)
//  "validation_pipeline": {...}}      // optional: its validation counterpart
//
// With "pipeline", training batches come from that pipeline instead of "data" (which then only
// names the default validation set: the idx test split when the pipeline reads an idx folder).
// A pipeline without a batch transformation gets batch(batch_size) appended; one with a batch
// sets the run's batch size.

#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "data/dataset.h"
#include "data/pipeline.h"
#include "train/trainer.h"

namespace ts {

struct RunConfig {
    std::string source;           // the configuration file it was read from (messages); empty: flags only
    std::string modelFile;
    ModelSpec model;              // used when modelFile is empty
    std::string dataDir;          // empty: the default Fashion-MNIST folder
    int64_t limit = 0;            // training examples used (0 = all)
    int64_t validationLimit = 0;  // validation examples used (0 = all)
    bool shuffle = true;
    bool validate = true;
    int64_t epochs = -1;          // -1: the model's compile setting
    int64_t maxSteps = 0;
    int64_t batchSize = -1;       // global; -1: the model's compile setting
    uint64_t seed = 0;
    nlohmann::json optimizer;     // null: the model's
    nlohmann::json schedule;
    std::string loss;
    StrategyConfig strategy;      // its precision is set by prepareRun from `precision` below
    // "precision": Keras' policy and loss scaling; unset: the model's compile precision
    // (float32 unless the model was built under a mixed policy).
    std::optional<PrecisionConfig> precision;
    std::string loadWeights, saveWeights;
    BackupConfig backup;          // "backup": resume from / write backups in backup.dir
    std::optional<PipelineSpec> pipeline;            // "pipeline": training input
    std::optional<PipelineSpec> validationPipeline;  // "validation_pipeline"

    nlohmann::json toJson() const;
    // The settings a backup must have been made with to be resumed by this run: everything that
    // shapes the training trajectory (not epochs, max_steps, save_weights or the backup itself).
    // Both fingerprints expect prepareRun's resolved strategy.precision.
    nlohmann::json backupFingerprint() const;
    // The settings every process of a multi-worker run must share (agreeOnSettings): what
    // shapes the trajectory and how long it runs; not what may differ between machines (data
    // folder, weight files, backups, devices, threads, backend: the chief's initial weights
    // reach every worker anyway, and replica counts are agreed on separately).
    nlohmann::json clusterFingerprint() const;
    // `modelGiven`: the caller supplies the model (trainstudio-cli's --model), so the document
    // may name none.
    static Result<RunConfig> fromJson(const nlohmann::json& j, const std::string& source, bool modelGiven = false);
};

struct PreparedRun {
    RunConfig config;             // with defaults resolved (epochs, batch size, optimizer)
    ModelSpec model;
    std::unique_ptr<Trainer> trainer;
    std::shared_ptr<IdxFolder> data;
    std::unique_ptr<InMemoryBatchSource> train;
    std::unique_ptr<InMemoryBatchSource> validation;  // null if validate is off
    // With a "pipeline" section: the training pipeline (then `train` is null, and `data` holds at
    // most the idx test split used for validation) and the validation pipeline (if
    // "validation_pipeline" is given; else `validation` serves the idx test split, if any).
    std::unique_ptr<Pipeline> pipeline;
    std::unique_ptr<Pipeline> validationPipeline;

    // What to hand to Trainer::fit: the pipeline if there is one, else the in-memory sources.
    BatchSource* trainSource() { return pipeline ? static_cast<BatchSource*>(pipeline.get()) : train.get(); }
    BatchSource* validationSource()
    {
        return validationPipeline ? static_cast<BatchSource*>(validationPipeline.get()) : validation.get();
    }
};

// Loads the model and data, checks that they fit, builds the strategy and initialises (or
// loads) the weights. Every error names the file/node/flag to fix.
// `pipelineOptions` (bus, run id, lane) go to the pipelines; their featureShape is set to the
// model's input shape.
Result<PreparedRun> prepareRun(const RunConfig& config, const PipelineOptions& pipelineOptions = {});

// OutOfMemory when the model's float32 weights and gradients alone exceed this machine's memory,
// naming the node that holds most of them (prepareRun checks it; `validate` reports it).
// `what` names the model in the message ("model 'm'" or its file).
Status checkModelFitsMemory(const GraphAnalysis& analysis, const std::string& what);

} // namespace ts
