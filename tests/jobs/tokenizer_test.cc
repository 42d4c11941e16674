// The SentencePiece tokenizer of batch jobs (jobs/tokenizer.h): a model
// trained at test time by the library's own trainer on a generated corpus,
// then text prompts and stop strings of a batch file going through it.
#include "slicesched/jobs/tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "slicesched/common/strings.h"
#include "slicesched/jobs/batch_input.h"

namespace slicesched::jobs {
namespace {

using ::testing::HasSubstr;

// Sentences over a small vocabulary, deterministic.
std::string Corpus() {
  const char* subjects[] = {"the cat", "a dog", "the small bird", "my neighbour", "the old train"};
  const char* verbs[] = {"sees", "follows", "waits for", "paints", "sings to"};
  const char* objects[] = {"the river", "a red house", "the quiet garden", "the morning light", "a blue boat"};
  std::string out;
  for (int i = 0; i < 600; ++i) {
    out += StrCat(subjects[i % 5], " ", verbs[(i / 5) % 5], " ", objects[(i / 25) % 5], ".\n");
  }
  return out;
}

class TokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(StrCat(::testing::TempDir(), "/tokenizer_", ::getpid()));
    std::filesystem::create_directories(*dir_);
    std::ofstream(*dir_ + "/corpus.txt") << Corpus();
    ASSERT_TRUE(TrainTokenizer(*dir_ + "/corpus.txt", *dir_ + "/sp", 120).ok());
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }
  static std::string* dir_;
};
std::string* TokenizerTest::dir_ = nullptr;

TEST_F(TokenizerTest, EncodesAndDecodesText) {
  auto t = Tokenizer::Load(*dir_ + "/sp.model");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->vocab_size(), 120);
  auto ids = (*t)->Encode("the cat paints a blue boat.");
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_GT(ids->size(), 1u);
  for (int64_t id : *ids) EXPECT_LT(id, 120);
  auto text = (*t)->Decode(*ids);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "the cat paints a blue boat.");
  EXPECT_THAT(std::string((*t)->Decode({1, 500}).status().message()), HasSubstr("token 1 is 500"));
}

TEST_F(TokenizerTest, BadFilesAreNamed) {
  EXPECT_TRUE(absl::IsNotFound(Tokenizer::Load(*dir_ + "/none.model").status()));
  std::ofstream(*dir_ + "/junk.model") << "not a model";
  auto junk = Tokenizer::Load(*dir_ + "/junk.model");
  ASSERT_FALSE(junk.ok());
  EXPECT_THAT(std::string(junk.status().message()), HasSubstr("junk.model: not a SentencePiece model"));
}

TEST_F(TokenizerTest, TextPromptsOfABatchAreEncodedAndChecked) {
  auto t = Tokenizer::Load(*dir_ + "/sp.model");
  ASSERT_TRUE(t.ok());
  std::shared_ptr<const Tokenizer> tok = *t;
  const BatchModelLookup models = [tok](std::string_view name) -> std::optional<BatchModelInfo> {
    if (name != "sp") return std::nullopt;
    BatchModelInfo info{.vocab = 256, .max_context_tokens = 24, .has_tokenizer = true};
    info.encode = [tok](std::string_view text) { return tok->Encode(text); };
    return info;
  };
  std::string long_text;
  for (int i = 0; i < 8; ++i) long_text += "the small bird waits for the quiet garden. ";
  const std::string in =
      R"({"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"model": "sp", "prompt": "the dog sees the river.", "max_tokens": 4, "stop": ["the", "quiet garden"]}})"
      "\n"
      R"({"custom_id": "b", "method": "POST", "url": "/v1/completions", "body": {"model": "sp", "prompt": ")" +
      long_text + R"(", "max_tokens": 4}})" + "\n";
  auto r = ParseBatchInput(in, models, /*strict=*/false);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->requests.size(), 1u);
  const BatchRequest& a = r->requests[0];
  EXPECT_EQ(a.prompt_text, "the dog sees the river.");
  EXPECT_EQ(a.prompt_tokens, *tok->Encode("the dog sees the river."));
  // "the" encodes to one piece: a stop token; "quiet garden" to several:
  // kept as text.
  EXPECT_EQ(a.stop_tokens.size(), 1u);
  EXPECT_EQ(a.stop_text, std::vector<std::string>{"quiet garden"});
  auto back = DecodeBatchRequest(EncodeBatchRequest(a));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->prompt_tokens, a.prompt_tokens);
  EXPECT_EQ(back->prompt_text, a.prompt_text);
  ASSERT_EQ(r->errors.size(), 1u);
  EXPECT_THAT(r->errors[0].message, HasSubstr("line 2: the prompt of"));
  EXPECT_THAT(r->errors[0].message, HasSubstr("holds at most 24"));
}

}  // namespace
}  // namespace slicesched::jobs
