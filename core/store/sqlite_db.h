#pragma once
// Thin RAII over the SQLite C API, private to core/store (nothing outside includes it, so
// <sqlite3.h> stays out of the public headers). Every error names the database file and,
// for the failures a user can act on (damaged file, locked, read-only, disk full), says what to do.

#include <sqlite3.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>

#include "common/result.h"

namespace ts::store::sql {

class Db;

// A prepared statement. Bind indexes are 1-based, column indexes 0-based (as in SQLite).
class Stmt {
public:
    Stmt() = default;
    Stmt(sqlite3_stmt* s, const Db* db) : m_stmt(s), m_db(db) {}
    Stmt(Stmt&& o) noexcept : m_stmt(std::exchange(o.m_stmt, nullptr)), m_db(o.m_db) {}
    Stmt& operator=(Stmt&& o) noexcept
    {
        if (this != &o) {
            sqlite3_finalize(m_stmt);
            m_stmt = std::exchange(o.m_stmt, nullptr);
            m_db = o.m_db;
        }
        return *this;
    }
    Stmt(const Stmt&) = delete;
    Stmt& operator=(const Stmt&) = delete;
    ~Stmt() { sqlite3_finalize(m_stmt); }

    bool valid() const { return m_stmt != nullptr; }

    Stmt& bind(int i, int64_t v) { sqlite3_bind_int64(m_stmt, i, v); return *this; }
    Stmt& bind(int i, int v) { sqlite3_bind_int64(m_stmt, i, v); return *this; }
    Stmt& bind(int i, uint64_t v) { sqlite3_bind_int64(m_stmt, i, static_cast<int64_t>(v)); return *this; }
    // NaN has no SQLite representation: it is stored as NULL and read back as NaN.
    Stmt& bind(int i, double v)
    {
        if (std::isnan(v)) sqlite3_bind_null(m_stmt, i);
        else sqlite3_bind_double(m_stmt, i, v);
        return *this;
    }
    Stmt& bind(int i, std::string_view v)
    {
        sqlite3_bind_text64(m_stmt, i, v.data(), v.size(), SQLITE_TRANSIENT, SQLITE_UTF8);
        return *this;
    }
    Stmt& bind(int i, const char* v) { return bind(i, std::string_view(v)); }
    Stmt& bind(int i, const std::string& v) { return bind(i, std::string_view(v)); }
    Stmt& bindBlob(int i, const void* p, std::size_t n)
    {
        sqlite3_bind_blob64(m_stmt, i, p, n, SQLITE_TRANSIENT);
        return *this;
    }
    Stmt& bindNull(int i) { sqlite3_bind_null(m_stmt, i); return *this; }

    // One step: true when a row is available, false when done.
    Result<bool> step();
    // Steps to completion (for statements that return no rows), then resets.
    Status run();
    void reset()
    {
        sqlite3_reset(m_stmt);
        sqlite3_clear_bindings(m_stmt);
    }

    bool isNull(int c) const { return sqlite3_column_type(m_stmt, c) == SQLITE_NULL; }
    int64_t int64(int c) const { return sqlite3_column_int64(m_stmt, c); }
    double real(int c) const
    {
        return isNull(c) ? std::numeric_limits<double>::quiet_NaN() : sqlite3_column_double(m_stmt, c);
    }
    std::string text(int c) const
    {
        const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(m_stmt, c));
        return p ? std::string(p, static_cast<std::size_t>(sqlite3_column_bytes(m_stmt, c))) : std::string();
    }
    std::string_view blob(int c) const
    {
        const void* p = sqlite3_column_blob(m_stmt, c);
        return p ? std::string_view(static_cast<const char*>(p), static_cast<std::size_t>(sqlite3_column_bytes(m_stmt, c)))
                 : std::string_view();
    }

private:
    sqlite3_stmt* m_stmt = nullptr;
    const Db* m_db = nullptr;
};

class Db {
public:
    Db() = default;
    Db(Db&& o) noexcept : m_db(std::exchange(o.m_db, nullptr)), m_path(std::move(o.m_path)) {}
    Db& operator=(Db&& o) noexcept
    {
        if (this != &o) {
            close();
            m_db = std::exchange(o.m_db, nullptr);
            m_path = std::move(o.m_path);
        }
        return *this;
    }
    Db(const Db&) = delete;
    Db& operator=(const Db&) = delete;
    ~Db() { close(); }

    // readOnly: SQLITE_OPEN_READONLY; otherwise read-write, created when missing if `create`.
    static Result<Db> open(const std::string& path, bool readOnly, bool create);
    void close();

    bool isOpen() const { return m_db != nullptr; }
    // SQLite opens a file this user may not write read-only without saying so.
    bool isReadOnly() const { return m_db && sqlite3_db_readonly(m_db, "main") == 1; }
    // The last call failed because another connection held a lock (SQLITE_BUSY).
    bool lastCallWasBusy() const { return m_db && (sqlite3_errcode(m_db) & 0xff) == SQLITE_BUSY; }
    const std::string& path() const { return m_path; }
    sqlite3* handle() const { return m_db; }

    Status exec(const std::string& sql);
    Result<Stmt> prepare(std::string_view sql) const;
    // First column of the first row as an integer (PRAGMA user_version and friends).
    Result<int64_t> queryInt(const std::string& sql) const;
    int64_t lastInsertRowId() const { return sqlite3_last_insert_rowid(m_db); }
    int changes() const { return sqlite3_changes(m_db); }

    // An Error for SQLite result code `rc` while doing `what`, naming the file.
    Error error(int rc, const std::string& what) const;

private:
    sqlite3* m_db = nullptr;
    std::string m_path;
    friend class Stmt;
};

// A transaction that rolls back unless committed (BEGIN IMMEDIATE for writers, so that two
// processes never deadlock upgrading a read lock; BEGIN for readers' snapshots).
class Transaction {
public:
    static Result<Transaction> begin(Db& db, bool immediate);
    Transaction(Transaction&& o) noexcept : m_db(std::exchange(o.m_db, nullptr)) {}
    Transaction& operator=(Transaction&&) = delete;
    ~Transaction();
    Status commit();

private:
    explicit Transaction(Db& db) : m_db(&db) {}
    Db* m_db = nullptr;
};

} // namespace ts::store::sql
