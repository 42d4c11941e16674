// Randomized property test: random DAG templates, random legal (and some
// illegal) transitions; after every step the incrementally maintained
// frontiers and memory accounting must equal a from-scratch recomputation
// (GlobalMappingGraph::VerifyInvariants).
#include <random>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "slicesched/gmg/gmg.h"

namespace slicesched {
namespace {

std::shared_ptr<const GraphTemplate> RandomTemplate(std::mt19937_64& rng, int index) {
  TemplateBuilder b(absl::StrCat("random", index));
  std::uniform_int_distribution<int> n_ops(1, 8);
  const int n = n_ops(rng);
  for (int i = 0; i < n; ++i) {
    const std::string name = absl::StrCat("op", i);
    b.Op(name, OpKind::kGeneric);
    std::vector<std::string> inputs;
    if (i > 0) {
      std::uniform_int_distribution<int> k(0, std::min(i, 3));
      const int n_in = k(rng);
      for (int j = 0; j < n_in; ++j) {
        std::string ref = absl::StrCat("op", std::uniform_int_distribution<int>(0, i - 1)(rng));
        if (std::find(inputs.begin(), inputs.end(), ref) == inputs.end()) inputs.push_back(ref);
      }
    }
    b.Inputs(inputs);
    b.Output("out", DType::kF32, {"N", absl::StrCat(1 + rng() % 5)});
    if (rng() % 4 == 0) b.RetainedOutput("keep", DType::kBF16, {"N"});
    if (rng() % 2 == 0) b.Workspace(absl::StrCat("N*", rng() % 7));
    if (rng() % 3 == 0) b.Weights(absl::StrCat("w", rng() % 3), Bytes(100));
  }
  auto t = b.Build();
  EXPECT_TRUE(t.ok()) << t.status();
  return *t;
}

struct NodeRef {
  NodeId id;
  NodeState state;
};

class PropertyTest : public ::testing::TestWithParam<uint64_t> {};

TEST_P(PropertyTest, IncrementalStateEqualsRecomputation) {
  std::mt19937_64 rng(GetParam());
  std::vector<DeviceSpec> devs(3);
  for (int d = 0; d < 3; ++d) {
    devs[d].name = absl::StrCat("d", d);
    devs[d].type = "cpu";
    devs[d].memory = Bytes::GiB(1);
  }
  GlobalMappingGraph g(*AcceleratorSet::Create(devs, LinkSpec{1e9, Duration::Micros(1)}));
  for (int d = 0; d < 3; ++d) {
    for (int w = 0; w < 3; ++w) ASSERT_TRUE(g.LoadWeights(DeviceId(d), absl::StrCat("w", w), Bytes(100)).ok());
  }
  std::vector<TemplateId> tpls;
  for (int i = 0; i < 5; ++i) tpls.push_back(*g.RegisterTemplate(RandomTemplate(rng, i)));

  int64_t now = 0;
  int finished = 0, transfers = 0, failures = 0;
  auto pick = [&](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
  for (int step = 0; step < 3000; ++step) {
    now += 1000;
    const Timestamp ts = Timestamp::FromNanos(now);
    // Collect live nodes by state.
    std::vector<const OpNode*> issued, running, unscheduled_frontier;
    std::vector<std::pair<const Instance*, const OpNode*>> compute_issued;
    for (const auto& [iid, inst] : g.instances()) {
      for (const OpNode& n : inst->nodes) {
        if (n.state == NodeState::kIssued) {
          issued.push_back(&n);
          compute_issued.emplace_back(inst.get(), &n);
        }
        if (n.state == NodeState::kRunning) running.push_back(&n);
      }
      for (NodeId t : inst->transfers) {
        const OpNode* tn = g.FindNode(t);
        if (tn->state == NodeState::kIssued) issued.push_back(tn);
        if (tn->state == NodeState::kRunning) running.push_back(tn);
      }
    }
    const int action = static_cast<int>(rng() % 100);
    // Actions: 10% instantiate, 25% issue, 15% transfer, 25% start, 20% finish,
    // 2% fail, 1% cancel, 1% release a checkpoint, 1% illegal calls.
    if (action < 10) {
      if (g.num_instances() >= 10) continue;
      InstanceSpec s;
      s.template_id = tpls[pick(tpls.size())];
      s.bindings = {{"N", static_cast<int64_t>(1 + rng() % 16)}};
      s.priority_class = rng() % 2 ? PriorityClass::kOnline : PriorityClass::kOffline;
      s.priority = static_cast<int32_t>(rng() % 3);
      s.arrival = ts;
      ASSERT_TRUE(g.Instantiate(s).ok());
    } else if (action < 35) {
      if (g.unscheduled_frontier().empty()) continue;
      auto it = g.unscheduled_frontier().begin();
      std::advance(it, pick(g.unscheduled_frontier().size()));
      ASSERT_TRUE(g.Issue(it->node, DeviceId(static_cast<uint16_t>(rng() % 3)), ts).ok());
    } else if (action < 50) {
      if (compute_issued.empty()) continue;
      // Move a missing input to an issued consumer.
      auto [inst, c] = compute_issued[pick(compute_issued.size())];
      const OpSpec& op = inst->tpl->op(c->op_index);
      for (const InputRef& r : op.inputs) {
        const OpNode& p = inst->nodes[r.index];
        if (!IsScheduled(p.state) || p.device == c->device) continue;
        const auto& copies = p.outputs[r.output].copies;
        if (std::find(copies.begin(), copies.end(), c->device) != copies.end()) continue;
        auto t = g.IssueTransfer(p.id, r.output, c->device, c->id, static_cast<int32_t>(rng() % 4), ts);
        if (t.ok()) {
          ++transfers;
          break;
        }
        EXPECT_EQ(t.status().code(), absl::StatusCode::kAlreadyExists) << t.status();
      }
    } else if (action < 75) {
      if (issued.empty()) continue;
      // Mostly start a ready node; sometimes any issued one (may be refused).
      std::vector<const OpNode*> ready;
      for (const OpNode* n : issued) {
        if (g.IsReady(n->id)) ready.push_back(n);
      }
      const OpNode* n = !ready.empty() && rng() % 4 != 0 ? ready[pick(ready.size())]
                                                         : issued[pick(issued.size())];
      const bool is_ready = g.IsReady(n->id);
      absl::Status st = g.Start(n->id, ts);
      if (!is_ready) {
        EXPECT_FALSE(st.ok());
      }
      if (!st.ok()) {
        EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
      }
    } else if (action < 95) {
      if (running.empty()) continue;
      ASSERT_TRUE(g.Finish(running[pick(running.size())]->id, ts).ok());
      ++finished;
    } else if (action < 97) {
      if (issued.empty() && running.empty()) continue;
      const OpNode* n = !running.empty() && rng() % 2 ? running[pick(running.size())]
                                                      : (!issued.empty() ? issued[pick(issued.size())]
                                                                         : running[pick(running.size())]);
      ASSERT_TRUE(g.Fail(n->id, "injected", ts).ok());
      ++failures;
    } else if (action < 98) {
      if (g.num_instances() == 0) continue;
      auto it = g.instances().begin();
      std::advance(it, pick(g.instances().size()));
      ASSERT_TRUE(g.CancelInstance(InstanceId(it->first), "cancelled", ts).ok());
    } else if (action < 99) {
      if (g.checkpoint_index().empty()) continue;
      auto it = g.checkpoint_index().begin();
      std::advance(it, pick(g.checkpoint_index().size()));
      (void)g.ReleaseCheckpoint(it->second);
    } else {
      // Illegal calls must be rejected without changing anything.
      if (!g.unscheduled_frontier().empty()) {
        NodeId n = g.unscheduled_frontier().begin()->node;
        EXPECT_FALSE(g.Finish(n, ts).ok());
        EXPECT_FALSE(g.Start(n, ts).ok());
        EXPECT_FALSE(g.Fail(n, "x", ts).ok());
      }
    }
    absl::Status inv = g.VerifyInvariants();
    ASSERT_TRUE(inv.ok()) << "step " << step << ": " << inv;
  }
  // The run must have exercised the interesting paths.
  EXPECT_GT(finished, 100);
  EXPECT_GT(transfers, 5);
  (void)g.TakeRetired();
}

INSTANTIATE_TEST_SUITE_P(Seeds, PropertyTest, ::testing::Values(1, 2, 3, 4, 5, 6, 7, 8));

}  // namespace
}  // namespace slicesched
