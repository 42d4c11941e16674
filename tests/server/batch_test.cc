// Batch jobs end to end in-process on the LibTorch executors: a Master on
// two CPU devices, the BatchManager and BatchRunner, and the Batch gRPC
// service on a unix socket. Every answer must equal the operators called
// directly (GenerateDirect) with the request's seed; a daemon stopped in
// the middle of a batch and started again on the same state directory
// finishes it with every custom_id exactly once and the same tokens; a
// cancelled batch keeps its finished results.
#include <grpcpp/grpcpp.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "slicesched/common/json_parse.h"
#include "slicesched/common/strings.h"
#include "slicesched/executor/kernels/llama_serving.h"
#include "slicesched/jobs/batch_manager.h"
#include "slicesched/jobs/tokenizer.h"
#include "slicesched/server/batch_runner.h"
#include "slicesched/server/batch_service.h"
#include "slicesched/server/config.h"
#include "slicesched/server/master.h"
#include "slicesched/server/services.h"
#include "slicesched/v1/batch.grpc.pb.h"

namespace slicesched {
namespace {

namespace v1 = ::slicesched::v1;
using ::testing::HasSubstr;

constexpr uint64_t kWeightsSeed = 7;

// One daemon: master, batch manager and runner, gRPC server.
struct Daemon {
  std::unique_ptr<Master> master;
  std::unique_ptr<jobs::BatchManager> batches;
  std::unique_ptr<BatchRunner> runner;
  std::unique_ptr<SlicedServer> server;
  std::unique_ptr<v1::Batch::Stub> stub;

  void Stop() {
    if (runner) runner->Stop();
    if (server) server->Shutdown(absl::Seconds(1));
    server.reset();
    if (master) master->Shutdown();
    runner.reset();
    batches.reset();
    master.reset();
  }
  ~Daemon() { Stop(); }
};

// A SentencePiece model with exactly the tiny model's 256 pieces, trained
// once by the library's trainer on pseudo-words from a fixed generator.
std::string TrainTinyTokenizer(const std::string& dir) {
  std::string corpus;
  uint64_t x = 12345;
  for (int line = 0; line < 3000; ++line) {
    for (int w = 0; w < 8; ++w) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      const int len = 2 + static_cast<int>((x >> 60) % 6);
      for (int k = 0; k < len; ++k) corpus += static_cast<char>('a' + (x >> (8 + 5 * k)) % 26);
      corpus += ' ';
    }
    corpus += '\n';
  }
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/corpus.txt") << corpus;
  const absl::Status s = jobs::TrainTokenizer(dir + "/corpus.txt", dir + "/tiny", 256);
  EXPECT_TRUE(s.ok()) << s;
  return dir + "/tiny.model";
}

class BatchTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tokenizer_ = new std::string(
        TrainTinyTokenizer(StrCat(::testing::TempDir(), "/sliced_batch_sp_", ::getpid())));
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(std::filesystem::path(*tokenizer_).parent_path());
    delete tokenizer_;
  }
  static std::string* tokenizer_;

  void SetUp() override {
    static std::atomic<int> counter{0};
    dir_ = StrCat(::testing::TempDir(), "/sliced_batch_", ::getpid(), "_", counter++);
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    auto dims = LlamaPreset("tiny");
    ASSERT_TRUE(dims.ok());
    auto w = executor::LlamaWeights::FromSeed(*dims, kWeightsSeed);
    ASSERT_TRUE(w.ok()) << w.status();
    weights_ = *w;
  }
  void TearDown() { std::filesystem::remove_all(dir_); }

  std::unique_ptr<Daemon> Start(int max_inflight, bool start_runner = true) {
    auto c = ParseSlicedConfig(
        YAML::Load(StrCat("cluster:\n"
                          "  devices: [{name: cpu, count: 2, type: cpu, memory: 256MiB, backend: cpu}]\n"
                          "deployments:\n"
                          "  - {name: chat, model: tiny, weights: {seed: ",
                          kWeightsSeed,
                          "}, role: online, partitions: [single, pp2]}\n"
                          "  - {name: text, model: tiny, weights: {seed: ",
                          kWeightsSeed, "}, role: offline, partitions: [single], tokenizer: ", *tokenizer_, "}\n"
                          "listen: {unix_socket: ",
                          dir_, "/s.sock}\n", "state_dir: ", dir_, "/state\n")),
        "<test>");
    EXPECT_TRUE(c.ok()) << c.status();
    auto d = std::make_unique<Daemon>();
    MasterOptions mo;
    mo.estimator_save_interval = Duration::Seconds(3600);
    auto m = Master::Start(*c, mo);
    EXPECT_TRUE(m.ok()) << m.status();
    d->master = *std::move(m);
    Master* master = d->master.get();
    jobs::BatchManager::Options bo;
    bo.models = [master](std::string_view name) { return BatchModelInfoOf(master, name); };
    auto b = jobs::BatchManager::Open(c->state_dir, bo);
    EXPECT_TRUE(b.ok()) << b.status();
    d->batches = *std::move(b);
    d->runner = std::make_unique<BatchRunner>(master, d->batches.get(),
                                              BatchRunnerOptions{.max_inflight = max_inflight});
    if (start_runner) d->runner->Start();
    ServerOptions so;
    so.unix_socket = c->listen.unix_socket;
    auto s = SlicedServer::Start(master, so, nullptr, d->batches.get(), d->runner.get());
    EXPECT_TRUE(s.ok()) << s.status();
    d->server = *std::move(s);
    d->stub = v1::Batch::NewStub(grpc::CreateChannel("unix:" + so.unix_socket, grpc::InsecureChannelCredentials()));
    return d;
  }

  static grpc::Status Submit(Daemon& d, const std::string& jsonl, v1::SubmitBatchResponse* out,
                             const std::string& window = "", bool strict = false) {
    grpc::ClientContext ctx;
    auto writer = d.stub->Submit(&ctx, out);
    // In two pieces, cut mid-line: the service joins the stream.
    const size_t half = jsonl.size() / 2;
    v1::SubmitBatchChunk first;
    first.set_deployment("chat");
    first.set_strict(strict);
    first.set_completion_window(window);
    first.set_data(jsonl.substr(0, half));
    v1::SubmitBatchChunk second;
    second.set_data(jsonl.substr(half));
    writer->Write(first);
    writer->Write(second);
    writer->WritesDone();
    return writer->Finish();
  }

  // The output file, as custom_id -> line.
  static std::map<std::string, std::string> Results(Daemon& d, uint64_t id, int* lines) {
    grpc::ClientContext ctx;
    v1::BatchResultsRequest req;
    req.set_batch_id(id);
    auto reader = d.stub->Results(&ctx, req);
    v1::BatchResultsChunk chunk;
    std::string all;
    while (reader->Read(&chunk)) all += chunk.data();
    EXPECT_TRUE(reader->Finish().ok());
    std::map<std::string, std::string> out;
    *lines = 0;
    size_t pos = 0;
    while (pos < all.size()) {
      const size_t end = all.find('\n', pos);
      const std::string line = all.substr(pos, end - pos);
      pos = end + 1;
      ++*lines;
      auto json = ParseJson(line);
      EXPECT_TRUE(json.ok()) << line;
      if (!json.ok()) continue;
      const std::string id_s = std::get<std::string>(JsonField(std::get<JsonObject>(json->v), "custom_id")->v);
      EXPECT_FALSE(out.contains(id_s)) << "custom_id " << id_s << " twice";
      out[id_s] = line;
    }
    return out;
  }

  // The token ids of an output line's completion.
  static std::vector<int64_t> Tokens(const std::string& line) {
    std::vector<int64_t> t;
    const size_t at = line.find("\"token_ids\":[");
    if (at == std::string::npos) return t;
    size_t pos = at + 13;
    while (line[pos] != ']') {
      size_t used = 0;
      t.push_back(std::stoll(line.substr(pos), &used));
      pos += used;
      if (line[pos] == ',') ++pos;
    }
    return t;
  }

  // Requests with prompts of 3..8 tokens, some sampled, some with a stop token.
  static std::string Input(int n, std::vector<BatchRequest>* requests) {
    std::string out;
    for (int i = 0; i < n; ++i) {
      BatchRequest r;
      r.custom_id = StrCat("req-", i);
      r.model = "chat";
      for (int k = 0; k < 3 + i % 6; ++k) r.prompt_tokens.push_back((i * 37 + k * 11) % 250 + 1);
      r.max_tokens = 3 + i % 4;
      r.temperature = i % 3 == 0 ? 0.0 : 0.9;
      r.top_p = i % 3 == 2 ? 0.8 : 1.0;
      if (i % 2 == 0) r.seed = 100 + static_cast<uint64_t>(i);
      if (i % 5 == 4) r.stop_tokens = {17};
      std::string prompt;
      for (int64_t t : r.prompt_tokens) prompt += StrCat(prompt.empty() ? "" : ",", t);
      out += StrCat(R"({"custom_id":")", r.custom_id, R"(","method":"POST","url":"/v1/completions","body":{)",
                    R"("prompt":[)", prompt, "],\"max_tokens\":", r.max_tokens, ",\"temperature\":", r.temperature,
                    ",\"top_p\":", r.top_p, r.seed.has_value() ? StrCat(",\"seed\":", *r.seed) : "",
                    r.stop_tokens.empty() ? "" : ",\"stop\":[17]", "}}\n");
      requests->push_back(r);
    }
    return out;
  }

  std::vector<int64_t> Direct(const BatchRequest& r) {
    executor::SamplingParams sp{.temperature = r.temperature, .top_p = r.top_p, .seed = BatchRequestSeed(r)};
    auto t = executor::GenerateDirect(*weights_, r.prompt_tokens, static_cast<int>(r.max_tokens), sp, r.stop_tokens);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? *t : std::vector<int64_t>{};
  }

  // Waits (on the runner's steps, never a sleep) until the batch is over.
  static StoredBatch AwaitOver(Daemon& d, uint64_t id) {
    const absl::Time deadline = absl::Now() + absl::Seconds(300);
    while (true) {
      const uint64_t step = d.runner->steps();
      auto b = d.batches->Get(id);
      EXPECT_TRUE(b.ok());
      if (!b.ok() || jobs::IsTerminalBatchState(b->state) || absl::Now() > deadline) return b.ok() ? *b : StoredBatch{};
      d.runner->AwaitStepAfter(step, absl::Seconds(5));
    }
  }

  std::string dir_;
  std::shared_ptr<const executor::LlamaWeights> weights_;
};
std::string* BatchTest::tokenizer_ = nullptr;

TEST_F(BatchTest, EveryAnswerEqualsDirectComputation) {
  auto d = Start(/*max_inflight=*/4);
  std::vector<BatchRequest> reqs;
  const std::string in = Input(12, &reqs);
  v1::SubmitBatchResponse resp;
  grpc::Status s = Submit(*d, in, &resp, "24h");
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.accepted(), 12);
  EXPECT_EQ(resp.batch().state(), v1::BATCH_STATE_IN_PROGRESS);
  EXPECT_EQ(resp.batch().completion_window_s(), 86400);
  const StoredBatch b = AwaitOver(*d, resp.batch().id());
  EXPECT_EQ(b.state, jobs::kBatchCompleted) << b.message;
  EXPECT_EQ(b.succeeded, 12);
  int lines = 0;
  auto out = Results(*d, b.id, &lines);
  EXPECT_EQ(lines, 12);
  int64_t tokens = 0;
  for (const BatchRequest& r : reqs) {
    ASSERT_TRUE(out.contains(r.custom_id));
    EXPECT_EQ(Tokens(out[r.custom_id]), Direct(r)) << out[r.custom_id];
    tokens += static_cast<int64_t>(Tokens(out[r.custom_id]).size());
  }
  EXPECT_EQ(b.completion_tokens, tokens);
  EXPECT_EQ(d->runner->stats().tokens, static_cast<uint64_t>(tokens));

  grpc::ClientContext ctx;
  v1::GetBatchRequest get;
  get.set_batch_id(b.id);
  v1::BatchJob job;
  ASSERT_TRUE(d->stub->Get(&ctx, get, &job).ok());
  EXPECT_EQ(job.state(), v1::BATCH_STATE_COMPLETED);
  EXPECT_EQ(job.eta_s(), -1);
  EXPECT_GT(job.tokens_per_second(), 0);
}

TEST_F(BatchTest, TextPromptsAreEncodedAndAnswersDecoded) {
  auto d = Start(/*max_inflight=*/4);
  auto tok = jobs::Tokenizer::Load(*tokenizer_);
  ASSERT_TRUE(tok.ok()) << tok.status();
  const std::vector<std::string> prompts = {"abc defg hij", "qrs tuv", "mno pqrst uvw xyz"};
  std::string in;
  for (size_t i = 0; i < prompts.size(); ++i) {
    in += StrCat(R"({"custom_id":"t)", i, R"(","method":"POST","url":"/v1/completions","body":{"model":"text",)",
                 R"("prompt":")", prompts[i], R"(","max_tokens":6,"temperature":0}})", "\n");
  }
  grpc::ClientContext ctx;
  v1::SubmitBatchResponse resp;
  auto writer = d->stub->Submit(&ctx, &resp);
  v1::SubmitBatchChunk chunk;
  chunk.set_data(in);
  writer->Write(chunk);
  writer->WritesDone();
  const grpc::Status s = writer->Finish();
  ASSERT_TRUE(s.ok()) << s.error_message();
  const StoredBatch b = AwaitOver(*d, resp.batch().id());
  EXPECT_EQ(b.state, jobs::kBatchCompleted) << b.message;
  int lines = 0;
  auto out = Results(*d, b.id, &lines);
  ASSERT_EQ(lines, 3);
  for (size_t i = 0; i < prompts.size(); ++i) {
    BatchRequest r;
    r.custom_id = StrCat("t", i);
    r.prompt_tokens = *(*tok)->Encode(prompts[i]);
    r.max_tokens = 6;
    r.temperature = 0;
    const std::vector<int64_t> want = Direct(r);
    const std::string& line = out[r.custom_id];
    EXPECT_EQ(Tokens(line), want) << line;
    auto json = ParseJson(line);
    ASSERT_TRUE(json.ok());
    const auto& body = std::get<JsonObject>(
        JsonField(std::get<JsonObject>(JsonField(std::get<JsonObject>(json->v), "response")->v), "body")->v);
    const auto& choice = std::get<JsonObject>(std::get<JsonArray>(JsonField(body, "choices")->v)[0].v);
    EXPECT_EQ(std::get<std::string>(JsonField(choice, "text")->v), *(*tok)->Decode(want)) << line;
    EXPECT_EQ(std::get<JsonNumber>(std::get<JsonObject>(JsonField(body, "usage")->v)[0].second.v).text,
              std::to_string(r.prompt_tokens.size()));
  }
}

TEST_F(BatchTest, AStoppedDaemonFinishesTheBatchAfterARestartWithEveryCustomIdOnce) {
  std::vector<BatchRequest> reqs;
  const std::string in = Input(16, &reqs);
  uint64_t id = 0;
  {
    auto d = Start(/*max_inflight=*/3, /*start_runner=*/false);
    v1::SubmitBatchResponse resp;
    ASSERT_TRUE(Submit(*d, in, &resp).ok());
    id = resp.batch().id();
    // Step by hand until a few results are stored and more are in flight,
    // then stop the daemon in the middle of the batch.
    const absl::Time deadline = absl::Now() + absl::Seconds(120);
    while (d->batches->Get(id)->succeeded < 5 && absl::Now() < deadline) {
      const uint64_t step = d->runner->steps();
      ASSERT_TRUE(d->runner->Step().ok());
      d->runner->AwaitStepAfter(step + 1, absl::Milliseconds(20));  // a bounded wait between steps
    }
    ASSERT_GE(d->batches->Get(id)->succeeded, 5);
    EXPECT_GT(d->runner->stats().in_flight, 0u);
    d->Stop();
  }
  auto d = Start(/*max_inflight=*/3);
  const StoredBatch b = AwaitOver(*d, id);
  EXPECT_EQ(b.state, jobs::kBatchCompleted) << b.message;
  EXPECT_EQ(b.succeeded, 16);
  int lines = 0;
  auto out = Results(*d, id, &lines);
  EXPECT_EQ(lines, 16);
  for (const BatchRequest& r : reqs) {
    ASSERT_TRUE(out.contains(r.custom_id));
    EXPECT_EQ(Tokens(out[r.custom_id]), Direct(r)) << r.custom_id;
  }
}

TEST_F(BatchTest, CancelKeepsFinishedResultsAndBadInputIsRefusedByLine) {
  auto d = Start(/*max_inflight=*/1, /*start_runner=*/false);
  std::vector<BatchRequest> reqs;
  const std::string in = Input(6, &reqs);
  v1::SubmitBatchResponse resp;
  ASSERT_TRUE(Submit(*d, in, &resp).ok());
  const uint64_t id = resp.batch().id();
  const absl::Time deadline = absl::Now() + absl::Seconds(120);
  while (d->batches->Get(id)->succeeded < 2 && absl::Now() < deadline) {
    const uint64_t step = d->runner->steps();
    ASSERT_TRUE(d->runner->Step().ok());
    d->runner->AwaitStepAfter(step + 1, absl::Milliseconds(20));
  }
  grpc::ClientContext ctx;
  v1::CancelBatchRequest cancel;
  cancel.set_batch_id(id);
  v1::BatchJob job;
  ASSERT_TRUE(d->stub->Cancel(&ctx, cancel, &job).ok());
  EXPECT_EQ(job.state(), v1::BATCH_STATE_CANCELLED);
  ASSERT_TRUE(d->runner->Step().ok());  // cancels the request in flight
  EXPECT_EQ(d->runner->stats().in_flight, 0u);
  int lines = 0;
  auto out = Results(*d, id, &lines);
  EXPECT_EQ(lines, 6);
  int kept = 0;
  for (const BatchRequest& r : reqs) {
    if (out[r.custom_id].find("batch_cancelled") != std::string::npos) continue;
    EXPECT_EQ(Tokens(out[r.custom_id]), Direct(r)) << r.custom_id;
    ++kept;
  }
  EXPECT_EQ(kept, job.succeeded());
  EXPECT_GE(kept, 2);

  // --strict with a bad line: INVALID_ARGUMENT naming it, nothing stored.
  v1::SubmitBatchResponse bad;
  grpc::Status s = Submit(*d, in + "{\"custom_id\": \"x\"}\n", &bad, "", /*strict=*/true);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("line 7:"));
  EXPECT_EQ(d->batches->List()->size(), 1u);
}

}  // namespace
}  // namespace slicesched
