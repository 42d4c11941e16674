// Microbenchmarks of the Global Mapping Graph: building instances and taking
// a snapshot of a server with 8 devices and N live instances (Llama3-8B,
// fused 8-layer operators, a mix of prefill and decode instances, some
// issued, running or waiting on cross-device transfers).
//
//   build/bench/gmg_bench --benchmark_min_time=0.2
#include <benchmark/benchmark.h>

#include <memory>

#include "absl/strings/str_cat.h"
#include "slicesched/gmg/gmg.h"
#include "slicesched/gmg/llama.h"
#include "slicesched/gmg/snapshot.h"

namespace slicesched {
namespace {

struct Server {
  std::unique_ptr<GlobalMappingGraph> g;
  TemplateId prefill, decode;
  LlamaTemplates t;
  int64_t now = 0;
  Timestamp Tick() { return Timestamp::FromNanos(now += 1000); }
};

Server MakeServer() {
  Server s;
  std::vector<DeviceSpec> devs(8);
  for (int d = 0; d < 8; ++d) {
    devs[d].name = absl::StrCat("gpu", d);
    devs[d].type = "A16";
    devs[d].memory = Bytes::GiB(64);
  }
  s.g = std::make_unique<GlobalMappingGraph>(*AcceleratorSet::Create(devs, LinkSpec{12e9, Duration::Micros(20)}));
  s.t = *BuildLlamaTemplates(*LlamaPreset("llama3-8b"));
  s.prefill = *s.g->RegisterTemplate(s.t.prefill);
  s.decode = *s.g->RegisterTemplate(s.t.decode);
  for (int d = 0; d < 8; ++d) {
    for (const OpSpec& op : s.t.prefill->ops()) {
      if (!op.weight_key.empty()) (void)s.g->LoadWeights(DeviceId(d), op.weight_key, op.weight_bytes);
    }
  }
  return s;
}

// Issues every op of an instance on a device pair (pp2), with transfers.
void PlacePp2(Server& s, InstanceId id, int pair) {
  const Instance* inst = s.g->FindInstance(id);
  const CandidatePartition& p = inst->tpl->partitions()[1];
  const DeviceId slots[2] = {DeviceId(2 * pair), DeviceId(2 * pair + 1)};
  for (int op : inst->tpl->topo_order()) (void)s.g->Issue(inst->nodes[op].id, slots[p.slot_of_op[op]], s.Tick());
  for (int op : inst->tpl->topo_order()) {
    for (const InputRef& r : inst->tpl->op(op).inputs) {
      if (r.kind == InputRef::Kind::kOp && p.slot_of_op[r.index] != p.slot_of_op[op]) {
        (void)s.g->IssueTransfer(inst->nodes[r.index].id, r.output, slots[p.slot_of_op[op]],
                                 inst->nodes[op].id, 0, s.Tick());
      }
    }
  }
}

void RunAll(Server& s, InstanceId id) {
  while (const Instance* inst = s.g->FindInstance(id)) {
    NodeId next;
    for (const OpNode& n : inst->nodes) {
      if (s.g->IsReady(n.id)) { next = n.id; break; }
    }
    if (!next.valid()) {
      for (NodeId t : inst->transfers) {
        if (s.g->IsReady(t)) { next = t; break; }
      }
    }
    if (!next.valid()) return;
    (void)s.g->Start(next, s.Tick());
    (void)s.g->Finish(next, s.Tick());
  }
}

// N live instances: conversations whose prefill is done and whose next decode
// step is live (a third unscheduled, a third issued, a third partly run),
// plus fresh prefills.
Server MakeLoaded(int live) {
  Server s = MakeServer();
  const int conversations = live * 2 / 3;
  for (int c = 0; c < conversations; ++c) {
    InstanceSpec ps;
    ps.template_id = s.prefill;
    ps.bindings = {{"B", 1}, {"S", 256 + (c * 37) % 2048}};
    ps.priority_class = PriorityClass::kOnline;
    ps.arrival = s.Tick();
    InstanceId pre = *s.g->Instantiate(ps);
    PlacePp2(s, pre, c % 4);
    RunAll(s, pre);
    std::vector<CheckpointId> kv = s.g->TakeRetired().back().produced;
    InstanceSpec ds;
    ds.template_id = s.decode;
    ds.bindings = {{"B", 1}, {"C", ps.bindings[1].second}};
    ds.priority_class = PriorityClass::kOnline;
    ds.priority = c % 5;
    ds.arrival = s.Tick();
    for (size_t k = 0; k < kv.size(); ++k) ds.checkpoints.emplace_back(absl::StrCat("kv", k), kv[k]);
    InstanceId dec = *s.g->Instantiate(ds);
    if (c % 3 >= 1) PlacePp2(s, dec, c % 4);
    if (c % 3 == 2) {
      const Instance* inst = s.g->FindInstance(dec);
      NodeId first = inst->nodes[0].id;
      if (s.g->IsReady(first) && !s.g->running_compute(inst->nodes[0].device).valid()) {
        (void)s.g->Start(first, s.Tick());
        (void)s.g->Finish(first, s.Tick());
      }
    }
  }
  for (int k = conversations; k < live; ++k) {
    InstanceSpec ps;
    ps.template_id = s.prefill;
    ps.bindings = {{"B", 1 + k % 4}, {"S", 2048}};
    ps.priority_class = PriorityClass::kOffline;
    ps.arrival = s.Tick();
    (void)s.g->Instantiate(ps);
  }
  return s;
}

void BM_InstantiateAndRetire(benchmark::State& state) {
  Server s = MakeServer();
  int64_t i = 0;
  for (auto _ : state) {
    InstanceSpec ps;
    ps.template_id = s.prefill;
    ps.bindings = {{"B", 1}, {"S", 128 + (i++ % 1024)}};
    ps.arrival = s.Tick();
    InstanceId id = *s.g->Instantiate(ps);
    benchmark::DoNotOptimize(id);
    (void)s.g->CancelInstance(id, "bench", s.Tick());
  }
  state.SetItemsProcessed(state.iterations());
  (void)s.g->TakeRetired();
}
BENCHMARK(BM_InstantiateAndRetire);

void BM_InstantiateIssueRun(benchmark::State& state) {
  Server s = MakeServer();
  int64_t i = 0;
  for (auto _ : state) {
    InstanceSpec ps;
    ps.template_id = s.prefill;
    ps.bindings = {{"B", 1}, {"S", 128 + (i % 1024)}};
    ps.arrival = s.Tick();
    InstanceId id = *s.g->Instantiate(ps);
    PlacePp2(s, id, static_cast<int>(i++ % 4));
    RunAll(s, id);
    for (const RetiredInstance& r : s.g->TakeRetired()) {
      for (CheckpointId c : r.produced) (void)s.g->ReleaseCheckpoint(c);
    }
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_InstantiateIssueRun);

void BM_Snapshot(benchmark::State& state) {
  Server s = MakeLoaded(static_cast<int>(state.range(0)));
  size_t nodes = 0, bytes = 0;
  GmgSnapshot snap;  // reused, as the scheduler does
  for (auto _ : state) {
    s.g->SnapshotInto(Timestamp::FromNanos(s.now), &snap);
    benchmark::DoNotOptimize(snap.nodes.data());
  }
  nodes = snap.nodes.size();
  bytes = snap.ByteSize();
  state.counters["live_instances"] = static_cast<double>(s.g->num_instances());
  state.counters["nodes"] = static_cast<double>(nodes);
  state.counters["snapshot_KiB"] = static_cast<double>(bytes) / 1024.0;
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(nodes));
}
BENCHMARK(BM_Snapshot)->Arg(100)->Arg(1000)->Arg(5000)->Unit(benchmark::kMicrosecond);

void BM_SnapshotCopy(benchmark::State& state) {
  Server s = MakeLoaded(static_cast<int>(state.range(0)));
  GmgSnapshot snap = s.g->Snapshot(Timestamp::FromNanos(s.now));
  GmgSnapshot copy;
  for (auto _ : state) {
    copy = snap;  // vector assignment reuses the destination's capacity
    benchmark::DoNotOptimize(copy.nodes.data());
  }
  state.counters["nodes"] = static_cast<double>(snap.nodes.size());
}
BENCHMARK(BM_SnapshotCopy)->Arg(1000)->Unit(benchmark::kMicrosecond);

void BM_VerifyInvariants(benchmark::State& state) {
  Server s = MakeLoaded(static_cast<int>(state.range(0)));
  for (auto _ : state) {
    absl::Status st = s.g->VerifyInvariants();
    if (!st.ok()) state.SkipWithError(std::string(st.message()).c_str());
  }
}
BENCHMARK(BM_VerifyInvariants)->Arg(1000)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace slicesched

BENCHMARK_MAIN();
