// JobSpec parsing: the example files, defaults, and the error of every field
// (one table row each: the YAML change, the field path and message, and the
// line it must be reported on).
#include "slicesched/jobs/job_spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "slicesched/common/strings.h"

namespace slicesched::jobs {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string SourceDir() {
  const char* dir = std::getenv("SLICESCHED_SOURCE_DIR");
  return dir != nullptr ? dir : ".";
}

constexpr std::string_view kBase =
    "name: j1\n"                                  // 1
    "backbone: tiny\n"                            // 2
    "dataset:\n"                                  // 3
    "  synthetic: {task: parity, seed: 1}\n"      // 4
    "hyperparameters:\n"                          // 5
    "  learning_rate: 0.001\n"                    // 6
    "  batch_size: 8\n"                           // 7
    "stop:\n"                                     // 8
    "  metric: accuracy\n"                        // 9
    "  target: 0.9\n"                             // 10
    "  max_epochs: 2\n";                          // 11

// kBase with `from` replaced by `to` (which must occur once).
std::string Edit(std::string_view from, std::string_view to) {
  std::string s(kBase);
  const size_t at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) s.replace(at, from.size(), to);
  return s;
}

TEST(JobSpecTest, EveryExampleFileParses) {
  const std::filesystem::path dir = std::filesystem::path(SourceDir()) / "configs" / "jobs";
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() == ".yaml") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  ASSERT_GE(files.size(), 3u) << "examples expected in " << dir;
  for (const auto& f : files) {
    auto parsed = LoadJobSpecFile(f.string());
    ASSERT_TRUE(parsed.ok()) << f << ": " << parsed.status();
    EXPECT_EQ(parsed->spec.backbone, "tiny") << f;
    EXPECT_TRUE(parsed->spec.backbone_is_preset) << f;
    EXPECT_EQ(parsed->spec.name + ".yaml", f.filename().string()) << "name the file after the job";
  }
}

TEST(JobSpecTest, ExampleFieldsAreRead) {
  const std::string dir = SourceDir() + "/configs/jobs/";
  auto a = LoadJobSpecFile(dir + "sentiment-tiny.yaml");
  ASSERT_TRUE(a.ok()) << a.status();
  const JobSpec& s = a->spec;
  EXPECT_EQ(s.dataset.kind, DatasetSpec::Kind::kFile);
  EXPECT_EQ(s.dataset.format, DatasetFormat::kJsonl);
  EXPECT_TRUE(std::filesystem::path(s.dataset.path).is_absolute()) << s.dataset.path;
  EXPECT_TRUE(std::filesystem::exists(s.dataset.path));
  EXPECT_DOUBLE_EQ(s.hyperparameters.learning_rate, 2e-4);
  EXPECT_EQ(s.hyperparameters.batch_size, 8);
  EXPECT_EQ(s.hyperparameters.grad_accumulation, 2);
  EXPECT_EQ(s.hyperparameters.seed, 1u);
  EXPECT_EQ(s.stop.metric, StopMetric::kAccuracy);
  EXPECT_DOUBLE_EQ(s.stop.target, 0.85);
  EXPECT_EQ(s.stop.max_epochs, 4);
  EXPECT_EQ(s.stop.max_iterations, 400);
  EXPECT_EQ(s.min_gpus, 1);
  EXPECT_EQ(s.max_gpus, 2);
  EXPECT_EQ(s.tenant, "team-a");
  EXPECT_EQ(s.trust_domain, "lab");
  EXPECT_EQ(s.priority, 10);
  EXPECT_TRUE(a->warnings.empty());

  auto b = LoadJobSpecFile(dir + "copy-pipeline.yaml");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->spec.pipeline_parallel, 2);
  EXPECT_EQ(b->spec.hyperparameters.optimizer, Optimizer::kSgd);
  EXPECT_EQ(b->spec.hyperparameters.momentum, 0.8);
  EXPECT_EQ(b->spec.stop.metric, StopMetric::kLoss);
  EXPECT_EQ(b->spec.dataset.synthetic.task, "copy");
  EXPECT_EQ(b->spec.dataset.synthetic.sequence_length, 64);
  EXPECT_EQ(b->spec.dataset.synthetic.num_classes, 2);  // default

  auto c = LoadJobSpecFile(dir + "private-parity.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->spec.allow_sharing);
  EXPECT_EQ(c->spec.dataset.format, DatasetFormat::kTokensBin);
  EXPECT_EQ(c->spec.trust_domain, "team-c");  // defaults to the tenant
}

TEST(JobSpecTest, AWordNetDatasetNamesAFamilyTaskAndTheInstalledCorpus) {
  // The package's layout: DIR/data.noun (its contents are read by the runner).
  const std::string dir = ::testing::TempDir() + "/job_spec_wordnet";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/data.noun") << "  1 header\n";
  auto p = ParseJobSpec(Edit("  synthetic: {task: parity, seed: 1}",
                             "  wordnet: {task: animal-plant@1, seed: 3, examples: 640, dir: " + dir + "}"));
  ASSERT_TRUE(p.ok()) << p.status();
  const DatasetSpec& ds = p->spec.dataset;
  EXPECT_EQ(ds.kind, DatasetSpec::Kind::kWordNet);
  EXPECT_EQ(ds.wordnet.task, "animal-plant@1");
  EXPECT_EQ(ds.wordnet.seed, 3u);
  EXPECT_EQ(ds.wordnet.examples, 640);
  EXPECT_EQ(ds.wordnet.sequence_length, 16);  // the estimators' default
  EXPECT_EQ(ds.wordnet.dir, dir);
  // The gains table is keyed by the task as written (NAME@K included).
  EXPECT_EQ(DatasetTaskName(ds), "animal-plant@1");
  // A reloaded job (check_dataset_file off) is not refused when the package
  // is gone since.
  JobSpecOptions reload;
  reload.check_dataset_file = false;
  auto r = ParseJobSpec(Edit("  synthetic: {task: parity, seed: 1}", "  wordnet: {task: cross-ap, seed: 1, dir: /gone}"),
                        reload);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(DatasetTaskName(r->spec.dataset), "cross-ap");
}

TEST(JobSpecTest, HeadInitAndWarmUpAreHyperparameters) {
  auto p = ParseJobSpec(Edit("  batch_size: 8", "  batch_size: 8\n  head_init: zero\n  warmup_steps: 4"));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->spec.hyperparameters.head_init, HeadInit::kZero);
  EXPECT_EQ(p->spec.hyperparameters.warmup_steps, 4);
  EXPECT_EQ(HeadInitName(HeadInit::kZero), "zero");
  auto d = ParseJobSpec(kBase);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->spec.hyperparameters.head_init, HeadInit::kRandom);
  EXPECT_EQ(d->spec.hyperparameters.warmup_steps, 0);
  EXPECT_EQ(DatasetTaskName(d->spec.dataset), "parity");
}

TEST(JobSpecTest, DefaultsOfAMinimalJob) {
  auto p = ParseJobSpec(kBase);
  ASSERT_TRUE(p.ok()) << p.status();
  const JobSpec& s = p->spec;
  EXPECT_EQ(s.name, "j1");
  EXPECT_EQ(s.dataset.kind, DatasetSpec::Kind::kSynthetic);
  EXPECT_EQ(s.dataset.synthetic.task, "parity");
  EXPECT_EQ(s.dataset.synthetic.seed, 1u);
  EXPECT_EQ(s.dataset.synthetic.examples, 1024);
  EXPECT_EQ(s.hyperparameters.grad_accumulation, 1);
  EXPECT_EQ(s.hyperparameters.lora_rank, 8);
  EXPECT_DOUBLE_EQ(s.hyperparameters.lora_alpha, 16);
  EXPECT_EQ(s.hyperparameters.optimizer, Optimizer::kAdamW);
  EXPECT_EQ(s.stop.max_iterations, 0);
  EXPECT_TRUE(s.allow_sharing);
  EXPECT_EQ(s.pipeline_parallel, 1);
  EXPECT_EQ(s.min_gpus, 1);
  EXPECT_EQ(s.max_gpus, 1);
  EXPECT_EQ(s.tenant, "default");
  EXPECT_EQ(s.trust_domain, "default");
  EXPECT_EQ(s.priority, 0);
  ASSERT_EQ(p->warnings.size(), 1u);
  EXPECT_THAT(p->warnings[0], HasSubstr("trust_domain is not set"));

  // pipeline_parallel sets the default GPU count.
  auto pp = ParseJobSpec(Edit("backbone: tiny\n", "backbone: tiny\npipeline_parallel: 4\n"));
  ASSERT_TRUE(pp.ok()) << pp.status();
  EXPECT_EQ(pp->spec.min_gpus, 4);
  EXPECT_EQ(pp->spec.max_gpus, 4);
  auto min_only = ParseJobSpec(Edit("backbone: tiny\n", "backbone: tiny\ngpus: {min: 2}\n"));
  ASSERT_TRUE(min_only.ok()) << min_only.status();
  EXPECT_EQ(min_only->spec.min_gpus, 2);
  EXPECT_EQ(min_only->spec.max_gpus, 2);
}

struct BadField {
  std::string from;
  std::string to;
  std::string error;  // "FIELD.PATH: MESSAGE" (a prefix of it)
  int line;           // 1-based line of the report
};

TEST(JobSpecTest, EveryFieldReportsItsError) {
  const std::vector<BadField> cases = {
      {"name: j1", "name: 'bad name!'", "name: a job name must be 1..64 characters of [A-Za-z0-9._-]", 1},
      {"name: j1", "name: [a]", "name: expected a string, got a list", 1},
      {"backbone: tiny", "backbone: gpt9", "backbone: unknown backbone 'gpt9'", 2},
      {"  learning_rate: 0.001", "  learning_rate: 0", "hyperparameters.learning_rate: must be positive, got 0", 6},
      {"  learning_rate: 0.001", "  learning_rate: -1e-3", "hyperparameters.learning_rate: must be positive", 6},
      {"  learning_rate: 0.001", "  learning_rate: fast", "hyperparameters.learning_rate: expected a number", 6},
      {"  batch_size: 8", "  batch_size: 0", "hyperparameters.batch_size: must be at least 1, got 0", 7},
      {"  batch_size: 8", "  batch_size: 8\n  grad_accumulation: 0",
       "hyperparameters.grad_accumulation: must be at least 1, got 0", 8},
      {"  batch_size: 8", "  batch_size: 8\n  lora_rank: 0", "hyperparameters.lora_rank: must be at least 1, got 0", 8},
      {"  batch_size: 8", "  batch_size: 8\n  lora_alpha: 0", "hyperparameters.lora_alpha: must be positive, got 0",
       8},
      {"  batch_size: 8", "  batch_size: 8\n  optimizer: adam", "hyperparameters.optimizer: must be adamw or sgd", 8},
      {"  batch_size: 8", "  batch_size: 8\n  seed: -2", "hyperparameters.seed: must not be negative, got -2", 8},
      {"  batch_size: 8", "  batch_size: 8\n  nesterov: true", "hyperparameters: unknown field 'nesterov'", 8},
      {"  batch_size: 8", "  batch_size: 8\n  momentum: 0.9",
       "hyperparameters.momentum: only applies to optimizer sgd", 8},
      {"  batch_size: 8", "  batch_size: 8\n  optimizer: sgd\n  momentum: 1",
       "hyperparameters.momentum: must be in [0, 1), got 1", 9},
      {"  batch_size: 8", "  batch_size: 8\n  optimizer: sgd\n  momentum: -0.5",
       "hyperparameters.momentum: must be in [0, 1), got -0.5", 9},
      {"  metric: accuracy", "  metric: f1", "stop.metric: must be accuracy, loss or perplexity, got 'f1'", 9},
      {"  target: 0.9", "  target: 1.5", "stop.target: an accuracy target must be in (0, 1], got 1.5", 10},
      {"  metric: accuracy\n  target: 0.9", "  metric: loss\n  target: -1", "stop.target: a loss target must not", 10},
      {"  metric: accuracy\n  target: 0.9", "  metric: perplexity\n  target: 0.5",
       "stop.target: a perplexity target must be at least 1", 10},
      {"  max_epochs: 2", "  max_epochs: 0", "stop.max_epochs: must be at least 1, got 0", 11},
      {"  max_epochs: 2", "  max_epochs: 2\n  max_iterations: 0", "stop.max_iterations: must be at least 1, got 0",
       12},
      {"  max_epochs: 2", "  max_epochs: 2\nallow_sharing: maybe", "allow_sharing: expected true or false", 12},
      {"  max_epochs: 2", "  max_epochs: 2\npipeline_parallel: 3", "pipeline_parallel: must be 1, 2, 4 or 8, got 3",
       12},
      {"  max_epochs: 2", "  max_epochs: 2\ngpus: {min: 0, max: 2}", "gpus.min: must be in 1..4096, got 0", 12},
      {"  max_epochs: 2", "  max_epochs: 2\ngpus: {min: 4, max: 2}", "gpus.max: must be at least gpus.min (4), got 2",
       12},
      {"  max_epochs: 2", "  max_epochs: 2\ngpus: {min: 2, max: 4, count: 3}", "gpus: unknown field 'count'", 12},
      {"  max_epochs: 2", "  max_epochs: 2\npipeline_parallel: 2\ngpus: {min: 3, max: 4}",
       "gpus.min: must be a multiple of pipeline_parallel (2), got 3", 13},
      {"  max_epochs: 2", "  max_epochs: 2\ntenant: 'a b'", "tenant: a tenant must be 1..64 characters", 12},
      {"  max_epochs: 2", "  max_epochs: 2\ntrust_domain: x/y", "trust_domain: a trust domain must be", 12},
      {"  max_epochs: 2", "  max_epochs: 2\npriority: 101", "priority: must be in 0..100, got 101", 12},
      {"  max_epochs: 2", "  max_epochs: 2\ncolour: red", "unknown field 'colour'", 12},
      {"  synthetic: {task: parity, seed: 1}", "  synthetic: {task: Parity!, seed: 1}",
       "dataset.synthetic.task: must be a name of [a-z0-9_-], got 'Parity!'", 4},
      {"  synthetic: {task: parity, seed: 1}", "  synthetic: {task: sst2, seed: 1}",
       "dataset.synthetic.task: unknown synthetic task 'sst2' (known: fa-major,", 4},
      {"  synthetic: {task: parity, seed: 1}", "  synthetic: {task: parity}",
       "dataset.synthetic: missing required field 'seed'", 4},
      {"  synthetic: {task: parity, seed: 1}", "  synthetic: {task: parity, seed: -1}",
       "dataset.synthetic.seed: must not be negative", 4},
      {"  synthetic: {task: parity, seed: 1}", "  synthetic: {task: parity, seed: 1, examples: 0}",
       "dataset.synthetic.examples: must be at least 1, got 0", 4},
      {"  synthetic: {task: parity, seed: 1}", "  synthetic: {task: parity, seed: 1, sequence_length: -4}",
       "dataset.synthetic.sequence_length: must be at least 1", 4},
      {"  synthetic: {task: parity, seed: 1}", "  synthetic: {task: parity, seed: 1, num_classes: 1}",
       "dataset.synthetic.num_classes: must be at least 2, got 1", 4},
      {"  synthetic: {task: parity, seed: 1}", "  synthetic: {task: parity, seed: 1, noise: 0.1}",
       "dataset.synthetic: unknown field 'noise'", 4},
      {"  synthetic: {task: parity, seed: 1}", "  synthetic: parity", "dataset.synthetic: expected a map", 4},
      {"  synthetic: {task: parity, seed: 1}", "  synthetic: {task: parity, seed: 1}\n  path: /x.jsonl",
       "dataset: set exactly one of 'path' (a token file), 'synthetic' (the built-in generator) or 'wordnet'", 4},
      {"  synthetic: {task: parity, seed: 1}", "  format: jsonl", "dataset: set exactly one of", 4},
      {"  synthetic: {task: parity, seed: 1}", "  synthetic: {task: parity, seed: 1}\n  format: jsonl",
       "dataset.format: only applies to dataset.path", 5},
      {"  synthetic: {task: parity, seed: 1}", "  path: data/train.jsonl",
       "dataset.path: must be an absolute path (a submitted job has no directory", 4},
      {"  synthetic: {task: parity, seed: 1}", "  path: /nonexistent/slicesched/train.jsonl",
       "dataset.path: '/nonexistent/slicesched/train.jsonl' does not exist", 4},
      {"  synthetic: {task: parity, seed: 1}", "  path: /etc/hostname",
       "dataset.path: cannot tell the format of '/etc/hostname' from its suffix", 4},
      {"  synthetic: {task: parity, seed: 1}", "  path: /tmp\n  format: jsonl",
       "dataset.path: '/tmp' is a directory; dataset.path must name one file: a JSONL file (.jsonl", 4},
      // A directory is named as one whatever its suffix; no second error
      // about the format.
      {"  synthetic: {task: parity, seed: 1}", "  path: /tmp",
       "dataset.path: '/tmp' is a directory; dataset.path must name one file: a JSONL file (.jsonl, one "
       "{\"tokens\": [...], \"label\": N} per line) or a tokens-bin file (.bin, starting with \"SSTOKV1\\n\")", 4},
      {"  synthetic: {task: parity, seed: 1}", "  path: /dev/null\n  format: jsonl",
       "dataset.path: '/dev/null' is not a regular file (a device, socket or pipe); expected a JSONL file", 4},
      {"  max_epochs: 2", "  max_epochs: 2\nallow_sharing: 'yes'",
       "allow_sharing: expected true or false, got the string 'yes' (a quoted word is not a boolean", 12},
      {"  max_epochs: 2", "  max_epochs: 2\nallow_sharing: 1", "allow_sharing: expected true or false, got '1'", 12},
      // Numbers follow the booleans' rule: a quoted one is a string.
      {"  batch_size: 8", "  batch_size: \"16\"",
       "hyperparameters.batch_size: expected an integer, got the string '16' (a quoted number is not a number; "
       "write it without quotes)", 7},
      {"  learning_rate: 0.001", "  learning_rate: '0.001'",
       "hyperparameters.learning_rate: expected a number, got the string '0.001' (a quoted number is not a number; "
       "write it without quotes)", 6},
      {"  synthetic: {task: parity, seed: 1}", "  path: /etc/hostname\n  format: csv",
       "dataset.format: must be jsonl or tokens-bin, got 'csv'", 5},
      {"dataset:\n  synthetic: {task: parity, seed: 1}\n", "dataset: 3\n", "dataset: expected a map", 3},
      {"  synthetic: {task: parity, seed: 1}", "  wordnet: {task: animal-plant, seed: 1}\n  synthetic: {task: parity, seed: 1}",
       "dataset: set exactly one of", 4},
      {"  synthetic: {task: parity, seed: 1}", "  wordnet: {task: animal-vegetable, seed: 1}",
       "dataset.wordnet.task: unknown WordNet task 'animal-vegetable'; known: animal-plant,", 4},
      {"  synthetic: {task: parity, seed: 1}", "  wordnet: {task: animal-plant}",
       "dataset.wordnet: missing required field 'seed'", 4},
      {"  synthetic: {task: parity, seed: 1}", "  wordnet: {task: animal-plant, seed: 1, examples: 1}",
       "dataset.wordnet.examples: must be at least 2, got 1", 4},
      {"  synthetic: {task: parity, seed: 1}", "  wordnet: {task: animal-plant, seed: 1, dir: wordnet}",
       "dataset.wordnet.dir: must be an absolute path, got 'wordnet'", 4},
      {"  synthetic: {task: parity, seed: 1}", "  wordnet: {task: animal-plant, seed: 1, dir: /nonexistent/wn}",
       "dataset.wordnet.dir: '/nonexistent/wn/data.noun' does not exist (WordNet 3.0: apt-get install wordnet-base)",
       4},
      {"  synthetic: {task: parity, seed: 1}", "  wordnet: {task: animal-plant, seed: 1, classes: 3}",
       "dataset.wordnet: unknown field 'classes'", 4},
      {"  batch_size: 8", "  batch_size: 8\n  head_init: ones", "hyperparameters.head_init: must be random or zero, got 'ones'",
       8},
      {"  batch_size: 8", "  batch_size: 8\n  warmup_steps: -1", "hyperparameters.warmup_steps: must be at least 0, got -1",
       8},
      {"  target: 0.9\n", "",
       "stop: missing required field 'target'", 9},
  };
  for (const BadField& c : cases) {
    const std::string yaml = Edit(c.from, c.to);
    auto p = ParseJobSpec(yaml);
    ASSERT_FALSE(p.ok()) << "accepted:\n" << yaml;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string msg(p.status().message());
    EXPECT_THAT(msg, HasSubstr(StrCat("<job>:", c.line, ":"))) << yaml;
    EXPECT_THAT(msg, HasSubstr(c.error)) << yaml;
    // One problem, one error: range checks do not repeat a conversion error.
    EXPECT_THAT(msg, HasSubstr("1 configuration error:")) << yaml;
  }
}

TEST(JobSpecTest, ExactPositionAndEveryErrorAtOnce) {
  const std::string yaml =
      "name: j1\n"
      "backbone: tiny\n"
      "dataset: {synthetic: {task: parity, seed: 1}}\n"
      "hyperparameters: {learning_rate: 0, batch_size: 0, optimizer: rmsprop}\n"
      "stop: {metric: accuracy, target: 2, max_epochs: 0}\n"
      "pipeline_parallel: 5\n";
  auto p = ParseJobSpec(yaml);
  ASSERT_FALSE(p.ok());
  const std::string msg(p.status().message());
  EXPECT_THAT(msg, HasSubstr("6 configuration errors:")) << msg;
  EXPECT_THAT(msg, HasSubstr("<job>:4:34: hyperparameters.learning_rate: must be positive, got 0"));
  EXPECT_THAT(msg, HasSubstr("<job>:4:49: hyperparameters.batch_size: must be at least 1, got 0"));
  EXPECT_THAT(msg, HasSubstr("<job>:4:63: hyperparameters.optimizer: must be adamw or sgd, got 'rmsprop'"));
  EXPECT_THAT(msg, HasSubstr("<job>:5:34: stop.target: an accuracy target must be in (0, 1], got 2"));
  EXPECT_THAT(msg, HasSubstr("<job>:5:49: stop.max_epochs: must be at least 1, got 0"));
  EXPECT_THAT(msg, HasSubstr("<job>:6:20: pipeline_parallel: must be 1, 2, 4 or 8, got 5"));
}

TEST(JobSpecTest, MissingSectionsAreAllReported) {
  auto p = ParseJobSpec("priority: 3\n");
  ASSERT_FALSE(p.ok());
  const std::string msg(p.status().message());
  for (const char* field : {"'name'", "'backbone'", "'dataset'", "'hyperparameters'", "'stop'"}) {
    EXPECT_THAT(msg, HasSubstr(StrCat("missing required field ", field))) << msg;
  }
  EXPECT_THAT(ParseJobSpec("").status().message(), HasSubstr("the job description is empty"));
  EXPECT_THAT(ParseJobSpec("- a\n- b\n").status().message(), HasSubstr("expected a map"));
  EXPECT_THAT(ParseJobSpec("name: [\n").status().message(), HasSubstr("<job>:"));  // YAML syntax error
}

TEST(JobSpecTest, TenantOfTheSubmitter) {
  JobSpecOptions o;
  o.tenant = "team-a";
  auto same = ParseJobSpec(Edit("name: j1", "name: j1\ntenant: team-a"), o);
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ(same->spec.tenant, "team-a");
  auto implied = ParseJobSpec(kBase, o);
  ASSERT_TRUE(implied.ok()) << implied.status();
  EXPECT_EQ(implied->spec.tenant, "team-a");
  EXPECT_EQ(implied->spec.trust_domain, "team-a");
  auto other = ParseJobSpec(Edit("name: j1", "name: j1\ntenant: team-b"), o);
  ASSERT_FALSE(other.ok());
  EXPECT_THAT(other.status().message(),
              HasSubstr("<job>:2:9: tenant: is 'team-b' but the job is submitted for tenant 'team-a'"));
}

TEST(JobSpecTest, DeploymentBackbones) {
  const std::string yaml = Edit("backbone: tiny", "backbone: chat-8b");
  EXPECT_FALSE(ParseJobSpec(yaml).ok());  // no deployments known
  JobSpecOptions o;
  o.is_deployment = [](std::string_view name) { return name == "chat-8b"; };
  auto p = ParseJobSpec(yaml, o);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->spec.backbone_is_preset);
  // Reloading an accepted job does not ask again.
  JobSpecOptions reload;
  reload.check_backbone = false;
  EXPECT_TRUE(ParseJobSpec(yaml, reload).ok());
  for (const char* preset : {"tiny", "small", "gloss", "llama3-8b"}) {
    auto q = ParseJobSpec(Edit("backbone: tiny", StrCat("backbone: ", preset)));
    ASSERT_TRUE(q.ok()) << preset << ": " << q.status();
    EXPECT_TRUE(q->spec.backbone_is_preset);
  }
}

TEST(JobSpecTest, DatasetFiles) {
  const std::string dir = ::testing::TempDir() + "/job_spec_test_data";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  {
    std::ofstream(dir + "/good.bin", std::ios::binary) << std::string("SSTOKV1\n", 8) << std::string(8, '\0');
    std::ofstream(dir + "/bad.bin", std::ios::binary) << "PK\x03\x04 not tokens";
    std::ofstream(dir + "/train.jsonl") << "{\"tokens\": [1, 2, 3], \"label\": 1}\n";
    std::ofstream(dir + "/tokens.dat", std::ios::binary) << std::string("SSTOKV1\n", 8);
  }
  auto with_path = [&](const std::string& path, const std::string& extra = "") {
    return ParseJobSpec(Edit("  synthetic: {task: parity, seed: 1}", StrCat("  path: ", path, extra)));
  };
  auto good = with_path(dir + "/good.bin");
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(good->spec.dataset.format, DatasetFormat::kTokensBin);
  auto jsonl = with_path(dir + "/train.jsonl");
  ASSERT_TRUE(jsonl.ok()) << jsonl.status();
  EXPECT_EQ(jsonl->spec.dataset.format, DatasetFormat::kJsonl);
  auto explicit_format = with_path(dir + "/tokens.dat", "\n  format: tokens-bin");
  ASSERT_TRUE(explicit_format.ok()) << explicit_format.status();
  auto bad = with_path(dir + "/bad.bin");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("dataset.path: '" + dir + "/bad.bin' is not a tokens-bin file"));

  // Relative paths resolve against the job file's directory.
  std::ofstream(dir + "/job.yaml") << Edit("  synthetic: {task: parity, seed: 1}", "  path: train.jsonl");
  auto file = LoadJobSpecFile(dir + "/job.yaml");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->spec.dataset.path, std::filesystem::path(dir + "/train.jsonl").lexically_normal().string());
  auto missing = LoadJobSpecFile(dir + "/nope.yaml");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  // Error positions name the file.
  std::ofstream(dir + "/bad.yaml") << Edit("  batch_size: 8", "  batch_size: -8");
  auto bad_file = LoadJobSpecFile(dir + "/bad.yaml");
  ASSERT_FALSE(bad_file.ok());
  EXPECT_THAT(bad_file.status().message(), HasSubstr(dir + "/bad.yaml:7:15: hyperparameters.batch_size"));
  EXPECT_THAT(bad_file.status().message(), Not(HasSubstr("<job>")));
}

}  // namespace
}  // namespace slicesched::jobs
