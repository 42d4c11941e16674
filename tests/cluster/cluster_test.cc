#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "slicesched/cluster/ground_truth.h"
#include "slicesched/cluster/virtual_cluster.h"
#include "slicesched/gmg/llama.h"
#include "slicesched/gmg/placement.h"

namespace slicesched {
namespace {

struct Fixture {
  Fixture() {
    std::vector<DeviceSpec> devs(4);
    for (int d = 0; d < 4; ++d) {
      devs[d].name = "gpu" + std::to_string(d);
      devs[d].type = "A16";
      devs[d].memory = Bytes::GiB(64);
    }
    g = std::make_unique<GlobalMappingGraph>(*AcceleratorSet::Create(devs, LinkSpec{12e9, Duration::Micros(20)}));
    t = *BuildLlamaTemplates(*LlamaPreset("llama3-8b"));
    pre = *g->RegisterTemplate(t.prefill);
    dec = *g->RegisterTemplate(t.decode);
    for (int d = 0; d < 4; ++d) {
      for (const OpSpec& op : t.prefill->ops()) {
        if (op.weight_key.empty()) continue;
        EXPECT_TRUE(g->LoadWeights(DeviceId(d), op.weight_key, op.weight_bytes).ok());
      }
    }
  }
  InstanceId Prefill(int64_t tokens, PriorityClass cls = PriorityClass::kOnline) {
    InstanceSpec s;
    s.template_id = pre;
    s.bindings = {{"B", 1}, {"S", tokens}};
    s.priority_class = cls;
    return *g->Instantiate(s);
  }
  std::unique_ptr<GlobalMappingGraph> g;
  LlamaTemplates t;
  TemplateId pre, dec;
};

TEST(GroundTruthTest, CalibratedToThePaper) {
  Fixture f;
  GroundTruthOptions o;
  o.device_skew_pct = 0;
  GroundTruthModel truth(f.g->accelerators(), o);
  const GraphTemplate& dec = *f.g->templates().Find(f.dec);
  // A fused 8-layer decode operator at batch 1 (context 1000): ~10.6 ms.
  const int64_t decode_attrs[] = {1, 1, 1000, 8};
  const double ns = truth.NominalOpNs(dec, 1, decode_attrs);
  EXPECT_NEAR(ns / 1e6, 10.6, 0.5);
  // Prefill grows with tokens, super-linearly at first (efficiency), then ~linearly.
  const GraphTemplate& pre = *f.g->templates().Find(f.pre);
  const int64_t p128[] = {1, 128, 0, 8}, p1024[] = {1, 1024, 0, 8}, p2048[] = {1, 2048, 0, 8};
  const double t128 = truth.NominalOpNs(pre, 1, p128), t1024 = truth.NominalOpNs(pre, 1, p1024),
               t2048 = truth.NominalOpNs(pre, 1, p2048);
  EXPECT_GT(t1024, 4 * t128);
  EXPECT_NEAR(t2048 / t1024, 2.0, 0.15);
  // Transfers: latency plus size over the achieved bandwidth plus chunking.
  const double x = truth.NominalTransferNs(DeviceId(0), DeviceId(1), Bytes::MiB(16));
  EXPECT_GT(x, 16.0 * (1 << 20) / 12e9 * 1e9);
  EXPECT_EQ(truth.NominalTransferNs(DeviceId(1), DeviceId(1), Bytes::MiB(16)), 0);
}

TEST(GroundTruthTest, NoiseSkewAndOverlapAreBounded) {
  Fixture f;
  GroundTruthModel truth(f.g->accelerators());
  const GraphTemplate& dec = *f.g->templates().Find(f.dec);
  const int64_t attrs[] = {1, 1, 500, 8};
  const double nominal = truth.NominalOpNs(dec, 1, attrs);
  std::mt19937_64 rng(3);
  for (int i = 0; i < 1000; ++i) {
    const double t = static_cast<double>(truth.OpTime(dec, 1, attrs, DeviceId(2), false, rng).nanos());
    EXPECT_LE(std::abs(t / (nominal * truth.skew(DeviceId(2))) - 1.0), 0.0301);
    const double o = static_cast<double>(truth.OpTime(dec, 1, attrs, DeviceId(2), true, rng).nanos());
    EXPECT_GT(o / (nominal * truth.skew(DeviceId(2))), 1.0 + 0.06 - 0.035);
  }
  EXPECT_LE(std::abs(truth.skew(DeviceId(0)) - 1.0), 0.04);
}

TEST(VirtualClusterTest, RunsAPipelinedPrefillWithTransfers) {
  Fixture f;
  GroundTruthModel truth(f.g->accelerators());
  VirtualCluster cluster(f.g.get(), &truth, 1);
  InstanceId i = f.Prefill(512);
  const DeviceId slots[] = {DeviceId(0), DeviceId(1)};
  auto issued = IssueByPartition(*f.g, i, f.t.prefill->partitions()[1], slots, 0, Timestamp::Epoch());
  ASSERT_TRUE(issued.ok()) << issued.status();
  EXPECT_EQ(issued->size(), 8u);  // 7 ops + the transfer between the halves
  for (NodeId n : *issued) cluster.NodeIssued(n);
  ASSERT_TRUE(cluster.Dispatch(Timestamp::Epoch()).ok());
  std::vector<Feedback> fb;
  int guard = 0;
  while (cluster.NextEventTime() != Timestamp::Infinite() && ++guard < 100) {
    ASSERT_TRUE(cluster.AdvanceTo(cluster.NextEventTime(), &fb).ok());
  }
  EXPECT_EQ(f.g->num_instances(), 0u);
  auto retired = f.g->TakeRetired();
  ASSERT_EQ(retired.size(), 1u);
  EXPECT_EQ(retired[0].state, InstanceState::kDone);
  EXPECT_EQ(fb.size(), 8u);
  EXPECT_EQ(cluster.completed_ops(), 7);
  EXPECT_EQ(cluster.completed_transfers(), 1);
  // Feedback is in completion order and matches the GMG's timestamps.
  for (size_t k = 1; k < fb.size(); ++k) EXPECT_LE(fb[k - 1].end, fb[k].end);
  EXPECT_EQ(retired[0].finished, fb.back().end);
  EXPECT_GT(cluster.busy_time(DeviceId(0)), Duration::Zero());
  EXPECT_EQ(cluster.busy_time(DeviceId(2)), Duration::Zero());
}

TEST(VirtualClusterTest, OnlineOvertakesQueuedOfflineWork) {
  Fixture f;
  GroundTruthModel truth(f.g->accelerators());
  VirtualCluster cluster(f.g.get(), &truth, 1);
  const DeviceId one[] = {DeviceId(0)};
  const CandidatePartition& single = f.t.prefill->partitions()[0];
  InstanceId off1 = f.Prefill(256, PriorityClass::kOffline);
  InstanceId off2 = f.Prefill(256, PriorityClass::kOffline);
  for (InstanceId i : {off1, off2}) {
    auto issued = IssueByPartition(*f.g, i, single, one, 0, Timestamp::Epoch());
    ASSERT_TRUE(issued.ok());
    for (NodeId n : *issued) cluster.NodeIssued(n);
  }
  ASSERT_TRUE(cluster.Dispatch(Timestamp::Epoch()).ok());
  // An online request arrives while off1's embedding runs.
  std::vector<Feedback> fb;
  const Timestamp t1 = Timestamp::FromNanos(1);
  ASSERT_TRUE(cluster.AdvanceTo(t1, &fb).ok());
  InstanceId on = f.Prefill(256, PriorityClass::kOnline);
  auto issued = IssueByPartition(*f.g, on, single, one, 0, t1);
  ASSERT_TRUE(issued.ok());
  for (NodeId n : *issued) cluster.NodeIssued(n);
  ASSERT_TRUE(cluster.Dispatch(t1).ok());
  while (cluster.NextEventTime() != Timestamp::Infinite()) {
    ASSERT_TRUE(cluster.AdvanceTo(cluster.NextEventTime(), &fb).ok());
  }
  auto retired = f.g->TakeRetired();
  ASSERT_EQ(retired.size(), 3u);
  EXPECT_EQ(retired[0].id, on);  // finished first although it arrived last
}

}  // namespace
}  // namespace slicesched

namespace slicesched {
namespace {

TEST(VirtualClusterTest, ForkRunsTheSameStateIndependently) {
  Fixture f;
  GroundTruthModel truth(f.g->accelerators());
  VirtualCluster cluster(f.g.get(), &truth, 9);
  const DeviceId slots[] = {DeviceId(0), DeviceId(1)};
  for (int k = 0; k < 3; ++k) {
    InstanceId i = f.Prefill(300 + k);
    auto issued = IssueByPartition(*f.g, i, f.t.prefill->partitions()[1], slots, 0, Timestamp::Epoch());
    ASSERT_TRUE(issued.ok());
    for (NodeId n : *issued) cluster.NodeIssued(n);
  }
  ASSERT_TRUE(cluster.Dispatch(Timestamp::Epoch()).ok());
  std::vector<Feedback> fb;
  ASSERT_TRUE(cluster.AdvanceTo(cluster.NextEventTime(), &fb).ok());
  GlobalMappingGraph copy = f.g->Clone();
  ASSERT_TRUE(copy.VerifyInvariants().ok());
  VirtualCluster fork = cluster.Fork(&copy);
  auto drain = [](VirtualCluster& c) {
    std::vector<Feedback> out;
    while (c.NextEventTime() != Timestamp::Infinite()) {
      EXPECT_TRUE(c.AdvanceTo(c.NextEventTime(), &out).ok());
    }
    return out;
  };
  std::vector<Feedback> a = drain(fork);
  EXPECT_EQ(copy.num_instances(), 0u);
  EXPECT_EQ(f.g->num_instances(), 3u);  // the original is untouched
  std::vector<Feedback> b = drain(cluster);
  ASSERT_EQ(a.size(), b.size());
  for (size_t k = 0; k < a.size(); ++k) {
    EXPECT_EQ(a[k].node, b[k].node);
    EXPECT_EQ(a[k].end, b[k].end);  // same random state, same outcome
  }
}

}  // namespace
}  // namespace slicesched

namespace slicesched {
namespace {

TEST(VirtualClusterTest, OneTransferServesEveryConsumerOnItsDevice) {
  std::vector<DeviceSpec> devs(2);
  for (int d = 0; d < 2; ++d) {
    devs[d].name = "d" + std::to_string(d);
    devs[d].type = "cpu";
    devs[d].memory = Bytes::GiB(1);
  }
  GlobalMappingGraph g(*AcceleratorSet::Create(devs, LinkSpec{1e9, Duration::Micros(1)}));
  TemplateBuilder b("diamond");
  b.Op("a", OpKind::kGeneric).Output("x", DType::kF32, {"16"});
  b.Op("b", OpKind::kGeneric).Inputs({"a"}).Output("y", DType::kF32, {"16"});
  b.Op("c", OpKind::kGeneric).Inputs({"a"}).Output("z", DType::kF32, {"16"});
  TemplateId t = *g.RegisterTemplate(*b.Build());
  InstanceSpec s;
  s.template_id = t;
  InstanceId i = *g.Instantiate(s);
  std::vector<NodePlacement> pl = {{*g.NodeOf(i, "a"), DeviceId(0)},
                                   {*g.NodeOf(i, "b"), DeviceId(1)},
                                   {*g.NodeOf(i, "c"), DeviceId(1)}};
  auto issued = IssuePlacements(g, pl, 0, Timestamp::Epoch());
  ASSERT_TRUE(issued.ok()) << issued.status();
  EXPECT_EQ(issued->size(), 4u);  // three ops, one transfer shared by b and c
  GroundTruthModel truth(g.accelerators());
  VirtualCluster cluster(&g, &truth, 1);
  for (NodeId n : *issued) cluster.NodeIssued(n);
  ASSERT_TRUE(cluster.Dispatch(Timestamp::Epoch()).ok());
  std::vector<Feedback> fb;
  for (int guard = 0; cluster.NextEventTime() != Timestamp::Infinite() && guard < 20; ++guard) {
    ASSERT_TRUE(cluster.AdvanceTo(cluster.NextEventTime(), &fb).ok());
  }
  EXPECT_EQ(g.num_instances(), 0u);  // both consumers ran
  EXPECT_EQ(fb.size(), 4u);
}

}  // namespace
}  // namespace slicesched
