#include "remote/run_evaluator.h"

#include <algorithm>
#include <filesystem>
#include <vector>

#include "data/dataset.h"
#include "io/safetensors.h"
#include "remote/ps_client.h"
#include "train/run_config.h"

namespace ts::remote {

RunEvaluator::~RunEvaluator() = default;

Result<std::unique_ptr<RunEvaluator>> RunEvaluator::create(const RunConfig& cfg, const ClusterSpec& spec, const RunEvaluatorOptions& options)
{
    std::unique_ptr<RunEvaluator> e(new RunEvaluator());
    e->m_config = std::make_unique<RunConfig>(cfg);
    TrainConfig tc;
    tc.optimizer = cfg.optimizer;
    tc.loss = cfg.loss;
    tc.strategy.kind = "one-device";
    tc.strategy.threads = cfg.strategy.threads;
    tc.strategy.backend = cfg.strategy.backend;
    ModelSpec model = cfg.model;
    if (!cfg.modelFile.empty()) {
        TS_ASSIGN(model, loadModelFile(cfg.modelFile));
    }
    TS_ASSIGN(e->m_trainer, Trainer::create(model, tc));
    PsClientOptions po;
    po.spec = spec;
    po.runId = options.runId;
    po.token = options.token;
    po.tls = options.tls;
    po.worker = options.who;
    po.partition = cfg.strategy.partition;
    if (options.pullFromPs) {
        TS_ASSIGN(e->m_store, RemoteParameterStore::connect(po));
    }
    if (options.loadValidation) TS_TRY(e->loadValidation());
    return e;
}

std::string RunEvaluator::nothingToEvaluate(const RunConfig& cfg)
{
    // A parameter-server run's evaluator evaluates whenever it validates (its workers never do).
    if (isParameterServer(cfg.strategy.kind)) return cfg.validate ? std::string() : "the run does not validate";
    // A "validation_pipeline" validates whatever "validate" says; a pipeline not over an idx
    // folder validates only on one.
    if (cfg.validationPipeline) return "the run validates on its \"validation_pipeline\", which its training tasks read";
    if (!cfg.validate || (cfg.pipeline && cfg.pipeline->source.kind != SourceKind::Idx)) return "the run does not validate";
    return {};
}

Status RunEvaluator::loadValidation()
{
    const RunConfig& cfg = *m_config;
    if (!cfg.validate || m_validation) return okStatus();
    std::string dir = cfg.dataDir.empty() ? defaultFashionMnistDir() : cfg.dataDir;
    if (cfg.pipeline && cfg.pipeline->source.kind == SourceKind::Idx && !cfg.pipeline->source.dir.empty()) dir = cfg.pipeline->source.dir;
    auto file = [&](const std::string& base) {
        std::error_code ec;
        const std::filesystem::path gz = std::filesystem::path(dir) / (base + ".gz");
        return std::filesystem::is_regular_file(gz, ec) ? gz.string() : (std::filesystem::path(dir) / base).string();
    };
    TS_ASSIGN(InMemoryDataset test, loadIdxDataset(file("t10k-images-idx3-ubyte"), file("t10k-labels-idx1-ubyte"), /*flatten=*/true));
    m_test = std::make_shared<InMemoryDataset>(std::move(test));
    const GraphAnalysis& g = m_trainer->graph();
    InMemoryBatchOptions vo;
    vo.limit = cfg.validationLimit;
    // Batches of up to 1000, never more than the (limited) test set holds.
    const int64_t examples = vo.limit > 0 ? std::min<int64_t>(vo.limit, m_test->size()) : m_test->size();
    vo.batchSize = std::max<int64_t>(1, std::min<int64_t>(1000, examples));
    vo.shuffle = false;
    vo.featureShape = g.nodes[static_cast<std::size_t>(g.inputNodes.at(0))].outputShape;
    TS_ASSIGN(m_validation, InMemoryBatchSource::create(*m_test, vo));
    return okStatus();
}

Status RunEvaluator::pullWeights()
{
    if (!m_store)
        return makeError(ErrorCode::Internal, "this evaluator has no ps tasks to pull from (a multi-worker-mirrored run's)",
                         "send it the weights to evaluate");
    if (!m_begun) {
        TS_TRY(m_store->begin(trainableStoreVariables(m_trainer->strategy().primary().params()), false, nullptr));
        m_begun = true;
    } else {
        TS_TRY(m_store->pull());
    }
    return okStatus();
}

Status RunEvaluator::checkValidates() const
{
    if (!m_validation)
        return makeError(ErrorCode::InvalidArgument, "this run does not validate (or its test split was not loaded)",
                         "set \"validate\": true in the run configuration");
    return okStatus();
}

Result<EvalResult> RunEvaluator::evaluate()
{
    TS_TRY(checkValidates());
    TS_TRY(pullWeights());
    return m_trainer->evaluate(*m_validation);
}

Result<EvalResult> RunEvaluator::evaluate(const SafetensorsFile& weights, const std::string& source)
{
    TS_TRY(checkValidates());
    TS_TRY(m_trainer->strategy().importParameters(weights.inOrder(), source));
    return m_trainer->evaluate(*m_validation);
}

Result<EvalResult> RunEvaluator::evaluateEncoded(std::string_view weights, const std::string& source)
{
    TS_ASSIGN(SafetensorsFile decoded, decodeSafetensors(weights, source));
    return evaluate(decoded, source);
}

} // namespace ts::remote
