#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "slicesched/common/strings.h"
#include "slicesched/gmg/placement.h"
#include "slicesched/sched/baselines.h"
#include "slicesched/sched/slice_scheduler.h"

namespace slicesched {
namespace {

using ::testing::ElementsAre;

constexpr int64_t kMs = 1000000;
Timestamp T(int64_t ms) { return Timestamp::FromNanos(ms * kMs); }

// Records what the scheduler issued; executes nothing (a fake backend).
class FakeBackend final : public ExecutionBackend {
 public:
  void NodeIssued(NodeId node) override { issued.push_back(node); }
  absl::Status Dispatch(Timestamp) override { return absl::OkStatus(); }
  Timestamp NextEventTime() const override { return Timestamp::Infinite(); }
  absl::Status AdvanceTo(Timestamp, std::vector<Feedback>*) override { return absl::OkStatus(); }
  std::vector<NodeId> issued;
};

struct OpDef {
  std::string name;
  std::vector<std::string> inputs;
  double ms;
  int64_t out_bytes = 1000;
  std::string weights;
};

class SchedTest : public ::testing::Test {
 protected:
  void SetUpCluster(int devices, std::vector<Bytes> capacity = {}) {
    std::vector<DeviceSpec> devs(devices);
    for (int d = 0; d < devices; ++d) {
      devs[d].name = "d" + std::to_string(d);
      devs[d].type = "cpu";
      devs[d].memory = capacity.empty() ? Bytes::GiB(1) : capacity[d];
    }
    g_ = std::make_unique<GlobalMappingGraph>(*AcceleratorSet::Create(devs, LinkSpec{1e9, Duration::Zero()}));
    transfers_ = std::make_unique<TransferEstimator>(g_->accelerators());
    ctx_ = std::make_unique<SimContext>(&g_->templates(), &ops_, transfers_.get());
    env_ = SchedulerEnv{g_.get(), &backend_, ctx_.get(), nullptr};
  }
  TemplateId Register(const std::string& name, const std::vector<OpDef>& ops,
                      const std::vector<std::pair<std::string, std::vector<std::pair<std::string, int>>>>& parts) {
    TemplateBuilder b(name);
    for (const OpDef& op : ops) {
      b.Op(op.name, OpKind::kGeneric).Inputs(op.inputs).Output("out", DType::kU8, {std::to_string(op.out_bytes)});
      if (!op.weights.empty()) b.Weights(op.weights, Bytes(10));
    }
    for (const auto& [pname, slots] : parts) b.Partition(pname, slots);
    TemplateId id = *g_->RegisterTemplate(*b.Build());
    for (size_t i = 0; i < ops.size(); ++i) {
      EXPECT_TRUE(ops_.SetPrior(ctx_->OpKey("cpu", id.value(), static_cast<int>(i)),
                                std::vector<double>{ops[i].ms * kMs}).ok());
    }
    return id;
  }
  InstanceId New(TemplateId t, PriorityClass cls = PriorityClass::kOnline, int64_t arrival_ms = 0, uint32_t tenant = 0) {
    InstanceSpec s;
    s.template_id = t;
    s.priority_class = cls;
    s.arrival = T(arrival_ms);
    s.tenant = TenantId(tenant);
    return *g_->Instantiate(s);
  }
  const OpNode& Node(InstanceId i, const char* op) { return *g_->FindNode(*g_->NodeOf(i, op)); }

  std::unique_ptr<GlobalMappingGraph> g_;
  OpEstimator ops_;
  std::unique_ptr<TransferEstimator> transfers_;
  std::unique_ptr<SimContext> ctx_;
  FakeBackend backend_;
  SchedulerEnv env_;
};

std::vector<std::pair<std::string, int>> AllOn(std::vector<std::string> ops, int slot = 0) {
  std::vector<std::pair<std::string, int>> m;
  for (auto& o : ops) m.emplace_back(o, slot);
  return m;
}

TEST_F(SchedTest, BatchFollowsSuccessorsWithinTheVolume) {
  SetUpCluster(2);
  TemplateId t = Register("chain", {{"a", {}, 10}, {"b", {"a"}, 10}, {"c", {"b"}, 10}, {"d", {"c"}, 100}},
                          {{"single", AllOn({"a", "b", "c", "d"})}});
  InstanceId i = New(t);
  SliceSchedulerOptions o;
  o.volume = Duration::Millis(35);
  o.max_rounds_per_call = 1;
  SliceScheduler s(o);
  auto st = s.Schedule(env_, T(0));
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->rounds, 1);
  EXPECT_EQ(st->issued_nodes, 3);  // a, b, c fit in 35 ms; d does not
  EXPECT_EQ(Node(i, "d").state, NodeState::kUnscheduled);
  EXPECT_THAT(backend_.issued, ElementsAre(Node(i, "a").id, Node(i, "b").id, Node(i, "c").id));
  st = s.Schedule(env_, T(0));
  EXPECT_EQ(st->issued_nodes, 1);  // the next round takes d alone
  EXPECT_EQ(Node(i, "d").state, NodeState::kIssued);
  EXPECT_TRUE(g_->VerifyInvariants().ok());
}

TEST_F(SchedTest, PicksTheIdleDeviceByWhatIf) {
  SetUpCluster(2);
  TemplateId t = Register("one", {{"a", {}, 50}}, {{"single", AllOn({"a"})}});
  InstanceId busy = New(t);
  ASSERT_TRUE(g_->Issue(Node(busy, "a").id, DeviceId(0), T(0)).ok());
  InstanceId i = New(t, PriorityClass::kOnline, 1);
  SliceScheduler s;
  auto st = s.Schedule(env_, T(0));
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->whatif_runs, 2);
  EXPECT_EQ(Node(i, "a").device, DeviceId(1));
}

// An online instance keeps to the devices it already uses unless another
// device saves more than online_new_device_cost: its conversation's decode
// steps would wait in that device's queue on every token too. Here a runs on
// d0, an unrelated 50 ms operator takes d0 next, and b can wait for d0 or
// move to the idle d1 (pp2), which finishes it 50 ms sooner.
TEST_F(SchedTest, OnlineInstancesAddADeviceOnlyWhenItSavesItsCost) {
  for (const auto& [cost_ms, want] : std::vector<std::pair<int64_t, int>>{{0, 1}, {10, 1}, {100, 0}}) {
    SetUpCluster(2);
    TemplateId t = Register("two", {{"a", {}, 10}, {"b", {"a"}, 10}},
                            {{"single", AllOn({"a", "b"})}, {"pp2", {{"a", 0}, {"b", 1}}}});
    TemplateId one = Register("one", {{"x", {}, 50}}, {{"single", AllOn({"x"})}});
    InstanceId i = New(t);
    ASSERT_TRUE(g_->Issue(Node(i, "a").id, DeviceId(0), T(0)).ok());
    InstanceId busy = New(one);
    ASSERT_TRUE(g_->Issue(Node(busy, "x").id, DeviceId(0), T(0)).ok());
    SliceSchedulerOptions o;
    o.online_new_device_cost = Duration::Millis(cost_ms);
    SliceScheduler s(o);
    auto st = s.Schedule(env_, T(0));
    ASSERT_TRUE(st.ok()) << st.status();
    EXPECT_EQ(st->whatif_runs, 2) << cost_ms;
    EXPECT_EQ(Node(i, "b").device, DeviceId(static_cast<uint16_t>(want))) << "cost " << cost_ms << " ms";
  }
}

// Long prompts are prefilled in pieces of about prefill_chunk_tokens
// (online) or offline_prefill_chunk_tokens (offline), at most
// max_prefill_chunks; a prompt shorter than two pieces stays whole, and 0
// turns chunking off. The baselines never chunk.
TEST(SliceSchedulerChunksTest, PiecesFollowThePromptLengthPerClass) {
  SliceSchedulerOptions o;
  o.prefill_chunk_tokens = 640;
  o.offline_prefill_chunk_tokens = 512;
  o.max_prefill_chunks = 4;
  EXPECT_EQ(SliceSchedulerOptions().max_prefill_chunks, 8);
  SliceScheduler s(o);
  EXPECT_EQ(s.PrefillChunks(1279, PriorityClass::kOnline), 1);
  EXPECT_EQ(s.PrefillChunks(1280, PriorityClass::kOnline), 2);
  EXPECT_EQ(s.PrefillChunks(2000, PriorityClass::kOnline), 3);
  EXPECT_EQ(s.PrefillChunks(100000, PriorityClass::kOnline), 4);
  EXPECT_EQ(s.PrefillChunks(2048, PriorityClass::kOffline), 4);
  EXPECT_EQ(s.PrefillChunks(1023, PriorityClass::kOffline), 1);
  o.prefill_chunk_tokens = 0;
  EXPECT_EQ(SliceScheduler(o).PrefillChunks(100000, PriorityClass::kOnline), 1);
  EXPECT_EQ(PinnedPolicy(PinnedPolicy::StaticOnline()).PrefillChunks(100000, PriorityClass::kOnline), 1);
  EXPECT_EQ(PriorityColocate().PrefillChunks(100000, PriorityClass::kOffline), 1);
}

TEST_F(SchedTest, CandidatesRespectWeightResidency) {
  SetUpCluster(2);
  TemplateId t = Register("w", {{"a", {}, 10, 1000, "wa"}}, {{"single", AllOn({"a"})}});
  ASSERT_TRUE(g_->LoadWeights(DeviceId(1), "wa", Bytes(10)).ok());
  InstanceId i = New(t);
  SliceScheduler s;
  ASSERT_TRUE(s.Schedule(env_, T(0)).ok());
  EXPECT_EQ(Node(i, "a").device, DeviceId(1));  // the only device holding its weights
  // No device holds the weights: nothing is issued, nothing breaks.
  TemplateId t2 = Register("w2", {{"a", {}, 10, 1000, "nowhere"}}, {{"single", AllOn({"a"})}});
  InstanceId j = New(t2);
  auto st = s.Schedule(env_, T(0));
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(Node(j, "a").state, NodeState::kUnscheduled);
}

// A bounded instance (allowed_devices, the planner's GPU set of a job) never
// lands outside its set, even when every device outside it is idle and the
// devices inside are busy; an instance bounded to devices that cannot hold
// it waits instead of being placed elsewhere.
TEST_F(SchedTest, BoundedInstanceNeverLandsOutsideItsDeviceSet) {
  SetUpCluster(4);
  TemplateId t = Register("two", {{"a", {}, 5}, {"b", {"a"}, 5}},
                          {{"single", AllOn({"a", "b"})}, {"pp2", {{"a", 0}, {"b", 1}}}});
  // Devices 2 and 3 are busy with a long operator each.
  TemplateId longop = Register("long", {{"x", {}, 500}}, {{"single", AllOn({"x"})}});
  for (uint16_t d : {2, 3}) {
    InstanceId busy = New(longop);
    ASSERT_TRUE(g_->Issue(Node(busy, "x").id, DeviceId(d), T(0)).ok());
  }
  std::vector<InstanceId> bounded;
  for (int k = 0; k < 2; ++k) {
    InstanceSpec s;
    s.template_id = t;
    s.priority_class = PriorityClass::kOnline;
    s.arrival = T(k);
    s.allowed_devices = {DeviceId(2), DeviceId(3)};
    bounded.push_back(*g_->Instantiate(s));
  }
  SliceScheduler s;
  for (int round = 0; round < 4; ++round) ASSERT_TRUE(s.Schedule(env_, T(1)).ok());
  int placed = 0;
  for (InstanceId i : bounded) {
    for (const char* op : {"a", "b"}) {
      const OpNode& n = Node(i, op);
      if (n.state == NodeState::kUnscheduled) continue;
      ++placed;
      EXPECT_TRUE(n.device == DeviceId(2) || n.device == DeviceId(3)) << op << " of " << i << " on " << n.device;
    }
  }
  EXPECT_GT(placed, 0);
  // Unbounded, the same template goes to the idle devices 0 and 1.
  InstanceId free = New(t, PriorityClass::kOnline, 10);
  ASSERT_TRUE(s.Schedule(env_, T(1)).ok());
  EXPECT_TRUE(Node(free, "a").device == DeviceId(0) || Node(free, "a").device == DeviceId(1));
  // A set no partition can be bound in (the pp2 groups are {0,1} and {2,3};
  // {1, 2} straddles them, and single placement needs weights only on 1 and
  // 2: here "w" lives on device 0 only): the instance waits.
  TemplateId w = Register("w", {{"a", {}, 10, 1000, "wa"}}, {{"single", AllOn({"a"})}});
  ASSERT_TRUE(g_->LoadWeights(DeviceId(0), "wa", Bytes(10)).ok());
  InstanceSpec ws;
  ws.template_id = w;
  ws.priority_class = PriorityClass::kOnline;
  ws.arrival = T(20);
  ws.allowed_devices = {DeviceId(1), DeviceId(2)};
  InstanceId waiting = *g_->Instantiate(ws);
  ASSERT_TRUE(s.Schedule(env_, T(1)).ok());
  EXPECT_EQ(Node(waiting, "a").state, NodeState::kUnscheduled);
  EXPECT_TRUE(g_->VerifyInvariants().ok());
}

TEST_F(SchedTest, CandidatesRespectKvLocality) {
  SetUpCluster(4);
  TemplateBuilder b("decode");
  b.CheckpointInput("kv", DType::kU8, {"100"});
  b.Op("e", OpKind::kGeneric).Output("h", DType::kU8, {"10"});
  b.Op("l", OpKind::kGeneric).Inputs({"e", "@kv"}).UpdateOutput("kv", "kv", {"101"}).Output("h", DType::kU8, {"10"});
  b.Partition("single", {{"e", 0}, {"l", 0}});
  TemplateId dec = *g_->RegisterTemplate(*b.Build());
  TemplateId pre = Register("kvmaker", {{"m", {}, 1, 100}}, {{"single", AllOn({"m"})}});
  // Make a checkpoint on device 3 (a retained output of a finished instance).
  TemplateBuilder r("retain");
  r.Op("m", OpKind::kGeneric).RetainedOutput("kv", DType::kU8, {"100"});
  TemplateId ret = *g_->RegisterTemplate(*r.Build());
  (void)pre;
  InstanceId maker = New(ret);
  ASSERT_TRUE(g_->Issue(Node(maker, "m").id, DeviceId(3), T(0)).ok());
  ASSERT_TRUE(g_->Start(Node(maker, "m").id, T(0)).ok());
  ASSERT_TRUE(g_->Finish(Node(maker, "m").id, T(1)).ok());
  CheckpointId kv = g_->TakeRetired()[0].produced[0];
  InstanceSpec ds;
  ds.template_id = dec;
  ds.checkpoints = {{"kv", kv}};
  InstanceId d = *g_->Instantiate(ds);
  for (int k = 0; k < 2; ++k) {
    EXPECT_TRUE(ops_.SetPrior(ctx_->OpKey("cpu", dec.value(), k), std::vector<double>{1.0 * kMs}).ok());
  }
  SliceSchedulerOptions o;
  o.volume = Duration::Millis(100);
  SliceScheduler s(o);
  ASSERT_TRUE(s.Schedule(env_, T(1)).ok());
  EXPECT_EQ(Node(d, "l").device, DeviceId(3));
  EXPECT_EQ(Node(d, "e").device, DeviceId(3));
}

// An online chunked prefill runs as a pipeline whose caches end on one
// device: the first piece's groups on distinct devices, each later piece's
// group where that group's cache is, and the last piece on one device. Off,
// the what-if keeps the first piece on one device (a new device costs
// online_new_device_cost). With fewer devices than groups the rule gives way.
TEST_F(SchedTest, OnlineChunkedPrefillRunsAsAPipelineWhoseCachesEndOnOneDevice) {
  for (const auto& [devices, pipeline] : std::vector<std::pair<int, bool>>{{4, true}, {4, false}, {1, true}}) {
    SetUpCluster(devices);
    const LlamaDims dims = *LlamaPreset("tiny");  // two fused groups
    auto tpl = *BuildLlamaChunkedPrefill(dims, 3);
    for (int d = 0; d < devices; ++d) {
      for (const OpSpec& op : tpl->ops()) {
        if (!op.weight_key.empty() && !g_->HasWeights(DeviceId(static_cast<uint16_t>(d)), op.weight_key)) {
          ASSERT_TRUE(g_->LoadWeights(DeviceId(static_cast<uint16_t>(d)), op.weight_key, op.weight_bytes).ok());
        }
      }
    }
    const TemplateId id = *g_->RegisterTemplate(tpl);
    const InstanceId i = *g_->Instantiate(LlamaChunkedPrefill(id, 3, 30, PriorityClass::kOnline, T(0)));
    SliceSchedulerOptions o;
    o.volume = Duration::Nanos(1);  // one operator a round
    o.pipeline_online_prefill = pipeline;
    SliceScheduler s(o);
    ASSERT_TRUE(s.Schedule(env_, T(0)).ok());
    auto dev = [&](const char* op) { return Node(i, op).device.value(); };
    for (const char* op : {"g0", "g1", "g0c1", "g1c1", "g0c2", "g1c2", "head", "sample"}) {
      EXPECT_EQ(Node(i, op).state, NodeState::kIssued) << op;
    }
    SCOPED_TRACE(::testing::Message() << devices << " devices, pipeline " << pipeline);
    if (devices == 1 || !pipeline) {
      EXPECT_EQ(dev("g1"), dev("g0"));
      continue;
    }
    EXPECT_NE(dev("g1"), dev("g0"));
    EXPECT_EQ(dev("g0c1"), dev("g0"));
    EXPECT_EQ(dev("g1c1"), dev("g1"));
    EXPECT_EQ(dev("g1c2"), dev("g0c2"));
    EXPECT_TRUE(g_->VerifyInvariants().ok());
  }
}

// A finished instance of class `cls` on `dev` whose output is kept: an online
// one is a conversation whose next decode step comes back to `dev`.
CheckpointId MakeCheckpoint(GlobalMappingGraph& g, PriorityClass cls, DeviceId dev) {
  TemplateBuilder r(StrCat("retain", dev.value(), static_cast<int>(cls)));
  r.Op("m", OpKind::kGeneric).RetainedOutput("kv", DType::kU8, {"100"});
  auto t = g.RegisterTemplate(*r.Build());
  EXPECT_TRUE(t.ok());
  InstanceSpec spec;
  spec.template_id = *t;
  spec.priority_class = cls;
  const InstanceId maker = *g.Instantiate(spec);
  const NodeId m = *g.NodeOf(maker, "m");
  EXPECT_TRUE(g.Issue(m, dev, T(0)).ok());
  EXPECT_TRUE(g.Start(m, T(0)).ok());
  EXPECT_TRUE(g.Finish(m, T(1)).ok());
  return g.TakeRetired()[0].produced[0];
}

TEST_F(SchedTest, OfflineWorkKeepsOffDevicesThatServeAnOnlineConversation) {
  struct Case {
    bool avoid;
    int64_t at_ms;  // the checkpoint was made at 1 ms
    int expected_device;
  };
  // A cache not grown for longer than stream_idle_after (2 s) is no
  // conversation in progress (a retained output kept for later).
  for (const Case& k : {Case{true, 1, 1}, Case{false, 1, 0}, Case{true, 2001, 1}, Case{true, 2002, 0}}) {
    const bool avoid = k.avoid;
    SetUpCluster(2);
    const CheckpointId kv = MakeCheckpoint(*g_, PriorityClass::kOnline, DeviceId(0));
    MakeCheckpoint(*g_, PriorityClass::kOffline, DeviceId(1));  // not a conversation of online work
    EXPECT_EQ(g_->online_checkpoints(DeviceId(0)), 1);
    EXPECT_EQ(g_->online_checkpoints(DeviceId(1)), 0);
    TemplateId t = Register("one", {{"a", {}, 10}}, {{"single", AllOn({"a"})}});
    SliceSchedulerOptions o;
    o.offline_avoids_online_streams = avoid;
    SliceScheduler s(o);
    const InstanceId off = New(t, PriorityClass::kOffline, 0, kOfflineTenantBase);
    ASSERT_TRUE(s.Schedule(env_, T(k.at_ms)).ok());
    // Both devices are idle, so the what-if ties and the first candidate
    // (device 0) would win; the conversation on device 0 rules it out.
    EXPECT_EQ(Node(off, "a").device, DeviceId(static_cast<uint16_t>(k.expected_device)))
        << avoid << " at " << k.at_ms << " ms";
    EXPECT_EQ(g_->online_kv_touched(DeviceId(0)), T(1));
    EXPECT_TRUE(g_->VerifyInvariants().ok());
    ASSERT_TRUE(g_->ReleaseCheckpoint(kv).ok());
    EXPECT_EQ(g_->online_checkpoints(DeviceId(0)), 0);
    EXPECT_TRUE(g_->VerifyInvariants().ok());
  }
}

// Aged offline work may queue behind online work, but still keeps off a
// conversation's device while another can take it; with every device
// serving one, it goes anyway (aged work is never starved).
TEST_F(SchedTest, AgedOfflineWorkKeepsOffConversationsWhileAnotherDeviceCanTakeIt) {
  for (const bool both_stream : {false, true}) {
    SetUpCluster(2);
    MakeCheckpoint(*g_, PriorityClass::kOnline, DeviceId(0));
    if (both_stream) MakeCheckpoint(*g_, PriorityClass::kOnline, DeviceId(1));
    TemplateId t = Register("one", {{"a", {}, 10}}, {{"single", AllOn({"a"})}});
    // Device 1 has an online operator outstanding: unaged work would wait.
    const InstanceId busy = New(t, PriorityClass::kOnline, 0);
    ASSERT_TRUE(g_->Issue(Node(busy, "a").id, DeviceId(1), T(1)).ok());
    SliceSchedulerOptions o;
    o.offline_aging = Duration::Zero();  // every offline operator is aged
    SliceScheduler s(o);
    const InstanceId off = New(t, PriorityClass::kOffline, 0, kOfflineTenantBase);
    ASSERT_TRUE(s.Schedule(env_, T(1)).ok());
    EXPECT_EQ(Node(off, "a").state, NodeState::kIssued) << both_stream;
    if (!both_stream) {
      EXPECT_EQ(Node(off, "a").device, DeviceId(1));
    }
  }
}

TEST_F(SchedTest, OnlineWorkPaysForADeviceThatServesAnotherConversation) {
  for (Duration cost : {Duration::Millis(100), Duration::Zero()}) {
    SetUpCluster(2);
    MakeCheckpoint(*g_, PriorityClass::kOnline, DeviceId(0));
    TemplateId t = Register("one", {{"a", {}, 10}}, {{"single", AllOn({"a"})}});
    SliceSchedulerOptions o;
    o.online_stream_device_cost = cost;
    SliceScheduler s(o);
    const InstanceId on = New(t, PriorityClass::kOnline, 0);
    ASSERT_TRUE(s.Schedule(env_, T(1)).ok());
    EXPECT_EQ(Node(on, "a").device, DeviceId(cost > Duration::Zero() ? 1 : 0)) << cost.nanos();
  }
}

TEST_F(SchedTest, OomCandidatesAreDiscarded) {
  // Device 0 is idle but too small; device 1 is busy but fits.
  SetUpCluster(2, {Bytes(500), Bytes::GiB(1)});
  TemplateId t = Register("big", {{"a", {}, 10, 1000}}, {{"single", AllOn({"a"})}});
  TemplateId small = Register("small", {{"x", {}, 30, 1}}, {{"single", AllOn({"x"})}});
  InstanceId busy = New(small);
  ASSERT_TRUE(g_->Issue(Node(busy, "x").id, DeviceId(1), T(0)).ok());
  InstanceId i = New(t, PriorityClass::kOnline, 1);
  SliceScheduler s;
  auto st = s.Schedule(env_, T(0));
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->rejected_oom, 1);
  EXPECT_EQ(Node(i, "a").device, DeviceId(1));
}

TEST_F(SchedTest, OutstandingBoundFromEq3) {
  SetUpCluster(2);
  TemplateId t = Register("one", {{"a", {}, 1}}, {{"single", AllOn({"a"})}});
  SliceSchedulerOptions o;
  EXPECT_EQ(SliceScheduler(o).outstanding_bound(), static_cast<int64_t>(0.1 * 17000 * 10.575) - 1);
  o.max_outstanding = 2;
  SliceScheduler s(o);
  for (int k = 0; k < 5; ++k) New(t, PriorityClass::kOnline, k);
  auto st = s.Schedule(env_, T(0));
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->issued_nodes, 2);
  EXPECT_EQ(g_->total_outstanding_compute(), 2);
}

TEST_F(SchedTest, OfflineFillsGapsAndIsNotStarved) {
  SetUpCluster(1);
  TemplateId t = Register("one", {{"a", {}, 10}}, {{"single", AllOn({"a"})}});
  SliceSchedulerOptions o;
  o.offline_aging = Duration::Seconds(30);
  SliceScheduler s(o);
  // Sustained online load keeps two operators queued on the only device.
  InstanceId off = New(t, PriorityClass::kOffline, 0, kOfflineTenantBase);
  for (int k = 0; k < 3; ++k) New(t, PriorityClass::kOnline, 0);
  ASSERT_TRUE(s.Schedule(env_, T(0)).ok());
  EXPECT_EQ(Node(off, "a").state, NodeState::kUnscheduled);  // the device is not idle: wait
  for (int k = 0; k < 3; ++k) New(t, PriorityClass::kOnline, 10 * k);
  ASSERT_TRUE(s.Schedule(env_, T(20000)).ok());
  EXPECT_EQ(Node(off, "a").state, NodeState::kUnscheduled);
  // Past the aging limit it goes in regardless.
  New(t, PriorityClass::kOnline, 31000);
  ASSERT_TRUE(s.Schedule(env_, T(31000)).ok());
  EXPECT_EQ(Node(off, "a").state, NodeState::kIssued);
  EXPECT_TRUE(g_->VerifyInvariants().ok());
}

TEST_F(SchedTest, OfflineWorkWhoseDeadlineIsNearGoesFirst) {
  SetUpCluster(1);
  TemplateId t = Register("one", {{"a", {}, 10}}, {{"single", AllOn({"a"})}});
  SliceSchedulerOptions o;
  o.offline_aging = Duration::Seconds(30);
  SliceScheduler s(o);
  InstanceSpec spec;
  spec.template_id = t;
  spec.priority_class = PriorityClass::kOffline;
  spec.tenant = TenantId(kOfflineTenantBase);
  spec.arrival = T(20000);
  spec.deadline = T(60000);  // a batch whose window closes in 40 s
  const InstanceId off = *g_->Instantiate(spec);
  for (int k = 0; k < 3; ++k) New(t, PriorityClass::kOnline, 20000);
  ASSERT_TRUE(s.Schedule(env_, T(20000)).ok());
  EXPECT_EQ(Node(off, "a").state, NodeState::kUnscheduled);  // the device is busy and there is time: wait
  // It has waited only 10.5 s (no aging by waiting), but its deadline is
  // now less than offline_aging away.
  New(t, PriorityClass::kOnline, 29000);
  ASSERT_TRUE(s.Schedule(env_, T(29000)).ok());
  EXPECT_EQ(Node(off, "a").state, NodeState::kUnscheduled);
  New(t, PriorityClass::kOnline, 30500);
  ASSERT_TRUE(s.Schedule(env_, T(30500)).ok());
  EXPECT_EQ(Node(off, "a").state, NodeState::kIssued);
  EXPECT_TRUE(g_->VerifyInvariants().ok());
}

TEST_F(SchedTest, OfflineOperatorsArePlacedJustInTime) {
  SetUpCluster(2);
  TemplateId t = Register("chain", {{"a", {}, 10}, {"b", {"a"}, 10}}, {{"single", AllOn({"a", "b"})}});
  SliceSchedulerOptions o;
  o.volume = Duration::Nanos(1);  // batches of one operator
  SliceScheduler s(o);
  InstanceId off = New(t, PriorityClass::kOffline, 0, kOfflineTenantBase);
  InstanceId on = New(t, PriorityClass::kOnline, 0);
  ASSERT_TRUE(s.Schedule(env_, T(0)).ok());
  // Online work is issued whole; offline only the operator whose inputs exist.
  EXPECT_EQ(Node(on, "b").state, NodeState::kIssued);
  EXPECT_EQ(Node(off, "a").state, NodeState::kIssued);
  EXPECT_EQ(Node(off, "b").state, NodeState::kUnscheduled);
  // Offline work went where no online work is outstanding.
  EXPECT_NE(Node(off, "a").device, Node(on, "a").device);
  EXPECT_EQ(g_->outstanding_compute(Node(off, "a").device, PriorityClass::kOffline), 1);
  EXPECT_EQ(g_->outstanding_compute(Node(off, "a").device, PriorityClass::kOnline), 0);
  ASSERT_TRUE(s.Schedule(env_, T(1)).ok());
  EXPECT_EQ(Node(off, "b").state, NodeState::kUnscheduled);  // its input is only queued
  ASSERT_TRUE(g_->Start(Node(off, "a").id, T(2)).ok());
  ASSERT_TRUE(s.Schedule(env_, T(2)).ok());
  EXPECT_EQ(Node(off, "b").state, NodeState::kIssued);  // now its input is being computed
  EXPECT_TRUE(g_->VerifyInvariants().ok());
}

TEST_F(SchedTest, PriorityColocateIssuesOfflineOnlyOnQuietPairs) {
  SetUpCluster(4);
  TemplateId t = Register("m", {{"a", {}, 1}, {"b", {"a"}, 1}}, {{"pp2", {{"a", 0}, {"b", 1}}}});
  PriorityColocate p;
  EXPECT_EQ(p.OfflineAdmissions(env_, T(0)), 4);  // two per pair
  InstanceId on = New(t, PriorityClass::kOnline, 0, 1);  // tenant 1: pair 1
  InstanceId off = New(t, PriorityClass::kOffline, 0, kOfflineTenantBase);
  ASSERT_TRUE(p.Schedule(env_, T(0)).ok());
  EXPECT_EQ(Node(on, "a").device, DeviceId(2));
  EXPECT_EQ(Node(on, "b").device, DeviceId(3));
  // The offline request took pair 0 (no offline work yet, the lower pair),
  // which is quiet: its first operator, and only that one, is issued.
  EXPECT_EQ(Node(off, "a").device, DeviceId(0));
  EXPECT_EQ(Node(off, "b").state, NodeState::kUnscheduled);
  ASSERT_TRUE(p.Schedule(env_, T(1)).ok());
  EXPECT_EQ(Node(off, "b").state, NodeState::kUnscheduled);  // the pair holds an offline operator
  ASSERT_TRUE(g_->Start(Node(off, "a").id, T(1)).ok());
  ASSERT_TRUE(g_->Finish(Node(off, "a").id, T(2)).ok());
  // Online work arrives on pair 0: the next offline operator waits for it.
  InstanceId on0 = New(t, PriorityClass::kOnline, 2, 0);
  ASSERT_TRUE(p.Schedule(env_, T(2)).ok());
  EXPECT_EQ(Node(on0, "a").device, DeviceId(0));
  EXPECT_EQ(Node(off, "b").state, NodeState::kUnscheduled);
  // A second offline request goes to pair 1, the one with fewer, and waits
  // there behind the online request.
  InstanceId off1 = New(t, PriorityClass::kOffline, 2, kOfflineTenantBase);
  ASSERT_TRUE(p.Schedule(env_, T(2)).ok());
  EXPECT_EQ(Node(off1, "a").state, NodeState::kUnscheduled);
  EXPECT_TRUE(g_->VerifyInvariants().ok());
}

TEST_F(SchedTest, StaticOnlinePinsInstancesToPairs) {
  SetUpCluster(8);
  TemplateId t = Register("m", {{"a", {}, 1}, {"b", {"a"}, 1}},
                          {{"pp2", {{"a", 0}, {"b", 1}}}});
  InstanceId i = New(t, PriorityClass::kOnline, 0, 2);
  PinnedPolicy p = PinnedPolicy::StaticOnline();
  EXPECT_FALSE(p.accepts_offline());
  EXPECT_EQ(p.OfflineAdmissions(env_, T(0)), 0);
  ASSERT_TRUE(p.Schedule(env_, T(0)).ok());
  EXPECT_EQ(Node(i, "a").device, DeviceId(4));
  EXPECT_EQ(Node(i, "b").device, DeviceId(5));
  EXPECT_EQ(backend_.issued.size(), 3u);  // two ops and the transfer between them
}

TEST_F(SchedTest, DualShareAdmitsOnlyToQuietSubsets) {
  SetUpCluster(8);
  TemplateId t = Register("m", {{"a", {}, 1}, {"b", {"a"}, 1}, {"c", {"b"}, 1}, {"d", {"c"}, 1}},
                          {{"pp4", {{"a", 0}, {"b", 1}, {"c", 2}, {"d", 3}}}});
  PinnedPolicy p = PinnedPolicy::DualShare();
  EXPECT_EQ(p.OfflineAdmissions(env_, T(0)), 8);
  // Busy the first subset: two operators queued on device 0.
  TemplateId one = Register("one", {{"x", {}, 1}}, {});
  for (int k = 0; k < 2; ++k) {
    InstanceId b = New(one);
    ASSERT_TRUE(g_->Issue(Node(b, "x").id, DeviceId(0), T(0)).ok());
  }
  InstanceId off = New(t, PriorityClass::kOffline, 0, kOfflineTenantBase);
  ASSERT_TRUE(p.Schedule(env_, T(0)).ok());
  EXPECT_EQ(Node(off, "a").device, DeviceId(4));  // the quiet subset
  EXPECT_EQ(p.OfflineAdmissions(env_, T(0)), 7);
}

}  // namespace
}  // namespace slicesched
