// Transformation stages: map (sequential; parallel in stages_async.cpp), shuffle, batch,
// prefetch, cache (memory and file), repeat, take, skip, shard.

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <unistd.h>

#include "data/stages.h"

namespace ts::pipeline_detail {

namespace {

namespace fs = std::filesystem;

int64_t inputCardinality(const Stage& s) { return s.input ? s.input->cardinality() : kUnknownCardinality; }

// Prefixes a map function's error with the stage and, when missing, the element's position.
Error mapError(Error e, const std::string& stage, const Element& meta)
{
    const std::string where = meta.where();
    if (e.message.find(where) == std::string::npos) e.message = where + ": " + e.message;
    e.message = stage + ": " + e.message;
    return e;
}

Element metaOf(const Element& e)
{
    Element m;
    m.key = e.key;
    m.origin = e.origin;
    m.labelOrigin = e.labelOrigin;
    m.position = e.position;
    return m;
}

// ---------------------------------------------------------------------------------------------

class SyncMapIterator final : public Iterator {
public:
    SyncMapIterator(IteratorPtr input, Stage& stage, MapFunction fn, MapContext mc, const IterContext& ctx)
        : m_input(std::move(input)), m_stage(stage), m_fn(std::move(fn)), m_mc(mc), m_ctx(ctx)
    {
    }
    Next next() override
    {
        for (;;) {
            Next r = m_input->next();
            if (!r.ok() || !r->has_value()) return r;
            const Element meta = metaOf(**r);
            const int64_t t0 = nowNs();
            Result<Element> out = m_fn.fn(std::move(**r), m_mc);
            m_stage.counters.addBusy(nowNs() - t0);
            if (!out.ok()) {
                Error e = mapError(out.takeError(), m_stage.name, meta);
                if (m_ctx.shared->skipBad && isRecordError(e)) {
                    m_ctx.shared->recordBad(e);
                    m_stage.counters.skipped.fetch_add(1, std::memory_order_relaxed);
                    continue;
                }
                return e;
            }
            m_stage.counters.countProduced(*out);
            return std::optional<Element>(std::move(out).value());
        }
    }

private:
    IteratorPtr m_input;
    Stage& m_stage;
    MapFunction m_fn;
    MapContext m_mc;
    IterContext m_ctx;
};

class MapStage final : public Stage {
public:
    MapStage(const TransformSpec& op, uint64_t seed, bool deterministic, int cpuBudget)
        : Stage(op.label(), "map", op.parallelism == kAutotune || op.parallelism > 1), m_fn(op.fn), m_seed(seed),
          m_deterministic(op.deterministic.value_or(deterministic))
    {
        if (async) {
            parallelism.present = true;
            parallelism.autotuned = op.parallelism == kAutotune;
            parallelism.maxValue = parallelism.autotuned ? std::max(1, cpuBudget) : op.parallelism;
            // AUTOTUNE starts with every core of the budget and gives back what the consumer does not need.
            parallelism.value = parallelism.maxValue;
            counters.parallelism = static_cast<int>(parallelism.value.load());
            if (parallelism.autotuned) name = "map(" + m_fn.name + ", AUTOTUNE)";
            else name = "map(" + m_fn.name + ", " + std::to_string(op.parallelism) + ")";
        }
    }
    Result<IteratorPtr> makeIterator(const IterContext& ctx) override
    {
        TS_ASSIGN(IteratorPtr in, input->makeIterator(ctx));
        const MapContext mc{m_seed, static_cast<int64_t>(ctx.iteration)};
        if (async)
            return makeParallelMapIterator(std::move(in), ctx, *this, m_fn, mc, m_deterministic,
                                           static_cast<int>(parallelism.maxValue));
        return IteratorPtr(new SyncMapIterator(std::move(in), *this, m_fn, mc, ctx));
    }
    int64_t cardinality() const override { return inputCardinality(*this); }

private:
    MapFunction m_fn;
    uint64_t m_seed;
    bool m_deterministic;
};

// ---------------------------------------------------------------------------------------------

class ShuffleIterator final : public Iterator {
public:
    ShuffleIterator(IteratorPtr input, Stage& stage, int64_t bufferSize, uint64_t seed, const IterContext& ctx)
        : m_input(std::move(input)), m_stage(stage), m_size(bufferSize), m_rng(seed), m_ctx(ctx)
    {
    }
    Next next() override
    {
        const int64_t t0 = nowNs();
        int64_t inNs = 0;
        if (m_buffer.empty()) m_buffer.reserve(static_cast<std::size_t>(std::min<int64_t>(m_size, 1 << 20)));
        while (!m_inputDone && static_cast<int64_t>(m_buffer.size()) < m_size) {
            if (m_ctx.chain->stopped()) return cancelledError();
            Next r = timedNext(*m_input, inNs);
            if (!r.ok()) {
                m_stage.counters.addBusy(nowNs() - t0 - inNs);
                return r;
            }
            if (!r->has_value()) {
                m_inputDone = true;
                m_input.reset();  // stops its threads now, not at the end of the epoch
                break;
            }
            m_buffer.push_back(std::move(**r));
        }
        if (m_buffer.empty()) return std::optional<Element>();
        const std::size_t j = static_cast<std::size_t>(m_rng.below(m_buffer.size()));
        Element out = std::move(m_buffer[j]);
        if (j + 1 != m_buffer.size()) m_buffer[j] = std::move(m_buffer.back());
        m_buffer.pop_back();
        m_stage.counters.addBusy(nowNs() - t0 - inNs);
        m_stage.counters.countProduced(out);
        return std::optional<Element>(std::move(out));
    }

private:
    IteratorPtr m_input;
    Stage& m_stage;
    int64_t m_size;
    SplitMix m_rng;
    IterContext m_ctx;
    std::vector<Element> m_buffer;
    bool m_inputDone = false;
};

class ShuffleStage final : public Stage {
public:
    ShuffleStage(const TransformSpec& op, uint64_t seed)
        : Stage(op.label(), "shuffle", false), m_size(op.bufferSize), m_seed(seed), m_reshuffle(op.reshuffleEachIteration)
    {
    }
    Result<IteratorPtr> makeIterator(const IterContext& ctx) override
    {
        TS_ASSIGN(IteratorPtr in, input->makeIterator(ctx));
        // reshuffle_each_iteration: a new order per epoch (and per repetition); otherwise the same.
        const uint64_t seed = mixSeed(mixSeed(m_seed) ^ (m_reshuffle ? ctx.iteration + 1 : 0));
        return IteratorPtr(new ShuffleIterator(std::move(in), *this, m_size, seed, ctx));
    }
    int64_t cardinality() const override { return inputCardinality(*this); }

private:
    int64_t m_size;
    uint64_t m_seed;
    bool m_reshuffle;
};

// ---------------------------------------------------------------------------------------------

// A class id the model has no output for, checked as batch() takes each element, while the
// element still knows its record (the loss would only name "batch row 26 of step 8"); under
// skip_bad_records the element is dropped there like any bad record, and the batch stays full.
std::optional<Error> classIdError(const Element& e, const std::string& stage, int64_t classCount)
{
    if (classCount <= 0 || !e.y.defined() || e.y.dtype() != DType::I32 || e.y.numel() != 1) return std::nullopt;
    const int32_t id = e.y.data<int32_t>()[0];
    if (id >= 0 && id < classCount) return std::nullopt;
    return makeError(ErrorCode::InvalidArgument,
                     stage + ": " + e.labelWhere() + ": label " + std::to_string(id) + " is not one of the model's " + std::to_string(classCount) +
                         " class ids (0.." + std::to_string(classCount - 1) + ")",
                     id < 0 ? "class ids start at 0: map the classes to 0.." + std::to_string(classCount - 1) + " in the data"
                            : "fix the label there, or give the last layer one unit per class (at least " + std::to_string(int64_t(id) + 1) +
                                  ")");
}

// Stacks elements of equal shapes and dtypes along a new first dimension.
Result<Element> stack(std::vector<Element>& items, const std::string& stage)
{
    const Element& first = items.front();
    const int64_t b = static_cast<int64_t>(items.size());
    auto check = [&](const Tensor Element::*field, const char* what) -> Status {
        const Tensor& t0 = first.*field;
        for (std::size_t i = 1; i < items.size(); ++i) {
            const Tensor& t = items[i].*field;
            if (t.defined() != t0.defined())
                return makeError(ErrorCode::ShapeMismatch,
                                 stage + ": " + items[i].where() + " has " + (t.defined() ? "" : "no ") + what + " but " +
                                     first.where() + " has " + (t0.defined() ? "" : "none"));
            if (!t.defined()) continue;
            if (t.dtype() != t0.dtype() || !(t.shape() == t0.shape()))
                return makeError(ErrorCode::ShapeMismatch,
                                 stage + ": cannot batch " + items[i].where() + " (" + what + " " + dtypeName(t.dtype()) + " " +
                                     t.shape().toString() + ") with " + first.where() + " (" + dtypeName(t0.dtype()) + " " +
                                     t0.shape().toString() + ")",
                                 "elements of a batch need one shape: resize, crop or pad them first (decode_image "
                                 "resizes, random_crop cuts a fixed size)");
        }
        return okStatus();
    };
    TS_TRY(check(&Element::x, "features"));
    TS_TRY(check(&Element::y, "label"));
    if (!first.x.defined())
        return makeError(ErrorCode::InvalidArgument, stage + ": " + first.where() + " has no features",
                         "image_folder elements need map decode_image before batch");
    auto stackField = [&](const Tensor Element::*field) -> Result<Tensor> {
        const Tensor& t0 = first.*field;
        if (!t0.defined()) return Tensor();
        std::vector<int64_t> dims{b};
        dims.insert(dims.end(), t0.shape().dims().begin(), t0.shape().dims().end());
        TS_ASSIGN(Tensor out, Tensor::create(Shape(dims), t0.dtype()));
        const std::size_t row = t0.bytes();
        auto* dst = static_cast<uint8_t*>(out.raw());
        for (std::size_t i = 0; i < items.size(); ++i) std::memcpy(dst + i * row, (items[i].*field).raw(), row);
        return out;
    };
    Element out;
    TS_ASSIGN(out.x, stackField(&Element::x));
    TS_ASSIGN(out.y, stackField(&Element::y));
    out.key = first.key;
    out.origin = first.origin;
    out.labelOrigin = first.labelOrigin;
    out.position = first.position;
    return out;
}

class BatchIterator final : public Iterator {
public:
    BatchIterator(IteratorPtr input, Stage& stage, int64_t size, bool dropRemainder, const IterContext& ctx)
        : m_input(std::move(input)), m_stage(stage), m_size(size), m_drop(dropRemainder), m_ctx(ctx)
    {
    }
    Next next() override
    {
        if (m_done) return std::optional<Element>();
        const int64_t t0 = nowNs();
        int64_t inNs = 0;
        m_items.clear();
        while (static_cast<int64_t>(m_items.size()) < m_size) {
            if (m_ctx.chain->stopped()) return cancelledError();
            Next r = timedNext(*m_input, inNs);
            if (!r.ok()) return r;
            if (!r->has_value()) {
                m_done = true;
                m_input.reset();
                break;
            }
            if (auto bad = classIdError(**r, m_stage.name, m_ctx.shared ? m_ctx.shared->classCount : 0)) {
                if (m_ctx.shared->skipBad) {
                    m_ctx.shared->recordBad(*bad);
                    m_stage.counters.skipped.fetch_add(1, std::memory_order_relaxed);
                    continue;
                }
                return *std::move(bad);
            }
            m_items.push_back(std::move(**r));
        }
        if (m_items.empty() || (m_drop && static_cast<int64_t>(m_items.size()) < m_size)) {
            m_items.clear();
            return std::optional<Element>();
        }
        Result<Element> out = stack(m_items, m_stage.name);
        m_items.clear();
        m_stage.counters.addBusy(nowNs() - t0 - inNs);
        if (!out.ok()) return out.takeError();
        m_stage.counters.countProduced(*out);
        return std::optional<Element>(std::move(out).value());
    }

private:
    IteratorPtr m_input;
    Stage& m_stage;
    int64_t m_size;
    bool m_drop;
    IterContext m_ctx;
    std::vector<Element> m_items;
    bool m_done = false;
};

class BatchStage final : public Stage {
public:
    explicit BatchStage(const TransformSpec& op) : Stage(op.label(), "batch", false), m_size(op.batchSize), m_drop(op.dropRemainder) {}
    Result<IteratorPtr> makeIterator(const IterContext& ctx) override
    {
        TS_ASSIGN(IteratorPtr in, input->makeIterator(ctx));
        return IteratorPtr(new BatchIterator(std::move(in), *this, m_size, m_drop, ctx));
    }
    int64_t cardinality() const override
    {
        const int64_t n = inputCardinality(*this);
        if (n < 0) return n;
        return m_drop ? n / m_size : (n + m_size - 1) / m_size;
    }

private:
    int64_t m_size;
    bool m_drop;
};

// ---------------------------------------------------------------------------------------------

class PrefetchStage final : public Stage {
public:
    explicit PrefetchStage(const TransformSpec& op) : Stage(op.label(), "prefetch", true)
    {
        buffer.present = true;
        buffer.autotuned = op.bufferSize == kAutotune;
        // AUTOTUNE starts small and doubles while the consumer still waits (autotune.h).
        buffer.value = buffer.autotuned ? 2 : op.bufferSize;
        buffer.maxValue = buffer.autotuned ? 64 : op.bufferSize;
        counters.queueCapacity = buffer.value.load();
    }
    Result<IteratorPtr> makeIterator(const IterContext& ctx) override
    {
        TS_ASSIGN(IteratorPtr in, input->makeIterator(ctx));
        return makePrefetchIterator(std::move(in), ctx, &counters, &buffer, 0, true);
    }
    int64_t cardinality() const override { return inputCardinality(*this); }
};

// ---------------------------------------------------------------------------------------------
// cache(): the first complete pass is recorded (memory, or a file written under a temporary name
// and renamed when complete); later passes replay it without building the input at all. A pass
// abandoned midway leaves nothing behind, like tf.data.

// Version 1: the magic, then records. Version 2: the magic, a fingerprint of the pipeline up to
// the cache (8 bytes), then records: a cache made from other data or transformations is refused
// instead of replayed (it trained on the old 2000 rows, or failed with a shape error).
constexpr char kCacheMagicV1[8] = {'T', 'S', 'C', 'A', 'C', 'H', 'E', '1'};
constexpr char kCacheMagic[8] = {'T', 'S', 'C', 'A', 'C', 'H', 'E', '2'};

class CacheStage;

class RecordingIterator final : public Iterator {
public:
    RecordingIterator(IteratorPtr input, CacheStage& stage, std::FILE* file, std::string tmpPath)
        : m_input(std::move(input)), m_stage(stage), m_file(file), m_tmp(std::move(tmpPath))
    {
    }
    ~RecordingIterator() override;
    Next next() override;

private:
    Status writeElement(const Element& e);

    IteratorPtr m_input;
    CacheStage& m_stage;
    std::FILE* m_file;  // null: memory
    std::string m_tmp;
    std::vector<Element> m_memory;
    int64_t m_count = 0;
    bool m_finished = false;
};

class ReplayIterator final : public Iterator {
public:
    ReplayIterator(std::shared_ptr<const std::vector<Element>> items, Stage& stage, const IterContext& ctx)
        : m_items(std::move(items)), m_stage(stage), m_ctx(ctx)
    {
    }
    Next next() override
    {
        if (m_ctx.chain->stopped()) return cancelledError();
        if (m_i >= m_items->size()) return std::optional<Element>();
        Element e = (*m_items)[m_i++];
        m_stage.counters.countProduced(e);
        return std::optional<Element>(std::move(e));
    }

private:
    std::shared_ptr<const std::vector<Element>> m_items;
    Stage& m_stage;
    IterContext m_ctx;
    std::size_t m_i = 0;
};

class FileReplayIterator final : public Iterator {
public:
    FileReplayIterator(std::string path, Stage& stage, const IterContext& ctx, uint64_t fingerprint)
        : m_path(std::move(path)), m_stage(stage), m_ctx(ctx), m_fingerprint(fingerprint)
    {
    }
    ~FileReplayIterator() override
    {
        if (m_file) std::fclose(m_file);
    }
    Next next() override
    {
        if (m_ctx.chain->stopped()) return cancelledError();
        const int64_t t0 = nowNs();
        Next r = read();
        m_stage.counters.addBusy(nowNs() - t0);
        if (r.ok() && r->has_value()) m_stage.counters.countProduced(**r);
        return r;
    }

private:
    Error corrupt(const std::string& what)
    {
        return makeError(ErrorCode::ParseError,
                         "cache file '" + m_path + "' is corrupt at byte " + std::to_string(m_offset) + " (record " +
                             std::to_string(m_record) + "): " + what,
                         "delete the file; the next epoch rebuilds it");
    }
    bool readBytes(void* p, std::size_t n)
    {
        if (n == 0) return true;
        const std::size_t got = std::fread(p, 1, n, m_file);
        m_offset += static_cast<int64_t>(got);
        return got == n;
    }
    Result<Tensor> readTensor()
    {
        uint8_t head[3];
        if (!readBytes(head, 3)) return corrupt("truncated inside a tensor header");
        if (head[0] == 0) return Tensor();
        if (head[1] > static_cast<uint8_t>(DType::U8) || head[2] > 8) return corrupt("bad tensor header");
        std::vector<int64_t> dims(head[2]);
        if (!readBytes(dims.data(), dims.size() * sizeof(int64_t))) return corrupt("truncated inside a shape");
        for (int64_t d : dims)
            if (d < 0 || d > (int64_t(1) << 32)) return corrupt("impossible dimension " + std::to_string(d));
        auto t = Tensor::create(Shape(dims), static_cast<DType>(head[1]));
        if (!t.ok()) return t.takeError();
        if (!readBytes(t->raw(), t->bytes())) return corrupt("truncated inside tensor data");
        return std::move(t).value();
    }
    Next read()
    {
        if (!m_file) {
            m_file = std::fopen(m_path.c_str(), "rb");
            if (!m_file) return makeError(ErrorCode::IoError, "cannot open cache file '" + m_path + "': " + std::strerror(errno));
            char magic[8];
            const bool read = readBytes(magic, 8);
            if (!read || (std::memcmp(magic, kCacheMagic, 8) != 0 && std::memcmp(magic, kCacheMagicV1, 8) != 0))
                // Someone else's file (perhaps the data itself): never suggest deleting it.
                return makeError(ErrorCode::InvalidArgument, "cache file '" + m_path + "' exists and is not a TrainStudio cache file",
                                 "name a new file for cache (an existing file is read as the cache, never overwritten)");
            uint64_t made = 0;
            if (std::memcmp(magic, kCacheMagic, 8) == 0 && (!readBytes(&made, 8) || made != m_fingerprint))
                return makeError(ErrorCode::InvalidArgument,
                                 "cache file '" + m_path + "' was made by another pipeline: the source, its files or the "
                                 "transformations before cache (a take, --limit) have changed since",
                                 "delete it to cache the new data, or name another cache file");
        }
        uint8_t tag = 0;
        if (!readBytes(&tag, 1)) return corrupt("truncated: the end marker is missing");
        if (tag == 2) {
            int64_t count = 0;
            if (!readBytes(&count, 8) || count != m_record) return corrupt("the end marker does not match the records");
            return std::optional<Element>();
        }
        if (tag != 1) return corrupt("bad record tag " + std::to_string(tag));
        Element e;
        TS_ASSIGN(e.x, readTensor());
        TS_ASSIGN(e.y, readTensor());
        uint32_t lens[2];
        if (!readBytes(&e.key, 8) || !readBytes(lens, 8) || lens[0] > 4096 || lens[1] > 4096)
            return corrupt("truncated or bad record trailer");
        std::string origin(lens[0], '\0');
        e.position.resize(lens[1]);
        if (!readBytes(origin.data(), lens[0]) || !readBytes(e.position.data(), lens[1])) return corrupt("truncated record trailer");
        if (!origin.empty()) {
            if (!m_lastOrigin || *m_lastOrigin != origin) m_lastOrigin = std::make_shared<const std::string>(std::move(origin));
            e.origin = m_lastOrigin;
        }
        ++m_record;
        return std::optional<Element>(std::move(e));
    }

    std::string m_path;
    Stage& m_stage;
    IterContext m_ctx;
    uint64_t m_fingerprint;
    std::FILE* m_file = nullptr;
    int64_t m_offset = 0;
    int64_t m_record = 0;
    std::shared_ptr<const std::string> m_lastOrigin;
};

class CacheStage final : public Stage {
public:
    CacheStage(const TransformSpec& op, uint64_t fingerprint) : Stage(op.label(), "cache", false), m_file(op.cacheFile), m_fingerprint(fingerprint) {}

    Result<IteratorPtr> makeIterator(const IterContext& ctx) override
    {
        std::unique_lock<std::mutex> lock(m_mutex);
        if (m_file.empty() && m_memory) return IteratorPtr(new ReplayIterator(m_memory, *this, ctx));
        std::error_code ec;
        if (!m_file.empty() && fs::is_directory(m_file, ec))
            return makeError(ErrorCode::InvalidArgument, "cache file '" + m_file + "' is a folder",
                             "name a file inside it for cache, e.g. '" + (fs::path(m_file) / "train.cache").string() + "'");
        if (!m_file.empty() && fs::exists(m_file, ec)) return IteratorPtr(new FileReplayIterator(m_file, *this, ctx, m_fingerprint));
        const bool record = !m_writing;
        if (record) m_writing = true;
        lock.unlock();
        auto in = input->makeIterator(ctx);
        if (!in.ok()) {
            if (record) finishWriting();
            return in.takeError();
        }
        if (!record) return std::move(in).value();  // another pass is recording: just pass through
        std::FILE* f = nullptr;
        std::string tmp;
        if (!m_file.empty()) {
            tmp = m_file + ".tmp-" + std::to_string(::getpid());
            f = std::fopen(tmp.c_str(), "wb");
            if (!f) {
                finishWriting();
                return makeError(ErrorCode::IoError, "cannot create cache file '" + tmp + "': " + std::strerror(errno),
                                 "check that the cache folder exists and is writable");
            }
            if (std::fwrite(kCacheMagic, 1, 8, f) != 8 || std::fwrite(&m_fingerprint, 1, 8, f) != 8) {
                std::fclose(f);
                finishWriting();
                return makeError(ErrorCode::IoError, "cannot write cache file '" + tmp + "'");
            }
        }
        return IteratorPtr(new RecordingIterator(std::move(in).value(), *this, f, tmp));
    }
    int64_t cardinality() const override { return inputCardinality(*this); }

    const std::string& file() const { return m_file; }
    void commitMemory(std::vector<Element> items)
    {
        std::lock_guard<std::mutex> lock(m_mutex);
        m_memory = std::make_shared<const std::vector<Element>>(std::move(items));
    }
    void finishWriting()
    {
        std::lock_guard<std::mutex> lock(m_mutex);
        m_writing = false;
    }

private:
    std::string m_file;
    uint64_t m_fingerprint;
    std::mutex m_mutex;
    std::shared_ptr<const std::vector<Element>> m_memory;
    bool m_writing = false;
};

RecordingIterator::~RecordingIterator()
{
    if (m_file) {
        std::fclose(m_file);
        if (!m_finished) {
            std::error_code ec;
            fs::remove(m_tmp, ec);  // an incomplete pass leaves no cache behind
        }
    }
    m_stage.finishWriting();
}

Status RecordingIterator::writeElement(const Element& e)
{
    auto put = [&](const void* p, std::size_t n) { return n == 0 || std::fwrite(p, 1, n, m_file) == n; };
    bool ok = put("\x01", 1);
    for (const Tensor* t : {&e.x, &e.y}) {
        const uint8_t head[3] = {static_cast<uint8_t>(t->defined()), static_cast<uint8_t>(t->dtype()),
                                 static_cast<uint8_t>(t->defined() ? t->shape().rank() : 0)};
        ok = ok && put(head, 3);
        if (t->defined()) ok = ok && put(t->shape().dims().data(), t->shape().dims().size() * 8) && put(t->raw(), t->bytes());
    }
    const std::string origin = e.origin ? *e.origin : std::string();
    const uint32_t lens[2] = {static_cast<uint32_t>(std::min<std::size_t>(origin.size(), 4096)),
                              static_cast<uint32_t>(std::min<std::size_t>(e.position.size(), 4096))};
    ok = ok && put(&e.key, 8) && put(lens, 8) && put(origin.data(), lens[0]) && put(e.position.data(), lens[1]);
    if (!ok)
        return makeError(ErrorCode::IoError, "cannot write cache file '" + m_tmp + "': " + std::strerror(errno),
                         "free disk space or cache in memory (cache without a file)");
    return okStatus();
}

Next RecordingIterator::next()
{
    Next r = m_input->next();
    if (!r.ok()) return r;
    const int64_t t0 = nowNs();
    if (!r->has_value()) {
        if (!m_finished) {
            m_finished = true;
            if (m_file) {
                const uint8_t tag = 2;
                const bool ok = std::fwrite(&tag, 1, 1, m_file) == 1 && std::fwrite(&m_count, 8, 1, m_file) == 1 &&
                                std::fflush(m_file) == 0;
                std::error_code ec;
                if (!ok) return makeError(ErrorCode::IoError, "cannot finish cache file '" + m_tmp + "'");
                fs::rename(m_tmp, m_stage.file(), ec);
                if (ec)
                    return makeError(ErrorCode::IoError, "cannot rename cache file '" + m_tmp + "' to '" + m_stage.file() +
                                                             "': " + ec.message());
            } else {
                m_stage.commitMemory(std::move(m_memory));
            }
        }
        m_stage.counters.addBusy(nowNs() - t0);
        return r;
    }
    if (m_file) {
        TS_TRY(writeElement(**r));
    } else {
        m_memory.push_back(**r);
    }
    ++m_count;
    m_stage.counters.addBusy(nowNs() - t0);
    m_stage.counters.countProduced(**r);
    return r;
}

// ---------------------------------------------------------------------------------------------

class RepeatIterator final : public Iterator {
public:
    RepeatIterator(Stage& stage, int64_t count, const IterContext& ctx) : m_stage(stage), m_count(count), m_ctx(ctx) {}
    Next next() override
    {
        for (;;) {
            if (m_ctx.chain->stopped()) return cancelledError();
            if (!m_cur) {
                if (m_count >= 0 && m_rep >= m_count) return std::optional<Element>();
                IterContext inner = m_ctx;
                if (m_rep > 0) inner.iteration = mixSeed(m_ctx.iteration ^ mixSeed(static_cast<uint64_t>(m_rep)));
                TS_ASSIGN(m_cur, m_stage.input->makeIterator(inner));
                m_producedThisRep = 0;
            }
            Next r = m_cur->next();
            if (!r.ok()) return r;
            if (!r->has_value()) {
                m_cur.reset();
                ++m_rep;
                if (m_producedThisRep == 0) return std::optional<Element>();  // an empty input would loop for ever
                continue;
            }
            ++m_producedThisRep;
            if (m_rep > 0) (*r)->key ^= mixSeed(static_cast<uint64_t>(m_rep));
            m_stage.counters.countProduced(**r);
            return r;
        }
    }

private:
    Stage& m_stage;
    int64_t m_count;
    IterContext m_ctx;
    IteratorPtr m_cur;
    int64_t m_rep = 0;
    int64_t m_producedThisRep = 0;
};

class RepeatStage final : public Stage {
public:
    explicit RepeatStage(const TransformSpec& op) : Stage(op.label(), "repeat", false), m_count(op.count) {}
    Result<IteratorPtr> makeIterator(const IterContext& ctx) override { return IteratorPtr(new RepeatIterator(*this, m_count, ctx)); }
    int64_t cardinality() const override
    {
        const int64_t n = inputCardinality(*this);
        if (n == 0 || m_count == 0) return 0;
        if (m_count < 0) return kInfiniteCardinality;
        return n < 0 ? n : n * m_count;
    }

private:
    int64_t m_count;
};

// Shard `index` of `shards` keeps positions [block * index / shards, block * (index + 1) / shards)
// of every block of `block` elements (block == shards: position % shards == index).
bool shardKeeps(int64_t pos, int64_t shards, int64_t index, int64_t block)
{
    const int64_t at = pos % block;
    return at >= block * index / shards && at < block * (index + 1) / shards;
}

// take / skip / shard: keep elements by their position in the input.
class SelectIterator final : public Iterator {
public:
    enum class Mode { Take, Skip, Shard };
    SelectIterator(IteratorPtr input, Stage& stage, Mode mode, int64_t a, int64_t b, int64_t block, const IterContext& ctx)
        : m_input(std::move(input)), m_stage(stage), m_mode(mode), m_a(a), m_b(b), m_block(block), m_ctx(ctx)
    {
    }
    Next next() override
    {
        std::optional<Element> out;
        TS_TRY(advance(&out));
        return out;
    }
    Result<bool> skip() override { return advance(nullptr); }

private:
    // Moves past the next kept element: into `out` when given, else passed over. The elements
    // dropped are passed over too, so a source that can skip cheaply (a CSV line unparsed) does.
    // False at the end.
    Result<bool> advance(std::optional<Element>* out)
    {
        for (;;) {
            if (m_ctx.chain->stopped()) return cancelledError();
            if (m_mode == Mode::Take && m_a >= 0 && m_pos >= m_a) {
                m_input.reset();  // done: stop the stages before us now
                return false;
            }
            if (!m_input) return false;
            bool keep = true;
            if (m_mode == Mode::Skip) keep = m_a >= 0 && m_pos >= m_a;
            else if (m_mode == Mode::Shard) keep = shardKeeps(m_pos, m_a, m_b, m_block);
            if (keep && out) {
                Next r = m_input->next();
                if (!r.ok()) return r.takeError();
                if (!r->has_value()) return false;
                ++m_pos;
                m_stage.counters.countProduced(**r);
                *out = std::move(*r);
                return true;
            }
            TS_ASSIGN(const bool more, m_input->skip());
            if (!more) return false;
            ++m_pos;
            if (keep) return true;
        }
    }

    IteratorPtr m_input;
    Stage& m_stage;
    Mode m_mode;
    int64_t m_a, m_b, m_block;
    IterContext m_ctx;
    int64_t m_pos = 0;
};

class SelectStage final : public Stage {
public:
    SelectStage(const TransformSpec& op, SelectIterator::Mode mode, int64_t a, int64_t b, int64_t block = 1)
        : Stage(op.label(), transformKindName(op.kind), false), m_mode(mode), m_a(a), m_b(b), m_block(block)
    {
    }
    Result<IteratorPtr> makeIterator(const IterContext& ctx) override
    {
        TS_ASSIGN(IteratorPtr in, input->makeIterator(ctx));
        return IteratorPtr(new SelectIterator(std::move(in), *this, m_mode, m_a, m_b, m_block, ctx));
    }
    int64_t cardinality() const override
    {
        const int64_t n = inputCardinality(*this);
        switch (m_mode) {
        case SelectIterator::Mode::Take:
            if (m_a < 0) return n;
            if (n == kInfiniteCardinality) return m_a;
            return n < 0 ? n : std::min(n, m_a);
        case SelectIterator::Mode::Skip:
            if (m_a < 0) return 0;
            return n < 0 ? n : std::max<int64_t>(0, n - m_a);
        case SelectIterator::Mode::Shard: {
            if (n < 0) return n;
            const int64_t lo = m_block * m_b / m_a, hi = m_block * (m_b + 1) / m_a;
            return n / m_block * (hi - lo) + std::clamp<int64_t>(n % m_block - lo, 0, hi - lo);
        }
        }
        return n;
    }

private:
    SelectIterator::Mode m_mode;
    int64_t m_a, m_b, m_block;
};

} // namespace

std::unique_ptr<Stage> makeMapStage(const TransformSpec& op, uint64_t seed, bool deterministic, int cpuBudget)
{
    return std::make_unique<MapStage>(op, seed, deterministic, cpuBudget);
}
std::unique_ptr<Stage> makeShuffleStage(const TransformSpec& op, uint64_t seed) { return std::make_unique<ShuffleStage>(op, seed); }
std::unique_ptr<Stage> makeBatchStage(const TransformSpec& op) { return std::make_unique<BatchStage>(op); }
std::unique_ptr<Stage> makePrefetchStage(const TransformSpec& op) { return std::make_unique<PrefetchStage>(op); }
std::unique_ptr<Stage> makeCacheStage(const TransformSpec& op, uint64_t fingerprint) { return std::make_unique<CacheStage>(op, fingerprint); }
std::unique_ptr<Stage> makeRepeatStage(const TransformSpec& op) { return std::make_unique<RepeatStage>(op); }
std::unique_ptr<Stage> makeTakeStage(const TransformSpec& op)
{
    return std::make_unique<SelectStage>(op, SelectIterator::Mode::Take, op.count, 0);
}
std::unique_ptr<Stage> makeSkipStage(const TransformSpec& op)
{
    return std::make_unique<SelectStage>(op, SelectIterator::Mode::Skip, op.count, 0);
}
std::unique_ptr<Stage> makeShardStage(const TransformSpec& op)
{
    return std::make_unique<SelectStage>(op, SelectIterator::Mode::Shard, op.numShards, op.shardIndex,
                                         op.shardBlock > 0 ? op.shardBlock : op.numShards);
}

} // namespace ts::pipeline_detail
