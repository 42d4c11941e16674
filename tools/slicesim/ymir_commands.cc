// slicesim's commands: The Ymir job-level simulator and the synthetic task data: ymir, synth-data.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "command.h"
#include "slicesched/experiments/ymir_sim.h"
#include "slicesched/synth/tasks.h"
#include "slicesched/synth/wordnet.h"
#include "slicesched/ymir/gains_repeats.h"

namespace slicesim {
namespace {

int YmirCommand(const std::vector<std::string>& args) {
  slicesched::YmirCompareOptions o;
  bool json = false;
  std::string donors = o.config.ilp_donors ? "1" : "0", pair_shares = o.config.ymir_pair_shares ? "1" : "0";
  std::vector<std::string> policies = slicesched::YmirSimPolicyNames();
  policies.push_back("all");
  if (int rc = Flags("ymir")
                   .Text("--trace", &o.trace)
                   .Text("--gains", &o.gains)
                   .Choice("--gains-definition", {"saved", "speedup"}, &o.gains_definition)
                   .Choice("--gains-column", {"gain", "gain_steps"}, &o.gains_column)
                   .Choice("--policy", policies, &o.policy)
                   .Int("--jobs", &o.jobs)
                   .Seed("--seed", &o.config.seed)
                   .Num("--load", &o.load)
                   .Int("--gpus", &o.config.gpus)
                   .Int("--nodes", &o.nodes)
                   .Num("--round", &o.config.round_s)
                   .Num("--restart", &o.config.restart_s)
                   .Int("--ilp-window", &o.config.ilp_window)
                   .Num("--ilp-gap", &o.config.ilp_gap)
                   .Num("--ilp-time-limit", &o.config.ilp_time_limit_s)
                   .Num("--ymir-horizon", &o.config.ymir_horizon_s)
                   .Num("--lambda", &o.config.lambda)
                   .Choice("--ilp-donors", {"0", "1"}, &donors)
                   .Choice("--pair-shares", {"0", "1"}, &pair_shares)
                   .Switch("--json", &json)
                   .Parse(args)) {
    return rc;
  }
  o.config.ilp_donors = donors == "1";
  o.config.ymir_pair_shares = pair_shares == "1";
  if (absl::Status v = o.Validate(); !v.ok()) return Rejected("ymir", v);
  auto r = slicesched::RunYmirCompare(o);
  if (!r.ok()) return Failed("ymir", r.status());
  std::printf("%s\n", json ? r->ToJson(o).c_str() : r->ToText().c_str());
  return 0;
}

// synth-data --family wordnet: the WordNet gloss tasks (synth/wordnet.h).
int WordNetData(const slicesched::synth::DatasetOptions& o, const std::string& dir, int64_t vocab,
                const std::string& out, bool list) {
  auto corpus = slicesched::synth::WordNetCorpus::Load(dir, vocab);
  if (!corpus.ok()) return Failed("synth-data", corpus.status());
  if (list) {
    std::printf("WordNet %s: %zu noun synsets, vocabulary %lld words\n", dir.c_str(), corpus->synsets().size(),
                static_cast<long long>(corpus->vocab_size()));
    for (const auto& t : slicesched::synth::WordNetTasks()) {
      size_t n[2] = {0, 0};
      for (int c = 0; c < 2; ++c) {
        auto m = slicesched::synth::WordNetClassMembers(*corpus, t, c);
        if (!m.ok()) return Failed("synth-data", m.status());
        n[c] = m->size();
      }
      std::printf("%-18s %6zu / %-6zu %s\n", t.name.c_str(), n[0], n[1], t.description.c_str());
    }
    return 0;
  }
  const slicesched::synth::WordNetDatasetOptions w{
      .task = o.task, .seed = o.seed, .examples = o.examples, .sequence_length = o.sequence_length};
  auto ex = slicesched::synth::GenerateWordNet(*corpus, w);
  if (!ex.ok()) return Failed("synth-data", ex.status());
  absl::Status st = out.ends_with(".jsonl") ? slicesched::synth::WriteJsonl(out, *ex)
                                            : slicesched::synth::WriteTokensBin(out, *ex);
  if (!st.ok()) return Failed("synth-data", st);
  std::printf("wrote %zu examples of WordNet task %s to %s\n", ex->size(), o.task.c_str(), out.c_str());
  return 0;
}

int SynthData(const std::vector<std::string>& args) {
  slicesched::synth::DatasetOptions o;
  std::string out, family = "synthetic", wordnet_dir = slicesched::synth::kWordNetDefaultDir;
  // WordNet's word vocabulary: the tiny backbone's by default, so that its
  // jobs accept the token ids.
  int64_t vocab = 256;
  bool list = false;
  if (int rc = Flags("synth-data")
                   .Text("--family", &family)
                   .Text("--wordnet-dir", &wordnet_dir)
                   .Int("--vocab", &vocab)
                   .Text("--task", &o.task)
                   .Text("--out", &out)
                   .Seed("--seed", &o.seed)
                   .Int("--examples", &o.examples)
                   .Int("--sequence-length", &o.sequence_length)
                   .Int("--num-classes", &o.num_classes)
                   .Switch("--list", &list)
                   .Parse(args)) {
    return rc;
  }
  if (family != "synthetic" && family != "wordnet") {
    return UsageError("synth-data", "--family must be synthetic or wordnet, got '" + family + "'");
  }
  const bool wordnet = family == "wordnet";
  if (wordnet && list) return WordNetData(o, wordnet_dir, vocab, out, list);
  if (list) {
    for (const auto& t : slicesched::synth::KnownTasks()) {
      std::printf("%-12s %s\n", t.name.c_str(), t.description.c_str());
    }
    return 0;
  }
  if (out.empty()) return UsageError("synth-data", "--out FILE is required");
  if (!out.ends_with(".jsonl") && !out.ends_with(".bin")) {
    return UsageError("synth-data", "--out must end in .jsonl or .bin, got '" + out + "'");
  }
  if (o.task.empty()) return UsageError("synth-data", "--task NAME is required (--list prints the names)");
  if (wordnet) return WordNetData(o, wordnet_dir, vocab, out, false);
  if (absl::Status v = o.Validate(); !v.ok()) return Rejected("synth-data", v);
  auto ex = slicesched::synth::Generate(o);
  if (!ex.ok()) return Failed("synth-data", ex.status());
  absl::Status st;
  if (out.ends_with(".jsonl")) {
    st = slicesched::synth::WriteJsonl(out, *ex);
  } else {
    st = slicesched::synth::WriteTokensBin(out, *ex);
  }
  if (!st.ok()) return Failed("synth-data", st);
  std::printf("wrote %zu examples of %s to %s\n", ex->size(), o.task.c_str(), out.c_str());
  return 0;
}

// ymir-gains --combine A.csv,B.csv[,...] --out FILE: one table with each
// pair's spread and sign over the repeats (slicesched/ymir/gains_repeats.h).
int YmirGains(const std::vector<std::string>& args) {
  std::string combine, out;
  if (int rc = Flags("ymir-gains").Text("--combine", &combine).Required().Text("--out", &out).Required().Parse(args)) {
    return rc;
  }
  std::vector<std::pair<std::string, std::string>> tables;
  for (const std::string& path : std::vector<std::string>(absl::StrSplit(combine, ',', absl::SkipEmpty()))) {
    std::ifstream in(path);
    if (!in) return Failed("ymir-gains", absl::NotFoundError("--combine: cannot read " + path));
    std::stringstream text;
    text << in.rdbuf();
    tables.emplace_back(path, text.str());
  }
  slicesched::ymir::GainsRepeatsSummary sum;
  auto table = slicesched::ymir::CombineGainRepeats(tables, &sum);
  if (!table.ok()) return Failed("ymir-gains", table.status());
  std::ofstream f(out);
  f << *table;
  if (!f) return Failed("ymir-gains", absl::UnavailableError("cannot write " + out));
  std::printf("wrote %s: %d pairs over %d repeats: %d positive, %d negative, %d neutral (95%% interval)\n",
              out.c_str(), sum.pairs, sum.repeats, sum.positive, sum.negative, sum.neutral);
  return 0;
}

[[maybe_unused]] const bool kRegistered = RegisterCommands({
    {"ymir", &YmirCommand},
    {"synth-data", &SynthData},
    {"ymir-gains", &YmirGains},
});

}  // namespace
}  // namespace slicesim
