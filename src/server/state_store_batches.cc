// The StateStore's offline batch jobs (schema 6): see state_store.h.
#include <sqlite3.h>

#include <string>
#include <vector>

#include "slicesched/server/state_store.h"
#include "state_store_sql.h"

namespace slicesched {
namespace {

constexpr std::string_view kBatchColumns =
    "id, state, deployment, tenant, total, rejected, succeeded, failed, prompt_tokens, completion_tokens, "
    "completion_window_s, deadline_unix_ms, created_unix_ms, updated_unix_ms, finished_unix_ms, message, "
    "metadata_json";

template <typename S>
StoredBatch BatchFromRow(const S& st) {
  StoredBatch b;
  b.id = static_cast<uint64_t>(st.Int(0));
  b.state = st.Text(1);
  b.deployment = st.Text(2);
  b.tenant = st.Text(3);
  b.total = st.Int(4);
  b.rejected = st.Int(5);
  b.succeeded = st.Int(6);
  b.failed = st.Int(7);
  b.prompt_tokens = st.Int(8);
  b.completion_tokens = st.Int(9);
  b.completion_window_s = st.Int(10);
  b.deadline_unix_ms = st.Int(11);
  b.created_unix_ms = st.Int(12);
  b.updated_unix_ms = st.Int(13);
  b.finished_unix_ms = st.Int(14);
  b.message = st.Text(15);
  b.metadata_json = st.Text(16);
  return b;
}

absl::Status NoBatch(uint64_t id) { return absl::NotFoundError(StrCat("no batch with id ", id)); }

}  // namespace

absl::StatusOr<uint64_t> StateStore::CreateBatch(const StoredBatch& batch,
                                                 const std::vector<StoredBatchRequest>& requests) {
  if (batch.state.empty()) return absl::InvalidArgumentError("batch: empty state");
  for (size_t i = 0; i < requests.size(); ++i) {
    if (requests[i].index != static_cast<int64_t>(i)) {
      return absl::InvalidArgumentError(
          StrCat("batch request ", i, ": index ", requests[i].index, " (requests are numbered 0, 1, ... in order)"));
    }
  }
  absl::MutexLock lock(&mu_);
  SLICESCHED_RETURN_IF_ERROR(ValidateJson(batch.metadata_json));
  const int64_t now = Now();
  SLICESCHED_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(this));
  {
    constexpr std::string_view kSql =
        "INSERT INTO batches (state, deployment, tenant, total, rejected, completion_window_s, deadline_unix_ms, "
        "created_unix_ms, updated_unix_ms, message, metadata_json) "
        "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?8, ?9, ?10)";
    SLICESCHED_ASSIGN_OR_RETURN(Statement st, Statement::Prepare(db_, kSql, path_));
    SLICESCHED_RETURN_IF_ERROR(st.Bind(1, batch.state)
                                   .Bind(2, batch.deployment)
                                   .Bind(3, batch.tenant)
                                   .Bind(4, static_cast<int64_t>(requests.size()))
                                   .Bind(5, batch.rejected)
                                   .Bind(6, batch.completion_window_s)
                                   .Bind(7, batch.deadline_unix_ms)
                                   .Bind(8, now)
                                   .Bind(9, batch.message)
                                   .Bind(10, batch.metadata_json)
                                   .Run());
  }
  const uint64_t id = static_cast<uint64_t>(sqlite3_last_insert_rowid(db_));
  {
    // One prepared statement, re-bound per row: 100,000 rows in well under a
    // second.
    constexpr std::string_view kSql =
        "INSERT INTO batch_requests (batch_id, idx, line, custom_id, request_json) VALUES (?1, ?2, ?3, ?4, ?5)";
    SLICESCHED_ASSIGN_OR_RETURN(Statement st, Statement::Prepare(db_, kSql, path_));
    for (const StoredBatchRequest& r : requests) {
      SLICESCHED_RETURN_IF_ERROR(st.Bind(1, static_cast<int64_t>(id))
                                     .Bind(2, r.index)
                                     .Bind(3, r.line)
                                     .Bind(4, r.custom_id)
                                     .Bind(5, r.request_json)
                                     .Run());
      st.Reset();
    }
  }
  SLICESCHED_RETURN_IF_ERROR(txn.Commit());
  return id;
}

absl::StatusOr<StoredBatch> StateStore::GetBatch(uint64_t id) {
  absl::MutexLock lock(&mu_);
  const std::string sql = StrCat("SELECT ", kBatchColumns, " FROM batches WHERE id = ?1");
  SLICESCHED_ASSIGN_OR_RETURN(Statement st, Statement::Prepare(db_, sql, path_));
  st.Bind(1, static_cast<int64_t>(id));
  SLICESCHED_ASSIGN_OR_RETURN(bool row, st.Step());
  if (!row) return NoBatch(id);
  return BatchFromRow(st);
}

absl::StatusOr<std::vector<StoredBatch>> StateStore::ListBatches(const BatchFilter& filter) {
  absl::MutexLock lock(&mu_);
  // The state filter as a JSON-free list: "|a|b|" LIKE '%|state|%'.
  std::string states;
  if (!filter.states.empty()) {
    states = "|";
    for (const std::string& s : filter.states) states += StrCat(s, "|");
  }
  const std::string sql = StrCat("SELECT ", kBatchColumns,
                                 " FROM batches WHERE (?1 = '' OR instr(?1, '|' || state || '|') > 0)"
                                 " AND id > ?2 ORDER BY id LIMIT ?3");
  SLICESCHED_ASSIGN_OR_RETURN(Statement st, Statement::Prepare(db_, sql, path_));
  st.Bind(1, states)
      .Bind(2, static_cast<int64_t>(filter.after_id))
      .Bind(3, filter.limit > 0 ? filter.limit : int64_t{-1});
  std::vector<StoredBatch> out;
  while (true) {
    SLICESCHED_ASSIGN_OR_RETURN(bool row, st.Step());
    if (!row) break;
    out.push_back(BatchFromRow(st));
  }
  return out;
}

absl::StatusOr<StoredBatch> StateStore::UpdateBatch(uint64_t id, const BatchUpdate& update) {
  if (update.state.has_value() && update.state->empty()) return absl::InvalidArgumentError("batch: empty state");
  absl::MutexLock lock(&mu_);
  const int64_t now = Now();
  SLICESCHED_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(this));
  {
    // A NULL parameter keeps the column as it is.
    constexpr std::string_view kSql =
        "UPDATE batches SET updated_unix_ms = ?2, state = coalesce(?3, state), message = coalesce(?4, message), "
        "finished_unix_ms = coalesce(?5, finished_unix_ms) WHERE id = ?1";
    SLICESCHED_ASSIGN_OR_RETURN(Statement st, Statement::Prepare(db_, kSql, path_));
    st.Bind(1, static_cast<int64_t>(id)).Bind(2, now);
    if (update.state.has_value()) st.Bind(3, *update.state);
    if (update.message.has_value()) st.Bind(4, *update.message);
    if (update.finished_unix_ms.has_value()) st.Bind(5, *update.finished_unix_ms);
    SLICESCHED_RETURN_IF_ERROR(st.Run());
    if (sqlite3_changes(db_) == 0) return NoBatch(id);
  }
  const std::string sql = StrCat("SELECT ", kBatchColumns, " FROM batches WHERE id = ?1");
  SLICESCHED_ASSIGN_OR_RETURN(Statement st, Statement::Prepare(db_, sql, path_));
  st.Bind(1, static_cast<int64_t>(id));
  SLICESCHED_ASSIGN_OR_RETURN(bool row, st.Step());
  if (!row) return NoBatch(id);
  StoredBatch b = BatchFromRow(st);
  SLICESCHED_RETURN_IF_ERROR(txn.Commit());
  return b;
}

absl::StatusOr<std::vector<StoredBatchRequest>> StateStore::PendingBatchRequests(uint64_t id, int64_t after_index,
                                                                                 int64_t limit) {
  if (limit <= 0) return absl::InvalidArgumentError(StrCat("pending batch requests: limit ", limit, " (must be > 0)"));
  absl::MutexLock lock(&mu_);
  constexpr std::string_view kSql =
      "SELECT r.idx, r.line, r.custom_id, r.request_json FROM batch_requests r "
      "WHERE r.batch_id = ?1 AND r.idx > ?2 AND NOT EXISTS "
      "(SELECT 1 FROM batch_results s WHERE s.batch_id = r.batch_id AND s.idx = r.idx) "
      "ORDER BY r.idx LIMIT ?3";
  SLICESCHED_ASSIGN_OR_RETURN(Statement st, Statement::Prepare(db_, kSql, path_));
  st.Bind(1, static_cast<int64_t>(id)).Bind(2, after_index).Bind(3, limit);
  std::vector<StoredBatchRequest> out;
  while (true) {
    SLICESCHED_ASSIGN_OR_RETURN(bool row, st.Step());
    if (!row) break;
    out.push_back(StoredBatchRequest{st.Int(0), st.Int(1), st.Text(2), st.Text(3)});
  }
  return out;
}

absl::Status StateStore::PutBatchResult(uint64_t id, const StoredBatchResult& result) {
  absl::MutexLock lock(&mu_);
  SLICESCHED_RETURN_IF_ERROR(ValidateJson(result.body_json));
  const int64_t now = Now();
  SLICESCHED_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(this));
  {
    constexpr std::string_view kSql = "SELECT 1 FROM batch_requests WHERE batch_id = ?1 AND idx = ?2";
    SLICESCHED_ASSIGN_OR_RETURN(Statement st, Statement::Prepare(db_, kSql, path_));
    st.Bind(1, static_cast<int64_t>(id)).Bind(2, result.index);
    SLICESCHED_ASSIGN_OR_RETURN(bool row, st.Step());
    if (!row) return absl::NotFoundError(StrCat("batch ", id, " has no request with index ", result.index));
  }
  {
    constexpr std::string_view kSql =
        "INSERT OR IGNORE INTO batch_results (batch_id, idx, ok, body_json, prompt_tokens, completion_tokens, "
        "time_unix_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)";
    SLICESCHED_ASSIGN_OR_RETURN(Statement st, Statement::Prepare(db_, kSql, path_));
    SLICESCHED_RETURN_IF_ERROR(st.Bind(1, static_cast<int64_t>(id))
                                   .Bind(2, result.index)
                                   .Bind(3, int64_t{result.ok ? 1 : 0})
                                   .Bind(4, result.body_json)
                                   .Bind(5, result.prompt_tokens)
                                   .Bind(6, result.completion_tokens)
                                   .Bind(7, now)
                                   .Run());
    if (sqlite3_changes(db_) == 0) {
      return absl::AlreadyExistsError(StrCat("batch ", id, ": request ", result.index, " already has a result"));
    }
  }
  {
    constexpr std::string_view kSql =
        "UPDATE batches SET succeeded = succeeded + ?2, failed = failed + ?3, prompt_tokens = prompt_tokens + ?4, "
        "completion_tokens = completion_tokens + ?5, updated_unix_ms = ?6 WHERE id = ?1";
    SLICESCHED_ASSIGN_OR_RETURN(Statement st, Statement::Prepare(db_, kSql, path_));
    SLICESCHED_RETURN_IF_ERROR(st.Bind(1, static_cast<int64_t>(id))
                                   .Bind(2, int64_t{result.ok ? 1 : 0})
                                   .Bind(3, int64_t{result.ok ? 0 : 1})
                                   .Bind(4, result.prompt_tokens)
                                   .Bind(5, result.completion_tokens)
                                   .Bind(6, now)
                                   .Run());
    if (sqlite3_changes(db_) == 0) return NoBatch(id);
  }
  return txn.Commit();
}

absl::StatusOr<std::vector<BatchResultRow>> StateStore::ListBatchResults(uint64_t id, int64_t after_index,
                                                                         int64_t limit) {
  if (limit <= 0) return absl::InvalidArgumentError(StrCat("batch results: limit ", limit, " (must be > 0)"));
  absl::MutexLock lock(&mu_);
  constexpr std::string_view kSql =
      "SELECT r.idx, r.custom_id, s.ok, s.body_json, s.prompt_tokens, s.completion_tokens, s.time_unix_ms "
      "FROM batch_requests r LEFT JOIN batch_results s ON s.batch_id = r.batch_id AND s.idx = r.idx "
      "WHERE r.batch_id = ?1 AND r.idx > ?2 ORDER BY r.idx LIMIT ?3";
  SLICESCHED_ASSIGN_OR_RETURN(Statement st, Statement::Prepare(db_, kSql, path_));
  st.Bind(1, static_cast<int64_t>(id)).Bind(2, after_index).Bind(3, limit);
  std::vector<BatchResultRow> out;
  while (true) {
    SLICESCHED_ASSIGN_OR_RETURN(bool row, st.Step());
    if (!row) break;
    BatchResultRow r{st.Int(0), st.Text(1), std::nullopt};
    if (!st.IsNull(2)) {
      r.result = StoredBatchResult{r.index, st.Int(2) != 0, st.Text(3), st.Int(4), st.Int(5), st.Int(6)};
    }
    out.push_back(std::move(r));
  }
  return out;
}

absl::StatusOr<std::vector<std::pair<std::string, int64_t>>> StateStore::CountBatchesByState() {
  absl::MutexLock lock(&mu_);
  constexpr std::string_view kSql = "SELECT state, count(*) FROM batches GROUP BY state ORDER BY state";
  SLICESCHED_ASSIGN_OR_RETURN(Statement st, Statement::Prepare(db_, kSql, path_));
  std::vector<std::pair<std::string, int64_t>> out;
  while (true) {
    SLICESCHED_ASSIGN_OR_RETURN(bool row, st.Step());
    if (!row) break;
    out.emplace_back(st.Text(0), st.Int(1));
  }
  return out;
}

}  // namespace slicesched
