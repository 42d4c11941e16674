// The synthetic language and task family: determinism, label balance and
// semantics, argument errors and the two file formats.
#include "slicesched/synth/tasks.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

namespace slicesched::synth {
namespace {

std::vector<Example> Gen(const std::string& task, uint64_t seed, int64_t n = 512, int64_t len = 32,
                         int64_t classes = 2) {
  DatasetOptions o;
  o.task = task;
  o.seed = seed;
  o.examples = n;
  o.sequence_length = len;
  o.num_classes = classes;
  auto r = Generate(o);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : std::vector<Example>{};
}

double Share(const std::vector<Example>& ex, int64_t label) {
  int64_t n = 0;
  for (const Example& e : ex) n += e.label == label ? 1 : 0;
  return static_cast<double>(n) / static_cast<double>(ex.size());
}

TEST(SynthTasks, SameSeedSameExamplesOtherSeedOtherExamples) {
  const auto a = Gen("fa-major", 7), b = Gen("fa-major", 7), c = Gen("fa-major", 8);
  ASSERT_EQ(a.size(), 512u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].tokens, b[i].tokens);
    EXPECT_EQ(a[i].label, b[i].label);
  }
  int64_t differ = 0;
  for (size_t i = 0; i < a.size(); ++i) differ += a[i].tokens != c[i].tokens ? 1 : 0;
  EXPECT_GT(differ, 500);
}

TEST(SynthTasks, FamilyVariantsShareInputsAndRelateLabels) {
  const auto major = Gen("fa-major", 3), inv = Gen("fa-inv", 3), noisy = Gen("fa-noisy", 3);
  const auto fb = Gen("fb-major", 3);
  int64_t flipped = 0, agree_fb = 0;
  for (size_t i = 0; i < major.size(); ++i) {
    ASSERT_EQ(major[i].tokens, inv[i].tokens);  // same sentences for one seed
    ASSERT_EQ(major[i].tokens, fb[i].tokens);
    EXPECT_EQ(inv[i].label, 1 - major[i].label);
    flipped += noisy[i].label != major[i].label ? 1 : 0;
    agree_fb += fb[i].label == major[i].label ? 1 : 0;
  }
  // 20% flips, binomial sd ~ 1.8% at n = 512.
  EXPECT_NEAR(static_cast<double>(flipped) / 512.0, 0.2, 0.06);
  // fb reads a disjoint class set: far from identical labels.
  EXPECT_LT(static_cast<double>(agree_fb) / 512.0, 0.8);
}

TEST(SynthTasks, LabelsAreRoughlyBalanced) {
  for (const char* task : {"fa-major", "fb-major", "fab-major", "parity"}) {
    const auto ex = Gen(task, 11, 2000);
    EXPECT_NEAR(Share(ex, 1), 0.5, 0.15) << task;
  }
  const auto bins = Gen("fa-bins", 11, 3000, 32, 3);
  for (int64_t c = 0; c < 3; ++c) EXPECT_NEAR(Share(bins, c), 1.0 / 3.0, 0.12) << c;
  const auto last = Gen("last-class", 11, 2000, 16, 4);
  for (const Example& e : last) {
    EXPECT_GE(e.label, 0);
    EXPECT_LT(e.label, 4);
  }
}

TEST(SynthTasks, CopyRepeatsTheFirstHalfAndTokensAreInVocab) {
  for (const Example& e : Gen("copy", 5, 64, 10)) {
    ASSERT_EQ(e.tokens.size(), 10u);
    for (size_t j = 0; j < 5; ++j) EXPECT_EQ(e.tokens[j], e.tokens[j + 5]);
    EXPECT_EQ(e.label, 0);
  }
  for (const Example& e : Gen("lm", 5, 64, 10)) {
    for (int64_t t : e.tokens) {
      EXPECT_GE(t, 0);
      EXPECT_LT(t, 256);
    }
  }
}

TEST(SynthTasks, TheLanguageHasStructure) {
  // The class chain is far from uniform: bigram class counts are skewed.
  auto lang = Language::Make({});
  ASSERT_TRUE(lang.ok());
  Rng rng(1);
  std::map<std::pair<int64_t, int64_t>, int64_t> bigrams;
  for (int i = 0; i < 200; ++i) {
    const auto s = lang->Sample(32, rng);
    for (size_t j = 1; j < s.size(); ++j) ++bigrams[{lang->ClassOf(s[j - 1]), lang->ClassOf(s[j])}];
  }
  int64_t max = 0, total = 0;
  for (const auto& [k, n] : bigrams) {
    max = std::max(max, n);
    total += n;
  }
  EXPECT_GT(static_cast<double>(max), 3.0 * static_cast<double>(total) / 64.0);
}

TEST(SynthTasks, BadArgumentsNameTheProblem) {
  DatasetOptions o;
  o.task = "nope";
  EXPECT_THAT(std::string(Generate(o).status().message()), testing::HasSubstr("unknown synthetic task 'nope'"));
  o.task = "fa-major";
  o.num_classes = 3;
  EXPECT_THAT(std::string(Generate(o).status().message()), testing::HasSubstr("is binary"));
  o.num_classes = 2;
  o.sequence_length = 1;
  EXPECT_THAT(std::string(Generate(o).status().message()), testing::HasSubstr("sequence_length"));
  o.sequence_length = 8;
  o.examples = 0;
  EXPECT_THAT(std::string(Generate(o).status().message()), testing::HasSubstr("examples"));
  EXPECT_TRUE(FindTask("parity").ok());
  EXPECT_TRUE(FindTask("copy").ok());  // the names the shipped job YAMLs use
}

TEST(SynthTasks, FilesRoundTrip) {
  const auto ex = Gen("fab-bins", 2, 20, 12, 4);
  const std::string dir = testing::TempDir();
  const std::string bin = dir + "/synth_roundtrip.bin", jsonl = dir + "/synth_roundtrip.jsonl";
  ASSERT_TRUE(WriteTokensBin(bin, ex).ok());
  auto back = ReadTokensBin(bin);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), ex.size());
  for (size_t i = 0; i < ex.size(); ++i) {
    EXPECT_EQ((*back)[i].tokens, ex[i].tokens);
    EXPECT_EQ((*back)[i].label, ex[i].label);
  }
  EXPECT_EQ(std::filesystem::file_size(bin), 8u + 8u + 20u * (8u + 4u + 12u * 4u));
  ASSERT_TRUE(WriteJsonl(jsonl, ex).ok());
  std::ifstream f(jsonl);
  std::string first;
  std::getline(f, first);
  std::string want = "{\"tokens\": [";
  for (size_t i = 0; i < ex[0].tokens.size(); ++i) want += (i ? ", " : "") + std::to_string(ex[0].tokens[i]);
  want += "], \"label\": " + std::to_string(ex[0].label) + "}";
  EXPECT_EQ(first, want);
  std::ofstream(bin, std::ios::binary) << "garbage!";
  EXPECT_FALSE(ReadTokensBin(bin).ok());
}

}  // namespace
}  // namespace slicesched::synth
