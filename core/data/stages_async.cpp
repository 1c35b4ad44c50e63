// Asynchronous iterators: prefetch, parallel map and file interleave. Every thread here blocks on
// a condition variable whose predicate includes the iterator's own stop flag and its chain's;
// Waker::wake() takes the iterator's mutex before notifying, so a stop raised between a
// predicate check and the wait cannot be missed.

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <thread>

#include "common/background_thread.h"
#include "data/stages.h"

namespace ts::pipeline_detail {

namespace {

// Pipeline threads make elements ahead of need (becomeBackgroundThread): with the default policy
// the prefetch thread woken by the trainer's pop preempted it and produced a whole batch inside
// the trainer's input wait although the queue was full (seed MLP: median wait 331 us per step,
// the cost of one batch; 3-7 us under SCHED_BATCH).

class PrefetchIterator final : public Iterator, public Waker {
public:
    PrefetchIterator(IteratorPtr input, const IterContext& ctx, Counters* counters, const Knob* knob, int64_t fixed, bool gauges)
        : m_input(std::move(input)), m_ctx(ctx), m_counters(counters), m_knob(knob), m_fixed(fixed), m_gauges(gauges && counters)
    {
        m_ctx.chain->add(this);
        m_thread = std::thread([this] { produce(); });
    }

    ~PrefetchIterator() override
    {
        m_ctx.chain->remove(this);
        {
            std::lock_guard<std::mutex> lock(m_mutex);
            m_stopping = true;
        }
        m_notFull.notify_all();
        m_notEmpty.notify_all();
        m_thread.join();
        if (m_gauges) m_counters->queueDepth = 0;
    }

    void wake() override
    {
        { std::lock_guard<std::mutex> lock(m_mutex); }
        m_notFull.notify_all();
        m_notEmpty.notify_all();
    }

    Next next() override
    {
        std::unique_lock<std::mutex> lock(m_mutex);
        if (m_queue.empty() && m_final) return *m_final;
        if (m_queue.empty()) {
            const int64_t t0 = nowNs();
            m_notEmpty.wait(lock, [&] { return !m_queue.empty() || m_stopping || m_ctx.chain->stopped(); });
            if (m_counters) m_counters->addBlocked(nowNs() - t0);
            if (m_queue.empty()) return cancelledError();
        }
        Next r = std::move(m_queue.front());
        m_queue.pop_front();
        const bool terminal = !r.ok() || !r->has_value();
        if (terminal) m_final = r;  // the end (or the error) again on later calls
        if (m_gauges) m_counters->queueDepth = static_cast<int64_t>(m_queue.size());
        lock.unlock();
        m_notFull.notify_one();
        if (m_gauges && !terminal) m_counters->countProduced(**r);
        return r;
    }

private:
    int64_t capacity() const
    {
        const int64_t c = m_knob ? m_knob->get() : m_fixed;
        return std::max<int64_t>(1, c);
    }

    void produce()
    {
        becomeBackgroundThread("ts-prefetch");
        for (;;) {
            {
                std::unique_lock<std::mutex> lock(m_mutex);
                m_notFull.wait(lock, [&] {
                    return m_stopping || m_ctx.chain->stopped() || static_cast<int64_t>(m_queue.size()) < capacity();
                });
                if (m_stopping || m_ctx.chain->stopped()) return;
                if (m_gauges) m_counters->queueCapacity = capacity();
            }
            Next r = m_input->next();
            const bool terminal = !r.ok() || !r->has_value();
            {
                std::lock_guard<std::mutex> lock(m_mutex);
                m_queue.push_back(std::move(r));
                if (m_gauges) m_counters->queueDepth = static_cast<int64_t>(m_queue.size());
            }
            m_notEmpty.notify_one();
            if (terminal) {
                // Release the input's threads and buffers now rather than at the end of the epoch.
                m_input.reset();
                return;
            }
        }
    }

    IteratorPtr m_input;
    IterContext m_ctx;
    Counters* m_counters;
    const Knob* m_knob;
    int64_t m_fixed;
    bool m_gauges;
    std::mutex m_mutex;
    std::condition_variable m_notFull, m_notEmpty;
    std::deque<Next> m_queue;
    std::optional<Next> m_final;
    bool m_stopping = false;
    std::thread m_thread;
};

// ---------------------------------------------------------------------------------------------

class ParallelMapIterator final : public Iterator, public Waker {
public:
    ParallelMapIterator(IteratorPtr input, const IterContext& ctx, Stage& stage, MapFunction fn, MapContext mc,
                        bool deterministic, int maxThreads)
        : m_input(std::move(input)), m_ctx(ctx), m_stage(stage), m_fn(std::move(fn)), m_mc(mc), m_deterministic(deterministic)
    {
        m_ctx.chain->add(this);
        const int n = std::max(1, maxThreads);
        m_threads.reserve(static_cast<std::size_t>(n));
        for (int i = 0; i < n; ++i) m_threads.emplace_back([this, i] { work(i); });
    }

    ~ParallelMapIterator() override
    {
        m_ctx.chain->remove(this);
        {
            std::lock_guard<std::mutex> lock(m_mutex);
            m_stopping = true;
        }
        m_workerCv.notify_all();
        m_consumerCv.notify_all();
        for (auto& t : m_threads) t.join();
        m_stage.counters.queueDepth = 0;
    }

    void wake() override
    {
        { std::lock_guard<std::mutex> lock(m_mutex); }
        m_workerCv.notify_all();
        m_consumerCv.notify_all();
    }

    Next next() override
    {
        for (;;) {
            // The chunk in hand is the consumer's alone: no lock per element.
            if (m_pos < m_current.size()) {
                Slot& slot = m_current[m_pos++];
                if (slot.skipped) continue;
                if (slot.error) {
                    m_final = Next(std::move(*slot.error));
                    m_current.clear();
                    m_pos = 0;
                    return *m_final;
                }
                m_stage.counters.countProduced(*slot.element);
                return std::move(slot.element);
            }
            if (m_final) return *m_final;
            std::unique_lock<std::mutex> lock(m_mutex);
            for (;;) {
                std::optional<Chunk> chunk;
                if (m_deterministic) {
                    auto it = m_results.find(m_nextOut);
                    if (it != m_results.end()) {
                        chunk = std::move(it->second);
                        m_results.erase(it);
                    }
                } else if (!m_done.empty()) {
                    chunk = std::move(m_done.front());
                    m_done.pop_front();
                }
                if (chunk) {
                    ++m_nextOut;
                    m_stage.counters.queueDepth = static_cast<int64_t>(m_deterministic ? m_results.size() : m_done.size());
                    const bool wakeWorker = m_workersWaiting > 0;
                    lock.unlock();
                    // Room in the window for one more chunk. notify_all: a worker parked above the
                    // autotuned parallelism must not swallow the wake-up meant for an active one.
                    if (wakeWorker) m_workerCv.notify_all();
                    m_current = std::move(chunk->slots);
                    m_pos = 0;
                    break;
                }
                if (m_inputDone && m_nextOut >= m_endSeq) {
                    m_final = Next(std::optional<Element>());
                    return *m_final;
                }
                if (m_stopping || m_ctx.chain->stopped()) return cancelledError();
                const int64_t t0 = nowNs();
                m_consumerWaiting = true;
                m_consumerCv.wait(lock);
                m_consumerWaiting = false;
                m_stage.counters.addBlocked(nowNs() - t0);
            }
        }
    }

private:
    struct Slot {
        std::optional<Element> element;
        std::optional<Error> error;
        bool skipped = false;
    };
    // Consecutive input elements mapped by one worker and handed over together: the threads
    // synchronise once per chunk, not once per element (per-element hand-offs cost more than a
    // cheap map like normalise itself).
    struct Chunk {
        std::vector<Slot> slots;
    };
    // Chunks take about 100 us of map work: long enough to amortise a hand-off (a few us), short
    // enough that a slow map (decoding, sleeping) still hands elements over one at a time.
    static constexpr std::size_t kMaxChunk = 64;
    static constexpr int64_t kChunkTargetNs = 100'000;
    std::size_t chunkSize() const
    {
        const int64_t avg = m_avgElementNs.load(std::memory_order_relaxed);
        if (avg <= 0) return 1;  // nothing measured yet
        return static_cast<std::size_t>(std::clamp<int64_t>(kChunkTargetNs / avg, 1, static_cast<int64_t>(kMaxChunk)));
    }

    int64_t parallelism() const { return std::max<int64_t>(1, m_stage.parallelism.get()); }
    // Chunks computed or in flight ahead of the consumer: two per thread keeps every worker busy
    // while the consumer works through one.
    int64_t window() const { return 2 * parallelism(); }

    void work(int id)
    {
        becomeBackgroundThread("ts-map");
        std::unique_lock<std::mutex> lock(m_mutex);
        std::vector<Next> inputs;
        inputs.reserve(kMaxChunk);
        for (;;) {
            ++m_workersWaiting;
            m_workerCv.wait(lock, [&] {
                return m_stopping || m_ctx.chain->stopped() ||
                       (id < parallelism() && !m_inputDone && !m_inputBusy && m_nextPull - m_nextOut < window());
            });
            --m_workersWaiting;
            if (m_stopping || m_ctx.chain->stopped()) return;
            m_inputBusy = true;
            const int64_t seq = m_nextPull++;
            m_stage.counters.parallelism = static_cast<int>(parallelism());
            const std::size_t want = chunkSize();
            m_stage.counters.queueCapacity = window() * static_cast<int64_t>(want);
            lock.unlock();
            // Pull a chunk; the input is this worker's until it lets go.
            inputs.clear();
            bool ended = false;
            const int64_t pullStart = nowNs();
            while (inputs.size() < want) {
                Next r = m_input->next();
                ended = !r.ok() || !r->has_value();
                if (ended && r.ok()) break;  // the end: not an element
                inputs.push_back(std::move(r));
                if (ended) break;            // an error ends the input too
                // A slow input (an upstream decode, a file) must not hold elements back to fill
                // a chunk sized for this map's speed.
                if (nowNs() - pullStart > kChunkTargetNs) break;
            }
            lock.lock();
            m_inputBusy = false;
            if (ended) m_inputDone = true;
            if (inputs.empty()) {
                m_endSeq = seq;
                m_nextPull = seq;
                lock.unlock();
                m_consumerCv.notify_all();
                m_workerCv.notify_all();
                lock.lock();
                continue;
            }
            if (ended) m_endSeq = seq + 1;
            const bool another = !ended && m_workersWaiting > 0;
            lock.unlock();
            if (another) m_workerCv.notify_all();  // another worker may pull now
            Chunk chunk;
            chunk.slots.resize(inputs.size());
            const int64_t t0 = nowNs();
            for (std::size_t i = 0; i < inputs.size(); ++i) mapOne(inputs[i], chunk.slots[i]);
            const int64_t per = (nowNs() - t0) / static_cast<int64_t>(inputs.size());
            const int64_t old = m_avgElementNs.load(std::memory_order_relaxed);
            m_avgElementNs.store(old <= 0 ? std::max<int64_t>(per, 1) : (3 * old + per) / 4, std::memory_order_relaxed);
            lock.lock();
            if (m_deterministic) m_results.emplace(seq, std::move(chunk));
            else m_done.push_back(std::move(chunk));
            m_stage.counters.queueDepth = static_cast<int64_t>(m_deterministic ? m_results.size() : m_done.size());
            const bool wakeConsumer = m_consumerWaiting;
            if (ended) {
                lock.unlock();
                m_consumerCv.notify_all();
                m_workerCv.notify_all();
                lock.lock();
            } else if (wakeConsumer) {
                lock.unlock();
                m_consumerCv.notify_one();
                lock.lock();
            }
        }
    }

    void mapOne(Next& in, Slot& slot)
    {
        if (!in.ok()) {
            slot.error = in.takeError();
            return;
        }
        Element& e = **in;
        Element meta;
        meta.key = e.key;
        meta.origin = e.origin;
        meta.labelOrigin = e.labelOrigin;
        meta.position = e.position;
        const int64_t t0 = nowNs();
        Result<Element> out = m_fn.fn(std::move(e), m_mc);
        m_stage.counters.addBusy(nowNs() - t0);
        if (out.ok()) {
            slot.element = std::move(out).value();
            return;
        }
        Error err = out.takeError();
        const std::string where = meta.where();
        if (err.message.find(where) == std::string::npos) err.message = where + ": " + err.message;
        err.message = m_stage.name + ": " + err.message;
        if (m_ctx.shared->skipBad && isRecordError(err)) {
            m_ctx.shared->recordBad(err);
            m_stage.counters.skipped.fetch_add(1, std::memory_order_relaxed);
            slot.skipped = true;
        } else {
            slot.error = std::move(err);
        }
    }

    IteratorPtr m_input;
    IterContext m_ctx;
    Stage& m_stage;
    MapFunction m_fn;
    MapContext m_mc;
    bool m_deterministic;
    std::mutex m_mutex;
    std::condition_variable m_workerCv, m_consumerCv;
    std::map<int64_t, Chunk> m_results;  // deterministic: by chunk sequence number
    std::deque<Chunk> m_done;            // otherwise: in completion order
    int64_t m_nextPull = 0;              // sequence number of the next chunk pulled from the input
    int64_t m_nextOut = 0;               // chunks handed to the consumer (deterministic: the next sequence number)
    int64_t m_endSeq = 0;                // valid once m_inputDone: chunks the input gave in total
    bool m_inputDone = false;
    bool m_inputBusy = false;            // the input is used by one worker at a time
    bool m_stopping = false;
    int m_workersWaiting = 0;
    bool m_consumerWaiting = false;
    std::atomic<int64_t> m_avgElementNs{0};  // moving average of the map's time per element
    // Consumer thread only.
    std::vector<Slot> m_current;
    std::size_t m_pos = 0;
    std::optional<Next> m_final;         // the end, or the error, again on later calls
    std::vector<std::thread> m_threads;
};

// ---------------------------------------------------------------------------------------------

class InterleaveIterator final : public Iterator {
public:
    InterleaveIterator(std::size_t files, FileIteratorFactory factory, const IterContext& ctx, Stage& stage,
                       int64_t cycle, int64_t block, bool parallel)
        : m_files(files), m_factory(std::move(factory)), m_ctx(ctx), m_stage(stage), m_cycle(cycle), m_block(block),
          m_parallel(parallel)
    {
    }

    Next next() override
    {
        Element e;
        TS_ASSIGN(const bool more, advance(&e));
        if (!more) return std::optional<Element>();
        m_stage.counters.countProduced(e);
        return std::optional<Element>(std::move(e));
    }

    // The file whose turn it is passes over its element (a CSV line is not parsed), so a shard
    // by element after a sequential interleave does not decode the other tasks' elements. Files
    // read ahead in parallel have produced theirs already.
    Result<bool> skip() override { return advance(nullptr); }

private:
    // Takes the next element in cycle order into `out`, or passes over it when `out` is null.
    Result<bool> advance(Element* out)
    {
        if (!m_started) {
            m_started = true;
            while (static_cast<int64_t>(m_slots.size()) < m_cycle && m_nextFile < m_files) {
                TS_ASSIGN(IteratorPtr it, open(m_nextFile++));
                m_slots.push_back(std::move(it));
            }
        }
        for (;;) {
            if (m_ctx.chain->stopped()) return cancelledError();
            if (m_slots.empty()) return false;
            bool more = false;
            if (out) {
                Next r = m_slots[m_cur]->next();
                if (!r.ok()) return r.takeError();
                if ((more = r->has_value())) *out = std::move(**r);
            } else {
                TS_ASSIGN(more, m_slots[m_cur]->skip());
            }
            if (!more) {
                // This file is done: the next file takes its place in the cycle, else the cycle shrinks.
                m_taken = 0;
                if (m_nextFile < m_files) {
                    m_slots[m_cur].reset();
                    TS_ASSIGN(m_slots[m_cur], open(m_nextFile++));
                } else {
                    m_slots.erase(m_slots.begin() + static_cast<std::ptrdiff_t>(m_cur));
                    if (m_cur >= m_slots.size()) m_cur = 0;
                }
                continue;
            }
            if (++m_taken >= m_block) {
                m_taken = 0;
                m_cur = (m_cur + 1) % m_slots.size();
            }
            return true;
        }
    }

    Result<IteratorPtr> open(std::size_t file)
    {
        TS_ASSIGN(IteratorPtr it, m_factory(file));
        if (!m_parallel) return it;
        // Each open file is read ahead on a thread of its own; the consumer's waits on it are the
        // stage's blocked time.
        return makePrefetchIterator(std::move(it), m_ctx, &m_stage.counters, nullptr, std::max<int64_t>(8, 2 * m_block), false);
    }

    std::size_t m_files;
    FileIteratorFactory m_factory;
    IterContext m_ctx;
    Stage& m_stage;
    int64_t m_cycle, m_block;
    bool m_parallel;
    bool m_started = false;
    std::vector<IteratorPtr> m_slots;
    std::size_t m_nextFile = 0;
    std::size_t m_cur = 0;
    int64_t m_taken = 0;
};

} // namespace

IteratorPtr makePrefetchIterator(IteratorPtr input, const IterContext& ctx, Counters* counters, const Knob* buffer,
                                 int64_t fixedBuffer, bool gauges)
{
    return IteratorPtr(new PrefetchIterator(std::move(input), ctx, counters, buffer, fixedBuffer, gauges));
}

IteratorPtr makeParallelMapIterator(IteratorPtr input, const IterContext& ctx, Stage& stage, MapFunction fn,
                                    MapContext mapCtx, bool deterministic, int maxThreads)
{
    return IteratorPtr(new ParallelMapIterator(std::move(input), ctx, stage, std::move(fn), mapCtx, deterministic, maxThreads));
}

IteratorPtr makeInterleaveIterator(std::size_t fileCount, FileIteratorFactory factory, const IterContext& ctx, Stage& stage,
                                   int64_t cycleLength, int64_t blockLength, bool parallel)
{
    return IteratorPtr(new InterleaveIterator(fileCount, std::move(factory), ctx, stage, cycleLength, blockLength, parallel));
}

} // namespace ts::pipeline_detail
