#pragma once
// Internal to the input pipeline (pipeline.cpp, stages_*.cpp); not part of core's API.
//
// A Stage is one transformation of a built pipeline and lives as long as the Pipeline: it holds
// the configuration, the counters, the tunable knobs and what persists across epochs (a source's
// loaded arrays, a cache). Each epoch the Pipeline asks the last stage for an Iterator, which asks
// its input stage for one in turn, and so on down to the source (repeat() asks again for every
// repetition, a completed cache() does not ask at all).
//
// Iterators are used from one thread at a time. Asynchronous iterators (prefetch, parallel map,
// parallel interleave) own worker threads that block on condition variables; every wait also
// watches the chain's stop flag, and ChainControl::requestStop() wakes them all, so a chain tears
// down promptly from any state.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/result.h"
#include "data/element.h"
#include "data/pipeline_config.h"

namespace ts::pipeline_detail {

inline int64_t nowNs()
{
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

using Next = Result<std::optional<Element>>;

inline constexpr int64_t kUnknownCardinality = -1;
inline constexpr int64_t kInfiniteCardinality = -2;

// Cumulative counters of one stage, written by its iterators on any thread.
struct Counters {
    std::atomic<int64_t> produced{0};
    std::atomic<int64_t> busyNs{0};
    std::atomic<int64_t> blockedNs{0};
    std::atomic<int64_t> skipped{0};
    std::atomic<int64_t> bytes{0};
    std::atomic<int64_t> queueDepth{0};
    std::atomic<int64_t> queueCapacity{0};
    std::atomic<int> parallelism{1};

    void addBusy(int64_t ns) { busyNs.fetch_add(ns, std::memory_order_relaxed); }
    void addBlocked(int64_t ns) { blockedNs.fetch_add(ns, std::memory_order_relaxed); }
    void countProduced(const Element& e)
    {
        produced.fetch_add(1, std::memory_order_relaxed);
        bytes.fetch_add(static_cast<int64_t>((e.x.defined() ? e.x.bytes() : 0) + (e.y.defined() ? e.y.bytes() : 0)),
                        std::memory_order_relaxed);
    }
    void reset();
};

// A setting live iterators read and the autotuner writes.
struct Knob {
    bool present = false;         // this stage has such a setting
    bool autotuned = false;       // written as kAutotune
    int64_t maxValue = 1;         // autotune upper bound (threads created up front for parallelism)
    std::atomic<int64_t> value{1};
    int64_t get() const { return value.load(std::memory_order_relaxed); }
};

class Waker {
public:
    virtual ~Waker() = default;
    virtual void wake() = 0;  // lock own mutex, notify every condition variable
};

// One chain of iterators (an epoch, or a peek): its stop flag and its live asynchronous iterators.
class ChainControl {
public:
    bool stopped() const { return m_stop.load(std::memory_order_acquire); }
    void requestStop();
    void wakeAll();
    void add(Waker* w);
    void remove(Waker* w);

private:
    std::atomic<bool> m_stop{false};
    std::mutex m_mutex;
    std::vector<Waker*> m_live;
};

// Pipeline-wide settings and the bad-record log.
struct Shared {
    uint64_t seed = 0;
    bool deterministic = true;
    bool skipBad = false;
    int64_t classCount = 0;  // PipelineOptions::classCount
    std::atomic<int64_t> badCount{0};
    std::mutex badMutex;
    std::vector<std::string> badMessages;
    void recordBad(const Error& e);
};

struct IterContext {
    int64_t epoch = 0;
    uint64_t iteration = 0;  // the epoch, mixed with repeat() counts: seeds shuffles and random maps
    ChainControl* chain = nullptr;
    Shared* shared = nullptr;
};

class Iterator {
public:
    virtual ~Iterator() = default;
    // The next element; std::nullopt at the end; Cancelled once the chain stops.
    virtual Next next() = 0;
    // Passes over the next element without handing it out: true if there was one, false at the
    // end. Sources override it where passing over is cheaper than producing (a CSV line is not
    // parsed, an array row not sliced), so shard/skip/take after them do not pay for the elements
    // they drop. An override must pass over exactly the element next() would have produced.
    virtual Result<bool> skip()
    {
        Next r = next();
        if (!r.ok()) return r.takeError();
        return r->has_value();
    }
};
using IteratorPtr = std::unique_ptr<Iterator>;

Error cancelledError();
// Whether an error may be dropped under skip_bad_records (data errors, not cancellation or bugs).
bool isRecordError(const Error& e);

// Pulls from `it`, adding the time spent to `inputNs`.
inline Next timedNext(Iterator& it, int64_t& inputNs)
{
    const int64_t t0 = nowNs();
    Next r = it.next();
    inputNs += nowNs() - t0;
    return r;
}

class Stage {
public:
    Stage(std::string name, std::string kind, bool async) : name(std::move(name)), kind(std::move(kind)), async(async) {}
    virtual ~Stage() = default;
    virtual Result<IteratorPtr> makeIterator(const IterContext& ctx) = 0;
    // Elements per pass: >= 0, kUnknownCardinality or kInfiniteCardinality.
    virtual int64_t cardinality() const = 0;

    Stage* input = nullptr;  // null for the source
    std::string name;        // "map(normalise)"
    std::string kind;        // "map", "source", ...
    bool async = false;
    Counters counters;
    Knob parallelism;
    Knob buffer;
};

// Builders (stages_sources.cpp, stages_ops.cpp, stages_async.cpp). `interleave` is the interleave
// op that follows a multi-file source, if any. Errors are configuration errors.
Result<std::unique_ptr<Stage>> makeSourceStage(const SourceSpec& spec, const TransformSpec* interleave, int cpuBudget);
std::unique_ptr<Stage> makeMapStage(const TransformSpec& op, uint64_t seed, bool deterministic, int cpuBudget);
std::unique_ptr<Stage> makeShuffleStage(const TransformSpec& op, uint64_t seed);
std::unique_ptr<Stage> makeBatchStage(const TransformSpec& op);
std::unique_ptr<Stage> makePrefetchStage(const TransformSpec& op);
// `fingerprint`: of the pipeline up to the cache; a cache file made with another is refused.
std::unique_ptr<Stage> makeCacheStage(const TransformSpec& op, uint64_t fingerprint);
std::unique_ptr<Stage> makeRepeatStage(const TransformSpec& op);
std::unique_ptr<Stage> makeTakeStage(const TransformSpec& op);
std::unique_ptr<Stage> makeSkipStage(const TransformSpec& op);
std::unique_ptr<Stage> makeShardStage(const TransformSpec& op);

// Asynchronous building blocks shared by stages (stages_async.cpp).
// Runs `input` on a thread of its own, buffering up to `buffer` elements (read on every wait, so
// a knob may change it); the consumer's blocked time goes to counters.blockedNs, the depth to
// counters.queueDepth when `gauges` is set.
IteratorPtr makePrefetchIterator(IteratorPtr input, const IterContext& ctx, Counters* counters, const Knob* buffer,
                                 int64_t fixedBuffer, bool gauges);
// Applies fn on up to parallelism.get() of `maxThreads` worker threads.
IteratorPtr makeParallelMapIterator(IteratorPtr input, const IterContext& ctx, Stage& stage, MapFunction fn,
                                    MapContext mapCtx, bool deterministic, int maxThreads);
// Interleaves per-file iterators: cycleLength files open at once, blockLength elements from
// each in turn; with `parallel`, every open file is read ahead on a thread of its own.
using FileIteratorFactory = std::function<Result<IteratorPtr>(std::size_t fileIndex)>;
IteratorPtr makeInterleaveIterator(std::size_t fileCount, FileIteratorFactory factory, const IterContext& ctx,
                                   Stage& stage, int64_t cycleLength, int64_t blockLength, bool parallel);

} // namespace ts::pipeline_detail
