#include "slicesched/server/master.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <future>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "slicesched/cluster/ground_truth.h"
#include "slicesched/cluster/virtual_cluster.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "slicesched/common/thread_pool.h"
#include "slicesched/estimate/calibration.h"
#include "slicesched/estimate/estimators.h"
#include "slicesched/gmg/llama.h"
#include "slicesched/sched/learner.h"
#include "slicesched/sched/slice_scheduler.h"
#include "slicesched/server/extensions.h"
#include "slicesched/sim/simulator.h"
#include "spdlog/spdlog.h"


namespace slicesched {

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
  absl::MutexLock lock(&mu_);
  if (done_) return;
  if (t.end != GenerationEnd::kNone) {
    done_ = true;
    end_ = t.end;
  }
  tokens_.push_back(t);
}

void GenerationRecord::Finish(GenerationEnd end, std::string message) {
  absl::MutexLock lock(&mu_);
  if (done_) return;
  done_ = true;
  end_ = end;
  message_ = std::move(message);
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
// Impl: everything owned by the loop thread
// ---------------------------------------------------------------------------

namespace {

bool ValidDeploymentName(const std::string& name) {
  if (name.empty() || name.size() > 128) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
}

bool SameModel(const LlamaDims& a, const LlamaDims& b) {
  return a.layers == b.layers && a.hidden == b.hidden && a.heads == b.heads && a.kv_heads == b.kv_heads &&
         a.ffn == b.ffn && a.vocab == b.vocab && a.dtype == b.dtype && a.fusion == b.fusion;
}

// Calibration log lines (see the header).
constexpr double kCalibrationLogChange = 0.10;
constexpr Duration kCalibrationLogInterval = Duration::Seconds(1);

int64_t UnixMillisNow() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

// What the loop accumulates for Timeline and Metrics (owned by the loop).
struct MasterObserved {
  explicit MasterObserved(size_t timeline_capacity) : timeline(timeline_capacity) {}
  TimelineRing timeline;
  // This iteration's completions; entries whose instance already left the
  // GMG get their class from the retirements of the same iteration.
  std::vector<std::pair<TimelineEntry, bool>> pending;  // entry, class known
  absl::flat_hash_map<uint64_t, PriorityClass> retired_class;
  MetricsSnapshot::ClassStats classes[2];
  uint64_t slo_total = 0;
  uint64_t slo_met = 0;
  Histogram schedule_call = Histogram::DecisionSeconds();
  Histogram schedule_round = Histogram::DecisionSeconds();
  uint64_t schedule_rounds = 0;
  uint64_t whatif_runs = 0;
  uint64_t issued_nodes = 0;
  uint64_t simulated_ops = 0;
  double whatif_seconds = 0;
};

struct Master::Impl {
  struct Tracked {
    InstanceId id;
    std::shared_ptr<InstanceRecord> record;
    InstanceState state = InstanceState::kPending;
    uint32_t ops_done = 0;
    uint32_t ops_total = 0;
  };
  struct BusySample {
    Timestamp time;
    std::vector<int64_t> busy_ns;
    std::vector<int64_t> busy_offline_ns;
  };
  // One Generate request between its steps (see the header).
  struct Generation {
    uint64_t id = 0;
    std::string deployment;
    TemplateId decode_tpl;
    GenerateArgs args;
    PriorityClass cls = PriorityClass::kOnline;
    std::shared_ptr<GenerationRecord> record;
    InstanceId current;             // the step now in the GMG
    std::vector<CheckpointId> kv;   // from the prefill, one per fused group
    uint32_t produced = 0;
    bool cancel_requested = false;
    Timestamp first_start = Timestamp::Never();
  };

  Impl(const SlicedConfig& config, const MasterOptions& options)
      : gmg(config.cluster),
        truth(gmg.accelerators(), GroundTruthOptions{}),
        cluster(&gmg, &truth, /*seed=*/1),
        transfers(gmg.accelerators()),
        calibration(gmg.accelerators()),
        ctx(&gmg.templates(), &ops, &transfers),
        learner(&gmg, &ctx, &ops, &transfers, &calibration),
        pool(std::max(1, options.scheduler_threads)),
        scheduler(SliceSchedulerOptions{.volume = config.scheduler.volume,
                                        .timeliness = config.scheduler.timeliness,
                                        .offline_queue_limit = static_cast<int>(config.scheduler.offline_queue_limit),
                                        .offline_aging = config.scheduler.offline_aging}),
        env{&gmg, &cluster, &ctx, &pool} {
    ctx.set_calibration(&calibration);
  }

  GlobalMappingGraph gmg;
  GroundTruthModel truth;
  VirtualCluster cluster;
  OpEstimator ops;
  TransferEstimator transfers;
  RuntimeCalibration calibration;
  SimContext ctx;
  OnlineLearner learner;
  ThreadPool pool;
  SliceScheduler scheduler;
  SchedulerEnv env;

  std::map<std::string, DeploymentInfo> deployments;
  absl::flat_hash_map<std::string, std::string> template_owner;  // template name -> deployment
  absl::flat_hash_map<uint64_t, Tracked> live;                    // by instance id
  absl::flat_hash_map<uint64_t, std::shared_ptr<InstanceRecord>> finished;
  std::deque<uint64_t> finished_order;
  absl::flat_hash_map<uint64_t, Timestamp> checkpoint_used;  // retained checkpoint -> last use
  std::deque<BusySample> busy_samples;
  std::vector<int64_t> busy_ns;          // per device: measured operator time so far
  std::vector<int64_t> busy_offline_ns;  // the part of it spent on offline instances
  std::vector<uint64_t> ops_done;        // per device: operators completed so far
  // Calibration log lines (see the header): per factor (devices, then the
  // overlap and transfer-overlap factors) the value last logged and when.
  std::vector<double> logged_factor;
  std::vector<Timestamp> logged_at;
  struct UnclassifiedBusy {
    uint64_t instance;
    uint16_t device;
    int64_t ns;
  };
  std::vector<UnclassifiedBusy> busy_unclassified;  // this iteration's, class resolved at retirement
  Timestamp last_save;
  std::vector<Feedback> feedback;

  // The backend the loop drives: &cluster, or the LibTorch executors.
  ExecutionBackend* backend = &cluster;
  bool has_tokens = false;  // the backend runs real operators (Generate works)
  // The real backend (server/extensions.h), when the devices have one.
  std::unique_ptr<RealBackend> real;
  // The loop's sleep, told to the LibTorch executors (no-ops otherwise).
  void OwnerSleeps() {
    if (real != nullptr) real->executors().OwnerSleeps();
  }
  void OwnerAwake() {
    if (real != nullptr) real->executors().OwnerAwake();
  }
  absl::flat_hash_map<uint64_t, Generation> generations;  // by request id
  absl::flat_hash_map<uint64_t, uint64_t> step_owner;     // instance -> request id
  uint64_t next_request_id = 1;

  // ---- the real backend's request table (no-ops on the virtual cluster) ----
  absl::Status AddModel(const LlamaDims& dims, const WeightsConfig& w) {
    return real != nullptr ? real->AddModel(dims, w) : absl::OkStatus();
  }
  absl::Status SetRequest(const std::string& deployment, InstanceId inst, const std::vector<int64_t>& tokens,
                          int64_t batch, double temperature, double top_p, uint64_t seed, int64_t top_k = 0) {
    return real != nullptr ? real->SetRequest(deployment, inst, tokens, batch, temperature, top_p, seed, top_k)
                           : absl::OkStatus();
  }
  void EraseRequest(InstanceId inst) {
    if (real != nullptr) real->EraseRequest(inst);
  }
  std::optional<std::vector<int64_t>> TakeTokens(InstanceId inst) {
    return real != nullptr ? real->TakeTokens(inst) : std::nullopt;
  }

  void ReleaseKv(Generation& g) {
    for (CheckpointId c : g.kv) {
      checkpoint_used.erase(c.value());
      if (gmg.FindCheckpoint(c) != nullptr) {
        const absl::Status s = gmg.ReleaseCheckpoint(c);
        if (!s.ok()) spdlog::warn("generation {}: releasing KV checkpoint {}: {}", g.id, c.value(), s.ToString());
      }
    }
    g.kv.clear();
  }
  std::unique_ptr<MasterObserved> obs;  // Timeline and Metrics

  // What the StateStore keeps of the learned models ("op", "transfer",
  // "calibration").
  std::vector<EstimatorSnapshot> LearnedState() const {
    return {{.kind = "op", .text = ops.Save()},
            {.kind = "transfer", .text = transfers.Save()},
            {.kind = "calibration", .text = calibration.Save()}};
  }

  // One log line per calibration factor that moved (see the header). Runs
  // every loop iteration with feedback: reads the factors only, builds a
  // line only for one that moved.
  void LogCalibration(Timestamp now) {
    const size_t nd = calibration.num_devices();
    if (logged_factor.empty()) {
      logged_factor.assign(nd + 2, 1.0);  // the devices, overlap, transfer overlap
      logged_at.assign(nd + 2, Timestamp::Never());
    }
    for (size_t i = 0; i < nd + 2; ++i) {
      const double factor = i < nd    ? calibration.device_factor(DeviceId(static_cast<uint16_t>(i)))
                            : i == nd ? calibration.overlap_factor()
                                      : calibration.transfer_overlap_factor();
      if (std::abs(factor / logged_factor[i] - 1.0) <= kCalibrationLogChange) continue;
      if (logged_at[i] != Timestamp::Never() && now - logged_at[i] < kCalibrationLogInterval) continue;
      const CalibrationView v = calibration.View();
      const CalibrationFactorView& f = i < nd ? v.devices[i] : i == nd ? v.overlap : v.transfer_overlap;
      const std::string name =
          i < nd ? StrCat("device ", gmg.accelerators().device(DeviceId(static_cast<uint16_t>(i))).name, " speed")
                 : std::string(i == nd ? "overlap" : "transfer overlap");
      // A device's factor is its relative one times its type's drift.
      spdlog::info("calibration: {} factor {:.3f} -> {:.3f} ({}raw {:.3f}, weight {:.3f}, {} samples{})", name,
                   logged_factor[i], factor,
                   i < nd ? absl::StrFormat("relative %.3f, drift %.3f, ", f.factor, v.drift[i].factor) : "",
                   f.raw, f.weight, f.samples, i < nd ? StrCat(", ", ops_done[i], " ops on it") : "");
      logged_factor[i] = factor;
      logged_at[i] = now;
    }
  }
};

// ---------------------------------------------------------------------------
// Construction and the loop
// ---------------------------------------------------------------------------

Master::Master(SlicedConfig config, MasterOptions options)
    : config_(std::move(config)), options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<Master>> Master::Start(SlicedConfig config, MasterOptions options) {
  // Which backend actually runs each device (see the header).
  std::set<std::string> cpu_devices, other_devices;
  for (const DeviceSpec& d : config.cluster.devices()) {
    if (d.backend == DeviceBackend::kCuda) {
      return absl::FailedPreconditionError(
          StrCat("cluster.devices: device '", d.name,
                 "' has backend 'cuda', which this version of sliced cannot drive yet (use 'cpu' or 'virtual')"));
    }
    (d.backend == DeviceBackend::kCpu ? cpu_devices : other_devices).insert(d.name);
  }
  if (config.cluster.size() == 0) return absl::InvalidArgumentError("cluster.devices: no devices");
  if (!cpu_devices.empty() && !other_devices.empty()) {
    return absl::InvalidArgumentError(
        StrCat("cluster.devices: devices ", absl::StrJoin(cpu_devices, ", "), " have backend 'cpu' but ",
               absl::StrJoin(other_devices, ", "), " do not; one daemon drives one kind of backend"));
  }

  std::unique_ptr<Master> m(new Master(std::move(config), std::move(options)));
  m->backend_name_ = "virtual";
  m->started_unix_ms_ = UnixMillisNow();
  SLICESCHED_ASSIGN_OR_RETURN(m->store_, StateStore::Open(m->config_.state_dir));
  m->impl_ = std::make_unique<Impl>(m->config_, m->options_);
  Impl& im = *m->impl_;
  im.busy_ns.assign(im.gmg.accelerators().size(), 0);
  im.busy_offline_ns.assign(im.gmg.accelerators().size(), 0);
  im.ops_done.assign(im.gmg.accelerators().size(), 0);
  if (!cpu_devices.empty()) {
    if (const RealBackendRegistration* registered = RegisteredRealBackend(); registered != nullptr) {
      ExecutorOptions eo;
      if (m->config_.scheduler.owner_nap.has_value()) {
        eo.owner_nap = absl::Nanoseconds(m->config_.scheduler.owner_nap->nanos());
      }
      SLICESCHED_ASSIGN_OR_RETURN(im.real, registered->create(&im.gmg, &m->clock_, eo));
      im.real->executors().SetEventNotifier([mp = m.get()] { mp->NotifyBackendEvent(); });
      im.backend = &im.real->executors();
      im.env.backend = im.backend;
      im.has_tokens = true;
      m->backend_name_ = "cpu (LibTorch)";
    } else {
      spdlog::warn(
          "devices {} are configured with backend 'cpu', but this sliced was built without LibTorch: they run on "
          "the VIRTUAL cluster (simulated operator times, no real computation, no Generate); Status/Devices "
          "report 'virtual (configured: cpu)'",
          absl::StrJoin(cpu_devices, ", "));
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

void Master::Loop() {
  Impl& im = *impl_;
  while (true) {
    std::deque<std::function<void()>> cmds;
    bool stop = false;
    {
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
      cmds.swap(commands_);
      backend_event_ = false;
      stop = stop_;
    }
    for (auto& c : cmds) c();
    if (stop) {
      // Commands posted between the swap and now still get an answer.
      absl::MutexLock lock(&mu_);
      for (auto& c : commands_) c();
      commands_.clear();
      return;
    }

    const Timestamp now = clock_.Now();
    im.feedback.clear();
    absl::Status s = im.backend->AdvanceTo(now, &im.feedback);
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
      }
    }

    if (!im.feedback.empty()) im.LogCalibration(now);

    // Retired instances: their final state.
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
    // Progress of the live ones.
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

    if (!im.gmg.unscheduled_frontier().empty()) {
      const auto t0 = std::chrono::steady_clock::now();
      auto st = im.scheduler.Schedule(im.env, now);
      ObserveSchedule(st.ok() ? &*st : nullptr, std::chrono::steady_clock::now() - t0);
      if (!st.ok()) spdlog::error("scheduler: {}", st.status().ToString());
    }
    s = im.backend->Dispatch(now);
    if (!s.ok()) spdlog::error("backend dispatch: {}", s.ToString());

    // Retained checkpoints past their TTL.
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

    // Busy samples for Devices (one a second, a minute's worth).
    if (im.busy_samples.empty() || now - im.busy_samples.back().time >= Duration::Seconds(1)) {
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

    if (now - im.last_save >= options_.estimator_save_interval) {
      im.last_save = now;
      const absl::Status saved = store_->PutEstimators(im.LearnedState());
      if (!saved.ok()) spdlog::warn("periodic estimator save failed: {}", saved.ToString());
    }
  }
}

// ---------------------------------------------------------------------------
// Serving
// ---------------------------------------------------------------------------

absl::StatusOr<DeploymentInfo> Master::RegisterDeployment(DeploymentConfig spec, bool replace) {
  if (draining_.load()) return absl::FailedPreconditionError("the daemon is draining; no new deployments");
  absl::StatusOr<DeploymentInfo> result = absl::InternalError("not run");
  SLICESCHED_RETURN_IF_ERROR(RunOnLoop([&] {
    Impl& im = *impl_;
    result = [&]() -> absl::StatusOr<DeploymentInfo> {
      if (!ValidDeploymentName(spec.name)) {
        return absl::InvalidArgumentError(
            StrCat("spec.name: '", spec.name, "' is not a valid name (1..128 of letters, digits, '.', '_', '-')"));
      }
      LlamaDims dims = spec.model;
      dims.name = spec.name;  // templates and weight keys are per deployment
      if (absl::Status v = dims.Validate(); !v.ok()) {
        return absl::InvalidArgumentError(StrCat("spec.model: ", v.message()));
      }
      auto existing = im.deployments.find(spec.name);
      if (existing != im.deployments.end()) {
        if (!replace) {
          return absl::AlreadyExistsError(
              StrCat("spec.name: deployment '", spec.name, "' exists (set replace to replace it)"));
        }
        if (!SameModel(existing->second.spec.model, spec.model)) {
          return absl::UnimplementedError(
              StrCat("spec.model: replacing deployment '", spec.name,
                     "' with a different model is not supported yet; register it under a new name"));
        }
      }
      auto templates = BuildLlamaTemplates(dims);
      if (!templates.ok()) return absl::InvalidArgumentError(StrCat("spec.model: ", templates.status().message()));
      auto train_template = BuildLlamaTrainTemplate(dims);
      if (!train_template.ok()) {
        return absl::InvalidArgumentError(StrCat("spec.model: ", train_template.status().message()));
      }

      // Enabled partitions.
      const size_t num_devices = im.gmg.accelerators().size();
      std::vector<const CandidatePartition*> enabled;
      for (const CandidatePartition& p : templates->prefill->partitions()) {
        const bool wanted = spec.partitions.empty() ||
                            std::find(spec.partitions.begin(), spec.partitions.end(), p.name) != spec.partitions.end();
        if (wanted && (static_cast<size_t>(p.num_slots) <= num_devices || !spec.partitions.empty())) {
          enabled.push_back(&p);
        }
      }
      std::vector<std::string> offered;
      for (const CandidatePartition& p : templates->prefill->partitions()) offered.push_back(p.name);
      for (const std::string& name : spec.partitions) {
        auto it = std::find_if(enabled.begin(), enabled.end(), [&](const CandidatePartition* p) { return p->name == name; });
        if (it == enabled.end()) {
          return absl::InvalidArgumentError(StrCat("spec.partitions: the model has no partition '", name,
                                                   "' (it offers: ", absl::StrJoin(offered, ", "), ")"));
        }
        if (static_cast<size_t>((*it)->num_slots) > num_devices) {
          return absl::InvalidArgumentError(StrCat("spec.partitions: '", name, "' needs ", (*it)->num_slots,
                                                   " devices but the cluster has ", num_devices));
        }
      }
      if (enabled.empty()) return absl::InvalidArgumentError("spec.partitions: no partition fits the cluster");

      // Weights: one replica per aligned device group of every enabled
      // partition. Check capacity before loading anything.
      std::vector<std::pair<DeviceId, const OpSpec*>> loads;
      std::vector<int64_t> extra(num_devices, 0);
      std::set<std::pair<uint16_t, std::string>> planned;
      int64_t weight_bytes = 0;
      std::set<std::string> seen_keys;
      for (const OpSpec& op : templates->prefill->ops()) {
        if (!op.weight_key.empty() && seen_keys.insert(op.weight_key).second) weight_bytes += op.weight_bytes.count();
      }
      for (const CandidatePartition* p : enabled) {
        const size_t groups = num_devices / static_cast<size_t>(p->num_slots);
        for (size_t g = 0; g < groups; ++g) {
          for (int op = 0; op < templates->prefill->num_ops(); ++op) {
            const OpSpec& spec_op = templates->prefill->ops()[static_cast<size_t>(op)];
            if (spec_op.weight_key.empty()) continue;
            const auto dev = static_cast<uint16_t>(g * static_cast<size_t>(p->num_slots) +
                                                   static_cast<size_t>(p->slot_of_op[static_cast<size_t>(op)]));
            if (im.gmg.HasWeights(DeviceId(dev), spec_op.weight_key)) continue;
            if (!planned.insert({dev, spec_op.weight_key}).second) continue;
            loads.emplace_back(DeviceId(dev), &spec_op);
            extra[dev] += spec_op.weight_bytes.count();
          }
        }
      }
      for (size_t d = 0; d < num_devices; ++d) {
        const DeviceId id(static_cast<uint16_t>(d));
        const int64_t cap = im.gmg.accelerators().device(id).memory.count();
        const int64_t used = im.gmg.memory(id).total().count();
        if (extra[d] > 0 && used + extra[d] > cap) {
          return absl::ResourceExhaustedError(
              StrCat("spec.model: the weights need ", Bytes(extra[d]).ToString(), " more on ",
                     im.gmg.accelerators().device(id).name, ", which has ", Bytes(cap - used).ToString(), " free"));
        }
      }

      // Real weights before anything is registered (the loader's errors name
      // the bad tensor; a failure leaves no trace).
      if (absl::Status w = im.AddModel(dims, spec.weights); !w.ok()) {
        return absl::Status(w.code(), StrCat("spec.weights: ", w.message()));
      }

      // Templates (new deployments only; a replacement keeps its templates).
      DeploymentInfo info;
      info.prefill_template = templates->prefill->name();
      info.decode_template = templates->decode->name();
      info.train_template = (*train_template)->name();
      if (existing == im.deployments.end()) {
        for (const auto& tpl : {templates->prefill, templates->decode, *train_template}) {
          auto tid = im.gmg.RegisterTemplate(tpl);
          if (!tid.ok()) return Annotate(tid.status(), "spec.name");
          for (const DeviceSpec& d : im.gmg.accelerators().devices()) im.ctx.OpKeys(d.type, tid->value());
          im.template_owner[tpl->name()] = spec.name;
        }
      }
      for (const auto& [dev, op] : loads) {
        SLICESCHED_RETURN_IF_ERROR(im.gmg.LoadWeights(dev, op->weight_key, op->weight_bytes));
      }

      SLICESCHED_RETURN_IF_ERROR(store_->PutDeployment(spec.name, spec.ToYaml()));
      SLICESCHED_ASSIGN_OR_RETURN(StoredDeployment stored, store_->GetDeployment(spec.name));
      info.spec = spec;
      for (const CandidatePartition* p : enabled) info.partitions.emplace_back(p->name, p->num_slots);
      info.weight_bytes = weight_bytes;
      info.kv_bytes_per_token = dims.KvBytesPerTokenPerLayer() * dims.layers;
      info.created_unix_ms = stored.created_unix_ms;
      im.deployments[spec.name] = info;
      spdlog::info("deployment '{}' registered: templates {} / {}, partitions [{}], {} of weights per replica",
                   spec.name, info.prefill_template, info.decode_template,
                   absl::StrJoin(info.partitions, ", ",
                                 [](std::string* out, const auto& p) { out->append(p.first); }),
                   Bytes(weight_bytes).ToString());
      return info;
    }();
  }));
  return result;
}

absl::StatusOr<std::vector<DeploymentInfo>> Master::ListDeployments() {
  std::vector<DeploymentInfo> out;
  SLICESCHED_RETURN_IF_ERROR(RunOnLoop([&] {
    for (const auto& [name, info] : impl_->deployments) out.push_back(info);
  }));
  return out;
}

absl::StatusOr<SubmitResult> Master::Submit(SubmitArgs args) {
  if (draining_.load()) return absl::FailedPreconditionError("the daemon is draining; no new instances");
  for (const auto& [sym, value] : args.bindings) {
    if (value < 1 || value > options_.max_binding_value) {
      return absl::InvalidArgumentError(StrCat("bindings[", sym, "]: ", value, " is outside 1..",
                                               options_.max_binding_value));
    }
  }
  absl::StatusOr<SubmitResult> result = absl::InternalError("not run");
  SLICESCHED_RETURN_IF_ERROR(RunOnLoop([&] {
    Impl& im = *impl_;
    result = [&]() -> absl::StatusOr<SubmitResult> {
      if (!im.template_owner.contains(args.template_name)) {
        std::vector<std::string> names;
        for (const auto& [n, d] : im.template_owner) names.push_back(n);
        std::sort(names.begin(), names.end());
        return absl::NotFoundError(StrCat("template_name: no template '", args.template_name,
                                          "' (registered: ", absl::StrJoin(names, ", "), ")"));
      }
      SLICESCHED_ASSIGN_OR_RETURN(TemplateId tid, im.gmg.templates().FindByName(args.template_name));
      const GraphTemplate* tpl = im.gmg.templates().Find(tid);
      const Timestamp now = clock_.Now();
      InstanceSpec spec;
      spec.template_id = tid;
      spec.bindings = args.bindings;
      spec.priority_class = args.priority_class;
      spec.priority = args.priority;
      spec.tenant = TenantId(args.priority_class == PriorityClass::kOffline ? kOfflineTenantBase : 0);
      spec.arrival = now;
      if (args.deadline_ms > 0) spec.deadline = now + Duration::Millis(args.deadline_ms);
      for (const auto& [name, ckpt] : args.checkpoints) {
        if (im.gmg.FindCheckpoint(CheckpointId(ckpt)) == nullptr) {
          return absl::NotFoundError(StrCat("checkpoints[", name, "]: no retained checkpoint ", ckpt));
        }
        spec.checkpoints.emplace_back(name, CheckpointId(ckpt));
      }
      spec.label = args.label;
      auto id = im.gmg.Instantiate(spec);
      if (!id.ok()) {
        const absl::StatusCode code = absl::IsNotFound(id.status()) ? absl::StatusCode::kNotFound
                                                                    : absl::StatusCode::kInvalidArgument;
        const bool about_symbols = absl::StrContains(id.status().message(), "symbol");
        return absl::Status(code, StrCat(about_symbols ? "bindings: " : "checkpoints: ", id.status().message()));
      }
      if (im.has_tokens) {
        // No token ids in a raw Submit: derive them from the instance id.
        const DeploymentInfo& dep = im.deployments.at(im.template_owner.at(args.template_name));
        int64_t batch = 1, news = 1;
        for (const auto& [sym, value] : args.bindings) {
          if (sym == "B") batch = value;
          if (sym == "S" && args.template_name == dep.prefill_template) news = value;
        }
        std::vector<int64_t> tokens(static_cast<size_t>(batch * news));
        for (size_t i = 0; i < tokens.size(); ++i) {
          tokens[i] = static_cast<int64_t>((id->value() * 7919 + i) % static_cast<uint64_t>(dep.spec.model.vocab));
        }
        if (absl::Status r = im.SetRequest(dep.spec.name, *id, tokens, batch, 0, 1, id->value()); !r.ok()) {
          (void)im.gmg.CancelInstance(*id, "its request could not be registered", now);
          return Annotate(r, "bindings");
        }
      }
      for (const auto& [name, ckpt] : args.checkpoints) im.checkpoint_used[ckpt] = now;
      Impl::Tracked t;
      t.id = *id;
      t.record = std::make_shared<InstanceRecord>(id->value());
      t.ops_total = static_cast<uint32_t>(tpl->num_ops());
      t.record->Append(InstanceUpdate{.state = InstanceState::kPending, .time = now, .ops_total = t.ops_total});
      im.live.emplace(id->value(), std::move(t));
      return SubmitResult{.instance_id = id->value(), .arrival = now};
    }();
  }));
  return result;
}

absl::StatusOr<std::shared_ptr<InstanceRecord>> Master::FindInstance(uint64_t instance_id) {
  std::shared_ptr<InstanceRecord> rec;
  SLICESCHED_RETURN_IF_ERROR(RunOnLoop([&] {
    if (auto it = impl_->live.find(instance_id); it != impl_->live.end()) {
      rec = it->second.record;
    } else if (auto f = impl_->finished.find(instance_id); f != impl_->finished.end()) {
      rec = f->second;
    }
  }));
  if (rec == nullptr) return absl::NotFoundError(StrCat("instance_id: no instance ", instance_id));
  return rec;
}

absl::StatusOr<InstanceState> Master::Cancel(uint64_t instance_id) {
  absl::StatusOr<InstanceState> result = absl::InternalError("not run");
  SLICESCHED_RETURN_IF_ERROR(RunOnLoop([&] {
    Impl& im = *impl_;
    if (auto f = im.finished.find(instance_id); f != im.finished.end()) {
      result = f->second->Last().state;
      return;
    }
    auto it = im.live.find(instance_id);
    if (it == im.live.end()) {
      result = absl::NotFoundError(StrCat("instance_id: no instance ", instance_id));
      return;
    }
    const Instance* inst = im.gmg.FindInstance(it->second.id);
    if (inst != nullptr && IsTerminalInstanceState(inst->state)) {
      result = inst->state;  // finishing; reported when retired
      return;
    }
    const absl::Status s = im.gmg.CancelInstance(it->second.id, "cancelled by the client", clock_.Now());
    result = s.ok() ? absl::StatusOr<InstanceState>(InstanceState::kCancelled) : s;
  }));
  return result;
}

// ---------------------------------------------------------------------------
// Generate
// ---------------------------------------------------------------------------

void Master::NotifyBackendEvent() {
  absl::MutexLock lock(&mu_);
  backend_event_ = true;
}

absl::StatusOr<std::shared_ptr<GenerationRecord>> Master::Generate(GenerateArgs args) {
  if (draining_.load()) return absl::FailedPreconditionError("the daemon is draining; no new requests");
  if (args.prompt.empty()) return absl::InvalidArgumentError("prompt_token_ids: at least one token is required");
  if (args.max_tokens < 1) return absl::InvalidArgumentError("max_tokens: must be at least 1");
  const int64_t total = static_cast<int64_t>(args.prompt.size()) + args.max_tokens;
  if (total > options_.max_binding_value) {
    return absl::InvalidArgumentError(StrCat("max_tokens: prompt (", args.prompt.size(), ") + max_tokens (",
                                             args.max_tokens, ") exceeds ", options_.max_binding_value, " tokens"));
  }
  if (!(args.temperature >= 0) || !(args.top_p >= 0 && args.top_p <= 1) || args.top_k < 0) {
    return absl::InvalidArgumentError("sampling: temperature must be >= 0, top_p within [0, 1] and top_k >= 0");
  }
  absl::StatusOr<std::shared_ptr<GenerationRecord>> result = absl::InternalError("not run");
  SLICESCHED_RETURN_IF_ERROR(RunOnLoop([&] {
    Impl& im = *impl_;
    result = [&]() -> absl::StatusOr<std::shared_ptr<GenerationRecord>> {
      auto dep_it = im.deployments.find(args.deployment);
      if (dep_it == im.deployments.end()) {
        return absl::NotFoundError(StrCat("deployment: no deployment '", args.deployment, "'"));
      }
      if (!im.has_tokens) {
        return absl::FailedPreconditionError(StrCat(
            "deployment: the daemon's backend (", backend_name_,
            ") computes no tokens; Generate needs devices with backend 'cpu' in a build with LibTorch"));
      }
      const DeploymentInfo& dep = dep_it->second;
      const int64_t vocab = dep.spec.model.vocab;
      for (size_t i = 0; i < args.prompt.size(); ++i) {
        if (args.prompt[i] < 0 || args.prompt[i] >= vocab) {
          return absl::InvalidArgumentError(StrCat("prompt_token_ids[", i, "]: ", args.prompt[i],
                                                   " is outside the vocabulary [0, ", vocab, ")"));
        }
      }
      // Admission: the whole KV cache must fit on some device, split over the
      // widest enabled partition.
      int max_slots = 1;
      for (const auto& [name, slots] : dep.partitions) max_slots = std::max(max_slots, slots);
      const int64_t kv_total = dep.kv_bytes_per_token * total;
      const int64_t kv_share = (kv_total + max_slots - 1) / max_slots;
      int64_t best_room = 0;
      for (const DeviceSpec& d : im.gmg.accelerators().devices()) {
        best_room = std::max(best_room, d.memory.count() - im.gmg.memory(d.id).weights.count());
      }
      if (kv_share > best_room) {
        return absl::ResourceExhaustedError(StrCat(
            "prompt_token_ids: the KV cache of ", total, " tokens (prompt + max_tokens) needs ",
            Bytes(kv_total).ToString(), " (", Bytes(kv_share).ToString(), " per device over ", max_slots,
            " devices), more than any device can hold besides its weights (", Bytes(best_room).ToString(), ")"));
      }
      SLICESCHED_ASSIGN_OR_RETURN(TemplateId pre, im.gmg.templates().FindByName(dep.prefill_template));
      SLICESCHED_ASSIGN_OR_RETURN(TemplateId dec, im.gmg.templates().FindByName(dep.decode_template));

      const Timestamp now = clock_.Now();
      const uint64_t request = im.next_request_id++;
      Impl::Generation g;
      g.id = request;
      g.deployment = dep.spec.name;
      g.decode_tpl = dec;
      g.cls = args.priority_class.value_or(dep.spec.role == DeploymentRole::kOffline ? PriorityClass::kOffline
                                                                                       : PriorityClass::kOnline);
      if (args.seed == 0) args.seed = request * 0x9E3779B97F4A7C15ull + 1;
      g.record = std::make_shared<GenerationRecord>(request, now);

      InstanceSpec spec;
      spec.template_id = pre;
      spec.bindings = {{"B", 1}, {"S", static_cast<int64_t>(args.prompt.size())}};
      spec.priority_class = g.cls;
      spec.priority = args.priority;
      spec.tenant = TenantId(g.cls == PriorityClass::kOffline ? kOfflineTenantBase : 0);
      spec.arrival = now;
      if (args.ttft_ms > 0) spec.deadline = now + Duration::Millis(args.ttft_ms);
      spec.label = args.client_tag;
      auto id = im.gmg.Instantiate(spec);
      if (!id.ok()) return Annotate(id.status(), "prompt_token_ids");
      if (absl::Status r =
              im.SetRequest(g.deployment, *id, args.prompt, 1, args.temperature, args.top_p, args.seed, args.top_k);
          !r.ok()) {
        (void)im.gmg.CancelInstance(*id, "its request could not be registered", now);
        return r;
      }
      g.args = std::move(args);
      g.current = *id;
      Impl::Tracked t;
      t.id = *id;
      t.record = std::make_shared<InstanceRecord>(id->value());
      t.ops_total = static_cast<uint32_t>(im.gmg.templates().Find(pre)->num_ops());
      t.record->Append(InstanceUpdate{.state = InstanceState::kPending, .time = now, .ops_total = t.ops_total});
      im.live.emplace(id->value(), std::move(t));
      im.step_owner[id->value()] = request;
      std::shared_ptr<GenerationRecord> record = g.record;
      im.generations.emplace(request, std::move(g));
      return record;
    }();
  }));
  return result;
}

void Master::StepRetired(uint64_t request, const RetiredInstance& r, Timestamp now) {
  Impl& im = *impl_;
  auto it = im.generations.find(request);
  if (it == im.generations.end()) return;
  Impl::Generation& g = it->second;
  auto end_request = [&](GenerationEnd end, std::string message) {
    g.record->Finish(end, std::move(message));
    im.ReleaseKv(g);
    im.generations.erase(it);
  };
  if (g.produced == 0 && r.state == InstanceState::kDone) g.kv = r.produced;
  if (r.state != InstanceState::kDone) {
    const bool cancelled = g.cancel_requested || r.state == InstanceState::kCancelled;
    end_request(cancelled ? GenerationEnd::kCancelled : GenerationEnd::kError,
                r.failure.empty() ? std::string(ToStd(InstanceStateName(r.state))) : r.failure);
    return;
  }
  std::optional<std::vector<int64_t>> tokens = im.TakeTokens(r.id);
  if (!tokens.has_value() || tokens->size() != 1) {
    end_request(GenerationEnd::kError, StrCat("step ", g.produced, " (instance ", r.id, ") reported no token"));
    return;
  }
  const int64_t token = (*tokens)[0];
  GeneratedToken out;
  out.token = token;
  out.index = g.produced++;
  out.time = now;
  if (out.index == 0 && g.first_start != Timestamp::Never()) {
    out.queue_ms = static_cast<double>((g.first_start - g.record->arrival()).nanos()) / 1e6;
  }
  const bool stop = std::find(g.args.stop_tokens.begin(), g.args.stop_tokens.end(), token) != g.args.stop_tokens.end();
  if (stop) {
    out.end = GenerationEnd::kStop;
  } else if (g.produced >= g.args.max_tokens) {
    out.end = GenerationEnd::kLength;
  }
  if (out.end == GenerationEnd::kNone && g.cancel_requested) out.end = GenerationEnd::kCancelled;
  g.record->Append(out);
  if (out.end != GenerationEnd::kNone) {
    end_request(out.end, out.end == GenerationEnd::kCancelled ? "cancelled by the client" : "");
    return;
  }
  if (g.kv.empty()) {
    end_request(GenerationEnd::kError, "the prefill retained no KV cache");
    return;
  }
  // The next step: one token on top of prompt + (produced - 1) cached ones.
  const int64_t context = static_cast<int64_t>(g.args.prompt.size()) + g.produced - 1;
  InstanceSpec spec = LlamaDecodeStep(g.decode_tpl, context, g.kv, g.cls, now);
  spec.priority = g.args.priority;
  spec.tenant = TenantId(g.cls == PriorityClass::kOffline ? kOfflineTenantBase : 0);
  spec.label = g.args.client_tag;
  if (g.args.deadline_ms > 0) spec.deadline = g.record->arrival() + Duration::Millis(g.args.deadline_ms);
  auto id = im.gmg.Instantiate(spec);
  if (!id.ok()) {
    end_request(GenerationEnd::kError, StrCat("decode step ", g.produced, ": ", id.status().message()));
    return;
  }
  const std::vector<int64_t> last = {token};
  if (absl::Status s = im.SetRequest(g.deployment, *id, last, 1, g.args.temperature, g.args.top_p,
                                     g.args.seed + g.produced, g.args.top_k);
      !s.ok()) {
    (void)im.gmg.CancelInstance(*id, "its request could not be registered", now);
    end_request(GenerationEnd::kError, std::string(ToStd(s.message())));
    return;
  }
  for (CheckpointId c : g.kv) im.checkpoint_used[c.value()] = now;
  g.current = *id;
  Impl::Tracked t;
  t.id = *id;
  t.record = std::make_shared<InstanceRecord>(id->value());
  t.ops_total = static_cast<uint32_t>(im.gmg.templates().Find(g.decode_tpl)->num_ops());
  t.record->Append(InstanceUpdate{.state = InstanceState::kPending, .time = now, .ops_total = t.ops_total});
  im.live.emplace(id->value(), std::move(t));
  im.step_owner[id->value()] = request;
}

absl::Status Master::CancelGeneration(uint64_t request_id) {
  return RunOnLoop([&] {
    Impl& im = *impl_;
    auto it = im.generations.find(request_id);
    if (it == im.generations.end()) return;
    Impl::Generation& g = it->second;
    g.cancel_requested = true;
    const Instance* inst = im.gmg.FindInstance(g.current);
    if (inst != nullptr && !IsTerminalInstanceState(inst->state)) {
      const absl::Status s = im.gmg.CancelInstance(g.current, "the client went away", clock_.Now());
      if (!s.ok()) spdlog::warn("generation {}: cancelling instance {}: {}", request_id, g.current.value(), s.ToString());
    }
  });
}

absl::StatusOr<size_t> Master::LiveGenerations() {
  size_t n = 0;
  SLICESCHED_RETURN_IF_ERROR(RunOnLoop([&] { n = impl_->generations.size(); }));
  return n;
}

// ---------------------------------------------------------------------------
// Fine-tuning
// ---------------------------------------------------------------------------

absl::StatusOr<std::shared_ptr<InstanceRecord>> Master::SubmitTrainStep(TrainStepArgs args) {
  if (draining_.load()) return absl::FailedPreconditionError("the daemon is draining; no new training steps");
  if (args.job == nullptr || args.batch == nullptr) return absl::InvalidArgumentError("job, batch: required");
  for (auto [field, v] : {std::pair<const char*, int64_t>{"rows", args.rows}, {"tokens", args.tokens},
                          {"rank", args.rank}, {"head_outputs", args.head_outputs}}) {
    if (v < 1 || v > options_.max_binding_value) {
      return absl::InvalidArgumentError(StrCat(field, ": ", v, " is outside 1..", options_.max_binding_value));
    }
  }
  if (args.devices.empty()) return absl::InvalidArgumentError("devices: at least one device is required");
  for (size_t i = 0; i < args.partners.size(); ++i) {
    if (args.partners[i] == nullptr || args.partners[i] == args.job) {
      return absl::InvalidArgumentError(StrCat("partners: ", i, " is null or the step's own job"));
    }
  }
  if (!args.partners.empty() && args.micro_index >= 0) {
    return absl::InvalidArgumentError(StrCat("micro_index: ", args.micro_index,
                                             " on a joint step; concurrent micro-batches are single-job only"));
  }
  // (The batch is complete only to the real backend; without one the step
  // is refused below: no backend runs training operators.)
  if (const RealBackendRegistration* registered = RegisteredRealBackend(); registered != nullptr) {
    SLICESCHED_RETURN_IF_ERROR(registered->check_train_step(args));
  }
  absl::StatusOr<std::shared_ptr<InstanceRecord>> result = absl::InternalError("not run");
  SLICESCHED_RETURN_IF_ERROR(RunOnLoop([&] {
    Impl& im = *impl_;
    result = [&]() -> absl::StatusOr<std::shared_ptr<InstanceRecord>> {
      auto dep = im.deployments.find(args.deployment);
      if (dep == im.deployments.end()) {
        return absl::NotFoundError(StrCat("deployment: no deployment '", args.deployment, "'"));
      }
      if (im.real == nullptr) {
        return absl::FailedPreconditionError(StrCat(
            "deployment: the daemon's backend (", backend_name_,
            ") runs no real operators; fine-tuning needs devices with backend 'cpu' in a build with LibTorch"));
      }
      const size_t n = im.gmg.accelerators().size();
      std::vector<DeviceId> allowed;
      for (uint32_t d : args.devices) {
        if (d >= n) return absl::InvalidArgumentError(StrCat("devices: ", d, " is not a device (the cluster has ", n, ")"));
        allowed.emplace_back(static_cast<uint16_t>(d));
      }
      SLICESCHED_ASSIGN_OR_RETURN(TemplateId tid, im.gmg.templates().FindByName(dep->second.train_template));
      const Timestamp now = clock_.Now();
      InstanceSpec spec = LlamaTrainStep(tid, args.rows, args.tokens, args.rank, args.head_outputs,
                                         PriorityClass::kOffline, now,
                                         1 + static_cast<int64_t>(args.partners.size()));
      spec.priority = args.priority;
      spec.tenant = TenantId(kOfflineTenantBase);
      spec.label = args.label;
      spec.allowed_devices = std::move(allowed);
      auto id = im.gmg.Instantiate(spec);
      if (!id.ok()) return Annotate(id.status(), "train step");
      if (absl::Status r = im.real->SetTrainRequest(args, *id); !r.ok()) {
        (void)im.gmg.CancelInstance(*id, "its training request could not be registered", now);
        return r;
      }
      Impl::Tracked t;
      t.id = *id;
      t.record = std::make_shared<InstanceRecord>(id->value());
      t.ops_total = static_cast<uint32_t>(im.gmg.templates().Find(tid)->num_ops());
      t.record->Append(InstanceUpdate{.state = InstanceState::kPending, .time = now, .ops_total = t.ops_total});
      std::shared_ptr<InstanceRecord> record = t.record;
      im.live.emplace(id->value(), std::move(t));
      return record;
    }();
  }));
  return result;
}

absl::StatusOr<std::shared_ptr<const executor::LlamaWeights>> Master::BackboneWeights(const std::string& deployment) {
  absl::StatusOr<std::shared_ptr<const executor::LlamaWeights>> result = absl::InternalError("not run");
  SLICESCHED_RETURN_IF_ERROR(RunOnLoop([&] {
    Impl& im = *impl_;
    if (!im.deployments.contains(deployment)) {
      result = absl::NotFoundError(StrCat("deployment: no deployment '", deployment, "'"));
      return;
    }
    if (im.real != nullptr) {
      std::shared_ptr<const executor::LlamaWeights> w = im.real->Weights(deployment);
      result = w != nullptr ? absl::StatusOr<std::shared_ptr<const executor::LlamaWeights>>(std::move(w))
                            : absl::NotFoundError(StrCat("deployment: '", deployment, "' has no loaded weights"));
      return;
    }
    result = absl::FailedPreconditionError(StrCat("deployment: the daemon's backend (", backend_name_,
                                                  ") holds no real weights"));
  }));
  return result;
}

// ---------------------------------------------------------------------------
// Admin
// ---------------------------------------------------------------------------

namespace {

std::string BackendUsed(const DeviceSpec& d, bool real) {
  if (real) return "cpu (LibTorch)";
  if (d.backend == DeviceBackend::kVirtual) return "virtual";
  return StrCat("virtual (configured: ", DeviceBackendName(d.backend), ")");
}

}  // namespace

absl::StatusOr<MasterStatus> Master::Status() {
  MasterStatus st;
  SLICESCHED_RETURN_IF_ERROR(RunOnLoop([&] {
    Impl& im = *impl_;
    st.version = options_.version;
    st.started_unix_ms = started_unix_ms_;
    st.uptime_ms = clock_.Now().nanos() / 1000000;
    st.num_devices = static_cast<uint32_t>(im.gmg.accelerators().size());
    for (const auto& [name, d] : im.deployments) st.deployments.push_back(name);
    st.live_instances = im.gmg.num_instances();
    for (const auto& [id, inst] : im.gmg.instances()) {
      const bool queued = std::all_of(inst->nodes.begin(), inst->nodes.end(),
                                      [](const OpNode& n) { return n.state == NodeState::kUnscheduled; });
      if (!queued) continue;
      (inst->spec.priority_class == PriorityClass::kOnline ? st.queued_online : st.queued_offline) += 1;
    }
    st.policy = std::string(im.scheduler.name());
    st.backend = backend_name_;
    st.state_dir = config_.state_dir;
    st.calibration = im.calibration.View();
    for (const DeviceSpec& d : im.gmg.accelerators().devices()) {
      st.device_activity.push_back({.name = d.name,
                                    .operators = im.ops_done[d.id.value()],
                                    .busy_seconds = static_cast<double>(im.busy_ns[d.id.value()]) / 1e9});
    }
    if (!draining_.load()) {
      st.state = ServingStateKind::kServing;
    } else {
      st.state = im.live.empty() ? ServingStateKind::kDrained : ServingStateKind::kDraining;
    }
  }));
  return st;
}

absl::StatusOr<std::vector<DeviceInfo>> Master::Devices() {
  std::vector<DeviceInfo> out;
  SLICESCHED_RETURN_IF_ERROR(RunOnLoop([&] {
    Impl& im = *impl_;
    const Timestamp now = clock_.Now();
    for (const DeviceSpec& d : im.gmg.accelerators().devices()) {
      DeviceInfo info;
      info.spec = d;
      info.backend_used = BackendUsed(d, im.has_tokens);
      info.memory = im.gmg.memory(d.id);
      info.queue_length = static_cast<uint32_t>(std::max(0, im.gmg.outstanding_compute(d.id)));
      info.running_node = im.gmg.running_compute(d.id).valid() ? im.gmg.running_compute(d.id).value() : 0;
      if (!im.busy_samples.empty()) {
        const Impl::BusySample& b = im.busy_samples.front();
        const int64_t span = now.nanos() - b.time.nanos();
        const int64_t busy = im.busy_ns[d.id.value()] - b.busy_ns[d.id.value()];
        const int64_t offline = im.busy_offline_ns[d.id.value()] - b.busy_offline_ns[d.id.value()];
        if (span > 0) {
          info.busy_fraction = std::clamp(static_cast<double>(busy) / static_cast<double>(span), 0.0, 1.0);
          info.busy_fraction_offline =
              std::clamp(static_cast<double>(offline) / static_cast<double>(span), 0.0, info.busy_fraction);
        }
      }
      out.push_back(std::move(info));
    }
  }));
  return out;
}

absl::StatusOr<GmgView> Master::DumpGmg() {
  SLICESCHED_ASSIGN_OR_RETURN(std::vector<DeviceInfo> devices, Devices());
  GmgView view;
  view.devices = std::move(devices);
  SLICESCHED_RETURN_IF_ERROR(RunOnLoop([&] {
    Impl& im = *impl_;
    im.gmg.SnapshotInto(clock_.Now(), &view.snapshot);
    for (const auto& tpl : im.gmg.templates().all()) {
      auto id = im.gmg.templates().FindByName(tpl->name());
      if (!id.ok()) continue;
      if (view.template_names.size() <= id->value()) view.template_names.resize(id->value() + 1);
      view.template_names[id->value()] = tpl->name();
    }
    for (const GmgSnapshot::Node& sn : view.snapshot.nodes) {
      GmgView::NodeExtra extra;
      const OpNode* node = im.gmg.FindNode(NodeId(sn.id));
      if (node != nullptr) {
        extra.kind = std::string(ToStd(OpKindName(node->kind)));
        extra.end = node->times.end;
        extra.predicted_start = node->times.predicted_start;
        extra.op = "transfer";
        if (node->op_index >= 0) {
          const Instance* inst = im.gmg.FindInstance(node->instance);
          if (inst != nullptr && inst->tpl != nullptr) {
            extra.op = inst->tpl->ops()[static_cast<size_t>(node->op_index)].name;
          }
        }
      }
      view.nodes.push_back(std::move(extra));
    }
    for (const GmgSnapshot::Instance& si : view.snapshot.instances) {
      const Instance* inst = im.gmg.FindInstance(InstanceId(si.id));
      GmgView::InstanceExtra extra;
      if (inst != nullptr) {
        extra.state = std::string(ToStd(InstanceStateName(inst->state)));
        extra.label = inst->spec.label;
      }
      view.instances.push_back(std::move(extra));
    }
  }));
  return view;
}

absl::StatusOr<EstimatorView> Master::Estimators() {
  EstimatorView v;
  SLICESCHED_RETURN_IF_ERROR(RunOnLoop([&] {
    v.ops = impl_->ops.Stats();
    v.transfers = impl_->transfers.Stats();
  }));
  return v;
}

absl::Status Master::SaveEstimators() {
  std::vector<EstimatorSnapshot> snaps;
  SLICESCHED_RETURN_IF_ERROR(RunOnLoop([&] { snaps = impl_->LearnedState(); }));
  return store_->PutEstimators(snaps);
}

absl::StatusOr<DrainResult> Master::Drain(bool wait, absl::Duration timeout) {
  if (!draining_.exchange(true)) spdlog::info("draining: no new deployments or instances are admitted");
  const absl::Time deadline = absl::Now() + timeout;
  DrainResult r;
  while (true) {
    SLICESCHED_RETURN_IF_ERROR(RunOnLoop([&] { r.remaining_instances = impl_->live.size(); }));
    if (r.remaining_instances == 0 || !wait || absl::Now() >= deadline) break;
    // Bounded polling of the loop; completions arrive in real time.
    absl::SleepFor(std::min(absl::Milliseconds(10), deadline - absl::Now()));
  }
  if (r.remaining_instances == 0) {
    r.state = ServingStateKind::kDrained;
    SLICESCHED_RETURN_IF_ERROR(SaveEstimators());
    spdlog::info("drained; estimator state saved to {}", store_->path());
  } else {
    r.state = ServingStateKind::kDraining;
  }
  return r;
}

// ---------------------------------------------------------------------------
// Observability (Timeline, Metrics)
// ---------------------------------------------------------------------------

double Master::PredictedNs(bool transfer, DeviceId device, DeviceId dst, TemplateId tpl, int op,
                           std::span<const int64_t> attrs, Bytes bytes, bool overlapped) {
  Impl& im = *impl_;
  if (transfer) {
    return im.transfers.PredictLinkNs(device, dst, bytes.count()) *
           (overlapped ? im.calibration.transfer_overlap_factor() : 1.0);
  }
  const int key = im.ctx.OpKey(im.gmg.accelerators().device(device).type, tpl.value(), op);
  return im.ops.PredictNs(key, attrs) * im.calibration.device_factor(device) *
         (overlapped ? im.calibration.overlap_factor() : 1.0);
}

TimelineEntry Master::TimelineEntryOf(const Feedback& f, bool* class_known) {
  Impl& im = *impl_;
  const bool transfer = f.kind == Feedback::Kind::kTransfer;
  TimelineEntry e;
  e.node_id = f.node.value();
  e.instance_id = f.instance.value();
  e.device = f.device.value();
  e.dst_device = transfer ? f.dst.value() : -1;
  e.start = f.start;
  e.end = f.end;
  e.name = "transfer";
  if (!transfer) {
    const GraphTemplate* tpl = im.gmg.templates().Find(f.tpl);
    e.name = tpl != nullptr && f.op >= 0 && f.op < tpl->num_ops() ? tpl->ops()[static_cast<size_t>(f.op)].name
                                                                    : StrCat("op", f.op);
  }
  const double predicted = PredictedNs(transfer, f.device, f.dst, f.tpl, f.op, f.attrs, f.bytes, f.overlapped);
  if (std::isfinite(predicted) && predicted >= 0) {
    e.predicted_end = f.start + Duration::Nanos(static_cast<int64_t>(predicted));
  }
  const Instance* inst = im.gmg.FindInstance(f.instance);
  *class_known = inst != nullptr;
  if (inst != nullptr) e.priority_class = inst->spec.priority_class;
  return e;
}

void Master::ObserveRetired(const RetiredInstance& r) {
  MasterObserved& o = *impl_->obs;
  o.retired_class[r.id.value()] = r.priority_class;
  MetricsSnapshot::ClassStats& c = o.classes[r.priority_class == PriorityClass::kOffline ? 1 : 0];
  const bool done = r.state == InstanceState::kDone;
  if (done) {
    ++c.done;
    c.latency.Observe((r.finished - r.arrival).ToSecondsF());
  } else if (r.state == InstanceState::kFailed) {
    ++c.failed;
  } else {
    ++c.cancelled;
  }
  if (r.priority_class == PriorityClass::kOnline && r.deadline != Timestamp::Never() &&
      r.deadline != Timestamp::Infinite()) {
    ++o.slo_total;
    if (done && r.finished <= r.deadline) ++o.slo_met;
  }
}

void Master::FlushTimeline() {
  MasterObserved& o = *impl_->obs;
  for (auto& [e, known] : o.pending) {
    if (!known) {
      auto it = o.retired_class.find(e.instance_id);
      if (it != o.retired_class.end()) e.priority_class = it->second;
    }
    o.timeline.Add(std::move(e));
  }
  o.pending.clear();
  o.retired_class.clear();
}

void Master::ObserveSchedule(const ScheduleStats* stats, std::chrono::steady_clock::duration took) {
  MasterObserved& o = *impl_->obs;
  o.schedule_call.Observe(std::chrono::duration<double>(took).count());
  if (stats != nullptr) {
    o.schedule_rounds += static_cast<uint64_t>(stats->rounds);
    o.whatif_runs += static_cast<uint64_t>(stats->whatif_runs);
    o.simulated_ops += static_cast<uint64_t>(stats->simulated_ops);
    o.whatif_seconds += stats->whatif_seconds;
    o.issued_nodes += static_cast<uint64_t>(stats->issued_nodes);
  }
  for (double us : impl_->scheduler.round_latency_us()) o.schedule_round.Observe(us / 1e6);
  impl_->scheduler.ClearRoundRecords();  // observed; a daemon must not keep them forever
}

absl::StatusOr<TimelineView> Master::Timeline(Timestamp since, Timestamp until, size_t max_events) {
  if (max_events == 0) return absl::InvalidArgumentError("max_events: must be at least 1");
  TimelineView view;
  SLICESCHED_RETURN_IF_ERROR(RunOnLoop([&] {
    Impl& im = *impl_;
    view.now = clock_.Now();
    const Timestamp end = std::min(until, view.now);
    std::vector<TimelineEntry> running;
    for (const DeviceSpec& d : im.gmg.accelerators().devices()) {
      view.device_names.push_back(d.name);
      for (const NodeId id : {im.gmg.running_compute(d.id), im.gmg.active_transfer(d.id)}) {
        if (!id.valid()) continue;
        const OpNode* n = im.gmg.FindNode(id);
        if (n == nullptr || n->state != NodeState::kRunning) continue;
        const bool transfer = n->kind == OpKind::kTransfer;
        if (transfer && n->device != d.id) continue;  // listed once, at its source
        const Instance* inst = im.gmg.FindInstance(n->instance);
        TimelineEntry e;
        e.node_id = id.value();
        e.instance_id = n->instance.value();
        e.device = n->device.value();
        e.start = n->times.start;
        e.name = "transfer";
        if (inst != nullptr) e.priority_class = inst->spec.priority_class;
        Bytes bytes;
        TemplateId tpl;
        if (transfer) {
          e.dst_device = n->dst_device.value();
          const OpNode* producer = im.gmg.FindNode(n->src_node);
          if (producer != nullptr && static_cast<size_t>(n->src_output) < producer->outputs.size()) {
            bytes = producer->outputs[static_cast<size_t>(n->src_output)].bytes;
          }
        } else if (inst != nullptr && inst->tpl != nullptr) {
          e.name = inst->tpl->ops()[static_cast<size_t>(n->op_index)].name;
          tpl = inst->tpl->id();
        }
        const bool overlapped = transfer ? im.gmg.running_compute(n->device).valid()
                                         : im.gmg.active_transfer(n->device).valid();
        const double predicted =
            transfer || tpl.valid()
                ? PredictedNs(transfer, n->device, n->dst_device, tpl, n->op_index, n->attrs, bytes, overlapped)
                : -1;
        if (std::isfinite(predicted) && predicted >= 0) {
          e.predicted_end = e.start + Duration::Nanos(static_cast<int64_t>(predicted));
        }
        running.push_back(std::move(e));
      }
    }
    view.result = im.obs->timeline.Query(since, end, max_events, running);
  }));
  return view;
}

absl::StatusOr<MetricsSnapshot> Master::Metrics() {
  SLICESCHED_ASSIGN_OR_RETURN(std::vector<DeviceInfo> devices, Devices());
  SLICESCHED_ASSIGN_OR_RETURN(MasterStatus status, Status());
  MetricsSnapshot m;
  m.version = status.version;
  m.uptime_seconds = static_cast<double>(status.uptime_ms) / 1000.0;
  m.live_instances = status.live_instances;
  m.queued_online = status.queued_online;
  m.queued_offline = status.queued_offline;
  SLICESCHED_RETURN_IF_ERROR(RunOnLoop([&] {
    Impl& im = *impl_;
    const MasterObserved& o = *im.obs;
    for (const DeviceInfo& d : devices) {
      MetricsSnapshot::Device md;
      md.name = d.spec.name;
      md.type = d.spec.type;
      md.busy_ratio = d.busy_fraction;
      md.busy_seconds_total = static_cast<double>(im.busy_ns[d.spec.id.value()]) / 1e9;
      md.queue_length = d.queue_length;
      md.memory_used_bytes = d.memory.total().count();
      md.memory_capacity_bytes = d.spec.memory.count();
      m.devices.push_back(std::move(md));
    }
    for (int c = 0; c < 2; ++c) m.classes[c] = o.classes[c];
    m.slo_total = o.slo_total;
    m.slo_met = o.slo_met;
    m.op_mape_pct = im.learner.op_error().mape_pct();
    m.op_observations = static_cast<uint64_t>(im.learner.op_error().n);
    m.transfer_mape_pct = im.learner.transfer_error().mape_pct();
    m.transfer_observations = static_cast<uint64_t>(im.learner.transfer_error().n);
    for (const OpEstimator::KeyStats& k : im.ops.Stats()) {
      if (k.samples == 0) continue;
      m.op_keys.push_back({.device_type = k.device_type,
                           .op_key = StrCat(k.template_name, ":", k.op_name),
                           .mape_pct = k.mape_pct,
                           .samples = static_cast<uint64_t>(k.samples)});
    }
    m.schedule_call = o.schedule_call;
    m.schedule_round = o.schedule_round;
    m.schedule_rounds = o.schedule_rounds;
    m.whatif_runs = o.whatif_runs;
    m.simulated_ops = o.simulated_ops;
    m.whatif_seconds = o.whatif_seconds;
    m.issued_nodes = o.issued_nodes;
  }));
  return m;
}

}  // namespace slicesched
