#include "slicesched/sim/simulator.h"

#include <algorithm>
#include <map>
#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "slicesched/gmg/gmg.h"
#include "slicesched/sim/queue_discipline.h"

namespace slicesched {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kMs = 1000000;
Timestamp T(int64_t ms) { return Timestamp::FromNanos(ms * kMs); }

// Templates of generic ops (feature basis [1]) whose durations are set by
// estimator priors, on devices with 1 GB/s, 0-latency links (1 byte = 1 ns).
class SimTest : public ::testing::Test {
 protected:
  void SetUpCluster(int devices, Bytes capacity = Bytes::GiB(1)) {
    std::vector<DeviceSpec> devs(devices);
    for (int d = 0; d < devices; ++d) {
      devs[d].name = "d" + std::to_string(d);
      devs[d].type = "cpu";
      devs[d].memory = capacity;
    }
    g_ = std::make_unique<GlobalMappingGraph>(*AcceleratorSet::Create(devs, LinkSpec{1e9, Duration::Zero()}));
    transfers_ = std::make_unique<TransferEstimator>(g_->accelerators());
    ctx_ = std::make_unique<SimContext>(&g_->templates(), &ops_, transfers_.get());
  }
  // ops: name -> (inputs, output bytes, duration ms, retained)
  struct OpDef {
    std::string name;
    std::vector<std::string> inputs;
    int64_t out_bytes;
    double ms;
    bool retain = false;
    int64_t workspace = 0;
  };
  TemplateId Register(const std::string& name, const std::vector<OpDef>& ops) {
    TemplateBuilder b(name);
    for (const OpDef& op : ops) {
      b.Op(op.name, OpKind::kGeneric).Inputs(op.inputs);
      b.Output("out", DType::kU8, {std::to_string(op.out_bytes)});
      if (op.retain) b.RetainedOutput("keep", DType::kU8, {"64"});
      b.Workspace(std::to_string(op.workspace));
    }
    TemplateId id = *g_->RegisterTemplate(*b.Build());
    const GraphTemplate* tpl = g_->templates().Find(id);
    for (size_t i = 0; i < ops.size(); ++i) {
      const double ns = ops[i].ms * kMs;
      EXPECT_TRUE(ops_.SetPrior(ctx_->OpKey("cpu", id.value(), static_cast<int>(i)), std::vector<double>{ns}).ok());
    }
    (void)tpl;
    return id;
  }
  InstanceId New(TemplateId t, PriorityClass cls = PriorityClass::kOffline, int prio = 0) {
    InstanceSpec s;
    s.template_id = t;
    s.priority_class = cls;
    s.priority = prio;
    return *g_->Instantiate(s);
  }
  NodeId N(InstanceId i, const char* op) { return *g_->NodeOf(i, op); }
  void IssueOn(InstanceId i, const char* op, int d, Timestamp now = T(0)) {
    ASSERT_TRUE(g_->Issue(N(i, op), DeviceId(d), now).ok());
  }
  uint32_t Index(const GmgSnapshot& s, NodeId id) {
    for (uint32_t n = 0; n < s.nodes.size(); ++n) {
      if (s.nodes[n].id == id.value()) return n;
    }
    ADD_FAILURE() << "node not in snapshot";
    return 0;
  }
  SimResult RunAt(Timestamp now, GmgSnapshot* snap, const SimOptions& o = {}) {
    *snap = g_->Snapshot(now);
    auto sim = Simulator::Create(*snap, *ctx_);
    EXPECT_TRUE(sim.ok()) << sim.status();
    return sim->Run(o);
  }

  std::unique_ptr<GlobalMappingGraph> g_;
  OpEstimator ops_;
  std::unique_ptr<TransferEstimator> transfers_;
  std::unique_ptr<SimContext> ctx_;
};

// The ready queue pops in RunsBefore order through many pushes and pops
// (its buckets drop their popped prefix as they go), including out-of-order
// ready times and buckets that never empty. Checked against a plain scan;
// Front() always names the key Pop() returns next.
TEST(ReadyQueueTest, PopsInRunsBeforeOrderThroughLongRuns) {
  std::mt19937_64 rng(7);
  ReadyQueue q;
  std::vector<std::pair<DisciplineKey, uint32_t>> ref;
  int64_t now = 0;
  uint32_t next_item = 0;
  int popped = 0;
  for (int step = 0; step < 20000; ++step) {
    // Pushes outnumber pops early on, so the buckets stay long-lived.
    const bool push = ref.empty() || rng() % 100 < (step < 10000 ? 55u : 45u);
    if (push) {
      DisciplineKey k;
      k.priority_class = static_cast<uint8_t>(rng() % 2);
      k.priority = static_cast<int32_t>(rng() % 3);
      now += static_cast<int64_t>(rng() % 3);
      // Mostly nondecreasing ready times, as in a run; some arrive late.
      k.ready_ns = rng() % 10 == 0 ? now - static_cast<int64_t>(rng() % 50) : now;
      k.tiebreak = rng() % 1000;
      q.Push(k, next_item);
      ref.push_back({k, next_item});
      ++next_item;
    } else {
      auto best = ref.begin();
      for (auto it = ref.begin(); it != ref.end(); ++it) {
        if (RunsBefore(it->first, best->first) ||
            (!RunsBefore(best->first, it->first) && it->second < best->second)) {
          best = it;
        }
      }
      // Front() names the key Pop() then returns.
      const DisciplineKey front = q.Front();
      DisciplineKey got;
      const uint32_t item = q.Pop(&got);
      ASSERT_EQ(front.priority_class, got.priority_class) << "pop " << popped;
      ASSERT_EQ(front.priority, got.priority) << "pop " << popped;
      ASSERT_EQ(front.ready_ns, got.ready_ns) << "pop " << popped;
      ASSERT_EQ(front.tiebreak, got.tiebreak) << "pop " << popped;
      // Equal keys may pop in either order; the key itself must match.
      ASSERT_EQ(got.priority_class, best->first.priority_class) << "pop " << popped;
      ASSERT_EQ(got.priority, best->first.priority) << "pop " << popped;
      ASSERT_EQ(got.ready_ns, best->first.ready_ns) << "pop " << popped;
      ASSERT_EQ(got.tiebreak, best->first.tiebreak) << "pop " << popped;
      auto match = std::find_if(ref.begin(), ref.end(), [&](const auto& e) { return e.second == item; });
      ASSERT_NE(match, ref.end());
      ref.erase(match);
      ++popped;
    }
    ASSERT_EQ(q.size(), ref.size());
  }
  EXPECT_GT(popped, 8000);
}

// A master that ranks its instances first-come first-served gives every
// instance a priority of its own (each lower than the one before). The queue
// still pops in RunsBefore order (the oldest instance's operators first), and
// holds buckets only for the priorities it has work for, plus at most
// kKeepBuckets empty ones, not one per priority it ever saw.
TEST(ReadyQueueTest, FirstComeFirstServedPrioritiesKeepFewBuckets) {
  std::mt19937_64 rng(11);
  ReadyQueue q;
  std::vector<std::pair<DisciplineKey, uint32_t>> ref;
  int64_t now = 0;
  uint32_t next_item = 0;
  int32_t next_priority = 0;
  size_t most_buckets = 0;
  int popped = 0;
  // Up to 4 instances in flight, 5 operators each, as the overhead harness.
  std::vector<int32_t> live;
  for (int step = 0; step < 20000; ++step) {
    if (live.size() < 4 && rng() % 3 == 0) live.push_back(next_priority--);
    const bool push = ref.empty() || rng() % 2 == 0;
    if (push && !live.empty()) {
      DisciplineKey k;
      k.priority_class = 0;
      k.priority = live[rng() % live.size()];
      now += static_cast<int64_t>(rng() % 3);
      k.ready_ns = now;
      k.tiebreak = next_item;
      q.Push(k, next_item);
      ref.push_back({k, next_item});
      ++next_item;
    } else if (!ref.empty()) {
      auto best = ref.begin();
      for (auto it = ref.begin(); it != ref.end(); ++it) {
        if (RunsBefore(it->first, best->first)) best = it;
      }
      DisciplineKey got;
      const uint32_t item = q.Pop(&got);
      ASSERT_EQ(item, best->second) << "pop " << popped;
      ASSERT_EQ(got.priority, best->first.priority) << "pop " << popped;
      ASSERT_EQ(got.ready_ns, best->first.ready_ns) << "pop " << popped;
      ref.erase(best);
      ++popped;
    }
    // An instance retires once it has no work left (sometimes).
    if (live.size() >= 2 && rng() % 2 == 0) {
      const int32_t oldest = live.front();
      if (std::none_of(ref.begin(), ref.end(), [&](const auto& e) { return e.first.priority == oldest; })) {
        live.erase(live.begin());
      }
    }
    ASSERT_EQ(q.size(), ref.size());
    most_buckets = std::max(most_buckets, q.num_buckets());
  }
  EXPECT_GT(popped, 8000);
  EXPECT_LT(next_priority, -300);  // many distinct priorities seen
  EXPECT_LE(most_buckets, ReadyQueue::kKeepBuckets + 1 + 4);
}

// The same with a thousand instances in flight (a master that queues every
// request at once): the buckets of finished instances leave in batches, as
// an empty prefix, and the order stays RunsBefore's throughout.
TEST(ReadyQueueTest, FirstComeFirstServedWithAThousandInstancesInFlight) {
  std::mt19937_64 rng(5);
  ReadyQueue q;
  // Reference: per instance (priority -i), its queued items in push order;
  // an instance's items are pushed with nondecreasing ready times.
  constexpr int kInstances = 1000;
  constexpr int kOps = 5;
  std::vector<std::vector<std::pair<DisciplineKey, uint32_t>>> queued(kInstances);
  int64_t now = 0;
  uint32_t next_item = 0;
  for (int i = 0; i < kInstances; ++i) {  // every instance's first operator
    DisciplineKey k{0, -i, now++, next_item};
    q.Push(k, next_item);
    queued[i].push_back({k, next_item++});
  }
  std::vector<int> left(kInstances, kOps - 1);  // operators still to push
  size_t most_buckets = 0, fewest_buckets = q.num_buckets();
  int first_live = 0;  // no instance before it has items queued
  int popped = 0;
  while (!q.empty()) {
    while (queued[first_live].empty()) ++first_live;
    // The oldest instance with queued items runs first (highest priority),
    // its earliest item (ready time, then tiebreak) first.
    const std::pair<DisciplineKey, uint32_t> want = queued[first_live].front();
    DisciplineKey got;
    ASSERT_EQ(q.Pop(&got), want.second) << "pop " << popped;
    ASSERT_EQ(got.priority, want.first.priority) << "pop " << popped;
    queued[first_live].erase(queued[first_live].begin());
    ++popped;
    // The popped operator's successor, and now and then another instance's
    // next operator, become ready.
    for (int inst : {first_live, static_cast<int>(rng() % kInstances)}) {
      if (left[inst] == 0) continue;
      --left[inst];
      first_live = std::min(first_live, inst);
      DisciplineKey k{0, -inst, now++, next_item};
      q.Push(k, next_item);
      queued[inst].push_back({k, next_item++});
    }
    most_buckets = std::max(most_buckets, q.num_buckets());
    fewest_buckets = std::min(fewest_buckets, q.num_buckets());
  }
  EXPECT_EQ(popped, kInstances * kOps);
  EXPECT_EQ(most_buckets, static_cast<size_t>(kInstances));
  EXPECT_LE(fewest_buckets, ReadyQueue::kKeepBuckets + 1);
  // The last pop dropped every emptied bucket beyond the few kept.
  q.Push(DisciplineKey{0, -kInstances, now, next_item}, next_item);
  EXPECT_LE(q.num_buckets(), ReadyQueue::kKeepBuckets + 1);
  EXPECT_EQ(q.Pop(), next_item);
}

TEST_F(SimTest, ChainOnOneDevice) {
  SetUpCluster(1);
  TemplateId t = Register("chain", {{"a", {}, 100, 10}, {"b", {"a"}, 100, 20}, {"c", {"b"}, 100, 30}});
  InstanceId i = New(t);
  for (const char* op : {"a", "b", "c"}) IssueOn(i, op, 0);
  GmgSnapshot snap;
  SimResult r = RunAt(T(0), &snap);
  EXPECT_EQ(r.node_end_ns[Index(snap, N(i, "a"))], 10 * kMs);
  EXPECT_EQ(r.node_end_ns[Index(snap, N(i, "b"))], 30 * kMs);
  EXPECT_EQ(r.node_end_ns[Index(snap, N(i, "c"))], 60 * kMs);
  EXPECT_EQ(r.instance_end_ns[0], 60 * kMs);
  EXPECT_EQ(r.simulated_ops, 3);
  EXPECT_FALSE(r.oom);
}

// The reconstruction names what the snapshot says runs and is resident:
// complete output copies (the producer's and a transferred one), the
// checkpoint a retained output became, but not the output of a running
// operator.
TEST_F(SimTest, ResidentBuffersAndRunningNodesFromTheSnapshot) {
  SetUpCluster(2);
  TemplateId t = Register("fan", {{"a", {}, 100, 10, /*retain=*/true}, {"b", {"a"}, 100, 20}, {"c", {"a"}, 100, 5}});
  InstanceId i = New(t);
  IssueOn(i, "a", 0);
  IssueOn(i, "b", 1);
  IssueOn(i, "c", 0);
  auto x = g_->IssueTransfer(N(i, "a"), 0, DeviceId(1), N(i, "b"), 0, T(0));
  ASSERT_TRUE(x.ok()) << x.status();
  ASSERT_TRUE(g_->Start(N(i, "a"), T(0)).ok());
  ASSERT_TRUE(g_->Finish(N(i, "a"), T(10)).ok());
  ASSERT_TRUE(g_->Start(*x, T(10)).ok());
  ASSERT_TRUE(g_->Finish(*x, T(11)).ok());
  ASSERT_TRUE(g_->Start(N(i, "b"), T(11)).ok());
  ASSERT_EQ(g_->checkpoint_index().size(), 1u);
  const uint64_t ckpt = g_->checkpoint_index().begin()->first;
  const GmgSnapshot snap = g_->Snapshot(T(12));
  auto sim = Simulator::Create(snap, *ctx_);
  ASSERT_TRUE(sim.ok()) << sim.status();
  EXPECT_EQ(sim->running(0), GmgSnapshot::kNone);
  EXPECT_EQ(sim->running(1), Index(snap, N(i, "b")));
  const uint64_t a = N(i, "a").value();
  const std::vector<SimResidentBuffer> want = {{a, 0, 0}, {a, 0, 1}, {ckpt, -1, 0}};
  std::vector<SimResidentBuffer> sorted_want = want;
  std::sort(sorted_want.begin(), sorted_want.end());
  EXPECT_EQ(sim->ResidentBuffers(), sorted_want);
  // c and b consume a's output: once both are done it is freed everywhere.
  ASSERT_TRUE(g_->Finish(N(i, "b"), T(31)).ok());
  ASSERT_TRUE(g_->Start(N(i, "c"), T(31)).ok());
  ASSERT_TRUE(g_->Finish(N(i, "c"), T(36)).ok());
  const GmgSnapshot after = g_->Snapshot(T(40));
  auto sim2 = Simulator::Create(after, *ctx_);
  ASSERT_TRUE(sim2.ok()) << sim2.status();
  EXPECT_EQ(sim2->ResidentBuffers(), (std::vector<SimResidentBuffer>{{ckpt, -1, 0}}));
}

TEST_F(SimTest, SimultaneousCompletionsAreDeterministic) {
  SetUpCluster(2);
  TemplateId t = Register("pair", {{"a", {}, 10, 10}, {"b", {"a"}, 10, 10}});
  InstanceId i = New(t), j = New(t);
  IssueOn(i, "a", 0);
  IssueOn(i, "b", 0);
  IssueOn(j, "a", 1);
  IssueOn(j, "b", 1);
  GmgSnapshot snap;
  SimResult r1 = RunAt(T(0), &snap);
  auto sim = Simulator::Create(snap, *ctx_);
  SimResult r2 = sim->Run();
  EXPECT_EQ(r1.node_end_ns, r2.node_end_ns);
  EXPECT_EQ(r1.instance_end_ns, (std::vector<int64_t>{20 * kMs, 20 * kMs}));
}

TEST_F(SimTest, ZeroDurationOperators) {
  SetUpCluster(1);
  TemplateId t = Register("zero", {{"a", {}, 10, 0}, {"b", {"a"}, 10, 0}, {"c", {"b"}, 10, 5}});
  InstanceId i = New(t);
  for (const char* op : {"a", "b", "c"}) IssueOn(i, op, 0);
  GmgSnapshot snap;
  SimResult r = RunAt(T(7), &snap);
  EXPECT_EQ(r.node_start_ns[Index(snap, N(i, "b"))], 7 * kMs);
  EXPECT_EQ(r.node_end_ns[Index(snap, N(i, "b"))], 7 * kMs);
  EXPECT_EQ(r.node_end_ns[Index(snap, N(i, "c"))], 12 * kMs);
}

TEST_F(SimTest, QueueDisciplineRunsOnlineFirst) {
  SetUpCluster(1);
  TemplateId t = Register("one", {{"a", {}, 10, 10}});
  InstanceId off = New(t, PriorityClass::kOffline, 9);
  InstanceId on = New(t, PriorityClass::kOnline, 0);
  IssueOn(off, "a", 0);
  IssueOn(on, "a", 0);
  GmgSnapshot snap;
  SimResult r = RunAt(T(0), &snap);
  EXPECT_EQ(r.node_end_ns[Index(snap, N(on, "a"))], 10 * kMs);
  EXPECT_EQ(r.node_end_ns[Index(snap, N(off, "a"))], 20 * kMs);
}

// The simulator uses the snapshot index as the discipline's tiebreak when
// node ids grow with it (as the GMG numbers them) and ranks the ids
// otherwise: the lower id still runs first.
TEST_F(SimTest, TiebreakIsTheNodeIdWhateverTheIndexOrder) {
  SetUpCluster(1);
  TemplateId t = Register("one", {{"a", {}, 10, 10}});
  InstanceId i = New(t), j = New(t);
  IssueOn(i, "a", 0);
  IssueOn(j, "a", 0);
  GmgSnapshot snap = g_->Snapshot(T(0));
  const uint32_t ni = Index(snap, N(i, "a")), nj = Index(snap, N(j, "a"));
  ASSERT_LT(ni, nj);
  auto run = [&] {
    auto sim = Simulator::Create(snap, *ctx_);
    EXPECT_TRUE(sim.ok()) << sim.status();
    return sim->Run();
  };
  SimResult r = run();
  EXPECT_EQ(r.node_end_ns[ni], 10 * kMs);
  EXPECT_EQ(r.node_end_ns[nj], 20 * kMs);
  // Swap the ids: node nj now has the lower one and goes first.
  std::swap(snap.nodes[ni].id, snap.nodes[nj].id);
  r = run();
  EXPECT_EQ(r.node_end_ns[nj], 10 * kMs);
  EXPECT_EQ(r.node_end_ns[ni], 20 * kMs);
}

// An operator reading one tensor through two inputs waits for both: it
// starts once the single transfer of that tensor has arrived.
// The same snapshot with its compute nodes in another order (`order[k]` is
// the old index of new node k; no transfers, copies or checkpoints): each
// node moves with its inputs, outputs and attributes, tensors follow their
// producers.
GmgSnapshot PermuteComputeNodes(const GmgSnapshot& s, const std::vector<uint32_t>& order) {
  GmgSnapshot p = s;
  std::vector<uint32_t> new_index(order.size()), new_tensor(s.tensors.size());
  for (uint32_t k = 0; k < order.size(); ++k) new_index[order[k]] = k;
  p.nodes.clear();
  p.tensors.clear();
  p.attrs.clear();
  p.inputs.clear();
  p.tensor_offsets = {0};
  p.attr_offsets = {0};
  p.input_offsets = {0};
  for (uint32_t old : order) {
    p.nodes.push_back(s.nodes[old]);
    for (uint32_t t = s.tensor_offsets[old]; t < s.tensor_offsets[old + 1]; ++t) {
      new_tensor[t] = static_cast<uint32_t>(p.tensors.size());
      p.tensors.push_back(s.tensors[t]);
      p.tensors.back().node = new_index[old];
    }
    p.tensor_offsets.push_back(static_cast<uint32_t>(p.tensors.size()));
    p.attrs.insert(p.attrs.end(), s.attrs.begin() + s.attr_offsets[old], s.attrs.begin() + s.attr_offsets[old + 1]);
    p.attr_offsets.push_back(static_cast<uint32_t>(p.attrs.size()));
  }
  for (uint32_t old : order) {
    for (uint32_t k = s.input_offsets[old]; k < s.input_offsets[old + 1]; ++k) {
      p.inputs.push_back(new_tensor[s.inputs[k]]);
    }
    p.input_offsets.push_back(static_cast<uint32_t>(p.inputs.size()));
  }
  return p;
}

// Construction does not assume that producers come before their consumers
// in the snapshot's node order (a GMG snapshot's order, which it fills the
// consumer lists by): listed consumer first, the result is the same. Two
// consumers of one output become ready together, so the order of its
// consumer list (and with it the event sequence) is exercised too.
TEST_F(SimTest, ConsumersListedBeforeTheirProducer) {
  SetUpCluster(2);
  TemplateId t = Register("fan", {{"a", {}, 100, 1}, {"b", {"a"}, 100, 2}, {"c", {"a"}, 100, 3},
                                  {"d", {"b", "c"}, 100, 1}});
  InstanceId i = New(t);
  IssueOn(i, "a", 0);
  IssueOn(i, "b", 0);
  IssueOn(i, "c", 0);
  IssueOn(i, "d", 0);
  InstanceId j = New(t);
  for (const char* op : {"a", "b", "c", "d"}) IssueOn(j, op, 1);
  GmgSnapshot snap;
  const SimResult want = RunAt(T(0), &snap);
  ASSERT_EQ(snap.num_compute_nodes, 8u);
  // Every consumer before its producers: d, b, c, a of each instance (b
  // stays before c: a finish wakes its consumers in index order, and the
  // first one woken on an idle device starts at once).
  const std::vector<uint32_t> order = {3, 1, 2, 0, 7, 5, 6, 4};
  const GmgSnapshot perm = PermuteComputeNodes(snap, order);
  auto sim = Simulator::Create(perm, *ctx_);
  ASSERT_TRUE(sim.ok()) << sim.status();
  const SimResult got = sim->Run();
  for (uint32_t k = 0; k < order.size(); ++k) {
    EXPECT_EQ(got.node_start_ns[k], want.node_start_ns[order[k]]) << "node " << order[k];
    EXPECT_EQ(got.node_end_ns[k], want.node_end_ns[order[k]]) << "node " << order[k];
  }
  EXPECT_EQ(got.instance_end_ns, want.instance_end_ns);
  EXPECT_EQ(got.peak_bytes, want.peak_bytes);
  EXPECT_EQ(got.final_bytes, want.final_bytes);
  // a 0..1 ms, b 1..3, c 3..6, d 6..7 on each device.
  EXPECT_EQ(want.node_end_ns[Index(snap, N(i, "d"))], 7 * kMs);
  EXPECT_EQ(want.node_end_ns[Index(snap, N(i, "c"))], 6 * kMs);
}

TEST_F(SimTest, OperatorReadingATensorTwice) {
  SetUpCluster(2);
  TemplateId t = Register("twice", {{"a", {}, 2 * kMs, 3}, {"b", {"a", "a"}, 10, 1}, {"c", {"a"}, 10, 1}});
  InstanceId i = New(t);
  IssueOn(i, "a", 0);
  IssueOn(i, "b", 1);
  IssueOn(i, "c", 0);
  auto x = g_->IssueTransfer(N(i, "a"), 0, DeviceId(1), N(i, "b"), 0, T(0));
  ASSERT_TRUE(x.ok()) << x.status();
  GmgSnapshot snap;
  SimResult r = RunAt(T(0), &snap);
  const uint32_t b = Index(snap, N(i, "b"));
  ASSERT_EQ(snap.input_offsets[b + 1] - snap.input_offsets[b], 2u);
  // a ends at 3 ms; its 2 MB take 2 ms to d1; b runs 5..6 ms, c 3..4 ms.
  EXPECT_EQ(r.node_end_ns[Index(snap, *x)], 5 * kMs);
  EXPECT_EQ(r.node_start_ns[b], 5 * kMs);
  EXPECT_EQ(r.node_end_ns[b], 6 * kMs);
  EXPECT_EQ(r.node_end_ns[Index(snap, N(i, "c"))], 4 * kMs);
  EXPECT_EQ(r.simulated_ops, 4);
}

// A snapshot naming a template the registry lacks is refused, also when
// it follows instances of a known one.
TEST_F(SimTest, UnknownTemplateIsAnError) {
  SetUpCluster(1);
  TemplateId t = Register("one", {{"a", {}, 10, 10}});
  InstanceId i = New(t), j = New(t);
  IssueOn(i, "a", 0);
  IssueOn(j, "a", 0);
  GmgSnapshot snap = g_->Snapshot(T(0));
  ASSERT_EQ(snap.instances.size(), 2u);
  ASSERT_TRUE(Simulator::Create(snap, *ctx_).ok());
  snap.instances[1].template_id = 999;
  auto sim = Simulator::Create(snap, *ctx_);
  EXPECT_EQ(sim.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(sim.status().message(), HasSubstr("template 999 unknown"));
}

// Each node's duration comes from the estimator of its own (device type,
// template, op), with instances of several templates interleaved over two
// device types, and template ids both below and above the ones the
// construction maps directly (it keeps a table per template and type).
TEST_F(SimTest, DurationsFollowEachNodesTemplateAndDeviceType) {
  std::vector<DeviceSpec> devs(3);
  for (int d = 0; d < 3; ++d) {
    devs[d].name = "d" + std::to_string(d);
    devs[d].type = d == 1 ? "fast" : "slow";
    devs[d].memory = Bytes::GiB(1);
  }
  g_ = std::make_unique<GlobalMappingGraph>(*AcceleratorSet::Create(devs, LinkSpec{1e9, Duration::Zero()}));
  transfers_ = std::make_unique<TransferEstimator>(g_->accelerators());
  ctx_ = std::make_unique<SimContext>(&g_->templates(), &ops_, transfers_.get());
  // Three templates of two ops; pad the registry so that the last one's id
  // is past 64.
  auto make = [&](const std::string& name) {
    TemplateBuilder b(name);
    b.Op("a", OpKind::kGeneric).Inputs({});
    b.Output("out", DType::kU8, {"8"});
    b.Op("b", OpKind::kGeneric).Inputs({"a"});
    b.Output("out", DType::kU8, {"8"});
    return *g_->RegisterTemplate(*b.Build());
  };
  std::vector<TemplateId> tpls{make("t0"), make("t1")};
  for (int k = 0; k < 70; ++k) make("pad" + std::to_string(k));
  tpls.push_back(make("t2"));
  ASSERT_GE(tpls[2].value(), 64u);
  // Duration (ns) of (type, template k, op): distinct for every triple.
  auto ns = [](const std::string& type, int k, int op) { return (type == "fast" ? 1000 : 2000) + 100 * k + 10 * op; };
  for (const char* type : {"slow", "fast"}) {
    for (int k = 0; k < 3; ++k) {
      for (int op = 0; op < 2; ++op) {
        ASSERT_TRUE(ops_.SetPrior(ctx_->OpKey(type, tpls[k].value(), op), std::vector<double>{double(ns(type, k, op))}).ok());
      }
    }
  }
  // Twelve instances cycling through the templates; op a and op b of an
  // instance on different devices for some.
  struct Placed {
    InstanceId inst;
    int k, dev_a, dev_b;
  };
  std::vector<Placed> placed;
  for (int j = 0; j < 12; ++j) {
    const int k = (j * 2) % 3;
    InstanceId i = New(tpls[k]);
    const int da = j % 3, db = (j / 3) % 2 == 0 ? da : (da + 1) % 3;
    IssueOn(i, "a", da);
    IssueOn(i, "b", db);
    if (db != da) {
      ASSERT_TRUE(g_->IssueTransfer(N(i, "a"), 0, DeviceId(db), N(i, "b"), 0, T(0)).ok());
    }
    placed.push_back({i, k, da, db});
  }
  GmgSnapshot snap = g_->Snapshot(T(0));
  auto sim = Simulator::Create(snap, *ctx_);
  ASSERT_TRUE(sim.ok()) << sim.status();
  auto type = [](int d) { return std::string(d == 1 ? "fast" : "slow"); };
  for (const Placed& p : placed) {
    EXPECT_EQ(sim->duration_ns(Index(snap, N(p.inst, "a"))), ns(type(p.dev_a), p.k, 0));
    EXPECT_EQ(sim->duration_ns(Index(snap, N(p.inst, "b"))), ns(type(p.dev_b), p.k, 1));
  }
}

TEST_F(SimTest, TransferHeldBackByArbitration) {
  SetUpCluster(3);
  // a on d0 feeds b on d1 and c on d2: two transfers out of d0 at once.
  TemplateId t = Register("fan", {{"a", {}, 5 * kMs, 1}, {"b", {"a"}, 1, 1}, {"c", {"a"}, 1, 1}});
  InstanceId i = New(t);
  IssueOn(i, "a", 0);
  IssueOn(i, "b", 1);
  IssueOn(i, "c", 2);
  auto tb = g_->IssueTransfer(N(i, "a"), 0, DeviceId(1), N(i, "b"), 1, T(0));
  auto tc = g_->IssueTransfer(N(i, "a"), 0, DeviceId(2), N(i, "c"), 7, T(0));
  ASSERT_TRUE(tb.ok() && tc.ok());
  GmgSnapshot snap;
  SimResult r = RunAt(T(0), &snap);
  // 5 MB at 1 GB/s = 5 ms each; the higher-priority one (to d2) goes first.
  EXPECT_EQ(r.node_start_ns[Index(snap, *tc)], 1 * kMs);
  EXPECT_EQ(r.node_end_ns[Index(snap, *tc)], 6 * kMs);
  EXPECT_EQ(r.node_start_ns[Index(snap, *tb)], 6 * kMs);
  EXPECT_EQ(r.node_end_ns[Index(snap, *tb)], 11 * kMs);
  EXPECT_EQ(r.node_end_ns[Index(snap, N(i, "b"))], 12 * kMs);
  EXPECT_EQ(r.node_end_ns[Index(snap, N(i, "c"))], 7 * kMs);
  // Buffers: both destinations held a copy while the tensor was live.
  EXPECT_EQ(r.peak_bytes[1], 5 * kMs + 1);
}

// The same fan-out with the higher-priority transfer issued first (so woken
// first): the rule sees both transfers that one finish makes ready, so the
// priority decides, whichever is woken first.
TEST_F(SimTest, TransfersMadeReadyTogetherAreArbitratedTogether) {
  for (const bool high_first : {true, false}) {
    SCOPED_TRACE(high_first ? "high priority issued first" : "high priority issued last");
    SetUpCluster(4);
    TemplateId t =
        Register("fan3", {{"a", {}, 5 * kMs, 1}, {"b", {"a"}, 1, 1}, {"c", {"a"}, 1, 1}, {"e", {"a"}, 1, 1}});
    InstanceId i = New(t);
    IssueOn(i, "a", 0);
    IssueOn(i, "b", 1);
    IssueOn(i, "c", 2);
    IssueOn(i, "e", 3);
    std::vector<std::pair<int, int>> order = {{2, 7}, {3, 4}, {1, 1}};  // (destination, priority)
    if (!high_first) std::reverse(order.begin(), order.end());
    std::map<int, NodeId> hop;
    for (const auto& [dst, prio] : order) {
      const char* op = dst == 1 ? "b" : dst == 2 ? "c" : "e";
      auto x = g_->IssueTransfer(N(i, "a"), 0, DeviceId(dst), N(i, op), prio, T(0));
      ASSERT_TRUE(x.ok());
      hop[dst] = *x;
    }
    GmgSnapshot snap;
    SimResult r = RunAt(T(0), &snap);
    // a ends at 1 ms; 5 ms per hop, one at a time out of d0, by priority.
    EXPECT_EQ(r.node_start_ns[Index(snap, hop[2])], 1 * kMs);
    EXPECT_EQ(r.node_start_ns[Index(snap, hop[3])], 6 * kMs);
    EXPECT_EQ(r.node_start_ns[Index(snap, hop[1])], 11 * kMs);
  }
}

// Hand-off gaps (TransferEstimator): none learned, a consumer starts when
// its transfer's link time ends; once learned, its bytes arrive launch +
// delivery gap later, while the link's slots are free at the link's end (the
// next transfer out of the source starts then).
TEST_F(SimTest, LearnedHandoffGapsDelayOnlyTheConsumer) {
  SetUpCluster(3);
  TemplateId t = Register("fan", {{"a", {}, 2 * kMs, 1}, {"b", {"a"}, 1, 1}, {"c", {"a"}, 1, 1}});
  InstanceId i = New(t);
  IssueOn(i, "a", 0);
  IssueOn(i, "b", 1);
  IssueOn(i, "c", 2);
  auto xc = g_->IssueTransfer(N(i, "a"), 0, DeviceId(2), N(i, "c"), 1, T(0));
  auto xb = g_->IssueTransfer(N(i, "a"), 0, DeviceId(1), N(i, "b"), 7, T(0));
  ASSERT_TRUE(xb.ok() && xc.ok());
  GmgSnapshot snap;
  SimResult r = RunAt(T(0), &snap);
  // a ends at 1 ms; 2 MB at 1 GB/s take 2 ms; the priority-7 hop goes first.
  EXPECT_EQ(r.node_end_ns[Index(snap, *xb)], 3 * kMs);
  EXPECT_EQ(r.node_start_ns[Index(snap, N(i, "b"))], 3 * kMs);
  EXPECT_EQ(r.node_start_ns[Index(snap, *xc)], 3 * kMs);
  EXPECT_EQ(r.node_start_ns[Index(snap, N(i, "c"))], 5 * kMs);

  transfers_->ObserveLaunchGap(DeviceId(0), DeviceId(1), Duration::Micros(200));
  transfers_->ObserveLaunchGap(DeviceId(0), DeviceId(2), Duration::Micros(400));
  transfers_->ObserveDeliveryGap(DeviceId(1), Duration::Micros(100));
  ASSERT_TRUE(transfers_->handoff_gaps_observed());
  r = RunAt(T(0), &snap);
  constexpr int64_t kUs = 1000;
  EXPECT_EQ(r.node_end_ns[Index(snap, *xb)], 3 * kMs + 300 * kUs);
  EXPECT_EQ(r.node_start_ns[Index(snap, N(i, "b"))], 3 * kMs + 300 * kUs);
  // The second hop still starts at the first one's link end.
  EXPECT_EQ(r.node_start_ns[Index(snap, *xc)], 3 * kMs);
  EXPECT_EQ(r.node_end_ns[Index(snap, *xc)], 5 * kMs + 400 * kUs);
  EXPECT_EQ(r.node_start_ns[Index(snap, N(i, "c"))], 5 * kMs + 400 * kUs);
  EXPECT_EQ(r.simulated_ops, 5);
}

TEST_F(SimTest, OperatorWithInputsOnTwoDevices) {
  SetUpCluster(2);
  TemplateId t = Register("join", {{"a", {}, 1000, 3}, {"b", {}, 2 * kMs, 4}, {"c", {"a", "b"}, 10, 1}});
  InstanceId i = New(t);
  IssueOn(i, "a", 0);
  IssueOn(i, "b", 1);
  IssueOn(i, "c", 0);
  auto x = g_->IssueTransfer(N(i, "b"), 0, DeviceId(0), N(i, "c"), 0, T(0));
  ASSERT_TRUE(x.ok());
  GmgSnapshot snap;
  SimResult r = RunAt(T(0), &snap);
  // b ends at 4 ms; its 2 MB take 2 ms; c starts at 6 ms although a ended at 3.
  EXPECT_EQ(r.node_end_ns[Index(snap, *x)], 6 * kMs);
  EXPECT_EQ(r.node_start_ns[Index(snap, N(i, "c"))], 6 * kMs);
  EXPECT_EQ(r.node_end_ns[Index(snap, N(i, "c"))], 7 * kMs);
}

TEST_F(SimTest, MemoryFreedAtLastConsumerAndCheckpointRetained) {
  SetUpCluster(1);
  // a (1000 B) is read by b and d; b -> c -> d. a's bytes stay until d ends.
  TemplateId t = Register("mem", {{"a", {}, 1000, 1, false, 50},
                                  {"b", {"a"}, 100, 1},
                                  {"c", {"b"}, 10, 1, true},
                                  {"d", {"a", "c"}, 1, 1}});
  InstanceId i = New(t);
  for (const char* op : {"a", "b", "c", "d"}) IssueOn(i, op, 0);
  GmgSnapshot snap;
  SimResult r = RunAt(T(0), &snap);
  // Peak while c runs: a 1000 + b 100 + c 10 + keep 64 (+ a's workspace 50 only while a ran).
  EXPECT_EQ(r.peak_bytes[0], 1000 + 100 + 10 + 64);
  // After d: only the retained 64 bytes remain.
  EXPECT_EQ(r.final_bytes[0], 64);
}

TEST_F(SimTest, OomFoundAtTheRightInstant) {
  SetUpCluster(1, Bytes(1500));
  TemplateId t = Register("big", {{"a", {}, 1000, 10}, {"b", {"a"}, 1000, 10}});
  InstanceId i = New(t);
  IssueOn(i, "a", 0);
  IssueOn(i, "b", 0);
  GmgSnapshot snap;
  SimResult r = RunAt(T(2), &snap);
  EXPECT_TRUE(r.oom);
  EXPECT_EQ(r.oom_device, 0);
  EXPECT_EQ(r.oom_at_ns, 12 * kMs);  // b starts (a's output still live)
  EXPECT_EQ(r.peak_bytes[0], 2000);
}

TEST_F(SimTest, RunningOperatorKeepsItsRemainingTime) {
  SetUpCluster(1);
  TemplateId t = Register("run", {{"a", {}, 10, 10}, {"b", {"a"}, 10, 10}});
  InstanceId i = New(t);
  IssueOn(i, "a", 0);
  IssueOn(i, "b", 0);
  ASSERT_TRUE(g_->Start(N(i, "a"), T(5)).ok());
  GmgSnapshot snap;
  SimResult r = RunAt(T(8), &snap);
  EXPECT_EQ(r.node_end_ns[Index(snap, N(i, "a"))], 15 * kMs);
  EXPECT_EQ(r.node_end_ns[Index(snap, N(i, "b"))], 25 * kMs);
  // Overdue: started at 5 with 10 ms predicted, snapshot at 20 -> ends now.
  SimResult late = RunAt(T(20), &snap);
  EXPECT_EQ(late.node_end_ns[Index(snap, N(i, "a"))], 20 * kMs);
}

TEST_F(SimTest, OutputOfARunningProducerIsNotYetAvailable) {
  // The GMG allocates a running node's output buffer at start; the simulator
  // must still wait for the producer before moving or consuming it.
  SetUpCluster(2);
  TemplateId t = Register("r", {{"a", {}, 1 * kMs, 10}, {"b", {"a"}, 1, 1}, {"c", {"a"}, 1, 1}});
  InstanceId i = New(t);
  IssueOn(i, "a", 0);
  IssueOn(i, "b", 1);
  IssueOn(i, "c", 0);
  auto x = g_->IssueTransfer(N(i, "a"), 0, DeviceId(1), N(i, "b"), 0, T(0));
  ASSERT_TRUE(x.ok());
  ASSERT_TRUE(g_->Start(N(i, "a"), T(0)).ok());
  GmgSnapshot snap;
  SimResult r = RunAt(T(2), &snap);
  EXPECT_EQ(r.node_start_ns[Index(snap, *x)], 10 * kMs);
  EXPECT_EQ(r.node_start_ns[Index(snap, N(i, "c"))], 10 * kMs);
  EXPECT_EQ(r.node_start_ns[Index(snap, N(i, "b"))], 11 * kMs);
}

TEST_F(SimTest, HorizonStopsTheRun) {
  SetUpCluster(1);
  TemplateId t = Register("chain", {{"a", {}, 1, 10}, {"b", {"a"}, 1, 10}, {"c", {"b"}, 1, 10}});
  InstanceId i = New(t);
  for (const char* op : {"a", "b", "c"}) IssueOn(i, op, 0);
  GmgSnapshot snap;
  SimOptions o;
  o.horizon = Duration::Millis(15);
  SimResult r = RunAt(T(0), &snap, o);
  EXPECT_EQ(r.simulated_ops, 1);
  EXPECT_EQ(r.node_end_ns[Index(snap, N(i, "c"))], -1);
  EXPECT_EQ(r.instance_end_ns[0], -1);
}

TEST_F(SimTest, WhatIfPlacesABatchWithoutTouchingTheGmg) {
  SetUpCluster(2);
  TemplateId t = Register("w", {{"a", {}, 3 * kMs, 2}, {"b", {"a"}, 1, 2}});
  InstanceId busy = New(t);
  IssueOn(busy, "a", 0);
  IssueOn(busy, "b", 0);
  InstanceId i = New(t);
  GmgSnapshot snap = g_->Snapshot(T(0));
  auto sim = Simulator::Create(snap, *ctx_);
  ASSERT_TRUE(sim.ok());
  const uint32_t a = Index(snap, N(i, "a")), b = Index(snap, N(i, "b"));
  // Candidate 1: both on the busy device 0 -> wait 4 ms, then 2 + 2.
  std::vector<Placement> same = {{a, 0}, {b, 0}};
  auto r1 = sim->WhatIf(same);
  ASSERT_TRUE(r1.ok()) << r1.status();
  EXPECT_EQ(r1->batch_completed, 2);
  EXPECT_EQ(r1->node_end_ns[b], 8 * kMs);
  EXPECT_EQ(r1->inserted_transfers, 0);
  // Candidate 2: a on idle device 1, b on 0 -> needs a transfer of 3 MB.
  std::vector<Placement> split = {{a, 1}, {b, 0}};
  auto r2 = sim->WhatIf(split);
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(r2->inserted_transfers, 1);
  EXPECT_EQ(r2->node_end_ns[a], 2 * kMs);
  EXPECT_EQ(r2->node_end_ns[b], 7 * kMs);  // transfer 2..5, b waits for device 0 until 4 -> 5..7
  EXPECT_LT(r2->batch_mean_completion_ns, r1->batch_mean_completion_ns);
  // Candidate 3: all on device 1.
  std::vector<Placement> other = {{a, 1}, {b, 1}};
  auto r3 = sim->WhatIf(other);
  EXPECT_EQ(r3->node_end_ns[b], 4 * kMs);
  // Errors name the problem; the GMG is untouched.
  std::vector<Placement> wrong_order = {{b, 0}};
  EXPECT_THAT(sim->WhatIf(wrong_order).status().message(), HasSubstr("neither scheduled nor earlier in the batch"));
  std::vector<Placement> bad_device = {{a, 9}};
  EXPECT_THAT(sim->WhatIf(bad_device).status().message(), HasSubstr("no device 9"));
  std::vector<Placement> scheduled = {{Index(snap, N(busy, "a")), 1}};
  EXPECT_THAT(sim->WhatIf(scheduled).status().message(), HasSubstr("not an unscheduled compute node"));
  EXPECT_EQ(g_->FindNode(N(i, "a"))->state, NodeState::kUnscheduled);
  EXPECT_TRUE(g_->VerifyInvariants().ok());
}

// A placed operator whose inputs both need an inserted transfer waits for
// both (its wait count must survive the node array growing as the first
// transfer is inserted).
TEST_F(SimTest, WhatIfOperatorWaitsForEveryInsertedTransfer) {
  SetUpCluster(3);
  TemplateId t = Register("join", {{"a", {}, 1000, 1}, {"b", {}, 2 * kMs, 1}, {"c", {"a", "b"}, 10, 1}});
  InstanceId i = New(t);
  GmgSnapshot snap = g_->Snapshot(T(0));
  auto sim = Simulator::Create(snap, *ctx_);
  ASSERT_TRUE(sim.ok());
  const uint32_t a = Index(snap, N(i, "a")), b = Index(snap, N(i, "b")), c = Index(snap, N(i, "c"));
  std::vector<Placement> batch = {{a, 0}, {b, 1}, {c, 2}};
  auto r = sim->WhatIf(batch);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->inserted_transfers, 2);
  ASSERT_EQ(r->node_end_ns.size(), snap.nodes.size() + 2);
  const int64_t x1 = r->node_end_ns[snap.nodes.size()], x2 = r->node_end_ns[snap.nodes.size() + 1];
  // a and b end at 1 ms; the transfers share device 2's slot: 1 us, then 2 ms.
  EXPECT_EQ(std::max(x1, x2), 3 * kMs + 1000);
  EXPECT_EQ(r->node_start_ns[c], 3 * kMs + 1000);
  EXPECT_EQ(r->node_end_ns[c], 4 * kMs + 1000);
  EXPECT_EQ(r->batch_completed, 3);
}

TEST_F(SimTest, SnapshotMidRunMatchesTheGmg) {
  // Drive the GMG by the simulator's own schedule and check that at each
  // completion the GMG's running node is what the simulator said.
  SetUpCluster(2);
  TemplateId t = Register("x", {{"a", {}, 100, 3}, {"b", {"a"}, 100, 5}, {"c", {"a"}, 100, 2}});
  InstanceId i = New(t), j = New(t, PriorityClass::kOnline);
  for (InstanceId k : {i, j}) {
    IssueOn(k, "a", 0);
    IssueOn(k, "b", 0);
    IssueOn(k, "c", 1);
    ASSERT_TRUE(g_->IssueTransfer(N(k, "a"), 0, DeviceId(1), N(k, "c"), 0, T(0)).ok());
  }
  GmgSnapshot snap;
  SimResult r = RunAt(T(0), &snap);
  // Online j runs first on device 0.
  EXPECT_EQ(r.node_end_ns[Index(snap, N(j, "a"))], 3 * kMs);
  EXPECT_EQ(r.node_end_ns[Index(snap, N(i, "a"))], 11 * kMs);  // after j.b (3..8)
  // Replay in the GMG by event order and re-simulate from a mid-run snapshot.
  std::vector<std::pair<int64_t, uint32_t>> order;
  for (uint32_t n = 0; n < snap.nodes.size(); ++n) order.emplace_back(r.node_start_ns[n], n);
  std::sort(order.begin(), order.end());
  ASSERT_TRUE(g_->Start(NodeId(snap.nodes[order[0].second].id), T(0)).ok());
  ASSERT_TRUE(g_->Finish(NodeId(snap.nodes[order[0].second].id), Timestamp::FromNanos(r.node_end_ns[order[0].second])).ok());
  GmgSnapshot mid;
  SimResult r2 = RunAt(Timestamp::FromNanos(r.node_end_ns[order[0].second]), &mid);
  EXPECT_EQ(r2.instance_end_ns, r.instance_end_ns);
}

}  // namespace
}  // namespace slicesched

namespace slicesched {
namespace {

TEST_F(SimTest, RunOnceIntoMatchesRunAndRebuildRestores) {
  SetUpCluster(2);
  TemplateId t = Register("c", {{"a", {}, 2 * kMs, 3}, {"b", {"a"}, 10, 4}, {"c", {"a"}, 10, 5}});
  InstanceId i = New(t);
  IssueOn(i, "a", 0);
  IssueOn(i, "b", 1);
  IssueOn(i, "c", 0);
  ASSERT_TRUE(g_->IssueTransfer(N(i, "a"), 0, DeviceId(1), N(i, "b"), 0, T(0)).ok());
  GmgSnapshot snap = g_->Snapshot(T(0));
  auto sim = Simulator::Create(snap, *ctx_);
  ASSERT_TRUE(sim.ok());
  const SimResult copied = sim->Run();
  SimScratch scratch;
  SimResult once;
  sim->RunOnceInto(SimOptions{}, &scratch, &once);
  EXPECT_EQ(once.node_end_ns, copied.node_end_ns);
  EXPECT_EQ(once.peak_bytes, copied.peak_bytes);
  EXPECT_EQ(once.instance_end_ns, copied.instance_end_ns);
  // The state was consumed; a rebuild makes the simulator whole again.
  ASSERT_TRUE(sim->Rebuild(snap, *ctx_).ok());
  EXPECT_EQ(sim->Run().node_end_ns, copied.node_end_ns);
}

}  // namespace
}  // namespace slicesched
