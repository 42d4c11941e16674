// The durable batch lifecycle (jobs/batch_manager.h) on a real SQLite state
// store with an injected clock: submit stores all or nothing, results are
// stored once and counted, cancel keeps finished results, the output file
// lists every custom_id once when the batch is over, and a second manager on
// the same directory (a restarted daemon) sees exactly what was stored.
#include "slicesched/jobs/batch_manager.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>

#include "slicesched/common/json_parse.h"
#include "slicesched/common/strings.h"

namespace slicesched::jobs {
namespace {

using ::testing::HasSubstr;

std::optional<BatchModelInfo> Models(std::string_view name) {
  if (name == "chat") return BatchModelInfo{.vocab = 256, .max_context_tokens = 64, .has_tokenizer = false};
  if (name == "other") return BatchModelInfo{.vocab = 256, .max_context_tokens = 64, .has_tokenizer = false};
  return std::nullopt;
}

std::string Line(const std::string& id, const std::string& body) {
  return StrCat(R"({"custom_id": ")", id, R"(", "method": "POST", "url": "/v1/completions", "body": )", body, "}\n");
}

class BatchManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    dir_ = StrCat(::testing::TempDir(), "/batch_mgr_", ::getpid(), "_", counter++);
    std::filesystem::remove_all(dir_);
    manager_ = Open();
  }
  void TearDown() override {
    manager_.reset();
    std::filesystem::remove_all(dir_);
  }
  std::unique_ptr<BatchManager> Open() {
    BatchManager::Options o;
    o.models = Models;
    o.now_unix_ms = [this] { return now_ms_.load(); };
    auto m = BatchManager::Open(dir_, o);
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? *std::move(m) : nullptr;
  }
  static StoredBatchResult Ok(int64_t index, int64_t tokens) {
    BatchRequest req;
    req.model = "chat";
    req.prompt_tokens = {1, 2};
    CompletionResult c;
    c.tokens.assign(static_cast<size_t>(tokens), 5);
    c.finish_reason = "length";
    c.request_id = StrCat("r", index);
    return StoredBatchResult{.index = index, .ok = true, .body_json = CompletionBody(req, c), .prompt_tokens = 2,
                             .completion_tokens = tokens};
  }

  std::string dir_;
  std::atomic<int64_t> now_ms_{1'000'000};
  std::unique_ptr<BatchManager> manager_;
};

TEST_F(BatchManagerTest, SubmitStoresEveryAcceptedRequestInOrder) {
  const std::string in = Line("a", R"({"model": "chat", "prompt": [1, 2], "max_tokens": 3, "seed": 9})") +
                         Line("b", R"({"prompt": [4], "temperature": 0.5, "stop": [7]})");
  auto r = manager_->Submit({.jsonl = in, .deployment = "chat", .completion_window = "2h"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->accepted, 2);
  EXPECT_TRUE(r->rejected.empty());
  auto b = manager_->Get(r->batch_id);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->state, kBatchInProgress);
  EXPECT_EQ(b->total, 2);
  EXPECT_EQ(b->deployment, "chat");
  EXPECT_EQ(b->completion_window_s, 7200);
  EXPECT_EQ(b->deadline_unix_ms, 1'000'000 + 7'200'000);
  auto pending = manager_->Pending(r->batch_id, -1, 10);
  ASSERT_TRUE(pending.ok()) << pending.status();
  ASSERT_EQ(pending->size(), 2u);
  EXPECT_EQ((*pending)[1].line, 2);
  EXPECT_EQ((*pending)[1].custom_id, "b");
  auto req = DecodeBatchRequest((*pending)[1].request_json);
  ASSERT_TRUE(req.ok()) << req.status();
  EXPECT_EQ(req->model, "chat");  // the batch's deployment
  EXPECT_EQ(req->prompt_tokens, std::vector<int64_t>{4});
  EXPECT_EQ(req->temperature, 0.5);
  EXPECT_EQ(req->stop_tokens, std::vector<int64_t>{7});
  auto a = DecodeBatchRequest((*pending)[0].request_json);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(BatchRequestSeed(*a), 9u);
  EXPECT_EQ(BatchRequestSeed(*req), BatchRequestSeed(*req));  // derived from custom_id
  EXPECT_NE(BatchRequestSeed(*req), 0u);
}

TEST_F(BatchManagerTest, RefusedSubmitLeavesNothingAndNonStrictListsBadLines) {
  const std::string in = Line("a", R"({"prompt": [1]})") + "{not json\n" + Line("c", R"({"model": "other", "prompt": [1]})");
  auto strict = manager_->Submit({.jsonl = in, .deployment = "chat", .strict = true});
  ASSERT_FALSE(strict.ok());
  EXPECT_THAT(std::string(strict.status().message()), HasSubstr("line 2:"));
  EXPECT_THAT(std::string(strict.status().message()), HasSubstr("line 3: body.model 'other' is not the batch's"));
  EXPECT_TRUE(manager_->List()->empty());

  auto window = manager_->Submit({.jsonl = in, .completion_window = "24x"});
  ASSERT_FALSE(window.ok());
  EXPECT_THAT(std::string(window.status().message()), HasSubstr("completion_window '24x'"));
  auto unknown = manager_->Submit({.jsonl = in, .deployment = "nope"});
  EXPECT_TRUE(absl::IsNotFound(unknown.status())) << unknown.status();
  auto check = manager_->Submit({.jsonl = in, .deployment = "chat", .validate_only = true});
  ASSERT_TRUE(check.ok());
  EXPECT_EQ(check->batch_id, 0u);
  EXPECT_TRUE(manager_->List()->empty());

  auto loose = manager_->Submit({.jsonl = in, .deployment = "chat"});
  ASSERT_TRUE(loose.ok()) << loose.status();
  EXPECT_EQ(loose->accepted, 1);
  ASSERT_EQ(loose->rejected.size(), 2u);
  EXPECT_EQ(loose->rejected[0].line, 2);
  auto b = manager_->Get(loose->batch_id);
  EXPECT_EQ(b->rejected, 2);
  EXPECT_THAT(b->message, HasSubstr("line 3:"));
}

TEST_F(BatchManagerTest, ResultsAreStoredOnceAndTheOutputListsEachCustomIdOnce) {
  std::string in;
  for (int i = 0; i < 5; ++i) in += Line(StrCat("q", i), R"({"prompt": [1, 2], "max_tokens": 4})");
  auto r = manager_->Submit({.jsonl = in, .deployment = "chat"});
  ASSERT_TRUE(r.ok()) << r.status();
  const uint64_t id = r->batch_id;
  ASSERT_TRUE(manager_->Record(id, Ok(1, 4)).ok());
  ASSERT_TRUE(manager_->Record(id, Ok(3, 2)).ok());
  EXPECT_TRUE(absl::IsAlreadyExists(manager_->Record(id, Ok(3, 2))));
  EXPECT_TRUE(absl::IsNotFound(manager_->Record(id, Ok(9, 2))));
  ASSERT_TRUE(manager_->Record(id, StoredBatchResult{.index = 4, .ok = false,
                                                     .body_json = BatchErrorBody("generation_failed", "boom")})
                  .ok());
  auto b = manager_->Get(id);
  EXPECT_EQ(b->succeeded, 2);
  EXPECT_EQ(b->failed, 1);
  EXPECT_EQ(b->completion_tokens, 6);
  EXPECT_EQ(b->prompt_tokens, 4);
  auto pending = manager_->Pending(id, -1, 10);
  ASSERT_EQ(pending->size(), 2u);  // q0 and q2
  EXPECT_EQ((*pending)[0].index, 0);
  EXPECT_EQ((*pending)[1].index, 2);

  // A restarted daemon (another manager on the directory) sees the same.
  auto again = Open();
  EXPECT_EQ(again->Pending(id, -1, 10)->size(), 2u);
  EXPECT_EQ(again->Get(id)->succeeded, 2);

  // While in progress, only finished requests are listed.
  int64_t next = 0;
  bool more = true;
  auto lines = manager_->ResultLines(id, -1, 100, &next, &more);
  ASSERT_TRUE(lines.ok()) << lines.status();
  EXPECT_EQ(lines->size(), 3u);
  EXPECT_FALSE(more);

  // Cancel keeps the finished results; a late result is dropped.
  now_ms_ += 5000;
  auto cancelled = manager_->Cancel(id, "enough");
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->state, kBatchCancelled);
  EXPECT_EQ(cancelled->finished_unix_ms, now_ms_.load());
  EXPECT_TRUE(absl::IsFailedPrecondition(manager_->Record(id, Ok(0, 1))));
  EXPECT_EQ(manager_->Cancel(id)->state, kBatchCancelled);  // idempotent
  EXPECT_FALSE(manager_->Finish(id, kBatchCompleted, "").ok());

  // Over: every custom_id exactly once, in input order, the unfinished ones
  // with an error, in pages.
  std::vector<std::string> all;
  int64_t after = -1;
  do {
    auto page = manager_->ResultLines(id, after, 2, &after, &more);
    ASSERT_TRUE(page.ok()) << page.status();
    all.insert(all.end(), page->begin(), page->end());
  } while (more);
  ASSERT_EQ(all.size(), 5u);
  for (int i = 0; i < 5; ++i) {
    auto json = ParseJson(all[static_cast<size_t>(i)]);
    ASSERT_TRUE(json.ok()) << all[static_cast<size_t>(i)];
    const auto& o = std::get<JsonObject>(json->v);
    EXPECT_EQ(std::get<std::string>(JsonField(o, "custom_id")->v), StrCat("q", i));
    const bool has_response = !std::holds_alternative<std::nullptr_t>(JsonField(o, "response")->v);
    const bool has_error = !std::holds_alternative<std::nullptr_t>(JsonField(o, "error")->v);
    EXPECT_NE(has_response, has_error) << all[static_cast<size_t>(i)];
    EXPECT_EQ(has_response, i == 1 || i == 3) << all[static_cast<size_t>(i)];
  }
  EXPECT_THAT(all[0], HasSubstr(R"("code":"batch_cancelled")"));
  EXPECT_THAT(all[4], HasSubstr(R"("code":"generation_failed")"));
  EXPECT_THAT(all[1], HasSubstr(R"("token_ids":[5,5,5,5])"));
  EXPECT_THAT(all[1], HasSubstr(R"("usage":{"prompt_tokens":2,"completion_tokens":4,"total_tokens":6})"));
}

TEST_F(BatchManagerTest, ActiveIsEarliestDeadlineFirstAndFinishIsChecked) {
  const std::string in = Line("a", R"({"prompt": [1]})");
  const uint64_t none = manager_->Submit({.jsonl = in, .deployment = "chat"})->batch_id;
  const uint64_t late = manager_->Submit({.jsonl = in, .deployment = "chat", .completion_window = "2d"})->batch_id;
  const uint64_t soon = manager_->Submit({.jsonl = in, .deployment = "chat", .completion_window = "90m"})->batch_id;
  auto active = manager_->Active();
  ASSERT_EQ(active->size(), 3u);
  EXPECT_EQ((*active)[0].id, soon);
  EXPECT_EQ((*active)[1].id, late);
  EXPECT_EQ((*active)[2].id, none);
  EXPECT_FALSE(manager_->Finish(soon, "running", "").ok());
  auto expired = manager_->Finish(soon, kBatchExpired, "window passed");
  ASSERT_TRUE(expired.ok()) << expired.status();
  EXPECT_EQ(expired->state, kBatchExpired);
  EXPECT_EQ(manager_->Active()->size(), 2u);
  EXPECT_EQ(manager_->List({.states = {std::string(kBatchExpired)}})->size(), 1u);
  auto p = ProgressOf(*manager_->Get(none), now_ms_.load() + 1000);
  EXPECT_EQ(p.done, 0);
  EXPECT_EQ(p.eta_s, -1);
}

TEST(CompletionWindowTest, ParsesUnitsAndRejectsTheRest) {
  EXPECT_EQ(*ParseCompletionWindow(""), 0);
  EXPECT_EQ(*ParseCompletionWindow("24h"), 86400);
  EXPECT_EQ(*ParseCompletionWindow("90m"), 5400);
  EXPECT_EQ(*ParseCompletionWindow("3600s"), 3600);
  EXPECT_EQ(*ParseCompletionWindow("2d"), 172800);
  for (const char* bad : {"h", "0h", "-1h", "24", "31d", "1.5h", "24 h", "99999999999999999999s"}) {
    EXPECT_FALSE(ParseCompletionWindow(bad).ok()) << bad;
  }
}

TEST(BatchRequestCodecTest, RoundTripsEveryField) {
  BatchRequest r;
  r.custom_id = "x\"y";
  r.model = "chat";
  r.prompt_tokens = {1, 2, 3};
  r.max_tokens = 7;
  r.temperature = 0.7;
  r.top_p = 0.95;
  r.seed = 18446744073709551615ull;
  r.stop_tokens = {4};
  auto back = DecodeBatchRequest(EncodeBatchRequest(r));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->custom_id, r.custom_id);
  EXPECT_EQ(back->prompt_tokens, r.prompt_tokens);
  EXPECT_EQ(back->max_tokens, 7);
  EXPECT_EQ(back->temperature, 0.7);
  EXPECT_EQ(back->top_p, 0.95);
  EXPECT_EQ(back->seed, r.seed);
  EXPECT_EQ(back->stop_tokens, r.stop_tokens);
  BatchRequest t = r;
  t.prompt_tokens.clear();
  t.prompt_text = "hello";
  t.stop_text = {"\n"};
  auto text = DecodeBatchRequest(EncodeBatchRequest(t));
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(text->prompt_text, "hello");
  EXPECT_EQ(text->stop_text, t.stop_text);
  EXPECT_TRUE(absl::IsDataLoss(DecodeBatchRequest("{}").status()));
  EXPECT_TRUE(absl::IsDataLoss(DecodeBatchRequest("[").status()));
}

}  // namespace
}  // namespace slicesched::jobs
