// The job runner's execution of running jobs: micro-batches and evaluation
// points, and data parallelism's waves.
#include "job_runner_internal.h"

namespace slicesched {

using job_runner_internal::Ema;
using job_runner_internal::IsEvalPoint;
using job_runner_internal::MicroBatchStep;
using job_runner_internal::MsSince;
using job_runner_internal::StepHeldIteration;
using job_runner_internal::WaveLast;

absl::Status JobRunner::Drive(Timestamp now) {
  for (auto it = runtimes_.begin(); it != runtimes_.end();) {
    Runtime& rt = *it->second;
    const uint64_t id = rt.id;
    SLICESCHED_ASSIGN_OR_RETURN(jobs::JobInfo info, jobs_->Get(id));
    // 0. Profiling.
    if (info.state == jobs::JobState::kProfiling || rt.profile_job != nullptr) {
      SLICESCHED_ASSIGN_OR_RETURN(const JobPass pass, DriveProfiling(rt, &info));
      if (pass == JobPass::kEnd) {
        ++it;
        continue;
      }
    }
    // 1. The micro-batch in flight (with data parallelism: the wave).
    if (rt.inflight != nullptr && FinishWave(rt, info) == JobPass::kEnd) {
      ++it;
      continue;
    }
    if (rt.eval_pending && rt.inflight == nullptr && info.state == jobs::JobState::kRunning) {
      SLICESCHED_ASSIGN_OR_RETURN(const JobPass pass, EvaluatePending(rt, info));
      if (pass == JobPass::kEnd) {
        ++it;
        continue;
      }
    }
    // 2. Terminal jobs leave (a temporal source's state stays for its target).
    if (jobs::IsTerminal(info.state)) {
      bool is_source = false;
      for (const auto& [target, source] : temporal_source_) is_source |= source == id;
      if (!is_source) {
        temporal_source_.erase(id);
        it = runtimes_.erase(it);
        continue;
      }
      rt.running = false;
      ++it;
      continue;
    }
    // 3. Checkpoints: left running, or the interval passed.
    SLICESCHED_RETURN_IF_ERROR(CheckpointIfDue(rt, info, now));
    // 4. The next micro-batch.
    if (info.state == jobs::JobState::kRunning && rt.running) {
      SLICESCHED_RETURN_IF_ERROR(StartNextMicroBatch(rt, info, now));
    }
    ++it;
  }
  return absl::OkStatus();
}

absl::StatusOr<JobRunner::JobPass> JobRunner::DriveProfiling(Runtime& rt, jobs::JobInfo* info) {
  Profile(rt, *info);
  if (rt.inflight != nullptr || rt.profile_job != nullptr) return JobPass::kEnd;
  SLICESCHED_ASSIGN_OR_RETURN(*info, jobs_->Get(rt.id));
  if (info->state == jobs::JobState::kProfiling || info->state == jobs::JobState::kQueued) return JobPass::kEnd;
  return JobPass::kContinue;
}

JobRunner::JobPass JobRunner::FinishWave(Runtime& rt, const jobs::JobInfo& info) {
  const uint64_t id = rt.id;
  const InstanceUpdate last = WaveLast(rt);
  if (!IsTerminalInstanceState(last.state)) return JobPass::kEnd;
  rt.inflight = nullptr;
  rt.wave.clear();
  if (last.state != InstanceState::kDone) {
    stats_.steps_failed += 1;
    if (!jobs::IsTerminal(info.state)) {
      FailJob(id, StrCat("training micro-batch ", rt.micro_index(), " failed: ",
                         last.message.empty() ? std::string(ToStd(InstanceStateName(last.state))) : last.message));
    }
    return JobPass::kEnd;
  }
  // Per job: a joint micro-batch without this job's rows is none of its
  // micro-batches, and its time is no one-stream time of this job.
  const double ms = MsSince(rt.inflight_since);
  if (!rt.joint_without_rows) {
    stats_.steps_done += static_cast<uint64_t>(rt.wave_size);
    RecordWave(rt, ms);
  }
  rt.joint_without_rows = false;
  {
    absl::MutexLock l(&rt.job->mu);
    if (!rt.job->losses.empty()) rt.last_loss = rt.job->losses.back();
  }
  if (rt.first_step_pending) ReportContextSwitch(rt, info, ms);
  // Iteration boundary: an evaluation point (a multiple of
  // eval_every_steps, an epoch end, or the limit) is marked, and
  // evaluated once the job runs (a job paused at that instant is
  // evaluated on the same state when it resumes), so the evaluation
  // points never depend on scheduling.
  const int64_t step = rt.step();
  if (step > rt.inflight_step_before && IsEvalPoint(rt, step, options_.planner.eval_every_steps)) {
    rt.eval_pending = true;
  }
  return JobPass::kContinue;
}

void JobRunner::ReportContextSwitch(Runtime& rt, const jobs::JobInfo& info, double first_step_ms) {
  rt.first_step_pending = false;
  rt.pending_switch["first_step_ms"] = first_step_ms;
  double total = 0;
  for (const char* k : {"first_step_ms", "load_checkpoint_ms", "prepare_data_ms"}) {
    auto f = rt.pending_switch.find(k);
    if (f != rt.pending_switch.end()) total += f->second;
  }
  rt.pending_switch["context_switch_ms"] = total;
  if (info.state == jobs::JobState::kRunning) {
    auto p = jobs_->ReportProgress(rt.id, rt.step(), rt.last_loss, "", rt.pending_switch);
    if (!p.ok()) spdlog::warn("job {}: progress: {}", rt.id, p.status().ToString());
  }
  rt.pending_switch.clear();
}

absl::StatusOr<JobRunner::JobPass> JobRunner::EvaluatePending(Runtime& rt, const jobs::JobInfo& info) {
  const uint64_t id = rt.id;
  rt.eval_pending = false;
  const int64_t step = rt.step();
  const bool at_limit = step >= rt.iteration_limit();
  double metric = 0, eval_loss = 0;
  absl::Status e = Evaluate(rt, &metric, &eval_loss);
  if (!e.ok()) {
    FailJob(id, StrCat("evaluation: ", e.message()));
    return JobPass::kEnd;
  }
  rt.last_eval_step = step;
  rt.last_metric = metric;
  RecordEvaluation(rt, info, step, metric);
  const bool higher = jobs::HigherIsBetter(rt.spec.stop.metric);
  const bool reached = higher ? metric >= rt.spec.stop.target : metric <= rt.spec.stop.target;
  const double epochs = static_cast<double>(step) / static_cast<double>(rt.iterations_per_epoch());
  if (reached || at_limit) {
    SLICESCHED_RETURN_IF_ERROR(Checkpoint(rt, {{"epochs", epochs}, {"metric", metric}}));
    jobs::CompletionReport rep;
    rep.metrics[std::string(jobs::StopMetricName(rt.spec.stop.metric))] = metric;
    rep.metrics["eval_loss"] = eval_loss;
    rep.metrics["train_loss"] = rt.last_loss;
    rep.metrics["iterations"] = static_cast<double>(step);
    rep.metrics["epochs"] = epochs;
    rep.metrics["censored"] = reached ? 0.0 : 1.0;
    auto c = jobs_->Complete(id, rep);
    if (!c.ok()) spdlog::warn("job {}: complete: {}", id, c.status().ToString());
    spdlog::info("job {} completed after {} iterations ({:.2f} epochs): {} = {:.4f}{}", id, step, epochs,
                 jobs::StopMetricName(rt.spec.stop.metric), metric,
                 reached ? "" : " (censored: the limit came first)");
    rt.running = false;
    plan_requested_ = true;
    return JobPass::kEnd;
  }
  std::map<std::string, double> extra = {{"epochs", epochs}, {"metric", metric}, {"eval_loss", eval_loss}};
  ObservePairing(rt, info, metric, &extra);
  auto p = jobs_->ReportProgress(id, step, rt.last_loss, "", extra);
  if (!p.ok()) spdlog::warn("job {}: progress: {}", id, p.status().ToString());
  return JobPass::kContinue;
}

absl::Status JobRunner::CheckpointIfDue(Runtime& rt, const jobs::JobInfo& info, Timestamp now) {
  if (rt.job != nullptr && (rt.checkpoint_due || (info.state == jobs::JobState::kRunning &&
                                                  rt.last_checkpoint != Timestamp::Never() &&
                                                  now - rt.last_checkpoint >= options_.planner.checkpoint_interval))) {
    SLICESCHED_RETURN_IF_ERROR(Checkpoint(rt, {}));
    rt.checkpoint_due = false;
  }
  return absl::OkStatus();
}

absl::Status JobRunner::StartNextMicroBatch(Runtime& rt, const jobs::JobInfo& info, Timestamp now) {
  const uint64_t id = rt.id;
  if (!rt.data_ready || rt.job == nullptr) {
    absl::Status s = Prepare(rt, info, /*with_state=*/true);
    if (!s.ok()) {
      FailJob(id, std::string(ToStd(s.message())));
      return absl::OkStatus();
    }
    if (rt.last_checkpoint == Timestamp::Never()) rt.last_checkpoint = now;
  }
  // A spatial pairing's stop-loss reference: the metric at its start.
  if (absl::Status s = StartPairWatch(rt, info); !s.ok()) {
    FailJob(id, StrCat("evaluation at the start of the pairing: ", s.message()));
    return absl::OkStatus();
  }
  // A spatial pair trains jointly ("Spatial joint training", job_runner_joint.cc).
  if (info.plan.mode == jobs::RunMode::kSpatial) return DriveSpatial(rt, info);
  // Alone (or temporal) from here. A job decoupled from a spatial pair
  // between two joint micro-batches may hold a complete iteration whose
  // JointOptimizerStep waited for the partner (their grad_accumulation
  // differ; also after a restart from such a checkpoint): it takes that
  // optimizer step alone first, then continues with the next iteration.
  absl::StatusOr<bool> held = StepHeldIteration(rt);
  if (!held.ok()) {
    FailJob(id, StrCat("the optimizer step of the iteration accumulated with the spatial partner: ",
                       held.status().message()));
    return absl::OkStatus();
  }
  if (*held && IsEvalPoint(rt, rt.step(), options_.planner.eval_every_steps)) {
    rt.eval_pending = true;  // evaluated (and maybe completed) in the next pass
    return absl::OkStatus();
  }
  const int64_t k = rt.micro_index();
  rt.inflight_step_before = rt.step();
  rt.inflight_since = std::chrono::steady_clock::now();
  if (absl::Status sub = SubmitWave(rt, k); !sub.ok()) {
    if (absl::IsFailedPrecondition(sub) && master_->draining()) return absl::OkStatus();
    FailJob(id, std::string(ToStd(sub.message())));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Data parallelism (job_runner_dp.h): a job on g devices runs its iteration's
// micro-batches in waves of up to g / pipeline_parallel concurrent streams.

absl::Status JobRunner::LoadTimeLut() {
  dp_ = std::make_unique<DpState>();
  const std::string& path = options_.planner.time_lut_path;
  if (path.empty()) return absl::OkStatus();
  dp_->has_lut = true;
  if (!std::filesystem::exists(path)) {
    spdlog::info("planner.time_lut: '{}' does not exist yet; it starts empty and is written with measured times",
                 path);
    return absl::OkStatus();
  }
  auto lut = ymir::TimeLut::Load(path);
  if (!lut.ok()) return Annotate(lut.status(), "planner.time_lut");
  dp_->lut = *std::move(lut);
  return absl::OkStatus();
}

void JobRunner::SaveTimeLut() {
  if (dp_ == nullptr || !dp_->has_lut || !dp_->lut_dirty) return;
  const std::string& path = options_.planner.time_lut_path;
  const std::string tmp = path + ".tmp";
  absl::Status s = dp_->lut.Save(tmp);
  std::error_code ec;
  if (s.ok()) std::filesystem::rename(tmp, path, ec);
  if (!s.ok() || ec) {
    spdlog::warn("planner.time_lut: writing the measured times to '{}': {}", path,
                 s.ok() ? ec.message() : s.ToString());
    return;
  }
  dp_->lut_dirty = false;
}

bool JobRunner::ProfileFromLut(Runtime& rt, const jobs::JobInfo& info) {
  if (!options_.planner.profile_from_lut || dp_ == nullptr || !dp_->has_lut) return false;
  const DpShape shape = rt.dp_shape();
  const ymir::LutKey key = DpLutKey(shape, shape.min_gpus);
  auto hit = dp_->lut.entries().find(key);  // measured keys only: no interpolation
  if (hit == dp_->lut.entries().end() || hit->second.seconds <= 0) return false;
  // The data is still loaded now (the job's first run needs it; this is
  // where profiling would have loaded it).
  if (absl::Status s = Prepare(rt, info, /*with_state=*/false); !s.ok()) {
    FailJob(rt.id, std::string(ToStd(s.message())));
    return true;
  }
  rt.iter_time_s = hit->second.seconds;
  rt.micro_s = rt.iter_time_s / static_cast<double>(DpWaves(shape, DpStreams(shape, shape.min_gpus)));
  rt.pending_switch["prepare_data_ms"] = 0;
  auto p = jobs_->ReportProgress(rt.id, info.iterations_done, info.last_loss, "",
                                 {{"profiled_iter_time_s", rt.iter_time_s},
                                  {"profile_micro_batches", 0.0},
                                  {"profile_from_lut", 1.0}});
  if (!p.ok()) spdlog::warn("job {}: profile progress: {}", rt.id, p.status().ToString());
  auto q = jobs_->Queue(rt.id, rt.iteration_limit());
  if (!q.ok()) spdlog::warn("job {}: queueing: {}", rt.id, q.status().ToString());
  spdlog::info("job {} profiled from the time LUT ({}): {:.4f} s per iteration", rt.id, key.ToString(),
               rt.iter_time_s);
  plan_requested_ = true;
  return true;
}

void JobRunner::OfferIterTimes(Runtime& rt, double min_time_s, int devices, ymir::JobView* v) {
  const DpShape shape = rt.dp_shape();
  DpInputs in;
  in.min_iter_s = min_time_s;
  in.micro_s = rt.micro_s > 0 ? rt.micro_s : min_time_s / static_cast<double>(rt.micro_per_iteration());
  in.measured_s = rt.measured_iter_s;
  in.lut = dp_ != nullptr && dp_->has_lut ? &dp_->lut : nullptr;
  if (dp_ != nullptr) {
    auto s = dp_->sync_per_stream_s.find(rt.deployment);
    if (s != dp_->sync_per_stream_s.end()) in.sync_per_stream_s = s->second;
  }
  const std::vector<DpTime> times = DpIterTimes(shape, in, devices);
  v->max_gpus = times.back().gpus;
  v->iter_time_s.assign(static_cast<size_t>(v->max_gpus) + 1, 0.0);
  for (const DpTime& t : times) v->iter_time_s[static_cast<size_t>(t.gpus)] = t.seconds;
  if (times.size() > 1) {
    std::string line;
    for (const DpTime& t : times) line += StrCat(line.empty() ? "" : ", ", t.gpus, ": ", t.seconds, " s (",
                                                 DpTimeSourceName(t.source), ")");
    spdlog::debug("job {}: iteration times offered {}", rt.id, line);
  }
}

absl::Status JobRunner::SubmitWave(Runtime& rt, int64_t k) {
  const DpShape shape = rt.dp_shape();
  const int gpus = static_cast<int>(rt.plan.devices.size());
  const int streams = DpStreams(shape, gpus);
  int64_t accumulated = 0;
  {
    absl::MutexLock l(&rt.job->mu);
    accumulated = rt.job->state.accumulated;
  }
  const auto size = static_cast<int>(std::min<int64_t>(streams, rt.micro_per_iteration() - accumulated));
  const std::vector<std::vector<uint32_t>> groups = DpStreamDevices(rt.plan.devices, shape.pipeline_parallel, size);
  rt.wave.clear();
  rt.inflight = nullptr;
  rt.wave_size = 0;
  rt.wave_gpus = gpus;
  if (accumulated == 0) {  // an iteration starts
    rt.iteration_since = rt.inflight_since;
    rt.iteration_gpus = gpus;
  } else if (rt.iteration_gpus != gpus) {
    rt.iteration_gpus = 0;  // re-planned mid-iteration: not a measurement of one count
  }
  for (int i = 0; i < static_cast<int>(groups.size()); ++i) {
    // One stream: its whole device set, as without data parallelism.
    std::vector<uint32_t> devs = groups.size() == 1 ? rt.plan.devices : groups[static_cast<size_t>(i)];
    TrainStepArgs args = MicroBatchStep(rt, k + i, rt.job, std::move(devs), StrCat("job-", rt.id, "/mb-", k + i));
    args.micro_index = k + i;
    auto rec = master_->SubmitTrainStep(std::move(args));
    if (!rec.ok()) {
      if (absl::IsFailedPrecondition(rec.status()) && master_->draining()) return rec.status();
      return absl::Status(rec.status().code(), StrCat("submitting micro-batch ", k + i, ": ", rec.status().message()));
    }
    if (rt.inflight == nullptr) {
      rt.inflight = *rec;
    } else {
      rt.wave.push_back(*rec);
    }
    rt.wave_size += 1;
  }
  return absl::OkStatus();
}

double JobRunner::SpanSeconds(const Runtime& rt, int64_t waves, double elapsed_s) const {
  return options_.span_seconds ? options_.span_seconds(rt.id, waves, elapsed_s) : elapsed_s;
}

void JobRunner::RecordWave(Runtime& rt, double ms) {
  const double s = SpanSeconds(rt, 1, ms / 1000.0);
  if (rt.wave_size == 1) {
    // A micro-batch alone: the one-stream times (the planner's gpus.min).
    rt.one_stream_samples += 1;
    rt.micro_s = Ema(rt.micro_s, s);
    rt.iter_time_s = Ema(rt.iter_time_s, s * static_cast<double>(rt.micro_per_iteration()));
  } else if (rt.micro_s > 0 && dp_ != nullptr) {
    const double extra = std::max(0.0, (s - rt.micro_s) / static_cast<double>(rt.wave_size - 1));
    double& sync = dp_->sync_per_stream_s[rt.deployment];
    sync = Ema(sync, extra);
  }
  // A whole iteration on one device count: measured, and fed to the LUT.
  if (rt.step() > rt.inflight_step_before && rt.iteration_gpus > 0 && rt.iteration_gpus == rt.wave_gpus) {
    const DpShape shape = rt.dp_shape();
    const double iter_s =
        SpanSeconds(rt, DpWaves(shape, DpStreams(shape, rt.iteration_gpus)),
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - rt.iteration_since).count());
    rt.measured_iter_s[rt.iteration_gpus] = Ema(rt.measured_iter_s[rt.iteration_gpus], iter_s);
    if (dp_ != nullptr && dp_->has_lut) {
      const ymir::LutKey key = DpLutKey(shape, rt.iteration_gpus);
      if (dp_->lut.Update(key, iter_s).ok()) dp_->lut_dirty = true;
    }
  }
  if (rt.step() > rt.inflight_step_before) rt.iteration_gpus = 0;
}

}  // namespace slicesched
