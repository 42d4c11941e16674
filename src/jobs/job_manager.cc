#include "slicesched/jobs/job_manager.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "json_writer.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"

namespace slicesched::jobs {
namespace {

constexpr JobState kAllStates[] = {JobState::kSubmitted, JobState::kProfiling, JobState::kQueued,
                                   JobState::kRunning,   JobState::kPaused,    JobState::kCompleted,
                                   JobState::kFailed,    JobState::kCancelled};

// One job's change waiting to be committed: the job as it will be, and the
// event that records the change.
struct Pending {
  JobInfo after;
  std::string kind;
  std::string details;
};

std::string PlanJson(const JobInfo& job) {
  if (job.state != JobState::kRunning) return "{}";
  JsonObject o;
  o.Add("mode", RunModeName(job.plan.mode));
  o.Add("partner", job.plan.partner);
  o.Add("devices", job.plan.devices);
  o.Add("gpus", static_cast<int64_t>(job.plan.devices.size()));
  if (job.plan.predicted_gain.has_value()) o.Add("predicted_gain", *job.plan.predicted_gain);
  return o.str();
}

JobUpdate RowOf(const JobInfo& job) {
  JobUpdate u;
  u.state = std::string(JobStateName(job.state));
  u.checkpoint_path = job.checkpoint_path;
  u.iterations_done = job.iterations_done;
  u.iterations_target = job.iterations_target;
  u.last_loss = job.last_loss;
  u.message = job.message;
  u.plan_json = PlanJson(job);
  return u;
}

std::string RunMessage(const RunPlan& plan) {
  const size_t gpus = plan.devices.size();
  if (plan.mode == RunMode::kAlone) return StrCat("running alone on ", gpus, gpus == 1 ? " GPU" : " GPUs");
  return StrCat("running paired (", RunModeName(plan.mode), ") with job ", plan.partner, " on ", gpus,
                gpus == 1 ? " GPU" : " GPUs");
}

constexpr std::string_view kSubmittedMessage = "submitted; waiting to be profiled";

uint64_t Fnv1a(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (char c : s) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  return h;
}

// Page tokens are "<last id>.<fingerprint of the filters>", so a token is
// only honoured with the filters that produced it.
uint64_t QueryFingerprint(const ListJobsQuery& q) {
  std::vector<std::string> states;
  for (JobState s : q.states) states.emplace_back(JobStateName(s));
  std::sort(states.begin(), states.end());
  states.erase(std::unique(states.begin(), states.end()), states.end());
  return Fnv1a(StrCat(absl::StrJoin(states, ","), "|", q.tenant));
}

absl::StatusOr<uint64_t> ParsePageToken(const ListJobsQuery& q) {
  if (q.page_token.empty()) return uint64_t{0};
  const size_t dot = q.page_token.find('.');
  uint64_t after = 0;
  uint64_t fingerprint = 0;
  if (dot == std::string::npos || !absl::SimpleAtoi(q.page_token.substr(0, dot), &after) ||
      !absl::SimpleHexAtoi(q.page_token.substr(dot + 1), &fingerprint)) {
    return absl::InvalidArgumentError(StrCat("page_token: '", q.page_token, "' is not a ListJobs page token"));
  }
  if (fingerprint != QueryFingerprint(q)) {
    return absl::InvalidArgumentError(
        "page_token: it belongs to a listing with other filters (state, tenant); repeat the same filters");
  }
  return after;
}

absl::Status CheckReason(std::string_view reason, std::string_view call) {
  if (reason.size() > 4096) return absl::InvalidArgumentError(StrCat(call, ": reason longer than 4096 bytes"));
  return absl::OkStatus();
}

}  // namespace

// One job's change waiting to be committed: the job as it will be, and the
// event that records the change.
struct JobManager::Pending {
  JobInfo after;
  std::string kind;
  std::string details;
  std::optional<uint64_t> never_pair_with;  // JobChange::never_pair_with
  std::optional<uint64_t> joint_with;       // JobChange::joint_with
  std::optional<uint64_t> end_joint_with;   // JobChange::end_joint_with
};

std::string_view JobStateName(JobState s) {
  switch (s) {
    case JobState::kSubmitted: return "submitted";
    case JobState::kProfiling: return "profiling";
    case JobState::kQueued: return "queued";
    case JobState::kRunning: return "running";
    case JobState::kPaused: return "paused";
    case JobState::kCompleted: return "completed";
    case JobState::kFailed: return "failed";
    case JobState::kCancelled: return "cancelled";
  }
  return "?";
}

absl::StatusOr<JobState> ParseJobState(std::string_view name) {
  for (JobState s : kAllStates) {
    if (JobStateName(s) == name) return s;
  }
  return absl::InvalidArgumentError(StrCat("unknown job state '", name, "'"));
}

bool IsTerminal(JobState s) {
  return s == JobState::kCompleted || s == JobState::kFailed || s == JobState::kCancelled;
}

std::string_view RunModeName(RunMode m) {
  switch (m) {
    case RunMode::kAlone: return "alone";
    case RunMode::kTemporal: return "temporal";
    case RunMode::kSpatial: return "spatial";
  }
  return "?";
}

// ---------------------------------------------------------------------------
// Construction and reload

JobManager::JobManager(std::unique_ptr<StateStore> store, Options options)
    : options_(std::move(options)), store_(std::move(store)) {}

absl::StatusOr<std::unique_ptr<JobManager>> JobManager::Open(const std::string& state_dir, Options options) {
  StateStore::Options so;
  so.now_unix_ms = options.now_unix_ms;
  SLICESCHED_ASSIGN_OR_RETURN(std::unique_ptr<StateStore> store, StateStore::Open(state_dir, so));
  return Create(std::move(store), std::move(options));
}

absl::StatusOr<std::unique_ptr<JobManager>> JobManager::Create(std::unique_ptr<StateStore> store, Options options) {
  if (store == nullptr) return absl::InvalidArgumentError("JobManager: no state store");
  std::unique_ptr<JobManager> m(new JobManager(std::move(store), std::move(options)));
  SLICESCHED_RETURN_IF_ERROR(m->Reload());
  return m;
}

absl::Status JobManager::Reload() {
  absl::MutexLock lock(&mu_);
  SLICESCHED_ASSIGN_OR_RETURN(std::vector<StoredJob> rows, store_->ListJobs());
  std::vector<JobChange> repairs;
  for (const StoredJob& row : rows) {
    JobInfo job;
    job.id = row.id;
    job.tenant = row.tenant;
    job.yaml = row.yaml;
    job.submitted_unix_ms = row.submitted_unix_ms;
    job.updated_unix_ms = row.updated_unix_ms;
    job.iterations_done = row.iterations_done;
    job.iterations_target = row.iterations_target;
    job.last_loss = row.last_loss;
    job.checkpoint_path = row.checkpoint_path;
    job.message = row.message;
    absl::StatusOr<JobState> state = ParseJobState(row.state);
    job.state = state.ok() ? *state : JobState::kFailed;

    JobSpecOptions so;
    so.tenant = row.tenant;
    so.check_backbone = false;  // accepted once; deployments may come and go
    so.check_dataset_file = false;
    so.accept_quoted_scalars = true;  // as accepted then
    absl::StatusOr<ParsedJobSpec> parsed = ParseJobSpec(row.yaml, so);
    if (parsed.ok()) {
      job.spec = parsed->spec;
      job.name = job.spec.name;
      if (job.iterations_target == 0) job.iterations_target = job.spec.stop.max_iterations;
    }
    if (job.message.empty() && job.state == JobState::kSubmitted) job.message = kSubmittedMessage;
    const JobState before = job.state;
    std::string kind;
    JsonObject details;
    if (!state.ok()) {
      kind = "failed";
      job.message = StrCat("failed: stored state '", row.state, "' is unknown to this sliced");
      details.Add("from", row.state).Add("to", "failed").Add("reason", job.message);
    } else if (!IsTerminal(job.state) && !parsed.ok()) {
      kind = "failed";
      job.state = JobState::kFailed;
      job.message = StrCat("failed at restart: the job's YAML no longer parses: ", parsed.status().message());
      details.Add("from", JobStateName(before)).Add("to", "failed").Add("reason", job.message);
    } else if (job.state == JobState::kProfiling) {
      // The measurement was lost with the process: profile again.
      kind = "recovered";
      job.state = JobState::kSubmitted;
      job.message = "submitted after a restart (was profiling); will be profiled again";
      details.Add("from", JobStateName(before)).Add("to", "submitted");
    } else if (job.state == JobState::kRunning) {
      kind = "recovered";
      job.state = JobState::kQueued;
      job.message = job.checkpoint_path.empty()
                        ? StrCat("queued after a restart (was ", JobStateName(before), "); starts from scratch")
                        : StrCat("queued after a restart (was ", JobStateName(before), "); resumes from ",
                                 job.checkpoint_path);
      details.Add("from", JobStateName(before))
          .Add("to", "queued")
          .Add("checkpoint", job.checkpoint_path)
          .Add("iterations_done", job.iterations_done)
          .AddRaw("plan", row.plan_json.empty() ? "{}" : row.plan_json);
    }
    if (!kind.empty()) {
      JobChange c;
      c.job_id = job.id;
      c.update = RowOf(job);
      c.event_kind = kind;
      c.details_json = details.str();
      repairs.push_back(std::move(c));
    }
    jobs_.emplace(job.id, std::move(job));
  }
  if (!repairs.empty()) {
    absl::Status s = store_->ApplyJobChanges(repairs).status();
    if (!s.ok()) return Annotate(s, "recovering fine-tuning jobs after a restart");
    for (const JobChange& c : repairs) {
      SLICESCHED_ASSIGN_OR_RETURN(StoredJob row, store_->GetJob(c.job_id));
      jobs_[c.job_id].updated_unix_ms = row.updated_unix_ms;
    }
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Helpers

JobInfo* JobManager::Find(uint64_t id) {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : &it->second;
}

absl::StatusOr<JobInfo*> JobManager::FindOrNotFound(uint64_t id) {
  JobInfo* job = Find(id);
  if (job == nullptr) return absl::NotFoundError(StrCat("no fine-tuning job with id ", id));
  return job;
}

absl::Status JobManager::CheckFrom(const JobInfo& job, std::string_view call, JobState to,
                                   std::initializer_list<JobState> from) {
  if (std::find(from.begin(), from.end(), job.state) != from.end()) return absl::OkStatus();
  std::vector<std::string> names;
  for (JobState s : from) names.emplace_back(JobStateName(s));
  return absl::FailedPreconditionError(StrCat("job ", job.id, ": cannot go from ", JobStateName(job.state), " to ",
                                              JobStateName(to), " (", call, " is allowed from ",
                                              absl::StrJoin(names, ", "), ")"));
}


void JobManager::DecouplePartners(const JobInfo& before, const JobInfo& after, std::string_view why,
                                  std::vector<Pending>* out) {
  if (before.state != JobState::kRunning || before.plan.mode == RunMode::kAlone) return;
  if (after.state == JobState::kRunning && after.plan.mode != RunMode::kAlone &&
      after.plan.partner == before.plan.partner) {
    return;
  }
  for (auto& [id, other] : jobs_) {
    if (id == before.id || other.state != JobState::kRunning || other.plan.mode == RunMode::kAlone ||
        other.plan.partner != before.id) {
      continue;
    }
    Pending p{other, "decoupled", ""};
    if (other.plan.mode == RunMode::kSpatial) p.end_joint_with = before.id;  // no longer one joint pair
    p.after.plan.mode = RunMode::kAlone;
    p.after.plan.partner = 0;
    p.after.plan.predicted_gain.reset();
    p.after.message = RunMessage(p.after.plan);
    JsonObject d;
    d.Add("reason", StrCat("partner job ", before.id, " ", why))
        .Add("partner", before.id)
        .Add("mode", RunModeName(other.plan.mode));
    if (other.plan.predicted_gain.has_value()) d.Add("predicted_gain", *other.plan.predicted_gain);
    p.details = d.str();
    out->push_back(std::move(p));
  }
}

absl::StatusOr<JobInfo> JobManager::Commit(std::vector<Pending> changes) {
  std::vector<JobChange> rows;
  rows.reserve(changes.size());
  // A joint pair ends once per transaction, though both of its members'
  // changes may end it (Decouple and its partner's decoupling;
  // EndJointTraining).
  std::set<std::pair<uint64_t, uint64_t>> ended;
  for (const Pending& p : changes) {
    JobChange c;
    c.job_id = p.after.id;
    c.update = RowOf(p.after);
    c.event_kind = p.kind;
    c.details_json = p.details;
    c.never_pair_with = p.never_pair_with;
    c.joint_with = p.joint_with;
    if (p.end_joint_with.has_value() &&
        ended.emplace(std::min(p.after.id, *p.end_joint_with), std::max(p.after.id, *p.end_joint_with)).second) {
      c.end_joint_with = p.end_joint_with;
    }
    rows.push_back(std::move(c));
  }
  SLICESCHED_RETURN_IF_ERROR(store_->ApplyJobChanges(rows).status());
  // Timestamps as stored (one clock reading per transaction).
  int64_t updated = 0;
  if (!changes.empty()) {
    SLICESCHED_ASSIGN_OR_RETURN(StoredJob row, store_->GetJob(changes.front().after.id));
    updated = row.updated_unix_ms;
  }
  for (Pending& p : changes) {
    p.after.updated_unix_ms = updated;
    jobs_[p.after.id] = std::move(p.after);
  }
  return changes.empty() ? JobInfo{} : jobs_[changes.front().after.id];
}

absl::StatusOr<JobInfo> JobManager::Move(uint64_t id, std::string_view call, JobState to,
                                         std::initializer_list<JobState> from, std::string_view kind,
                                         const std::function<void(JobInfo*, JsonObject*)>& edit) {
  SLICESCHED_ASSIGN_OR_RETURN(JobInfo * job, FindOrNotFound(id));
  SLICESCHED_RETURN_IF_ERROR(CheckFrom(*job, call, to, from));
  std::vector<Pending> changes;
  changes.push_back(Pending{*job, std::string(kind), ""});
  JobInfo& after = changes.back().after;
  after.state = to;
  if (to != JobState::kRunning) after.plan = RunPlan{};
  JsonObject details;
  details.Add("from", JobStateName(job->state)).Add("to", JobStateName(to));
  edit(&after, &details);
  changes.back().details = details.str();
  DecouplePartners(*job, after, kind, &changes);
  return Commit(std::move(changes));
}

// ---------------------------------------------------------------------------
// The FineTune API

absl::StatusOr<SubmitJobResult> JobManager::Submit(std::string_view yaml, std::string_view tenant,
                                                   bool validate_only) {
  JobSpecOptions so;
  so.source = "<job>";
  so.tenant = std::string(tenant);
  so.is_deployment = options_.is_deployment;
  SLICESCHED_ASSIGN_OR_RETURN(ParsedJobSpec parsed, ParseJobSpec(yaml, so));
  SubmitJobResult result;
  result.warnings = parsed.warnings;
  if (validate_only) return result;
  const JobSpec& spec = parsed.spec;
  JsonObject details;
  details.Add("to", "submitted")
      .Add("name", spec.name)
      .Add("tenant", spec.tenant)
      .Add("backbone", spec.backbone)
      .Add("trust_domain", spec.trust_domain)
      .Add("allow_sharing", spec.allow_sharing)
      .Add("priority", spec.priority)
      .Add("min_gpus", spec.min_gpus)
      .Add("max_gpus", spec.max_gpus);
  absl::MutexLock lock(&mu_);
  SLICESCHED_ASSIGN_OR_RETURN(uint64_t id, store_->CreateJob(yaml, spec.tenant, "submitted", details.str()));
  SLICESCHED_ASSIGN_OR_RETURN(StoredJob row, store_->GetJob(id));
  JobInfo job;
  job.id = id;
  job.name = spec.name;
  job.tenant = spec.tenant;
  job.state = JobState::kSubmitted;
  job.yaml = std::string(yaml);
  job.spec = spec;
  job.submitted_unix_ms = row.submitted_unix_ms;
  job.updated_unix_ms = row.updated_unix_ms;
  job.iterations_target = spec.stop.max_iterations;
  // As Reload derives them from a row that has neither message nor target.
  job.message = kSubmittedMessage;
  jobs_.emplace(id, std::move(job));
  result.job_id = id;
  return result;
}

absl::StatusOr<ListJobsPage> JobManager::List(const ListJobsQuery& query) {
  SLICESCHED_ASSIGN_OR_RETURN(uint64_t after, ParsePageToken(query));
  size_t page = query.page_size == 0 ? options_.default_page_size : query.page_size;
  page = std::min(page, options_.max_page_size);
  const std::set<JobState> states(query.states.begin(), query.states.end());
  absl::MutexLock lock(&mu_);
  ListJobsPage out;
  for (auto it = jobs_.upper_bound(after); it != jobs_.end(); ++it) {
    const JobInfo& job = it->second;
    if (!states.empty() && states.count(job.state) == 0) continue;
    if (!query.tenant.empty() && job.tenant != query.tenant) continue;
    if (out.jobs.size() == page) {
      // One more match exists: this page is not the last.
      out.next_page_token = absl::StrFormat("%d.%x", out.jobs.back().id, QueryFingerprint(query));
      break;
    }
    out.jobs.push_back(job);
  }
  return out;
}

absl::StatusOr<JobInfo> JobManager::Get(uint64_t id) {
  absl::MutexLock lock(&mu_);
  SLICESCHED_ASSIGN_OR_RETURN(JobInfo * job, FindOrNotFound(id));
  return *job;
}

absl::StatusOr<std::vector<JobEvent>> JobManager::Events(uint64_t id, uint64_t after_seq) {
  absl::MutexLock lock(&mu_);
  SLICESCHED_RETURN_IF_ERROR(FindOrNotFound(id).status());
  return store_->ListJobEvents(id, after_seq);
}

JobCounts JobManager::Counts() {
  absl::MutexLock lock(&mu_);
  JobCounts c;
  for (const auto& [id, job] : jobs_) {
    switch (job.state) {
      case JobState::kSubmitted: ++c.submitted; break;
      case JobState::kProfiling: ++c.profiling; break;
      case JobState::kQueued: ++c.queued; break;
      case JobState::kRunning: ++c.running; break;
      case JobState::kPaused: ++c.paused; break;
      case JobState::kCompleted: ++c.completed; break;
      case JobState::kFailed: ++c.failed; break;
      case JobState::kCancelled: ++c.cancelled; break;
    }
  }
  return c;
}

int64_t JobManager::NowUnixMs() const { return store_->Now(); }

absl::StatusOr<JobInfo> JobManager::Cancel(uint64_t id, std::string_view reason) {
  SLICESCHED_RETURN_IF_ERROR(CheckReason(reason, "Cancel"));
  absl::MutexLock lock(&mu_);
  SLICESCHED_ASSIGN_OR_RETURN(JobInfo * job, FindOrNotFound(id));
  if (IsTerminal(job->state)) return *job;
  return Move(id, "Cancel", JobState::kCancelled,
              {JobState::kSubmitted, JobState::kProfiling, JobState::kQueued, JobState::kRunning, JobState::kPaused},
              "cancelled", [&](JobInfo* j, JsonObject* d) {
                j->message = reason.empty() ? std::string("cancelled") : StrCat("cancelled: ", reason);
                d->Add("reason", reason);
              });
}

// ---------------------------------------------------------------------------
// Transitions

absl::StatusOr<JobInfo> JobManager::StartProfiling(uint64_t id, const std::vector<uint32_t>& devices) {
  absl::MutexLock lock(&mu_);
  return Move(id, "StartProfiling", JobState::kProfiling, {JobState::kSubmitted}, "profiling",
              [&](JobInfo* j, JsonObject* d) {
                j->message = StrCat("profiling on ", devices.size(), devices.size() == 1 ? " GPU" : " GPUs");
                d->Add("devices", devices);
              });
}

absl::StatusOr<JobInfo> JobManager::Queue(uint64_t id, int64_t iterations_target) {
  if (iterations_target < 0) {
    return absl::InvalidArgumentError(StrCat("Queue: iterations_target must not be negative, got ", iterations_target));
  }
  absl::MutexLock lock(&mu_);
  return Move(id, "Queue", JobState::kQueued, {JobState::kSubmitted, JobState::kProfiling}, "queued",
              [&](JobInfo* j, JsonObject* d) {
                if (iterations_target > 0) j->iterations_target = iterations_target;
                j->message = "queued; waiting for the planner";
                d->Add("iterations_target", j->iterations_target);
              });
}

absl::StatusOr<JobInfo> JobManager::Run(uint64_t id, const RunPlan& plan) {
  absl::MutexLock lock(&mu_);
  SLICESCHED_ASSIGN_OR_RETURN(JobInfo * job, FindOrNotFound(id));
  SLICESCHED_RETURN_IF_ERROR(
      CheckFrom(*job, "Run", JobState::kRunning, {JobState::kQueued, JobState::kPaused, JobState::kRunning}));
  // The plan itself.
  const std::string what = StrCat("Run(job ", id, ")");
  if (plan.devices.empty()) return absl::InvalidArgumentError(StrCat(what, ": the plan has no devices"));
  if (std::set<uint32_t>(plan.devices.begin(), plan.devices.end()).size() != plan.devices.size()) {
    return absl::InvalidArgumentError(StrCat(what, ": a device is listed twice"));
  }
  const int gpus = static_cast<int>(plan.devices.size());
  const JobSpec& spec = job->spec;
  if (gpus < spec.min_gpus || gpus > spec.max_gpus) {
    return absl::InvalidArgumentError(StrCat(what, ": the plan gives ", gpus, " GPUs; the job takes ", spec.min_gpus,
                                             "..", spec.max_gpus));
  }
  if (gpus % spec.pipeline_parallel != 0) {
    return absl::InvalidArgumentError(StrCat(what, ": the plan gives ", gpus,
                                             " GPUs, not a multiple of pipeline_parallel ", spec.pipeline_parallel));
  }
  if (plan.predicted_gain.has_value() && !std::isfinite(*plan.predicted_gain)) {
    return absl::InvalidArgumentError(StrCat(what, ": predicted_gain is not a finite number"));
  }
  if (plan.mode == RunMode::kAlone) {
    if (plan.partner != 0) return absl::InvalidArgumentError(StrCat(what, ": a job running alone has no partner"));
  } else {
    if (plan.partner == 0 || plan.partner == id) {
      return absl::InvalidArgumentError(
          StrCat(what, ": ", RunModeName(plan.mode), " mode needs a partner job other than itself"));
    }
    JobInfo* partner = Find(plan.partner);
    if (partner == nullptr) return absl::NotFoundError(StrCat(what, ": no partner job with id ", plan.partner));
    // A temporal target runs after its source finished: its partner may be
    // completed (the source whose adapters it started from).
    const bool finished_source = plan.mode == RunMode::kTemporal && partner->state == JobState::kCompleted;
    if (IsTerminal(partner->state) && !finished_source) {
      return absl::FailedPreconditionError(
          StrCat(what, ": partner job ", plan.partner, " is ", JobStateName(partner->state)));
    }
    // Ymir's pairing rules: consent, one backbone, one trust domain.
    for (const JobInfo* j : {static_cast<const JobInfo*>(job), static_cast<const JobInfo*>(partner)}) {
      if (!j->spec.allow_sharing) {
        return absl::FailedPreconditionError(StrCat(what, ": job ", j->id, " does not allow sharing"));
      }
    }
    if (partner->spec.backbone != spec.backbone) {
      return absl::FailedPreconditionError(StrCat(what, ": partner job ", plan.partner, " has backbone '",
                                                  partner->spec.backbone, "', this job '", spec.backbone, "'"));
    }
    if (partner->spec.trust_domain != spec.trust_domain) {
      return absl::FailedPreconditionError(StrCat(what, ": partner job ", plan.partner, " is in trust domain '",
                                                  partner->spec.trust_domain, "', this job in '", spec.trust_domain,
                                                  "'"));
    }
  }
  const bool replan = job->state == JobState::kRunning;
  std::vector<Pending> changes;
  changes.push_back(Pending{*job, replan ? "replanned" : "running", ""});
  JobInfo& after = changes.back().after;
  after.state = JobState::kRunning;
  after.plan = plan;
  after.message = RunMessage(plan);
  JsonObject d;
  d.Add("from", JobStateName(job->state))
      .Add("to", "running")
      .Add("mode", RunModeName(plan.mode))
      .Add("partner", plan.partner)
      .Add("devices", plan.devices)
      .Add("gpus", gpus);
  if (plan.predicted_gain.has_value()) d.Add("predicted_gain", *plan.predicted_gain);
  if (!after.checkpoint_path.empty()) d.Add("resume_from", after.checkpoint_path);
  changes.back().details = d.str();
  DecouplePartners(*job, after, "was re-planned", &changes);
  return Commit(std::move(changes));
}

absl::StatusOr<JobInfo> JobManager::Pause(uint64_t id, std::string_view reason) {
  SLICESCHED_RETURN_IF_ERROR(CheckReason(reason, "Pause"));
  absl::MutexLock lock(&mu_);
  return Move(id, "Pause", JobState::kPaused, {JobState::kRunning}, "paused", [&](JobInfo* j, JsonObject* d) {
    j->message = reason.empty() ? std::string("paused") : StrCat("paused: ", reason);
    d->Add("reason", reason).Add("checkpoint", j->checkpoint_path);
  });
}

absl::StatusOr<JobInfo> JobManager::Preempt(uint64_t id, std::string_view reason) {
  SLICESCHED_RETURN_IF_ERROR(CheckReason(reason, "Preempt"));
  absl::MutexLock lock(&mu_);
  return Move(id, "Preempt", JobState::kPaused, {JobState::kRunning}, "preempted", [&](JobInfo* j, JsonObject* d) {
    j->message = reason.empty() ? std::string("preempted") : StrCat("preempted: ", reason);
    d->Add("reason", reason).Add("checkpoint", j->checkpoint_path);
  });
}

absl::StatusOr<JobInfo> JobManager::Decouple(uint64_t id, std::string_view reason, std::optional<double> actual_gain,
                                             bool never_pair_again) {
  SLICESCHED_RETURN_IF_ERROR(CheckReason(reason, "Decouple"));
  if (actual_gain.has_value() && !std::isfinite(*actual_gain)) {
    return absl::InvalidArgumentError("Decouple: actual_gain is not a finite number");
  }
  absl::MutexLock lock(&mu_);
  SLICESCHED_ASSIGN_OR_RETURN(JobInfo * job, FindOrNotFound(id));
  SLICESCHED_RETURN_IF_ERROR(CheckFrom(*job, "Decouple", JobState::kRunning, {JobState::kRunning}));
  if (job->plan.mode == RunMode::kAlone) {
    return absl::FailedPreconditionError(StrCat("job ", id, ": cannot decouple: it is running alone, not paired"));
  }
  std::vector<Pending> changes;
  changes.push_back(Pending{*job, "decoupled", ""});
  JobInfo& after = changes.back().after;
  after.plan.mode = RunMode::kAlone;
  after.plan.partner = 0;
  after.plan.predicted_gain.reset();
  after.message = RunMessage(after.plan);
  JsonObject d;
  d.Add("reason", reason).Add("partner", job->plan.partner).Add("mode", RunModeName(job->plan.mode));
  if (job->plan.predicted_gain.has_value()) d.Add("predicted_gain", *job->plan.predicted_gain);
  if (actual_gain.has_value()) d.Add("actual_gain", *actual_gain);
  if (never_pair_again) {
    d.Add("never_pair_again", true);
    changes.back().never_pair_with = job->plan.partner;
  }
  if (job->plan.mode == RunMode::kSpatial) changes.back().end_joint_with = job->plan.partner;
  changes.back().details = d.str();
  DecouplePartners(*job, after, StrCat("was decoupled: ", reason), &changes);
  return Commit(std::move(changes));
}

absl::Status JobManager::StartJointTraining(uint64_t a, uint64_t b, int64_t step, bool resumed) {
  absl::MutexLock lock(&mu_);
  std::vector<Pending> changes;
  for (auto [id, partner] : {std::pair{a, b}, std::pair{b, a}}) {
    SLICESCHED_ASSIGN_OR_RETURN(JobInfo * job, FindOrNotFound(id));
    if (job->state != JobState::kRunning || job->plan.mode != RunMode::kSpatial || job->plan.partner != partner) {
      return absl::FailedPreconditionError(StrCat("job ", id, ": cannot start joint training with job ", partner,
                                                  ": it is not running spatially with it (", JobStateName(job->state),
                                                  ", ", RunModeName(job->plan.mode), " with job ", job->plan.partner,
                                                  ")"));
    }
    JsonObject d;
    d.Add("partner", partner).Add("step", step).Add("resumed", resumed);
    changes.push_back(Pending{*job, "joint_training", d.str()});
  }
  changes.front().joint_with = b;
  return Commit(std::move(changes)).status();
}

absl::Status JobManager::EndJointTraining(uint64_t a, uint64_t b, std::string_view reason) {
  SLICESCHED_RETURN_IF_ERROR(CheckReason(reason, "EndJointTraining"));
  absl::MutexLock lock(&mu_);
  std::vector<Pending> changes;
  for (auto [id, partner] : {std::pair{a, b}, std::pair{b, a}}) {
    JobInfo* job = Find(id);
    if (job == nullptr) continue;
    JsonObject d;
    d.Add("partner", partner).Add("reason", reason);
    changes.push_back(Pending{*job, "joint_not_resumed", d.str()});
    changes.back().end_joint_with = partner;
  }
  if (changes.empty()) return absl::OkStatus();  // both gone (DeleteJob removed the pair)
  return Commit(std::move(changes)).status();
}

namespace {

// The (job_a, job_b) of a pair table's rows.
absl::StatusOr<std::set<std::pair<uint64_t, uint64_t>>> PairSet(absl::StatusOr<std::vector<DecoupledPair>> rows) {
  if (!rows.ok()) return rows.status();
  std::set<std::pair<uint64_t, uint64_t>> out;
  for (const DecoupledPair& p : *rows) out.emplace(p.job_a, p.job_b);
  return out;
}

}  // namespace

absl::StatusOr<std::set<std::pair<uint64_t, uint64_t>>> JobManager::JointPairs() {
  return PairSet(store_->ListJointPairs());
}

absl::StatusOr<std::set<std::pair<uint64_t, uint64_t>>> JobManager::NeverPairedAgain() {
  return PairSet(store_->ListDecoupledPairs());
}

absl::Status JobManager::RecordNormalEvaluation(uint64_t id, std::string_view run_key, int64_t step,
                                                double metric) {
  return store_->AddNormalRunPoint(id, run_key, step, metric);
}

absl::Status JobManager::ForgetNormalRun(uint64_t id) { return store_->DeleteNormalRun(id); }

absl::StatusOr<std::vector<StoredNormalRun>> JobManager::NormalRuns() { return store_->ListNormalRuns(); }

absl::StatusOr<JobInfo> JobManager::Complete(uint64_t id, const CompletionReport& report) {
  if (report.actual_gain.has_value() && !std::isfinite(*report.actual_gain)) {
    return absl::InvalidArgumentError("Complete: actual_gain is not a finite number");
  }
  JsonObject metrics;
  std::vector<std::string> shown;
  for (const auto& [name, value] : report.metrics) {
    if (name.empty()) return absl::InvalidArgumentError("Complete: a metric has an empty name");
    if (!std::isfinite(value)) return absl::InvalidArgumentError(StrCat("Complete: metric '", name, "' is not finite"));
    metrics.Add(name, value);
    shown.push_back(StrCat(name, "=", JsonNumber(value)));
  }
  absl::MutexLock lock(&mu_);
  SLICESCHED_ASSIGN_OR_RETURN(JobInfo * job, FindOrNotFound(id));
  const RunPlan plan = job->plan;  // the plan the job finished under
  return Move(id, "Complete", JobState::kCompleted, {JobState::kRunning}, "completed",
              [&](JobInfo* j, JsonObject* d) {
                if (!report.checkpoint_path.empty()) j->checkpoint_path = report.checkpoint_path;
                j->message = shown.empty() ? std::string("completed") : StrCat("completed: ", absl::StrJoin(shown, ", "));
                d->AddRaw("metrics", metrics.str())
                    .Add("mode", RunModeName(plan.mode))
                    .Add("partner", plan.partner)
                    .Add("checkpoint", j->checkpoint_path);
                if (plan.predicted_gain.has_value()) d->Add("predicted_gain", *plan.predicted_gain);
                if (report.actual_gain.has_value()) d->Add("actual_gain", *report.actual_gain);
              });
}

absl::StatusOr<JobInfo> JobManager::Fail(uint64_t id, std::string_view reason) {
  SLICESCHED_RETURN_IF_ERROR(CheckReason(reason, "Fail"));
  absl::MutexLock lock(&mu_);
  return Move(id, "Fail", JobState::kFailed,
              {JobState::kSubmitted, JobState::kProfiling, JobState::kQueued, JobState::kRunning, JobState::kPaused},
              "failed", [&](JobInfo* j, JsonObject* d) {
                j->message = reason.empty() ? std::string("failed") : StrCat("failed: ", reason);
                d->Add("reason", reason);
              });
}

absl::StatusOr<JobInfo> JobManager::ReportProgress(uint64_t id, int64_t iterations_done, double loss,
                                                   std::string_view checkpoint_path,
                                                   const std::map<std::string, double>& extra) {
  if (iterations_done < 0) {
    return absl::InvalidArgumentError(
        StrCat("ReportProgress: iterations_done must not be negative, got ", iterations_done));
  }
  if (!std::isfinite(loss)) return absl::InvalidArgumentError("ReportProgress: loss is not a finite number");
  absl::MutexLock lock(&mu_);
  SLICESCHED_ASSIGN_OR_RETURN(JobInfo * job, FindOrNotFound(id));
  if (job->state != JobState::kProfiling && job->state != JobState::kRunning && job->state != JobState::kPaused) {
    return absl::FailedPreconditionError(StrCat("job ", id, ": cannot report progress while ",
                                                JobStateName(job->state),
                                                " (allowed while profiling, running or paused)"));
  }
  std::vector<Pending> changes;
  changes.push_back(Pending{*job, checkpoint_path.empty() ? "progress" : "checkpoint", ""});
  JobInfo& after = changes.back().after;
  after.iterations_done = iterations_done;
  after.last_loss = loss;
  if (!checkpoint_path.empty()) after.checkpoint_path = std::string(checkpoint_path);
  JsonObject d;
  d.Add("iterations_done", iterations_done).Add("loss", loss).Add("checkpoint", after.checkpoint_path);
  for (const auto& [key, value] : extra) {
    if (key != "iterations_done" && key != "loss" && key != "checkpoint") d.Add(key, value);
  }
  changes.back().details = d.str();
  return Commit(std::move(changes));
}

}  // namespace slicesched::jobs
