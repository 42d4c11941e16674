// Durable daemon state: one SQLite database, STATE_DIR/sliced.db.
//
// What survives a restart of `sliced`:
//   deployments   name -> the deployment spec as YAML (DeploymentConfig::ToYaml)
//   estimators    kind ("op", "transfer", ...) -> the text of
//                 OpEstimator::Save() / TransferEstimator::Save()
//   jobs          fine-tuning jobs: id, submitted YAML, state, tenant, times,
//                 and (schema 2) the resume point and progress: last
//                 checkpoint path, iterations done / target, last loss, a
//                 human-readable message and the current plan as JSON
//   job_events    a per-job append-only log: (job id, seq) with seq = 1, 2, ...
//                 without gaps, time, kind, details as JSON text
//   decoupled_pairs (schema 3) pairs of jobs the planner must never pair
//                 again (the job runner's stop-loss decoupled them, or a
//                 spatial pair could not start jointly), stored in the same
//                 transaction as the decoupling event
//   normal_runs, normal_run_points (schema 4) the job runner's normal runs:
//                 job id -> the run's key (task and training setup, opaque
//                 here) and its evaluations (step -> metric), the stop-loss's
//                 normal curve after a restart; removed with their job
//   joint_pairs   (schema 5) spatial pairs that are training jointly (one
//                 shared adapter, each member's part in its own checkpoint):
//                 stored in the transaction of the event that starts (or
//                 resumes) the joint training and removed in the one that
//                 decouples the pair, so after a restart the job runner
//                 knows which queued jobs were one joint pair
//   batches, batch_requests, batch_results (schema 6) offline batch
//                 inference jobs: the batch row (state, counters, deadline),
//                 its validated requests in input order (index 0, 1, ...), and
//                 at most one result per request. A result is inserted in the
//                 transaction that adds it to the batch's counters, and never
//                 changed, so a request counts as done exactly when its
//                 result is stored
//
// The database runs in WAL mode (readers never block the writer) with a busy
// timeout, so `slicectl` or a second StateStore may read while the daemon
// writes. The schema is versioned in table `schema_version`; every migration
// lives in one list in state_store.cc and runs in one transaction at Open.
// Updates that touch several rows (a job's state and its event, a batch of
// estimator snapshots, deleting a job and its log) are single transactions.
//
// Errors: every SQLite failure becomes a Status whose message names the
// statement and SQLite's own message; corruption or a file that is not a
// database gives DataLossError naming the file, a database written by a newer
// binary gives FailedPreconditionError, lock contention past the busy
// timeout gives UnavailableError. Nothing here throws or aborts.
//
// Thread safety: all methods may be called from any thread; one connection
// per StateStore, serialised by a mutex.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

struct sqlite3;

namespace slicesched {

struct StoredDeployment {
  std::string name;
  std::string spec_yaml;
  int64_t created_unix_ms = 0;  // kept when a deployment is replaced
  int64_t updated_unix_ms = 0;
};

struct EstimatorSnapshot {
  std::string kind;  // e.g. "op", "transfer"
  std::string text;  // the estimator's Save() output
  int64_t updated_unix_ms = 0;
};

struct StoredJob {
  uint64_t id = 0;
  std::string yaml;
  std::string state;   // e.g. "queued", "running"; the store does not interpret it
  std::string tenant;
  int64_t submitted_unix_ms = 0;
  int64_t updated_unix_ms = 0;
  // Schema 2; the store does not interpret these either.
  std::string checkpoint_path;   // where the job resumes from; "" = from scratch
  int64_t iterations_done = 0;
  int64_t iterations_target = 0;  // 0 = not known yet
  double last_loss = 0;
  std::string message;            // why the job is in its state
  std::string plan_json = "{}";   // the current plan (devices, mode, partner)
};

// A partial update of a job row: only the fields that are set change.
struct JobUpdate {
  std::optional<std::string> state;
  std::optional<std::string> checkpoint_path;
  std::optional<int64_t> iterations_done;
  std::optional<int64_t> iterations_target;
  std::optional<double> last_loss;
  std::optional<std::string> message;
  std::optional<std::string> plan_json;  // must be valid JSON (checked as event details are)
};

// One row update plus the event that records it.
struct JobChange {
  uint64_t job_id = 0;
  JobUpdate update;
  std::string event_kind;
  std::string details_json = "{}";
  // Also records (job_id, never_pair_with) in decoupled_pairs (schema 3).
  std::optional<uint64_t> never_pair_with;
  // Also records (job_id, joint_with) in joint_pairs (schema 5).
  std::optional<uint64_t> joint_with;
  // Also removes (job_id, end_joint_with) from joint_pairs (absent: no-op).
  std::optional<uint64_t> end_joint_with;
};

// A pair the planner must never pair again (job_a < job_b).
struct DecoupledPair {
  uint64_t job_a = 0;
  uint64_t job_b = 0;
  int64_t time_unix_ms = 0;
};

// A job's normal run (schema 4): its key and evaluations, ascending step.
struct StoredNormalRun {
  uint64_t job_id = 0;
  std::string run_key;
  std::vector<std::pair<int64_t, double>> points;  // (step, metric)
};

struct JobEvent {
  uint64_t job_id = 0;
  uint64_t seq = 0;  // 1-based, no gaps per job
  int64_t time_unix_ms = 0;
  std::string kind;
  std::string details_json;  // "{}" when there are no details
};

struct JobFilter {
  std::string state;   // empty = any
  std::string tenant;  // empty = any
  uint64_t after_id = 0;  // paging: ids greater than this
  int64_t limit = 0;      // 0 = no limit
};

// An offline batch inference job (schema 6). The store does not interpret
// `state`; the counters are kept by PutBatchResult.
struct StoredBatch {
  uint64_t id = 0;
  std::string state;
  std::string deployment;  // the deployment given at submit ("" = each line names its model)
  std::string tenant;
  int64_t total = 0;       // accepted requests
  int64_t rejected = 0;    // input lines left out at submit
  int64_t succeeded = 0;   // results stored, ok
  int64_t failed = 0;      // results stored, error
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t completion_window_s = 0;  // 0 = none
  int64_t deadline_unix_ms = 0;     // 0 = none
  int64_t created_unix_ms = 0;
  int64_t updated_unix_ms = 0;
  int64_t finished_unix_ms = 0;     // 0 = not finished
  std::string message;
  std::string metadata_json = "{}";
};

// One accepted request of a batch, as the runner needs it.
struct StoredBatchRequest {
  int64_t index = 0;  // 0-based position among the accepted requests
  int64_t line = 0;   // 1-based line in the input file
  std::string custom_id;
  std::string request_json;  // the validated request (jobs/batch_input.h EncodeBatchRequest)
};

// The result of one request: the output line's response body (ok) or its
// error object.
struct StoredBatchResult {
  int64_t index = 0;
  bool ok = true;
  std::string body_json;
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t time_unix_ms = 0;  // set by the store
};

// A request with its result, when one is stored.
struct BatchResultRow {
  int64_t index = 0;
  std::string custom_id;
  std::optional<StoredBatchResult> result;
};

struct BatchUpdate {
  std::optional<std::string> state;
  std::optional<std::string> message;
  std::optional<int64_t> finished_unix_ms;
};

struct BatchFilter {
  std::vector<std::string> states;  // empty = any
  uint64_t after_id = 0;
  int64_t limit = 0;  // 0 = no limit
};

class StateStore {
 public:
  struct Options {
    // Wall-clock source for the *_unix_ms columns (tests inject a fake).
    std::function<int64_t()> now_unix_ms;
    // How long a statement waits for another connection's lock.
    int busy_timeout_ms = 5000;
  };

  static constexpr int kSchemaVersion = 6;
  static constexpr std::string_view kFileName = "sliced.db";

  // Opens (creating the directory and the database when missing) and
  // migrates DIR/sliced.db, then runs a quick integrity check.
  static absl::StatusOr<std::unique_ptr<StateStore>> Open(const std::string& dir);
  static absl::StatusOr<std::unique_ptr<StateStore>> Open(const std::string& dir, Options options);

  StateStore(const StateStore&) = delete;
  StateStore& operator=(const StateStore&) = delete;
  ~StateStore();

  const std::string& path() const { return path_; }
  absl::StatusOr<int> SchemaVersion();
  // The clock of the *_unix_ms columns: Options::now_unix_ms, else the wall
  // clock (Unix milliseconds).
  int64_t Now() const;

  // --- Deployments (keyed by name) ---------------------------------------
  // Inserts or replaces; a replaced deployment keeps its created time.
  absl::Status PutDeployment(std::string_view name, std::string_view spec_yaml);
  absl::StatusOr<StoredDeployment> GetDeployment(std::string_view name);  // NotFound
  absl::StatusOr<std::vector<StoredDeployment>> ListDeployments();        // by name
  absl::Status DeleteDeployment(std::string_view name);                  // NotFound

  // --- Estimator snapshots (keyed by kind) --------------------------------
  absl::Status PutEstimator(std::string_view kind, std::string_view text);
  // Several kinds at once, all or nothing (e.g. op and transfer together).
  absl::Status PutEstimators(const std::vector<EstimatorSnapshot>& snapshots);
  absl::StatusOr<EstimatorSnapshot> GetEstimator(std::string_view kind);  // NotFound
  absl::StatusOr<std::vector<EstimatorSnapshot>> ListEstimators();       // by kind
  absl::Status DeleteEstimator(std::string_view kind);                   // NotFound

  // --- Fine-tuning jobs -----------------------------------------------------
  // Creates a job (ids ascend, never reused) and, in the same transaction,
  // its first event: kind "submitted" with `details_json`.
  absl::StatusOr<uint64_t> CreateJob(std::string_view yaml, std::string_view tenant,
                                     std::string_view state, std::string_view details_json = "{}");
  absl::StatusOr<StoredJob> GetJob(uint64_t id);  // NotFound
  absl::StatusOr<std::vector<StoredJob>> ListJobs(const JobFilter& filter = {});  // ascending id
  // Sets the state and appends an event (kind, details) in one transaction;
  // returns the event's seq. NotFound for an unknown job.
  absl::StatusOr<uint64_t> SetJobState(uint64_t id, std::string_view state, std::string_view event_kind,
                                       std::string_view details_json = "{}");
  // Applies every change (row update, then its event) in order, all in one
  // transaction: either every change and event is stored or none is.
  // Returns each event's seq. NotFound (and nothing stored) when a job does
  // not exist; InvalidArgument for an empty event kind, an empty state or
  // invalid JSON.
  absl::StatusOr<std::vector<uint64_t>> ApplyJobChanges(const std::vector<JobChange>& changes);
  // Deletes a job and its event log.
  absl::Status DeleteJob(uint64_t id);  // NotFound

  // --- Job event log (append-only: the schema rejects updates) ---------------
  // Appends an event with the next seq and returns it; NotFound for an
  // unknown job. `details_json` must be a JSON object or array (checked by
  // SQLite's json_valid when available, else only non-empty).
  absl::StatusOr<uint64_t> AppendJobEvent(uint64_t job_id, std::string_view kind,
                                          std::string_view details_json = "{}");
  // Events of a job with seq > after_seq, ascending seq.
  absl::StatusOr<std::vector<JobEvent>> ListJobEvents(uint64_t job_id, uint64_t after_seq = 0);

  // --- Pairs never to be paired again (JobChange::never_pair_with) -----------
  // Every stored pair, ascending (job_a, job_b).
  absl::StatusOr<std::vector<DecoupledPair>> ListDecoupledPairs();
  // Spatial pairs training jointly (schema 5; JobChange::joint_with), as
  // (job_a < job_b, time stored), ascending.
  absl::StatusOr<std::vector<DecoupledPair>> ListJointPairs();

  // --- Offline batch jobs (schema 6; state_store_batches.cc) ---------------
  // Stores the batch row and all its requests in one transaction (ids
  // ascend, never reused); `batch.id`, the counters and the times are
  // ignored. InvalidArgument for an empty state or indices that are not
  // 0, 1, ... in order.
  absl::StatusOr<uint64_t> CreateBatch(const StoredBatch& batch, const std::vector<StoredBatchRequest>& requests);
  absl::StatusOr<StoredBatch> GetBatch(uint64_t id);  // NotFound
  absl::StatusOr<std::vector<StoredBatch>> ListBatches(const BatchFilter& filter = {});  // ascending id
  absl::StatusOr<StoredBatch> UpdateBatch(uint64_t id, const BatchUpdate& update);      // NotFound
  // Requests of the batch with index > after_index and no stored result,
  // ascending index, at most `limit` (> 0).
  absl::StatusOr<std::vector<StoredBatchRequest>> PendingBatchRequests(uint64_t id, int64_t after_index,
                                                                       int64_t limit);
  // Inserts the result and adds it to the batch's counters, in one
  // transaction. AlreadyExists (nothing changed) when the request already
  // has one; NotFound for an unknown batch or index.
  absl::Status PutBatchResult(uint64_t id, const StoredBatchResult& result);
  // Requests with index > after_index in index order, each with its result
  // when stored, at most `limit` (> 0).
  absl::StatusOr<std::vector<BatchResultRow>> ListBatchResults(uint64_t id, int64_t after_index, int64_t limit);
  // (state, number of batches) for every state present, by state.
  absl::StatusOr<std::vector<std::pair<std::string, int64_t>>> CountBatchesByState();

  // --- Normal runs (schema 4; the job runner's stop-loss curves) -------------
  // Records (step, metric) of the job's normal run `run_key` (replacing a
  // point at the same step). NotFound for an unknown job; FailedPrecondition
  // when the job's run is stored under another key; InvalidArgument for an
  // empty key, a negative step or a metric that is not finite.
  absl::Status AddNormalRunPoint(uint64_t job_id, std::string_view run_key, int64_t step, double metric);
  // Forgets the job's normal run (none stored: no change, no error).
  absl::Status DeleteNormalRun(uint64_t job_id);
  // Every stored run, ascending job id, points by ascending step.
  absl::StatusOr<std::vector<StoredNormalRun>> ListNormalRuns();

 private:
  class Statement;
  class Transaction;

  StateStore(std::string path, Options options, sqlite3* db);

  absl::Status Configure() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Migrate() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Exec(std::string_view sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<bool> JobExists(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<uint64_t> AppendEventLocked(uint64_t job_id, int64_t now, std::string_view kind,
                                             std::string_view details_json)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ValidateJson(std::string_view json) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status DeleteNormalRunLocked(uint64_t job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The (job_a, job_b, time) rows of a pair table (decoupled_pairs, joint_pairs).
  absl::StatusOr<std::vector<DecoupledPair>> ListPairsLocked(std::string_view table)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const std::string path_;
  const Options options_;

  absl::Mutex mu_;
  sqlite3* db_ ABSL_GUARDED_BY(mu_);
  bool have_json_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace slicesched
