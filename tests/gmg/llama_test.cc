#include "slicesched/gmg/llama.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>

#include "slicesched/common/strings.h"
#include "slicesched/gmg/gmg.h"

namespace slicesched {
namespace {

using ::testing::HasSubstr;

// A GMG over one 64 GiB A16.
std::unique_ptr<GlobalMappingGraph> OneA16() {
  std::vector<DeviceSpec> devs(1);
  devs[0].name = "gpu0";
  devs[0].type = "A16";
  devs[0].memory = Bytes::GiB(64);
  return std::make_unique<GlobalMappingGraph>(*AcceleratorSet::Create(devs, LinkSpec{12e9, Duration::Micros(20)}));
}

TEST(LlamaTest, Llama3_8bFusedOperatorSize) {
  auto dims = LlamaPreset("llama3-8b");
  ASSERT_TRUE(dims.ok()) << dims.status();
  EXPECT_EQ(dims->fusion, 8);
  EXPECT_EQ(dims->head_dim(), 128);
  // 8 layers: 1.745 G parameters within 0.5%, 3.49 GB in bf16.
  const double params = static_cast<double>(dims->ParamsPerGroup());
  EXPECT_NEAR(params / 1.745e9, 1.0, 0.005);
  auto t = BuildLlamaTemplates(*dims);
  ASSERT_TRUE(t.ok()) << t.status();
  const GraphTemplate& pre = *t->prefill;
  auto g0 = pre.FindOp("g0");
  ASSERT_TRUE(g0.ok());
  EXPECT_NEAR(static_cast<double>(pre.op(*g0).weight_bytes.count()) / 3.49e9, 1.0, 0.005);
  // KV bytes per token per layer: 2 x 8 kv heads x 128 x 2 bytes.
  EXPECT_EQ(dims->KvBytesPerTokenPerLayer(), 2 * 8 * 128 * 2);
  // The whole model: about 8.03 G parameters.
  EXPECT_NEAR(static_cast<double>(dims->TotalParams()) / 8.03e9, 1.0, 0.01);
}

TEST(LlamaTest, TemplatesHaveExactKvAndPartitions) {
  auto dims = *LlamaPreset("llama3-8b");
  auto t = *BuildLlamaTemplates(dims);
  EXPECT_EQ(t.prefill->num_ops(), 1 + 4 + 2);
  EXPECT_EQ(t.decode->checkpoint_inputs().size(), 4u);
  std::vector<std::string> names;
  for (const auto& p : t.prefill->partitions()) names.push_back(p.name);
  EXPECT_THAT(names, ::testing::ElementsAre("single", "pp2", "pp4"));

  auto gmg = OneA16();
  GlobalMappingGraph& g = *gmg;
  TemplateId pre = *g.RegisterTemplate(t.prefill);
  TemplateId dec = *g.RegisterTemplate(t.decode);
  InstanceSpec s;
  s.template_id = pre;
  s.bindings = {{"B", 1}, {"S", 100}};
  InstanceId i = *g.Instantiate(s);
  const Instance* inst = g.FindInstance(i);
  // g0's retained KV: 8 layers x 100 tokens x 4096 bytes.
  EXPECT_EQ(inst->nodes[1].outputs[1].bytes, Bytes(8 * 100 * 4096));
  EXPECT_TRUE(inst->nodes[1].outputs[1].retained);
  EXPECT_EQ(inst->nodes[1].outputs[0].bytes, Bytes(100 * 4096 * 2));
  // Decode attaches to a KV of C tokens and grows it by one token.
  EXPECT_EQ(t.decode->FindCheckpointInput("kv3"), 3);
  (void)dec;
}

TEST(LlamaTest, TrainTemplateShapesAndPartitions) {
  auto dims = *LlamaPreset("llama3-8b");
  auto t = BuildLlamaTrainTemplate(dims);
  ASSERT_TRUE(t.ok()) << t.status();
  const GraphTemplate& tr = **t;
  EXPECT_EQ(tr.name(), "llama3-8b/train");
  // embed, f0..f3, loss, b3..b0, optimizer.
  ASSERT_EQ(tr.num_ops(), 1 + 4 + 1 + 4 + 1);
  EXPECT_EQ(tr.op(*tr.FindOp("f2")).kind, OpKind::kTrainForward);
  EXPECT_EQ(tr.op(*tr.FindOp("loss")).kind, OpKind::kTrainLoss);
  EXPECT_EQ(tr.op(*tr.FindOp("b2")).kind, OpKind::kTrainBackward);
  EXPECT_EQ(tr.op(*tr.FindOp("optimizer")).kind, OpKind::kOptimizerStep);
  EXPECT_EQ(OpKindName(OpKind::kTrainLoss), "train_loss");
  EXPECT_EQ(*ParseOpKind("train_loss"), OpKind::kTrainLoss);
  // Training shares the serving backbone's weight keys.
  EXPECT_EQ(tr.op(*tr.FindOp("f2")).weight_key, LlamaGroupWeightKey(dims, 2));
  EXPECT_EQ(tr.op(*tr.FindOp("b2")).weight_key, LlamaGroupWeightKey(dims, 2));
  // b{g} follows f{g}; the optimizer waits for every group's gradients.
  EXPECT_EQ(tr.op(*tr.FindOp("optimizer")).preds.size(), 5u);
  for (const CandidatePartition& p : tr.partitions()) {
    for (int g = 0; g < 4; ++g) {
      EXPECT_EQ(p.slot_of_op[*tr.FindOp(StrCat("f", g))], p.slot_of_op[*tr.FindOp(StrCat("b", g))])
          << p.name;
    }
    EXPECT_EQ(p.slot_of_op[*tr.FindOp("loss")], p.num_slots - 1) << p.name;
    EXPECT_EQ(p.slot_of_op[*tr.FindOp("optimizer")], p.num_slots - 1) << p.name;
    EXPECT_EQ(p.slot_of_op[*tr.FindOp("embed")], 0) << p.name;
  }

  auto gmg = OneA16();
  GlobalMappingGraph& g = *gmg;
  TemplateId id = *g.RegisterTemplate(*t);
  InstanceId i =
      *g.Instantiate(LlamaTrainStep(id, 2, 64, 16, 10, PriorityClass::kOffline, Timestamp()));
  const Instance* inst = g.FindInstance(i);
  const int b0 = *tr.FindOp("b0");
  // LoRA gradients of 8 layers: rank 16 x (2 x 4096 + 4096 + 1024) f32.
  EXPECT_EQ(inst->nodes[b0].outputs[1].bytes, Bytes(8 * 16 * (2 * 4096 + 4096 + 1024) * 4));
  const int loss = *tr.FindOp("loss");
  EXPECT_EQ(inst->nodes[loss].outputs[1].bytes, Bytes(10 * 4096 * 4));  // head gradient
  EXPECT_EQ(inst->nodes[loss].outputs[0].bytes, Bytes(2 * 64 * 4096 * 2));
  EXPECT_EQ(inst->nodes[loss].outputs[2].bytes, Bytes(4));  // one loss
  // A spatial joint step (T = 2 task slots): B and NC summed over the two
  // jobs, LoRA gradients and losses per slot; the same op kinds.
  InstanceId j = *g.Instantiate(
      LlamaTrainStep(id, 4, 64, 16, 10 + 6, PriorityClass::kOffline, Timestamp(), /*tasks=*/2));
  const Instance* joint = g.FindInstance(j);
  EXPECT_EQ(joint->nodes[b0].outputs[1].bytes, Bytes(2 * 8 * 16 * (2 * 4096 + 4096 + 1024) * 4));
  EXPECT_EQ(joint->nodes[loss].outputs[1].bytes, Bytes(16 * 4096 * 4));
  EXPECT_EQ(joint->nodes[loss].outputs[2].bytes, Bytes(2 * 4));
  EXPECT_EQ(joint->nodes[loss].outputs[0].bytes, Bytes(4 * 64 * 4096 * 2));
}

TEST(LlamaTest, ChunkedPrefillPiecesAttendToTheCacheBeforeThemAndRetainItWhole) {
  auto dims = *LlamaPreset("llama3-8b");
  auto t = BuildLlamaChunkedPrefill(dims, 3);
  ASSERT_TRUE(t.ok()) << t.status();
  const GraphTemplate& c = **t;
  EXPECT_EQ(c.name(), "llama3-8b/prefill_c3");
  EXPECT_EQ(c.num_ops(), 3 * (1 + 4) + 2);
  auto gmg = OneA16();
  GlobalMappingGraph& g = *gmg;
  TemplateId id = *g.RegisterTemplate(*t);
  // 11 tokens: pieces of 4, 4 and 3.
  InstanceSpec s = LlamaChunkedPrefill(id, 3, 11, PriorityClass::kOnline, Timestamp::FromNanos(5));
  EXPECT_THAT(s.bindings, ::testing::ElementsAre(std::pair<std::string, int64_t>{"B", 1},
                                                 std::pair<std::string, int64_t>{"S0", 4},
                                                 std::pair<std::string, int64_t>{"S1", 4},
                                                 std::pair<std::string, int64_t>{"S2", 3}));
  const Instance* inst = g.FindInstance(*g.Instantiate(s));
  auto attr = [&](const std::string& op, const std::string& name) {
    const int k = *c.FindOp(op);
    for (size_t i = 0; i < c.op(k).attrs.size(); ++i) {
      if (c.op(k).attrs[i].first == name) return inst->nodes[k].attrs[i];
    }
    ADD_FAILURE() << op << " has no attribute " << name;
    return int64_t{-1};
  };
  EXPECT_EQ(attr("g2c2", "new_tokens"), 3);
  EXPECT_EQ(attr("g2c2", "context"), 8);
  EXPECT_EQ(attr("embed_c1", "token_offset"), 4);
  EXPECT_EQ(attr("g0", "context"), 0);
  // Pieces before the last hand their cache on; the last retains it whole,
  // one checkpoint per group as the one-piece prefill does.
  const int g1c1 = *c.FindOp("g1c1"), g1c2 = *c.FindOp("g1c2");
  EXPECT_FALSE(inst->nodes[g1c1].outputs[1].retained);
  EXPECT_EQ(inst->nodes[g1c1].outputs[1].bytes, Bytes(8 * 8 * 4096));
  EXPECT_TRUE(inst->nodes[g1c2].outputs[1].retained);
  EXPECT_EQ(inst->nodes[g1c2].outputs[1].bytes, Bytes(8 * 11 * 4096));
  // A group's pieces share its slot in every partition.
  for (const CandidatePartition& p : c.partitions()) {
    for (const std::string group : {"g0", "g3"}) {
      const int slot = p.slot_of_op[*c.FindOp(group)];
      EXPECT_EQ(p.slot_of_op[*c.FindOp(group + "c1")], slot) << p.name;
      EXPECT_EQ(p.slot_of_op[*c.FindOp(group + "c2")], slot) << p.name;
    }
  }
  for (const int bad : {1, kMaxPrefillChunks + 1}) {
    auto r = BuildLlamaChunkedPrefill(dims, bad);
    EXPECT_FALSE(r.ok());
    EXPECT_THAT(r.status().message(), HasSubstr("2 to 8 chunks"));
  }
}

TEST(LlamaTest, ChunkedPrefillLayoutNamesEachPieceAndGroup) {
  auto dims = *LlamaPreset("llama3-8b");
  const std::shared_ptr<const GraphTemplate> chunked = *BuildLlamaChunkedPrefill(dims, 3);
  const GraphTemplate& c = *chunked;
  const ChunkedPrefillLayout l = ChunkedPrefillLayoutOf(c);
  EXPECT_EQ(l.pieces, 3);
  EXPECT_EQ(l.groups, 4);
  EXPECT_EQ(c.op(l.Op(0, 0)).name, "g0");
  EXPECT_EQ(c.op(l.Op(0, 3)).name, "g3");
  EXPECT_EQ(c.op(l.Op(2, 1)).name, "g1c2");
  for (int k = 0; k < 3; ++k) {
    for (int j = 0; j < 4; ++j) {
      EXPECT_EQ(l.piece[static_cast<size_t>(l.Op(k, j))], k);
      EXPECT_EQ(l.group[static_cast<size_t>(l.Op(k, j))], j);
    }
  }
  for (const char* other : {"embed", "embed_c1", "head", "sample"}) {
    EXPECT_EQ(l.piece[static_cast<size_t>(*c.FindOp(other))], -1) << other;
  }
  // Not a chunked prefill: the one-piece prefill and decode templates.
  const LlamaTemplates t = *BuildLlamaTemplates(dims);
  EXPECT_EQ(ChunkedPrefillLayoutOf(*t.prefill).pieces, 0);
  EXPECT_EQ(ChunkedPrefillLayoutOf(*t.decode).pieces, 0);
}

TEST(LlamaTest, FullPrefillThenDecodeOnOneDevice) {
  auto dims = *LlamaPreset("tiny");
  auto t = *BuildLlamaTemplates(dims);
  std::vector<DeviceSpec> devs(1);
  devs[0].name = "cpu0";
  devs[0].type = "cpu";
  devs[0].memory = Bytes::MiB(64);
  GlobalMappingGraph g(*AcceleratorSet::Create(devs, LinkSpec{1e9, Duration::Micros(1)}));
  TemplateId pre = *g.RegisterTemplate(t.prefill);
  TemplateId dec = *g.RegisterTemplate(t.decode);
  for (const OpSpec& op : t.prefill->ops()) {
    if (op.weight_key.empty()) continue;
    ASSERT_TRUE(g.LoadWeights(DeviceId(0), op.weight_key, op.weight_bytes).ok());
  }
  auto run_all = [&](InstanceId id, int64_t t0) {
    const Instance* inst = g.FindInstance(id);
    std::vector<NodeId> nodes;
    for (const OpNode& n : inst->nodes) nodes.push_back(n.id);
    for (NodeId n : nodes) ASSERT_TRUE(g.Issue(n, DeviceId(0), Timestamp::FromNanos(t0)).ok());
    for (NodeId n : nodes) {
      ASSERT_TRUE(g.Start(n, Timestamp::FromNanos(t0 + 1)).ok());
      ASSERT_TRUE(g.Finish(n, Timestamp::FromNanos(t0 + 2)).ok());
    }
  };
  InstanceSpec s;
  s.template_id = pre;
  s.bindings = {{"B", 1}, {"S", 7}};
  run_all(*g.Instantiate(s), 0);
  auto retired = g.TakeRetired();
  ASSERT_EQ(retired.size(), 1u);
  ASSERT_EQ(retired[0].produced.size(), 2u);  // one KV per fused group
  const Bytes kv_per_group(2 * dims.fusion * 7 * dims.kv_heads * dims.head_dim() * 4);
  EXPECT_EQ(g.FindCheckpoint(retired[0].produced[0])->bytes, kv_per_group);
  for (int step = 0; step < 3; ++step) {
    InstanceSpec d;
    d.template_id = dec;
    d.bindings = {{"B", 1}, {"C", 7 + step}};
    d.checkpoints = {{"kv0", retired[0].produced[0]}, {"kv1", retired[0].produced[1]}};
    auto id = g.Instantiate(d);
    ASSERT_TRUE(id.ok()) << id.status();
    run_all(*id, 10 * (step + 1));
  }
  EXPECT_EQ(g.FindCheckpoint(retired[0].produced[0])->bytes,
            Bytes(2 * dims.fusion * 10 * dims.kv_heads * dims.head_dim() * 4));
  EXPECT_EQ(g.memory(DeviceId(0)).activations, Bytes(0));
  EXPECT_TRUE(g.VerifyInvariants().ok());
}

// An offline conversation ages as one request: each of its decode steps
// arrives at the request's admission (the daemon and the replay both use
// this rule); an online step arrives when it is created.
TEST(LlamaTest, OfflineDecodeStepsCarryTheirRequestsAdmission) {
  const Timestamp admitted = Timestamp::FromNanos(1'000'000'000);
  const Timestamp now = Timestamp::FromNanos(40'000'000'000);
  EXPECT_EQ(DecodeStepArrival(PriorityClass::kOffline, admitted, now), admitted);
  EXPECT_EQ(DecodeStepArrival(PriorityClass::kOnline, admitted, now), now);
}

TEST(LlamaTest, RejectsBadDims) {
  LlamaDims d = *LlamaPreset("tiny");
  d.heads = 3;
  EXPECT_THAT(BuildLlamaTemplates(d).status().message(), HasSubstr("not divisible by heads"));
  d = *LlamaPreset("tiny");
  d.fusion = 3;
  EXPECT_THAT(BuildLlamaTemplates(d).status().message(), HasSubstr("not divisible by fusion"));
  d = *LlamaPreset("tiny");
  d.vocab = 0;
  EXPECT_THAT(BuildLlamaTemplates(d).status().message(), HasSubstr("vocab must be positive"));
  EXPECT_EQ(LlamaPreset("gpt5").status().code(), absl::StatusCode::kNotFound);
}

TEST(LlamaTest, ParsesModelConfigWithPositions) {
  auto root = LoadYamlString("model:\n  name: m\n  layers: 4\n  hidden: 64\n  heads: 4\n  ffn: x\n  vocab: 10\n  colour: red\n", "m.yaml");
  ASSERT_TRUE(root.ok());
  ConfigErrors errors;
  ConfigReader r(*root, "m.yaml", &errors);
  LlamaDims d = LlamaDims::FromConfig(r.Child("model"));
  ASSERT_FALSE(errors.ok());
  const std::string msg(errors.ToStatus().message());
  EXPECT_THAT(msg, HasSubstr("m.yaml:6:8: model.ffn"));
  EXPECT_THAT(msg, HasSubstr("colour"));
  (void)d;
}

// family: llama (or absent) only; the error names the value and the field.
TEST(LlamaTest, UnknownFamilyIsRefused) {
  const std::string dims = "  layers: 4\n  hidden: 64\n  heads: 4\n  ffn: 128\n  vocab: 10\n  fusion: 2\n";
  for (const std::string family : {"", "  family: llama\n"}) {
    auto root = LoadYamlString("model:\n  name: m\n" + family + dims, "m.yaml");
    ASSERT_TRUE(root.ok());
    ConfigErrors errors;
    LlamaDims d = LlamaDims::FromConfig(ConfigReader(*root, "m.yaml", &errors).Child("model"));
    EXPECT_TRUE(errors.ok()) << errors.ToStatus();
    EXPECT_EQ(d.layers, 4);
  }
  auto root = LoadYamlString("model:\n  name: m\n  family: mistral\n" + dims, "m.yaml");
  ASSERT_TRUE(root.ok());
  ConfigErrors errors;
  (void)LlamaDims::FromConfig(ConfigReader(*root, "m.yaml", &errors).Child("model"));
  EXPECT_THAT(errors.errors(),
              ::testing::ElementsAre("m.yaml:3:11: model.family: unsupported model family 'mistral' (the only family "
                                     "is llama: a Llama-shaped decoder)"));
}

}  // namespace
}  // namespace slicesched
