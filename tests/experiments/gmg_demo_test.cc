#include "slicesched/experiments/gmg_demo.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace slicesched {
namespace {

using ::testing::HasSubstr;

TEST(GmgDemoTest, EmbeddedDefaultRuns) {
  auto c = DefaultGmgDemoConfig();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->cluster.size(), 8u);
  EXPECT_EQ(c->model.name, "llama3-8b");
  auto report = RunGmgDemo(*c);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_THAT(*report, HasSubstr("1.745 G per fused operator of 8 layers"));
  EXPECT_THAT(*report, HasSubstr("KV cache: 4096 bytes per token per layer"));
  EXPECT_THAT(*report, HasSubstr("invariants: frontiers and memory equal"));
}

TEST(GmgDemoTest, InlineModelAndErrors) {
  auto root = LoadYamlString(R"(cluster:
  devices: [{name: cpu, count: 2, type: cpu, memory: 1GiB, backend: cpu}]
model: {name: t, layers: 2, hidden: 8, heads: 2, ffn: 16, vocab: 32, dtype: f32, fusion: 1}
demo: {prefill_tokens: 5, decode_steps: 2, partition: pp2, devices: [cpu0, cpu1]}
)", "x.yaml");
  ASSERT_TRUE(root.ok());
  auto c = ParseGmgDemoConfig(*root, "x.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  auto report = RunGmgDemo(*c);
  ASSERT_TRUE(report.ok()) << report.status();

  auto bad = LoadYamlString("cluster:\n  devices: []\nmodel: gpt5\ndemo: {prefill_tokens: -1}\n", "bad.yaml");
  ASSERT_TRUE(bad.ok());
  auto e = ParseGmgDemoConfig(*bad, "bad.yaml");
  ASSERT_FALSE(e.ok());
  const std::string msg(e.status().message());
  EXPECT_THAT(msg, HasSubstr("bad.yaml:2:"));
  EXPECT_THAT(msg, HasSubstr("no model preset named 'gpt5'"));
  EXPECT_THAT(msg, HasSubstr("demo.prefill_tokens"));
  EXPECT_FALSE(LoadGmgDemoConfig("/nonexistent.yaml").ok());
}

}  // namespace
}  // namespace slicesched
