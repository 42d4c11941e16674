// One policy over the replay window: the event loop that feeds online and
// offline requests into the GMG, lets the policy place them, and measures.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "replay_internal.h"
#include "slicesched/cluster/ground_truth.h"
#include "slicesched/cluster/virtual_cluster.h"
#include "slicesched/common/stats.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "slicesched/common/thread_pool.h"
#include "slicesched/experiments/gmg_demo.h"
#include "slicesched/gmg/llama.h"
#include "slicesched/sched/baselines.h"
#include "slicesched/sched/learner.h"
#include "slicesched/sched/slice_scheduler.h"

namespace slicesched::replay_internal {
namespace {

struct Conversation {
  bool online = true;
  int64_t arrival_ns = 0;
  int64_t context = 0;
  int64_t remaining = 0;  // decode steps to go
  std::vector<CheckpointId> kv;
  std::vector<int64_t> token_ns;  // online: completion time of each token
  int64_t offered_ns = 0;         // offline: when the request arrived (it may wait to be admitted)
};

// Nearest-rank percentile (the replay's TTFT figures).
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
    std::fprintf(stderr, "\r%-17s [%.*s%.*s] %3d%%  t=%.0f/%.0f s", label_.c_str(), bar,
                 "##############################", 30 - bar, "..............................", pct, t_s, total_);
    std::fflush(stderr);
  }
  void Done(double wall_s) {
    if (on_) std::fprintf(stderr, "\r%-17s [##############################] 100%%  %.1f s wall\n", label_.c_str(), wall_s);
  }

 private:
  bool on_;
  std::string label_;
  double total_;
  int last_ = -1;
};

// The server of the experiment: the embedded default cluster, Llama3-8B
// resident on every device, fused 8 layers per operator (Full-Share's offline
// instance: 4).
struct Server {
  GmgDemoConfig cfg;
  std::unique_ptr<GlobalMappingGraph> g;
  TemplateId pre8, dec8, off_pre, off_dec;
  // pre8_chunks[k]: the prefill in k pieces (k >= 2; gmg/llama.h).
  std::vector<TemplateId> pre8_chunks;
  bool IsPrefill(TemplateId t) const {
    return t == pre8 || t == off_pre || std::find(pre8_chunks.begin(), pre8_chunks.end(), t) != pre8_chunks.end();
  }
  // A prompt's prefill on `whole`, or in the pieces the policy asks for
  // (chunked templates exist for the 8-layer fusion only).
  InstanceSpec Prefill(const PlacementPolicy& policy, TemplateId whole, int64_t prompt, PriorityClass cls,
                       Timestamp now) const {
    const int chunks = whole != pre8 ? 1 : PrefillPieces(policy, prompt, cls);
    if (chunks > 1) return LlamaChunkedPrefill(pre8_chunks[chunks], chunks, prompt, cls, now);
    InstanceSpec ps;
    ps.template_id = whole;
    ps.bindings = {{"B", 1}, {"S", prompt}};
    ps.priority_class = cls;
    ps.arrival = now;
    return ps;
  }
};

absl::StatusOr<Server> BuildServer(bool full_share) {
  Server s;
  SLICESCHED_ASSIGN_OR_RETURN(s.cfg, DefaultGmgDemoConfig());
  s.g = std::make_unique<GlobalMappingGraph>(s.cfg.cluster);
  GlobalMappingGraph& g = *s.g;
  SLICESCHED_ASSIGN_OR_RETURN(LlamaTemplates t8, BuildLlamaTemplates(s.cfg.model));
  LlamaDims dims4 = s.cfg.model;
  dims4.name = s.cfg.model.name + "-f4";
  dims4.fusion = 4;
  SLICESCHED_ASSIGN_OR_RETURN(LlamaTemplates t4, BuildLlamaTemplates(dims4));
  SLICESCHED_ASSIGN_OR_RETURN(s.pre8, g.RegisterTemplate(t8.prefill));
  SLICESCHED_ASSIGN_OR_RETURN(s.dec8, g.RegisterTemplate(t8.decode));
  SLICESCHED_ASSIGN_OR_RETURN(TemplateId pre4, g.RegisterTemplate(t4.prefill));
  SLICESCHED_ASSIGN_OR_RETURN(TemplateId dec4, g.RegisterTemplate(t4.decode));
  s.pre8_chunks.assign(kMaxPrefillChunks + 1, TemplateId());
  for (int k = 2; k <= kMaxPrefillChunks; ++k) {
    SLICESCHED_ASSIGN_OR_RETURN(auto chunked, BuildLlamaChunkedPrefill(s.cfg.model, k));
    SLICESCHED_ASSIGN_OR_RETURN(s.pre8_chunks[k], g.RegisterTemplate(chunked));
  }
  // Weights: the whole model resident on every device (16 GB of 64 GB).
  for (size_t d = 0; d < g.accelerators().size(); ++d) {
    for (const auto* tpl : {t8.prefill.get(), full_share ? t4.prefill.get() : nullptr}) {
      if (tpl == nullptr) continue;
      for (const OpSpec& op : tpl->ops()) {
        if (op.weight_key.empty()) continue;
        SLICESCHED_RETURN_IF_ERROR(g.LoadWeights(DeviceId(static_cast<uint16_t>(d)), op.weight_key, op.weight_bytes));
      }
    }
  }
  s.off_pre = full_share ? pre4 : s.pre8;
  s.off_dec = full_share ? dec4 : s.dec8;
  return s;
}

}  // namespace

std::unique_ptr<PlacementPolicy> MakePolicy(const std::string& name) {
  if (name == "Static-Online") return std::make_unique<PinnedPolicy>(PinnedPolicy::StaticOnline());
  if (name == "Full-Share") return std::make_unique<PinnedPolicy>(PinnedPolicy::FullShare());
  if (name == "Subset-Share") return std::make_unique<PinnedPolicy>(PinnedPolicy::SubsetShare());
  if (name == "Dual-Share") return std::make_unique<PinnedPolicy>(PinnedPolicy::DualShare());
  if (name == "Priority-Colocate") return std::make_unique<PriorityColocate>();
  if (name == "SliceScheduler") return std::make_unique<SliceScheduler>();
  return nullptr;
}

namespace {

// One policy's replay in progress: the conversations in flight (by live
// instance id) and the counters its result is computed from.
struct ReplayState {
  absl::flat_hash_map<uint64_t, Conversation> conv;
  std::vector<std::vector<int64_t>> online_tokens;  // per finished online request
  int64_t end_ns = 0;
  // Offline requests that arrived this long before the end should be done
  // by then, unless the policy falls behind.
  int64_t settle_ns = 0;
  bool offline_on = false;
  double offline_gap_ns = 0;
  int64_t offline_arrived = 0, offline_queued = 0, offline_tenant = 0;
  int64_t tokens_online = 0, tokens_offline = 0, offline_settled_done = 0;
  double offline_busy_ns = 0;

  int64_t NextOfflineNs() const {
    return offline_on ? static_cast<int64_t>(offline_gap_ns * static_cast<double>(offline_arrived + 1))
                      : std::numeric_limits<int64_t>::max();
  }
};

// Finished instances: a prefill or decode step that has tokens to go issues
// the conversation's next decode step; a finished conversation releases its
// KV cache and is counted.
absl::Status RetireFinished(const Server& server, Timestamp now, ReplayState& st, RunOutput& out) {
  GlobalMappingGraph& g = *server.g;
  for (const RetiredInstance& r : g.TakeRetired()) {
    auto it = st.conv.find(r.id.value());
    if (it == st.conv.end()) continue;
    Conversation c = std::move(it->second);
    st.conv.erase(it);
    if (r.state != InstanceState::kDone) continue;
    if (server.IsPrefill(r.template_id)) {
      c.kv = r.produced;
      if (c.online) out.ttft_ms.push_back(static_cast<double>(r.finished.nanos() - c.arrival_ns) / 1e6);
    } else {
      ++c.context;
    }
    if (c.online) c.token_ns.push_back(r.finished.nanos());
    (c.online ? st.tokens_online : st.tokens_offline) += 1;
    if (c.remaining > 0) {
      --c.remaining;
      const PriorityClass cls = c.online ? PriorityClass::kOnline : PriorityClass::kOffline;
      InstanceSpec ds = LlamaDecodeStep(c.online ? server.dec8 : server.off_dec, c.context, c.kv, cls,
                                        DecodeStepArrival(cls, Timestamp::FromNanos(c.arrival_ns), now));
      ds.tenant = TenantId(c.online ? 0 : kOfflineTenantBase);
      SLICESCHED_ASSIGN_OR_RETURN(InstanceId id, g.Instantiate(ds));
      st.conv[id.value()] = std::move(c);
    } else {
      for (CheckpointId k : c.kv) SLICESCHED_RETURN_IF_ERROR(g.ReleaseCheckpoint(k));
      (c.online ? out.result.online_completed : out.result.offline_completed) += 1;
      if (!c.online && c.offered_ns <= st.settle_ns) ++st.offline_settled_done;
      if (!c.online) out.offline_latency_s.push_back(static_cast<double>(now.nanos() - c.offered_ns) / 1e9);
      if (c.online) st.online_tokens.push_back(std::move(c.token_ns));
    }
  }
  return absl::OkStatus();
}

// The result's figures from the finished replay (the online requests still
// without a first token, and the token gaps of those still generating,
// count too).
void Summarize(const std::string& name, const RunSettings& o, const GlobalMappingGraph& g, PlacementPolicy* policy,
               ReplayState& st, RunOutput& out) {
  const int64_t end_ns = st.end_ns;
  for (auto& [id, c] : st.conv) {
    const Instance* inst = g.FindInstance(InstanceId(id));
    if (c.online && inst != nullptr && inst->tpl->checkpoint_inputs().empty() && c.token_ns.empty()) {
      out.waiting_ms.push_back(static_cast<double>(end_ns - c.arrival_ns) / 1e6);
    }
    if (c.online) st.online_tokens.push_back(std::move(c.token_ns));
  }
  const double span_s = static_cast<double>(end_ns) / 1e9;
  PolicyResult& r = out.result;
  r.policy = name;
  r.online_req_per_s = static_cast<double>(r.online_completed) / span_s;
  r.req_per_s = static_cast<double>(r.online_completed + r.offline_completed) / span_s;
  r.tok_per_s = static_cast<double>(st.tokens_online + st.tokens_offline) / span_s;
  r.offline_tok_per_s = static_cast<double>(st.tokens_offline) / span_s;
  r.offline_offered_per_s = o.offline_rate;
  const double offered_tokens = std::floor(o.offline_rate * span_s) * static_cast<double>(kReplayOfflineOutput);
  r.offline_completed_frac = offered_tokens > 0 ? static_cast<double>(st.tokens_offline) / offered_tokens : 0;
  r.offline_busy_s = st.offline_busy_ns / 1e9;
  const double settled_offered =
      st.offline_on && st.settle_ns > 0 ? std::floor(static_cast<double>(st.settle_ns) / st.offline_gap_ns) : 0;
  r.offline_settled_frac = settled_offered > 0 ? static_cast<double>(st.offline_settled_done) / settled_offered : 0;
  r.offline_backlog = st.offline_arrived - r.offline_completed;
  r.offline_latency_p50_s = Percentile(out.offline_latency_s, 0.5);
  r.offline_latency_p90_s = Percentile(out.offline_latency_s, 0.9);
  r.ttft_p50_ms = Percentile(out.ttft_ms, 0.5);
  r.ttft_p99_ms = Percentile(out.ttft_ms, 0.99);
  std::vector<double> tbt = TimeBetweenTokensMs(st.online_tokens);
  std::sort(tbt.begin(), tbt.end());
  r.tbt_p50_ms = QuantileOfSorted(tbt, 0.5);
  r.tbt_p99_ms = QuantileOfSorted(tbt, 0.99);
  double busy_ns = 0;
  for (auto& dev : out.busy) {
    for (const BusyInterval& b : dev) busy_ns += static_cast<double>(std::min(b.end_ns, end_ns) - b.start_ns);
  }
  r.gpu_util = busy_ns / (static_cast<double>(end_ns) * static_cast<double>(out.busy.size()));
  if (auto* s = dynamic_cast<SliceScheduler*>(policy)) {
    std::vector<double> lat = s->round_latency_us();
    r.round_p50_us = Percentile(lat, 0.5);
    r.round_p99_us = Percentile(lat, 0.99);
    double sum = 0;
    for (int c : s->round_candidates()) sum += c;
    r.mean_candidates = s->round_candidates().empty() ? 0 : sum / static_cast<double>(s->round_candidates().size());
  }
}

}  // namespace

absl::StatusOr<RunOutput> RunPolicy(const std::string& name, const std::vector<TaggedRequest>& online,
                                    const RunSettings& o) {
  RunOutput out;
  const auto wall0 = std::chrono::steady_clock::now();
  std::unique_ptr<PlacementPolicy> policy = MakePolicy(name);
  if (policy == nullptr) return absl::InvalidArgumentError(StrCat("unknown policy '", name, "'"));
  SLICESCHED_ASSIGN_OR_RETURN(Server server, BuildServer(name == "Full-Share"));
  GlobalMappingGraph& g = *server.g;
  const size_t devices = g.accelerators().size();

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

  ReplayState st;
  out.busy.assign(devices, {});
  st.end_ns = static_cast<int64_t>(o.minutes * 60e9);
  st.offline_on = policy->accepts_offline() && o.offline_rate > 0;
  st.offline_gap_ns = st.offline_on ? 1e9 / o.offline_rate : 0;
  st.settle_ns = st.end_ns - static_cast<int64_t>(kOfflineSettle.nanos());
  const int64_t end_ns = st.end_ns;
  size_t next_req = 0;
  std::vector<Feedback> feedback;
  Progress progress(o.progress, name, o.minutes * 60);

  while (true) {
    const int64_t arrival = next_req < online.size() ? static_cast<int64_t>(online[next_req].arrival_s * 1e9)
                                                     : std::numeric_limits<int64_t>::max();
    const int64_t next = std::min({arrival, st.NextOfflineNs(), cluster.NextEventTime().nanos()});
    if (next > end_ns) break;
    const Timestamp now = Timestamp::FromNanos(next);
    feedback.clear();
    SLICESCHED_RETURN_IF_ERROR(cluster.AdvanceTo(now, &feedback));
    for (const Feedback& f : feedback) {
      learner.Apply(f, false);
      if (f.kind != Feedback::Kind::kOp) continue;
      out.busy[f.device.value()].push_back({f.start.nanos(), f.end.nanos()});
      auto it = st.conv.find(f.instance.value());
      if (it != st.conv.end() && !it->second.online) {
        st.offline_busy_ns += static_cast<double>(std::min(f.end.nanos(), end_ns) - f.start.nanos());
      }
    }
    SLICESCHED_RETURN_IF_ERROR(RetireFinished(server, now, st, out));
    while (next_req < online.size() && static_cast<int64_t>(online[next_req].arrival_s * 1e9) <= next) {
      const TaggedRequest& req = online[next_req++];
      InstanceSpec ps =
          server.Prefill(*policy, server.pre8, std::max<int64_t>(1, req.context), PriorityClass::kOnline, now);
      ps.tenant = TenantId(static_cast<uint32_t>(req.instance));
      SLICESCHED_ASSIGN_OR_RETURN(InstanceId id, g.Instantiate(ps));
      Conversation c;
      c.online = true;
      c.arrival_ns = next;
      c.context = std::max<int64_t>(1, req.context);
      c.remaining = std::max<int64_t>(0, req.output - 1);
      st.conv[id.value()] = std::move(c);
      ++out.result.online_requests;
    }
    while (st.offline_on && st.NextOfflineNs() <= next) {
      ++st.offline_arrived;
      ++st.offline_queued;
    }
    for (int admit = policy->OfflineAdmissions(env, now); admit > 0 && st.offline_queued > 0; --admit) {
      InstanceSpec ps = server.Prefill(*policy, server.off_pre, kReplayOfflineInput, PriorityClass::kOffline, now);
      ps.tenant = TenantId(static_cast<uint32_t>(kOfflineTenantBase + (st.offline_tenant++ % 2)));
      SLICESCHED_ASSIGN_OR_RETURN(InstanceId id, g.Instantiate(ps));
      Conversation c;
      c.online = false;
      c.arrival_ns = next;
      c.context = kReplayOfflineInput;
      c.remaining = kReplayOfflineOutput - 1;
      // Requests are admitted in arrival order: this is arrival number
      // offline_arrived - offline_queued (from 0).
      c.offered_ns =
          static_cast<int64_t>(st.offline_gap_ns * static_cast<double>(st.offline_arrived - st.offline_queued + 1));
      st.conv[id.value()] = std::move(c);
      --st.offline_queued;
    }
    if (!g.unscheduled_frontier().empty()) {
      SLICESCHED_ASSIGN_OR_RETURN(ScheduleStats stats, policy->Schedule(env, now));
      out.result.rounds += stats.rounds;
    }
    SLICESCHED_RETURN_IF_ERROR(cluster.Dispatch(now));
    progress.Update(static_cast<double>(next) / 1e9);
  }
  Summarize(name, o, g, policy.get(), st, out);
  out.result.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  progress.Done(out.result.wall_s);
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

void JudgeAgainstReference(double slo_ms, double reference_idle_s, RunOutput* run) {
  run->result.slo_attainment = Attainment(*run, slo_ms);
  run->result.harvest = reference_idle_s > 0 ? run->result.offline_busy_s / reference_idle_s : 0;
}

}  // namespace slicesched::replay_internal
