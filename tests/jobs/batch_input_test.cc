#include "slicesched/jobs/batch_input.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "slicesched/common/strings.h"

namespace slicesched {
namespace {

using ::testing::HasSubstr;

// Deployment "chat": vocab 256, KV for 64 tokens, no tokenizer; "sp": a
// tokenizer.
std::optional<BatchModelInfo> Models(std::string_view name) {
  if (name == "chat") return BatchModelInfo{.vocab = 256, .max_context_tokens = 64, .has_tokenizer = false};
  if (name == "sp") return BatchModelInfo{.vocab = 1000, .max_context_tokens = 512, .has_tokenizer = true};
  return std::nullopt;
}

std::string Line(const std::string& id, const std::string& body) {
  return StrCat(R"({"custom_id": ")", id, R"(", "method": "POST", "url": "/v1/completions", "body": )", body, "}\n");
}

TEST(BatchInputTest, ParsesEveryFieldAndKeepsLineNumbers) {
  const std::string in =
      Line("a", R"({"model": "chat", "prompt": [1, 2, 3], "max_tokens": 5, "temperature": 0, "top_p": 0.9, "seed": 7, "stop": [2, 9]})") +
      "\n" +  // a blank line is skipped but counted
      Line("b", R"({"model": "sp", "prompt": "hello", "stop": "\n"})") + Line("c", R"({"model": "chat", "prompt": [4]})");
  auto r = ParseBatchInput(in, Models, /*strict=*/true);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->requests.size(), 3u);
  const BatchRequest& a = r->requests[0];
  EXPECT_EQ(a.line, 1);
  EXPECT_EQ(a.custom_id, "a");
  EXPECT_EQ(a.model, "chat");
  EXPECT_EQ(a.prompt_tokens, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(a.max_tokens, 5);
  EXPECT_EQ(a.temperature, 0);
  EXPECT_DOUBLE_EQ(a.top_p, 0.9);
  EXPECT_EQ(a.seed, 7u);
  EXPECT_EQ(a.stop_tokens, (std::vector<int64_t>{2, 9}));
  EXPECT_EQ(r->requests[1].line, 3);
  EXPECT_EQ(r->requests[1].prompt_text, "hello");
  EXPECT_EQ(r->requests[1].stop_text, std::vector<std::string>{"\n"});
  const BatchRequest& c = r->requests[2];  // OpenAI's defaults
  EXPECT_EQ(c.line, 4);
  EXPECT_EQ(c.max_tokens, 16);
  EXPECT_EQ(c.temperature, 1.0);
  EXPECT_FALSE(c.seed.has_value());
  EXPECT_TRUE(r->errors.empty());
}

// Each malformed line is named by its number, in both modes; without
// --strict the good lines are accepted, with it nothing is.
TEST(BatchInputTest, EveryMalformedLineIsReportedByNumber) {
  struct Case {
    std::string line;
    std::string want;
  };
  const std::vector<Case> cases = {
      {"{\"custom_id\": \"x\", \"method\": \"POST\"\n", "malformed JSON"},
      {"[1, 2]\n", "not a JSON object"},
      {R"({"method": "POST", "url": "/v1/completions", "body": {"model": "chat", "prompt": [1]}})" "\n", "missing custom_id"},
      {Line("", R"({"model": "chat", "prompt": [1]})"), "custom_id must be a non-empty string"},
      {Line("ok", R"({"model": "chat", "prompt": [1]})"), "duplicate custom_id 'ok' (first on line 1)"},
      {Line("m", R"({"model": "nope", "prompt": [1]})"), "unknown model 'nope'"},
      {Line("l", R"({"model": "chat", "prompt": [1, 2, 3], "max_tokens": 62})"), "needs a KV cache of 65 tokens"},
      {Line("u", R"({"model": "chat", "prompt": [1], "logprobs": 3})"), "unknown field 'body.logprobs'"},
      {R"({"custom_id": "v", "method": "POST", "url": "/v1/completions", "body": {"model": "chat", "prompt": [1]}, "extra": 1})" "\n",
       "unknown field 'extra'"},
      {R"({"custom_id": "w", "method": "GET", "url": "/v1/completions", "body": {}})" "\n", "method must be"},
      {R"({"custom_id": "y", "method": "POST", "url": "/v1/chat/completions", "body": {}})" "\n", "url must be"},
      {Line("t", R"({"model": "chat", "prompt": "hi"})"), "has no tokenizer"},
      {Line("v2", R"({"model": "chat", "prompt": [300]})"), "body.prompt[0] must be a token id in [0, 256)"},
      {Line("e", R"({"model": "chat", "prompt": []})"), "body.prompt is empty"},
      {Line("n", R"({"model": "chat", "prompt": [1], "max_tokens": 0})"), "max_tokens must be a positive integer"},
      {Line("f", R"({"model": "chat", "prompt": [1], "max_tokens": 2.5})"), "max_tokens must be a positive integer"},
      {Line("temp", R"({"model": "chat", "prompt": [1], "temperature": 3})"), "temperature must be"},
      {Line("p", R"({"model": "chat", "prompt": [1], "top_p": 0})"), "top_p must be"},
      {Line("s", R"({"model": "chat", "prompt": [1], "seed": -1})"), "seed must be"},
      {Line("st", R"({"model": "chat", "prompt": [1], "stop": [1.5]})"), "body.stop must hold"},
  };
  const std::string good = Line("ok", R"({"model": "chat", "prompt": [1]})");
  for (const Case& c : cases) {
    SCOPED_TRACE(c.line);
    const std::string in = good + c.line + Line("z", R"({"model": "chat", "prompt": [5]})");
    auto lenient = ParseBatchInput(in, Models, /*strict=*/false);
    ASSERT_TRUE(lenient.ok()) << lenient.status();
    EXPECT_EQ(lenient->requests.size(), 2u);
    ASSERT_EQ(lenient->errors.size(), 1u);
    EXPECT_EQ(lenient->errors[0].line, 2);
    EXPECT_THAT(lenient->errors[0].message, HasSubstr("line 2: "));
    EXPECT_THAT(lenient->errors[0].message, HasSubstr(c.want));
    auto strict = ParseBatchInput(in, Models, /*strict=*/true);
    ASSERT_FALSE(strict.ok());
    EXPECT_EQ(strict.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(strict.status().message()), HasSubstr("line 2: "));
    EXPECT_THAT(std::string(strict.status().message()), HasSubstr(c.want));
  }
}

TEST(BatchInputTest, AFileWithoutAValidRequestIsRefusedAndLongReportsAreCut) {
  auto empty = ParseBatchInput("\n\n", Models, false);
  ASSERT_FALSE(empty.ok());
  EXPECT_THAT(std::string(empty.status().message()), HasSubstr("holds no request"));
  std::string bad;
  for (int i = 0; i < 25; ++i) bad += "nope\n";
  auto all_bad = ParseBatchInput(bad, Models, false);
  ASSERT_FALSE(all_bad.ok());
  const std::string msg(all_bad.status().message());
  EXPECT_THAT(msg, HasSubstr("line 20: "));
  EXPECT_THAT(msg, ::testing::Not(HasSubstr("line 21: ")));
  EXPECT_THAT(msg, HasSubstr("... and 5 more bad lines"));
  // CRLF line ends are accepted.
  auto crlf = ParseBatchInput("{\"custom_id\": \"a\", \"method\": \"POST\", \"url\": \"/v1/completions\", "
                              "\"body\": {\"model\": \"chat\", \"prompt\": [1]}}\r\n",
                              Models, true);
  ASSERT_TRUE(crlf.ok()) << crlf.status();
  EXPECT_EQ(crlf->requests.size(), 1u);
}

}  // namespace
}  // namespace slicesched
