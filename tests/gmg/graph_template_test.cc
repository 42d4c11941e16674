#include "slicesched/gmg/graph_template.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace slicesched {
namespace {

using ::testing::HasSubstr;

TemplateBuilder Chain() {
  TemplateBuilder b("chain");
  b.Define("H", 16)
      .ExternalInput("tokens", DType::kI64, {"B", "S"})
      .Op("embed", OpKind::kEmbedding)
      .Inputs({"$tokens"})
      .Output("hidden", DType::kF32, {"B", "S", "H"})
      .Weights("w/embed", Bytes(100))
      .Op("layers", OpKind::kFusedLayers)
      .Inputs({"embed"})
      .Output("hidden", DType::kF32, {"B", "S", "H"})
      .RetainedOutput("kv", DType::kF32, {"2", "B", "S", "H"})
      .Workspace("B*S*H*4")
      .Attr("tokens", "B*S")
      .Op("head", OpKind::kLmHead)
      .Inputs({"layers:hidden"})
      .Output("logits", DType::kF32, {"B", "32"});
  return b;
}

TEST(GraphTemplateTest, BuildsAndResolvesInputs) {
  auto tpl = Chain().Partition("single", {{"embed", 0}, {"layers", 0}, {"head", 0}})
                 .Partition("split", {{"embed", 0}, {"layers", 1}, {"head", 1}})
                 .Build();
  ASSERT_TRUE(tpl.ok()) << tpl.status();
  const GraphTemplate& t = **tpl;
  EXPECT_EQ(t.num_ops(), 3);
  EXPECT_THAT(t.topo_order(), ::testing::ElementsAre(0, 1, 2));
  EXPECT_THAT(t.op(1).preds, ::testing::ElementsAre(0));
  EXPECT_THAT(t.op(1).succs, ::testing::ElementsAre(2));
  EXPECT_EQ(t.op(0).inputs[0].kind, InputRef::Kind::kExternal);
  EXPECT_EQ(t.op(2).inputs[0].output, 0);
  EXPECT_EQ(t.NumConsumers(1, 0), 1);
  EXPECT_EQ(t.NumConsumers(1, 1), 0);
  EXPECT_THAT(t.FreeSymbols(), ::testing::UnorderedElementsAre("B", "S"));
  ASSERT_EQ(t.partitions().size(), 2u);
  EXPECT_EQ(t.partitions()[1].num_slots, 2);
  EXPECT_THAT(t.partitions()[1].slot_of_op, ::testing::ElementsAre(0, 1, 1));
  EXPECT_EQ(t.TotalWeightBytes(), Bytes(100));
}

TEST(GraphTemplateTest, RejectsDuplicateOpName) {
  TemplateBuilder b("dup");
  b.Op("a", OpKind::kGeneric).Output("x", DType::kF32, {"1"});
  b.Op("a", OpKind::kGeneric).Output("x", DType::kF32, {"1"});
  auto t = b.Build();
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t.status().message(), HasSubstr("duplicate op name 'a'"));
}

TEST(GraphTemplateTest, RejectsDanglingInput) {
  TemplateBuilder b("dangling");
  b.Op("a", OpKind::kGeneric).Inputs({"nowhere"}).Output("x", DType::kF32, {"1"});
  auto t = b.Build();
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t.status().message(), HasSubstr("op 'a': input 'nowhere' names no op"));
}

TEST(GraphTemplateTest, RejectsUnknownOutputName) {
  TemplateBuilder b("badout");
  b.Op("a", OpKind::kGeneric).Output("x", DType::kF32, {"1"});
  b.Op("b", OpKind::kGeneric).Inputs({"a:y"}).Output("x", DType::kF32, {"1"});
  auto t = b.Build();
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t.status().message(), HasSubstr("op 'a' has no output 'y'"));
}

TEST(GraphTemplateTest, RejectsCycleNamingItsOps) {
  TemplateBuilder b("cyclic");
  b.Op("a", OpKind::kGeneric).Inputs({"c"}).Output("x", DType::kF32, {"1"});
  b.Op("b", OpKind::kGeneric).Inputs({"a"}).Output("x", DType::kF32, {"1"});
  b.Op("c", OpKind::kGeneric).Inputs({"b"}).Output("x", DType::kF32, {"1"});
  auto t = b.Build();
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t.status().message(), HasSubstr("cycle through ops"));
  EXPECT_THAT(t.status().message(), HasSubstr("a"));
  EXPECT_THAT(t.status().message(), HasSubstr("c"));
}

TEST(GraphTemplateTest, RejectsTypeErrors) {
  TemplateBuilder b("types");
  b.ExternalInput("x", DType::kF32, {"4"});
  b.Op("embed", OpKind::kEmbedding).Inputs({"$x"}).Output("h", DType::kF32, {"4"});
  auto t = b.Build();
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t.status().message(), HasSubstr("op 'embed' (embedding): input 0 '$x' is f32, expected an integer tensor"));

  TemplateBuilder c("types2");
  c.ExternalInput("ids", DType::kI64, {"4"});
  c.Op("layers", OpKind::kFusedLayers).Inputs({"$ids"}).Output("h", DType::kF32, {"4"});
  auto u = c.Build();
  ASSERT_FALSE(u.ok());
  EXPECT_THAT(u.status().message(), HasSubstr("op 'layers' (fused_layers)"));
  EXPECT_THAT(u.status().message(), HasSubstr("expected a floating-point tensor"));
}

TEST(GraphTemplateTest, RejectsWrongArity) {
  TemplateBuilder b("arity");
  b.ExternalInput("a", DType::kF32, {"4"});
  b.Op("mm", OpKind::kMatmul).Inputs({"$a"}).Output("y", DType::kF32, {"4"});
  auto t = b.Build();
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t.status().message(), HasSubstr("op 'mm' (matmul) takes 2 inputs, got 1"));
}

TEST(GraphTemplateTest, RejectsBadShapeExpressionNamingTheOp) {
  TemplateBuilder b("shape");
  b.Op("a", OpKind::kGeneric).Output("x", DType::kF32, {"B*(S"});
  auto t = b.Build();
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t.status().message(), HasSubstr("op 'a' output 'x'"));
}

TEST(GraphTemplateTest, ValidatesPartitions) {
  auto missing = Chain().Partition("p", {{"embed", 0}, {"layers", 0}}).Build();
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("partition 'p' does not map op 'head'"));

  auto unknown = Chain().Partition("p", {{"embed", 0}, {"layers", 0}, {"head", 0}, {"zz", 0}}).Build();
  ASSERT_FALSE(unknown.ok());
  EXPECT_THAT(unknown.status().message(), HasSubstr("maps unknown op 'zz'"));

  auto gap = Chain().Partition("p", {{"embed", 0}, {"layers", 2}, {"head", 2}}).Build();
  ASSERT_FALSE(gap.ok());
  EXPECT_THAT(gap.status().message(), HasSubstr("leaves slot 1 empty"));

  auto twice = Chain()
                   .Partition("p", {{"embed", 0}, {"layers", 0}, {"head", 0}})
                   .Partition("p", {{"embed", 0}, {"layers", 0}, {"head", 0}})
                   .Build();
  ASSERT_FALSE(twice.ok());
  EXPECT_THAT(twice.status().message(), HasSubstr("duplicate partition 'p'"));
}

TEST(GraphTemplateTest, CheckpointRules) {
  TemplateBuilder b("ckpt");
  b.CheckpointInput("kv", DType::kBF16, {"C"});
  b.Op("a", OpKind::kGeneric).Inputs({"@kv"}).UpdateOutput("kv", "kv", {"C+1"});
  auto ok = b.Build();
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ((*ok)->op(0).checkpoint_update_of, 0);

  TemplateBuilder c("ckpt2");
  c.CheckpointInput("kv", DType::kBF16, {"C"});
  c.Op("a", OpKind::kGeneric).UpdateOutput("kv", "kv", {"C+1"});
  auto bad = c.Build();
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("updates checkpoint '@kv' but does not read it"));

  TemplateBuilder d("ckpt3");
  d.Op("a", OpKind::kGeneric).RetainedOutput("kv", DType::kF32, {"4"});
  d.Op("b", OpKind::kGeneric).Inputs({"a:kv"}).Output("y", DType::kF32, {"4"});
  auto consumed = d.Build();
  ASSERT_FALSE(consumed.ok());
  EXPECT_THAT(consumed.status().message(), HasSubstr("is a checkpoint and may not be consumed"));
}

TEST(TemplateRegistryTest, RegistersOnceByName) {
  TemplateRegistry reg;
  auto t = Chain().Build();
  ASSERT_TRUE(t.ok());
  auto id = reg.Register(*t);
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(reg.Find(*id)->name(), "chain");
  EXPECT_EQ(reg.Find(*id)->id(), *id);
  auto again = reg.Register(*t);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(*reg.FindByName("chain"), *id);
  EXPECT_FALSE(reg.FindByName("nope").ok());
}

}  // namespace
}  // namespace slicesched
