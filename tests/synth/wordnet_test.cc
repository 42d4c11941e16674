#include "slicesched/synth/wordnet.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "synth/wordnet_fixture.h"

namespace slicesched::synth {
namespace {

using ::testing::HasSubstr;

TEST(WordNetTest, LoadsSynsetsHypernymsAndGlossesFromThePackageFormat) {
  auto c = WordNetCorpus::Load(WriteWordNetFixture("wn_ok", kWordNetFixture));
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->synsets().size(), 10u);
  const WordNetSynset* dog = c->Find(2084071);
  ASSERT_NE(dog, nullptr);
  EXPECT_EQ(dog->lexfile, 5);
  EXPECT_EQ(dog->words, (std::vector<std::string>{"dog", "domestic_dog", "Canis_familiaris"}));
  EXPECT_EQ(dog->hypernyms, (std::vector<uint32_t>{1861778}));
  EXPECT_EQ(dog->gloss, "a member of the genus Canis that has been domesticated by man");
  EXPECT_TRUE(c->IsA(2084071, 15388));   // dog -> mammal -> animal
  EXPECT_FALSE(c->IsA(2084071, 1503061));  // not a bird
  // Gloss words: lowercased, split at punctuation; the most frequent words
  // get the smallest ids, unknown words kWordNetUnknown.
  const std::vector<int64_t> ids = c->Encode("Warm-blooded, ZEBRA");
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(c->Word(ids[0]), "warm");
  EXPECT_EQ(c->Word(ids[1]), "blooded");
  EXPECT_EQ(c->Word(kWordNetPad), "<pad>");
  auto small = WordNetCorpus::Load(WriteWordNetFixture("wn_ok", kWordNetFixture), 16);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(small->vocab_size(), 16);
  EXPECT_EQ(small->Encode("zebra"), (std::vector<int64_t>{kWordNetUnknown}));
}

TEST(WordNetTest, BadInputNamesTheFileLineAndWhat) {
  auto missing = WordNetCorpus::Load(::testing::TempDir() + "/no_such_wordnet");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("wordnet-base"));
  auto no_gloss = WordNetCorpus::Load(WriteWordNetFixture("wn_bad1", "00015388 03 n 01 animal 0 000\n"));
  EXPECT_THAT(no_gloss.status().message(), HasSubstr("data.noun:1: no ' | '"));
  auto short_ptrs = WordNetCorpus::Load(WriteWordNetFixture("wn_bad2", "  header\n00015388 03 n 01 animal 0 002 @ 1 n 0000 | x\n"));
  EXPECT_THAT(short_ptrs.status().message(), HasSubstr("data.noun:2: the line ends inside its 2 pointers"));
  auto verb = WordNetCorpus::Load(WriteWordNetFixture("wn_bad3", "00015388 29 v 01 run 0 000 | move fast\n"));
  EXPECT_THAT(verb.status().message(), HasSubstr("not a noun"));
  auto twice = WordNetCorpus::Load(WriteWordNetFixture("wn_bad4", "00000001 03 n 01 a 0 000 | x\n00000001 03 n 01 b 0 000 | y\n"));
  EXPECT_THAT(twice.status().message(), HasSubstr("data.noun:2: synset 1 appears twice"));
  EXPECT_FALSE(WordNetCorpus::Load(WriteWordNetFixture("wn_ok", kWordNetFixture), 8).ok());
}

TEST(WordNetTest, TheFamilyHasSixteenTasksWithGradedRelatedness) {
  const auto& tasks = WordNetTasks();
  EXPECT_GE(tasks.size(), 16u);
  std::set<std::string> names;
  for (const WordNetTask& t : tasks) EXPECT_TRUE(names.insert(t.name).second) << t.name;
  EXPECT_TRUE(FindWordNetTask("mammal-bird@3").ok());
  auto unknown = FindWordNetTask("dog-cat");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(unknown.status().message(), HasSubstr("animal-plant"));
}

TEST(WordNetTest, ExamplesAreBalancedLeftPaddedGlossesOfTheirClass) {
  auto c = WordNetCorpus::Load(WriteWordNetFixture("wn_ok", kWordNetFixture));
  ASSERT_TRUE(c.ok());
  auto task = FindWordNetTask("mammal-bird");
  ASSERT_TRUE(task.ok());
  auto mammals = WordNetClassMembers(*c, *task, 0);
  ASSERT_TRUE(mammals.ok());
  EXPECT_EQ(*mammals, (std::vector<uint32_t>{1861778, 2084071, 2121620}));
  auto birds = WordNetClassMembers(*c, *task, 1);
  EXPECT_EQ(*birds, (std::vector<uint32_t>{1503061, 1524359}));
  WordNetDatasetOptions o{.task = "mammal-bird", .seed = 7, .examples = 400, .sequence_length = 12};
  auto ex = GenerateWordNet(*c, o);
  ASSERT_TRUE(ex.ok()) << ex.status();
  int ones = 0;
  for (const Example& e : *ex) {
    ASSERT_EQ(e.tokens.size(), 12u);
    EXPECT_NE(e.tokens.back(), kWordNetPad);  // the label's position holds a word
    ones += static_cast<int>(e.label);
  }
  EXPECT_GT(ones, 160);
  EXPECT_LT(ones, 240);
  // Deterministic; another seed or a data salt draws other examples.
  auto again = GenerateWordNet(*c, o);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)[5].tokens, (*ex)[5].tokens);
  o.task = "mammal-bird@1";
  auto salted = GenerateWordNet(*c, o);
  ASSERT_TRUE(salted.ok());
  bool differs = false;
  for (size_t k = 0; k < ex->size(); ++k) differs |= (*salted)[k].tokens != (*ex)[k].tokens;
  EXPECT_TRUE(differs);
  // A class with no synset in the corpus is an error that names it.
  o.task = "fish-insect";
  EXPECT_THAT(GenerateWordNet(*c, o).status().message(), HasSubstr("class 0 (syn:fish) has no synset"));
  o.task = "mammal-bird";
  o.sequence_length = 1;
  EXPECT_EQ(GenerateWordNet(*c, o).status().code(), absl::StatusCode::kInvalidArgument);
}

// The installed package, when present: every task of the family has both
// classes populated, with enough synsets to train and evaluate on.
TEST(WordNetTest, EveryTaskHasBothClassesInTheInstalledWordNet) {
  if (!std::filesystem::exists(std::string(kWordNetDefaultDir) + "/data.noun")) {
    GTEST_SKIP() << kWordNetDefaultDir << "/data.noun is absent (Debian's wordnet-base)";
  }
  auto c = WordNetCorpus::Load();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_GT(c->synsets().size(), 80000u);
  for (const WordNetTask& t : WordNetTasks()) {
    for (int cls = 0; cls < 2; ++cls) {
      auto m = WordNetClassMembers(*c, t, cls);
      ASSERT_TRUE(m.ok()) << m.status();
      EXPECT_GE(m->size(), 50u) << t.name << " class " << cls;
    }
  }
}

}  // namespace
}  // namespace slicesched::synth
