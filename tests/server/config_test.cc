// sliced configuration: the embedded default parses, and every kind of bad
// config is reported with the field path and its line:col.
#include "slicesched/server/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "docs/docs_text.h"
#include "slicesched/common/strings.h"

namespace slicesched {
namespace {

using ::testing::HasSubstr;

constexpr char kSource[] = "test.yaml";

// A valid config; tests edit copies of it.
constexpr char kBase[] = R"(cluster:
  devices:
    - {name: cpu, count: 2, type: cpu, memory: 1GiB, backend: cpu}
state_dir: /tmp/sliced-test
deployments:
  - name: a
    model: tiny
    weights: {seed: 7}
    role: online
)";

absl::StatusOr<SlicedConfig> Parse(const std::string& text) {
  auto root = LoadYamlString(text, kSource);
  if (!root.ok()) return root.status();
  return ParseSlicedConfig(*root, kSource);
}

std::string ErrorOf(const std::string& text) {
  auto c = Parse(text);
  EXPECT_FALSE(c.ok()) << "config unexpectedly valid:\n" << text;
  return c.ok() ? "" : std::string(c.status().message());
}

TEST(SlicedConfigTest, EmbeddedDefaultParses) {
  auto c = DefaultSlicedConfig();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->cluster.size(), 4u);
  for (const DeviceSpec& d : c->cluster.devices()) {
    EXPECT_EQ(d.backend, DeviceBackend::kCpu);
    EXPECT_EQ(d.memory, Bytes::GiB(2));
  }
  ASSERT_EQ(c->deployments.size(), 2u);
  EXPECT_EQ(c->deployments[0].model.name, "tiny");
  EXPECT_EQ(c->deployments[0].model_preset, "tiny");
  EXPECT_EQ(c->deployments[0].role, DeploymentRole::kOnline);
  EXPECT_EQ(c->deployments[0].weights.kind, WeightsConfig::Kind::kSeed);
  EXPECT_EQ(c->deployments[1].role, DeploymentRole::kOffline);
  EXPECT_NE(c->FindDeployment("tiny-offline"), nullptr);
  EXPECT_EQ(c->FindDeployment("nope"), nullptr);
  EXPECT_THAT(c->listen.unix_socket, ::testing::StartsWith("/tmp/"));
  EXPECT_TRUE(c->listen.tcp_address.empty());
  EXPECT_THAT(c->state_dir, ::testing::StartsWith("/tmp/"));
  EXPECT_EQ(c->scheduler.volume, Duration::Millis(50));
  EXPECT_TRUE(c->scheduler.pipeline_online_prefill);
  EXPECT_EQ(c->scheduler.offline_aging, Duration::Seconds(30));
  EXPECT_EQ(c->scheduler.owner_nap, Duration::Micros(100));
  EXPECT_EQ(c->log_level, "info");
}

TEST(SlicedConfigTest, DefaultsApplyWhenSectionsAreMissing) {
  auto c = Parse(kBase);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->listen.unix_socket, "/run/sliced/sliced.sock");
  EXPECT_EQ(c->scheduler.offline_queue_limit, 1);
  EXPECT_EQ(c->scheduler.timeliness, 0.1);
  EXPECT_FALSE(c->scheduler.owner_nap.has_value());  // the executors' default
  EXPECT_TRUE(c->deployments[0].partitions.empty());
  EXPECT_EQ(c->deployments[0].weights.seed, 7u);
}

// sliced's --socket / --state-dir follow the config's rules and name the
// flag; a relative --socket used to reach bind() and fail as "cannot create :
// Invalid argument".
TEST(SlicedConfigTest, CommandLineOverridesAreCheckedLikeTheConfig) {
  auto c = Parse(kBase);
  ASSERT_TRUE(c.ok()) << c.status();
  const SlicedConfig before = *c;
  absl::Status s = ApplySlicedOverrides({.unix_socket = "rel.sock"}, &*c);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("--socket: must be an absolute path, got 'rel.sock'"));
  s = ApplySlicedOverrides({.unix_socket = "/" + std::string(120, 'x')}, &*c);
  EXPECT_THAT(s.message(), HasSubstr("--socket: is 121 bytes; a socket path holds at most 107"));
  s = ApplySlicedOverrides({.unix_socket = "/tmp/ok.sock", .state_dir = "state"}, &*c);
  EXPECT_THAT(s.message(), HasSubstr("--state-dir: must be an absolute path, got 'state'"));
  EXPECT_EQ(c->listen.unix_socket, before.listen.unix_socket);  // unchanged on error
  EXPECT_EQ(c->state_dir, before.state_dir);

  ASSERT_TRUE(ApplySlicedOverrides({.unix_socket = "/tmp/x/s.sock", .state_dir = "/tmp/x/state"}, &*c).ok());
  EXPECT_EQ(c->listen.unix_socket, "/tmp/x/s.sock");
  EXPECT_EQ(c->state_dir, "/tmp/x/state");
  ASSERT_TRUE(ApplySlicedOverrides({}, &*c).ok());  // empty: keep the config's
  EXPECT_EQ(c->listen.unix_socket, "/tmp/x/s.sock");
}

TEST(SlicedConfigTest, FullConfigWithTlsAndInlineModel) {
  const std::string text = std::string(kBase) + R"(  - name: b
    model: {name: mini, layers: 2, hidden: 32, heads: 2, ffn: 64, vocab: 100, dtype: f32, fusion: 1}
    weights: {safetensors: /models/mini.safetensors}
    role: offline
    partitions: [single, pp2]
scheduler: {volume_ms: 20, offline_queue_limit: 2, offline_aging_s: 5.5, timeliness: 0.2, owner_nap_us: 250,
            online_new_device_cost_ms: 25, online_stream_device_cost_ms: 0, stream_idle_after_s: 0.5,
            offline_avoids_online_streams: false, pipeline_online_prefill: false}
listen:
  unix_socket: ""
  tcp: "[::]:50051"
  tls: {cert: /etc/sliced/c.pem, key: /etc/sliced/k.pem}
  admin_token: s3cret
log_level: DEBUG
)";
  auto c = Parse(text);
  ASSERT_TRUE(c.ok()) << c.status();
  const DeploymentConfig& b = c->deployments[1];
  EXPECT_TRUE(b.model_preset.empty());
  EXPECT_EQ(b.model.name, "mini");
  EXPECT_EQ(b.weights.kind, WeightsConfig::Kind::kSafetensors);
  EXPECT_EQ(b.weights.safetensors_path, "/models/mini.safetensors");
  EXPECT_EQ(b.partitions, (std::vector<std::string>{"single", "pp2"}));
  EXPECT_EQ(c->scheduler.volume, Duration::Millis(20));
  EXPECT_EQ(c->scheduler.offline_aging, Duration::Millis(5500));
  EXPECT_EQ(c->scheduler.owner_nap, Duration::Micros(250));
  EXPECT_EQ(c->scheduler.online_new_device_cost, Duration::Millis(25));
  EXPECT_EQ(c->scheduler.online_stream_device_cost, Duration::Zero());
  EXPECT_EQ(c->scheduler.stream_idle_after, Duration::Millis(500));
  EXPECT_FALSE(c->scheduler.offline_avoids_online_streams);
  EXPECT_FALSE(c->scheduler.pipeline_online_prefill);
  EXPECT_TRUE(c->listen.unix_socket.empty());
  EXPECT_EQ(c->listen.tcp_address, "[::]:50051");
  EXPECT_EQ(c->listen.tls_key, "/etc/sliced/k.pem");
  EXPECT_EQ(c->listen.admin_token, "s3cret");
  EXPECT_EQ(c->log_level, "debug");
}

TEST(SlicedConfigTest, DeploymentYamlRoundTrips) {
  auto c = DefaultSlicedConfig();
  ASSERT_TRUE(c.ok()) << c.status();
  for (const DeploymentConfig& d : c->deployments) {
    auto back = DeploymentConfigFromYaml(d.ToYaml(), "<stored>");
    ASSERT_TRUE(back.ok()) << back.status() << "\n" << d.ToYaml();
    EXPECT_EQ(back->name, d.name);
    EXPECT_EQ(back->model_preset, d.model_preset);
    EXPECT_EQ(back->model.layers, d.model.layers);
    EXPECT_EQ(back->weights.seed, d.weights.seed);
    EXPECT_EQ(back->role, d.role);
    EXPECT_EQ(back->partitions, d.partitions);
  }
  DeploymentConfig inline_model;
  inline_model.name = "x";
  inline_model.model = *LlamaPreset("tiny");
  inline_model.model.name = "mine";
  inline_model.weights.kind = WeightsConfig::Kind::kSafetensors;
  inline_model.weights.safetensors_path = "/w.safetensors";
  auto back = DeploymentConfigFromYaml(inline_model.ToYaml(), "<stored>");
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << inline_model.ToYaml();
  EXPECT_EQ(back->model.name, "mine");
  EXPECT_EQ(back->model.hidden, inline_model.model.hidden);
  EXPECT_EQ(back->model.dtype, inline_model.model.dtype);
  EXPECT_EQ(back->weights.safetensors_path, "/w.safetensors");
}

TEST(SlicedConfigTest, UnknownFieldNamesFieldAndPosition) {
  const std::string text = std::string(kBase) + "listen:\n  unix_sokcet: /tmp/x.sock\n";
  const std::string err = ErrorOf(text);
  EXPECT_THAT(err, HasSubstr("test.yaml:11:3: listen: unknown field 'unix_sokcet'")) << err;
}

TEST(SlicedConfigTest, UnknownTopLevelField) {
  const std::string err = ErrorOf(std::string(kBase) + "statedir: /x\n");
  EXPECT_THAT(err, HasSubstr("test.yaml:10:1:")) << err;
  EXPECT_THAT(err, HasSubstr("unknown field 'statedir'")) << err;
}

TEST(SlicedConfigTest, TcpWithoutTls) {
  const std::string err = ErrorOf(std::string(kBase) + "listen:\n  tcp: 0.0.0.0:50051\n");
  EXPECT_THAT(err, HasSubstr("test.yaml:11:8: listen.tcp: requires listen.tls")) << err;
}

TEST(SlicedConfigTest, TlsCertWithoutKey) {
  const std::string err =
      ErrorOf(std::string(kBase) + "listen:\n  tcp: 0.0.0.0:50051\n  tls: {cert: /c.pem}\n");
  EXPECT_THAT(err, HasSubstr("test.yaml:12:8: listen.tls: missing required field 'key'")) << err;
}

TEST(SlicedConfigTest, BadTcpAddress) {
  const std::string err = ErrorOf(std::string(kBase) +
                                  "listen:\n  tcp: localhost\n  tls: {cert: /c, key: /k}\n");
  EXPECT_THAT(err, HasSubstr("test.yaml:11:8: listen.tcp: expected HOST:PORT")) << err;
}

TEST(SlicedConfigTest, MetricsListener) {
  auto c = Parse(std::string(kBase) + "listen:\n  unix_socket: /tmp/x.sock\n  metrics: 127.0.0.1:9464\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->listen.metrics_address, "127.0.0.1:9464");
  auto off = Parse(std::string(kBase));
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_TRUE(off->listen.metrics_address.empty());  // default: off

  std::string err = ErrorOf(std::string(kBase) + "listen:\n  metrics: 9464\n");
  EXPECT_THAT(err, HasSubstr("test.yaml:11:12: listen.metrics: expected HOST:PORT")) << err;
  err = ErrorOf(std::string(kBase) + "listen:\n  metrics: 0.0.0.0:99999\n");
  EXPECT_THAT(err, HasSubstr("listen.metrics: port must be a number in 1..65535")) << err;
}

TEST(SlicedConfigTest, BadByteSize) {
  std::string text = kBase;
  text.replace(text.find("1GiB"), 4, "lots");
  const std::string err = ErrorOf(text);
  EXPECT_THAT(err, HasSubstr("test.yaml:3:48: cluster.devices[0].memory:")) << err;
  EXPECT_THAT(err, HasSubstr("lots")) << err;
}

TEST(SlicedConfigTest, UnknownModelPreset) {
  std::string text = kBase;
  text.replace(text.find("model: tiny"), 11, "model: huge");
  const std::string err = ErrorOf(text);
  EXPECT_THAT(err, HasSubstr("test.yaml:7:12: deployments[0].model: no model preset named 'huge'")) << err;
}

// `family` is llama or absent; anything else is refused, naming the value
// and the one family there is (not built as a Llama, not ignored).
TEST(SlicedConfigTest, UnknownModelFamily) {
  const std::string inline_model = "model: {name: m, family: FAMILY, layers: 2, hidden: 32, heads: 2, ffn: 64, vocab: 100, fusion: 1}";
  auto with_family = [&](const std::string& family) {
    return absl::StrReplaceAll(std::string(kBase), {{"model: tiny", absl::StrReplaceAll(inline_model, {{"FAMILY", family}})}});
  };
  ASSERT_TRUE(Parse(with_family("llama")).ok());
  for (const std::string family : {"gpt", "Llama", "'llama2'"}) {
    const std::string err = ErrorOf(with_family(family));
    EXPECT_THAT(err, HasSubstr("test.yaml:7:30: deployments[0].model.family: unsupported model family '")) << err;
    EXPECT_THAT(err, HasSubstr("' (the only family is llama: a Llama-shaped decoder)")) << err;
    EXPECT_THAT(err, HasSubstr("1 configuration error:")) << err;
  }
}

// Booleans (planner.profile_from_lut): unquoted true/false (yes/no, on/off);
// a quoted word or a number is refused, naming the file, key and value.
TEST(SlicedConfigTest, BooleansMustBeUnquotedWords) {
  const std::string base = std::string(kBase) + "planner: {time_lut: /l.csv, profile_from_lut: VALUE}\n";
  auto with = [&](const std::string& v) { return absl::StrReplaceAll(base, {{"VALUE", v}}); };
  for (const std::string v : {"true", "yes", "on", "True"}) {
    auto c = Parse(with(v));
    ASSERT_TRUE(c.ok()) << v << ": " << c.status();
    EXPECT_TRUE(c->planner.profile_from_lut) << v;
  }
  EXPECT_THAT(ErrorOf(with("'yes'")),
              HasSubstr("test.yaml:10:47: planner.profile_from_lut: expected true or false, got the string 'yes' (a "
                        "quoted word is not a boolean; write it without quotes)"));
  EXPECT_THAT(ErrorOf(with("\"false\"")), HasSubstr("planner.profile_from_lut: expected true or false, got the string 'false'"));
  EXPECT_THAT(ErrorOf(with("1")), HasSubstr("test.yaml:10:47: planner.profile_from_lut: expected true or false, got '1'"));
}

TEST(SlicedConfigTest, DuplicateDeploymentName) {
  const std::string text = std::string(kBase) +
                           "  - {name: a, model: tiny, weights: {seed: 1}, role: offline}\n";
  const std::string err = ErrorOf(text);
  EXPECT_THAT(err, HasSubstr("test.yaml:10:12: deployments[1].name: duplicate deployment name 'a' "
                             "(first defined at line 6)"))
      << err;
}

TEST(SlicedConfigTest, WeightsNeedExactlyOneSource) {
  std::string text = kBase;
  text.replace(text.find("{seed: 7}"), 9, "{seed: 7, safetensors: /w}");
  EXPECT_THAT(ErrorOf(text), HasSubstr("test.yaml:8:14: deployments[0].weights: set exactly one"));
}

TEST(SlicedConfigTest, PartitionTheModelDoesNotOfferOrClusterCannotHold) {
  std::string text = kBase;
  text.replace(text.find("role: online"), 12, "role: online\n    partitions: [pp8, pp4]");
  const std::string err = ErrorOf(text);
  // tiny has 2 fused groups: no pp8; pp4 does not exist either.
  EXPECT_THAT(err, HasSubstr("deployments[0].partitions[0]: model 'tiny' has no partition 'pp8'")) << err;
  std::string text2 = kBase;
  text2.replace(text2.find("count: 2"), 8, "count: 1");
  text2.replace(text2.find("role: online"), 12, "role: online\n    partitions: [pp2]");
  EXPECT_THAT(ErrorOf(text2),
              HasSubstr("deployments[0].partitions[0]: partition 'pp2' needs 2 devices but the cluster has 1"));
}

TEST(SlicedConfigTest, ReportsEveryErrorInOnePass) {
  std::string text = kBase;
  text.replace(text.find("1GiB"), 4, "lots");
  text.replace(text.find("role: online"), 12, "role: sometimes");
  text.replace(text.find("/tmp/sliced-test"), 16, "relative/dir");
  text += "scheduler: {volume_ms: 0, timeliness: -1, owner_nap_us: -5, online_stream_device_cost_ms: -1}\nlog_level: loud\n";
  const std::string err = ErrorOf(text);
  EXPECT_THAT(err, HasSubstr("cluster.devices[0].memory"));
  EXPECT_THAT(err, HasSubstr("deployments[0].role: expected 'online' or 'offline'"));
  EXPECT_THAT(err, HasSubstr("scheduler.volume_ms: must be positive"));
  EXPECT_THAT(err, HasSubstr("scheduler.timeliness: must be positive"));
  EXPECT_THAT(err, HasSubstr("scheduler.owner_nap_us: must not be negative, got -5"));
  EXPECT_THAT(err, HasSubstr("scheduler.online_stream_device_cost_ms: must not be negative"));
  EXPECT_THAT(err, HasSubstr("log_level: expected one of"));
  EXPECT_THAT(err, HasSubstr("state_dir: must be an absolute path"));
}

// The planner section of the fine-tuning job runner: defaults, values, and
// every bad field named.
TEST(SlicedConfigTest, PlannerSection) {
  auto d = Parse(kBase);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->planner.interval, Duration::Seconds(120));
  EXPECT_EQ(d->planner.mode, PlannerConfig::Mode::kYmir);
  EXPECT_EQ(d->planner.checkpoint_interval, Duration::Seconds(30));
  EXPECT_EQ(d->planner.prefetch, Duration::Seconds(30));
  EXPECT_TRUE(d->planner.gains_path.empty());
  EXPECT_EQ(d->planner.spatial_step, PlannerConfig::SpatialStep::kMean);
  auto c = Parse(std::string(kBase) +
                 "planner: {interval_s: 5, mode: elastic, gains: /g.csv, checkpoint_interval_s: 2, prefetch_s: 0, "
                 "eval_every_steps: 8, spatial_step: sum, max_eval_examples: 512, neutral_pairs: plan}\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->planner.pair_neutral);
  EXPECT_FALSE(d->planner.pair_neutral);
  EXPECT_EQ(c->planner.interval, Duration::Seconds(5));
  EXPECT_EQ(c->planner.mode, PlannerConfig::Mode::kElastic);
  EXPECT_EQ(c->planner.gains_path, "/g.csv");
  EXPECT_EQ(c->planner.checkpoint_interval, Duration::Seconds(2));
  EXPECT_EQ(c->planner.prefetch, Duration::Zero());
  EXPECT_EQ(c->planner.eval_every_steps, 8);
  EXPECT_EQ(c->planner.spatial_step, PlannerConfig::SpatialStep::kSum);
  EXPECT_EQ(c->planner.max_eval_examples, 512);
  EXPECT_EQ(d->planner.max_eval_examples, 128);
  for (const auto& [name, mode] : {std::pair{"srtf", PlannerConfig::Mode::kSrtf},
                                   std::pair{"pollux", PlannerConfig::Mode::kPollux}}) {
    auto b = Parse(std::string(kBase) + "planner: {mode: " + name + "}\n");
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(b->planner.mode, mode);
    EXPECT_EQ(PlannerModeName(mode), name);
  }
  const std::string err = ErrorOf(std::string(kBase) +
                                  "planner: {interval_s: 0, mode: greedy, checkpoint_interval_s: -1, prefetch_s: -2, "
                                  "eval_every_steps: -3, colour: red, spatial_step: max, max_eval_examples: 0, "
                                  "neutral_pairs: maybe}\n");
  EXPECT_THAT(err, HasSubstr("planner.interval_s: must be positive"));
  EXPECT_THAT(err, HasSubstr("planner.mode: expected ymir, elastic, srtf or pollux, got 'greedy'"));
  EXPECT_THAT(err, HasSubstr("planner.spatial_step: expected mean or sum, got 'max'"));
  EXPECT_THAT(err, HasSubstr("planner.max_eval_examples: must be in 1..1048576, got 0"));
  EXPECT_THAT(err, HasSubstr("planner.neutral_pairs: expected skip or plan, got 'maybe'"));
  EXPECT_THAT(err, HasSubstr("planner.checkpoint_interval_s: must be positive"));
  EXPECT_THAT(err, HasSubstr("planner.prefetch_s: must not be negative"));
  EXPECT_THAT(err, HasSubstr("planner.eval_every_steps: must not be negative"));
  EXPECT_THAT(err, HasSubstr("colour"));
}

// planner.time_lut / profile_from_lut (the runner's data-parallel times).
TEST(SlicedConfigTest, PlannerTimeLut) {
  auto d = Parse(kBase);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(d->planner.time_lut_path.empty());
  EXPECT_FALSE(d->planner.profile_from_lut);
  auto c = Parse(std::string(kBase) + "planner: {time_lut: /var/lib/sliced/lut.csv, profile_from_lut: true}\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->planner.time_lut_path, "/var/lib/sliced/lut.csv");
  EXPECT_TRUE(c->planner.profile_from_lut);
  EXPECT_THAT(ErrorOf(std::string(kBase) + "planner: {profile_from_lut: true}\n"),
              HasSubstr("planner.profile_from_lut: needs planner.time_lut"));
  EXPECT_THAT(ErrorOf(std::string(kBase) + "planner: {time_lut: /l.csv, profile_from_lut: maybe}\n"),
              HasSubstr("profile_from_lut"));
}

// The planner's file knobs must not name a directory (the gains table would
// read as empty, the LUT could never be written back).
TEST(SlicedConfigTest, PlannerFilesMustNotBeDirectories) {
  const std::string dir = ::testing::TempDir();
  EXPECT_THAT(ErrorOf(StrCat(kBase, "planner: {time_lut: ", dir, "}\n")),
              HasSubstr(StrCat("planner.time_lut: '", dir, "' is a directory; expected a CSV file (created when missing)")));
  EXPECT_THAT(ErrorOf(StrCat(kBase, "planner: {gains: ", dir, "}\n")),
              HasSubstr(StrCat("planner.gains: '", dir, "' is a directory; expected a gains table (a CSV file)")));
  EXPECT_TRUE(Parse(StrCat(kBase, "planner: {time_lut: ", dir, "/not-yet.csv}\n")).ok());
}

TEST(SlicedConfigTest, LoadFromFileResolvesRelativeWeights) {
  const std::string dir = ::testing::TempDir();
  const std::string path = dir + "/sliced_config_test.yaml";
  std::string text = kBase;
  text.replace(text.find("{seed: 7}"), 9, "{safetensors: w/model.safetensors}");
  {
    std::ofstream out(path);
    out << text;
  }
  auto c = LoadSlicedConfig(path);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->deployments[0].weights.safetensors_path, ::testing::EndsWith("/w/model.safetensors"));
  EXPECT_EQ(c->deployments[0].weights.safetensors_path.front(), '/');
  EXPECT_EQ(c->source, path);

  auto missing = LoadSlicedConfig(dir + "/does-not-exist.yaml");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
}

TEST(SlicedConfigTest, BatchSection) {
  auto c = ParseSlicedConfig(YAML::Load(std::string(kBase) + "batch: {max_inflight: 4}\n"), "<test>");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->batch.max_inflight, 4);
  auto d = ParseSlicedConfig(YAML::Load(kBase), "<test>");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->batch.max_inflight, 16);
  EXPECT_THAT(ErrorOf(std::string(kBase) + "batch: {max_inflight: 0}\n"), HasSubstr("batch.max_inflight"));
}

// docs/operations.md, "Configuration reference": the keys its tables and
// headings document are exactly those the loader takes, map by map. The
// loader's keys come from its own "unknown field" error.
std::set<std::string> LoaderKeys(const std::string& text) {
  const std::string e = ErrorOf(text);
  const std::string marker = "unknown field 'zz_undocumented' (expected one of: ";
  const size_t at = e.find(marker);
  EXPECT_NE(at, std::string::npos) << e;
  if (at == std::string::npos) return {};
  const size_t begin = at + marker.size();
  std::set<std::string> keys;
  for (absl::string_view k : absl::StrSplit(e.substr(begin, e.find(')', begin) - begin), ", ")) keys.emplace(k);
  return keys;
}

TEST(SlicedConfigDocs, EveryKeyTheLoaderTakesIsDocumentedAndNoOther) {
  namespace docs = testing_docs;
  const std::string doc = docs::ReadSourceFile("docs/operations.md");
  ASSERT_FALSE(doc.empty());
  const std::vector<std::string> reference = docs::MarkdownSection(doc, "## Configuration reference");
  ASSERT_FALSE(reference.empty());
  // Each "### `key`" heading is a top-level key.
  std::set<std::string> top;
  for (const std::string& line : reference) {
    if (docs::StartsWith(line, "### ")) top.insert(docs::CodeSpans(line).at(0));
  }
  // The first column of a heading's table, split at "." / "[]." into maps.
  auto documented = [&](std::string_view heading, std::string_view prefix) {
    std::set<std::string> keys;
    for (const std::string& code : docs::FirstColumnCodes(docs::MarkdownSection(doc, heading))) {
      if (!docs::StartsWith(code, prefix)) continue;
      const std::string rest = code.substr(prefix.size());
      keys.insert(rest.substr(0, rest.find_first_of(".[")));
    }
    return keys;
  };
  const std::string bogus = "zz_undocumented: 1";
  const std::string base(kBase);
  auto with = [&](absl::string_view from, const std::string& to) { return absl::StrReplaceAll(base, {{from, to}}); };
  EXPECT_EQ(top, LoaderKeys(base + bogus + "\n"));
  EXPECT_EQ(documented("### `cluster`", ""), LoaderKeys(with("  devices:\n", StrCat("  ", bogus, "\n  devices:\n"))));
  EXPECT_EQ(documented("### `cluster`", "devices[]."),
            LoaderKeys(with("backend: cpu}", "backend: cpu, " + bogus + "}")));
  EXPECT_EQ(documented("### `cluster`", "links."),
            LoaderKeys(with("state_dir:", StrCat("  links: {", bogus, "}\nstate_dir:"))));
  EXPECT_EQ(documented("### `deployments`", ""),
            LoaderKeys(with("    role: online\n", "    role: online\n    " + bogus + "\n")));
  // An inline model's keys (also those of configs/models/*.yaml).
  EXPECT_EQ(documented("### `deployments`", "model."),
            LoaderKeys(with("model: tiny", StrCat("model: {name: m, layers: 2, hidden: 32, heads: 2, ffn: 64, "
                                                  "vocab: 100, ", bogus, "}"))));
  for (const std::string section : {"scheduler", "planner", "batch", "listen"}) {
    EXPECT_EQ(documented(StrCat("### `", section, "`"), ""), LoaderKeys(StrCat(base, section, ": {", bogus, "}\n")))
        << section;
  }
  EXPECT_EQ(documented("### `listen`", "tls."),
            LoaderKeys(StrCat(base, "listen: {tcp: '127.0.0.1:1', tls: {cert: c, key: k, ", bogus, "}}\n")));
}

}  // namespace
}  // namespace slicesched
