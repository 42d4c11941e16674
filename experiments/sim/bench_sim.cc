#include "slicesched/experiments/bench_sim.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>

#include "absl/strings/str_format.h"
#include "slicesched/common/option_checks.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "slicesched/estimate/estimators.h"
#include "slicesched/gmg/gmg.h"
#include "slicesched/gmg/llama.h"
#include "slicesched/gmg/placement.h"
#include "slicesched/gmg/snapshot.h"
#include "slicesched/sim/simulator.h"

namespace slicesched {

std::string BenchSimResult::ToJson() const {
  return absl::StrFormat(
      "{\"devices\": %d, \"ops\": %d, \"compute_ops\": %d, \"transfers\": %d, \"instances\": %d, "
      "\"repetitions\": %d, \"warmup\": %d, \"snapshot_us\": %.1f, \"construct_us\": %.1f, \"simulate_us\": %.1f, \"ops_per_ms\": %.1f, "
      "\"compute_ops_per_ms\": %.1f, \"makespan_ms\": %.1f}",
      devices, ops, compute_ops, transfers, instances, repetitions, warmup, snapshot_us, construct_us, simulate_us, ops_per_ms,
      compute_ops_per_ms, makespan_ms);
}

namespace {

double Micros(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}

// Plausible A16 + Llama3-8B coefficients for the bench's estimator (any
// positive model would do: the bench measures simulator speed).
void SetBenchPriors(SimContext& ctx, OpEstimator& ops, const GraphTemplate& tpl) {
  for (int op = 0; op < tpl.num_ops(); ++op) {
    const int key = ctx.OpKey("A16", tpl.id().value(), op);
    switch (tpl.op(op).kind) {
      case OpKind::kFusedLayers:  // [B*S, B*S*(C+S), B*(C+S), 1]
        (void)ops.SetPrior(key, std::vector<double>{2.0e5, 7.3, 0.2, 10.4e6});
        break;
      case OpKind::kEmbedding:  // [B*S, 1]
        (void)ops.SetPrior(key, std::vector<double>{50.0, 0.05e6});
        break;
      case OpKind::kLmHead:  // [B, 1]
        (void)ops.SetPrior(key, std::vector<double>{0.2e6, 2.5e6});
        break;
      default:  // sample: [B, 1]
        (void)ops.SetPrior(key, std::vector<double>{0.01e6, 0.05e6});
        break;
    }
  }
}

class Builder {
 public:
  Builder(const BenchSimOptions& o) : o_(o), rng_(o.seed) {}

  absl::Status Build() {
    std::vector<DeviceSpec> devs(o_.devices);
    for (int d = 0; d < o_.devices; ++d) {
      devs[d].name = StrCat("gpu", d);
      devs[d].type = "A16";
      devs[d].memory = Bytes::GiB(64);
    }
    SLICESCHED_ASSIGN_OR_RETURN(AcceleratorSet accel,
                                AcceleratorSet::Create(devs, LinkSpec{12e9, Duration::Micros(20)}));
    g_ = std::make_unique<GlobalMappingGraph>(std::move(accel));
    SLICESCHED_ASSIGN_OR_RETURN(LlamaDims dims, LlamaPreset("llama3-8b"));
    SLICESCHED_ASSIGN_OR_RETURN(t_, BuildLlamaTemplates(dims));
    SLICESCHED_ASSIGN_OR_RETURN(pre_, g_->RegisterTemplate(t_.prefill));
    SLICESCHED_ASSIGN_OR_RETURN(dec_, g_->RegisterTemplate(t_.decode));
    for (int d = 0; d < o_.devices; ++d) {
      for (const OpSpec& op : t_.prefill->ops()) {
        if (!op.weight_key.empty()) {
          SLICESCHED_RETURN_IF_ERROR(g_->LoadWeights(DeviceId(d), op.weight_key, op.weight_bytes));
        }
      }
    }
    transfers_ = std::make_unique<TransferEstimator>(g_->accelerators());
    ctx_ = std::make_unique<SimContext>(&g_->templates(), &ops_, transfers_.get());
    SetBenchPriors(*ctx_, ops_, *g_->templates().Find(pre_));
    SetBenchPriors(*ctx_, ops_, *g_->templates().Find(dec_));

    // Conversations: prefill run to completion (KV retained on a pair).
    const int pairs = std::max(1, o_.devices / 2);
    int issued = 0;
    int k = 0;
    while (issued < o_.ops) {
      const int r = static_cast<int>(rng_() % 10);
      if (r < 7) {
        SLICESCHED_RETURN_IF_ERROR(AddDecode(static_cast<int>(rng_() % pairs)));
      } else {
        SLICESCHED_RETURN_IF_ERROR(AddPrefill(r == 9));
      }
      issued += t_.prefill->num_ops();
      ++k;
    }
    // One operator running on every device that has a ready one.
    for (const auto& [iid, inst] : g_->instances()) {
      for (const OpNode& n : inst->nodes) {
        if (n.state == NodeState::kIssued && !g_->running_compute(n.device).valid() && g_->IsReady(n.id)) {
          SLICESCHED_RETURN_IF_ERROR(g_->Start(n.id, now_));
        }
      }
    }
    return absl::OkStatus();
  }

  GlobalMappingGraph& gmg() { return *g_; }
  SimContext& ctx() { return *ctx_; }
  Timestamp now() const { return now_; }

 private:
  Timestamp Tick() { return now_ = now_ + Duration::Micros(1); }

  absl::Status Place(InstanceId id, const CandidatePartition& p, const std::vector<DeviceId>& slots) {
    return IssueByPartition(*g_, id, p, slots, 0, now_).status();
  }

  std::vector<DeviceId> Pair(int pair) const {
    const int a = (2 * pair) % o_.devices;
    return {DeviceId(a), DeviceId((a + 1) % o_.devices)};
  }

  absl::Status AddDecode(int pair) {
    InstanceSpec ps;
    ps.template_id = pre_;
    const int64_t context = 100 + static_cast<int64_t>(rng_() % 3900);
    ps.bindings = {{"B", 1}, {"S", context}};
    ps.priority_class = PriorityClass::kOnline;
    ps.arrival = Tick();
    SLICESCHED_ASSIGN_OR_RETURN(InstanceId pre, g_->Instantiate(ps));
    const CandidatePartition& pp2 = t_.prefill->partitions()[1];
    SLICESCHED_RETURN_IF_ERROR(Place(pre, pp2, Pair(pair)));
    while (const Instance* inst = g_->FindInstance(pre)) {
      NodeId next;
      for (const OpNode& n : inst->nodes) {
        if (g_->IsReady(n.id)) { next = n.id; break; }
      }
      for (NodeId x : inst->transfers) {
        if (!next.valid() && g_->IsReady(x)) next = x;
      }
      if (!next.valid()) return absl::InternalError("bench prefill stuck");
      SLICESCHED_RETURN_IF_ERROR(g_->Start(next, Tick()));
      SLICESCHED_RETURN_IF_ERROR(g_->Finish(next, Tick()));
    }
    std::vector<CheckpointId> kv = g_->TakeRetired().back().produced;
    const int32_t priority = static_cast<int32_t>(rng_() % 4);
    InstanceSpec ds = LlamaDecodeStep(dec_, context, kv, PriorityClass::kOnline, Tick());
    ds.priority = priority;
    SLICESCHED_ASSIGN_OR_RETURN(InstanceId dec, g_->Instantiate(ds));
    return Place(dec, t_.decode->partitions()[1], Pair(pair));
  }

  absl::Status AddPrefill(bool offline) {
    InstanceSpec ps;
    ps.template_id = pre_;
    ps.bindings = {{"B", 1}, {"S", offline ? 2048 : 128 + static_cast<int64_t>(rng_() % 4000)}};
    ps.priority_class = offline ? PriorityClass::kOffline : PriorityClass::kOnline;
    ps.priority = static_cast<int32_t>(rng_() % 4);
    ps.arrival = Tick();
    SLICESCHED_ASSIGN_OR_RETURN(InstanceId id, g_->Instantiate(ps));
    const bool wide = o_.devices >= 4 && rng_() % 2 == 0;
    const CandidatePartition& p = t_.prefill->partitions()[wide ? 2 : 1];
    std::vector<DeviceId> slots;
    const int base = static_cast<int>(rng_() % o_.devices);
    for (int s = 0; s < p.num_slots; ++s) slots.push_back(DeviceId((base + s) % o_.devices));
    return Place(id, p, slots);
  }

  BenchSimOptions o_;
  std::mt19937_64 rng_;
  std::unique_ptr<GlobalMappingGraph> g_;
  LlamaTemplates t_;
  TemplateId pre_, dec_;
  OpEstimator ops_;
  std::unique_ptr<TransferEstimator> transfers_;
  std::unique_ptr<SimContext> ctx_;
  Timestamp now_;
};

}  // namespace

absl::Status BenchSimOptions::Validate() const {
  if (devices < 2 || devices > 4096) return OptionOutOfRange("--devices", "in 2..4096", devices);
  if (ops < 1 || ops > 10000000) return OptionOutOfRange("--ops", "in 1..10000000", ops);
  if (repetitions < 1) return OptionOutOfRange("--repetitions", "at least 1", repetitions);
  if (warmup < 0) return OptionOutOfRange("--warmup", "at least 0", warmup);
  if (horizon_us < -1) return OptionOutOfRange("--horizon-us", "at least -1 (-1: to completion)", horizon_us);
  return absl::OkStatus();
}

absl::StatusOr<BenchSimResult> RunBenchSim(const BenchSimOptions& o) {
  SLICESCHED_RETURN_IF_ERROR(o.Validate());
  Builder b(o);
  SLICESCHED_RETURN_IF_ERROR(b.Build());

  BenchSimResult r;
  r.devices = o.devices;
  r.instances = static_cast<int64_t>(b.gmg().num_instances());
  r.repetitions = o.repetitions;
  r.warmup = o.warmup;
  std::vector<double> snap_us, construct_us, simulate_us;
  GmgSnapshot snap;
  SimScratch scratch;  // reused, as the scheduler's threads do
  SimResult res;
  SLICESCHED_ASSIGN_OR_RETURN(Simulator sim, Simulator::Create(snap, b.ctx()));  // warm buffers
  for (int rep = -o.warmup; rep < o.repetitions; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    b.gmg().SnapshotInto(b.now(), &snap);
    auto t1 = std::chrono::steady_clock::now();
    SLICESCHED_RETURN_IF_ERROR(sim.Rebuild(snap, b.ctx()));
    auto t2 = std::chrono::steady_clock::now();
    SimOptions so;
    if (o.horizon_us >= 0) so.horizon = Duration::Micros(o.horizon_us);
    sim.RunOnceInto(so, &scratch, &res);  // one run per build: consume the state
    auto t3 = std::chrono::steady_clock::now();
    if (rep < 0) continue;  // warm-up: untimed
    snap_us.push_back(Micros(t1 - t0));
    construct_us.push_back(Micros(t2 - t1));
    simulate_us.push_back(Micros(t3 - t2));
    r.ops = res.simulated_ops;
    r.compute_ops = 0;
    for (uint32_t n = 0; n < snap.num_compute_nodes; ++n) r.compute_ops += res.node_end_ns[n] >= 0 && snap.nodes[n].state != static_cast<uint8_t>(NodeState::kDone);
    r.transfers = static_cast<int64_t>(snap.nodes.size() - snap.num_compute_nodes);
    r.makespan_ms = static_cast<double>(res.end_ns - res.start_ns) / 1e6;
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  r.snapshot_us = median(snap_us);
  r.construct_us = median(construct_us);
  r.simulate_us = median(simulate_us);
  r.ops_per_ms = static_cast<double>(r.ops) / ((r.construct_us + r.simulate_us) / 1000.0);
  r.compute_ops_per_ms = static_cast<double>(r.compute_ops) / ((r.construct_us + r.simulate_us) / 1000.0);
  return r;
}

absl::Status RunBenchSimSweep(const std::vector<int>& devices, const std::vector<int>& ops, int repetitions,
                              const std::string& out_dir) {
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return absl::InvalidArgumentError(StrCat("cannot create ", out_dir, ": ", ec.message()));
  const std::string path = out_dir + "/bench_sim.csv";
  std::ofstream out(path);
  if (!out) return absl::InvalidArgumentError(StrCat("cannot write ", path));
  out << "devices,ops,simulated_ops,instances,snapshot_us,construct_us,simulate_us,ops_per_ms\n";
  for (int d : devices) {
    for (int k : ops) {
      BenchSimOptions o;
      o.devices = d;
      o.ops = k;
      o.repetitions = repetitions;
      SLICESCHED_ASSIGN_OR_RETURN(BenchSimResult r, RunBenchSim(o));
      out << absl::StrFormat("%d,%d,%d,%d,%.1f,%.1f,%.1f,%.1f\n", d, k, r.ops, r.instances, r.snapshot_us,
                             r.construct_us, r.simulate_us, r.ops_per_ms);
      out.flush();
    }
  }
  return absl::OkStatus();
}

}  // namespace slicesched
