#include "slicesched/experiments/accuracy.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "slicesched/cluster/ground_truth.h"
#include "slicesched/cluster/virtual_cluster.h"
#include "slicesched/common/option_checks.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "slicesched/estimate/calibration.h"
#include "slicesched/estimate/estimators.h"
#include "slicesched/experiments/gmg_demo.h"
#include "slicesched/gmg/llama.h"
#include "slicesched/gmg/placement.h"
#include "slicesched/gmg/snapshot.h"
#include "slicesched/sched/learner.h"
#include "slicesched/sim/simulator.h"
#include "slicesched/workload/trace.h"

namespace slicesched {

std::string AccuracyResult::ToJson() const {
  return absl::StrFormat(
      "{\"workload\": \"%s\", \"requests\": %d, \"instances\": %d, \"ops\": %d, \"transfers\": %d, "
      "\"predictions\": %d, \"completion_mape_pct\": %.3f, \"completion_p90_ape_pct\": %.3f, "
      "\"completion_bias_pct\": %.3f, \"open_loop_mape_pct\": %.3f, "
      "\"op_mape_pct\": %.3f, \"transfer_mape_pct\": %.3f, \"simulated_s\": %.1f}",
      workload, requests, instances, ops, transfers, predictions, completion_mape_pct, completion_p90_ape_pct,
      completion_bias_pct, open_loop_mape_pct, op_mape_pct, transfer_mape_pct, simulated_s);
}

namespace {

struct Conversation {
  int pair = 0;
  int64_t context = 0;    // tokens in the KV cache
  int64_t remaining = 0;  // decode steps still to run
  std::vector<CheckpointId> kv;
};

struct Prediction {
  int64_t at_ns;
  int64_t predicted_end_ns;
  int64_t arrival_ns;
};

}  // namespace

absl::Status AccuracyOptions::Validate() const {
  for (const auto& [flag, v] : {std::pair{"--minutes", minutes}, std::pair{"--load-scale", load_scale},
                                std::pair{"--predict-every", predict_every_s}}) {
    if (!(v > 0) || !std::isfinite(v)) return OptionOutOfRange(flag, "> 0", v);
  }
  if (!(warmup_s >= 0) || !std::isfinite(warmup_s)) return OptionOutOfRange("--warmup", "at least 0", warmup_s);
  if (minutes * 60.0 <= warmup_s) {  // nothing would be scored: every figure would read 0.00%
    return absl::InvalidArgumentError(StrCat("--minutes ", minutes, " (", minutes * 60.0, " s) must exceed --warmup ",
                                             warmup_s, " s, before which nothing is scored"));
  }
  return absl::OkStatus();
}

namespace {

// The requests replayed (the trace, else the built-in model), load-scaled and
// cut to the run's window; `result` names the workload.
absl::StatusOr<std::vector<Request>> LoadRequests(const AccuracyOptions& o, AccuracyResult* result) {
  std::vector<Request> requests;
  if (o.trace.empty()) {
    requests = GenerateBuiltInWorkload(BuiltInWorkloadModel{}, o.minutes * 60.0 / o.load_scale, o.seed);
    result->workload = "built-in (derived from the Azure code trace)";
  } else {
    SLICESCHED_ASSIGN_OR_RETURN(requests, LoadAzureLlmTrace(o.trace));
    result->workload = o.trace;
  }
  return Window(ScaleLoad(requests, o.load_scale), 0, o.minutes * 60.0);
}

// Llama3-8B on the graph: its prefill and decode templates, one model
// instance per device pair (the prefill's pp2 weights loaded on each pair).
struct LlamaOnPairs {
  TemplateId pre_id;
  TemplateId dec_id;
  int pairs = 0;
};

absl::StatusOr<LlamaOnPairs> LoadLlamaOnPairs(const GmgDemoConfig& cfg, GlobalMappingGraph& g) {
  SLICESCHED_ASSIGN_OR_RETURN(LlamaTemplates t, BuildLlamaTemplates(cfg.model));
  LlamaOnPairs m;
  SLICESCHED_ASSIGN_OR_RETURN(m.pre_id, g.RegisterTemplate(t.prefill));
  SLICESCHED_ASSIGN_OR_RETURN(m.dec_id, g.RegisterTemplate(t.decode));
  const CandidatePartition& pp2 = t.prefill->partitions()[1];
  m.pairs = static_cast<int>(g.accelerators().size() / 2);
  for (int p = 0; p < m.pairs; ++p) {
    for (int op = 0; op < t.prefill->num_ops(); ++op) {
      const OpSpec& spec = t.prefill->op(op);
      if (spec.weight_key.empty()) continue;
      SLICESCHED_RETURN_IF_ERROR(g.LoadWeights(DeviceId(2 * p + pp2.slot_of_op[op]), spec.weight_key, spec.weight_bytes));
    }
  }
  return m;
}

// One replay: the graph and its ground-truth cluster, the learner that the
// cluster's feedback trains, the live conversations, the predictions waiting
// for their instance's end, and the scores so far.
struct Replay {
  const AccuracyOptions& o;
  GlobalMappingGraph& g;
  VirtualCluster& cluster;
  OnlineLearner& learner;
  SimContext& ctx;
  LlamaOnPairs model;
  AccuracyResult& result;
  int64_t warmup_ns = 0;
  int64_t end_ns = 0;
  absl::flat_hash_map<uint64_t, Conversation> conv;      // by live instance id
  absl::flat_hash_map<uint64_t, std::vector<Prediction>> preds;
  // |predicted - actual| / (actual - snapshot time), percent: against the
  // counterfactual without later arrivals (closed) and the real run (open).
  std::vector<double> closed_ape, open_ape;
  double closed_signed = 0;
};

// Issues the instance's nodes on device pair `pair` (the pp2 partition).
absl::Status Issue(Replay& run, InstanceId id, int pair, Timestamp now) {
  const DeviceId slots[2] = {DeviceId(static_cast<uint16_t>(2 * pair)), DeviceId(static_cast<uint16_t>(2 * pair + 1))};
  const Instance* inst = run.g.FindInstance(id);
  SLICESCHED_ASSIGN_OR_RETURN(std::vector<NodeId> issued,
                              IssueByPartition(run.g, id, inst->tpl->partitions()[1], slots, 0, now));
  for (NodeId n : issued) run.cluster.NodeIssued(n);
  ++run.result.instances;
  return absl::OkStatus();
}

// The conversation's next decode step, on its pair.
absl::Status StartDecode(Replay& run, Conversation c, Timestamp now) {
  const InstanceSpec ds = LlamaDecodeStep(run.model.dec_id, c.context, c.kv, PriorityClass::kOnline, now);
  SLICESCHED_ASSIGN_OR_RETURN(InstanceId id, run.g.Instantiate(ds));
  const int pair = c.pair;
  run.conv[id.value()] = std::move(c);
  return Issue(run, id, pair, now);
}

// Runs the cluster to `now`; its feedback trains the learner (scored after
// the warm-up).
absl::Status AdvanceCluster(Replay& run, Timestamp now, std::vector<Feedback>* feedback) {
  feedback->clear();
  SLICESCHED_RETURN_IF_ERROR(run.cluster.AdvanceTo(now, feedback));
  for (const Feedback& f : *feedback) {
    run.learner.Apply(f, f.start.nanos() >= run.warmup_ns);
    if (f.kind == Feedback::Kind::kOp) {
      ++run.result.ops;
    } else {
      ++run.result.transfers;
    }
  }
  return absl::OkStatus();
}

// Finished instances: score predictions, continue conversations.
absl::Status RetireFinished(Replay& run, Timestamp now) {
  for (const RetiredInstance& r : run.g.TakeRetired()) {
    if (auto it = run.preds.find(r.id.value()); it != run.preds.end()) {
      for (const Prediction& p : it->second) {
        const double remaining = static_cast<double>(r.finished.nanos() - p.at_ns);
        const double latency = static_cast<double>(r.finished.nanos() - p.arrival_ns);
        const double err = static_cast<double>(p.predicted_end_ns - r.finished.nanos());
        if (remaining > 0 && latency > 0) run.open_ape.push_back(100.0 * std::abs(err) / remaining);
      }
      run.preds.erase(it);
    }
    auto cit = run.conv.find(r.id.value());
    if (cit == run.conv.end()) continue;
    Conversation c = std::move(cit->second);
    run.conv.erase(cit);
    if (r.state != InstanceState::kDone) continue;
    if (r.template_id == run.model.pre_id) c.kv = r.produced;
    if (c.remaining > 0) {
      --c.remaining;
      if (r.template_id == run.model.dec_id) ++c.context;
      SLICESCHED_RETURN_IF_ERROR(StartDecode(run, std::move(c), now));
    } else {
      for (CheckpointId k : c.kv) SLICESCHED_RETURN_IF_ERROR(run.g.ReleaseCheckpoint(k));
    }
  }
  return absl::OkStatus();
}

// Arrivals up to `now_ns`: each request's prefill starts its conversation on
// the next pair in turn; `*next_req` moves past them.
absl::Status AdmitArrivals(Replay& run, const std::vector<Request>& requests, size_t* next_req, int64_t now_ns,
                           Timestamp now) {
  while (*next_req < requests.size() && static_cast<int64_t>(requests[*next_req].arrival_s * 1e9) <= now_ns) {
    const Request& req = requests[*next_req];
    InstanceSpec ps;
    ps.template_id = run.model.pre_id;
    ps.bindings = {{"B", 1}, {"S", std::max<int64_t>(1, req.context_tokens)}};
    ps.priority_class = PriorityClass::kOnline;
    ps.arrival = now;
    SLICESCHED_ASSIGN_OR_RETURN(InstanceId id, run.g.Instantiate(ps));
    Conversation c;
    c.pair = static_cast<int>(*next_req % run.model.pairs);
    c.context = std::max<int64_t>(1, req.context_tokens);
    c.remaining = std::max<int64_t>(0, req.generated_tokens - 1);  // the prefill samples the first
    const int pair = c.pair;
    run.conv[id.value()] = std::move(c);
    SLICESCHED_RETURN_IF_ERROR(Issue(run, id, pair, now));
    ++run.result.requests;
    ++*next_req;
  }
  return absl::OkStatus();
}

// The simulator's predicted end of every in-flight instance of the snapshot
// taken at `now_ns`, scored against the real run when the instance ends.
void KeepPredictions(Replay& run, const GmgSnapshot& snap, const SimResult& res, int64_t now_ns) {
  for (size_t i = 0; i < snap.instances.size(); ++i) {
    if (res.instance_end_ns[i] < 0) continue;
    run.preds[snap.instances[i].id].push_back({now_ns, res.instance_end_ns[i], snap.instances[i].arrival_ns});
  }
}

// Counterfactual: the ground truth from the same state with no
// further arrivals (the work the snapshot knows), run to the end.
absl::Status ScoreAgainstCounterfactual(Replay& run, const GmgSnapshot& snap, const SimResult& res, int64_t now_ns) {
  GlobalMappingGraph g2 = run.g.Clone();
  VirtualCluster c2 = run.cluster.Fork(&g2);
  std::vector<Feedback> ignored;
  while (c2.NextEventTime() != Timestamp::Infinite()) {
    SLICESCHED_RETURN_IF_ERROR(c2.AdvanceTo(c2.NextEventTime(), &ignored));
    ignored.clear();
  }
  absl::flat_hash_map<uint64_t, int64_t> finished;
  for (const RetiredInstance& r : g2.TakeRetired()) finished[r.id.value()] = r.finished.nanos();
  for (size_t i = 0; i < snap.instances.size(); ++i) {
    auto it = finished.find(snap.instances[i].id);
    if (res.instance_end_ns[i] < 0 || it == finished.end() || it->second <= now_ns) continue;
    run.closed_ape.push_back(100.0 * std::abs(static_cast<double>(res.instance_end_ns[i] - it->second)) /
                             static_cast<double>(it->second - now_ns));
    run.closed_signed += 100.0 * static_cast<double>(res.instance_end_ns[i] - it->second) /
                         static_cast<double>(it->second - now_ns);
  }
  return absl::OkStatus();
}

// The event loop, from time 0 until the cluster drained: arrivals, the
// cluster's events and the prediction instants, in time order. Returns the
// time of the last event.
absl::StatusOr<int64_t> ReplayEvents(Replay& run, const std::vector<Request>& requests) {
  GmgSnapshot snap;
  SLICESCHED_ASSIGN_OR_RETURN(Simulator sim, Simulator::Create(snap, run.ctx));
  SimScratch scratch;
  SimResult res;
  std::vector<Feedback> feedback;
  size_t next_req = 0;
  int64_t next_predict = static_cast<int64_t>(run.o.predict_every_s * 1e9);
  int64_t now_ns = 0;
  while (true) {
    const int64_t arrival = next_req < requests.size() ? static_cast<int64_t>(requests[next_req].arrival_s * 1e9)
                                                       : std::numeric_limits<int64_t>::max();
    const int64_t event = run.cluster.NextEventTime().nanos();
    const int64_t predict = next_predict <= run.end_ns ? next_predict : std::numeric_limits<int64_t>::max();
    const int64_t next = std::min({arrival, event, predict});
    if (next == std::numeric_limits<int64_t>::max()) break;  // drained
    now_ns = next;
    const Timestamp now = Timestamp::FromNanos(now_ns);
    SLICESCHED_RETURN_IF_ERROR(AdvanceCluster(run, now, &feedback));
    SLICESCHED_RETURN_IF_ERROR(RetireFinished(run, now));
    SLICESCHED_RETURN_IF_ERROR(AdmitArrivals(run, requests, &next_req, now_ns, now));
    SLICESCHED_RETURN_IF_ERROR(run.cluster.Dispatch(now));
    // Predictions.
    if (now_ns == next_predict) {
      next_predict += static_cast<int64_t>(run.o.predict_every_s * 1e9);
      run.g.SnapshotInto(now, &snap);
      SLICESCHED_RETURN_IF_ERROR(sim.Rebuild(snap, run.ctx));
      sim.RunInto(SimOptions{}, &scratch, &res);
      if (now_ns >= run.warmup_ns) {
        KeepPredictions(run, snap, res, now_ns);
        SLICESCHED_RETURN_IF_ERROR(ScoreAgainstCounterfactual(run, snap, res, now_ns));
      }
    }
  }
  return now_ns;
}

// The scores into run.result; `now_ns`: the replay's last event.
void Summarize(Replay& run, int64_t now_ns) {
  AccuracyResult& result = run.result;
  std::vector<double>& closed_ape = run.closed_ape;
  result.simulated_s = static_cast<double>(now_ns) / 1e9;
  auto mean = [](const std::vector<double>& v) {
    double sum = 0;
    for (double a : v) sum += a;
    return v.empty() ? 0.0 : sum / static_cast<double>(v.size());
  };
  result.predictions = static_cast<int64_t>(closed_ape.size());
  result.completion_mape_pct = mean(closed_ape);
  result.completion_bias_pct = closed_ape.empty() ? 0.0 : run.closed_signed / static_cast<double>(closed_ape.size());
  if (!closed_ape.empty()) {
    std::sort(closed_ape.begin(), closed_ape.end());
    result.completion_p90_ape_pct = closed_ape[closed_ape.size() * 9 / 10];
  }
  result.open_loop_mape_pct = mean(run.open_ape);
  result.op_mape_pct = run.learner.op_error().mape_pct();
  result.transfer_mape_pct = run.learner.transfer_error().mape_pct();
}

}  // namespace

absl::StatusOr<AccuracyResult> RunAccuracy(const AccuracyOptions& o) {
  SLICESCHED_RETURN_IF_ERROR(o.Validate());
  AccuracyResult result;
  // Workload.
  SLICESCHED_ASSIGN_OR_RETURN(const std::vector<Request> requests, LoadRequests(o, &result));

  // Cluster: the embedded default (8 x A16, PCIe links), Llama3-8B.
  SLICESCHED_ASSIGN_OR_RETURN(GmgDemoConfig cfg, DefaultGmgDemoConfig());
  GlobalMappingGraph g(cfg.cluster);
  SLICESCHED_ASSIGN_OR_RETURN(LlamaOnPairs model, LoadLlamaOnPairs(cfg, g));
  GroundTruthModel truth(g.accelerators());
  VirtualCluster cluster(&g, &truth, o.seed);
  OpEstimator ops;
  TransferEstimator transfers(g.accelerators());
  RuntimeCalibration calibration(g.accelerators().size());
  SimContext ctx(&g.templates(), &ops, &transfers);
  ctx.set_calibration(&calibration);
  OnlineLearner learner(&g, &ctx, &ops, &transfers, &calibration);

  Replay run{.o = o,
             .g = g,
             .cluster = cluster,
             .learner = learner,
             .ctx = ctx,
             .model = model,
             .result = result,
             .warmup_ns = static_cast<int64_t>(o.warmup_s * 1e9),
             .end_ns = static_cast<int64_t>(o.minutes * 60e9)};
  SLICESCHED_ASSIGN_OR_RETURN(const int64_t now_ns, ReplayEvents(run, requests));
  Summarize(run, now_ns);
  return result;
}

}  // namespace slicesched
