// The job runner's planning round (the Ymir ILP), its pairings and their
// stop-loss reference curves.
#include "job_runner_internal.h"

namespace slicesched {

using job_runner_internal::JointResumeProblem;
using job_runner_internal::PairKey;

absl::Status JobRunner::StartPairWatch(Runtime& rt, const jobs::JobInfo& info) {
  if (info.plan.mode == jobs::RunMode::kAlone || rt.job == nullptr) return absl::OkStatus();
  auto w = pair_watch_.find(PairKey(rt.id, info.plan.partner));
  if (w == pair_watch_.end()) return absl::OkStatus();
  const int m = w->second->members[0] == rt.id ? 0 : 1;
  if (m >= w->second->policy.members()) return absl::OkStatus();  // a temporal source
  if (!std::isnan(w->second->start_metric[m])) return absl::OkStatus();
  double metric = 0, loss = 0;
  SLICESCHED_RETURN_IF_ERROR(Evaluate(rt, &metric, &loss));
  w->second->start_metric[m] = jobs::HigherIsBetter(rt.spec.stop.metric) ? -metric : metric;
  w->second->start_step[m] = rt.step();
  return absl::OkStatus();
}

void JobRunner::ObservePairing(Runtime& rt, const jobs::JobInfo& info, double metric,
                               std::map<std::string, double>* extra) {
  if (info.plan.mode == jobs::RunMode::kAlone) return;
  const auto key = PairKey(rt.id, info.plan.partner);
  auto w = pair_watch_.find(key);
  if (w == pair_watch_.end()) return;
  PairWatch& pw = *w->second;
  if (pw.policy.verdict() != ymir::StopLossVerdict::kUndecided) return;  // kept: final
  const int m = pw.members[0] == rt.id ? 0 : 1;
  if (m >= pw.policy.members()) return;  // a temporal source
  if (std::isnan(pw.start_metric[m])) return;  // started after this evaluation point
  const double signed_metric = jobs::HigherIsBetter(rt.spec.stop.metric) ? -metric : metric;
  const double epochs =
      static_cast<double>(rt.step() - pw.start_step[m]) / static_cast<double>(rt.iterations_per_epoch());
  // Both kinds of member (a spatial member, a temporal target) are compared
  // with the measured normal curve of their task where there is one.
  uint64_t curve_job = 0;
  const double reference = StopLossReference(rt, pw.start_metric[m], rt.step(), &curve_job);
  (*extra)["stop_loss_reference"] = jobs::HigherIsBetter(rt.spec.stop.metric) ? -reference : reference;
  (*extra)["stop_loss_normal_curve"] = curve_job != 0 ? 1 : 0;
  (*extra)["stop_loss_start_metric"] = jobs::HigherIsBetter(rt.spec.stop.metric) ? -pw.start_metric[m] : pw.start_metric[m];
  if (curve_job != 0) (*extra)["stop_loss_normal_run_job"] = static_cast<double>(curve_job);
  auto v = pw.policy.Observe(m, epochs, signed_metric, reference);
  if (!v.ok()) {
    spdlog::warn("job {}: stop-loss: {}", rt.id, v.status().ToString());
    return;
  }
  if (*v == ymir::StopLossVerdict::kKeep) {
    (*extra)["stop_loss_kept"] = 1;
    // The watch stays (with its final verdict) while the pairing lasts, so
    // the next planning round does not start a new one.
    spdlog::info("jobs {} + {}: {} pairing kept (stop-loss: {})", key.first, key.second,
                 ymir::PairingModeName(pw.policy.mode()), pw.policy.reason());
    return;
  }
  if (*v != ymir::StopLossVerdict::kDecouple) return;
  const std::string reason =
      StrCat("stop-loss: the ", ymir::PairingModeName(pw.policy.mode()), " pairing with job ", info.plan.partner,
             " did not improve ",
             jobs::StopMetricName(rt.spec.stop.metric), " within ", ymir::StopLossOptions{}.window_epochs,
             " epochs (", pw.policy.reason(), "; member ", m, " is job ", rt.id,
             jobs::HigherIsBetter(rt.spec.stop.metric) ? ", metric negated" : "", "; reference: ",
             curve_job != 0 ? StrCat("the normal run of job ", curve_job, " at step ", rt.step())
                            : StrCat("its metric at the pairing's start, step ", pw.start_step[m]),
             ")");
  auto d = jobs_->Decouple(rt.id, reason, {}, /*never_pair_again=*/true);
  if (!d.ok()) {
    spdlog::warn("job {}: decouple: {}", rt.id, d.status().ToString());
    return;
  }
  spdlog::info("job {}: {}", rt.id, reason);
  for (uint64_t id : {key.first, key.second}) {
    auto r = runtimes_.find(id);
    if (r == runtimes_.end()) continue;
    auto now_info = jobs_->Get(id);
    if (now_info.ok()) r->second->plan = now_info->plan;
  }
  decoupled_pairs_.insert(key);
  // A temporal target keeps the adapters it trained; it no longer counts as
  // its source's target (the source's state may now be released).
  if (pw.policy.mode() == ymir::PairingMode::kTemporal) temporal_source_.erase(pw.members[0]);
  pair_watch_.erase(w);
  plan_requested_ = true;
}

absl::Status JobRunner::ApplyPlan(uint64_t id, const jobs::RunPlan& plan, Timestamp now) {
  (void)now;
  auto it = runtimes_.find(id);
  if (it != runtimes_.end() && it->second->running && it->second->plan.devices == plan.devices &&
      it->second->plan.mode == plan.mode && it->second->plan.partner == plan.partner) {
    return absl::OkStatus();  // unchanged: no event
  }
  auto r = jobs_->Run(id, plan);
  if (!r.ok()) return r.status();
  Runtime& rt = *runtimes_.at(id);
  const bool was_running = rt.running;
  rt.plan = plan;
  rt.running = true;
  if (!was_running) rt.first_step_pending = true;
  return absl::OkStatus();
}

std::map<uint64_t, uint64_t> JobRunner::JointPartners(const std::vector<jobs::JobInfo>& listed) {
  std::map<uint64_t, const jobs::JobInfo*> info;
  for (const jobs::JobInfo& j : listed) info[j.id] = &j;
  std::map<uint64_t, uint64_t> out;
  // Pairs training jointly now: they may stay spatial.
  for (const auto& [a, b] : joint_started_) {
    auto ia = info.find(a), ib = info.find(b);
    if (ia == info.end() || ib == info.end()) continue;
    const jobs::RunPlan &pa = ia->second->plan, &pb = ib->second->plan;
    if (ia->second->state != jobs::JobState::kRunning || ib->second->state != jobs::JobState::kRunning ||
        pa.mode != jobs::RunMode::kSpatial || pa.partner != b || pb.mode != jobs::RunMode::kSpatial ||
        pb.partner != a) {
      continue;
    }
    out[a] = b;
    out[b] = a;
  }
  // Pairs that were training jointly when the daemon stopped (the store's
  // joint pairs, neither member running yet): resumable when both
  // checkpoints are at the same step of the pairing with one shared adapter.
  auto stored = jobs_->JointPairs();
  if (!stored.ok()) {
    spdlog::warn("reading the joint pairs: {}", stored.status().ToString());
    return out;
  }
  for (const auto& key : *stored) {
    const auto [a, b] = key;
    if (joint_started_.contains(key)) continue;  // running (above), or decoupled in this process
    auto ia = info.find(a), ib = info.find(b);
    std::string why;
    if (ia == info.end() || ib == info.end()) {
      // Not in this round's list: gone, or beyond the listed page (a round
      // lists at most one page of jobs), which keeps the pair stored (not
      // offered this round).
      bool unlisted = false;
      for (const uint64_t id : {a, b}) {
        if (info.contains(id)) continue;
        auto j = jobs_->Get(id);
        if (j.ok() && (j->state == jobs::JobState::kQueued || j->state == jobs::JobState::kPaused ||
                       j->state == jobs::JobState::kRunning)) {
          unlisted = true;
        } else if (why.empty()) {
          why = StrCat("job ", id, " is no longer queued, paused or running");
        }
      }
      if (why.empty() && unlisted) continue;
    } else if (ia->second->state == jobs::JobState::kRunning || ib->second->state == jobs::JobState::kRunning) {
      const jobs::RunPlan &pa = ia->second->plan, &pb = ib->second->plan;
      const bool a_with_b = ia->second->state == jobs::JobState::kRunning && pa.mode == jobs::RunMode::kSpatial &&
                            pa.partner == b;
      const bool b_with_a = ib->second->state == jobs::JobState::kRunning && pb.mode == jobs::RunMode::kSpatial &&
                            pb.partner == a;
      if (a_with_b && b_with_a) {
        // Resumed by an earlier round (checked then), its first joint
        // micro-batch not taken yet: kept spatial.
        out[a] = b;
        out[b] = a;
        continue;
      }
      const uint64_t apart = ia->second->state == jobs::JobState::kRunning && !a_with_b ? a : b;
      why = StrCat("the planner runs job ", apart, " without its partner");
    }
    const executor::TaskState* st[2] = {nullptr, nullptr};
    for (int i = 0; i < 2 && why.empty(); ++i) {
      const jobs::JobInfo& j = *(i == 0 ? ia : ib)->second;
      Runtime& rt = RuntimeFor(j);
      if (absl::Status s = Prepare(rt, j, /*with_state=*/true); !s.ok()) {
        why = StrCat("job ", j.id, "'s state does not load: ", s.message());
        break;
      }
      st[i] = &rt.job->state;
    }
    if (why.empty()) {
      const bool fresh = st[0]->step == 0 && st[0]->accumulated == 0 && st[1]->step == 0 && st[1]->accumulated == 0;
      if (fresh) {
        why = "both jobs start from scratch (no checkpoint of their joint training); as fresh jobs they may be "
              "paired again";
      } else {
        why = JointResumeProblem(a, *st[0], b, *st[1]);
      }
    }
    if (!why.empty()) {
      spdlog::info("jobs {} + {}: joint training not resumed: {}", a, b, why);
      if (absl::Status s = jobs_->EndJointTraining(a, b, StrCat("joint training not resumed after a restart: ", why));
          !s.ok()) {
        spdlog::warn("jobs {} + {}: recording the end of their joint training: {}", a, b, s.ToString());
      }
      continue;
    }
    out[a] = b;
    out[b] = a;
  }
  return out;
}

// The planner's view of every listed job (failing those that can never fit).
JobRunner::PlanInputs JobRunner::JobViews(const std::vector<jobs::JobInfo>& listed, int devices) {
  PlanInputs in;
  std::vector<ymir::JobView>& views = in.views;
  std::map<uint64_t, std::string>& task_of = in.task_of;
  // Measured iteration time per deployment (for jobs not yet measured).
  std::map<std::string, double> deployment_time;
  for (const auto& [id, rt] : runtimes_) {
    if (rt->iter_time_s > 0 && !rt->deployment.empty()) deployment_time[rt->deployment] = rt->iter_time_s;
  }
  std::map<uint64_t, uint64_t> joint_partner = JointPartners(listed);
  int demand = 0;
  for (const jobs::JobInfo& j : listed) demand += j.spec.min_gpus;
  in.contended = demand > devices;
  const int64_t now_ms = jobs_->NowUnixMs();  // the clock of submitted_unix_ms
  for (const jobs::JobInfo& j : listed) {
    Runtime& rt = RuntimeFor(j);
    if (j.spec.min_gpus > devices) {
      FailJob(j.id, StrCat("gpus.min: ", j.spec.min_gpus, " devices requested, the daemon has ", devices));
      continue;
    }
    ymir::JobView v;
    v.id = j.id;
    v.backbone = j.spec.backbone;
    v.tenant = j.tenant;
    v.trust_domain = j.spec.trust_domain;
    v.allow_sharing = j.spec.allow_sharing;
    v.has_progress = j.iterations_done > 0 || rt.step() > 0 || rt.micro_index() > 0;
    if (auto jp = joint_partner.find(j.id); jp != joint_partner.end()) v.joint_partner = jp->second;
    v.min_gpus = j.spec.min_gpus;
    int64_t limit = j.iterations_target;
    if (rt.data_ready) limit = rt.iteration_limit();
    if (limit <= 0) limit = std::max<int64_t>(1, j.spec.stop.max_iterations > 0 ? j.spec.stop.max_iterations : 100);
    const int64_t done = std::max<int64_t>(j.iterations_done, rt.step());
    v.remaining_iterations = static_cast<double>(std::max<int64_t>(1, limit - done));
    double t = rt.iter_time_s;
    if (t <= 0) {
      auto d = deployment_time.find(rt.deployment);
      t = d != deployment_time.end() ? d->second : options_.default_iter_time_s;
    }
    OfferIterTimes(rt, t, devices, &v);
    v.fair_share_jct_s = v.remaining_iterations * t * std::max(1.0, static_cast<double>(demand) / devices);
    v.waited_s = std::max(0.0, static_cast<double>(now_ms - j.submitted_unix_ms) / 1000.0);
    task_of[j.id] = rt.task_key;
    views.push_back(std::move(v));
  }
  return in;
}

// The transfer candidates among the views (Ymir mode only): every ordered
// pair with a plannable gain that was not decoupled.
JobRunner::PairCandidates JobRunner::PairCandidatesOf(const PlanInputs& in) {
  PairCandidates out;
  std::vector<ymir::PairEstimate>& pairs = out.pairs;
  std::map<std::pair<uint64_t, uint64_t>, ymir::PairEstimate>& by_pair = out.by_pair;
  const std::vector<ymir::JobView>& views = in.views;
  const std::map<uint64_t, std::string>& task_of = in.task_of;
  // Pairs only while the jobs' gpus.min exceed the devices. With a device to
  // spare, a temporal target would wait for its source and a spatial pair
  // would share one device, where each job alone on its own device finishes
  // both sooner: at a light load the real run (tools/ymir_real_run --gap 3)
  // took 1.05x elastic's average JCT with pairs offered anyway.
  if (options_.planner.mode == PlannerConfig::Mode::kYmir && in.contended) {
    for (const ymir::JobView& a : views) {
      for (const ymir::JobView& b : views) {
        if (a.id == b.id || decoupled_pairs_.contains(PairKey(a.id, b.id))) continue;
        double tg = 0, sg = 0;
        // A censored gain (format 2: the transfer never reached the target)
        // is only a bound: not offered, as in the simulator.
        const bool has_t = gains_->table.Plannable(task_of.at(a.id), task_of.at(b.id), ymir::Mode::kTemporal, &tg);
        const bool has_s = gains_->table.Plannable(task_of.at(a.id), task_of.at(b.id), ymir::Mode::kSpatial, &sg);
        if (!has_t && !has_s) continue;
        ymir::PairEstimate e;
        e.a = a.id;
        e.b = b.id;
        // YmirGains holds the saved fraction of iterations (LoadYmirGains
        // converted the file's definition).
        e.temporal_gain_ab = has_t ? tg : -1.0;
        e.spatial_gain = has_s ? sg : -1.0;
        e.spatial_iter_time_factor = 1.0;
        // A spatial pair's joint micro-batches run as one stream (no data
        // parallelism): priced from the one-stream times, at gpus.min.
        e.spatial_single_stream = true;
        pairs.push_back(e);
        by_pair[{a.id, b.id}] = e;
      }
    }
  }
  return out;
}

// Concrete devices per assignment index: keep a running job's set when it
// still fits, then buddy-aligned blocks.
std::map<size_t, std::vector<uint32_t>> JobRunner::PlaceOnDevices(const ymir::PlanResult& plan, int devices) const {
  std::vector<uint8_t> used(static_cast<size_t>(devices), 0);
  std::map<size_t, std::vector<uint32_t>> devs_of;  // assignment index -> devices
  std::vector<size_t> order;
  for (size_t i = 0; i < plan.assignments.size(); ++i) {
    if (plan.assignments[i].mode != ymir::Mode::kWait) order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return plan.assignments[a].gpus > plan.assignments[b].gpus; });
  for (size_t i : order) {
    const ymir::Assignment& a = plan.assignments[i];
    const Runtime& rt = *runtimes_.at(a.jobs[0]);
    if (rt.running && static_cast<int>(rt.plan.devices.size()) == a.gpus &&
        std::none_of(rt.plan.devices.begin(), rt.plan.devices.end(), [&](uint32_t d) { return d >= used.size() || used[d]; })) {
      for (uint32_t d : rt.plan.devices) used[d] = 1;
      devs_of[i] = rt.plan.devices;
    }
  }
  for (size_t i : order) {
    if (devs_of.contains(i)) continue;
    const int g = plan.assignments[i].gpus;
    std::vector<uint32_t> pick;
    for (int start = 0; start + g <= devices && pick.empty(); start += g) {
      bool free = true;
      for (int d = start; d < start + g; ++d) free &= !used[static_cast<size_t>(d)];
      if (free) {
        for (int d = start; d < start + g; ++d) pick.push_back(static_cast<uint32_t>(d));
      }
    }
    if (pick.empty()) {
      for (int d = 0; d < devices && static_cast<int>(pick.size()) < g; ++d) {
        if (!used[static_cast<size_t>(d)]) pick.push_back(static_cast<uint32_t>(d));
      }
    }
    for (uint32_t d : pick) used[d] = 1;
    devs_of[i] = pick;
  }

  return devs_of;
}

// Preempts the running jobs the plan makes wait (before any run, so that
// their devices are free).
void JobRunner::PreemptWaiting(const ymir::PlanResult& plan) {
  for (const ymir::Assignment& a : plan.assignments) {
    if (a.mode != ymir::Mode::kWait) continue;
    for (uint64_t id : a.jobs) {
      Runtime& rt = *runtimes_.at(id);
      if (!rt.running) continue;
      auto r = jobs_->Preempt(id, "the planner gave its devices to other jobs this round");
      if (!r.ok()) {
        spdlog::warn("job {}: preempt: {}", id, r.status().ToString());
        continue;
      }
      rt.running = false;
      rt.checkpoint_due = true;
    }
  }
}

// Runs each assignment: alone (or as a temporal target whose source
// completed), as a temporal pair, or as a spatial pair, with the stop-loss
// watch of each pairing.
absl::Status JobRunner::ApplyAssignments(const ymir::PlanResult& plan,
                                         const std::map<size_t, std::vector<uint32_t>>& devs_of,
                                         const std::map<std::pair<uint64_t, uint64_t>, ymir::PairEstimate>& by_pair,
                                         Timestamp now) {
  for (size_t i = 0; i < plan.assignments.size(); ++i) {
    const ymir::Assignment& a = plan.assignments[i];
    if (a.mode == ymir::Mode::kWait) continue;
    jobs::RunPlan rp;
    if (auto d = devs_of.find(i); d != devs_of.end()) rp.devices = d->second;
    if (rp.devices.empty()) continue;
    if (a.mode == ymir::Mode::kNormal) {
      rp.mode = jobs::RunMode::kAlone;
      // A temporal target starts from its source's adapters only once the
      // source completed; run alone while the source still trains (or after
      // it failed), it starts from its own initialisation.
      // Once it did, the target runs as the temporal pair's second half
      // (mode temporal, partner = the completed source), watched by the
      // stop-loss.
      if (auto src = temporal_source_.find(a.jobs[0]); src != temporal_source_.end()) {
        auto s = jobs_->Get(src->second);
        if (!s.ok() || s->state != jobs::JobState::kCompleted) {
          temporal_source_.erase(src);
        } else {
          rp.mode = jobs::RunMode::kTemporal;
          rp.partner = src->second;
          const auto key = PairKey(a.jobs[0], src->second);
          if (!pair_watch_.contains(key)) {
            SLICESCHED_ASSIGN_OR_RETURN(ymir::StopLoss policy, ymir::StopLoss::Create(ymir::PairingMode::kTemporal));
            auto w = std::make_unique<PairWatch>(std::move(policy));
            w->members[0] = a.jobs[0];
            w->members[1] = src->second;
            pair_watch_[key] = std::move(w);
          }
        }
      }
      SLICESCHED_RETURN_IF_ERROR(ApplyPlan(a.jobs[0], rp, now));
      continue;
    }
    const uint64_t A = a.jobs[0], B = a.jobs[1];
    auto found = by_pair.find({A, B});
    if (found == by_pair.end()) found = by_pair.find({B, A});
    const ymir::PairEstimate e = found != by_pair.end() ? found->second : ymir::PairEstimate{};
    if (a.mode == ymir::Mode::kTemporal) {
      rp.mode = jobs::RunMode::kTemporal;
      rp.partner = B;
      rp.predicted_gain = e.temporal_gain_ab;
      SLICESCHED_RETURN_IF_ERROR(ApplyPlan(A, rp, now));
      temporal_source_[B] = A;
      Runtime& rb = *runtimes_.at(B);
      if (rb.running) {
        auto r = jobs_->Preempt(B, StrCat("waits for its temporal source job ", A));
        if (r.ok()) {
          rb.running = false;
          rb.checkpoint_due = true;
        }
      }
    } else {
      temporal_source_.erase(A);
      temporal_source_.erase(B);
      rp.mode = jobs::RunMode::kSpatial;
      rp.predicted_gain = e.spatial_gain;
      rp.partner = B;
      SLICESCHED_RETURN_IF_ERROR(ApplyPlan(A, rp, now));
      rp.partner = A;
      SLICESCHED_RETURN_IF_ERROR(ApplyPlan(B, rp, now));
      const auto key = PairKey(A, B);
      if (!pair_watch_.contains(key)) {
        SLICESCHED_ASSIGN_OR_RETURN(ymir::StopLoss policy, ymir::StopLoss::Create(ymir::PairingMode::kSpatial));
        auto w = std::make_unique<PairWatch>(std::move(policy));
        w->members[0] = key.first;
        w->members[1] = key.second;
        pair_watch_[key] = std::move(w);
      }
    }
  }
  return absl::OkStatus();
}

// Drops the watches of pairings that ended (re-planned apart, paused,
// finished).
void JobRunner::DropEndedPairWatches() {
  for (auto w = pair_watch_.begin(); w != pair_watch_.end();) {
    const PairWatch& pw = *w->second;
    const jobs::RunMode mode =
        pw.policy.mode() == ymir::PairingMode::kSpatial ? jobs::RunMode::kSpatial : jobs::RunMode::kTemporal;
    auto ra = runtimes_.find(pw.members[0]);
    const bool alive = ra != runtimes_.end() && ra->second->running && ra->second->plan.mode == mode &&
                       ra->second->plan.partner == pw.members[1];
    w = alive ? std::next(w) : pair_watch_.erase(w);
  }
}

absl::Status JobRunner::PlanRound(Timestamp now) {
  SLICESCHED_ASSIGN_OR_RETURN(
      jobs::ListJobsPage page,
      jobs_->List({.states = {jobs::JobState::kQueued, jobs::JobState::kRunning, jobs::JobState::kPaused},
                   .page_size = 1000}));
  const int devices = static_cast<int>(master_->config().cluster.size());
  const PlanInputs in = JobViews(page.jobs, devices);
  if (in.views.empty()) return absl::OkStatus();
  const PairCandidates candidates = PairCandidatesOf(in);
  ymir::ClusterView cluster{.gpus = devices, .gpus_per_node = devices};
  ymir::PlannerOptions po;
  po.round_s = options_.planner.interval.ToSecondsF();
  po.time_limit_s = 5;
  auto solve = [&]() -> absl::StatusOr<ymir::PlanResult> {
    switch (options_.planner.mode) {
      case PlannerConfig::Mode::kSrtf: return ymir::PlanSrtf(in.views, cluster);
      case PlannerConfig::Mode::kPollux: return ymir::PlanPolluxLike(in.views, cluster);
      case PlannerConfig::Mode::kYmir:
      case PlannerConfig::Mode::kElastic: break;
    }
    return ymir::Plan(in.views, candidates.pairs, cluster, po);
  };
  SLICESCHED_ASSIGN_OR_RETURN(ymir::PlanResult plan, solve());
  stats_.plans += 1;
  stats_.last_solve_s = plan.solve_seconds;
  const std::map<size_t, std::vector<uint32_t>> devs_of = PlaceOnDevices(plan, devices);
  PreemptWaiting(plan);
  SLICESCHED_RETURN_IF_ERROR(ApplyAssignments(plan, devs_of, candidates.by_pair, now));
  DropEndedPairWatches();
  SaveTimeLut();
  spdlog::info("planner ({}): {} jobs, {} candidates, {} pruned, solved in {:.3f} s",
               ToStd(PlannerModeName(options_.planner.mode)), in.views.size(), plan.candidates, plan.pruned,
               plan.solve_seconds);
  return absl::OkStatus();
}

void JobRunner::Prefetch(Timestamp now) {
  if (last_plan_ == Timestamp::Never()) return;
  if (now + options_.planner.prefetch < last_plan_ + options_.planner.interval) return;
  auto page = jobs_->List({.states = {jobs::JobState::kQueued, jobs::JobState::kPaused}, .page_size = 1000});
  if (!page.ok()) return;
  for (const jobs::JobInfo& j : page->jobs) {
    auto it = runtimes_.find(j.id);
    if (it == runtimes_.end() || it->second->data_ready) continue;
    Runtime& rt = *it->second;
    absl::Status s = Prepare(rt, j, /*with_state=*/false);
    if (!s.ok()) {
      FailJob(j.id, std::string(ToStd(s.message())));
      continue;
    }
    // Prepared ahead of the resume: not part of its context switch (which
    // reports prepare_data_ms 0), reported beside it.
    rt.pending_switch["prefetched_data_ms"] = rt.pending_switch["prepare_data_ms"];
    rt.pending_switch["prepare_data_ms"] = 0;
  }
}

namespace {

// Jobs whose normal runs are comparable: the same task on the same
// deployment with the same data size, objective and training setup (the
// seeds may differ; SGD and AdamW runs are never compared).
std::string NormalRunKey(const JobRunner::Runtime& rt) {
  const jobs::Hyperparameters& h = rt.spec.hyperparameters;
  return StrCat(rt.deployment, "|", rt.task_key, "|", rt.train.size(), "+", rt.eval.size(), "|",
                jobs::StopMetricName(rt.spec.stop.metric), "|", h.learning_rate, "|", h.batch_size, "|",
                h.grad_accumulation, "|", h.lora_rank, "|", h.lora_alpha, "|", jobs::OptimizerName(h.optimizer),
                h.optimizer == jobs::Optimizer::kSgd ? StrCat("|", h.momentum) : std::string());
}

}  // namespace

void JobRunner::RecordEvaluation(const Runtime& rt, const jobs::JobInfo& info, int64_t step, double metric) {
  NormalRun& run = normal_runs_[rt.id];
  if (run.key.empty()) run.key = NormalRunKey(rt);
  // Normal: alone, or a temporal source (its own training); not a temporal
  // target (it started from another job's adapters), never joint
  // (DriveSpatial marks the members).
  bool target = temporal_source_.contains(rt.id);
  if (info.plan.mode == jobs::RunMode::kTemporal) {
    auto partner = jobs_->Get(info.plan.partner);
    target |= partner.ok() && partner->state == jobs::JobState::kCompleted;
  }
  if (info.plan.mode == jobs::RunMode::kSpatial || target) NotANormalRun(rt.id);
  // A job resumed from a checkpoint (after a restart) continues a normal run
  // only when the store had that run: a checkpoint alone does not say how
  // the job trained before (a decoupled pairing member, a temporal target).
  if (run.points.empty() && rt.resumed_from_checkpoint) NotANormalRun(rt.id);
  if (!run.normal) return;
  if (!run.points.empty() && run.points.back().first >= step) return;  // re-evaluated after a pause
  run.points.emplace_back(step, metric);
  // Stored, so that a restarted daemon still has the curve.
  if (absl::Status s = jobs_->RecordNormalEvaluation(rt.id, run.key, step, metric); !s.ok()) {
    spdlog::warn("job {}: storing its normal run's evaluation at step {}: {}", rt.id, step, s.ToString());
  }
}

void JobRunner::NotANormalRun(uint64_t id) {
  NormalRun& run = normal_runs_[id];
  if (!run.normal) return;
  run.normal = false;
  run.points.clear();
  if (absl::Status s = jobs_->ForgetNormalRun(id); !s.ok()) {
    spdlog::warn("job {}: forgetting its stored normal run: {}", id, s.ToString());
  }
}

double JobRunner::StopLossReference(const Runtime& rt, double start, int64_t step, uint64_t* curve_job) const {
  *curve_job = 0;
  const std::string key = NormalRunKey(rt);
  const NormalRun* best = nullptr;
  uint64_t best_id = 0;
  for (const auto& [id, run] : normal_runs_) {
    if (id == rt.id || !run.normal || run.key != key || run.points.empty()) continue;
    if (best == nullptr || run.points.back().first > best->points.back().first) {
      best = &run;
      best_id = id;
    }
  }
  if (best == nullptr) return start;
  spatial_internal::MetricKind kind = spatial_internal::MetricKind::kLoss;
  if (rt.spec.stop.metric == jobs::StopMetric::kAccuracy) kind = spatial_internal::MetricKind::kAccuracy;
  if (rt.spec.stop.metric == jobs::StopMetric::kPerplexity) kind = spatial_internal::MetricKind::kPerplexity;
  const std::optional<double> r = spatial_internal::NormalReference(best->points, step, kind);
  if (!r.has_value()) return start;
  *curve_job = best_id;
  return jobs::HigherIsBetter(rt.spec.stop.metric) ? -*r : *r;
}

}  // namespace slicesched
