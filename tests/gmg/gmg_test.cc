#include "slicesched/gmg/gmg.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <iterator>
#include <limits>

#include "slicesched/gmg/snapshot.h"

namespace slicesched {
namespace {

using ::testing::HasSubstr;

Timestamp T(int64_t ms) { return Timestamp::FromNanos(ms * 1000000); }

AcceleratorSet TwoDevices(Bytes capacity = Bytes::GiB(1)) {
  std::vector<DeviceSpec> devs(2);
  devs[0].name = "d0";
  devs[0].type = "cpu";
  devs[0].memory = capacity;
  devs[1].name = "d1";
  devs[1].type = "cpu";
  devs[1].memory = capacity;
  return *AcceleratorSet::Create(devs, LinkSpec{1e9, Duration::Micros(5)});
}

// a -> b -> c with a fan-out a -> c; b retains a checkpoint.
std::shared_ptr<const GraphTemplate> Diamond() {
  TemplateBuilder b("diamond");
  b.ExternalInput("in", DType::kI64, {"N"});
  b.Op("a", OpKind::kEmbedding).Inputs({"$in"}).Output("x", DType::kF32, {"N", "4"}).Weights("wa", Bytes(1000));
  b.Op("b", OpKind::kFusedLayers)
      .Inputs({"a"})
      .Output("y", DType::kF32, {"N", "4"})
      .RetainedOutput("kv", DType::kF32, {"N"})
      .Workspace("N*100");
  b.Op("c", OpKind::kGeneric).Inputs({"a", "b:y"}).Output("z", DType::kF32, {"N"});
  b.Partition("single", {{"a", 0}, {"b", 0}, {"c", 0}});
  return *b.Build();
}

std::shared_ptr<const GraphTemplate> Step() {
  TemplateBuilder b("step");
  b.CheckpointInput("kv", DType::kF32, {"C"});
  b.Op("s", OpKind::kGeneric).Inputs({"@kv"}).UpdateOutput("kv", "kv", {"C+2"}).Output("o", DType::kF32, {"1"});
  return *b.Build();
}

class GmgTest : public ::testing::Test {
 protected:
  GmgTest() : g_(TwoDevices()) {
    diamond_ = *g_.RegisterTemplate(Diamond());
    step_ = *g_.RegisterTemplate(Step());
    EXPECT_TRUE(g_.LoadWeights(DeviceId(0), "wa", Bytes(1000)).ok());
  }
  InstanceId NewDiamond(int64_t n = 10, PriorityClass cls = PriorityClass::kOffline, int prio = 0,
                        int64_t arrival_ms = 0) {
    InstanceSpec s;
    s.template_id = diamond_;
    s.bindings = {{"N", n}};
    s.priority_class = cls;
    s.priority = prio;
    s.arrival = T(arrival_ms);
    auto id = g_.Instantiate(s);
    EXPECT_TRUE(id.ok()) << id.status();
    return *id;
  }
  NodeId N(InstanceId i, const char* op) { return *g_.NodeOf(i, op); }
  void Check() { ASSERT_TRUE(g_.VerifyInvariants().ok()) << g_.VerifyInvariants(); }

  GlobalMappingGraph g_;
  TemplateId diamond_, step_;
};

TEST_F(GmgTest, InstantiateComputesBytes) {
  InstanceId i = NewDiamond(10);
  const Instance* inst = g_.FindInstance(i);
  ASSERT_NE(inst, nullptr);
  EXPECT_EQ(inst->nodes[0].outputs[0].bytes, Bytes(10 * 4 * 4));
  EXPECT_EQ(inst->nodes[1].workspace, Bytes(1000));
  EXPECT_EQ(inst->nodes[1].outputs[1].bytes, Bytes(40));
  EXPECT_EQ(inst->nodes[0].outputs[0].pending_consumers, 2);
  EXPECT_EQ(g_.num_nodes(), 3u);
  ASSERT_EQ(g_.unscheduled_frontier().size(), 1u);
  EXPECT_EQ(g_.unscheduled_frontier().begin()->node, N(i, "a"));
  Check();
}

TEST_F(GmgTest, InstantiateRejectsBadBindings) {
  InstanceSpec s;
  s.template_id = diamond_;
  auto unbound = g_.Instantiate(s);
  EXPECT_THAT(unbound.status().message(), HasSubstr("symbol 'N' is not bound"));
  s.bindings = {{"N", 4}, {"Q", 1}};
  EXPECT_THAT(g_.Instantiate(s).status().message(), HasSubstr("unknown symbol 'Q'"));
  s.bindings = {{"N", 0}};
  auto zero = g_.Instantiate(s);
  ASSERT_FALSE(zero.ok());
  EXPECT_THAT(zero.status().message(), HasSubstr("op 'a' output 'x'"));
  s.bindings = {{"N", int64_t{1} << 62}};
  EXPECT_FALSE(g_.Instantiate(s).ok());
  s.template_id = TemplateId(99);
  EXPECT_EQ(g_.Instantiate(s).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(g_.num_instances(), 0u);
  Check();
}

// The frontier orders by -priority: INT32_MIN (which an RPC can send; found
// by rpc_mutation_test under UBSan) has no negation and is refused; the
// extremes that remain order as any other priorities.
TEST_F(GmgTest, InstantiateRefusesAPriorityWithoutANegation) {
  InstanceSpec s;
  s.template_id = diamond_;
  s.bindings = {{"N", 4}};
  s.priority = std::numeric_limits<int32_t>::min();
  auto refused = g_.Instantiate(s);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("priority -2147483648 is out of range"));
  EXPECT_EQ(g_.num_instances(), 0u);
  const InstanceId low = NewDiamond(4, PriorityClass::kOffline, std::numeric_limits<int32_t>::min() + 1);
  const InstanceId high = NewDiamond(4, PriorityClass::kOffline, std::numeric_limits<int32_t>::max());
  ASSERT_EQ(g_.unscheduled_frontier().size(), 2u);
  EXPECT_EQ(g_.unscheduled_frontier().begin()->node, N(high, "a"));
  EXPECT_EQ(std::next(g_.unscheduled_frontier().begin())->node, N(low, "a"));
  Check();
}

TEST_F(GmgTest, LifecycleFreesMemoryAtLastConsumer) {
  InstanceId i = NewDiamond(10);
  const DeviceId d0(0);
  const Bytes x(160), y(160), kv(40), z(40);
  ASSERT_TRUE(g_.Issue(N(i, "a"), d0, T(1)).ok());
  ASSERT_TRUE(g_.Issue(N(i, "b"), d0, T(1)).ok());
  ASSERT_TRUE(g_.Issue(N(i, "c"), d0, T(1)).ok());
  EXPECT_TRUE(g_.unscheduled_frontier().empty());
  EXPECT_TRUE(g_.IsReady(N(i, "a")));
  EXPECT_FALSE(g_.IsReady(N(i, "b")));
  ASSERT_TRUE(g_.Start(N(i, "a"), T(2)).ok());
  EXPECT_EQ(g_.memory(d0).activations, x);
  ASSERT_TRUE(g_.Finish(N(i, "a"), T(3)).ok());
  EXPECT_TRUE(g_.IsReady(N(i, "b")));
  EXPECT_EQ(g_.FindNode(N(i, "b"))->times.ready, T(3));
  ASSERT_TRUE(g_.Start(N(i, "b"), T(4)).ok());
  EXPECT_EQ(g_.memory(d0).activations, x + y + kv);
  EXPECT_EQ(g_.memory(d0).workspace, Bytes(1000));
  Check();
  ASSERT_TRUE(g_.Finish(N(i, "b"), T(5)).ok());
  // x is still needed by c; kv became a checkpoint.
  EXPECT_EQ(g_.memory(d0).activations, x + y);
  EXPECT_EQ(g_.memory(d0).checkpoints, kv);
  EXPECT_EQ(g_.memory(d0).workspace, Bytes(0));
  ASSERT_TRUE(g_.Start(N(i, "c"), T(6)).ok());
  EXPECT_EQ(g_.memory(d0).activations, x + y + z);
  Check();
  ASSERT_TRUE(g_.Finish(N(i, "c"), T(7)).ok());
  // c was the last consumer of x and y; z has no consumer.
  EXPECT_EQ(g_.memory(d0).activations, Bytes(0));
  EXPECT_EQ(g_.memory(d0).total(), Bytes(1000) + kv);
  EXPECT_EQ(g_.num_instances(), 0u);  // retired
  auto retired = g_.TakeRetired();
  ASSERT_EQ(retired.size(), 1u);
  EXPECT_EQ(retired[0].state, InstanceState::kDone);
  EXPECT_EQ(retired[0].finished, T(7));
  ASSERT_EQ(retired[0].produced.size(), 1u);
  const Checkpoint* ck = g_.FindCheckpoint(retired[0].produced[0]);
  ASSERT_NE(ck, nullptr);
  EXPECT_EQ(ck->bytes, kv);
  EXPECT_EQ(ck->device, d0);
  EXPECT_TRUE(g_.TakeRetired().empty());
  Check();
  ASSERT_TRUE(g_.ReleaseCheckpoint(ck->id).ok());
  EXPECT_EQ(g_.memory(d0).checkpoints, Bytes(0));
}

TEST_F(GmgTest, RejectsIllegalTransitions) {
  InstanceId i = NewDiamond();
  const DeviceId d0(0);
  EXPECT_EQ(g_.Start(N(i, "a"), T(0)).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(g_.Finish(N(i, "a"), T(0)).code(), absl::StatusCode::kFailedPrecondition);
  // b before its predecessor a is issued.
  auto early = g_.Issue(N(i, "b"), d0, T(0));
  EXPECT_THAT(early.message(), HasSubstr("unscheduled predecessor"));
  // Weights not resident on d1.
  auto noweights = g_.Issue(N(i, "a"), DeviceId(1), T(0));
  EXPECT_THAT(noweights.message(), HasSubstr("weights 'wa' are not resident on d1"));
  ASSERT_TRUE(g_.Issue(N(i, "a"), d0, T(0)).ok());
  EXPECT_THAT(g_.Issue(N(i, "a"), d0, T(0)).message(), HasSubstr("is issued; only unscheduled"));
  ASSERT_TRUE(g_.Issue(N(i, "b"), d0, T(0)).ok());
  EXPECT_THAT(g_.Start(N(i, "b"), T(0)).message(), HasSubstr("is not ready"));
  ASSERT_TRUE(g_.Start(N(i, "a"), T(0)).ok());
  EXPECT_EQ(g_.Start(N(i, "a"), T(0)).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(g_.Fail(NodeId(12345), "x", T(0)).code(), absl::StatusCode::kNotFound);
  Check();
}

TEST_F(GmgTest, OneComputeNodePerDevice) {
  InstanceId i = NewDiamond();
  InstanceId j = NewDiamond();
  const DeviceId d0(0);
  ASSERT_TRUE(g_.Issue(N(i, "a"), d0, T(0)).ok());
  ASSERT_TRUE(g_.Issue(N(j, "a"), d0, T(0)).ok());
  ASSERT_TRUE(g_.Start(N(i, "a"), T(1)).ok());
  auto second = g_.Start(N(j, "a"), T(1));
  EXPECT_THAT(second.message(), HasSubstr("is already running"));
  EXPECT_EQ(g_.running_compute(d0), N(i, "a"));
  Check();
}

TEST_F(GmgTest, TransferMakesInputLocalAndIsArbitratedPerDevice) {
  ASSERT_TRUE(g_.LoadWeights(DeviceId(1), "wa", Bytes(1000)).ok());
  InstanceId i = NewDiamond(10);
  const DeviceId d0(0), d1(1);
  ASSERT_TRUE(g_.Issue(N(i, "a"), d0, T(0)).ok());
  ASSERT_TRUE(g_.Issue(N(i, "b"), d1, T(0)).ok());
  // Consumer on d1 needs a's output from d0.
  auto t = g_.IssueTransfer(N(i, "a"), 0, d1, N(i, "b"), 5, T(0));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(g_.IssueTransfer(N(i, "a"), 0, d1, N(i, "b"), 5, T(0)).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_FALSE(g_.IsReady(*t));  // producer not done
  ASSERT_TRUE(g_.Start(N(i, "a"), T(1)).ok());
  ASSERT_TRUE(g_.Finish(N(i, "a"), T(2)).ok());
  EXPECT_TRUE(g_.IsReady(*t));
  EXPECT_FALSE(g_.IsReady(N(i, "b")));  // input not local yet
  ASSERT_TRUE(g_.Start(*t, T(3)).ok());
  EXPECT_EQ(g_.active_transfer(d0), *t);
  EXPECT_EQ(g_.active_transfer(d1), *t);
  EXPECT_EQ(g_.memory(d1).activations, Bytes(160));  // receive buffer
  Check();
  ASSERT_TRUE(g_.Finish(*t, T(4)).ok());
  EXPECT_TRUE(g_.IsReady(N(i, "b")));
  EXPECT_EQ(g_.FindNode(N(i, "b"))->times.ready, T(4));
  // The tensor now lives on both devices until its last consumer is done.
  EXPECT_EQ(g_.memory(d0).activations, Bytes(160));
  EXPECT_EQ(g_.memory(d1).activations, Bytes(160));
  ASSERT_TRUE(g_.Start(N(i, "b"), T(5)).ok());
  ASSERT_TRUE(g_.Finish(N(i, "b"), T(6)).ok());
  // c on d0 reads a (local) and b:y (on d1): an operator whose inputs sit on two devices.
  ASSERT_TRUE(g_.Issue(N(i, "c"), d0, T(6)).ok());
  EXPECT_FALSE(g_.IsReady(N(i, "c")));
  auto t2 = g_.IssueTransfer(N(i, "b"), 0, d0, N(i, "c"), 0, T(6));
  ASSERT_TRUE(t2.ok()) << t2.status();
  ASSERT_TRUE(g_.Start(*t2, T(7)).ok());
  ASSERT_TRUE(g_.Finish(*t2, T(8)).ok());
  ASSERT_TRUE(g_.Start(N(i, "c"), T(9)).ok());
  ASSERT_TRUE(g_.Finish(N(i, "c"), T(10)).ok());
  EXPECT_EQ(g_.memory(d0).activations, Bytes(0));
  EXPECT_EQ(g_.memory(d1).activations, Bytes(0));
  EXPECT_EQ(g_.num_nodes(), 0u);
  Check();
}

TEST_F(GmgTest, FailureReleasesEverythingAndCancelsTheRest) {
  InstanceId i = NewDiamond(10);
  const DeviceId d0(0);
  ASSERT_TRUE(g_.Issue(N(i, "a"), d0, T(0)).ok());
  ASSERT_TRUE(g_.Issue(N(i, "b"), d0, T(0)).ok());
  ASSERT_TRUE(g_.Start(N(i, "a"), T(1)).ok());
  ASSERT_TRUE(g_.Finish(N(i, "a"), T(2)).ok());
  ASSERT_TRUE(g_.Start(N(i, "b"), T(3)).ok());
  ASSERT_TRUE(g_.Fail(N(i, "b"), "out of memory", T(4)).ok());
  EXPECT_EQ(g_.memory(d0).activations, Bytes(0));
  EXPECT_EQ(g_.memory(d0).workspace, Bytes(0));
  EXPECT_EQ(g_.memory(d0).checkpoints, Bytes(0));
  EXPECT_FALSE(g_.running_compute(d0).valid());
  EXPECT_TRUE(g_.unscheduled_frontier().empty());
  auto retired = g_.TakeRetired();
  ASSERT_EQ(retired.size(), 1u);
  EXPECT_EQ(retired[0].state, InstanceState::kFailed);
  EXPECT_THAT(retired[0].failure, HasSubstr("out of memory"));
  Check();
}

TEST_F(GmgTest, CancelInstanceFromAnyState) {
  InstanceId i = NewDiamond();
  ASSERT_TRUE(g_.Issue(N(i, "a"), DeviceId(0), T(0)).ok());
  ASSERT_TRUE(g_.Start(N(i, "a"), T(0)).ok());
  ASSERT_TRUE(g_.CancelInstance(i, "client went away", T(1)).ok());
  EXPECT_EQ(g_.memory(DeviceId(0)).activations, Bytes(0));
  auto r = g_.TakeRetired();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].state, InstanceState::kCancelled);
  EXPECT_EQ(g_.CancelInstance(i, "again", T(2)).code(), absl::StatusCode::kNotFound);
  Check();
}

TEST_F(GmgTest, CheckpointAttachAndGrowInPlace) {
  // Produce a checkpoint through a diamond instance (kv of 10 floats).
  InstanceId i = NewDiamond(10);
  for (const char* op : {"a", "b", "c"}) ASSERT_TRUE(g_.Issue(N(i, op), DeviceId(0), T(0)).ok());
  for (const char* op : {"a", "b", "c"}) {
    ASSERT_TRUE(g_.Start(N(i, op), T(1)).ok());
    ASSERT_TRUE(g_.Finish(N(i, op), T(2)).ok());
  }
  CheckpointId ck = g_.TakeRetired()[0].produced[0];

  InstanceSpec s;
  s.template_id = step_;
  s.bindings = {{"C", 9}};  // wrong size: 9 floats != 40 bytes
  s.checkpoints = {{"kv", ck}};
  EXPECT_THAT(g_.Instantiate(s).status().message(), HasSubstr("holds 40 bytes but the template expects 36"));
  s.bindings = {{"C", 10}};
  s.checkpoints = {};
  EXPECT_THAT(g_.Instantiate(s).status().message(), HasSubstr("'@kv' is not attached"));
  s.checkpoints = {{"kv", CheckpointId(999)}};
  EXPECT_EQ(g_.Instantiate(s).status().code(), absl::StatusCode::kNotFound);
  s.checkpoints = {{"kv", ck}};
  auto j = g_.Instantiate(s);
  ASSERT_TRUE(j.ok()) << j.status();
  // A second instance may not grow the same checkpoint concurrently.
  EXPECT_THAT(g_.Instantiate(s).status().message(), HasSubstr("is being updated"));
  EXPECT_EQ(g_.ReleaseCheckpoint(ck).code(), absl::StatusCode::kFailedPrecondition);
  NodeId step = N(*j, "s");
  EXPECT_THAT(g_.Issue(step, DeviceId(1), T(3)).message(), HasSubstr("must run there"));
  ASSERT_TRUE(g_.Issue(step, DeviceId(0), T(3)).ok());
  ASSERT_TRUE(g_.Start(step, T(4)).ok());
  EXPECT_EQ(g_.FindCheckpoint(ck)->bytes, Bytes(48));
  EXPECT_EQ(g_.memory(DeviceId(0)).checkpoints, Bytes(48));
  Check();
  ASSERT_TRUE(g_.Finish(step, T(5)).ok());
  EXPECT_EQ(g_.FindCheckpoint(ck)->bytes, Bytes(48));
  EXPECT_FALSE(g_.FindCheckpoint(ck)->updating.valid());
  Check();
  // A failed update gives the growth back.
  s.bindings = {{"C", 12}};
  auto k = g_.Instantiate(s);
  ASSERT_TRUE(k.ok()) << k.status();
  ASSERT_TRUE(g_.Issue(N(*k, "s"), DeviceId(0), T(6)).ok());
  ASSERT_TRUE(g_.Start(N(*k, "s"), T(6)).ok());
  EXPECT_EQ(g_.memory(DeviceId(0)).checkpoints, Bytes(56));
  ASSERT_TRUE(g_.Fail(N(*k, "s"), "boom", T(7)).ok());
  EXPECT_EQ(g_.memory(DeviceId(0)).checkpoints, Bytes(48));
  EXPECT_EQ(g_.FindCheckpoint(ck)->bytes, Bytes(48));
  Check();
}

TEST_F(GmgTest, UnscheduledFrontierOrder) {
  InstanceId off_lo = NewDiamond(1, PriorityClass::kOffline, 0, 1);
  InstanceId on_late = NewDiamond(1, PriorityClass::kOnline, 0, 9);
  InstanceId on_early = NewDiamond(1, PriorityClass::kOnline, 0, 3);
  InstanceId off_hi = NewDiamond(1, PriorityClass::kOffline, 7, 5);
  std::vector<NodeId> order;
  for (const FrontierKey& k : g_.unscheduled_frontier()) order.push_back(k.node);
  EXPECT_THAT(order, ::testing::ElementsAre(N(on_early, "a"), N(on_late, "a"), N(off_hi, "a"),
                                            N(off_lo, "a")));
  ASSERT_TRUE(g_.Issue(N(on_early, "a"), DeviceId(0), T(0)).ok());
  EXPECT_TRUE(g_.scheduled_frontier().contains(N(on_early, "a")));
  ASSERT_TRUE(g_.Issue(N(on_early, "b"), DeviceId(0), T(0)).ok());
  EXPECT_TRUE(g_.scheduled_frontier().contains(N(on_early, "a")));  // c still unscheduled
  ASSERT_TRUE(g_.Issue(N(on_early, "c"), DeviceId(0), T(0)).ok());
  EXPECT_FALSE(g_.scheduled_frontier().contains(N(on_early, "a")));
  Check();
}

TEST_F(GmgTest, ResidentSetMatchesAccounting) {
  InstanceId i = NewDiamond(10);
  ASSERT_TRUE(g_.Issue(N(i, "a"), DeviceId(0), T(0)).ok());
  ASSERT_TRUE(g_.Issue(N(i, "b"), DeviceId(0), T(0)).ok());
  ASSERT_TRUE(g_.Start(N(i, "a"), T(0)).ok());
  ASSERT_TRUE(g_.Finish(N(i, "a"), T(0)).ok());
  ASSERT_TRUE(g_.Start(N(i, "b"), T(0)).ok());
  Bytes sum;
  for (const ResidentItem& item : g_.ResidentSet(DeviceId(0))) sum += item.bytes;
  EXPECT_EQ(sum, g_.memory(DeviceId(0)).total());
  EXPECT_EQ(g_.ResidentSet(DeviceId(0)).size(), 1u + 3u + 1u);  // weights, x y kv, workspace
}

TEST_F(GmgTest, SnapshotIsFlatAndConsistent) {
  ASSERT_TRUE(g_.LoadWeights(DeviceId(1), "wa", Bytes(1000)).ok());
  InstanceId i = NewDiamond(10, PriorityClass::kOnline, 3, 1);
  NewDiamond(5);
  ASSERT_TRUE(g_.Issue(N(i, "a"), DeviceId(0), T(0)).ok());
  ASSERT_TRUE(g_.Issue(N(i, "b"), DeviceId(1), T(0)).ok());
  auto t = g_.IssueTransfer(N(i, "a"), 0, DeviceId(1), N(i, "b"), 1, T(0));
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(g_.Start(N(i, "a"), T(1)).ok());
  GmgSnapshot s = g_.Snapshot(T(2));
  EXPECT_EQ(s.taken_at, T(2));
  ASSERT_EQ(s.instances.size(), 2u);
  ASSERT_EQ(s.nodes.size(), 7u);
  EXPECT_EQ(s.num_compute_nodes, 6u);
  EXPECT_EQ(s.pred_offsets.size(), 8u);
  // Node order: instance i's a, b, c, then the other's, then the transfer.
  EXPECT_EQ(s.nodes[0].id, N(i, "a").value());
  EXPECT_EQ(s.nodes[0].state, static_cast<uint8_t>(NodeState::kRunning));
  EXPECT_EQ(s.nodes[6].kind, static_cast<uint8_t>(OpKind::kTransfer));
  EXPECT_EQ(s.nodes[6].consumer, 1u);
  EXPECT_EQ(s.nodes[6].transfer_bytes, 160);
  // c's predecessors are a and b.
  std::vector<uint32_t> preds_c(s.preds.begin() + s.pred_offsets[2], s.preds.begin() + s.pred_offsets[3]);
  EXPECT_THAT(preds_c, ::testing::ElementsAre(0, 1));
  // a's successors: b, c and the transfer.
  std::vector<uint32_t> succ_a(s.succs.begin() + s.succ_offsets[0], s.succs.begin() + s.succ_offsets[1]);
  EXPECT_THAT(succ_a, ::testing::ElementsAre(1, 2, 6));
  // c reads tensor a:x and b:y.
  std::vector<uint32_t> in_c(s.inputs.begin() + s.input_offsets[2], s.inputs.begin() + s.input_offsets[3]);
  EXPECT_THAT(in_c, ::testing::ElementsAre(s.tensor_offsets[0], s.tensor_offsets[1]));
  EXPECT_EQ(s.devices[0].running, 0u);
  EXPECT_EQ(s.devices[1].running, GmgSnapshot::kNone);
  EXPECT_EQ(s.devices[0].activations, 160);
  EXPECT_EQ(s.devices[0].weights, 1000);
  ASSERT_EQ(s.device_types.size(), 1u);
  // A copy is independent of the GMG.
  GmgSnapshot copy = s;
  ASSERT_TRUE(g_.Finish(N(i, "a"), T(3)).ok());
  EXPECT_EQ(copy.nodes[0].state, static_cast<uint8_t>(NodeState::kRunning));
  EXPECT_GT(s.ByteSize(), 0u);
}

}  // namespace
}  // namespace slicesched
