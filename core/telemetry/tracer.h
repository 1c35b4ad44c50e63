#pragma once
// Tracer: spans and counters recorded into per-thread buffers, collected into SpanEvents.
// Contract:
//  - One process-wide tracer (Tracer::instance()); its level (Off / Spans / Detailed) is a
//    relaxed atomic, so a disabled scope costs one load and a branch. With the CMake option
//    TS_TRACING=OFF the TS_TRACE_* macros compile to nothing.
//  - Threading: any thread may record. Records go to a thread_local buffer (no lock); a buffer
//    moves to the tracer's shared list (one short lock) when it holds 1024 records, when its
//    oldest record is 100 ms old, on flushThread(), and when the thread exits. collect() may be
//    called from any thread (a TraceCollector thread, a test) and takes everything moved so far.
//  - Each thread's spans carry its lane (setThreadLane; default {"local", "", "thread N"}) and
//    the global step current at the time of recording (setStep; the Trainer updates it).
//  - Span and counter names are const char* that must outlive the tracer's data: string
//    literals, or intern() for names built at run time ("forward/dense_1").
//  - One traced run per process at a time: spans do not carry a run id until collect() stamps
//    them with the collector's; beginSession() fences off records of an earlier run.
//  - Errors: none; recording never fails (memory exhaustion aside).

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "common/background_thread.h"
#include "telemetry/events.h"

namespace ts::telemetry {

class EventBus;

enum class TraceLevel : int { Off = 0, Spans = 1, Detailed = 2 };

// Monotonic nanoseconds (steady_clock); every span and breakdown is measured with it.
inline int64_t nowNs()
{
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
// Converts a nowNs() value to microseconds since the Unix epoch (Stamp::wallTimeUs's clock),
// using one steady/system offset taken at first use, so spans stay monotonic.
int64_t wallMicros(int64_t steadyNs);
int64_t wallNowMicros();

using TraceArgs = std::vector<std::pair<const char*, std::string>>;

// One recorded span (durationNs >= 0) or counter sample (durationNs < 0, value set).
struct TraceRecord {
    const char* name = nullptr;
    const char* category = nullptr;
    int64_t startNs = 0;
    int64_t durationNs = 0;
    int64_t step = 0;
    double value = 0;
    uint32_t session = 0;  // Tracer::beginSession() generation it was recorded in
    TraceArgs args;
};

class Tracer {
public:
    static Tracer& instance();

    static TraceLevel level() { return static_cast<TraceLevel>(s_level.load(std::memory_order_relaxed)); }
    static bool enabled() { return s_level.load(std::memory_order_relaxed) >= static_cast<int>(TraceLevel::Spans); }
    static bool detailed() { return s_level.load(std::memory_order_relaxed) >= static_cast<int>(TraceLevel::Detailed); }
    static void setLevel(TraceLevel level) { s_level.store(static_cast<int>(level), std::memory_order_relaxed); }

    static void setStep(int64_t step) { s_step.store(step, std::memory_order_relaxed); }
    static int64_t step() { return s_step.load(std::memory_order_relaxed); }

    // Stable copy of `s` for the process lifetime (same text -> same pointer).
    static const char* intern(std::string_view s);

    // The calling thread's lane for everything it records from now on.
    static void setThreadLane(const Lane& lane);
    static Lane threadLane();

    static void recordSpan(const char* name, const char* category, int64_t startNs, int64_t endNs,
                           TraceArgs* args = nullptr);
    static void recordCounter(const char* name, double value);
    // Moves the calling thread's buffer to the shared list (cheap when empty).
    static void flushThread();

    // Everything moved to the shared list so far, as SpanEvents stamped with runId (counters
    // as category "counter" spans), oldest buffer first. Unflushed thread buffers stay put.
    std::vector<SpanEvent> collect(const std::string& runId);
    // Drops everything collected or buffered in the shared list (between runs, in tests).
    void discard();
    // Starts a new tracing session (a traced run): discards the shared list, and records still
    // sitting in some thread's buffer from an earlier session are dropped when they arrive.
    void beginSession();
    uint64_t recordedSpans() const { return m_recorded.load(std::memory_order_relaxed); }

    struct Chunk {  // one thread's buffer, moved to the shared list
        Lane lane;
        std::vector<TraceRecord> records;
    };

private:
    Tracer() = default;
    friend struct ThreadBuffer;
    void push(Chunk&& chunk);

    static std::atomic<int> s_level;
    static std::atomic<int64_t> s_step;
    static std::atomic<uint32_t> s_session;
    std::mutex m_mutex;
    std::vector<Chunk> m_chunks;
    std::atomic<uint64_t> m_recorded{0};
};

// RAII span on the current thread's lane; inactive (free) when the tracer's level is below
// `minLevel` at construction.
class TraceScope {
public:
    TraceScope(const char* name, const char* category, TraceLevel minLevel = TraceLevel::Spans)
        : m_name(name), m_category(category),
          m_start(static_cast<int>(Tracer::level()) >= static_cast<int>(minLevel) ? nowNs() : -1)
    {
    }
    ~TraceScope()
    {
        if (m_start >= 0) Tracer::recordSpan(m_name, m_category, m_start, nowNs(), m_args.empty() ? nullptr : &m_args);
    }
    TraceScope(const TraceScope&) = delete;
    TraceScope& operator=(const TraceScope&) = delete;

    bool active() const { return m_start >= 0; }
    void args(std::initializer_list<std::pair<const char*, std::string>> a) { m_args.insert(m_args.end(), a); }

private:
    const char* m_name;
    const char* m_category;
    int64_t m_start;
    TraceArgs m_args;
};

// A thread that periodically collects the tracer's spans and publishes them on a bus. The
// owner (the Trainer) starts it for a traced run and stops it at the end: stop() flushes the
// calling thread and publishes everything left.
class TraceCollector {
public:
    // Every interval it wakes and publishes what the threads handed over (kHelperPeriod: see
    // there why not more often).
    TraceCollector(EventBus& bus, std::string runId, std::chrono::milliseconds interval = kHelperPeriod);
    ~TraceCollector();
    TraceCollector(const TraceCollector&) = delete;
    TraceCollector& operator=(const TraceCollector&) = delete;
    void stop();
    uint64_t published() const { return m_published.load(std::memory_order_relaxed); }

private:
    void publishOnce();
    EventBus& m_bus;
    std::string m_runId;
    std::chrono::milliseconds m_interval;
    std::mutex m_mutex;
    std::condition_variable m_cv;
    bool m_stop = false;
    std::atomic<uint64_t> m_published{0};
    std::thread m_thread;
};

} // namespace ts::telemetry

#define TS_TELEMETRY_CONCAT_INNER_(a, b) a##b
#define TS_TELEMETRY_CONCAT_(a, b) TS_TELEMETRY_CONCAT_INNER_(a, b)

#if defined(TS_TRACING) && TS_TRACING
// A span from here to the end of the enclosing block (name, category: string literals or interned).
#define TS_TRACE_SCOPE(name, category) \
    ::ts::telemetry::TraceScope TS_TELEMETRY_CONCAT_(ts_trace_scope_, __LINE__)(name, category)
// The same with arguments, evaluated only when the span is recorded:
//   TS_TRACE_SCOPE_ARGS("load", "io", {"file", path}, {"bytes", std::to_string(n)});
// Expands to two statements: use it inside braces.
#define TS_TRACE_SCOPE_ARGS(name, category, ...)                                                  \
    ::ts::telemetry::TraceScope TS_TELEMETRY_CONCAT_(ts_trace_scope_, __LINE__)(name, category); \
    if (TS_TELEMETRY_CONCAT_(ts_trace_scope_, __LINE__).active())                                \
    TS_TELEMETRY_CONCAT_(ts_trace_scope_, __LINE__).args({__VA_ARGS__})
// Recorded only at TraceLevel::Detailed (per-layer spans).
#define TS_TRACE_SCOPE_DETAIL(name, category)                                                    \
    ::ts::telemetry::TraceScope TS_TELEMETRY_CONCAT_(ts_trace_scope_, __LINE__)(name, category, \
                                                                               ::ts::telemetry::TraceLevel::Detailed)
#define TS_TRACE_COUNTER(name, value)                                                \
    do {                                                                             \
        if (::ts::telemetry::Tracer::enabled()) ::ts::telemetry::Tracer::recordCounter(name, value); \
    } while (0)
#else
#define TS_TRACE_SCOPE(name, category) \
    do {                               \
    } while (0)
#define TS_TRACE_SCOPE_ARGS(name, category, ...) \
    do {                                         \
    } while (0)
#define TS_TRACE_SCOPE_DETAIL(name, category) \
    do {                                      \
    } while (0)
#define TS_TRACE_COUNTER(name, value) \
    do {                              \
    } while (0)
#endif
