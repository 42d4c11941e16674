#include "slicesched/synth/wordnet.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>

namespace slicesched::synth {
namespace {

using ::testing::HasSubstr;

// A small data.noun in WordNet 3.0's format (wndb(5WN)): the license header
// (lines starting with two spaces), then one synset per line with the real
// offsets of the roots the family names (mammal 01861778, bird 01503061).
constexpr char kFixture[] =
    "  1 This software and database is being provided to you, the LICENSEE, by\n"
    "  2 Princeton University under the following license.\n"
    "00015388 03 n 06 animal 0 animate_being 0 beast 0 brute 0 creature 0 fauna 0 001 @ 00004475 n 0000 "
    "| a living organism characterized by voluntary movement\n"
    "01861778 05 n 02 mammal 0 mammalian 0 001 @ 00015388 n 0000 "
    "| any warm-blooded vertebrate having the skin more or less covered with hair\n"
    "02084071 05 n 03 dog 0 domestic_dog 0 Canis_familiaris 0 001 @ 01861778 n 0000 "
    "| a member of the genus Canis that has been domesticated by man\n"
    "02121620 05 n 01 cat 0 001 @ 01861778 n 0000 | feline mammal usually having thick soft fur\n"
    "01503061 05 n 01 bird 0 001 @ 00015388 n 0000 "
    "| warm-blooded egg-laying vertebrates characterized by feathers and forelimbs modified as wings\n"
    "01524359 05 n 01 passerine 0 001 @ 01503061 n 0000 | perching birds mostly small and living near the ground\n"
    "13104059 20 n 01 tree 0 000 | a tall perennial woody plant having a main trunk and branches\n"
    "11669921 20 n 01 flower 0 000 | a plant cultivated for its blooms or blossoms\n"
    "03183080 06 n 01 device 0 000 | an instrumentality invented for a particular purpose\n"
    "07705931 13 n 02 edible_fruit 0 fruit 0 000 | edible reproductive body of a seed plant having sweet flesh\n";

std::string WriteFixture(const std::string& name, const std::string& text) {
  const std::string dir = ::testing::TempDir() + "/" + name;
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/data.noun") << text;
  return dir;
}

TEST(WordNetTest, LoadsSynsetsHypernymsAndGlossesFromThePackageFormat) {
  auto c = WordNetCorpus::Load(WriteFixture("wn_ok", kFixture));
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
  auto small = WordNetCorpus::Load(WriteFixture("wn_ok", kFixture), 16);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(small->vocab_size(), 16);
  EXPECT_EQ(small->Encode("zebra"), (std::vector<int64_t>{kWordNetUnknown}));
}

TEST(WordNetTest, BadInputNamesTheFileLineAndWhat) {
  auto missing = WordNetCorpus::Load(::testing::TempDir() + "/no_such_wordnet");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("wordnet-base"));
  auto no_gloss = WordNetCorpus::Load(WriteFixture("wn_bad1", "00015388 03 n 01 animal 0 000\n"));
  EXPECT_THAT(no_gloss.status().message(), HasSubstr("data.noun:1: no ' | '"));
  auto short_ptrs = WordNetCorpus::Load(WriteFixture("wn_bad2", "  header\n00015388 03 n 01 animal 0 002 @ 1 n 0000 | x\n"));
  EXPECT_THAT(short_ptrs.status().message(), HasSubstr("data.noun:2: the line ends inside its 2 pointers"));
  auto verb = WordNetCorpus::Load(WriteFixture("wn_bad3", "00015388 29 v 01 run 0 000 | move fast\n"));
  EXPECT_THAT(verb.status().message(), HasSubstr("not a noun"));
  auto twice = WordNetCorpus::Load(WriteFixture("wn_bad4", "00000001 03 n 01 a 0 000 | x\n00000001 03 n 01 b 0 000 | y\n"));
  EXPECT_THAT(twice.status().message(), HasSubstr("data.noun:2: synset 1 appears twice"));
  EXPECT_FALSE(WordNetCorpus::Load(WriteFixture("wn_ok", kFixture), 8).ok());
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
  auto c = WordNetCorpus::Load(WriteFixture("wn_ok", kFixture));
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
