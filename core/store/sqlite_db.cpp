#include "store/sqlite_db.h"

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <unistd.h>

namespace ts::store::sql {

namespace {

std::string hintFor(int rc)
{
    switch (rc & 0xff) {
    case SQLITE_NOTADB:
    case SQLITE_CORRUPT:
        return "the file is damaged or is not a TrainStudio run database; keep a copy of it and either choose "
               "another database (--db) or salvage what is left with `sqlite3 FILE .recover`";
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
        return "another process holds the database locked; wait for it or close it";
    case SQLITE_READONLY:
        return "the database (or its folder) is read-only; check the permissions or choose another --db";
    case SQLITE_CANTOPEN:
        return "check that the folder exists and that you may write to it";
    case SQLITE_FULL:
        return "the disk is full; free some space";
    case SQLITE_IOERR:
        return "the disk or file system reported an error";
    default:
        return {};
    }
}

} // namespace

Result<bool> Stmt::step()
{
    const int rc = sqlite3_step(m_stmt);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    const char* sql = sqlite3_sql(m_stmt);
    std::string what = "statement failed";
    if (sql) {
        std::string s(sql);
        if (s.size() > 60) s = s.substr(0, 57) + "...";
        what = "'" + s + "' failed";
    }
    Error e = m_db->error(rc, what);
    sqlite3_reset(m_stmt);
    return e;
}

Status Stmt::run()
{
    while (true) {
        auto r = step();
        if (!r.ok()) return r.takeError();
        if (!*r) break;
    }
    sqlite3_reset(m_stmt);
    sqlite3_clear_bindings(m_stmt);
    return okStatus();
}

Result<Db> Db::open(const std::string& path, bool readOnly, bool create)
{
    Db db;
    db.m_path = path;
    int flags = SQLITE_OPEN_NOMUTEX;  // each connection is used by one thread at a time
    if (readOnly) flags |= SQLITE_OPEN_READONLY;
    else flags |= SQLITE_OPEN_READWRITE | (create ? SQLITE_OPEN_CREATE : 0);
    if (!create || readOnly) {
        std::error_code ec;
        if (!std::filesystem::exists(path, ec))
            return makeError(ErrorCode::NotFound, "run database '" + path + "' does not exist",
                             "check the path, or leave out --db to use the default database");
    }
    std::string name = path;
    if (readOnly) {
        // On read-only media (a mounted backup, a CD) SQLite cannot make the -shm file a WAL
        // database needs even to read, and fails with "unable to open database file". Nobody can
        // write there either, so the file is opened as immutable.
        std::error_code ec;
        const std::filesystem::path dir = std::filesystem::absolute(path, ec).parent_path();
        if (::access(dir.c_str(), W_OK) != 0 && errno == EROFS) {
            flags |= SQLITE_OPEN_URI;
            name = "file:";
            for (const unsigned char c : std::filesystem::absolute(path, ec).string()) {
                if (std::isalnum(c) || std::strchr("/-_.~", c)) {
                    name += static_cast<char>(c);
                } else {
                    char hex[4];
                    std::snprintf(hex, sizeof hex, "%%%02X", c);
                    name += hex;
                }
            }
            name += "?immutable=1";
        }
    }
    const int rc = sqlite3_open_v2(name.c_str(), &db.m_db, flags, nullptr);
    if (rc != SQLITE_OK) {
        Error e = db.m_db ? db.error(rc, "cannot open the run database")
                          : makeError(ErrorCode::OutOfMemory, path + ": cannot open the run database: out of memory");
        return e;
    }
    sqlite3_extended_result_codes(db.m_db, 1);
    // Another process committing a batch holds the write lock for milliseconds; wait for it.
    sqlite3_busy_timeout(db.m_db, 10000);
    return db;
}

void Db::close()
{
    if (m_db) {
        sqlite3_close_v2(m_db);
        m_db = nullptr;
    }
}

Status Db::exec(const std::string& sql)
{
    char* msg = nullptr;
    const int rc = sqlite3_exec(m_db, sql.c_str(), nullptr, nullptr, &msg);
    if (msg) sqlite3_free(msg);
    if (rc != SQLITE_OK) {
        std::string s = sql.size() > 60 ? sql.substr(0, 57) + "..." : sql;
        return error(rc, "'" + s + "' failed");
    }
    return okStatus();
}

Result<Stmt> Db::prepare(std::string_view sql) const
{
    sqlite3_stmt* s = nullptr;
    const int rc = sqlite3_prepare_v3(m_db, sql.data(), static_cast<int>(sql.size()), SQLITE_PREPARE_PERSISTENT, &s, nullptr);
    if (rc != SQLITE_OK) {
        std::string q(sql.substr(0, 60));
        return error(rc, "cannot prepare '" + q + "'");
    }
    return Stmt(s, this);
}

Result<int64_t> Db::queryInt(const std::string& sql) const
{
    TS_ASSIGN(Stmt s, prepare(sql));
    TS_ASSIGN(bool row, s.step());
    return row ? s.int64(0) : int64_t{0};
}

Error Db::error(int rc, const std::string& what) const
{
    std::string detail = m_db ? sqlite3_errmsg(m_db) : sqlite3_errstr(rc);
    ErrorCode code = ErrorCode::IoError;
    switch (rc & 0xff) {
    case SQLITE_NOTADB:
    case SQLITE_CORRUPT: code = ErrorCode::ParseError; break;
    case SQLITE_NOMEM: code = ErrorCode::OutOfMemory; break;
    case SQLITE_CANTOPEN: code = ErrorCode::NotFound; break;
    case SQLITE_CONSTRAINT:
    case SQLITE_MISMATCH:
    case SQLITE_RANGE: code = ErrorCode::InvalidArgument; break;
    case SQLITE_ERROR: code = ErrorCode::Internal; break;
    default: break;
    }
    return makeError(code, "run database '" + m_path + "': " + what + ": " + detail, hintFor(rc));
}

Result<Transaction> Transaction::begin(Db& db, bool immediate)
{
    TS_TRY(db.exec(immediate ? "BEGIN IMMEDIATE" : "BEGIN"));
    return Transaction(db);
}

Transaction::~Transaction()
{
    if (m_db) (void)m_db->exec("ROLLBACK");
}

Status Transaction::commit()
{
    Db* db = std::exchange(m_db, nullptr);
    Status s = db->exec("COMMIT");
    if (!s.ok()) (void)db->exec("ROLLBACK");
    return s;
}

} // namespace ts::store::sql
