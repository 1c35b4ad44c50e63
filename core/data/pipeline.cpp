#include "data/pipeline.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <filesystem>
#include <numeric>

#include "data/stages.h"
#include "data/transforms.h"
#include "store/hash.h"
#include "telemetry/bus.h"

namespace ts {

using namespace pipeline_detail;

namespace {

double nowSeconds() { return static_cast<double>(nowNs()) * 1e-9; }

int64_t wallTimeUs()
{
    return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// What a cache at ops[index] holds depends on: the source (and its files' sizes and times), the
// transformations before it (their settings, not their parallelism) and the seed of random maps.
uint64_t cacheFingerprint(const PipelineSpec& spec, std::size_t index)
{
    nlohmann::json j = spec.toJson();
    nlohmann::json before = nlohmann::json::array();
    for (std::size_t k = 0; k < index && k < j["transformations"].size(); ++k) {
        nlohmann::json op = j["transformations"][k];
        op.erase("num_parallel_calls");
        op.erase("deterministic");
        before.push_back(std::move(op));
    }
    // The files' sizes and times; a folder (idx, image_folder) by its path only: its own time
    // changes whenever anything is written into it, the cache file itself included.
    nlohmann::json files = nlohmann::json::array();
    for (const auto& path : spec.source.paths) {
        std::error_code sizeError, timeError;
        const auto size = std::filesystem::file_size(path, sizeError);
        const auto time = std::filesystem::last_write_time(path, timeError).time_since_epoch().count();
        files.push_back({path, sizeError ? 0 : size, timeError ? 0 : time});
    }
    // The seed matters only if something random comes first (a shuffle, a random map).
    bool random = false;
    for (std::size_t k = 0; k < index && k < spec.ops.size(); ++k)
        random = random || spec.ops[k].kind == TransformKind::Shuffle || (spec.ops[k].kind == TransformKind::Map && spec.ops[k].fn.random);
    const std::string text =
        nlohmann::json{{"source", j["source"]}, {"files", files}, {"before", before}, {"seed", random ? spec.seed : 0}}.dump();
    return store::fnv1a64(text);
}

} // namespace

Pipeline::~Pipeline()
{
    stopNextChain();
    stopChain();
}

Result<std::unique_ptr<Pipeline>> Pipeline::create(const PipelineSpec& spec, const PipelineOptions& options)
{
    TS_TRY(spec.validate("pipeline"));
    std::unique_ptr<Pipeline> p(new Pipeline);
    p->m_spec = spec;
    p->m_options = options;
    p->m_shared = std::make_shared<Shared>();
    p->m_shared->seed = spec.seed;
    p->m_shared->deterministic = spec.deterministic;
    p->m_shared->skipBad = spec.skipBadRecords;
    p->m_shared->classCount = options.classCount;
    const int cpu = spec.autotune.cpuBudget > 0 ? spec.autotune.cpuBudget : defaultCpuBudget();
    const int64_t ram = spec.autotune.ramBudgetBytes > 0 ? spec.autotune.ramBudgetBytes : defaultRamBudget();

    const TransformSpec* interleave = !spec.ops.empty() && spec.ops[0].kind == TransformKind::Interleave ? &spec.ops[0] : nullptr;
    TS_ASSIGN(std::unique_ptr<Stage> source, makeSourceStage(spec.source, interleave, cpu));
    p->m_stages.push_back(std::move(source));
    auto link = [&](std::unique_ptr<Stage> s) {
        s->input = p->m_stages.back().get();
        p->m_stages.push_back(std::move(s));
    };
    // Seeds of shuffles and random maps without their own: derived from the pipeline's seed and
    // the transformation's position, so editing one transformation does not reseed the others.
    auto seedOf = [&](const TransformSpec& op, std::size_t index) { return op.seed ? *op.seed : spec.derivedSeed(index); };

    bool userDecodes = false;
    for (const auto& op : spec.ops)
        if (op.kind == TransformKind::Map && op.fn.builtin && op.fn.name == "decode_image") userDecodes = true;
    if (spec.source.kind == SourceKind::ImageFolder && !userDecodes) {
        // Image folders list files; decoding is a parallel map right after the source, unless the
        // transformations place decode_image themselves (e.g. after shard, to decode only a shard).
        const TransformSpec decode = TransformSpec::map(decodeImageFn(spec.source.height, spec.source.width, spec.source.channels), kAutotune);
        link(makeMapStage(decode, 0, spec.deterministic, cpu));
    }
    // Rewrite (as tf.data's static optimisations do): a pure element-wise built-in map directly
    // before a shuffle runs after it instead. The shuffle's permutation does not depend on the
    // values, so the elements and their order are the same, but the shuffle buffer then holds
    // the source's small records (often views into one array) instead of freshly converted
    // float copies scattered over the heap: 2.4x faster for normalise -> shuffle(10000) on
    // Fashion-MNIST. Not with skip_bad_records, where dropping before or after the buffer differs.
    std::vector<std::size_t> order(spec.ops.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    auto pureElementwise = [](const TransformSpec& op) {
        static const char* const kPure[] = {"normalise", "cast", "one_hot", "reshape"};
        return op.kind == TransformKind::Map && op.fn.builtin && !op.fn.random &&
               std::any_of(std::begin(kPure), std::end(kPure), [&](const char* n) { return op.fn.name == n; });
    };
    // Likewise normalise and cast directly before a batch run on the whole batch (tf.data's
    // map vectorisation): one vectorised pass over B examples instead of B allocations, and the
    // batch copies the source's bytes (u8 images: a quarter of the float bytes).
    // Not a cast of the labels when batch() checks class ids: it would see them still as floats
    // and let an out-of-range id through to the loss's "batch row N".
    auto batchable = [&](const TransformSpec& op) {
        const bool labelCast = op.fn.name == "cast" && op.fn.params.is_object() && op.fn.params.value("target", "x") == "y";
        return pureElementwise(op) && (op.fn.name == "normalise" || (op.fn.name == "cast" && !(labelCast && options.classCount > 0)));
    };
    if (!spec.skipBadRecords)
        for (bool moved = true; moved;) {
            moved = false;
            for (std::size_t k = 0; k + 1 < order.size(); ++k) {
                const TransformSpec& a = spec.ops[order[k]];
                const TransformSpec& b = spec.ops[order[k + 1]];
                if ((pureElementwise(a) && b.kind == TransformKind::Shuffle) || (batchable(a) && b.kind == TransformKind::Batch)) {
                    std::swap(order[k], order[k + 1]);
                    moved = true;
                }
            }
        }
    for (std::size_t k = 0; k < order.size(); ++k) {
        const std::size_t i = order[k];
        const TransformSpec& op = spec.ops[i];
        // Map fusion (tf.data's map_fusion): consecutive maps with the same parallelism run as one
        // stage, each element through all of them on one thread, instead of a thread hand-off per
        // map. Each function keeps its own seed, so random augmentation is unchanged.
        std::size_t run = k + 1;
        while (op.kind == TransformKind::Map && run < order.size() && spec.ops[order[run]].kind == TransformKind::Map &&
               spec.ops[order[run]].parallelism == op.parallelism && spec.ops[order[run]].deterministic == op.deterministic)
            ++run;
        if (run - k > 1) {
            std::vector<std::pair<MapFn, uint64_t>> parts;
            TransformSpec fused = op;
            fused.fn.name.clear();
            fused.fn.builtin = false;
            fused.fn.params = nullptr;
            for (std::size_t j = k; j < run; ++j) {
                const TransformSpec& m = spec.ops[order[j]];
                parts.emplace_back(m.fn.fn, seedOf(m, order[j]));
                fused.fn.name += (j > k ? " + " : "") + m.fn.name;
                fused.fn.random = fused.fn.random || m.fn.random;
            }
            fused.fn.fn = [parts = std::move(parts)](Element&& e, const MapContext& mc) -> Result<Element> {
                Element cur = std::move(e);
                for (const auto& [fn, seed] : parts) {
                    MapContext c = mc;
                    c.seed = seed;
                    TS_ASSIGN(cur, fn(std::move(cur), c));
                }
                return cur;
            };
            link(makeMapStage(fused, 0, spec.deterministic, cpu));
            k = run - 1;
            continue;
        }
        switch (op.kind) {
        case TransformKind::Interleave: break;  // part of the source stage
        case TransformKind::Map: link(makeMapStage(op, seedOf(op, i), spec.deterministic, cpu)); break;
        case TransformKind::Shuffle: link(makeShuffleStage(op, seedOf(op, i))); break;
        case TransformKind::Batch:
            link(makeBatchStage(op));
            if (!p->m_hasBatch) p->m_batchDropsRemainder = op.dropRemainder;
            p->m_hasBatch = true;
            break;
        case TransformKind::Prefetch: link(makePrefetchStage(op)); break;
        case TransformKind::Cache: link(makeCacheStage(op, cacheFingerprint(spec, i))); break;
        case TransformKind::Repeat: link(makeRepeatStage(op)); break;
        case TransformKind::Take: link(makeTakeStage(op)); break;
        case TransformKind::Skip: link(makeSkipStage(op)); break;
        case TransformKind::Shard: link(makeShardStage(op)); break;
        }
    }
    bool tunable = false;
    for (const auto& s : p->m_stages) tunable = tunable || s->parallelism.autotuned || s->buffer.autotuned;
    if (spec.autotune.enabled && tunable) p->m_tuner = std::make_unique<Autotuner>(cpu, ram);
    p->m_windowStart = p->snapshot();
    p->m_tuneStart = p->m_windowStart;
    return p;
}

void Pipeline::stopChain()
{
    std::shared_ptr<ChainControl> chain;
    std::unique_ptr<Iterator> root;
    {
        std::lock_guard<std::mutex> lock(m_chainMutex);
        chain = std::move(m_chain);
        root = std::move(m_root);
    }
    if (chain) chain->requestStop();
    root.reset();  // joins every worker thread of the chain (they all see the stop)
}

void Pipeline::stopNextChain()
{
    std::shared_ptr<ChainControl> chain;
    std::unique_ptr<Iterator> root;
    {
        std::lock_guard<std::mutex> lock(m_chainMutex);
        chain = std::move(m_nextChain);
        root = std::move(m_nextRoot);
        m_nextEpoch = -1;
    }
    if (chain) chain->requestStop();
    root.reset();
}

std::pair<std::shared_ptr<ChainControl>, Result<std::unique_ptr<Iterator>>> Pipeline::buildChain(int64_t epoch)
{
    auto chain = std::make_shared<ChainControl>();
    IterContext ctx;
    ctx.epoch = epoch;
    ctx.iteration = static_cast<uint64_t>(epoch);
    ctx.chain = chain.get();
    ctx.shared = m_shared.get();
    auto root = m_stages.back()->makeIterator(ctx);
    if (!root.ok()) chain->requestStop();
    return {chain, std::move(root)};
}

void Pipeline::warmNextEpoch()
{
    // Not with cache(): its files and memory are completed when this epoch's chain goes away, and
    // the next epoch must read them rather than the source.
    for (const auto& op : m_spec.ops)
        if (op.kind == TransformKind::Cache) return;
    // Nor with skip_bad_records: records the next epoch would drop must not be counted (and
    // reported) for an epoch that may never run.
    if (m_spec.skipBadRecords) return;
    if (m_cancelled.load()) return;
    {
        std::lock_guard<std::mutex> lock(m_chainMutex);
        if (m_nextRoot && m_nextEpoch == m_epoch + 1) return;
    }
    stopNextChain();
    auto built = buildChain(m_epoch + 1);
    if (!built.second.ok()) return;  // startEpoch() builds it again and reports the error
    std::lock_guard<std::mutex> lock(m_chainMutex);
    m_nextChain = std::move(built.first);
    m_nextRoot = std::move(built.second).value();
    m_nextEpoch = m_epoch + 1;
    if (m_cancelled.load()) m_nextChain->requestStop();
}

Status Pipeline::startEpoch(int64_t epoch)
{
    if (m_cancelled.load()) return makeError(ErrorCode::Cancelled, "the input pipeline was cancelled");
    stopChain();
    std::shared_ptr<ChainControl> chain;
    std::unique_ptr<Iterator> root;
    {
        std::lock_guard<std::mutex> lock(m_chainMutex);
        if (m_nextRoot && m_nextEpoch == epoch) {  // warmed up at the end of the last epoch
            chain = std::move(m_nextChain);
            root = std::move(m_nextRoot);
            m_nextEpoch = -1;
        }
    }
    if (!root) {
        stopNextChain();  // built for another epoch
        auto built = buildChain(epoch);
        if (!built.second.ok()) return built.second.takeError();
        chain = std::move(built.first);
        root = std::move(built.second).value();
    }
    {
        std::lock_guard<std::mutex> lock(m_chainMutex);
        m_chain = chain;
        m_root = std::move(root);
        if (m_cancelled.load()) m_chain->requestStop();  // cancel() ran while we built the chain
    }
    m_epoch = epoch;
    m_started = true;
    m_failed.reset();
    m_openStart = -1;  // a step never spans two epochs (validation runs in between)
    if (!m_notePublished && m_options.bus && !m_options.note.empty()) {
        m_notePublished = true;
        telemetry::LogEvent e;
        e.stamp.runId = m_options.runId;
        e.stamp.step = m_options.stepOffset;
        e.stamp.wallTimeUs = wallTimeUs();
        e.stamp.lane = m_options.lane;
        e.message = m_options.note;
        m_options.bus->publish(telemetry::Event(std::move(e)));
    }
    return okStatus();
}

Result<std::optional<Element>> Pipeline::pull()
{
    if (m_cancelled.load()) return makeError(ErrorCode::Cancelled, "the input pipeline was cancelled");
    if (!m_started) TS_TRY(startEpoch(0));
    if (m_failed) return *m_failed;
    if (!m_root)
        return makeError(ErrorCode::InvalidArgument, "the input pipeline has no epoch to serve: startEpoch() failed",
                         "fix the error startEpoch() returned, then start the epoch again");
    const double start = nowSeconds();
    if (m_openStart >= 0) {
        {
            std::lock_guard<std::mutex> lock(m_statsMutex);
            ++m_steps;
            m_waitTotal += m_openWait;
            m_stepTotal += start - m_openStart;
        }
        m_openStart = -1;
        if (m_steps - m_windowStart.steps >= m_spec.windowSteps) closeWindow();
        maybeTune();
    }
    Next r = m_root->next();
    const double end = nowSeconds();
    if (!r.ok()) {
        if (m_cancelled.load()) return makeError(ErrorCode::Cancelled, "the input pipeline was cancelled");
        m_failed = r.error();
        return r.takeError();
    }
    if (!r->has_value()) {
        warmNextEpoch();
        return std::optional<Element>();
    }
    {
        std::lock_guard<std::mutex> lock(m_statsMutex);
        ++m_served;
        m_lastStep = StepRecord{m_served, end - start};
    }
    m_openStart = start;
    m_openWait = end - start;
    return r;
}

Result<std::optional<Element>> Pipeline::nextElement() { return pull(); }

namespace {

Result<Batch> toBatch(Element&& e, const Shape& featureShape)
{
    if (!e.x.defined())
        return makeError(ErrorCode::InvalidArgument, "the pipeline produced a batch without features",
                         "image_folder sources need map decode_image before batch");
    if (e.x.dtype() != DType::F32)
        return makeError(ErrorCode::InvalidArgument,
                         std::string("the pipeline's batches hold ") + dtypeName(e.x.dtype()) + " features " +
                             e.x.shape().toString() + "; training needs f32",
                         "add {\"op\": \"map\", \"fn\": \"normalise\"} (u8 pixels to [0, 1]) or {\"op\": \"map\", \"fn\": "
                         "\"cast\", \"dtype\": \"f32\"} before batch");
    if (e.x.shape().rank() < 2)
        return makeError(ErrorCode::InvalidArgument,
                         "the pipeline's elements " + e.x.shape().toString() + " are not batches",
                         "add {\"op\": \"batch\", \"size\": 256}");
    const int64_t b = e.x.shape()[0];
    if (!e.y.defined())
        return makeError(ErrorCode::InvalidArgument, "the pipeline's batches have no labels",
                         "give the source a label array / column");
    if (e.y.dtype() == DType::I32 && e.y.shape().rank() == 2 && e.y.shape()[1] == 1) e.y = e.y.reshaped(Shape{b});
    const bool ids = e.y.dtype() == DType::I32 && e.y.shape().rank() == 1;
    const bool rows = e.y.dtype() == DType::F32 && e.y.shape().rank() == 2;
    if (!ids && !rows)
        return makeError(ErrorCode::InvalidArgument,
                         std::string("the pipeline's labels are ") + dtypeName(e.y.dtype()) + " " + e.y.shape().toString() +
                             "; training takes i32 class ids (B) or f32 rows (B, C)",
                         "use one_hot for f32 targets, or cast labels to i32 class ids");
    if (featureShape.rank() > 0) {
        if (e.x.numel() != b * featureShape.numel())
            return makeError(ErrorCode::ShapeMismatch,
                             "the pipeline's batch x has shape " + e.x.shape().toString() + " but the model's input is " +
                                 featureShape.toString(),
                             "resize or reshape the elements (map reshape / decode_image size) to the model's Input shape");
        std::vector<int64_t> dims{b};
        dims.insert(dims.end(), featureShape.dims().begin(), featureShape.dims().end());
        e.x = e.x.reshaped(Shape(dims));
    }
    return Batch{std::move(e.x), std::move(e.y)};
}

} // namespace

Result<std::optional<Batch>> Pipeline::next()
{
    if (!m_hasBatch)
        return makeError(ErrorCode::InvalidArgument, "the input pipeline has no batch transformation",
                         "add {\"op\": \"batch\", \"size\": 256} (nextElement() serves single elements)");
    TS_ASSIGN(std::optional<Element> e, pull());
    if (!e) return std::optional<Batch>();
    auto b = toBatch(std::move(*e), m_options.featureShape);
    if (!b.ok()) {
        m_failed = b.error();
        return b.takeError();
    }
    if (m_options.globalBatch > 0) {
        b->localShard = true;
        b->globalRows = m_options.globalBatch;
        b->dropRemainder = m_batchDropsRemainder;
    }
    return std::optional<Batch>(std::move(b).value());
}

Result<Batch> Pipeline::peek()
{
    if (!m_hasBatch)
        return makeError(ErrorCode::InvalidArgument, "the input pipeline has no batch transformation",
                         "add {\"op\": \"batch\", \"size\": 256}");
    // Peeking must not count: remember the counters and take the peek's share back out (bad
    // records too: the epoch reads them again, and they were counted twice).
    const int64_t badBefore = m_shared->badCount.load();
    std::size_t badMessagesBefore = 0;
    {
        std::lock_guard lock(m_shared->badMutex);
        badMessagesBefore = m_shared->badMessages.size();
    }
    std::vector<std::array<int64_t, 5>> before;
    for (const auto& s : m_stages)
        before.push_back({s->counters.produced.load(), s->counters.busyNs.load(), s->counters.blockedNs.load(),
                          s->counters.bytes.load(), s->counters.skipped.load()});
    auto chain = std::make_shared<ChainControl>();
    IterContext ctx;
    ctx.chain = chain.get();
    ctx.shared = m_shared.get();
    Next r = [&]() -> Next {
        TS_ASSIGN(IteratorPtr root, m_stages.back()->makeIterator(ctx));
        Next first = root->next();
        chain->requestStop();
        return first;
    }();
    chain->requestStop();
    for (std::size_t i = 0; i < m_stages.size(); ++i) {
        Counters& c = m_stages[i]->counters;
        c.produced -= c.produced.load() - before[i][0];
        c.busyNs -= c.busyNs.load() - before[i][1];
        c.blockedNs -= c.blockedNs.load() - before[i][2];
        c.bytes -= c.bytes.load() - before[i][3];
        c.skipped -= c.skipped.load() - before[i][4];
    }
    m_shared->badCount.store(badBefore);
    {
        std::lock_guard lock(m_shared->badMutex);
        m_shared->badMessages.resize(badMessagesBefore);
    }
    if (!r.ok()) return r.takeError();
    if (!r->has_value()) {
        // The message stays kNoBatchMessage (prepareRun tells an empty shard by it); the hint
        // names what was read.
        std::string files;
        for (const auto& p : m_spec.source.paths) files += (files.empty() ? "'" : ", '") + p + "'";
        if (files.empty() && !m_spec.source.dir.empty()) files = "'" + m_spec.source.dir + "'";
        return makeError(ErrorCode::InvalidArgument, kNoBatchMessage,
                         (files.empty() ? std::string("its source") : files) +
                             " gave no element to batch: check that it holds rows (a CSV file of a header only, an empty array) and "
                             "that the take/skip/shard counts leave some");
    }
    return toBatch(std::move(**r), m_options.featureShape);
}

Batch Pipeline::emptyShard() const
{
    Batch e;
    if (m_options.globalBatch <= 0) return e;
    e.localShard = true;
    e.globalRows = m_options.globalBatch;
    e.dropRemainder = m_batchDropsRemainder;
    return e;
}

int64_t Pipeline::batchesPerEpoch() const
{
    const int64_t n = m_stages.back()->cardinality();
    return n >= 0 ? n : -1;
}

bool Pipeline::endless() const { return m_stages.back()->cardinality() == kInfiniteCardinality; }

int64_t Pipeline::examplesPerEpoch() const
{
    for (auto it = m_stages.rbegin(); it != m_stages.rend(); ++it)
        if ((*it)->kind == "batch") {
            const int64_t n = (*it)->input->cardinality();
            return n >= 0 ? n : -1;
        }
    const int64_t n = m_stages.back()->cardinality();
    return n >= 0 ? n : -1;
}

void Pipeline::cancel()
{
    m_cancelled.store(true);
    std::lock_guard<std::mutex> lock(m_chainMutex);
    if (m_chain) m_chain->requestStop();
    if (m_nextChain) m_nextChain->requestStop();
}

PipelineSnapshot Pipeline::snapshot() const
{
    PipelineSnapshot s;
    s.timeSeconds = nowSeconds();
    {
        std::lock_guard<std::mutex> lock(m_statsMutex);
        s.steps = m_steps;
        s.waitSeconds = m_waitTotal;
        s.stepSeconds = m_stepTotal;
    }
    s.stages.reserve(m_stages.size());
    for (const auto& st : m_stages) {
        const Counters& c = st->counters;
        StageStats x;
        x.name = st->name;
        x.kind = st->kind;
        x.async = st->async;
        x.produced = c.produced.load(std::memory_order_relaxed);
        x.busySeconds = static_cast<double>(c.busyNs.load(std::memory_order_relaxed)) * 1e-9;
        x.blockedSeconds = static_cast<double>(c.blockedNs.load(std::memory_order_relaxed)) * 1e-9;
        x.skipped = c.skipped.load(std::memory_order_relaxed);
        x.bytesProduced = c.bytes.load(std::memory_order_relaxed);
        x.queueDepth = c.queueDepth.load(std::memory_order_relaxed);
        x.queueCapacity = st->buffer.present ? st->buffer.get() : c.queueCapacity.load(std::memory_order_relaxed);
        x.parallelism = st->parallelism.present ? static_cast<int>(st->parallelism.get()) : c.parallelism.load();
        s.stages.push_back(std::move(x));
    }
    return s;
}

std::optional<PipelineWindow> Pipeline::lastWindow() const
{
    std::lock_guard<std::mutex> lock(m_statsMutex);
    return m_lastWindow;
}

PipelineWindow Pipeline::windowSince(const PipelineSnapshot& since) const { return analyseWindow(since, snapshot()); }

StepRecord Pipeline::lastStep() const
{
    std::lock_guard<std::mutex> lock(m_statsMutex);
    return m_lastStep;
}

void Pipeline::closeWindow()
{
    const PipelineSnapshot now = snapshot();
    PipelineWindow w = analyseWindow(m_windowStart, now);
    m_windowStart = now;
    if (m_options.bus) {
        telemetry::Stamp stamp;
        stamp.runId = m_options.runId;
        stamp.step = w.lastStep + m_options.stepOffset;
        stamp.wallTimeUs = wallTimeUs();
        stamp.lane = m_options.lane;
        for (auto& e : pipelineSampleEvents(w, stamp)) m_options.bus->publish(telemetry::Event(std::move(e)));
        if (auto f = inputBoundFinding(w, stamp)) m_options.bus->publish(telemetry::Event(std::move(*f)));
    }
    std::lock_guard<std::mutex> lock(m_statsMutex);
    m_lastWindow = std::move(w);
}

void Pipeline::maybeTune()
{
    if (!m_tuner) return;
    const double now = nowSeconds();
    if (now - m_tuneStart.timeSeconds < m_spec.autotune.intervalSeconds) return;
    PipelineSnapshot snap = snapshot();
    if (snap.steps <= m_tuneStart.steps) return;
    std::vector<TuningKnob> knobs;
    std::vector<Knob*> targets;
    for (std::size_t i = 0; i < m_stages.size(); ++i) {
        Stage& s = *m_stages[i];
        if (s.parallelism.autotuned) {
            knobs.push_back({static_cast<int>(i), TuningKnob::Kind::Parallelism, s.parallelism.get(), 1, s.parallelism.maxValue});
            targets.push_back(&s.parallelism);
        }
        if (s.buffer.autotuned) {
            knobs.push_back({static_cast<int>(i), TuningKnob::Kind::BufferSize, s.buffer.get(), 1, s.buffer.maxValue});
            targets.push_back(&s.buffer);
        }
    }
    const std::vector<int64_t> values = m_tuner->tune(m_tuneStart, snap, knobs);
    bool changed = false;
    for (std::size_t i = 0; i < values.size(); ++i)
        if (values[i] != knobs[i].value) {
            targets[i]->value.store(values[i]);
            changed = true;
        }
    m_tuneStart = std::move(snap);
    if (changed) {
        std::lock_guard<std::mutex> lock(m_chainMutex);
        if (m_chain) m_chain->wakeAll();  // parked workers and full buffers re-check their limits
    }
}

std::vector<KnobState> Pipeline::knobs() const
{
    std::vector<KnobState> out;
    for (const auto& s : m_stages) {
        if (s->parallelism.present) out.push_back({s->name, "parallelism", s->parallelism.get(), s->parallelism.autotuned});
        if (s->buffer.present) out.push_back({s->name, "buffer_size", s->buffer.get(), s->buffer.autotuned});
    }
    return out;
}

std::vector<std::string> Pipeline::stageNames() const
{
    std::vector<std::string> out;
    for (const auto& s : m_stages) out.push_back(s->name);
    return out;
}

int64_t Pipeline::badRecords() const { return m_shared->badCount.load(); }

std::vector<std::string> Pipeline::badRecordMessages() const
{
    std::lock_guard<std::mutex> lock(m_shared->badMutex);
    return m_shared->badMessages;
}

} // namespace ts
