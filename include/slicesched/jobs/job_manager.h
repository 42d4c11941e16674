// The durable lifecycle of fine-tuning jobs.
//
// States and the calls that move a job between them (anything else is an
// illegal transition: FailedPreconditionError naming the current and the
// requested state, e.g. "job 3: cannot go from completed to running"):
//
//   Submit          -> submitted
//   StartProfiling  submitted                    -> profiling
//   Queue           submitted | profiling        -> queued
//   Run             queued | paused | running    -> running   (alone or paired;
//                                                  from running: a re-plan)
//   Pause, Preempt  running                      -> paused    (keeps the checkpoint)
//   Decouple        running (paired)             -> running (alone)
//   Complete        running                      -> completed (terminal)
//   Fail            any non-terminal             -> failed    (terminal)
//   Cancel          any non-terminal             -> cancelled (terminal); on a
//                                                  terminal job: no change, no error
//   ReportProgress  profiling | running | paused    (no state change)
//
// The FineTune proto has fewer states; the mapping (ProtoState) is
//   submitted, profiling, queued -> JOB_STATE_QUEUED   (Job.message says which)
//   running                      -> JOB_STATE_RUNNING
//   paused                       -> JOB_STATE_PAUSED
//   completed                    -> JOB_STATE_SUCCEEDED
//   failed / cancelled           -> JOB_STATE_FAILED / JOB_STATE_CANCELLED
//
// Pairs. Run with a paired mode (temporal, spatial) names the partner job,
// which must exist, differ and not be terminal, except that a temporal
// target may name its completed source (Run(B, temporal, partner A) after A
// completed: B trains from A's adapters and can be decoupled). When a paired job leaves
// `running` (pause, preempt, complete, fail, cancel, or a re-plan that drops
// the pairing), every running job paired with it is decoupled in the same
// transaction (event "decoupled", reason "partner job N ...").
//
// Event log. Every call that changes a job appends one event to the job's
// log (StateStore: seq 1, 2, ... without gaps, in the same transaction as the
// row change). Kinds: submitted, profiling, queued, running, replanned,
// paused, preempted, decoupled, progress, completed, failed, cancelled,
// recovered. Details are a JSON object; state-changing events carry "from"
// and "to" (state names); run events "mode", "partner", "devices", "gpus",
// "predicted_gain"; decoupling "reason", "partner", "mode" (the old one),
// "predicted_gain", "actual_gain"; completion "metrics" and "actual_gain";
// progress "iterations_done", "loss", "checkpoint" (plus the caller's extra
// numeric fields).
//
// Restart. Open() reloads every job. Non-terminal jobs that were running go
// back to queued with a "recovered" event (details: "from", "checkpoint",
// "iterations_done", "plan" = the plan they lost); they resume from their
// checkpoint_path. Jobs that were profiling go back to submitted (a
// "recovered" event, "from": "profiling", "to": "submitted"), so they are
// profiled again. Submitted, queued and paused jobs are kept as they are. A non-terminal job whose stored YAML no longer parses is failed
// with the parse error.
//
// Thread safety: every method may be called from any thread. One mutex
// serialises the calls; it is held across the SQLite write so the in-memory
// state and the database never disagree. The database is STATE_DIR/sliced.db
// (WAL mode), shared with the Master's own StateStore connection.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "slicesched/jobs/job_spec.h"
#include "slicesched/server/state_store.h"

namespace slicesched::jobs {

enum class JobState : uint8_t {
  kSubmitted,
  kProfiling,
  kQueued,
  kRunning,
  kPaused,
  kCompleted,
  kFailed,
  kCancelled,
};
std::string_view JobStateName(JobState s);  // "submitted", "profiling", ...
absl::StatusOr<JobState> ParseJobState(std::string_view name);
bool IsTerminal(JobState s);

enum class RunMode : uint8_t { kAlone, kTemporal, kSpatial };
std::string_view RunModeName(RunMode m);  // "alone", "temporal", "spatial"

// What the planner gives a job to run with.
struct RunPlan {
  std::vector<uint32_t> devices;  // non-empty, distinct device ids
  RunMode mode = RunMode::kAlone;
  uint64_t partner = 0;  // the other job of a temporal/spatial pair; 0 when alone
  // Predicted fraction of iterations the pairing saves (ymir PairEstimate).
  std::optional<double> predicted_gain;
};

struct CompletionReport {
  std::map<std::string, double> metrics;  // e.g. {"accuracy": 0.91, "loss": 0.2}
  std::optional<double> actual_gain;      // measured fraction of iterations saved
  std::string checkpoint_path;            // final weights; "" keeps the last one
};

// A snapshot of one job.
struct JobInfo {
  uint64_t id = 0;
  std::string name;
  std::string tenant;
  JobState state = JobState::kSubmitted;
  std::string yaml;
  JobSpec spec;  // parsed from `yaml`
  int64_t submitted_unix_ms = 0;
  int64_t updated_unix_ms = 0;
  int64_t iterations_done = 0;
  int64_t iterations_target = 0;  // 0 = unknown
  double last_loss = 0;
  std::string checkpoint_path;  // resume point; "" = from scratch
  std::string message;
  RunPlan plan;  // the current plan while running; empty otherwise
};

struct JobCounts {
  uint64_t submitted = 0, profiling = 0, queued = 0, running = 0, paused = 0;
  uint64_t completed = 0, failed = 0, cancelled = 0;
};

struct ListJobsQuery {
  std::vector<JobState> states;  // empty = every state
  std::string tenant;            // empty = every tenant
  size_t page_size = 0;          // 0 = default (100); capped at 1000
  std::string page_token;        // from the previous page; "" = first page
};

struct ListJobsPage {
  std::vector<JobInfo> jobs;    // ascending id
  std::string next_page_token;  // "" on the last page
};

class JsonObject;  // event details under construction (src/jobs/json_writer.h)

struct SubmitJobResult {
  uint64_t job_id = 0;  // 0 with validate_only
  std::vector<std::string> warnings;
};

class JobManager {
 public:
  struct Options {
    // Wall-clock milliseconds for the store's timestamps (tests inject one).
    std::function<int64_t()> now_unix_ms;
    // Whether a backbone name is a registered deployment (presets are always
    // accepted); null = presets only.
    std::function<bool(std::string_view)> is_deployment;
    size_t default_page_size = 100;
    size_t max_page_size = 1000;
  };

  // Opens STATE_DIR/sliced.db (creating and migrating it) and reloads.
  static absl::StatusOr<std::unique_ptr<JobManager>> Open(const std::string& state_dir, Options options);
  // Takes over an open store and reloads.
  static absl::StatusOr<std::unique_ptr<JobManager>> Create(std::unique_ptr<StateStore> store, Options options);

  JobManager(const JobManager&) = delete;
  JobManager& operator=(const JobManager&) = delete;

  // Parses and validates the YAML (see job_spec.h; errors list every problem
  // as "<job>:LINE:COL: FIELD: MESSAGE"). With validate_only nothing is
  // stored and job_id is 0. `tenant` empty: the YAML's tenant or "default".
  absl::StatusOr<SubmitJobResult> Submit(std::string_view yaml, std::string_view tenant, bool validate_only);

  absl::StatusOr<ListJobsPage> List(const ListJobsQuery& query);
  absl::StatusOr<JobInfo> Get(uint64_t id);  // NotFound
  // Events with seq > after_seq, ascending.
  absl::StatusOr<std::vector<JobEvent>> Events(uint64_t id, uint64_t after_seq = 0);
  // The job after the call: cancelled, or the terminal state it had reached.
  absl::StatusOr<JobInfo> Cancel(uint64_t id, std::string_view reason);
  JobCounts Counts();
  // Now on the clock of the stored timestamps (submitted_unix_ms, ...):
  // Options::now_unix_ms, else the wall clock. The job runner measures how
  // long a job has waited since its submission with it.
  int64_t NowUnixMs() const;

  // --- Transitions the planner drives (see the table above) -----------------
  absl::StatusOr<JobInfo> StartProfiling(uint64_t id, const std::vector<uint32_t>& devices);
  // iterations_target > 0 records the profiler's estimate; 0 keeps the old one.
  absl::StatusOr<JobInfo> Queue(uint64_t id, int64_t iterations_target = 0);
  absl::StatusOr<JobInfo> Run(uint64_t id, const RunPlan& plan);
  absl::StatusOr<JobInfo> Pause(uint64_t id, std::string_view reason);
  absl::StatusOr<JobInfo> Preempt(uint64_t id, std::string_view reason);
  // never_pair_again: the pair (id, its partner) is also stored (StateStore
  // decoupled_pairs, same transaction; the event's details get
  // "never_pair_again": true) and listed by NeverPairedAgain from then on,
  // across restarts.
  absl::StatusOr<JobInfo> Decouple(uint64_t id, std::string_view reason, std::optional<double> actual_gain = {},
                                   bool never_pair_again = false);
  // The pairs decoupled with never_pair_again, as (smaller id, larger id).
  absl::StatusOr<std::set<std::pair<uint64_t, uint64_t>>> NeverPairedAgain();
  // Spatial joint training (StateStore joint_pairs, schema 5). The job
  // runner calls StartJointTraining when a running spatial pair takes its
  // first joint micro-batch (the shared adapter made, or a stored joint pair
  // resumed after a restart, `resumed`): event "joint_training" on both
  // jobs (partner, step, resumed) and the pair stored, in one transaction.
  // FailedPrecondition unless both run spatially with each other. Every
  // decoupling of the pair (Decouple, or a member leaving running: the
  // partner's "decoupled") removes it in its own transaction; a restart
  // (running -> queued, "recovered") keeps it, so JointPairs lists the pairs
  // that were training jointly when the daemon stopped. EndJointTraining
  // removes a stored pair that will not resume, with event
  // "joint_not_resumed" (reason) on each member that still exists; the jobs'
  // states are unchanged.
  absl::Status StartJointTraining(uint64_t a, uint64_t b, int64_t step, bool resumed);
  absl::Status EndJointTraining(uint64_t a, uint64_t b, std::string_view reason);
  absl::StatusOr<std::set<std::pair<uint64_t, uint64_t>>> JointPairs();
  // The job runner's normal runs (StateStore normal_runs, schema 4): an
  // evaluation (step, metric) of a job that trains normally, under the
  // run's key (task and setup); forgetting a job's run (it turned out not to
  // be normal); every stored run. They survive restarts, so the stop-loss
  // keeps its normal curves. NotFound for an unknown job.
  absl::Status RecordNormalEvaluation(uint64_t id, std::string_view run_key, int64_t step, double metric);
  absl::Status ForgetNormalRun(uint64_t id);
  absl::StatusOr<std::vector<StoredNormalRun>> NormalRuns();
  absl::StatusOr<JobInfo> Complete(uint64_t id, const CompletionReport& report);
  absl::StatusOr<JobInfo> Fail(uint64_t id, std::string_view reason);
  // Progress and the latest checkpoint (the resume point after a restart).
  // `extra` adds numeric fields to the event's details (e.g. the job
  // runner's epoch, eval metric, context-switch times); the three fixed keys
  // cannot be overridden.
  absl::StatusOr<JobInfo> ReportProgress(uint64_t id, int64_t iterations_done, double loss,
                                         std::string_view checkpoint_path,
                                         const std::map<std::string, double>& extra = {});

 private:
  explicit JobManager(std::unique_ptr<StateStore> store, Options options);
  absl::Status Reload();

  JobInfo* Find(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<JobInfo*> FindOrNotFound(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // FailedPrecondition unless the job is in one of `from`.
  static absl::Status CheckFrom(const JobInfo& job, std::string_view call, JobState to,
                                std::initializer_list<JobState> from);

  struct Pending;  // one job's new row and its event (job_manager.cc)
  // When `before` ran paired and `after` no longer runs paired with the same
  // partner, adds a decoupling of every running job paired with it.
  void DecouplePartners(const JobInfo& before, const JobInfo& after, std::string_view why,
                        std::vector<Pending>* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stores every change in one transaction, then applies them to memory;
  // returns the first job as stored.
  absl::StatusOr<JobInfo> Commit(std::vector<Pending> changes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The common shape of the simple transitions: check `from`, build the new
  // row with `edit`, record `kind` with `details`, decouple partners.
  absl::StatusOr<JobInfo> Move(uint64_t id, std::string_view call, JobState to,
                               std::initializer_list<JobState> from, std::string_view kind,
                               const std::function<void(JobInfo*, JsonObject*)>& edit)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const Options options_;
  const std::unique_ptr<StateStore> store_;

  absl::Mutex mu_;
  std::map<uint64_t, JobInfo> jobs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace slicesched::jobs
