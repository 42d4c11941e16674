// The exact minimal inputs the mutation campaign (parser_mutation_test.cc)
// found crashing, overflowing or silently accepted, each with the error the
// fixed parser now gives. See docs/results.md.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "slicesched/common/config.h"
#include "slicesched/jobs/job_spec.h"
#include "slicesched/server/config.h"
#include "slicesched/synth/tasks.h"

namespace slicesched {
namespace {

using ::testing::HasSubstr;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

// A persisted deployment (DeploymentConfig::ToYaml) with an inline model;
// listing partitions makes the parser build the model's templates.
std::string InlineDeployment(const std::string& layers, const std::string& fusion) {
  return "name: d\nmodel:\n  name: d\n  layers: " + layers +
         "\n  hidden: 64\n  heads: 4\n  kv_heads: 2\n  ffn: 176\n  vocab: 256\n  dtype: f32\n  fusion: " + fusion +
         "\nweights: {seed: 1}\nrole: online\npartitions: [single]\n";
}

TEST(InputRegression, HugeLayerCountIsRejectedBeforeBuildingTemplates) {
  // Found by the persisted-deployment sweep: 2^31 layers in fused groups of 2
  // made ParsePartitions build templates of 2^30 operators (the test process
  // was OOM-killed at 23 GB). Only the RPC path had these bounds.
  auto d = DeploymentConfigFromYaml(InlineDeployment("2147483648", "2"), "<state>");
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(Message(d.status()), HasSubstr("<state>:3:3: model: model 'd': layers 2147483648 is too large (at most 4194304)"));
}

TEST(InputRegression, TooManyFusedGroupsIsRejected) {
  // Accepted from a config or the state store, refused over RPC.
  auto d = DeploymentConfigFromYaml(InlineDeployment("4096", "1"), "<state>");
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(Message(d.status()), HasSubstr("4096 fused operators per pass (layers / fusion) is too many"));
}

absl::Status ParseConfig(const std::string& extra) {
  const std::string yaml =
      "cluster:\n"
      "  devices: [{name: v, count: 2, type: testdev, memory: 1GiB, backend: virtual}]\n"
      "  links: {default: {bandwidth: 10GB/s, latency: 5us}}\n"
      "listen: {unix_socket: /tmp/s.sock}\n" +
      extra;
  auto node = LoadYamlString(yaml, "<cfg>");
  if (!node.ok()) return node.status();
  return ParseSlicedConfig(*node, "<cfg>").status();
}

TEST(InputRegression, DurationKnobsBeyondInt64NanosAreRejected) {
  // 1e308 s (or 1e300 ms) passed the "> 0" check and was cast to int64
  // nanoseconds: undefined behaviour, in practice a negative or zero interval.
  absl::Status s = ParseConfig("planner: {checkpoint_interval_s: 1e308}\n");
  EXPECT_THAT(Message(s), HasSubstr("planner.checkpoint_interval_s: must be at most 1e+09 s, got 1e+308"));
  s = ParseConfig("scheduler: {volume_ms: 1e300}\n");
  EXPECT_THAT(Message(s), HasSubstr("scheduler.volume_ms: must be at most 1e+12 ms, got 1e+300"));
  s = ParseConfig("scheduler: {owner_nap_us: 1e300}\n");
  EXPECT_THAT(Message(s), HasSubstr("scheduler.owner_nap_us: must be at most"));
  // A positive value below 1 ns was accepted as a zero interval.
  s = ParseConfig("planner: {interval_s: 1e-300}\n");
  EXPECT_THAT(Message(s), HasSubstr("planner.interval_s: must be at least 1 ns, got 1e-300 s"));
  // The largest accepted value still converts exactly.
  EXPECT_TRUE(ParseConfig("planner: {interval_s: 1e9}\n").ok());
}

// A job with `hyperparameters` (flow map entries) and extra synthetic fields.
std::string Job(const std::string& hyperparameters, const std::string& synthetic_extra = "") {
  return "name: j\nbackbone: tiny\ndataset:\n  synthetic: {task: parity, seed: 7" + synthetic_extra +
         "}\nhyperparameters: {" + hyperparameters + "}\nstop: {metric: accuracy, target: 0.9, max_epochs: 2}\n";
}

TEST(InputRegression, JobSizesAreBounded) {
  // Accepted before: batch_size x grad_accumulation and max_epochs x
  // iterations overflowed int64 in the runner (undefined behaviour), and the
  // synthetic generator was asked for 2^63 examples.
  auto j = jobs::ParseJobSpec(Job("learning_rate: 1e-3, batch_size: 9223372036854775807"));
  ASSERT_FALSE(j.ok());
  EXPECT_THAT(Message(j.status()), HasSubstr("hyperparameters.batch_size: must be at most 65536, got 9223372036854775807"));
  j = jobs::ParseJobSpec(Job("learning_rate: 1e-3, batch_size: 8", ", examples: 9223372036854775807"));
  ASSERT_FALSE(j.ok());
  EXPECT_THAT(Message(j.status()), HasSubstr("dataset.synthetic.examples: must be at most 16777216"));
  j = jobs::ParseJobSpec(Job("learning_rate: 1e308, batch_size: 8"));
  ASSERT_FALSE(j.ok());
  EXPECT_THAT(Message(j.status()), HasSubstr("hyperparameters.learning_rate: must be at most 10, got 1e+308"));
  j = jobs::ParseJobSpec(Job("learning_rate: 1e-3, batch_size: 8, lora_rank: 2147483648"));
  ASSERT_FALSE(j.ok());
  EXPECT_THAT(Message(j.status()), HasSubstr("hyperparameters.lora_rank: must be at most 4096"));
  auto max = jobs::ParseJobSpec(Job("learning_rate: 10, batch_size: 65536, lora_rank: 4096"));
  EXPECT_TRUE(max.ok()) << max.status();
}

TEST(InputRegression, EmptyRequiredJobStringsAreRejected) {
  // Found by the job spec value sweep: `name: ""`, `backbone: ""`,
  // `task: ""` and `metric: ""` were accepted (a job with no name, no
  // backbone, no task; the metric silently accuracy).
  const std::string job = Job("learning_rate: 1e-3, batch_size: 8");
  for (const auto& [from, to, field] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"name: j", "name: \"\"", "name: must not be empty"},
           {"backbone: tiny", "backbone: ''", "backbone: must not be empty"},
           {"task: parity", "task: \"\"", "dataset.synthetic.task: must not be empty"},
           {"metric: accuracy", "metric: ''", "stop.metric: must not be empty"}}) {
    std::string yaml = job;
    yaml.replace(yaml.find(from), from.size(), to);
    auto j = jobs::ParseJobSpec(yaml);
    ASSERT_FALSE(j.ok()) << to;
    EXPECT_THAT(Message(j.status()), HasSubstr(field));
  }
}

TEST(InputRegression, DeepNestingSaysSo) {
  // Found by the value sweep: 2000 nested flow maps gave "<cfg>:1:1995: bad
  // file", yaml-cpp's message for its depth guard.
  std::string deep;
  for (int i = 0; i < 2000; ++i) deep += "{a: ";
  deep += "1" + std::string(2000, '}');
  auto node = LoadYamlString("a: " + deep + "\n", "<cfg>");
  ASSERT_FALSE(node.ok());
  EXPECT_THAT(Message(node.status()), HasSubstr("<cfg>:1:1995: nested too deeply"));
}

TEST(InputRegression, JsonlLabelOutOfInt64RangeIsRejected) {
  // Found by reading the JSONL parser while moving it out of the torch-only
  // job runner for the campaign: a label of 1e308 (or nan) was cast to int64
  // (undefined behaviour).
  synth::Example e;
  absl::Status s = synth::ParseJsonlExample(R"({"tokens": [1, 2], "label": 1e308})", 3, "d.jsonl", &e);
  EXPECT_THAT(Message(s), HasSubstr("d.jsonl:3: \"label\" 1e+308 is out of range"));
  s = synth::ParseJsonlExample(R"({"tokens": [1], "label": nan})", 4, "d.jsonl", &e);
  EXPECT_THAT(Message(s), HasSubstr("d.jsonl:4: \"label\" nan is out of range"));
  ASSERT_TRUE(synth::ParseJsonlExample(R"({"tokens": [1], "label": -3})", 5, "d.jsonl", &e).ok());
  EXPECT_EQ(e.label, -3);
}

}  // namespace
}  // namespace slicesched
