#include "slicesched/server/state_store.h"

#include <sqlite3.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "state_store_sql.h"

namespace slicesched {
namespace {

// Every schema change is one entry here, applied in order inside one
// transaction; entry i brings the database from version i to i + 1. Never
// edit an entry that has shipped: append a new one and bump kSchemaVersion.
constexpr std::string_view kMigrations[] = {
    // 0 -> 1: the initial schema.
    R"sql(
CREATE TABLE deployments (
  name            TEXT PRIMARY KEY NOT NULL,
  spec_yaml       TEXT NOT NULL,
  created_unix_ms INTEGER NOT NULL,
  updated_unix_ms INTEGER NOT NULL
);
CREATE TABLE estimators (
  kind            TEXT PRIMARY KEY NOT NULL,
  text            TEXT NOT NULL,
  updated_unix_ms INTEGER NOT NULL
);
CREATE TABLE jobs (
  id                INTEGER PRIMARY KEY AUTOINCREMENT,
  yaml              TEXT NOT NULL,
  state             TEXT NOT NULL,
  tenant            TEXT NOT NULL,
  submitted_unix_ms INTEGER NOT NULL,
  updated_unix_ms   INTEGER NOT NULL
);
CREATE INDEX jobs_by_state ON jobs(state, id);
CREATE INDEX jobs_by_tenant ON jobs(tenant, id);
CREATE TABLE job_events (
  job_id       INTEGER NOT NULL,
  seq          INTEGER NOT NULL,
  time_unix_ms INTEGER NOT NULL,
  kind         TEXT NOT NULL,
  details_json TEXT NOT NULL,
  PRIMARY KEY (job_id, seq)
) WITHOUT ROWID;
-- The event log is append-only: rows are never changed, and only removed
-- together with their job (DeleteJob removes the job first).
CREATE TRIGGER job_events_no_update BEFORE UPDATE ON job_events
BEGIN SELECT RAISE(ABORT, 'job_events is append-only'); END;
CREATE TRIGGER job_events_no_delete BEFORE DELETE ON job_events
WHEN EXISTS (SELECT 1 FROM jobs WHERE id = OLD.job_id)
BEGIN SELECT RAISE(ABORT, 'job_events is append-only'); END;
)sql",
    // 1 -> 2: where a job resumes from and how far it got (the JobManager
    // reloads non-terminal jobs at start and resumes them from
    // checkpoint_path), its state message and its current plan.
    R"sql(
ALTER TABLE jobs ADD COLUMN checkpoint_path TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN iterations_done INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN iterations_target INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN last_loss REAL NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN message TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN plan_json TEXT NOT NULL DEFAULT '{}';
)sql",
    // 2 -> 3: pairs the job runner's stop-loss decoupled; the planner never
    // pairs them again, across restarts (job_a < job_b).
    R"sql(
CREATE TABLE decoupled_pairs (
  job_a        INTEGER NOT NULL,
  job_b        INTEGER NOT NULL,
  time_unix_ms INTEGER NOT NULL,
  PRIMARY KEY (job_a, job_b)
) WITHOUT ROWID;
)sql",
    // 3 -> 4: the job runner's normal runs (jobs that trained alone from a
    // fresh state): the run's key (task and training setup) and its
    // evaluations, the stop-loss's normal curve across restarts.
    R"sql(
CREATE TABLE normal_runs (
  job_id          INTEGER PRIMARY KEY NOT NULL,
  run_key         TEXT NOT NULL,
  updated_unix_ms INTEGER NOT NULL
);
CREATE TABLE normal_run_points (
  job_id INTEGER NOT NULL,
  step   INTEGER NOT NULL,
  metric REAL NOT NULL,
  PRIMARY KEY (job_id, step)
) WITHOUT ROWID;
)sql",
    // 4 -> 5: spatial pairs training jointly (job_a < job_b), so that a
    // restarted job runner can resume them jointly.
    R"sql(
CREATE TABLE joint_pairs (
  job_a        INTEGER NOT NULL,
  job_b        INTEGER NOT NULL,
  time_unix_ms INTEGER NOT NULL,
  PRIMARY KEY (job_a, job_b)
) WITHOUT ROWID;
)sql",
    // 5 -> 6: offline batch inference jobs (state_store_batches.cc): the
    // batch, its validated requests in input order, and one result per
    // request, written once, in the transaction that updates the counters.
    R"sql(
CREATE TABLE batches (
  id                  INTEGER PRIMARY KEY AUTOINCREMENT,
  state               TEXT NOT NULL,
  deployment          TEXT NOT NULL,
  tenant              TEXT NOT NULL,
  total               INTEGER NOT NULL,
  rejected            INTEGER NOT NULL,
  succeeded           INTEGER NOT NULL DEFAULT 0,
  failed              INTEGER NOT NULL DEFAULT 0,
  prompt_tokens       INTEGER NOT NULL DEFAULT 0,
  completion_tokens   INTEGER NOT NULL DEFAULT 0,
  completion_window_s INTEGER NOT NULL,
  deadline_unix_ms    INTEGER NOT NULL,
  created_unix_ms     INTEGER NOT NULL,
  updated_unix_ms     INTEGER NOT NULL,
  finished_unix_ms    INTEGER NOT NULL DEFAULT 0,
  message             TEXT NOT NULL DEFAULT '',
  metadata_json       TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX batches_by_state ON batches(state, id);
CREATE TABLE batch_requests (
  batch_id     INTEGER NOT NULL,
  idx          INTEGER NOT NULL,
  line         INTEGER NOT NULL,
  custom_id    TEXT NOT NULL,
  request_json TEXT NOT NULL,
  PRIMARY KEY (batch_id, idx)
) WITHOUT ROWID;
CREATE TABLE batch_results (
  batch_id          INTEGER NOT NULL,
  idx               INTEGER NOT NULL,
  ok                INTEGER NOT NULL,
  body_json         TEXT NOT NULL,
  prompt_tokens     INTEGER NOT NULL,
  completion_tokens INTEGER NOT NULL,
  time_unix_ms      INTEGER NOT NULL,
  PRIMARY KEY (batch_id, idx)
) WITHOUT ROWID;
CREATE TRIGGER batch_results_write_once BEFORE UPDATE ON batch_results
BEGIN SELECT RAISE(ABORT, 'batch_results are written once'); END;
)sql",
};
static_assert(static_cast<int>(std::size(kMigrations)) == StateStore::kSchemaVersion);

int64_t WallNowMs() { return absl::ToUnixMillis(absl::Now()); }

}  // namespace

// ---------------------------------------------------------------------------
// Open, configuration and migrations.

StateStore::StateStore(std::string path, Options options, sqlite3* db)
    : path_(std::move(path)), options_(std::move(options)), db_(db) {}

StateStore::~StateStore() {
  absl::MutexLock lock(&mu_);
  sqlite3_close_v2(db_);
}

absl::StatusOr<std::unique_ptr<StateStore>> StateStore::Open(const std::string& dir) {
  return Open(dir, Options{});
}

absl::StatusOr<std::unique_ptr<StateStore>> StateStore::Open(const std::string& dir, Options options) {
  if (dir.empty()) return absl::InvalidArgumentError("state directory: empty path");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::PermissionDeniedError(StrCat("state directory ", dir, ": cannot create it: ", ec.message()));
  }
  if (!std::filesystem::is_directory(dir, ec)) {
    return absl::FailedPreconditionError(StrCat("state directory ", dir, ": not a directory"));
  }
  std::string path = (std::filesystem::path(dir) / std::string(kFileName)).string();
  sqlite3* db = nullptr;
  const int rc = sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE |
                                                        SQLITE_OPEN_NOMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    absl::Status status = SqliteError(db, rc, "open", path);
    sqlite3_close_v2(db);
    return status;
  }
  sqlite3_extended_result_codes(db, 1);
  std::unique_ptr<StateStore> store(new StateStore(std::move(path), std::move(options), db));
  {
    absl::MutexLock lock(&store->mu_);
    SLICESCHED_RETURN_IF_ERROR(store->Configure());
    SLICESCHED_RETURN_IF_ERROR(store->Migrate());
  }
  return store;
}

absl::Status StateStore::Exec(std::string_view sql) {
  // sqlite3_exec needs a NUL-terminated string; statements are literals.
  const std::string text(sql);
  char* err = nullptr;
  const int rc = sqlite3_exec(db_, text.c_str(), nullptr, nullptr, &err);
  sqlite3_free(err);
  if (rc != SQLITE_OK) return SqliteError(db_, rc, sql, path_);
  return absl::OkStatus();
}

absl::Status StateStore::Configure() {
  sqlite3_busy_timeout(db_, options_.busy_timeout_ms);
  {
    // The first statement that reads the file: a non-database fails here.
    constexpr std::string_view kSql = "PRAGMA journal_mode=WAL";
    SLICESCHED_ASSIGN_OR_RETURN(Statement st, Statement::Prepare(db_, kSql, path_));
    SLICESCHED_ASSIGN_OR_RETURN(bool row, st.Step());
    const std::string mode = row ? st.Text(0) : "";
    if (mode != "wal") {
      return absl::FailedPreconditionError(
          StrCat("state database ", path_, ": cannot enable WAL journaling (journal mode is '", mode,
                 "'); is the state directory on a network file system?"));
    }
  }
  SLICESCHED_RETURN_IF_ERROR(Exec("PRAGMA synchronous=NORMAL"));
  {
    constexpr std::string_view kSql = "PRAGMA quick_check";
    SLICESCHED_ASSIGN_OR_RETURN(Statement st, Statement::Prepare(db_, kSql, path_));
    SLICESCHED_ASSIGN_OR_RETURN(bool row, st.Step());
    if (row && st.Text(0) != "ok") {
      return absl::DataLossError(StrCat("state database ", path_, ": integrity check failed: ", st.Text(0),
                                        "; move the file aside to start with empty state"));
    }
  }
  {
    // JSON functions are built into SQLite >= 3.38; older builds skip the check.
    auto st = Statement::Prepare(db_, "SELECT json_valid('{}')", path_);
    have_json_ = st.ok();
  }
  return absl::OkStatus();
}

absl::Status StateStore::Migrate() {
  SLICESCHED_RETURN_IF_ERROR(
      Exec("CREATE TABLE IF NOT EXISTS schema_version ("
           "id INTEGER PRIMARY KEY CHECK (id = 1), version INTEGER NOT NULL)"));
  SLICESCHED_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(this));
  int64_t version = 0;
  {
    constexpr std::string_view kSql = "SELECT version FROM schema_version WHERE id = 1";
    SLICESCHED_ASSIGN_OR_RETURN(Statement st, Statement::Prepare(db_, kSql, path_));
    SLICESCHED_ASSIGN_OR_RETURN(bool row, st.Step());
    if (row) version = st.Int(0);
  }
  if (version > kSchemaVersion) {
    return absl::FailedPreconditionError(
        StrCat("state database ", path_, ": schema version ", version, " is newer than this sliced supports (",
               kSchemaVersion, "); run a newer sliced or move the file aside"));
  }
  if (version < 0) {
    return absl::DataLossError(StrCat("state database ", path_, ": invalid schema version ", version));
  }
  if (version == kSchemaVersion) return txn.Commit();
  for (int64_t v = version; v < kSchemaVersion; ++v) {
    absl::Status s = Exec(kMigrations[v]);
    if (!s.ok()) return Annotate(s, StrCat("migration to schema version ", v + 1));
  }
  {
    constexpr std::string_view kSql = "INSERT OR REPLACE INTO schema_version (id, version) VALUES (1, ?1)";
    SLICESCHED_ASSIGN_OR_RETURN(Statement st, Statement::Prepare(db_, kSql, path_));
    SLICESCHED_RETURN_IF_ERROR(st.Bind(1, int64_t{kSchemaVersion}).Run());
  }
  return txn.Commit();
}

absl::StatusOr<int> StateStore::SchemaVersion() {
  absl::MutexLock lock(&mu_);
  constexpr std::string_view kSql = "SELECT version FROM schema_version WHERE id = 1";
  SLICESCHED_ASSIGN_OR_RETURN(Statement st, Statement::Prepare(db_, kSql, path_));
  SLICESCHED_ASSIGN_OR_RETURN(bool row, st.Step());
  if (!row) return absl::DataLossError(StrCat("state database ", path_, ": no schema version"));
  return static_cast<int>(st.Int(0));
}

int64_t StateStore::Now() const { return options_.now_unix_ms ? options_.now_unix_ms() : WallNowMs(); }

absl::Status StateStore::ValidateJson(std::string_view json) {
  if (json.empty()) return absl::InvalidArgumentError("event details: empty JSON (use \"{}\")");
  if (!have_json_) return absl::OkStatus();
  constexpr std::string_view kSql = "SELECT json_valid(?1)";
  SLICESCHED_ASSIGN_OR_RETURN(Statement st, Statement::Prepare(db_, kSql, path_));
  st.Bind(1, json);
  SLICESCHED_ASSIGN_OR_RETURN(bool row, st.Step());
  if (!row || st.Int(0) != 1) {
    return absl::InvalidArgumentError(StrCat("event details: not valid JSON: ", json.substr(0, 80)));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Deployments

absl::Status StateStore::PutDeployment(std::string_view name, std::string_view spec_yaml) {
  if (name.empty()) return absl::InvalidArgumentError("deployment: empty name");
  absl::MutexLock lock(&mu_);
  constexpr std::string_view kSql =
      "INSERT INTO deployments (name, spec_yaml, created_unix_ms, updated_unix_ms) VALUES (?1, ?2, ?3, ?3) "
      "ON CONFLICT(name) DO UPDATE SET spec_yaml = excluded.spec_yaml, updated_unix_ms = excluded.updated_unix_ms";
  SLICESCHED_ASSIGN_OR_RETURN(Statement st, Statement::Prepare(db_, kSql, path_));
  return st.Bind(1, name).Bind(2, spec_yaml).Bind(3, Now()).Run();
}

absl::StatusOr<StoredDeployment> StateStore::GetDeployment(std::string_view name) {
  absl::MutexLock lock(&mu_);
  constexpr std::string_view kSql =
      "SELECT name, spec_yaml, created_unix_ms, updated_unix_ms FROM deployments WHERE name = ?1";
  SLICESCHED_ASSIGN_OR_RETURN(Statement st, Statement::Prepare(db_, kSql, path_));
  st.Bind(1, name);
  SLICESCHED_ASSIGN_OR_RETURN(bool row, st.Step());
  if (!row) return absl::NotFoundError(StrCat("no deployment named '", name, "'"));
  return StoredDeployment{st.Text(0), st.Text(1), st.Int(2), st.Int(3)};
}

absl::StatusOr<std::vector<StoredDeployment>> StateStore::ListDeployments() {
  absl::MutexLock lock(&mu_);
  constexpr std::string_view kSql =
      "SELECT name, spec_yaml, created_unix_ms, updated_unix_ms FROM deployments ORDER BY name";
  SLICESCHED_ASSIGN_OR_RETURN(Statement st, Statement::Prepare(db_, kSql, path_));
  std::vector<StoredDeployment> out;
  while (true) {
    SLICESCHED_ASSIGN_OR_RETURN(bool row, st.Step());
    if (!row) break;
    out.push_back(StoredDeployment{st.Text(0), st.Text(1), st.Int(2), st.Int(3)});
  }
  return out;
}

absl::Status StateStore::DeleteDeployment(std::string_view name) {
  absl::MutexLock lock(&mu_);
  constexpr std::string_view kSql = "DELETE FROM deployments WHERE name = ?1";
  SLICESCHED_ASSIGN_OR_RETURN(Statement st, Statement::Prepare(db_, kSql, path_));
  SLICESCHED_RETURN_IF_ERROR(st.Bind(1, name).Run());
  if (sqlite3_changes(db_) == 0) return absl::NotFoundError(StrCat("no deployment named '", name, "'"));
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Estimators

namespace {
constexpr std::string_view kPutEstimatorSql =
    "INSERT INTO estimators (kind, text, updated_unix_ms) VALUES (?1, ?2, ?3) "
    "ON CONFLICT(kind) DO UPDATE SET text = excluded.text, updated_unix_ms = excluded.updated_unix_ms";
}  // namespace

absl::Status StateStore::PutEstimator(std::string_view kind, std::string_view text) {
  return PutEstimators({EstimatorSnapshot{std::string(kind), std::string(text), 0}});
}

absl::Status StateStore::PutEstimators(const std::vector<EstimatorSnapshot>& snapshots) {
  for (const EstimatorSnapshot& s : snapshots) {
    if (s.kind.empty()) return absl::InvalidArgumentError("estimator snapshot: empty kind");
  }
  absl::MutexLock lock(&mu_);
  const int64_t now = Now();
  SLICESCHED_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(this));
  for (const EstimatorSnapshot& s : snapshots) {
    SLICESCHED_ASSIGN_OR_RETURN(Statement st, Statement::Prepare(db_, kPutEstimatorSql, path_));
    SLICESCHED_RETURN_IF_ERROR(st.Bind(1, s.kind).Bind(2, s.text).Bind(3, now).Run());
  }
  return txn.Commit();
}

absl::StatusOr<EstimatorSnapshot> StateStore::GetEstimator(std::string_view kind) {
  absl::MutexLock lock(&mu_);
  constexpr std::string_view kSql = "SELECT kind, text, updated_unix_ms FROM estimators WHERE kind = ?1";
  SLICESCHED_ASSIGN_OR_RETURN(Statement st, Statement::Prepare(db_, kSql, path_));
  st.Bind(1, kind);
  SLICESCHED_ASSIGN_OR_RETURN(bool row, st.Step());
  if (!row) return absl::NotFoundError(StrCat("no estimator snapshot of kind '", kind, "'"));
  return EstimatorSnapshot{st.Text(0), st.Text(1), st.Int(2)};
}

absl::StatusOr<std::vector<EstimatorSnapshot>> StateStore::ListEstimators() {
  absl::MutexLock lock(&mu_);
  constexpr std::string_view kSql = "SELECT kind, text, updated_unix_ms FROM estimators ORDER BY kind";
  SLICESCHED_ASSIGN_OR_RETURN(Statement st, Statement::Prepare(db_, kSql, path_));
  std::vector<EstimatorSnapshot> out;
  while (true) {
    SLICESCHED_ASSIGN_OR_RETURN(bool row, st.Step());
    if (!row) break;
    out.push_back(EstimatorSnapshot{st.Text(0), st.Text(1), st.Int(2)});
  }
  return out;
}

absl::Status StateStore::DeleteEstimator(std::string_view kind) {
  absl::MutexLock lock(&mu_);
  constexpr std::string_view kSql = "DELETE FROM estimators WHERE kind = ?1";
  SLICESCHED_ASSIGN_OR_RETURN(Statement st, Statement::Prepare(db_, kSql, path_));
  SLICESCHED_RETURN_IF_ERROR(st.Bind(1, kind).Run());
  if (sqlite3_changes(db_) == 0) return absl::NotFoundError(StrCat("no estimator snapshot of kind '", kind, "'"));
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Jobs and their event log

namespace {
constexpr std::string_view kJobColumns =
    "id, yaml, state, tenant, submitted_unix_ms, updated_unix_ms, checkpoint_path, iterations_done, "
    "iterations_target, last_loss, message, plan_json";

template <typename S>
StoredJob JobFromRow(const S& st) {
  StoredJob j;
  j.id = static_cast<uint64_t>(st.Int(0));
  j.yaml = st.Text(1);
  j.state = st.Text(2);
  j.tenant = st.Text(3);
  j.submitted_unix_ms = st.Int(4);
  j.updated_unix_ms = st.Int(5);
  j.checkpoint_path = st.Text(6);
  j.iterations_done = st.Int(7);
  j.iterations_target = st.Int(8);
  j.last_loss = st.Double(9);
  j.message = st.Text(10);
  j.plan_json = st.Text(11);
  return j;
}
}  // namespace

absl::StatusOr<bool> StateStore::JobExists(uint64_t id) {
  constexpr std::string_view kSql = "SELECT 1 FROM jobs WHERE id = ?1";
  SLICESCHED_ASSIGN_OR_RETURN(Statement st, Statement::Prepare(db_, kSql, path_));
  st.Bind(1, static_cast<int64_t>(id));
  return st.Step();
}

absl::StatusOr<uint64_t> StateStore::AppendEventLocked(uint64_t job_id, int64_t now, std::string_view kind,
                                                       std::string_view details_json) {
  int64_t seq = 1;
  {
    constexpr std::string_view kSql = "SELECT COALESCE(MAX(seq), 0) + 1 FROM job_events WHERE job_id = ?1";
    SLICESCHED_ASSIGN_OR_RETURN(Statement st, Statement::Prepare(db_, kSql, path_));
    st.Bind(1, static_cast<int64_t>(job_id));
    SLICESCHED_ASSIGN_OR_RETURN(bool row, st.Step());
    if (row) seq = st.Int(0);
  }
  {
    constexpr std::string_view kSql =
        "INSERT INTO job_events (job_id, seq, time_unix_ms, kind, details_json) VALUES (?1, ?2, ?3, ?4, ?5)";
    SLICESCHED_ASSIGN_OR_RETURN(Statement st, Statement::Prepare(db_, kSql, path_));
    SLICESCHED_RETURN_IF_ERROR(
        st.Bind(1, static_cast<int64_t>(job_id)).Bind(2, seq).Bind(3, now).Bind(4, kind).Bind(5, details_json).Run());
  }
  {
    constexpr std::string_view kSql = "UPDATE jobs SET updated_unix_ms = ?2 WHERE id = ?1";
    SLICESCHED_ASSIGN_OR_RETURN(Statement st, Statement::Prepare(db_, kSql, path_));
    SLICESCHED_RETURN_IF_ERROR(st.Bind(1, static_cast<int64_t>(job_id)).Bind(2, now).Run());
  }
  return static_cast<uint64_t>(seq);
}

absl::StatusOr<uint64_t> StateStore::CreateJob(std::string_view yaml, std::string_view tenant,
                                               std::string_view state, std::string_view details_json) {
  if (state.empty()) return absl::InvalidArgumentError("job: empty state");
  absl::MutexLock lock(&mu_);
  SLICESCHED_RETURN_IF_ERROR(ValidateJson(details_json));
  const int64_t now = Now();
  SLICESCHED_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(this));
  {
    constexpr std::string_view kSql =
        "INSERT INTO jobs (yaml, state, tenant, submitted_unix_ms, updated_unix_ms) VALUES (?1, ?2, ?3, ?4, ?4)";
    SLICESCHED_ASSIGN_OR_RETURN(Statement st, Statement::Prepare(db_, kSql, path_));
    SLICESCHED_RETURN_IF_ERROR(st.Bind(1, yaml).Bind(2, state).Bind(3, tenant).Bind(4, now).Run());
  }
  const uint64_t id = static_cast<uint64_t>(sqlite3_last_insert_rowid(db_));
  SLICESCHED_RETURN_IF_ERROR(AppendEventLocked(id, now, "submitted", details_json).status());
  SLICESCHED_RETURN_IF_ERROR(txn.Commit());
  return id;
}

absl::StatusOr<StoredJob> StateStore::GetJob(uint64_t id) {
  absl::MutexLock lock(&mu_);
  const std::string sql = StrCat("SELECT ", kJobColumns, " FROM jobs WHERE id = ?1");
  SLICESCHED_ASSIGN_OR_RETURN(Statement st, Statement::Prepare(db_, sql, path_));
  st.Bind(1, static_cast<int64_t>(id));
  SLICESCHED_ASSIGN_OR_RETURN(bool row, st.Step());
  if (!row) return absl::NotFoundError(StrCat("no fine-tuning job with id ", id));
  return JobFromRow(st);
}

absl::StatusOr<std::vector<StoredJob>> StateStore::ListJobs(const JobFilter& filter) {
  absl::MutexLock lock(&mu_);
  const std::string sql = StrCat("SELECT ", kJobColumns,
                                 " FROM jobs WHERE (?1 = '' OR state = ?1) AND (?2 = '' OR tenant = ?2)"
                                 " AND id > ?3 ORDER BY id LIMIT ?4");
  SLICESCHED_ASSIGN_OR_RETURN(Statement st, Statement::Prepare(db_, sql, path_));
  st.Bind(1, filter.state)
      .Bind(2, filter.tenant)
      .Bind(3, static_cast<int64_t>(filter.after_id))
      .Bind(4, filter.limit > 0 ? filter.limit : int64_t{-1});
  std::vector<StoredJob> out;
  while (true) {
    SLICESCHED_ASSIGN_OR_RETURN(bool row, st.Step());
    if (!row) break;
    out.push_back(JobFromRow(st));
  }
  return out;
}

absl::StatusOr<uint64_t> StateStore::SetJobState(uint64_t id, std::string_view state, std::string_view event_kind,
                                                 std::string_view details_json) {
  if (state.empty()) return absl::InvalidArgumentError("job: empty state");
  if (event_kind.empty()) return absl::InvalidArgumentError("job event: empty kind");
  absl::MutexLock lock(&mu_);
  SLICESCHED_RETURN_IF_ERROR(ValidateJson(details_json));
  const int64_t now = Now();
  SLICESCHED_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(this));
  {
    constexpr std::string_view kSql = "UPDATE jobs SET state = ?2 WHERE id = ?1";
    SLICESCHED_ASSIGN_OR_RETURN(Statement st, Statement::Prepare(db_, kSql, path_));
    SLICESCHED_RETURN_IF_ERROR(st.Bind(1, static_cast<int64_t>(id)).Bind(2, state).Run());
    if (sqlite3_changes(db_) == 0) return absl::NotFoundError(StrCat("no fine-tuning job with id ", id));
  }
  SLICESCHED_ASSIGN_OR_RETURN(uint64_t seq, AppendEventLocked(id, now, event_kind, details_json));
  SLICESCHED_RETURN_IF_ERROR(txn.Commit());
  return seq;
}

absl::StatusOr<std::vector<uint64_t>> StateStore::ApplyJobChanges(const std::vector<JobChange>& changes) {
  for (const JobChange& c : changes) {
    if (c.event_kind.empty()) return absl::InvalidArgumentError("job event: empty kind");
    if (c.update.state.has_value() && c.update.state->empty()) return absl::InvalidArgumentError("job: empty state");
  }
  absl::MutexLock lock(&mu_);
  for (const JobChange& c : changes) {
    SLICESCHED_RETURN_IF_ERROR(ValidateJson(c.details_json));
    if (c.update.plan_json.has_value()) SLICESCHED_RETURN_IF_ERROR(ValidateJson(*c.update.plan_json));
  }
  const int64_t now = Now();
  SLICESCHED_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(this));
  std::vector<uint64_t> seqs;
  seqs.reserve(changes.size());
  for (const JobChange& c : changes) {
    const JobUpdate& u = c.update;
    // "UPDATE jobs SET updated_unix_ms = ?2[, col = ?k]... WHERE id = ?1":
    // the SET list names only the fields being changed.
    std::string sql = "UPDATE jobs SET updated_unix_ms = ?2";
    int next = 3;
    auto set = [&](bool present, std::string_view column) {
      if (present) sql += StrCat(", ", column, " = ?", next++);
    };
    set(u.state.has_value(), "state");
    set(u.checkpoint_path.has_value(), "checkpoint_path");
    set(u.iterations_done.has_value(), "iterations_done");
    set(u.iterations_target.has_value(), "iterations_target");
    set(u.last_loss.has_value(), "last_loss");
    set(u.message.has_value(), "message");
    set(u.plan_json.has_value(), "plan_json");
    sql += " WHERE id = ?1";
    SLICESCHED_ASSIGN_OR_RETURN(Statement st, Statement::Prepare(db_, sql, path_));
    st.Bind(1, static_cast<int64_t>(c.job_id)).Bind(2, now);
    int k = 3;
    if (u.state.has_value()) st.Bind(k++, std::string_view(*u.state));
    if (u.checkpoint_path.has_value()) st.Bind(k++, std::string_view(*u.checkpoint_path));
    if (u.iterations_done.has_value()) st.Bind(k++, *u.iterations_done);
    if (u.iterations_target.has_value()) st.Bind(k++, *u.iterations_target);
    if (u.last_loss.has_value()) st.Bind(k++, *u.last_loss);
    if (u.message.has_value()) st.Bind(k++, std::string_view(*u.message));
    if (u.plan_json.has_value()) st.Bind(k++, std::string_view(*u.plan_json));
    SLICESCHED_RETURN_IF_ERROR(st.Run());
    if (sqlite3_changes(db_) == 0) return absl::NotFoundError(StrCat("no fine-tuning job with id ", c.job_id));
    SLICESCHED_ASSIGN_OR_RETURN(uint64_t seq, AppendEventLocked(c.job_id, now, c.event_kind, c.details_json));
    seqs.push_back(seq);
    if (c.never_pair_with.has_value()) {
      constexpr std::string_view kSql =
          "INSERT OR IGNORE INTO decoupled_pairs (job_a, job_b, time_unix_ms) VALUES (?1, ?2, ?3)";
      SLICESCHED_ASSIGN_OR_RETURN(Statement pst, Statement::Prepare(db_, kSql, path_));
      const uint64_t a = std::min(c.job_id, *c.never_pair_with), b = std::max(c.job_id, *c.never_pair_with);
      SLICESCHED_RETURN_IF_ERROR(pst.Bind(1, static_cast<int64_t>(a)).Bind(2, static_cast<int64_t>(b)).Bind(3, now).Run());
    }
    for (const auto& [other, sql] :
         {std::pair{c.joint_with,
                    std::string_view("INSERT OR IGNORE INTO joint_pairs (job_a, job_b, time_unix_ms) VALUES (?1, ?2, ?3)")},
          std::pair{c.end_joint_with, std::string_view("DELETE FROM joint_pairs WHERE job_a = ?1 AND job_b = ?2")}}) {
      if (!other.has_value()) continue;
      SLICESCHED_ASSIGN_OR_RETURN(Statement pst, Statement::Prepare(db_, sql, path_));
      const uint64_t a = std::min(c.job_id, *other), b = std::max(c.job_id, *other);
      pst.Bind(1, static_cast<int64_t>(a)).Bind(2, static_cast<int64_t>(b));
      if (sql.starts_with("INSERT")) pst.Bind(3, now);
      SLICESCHED_RETURN_IF_ERROR(pst.Run());
    }
  }
  SLICESCHED_RETURN_IF_ERROR(txn.Commit());
  return seqs;
}

absl::Status StateStore::DeleteJob(uint64_t id) {
  absl::MutexLock lock(&mu_);
  SLICESCHED_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(this));
  {
    constexpr std::string_view kSql = "DELETE FROM jobs WHERE id = ?1";
    SLICESCHED_ASSIGN_OR_RETURN(Statement st, Statement::Prepare(db_, kSql, path_));
    SLICESCHED_RETURN_IF_ERROR(st.Bind(1, static_cast<int64_t>(id)).Run());
    if (sqlite3_changes(db_) == 0) return absl::NotFoundError(StrCat("no fine-tuning job with id ", id));
  }
  {
    // Allowed by the append-only trigger only because the job is gone.
    constexpr std::string_view kSql = "DELETE FROM job_events WHERE job_id = ?1";
    SLICESCHED_ASSIGN_OR_RETURN(Statement st, Statement::Prepare(db_, kSql, path_));
    SLICESCHED_RETURN_IF_ERROR(st.Bind(1, static_cast<int64_t>(id)).Run());
  }
  SLICESCHED_RETURN_IF_ERROR(DeleteNormalRunLocked(id));
  {
    constexpr std::string_view kSql = "DELETE FROM joint_pairs WHERE job_a = ?1 OR job_b = ?1";
    SLICESCHED_ASSIGN_OR_RETURN(Statement st, Statement::Prepare(db_, kSql, path_));
    SLICESCHED_RETURN_IF_ERROR(st.Bind(1, static_cast<int64_t>(id)).Run());
  }
  return txn.Commit();
}

absl::StatusOr<uint64_t> StateStore::AppendJobEvent(uint64_t job_id, std::string_view kind,
                                                    std::string_view details_json) {
  if (kind.empty()) return absl::InvalidArgumentError("job event: empty kind");
  absl::MutexLock lock(&mu_);
  SLICESCHED_RETURN_IF_ERROR(ValidateJson(details_json));
  const int64_t now = Now();
  SLICESCHED_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(this));
  SLICESCHED_ASSIGN_OR_RETURN(bool exists, JobExists(job_id));
  if (!exists) return absl::NotFoundError(StrCat("no fine-tuning job with id ", job_id));
  SLICESCHED_ASSIGN_OR_RETURN(uint64_t seq, AppendEventLocked(job_id, now, kind, details_json));
  SLICESCHED_RETURN_IF_ERROR(txn.Commit());
  return seq;
}

absl::StatusOr<std::vector<JobEvent>> StateStore::ListJobEvents(uint64_t job_id, uint64_t after_seq) {
  absl::MutexLock lock(&mu_);
  constexpr std::string_view kSql =
      "SELECT job_id, seq, time_unix_ms, kind, details_json FROM job_events "
      "WHERE job_id = ?1 AND seq > ?2 ORDER BY seq";
  SLICESCHED_ASSIGN_OR_RETURN(Statement st, Statement::Prepare(db_, kSql, path_));
  st.Bind(1, static_cast<int64_t>(job_id)).Bind(2, static_cast<int64_t>(after_seq));
  std::vector<JobEvent> out;
  while (true) {
    SLICESCHED_ASSIGN_OR_RETURN(bool row, st.Step());
    if (!row) break;
    out.push_back(JobEvent{static_cast<uint64_t>(st.Int(0)), static_cast<uint64_t>(st.Int(1)), st.Int(2),
                           st.Text(3), st.Text(4)});
  }
  return out;
}

absl::StatusOr<std::vector<DecoupledPair>> StateStore::ListPairsLocked(std::string_view table) {
  const std::string sql = StrCat("SELECT job_a, job_b, time_unix_ms FROM ", table, " ORDER BY job_a, job_b");
  SLICESCHED_ASSIGN_OR_RETURN(Statement st, Statement::Prepare(db_, sql, path_));
  std::vector<DecoupledPair> out;
  while (true) {
    SLICESCHED_ASSIGN_OR_RETURN(bool row, st.Step());
    if (!row) break;
    out.push_back(DecoupledPair{static_cast<uint64_t>(st.Int(0)), static_cast<uint64_t>(st.Int(1)), st.Int(2)});
  }
  return out;
}

absl::StatusOr<std::vector<DecoupledPair>> StateStore::ListDecoupledPairs() {
  absl::MutexLock lock(&mu_);
  return ListPairsLocked("decoupled_pairs");
}

absl::StatusOr<std::vector<DecoupledPair>> StateStore::ListJointPairs() {
  absl::MutexLock lock(&mu_);
  return ListPairsLocked("joint_pairs");
}

absl::Status StateStore::AddNormalRunPoint(uint64_t job_id, std::string_view run_key, int64_t step, double metric) {
  if (run_key.empty()) return absl::InvalidArgumentError(StrCat("normal run of job ", job_id, ": empty run key"));
  if (step < 0 || !std::isfinite(metric)) {
    return absl::InvalidArgumentError(StrCat("normal run of job ", job_id, ": step ", step, ", metric ", metric,
                                             " (the step must be >= 0 and the metric finite)"));
  }
  absl::MutexLock lock(&mu_);
  const int64_t now = Now();
  SLICESCHED_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(this));
  SLICESCHED_ASSIGN_OR_RETURN(bool exists, JobExists(job_id));
  if (!exists) return absl::NotFoundError(StrCat("no fine-tuning job with id ", job_id));
  {
    constexpr std::string_view kSql = "SELECT run_key FROM normal_runs WHERE job_id = ?1";
    SLICESCHED_ASSIGN_OR_RETURN(Statement st, Statement::Prepare(db_, kSql, path_));
    st.Bind(1, static_cast<int64_t>(job_id));
    SLICESCHED_ASSIGN_OR_RETURN(bool row, st.Step());
    if (row && st.Text(0) != run_key) {
      return absl::FailedPreconditionError(StrCat("normal run of job ", job_id, ": stored with key '", st.Text(0),
                                                  "', not '", run_key, "'"));
    }
  }
  {
    constexpr std::string_view kSql =
        "INSERT INTO normal_runs (job_id, run_key, updated_unix_ms) VALUES (?1, ?2, ?3) "
        "ON CONFLICT(job_id) DO UPDATE SET updated_unix_ms = excluded.updated_unix_ms";
    SLICESCHED_ASSIGN_OR_RETURN(Statement st, Statement::Prepare(db_, kSql, path_));
    SLICESCHED_RETURN_IF_ERROR(st.Bind(1, static_cast<int64_t>(job_id)).Bind(2, run_key).Bind(3, now).Run());
  }
  {
    constexpr std::string_view kSql =
        "INSERT OR REPLACE INTO normal_run_points (job_id, step, metric) VALUES (?1, ?2, ?3)";
    SLICESCHED_ASSIGN_OR_RETURN(Statement st, Statement::Prepare(db_, kSql, path_));
    SLICESCHED_RETURN_IF_ERROR(st.Bind(1, static_cast<int64_t>(job_id)).Bind(2, step).Bind(3, metric).Run());
  }
  return txn.Commit();
}

absl::Status StateStore::DeleteNormalRunLocked(uint64_t job_id) {
  for (std::string_view sql : {std::string_view("DELETE FROM normal_run_points WHERE job_id = ?1"),
                               std::string_view("DELETE FROM normal_runs WHERE job_id = ?1")}) {
    SLICESCHED_ASSIGN_OR_RETURN(Statement st, Statement::Prepare(db_, sql, path_));
    SLICESCHED_RETURN_IF_ERROR(st.Bind(1, static_cast<int64_t>(job_id)).Run());
  }
  return absl::OkStatus();
}

absl::Status StateStore::DeleteNormalRun(uint64_t job_id) {
  absl::MutexLock lock(&mu_);
  SLICESCHED_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(this));
  SLICESCHED_RETURN_IF_ERROR(DeleteNormalRunLocked(job_id));
  return txn.Commit();
}

absl::StatusOr<std::vector<StoredNormalRun>> StateStore::ListNormalRuns() {
  absl::MutexLock lock(&mu_);
  std::vector<StoredNormalRun> out;
  {
    constexpr std::string_view kSql = "SELECT job_id, run_key FROM normal_runs ORDER BY job_id";
    SLICESCHED_ASSIGN_OR_RETURN(Statement st, Statement::Prepare(db_, kSql, path_));
    while (true) {
      SLICESCHED_ASSIGN_OR_RETURN(bool row, st.Step());
      if (!row) break;
      out.push_back(StoredNormalRun{static_cast<uint64_t>(st.Int(0)), st.Text(1), {}});
    }
  }
  constexpr std::string_view kSql = "SELECT step, metric FROM normal_run_points WHERE job_id = ?1 ORDER BY step";
  for (StoredNormalRun& run : out) {
    SLICESCHED_ASSIGN_OR_RETURN(Statement st, Statement::Prepare(db_, kSql, path_));
    st.Bind(1, static_cast<int64_t>(run.job_id));
    while (true) {
      SLICESCHED_ASSIGN_OR_RETURN(bool row, st.Step());
      if (!row) break;
      run.points.emplace_back(st.Int(0), st.Double(1));
    }
  }
  return out;
}

}  // namespace slicesched
