// The SQL plumbing shared by the StateStore's source files: error mapping,
// prepared statements and transactions. Internal to src/server.
#pragma once

#include <sqlite3.h>

#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "slicesched/server/state_store.h"

namespace slicesched {
namespace state_store_sql {

inline absl::StatusCode CodeOf(int rc) {
  switch (rc & 0xff) {
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return absl::StatusCode::kDataLoss;
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
    case SQLITE_CANTOPEN:
    case SQLITE_IOERR:
    case SQLITE_PROTOCOL:
      return absl::StatusCode::kUnavailable;
    case SQLITE_CONSTRAINT:
      return absl::StatusCode::kFailedPrecondition;
    case SQLITE_FULL:
    case SQLITE_NOMEM:
      return absl::StatusCode::kResourceExhausted;
    case SQLITE_PERM:
    case SQLITE_READONLY:
    case SQLITE_AUTH:
      return absl::StatusCode::kPermissionDenied;
    default:
      return absl::StatusCode::kInternal;
  }
}

// The statement as shown in error messages: whitespace collapsed, cut short.
inline std::string ShortSql(std::string_view sql) {
  std::string out;
  for (char c : sql) {
    const bool space = c == '\n' || c == ' ' || c == '\t';
    if (space && (out.empty() || out.back() == ' ')) continue;
    out.push_back(space ? ' ' : c);
    if (out.size() >= 96) {
      out += "...";
      break;
    }
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

inline absl::Status SqliteError(sqlite3* db, int rc, std::string_view sql, const std::string& path) {
  const char* msg = db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  std::string text = StrCat("state database ", path, ": ", msg, " (sqlite code ", rc, ") in statement '",
                            ShortSql(sql), "'");
  const int primary = rc & 0xff;
  if (primary == SQLITE_CORRUPT || primary == SQLITE_NOTADB) {
    text += "; the file is corrupt or not a SQLite database: move it aside to start with empty state";
  }
  return absl::Status(CodeOf(rc), text);
}

}  // namespace state_store_sql

using state_store_sql::SqliteError;

// ---------------------------------------------------------------------------
// Statement: a prepared statement with error reporting that names it.

class StateStore::Statement {
 public:
  static absl::StatusOr<Statement> Prepare(sqlite3* db, std::string_view sql, const std::string& path) {
    sqlite3_stmt* stmt = nullptr;
    const int rc = sqlite3_prepare_v2(db, sql.data(), static_cast<int>(sql.size()), &stmt, nullptr);
    if (rc != SQLITE_OK) {
      sqlite3_finalize(stmt);
      return SqliteError(db, rc, sql, path);
    }
    return Statement(db, stmt, sql, path);
  }

  Statement(Statement&& o) noexcept
      : db_(o.db_), stmt_(std::exchange(o.stmt_, nullptr)), sql_(o.sql_), path_(o.path_), bind_(std::move(o.bind_)) {}
  Statement& operator=(Statement&&) = delete;
  ~Statement() { sqlite3_finalize(stmt_); }

  Statement& Bind(int index, int64_t value) {
    Check(sqlite3_bind_int64(stmt_, index, value));
    return *this;
  }
  Statement& Bind(int index, double value) {
    Check(sqlite3_bind_double(stmt_, index, value));
    return *this;
  }
  Statement& Bind(int index, std::string_view value) {
    Check(sqlite3_bind_text(stmt_, index, value.data(), static_cast<int>(value.size()), SQLITE_TRANSIENT));
    return *this;
  }

  // true: a row is available; false: done.
  absl::StatusOr<bool> Step() {
    if (!bind_.ok()) return bind_;
    const int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    return SqliteError(db_, rc, sql_, *path_);
  }
  // Runs to completion, ignoring rows.
  absl::Status Run() {
    while (true) {
      SLICESCHED_ASSIGN_OR_RETURN(bool row, Step());
      if (!row) return absl::OkStatus();
    }
  }

  // Ready to run again with new bindings.
  void Reset() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }

  bool IsNull(int col) const { return sqlite3_column_type(stmt_, col) == SQLITE_NULL; }
  int64_t Int(int col) const { return sqlite3_column_int64(stmt_, col); }
  double Double(int col) const { return sqlite3_column_double(stmt_, col); }
  std::string Text(int col) const {
    const unsigned char* p = sqlite3_column_text(stmt_, col);
    const int n = sqlite3_column_bytes(stmt_, col);
    return p == nullptr ? std::string() : std::string(reinterpret_cast<const char*>(p), static_cast<size_t>(n));
  }

 private:
  Statement(sqlite3* db, sqlite3_stmt* stmt, std::string_view sql, const std::string& path)
      : db_(db), stmt_(stmt), sql_(sql), path_(&path) {}

  void Check(int rc) {
    if (rc != SQLITE_OK && bind_.ok()) bind_ = SqliteError(db_, rc, sql_, *path_);
  }

  sqlite3* db_;
  sqlite3_stmt* stmt_;
  std::string_view sql_;  // statements are string literals
  const std::string* path_;
  absl::Status bind_;
};

// ---------------------------------------------------------------------------
// Transaction: BEGIN IMMEDIATE ... COMMIT, rolled back unless committed.

class StateStore::Transaction {
 public:
  static absl::StatusOr<Transaction> Begin(StateStore* store) ABSL_EXCLUSIVE_LOCKS_REQUIRED(store->mu_) {
    // IMMEDIATE takes the write lock now, so a read-then-write sequence
    // (next seq, then insert) cannot race another connection.
    SLICESCHED_RETURN_IF_ERROR(store->Exec("BEGIN IMMEDIATE"));
    return Transaction(store);
  }
  Transaction(Transaction&& o) noexcept : store_(std::exchange(o.store_, nullptr)) {}
  Transaction& operator=(Transaction&&) = delete;
  ~Transaction() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (store_ != nullptr) (void)store_->Exec("ROLLBACK");
  }
  absl::Status Commit() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    StateStore* s = std::exchange(store_, nullptr);
    absl::Status status = s->Exec("COMMIT");
    if (!status.ok()) (void)s->Exec("ROLLBACK");
    return status;
  }

 private:
  explicit Transaction(StateStore* store) : store_(store) {}
  StateStore* store_;
};

}  // namespace slicesched
