#include "store/run_store.h"

#include "common/utf8.h"

#include "telemetry/chrome_trace.h"
#include "common/background_thread.h"
#include "common/paths.h"

#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <string_view>
#include <limits>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <future>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>
#include <variant>

#include "store/hash.h"
#include "store/process_identity.h"
#include "store/schema.h"
#include "store/sqlite_db.h"
#include "store/step_series.h"

namespace ts::store {

namespace fs = std::filesystem;
using telemetry::Event;

// ---------------------------------------------------------------------------------------------
// Names and small helpers

const char* statusName(RunState s)
{
    switch (s) {
    case RunState::Created: return "created";
    case RunState::Running: return "running";
    case RunState::Paused: return "paused";
    case RunState::Completed: return "completed";
    case RunState::Cancelled: return "cancelled";
    case RunState::Failed: return "failed";
    case RunState::Interrupted: return "interrupted";
    }
    return "created";
}

std::optional<RunState> parseStatus(const std::string& s)
{
    for (RunState r : {RunState::Created, RunState::Running, RunState::Paused, RunState::Completed, RunState::Cancelled,
                       RunState::Failed, RunState::Interrupted})
        if (s == statusName(r)) return r;
    return std::nullopt;
}

bool isTerminal(RunState s)
{
    return s == RunState::Completed || s == RunState::Cancelled || s == RunState::Failed || s == RunState::Interrupted;
}

std::string defaultDatabasePath() { return (fs::path(userDataDir()) / "runs.db").string(); }

std::string newRunId()
{
    thread_local std::mt19937_64 rng([] {
        std::random_device rd;
        std::seed_seq seq{rd(), rd(), rd(), rd(),
                          static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count())};
        return std::mt19937_64(seq);
    }());
    uint64_t a = rng(), b = rng();
    a = (a & 0xffffffffffff0fffull) | 0x0000000000004000ull;  // version 4
    b = (b & 0x3fffffffffffffffull) | 0x8000000000000000ull;  // variant 10
    char buf[40];
    std::snprintf(buf, sizeof buf, "%08llx-%04llx-%04llx-%04llx-%012llx", static_cast<unsigned long long>(a >> 32),
                  static_cast<unsigned long long>((a >> 16) & 0xffff), static_cast<unsigned long long>(a & 0xffff),
                  static_cast<unsigned long long>(b >> 48), static_cast<unsigned long long>(b & 0xffffffffffffull));
    return buf;
}

namespace {

int64_t nowUs()
{
    return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

int64_t stampTime(const telemetry::Stamp& s) { return s.wallTimeUs > 0 ? s.wallTimeUs : nowUs(); }

const char* levelName(telemetry::LogLevel l)
{
    switch (l) {
    case telemetry::LogLevel::Debug: return "debug";
    case telemetry::LogLevel::Info: return "info";
    case telemetry::LogLevel::Warning: return "warning";
    case telemetry::LogLevel::Error: return "error";
    }
    return "info";
}

telemetry::LogLevel parseLevel(const std::string& s)
{
    if (s == "debug") return telemetry::LogLevel::Debug;
    if (s == "warning") return telemetry::LogLevel::Warning;
    if (s == "error") return telemetry::LogLevel::Error;
    return telemetry::LogLevel::Info;
}

nlohmann::json parseJsonColumn(const std::string& text)
{
    if (text.empty()) return nullptr;
    nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    return j.is_discarded() ? nlohmann::json(nullptr) : j;
}

std::string absolutePath(const std::string& p)
{
    std::error_code ec;
    fs::path a = fs::absolute(p, ec);
    return (ec ? fs::path(p) : a).lexically_normal().string();
}

std::string defaultRunName(const nlohmann::json& model)
{
    std::string base = model.is_object() ? model.value("name", std::string("run")) : std::string("run");
    const std::time_t t = std::time(nullptr);
    std::tm tm{};
    localtime_r(&t, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
    return base + " " + buf;
}

Error notFoundRun(const std::string& path, const std::string& runId)
{
    return makeError(ErrorCode::NotFound, "no run '" + runId + "' in run database '" + path + "'",
                     std::string(runId.size() < 4 ? "an id prefix needs 4 characters or more; " : "") +
                         "list the runs with `trainstudio-cli runs list --db " + path + "`");
}

Error readOnlyError(const std::string& path)
{
    return makeError(ErrorCode::Unsupported, "run database '" + path + "' is open read-only",
                     "open it without the read-only option to change it");
}

using telemetry::appendJsonString;

void appendInt(std::string& out, int64_t v)
{
    char buf[24];
    auto r = std::to_chars(buf, buf + sizeof buf, v);
    out.append(buf, r.ptr);
}

// Spans are stored per batch and run as one zlib-compressed JSON document:
//   {"lanes": [[worker, device, thread], ...],
//    "spans": [[name, category, lane, startUs, durationUs, step, args|null], ...]}
// The writer thread encodes every span the run records, so the text is written straight into
// one reused buffer (no JSON tree) and one deflate stream is reset per chunk rather than set up
// (a quarter megabyte of tables) each time.
class SpanEncoder {
public:
    ~SpanEncoder()
    {
        if (m_ready) deflateEnd(&m_zs);
    }

    // The compressed chunk (empty on a zlib failure); t0/t1 the time it covers.
    std::string_view encode(const std::vector<const telemetry::SpanEvent*>& spans, int64_t& t0, int64_t& t1,
                            std::size_t& rawBytes)
    {
        m_lanes.clear();
        m_rows.clear();
        t0 = std::numeric_limits<int64_t>::max();
        t1 = std::numeric_limits<int64_t>::min();
        for (const telemetry::SpanEvent* s : spans) {
            std::size_t lane = 0;
            for (; lane < m_lanes.size(); ++lane)
                if (*m_lanes[lane] == s->stamp.lane) break;
            if (lane == m_lanes.size()) m_lanes.push_back(&s->stamp.lane);
            m_rows += m_rows.empty() ? "[" : ",[";
            appendJsonString(m_rows, s->name);
            m_rows += ',';
            appendJsonString(m_rows, s->category);
            m_rows += ',';
            appendInt(m_rows, static_cast<int64_t>(lane));
            m_rows += ',';
            appendInt(m_rows, s->startUs);
            m_rows += ',';
            appendInt(m_rows, s->durationUs);
            m_rows += ',';
            appendInt(m_rows, s->stamp.step);
            if (s->args.empty()) {
                m_rows += ",null]";
            } else {
                char sep = '{';
                m_rows += ',';
                for (const auto& [k, v] : s->args) {
                    m_rows += sep;
                    sep = ',';
                    appendJsonString(m_rows, k);
                    m_rows += ':';
                    appendJsonString(m_rows, v);
                }
                m_rows += "}]";
            }
            t0 = std::min(t0, s->startUs);
            t1 = std::max(t1, s->startUs + s->durationUs);
        }
        m_raw = "{\"lanes\":[";
        for (std::size_t i = 0; i < m_lanes.size(); ++i) {
            m_raw += i ? ",[" : "[";
            appendJsonString(m_raw, m_lanes[i]->worker);
            m_raw += ',';
            appendJsonString(m_raw, m_lanes[i]->device);
            m_raw += ',';
            appendJsonString(m_raw, m_lanes[i]->thread);
            m_raw += ']';
        }
        m_raw += "],\"spans\":[";
        m_raw += m_rows;
        m_raw += "]}";
        rawBytes = m_raw.size();
        if (!m_ready) {
            // Level 1: spans compress ~10x even so, and the writer thread stays cheap.
            if (deflateInit(&m_zs, 1) != Z_OK) return {};
            m_ready = true;
        } else if (deflateReset(&m_zs) != Z_OK) {
            return {};
        }
        m_out.resize(deflateBound(&m_zs, static_cast<uLong>(m_raw.size())));
        m_zs.next_in = reinterpret_cast<Bytef*>(m_raw.data());
        m_zs.avail_in = static_cast<uInt>(m_raw.size());
        m_zs.next_out = reinterpret_cast<Bytef*>(m_out.data());
        m_zs.avail_out = static_cast<uInt>(m_out.size());
        if (deflate(&m_zs, Z_FINISH) != Z_STREAM_END) return {};
        return std::string_view(m_out.data(), m_out.size() - m_zs.avail_out);
    }

private:
    z_stream m_zs{};
    bool m_ready = false;
    std::vector<const telemetry::Lane*> m_lanes;
    std::string m_rows, m_raw, m_out;
};

Status decodeSpans(std::string_view blob, std::size_t rawBytes, const std::string& runId, const std::string& where,
                   std::vector<telemetry::SpanEvent>& out, int64_t t0, int64_t t1)
{
    std::string raw(rawBytes, '\0');
    uLongf size = static_cast<uLongf>(rawBytes);
    if (rawBytes == 0 || uncompress(reinterpret_cast<Bytef*>(raw.data()), &size, reinterpret_cast<const Bytef*>(blob.data()),
                                    static_cast<uLong>(blob.size())) != Z_OK ||
        size != rawBytes)
        return makeError(ErrorCode::ParseError, where + ": a trace chunk of run " + runId + " is damaged (zlib)",
                         "the run's other history is unaffected");
    nlohmann::json j = nlohmann::json::parse(raw, nullptr, false);
    if (j.is_discarded() || !j.is_object())
        return makeError(ErrorCode::ParseError, where + ": a trace chunk of run " + runId + " is damaged (JSON)");
    try {
        std::vector<telemetry::Lane> lanes;
        for (const auto& l : j.at("lanes"))
            lanes.push_back({l.at(0).get<std::string>(), l.at(1).get<std::string>(), l.at(2).get<std::string>()});
        for (const auto& r : j.at("spans")) {
            telemetry::SpanEvent s;
            s.startUs = r.at(3).get<int64_t>();
            s.durationUs = r.at(4).get<int64_t>();
            if (s.startUs > t1 || s.startUs + s.durationUs < t0) continue;
            s.name = r.at(0).get<std::string>();
            s.category = r.at(1).get<std::string>();
            const auto lane = r.at(2).get<std::size_t>();
            if (lane < lanes.size()) s.stamp.lane = lanes[lane];
            s.stamp.runId = runId;
            s.stamp.step = r.at(5).get<int64_t>();
            s.stamp.wallTimeUs = s.startUs;
            if (r.at(6).is_object()) s.args = r.at(6).get<std::map<std::string, std::string>>();
            out.push_back(std::move(s));
        }
    } catch (const nlohmann::json::exception& e) {
        return makeError(ErrorCode::ParseError, where + ": a trace chunk of run " + runId + " is damaged: " + e.what());
    }
    return okStatus();
}

// The columns readRun() expects, in order.
constexpr const char* kRunColumns =
    "r.id, r.name, r.project, r.model_name, r.strategy, r.config_hash, r.seed, r.status, r.error, r.created_us, "
    "r.started_us, r.ended_us, r.writer_host, r.writer_pid, r.writer_start, "
    "(SELECT group_concat(tag, char(31)) FROM (SELECT tag FROM run_tags WHERE run = r.rid ORDER BY tag)), r.rid";

RunInfo readRun(const sql::Stmt& s)
{
    RunInfo r;
    r.id = s.text(0);
    r.name = s.text(1);
    r.project = s.text(2);
    r.modelName = s.text(3);
    r.strategy = s.text(4);
    r.configHash = s.text(5);
    r.seed = static_cast<uint64_t>(s.int64(6));
    r.status = parseStatus(s.text(7)).value_or(RunState::Created);
    r.error = s.text(8);
    r.createdUs = s.int64(9);
    r.startedUs = s.isNull(10) ? 0 : s.int64(10);
    r.endedUs = s.isNull(11) ? 0 : s.int64(11);
    if (!isTerminal(r.status)) {
        // A run whose writer is gone is interrupted, whatever the row still says (a read-only
        // open cannot fix the row, and the process that would has not opened it yet).
        ProcessIdentity w{s.text(12), s.int64(13), s.text(14)};
        if (processLiveness(w) == Liveness::Gone) r.status = RunState::Interrupted;
    }
    const std::string tags = s.text(15);
    std::size_t pos = 0;
    while (!tags.empty() && pos <= tags.size()) {
        const auto end = tags.find('\x1f', pos);
        r.tags.push_back(tags.substr(pos, end == std::string::npos ? std::string::npos : end - pos));
        if (end == std::string::npos) break;
        pos = end + 1;
    }
    return r;
}

// RunInfo::lastStep, read apart from the run's row so that a damaged metrics page costs that
// one number (-1), not the whole run list. The epochs' ends count too: a parameter-server run's
// step series holds the reporting worker's steps only, while its epochs end at ps:0's count of
// every worker's steps (a 32-step run listed 31 when worker 1 took the last one).
void readLastStep(const sql::Db& db, int64_t rid, RunInfo& r)
{
    auto s = db.prepare("SELECT max(s) FROM (SELECT max(step1) AS s FROM step_series WHERE run = ?1 AND name = 'loss' "
                        "UNION ALL SELECT max(step) FROM epoch_metrics WHERE run = ?1)");
    if (!s.ok()) {
        r.lastStep = -1;
        return;
    }
    s->bind(1, rid);
    auto row = s->step();
    r.lastStep = !row.ok() ? -1 : (*row && !s->isNull(0) ? s->int64(0) : 0);
}

// ownTransaction: false when called inside the writer's batch transaction.
Result<int> markInterruptedOn(sql::Db& db, bool ownTransaction)
{
    struct Candidate {
        int64_t rid;
        ProcessIdentity writer;
    };
    std::vector<Candidate> gone;
    {
        TS_ASSIGN(sql::Stmt s, db.prepare("SELECT rid, writer_host, writer_pid, writer_start FROM runs "
                                          "WHERE status IN ('created', 'running', 'paused')"));
        while (true) {
            TS_ASSIGN(bool row, s.step());
            if (!row) break;
            Candidate c{s.int64(0), {s.text(1), s.int64(2), s.text(3)}};
            if (processLiveness(c.writer) == Liveness::Gone) gone.push_back(std::move(c));
        }
    }
    if (gone.empty()) return 0;
    std::optional<sql::Transaction> tx;
    if (ownTransaction) {
        TS_ASSIGN(auto t, sql::Transaction::begin(db, true));
        tx.emplace(std::move(t));
    }
    TS_ASSIGN(sql::Stmt upd,
              db.prepare("UPDATE runs SET status = 'interrupted', error = ?2, ended_us = coalesce("
                         "(SELECT last_wall_us FROM step_series WHERE run = ?1 AND name = 'loss' ORDER BY step1 DESC, id DESC LIMIT 1), "
                         "started_us, created_us) WHERE rid = ?1 AND status IN ('created', 'running', 'paused')"));
    for (const Candidate& c : gone) {
        upd.bind(1, c.rid).bind(2, "the process writing it (pid " + std::to_string(c.writer.pid) + " on " + c.writer.host +
                                       ") ended without finishing the run; everything recorded up to then is kept");
        TS_TRY(upd.run());
    }
    if (tx) TS_TRY(tx->commit());
    return static_cast<int>(gone.size());
}

Status migrate(sql::Db& db)
{
    while (true) {
        TS_ASSIGN(auto tx, sql::Transaction::begin(db, true));
        // Another process may have migrated between our check and the lock: read again under it.
        TS_ASSIGN(int64_t version, db.queryInt("PRAGMA user_version"));
        if (version >= schemaVersion()) return tx.commit();
        const int next = static_cast<int>(version) + 1;
        if (next == 1) TS_TRY(db.exec("PRAGMA application_id = " + std::to_string(kApplicationId)));
        Status s = db.exec(migrationSql(next));
        if (s.ok()) s = migrateData(db, next);
        if (!s.ok()) {
            Error e = s.takeError();
            e.message += " (while upgrading the schema to version " + std::to_string(next) + "; the database was left unchanged)";
            return e;
        }
        TS_TRY(db.exec("PRAGMA user_version = " + std::to_string(next)));
        TS_TRY(tx.commit());
    }
}

} // namespace

// ---------------------------------------------------------------------------------------------
// Impl

struct RunStore::Impl {
    using Task = std::function<Status()>;
    struct TaskItem {
        Task fn;
        std::shared_ptr<std::promise<Status>> done;
    };
    using Item = std::variant<Event, TaskItem>;

    std::string path;
    OpenOptions options;
    int fileVersion = 0;
    ProcessIdentity self;

    // Files in the store's own folder are recorded relative to the database's folder, so a
    // history moved or copied with its folder (another machine, a new home) keeps its
    // checkpoints; files elsewhere (the user's) keep their absolute paths.
    std::string storedPath(const std::string& absolute) const
    {
        const fs::path dbDir = fs::path(absolutePath(path)).parent_path();
        const std::string root = absolutePath(filesRoot(path));
        if (!absolute.starts_with(root + "/")) return absolute;
        return fs::path(absolute).lexically_relative(dbDir).string();
    }
    std::string resolvedPath(const std::string& stored) const
    {
        const fs::path p(stored);
        if (p.is_relative()) return (fs::path(absolutePath(path)).parent_path() / p).lexically_normal().string();
        // Recorded absolute by earlier versions: a history moved with its folder
        // finds them under the folder's new place.
        std::error_code ec;
        if (fs::exists(p, ec)) return stored;
        const std::string root = absolutePath(filesRoot(path));
        const std::string marker = "/" + fs::path(root).filename().string() + "/";
        if (const auto at = stored.rfind(marker); at != std::string::npos) {
            const fs::path moved = fs::path(root) / stored.substr(at + marker.size());
            if (fs::exists(moved, ec)) return moved.string();
        }
        return stored;
    }

    sql::Db reader;
    std::recursive_mutex readMutex;

    // Writer side: the queue is shared, the rest belongs to the writer thread.
    sql::Db writer;
    std::thread thread;
    std::mutex queueMutex;
    std::condition_variable queueCv;
    std::vector<Item> queue;
    std::size_t queuedEvents = 0;
    bool queuedTask = false;
    bool stopping = false;
    bool running = false;
    bool idle = false;  // the writer sleeps until something is queued (no sources to poll)
    // Sources the writer pulls from itself (bus subscriptions). sourceMutex is held while one
    // is drained, so removeSource() never races a pull; sourceCount is read under queueMutex.
    std::mutex sourceMutex;
    std::vector<std::pair<int, EventSource>> sources;
    std::size_t sourceCount = 0;
    int nextSourceId = 1;
    std::vector<Event> pulled;
    std::chrono::steady_clock::time_point firstQueued;
    std::atomic<uint64_t> dropped{0};
    std::mutex errorMutex;
    std::optional<Error> writeError;

    std::unordered_map<std::string, int64_t> ridCache;
    std::map<int64_t, std::vector<const telemetry::SpanEvent*>> pendingSpans;
    SpanEncoder spanEncoder;
    // Step metrics of the batch per (run, metric), packed into step_series rows at its end.
    std::map<std::pair<int64_t, std::string>, std::vector<StepSample>> pendingSteps;
    std::string stepBlob;
    sql::Stmt insSeries, insEpoch, insBreakdown, insDevice, insPipeline, insChunk, insFinding, insLog, selRid, insAutoRun;

    ~Impl() { stop(); }

    // --- writer thread ---------------------------------------------------------------------
    void start()
    {
        running = true;
        thread = std::thread([this] {
            becomeBackgroundThread("ts-store-writer");  // the run store's writer: batches, never urgent
            loop();
        });
    }

    void stop()
    {
        {
            std::lock_guard lk(queueMutex);
            if (!running) return;
            stopping = true;
        }
        queueCv.notify_all();
        thread.join();
        running = false;
    }

    void noteError(Error e)
    {
        std::lock_guard lk(errorMutex);
        if (!writeError) writeError = std::move(e);
    }

    void enqueue(std::vector<Event>&& events)
    {
        if (events.empty()) return;
        bool wake = false;
        {
            std::lock_guard lk(queueMutex);
            if (!running || stopping) {
                dropped += events.size();
                return;
            }
            if (queuedEvents + events.size() > options.maxQueuedEvents) {
                dropped += events.size();
                return;
            }
            if (queue.empty()) firstQueued = std::chrono::steady_clock::now();
            for (auto& e : events) queue.emplace_back(std::move(e));
            queuedEvents += events.size();
            // A writer that polls sources comes round within batchMs anyway: wake it only early
            // for a full batch, and from its idle sleep.
            wake = queuedEvents >= options.batchEvents || (idle && queue.size() == events.size());
        }
        if (wake) queueCv.notify_one();
    }

    // Writer thread, sourceMutex held: appends what the sources have ready to `out`; returns
    // how many.
    std::size_t pullSources(std::vector<Item>& out)
    {
        std::size_t n = 0;
        for (auto& [id, drain] : sources) {
            pulled.clear();
            n += drain(pulled);
            for (Event& e : pulled) out.emplace_back(std::move(e));
        }
        pulled.clear();
        return n;
    }

    Status submit(Task fn)
    {
        if (options.readOnly) return readOnlyError(path);
        auto done = std::make_shared<std::promise<Status>>();
        auto fut = done->get_future();
        {
            std::lock_guard lk(queueMutex);
            if (!running || stopping)
                return makeError(ErrorCode::Cancelled, "run database '" + path + "' is closed");
            if (queue.empty()) firstQueued = std::chrono::steady_clock::now();
            queue.emplace_back(TaskItem{std::move(fn), std::move(done)});
            queuedTask = true;
        }
        queueCv.notify_one();
        return fut.get();
    }

    // One wake-up per batch while events flow: the writer sleeps batchMs, then takes what the
    // sources and the queue hold (sources first: a task queued meanwhile, such as a status
    // change, follows the events published before it).
    void loop()
    {
        std::vector<Item> batch, queued, pulledItems;
        const auto period = std::chrono::milliseconds(options.batchMs);
        auto urgent = [&] { return stopping || queuedTask || queuedEvents >= options.batchEvents; };
        std::unique_lock lk(queueMutex);
        while (true) {
            if (!urgent()) {
                if (sourceCount > 0) {
                    queueCv.wait_for(lk, period, urgent);
                } else if (queue.empty()) {
                    idle = true;
                    queueCv.wait(lk, [&] { return stopping || !queue.empty() || sourceCount > 0; });
                    idle = false;
                    continue;  // decide again: a source to poll, or a batch to let fill
                } else {
                    queueCv.wait_until(lk, firstQueued + period, urgent);
                }
            }
            lk.unlock();
            bool last = false;
            {
                // Under sourceMutex, so that what pullSource() moved to the queue (older than
                // what the sources hold now) is taken in this batch or entirely in the next.
                std::lock_guard sl(sourceMutex);
                {
                    std::lock_guard ql(queueMutex);
                    queued.swap(queue);
                    queuedEvents = 0;
                    queuedTask = false;
                    last = stopping;
                }
                pullSources(pulledItems);
            }
            // The pulled events go before the first queued task (a status change or flush the
            // owner asked for after publishing them), after the events queued before it.
            bool placed = false;
            for (Item& it : queued) {
                if (!placed && std::holds_alternative<TaskItem>(it)) {
                    for (Item& p : pulledItems) batch.push_back(std::move(p));
                    placed = true;
                }
                batch.push_back(std::move(it));
            }
            if (!placed)
                for (Item& p : pulledItems) batch.push_back(std::move(p));
            pulledItems.clear();
            queued.clear();
            if (!batch.empty()) writeBatch(batch);
            batch.clear();
            lk.lock();
            if (last && queue.empty()) break;  // stopping: the sources were drained once more above
        }
    }

    int addSource(EventSource drain)
    {
        int id = 0;
        {
            std::lock_guard sl(sourceMutex);
            id = nextSourceId++;
            sources.emplace_back(id, std::move(drain));
        }
        {
            std::lock_guard lk(queueMutex);
            ++sourceCount;
        }
        queueCv.notify_one();  // out of an idle sleep: there is something to poll now
        return id;
    }

    // Moves what the source holds to the queue now (any thread): its buffer is nearly full
    // because the writer is held up (a slow disk, another process's write lock).
    void pullSource(int id)
    {
        std::vector<Event> events;
        std::lock_guard sl(sourceMutex);
        for (auto& [sid, drain] : sources)
            if (sid == id) drain(events);
        enqueue(std::move(events));
    }

    Status removeSource(int id)
    {
        std::vector<Event> rest;
        bool found = false;
        {
            std::lock_guard sl(sourceMutex);
            for (auto it = sources.begin(); it != sources.end(); ++it) {
                if (it->first != id) continue;
                it->second(rest);  // what arrived since the writer's last pull
                sources.erase(it);
                found = true;
                break;
            }
        }
        if (!found) return okStatus();
        {
            std::lock_guard lk(queueMutex);
            --sourceCount;
        }
        enqueue(std::move(rest));
        return okStatus();
    }

    void writeBatch(std::vector<Item>& batch)
    {
        std::vector<std::pair<std::shared_ptr<std::promise<Status>>, Status>> results;
        std::size_t events = 0;
        auto tx = sql::Transaction::begin(writer, true);
        if (!tx.ok()) {
            Error e = tx.error();
            for (auto& item : batch) {
                if (auto* t = std::get_if<TaskItem>(&item)) t->done->set_value(e);
                else ++events;
            }
            dropped += events;
            noteError(std::move(e));
            return;
        }
        for (auto& item : batch) {
            if (auto* ev = std::get_if<Event>(&item)) {
                ++events;
                Status s = std::visit([&](const auto& e) { return write(e); }, *ev);
                if (!s.ok()) {
                    ++dropped;
                    noteError(s.takeError());
                }
            } else {
                auto& t = std::get<TaskItem>(item);
                // A failed task undoes only its own changes, not the batch's events.
                Status s = writer.exec("SAVEPOINT task");
                if (s.ok()) {
                    s = t.fn();
                    if (s.ok()) s = writer.exec("RELEASE task");
                    else {
                        (void)writer.exec("ROLLBACK TO task");
                        (void)writer.exec("RELEASE task");
                    }
                }
                results.emplace_back(t.done, std::move(s));
            }
        }
        Status steps = writeStepSeries();
        if (!steps.ok()) noteError(steps.takeError());
        Status spans = writeSpanChunks();
        if (!spans.ok()) noteError(spans.takeError());
        Status c = tx->commit();
        if (!c.ok()) {
            // The whole batch is gone: forget run ids it may have created.
            ridCache.clear();
            dropped += events;
            noteError(c.error());
            for (auto& r : results)
                if (r.second.ok()) r.second = c.error();
        }
        for (auto& r : results) r.first->set_value(std::move(r.second));
    }

    Status prepareWriterStatements()
    {
        TS_ASSIGN(insSeries, writer.prepare("INSERT INTO step_series (run, name, step0, step1, samples, last_wall_us, data) "
                                            "VALUES (?, ?, ?, ?, ?, ?, ?)"));
        TS_ASSIGN(insEpoch, writer.prepare("INSERT OR REPLACE INTO epoch_metrics (run, epoch, name, value, step, wall_us) "
                                           "VALUES (?, ?, ?, ?, ?, ?)"));
        TS_ASSIGN(insBreakdown,
                  writer.prepare("INSERT INTO step_breakdowns (run, step, wall_us, worker, device, step_s, input_s, forward_s, "
                                 "backward_s, communication_s, optimizer_s, other_s) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"));
        TS_ASSIGN(insDevice,
                  writer.prepare("INSERT INTO device_samples (run, step, wall_us, worker, device, utilisation, process_cpu, "
                                 "per_core, memory_used, memory_total, temperature_c, power_w) "
                                 "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"));
        TS_ASSIGN(insPipeline,
                  writer.prepare("INSERT INTO pipeline_samples (run, step, wall_us, worker, stage, produced, busy_s, "
                                 "queue_depth, queue_capacity, wait_s, parallelism) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"));
        TS_ASSIGN(insChunk, writer.prepare("INSERT INTO trace_chunks (run, start_us, end_us, spans, encoding, raw_bytes, data) "
                                           "VALUES (?, ?, ?, ?, 'json+zlib', ?, ?)"));
        TS_ASSIGN(insFinding,
                  writer.prepare("INSERT INTO findings (run, wall_us, step, kind, severity, message, recommendation, "
                                 "first_step, last_step) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"));
        TS_ASSIGN(insLog, writer.prepare("INSERT INTO run_logs (run, wall_us, step, level, message, hint, place, worker) "
                                         "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"));
        TS_ASSIGN(selRid, writer.prepare("SELECT rid FROM runs WHERE id = ?"));
        TS_ASSIGN(insAutoRun, writer.prepare("INSERT INTO runs (id, name, status, created_us, started_us, writer_host, "
                                             "writer_pid, writer_start) VALUES (?1, ?1, 'running', ?2, ?2, ?3, ?4, ?5)"));
        return okStatus();
    }

    // The integer key of a run (writer thread only). autoCreate: events of a run nobody created
    // here (a remote worker's, say) get a minimal entry instead of being lost.
    Result<int64_t> rid(const std::string& runId, bool autoCreate)
    {
        if (auto it = ridCache.find(runId); it != ridCache.end()) return it->second;
        if (runId.empty())
            return makeError(ErrorCode::InvalidArgument, "run database '" + path + "': an event without a run id",
                             "stamp every event with the run it belongs to");
        selRid.bind(1, runId);
        TS_ASSIGN(bool row, selRid.step());
        int64_t id = row ? selRid.int64(0) : 0;
        selRid.reset();
        if (!row) {
            if (!autoCreate) return notFoundRun(path, runId);
            insAutoRun.bind(1, runId).bind(2, nowUs()).bind(3, self.host).bind(4, self.pid).bind(5, self.start);
            TS_TRY(insAutoRun.run());
            id = writer.lastInsertRowId();
        }
        ridCache.emplace(runId, id);
        return id;
    }

    Status writeStatus(int64_t runKey, RunState state, const std::string& error, int64_t wallUs)
    {
        if (isTerminal(state)) {
            // A completed run has no error, even when an earlier attempt (train --restarts) failed:
            // its log says so.
            TS_ASSIGN(sql::Stmt s, writer.prepare("UPDATE runs SET status = ?1, ended_us = ?2, "
                                                  "error = CASE WHEN ?1 = 'completed' THEN '' WHEN ?3 = '' THEN error ELSE ?3 END WHERE rid = ?4"));
            s.bind(1, statusName(state)).bind(2, wallUs).bind(3, error).bind(4, runKey);
            return s.run();
        }
        // Created / Running / Paused: this process is now the run's writer.
        TS_ASSIGN(sql::Stmt s, writer.prepare("UPDATE runs SET status = ?1, ended_us = NULL, "
                                              "started_us = CASE WHEN ?1 = 'running' THEN coalesce(started_us, ?2) ELSE started_us END, "
                                              "writer_host = ?3, writer_pid = ?4, writer_start = ?5 WHERE rid = ?6"));
        s.bind(1, statusName(state)).bind(2, wallUs).bind(3, self.host).bind(4, self.pid).bind(5, self.start).bind(6, runKey);
        return s.run();
    }

    // Writer thread: drops run `r`'s per-step records beyond `step` (RunStore::rewindRun).
    Status rewind(int64_t r, int64_t step)
    {
        // Samples of this batch not written yet (step series are written at the batch's end).
        for (auto& [key, samples] : pendingSteps)
            if (key.first == r)
                samples.erase(std::remove_if(samples.begin(), samples.end(), [&](const StepSample& s) { return s.step > step; }),
                              samples.end());
        // Blocks that straddle the step keep their first part, re-encoded.
        {
            TS_ASSIGN(sql::Stmt sel, writer.prepare("SELECT rowid, data FROM step_series WHERE run = ?1 AND step0 <= ?2 AND step1 > ?2"));
            sel.bind(1, r).bind(2, step);
            std::vector<std::pair<int64_t, std::vector<StepSample>>> cut;
            for (;;) {
                TS_ASSIGN(bool row, sel.step());
                if (!row) break;
                std::vector<StepSample> kept;
                const std::string blob(sel.blob(1));
                if (!decodeStepSamples(blob, std::numeric_limits<int64_t>::min(), step, kept))
                    return makeError(ErrorCode::IoError, "a damaged step series block could not be cut at step " + std::to_string(step));
                cut.emplace_back(sel.int64(0), std::move(kept));
            }
            for (auto& [rowid, kept] : cut) {
                if (kept.empty()) {
                    TS_ASSIGN(sql::Stmt del, writer.prepare("DELETE FROM step_series WHERE rowid = ?1"));
                    del.bind(1, rowid);
                    TS_TRY(del.run());
                    continue;
                }
                std::string blob;
                encodeStepSamples(kept.data(), kept.size(), blob);
                TS_ASSIGN(sql::Stmt up, writer.prepare("UPDATE step_series SET step1 = ?1, samples = ?2, last_wall_us = ?3, data = ?4 WHERE rowid = ?5"));
                up.bind(1, kept.back().step).bind(2, static_cast<int64_t>(kept.size())).bind(3, kept.back().wallUs)
                    .bindBlob(4, blob.data(), blob.size()).bind(5, rowid);
                TS_TRY(up.run());
            }
        }
        for (const char* sql : {"DELETE FROM step_series WHERE run = ?1 AND step0 > ?2",
                                "DELETE FROM epoch_metrics WHERE run = ?1 AND step > ?2",
                                "DELETE FROM step_breakdowns WHERE run = ?1 AND step > ?2"}) {
            TS_ASSIGN(sql::Stmt del, writer.prepare(sql));
            del.bind(1, r).bind(2, step);
            TS_TRY(del.run());
        }
        return okStatus();
    }

    Status write(const telemetry::RunStateEvent& e)
    {
        TS_ASSIGN(int64_t r, rid(e.stamp.runId, true));
        if (e.resumedAfterStep >= 0) TS_TRY(rewind(r, e.resumedAfterStep));
        return writeStatus(r, e.state, e.message, stampTime(e.stamp));
    }

    Status write(const telemetry::StepMetricsEvent& e)
    {
        TS_ASSIGN(int64_t r, rid(e.stamp.runId, true));
        const int64_t t = stampTime(e.stamp);
        auto one = [&](const std::string& name, double v) {
            auto key = std::make_pair(r, name);
            auto it = pendingSteps.find(key);
            if (it == pendingSteps.end()) it = pendingSteps.emplace(std::move(key), std::vector<StepSample>()).first;
            it->second.push_back({e.stamp.step, e.epoch, t, v});
        };
        one("loss", e.loss);
        for (const auto& [name, v] : e.metrics) one(name, v);
        one("samples_per_sec", e.samplesPerSec);
        one("learning_rate", e.learningRate);
        return okStatus();
    }

    Status write(const telemetry::EpochMetricsEvent& e)
    {
        TS_ASSIGN(int64_t r, rid(e.stamp.runId, true));
        const int64_t t = stampTime(e.stamp);
        auto one = [&](const std::string& name, double v) {
            insEpoch.bind(1, r).bind(2, e.epoch).bind(3, name).bind(4, v).bind(5, e.stamp.step).bind(6, t);
            return insEpoch.run();
        };
        for (const auto& [name, v] : e.metrics) TS_TRY(one(name, v));
        TS_TRY(one("seconds", e.seconds));
        return one("samples_per_sec", e.samplesPerSec);
    }

    Status write(const telemetry::StepBreakdownEvent& e)
    {
        TS_ASSIGN(int64_t r, rid(e.stamp.runId, true));
        insBreakdown.bind(1, r).bind(2, e.stamp.step).bind(3, stampTime(e.stamp)).bind(4, e.stamp.lane.worker)
            .bind(5, e.stamp.lane.device).bind(6, e.stepSeconds).bind(7, e.input).bind(8, e.forward).bind(9, e.backward)
            .bind(10, e.communication).bind(11, e.optimizer).bind(12, e.other);
        return insBreakdown.run();
    }

    Status write(const telemetry::DeviceSampleEvent& e)
    {
        TS_ASSIGN(int64_t r, rid(e.stamp.runId, true));
        insDevice.bind(1, r).bind(2, e.stamp.step).bind(3, stampTime(e.stamp)).bind(4, e.stamp.lane.worker)
            .bind(5, e.stamp.lane.device).bind(6, e.utilisation).bind(7, e.processCpu);
        if (e.perCore.empty()) insDevice.bindNull(8);
        else insDevice.bind(8, nlohmann::json(e.perCore).dump());
        insDevice.bind(9, e.memoryUsed).bind(10, e.memoryTotal).bind(11, e.temperatureC).bind(12, e.powerW);
        return insDevice.run();
    }

    Status write(const telemetry::PipelineSampleEvent& e)
    {
        TS_ASSIGN(int64_t r, rid(e.stamp.runId, true));
        insPipeline.bind(1, r).bind(2, e.stamp.step).bind(3, stampTime(e.stamp)).bind(4, e.stamp.lane.worker)
            .bind(5, e.stage).bind(6, e.produced).bind(7, e.busySeconds).bind(8, e.queueDepth).bind(9, e.queueCapacity)
            .bind(10, e.waitSeconds).bind(11, e.parallelism);
        return insPipeline.run();
    }

    Status write(const telemetry::SpanEvent& e)
    {
        TS_ASSIGN(int64_t r, rid(e.stamp.runId, true));
        pendingSpans[r].push_back(&e);  // written as one chunk per run at the end of the batch
        return okStatus();
    }

    Status write(const telemetry::LogEvent& e)
    {
        TS_ASSIGN(int64_t r, rid(e.stamp.runId, true));
        insLog.bind(1, r).bind(2, stampTime(e.stamp)).bind(3, e.stamp.step).bind(4, levelName(e.level)).bind(5, e.message)
            .bind(6, "").bind(7, "").bind(8, e.stamp.lane.worker);
        return insLog.run();
    }

    Status write(const telemetry::ErrorEvent& e)
    {
        TS_ASSIGN(int64_t r, rid(e.stamp.runId, true));
        insLog.bind(1, r).bind(2, stampTime(e.stamp)).bind(3, e.stamp.step).bind(4, "error").bind(5, e.message)
            .bind(6, e.hint).bind(7, e.where).bind(8, e.stamp.lane.worker);
        return insLog.run();
    }

    Status write(const telemetry::FindingEvent& e)
    {
        TS_ASSIGN(int64_t r, rid(e.stamp.runId, true));
        insFinding.bind(1, r).bind(2, stampTime(e.stamp)).bind(3, e.stamp.step).bind(4, e.kind).bind(5, e.severity)
            .bind(6, e.message).bind(7, e.recommendation).bind(8, e.firstStep).bind(9, e.lastStep);
        return insFinding.run();
    }

    Status writeStepSeries()
    {
        Status result;
        for (auto& [key, samples] : pendingSteps) {
            sortKeepLast(samples);
            for (std::size_t i = 0; i < samples.size(); i += kStepBlockSamples) {
                const std::size_t n = std::min(kStepBlockSamples, samples.size() - i);
                const StepSample* b = samples.data() + i;
                stepBlob.clear();
                encodeStepSamples(b, n, stepBlob);
                insSeries.bind(1, key.first).bind(2, key.second).bind(3, b[0].step).bind(4, b[n - 1].step)
                    .bind(5, static_cast<int64_t>(n)).bind(6, b[n - 1].wallUs).bindBlob(7, stepBlob.data(), stepBlob.size());
                Status st = insSeries.run();
                if (!st.ok() && result.ok()) result = std::move(st);
            }
        }
        pendingSteps.clear();
        return result;
    }

    Status writeSpanChunks()
    {
        Status result;
        for (auto& [r, spans] : pendingSpans) {
            // Chunks of at most 20k spans keep a time-range query from inflating a huge blob.
            for (std::size_t i = 0; i < spans.size(); i += 20000) {
                std::vector<const telemetry::SpanEvent*> part(spans.begin() + static_cast<std::ptrdiff_t>(i),
                                                              spans.begin() + static_cast<std::ptrdiff_t>(std::min(spans.size(), i + 20000)));
                int64_t t0 = 0, t1 = 0;
                std::size_t raw = 0;
                const std::string_view blob = spanEncoder.encode(part, t0, t1, raw);
                if (blob.empty()) {
                    dropped += part.size();
                    if (result.ok()) result = makeError(ErrorCode::Internal, "run database '" + path + "': cannot compress spans");
                    continue;
                }
                insChunk.bind(1, r).bind(2, t0).bind(3, t1).bind(4, static_cast<int64_t>(part.size()))
                    .bind(5, static_cast<int64_t>(raw)).bindBlob(6, blob.data(), blob.size());
                Status s = insChunk.run();
                if (!s.ok()) {
                    dropped += part.size();
                    if (result.ok()) result = std::move(s);
                }
            }
        }
        pendingSpans.clear();
        return result;
    }

    // --- reader side -----------------------------------------------------------------------
    Result<int64_t> readRid(const std::string& runId)
    {
        TS_ASSIGN(sql::Stmt s, reader.prepare("SELECT rid FROM runs WHERE id = ?"));
        s.bind(1, runId);
        TS_ASSIGN(bool row, s.step());
        if (!row) return notFoundRun(path, runId);
        return s.int64(0);
    }

    // One run's samples of `metric` with lo <= step <= hi, in step order (a step recorded twice:
    // the later value).
    Result<std::vector<StepSample>> loadSamples(int64_t r, const std::string& runId, const std::string& metric, int64_t lo,
                                                int64_t hi)
    {
        std::vector<StepSample> out;
        if (hi < lo) return out;
        // Write order, so that of a re-recorded step the later sample comes last.
        TS_ASSIGN(sql::Stmt s, reader.prepare("SELECT data FROM step_series WHERE run = ? AND name = ? AND step0 <= ? "
                                              "AND step1 >= ? ORDER BY id"));
        s.bind(1, r).bind(2, metric).bind(3, hi).bind(4, lo);
        while (true) {
            TS_ASSIGN(bool row, s.step());
            if (!row) break;
            if (!decodeStepSamples(s.blob(0), lo, hi, out))
                return makeError(ErrorCode::ParseError, "run database '" + path + "': the '" + metric + "' series of run " + runId +
                                                            " is damaged",
                                 "the run's other history is unaffected");
        }
        sortKeepLast(out);
        return out;
    }

    // A Series over [step0, step1] from samples in step order (those outside are left out).
    static Series makeSeries(const std::string& runId, const std::string& metric, int64_t step0, int64_t step1, int buckets,
                             const std::vector<StepSample>& samples)
    {
        Series out;
        out.runId = runId;
        out.metric = metric;
        out.step0 = step0;
        out.step1 = step1;
        if (step1 < step0) return out;
        auto first = std::lower_bound(samples.begin(), samples.end(), step0,
                                      [](const StepSample& a, int64_t step) { return a.step < step; });
        auto last = std::upper_bound(first, samples.end(), step1, [](int64_t step, const StepSample& a) { return step < a.step; });
        const auto rows = static_cast<int64_t>(last - first);
        if (buckets > 0) {
            M4Downsampler m4(step0, step1, buckets);
            for (auto it = first; it != last; ++it) m4.add(it->step, it->value);
            out.points = m4.points();
            out.samples = rows;
            out.downsampled = static_cast<int64_t>(out.points.size()) < rows;
        } else {
            out.points.reserve(static_cast<std::size_t>(rows));
            for (auto it = first; it != last; ++it) out.points.push_back({it->step, it->value});
            out.samples = rows;
        }
        return out;
    }
};

// ---------------------------------------------------------------------------------------------
// RunStore

RunStore::RunStore(std::unique_ptr<Impl> impl) : m(std::move(impl)) {}
RunStore::RunStore(RunStore&&) noexcept = default;
RunStore& RunStore::operator=(RunStore&& o) noexcept
{
    if (this != &o) {
        (void)close();
        m = std::move(o.m);
    }
    return *this;
}
RunStore::~RunStore() { (void)close(); }

const std::string& RunStore::path() const { return m->path; }
bool RunStore::readOnly() const { return m->options.readOnly; }
int RunStore::fileSchemaVersion() const { return m->fileVersion; }
uint64_t RunStore::droppedEvents() const { return m ? m->dropped.load() : 0; }

Result<RunStore> RunStore::open(const std::string& path, const OpenOptions& options)
{
    auto impl = std::make_unique<Impl>();
    impl->path = path;
    impl->options = options;
    impl->options.batchMs = std::max(1, options.batchMs);
    impl->options.batchEvents = std::max<std::size_t>(1, options.batchEvents);
    impl->self = currentProcess();
    if (path.empty()) return makeError(ErrorCode::InvalidArgument, "no run database path given");
    if (!options.readOnly && options.create) {
        const fs::path parent = fs::path(path).parent_path();
        std::error_code ec;
        if (!parent.empty()) fs::create_directories(parent, ec);
        if (ec)
            return makeError(ErrorCode::IoError, "cannot create the folder '" + parent.string() + "' for run database '" + path +
                                                     "': " + ec.message(),
                             "check the permissions, or choose another --db");
    }
    {
        std::error_code ec;
        if (fs::is_directory(path, ec))
            return makeError(ErrorCode::InvalidArgument, "run database path '" + path + "' is a folder",
                             "name a file, e.g. " + (fs::path(path) / "runs.db").string());
    }
    TS_ASSIGN(sql::Db db, sql::Db::open(path, options.readOnly, options.create));
    // Recording into it would fail batch by batch after the work is done (and the run be lost):
    // say so now. Unsupported: readers fall back to opening it read-only.
    if (!options.readOnly && db.isReadOnly())
        return makeError(ErrorCode::Unsupported, "run database '" + path + "' is read-only for this user",
                         "make it (and its folder) writable, or choose another --db; it can still be read");

    // Recognise the file before changing anything in it, in one read transaction: another
    // process may be creating the schema right now, and its application id read before its
    // commit with its tables after took the file for another program's.
    int64_t appId = 0, tables = 0;
    Result<int64_t> version = int64_t{0};
    {
        TS_ASSIGN(auto readTx, sql::Transaction::begin(db, false));
        version = db.queryInt("PRAGMA user_version");
        if (!version.ok()) return version.takeError();
        TS_ASSIGN(appId, db.queryInt("PRAGMA application_id"));
        TS_ASSIGN(tables, db.queryInt("SELECT count(*) FROM sqlite_schema"));
        TS_TRY(readTx.commit());
    }
    if (appId != kApplicationId && (tables > 0 || *version > 0)) {
        char id[16];
        std::snprintf(id, sizeof id, "0x%08llx", static_cast<unsigned long long>(static_cast<uint32_t>(appId)));
        return makeError(ErrorCode::InvalidArgument,
                         "'" + path + "' is an SQLite database of another program (application_id " + id + ", " +
                             std::to_string(tables) + " schema objects), not a TrainStudio run database; it was not modified",
                         "choose another file with --db");
    }
    impl->fileVersion = static_cast<int>(*version);
    const int ours = schemaVersion();
    if (*version > ours && !options.readOnly)
        return makeError(ErrorCode::Unsupported,
                         "run database '" + path + "' was created by a newer TrainStudio (schema " + std::to_string(*version) +
                             " > " + std::to_string(ours) + "); it was not modified",
                         "update TrainStudio, or open it read-only to look at its runs (the CLI's runs list/show/compare/export "
                         "fall back to that)");
    if (options.readOnly && *version < ours) {
        if (*version == 0)
            return makeError(ErrorCode::NotFound, "'" + path + "' is an empty run database", "record a run into it first");
        return makeError(ErrorCode::Unsupported,
                         "run database '" + path + "' has the older schema " + std::to_string(*version) + " (this TrainStudio uses " +
                             std::to_string(ours) + ") and cannot be upgraded read-only",
                         "open it read-write once; the upgrade keeps every run");
    }

    if (options.readOnly) {
        impl->reader = std::move(db);
    } else {
        // WAL: readers and the one writer never block each other; synchronous=NORMAL keeps every
        // commit across a process crash (the WAL is in the OS cache) and the file always
        // consistent; only an OS crash or power cut may lose the last batches.
        TS_ASSIGN(sql::Stmt wal, db.prepare("PRAGMA journal_mode = WAL"));
        // Two processes creating the same new database at once: switching its journal needs an
        // exclusive lock, and SQLite answers BUSY at once instead of waiting (the other holds a
        // shared one). Try again for as long as the busy timeout would have waited.
        auto stepped = wal.step();
        for (int tries = 0; !stepped.ok() && db.lastCallWasBusy() && tries < 200; ++tries) {
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
            wal.reset();
            stepped = wal.step();
        }
        TS_ASSIGN(bool row, std::move(stepped));
        if (!row || wal.text(0) != "wal")
            return makeError(ErrorCode::IoError, "run database '" + path + "': cannot switch to WAL journaling (got '" +
                                                     (row ? wal.text(0) : std::string()) + "')",
                             "WAL needs a local file system with shared memory support; choose a --db on a local disk");
        wal = sql::Stmt();
        TS_TRY(db.exec("PRAGMA synchronous = NORMAL"));
        TS_TRY(migrate(db));
        auto marked = markInterruptedOn(db, true);
        if (!marked.ok()) return marked.takeError();
        impl->writer = std::move(db);
        TS_TRY(impl->prepareWriterStatements());
        TS_ASSIGN(impl->reader, sql::Db::open(path, true, false));
        impl->start();
    }
    return RunStore(std::move(impl));
}

Status RunStore::flush()
{
    if (!m) return okStatus();
    if (!m->options.readOnly) {
        Status s = m->submit([] { return okStatus(); });
        if (!s.ok()) return s;
    }
    std::lock_guard lk(m->errorMutex);
    if (m->writeError) {
        Error e = std::move(*m->writeError);
        m->writeError.reset();
        return e;
    }
    return okStatus();
}

Status RunStore::rewindRun(const std::string& runId, int64_t step)
{
    Impl* d = m.get();
    return m->submit([=]() -> Status {
        TS_ASSIGN(int64_t r, d->rid(runId, false));
        return d->rewind(r, step);
    });
}

Status RunStore::close()
{
    if (!m) return okStatus();
    Status s = okStatus();
    bool running;
    {
        std::lock_guard lk(m->queueMutex);
        running = m->running && !m->stopping;
    }
    if (running) s = flush();
    m->stop();
    {
        std::lock_guard lk(m->queueMutex);
        m->running = false;
    }
    for (sql::Stmt* st : {&m->insSeries, &m->insEpoch, &m->insBreakdown, &m->insDevice, &m->insPipeline, &m->insChunk,
                          &m->insFinding, &m->insLog, &m->selRid, &m->insAutoRun})
        *st = sql::Stmt();
    // Fold the WAL into the database file before leaving, so a runs.db copied or moved without
    // its -wal holds everything (after the studio exited it read as empty). SQLite does this when
    // the last connection closes, which was the read-only reader; another process may also still
    // hold the file. PASSIVE: never waits for readers.
    if (!m->options.readOnly && m->writer.isOpen()) (void)m->writer.exec("PRAGMA wal_checkpoint(PASSIVE)");
    {
        std::lock_guard lk(m->readMutex);
        m->reader.close();
    }
    m->writer.close();  // last: it deletes the WAL when no other process has the file open
    return s;
}

void RunStore::record(Event event)
{
    std::vector<Event> v;
    v.push_back(std::move(event));
    m->enqueue(std::move(v));
}

void RunStore::recordEvents(std::vector<Event> events) { m->enqueue(std::move(events)); }

int RunStore::addSource(EventSource drain)
{
    if (!m || m->options.readOnly) return 0;
    return m->addSource(std::move(drain));
}

void RunStore::pullSource(int id)
{
    if (m && id != 0) m->pullSource(id);
}

Status RunStore::removeSource(int id)
{
    if (!m || id == 0) return okStatus();
    TS_TRY(m->removeSource(id));
    return flush();
}

namespace {

Status checkText(const std::string& text, const char* what)
{
    if (!isValidUtf8(text))
        return makeError(ErrorCode::InvalidArgument, std::string("a run's ") + what + " must be UTF-8 text (this one has other bytes)",
                         "type it again, or set the terminal's locale to UTF-8");
    // A newline or tab would break every table that lists it (runs list, the history panel).
    for (const unsigned char c : text)
        if (c < 0x20 || c == 0x7f)
            return makeError(ErrorCode::InvalidArgument,
                             std::string("a run's ") + what + " must be one line of text (this one holds the control character 0x" +
                                 "0123456789abcdef"[c >> 4] + "0123456789abcdef"[c & 15] + ")",
                             "give it without newlines or tabs");
    return okStatus();
}

// Tags are listed joined by commas ("best,fast"): a new one holding a comma would read as two.
Status checkNewTag(const std::string& tag)
{
    TS_TRY(checkText(tag, "tag"));
    if (tag.find(',') != std::string::npos)
        return makeError(ErrorCode::InvalidArgument, "a run's tag cannot hold a comma ('" + tag + "')",
                         "give each tag on its own: --add a --add b");
    return okStatus();
}

// Runs are found by id, unique id prefix (4+ characters) or name, in that order: a name that is
// another run's id or the start of one would find that run instead. `self`: the renamed run's rid.
Status checkNameIsNotAnId(const sql::Db& db, const std::string& name, int64_t self)
{
    TS_ASSIGN(sql::Stmt s, db.prepare("SELECT id FROM runs WHERE rid != ?1 AND (id = ?2 OR (length(?2) >= 4 AND "
                                 "substr(id, 1, length(?2)) = ?2)) LIMIT 1"));
    s.bind(1, self).bind(2, lowerAscii(name));  // lookups compare ids in lower case
    TS_ASSIGN(bool row, s.step());
    if (!row) return okStatus();
    return makeError(ErrorCode::InvalidArgument,
                     "the name '" + name + "' is the start of run " + s.text(0) + "'s id, so looking it up would find that run",
                     "choose a name that is not a run id or the start of one");
}

// A rename onto another run's name would make both ambiguous to every lookup by name (`runs show
// NAME`). New runs may share a name (a rerun keeps it); lookups then list their ids.
Status checkNameIsFree(const sql::Db& db, const std::string& name, int64_t self)
{
    TS_ASSIGN(sql::Stmt s, db.prepare("SELECT id FROM runs WHERE rid != ? AND name = ? LIMIT 1"));
    s.bind(1, self).bind(2, name);
    TS_ASSIGN(bool row, s.step());
    if (!row) return okStatus();
    return makeError(ErrorCode::InvalidArgument, "run " + s.text(0) + " is already named '" + name + "'",
                     "names find runs, so each run's must be its own: choose another name, or rename that run first");
}

} // namespace

Result<RunInfo> RunStore::createRun(const NewRun& spec)
{
    TS_TRY(checkText(spec.name, "name"));
    for (const auto& t : spec.tags) TS_TRY(checkNewTag(t));
    RunInfo info;
    info.id = spec.id.empty() ? newRunId() : spec.id;
    info.name = spec.name.empty() ? defaultRunName(spec.model) : spec.name;
    info.project = spec.project;
    info.modelName = spec.model.is_object() ? spec.model.value("name", std::string()) : std::string();
    info.strategy = spec.strategy;
    info.configHash = spec.config.is_null() ? std::string() : configHash(spec.config);
    info.seed = spec.seed;
    info.status = RunState::Created;
    info.createdUs = nowUs();
    info.tags = spec.tags;
    std::sort(info.tags.begin(), info.tags.end());
    info.tags.erase(std::unique(info.tags.begin(), info.tags.end()), info.tags.end());
    std::erase(info.tags, std::string());  // an empty tag could not be listed, filtered or removed
    info.model = spec.model;
    info.config = spec.config;
    info.devices = spec.devices;
    Impl* d = m.get();
    TS_TRY(m->submit([&]() -> Status {
        if (!spec.name.empty()) TS_TRY(checkNameIsNotAnId(d->writer, spec.name, -1));
        TS_ASSIGN(sql::Stmt s, d->writer.prepare(
                                   "INSERT INTO runs (id, name, project, model_json, config_json, config_hash, seed, strategy, "
                                   "devices_json, status, created_us, model_name, writer_host, writer_pid, writer_start) "
                                   "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'created', ?, ?, ?, ?, ?)"));
        s.bind(1, info.id).bind(2, info.name).bind(3, info.project);
        if (spec.model.is_null()) s.bindNull(4);
        else s.bind(4, spec.model.dump());
        if (spec.config.is_null()) s.bindNull(5);
        else s.bind(5, spec.config.dump());
        s.bind(6, info.configHash).bind(7, info.seed).bind(8, info.strategy);
        if (spec.devices.is_null()) s.bindNull(9);
        else s.bind(9, spec.devices.dump());
        s.bind(10, info.createdUs).bind(11, info.modelName).bind(12, d->self.host).bind(13, d->self.pid).bind(14, d->self.start);
        Status st = s.run();
        if (!st.ok()) {
            Error e = st.takeError();
            if (e.code == ErrorCode::InvalidArgument) e.message += " (is the run id '" + info.id + "' already used?)";
            return e;
        }
        const int64_t newRid = d->writer.lastInsertRowId();
        TS_ASSIGN(sql::Stmt tag, d->writer.prepare("INSERT OR IGNORE INTO run_tags (run, tag) VALUES (?, ?)"));
        for (const auto& t : info.tags) {
            tag.bind(1, newRid).bind(2, t);
            TS_TRY(tag.run());
        }
        d->ridCache[info.id] = newRid;  // a failed batch commit clears the cache
        return okStatus();
    }));
    return info;
}

Status RunStore::setRunStatus(const std::string& runId, RunState status, const std::string& error)
{
    Impl* d = m.get();
    return m->submit([=]() -> Status {
        TS_ASSIGN(int64_t r, d->rid(runId, false));
        return d->writeStatus(r, status, error, nowUs());
    });
}

Status RunStore::setRunDevices(const std::string& runId, const nlohmann::json& devices)
{
    Impl* d = m.get();
    const std::string text = devices.dump();
    return m->submit([=]() -> Status {
        TS_ASSIGN(int64_t r, d->rid(runId, false));
        TS_ASSIGN(sql::Stmt s, d->writer.prepare("UPDATE runs SET devices_json = ?1 WHERE rid = ?2"));
        s.bind(1, text).bind(2, r);
        return s.run();
    });
}

Status RunStore::upsertProject(const std::string& name, const nlohmann::json& spec)
{
    if (name.empty()) return makeError(ErrorCode::InvalidArgument, "a project needs a name");
    Impl* d = m.get();
    const std::string text = spec.dump();
    return m->submit([=]() -> Status {
        TS_ASSIGN(sql::Stmt s, d->writer.prepare("INSERT INTO projects (name, spec_json, created_us, updated_us) VALUES (?1, ?2, ?3, ?3) "
                                                 "ON CONFLICT (name) DO UPDATE SET spec_json = ?2, updated_us = ?3"));
        s.bind(1, name).bind(2, text).bind(3, nowUs());
        return s.run();
    });
}

Status RunStore::renameRun(const std::string& runId, const std::string& name)
{
    if (name.empty()) return makeError(ErrorCode::InvalidArgument, "a run's name cannot be empty");
    TS_TRY(checkText(name, "name"));
    Impl* d = m.get();
    return m->submit([=]() -> Status {
        TS_ASSIGN(int64_t r, d->rid(runId, false));
        TS_TRY(checkNameIsNotAnId(d->writer, name, r));
        TS_TRY(checkNameIsFree(d->writer, name, r));
        TS_ASSIGN(sql::Stmt s, d->writer.prepare("UPDATE runs SET name = ? WHERE rid = ?"));
        s.bind(1, name).bind(2, r);
        return s.run();
    });
}

Status RunStore::setTags(const std::string& runId, const std::vector<std::string>& tags)
{
    for (const auto& t : tags) TS_TRY(checkText(t, "tag"));
    Impl* d = m.get();
    return m->submit([=]() -> Status {
        TS_ASSIGN(int64_t r, d->rid(runId, false));
        // A comma is refused in new tags only: a run tagged so before the rule can still have its
        // other tags edited (the studio saves the whole list).
        {
            TS_ASSIGN(sql::Stmt has, d->writer.prepare("SELECT 1 FROM run_tags WHERE run = ? AND tag = ?"));
            for (const auto& t : tags) {
                has.bind(1, r).bind(2, t);
                TS_ASSIGN(bool kept, has.step());
                has.reset();
                if (!kept) TS_TRY(checkNewTag(t));
            }
        }
        TS_ASSIGN(sql::Stmt del, d->writer.prepare("DELETE FROM run_tags WHERE run = ?"));
        del.bind(1, r);
        TS_TRY(del.run());
        TS_ASSIGN(sql::Stmt ins, d->writer.prepare("INSERT OR IGNORE INTO run_tags (run, tag) VALUES (?, ?)"));
        for (const auto& t : tags) {
            if (t.empty()) continue;
            ins.bind(1, r).bind(2, t);
            TS_TRY(ins.run());
        }
        return okStatus();
    });
}

Status RunStore::addTag(const std::string& runId, const std::string& tag)
{
    if (tag.empty()) return makeError(ErrorCode::InvalidArgument, "a tag cannot be empty");
    TS_TRY(checkNewTag(tag));
    Impl* d = m.get();
    return m->submit([=]() -> Status {
        TS_ASSIGN(int64_t r, d->rid(runId, false));
        TS_ASSIGN(sql::Stmt s, d->writer.prepare("INSERT OR IGNORE INTO run_tags (run, tag) VALUES (?, ?)"));
        s.bind(1, r).bind(2, tag);
        return s.run();
    });
}

Status RunStore::removeTag(const std::string& runId, const std::string& tag)
{
    Impl* d = m.get();
    return m->submit([=]() -> Status {
        TS_ASSIGN(int64_t r, d->rid(runId, false));
        TS_ASSIGN(sql::Stmt s, d->writer.prepare("DELETE FROM run_tags WHERE run = ? AND tag = ?"));
        s.bind(1, r).bind(2, tag);
        return s.run();
    });
}

Result<Checkpoint> RunStore::addCheckpoint(const std::string& runId, const std::string& path, int64_t step, const std::string& kind)
{
    if (m->options.readOnly) return readOnlyError(m->path);
    Checkpoint c;
    c.runId = runId;
    c.step = step;
    c.kind = kind.empty() ? "periodic" : kind;
    c.path = absolutePath(path);
    c.createdUs = nowUs();
    std::error_code ec;
    if (!fs::is_regular_file(c.path, ec))
        return makeError(ErrorCode::NotFound, "checkpoint file '" + c.path + "' does not exist",
                         "write it first (writeSafetensors), then record it");
    c.bytes = static_cast<int64_t>(fs::file_size(c.path, ec));
    TS_ASSIGN(c.checksum, fileChecksum(c.path));
    Impl* d = m.get();
    TS_TRY(m->submit([&]() -> Status {
        TS_ASSIGN(int64_t r, d->rid(runId, false));
        TS_ASSIGN(sql::Stmt s, d->writer.prepare("INSERT INTO checkpoints (run, step, kind, path, checksum, bytes, created_us) "
                                                 "VALUES (?, ?, ?, ?, ?, ?, ?)"));
        s.bind(1, r).bind(2, c.step).bind(3, c.kind).bind(4, d->storedPath(c.path)).bind(5, c.checksum).bind(6, c.bytes).bind(7, c.createdUs);
        TS_TRY(s.run());
        c.id = d->writer.lastInsertRowId();
        return okStatus();
    }));
    return c;
}

Result<RunFile> RunStore::addFile(const std::string& runId, const std::string& kind, const std::string& path)
{
    if (m->options.readOnly) return readOnlyError(m->path);
    RunFile f;
    f.runId = runId;
    f.kind = kind;
    f.path = absolutePath(path);
    f.createdUs = nowUs();
    std::error_code ec;
    if (!fs::is_regular_file(f.path, ec)) return makeError(ErrorCode::NotFound, "file '" + f.path + "' does not exist");
    f.bytes = static_cast<int64_t>(fs::file_size(f.path, ec));
    TS_ASSIGN(f.checksum, fileChecksum(f.path));
    Impl* d = m.get();
    TS_TRY(m->submit([&]() -> Status {
        TS_ASSIGN(int64_t r, d->rid(runId, false));
        TS_ASSIGN(sql::Stmt s, d->writer.prepare("INSERT INTO run_files (run, kind, path, checksum, bytes, created_us) "
                                                 "VALUES (?, ?, ?, ?, ?, ?)"));
        s.bind(1, r).bind(2, f.kind).bind(3, d->storedPath(f.path)).bind(4, f.checksum).bind(5, f.bytes).bind(6, f.createdUs);
        TS_TRY(s.run());
        f.id = d->writer.lastInsertRowId();
        return okStatus();
    }));
    return f;
}

Result<DeleteReport> RunStore::deleteRun(const std::string& runId, bool removeFiles)
{
    struct Owned {
        std::string stored, checksum;  // as recorded (relative in the store's folder)
        bool shared = false;
        std::string path;               // resolved against the database's folder
    };
    std::vector<Owned> owned;
    Impl* d = m.get();
    TS_TRY(m->submit([&]() -> Status {
        TS_ASSIGN(int64_t r, d->rid(runId, false));
        {
            // A run still being recorded would go on writing steps and checkpoint files that
            // nothing refers to any more (its writer does not notice the deletion).
            TS_ASSIGN(sql::Stmt s, d->writer.prepare("SELECT writer_host, writer_pid, writer_start FROM runs "
                                                     "WHERE rid = ? AND status IN ('created', 'running', 'paused')"));
            s.bind(1, r);
            TS_ASSIGN(bool row, s.step());
            if (row) {
                const ProcessIdentity writer{s.text(0), s.int64(1), s.text(2)};
                // Unknown (another host, an old record) is not refused: it could never be deleted.
                if (processLiveness(writer) == Liveness::Alive)
                    return makeError(ErrorCode::InvalidArgument,
                                     "run " + runId + " is still being recorded (by process " + std::to_string(writer.pid) + " on " +
                                         writer.host + "); nothing was deleted",
                                     "stop it first (Ctrl-C there, or Stop in the studio), then delete it");
            }
        }
        {
            TS_ASSIGN(sql::Stmt s, d->writer.prepare("SELECT path, checksum FROM checkpoints WHERE run = ?1 "
                                                     "UNION SELECT path, checksum FROM run_files WHERE run = ?1"));
            s.bind(1, r);
            while (true) {
                TS_ASSIGN(bool row, s.step());
                if (!row) break;
                owned.push_back({s.text(0), s.text(1), false, d->resolvedPath(s.text(0))});
            }
        }
        for (const char* table : {"step_metrics", "step_series", "epoch_metrics", "checkpoints", "run_tags", "step_breakdowns", "device_samples",
                                  "pipeline_samples", "trace_chunks", "findings", "run_logs", "run_files"}) {
            TS_ASSIGN(sql::Stmt s, d->writer.prepare(std::string("DELETE FROM ") + table + " WHERE run = ?"));
            s.bind(1, r);
            TS_TRY(s.run());
        }
        TS_ASSIGN(sql::Stmt s, d->writer.prepare("DELETE FROM runs WHERE rid = ?"));
        s.bind(1, r);
        TS_TRY(s.run());
        // A file another run still references (two runs saving to the same --save-weights) stays.
        TS_ASSIGN(sql::Stmt refs, d->writer.prepare("SELECT (SELECT count(*) FROM checkpoints WHERE path = ?1) + "
                                                    "(SELECT count(*) FROM run_files WHERE path = ?1)"));
        for (Owned& o : owned) {
            refs.bind(1, o.stored);
            TS_ASSIGN(bool row, refs.step());
            o.shared = row && refs.int64(0) > 0;
            refs.reset();
        }
        d->ridCache.erase(runId);
        return okStatus();
    }));
    DeleteReport report;
    if (!removeFiles) {
        for (const Owned& o : owned) report.keptFiles.push_back(o.path + " (files kept on request)");
        return report;
    }
    // Only what the store wrote into its own folder is its to delete: a --save-weights or
    // --trace file elsewhere is the user's, recorded so the run can find it, not owned.
    const std::string root = filesRoot(m->path);
    for (const Owned& o : owned) {
        std::error_code ec;
        if (!fs::exists(o.path, ec)) continue;
        if (!pathIsInside(o.path, root)) {
            report.keptFiles.push_back(o.path + " (outside the store's folder: it is yours)");
            continue;
        }
        if (o.shared) {
            report.keptFiles.push_back(o.path + " (another run references it)");
            continue;
        }
        auto sum = fileChecksum(o.path);
        if (!sum.ok() || *sum != o.checksum) {
            report.keptFiles.push_back(o.path + " (changed since it was recorded)");
            continue;
        }
        if (fs::remove(o.path, ec)) report.removedFiles.push_back(o.path);
        else report.keptFiles.push_back(o.path + " (cannot remove: " + ec.message() + ")");
    }
    // The store's own folder for the run, once empty.
    std::error_code ec;
    const fs::path dir = runFilesDir(runId);
    if (fs::is_directory(dir, ec) && fs::is_empty(dir, ec)) fs::remove(dir, ec);
    return report;
}

Result<int> RunStore::markInterruptedRuns()
{
    Impl* d = m.get();
    int n = 0;
    TS_TRY(m->submit([&]() -> Status {
        TS_ASSIGN(n, markInterruptedOn(d->writer, false));
        return okStatus();
    }));
    return n;
}

std::string RunStore::filesRoot(const std::string& dbPath)
{
    const fs::path db(dbPath);
    return (db.parent_path() / (db.stem().string() + "-files")).string();
}

std::string RunStore::runFilesDir(const std::string& runId) const
{
    return (fs::path(filesRoot(m->path)) / runId).string();
}

// --- reading ---------------------------------------------------------------------------------

Result<std::string> RunStore::resolveRunId(const std::string& text)
{
    std::lock_guard lk(m->readMutex);
    if (text.empty()) return makeError(ErrorCode::InvalidArgument, "no run given", "give a run id, a unique id prefix or a run name");
    auto collect = [&](const std::string& sqlText, const std::string& arg) -> Result<std::vector<std::string>> {
        TS_ASSIGN(sql::Stmt s, m->reader.prepare(sqlText));
        s.bind(1, arg);
        std::vector<std::string> ids;
        while (true) {
            TS_ASSIGN(bool row, s.step());
            if (!row) break;
            ids.push_back(s.text(0));
        }
        return ids;
    };
    auto ambiguous = [&](const std::vector<std::string>& ids, const std::string& what) -> Error {
        std::string list;
        for (std::size_t i = 0; i < ids.size() && i < 5; ++i) list += (i ? ", " : "") + ids[i];
        if (ids.size() > 5) list += ", ...";
        return makeError(ErrorCode::InvalidArgument, what + " '" + text + "' matches " + std::to_string(ids.size()) + " runs: " + list,
                         "give more of the run id");
    };
    // Ids are lower-case hex: one typed or pasted in upper case finds its run too.
    const std::string lower = lowerAscii(text);
    TS_ASSIGN(auto exact, collect("SELECT id FROM runs WHERE id = ?", lower));
    if (!exact.empty()) return exact.front();
    if (text.size() >= 4) {
        // Prefix match without LIKE's wildcards: ids are plain hex and dashes anyway.
        TS_ASSIGN(auto pre, collect("SELECT id FROM runs WHERE substr(id, 1, length(?1)) = ?1 ORDER BY created_us", lower));
        if (pre.size() == 1) return pre.front();
        if (pre.size() > 1) return ambiguous(pre, "run id prefix");
    }
    TS_ASSIGN(auto named, collect("SELECT id FROM runs WHERE name = ? ORDER BY created_us", text));
    if (named.size() == 1) return named.front();
    if (named.size() > 1) return ambiguous(named, "run name");
    return notFoundRun(m->path, text);
}

Result<RunInfo> RunStore::run(const std::string& runId)
{
    std::lock_guard lk(m->readMutex);
    TS_ASSIGN(sql::Stmt s, m->reader.prepare(std::string("SELECT ") + kRunColumns +
                                             ", r.model_json, r.config_json, r.devices_json FROM runs r WHERE r.id = ?"));
    s.bind(1, runId);
    TS_ASSIGN(bool row, s.step());
    if (!row) return notFoundRun(m->path, runId);
    RunInfo r = readRun(s);
    readLastStep(m->reader, s.int64(16), r);
    r.model = parseJsonColumn(s.text(17));
    r.config = parseJsonColumn(s.text(18));
    r.devices = parseJsonColumn(s.text(19));
    return r;
}

Result<std::vector<RunInfo>> RunStore::listRuns(const RunFilter& f)
{
    std::lock_guard lk(m->readMutex);
    std::string q = std::string("SELECT ") + kRunColumns + " FROM runs r WHERE 1";
    std::vector<std::string> args;
    // Live statuses are decided after reading (a dead writer's "running" run is interrupted), so
    // only terminal, stored-as-is statuses are filtered in SQL.
    const bool statusInSql = f.status && isTerminal(*f.status) && *f.status != RunState::Interrupted;
    if (statusInSql) {
        q += " AND r.status = ?";
        args.push_back(statusName(*f.status));
    }
    if (!f.nameContains.empty()) {
        q += " AND instr(lower(r.name), lower(?)) > 0";
        args.push_back(f.nameContains);
    }
    if (!f.strategy.empty()) {
        q += " AND r.strategy = ?";
        args.push_back(f.strategy);
    }
    if (!f.model.empty()) {
        q += " AND r.model_name = ?";
        args.push_back(f.model);
    }
    if (!f.project.empty()) {
        q += " AND r.project = ?";
        args.push_back(f.project);
    }
    if (!f.tag.empty()) {
        q += " AND EXISTS (SELECT 1 FROM run_tags t WHERE t.run = r.rid AND t.tag = ?)";
        args.push_back(f.tag);
    }
    q += " ORDER BY r.created_us DESC, r.rid DESC";
    if (f.limit > 0 && (!f.status || statusInSql)) q += " LIMIT " + std::to_string(f.limit);
    TS_ASSIGN(sql::Stmt s, m->reader.prepare(q));
    for (std::size_t i = 0; i < args.size(); ++i) s.bind(static_cast<int>(i + 1), args[i]);
    std::vector<RunInfo> out;
    while (true) {
        TS_ASSIGN(bool row, s.step());
        if (!row) break;
        RunInfo r = readRun(s);
        if (f.status && r.status != *f.status) continue;
        readLastStep(m->reader, s.int64(16), r);
        out.push_back(std::move(r));
        if (f.limit > 0 && static_cast<int>(out.size()) >= f.limit) break;
    }
    return out;
}

Result<std::vector<ProjectInfo>> RunStore::projects()
{
    std::lock_guard lk(m->readMutex);
    TS_ASSIGN(sql::Stmt s, m->reader.prepare("SELECT name, spec_json, created_us, updated_us FROM projects ORDER BY name"));
    std::vector<ProjectInfo> out;
    while (true) {
        TS_ASSIGN(bool row, s.step());
        if (!row) break;
        out.push_back({s.text(0), parseJsonColumn(s.text(1)), s.int64(2), s.int64(3)});
    }
    return out;
}

Result<std::vector<std::string>> RunStore::metricNames(const std::string& runId)
{
    std::lock_guard lk(m->readMutex);
    TS_ASSIGN(int64_t r, m->readRid(runId));
    // A skip scan over the (run, name, step) key: one index seek per name, not a pass over
    // every sample.
    TS_ASSIGN(sql::Stmt s, m->reader.prepare(
                               "WITH RECURSIVE n(name) AS (SELECT min(name) FROM step_series WHERE run = ?1 "
                               "UNION ALL SELECT (SELECT min(name) FROM step_series WHERE run = ?1 AND name > n.name) "
                               "FROM n WHERE n.name IS NOT NULL) SELECT name FROM n WHERE name IS NOT NULL"));
    s.bind(1, r);
    std::vector<std::string> out;
    while (true) {
        TS_ASSIGN(bool row, s.step());
        if (!row) break;
        out.push_back(s.text(0));
    }
    return out;
}

Result<Series> RunStore::series(const std::string& runId, const std::string& metric, const SeriesQuery& q)
{
    std::lock_guard lk(m->readMutex);
    TS_ASSIGN(int64_t r, m->readRid(runId));
    TS_ASSIGN(std::vector<StepSample> samples, m->loadSamples(r, runId, metric, q.step0, q.step1));
    int64_t step0 = q.step0, step1 = q.step1;
    const bool open0 = step0 == std::numeric_limits<int64_t>::min(), open1 = step1 == std::numeric_limits<int64_t>::max();
    if (open0 || open1) {
        if (samples.empty()) {
            Series empty;
            empty.runId = runId;
            empty.metric = metric;
            empty.step0 = open0 ? 0 : step0;
            empty.step1 = open1 ? 0 : step1;
            return empty;
        }
        if (open0) step0 = samples.front().step;
        if (open1) step1 = samples.back().step;
    }
    return Impl::makeSeries(runId, metric, step0, step1, q.buckets, samples);
}

Result<std::vector<Series>> RunStore::compare(const std::vector<std::string>& runIds, const std::string& metric, const SeriesQuery& q)
{
    std::lock_guard lk(m->readMutex);
    std::vector<std::vector<StepSample>> samples;
    int64_t lo = std::numeric_limits<int64_t>::max(), hi = std::numeric_limits<int64_t>::min();
    for (const auto& id : runIds) {
        TS_ASSIGN(int64_t r, m->readRid(id));
        TS_ASSIGN(std::vector<StepSample> s, m->loadSamples(r, id, metric, q.step0, q.step1));
        if (!s.empty()) {
            lo = std::min(lo, s.front().step);
            hi = std::max(hi, s.back().step);
        }
        samples.push_back(std::move(s));
    }
    int64_t step0 = q.step0 == std::numeric_limits<int64_t>::min() ? lo : q.step0;
    int64_t step1 = q.step1 == std::numeric_limits<int64_t>::max() ? hi : q.step1;
    if (lo > hi) {  // no run has the metric: empty series over the given (or an empty) range
        if (q.step0 == std::numeric_limits<int64_t>::min()) step0 = 0;
        if (q.step1 == std::numeric_limits<int64_t>::max()) step1 = -1;
    }
    std::vector<Series> out;
    for (std::size_t i = 0; i < runIds.size(); ++i) out.push_back(Impl::makeSeries(runIds[i], metric, step0, step1, q.buckets, samples[i]));
    return out;
}

Result<std::vector<EpochRow>> RunStore::epochMetrics(const std::string& runId)
{
    std::lock_guard lk(m->readMutex);
    TS_ASSIGN(int64_t r, m->readRid(runId));
    TS_ASSIGN(sql::Stmt s, m->reader.prepare("SELECT epoch, name, value, step, wall_us FROM epoch_metrics WHERE run = ? ORDER BY epoch, name"));
    s.bind(1, r);
    std::vector<EpochRow> out;
    while (true) {
        TS_ASSIGN(bool row, s.step());
        if (!row) break;
        const int64_t epoch = s.int64(0);
        if (out.empty() || out.back().epoch != epoch) out.push_back(EpochRow{epoch, 0, 0, {}});
        EpochRow& e = out.back();
        e.metrics[s.text(1)] = s.real(2);
        e.step = std::max(e.step, s.int64(3));
        e.wallUs = std::max(e.wallUs, s.int64(4));
    }
    return out;
}

Result<RunCounts> RunStore::counts(const std::string& runId)
{
    std::lock_guard lk(m->readMutex);
    TS_ASSIGN(int64_t r, m->readRid(runId));
    TS_ASSIGN(sql::Stmt s, m->reader.prepare(
                               "SELECT (SELECT coalesce(sum(samples), 0) FROM step_series WHERE run = ?1 AND name = 'loss'), "
                               "(SELECT count(DISTINCT epoch) FROM epoch_metrics WHERE run = ?1), "
                               "(SELECT count(*) FROM step_breakdowns WHERE run = ?1), "
                               "(SELECT count(*) FROM device_samples WHERE run = ?1), "
                               "(SELECT count(*) FROM pipeline_samples WHERE run = ?1), "
                               "(SELECT coalesce(sum(spans), 0) FROM trace_chunks WHERE run = ?1), "
                               "(SELECT count(*) FROM findings WHERE run = ?1), "
                               "(SELECT count(*) FROM run_logs WHERE run = ?1), "
                               "(SELECT count(*) FROM checkpoints WHERE run = ?1), "
                               "(SELECT count(*) FROM run_files WHERE run = ?1)"));
    s.bind(1, r);
    TS_ASSIGN(bool row, s.step());
    RunCounts c;
    if (row) {
        c.steps = s.int64(0);
        c.epochs = s.int64(1);
        c.breakdowns = s.int64(2);
        c.deviceSamples = s.int64(3);
        c.pipelineSamples = s.int64(4);
        c.spans = s.int64(5);
        c.findings = s.int64(6);
        c.logs = s.int64(7);
        c.checkpoints = s.int64(8);
        c.files = s.int64(9);
    }
    return c;
}

Status RunStore::forEachStep(const std::string& runId,
                             const std::function<void(int64_t, int64_t, int64_t, const std::map<std::string, double>&)>& fn)
{
    std::lock_guard lk(m->readMutex);
    TS_ASSIGN(std::vector<std::string> names, metricNames(runId));
    TS_ASSIGN(int64_t r, m->readRid(runId));
    // One cursor per metric, each in step order, merged: streams any number of steps, one
    // decoded row of samples per metric at a time.
    struct Cursor {
        std::string name;
        sql::Stmt stmt;  // rows in step order; none when `samples` holds the whole series
        std::vector<StepSample> samples;
        std::size_t pos = 0;
        bool live = false;
        bool streaming = false;  // stmt has rows left to decode
        const StepSample& at() const { return samples[pos]; }
    };
    auto refill = [&](Cursor& c) -> Status {
        c.pos = 0;
        c.samples.clear();
        while (c.samples.empty()) {
            TS_ASSIGN(bool row, c.stmt.step());
            if (!row) break;
            if (!decodeStepSamples(c.stmt.blob(0), std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(),
                                   c.samples))
                return makeError(ErrorCode::ParseError, "run database '" + m->path + "': the '" + c.name + "' series of run " +
                                                            runId + " is damaged");
        }
        c.live = !c.samples.empty();
        return okStatus();
    };
    std::vector<Cursor> cursors;
    for (const auto& n : names) {
        Cursor c{n, sql::Stmt(), {}, 0, false, false};
        // Rows whose step ranges overlap (a step recorded twice, in two batches) need the whole
        // series merged; otherwise their rows in step order are the samples in step order.
        TS_ASSIGN(sql::Stmt overlap, m->reader.prepare(
                                         "SELECT count(*) FROM (SELECT step0, lag(step1) OVER (ORDER BY step0, id) AS prev "
                                         "FROM step_series WHERE run = ?1 AND name = ?2) WHERE step0 <= prev"));
        overlap.bind(1, r).bind(2, n);
        TS_ASSIGN(bool any, overlap.step());
        if (any && overlap.int64(0) > 0) {
            TS_ASSIGN(c.samples, m->loadSamples(r, runId, n, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()));
            c.live = !c.samples.empty();
        } else {
            TS_ASSIGN(c.stmt, m->reader.prepare("SELECT data FROM step_series WHERE run = ? AND name = ? ORDER BY step0"));
            c.stmt.bind(1, r).bind(2, n);
            c.streaming = true;
            TS_TRY(refill(c));
        }
        cursors.push_back(std::move(c));
    }
    std::map<std::string, double> row;
    while (true) {
        int64_t step = std::numeric_limits<int64_t>::max();
        for (const Cursor& c : cursors)
            if (c.live) step = std::min(step, c.at().step);
        if (step == std::numeric_limits<int64_t>::max()) break;
        row.clear();
        int64_t epoch = 0, wall = 0;
        for (Cursor& c : cursors) {
            if (!c.live || c.at().step != step) continue;
            epoch = std::max(epoch, c.at().epoch);
            wall = std::max(wall, c.at().wallUs);
            row[c.name] = c.at().value;
            if (++c.pos == c.samples.size()) {
                if (c.streaming) TS_TRY(refill(c));
                else c.live = false;
            }
        }
        fn(step, epoch, wall, row);
    }
    return okStatus();
}

namespace {

std::string limitClause(int limit) { return limit > 0 ? " LIMIT " + std::to_string(limit) : std::string(); }

} // namespace

Result<std::vector<telemetry::StepBreakdownEvent>> RunStore::breakdowns(const std::string& runId, int limit)
{
    std::lock_guard lk(m->readMutex);
    TS_ASSIGN(int64_t r, m->readRid(runId));
    TS_ASSIGN(sql::Stmt s, m->reader.prepare("SELECT step, wall_us, worker, device, step_s, input_s, forward_s, backward_s, "
                                             "communication_s, optimizer_s, other_s FROM step_breakdowns WHERE run = ? "
                                             "ORDER BY step, rowid" + limitClause(limit)));
    s.bind(1, r);
    std::vector<telemetry::StepBreakdownEvent> out;
    while (true) {
        TS_ASSIGN(bool row, s.step());
        if (!row) break;
        telemetry::StepBreakdownEvent e;
        e.stamp.runId = runId;
        e.stamp.step = s.int64(0);
        e.stamp.wallTimeUs = s.int64(1);
        e.stamp.lane.worker = s.text(2);
        e.stamp.lane.device = s.text(3);
        e.stepSeconds = s.real(4);
        e.input = s.real(5);
        e.forward = s.real(6);
        e.backward = s.real(7);
        e.communication = s.real(8);
        e.optimizer = s.real(9);
        e.other = s.real(10);
        out.push_back(std::move(e));
    }
    return out;
}

Result<std::vector<telemetry::DeviceSampleEvent>> RunStore::deviceSamples(const std::string& runId, int limit)
{
    std::lock_guard lk(m->readMutex);
    TS_ASSIGN(int64_t r, m->readRid(runId));
    TS_ASSIGN(sql::Stmt s, m->reader.prepare("SELECT step, wall_us, worker, device, utilisation, process_cpu, per_core, memory_used, "
                                             "memory_total, temperature_c, power_w FROM device_samples WHERE run = ? "
                                             "ORDER BY step, rowid" + limitClause(limit)));
    s.bind(1, r);
    std::vector<telemetry::DeviceSampleEvent> out;
    while (true) {
        TS_ASSIGN(bool row, s.step());
        if (!row) break;
        telemetry::DeviceSampleEvent e;
        e.stamp.runId = runId;
        e.stamp.step = s.int64(0);
        e.stamp.wallTimeUs = s.int64(1);
        e.stamp.lane.worker = s.text(2);
        e.stamp.lane.device = s.text(3);
        e.utilisation = s.isNull(4) ? -1 : s.real(4);
        e.processCpu = s.isNull(5) ? -1 : s.real(5);
        const nlohmann::json cores = parseJsonColumn(s.text(6));
        if (cores.is_array())
            for (const auto& c : cores)
                if (c.is_number()) e.perCore.push_back(c.get<double>());
        e.memoryUsed = static_cast<uint64_t>(s.int64(7));
        e.memoryTotal = static_cast<uint64_t>(s.int64(8));
        e.temperatureC = s.isNull(9) ? -1 : s.real(9);
        e.powerW = s.isNull(10) ? -1 : s.real(10);
        out.push_back(std::move(e));
    }
    return out;
}

Result<std::vector<telemetry::PipelineSampleEvent>> RunStore::pipelineSamples(const std::string& runId, int limit)
{
    std::lock_guard lk(m->readMutex);
    TS_ASSIGN(int64_t r, m->readRid(runId));
    TS_ASSIGN(sql::Stmt s, m->reader.prepare("SELECT step, wall_us, worker, stage, produced, busy_s, queue_depth, queue_capacity, "
                                             "wait_s, parallelism FROM pipeline_samples WHERE run = ? ORDER BY step, rowid" +
                                             limitClause(limit)));
    s.bind(1, r);
    std::vector<telemetry::PipelineSampleEvent> out;
    while (true) {
        TS_ASSIGN(bool row, s.step());
        if (!row) break;
        telemetry::PipelineSampleEvent e;
        e.stamp.runId = runId;
        e.stamp.step = s.int64(0);
        e.stamp.wallTimeUs = s.int64(1);
        e.stamp.lane.worker = s.text(2);
        e.stage = s.text(3);
        e.produced = s.int64(4);
        e.busySeconds = s.real(5);
        e.queueDepth = s.int64(6);
        e.queueCapacity = s.int64(7);
        e.waitSeconds = s.real(8);
        e.parallelism = static_cast<int>(s.int64(9));
        out.push_back(std::move(e));
    }
    return out;
}

Result<std::vector<telemetry::SpanEvent>> RunStore::spans(const std::string& runId, int64_t t0, int64_t t1)
{
    std::lock_guard lk(m->readMutex);
    TS_ASSIGN(int64_t r, m->readRid(runId));
    TS_ASSIGN(sql::Stmt s, m->reader.prepare("SELECT encoding, raw_bytes, data FROM trace_chunks WHERE run = ? AND start_us <= ? "
                                             "AND end_us >= ? ORDER BY start_us"));
    s.bind(1, r).bind(2, t1).bind(3, t0);
    std::vector<telemetry::SpanEvent> out;
    while (true) {
        TS_ASSIGN(bool row, s.step());
        if (!row) break;
        if (s.text(0) != "json+zlib")
            return makeError(ErrorCode::Unsupported, "run database '" + m->path + "': trace chunk encoding '" + s.text(0) +
                                                         "' of run " + runId + " is unknown to this TrainStudio",
                             "update TrainStudio");
        TS_TRY(decodeSpans(s.blob(2), static_cast<std::size_t>(s.int64(1)), runId, "run database '" + m->path + "'", out, t0, t1));
    }
    std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.startUs < b.startUs; });
    return out;
}

Result<std::vector<telemetry::FindingEvent>> RunStore::findings(const std::string& runId)
{
    std::lock_guard lk(m->readMutex);
    TS_ASSIGN(int64_t r, m->readRid(runId));
    TS_ASSIGN(sql::Stmt s, m->reader.prepare("SELECT wall_us, step, kind, severity, message, recommendation, first_step, last_step "
                                             "FROM findings WHERE run = ? ORDER BY id"));
    s.bind(1, r);
    std::vector<telemetry::FindingEvent> out;
    while (true) {
        TS_ASSIGN(bool row, s.step());
        if (!row) break;
        telemetry::FindingEvent e;
        e.stamp.runId = runId;
        e.stamp.wallTimeUs = s.int64(0);
        e.stamp.step = s.int64(1);
        e.kind = s.text(2);
        e.severity = s.text(3);
        e.message = s.text(4);
        e.recommendation = s.text(5);
        e.firstStep = s.int64(6);
        e.lastStep = s.int64(7);
        out.push_back(std::move(e));
    }
    return out;
}

Result<std::vector<telemetry::LogEvent>> RunStore::logs(const std::string& runId, int limit)
{
    std::lock_guard lk(m->readMutex);
    TS_ASSIGN(int64_t r, m->readRid(runId));
    TS_ASSIGN(sql::Stmt s, m->reader.prepare("SELECT wall_us, step, level, message, hint, place, worker FROM run_logs WHERE run = ? "
                                             "ORDER BY id" + limitClause(limit)));
    s.bind(1, r);
    std::vector<telemetry::LogEvent> out;
    while (true) {
        TS_ASSIGN(bool row, s.step());
        if (!row) break;
        telemetry::LogEvent e;
        e.stamp.runId = runId;
        e.stamp.wallTimeUs = s.int64(0);
        e.stamp.step = s.int64(1);
        e.level = parseLevel(s.text(2));
        e.message = s.text(3);
        const std::string hint = s.text(4), place = s.text(5);
        if (!place.empty()) e.message = place + ": " + e.message;
        if (!hint.empty()) e.message += " (hint: " + hint + ")";
        e.stamp.lane.worker = s.text(6);
        out.push_back(std::move(e));
    }
    return out;
}

Result<std::vector<Checkpoint>> RunStore::checkpoints(const std::string& runId)
{
    std::lock_guard lk(m->readMutex);
    TS_ASSIGN(int64_t r, m->readRid(runId));
    TS_ASSIGN(sql::Stmt s, m->reader.prepare("SELECT id, step, kind, path, checksum, bytes, created_us FROM checkpoints WHERE run = ? "
                                             "ORDER BY step, id"));
    s.bind(1, r);
    std::vector<Checkpoint> out;
    while (true) {
        TS_ASSIGN(bool row, s.step());
        if (!row) break;
        out.push_back({s.int64(0), runId, s.int64(1), s.text(2), m->resolvedPath(s.text(3)), s.text(4), s.int64(5), s.int64(6)});
    }
    return out;
}

Result<std::vector<RunFile>> RunStore::files(const std::string& runId)
{
    std::lock_guard lk(m->readMutex);
    TS_ASSIGN(int64_t r, m->readRid(runId));
    TS_ASSIGN(sql::Stmt s, m->reader.prepare("SELECT id, kind, path, checksum, bytes, created_us FROM run_files WHERE run = ? ORDER BY id"));
    s.bind(1, r);
    std::vector<RunFile> out;
    while (true) {
        TS_ASSIGN(bool row, s.step());
        if (!row) break;
        out.push_back({s.int64(0), runId, s.text(1), m->resolvedPath(s.text(2)), s.text(3), s.int64(4), s.int64(5)});
    }
    return out;
}

Status RunStore::verifyCheckpoint(const Checkpoint& c)
{
    std::error_code ec;
    if (!fs::exists(c.path, ec))
        return makeError(ErrorCode::NotFound,
                         "checkpoint file '" + c.path + "' of run " + c.runId + " (step " + std::to_string(c.step) + ") is missing",
                         "it was moved or deleted after the run; the run's metrics and the rest of its history are unaffected");
    TS_ASSIGN(std::string sum, fileChecksum(c.path));
    if (sum != c.checksum)
        return makeError(ErrorCode::IoError,
                         "checkpoint file '" + c.path + "' of run " + c.runId + " changed since it was recorded (checksum " +
                             c.checksum + ", now " + sum + ")",
                         "another run or program overwrote it; it no longer holds this run's weights");
    return okStatus();
}

Result<std::vector<std::string>> RunStore::integrityCheck()
{
    std::lock_guard lk(m->readMutex);
    TS_ASSIGN(sql::Stmt s, m->reader.prepare("PRAGMA integrity_check"));
    std::vector<std::string> out;
    while (true) {
        TS_ASSIGN(bool row, s.step());
        if (!row) break;
        out.push_back(s.text(0));
    }
    return out;
}

Status RunStore::withReadSnapshot(const std::function<void()>& fn)
{
    std::lock_guard lk(m->readMutex);
    TS_TRY(m->reader.exec("BEGIN"));
    // A deferred transaction takes its snapshot at the first read.
    auto first = m->reader.queryInt("SELECT count(*) FROM runs");
    if (!first.ok()) {
        (void)m->reader.exec("ROLLBACK");
        return first.takeError();
    }
    fn();
    return m->reader.exec("COMMIT");
}

std::string devicesSummary(const nlohmann::json& devices, bool withNames)
{
    auto text = [](const nlohmann::json& j, const char* key) {
        return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string();
    };
    std::string out;
    auto add = [&out](const std::string& part) {
        if (!part.empty()) out += (out.empty() ? "" : ", ") + part;
    };
    if (devices.is_string()) return devices.get<std::string>();
    if (devices.is_array()) {
        for (const auto& d : devices) {
            if (d.is_string()) {
                add(d.get<std::string>());
            } else if (d.is_object()) {
                std::string one = withNames && !text(d, "name").empty() ? text(d, "name") : text(d, "device");
                if (!text(d, "task").empty()) one = text(d, "task") + " " + one;
                add(one.empty() ? d.dump() : one);
            } else {
                add(d.dump());
            }
        }
    } else if (devices.is_object()) {
        for (auto it = devices.begin(); it != devices.end(); ++it)
            add(it.value().is_array() ? it.key() + " \u00d7" + std::to_string(it.value().size()) : it.key());
    }
    return out;
}

} // namespace ts::store
