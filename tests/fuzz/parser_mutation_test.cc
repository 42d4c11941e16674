// The input-robustness campaign over the daemon's text and file parsers (the
// project's standard: bad input gets a clear error that names what is wrong,
// never a crash). Every surface starts from valid examples (the repository's
// configs, job YAMLs, gains tables, token files, or generated fixtures) and
// feeds the parser kIterations seeded mutations (tests/fuzz/mutator.h). A
// result passes when it is OK, or an error whose message names where the
// problem is (the surface's criterion below: the source and a line/field, or
// the offending text). Crashes and undefined behaviour are caught by running
// this test under tools/sanitize; a hang would trip ctest's timeout (each
// input is at most 256 KiB, so the work per input is bounded).
//
// SLICESCHED_FUZZ_ITERATIONS overrides the per-surface iteration count for a
// longer local campaign (CI uses the default).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <algorithm>
#include <cctype>
#include <regex>
#include <string>
#include <vector>

#include "fuzz/mutator.h"
#include "slicesched/common/config.h"
#include "slicesched/common/strings.h"
#include "slicesched/common/units.h"
#include "slicesched/estimate/estimators.h"
#include "slicesched/experiments/ymir_sim.h"
#include "slicesched/gmg/shape_expr.h"
#include "slicesched/jobs/job_spec.h"
#include "slicesched/server/config.h"
#include "slicesched/server/state_store.h"
#include "slicesched/synth/tasks.h"
#include "slicesched/workload/trace.h"
#include "slicesched/ymir/time_lut.h"

namespace slicesched {
namespace {

constexpr uint64_t kSeed = 20261201;

int Iterations(int default_count) {
  const char* env = std::getenv("SLICESCHED_FUZZ_ITERATIONS");
  return env != nullptr ? std::atoi(env) : default_count;
}

std::string SourceDir() {
  const char* dir = std::getenv("SLICESCHED_SOURCE_DIR");
  return dir != nullptr ? dir : ".";
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << path;
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(text.data(), static_cast<std::streamsize>(text.size()));
}

std::string TempDir(const std::string& name) {
  const std::string dir = StrCat(::testing::TempDir(), "/fuzz_", name, "_", ::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// A short, printable excerpt of an input for failure messages.
std::string Excerpt(const std::string& input) {
  std::string out;
  for (char c : input.substr(0, 300)) {
    const auto u = static_cast<unsigned char>(c);
    out += (u >= 0x20 && u < 0x7f) || c == '\n' ? std::string(1, c) : StrCat("\\x", absl::Hex(u, absl::kZeroPad2));
  }
  return input.size() > 300 ? out + "..." : out;
}

// The criterion for text sources: the message names the source followed by
// a position ("SOURCE:LINE[:COL]: ...", YAML and CSV rows) or by what is wrong
// with it as a whole ("SOURCE: FIELD.PATH: ..." for a missing key, "SOURCE:
// empty gains table"), possibly quoted ('SOURCE').
bool NamesSourcePosition(const std::string& message, const std::string& source) {
  for (size_t at = message.find(source); at != std::string::npos; at = message.find(source, at + 1)) {
    size_t p = at + source.size();
    if (p < message.size() && message[p] == '\'') ++p;
    if (p + 1 >= message.size() || message[p] != ':') continue;
    const char next = message[p + 1];
    if (std::isdigit(static_cast<unsigned char>(next))) return true;
    if (next == ' ' && p + 2 < message.size() && std::isgraph(static_cast<unsigned char>(message[p + 2]))) return true;
  }
  return false;
}

struct Campaign {
  std::string surface;
  int iterations = 0;
  int ok = 0;
  int errors = 0;
  std::vector<std::string> unnamed;  // errors that fail the criterion (first few)

  void Record(const absl::Status& s, bool names_where, const std::string& input) {
    if (s.ok()) {
      ++ok;
      return;
    }
    ++errors;
    if (!names_where && unnamed.size() < 5) {
      unnamed.push_back(StrCat("input:\n", Excerpt(input), "\nerror: ", s.message().substr(0, 600)));
    }
  }
  void Report() const {
    std::printf("[fuzz] %s: %d inputs, %d accepted, %d rejected, %zu unnamed\n", surface.c_str(), iterations,
                ok, errors, unnamed.size());
    for (const std::string& u : unnamed) ADD_FAILURE() << surface << ": error does not name where:\n" << u;
  }
};

// Runs `parse` on `iterations` mutations of the seeds (round robin).
void RunCampaign(const std::string& surface, const std::vector<std::string>& seeds, int iterations,
                 const std::function<void(const std::string& input, Campaign& c)>& parse) {
  fuzz::Mutator m(kSeed ^ std::hash<std::string>()(surface));
  Campaign c{.surface = surface, .iterations = iterations};
  for (int i = 0; i < iterations; ++i) {
    const std::string input = m.Mutate(seeds[static_cast<size_t>(i) % seeds.size()]);
    parse(input, c);
  }
  c.Report();
}

// Structure-aware sweep: every value of every line of `seed`, in turn,
// replaced by every extreme value of the mutator's dictionary. Errors must
// meet `names_where`; with SLICESCHED_FUZZ_VERBOSE set, accepted substitutions
// are printed for review (silent acceptance of nonsense).
void SweepValues(const std::string& surface, const std::string& seed,
                 const std::function<absl::Status(const std::string&)>& parse,
                 const std::function<bool(const std::string&)>& names_where) {
  const bool verbose = std::getenv("SLICESCHED_FUZZ_VERBOSE") != nullptr;
  Campaign c{.surface = surface + " (value sweep)"};
  size_t line_start = 0;
  while (line_start < seed.size()) {
    size_t line_end = seed.find('\n', line_start);
    if (line_end == std::string::npos) line_end = seed.size();
    const std::string line = seed.substr(line_start, line_end - line_start);
    const size_t colon = line.find(": ");
    const size_t first = line.find_first_not_of(' ');
    if (colon != std::string::npos && first != std::string::npos && line[first] != '#') {
      const size_t vs = colon + 2;
      size_t ve = std::min(line.size(), line.find_first_of(",}#", vs));
      while (ve > vs && line[ve - 1] == ' ') --ve;
      for (const std::string& v : fuzz::Mutator::ExtremeValues()) {
        const std::string input = seed.substr(0, line_start + vs) + v + seed.substr(line_start + ve);
        const absl::Status s = parse(input);
        ++c.iterations;
        c.Record(s, names_where(std::string(s.message())), input);
        if (s.ok() && verbose) std::printf("[fuzz] %s accepts `%s` <- %s\n", surface.c_str(), line.c_str(), Excerpt(v.substr(0, 40)).c_str());
      }
    }
    line_start = line_end + 1;
  }
  c.Report();
}

TEST(ParserMutation, SeedsAreValid) {
  // The campaigns start from valid inputs; a broken seed would only test the
  // first error path.
  auto config = DefaultSlicedConfig();
  ASSERT_TRUE(config.ok()) << config.status();
  const std::string jobs = SourceDir() + "/configs/jobs";
  for (const char* f : {"sentiment-tiny.yaml", "parity-synthetic.yaml", "copy-pipeline.yaml"}) {
    EXPECT_TRUE(jobs::LoadJobSpecFile(jobs + "/" + f).ok()) << f;
  }
  EXPECT_TRUE(ymir::LoadYmirGains(SourceDir() + "/configs/ymir/gains_synth.csv").ok());
  EXPECT_TRUE(synth::ReadTokensBin(jobs + "/data/parity-tiny.bin").ok());
}

TEST(ParserMutation, SlicedConfig) {
  const std::string source = "<fuzz:sliced.yaml>";
  const std::vector<std::string> seeds = {std::string(DefaultSlicedConfigYaml()),
                                          ReadFile(SourceDir() + "/configs/sliced.yaml")};
  const auto parse = [&](const std::string& input) {
    auto node = LoadYamlString(input, source);
    return node.ok() ? ParseSlicedConfig(*node, source).status() : node.status();
  };
  const auto names = [&](const std::string& msg) { return NamesSourcePosition(msg, source); };
  SweepValues("sliced config", seeds[1], parse, names);
  RunCampaign("sliced config", seeds, Iterations(1500), [&](const std::string& input, Campaign& c) {
    absl::Status s;
    auto node = LoadYamlString(input, source);
    if (!node.ok()) {
      s = node.status();
    } else {
      s = ParseSlicedConfig(*node, source).status();
    }
    c.Record(s, NamesSourcePosition(std::string(s.message()), source), input);
  });
}

TEST(ParserMutation, PersistedDeployment) {
  // What the state store hands back on restart (DeploymentConfig::ToYaml).
  auto config = DefaultSlicedConfig();
  ASSERT_TRUE(config.ok());
  std::vector<std::string> seeds;
  for (const DeploymentConfig& d : config->deployments) seeds.push_back(d.ToYaml());
  DeploymentConfig inline_model = config->deployments.at(0);
  inline_model.model_preset.clear();
  seeds.push_back(inline_model.ToYaml());
  const std::string source = "<fuzz:deployment>";
  for (const std::string& seed : seeds) {
    SweepValues("persisted deployment", seed,
                [&](const std::string& input) { return DeploymentConfigFromYaml(input, source).status(); },
                [&](const std::string& msg) { return NamesSourcePosition(msg, source); });
  }
  RunCampaign("persisted deployment", seeds, Iterations(1500), [&](const std::string& input, Campaign& c) {
    const absl::Status s = DeploymentConfigFromYaml(input, source).status();
    c.Record(s, NamesSourcePosition(std::string(s.message()), source), input);
  });
}

TEST(ParserMutation, JobSpec) {
  const std::string jobs = SourceDir() + "/configs/jobs";
  std::vector<std::string> seeds;
  for (const char* f : {"sentiment-tiny.yaml", "parity-synthetic.yaml", "copy-pipeline.yaml", "private-parity.yaml"}) {
    seeds.push_back(ReadFile(jobs + "/" + f));
  }
  jobs::JobSpecOptions options;
  options.source = "<fuzz:job>";
  options.base_dir = jobs;
  for (const std::string& seed : seeds) {
    SweepValues("job spec", seed, [&](const std::string& input) { return jobs::ParseJobSpec(input, options).status(); },
                [&](const std::string& msg) { return NamesSourcePosition(msg, options.source); });
  }
  RunCampaign("job spec", seeds, Iterations(2000), [&](const std::string& input, Campaign& c) {
    const absl::Status s = jobs::ParseJobSpec(input, options).status();
    c.Record(s, NamesSourcePosition(std::string(s.message()), options.source), input);
  });
}

TEST(ParserMutation, OpEstimatorState) {
  // The estimator state a restart reads back from the state store.
  const std::vector<std::string> seeds = {
      "version: 1\nops:\n"
      "  - {device_type: A16, template: mixed, op: head, features: [B, '1'], coeffs: [1, 2], fitted: true}\n"
      "  - {device_type: A16, template: mixed, op: mm, features: [b*m*n*k, b*m*k, b*k*n, b*m*n, '1'],\n"
      "     coeffs: [1, 2, 0, 0, 1], samples: 12, mape_pct: 3.5, fitted: true}\n",
      "version: 1\nops:\n"
      "  - device_type: cpu\n    template: tiny/prefill\n    op: g0\n    features: [B*S, '1']\n"
      "    coeffs: [0.5, 1000]\n    samples: 3\n    fitted: false\n"};
  const std::string source = "<op estimator state>";
  RunCampaign("op estimator state", seeds, Iterations(1500), [&](const std::string& input, Campaign& c) {
    OpEstimator est;
    const std::string before = est.Save();
    const absl::Status s = est.Restore(input);
    if (!s.ok()) {
      EXPECT_EQ(est.Save(), before) << "a failed Restore changed the estimator";
    }
    // An input that is not a map at all gets "SOURCE: estimator state must be a map".
    c.Record(s, NamesSourcePosition(std::string(s.message()), source), input);
  });
}

TEST(ParserMutation, ShapeExpressions) {
  const std::vector<std::string> seeds = {"B*S",         "ceil(C/256)*256", "cdiv(B*S, 4) + min(C, 4096)",
                                          "max(1, S-1)", "-(B) + 2*(S+C)",  "B*S*64*2"};
  RunCampaign("shape expression", seeds, Iterations(3000), [&](const std::string& input, Campaign& c) {
    SymbolTable symbols;
    auto e = ShapeExpr::Parse(input, &symbols);
    absl::Status s = e.status();
    if (e.ok()) {
      // Evaluate with extreme bindings: overflow must be an error, not UB.
      SymbolValues values(symbols.size());
      fuzz::Mutator m(std::hash<std::string>()(input));
      for (size_t i = 0; i < symbols.size(); ++i) values.Set(static_cast<int>(i), m.ExtremeInteger());
      s = e->Evaluate(values).status();
    }
    // Parse errors quote the expression; evaluation errors name the fault.
    const std::string msg(s.message());
    c.Record(s, !msg.empty(), input);
  });
}

TEST(ParserMutation, Units) {
  const std::vector<std::string> seeds = {"64GiB", "1.5MiB", "4096", "16k", "40 GB", "10ms", "1h30m", "-5ms", "inf"};
  RunCampaign("units", seeds, Iterations(3000), [&](const std::string& input, Campaign& c) {
    for (const absl::Status& s : {Bytes::Parse(input).status(), Duration::Parse(input).status()}) {
      // The criterion: the message quotes the text it could not read.
      const std::string msg(s.message());
      c.Record(s, msg.find(input.substr(0, 64)) != std::string::npos, input);
    }
  });
}

TEST(ParserMutation, YmirGainsCsv) {
  const std::string dir = TempDir("gains");
  const std::string path = dir + "/gains.csv";
  const std::vector<std::string> seeds = {ReadFile(SourceDir() + "/configs/ymir/gains_synth.csv"),
                                          ReadFile(SourceDir() + "/configs/ymir/gains_first_setup.csv")};
  RunCampaign("ymir gains csv", seeds, Iterations(1500), [&](const std::string& input, Campaign& c) {
    WriteFile(path, input);
    const absl::Status s = ymir::LoadYmirGains(path).status();
    c.Record(s, NamesSourcePosition(std::string(s.message()), path), input);
  });
}

TEST(ParserMutation, TimeLutCsv) {
  ymir::TimeLut lut;
  ASSERT_TRUE(lut.Set({.devices = 1, .grad_accum = 1, .local_batch = 8}, 0.5, 3).ok());
  ASSERT_TRUE(lut.Set({.devices = 4, .grad_accum = 2, .local_batch = 16, .frozen_layers = 2, .amp = true,
                       .parallelism = ymir::Parallelism::kPipeline},
                      0.25, 1)
                  .ok());
  const std::vector<std::string> seeds = {lut.ToCsv()};
  RunCampaign("time lut csv", seeds, Iterations(1500), [&](const std::string& input, Campaign& c) {
    const absl::Status s = ymir::TimeLut::FromCsv(input).status();
    const std::string msg(s.message());
    c.Record(s, std::regex_search(msg, std::regex("time LUT( line [0-9]+)?:")), input);
  });
}

TEST(ParserMutation, TraceCsv) {
  const std::string dir = TempDir("trace");
  const std::string path = dir + "/trace.csv";
  const std::vector<std::string> seeds = {
      "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,4808,10\n"
      "2023-11-16 18:15:50.9951690,3180,8\n2023-11-16 18:15:51.1000000,110,27\n"};
  RunCampaign("azure trace csv", seeds, Iterations(1000), [&](const std::string& input, Campaign& c) {
    WriteFile(path, input);
    const absl::Status s = LoadAzureLlmTrace(path).status();
    c.Record(s, NamesSourcePosition(std::string(s.message()), path), input);
  });
  const std::vector<std::string> job_seeds = {ReadFile(SourceDir() + "/tests/experiments/data/ymir_jobs.csv")};
  RunCampaign("job trace csv", job_seeds, Iterations(1000), [&](const std::string& input, Campaign& c) {
    WriteFile(path, input);
    const absl::Status s = LoadJobTrace(path).status();
    c.Record(s, NamesSourcePosition(std::string(s.message()), path), input);
  });
}

TEST(ParserMutation, TokensBin) {
  const std::string dir = TempDir("tokens");
  const std::string path = dir + "/tokens.bin";
  const std::vector<std::string> seeds = {ReadFile(SourceDir() + "/configs/jobs/data/parity-tiny.bin")};
  RunCampaign("tokens-bin", seeds, Iterations(1500), [&](const std::string& input, Campaign& c) {
    WriteFile(path, input);
    const absl::Status s = synth::ReadTokensBin(path).status();
    c.Record(s, std::string(s.message()).find(path) != std::string::npos, input);
  });
}

TEST(ParserMutation, JsonlDataset) {
  // One line at a time, as the job runner's loader reads the file.
  const std::string data = ReadFile(SourceDir() + "/configs/jobs/data/sentiment-tiny.jsonl");
  std::vector<std::string> seeds;
  for (size_t start = 0; start < data.size() && seeds.size() < 8;) {
    const size_t nl = data.find('\n', start);
    seeds.push_back(data.substr(start, nl - start));
    start = nl == std::string::npos ? data.size() : nl + 1;
  }
  const std::string path = "<fuzz:data.jsonl>";
  RunCampaign("jsonl line", seeds, Iterations(3000), [&](const std::string& input, Campaign& c) {
    synth::Example e;
    const absl::Status s = synth::ParseJsonlExample(input, 17, path, &e);
    c.Record(s, std::string(s.message()).find(path + ":17: ") != std::string::npos, input);
  });
}

TEST(ParserMutation, StateStoreFile) {
  // A restart reads the state directory back: a truncated or corrupt
  // sliced.db must give an error naming the file, not a crash.
  const std::string good_dir = TempDir("state_good");
  {
    auto store = StateStore::Open(good_dir);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->PutDeployment("tiny-a", "name: tiny-a\nmodel: {preset: tiny}\n").ok());
    ASSERT_TRUE((*store)->CreateJob("name: j\n", "default", "queued").ok());
  }
  const std::vector<std::string> seeds = {ReadFile(good_dir + "/" + std::string(StateStore::kFileName))};
  const std::string dir = TempDir("state");
  const std::string path = dir + "/" + std::string(StateStore::kFileName);
  RunCampaign("state store file", seeds, Iterations(300), [&](const std::string& input, Campaign& c) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    WriteFile(path, input);
    absl::Status s;
    auto store = StateStore::Open(dir);
    if (!store.ok()) {
      s = store.status();
    } else {
      s = (*store)->ListDeployments().status();
      if (s.ok()) s = (*store)->ListJobs().status();
      if (s.ok()) s = (*store)->ListEstimators().status();
    }
    c.Record(s, std::string(s.message()).find(path) != std::string::npos, input);
  });
}

}  // namespace
}  // namespace slicesched
