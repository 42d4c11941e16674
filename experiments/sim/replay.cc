#include "slicesched/experiments/replay.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "slicesched/cluster/ground_truth.h"
#include "slicesched/cluster/virtual_cluster.h"
#include "slicesched/common/option_checks.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "slicesched/common/thread_pool.h"
#include "slicesched/experiments/gmg_demo.h"
#include "slicesched/gmg/llama.h"
#include "slicesched/sched/baselines.h"
#include "slicesched/sched/learner.h"
#include "slicesched/sched/slice_scheduler.h"
#include "slicesched/workload/trace.h"

namespace slicesched {

std::vector<std::string> ReplayPolicyNames() {
  return {"Static-Online", "Full-Share", "Subset-Share", "Dual-Share", "SliceScheduler"};
}

namespace {

constexpr double kOfflineRatePerS = 1.0;
constexpr int64_t kOfflineInput = 2048;
constexpr int64_t kOfflineOutput = 15;

struct TaggedRequest {
  double arrival_s;
  int64_t context, output;
  int instance;  // online model instance k
};

struct Conversation {
  bool online = true;
  int64_t arrival_ns = 0;
  int64_t context = 0;
  int64_t remaining = 0;  // decode steps to go
  std::vector<CheckpointId> kv;
};

std::unique_ptr<PlacementPolicy> MakePolicy(const std::string& name) {
  if (name == "Static-Online") return std::make_unique<PinnedPolicy>(PinnedPolicy::StaticOnline());
  if (name == "Full-Share") return std::make_unique<PinnedPolicy>(PinnedPolicy::FullShare());
  if (name == "Subset-Share") return std::make_unique<PinnedPolicy>(PinnedPolicy::SubsetShare());
  if (name == "Dual-Share") return std::make_unique<PinnedPolicy>(PinnedPolicy::DualShare());
  if (name == "SliceScheduler") return std::make_unique<SliceScheduler>();
  return nullptr;
}

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t k = std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())));
  return v[k];
}

class Progress {
 public:
  Progress(bool enabled, std::string label, double total_s)
      : on_(enabled && isatty(2)), label_(std::move(label)), total_(total_s) {}
  void Update(double t_s) {
    if (!on_) return;
    const int pct = static_cast<int>(100.0 * std::min(1.0, t_s / total_));
    if (pct == last_) return;
    last_ = pct;
    const int bar = pct * 30 / 100;
    std::fprintf(stderr, "\r%-15s [%.*s%.*s] %3d%%  t=%.0f/%.0f s", label_.c_str(), bar,
                 "##############################", 30 - bar, "..............................", pct, t_s, total_);
    std::fflush(stderr);
  }
  void Done(double wall_s) {
    if (on_) std::fprintf(stderr, "\r%-15s [##############################] 100%%  %.1f s wall\n", label_.c_str(), wall_s);
  }

 private:
  bool on_;
  std::string label_;
  double total_;
  int last_ = -1;
};

struct RunOutput {
  PolicyResult result;
  std::vector<double> ttft_ms;                       // online, first token reached
  std::vector<double> waiting_ms;                    // online, no first token by the end
  std::vector<std::vector<BusyInterval>> busy;       // per device
};

absl::StatusOr<RunOutput> RunPolicy(const std::string& name, const std::vector<TaggedRequest>& online,
                                    const ReplayOptions& o) {
  RunOutput out;
  const auto wall0 = std::chrono::steady_clock::now();
  std::unique_ptr<PlacementPolicy> policy = MakePolicy(name);
  if (policy == nullptr) return absl::InvalidArgumentError(StrCat("unknown policy '", name, "'"));

  SLICESCHED_ASSIGN_OR_RETURN(GmgDemoConfig cfg, DefaultGmgDemoConfig());
  GlobalMappingGraph g(cfg.cluster);
  const size_t devices = g.accelerators().size();
  SLICESCHED_ASSIGN_OR_RETURN(LlamaTemplates t8, BuildLlamaTemplates(cfg.model));
  LlamaDims dims4 = cfg.model;
  dims4.name = cfg.model.name + "-f4";
  dims4.fusion = 4;
  SLICESCHED_ASSIGN_OR_RETURN(LlamaTemplates t4, BuildLlamaTemplates(dims4));
  SLICESCHED_ASSIGN_OR_RETURN(TemplateId pre8, g.RegisterTemplate(t8.prefill));
  SLICESCHED_ASSIGN_OR_RETURN(TemplateId dec8, g.RegisterTemplate(t8.decode));
  SLICESCHED_ASSIGN_OR_RETURN(TemplateId pre4, g.RegisterTemplate(t4.prefill));
  SLICESCHED_ASSIGN_OR_RETURN(TemplateId dec4, g.RegisterTemplate(t4.decode));
  const bool full_share = name == "Full-Share";
  // Weights: the whole model resident on every device (16 GB of 64 GB);
  // Full-Share's offline instance uses the 4-layer operators.
  for (size_t d = 0; d < devices; ++d) {
    for (const auto* tpl : {t8.prefill.get(), full_share ? t4.prefill.get() : nullptr}) {
      if (tpl == nullptr) continue;
      for (const OpSpec& op : tpl->ops()) {
        if (op.weight_key.empty()) continue;
        SLICESCHED_RETURN_IF_ERROR(g.LoadWeights(DeviceId(static_cast<uint16_t>(d)), op.weight_key, op.weight_bytes));
      }
    }
  }
  const TemplateId off_pre = full_share ? pre4 : pre8;
  const TemplateId off_dec = full_share ? dec4 : dec8;

  GroundTruthModel truth(g.accelerators(), GroundTruthOptions{.seed = o.seed});
  VirtualCluster cluster(&g, &truth, o.seed);
  OpEstimator ops;
  TransferEstimator transfers(g.accelerators());
  RuntimeCalibration calibration(devices);
  SimContext ctx(&g.templates(), &ops, &transfers);
  ctx.set_calibration(&calibration);
  OnlineLearner learner(&g, &ctx, &ops, &transfers, &calibration);
  const int threads = o.threads > 0 ? o.threads : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) - 1);
  ThreadPool pool(threads);
  SchedulerEnv env{&g, &cluster, &ctx, &pool};

  absl::flat_hash_map<uint64_t, Conversation> conv;  // by live instance id
  out.busy.assign(devices, {});
  const int64_t end_ns = static_cast<int64_t>(o.minutes * 60e9);
  int64_t offline_next_ns = static_cast<int64_t>(1e9 / kOfflineRatePerS);
  int64_t offline_queued = 0, offline_tenant = 0;
  int64_t tokens_online = 0, tokens_offline = 0;
  size_t next_req = 0;
  std::vector<Feedback> feedback;
  Progress progress(o.progress, name, o.minutes * 60);

  auto start_decode = [&](Conversation c, TemplateId dec, uint32_t tenant, Timestamp now) -> absl::Status {
    InstanceSpec ds =
        LlamaDecodeStep(dec, c.context, c.kv, c.online ? PriorityClass::kOnline : PriorityClass::kOffline, now);
    ds.tenant = TenantId(tenant);
    SLICESCHED_ASSIGN_OR_RETURN(InstanceId id, g.Instantiate(ds));
    conv[id.value()] = std::move(c);
    return absl::OkStatus();
  };

  while (true) {
    const int64_t arrival = next_req < online.size() ? static_cast<int64_t>(online[next_req].arrival_s * 1e9)
                                                     : std::numeric_limits<int64_t>::max();
    const int64_t offline_arrival = policy->accepts_offline() ? offline_next_ns : std::numeric_limits<int64_t>::max();
    const int64_t next = std::min({arrival, offline_arrival, cluster.NextEventTime().nanos()});
    if (next > end_ns) break;
    const Timestamp now = Timestamp::FromNanos(next);
    feedback.clear();
    SLICESCHED_RETURN_IF_ERROR(cluster.AdvanceTo(now, &feedback));
    for (const Feedback& f : feedback) {
      learner.Apply(f, false);
      if (f.kind == Feedback::Kind::kOp) out.busy[f.device.value()].push_back({f.start.nanos(), f.end.nanos()});
    }
    for (const RetiredInstance& r : g.TakeRetired()) {
      auto it = conv.find(r.id.value());
      if (it == conv.end()) continue;
      Conversation c = std::move(it->second);
      conv.erase(it);
      if (r.state != InstanceState::kDone) continue;
      const bool prefill = r.template_id == pre8 || r.template_id == pre4;
      if (prefill) {
        c.kv = r.produced;
        if (c.online) out.ttft_ms.push_back(static_cast<double>(r.finished.nanos() - c.arrival_ns) / 1e6);
      } else {
        ++c.context;
      }
      (c.online ? tokens_online : tokens_offline) += 1;
      if (c.remaining > 0) {
        --c.remaining;
        const bool on = c.online;
        SLICESCHED_RETURN_IF_ERROR(start_decode(std::move(c), on ? dec8 : off_dec,
                                                on ? 0 : kOfflineTenantBase, now));
      } else {
        for (CheckpointId k : c.kv) SLICESCHED_RETURN_IF_ERROR(g.ReleaseCheckpoint(k));
        (c.online ? out.result.online_completed : out.result.offline_completed) += 1;
      }
    }
    while (next_req < online.size() && static_cast<int64_t>(online[next_req].arrival_s * 1e9) <= next) {
      const TaggedRequest& req = online[next_req++];
      InstanceSpec ps;
      ps.template_id = pre8;
      ps.bindings = {{"B", 1}, {"S", std::max<int64_t>(1, req.context)}};
      ps.priority_class = PriorityClass::kOnline;
      ps.tenant = TenantId(static_cast<uint32_t>(req.instance));
      ps.arrival = now;
      SLICESCHED_ASSIGN_OR_RETURN(InstanceId id, g.Instantiate(ps));
      Conversation c;
      c.online = true;
      c.arrival_ns = next;
      c.context = std::max<int64_t>(1, req.context);
      c.remaining = std::max<int64_t>(0, req.output - 1);
      conv[id.value()] = std::move(c);
      ++out.result.online_requests;
    }
    while (policy->accepts_offline() && offline_next_ns <= next) {
      ++offline_queued;
      offline_next_ns += static_cast<int64_t>(1e9 / kOfflineRatePerS);
    }
    for (int admit = policy->OfflineAdmissions(env, now); admit > 0 && offline_queued > 0; --admit) {
      InstanceSpec ps;
      ps.template_id = off_pre;
      ps.bindings = {{"B", 1}, {"S", kOfflineInput}};
      ps.priority_class = PriorityClass::kOffline;
      ps.tenant = TenantId(static_cast<uint32_t>(kOfflineTenantBase + (offline_tenant++ % 2)));
      ps.arrival = now;
      SLICESCHED_ASSIGN_OR_RETURN(InstanceId id, g.Instantiate(ps));
      Conversation c;
      c.online = false;
      c.arrival_ns = next;
      c.context = kOfflineInput;
      c.remaining = kOfflineOutput - 1;
      conv[id.value()] = std::move(c);
      --offline_queued;
    }
    if (!g.unscheduled_frontier().empty()) {
      SLICESCHED_ASSIGN_OR_RETURN(ScheduleStats st, policy->Schedule(env, now));
      out.result.rounds += st.rounds;
    }
    SLICESCHED_RETURN_IF_ERROR(cluster.Dispatch(now));
    progress.Update(static_cast<double>(next) / 1e9);
  }
  // Online requests still without a first token at the end.
  for (const auto& [id, c] : conv) {
    const Instance* inst = g.FindInstance(InstanceId(id));
    if (c.online && inst != nullptr && inst->tpl->checkpoint_inputs().empty()) {
      out.waiting_ms.push_back(static_cast<double>(end_ns - c.arrival_ns) / 1e6);
    }
  }
  const double span_s = static_cast<double>(end_ns) / 1e9;
  PolicyResult& r = out.result;
  r.policy = name;
  r.online_req_per_s = static_cast<double>(r.online_completed) / span_s;
  r.req_per_s = static_cast<double>(r.online_completed + r.offline_completed) / span_s;
  r.tok_per_s = static_cast<double>(tokens_online + tokens_offline) / span_s;
  r.offline_tok_per_s = static_cast<double>(tokens_offline) / span_s;
  r.ttft_p50_ms = Percentile(out.ttft_ms, 0.5);
  r.ttft_p99_ms = Percentile(out.ttft_ms, 0.99);
  double busy_ns = 0;
  for (auto& dev : out.busy) {
    for (const BusyInterval& b : dev) busy_ns += static_cast<double>(std::min(b.end_ns, end_ns) - b.start_ns);
  }
  r.gpu_util = busy_ns / (static_cast<double>(end_ns) * static_cast<double>(devices));
  if (auto* s = dynamic_cast<SliceScheduler*>(policy.get())) {
    std::vector<double> lat = s->round_latency_us();
    r.round_p50_us = Percentile(lat, 0.5);
    r.round_p99_us = Percentile(lat, 0.99);
    double sum = 0;
    for (int c : s->round_candidates()) sum += c;
    r.mean_candidates = s->round_candidates().empty() ? 0 : sum / static_cast<double>(s->round_candidates().size());
  }
  r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  progress.Done(r.wall_s);
  return out;
}

double Attainment(const RunOutput& run, double slo_ms) {
  int64_t ok = 0, total = 0;
  for (double t : run.ttft_ms) {
    ++total;
    ok += t <= slo_ms;
  }
  for (double w : run.waiting_ms) {
    if (w > slo_ms) ++total;  // already late; still-young requests are not judged
  }
  return total == 0 ? 1.0 : static_cast<double>(ok) / static_cast<double>(total);
}

absl::Status WriteSummary(const std::string& dir, const ReplayResult& r) {
  std::ofstream f(dir + "/summary.csv");
  if (!f) return absl::InvalidArgumentError(StrCat("cannot write ", dir, "/summary.csv"));
  f << "policy,req_per_s,tok_per_s,slo_attainment,gpu_util,ttft_p50_ms,ttft_p99_ms,online_req_per_s,offline_tok_per_s\n";
  for (const PolicyResult& p : r.policies) {
    f << absl::StrFormat("%s,%.4f,%.4f,%.4f,%.4f,%.1f,%.1f,%.4f,%.4f\n", p.policy, p.req_per_s, p.tok_per_s,
                         p.slo_attainment, p.gpu_util, p.ttft_p50_ms, p.ttft_p99_ms, p.online_req_per_s,
                         p.offline_tok_per_s);
  }
  return f ? absl::OkStatus() : absl::InternalError("writing summary.csv failed");
}

}  // namespace

absl::Status ReplayOptions::Validate() const {
  for (const auto& [flag, v] : {std::pair{"--minutes", minutes}, std::pair{"--load-scale", load_scale}}) {
    if (!(v > 0) || !std::isfinite(v)) return OptionOutOfRange(flag, "> 0", v);
  }
  if (threads < 0 || threads > 1024) return OptionOutOfRange("--threads", "in 0..1024", threads);
  if (policy != "all" && MakePolicy(policy) == nullptr) {
    return OptionOutOfRange("--policy", "Static-Online, Full-Share, Subset-Share, Dual-Share, SliceScheduler or all",
                            policy);
  }
  return absl::OkStatus();
}

absl::StatusOr<ReplayResult> RunReplay(const ReplayOptions& o) {
  SLICESCHED_RETURN_IF_ERROR(o.Validate());
  const std::vector<std::string> names = o.policy == "all" ? ReplayPolicyNames() : std::vector<std::string>{o.policy};
  ReplayResult result;
  result.load_scale = o.load_scale;
  // Workload: one day of arrivals, four shifted copies.
  std::vector<Request> base;
  if (o.trace.empty()) {
    base = GenerateBuiltInWorkload(BuiltInWorkloadModel{}, 3436.0, o.seed);
    result.workload = "built-in (derived from the Azure code trace)";
  } else {
    SLICESCHED_ASSIGN_OR_RETURN(base, LoadAzureLlmTrace(o.trace));
    result.workload = o.trace;
  }
  std::vector<TaggedRequest> online;
  for (int k = 0; k < 4; ++k) {
    // Load scale < 1 thins the requests (the timeline stays); > 1 compresses time.
    std::vector<Request> shifted = CyclicShift(base, k / 4.0);
    shifted = o.load_scale <= 1.0 ? Thin(shifted, o.load_scale, o.seed * 4 + static_cast<uint64_t>(k))
                                  : ScaleLoad(shifted, o.load_scale);
    for (const Request& r : Window(shifted, 0, o.minutes * 60.0)) {
      online.push_back({r.arrival_s, r.context_tokens, r.generated_tokens, k});
    }
  }
  std::stable_sort(online.begin(), online.end(),
                   [](const TaggedRequest& a, const TaggedRequest& b) { return a.arrival_s < b.arrival_s; });

  // Static-Online first: it defines the SLO and the idle-slice figures.
  SLICESCHED_ASSIGN_OR_RETURN(RunOutput reference, RunPolicy("Static-Online", online, o));
  result.slo_ttft_ms = Percentile(reference.ttft_ms, 0.9);
  const int64_t end_ns = static_cast<int64_t>(o.minutes * 60e9);
  const std::vector<IdleSlice> slices = IdleSlices(reference.busy, 0, end_ns);
  result.idle = SummarizeIdleSlices(slices, o.minutes * 60.0, static_cast<int>(reference.busy.size()));
  std::vector<std::vector<BusyInterval>> per_instance(reference.busy.size() / 2);
  for (size_t d = 0; d < reference.busy.size(); ++d) {
    auto& dst = per_instance[d / 2];
    dst.insert(dst.end(), reference.busy[d].begin(), reference.busy[d].end());
  }
  result.overlap = ComputeIdleOverlap(per_instance, 0, end_ns);

  for (const std::string& name : names) {
    RunOutput run;
    if (name == "Static-Online") {
      run = reference;
    } else {
      SLICESCHED_ASSIGN_OR_RETURN(run, RunPolicy(name, online, o));
    }
    run.result.slo_attainment = Attainment(run, result.slo_ttft_ms);
    result.policies.push_back(run.result);
  }

  if (!o.out_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(o.out_dir, ec);
    if (ec) return absl::InvalidArgumentError(StrCat("cannot create ", o.out_dir, ": ", ec.message()));
    SLICESCHED_RETURN_IF_ERROR(WriteSummary(o.out_dir, result));
    SLICESCHED_RETURN_IF_ERROR(WriteIdleSlicesCsv(o.out_dir + "/idle_slices.csv", slices));
    SLICESCHED_RETURN_IF_ERROR(WriteIdleOverlapCsv(o.out_dir + "/idle_overlap.csv", result.overlap));
  }
  return result;
}

}  // namespace slicesched
