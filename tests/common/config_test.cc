// Tests for the YAML configuration helpers.

#include "slicesched/common/config.h"

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "slicesched/common/units.h"

namespace slicesched {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

YAML::Node Parse(absl::string_view text) {
  absl::StatusOr<YAML::Node> node = LoadYamlString(text, "test.yaml");
  EXPECT_TRUE(node.ok()) << node.status();
  return node.ok() ? *node : YAML::Node();
}

// --- Loading ----------------------------------------------------------------

TEST(LoadYamlTest, ParsesValidText) {
  absl::StatusOr<YAML::Node> node =
      LoadYamlString("a: 1\nb: [x, y]\n", "t.yaml");
  ASSERT_TRUE(node.ok()) << node.status();
  EXPECT_TRUE(node->IsMap());
  EXPECT_EQ((*node)["b"].size(), 2u);
}

TEST(LoadYamlTest, SyntaxErrorNamesSourceLineAndColumn) {
  // Line 2 ("b: c: d"): the second ':' at column 5 is an illegal map value.
  absl::StatusOr<YAML::Node> node =
      LoadYamlString("a: 1\nb: c: d\n", "cluster.yaml");
  ASSERT_FALSE(node.ok());
  EXPECT_EQ(node.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(node.status().message(), "cluster.yaml:2:5: illegal map value");
}

TEST(LoadYamlTest, UnterminatedFlowSequence) {
  absl::StatusOr<YAML::Node> node =
      LoadYamlString("a: 1\nb: [1, 2\nc: 3\n", "<embedded:x>");
  ASSERT_FALSE(node.ok());
  EXPECT_THAT(node.status().message(),
              HasSubstr("<embedded:x>:3:2: end of sequence flow not found"));
}

TEST(LoadYamlTest, EmptyTextIsNull) {
  absl::StatusOr<YAML::Node> node = LoadYamlString("", "empty.yaml");
  ASSERT_TRUE(node.ok());
  EXPECT_TRUE(node->IsNull());
}

class LoadYamlFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("slicesched_config_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }

  std::filesystem::path dir_;
};

TEST_F(LoadYamlFileTest, LoadsAFile) {
  const std::string path = Write("ok.yaml", "devices:\n  - name: gpu0\n");
  absl::StatusOr<YAML::Node> node = LoadYamlFile(path);
  ASSERT_TRUE(node.ok()) << node.status();
  EXPECT_EQ((*node)["devices"][0]["name"].Scalar(), "gpu0");
}

TEST_F(LoadYamlFileTest, MissingFileIsNotFoundNamingThePath) {
  const std::string path = (dir_ / "nope.yaml").string();
  absl::StatusOr<YAML::Node> node = LoadYamlFile(path);
  ASSERT_FALSE(node.ok());
  EXPECT_EQ(node.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(node.status().message(), HasSubstr(path));
}

TEST_F(LoadYamlFileTest, DirectoryIsRejected) {
  absl::StatusOr<YAML::Node> node = LoadYamlFile(dir_.string());
  ASSERT_FALSE(node.ok());
  EXPECT_THAT(node.status().message(), HasSubstr("is a directory"));
}

TEST_F(LoadYamlFileTest, SyntaxErrorNamesTheFile) {
  const std::string path = Write("bad.yaml", "a: 1\n  b: 2\n");
  absl::StatusOr<YAML::Node> node = LoadYamlFile(path);
  ASSERT_FALSE(node.ok());
  EXPECT_EQ(node.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(node.status().message(), HasSubstr(path + ":2:4: "));
}

// --- ConfigErrors -----------------------------------------------------------

TEST(ConfigErrorsTest, OkWhenEmpty) {
  ConfigErrors errors("c.yaml");
  EXPECT_TRUE(errors.ok());
  EXPECT_TRUE(errors.ToStatus().ok());
}

TEST(ConfigErrorsTest, FormatsPositionPathAndMessage) {
  const YAML::Node root = Parse("a: 1\nb:\n  c: xyz\n");
  ConfigErrors errors("c.yaml");
  errors.Add(root["b"]["c"], "b.c", "bad value");
  errors.Add(root, "", "top-level problem");
  errors.Add(YAML::Node(), "x", "no position");
  errors.AddGlobal("global problem");
  errors.Add(ConfigSource{"other.yaml"}, root["a"], "a", "elsewhere");
  EXPECT_FALSE(errors.ok());
  EXPECT_THAT(
      errors.errors(),
      ElementsAre("c.yaml:3:6: b.c: bad value", "c.yaml:1:1: top-level problem",
                  "c.yaml: x: no position", "global problem",
                  "other.yaml:1:4: a: elsewhere"));
}

TEST(ConfigErrorsTest, DeduplicatesIdenticalLines) {
  const YAML::Node root = Parse("a: 1\n");
  ConfigErrors errors("c.yaml");
  errors.Add(root["a"], "a", "bad");
  errors.Add(root["a"], "a", "bad");
  EXPECT_EQ(errors.size(), 1u);
}

TEST(ConfigErrorsTest, ToStatusListsEveryErrorAndTheCount) {
  ConfigErrors errors;
  errors.AddGlobal("first");
  EXPECT_EQ(errors.ToStatus().message(), "1 configuration error:\nfirst");
  errors.AddGlobal("second");
  const absl::Status s = errors.ToStatus();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "2 configuration errors:\nfirst\nsecond");
}

// --- ConfigReader -----------------------------------------------------------

constexpr char kCluster[] = R"yaml(# A small cluster.
name: test-cluster
devices:
  - name: gpu0
    memory: 80GiB
    bandwidth: 2.0e12
    replicas: 2
    latency: 10us
    shared: true
  - name: gpu1
    memory: 40 GB
    bandwidth: 1.5e12
links: []
)yaml";

struct DeviceSpec {
  std::string name;
  Bytes memory;
  double bandwidth = 0;
  int64_t replicas = 0;
  Duration latency;
  bool shared = false;
};

std::vector<DeviceSpec> ReadDevices(const ConfigReader& r) {
  std::vector<DeviceSpec> out;
  ConfigReader devices = r.RequiredChild("devices");
  for (size_t i = 0; i < devices.size(); ++i) {
    ConfigReader d = devices.At(i);
    DeviceSpec spec;
    spec.name = d.Required<std::string>("name");
    spec.memory = d.RequiredBytes("memory");
    spec.bandwidth = d.Required<double>("bandwidth");
    spec.replicas = d.Optional<int64_t>("replicas", 1);
    spec.latency = d.OptionalDuration("latency", Duration::Micros(5));
    spec.shared = d.Optional<bool>("shared", false);
    d.CheckPositive("replicas", spec.replicas);
    d.CheckPositive("memory", spec.memory);
    d.RejectUnknownKeys(
        {"name", "memory", "bandwidth", "replicas", "latency", "shared"});
    out.push_back(spec);
  }
  return out;
}

TEST(ConfigReaderTest, ReadsTypedValues) {
  const YAML::Node root = Parse(kCluster);
  ConfigErrors errors;
  ConfigReader r(root, "cluster.yaml", &errors);
  EXPECT_EQ(r.Required<std::string>("name"), "test-cluster");
  const std::vector<DeviceSpec> devices = ReadDevices(r);
  r.RejectUnknownKeys({"name", "devices", "links"});
  EXPECT_EQ(r.Child("links").size(), 0u);
  ASSERT_TRUE(errors.ok()) << errors.ToStatus();

  ASSERT_EQ(devices.size(), 2u);
  EXPECT_EQ(devices[0].name, "gpu0");
  EXPECT_EQ(devices[0].memory, Bytes::GiB(80));
  EXPECT_DOUBLE_EQ(devices[0].bandwidth, 2.0e12);
  EXPECT_EQ(devices[0].replicas, 2);
  EXPECT_EQ(devices[0].latency, Duration::Micros(10));
  EXPECT_TRUE(devices[0].shared);
  EXPECT_EQ(devices[1].name, "gpu1");
  EXPECT_EQ(devices[1].memory, Bytes(40000000000));
  EXPECT_EQ(devices[1].replicas, 1);                   // default
  EXPECT_EQ(devices[1].latency, Duration::Micros(5));  // default
  EXPECT_FALSE(devices[1].shared);                     // default
}

TEST(ConfigReaderTest, PathsNameListIndicesAndKeys) {
  const YAML::Node root = Parse(kCluster);
  ConfigErrors errors;
  ConfigReader r(root, "cluster.yaml", &errors);
  EXPECT_EQ(r.path(), "");
  EXPECT_EQ(r.Child("devices").path(), "devices");
  EXPECT_EQ(r.Child("devices").At(1).path(), "devices[1]");
  EXPECT_EQ(r.Child("devices").At(1).Child("memory").path(),
            "devices[1].memory");
  EXPECT_EQ(r.source().name, "cluster.yaml");
}

TEST(ConfigReaderTest, WrongTypesAreReportedAtTheValue) {
  const YAML::Node root = Parse(R"yaml(devices:
  - name: gpu0
    memory: 80GiB
    bandwidth: 1e12
  - name: gpu1
    memory: abc
    bandwidth: fast
    replicas: 1.5
    latency: 10 parsecs
    shared: maybe
)yaml");
  ConfigErrors errors;
  ConfigReader r(root, "cluster.yaml", &errors);
  const std::vector<DeviceSpec> devices = ReadDevices(r);
  ASSERT_EQ(devices.size(), 2u);
  // Bad values leave the defaults in place.
  EXPECT_EQ(devices[1].memory, Bytes::Zero());
  EXPECT_EQ(devices[1].replicas, 1);
  EXPECT_EQ(devices[1].latency, Duration::Micros(5));
  EXPECT_THAT(
      errors.errors(),
      ElementsAre(
          "cluster.yaml:6:13: devices[1].memory: expected a byte size such as "
          "64GiB, got 'abc'",
          "cluster.yaml:7:16: devices[1].bandwidth: expected a number, got "
          "'fast'",
          "cluster.yaml:8:15: devices[1].replicas: expected an integer, got "
          "'1.5'",
          "cluster.yaml:9:14: devices[1].latency: expected a duration such as "
          "10ms, got '10 parsecs'",
          "cluster.yaml:10:13: devices[1].shared: expected true or false, got "
          "'maybe'",
          // memory stayed at its zero default, so the validation fires too.
          "cluster.yaml:6:13: devices[1].memory: must be positive, got 0 B"));
}

TEST(ConfigReaderTest, MissingRequiredFieldIsReportedAtTheParent) {
  const YAML::Node root = Parse(R"yaml(devices:
  - name: gpu0
    bandwidth: 1e12
  - memory: 1GiB
    bandwidth: 1e12
)yaml");
  ConfigErrors errors;
  ConfigReader r(root, "cluster.yaml", &errors);
  ReadDevices(r);
  EXPECT_THAT(errors.errors(),
              ElementsAre("cluster.yaml:2:5: devices[0]: missing required "
                          "field 'memory'",
                          "cluster.yaml:2:5: devices[0].memory: must be "
                          "positive, got 0 B",
                          "cluster.yaml:4:5: devices[1]: missing required "
                          "field 'name'"));
}

TEST(ConfigReaderTest, MissingTopLevelSectionAndEmptyValue) {
  const YAML::Node root = Parse("name:\nother: 1\n");
  ConfigErrors errors;
  ConfigReader r(root, "c.yaml", &errors);
  EXPECT_EQ(r.Required<std::string>("name"), "");
  // A null value counts as absent for Optional.
  EXPECT_EQ(r.Optional<std::string>("name", "dflt"), "dflt");
  EXPECT_TRUE(ReadDevices(r).empty());
  EXPECT_THAT(errors.errors(),
              ElementsAre("c.yaml:1:1: required field 'name' has no value",
                          "c.yaml:1:1: missing required field 'devices'"));
}

TEST(ConfigReaderTest, UnknownKeysAreReportedAtTheKey) {
  const YAML::Node root = Parse(R"yaml(devices:
  - name: gpu0
    memory: 1GiB
    bandwidth: 1e12
    colour: green
nmae: typo
)yaml");
  ConfigErrors errors;
  ConfigReader r(root, "cluster.yaml", &errors);
  ReadDevices(r);
  r.RejectUnknownKeys({"devices", "links"});
  EXPECT_THAT(
      errors.errors(),
      ElementsAre("cluster.yaml:5:5: devices[0]: unknown field 'colour' "
                  "(expected one of: name, memory, bandwidth, replicas, "
                  "latency, shared)",
                  "cluster.yaml:6:1: unknown field 'nmae' (expected one of: "
                  "devices, links)"));
}

TEST(ConfigReaderTest, StructureMismatchesAreReported) {
  const YAML::Node root = Parse(R"yaml(devices:
  gpu0: {}
limits: 5
)yaml");
  ConfigErrors errors;
  ConfigReader r(root, "c.yaml", &errors);
  EXPECT_EQ(r.Child("devices").size(), 0u);
  EXPECT_EQ(r.Child("limits").Optional<int64_t>("max", 3), 3);
  EXPECT_EQ(r.Child("limits").Required<int64_t>("max"), 0);  // same error
  EXPECT_EQ(r.Required<std::string>("devices"), "");
  EXPECT_THAT(errors.errors(),
              ElementsAre("c.yaml:2:3: devices: expected a list, got a map",
                          "c.yaml:3:9: limits: expected a map, got '5'",
                          "c.yaml:2:3: devices: expected a string, got a map"));
}

TEST(ConfigReaderTest, AbsentReadersYieldDefaultsWithoutErrors) {
  const YAML::Node root = Parse("a: 1\n");
  ConfigErrors errors;
  ConfigReader r(root, "c.yaml", &errors);
  ConfigReader missing = r.Child("limits").Child("deeper").At(3);
  EXPECT_FALSE(missing.present());
  EXPECT_EQ(missing.path(), "limits.deeper[3]");
  EXPECT_EQ(missing.Optional<int64_t>("n", 7), 7);
  EXPECT_EQ(missing.Required<int64_t>("n"), 0);
  EXPECT_EQ(missing.RequiredBytes("mem"), Bytes::Zero());
  EXPECT_EQ(missing.OptionalDuration("t", Duration::Millis(1)),
            Duration::Millis(1));
  EXPECT_EQ(missing.size(), 0u);
  EXPECT_THAT(missing.Elements(), IsEmpty());
  EXPECT_THAT(missing.Entries(), IsEmpty());
  EXPECT_FALSE(missing.Has("n"));
  missing.RejectUnknownKeys({});
  EXPECT_TRUE(errors.ok()) << errors.ToStatus();
  // Explicit validation on an absent reader is still reported, at the
  // nearest present ancestor.
  missing.Check(false, "n", "needed when limits are set");
  EXPECT_THAT(errors.errors(),
              ElementsAre("c.yaml:1:1: limits.deeper[3].n: needed when limits "
                          "are set"));
}

TEST(ConfigReaderTest, NullRootIsAbsent) {
  ConfigErrors errors;
  ConfigReader r(Parse(""), "empty.yaml", &errors);
  EXPECT_FALSE(r.present());
  EXPECT_EQ(r.Optional<int64_t>("x", 4), 4);
  r.RequiredChild("devices");  // absent parent: nothing to report
  EXPECT_TRUE(errors.ok());
  r.Error("configuration is empty");
  EXPECT_THAT(errors.errors(),
              ElementsAre("empty.yaml: configuration is empty"));
}

TEST(ConfigReaderTest, CheckUsesTheFieldPosition) {
  const YAML::Node root = Parse("min: 5\nmax: 3\n");
  ConfigErrors errors;
  ConfigReader r(root, "c.yaml", &errors);
  const int64_t lo = r.Required<int64_t>("min");
  const int64_t hi = r.Required<int64_t>("max");
  r.Check(lo <= hi, "max", "must be >= min");
  r.Check(true, "min", "never reported");
  r.CheckPositive("min", lo);
  r.CheckPositive("ratio", 0.0);  // missing field: at this node
  r.CheckPositive("wait", Duration::Millis(-1));
  EXPECT_THAT(errors.errors(),
              ElementsAre("c.yaml:2:6: max: must be >= min",
                          "c.yaml:1:1: ratio: must be positive, got 0",
                          "c.yaml:1:1: wait: must be positive, got -1ms"));
}

TEST(ConfigReaderTest, IntegerBoundsAndFormats) {
  const YAML::Node root = Parse(R"yaml(big: 9223372036854775807
too_big: 9223372036854775808
neg: -12
hex: 0x10
mem_int: 4096
mem_huge: 99999999PiB
)yaml");
  ConfigErrors errors;
  ConfigReader r(root, "c.yaml", &errors);
  EXPECT_EQ(r.Required<int64_t>("big"), INT64_MAX);
  EXPECT_EQ(r.Required<int64_t>("too_big"), 0);
  EXPECT_EQ(r.Required<int64_t>("neg"), -12);
  EXPECT_EQ(r.Optional<int64_t>("hex", 1), 1);
  EXPECT_EQ(r.RequiredBytes("mem_int"), Bytes(4096));
  EXPECT_EQ(r.RequiredBytes("mem_huge"), Bytes::Zero());
  EXPECT_THAT(
      errors.errors(),
      ElementsAre(
          "c.yaml:2:10: too_big: expected an integer, got "
          "'9223372036854775808'",
          "c.yaml:4:6: hex: expected an integer, got '0x10'",
          "c.yaml:6:11: mem_huge: byte size '99999999PiB' is out of range"));
}

TEST(ConfigReaderTest, DoublesAndBools) {
  const YAML::Node root = Parse(R"yaml(a: 1.5
b: 3
c: .inf
d: nan
t: [true, On, yes, FALSE, off, no, 1]
)yaml");
  ConfigErrors errors;
  ConfigReader r(root, "c.yaml", &errors);
  EXPECT_DOUBLE_EQ(r.Required<double>("a"), 1.5);
  EXPECT_DOUBLE_EQ(r.Required<double>("b"), 3.0);
  EXPECT_DOUBLE_EQ(r.Optional<double>("c", 2.0), 2.0);
  EXPECT_DOUBLE_EQ(r.Optional<double>("d", 2.0), 2.0);
  std::vector<bool> flags;
  for (const ConfigReader& t : r.Child("t").Elements())
    flags.push_back(t.As<bool>());
  EXPECT_THAT(flags, ElementsAre(true, true, true, false, false, false, false));
  EXPECT_THAT(
      errors.errors(),
      ElementsAre("c.yaml:3:4: c: expected a number, got '.inf'",
                  "c.yaml:4:4: d: expected a number, got 'nan'",
                  "c.yaml:5:36: t[6]: expected true or false, got '1'"));
}

// Only plain (unquoted) words are booleans: a quoted 'yes' or "true" is a
// YAML string, and a number is not a boolean either. Each is reported with
// the file, the position, the key and the value; the default is kept.
TEST(ConfigReaderTest, QuotedWordsAndNumbersAreNotBools) {
  const YAML::Node root = Parse(R"yaml(a: 'yes'
b: "true"
c: 0
d: !!bool false
e: |
  true
)yaml");
  ConfigErrors errors;
  ConfigReader r(root, "c.yaml", &errors);
  EXPECT_FALSE(r.Optional<bool>("a", false));
  EXPECT_TRUE(r.Optional<bool>("b", true));
  EXPECT_TRUE(r.Optional<bool>("c", true));
  EXPECT_FALSE(r.Required<bool>("d"));
  EXPECT_TRUE(r.Optional<bool>("e", true));
  EXPECT_THAT(errors.errors(),
              ElementsAre("c.yaml:1:4: a: expected true or false, got the string 'yes' (a quoted word is not a "
                          "boolean; write it without quotes)",
                          "c.yaml:2:4: b: expected true or false, got the string 'true' (a quoted word is not a "
                          "boolean; write it without quotes)",
                          "c.yaml:3:4: c: expected true or false, got '0'",
                          "c.yaml:5:4: e: expected true or false, got 'true\n'"));

  // Re-reading text accepted before the rule: quoted words are booleans in
  // the reader and its children; numbers still are not.
  ConfigErrors lenient_errors;
  ConfigReader lenient(root, "c.yaml", &lenient_errors);
  lenient.AcceptQuotedScalars();
  EXPECT_TRUE(lenient.Required<bool>("a"));
  EXPECT_TRUE(lenient.Child("b").As<bool>());
  EXPECT_TRUE(lenient.Optional<bool>("c", true));
  EXPECT_THAT(lenient_errors.errors(), ElementsAre("c.yaml:3:4: c: expected true or false, got '0'"));
}

// Numbers follow the booleans' rule: a quoted "16" or '1.5' is a YAML string
// (once read as the number it spells), reported with the file, the position,
// the key and the value; the default is kept. Plain and !!int / !!float
// tagged scalars are numbers; a quoted non-number gets the plain message.
TEST(ConfigReaderTest, QuotedNumbersAreNotNumbers) {
  const YAML::Node root = Parse(R"yaml(batch_size: "16"
learning_rate: '1.5'
plain_int: 16
plain_float: 1.5
tagged: !!int "8"
block: |
  4
word: "sixteen"
ints: [1, "2"]
)yaml");
  ConfigErrors errors;
  ConfigReader r(root, "c.yaml", &errors);
  EXPECT_EQ(r.Optional<int64_t>("batch_size", 1), 1);
  EXPECT_DOUBLE_EQ(r.Optional<double>("learning_rate", 0.5), 0.5);
  EXPECT_EQ(r.Required<int64_t>("plain_int"), 16);
  EXPECT_DOUBLE_EQ(r.Required<double>("plain_float"), 1.5);
  EXPECT_DOUBLE_EQ(r.Required<double>("plain_int"), 16.0);
  EXPECT_EQ(r.Required<int64_t>("tagged"), 8);
  EXPECT_EQ(r.Optional<int64_t>("block", 3), 3);
  EXPECT_EQ(r.Optional<int64_t>("word", 3), 3);
  std::vector<int64_t> ints;
  for (const ConfigReader& e : r.Child("ints").Elements()) ints.push_back(e.As<int64_t>(-1));
  EXPECT_THAT(ints, ElementsAre(1, -1));
  EXPECT_THAT(errors.errors(),
              ElementsAre("c.yaml:1:13: batch_size: expected an integer, got the string '16' (a quoted number is "
                          "not a number; write it without quotes)",
                          "c.yaml:2:16: learning_rate: expected a number, got the string '1.5' (a quoted number is "
                          "not a number; write it without quotes)",
                          "c.yaml:6:8: block: expected an integer, got the string '4\n' (a quoted number is not a "
                          "number; write it without quotes)",
                          "c.yaml:8:7: word: expected an integer, got 'sixteen'",
                          "c.yaml:9:11: ints[1]: expected an integer, got the string '2' (a quoted number is not a "
                          "number; write it without quotes)"));

  // Re-reading text accepted before the rule: quoted numbers are numbers in
  // the reader and its children; a word still is not.
  ConfigErrors lenient_errors;
  ConfigReader lenient(root, "c.yaml", &lenient_errors);
  lenient.AcceptQuotedScalars();
  EXPECT_EQ(lenient.Required<int64_t>("batch_size"), 16);
  EXPECT_DOUBLE_EQ(lenient.Required<double>("learning_rate"), 1.5);
  EXPECT_DOUBLE_EQ(lenient.Required<double>("batch_size"), 16.0);
  EXPECT_EQ(lenient.Child("ints").At(1).As<int64_t>(), 2);
  EXPECT_EQ(lenient.Optional<int64_t>("word", 3), 3);
  EXPECT_THAT(lenient_errors.errors(), ElementsAre("c.yaml:8:7: word: expected an integer, got 'sixteen'"));
}

TEST(ConfigReaderTest, ListsOfScalarsAndUnitValues) {
  const YAML::Node root = Parse(R"yaml(sizes: [1KiB, 2 MiB, 4096]
timeouts: [10ms, 1.5s]
names: [a, b]
)yaml");
  ConfigErrors errors;
  ConfigReader r(root, "c.yaml", &errors);
  std::vector<int64_t> sizes;
  for (const ConfigReader& s : r.Child("sizes").Elements()) {
    sizes.push_back(s.AsBytes().count());
  }
  EXPECT_THAT(sizes, ElementsAre(1024, 2 << 20, 4096));
  EXPECT_EQ(r.Child("timeouts").At(1).AsDuration(), Duration::Millis(1500));
  EXPECT_EQ(r.Child("names").At(0).As<std::string>(), "a");
  EXPECT_FALSE(r.Child("names").At(2).present());
  EXPECT_TRUE(errors.ok()) << errors.ToStatus();
}

TEST(ConfigReaderTest, EntriesKeepFileOrder) {
  const YAML::Node root = Parse(R"yaml(models:
  llama: {layers: 32}
  mistral: {layers: 40}
  empty:
)yaml");
  ConfigErrors errors;
  ConfigReader r(root, "models.yaml", &errors);
  std::vector<std::string> names;
  std::vector<int64_t> layers;
  for (const auto& [name, model] : r.Child("models").Entries()) {
    names.push_back(name);
    layers.push_back(model.Optional<int64_t>("layers", -1));
    EXPECT_EQ(model.path(), "models." + name);
  }
  EXPECT_THAT(names, ElementsAre("llama", "mistral", "empty"));
  EXPECT_THAT(layers, ElementsAre(32, 40, -1));
  EXPECT_TRUE(errors.ok());
}

TEST(ConfigReaderTest, HasAndStructurePredicates) {
  const YAML::Node root = Parse("a: 1\nb:\nc: [1]\nd: {x: 1}\n");
  ConfigErrors errors;
  ConfigReader r(root, "c.yaml", &errors);
  EXPECT_TRUE(r.Has("a"));
  EXPECT_FALSE(r.Has("b"));  // null
  EXPECT_FALSE(r.Has("z"));
  EXPECT_TRUE(r.IsMap());
  EXPECT_TRUE(r.Child("a").IsScalar());
  EXPECT_TRUE(r.Child("c").IsList());
  EXPECT_TRUE(r.Child("d").IsMap());
  EXPECT_FALSE(r.Child("b").present());
  EXPECT_TRUE(errors.ok());
}

TEST(ConfigReaderTest, ReadersNeverModifyTheTree) {
  const YAML::Node root = Parse("a: {x: 1}\nb: {y: 2}\n");
  ConfigErrors errors;
  ConfigReader r(root, "c.yaml", &errors);
  ConfigReader a = r.Child("a");
  ConfigReader b = r.Child("b");
  a = b;  // rebinds the reader only
  EXPECT_EQ(a.Required<int64_t>("y"), 2);
  a = r.Child("missing");
  EXPECT_FALSE(a.present());
  r.Child("q").Optional<int64_t>("z", 0);
  EXPECT_EQ(root["a"]["x"].as<int>(), 1);
  EXPECT_FALSE(root["a"]["y"].IsDefined());
  EXPECT_FALSE(root["q"].IsDefined());
  EXPECT_EQ(root.size(), 2u);
  EXPECT_TRUE(errors.ok());
}

TEST(ConfigReaderTest, ErrorsConvertToOneStatus) {
  const YAML::Node root = Parse("devices: [{name: a}]\nextra: 1\n");
  ConfigErrors errors;
  ConfigReader r(root, "cluster.yaml", &errors);
  ReadDevices(r);
  r.RejectUnknownKeys({"devices"});
  const absl::Status s = errors.ToStatus();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("configuration errors:\n"));
  EXPECT_THAT(s.message(),
              HasSubstr("devices[0]: missing required field 'memory'"));
  EXPECT_THAT(s.message(),
              HasSubstr("cluster.yaml:2:1: unknown field 'extra'"));
}

}  // namespace
}  // namespace slicesched
