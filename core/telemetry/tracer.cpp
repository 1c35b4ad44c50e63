#include "telemetry/tracer.h"
#include "common/background_thread.h"

#include <charconv>
#include <unordered_set>

#include "telemetry/bus.h"

namespace ts::telemetry {

std::atomic<int> Tracer::s_level{0};
std::atomic<int64_t> Tracer::s_step{0};
std::atomic<uint32_t> Tracer::s_session{0};

namespace {

constexpr std::size_t kFlushRecords = 1024;
constexpr int64_t kFlushAgeNs = 100'000'000;  // 100 ms: the collector sees spans promptly

int64_t steadyToWallOffsetUs()
{
    static const int64_t offset = [] {
        const int64_t sys = std::chrono::duration_cast<std::chrono::microseconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count();
        return sys - nowNs() / 1000;
    }();
    return offset;
}

std::atomic<int> g_threadCounter{0};

std::string formatDouble(double v)
{
    char buf[32];
    auto r = std::to_chars(buf, buf + sizeof buf, v);
    return std::string(buf, r.ptr);
}

} // namespace

int64_t wallMicros(int64_t steadyNs) { return steadyToWallOffsetUs() + steadyNs / 1000; }
int64_t wallNowMicros() { return wallMicros(nowNs()); }

struct ThreadBuffer {
    Lane lane;
    std::vector<TraceRecord> records;
    int64_t firstNs = 0;

    ThreadBuffer() { lane = Lane{"local", "", "thread " + std::to_string(g_threadCounter.fetch_add(1) + 1)}; }
    ~ThreadBuffer() { flush(); }

    void flush()
    {
        if (records.empty()) return;
        Tracer::Chunk chunk{lane, std::move(records)};
        records = {};
        records.reserve(128);  // skip the first growth steps; a busy thread grows it further once
        Tracer::instance().push(std::move(chunk));
    }
    void added(int64_t startNs)
    {
        if (records.size() == 1) firstNs = startNs;
        else if (records.size() >= kFlushRecords || startNs - firstNs > kFlushAgeNs) flush();
    }
};

namespace {
ThreadBuffer& threadBuffer()
{
    thread_local ThreadBuffer buffer;
    return buffer;
}
} // namespace

Tracer& Tracer::instance()
{
    // Leaked on purpose: thread_local buffers flush into it from exiting threads, in any order.
    static Tracer* t = new Tracer();
    return *t;
}

const char* Tracer::intern(std::string_view s)
{
    static std::mutex mutex;
    static auto* table = new std::unordered_set<std::string>();
    std::lock_guard lock(mutex);
    return table->emplace(s).first->c_str();
}

void Tracer::setThreadLane(const Lane& lane)
{
    ThreadBuffer& b = threadBuffer();
    if (b.lane == lane) return;
    b.flush();  // records keep the lane they were made on
    b.lane = lane;
}

Lane Tracer::threadLane() { return threadBuffer().lane; }

void Tracer::recordSpan(const char* name, const char* category, int64_t startNs, int64_t endNs, TraceArgs* args)
{
    ThreadBuffer& b = threadBuffer();
    TraceRecord r;
    r.name = name;
    r.category = category;
    r.startNs = startNs;
    r.durationNs = endNs >= startNs ? endNs - startNs : 0;
    r.step = step();
    r.session = s_session.load(std::memory_order_relaxed);
    if (args) r.args = std::move(*args);
    b.records.push_back(std::move(r));
    instance().m_recorded.fetch_add(1, std::memory_order_relaxed);
    b.added(startNs);
}

void Tracer::recordCounter(const char* name, double value)
{
    ThreadBuffer& b = threadBuffer();
    TraceRecord r;
    r.name = name;
    r.category = "counter";
    r.startNs = nowNs();
    r.durationNs = -1;
    r.step = step();
    r.session = s_session.load(std::memory_order_relaxed);
    r.value = value;
    b.records.push_back(std::move(r));
    b.added(r.startNs);
}

void Tracer::flushThread() { threadBuffer().flush(); }

void Tracer::push(Chunk&& chunk)
{
    std::lock_guard lock(m_mutex);
    m_chunks.push_back(std::move(chunk));
}

std::vector<SpanEvent> Tracer::collect(const std::string& runId)
{
    std::vector<Chunk> chunks;
    {
        std::lock_guard lock(m_mutex);
        chunks.swap(m_chunks);
    }
    const uint32_t session = s_session.load(std::memory_order_relaxed);
    std::size_t n = 0;
    for (const auto& c : chunks) n += c.records.size();
    std::vector<SpanEvent> out;
    out.reserve(n);
    for (auto& c : chunks) {
        for (auto& r : c.records) {
            if (r.session != session) continue;  // left over from an earlier traced run
            SpanEvent e;
            e.stamp.runId = runId;
            e.stamp.step = r.step;
            e.stamp.lane = c.lane;
            e.name = r.name ? r.name : "";
            e.category = r.category ? r.category : "";
            // Round both ends (not the duration) so nested spans stay nested in microseconds.
            e.startUs = wallMicros(r.startNs);
            e.stamp.wallTimeUs = e.startUs;
            if (r.durationNs >= 0) {
                e.durationUs = wallMicros(r.startNs + r.durationNs) - e.startUs;
            } else {
                e.durationUs = 0;
                e.args["value"] = formatDouble(r.value);
            }
            for (auto& [k, v] : r.args) e.args[k ? k : ""] = std::move(v);
            out.push_back(std::move(e));
        }
    }
    return out;
}

void Tracer::discard()
{
    std::lock_guard lock(m_mutex);
    m_chunks.clear();
}

void Tracer::beginSession()
{
    std::lock_guard lock(m_mutex);
    m_chunks.clear();
    s_session.fetch_add(1, std::memory_order_relaxed);
}

TraceCollector::TraceCollector(EventBus& bus, std::string runId, std::chrono::milliseconds interval)
    : m_bus(bus), m_runId(std::move(runId)), m_interval(interval)
{
    m_thread = std::thread([this] {
        becomeBackgroundThread("ts-trace-coll");
        std::unique_lock lock(m_mutex);
        while (!m_stop) {
            m_cv.wait_for(lock, m_interval, [this] { return m_stop; });
            if (m_stop) break;
            lock.unlock();
            publishOnce();
            lock.lock();
        }
    });
}

TraceCollector::~TraceCollector() { stop(); }

void TraceCollector::stop()
{
    if (!m_thread.joinable()) return;
    Tracer::flushThread();
    {
        std::lock_guard lock(m_mutex);
        m_stop = true;
    }
    m_cv.notify_all();
    m_thread.join();
    publishOnce();
}

void TraceCollector::publishOnce()
{
    auto spans = Tracer::instance().collect(m_runId);
    for (auto& s : spans) m_bus.publish(Event(std::move(s)));
    m_published.fetch_add(spans.size(), std::memory_order_relaxed);
}

} // namespace ts::telemetry
