#pragma once
// The seed MLP evaluated here on Fashion-MNIST's test split, in batches of 1000 and in order, as
// the coordinator and an evaluator task evaluate a run's weights: the accuracy they report must
// equal this one.

#include <memory>
#include <string>

#include "common/result.h"
#include "data/dataset.h"
#include "model/spec.h"
#include "train/run_config.h"
#include "train/trainer.h"

namespace tstest {

inline const std::string kSeedMlpFile = std::string(TS_SOURCE_DIR) + "/resources/models/seed_mlp.json";

// A one-thread trainer of the seed MLP.
inline ts::Result<std::unique_ptr<ts::Trainer>> seedMlpTrainer()
{
    TS_ASSIGN(ts::ModelSpec model, ts::loadModelFile(kSeedMlpFile));
    ts::TrainConfig tc;
    tc.strategy.threads = 1;
    return ts::Trainer::create(model, tc);
}

// The seed MLP as a one-thread multi-worker-mirrored run (validating on the first
// `validationLimit` test examples; 0: all).
inline ts::RunConfig mirroredSeedMlpRun(int64_t validationLimit = 0)
{
    ts::RunConfig cfg;
    cfg.model = *ts::loadModelFile(kSeedMlpFile);
    cfg.strategy.kind = "multi-worker-mirrored";
    cfg.strategy.threads = 1;
    cfg.validationLimit = validationLimit;
    return cfg;
}

// `trainer`'s weights on the test split (`limit`: its first examples only; 0: all 10000).
inline ts::Result<ts::EvalResult> evaluateOnTestSplit(ts::Trainer& trainer, int64_t limit = 0)
{
    TS_ASSIGN(ts::IdxFolder data, ts::loadIdxFolder(ts::defaultFashionMnistDir(), true));
    ts::InMemoryBatchOptions bo;
    bo.batchSize = 1000;
    bo.shuffle = false;
    bo.limit = limit;
    TS_ASSIGN(auto test, ts::InMemoryBatchSource::create(data.test, bo));
    return trainer.evaluate(*test);
}

// A weights file (safetensors) of the seed MLP on the whole test split.
inline ts::Result<ts::EvalResult> evaluateWeightsFile(const std::string& weights)
{
    TS_ASSIGN(auto trainer, seedMlpTrainer());
    TS_TRY(trainer->loadWeights(weights));
    return evaluateOnTestSplit(*trainer);
}

} // namespace tstest
