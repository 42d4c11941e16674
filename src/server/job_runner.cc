// Torch-free TU: the runner drives the training operators through their
// LibTorch-free API (executor/train/train_ops.h, llama_kernels.h). It is in
// the LibTorch library sliced_torch, which registers it with the daemon
// (server/extensions.h). This file: creation, data, profiling, evaluation,
// checkpoints and the pass (Tick); job_runner_internal.h names the others.
#include "job_runner_internal.h"

#include "slicesched/synth/wordnet.h"

namespace slicesched {

using job_runner_internal::CheckpointPath;
using job_runner_internal::EvalResult;
using job_runner_internal::EvaluateOn;
using job_runner_internal::LoadJsonl;
using job_runner_internal::MicroBatchStep;
using job_runner_internal::MsSince;
using job_runner_internal::WaveRecordToWaitOn;
using job_runner_internal::kProfileMicroBatches;

int64_t JobRunner::Runtime::micro_index() const {
  if (job == nullptr) return 0;
  absl::MutexLock l(&job->mu);
  return job->state.step * micro_per_iteration() + job->state.accumulated;
}


JobRunner::JobRunner(Master* master, jobs::JobManager* jobs, JobRunnerOptions options)
    : master_(master), jobs_(jobs), options_(std::move(options)) {
  clock_ = options_.clock != nullptr ? options_.clock : &own_clock_;
}

absl::StatusOr<std::unique_ptr<JobRunner>> JobRunner::Create(Master* master, jobs::JobManager* jobs,
                                                             JobRunnerOptions options) {
  if (master == nullptr || jobs == nullptr) return absl::InvalidArgumentError("JobRunner: master and jobs are required");
  if (options.state_dir.empty()) return absl::InvalidArgumentError("JobRunner: state_dir is required");
  std::unique_ptr<JobRunner> r(new JobRunner(master, jobs, std::move(options)));
  r->gains_ = std::make_unique<Gains>();
  if (!r->options_.planner.gains_path.empty()) {
    auto g = ymir::LoadYmirGains(r->options_.planner.gains_path, {.pair_neutral = r->options_.planner.pair_neutral});
    if (!g.ok()) return Annotate(g.status(), "planner.gains");
    r->gains_->table = *std::move(g);
  }
  SLICESCHED_RETURN_IF_ERROR(r->LoadTimeLut());
  // Pairs the stop-loss decoupled before a restart stay apart.
  auto never = r->jobs_->NeverPairedAgain();
  if (!never.ok()) return Annotate(never.status(), "reading the decoupled pairs");
  r->decoupled_pairs_ = *std::move(never);
  // So do the normal runs the stop-loss compares pairing members with.
  auto runs = r->jobs_->NormalRuns();
  if (!runs.ok()) return Annotate(runs.status(), "reading the normal runs");
  for (StoredNormalRun& stored : *runs) {
    NormalRun& run = r->normal_runs_[stored.job_id];
    run.key = std::move(stored.run_key);
    run.points = std::move(stored.points);
  }
  return r;
}

std::pair<int64_t, int64_t> JobRunner::TrainingPosition(uint64_t job_id) const {
  auto it = runtimes_.find(job_id);
  if (it == runtimes_.end() || it->second->job == nullptr) return {-1, -1};
  absl::MutexLock l(&it->second->job->mu);
  return {it->second->job->state.step, it->second->job->state.accumulated};
}

std::string JobRunner::DeploymentFor(const jobs::JobSpec& spec, absl::Status* error) {
  auto list = master_->ListDeployments();
  if (!list.ok()) {
    *error = list.status();
    return "";
  }
  std::string best;
  for (const DeploymentInfo& d : *list) {
    if (d.spec.name == spec.backbone) return d.spec.name;
  }
  for (const DeploymentInfo& d : *list) {
    if (d.spec.model_preset != spec.backbone) continue;
    if (best.empty() || d.spec.role == DeploymentRole::kOffline) best = d.spec.name;
    if (d.spec.role == DeploymentRole::kOffline) break;
  }
  if (best.empty()) {
    *error = absl::FailedPreconditionError(
        StrCat("backbone: no deployment serves '", spec.backbone, "' (register a deployment of that model)"));
  }
  return best;
}

absl::Status JobRunner::Prepare(Runtime& rt, const jobs::JobInfo& info, bool with_state) {
  if (rt.weights == nullptr) {
    absl::Status err;
    rt.deployment = DeploymentFor(rt.spec, &err);
    SLICESCHED_RETURN_IF_ERROR(err);
    SLICESCHED_ASSIGN_OR_RETURN(rt.weights, master_->BackboneWeights(rt.deployment));
  }
  const int64_t vocab = rt.weights->dims().vocab;
  if (!rt.data_ready) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<synth::Example> all;
    const jobs::DatasetSpec& ds = rt.spec.dataset;
    if (ds.kind == jobs::DatasetSpec::Kind::kSynthetic) {
      synth::DatasetOptions o;
      o.task = ds.synthetic.task;
      o.seed = ds.synthetic.seed;
      o.examples = ds.synthetic.examples;
      o.sequence_length = ds.synthetic.sequence_length;
      o.num_classes = ds.synthetic.num_classes;
      o.language.vocab = vocab;
      SLICESCHED_ASSIGN_OR_RETURN(all, synth::Generate(o));
      SLICESCHED_ASSIGN_OR_RETURN(synth::TaskInfo task, synth::FindTask(ds.synthetic.task));
      rt.next_token = task.kind == synth::TaskKind::kNextToken;
      rt.head_outputs = rt.next_token ? vocab : ds.synthetic.num_classes;
    } else if (ds.kind == jobs::DatasetSpec::Kind::kWordNet) {
      SLICESCHED_ASSIGN_OR_RETURN(std::shared_ptr<const synth::WordNetCorpus> corpus,
                                  WordNetCorpusFor(ds.wordnet.dir, vocab));
      SLICESCHED_ASSIGN_OR_RETURN(all, synth::GenerateWordNet(*corpus, {.task = ds.wordnet.task,
                                                                         .seed = ds.wordnet.seed,
                                                                         .examples = ds.wordnet.examples,
                                                                         .sequence_length = ds.wordnet.sequence_length}));
      rt.head_outputs = 2;
    } else {
      if (ds.format == jobs::DatasetFormat::kJsonl) {
        SLICESCHED_ASSIGN_OR_RETURN(all, LoadJsonl(ds.path));
      } else {
        SLICESCHED_ASSIGN_OR_RETURN(all, synth::ReadTokensBin(ds.path));
      }
      int64_t max_label = 1;
      for (size_t i = 0; i < all.size(); ++i) {
        for (int64_t t : all[i].tokens) {
          if (t < 0 || t >= vocab) {
            return absl::InvalidArgumentError(StrCat("dataset: example ", i, " of '", ds.path, "' has token id ", t,
                                                     " outside the backbone's vocabulary [0, ", vocab, ")"));
          }
        }
        if (all[i].label < 0) {
          return absl::InvalidArgumentError(
              StrCat("dataset: example ", i, " of '", ds.path, "' has a negative label ", all[i].label));
        }
        max_label = std::max(max_label, all[i].label);
      }
      rt.head_outputs = max_label + 1;
    }
    if (all.size() < 2) {
      return absl::InvalidArgumentError(StrCat("dataset: ", all.size(), " examples; at least 2 are needed (train + eval)"));
    }
    const auto n_eval = static_cast<size_t>(std::clamp<int64_t>(static_cast<int64_t>(all.size()) / 5, 1,
                                                                 options_.planner.max_eval_examples));
    rt.eval.assign(all.end() - static_cast<std::ptrdiff_t>(n_eval), all.end());
    all.resize(all.size() - n_eval);
    rt.train = std::move(all);
    rt.data_ready = true;
    rt.pending_switch["prepare_data_ms"] = MsSince(t0);
  }
  if (with_state && rt.job == nullptr) {
    const jobs::Hyperparameters& hp = rt.spec.hyperparameters;
    const auto t0 = std::chrono::steady_clock::now();
    auto job = std::make_shared<LlamaTrainJob>();
    job->accumulation = rt.micro_per_iteration();
    job->joint_rule = options_.planner.spatial_step == PlannerConfig::SpatialStep::kSum
                          ? executor::JointStepRule::kSum
                          : executor::JointStepRule::kMean;
    TaskState state;
    const std::string path = info.checkpoint_path;
    if (!path.empty()) {
      if (!std::filesystem::exists(path)) {
        return absl::NotFoundError(StrCat("checkpoint: '", path, "' (the job's resume point) does not exist"));
      }
      SLICESCHED_ASSIGN_OR_RETURN(state, executor::LoadTaskCheckpoint(path, rt.weights->dims()));
      rt.resumed_from_checkpoint = true;
    } else {
      executor::AdamWOptions adamw;
      adamw.lr = hp.learning_rate;
      adamw.warmup_steps = hp.warmup_steps;
      SLICESCHED_ASSIGN_OR_RETURN(state, TaskState::Init(rt.weights->dims(),
                                                         executor::LoraConfig{hp.lora_rank, hp.lora_alpha},
                                                         rt.head_outputs, hp.seed));
      if (hp.head_init == jobs::HeadInit::kZero) {
        SLICESCHED_ASSIGN_OR_RETURN(executor::TaskAdapters zeros, executor::TaskAdapters::ZerosLike(state.params));
        state.params.head = zeros.head;
      }
      state.adamw = adamw;  // lr (and weight decay) of either optimizer
      state.optimizer = hp.optimizer == jobs::Optimizer::kSgd ? executor::OptimizerKind::kSgd
                                                              : executor::OptimizerKind::kAdamW;
      state.momentum = hp.momentum;
      // Temporal transfer: B starts from its source's trained adapters.
      auto src = temporal_source_.find(rt.id);
      if (src != temporal_source_.end()) {
        auto s = runtimes_.find(src->second);
        if (s != runtimes_.end() && s->second->job != nullptr) {
          TaskState from;
          {
            absl::MutexLock l(&s->second->job->mu);
            from = s->second->job->state;
          }
          const absl::Status t = executor::TransferLora(from, state);
          if (t.ok()) {
            spdlog::info("job {}: starts from the adapters of job {} (temporal transfer)", rt.id, src->second);
            rt.pending_switch["temporal_source"] = static_cast<double>(src->second);
          } else {
            spdlog::warn("job {}: temporal transfer from job {} skipped: {}", rt.id, src->second, t.ToString());
          }
        }
      }
    }
    {
      absl::MutexLock l(&job->mu);
      job->state = std::move(state);
    }
    rt.job = std::move(job);
    rt.pending_switch["load_checkpoint_ms"] = MsSince(t0);
    rt.last_eval_step = rt.step();
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const synth::WordNetCorpus>> JobRunner::WordNetCorpusFor(const std::string& dir,
                                                                                     int64_t vocab) {
  auto& slot = wordnet_[{dir, vocab}];
  if (slot == nullptr) {
    // The backbone's vocabulary bounds the corpus's: its most frequent words.
    SLICESCHED_ASSIGN_OR_RETURN(synth::WordNetCorpus corpus, synth::WordNetCorpus::Load(dir, vocab));
    slot = std::make_shared<const synth::WordNetCorpus>(std::move(corpus));
  }
  return slot;
}

void JobRunner::FailJob(uint64_t id, const std::string& reason) {
  spdlog::warn("job {} failed: {}", id, reason);
  auto r = jobs_->Fail(id, reason);
  if (!r.ok()) spdlog::error("job {}: recording the failure: {}", id, r.status().ToString());
  plan_requested_ = true;
  auto it = runtimes_.find(id);
  if (it != runtimes_.end()) it->second->running = false;
}

absl::Status JobRunner::Checkpoint(Runtime& rt, const std::map<std::string, double>& extra) {
  if (rt.job == nullptr) return absl::OkStatus();
  const std::string path = CheckpointPath(options_.state_dir, rt.id);
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  if (ec) return absl::InternalError(StrCat("checkpoint: cannot create the directory of '", path, "': ", ec.message()));
  TaskState snapshot;
  {
    absl::MutexLock l(&rt.job->mu);
    snapshot = rt.job->state;
  }
  const std::string tmp = path + ".tmp";
  SLICESCHED_RETURN_IF_ERROR(executor::SaveTaskCheckpoint(tmp, snapshot));
  std::filesystem::rename(tmp, path, ec);
  if (ec) return absl::InternalError(StrCat("checkpoint: renaming '", tmp, "': ", ec.message()));
  rt.last_checkpoint = clock_->Now();
  std::map<std::string, double> details = extra;
  details["micro_batches"] = static_cast<double>(snapshot.step * rt.micro_per_iteration() + snapshot.accumulated);
  auto r = jobs_->ReportProgress(rt.id, snapshot.step, rt.last_loss, path, details);
  return r.ok() ? absl::OkStatus() : r.status();
}

absl::Status JobRunner::Evaluate(Runtime& rt, double* metric, double* loss) {
  TaskState snapshot;
  {
    absl::MutexLock l(&rt.job->mu);
    snapshot = rt.job->state;
  }
  SLICESCHED_ASSIGN_OR_RETURN(EvalResult e, EvaluateOn(*rt.weights, snapshot.params, rt.eval, rt.next_token));
  *loss = e.loss;
  switch (rt.spec.stop.metric) {
    case jobs::StopMetric::kAccuracy: *metric = e.accuracy; break;
    case jobs::StopMetric::kLoss: *metric = e.loss; break;
    case jobs::StopMetric::kPerplexity: *metric = std::exp(e.loss); break;
  }
  return absl::OkStatus();
}

JobRunner::Runtime& JobRunner::RuntimeFor(const jobs::JobInfo& j) {
  auto& slot = runtimes_[j.id];
  if (slot == nullptr) {
    slot = std::make_unique<Runtime>();
    slot->id = j.id;
    slot->spec = j.spec;
    const std::string_view task = jobs::DatasetTaskName(j.spec.dataset);
    slot->task_key = task.empty() ? j.spec.name : std::string(task);
    slot->running = j.state == jobs::JobState::kRunning;
    slot->plan = j.plan;
  }
  return *slot;
}

absl::Status JobRunner::Admit() {
  SLICESCHED_ASSIGN_OR_RETURN(jobs::ListJobsPage page,
                              jobs_->List({.states = {jobs::JobState::kSubmitted}, .page_size = 1000}));
  const int devices = static_cast<int>(master_->config().cluster.size());
  for (const jobs::JobInfo& j : page.jobs) {
    if (j.spec.min_gpus > devices) {
      FailJob(j.id, StrCat("gpus.min: ", j.spec.min_gpus, " devices requested, the daemon has ", devices));
      continue;
    }
    Runtime& rt = RuntimeFor(j);
    rt.profile_devices.clear();
    for (int d = 0; d < j.spec.min_gpus; ++d) rt.profile_devices.push_back(static_cast<uint32_t>(d));
    auto p = jobs_->StartProfiling(j.id, rt.profile_devices);
    if (!p.ok()) spdlog::warn("job {}: start profiling: {}", j.id, p.status().ToString());
  }
  return absl::OkStatus();
}

void JobRunner::Profile(Runtime& rt, const jobs::JobInfo& info) {
  const uint64_t id = rt.id;
  if (rt.inflight != nullptr) {
    const InstanceUpdate last = rt.inflight->Last();
    if (!IsTerminalInstanceState(last.state)) return;
    rt.inflight = nullptr;
    if (last.state != InstanceState::kDone) {
      stats_.steps_failed += 1;
      rt.profile_job = nullptr;
      if (info.state == jobs::JobState::kProfiling) {
        FailJob(id, StrCat("profiling micro-batch ", rt.profile_done, " failed: ",
                           last.message.empty() ? std::string(ToStd(InstanceStateName(last.state))) : last.message));
      }
      return;
    }
    stats_.profile_steps += 1;
    if (rt.profile_done > 0) rt.profile_sum_s += SpanSeconds(rt, 1, MsSince(rt.inflight_since) / 1000.0);
    rt.profile_done += 1;
  }
  if (info.state != jobs::JobState::kProfiling) {  // cancelled / failed meanwhile
    rt.profile_job = nullptr;
    return;
  }
  if (rt.profile_done >= kProfileMicroBatches) {
    rt.profile_job = nullptr;
    const double per_micro = rt.profile_sum_s / static_cast<double>(kProfileMicroBatches - 1);
    rt.iter_time_s = per_micro * static_cast<double>(rt.micro_per_iteration());
    rt.micro_s = per_micro;
    auto p = jobs_->ReportProgress(id, info.iterations_done, info.last_loss, "",
                                   {{"profiled_iter_time_s", rt.iter_time_s},
                                    {"profile_micro_batches", static_cast<double>(kProfileMicroBatches)}});
    if (!p.ok()) spdlog::warn("job {}: profile progress: {}", id, p.status().ToString());
    auto q = jobs_->Queue(id, rt.iteration_limit());
    if (!q.ok()) spdlog::warn("job {}: queueing: {}", id, q.status().ToString());
    spdlog::info("job {} profiled: {:.4f} s per iteration", id, rt.iter_time_s);
    plan_requested_ = true;
    return;
  }
  if (rt.profile_job == nullptr && rt.profile_done == 0 && ProfileFromLut(rt, info)) return;
  if (rt.profile_job == nullptr) {
    // The fresh state (Prepare's path), then handed to the scratch job: the
    // job's own state is created when it first runs (temporal transfer).
    absl::Status s = Prepare(rt, info, /*with_state=*/true);
    if (!s.ok()) {
      FailJob(id, std::string(ToStd(s.message())));
      return;
    }
    rt.profile_job = std::move(rt.job);
    rt.job = nullptr;
    rt.resumed_from_checkpoint = false;
    rt.pending_switch.erase("load_checkpoint_ms");
    rt.pending_switch["prepare_data_ms"] = 0;  // the data is prefetched for the first run
    rt.profile_done = 0;
    rt.profile_sum_s = 0;
  }
  const int64_t k = rt.profile_done;
  TrainStepArgs args = MicroBatchStep(rt, k, rt.profile_job, rt.profile_devices, StrCat("job-", id, "/profile-", k));
  rt.inflight_since = std::chrono::steady_clock::now();
  auto rec = master_->SubmitTrainStep(std::move(args));
  if (!rec.ok()) {
    if (absl::IsFailedPrecondition(rec.status()) && master_->draining()) return;
    rt.profile_job = nullptr;
    FailJob(id, StrCat("submitting profiling micro-batch ", k, ": ", rec.status().message()));
    return;
  }
  // One micro-batch on the scratch state (taken here, not by Drive's wave
  // bookkeeping); the wave fields say so all the same.
  rt.wave.clear();
  rt.wave_size = 1;
  rt.wave_gpus = static_cast<int>(rt.profile_devices.size());
  rt.iteration_gpus = 0;
  rt.inflight = *rec;
}

absl::Status JobRunner::Tick() {
  const Timestamp now = clock_->Now();
  SLICESCHED_RETURN_IF_ERROR(Admit());
  // A requested round waits while jobs are profiling (at most until the
  // interval is due), so jobs submitted together are planned together.
  bool profiling = false;
  if (plan_requested_) {
    auto p = jobs_->List({.states = {jobs::JobState::kProfiling}, .page_size = 1});
    profiling = p.ok() && !p->jobs.empty();
  }
  if ((plan_requested_ && !profiling) || last_plan_ == Timestamp::Never() ||
      now - last_plan_ >= options_.planner.interval) {
    plan_requested_ = false;
    last_plan_ = now;
    absl::Status s = PlanRound(now);
    if (!s.ok()) spdlog::error("planner: {}", s.ToString());
  }
  Prefetch(now);
  return Drive(now);
}

void JobRunner::WaitForProgress(absl::Duration timeout) {
  for (const auto& [id, rt] : runtimes_) {
    if (rt->inflight == nullptr) continue;
    const std::shared_ptr<InstanceRecord> rec = WaveRecordToWaitOn(*rt);
    if (rec == nullptr) return;  // the whole wave ended: the next Tick takes it
    bool closed = false;
    const size_t seen = rec->WaitFrom(0, absl::ZeroDuration(), &closed).size();
    if (!closed) (void)rec->WaitFrom(seen, timeout, &closed);
    return;
  }
  absl::MutexLock l(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&stop_), timeout);
}

void JobRunner::Start() {
  thread_ = std::thread([this] {
    for (;;) {
      {
        absl::MutexLock l(&mu_);
        if (stop_) return;
      }
      absl::Status s = Tick();
      if (!s.ok()) spdlog::error("job runner: {}", s.ToString());
      // Idle (no job known to the runner): look for arrivals 4 times a second.
      WaitForProgress(absl::Milliseconds(runtimes_.empty() ? 250 : 20));
    }
  });
}

void JobRunner::Stop(absl::Duration timeout) {
  if (stopped_) return;
  stopped_ = true;
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
  const absl::Time deadline = absl::Now() + timeout;
  for (auto& [id, rt] : runtimes_) {
    if (rt->inflight == nullptr) continue;
    std::vector<std::shared_ptr<InstanceRecord>> records = rt->wave;
    records.push_back(rt->inflight);
    for (const auto& rec : records) {
      bool closed = false;
      size_t seen = 0;
      while (!closed && !IsTerminalInstanceState(rec->Last().state) && absl::Now() < deadline) {
        auto ev = rec->WaitFrom(seen, deadline - absl::Now(), &closed);
        seen += ev.size();
      }
    }
  }
  SaveTimeLut();
  for (auto& [id, rt] : runtimes_) {
    if (rt->job == nullptr) continue;
    auto info = jobs_->Get(id);
    if (!info.ok() || jobs::IsTerminal(info->state)) continue;
    absl::Status s = Checkpoint(*rt, {});
    if (!s.ok()) spdlog::error("job {}: checkpoint at shutdown: {}", id, s.ToString());
  }
}

namespace {

absl::StatusOr<std::unique_ptr<TrainingRunner>> CreateJobRunner(Master* master, jobs::JobManager* jobs,
                                                                JobRunnerOptions options) {
  SLICESCHED_ASSIGN_OR_RETURN(std::unique_ptr<JobRunner> runner, JobRunner::Create(master, jobs, std::move(options)));
  return std::unique_ptr<TrainingRunner>(std::move(runner));
}

[[maybe_unused]] const bool kRegistered = RegisterTrainingRunner(&CreateJobRunner);

}  // namespace

JobRunner::~JobRunner() { Stop(); }

}  // namespace slicesched
