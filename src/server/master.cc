// The master: its records, construction and the loop (see server/master.h).
#include "master_impl.h"

namespace slicesched {

using master_internal::UnixMillisNow;

absl::string_view ServingStateName(ServingStateKind s) {
  switch (s) {
    case ServingStateKind::kStarting: return "starting";
    case ServingStateKind::kServing: return "serving";
    case ServingStateKind::kDraining: return "draining";
    case ServingStateKind::kDrained: return "drained";
  }
  return "?";
}

// ---------------------------------------------------------------------------
// InstanceRecord
// ---------------------------------------------------------------------------

void InstanceRecord::Append(InstanceUpdate update) {
  absl::MutexLock lock(&mu_);
  if (closed_) return;
  const bool terminal = IsTerminalInstanceState(update.state);
  events_.push_back(std::move(update));
  if (terminal) closed_ = true;
}

void InstanceRecord::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
}

std::vector<InstanceUpdate> InstanceRecord::WaitFrom(size_t from, absl::Duration timeout, bool* closed) {
  absl::MutexLock lock(&mu_);
  auto more = [this, from]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return events_.size() > from || closed_; };
  mu_.AwaitWithTimeout(absl::Condition(&more), timeout);
  std::vector<InstanceUpdate> out;
  for (size_t i = from; i < events_.size(); ++i) out.push_back(events_[i]);
  *closed = closed_;
  return out;
}

InstanceUpdate InstanceRecord::Last() {
  absl::MutexLock lock(&mu_);
  return events_.empty() ? InstanceUpdate{} : events_.back();
}

// ---------------------------------------------------------------------------
// GenerationRecord
// ---------------------------------------------------------------------------

void GenerationRecord::Append(GeneratedToken t) {
  std::function<void()> done;
  {
    absl::MutexLock lock(&mu_);
    if (done_) return;
    if (t.end != GenerationEnd::kNone) {
      done_ = true;
      end_ = t.end;
      done = std::move(on_done_);
    }
    tokens_.push_back(t);
  }
  if (done) done();
}

void GenerationRecord::Finish(GenerationEnd end, std::string message) {
  std::function<void()> done;
  {
    absl::MutexLock lock(&mu_);
    if (done_) return;
    done_ = true;
    end_ = end;
    message_ = std::move(message);
    done = std::move(on_done_);
  }
  if (done) done();
}

void GenerationRecord::OnDone(std::function<void()> fn) {
  {
    absl::MutexLock lock(&mu_);
    if (!done_) {
      on_done_ = std::move(fn);
      return;
    }
  }
  fn();
}

std::vector<GeneratedToken> GenerationRecord::WaitFrom(size_t from, absl::Duration timeout, bool* done,
                                                       GenerationEnd* end, std::string* message) {
  absl::MutexLock lock(&mu_);
  auto more = [this, from]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return tokens_.size() > from || done_; };
  mu_.AwaitWithTimeout(absl::Condition(&more), timeout);
  std::vector<GeneratedToken> out;
  for (size_t i = from; i < tokens_.size(); ++i) out.push_back(tokens_[i]);
  *done = done_;
  *end = end_;
  *message = message_;
  return out;
}

// ---------------------------------------------------------------------------
// Construction and the loop
// ---------------------------------------------------------------------------

Master::Master(SlicedConfig config, MasterOptions options)
    : config_(std::move(config)), options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<Master>> Master::Start(SlicedConfig config, MasterOptions options) {
  // Which backend actually runs each device (see the header): 'cpu' and
  // 'cuda' devices run the LibTorch executors, the others the virtual cluster.
  std::map<DeviceBackend, std::set<std::string>> by_backend;
  for (const DeviceSpec& d : config.cluster.devices()) {
    by_backend[d.backend == DeviceBackend::kCpu || d.backend == DeviceBackend::kCuda ? d.backend
                                                                                     : DeviceBackend::kVirtual]
        .insert(d.name);
  }
  if (config.cluster.size() == 0) return absl::InvalidArgumentError("cluster.devices: no devices");
  if (by_backend.size() > 1) {
    std::vector<std::string> parts;
    for (const auto& [backend, names] : by_backend) {
      parts.push_back(StrCat(absl::StrJoin(names, ", "), backend == DeviceBackend::kVirtual
                                                             ? " run virtually"
                                                             : StrCat(" have backend '", DeviceBackendName(backend), "'")));
    }
    return absl::InvalidArgumentError(
        StrCat("cluster.devices: devices ", absl::StrJoin(parts, "; "), ": one daemon drives one kind of backend"));
  }
  const DeviceBackend backend = by_backend.begin()->first;
  const std::set<std::string>& real_devices = by_backend.begin()->second;
  if (backend == DeviceBackend::kCuda && RegisteredRealBackend() == nullptr) {
    return absl::FailedPreconditionError(
        StrCat("cluster.devices: devices ", absl::StrJoin(real_devices, ", "),
               " have backend 'cuda', but this sliced was built without LibTorch and cannot drive a GPU"));
  }

  std::unique_ptr<Master> m(new Master(std::move(config), std::move(options)));
  m->backend_name_ = "virtual";
  m->started_unix_ms_ = UnixMillisNow();
  SLICESCHED_ASSIGN_OR_RETURN(m->store_, StateStore::Open(m->config_.state_dir));
  m->impl_ = std::make_unique<Impl>(m->config_, m->options_);
  Impl& im = *m->impl_;
  im.busy_ns.assign(im.gmg.accelerators().size(), 0);
  im.busy_offline_ns.assign(im.gmg.accelerators().size(), 0);
  im.busy_batch_ns.assign(im.gmg.accelerators().size(), 0);
  im.ops_done.assign(im.gmg.accelerators().size(), 0);
  if (backend != DeviceBackend::kVirtual) {
    if (const RealBackendRegistration* registered = RegisteredRealBackend(); registered != nullptr) {
      executor::ExecutorOptions eo;
      if (m->config_.scheduler.owner_nap.has_value()) {
        eo.owner_nap = absl::Nanoseconds(m->config_.scheduler.owner_nap->nanos());
      }
      SLICESCHED_ASSIGN_OR_RETURN(im.real, registered->create(&im.gmg, &m->clock_, eo));
      im.real->executors().SetEventNotifier([mp = m.get()] { mp->NotifyBackendEvent(); });
      im.backend = &im.real->executors();
      im.env.backend = im.backend;
      im.has_tokens = true;
      m->backend_name_ = StrCat(DeviceBackendName(backend), " (LibTorch)");
    } else {
      spdlog::warn(
          "devices {} are configured with backend 'cpu', but this sliced was built without LibTorch: they run on "
          "the VIRTUAL cluster (simulated operator times, no real computation, no Generate); Status/Devices "
          "report 'virtual (configured: cpu)'",
          absl::StrJoin(real_devices, ", "));
    }
  }
  im.obs = std::make_unique<MasterObserved>(std::max<size_t>(1, m->options_.timeline_capacity));

  // Estimators first, so keys registered with the deployments start warm.
  for (const std::string_view kind : {"op", "transfer", "calibration"}) {
    auto snap = m->store_->GetEstimator(kind);
    if (absl::IsNotFound(snap.status())) continue;
    if (!snap.ok()) return Annotate(snap.status(), StrCat("restoring the ", kind, " estimator"));
    const absl::Status s = kind == "op"         ? im.ops.Restore(snap->text)
                           : kind == "transfer" ? im.transfers.Restore(snap->text)
                                                : im.calibration.Restore(snap->text);
    if (s.ok()) {
      spdlog::info("restored the {} estimator from {}", kind, m->store_->path());
    } else {
      spdlog::warn("ignoring the saved {} estimator (starting cold): {}", kind, s.ToString());
    }
  }

  // Deployments: the config's, then persisted ones it does not name.
  for (const DeploymentConfig& d : m->config_.deployments) {
    absl::StatusOr<DeploymentInfo> info = m->RegisterDeployment(d, /*replace=*/true);
    if (!info.ok()) return Annotate(info.status(), StrCat("deployment '", d.name, "' of the config"));
  }
  SLICESCHED_ASSIGN_OR_RETURN(std::vector<StoredDeployment> stored, m->store_->ListDeployments());
  for (const StoredDeployment& sd : stored) {
    if (m->config_.FindDeployment(sd.name) != nullptr) continue;
    auto spec = DeploymentConfigFromYaml(ToAbsl(sd.spec_yaml), StrCat(m->store_->path(), ":deployments/", sd.name));
    absl::StatusOr<DeploymentInfo> info = spec.ok() ? m->RegisterDeployment(*spec, false) : spec.status();
    if (info.ok()) {
      spdlog::info("restored deployment '{}'", sd.name);
    } else {
      spdlog::error("could not restore deployment '{}' (skipped): {}", sd.name, info.status().ToString());
    }
  }
  im.last_save = m->clock_.Now();
  m->loop_ = std::thread([mp = m.get()] { mp->Loop(); });
  spdlog::info("master started: {} devices, {} deployments, backend {}, state {}", m->config_.cluster.size(),
               im.deployments.size(), m->backend_name_, m->store_->path());
  return m;
}

Master::~Master() { Shutdown(); }

void Master::Shutdown() {
  absl::MutexLock shutdown_lock(&shutdown_mu_);
  bool had_loop = false;
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stop_ = true;
    had_loop = loop_.joinable();
  }
  if (had_loop) loop_.join();
  {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
    commands_.clear();
  }
  if (impl_ != nullptr) {
    for (auto& [id, t] : impl_->live) t.record->Close();
    for (auto& [id, g] : impl_->generations) g.record->Finish(GenerationEnd::kCancelled, "the daemon is shutting down");
    if (store_ != nullptr) {
      const absl::Status s = store_->PutEstimators(impl_->LearnedState());
      if (!s.ok()) spdlog::error("saving the estimators at shutdown failed: {}", s.ToString());
    }
  }
}

absl::Status Master::RunOnLoop(std::function<void()> fn) {
  std::future<void> f;
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return absl::UnavailableError("the master is shutting down");
    if (loop_.joinable()) {
      auto done = std::make_shared<std::promise<void>>();
      f = done->get_future();
      commands_.push_back([fn = std::move(fn), done] {
        fn();
        done->set_value();
      });
    }
  }
  if (f.valid()) {
    // The loop runs every queued command before it stops (see Loop()).
    f.wait();
    return absl::OkStatus();
  }
  // Before the loop starts (Start() registering deployments) the caller is
  // the only thread that can reach the master: run inline.
  fn();
  return absl::OkStatus();
}

Master::LoopWake Master::AwaitWork() {
  Impl& im = *impl_;
  // The backend is asked before taking mu_: its notifier takes mu_ while
  // holding the executors' lock, so mu_ -> executors' lock must not occur.
  // The executors notify only an owner that said it sleeps, and only
  // when progress needs it; otherwise NextEventTime() ends the wait
  // after their nap (ExecutorSet, "Owner waits").
  im.OwnerSleeps();
  const Timestamp next = im.backend->NextEventTime();
  const Timestamp now = clock_.Now();
  absl::Duration wait = absl::Milliseconds(50);
  if (next != Timestamp::Infinite()) {
    wait = std::min(wait, absl::Nanoseconds(std::max<int64_t>(0, next.nanos() - now.nanos())));
  }
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !commands_.empty() || stop_ || backend_event_;
  };
  mu_.AwaitWithTimeout(absl::Condition(&ready), wait);
  im.OwnerAwake();
  LoopWake wake;
  wake.commands.swap(commands_);
  backend_event_ = false;
  wake.stop = stop_;
  return wake;
}

void Master::ApplyFeedback(Timestamp now) {
  Impl& im = *impl_;
  im.feedback.clear();
  const absl::Status s = im.backend->AdvanceTo(now, &im.feedback);
  if (!s.ok()) spdlog::error("backend: {}", s.ToString());
  for (const Feedback& f : im.feedback) {
    bool class_known = true;
    TimelineEntry e = TimelineEntryOf(f, &class_known);  // before the learner updates
    const bool offline = class_known && e.priority_class == PriorityClass::kOffline;
    im.obs->pending.emplace_back(std::move(e), class_known);
    im.learner.Apply(f, /*score=*/true);
    if (f.kind != Feedback::Kind::kOp) continue;
    im.busy_ns[f.device.value()] += f.measured().nanos();
    ++im.ops_done[f.device.value()];
    if (offline) im.busy_offline_ns[f.device.value()] += f.measured().nanos();
    if (!class_known) im.busy_unclassified.push_back({f.instance.value(), f.device.value(), f.measured().nanos()});
    if (auto g = im.step_owner.find(f.instance.value()); g != im.step_owner.end()) {
      Impl::Generation& gen = im.generations.at(g->second);
      if (gen.first_start == Timestamp::Never()) gen.first_start = f.start;
      if (gen.args.client_tag.starts_with(kBatchClientTagPrefix)) {
        im.busy_batch_ns[f.device.value()] += f.measured().nanos();
      }
    }
  }
  if (!im.feedback.empty()) im.LogCalibration(now);
}

void Master::ReportRetired(Timestamp now) {
  Impl& im = *impl_;
  const std::vector<RetiredInstance> retired = im.gmg.TakeRetired();
  for (const Impl::UnclassifiedBusy& b : im.busy_unclassified) {  // retired before their feedback was read
    for (const RetiredInstance& r : retired) {
      if (r.id.value() == b.instance && r.priority_class == PriorityClass::kOffline) {
        im.busy_offline_ns[b.device] += b.ns;
      }
    }
  }
  im.busy_unclassified.clear();
  for (const RetiredInstance& r : retired) {
    ObserveRetired(r);
    auto it = im.live.find(r.id.value());
    if (it == im.live.end()) continue;
    Impl::Tracked& t = it->second;
    InstanceUpdate u;
    u.state = r.state;
    u.time = r.finished;
    u.ops_total = t.ops_total;
    u.ops_done = r.state == InstanceState::kDone ? t.ops_total : t.ops_done;
    if (r.state == InstanceState::kDone) {
      for (CheckpointId c : r.produced) {
        u.produced_checkpoints.push_back(c.value());
        im.checkpoint_used[c.value()] = now;
      }
    }
    u.message = r.failure;
    t.record->Append(std::move(u));
    im.finished.emplace(r.id.value(), t.record);
    im.finished_order.push_back(r.id.value());
    im.live.erase(it);
    if (auto g = im.step_owner.find(r.id.value()); g != im.step_owner.end()) {
      const uint64_t request = g->second;
      im.step_owner.erase(g);
      StepRetired(request, r, now);  // takes the step's token first
    }
    im.EraseRequest(r.id);
  }
  FlushTimeline();
  while (im.finished_order.size() > options_.max_terminal_records) {
    im.finished.erase(im.finished_order.front());
    im.finished_order.pop_front();
  }
}

void Master::ReportProgress(Timestamp now) {
  Impl& im = *impl_;
  for (auto& [id, t] : im.live) {
    const Instance* inst = im.gmg.FindInstance(t.id);
    if (inst == nullptr) continue;
    uint32_t done = 0;
    for (const OpNode& n : inst->nodes) done += n.state == NodeState::kDone ? 1 : 0;
    InstanceState st = inst->state;
    if (IsTerminalInstanceState(st)) continue;  // reported when retired
    if (st != t.state || done != t.ops_done) {
      t.state = st;
      t.ops_done = done;
      t.record->Append(InstanceUpdate{.state = st, .time = now, .ops_done = done, .ops_total = t.ops_total});
    }
  }
}

void Master::ReleaseExpiredCheckpoints(Timestamp now) {
  Impl& im = *impl_;
  for (auto it = im.checkpoint_used.begin(); it != im.checkpoint_used.end();) {
    auto cur = it++;
    if (now - cur->second < options_.checkpoint_ttl) continue;
    const Checkpoint* c = im.gmg.FindCheckpoint(CheckpointId(cur->first));
    if (c == nullptr) {
      im.checkpoint_used.erase(cur);
    } else if (!c->updating.valid() && im.gmg.ReleaseCheckpoint(CheckpointId(cur->first)).ok()) {
      im.checkpoint_used.erase(cur);
    }
  }
}

void Master::SampleBusy(Timestamp now) {
  Impl& im = *impl_;
  if (!im.busy_samples.empty() && now - im.busy_samples.back().time < Duration::Seconds(1)) return;
  Impl::BusySample b{.time = now};
  for (size_t d = 0; d < im.gmg.accelerators().size(); ++d) {
    b.busy_ns.push_back(im.busy_ns[d]);
    b.busy_offline_ns.push_back(im.busy_offline_ns[d]);
  }
  im.busy_samples.push_back(std::move(b));
  while (im.busy_samples.size() > 2 && now - im.busy_samples[1].time >= Duration::Seconds(60)) {
    im.busy_samples.pop_front();
  }
}

void Master::Loop() {
  Impl& im = *impl_;
  while (true) {
    LoopWake wake = AwaitWork();
    for (auto& c : wake.commands) c();
    if (wake.stop) {
      // Commands posted between the swap and now still get an answer.
      absl::MutexLock lock(&mu_);
      for (auto& c : commands_) c();
      commands_.clear();
      return;
    }

    const Timestamp now = clock_.Now();
    ApplyFeedback(now);
    ReportRetired(now);
    ReportProgress(now);

    if (!im.gmg.unscheduled_frontier().empty()) {
      const auto t0 = std::chrono::steady_clock::now();
      auto st = im.scheduler.Schedule(im.env, now);
      ObserveSchedule(st.ok() ? &*st : nullptr, std::chrono::steady_clock::now() - t0);
      if (!st.ok()) spdlog::error("scheduler: {}", st.status().ToString());
    }
    const absl::Status s = im.backend->Dispatch(now);
    if (!s.ok()) spdlog::error("backend dispatch: {}", s.ToString());

    ReleaseExpiredCheckpoints(now);
    SampleBusy(now);

    if (now - im.last_save >= options_.estimator_save_interval) {
      im.last_save = now;
      const absl::Status saved = store_->PutEstimators(im.LearnedState());
      if (!saved.ok()) spdlog::warn("periodic estimator save failed: {}", saved.ToString());
    }
  }
}

}  // namespace slicesched
