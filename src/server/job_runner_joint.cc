// The job runner's spatial joint training, and the test hooks on a job's
// training state.
#include "job_runner_internal.h"

namespace slicesched {

using job_runner_internal::JointResumeProblem;
using job_runner_internal::MicroBatch;
using job_runner_internal::PairKey;

// ---------------------------------------------------------------------------
// Spatial joint training: the pair's micro-batches mix the rows of
// both jobs and run as one "<deployment>/train" instance with two task slots
// (slot 0 = the smaller job id, slot 1 = the other; llama_kernels.h), which
// accumulates each job's gradients into its own TaskState and takes one
// JointOptimizerStep once both jobs have their own grad_accumulation
// micro-batches (a job already complete for this iteration sends no rows).

bool JobRunner::CopyTaskState(uint64_t job_id, executor::TaskState* out) const {
  auto it = runtimes_.find(job_id);
  if (it == runtimes_.end() || it->second->job == nullptr) return false;
  absl::MutexLock l(&it->second->job->mu);
  *out = it->second->job->state;
  return true;
}

int64_t JobRunner::OneStreamSamples(uint64_t job_id) const {
  auto it = runtimes_.find(job_id);
  return it == runtimes_.end() ? -1 : it->second->one_stream_samples;
}

bool JobRunner::MicroBatchOf(uint64_t job_id, int64_t k, executor::TrainBatch* out) {
  auto it = runtimes_.find(job_id);
  if (it == runtimes_.end() || !it->second->data_ready) return false;
  *out = MicroBatch(*it->second, k);
  return true;
}

void JobRunner::DecoupleSpatial(uint64_t a, uint64_t b, const std::string& reason) {
  // Stored like the stop-loss's decouplings (decoupled_pairs, in the same
  // transaction), so a restarted runner does not plan and split the pair
  // again.
  auto d = jobs_->Decouple(a, reason, {}, /*never_pair_again=*/true);
  if (!d.ok()) {
    spdlog::warn("job {}: decouple: {}", a, d.status().ToString());
    return;
  }
  spdlog::info("jobs {} + {}: {}", a, b, reason);
  for (uint64_t id : {a, b}) {
    auto r = runtimes_.find(id);
    if (r == runtimes_.end()) continue;
    auto now_info = jobs_->Get(id);
    if (now_info.ok()) r->second->plan = now_info->plan;
  }
  decoupled_pairs_.insert(PairKey(a, b));
  pair_watch_.erase(PairKey(a, b));
  plan_requested_ = true;
}

absl::Status JobRunner::DriveSpatial(Runtime& rt, const jobs::JobInfo& info) {
  const uint64_t partner = info.plan.partner;
  auto pit = runtimes_.find(partner);
  if (pit == runtimes_.end()) {
    DecoupleSpatial(rt.id, partner, StrCat("spatial pairing: the runner holds no state of partner job ", partner));
    return absl::OkStatus();
  }
  // Drive visits jobs by increasing id: the larger id submits, once the
  // smaller one has finished its own pass (its step ended, evaluated).
  if (rt.id < partner) return absl::OkStatus();
  Runtime& a = *pit->second;  // slot 0
  Runtime& b = rt;            // slot 1
  SLICESCHED_ASSIGN_OR_RETURN(const jobs::JobInfo ainfo, jobs_->Get(a.id));
  if (ainfo.state != jobs::JobState::kRunning || ainfo.plan.mode != jobs::RunMode::kSpatial ||
      ainfo.plan.partner != b.id) {
    return absl::OkStatus();  // the JobManager decouples both together; wait for it
  }
  if (!a.running || a.inflight != nullptr || a.job == nullptr || !a.data_ready || a.eval_pending ||
      b.inflight != nullptr) {
    return absl::OkStatus();
  }
  const auto key = PairKey(a.id, b.id);
  if (!joint_started_.contains(key)) {
    // The pairing starts: both jobs fresh (the planner pairs only jobs
    // without progress; checked), then one shared adapter (job a's initial
    // LoRA; each keeps its own head and optimizer state).
    const jobs::Hyperparameters& ha = a.spec.hyperparameters;
    const jobs::Hyperparameters& hb = b.spec.hyperparameters;
    std::string why;
    if (a.deployment != b.deployment) {
      why = StrCat("jobs ", a.id, " and ", b.id, " train on different deployments ('", a.deployment, "', '",
                   b.deployment, "')");
    } else if (ha.lora_rank != hb.lora_rank || ha.lora_alpha != hb.lora_alpha) {
      why = StrCat("one shared adapter needs one LoRA config; job ", a.id, " has rank ", ha.lora_rank, " alpha ",
                   ha.lora_alpha, ", job ", b.id, " rank ", hb.lora_rank, " alpha ", hb.lora_alpha);
    }
    absl::Status shared = absl::OkStatus();
    int64_t resumed_step = -1;  // >= 0: a stored joint pair resumes at this step
    // A stored pair that JointPartners let the planner keep spatial: it
    // resumes the joint training of both checkpoints.
    SLICESCHED_ASSIGN_OR_RETURN(const auto stored, jobs_->JointPairs());
    if (why.empty()) {
      // Address order, as the optimizer kernel locks several jobs.
      executor::LlamaTrainJob* first = std::min(a.job.get(), b.job.get());
      executor::LlamaTrainJob* second = std::max(a.job.get(), b.job.get());
      absl::MutexLock l1(&first->mu);
      absl::MutexLock l2(&second->mu);
      const executor::TaskState &sa = a.job->state, &sb = b.job->state;
      const bool fresh = sa.step == 0 && sa.accumulated == 0 && sb.step == 0 && sb.accumulated == 0;
      if (!fresh && stored.contains(key)) {
        // A joint pair resumed after a restart from both members' checkpoints
        // (checked when planned; checked again on the states it trains).
        why = JointResumeProblem(a.id, sa, b.id, sb);
        if (why.empty()) resumed_step = sa.step;
      } else {
        for (const Runtime* r : {&a, &b}) {
          const executor::TaskState& st = r->job->state;
          if (why.empty() && (st.step > 0 || st.accumulated > 0)) {
            why = StrCat("job ", r->id, " already has progress (", st.step, " steps, ", st.accumulated,
                         " micro-batches accumulated); only fresh jobs train jointly");
          }
        }
        if (why.empty()) {
          executor::TaskState* both[] = {&a.job->state, &b.job->state};
          shared = executor::ShareLora(both);
        }
      }
    }
    if (!shared.ok()) why = StrCat("sharing the adapter failed: ", shared.message());
    if (!why.empty()) {
      DecoupleSpatial(b.id, a.id, StrCat("spatial joint training not possible: ", why));
      return absl::OkStatus();
    }
    // Stored (the store's joint pairs), so a restart can resume the pair;
    // marked started only once stored.
    SLICESCHED_RETURN_IF_ERROR(jobs_->StartJointTraining(a.id, b.id, std::max<int64_t>(resumed_step, 0),
                                                         /*resumed=*/resumed_step >= 0));
    joint_started_.insert(key);
    if (resumed_step >= 0) {
      spdlog::info("jobs {} + {}: spatial joint training resumes at step {} from both checkpoints", a.id, b.id,
                   resumed_step);
    } else {
      spdlog::info("jobs {} + {}: spatial joint training starts (shared adapter of job {})", a.id, b.id, a.id);
    }
  }
  // The rows of each job still accumulating this iteration.
  std::vector<TrainBatch> own;
  std::vector<int64_t> slots, ks;
  own.reserve(2);
  for (Runtime* r : {&a, &b}) {
    const int64_t k = r->micro_index();
    int64_t accumulated = 0;
    {
      absl::MutexLock l(&r->job->mu);
      accumulated = r->job->state.accumulated;
    }
    ks.push_back(k);
    if (accumulated >= r->micro_per_iteration()) continue;
    own.push_back(MicroBatch(*r, k));
    slots.push_back(r == &a ? 0 : 1);
  }
  std::vector<spatial_internal::JointPart> parts;
  for (size_t i = 0; i < own.size(); ++i) parts.push_back({slots[i], &own[i]});
  auto mixed = spatial_internal::MixMicroBatches(parts);
  if (!mixed.ok()) {
    FailJob(a.id, StrCat("joint micro-batch: ", mixed.status().message()));
    FailJob(b.id, StrCat("joint micro-batch: ", mixed.status().message()));
    return absl::OkStatus();
  }
  const std::vector<int64_t> shape = mixed->tokens.shape();
  TrainStepArgs args;
  args.deployment = a.deployment;
  args.job = a.job;
  args.partners = {b.job};
  args.batch = std::make_shared<TrainBatch>(*std::move(mixed));
  args.rows = shape[0];
  args.tokens = shape[1];
  args.rank = a.spec.hyperparameters.lora_rank;
  args.head_outputs = a.head_outputs + b.head_outputs;
  args.devices = info.plan.devices;
  args.priority = std::max(a.spec.priority, b.spec.priority);
  args.label = StrCat("job-", a.id, "+", b.id, "/mb-", ks[0], "+", ks[1]);
  const auto now = std::chrono::steady_clock::now();
  auto rec = master_->SubmitTrainStep(std::move(args));
  if (!rec.ok()) {
    if (absl::IsFailedPrecondition(rec.status()) && master_->draining()) return absl::OkStatus();
    for (Runtime* r : {&a, &b}) {
      FailJob(r->id, StrCat("submitting joint micro-batch ", ks[r == &a ? 0 : 1], " (with job ",
                            r == &a ? b.id : a.id, "): ", rec.status().message()));
    }
    return absl::OkStatus();
  }
  for (Runtime* r : {&a, &b}) {
    NotANormalRun(r->id);  // trained jointly
    r->joint_without_rows = std::find(slots.begin(), slots.end(), r == &a ? 0 : 1) == slots.end();
    // One joint stream, no data parallelism: a wave of one micro-batch that
    // is no measurement of a GPU count (joint timings stay out of the time
    // LUT and measured_iter_s; RecordWave still takes it as the job's
    // one-stream micro-batch time, as without data parallelism, when it
    // carries the job's rows).
    r->wave.clear();
    r->wave_size = 1;
    r->wave_gpus = static_cast<int>(info.plan.devices.size());
    r->iteration_gpus = 0;
    r->inflight = *rec;
    r->inflight_since = now;
    r->inflight_step_before = r->step();
  }
  return absl::OkStatus();
}

}  // namespace slicesched
