// Serving.Generate on the LibTorch backend, end to end in-process: a Master
// on two CPU devices plus the gRPC services on a unix socket. The streamed
// tokens must equal the operators called directly with the same weights and
// seeds; bad requests are refused with errors naming the field; a client
// that goes away has its request cancelled and its KV cache freed.
#include <grpcpp/grpcpp.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "slicesched/common/strings.h"
#include "slicesched/executor/kernels/llama_serving.h"
#include "cuda_or_skip.h"
#include "slicesched/server/config.h"
#include "slicesched/server/master.h"
#include "slicesched/server/services.h"
#include "slicesched/v1/serving.grpc.pb.h"

namespace slicesched {
namespace {

namespace v1 = ::slicesched::v1;

std::string UniqueDir(const std::string& name) {
  static std::atomic<int> counter{0};
  std::string dir = StrCat(::testing::TempDir(), "/sliced_gen_", name, "_", ::getpid(), "_", counter++);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

constexpr uint64_t kWeightsSeed = 7;

class GenerateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = UniqueDir("t");
    auto c = ParseSlicedConfig(
        YAML::Load(StrCat("cluster:\n"
                          "  devices: [", devices_yaml_, "]\n"
                          "deployments:\n"
                          "  - {name: chat, model: tiny, weights: {seed: ", kWeightsSeed,
                          "}, role: online, partitions: [single, pp2]}\n"
                          "listen: {unix_socket: ", dir_, "/s.sock}\n",
                          "state_dir: ", dir_, "/state\n", extra_yaml_)),
        "<test>");
    ASSERT_TRUE(c.ok()) << c.status();
    MasterOptions mo;
    mo.estimator_save_interval = Duration::Seconds(3600);
    auto m = Master::Start(*c, mo);
    ASSERT_TRUE(m.ok()) << m.status();
    master_ = *std::move(m);
    ServerOptions so;
    so.unix_socket = c->listen.unix_socket;
    auto s = SlicedServer::Start(master_.get(), so);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
    serving_ = v1::Serving::NewStub(grpc::CreateChannel("unix:" + so.unix_socket, grpc::InsecureChannelCredentials()));
    auto dims = LlamaPreset("tiny");
    ASSERT_TRUE(dims.ok());
    auto w = executor::LlamaWeights::FromSeed(*dims, kWeightsSeed);
    ASSERT_TRUE(w.ok()) << w.status();
    weights_ = *w;
  }
  void TearDown() override {
    if (server_) server_->Shutdown(absl::Seconds(1));
    server_.reset();
    if (master_) master_->Shutdown();
  }

  struct Stream {
    grpc::Status status;
    std::vector<v1::GenerateResponse> messages;
    std::vector<int64_t> tokens() const {
      std::vector<int64_t> t;
      for (const auto& m : messages) t.push_back(m.token_id());
      return t;
    }
  };
  Stream Generate(const v1::GenerateRequest& req) {
    grpc::ClientContext ctx;
    Stream out;
    auto reader = serving_->Generate(&ctx, req);
    v1::GenerateResponse m;
    while (reader->Read(&m)) out.messages.push_back(m);
    out.status = reader->Finish();
    return out;
  }
  static v1::GenerateRequest Request(std::vector<uint32_t> prompt, uint32_t max_tokens) {
    v1::GenerateRequest r;
    r.set_deployment("chat");
    for (uint32_t t : prompt) r.add_prompt_token_ids(t);
    r.set_max_tokens(max_tokens);
    return r;
  }
  // Every request on its own client thread at once.
  std::vector<Stream> GenerateConcurrently(const std::vector<v1::GenerateRequest>& reqs) {
    std::vector<Stream> got(reqs.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < reqs.size(); ++i) threads.emplace_back([&, i] { got[i] = Generate(reqs[i]); });
    for (auto& t : threads) t.join();
    return got;
  }
  // No KV cache or activation is left on any device.
  void ExpectDevicesHoldNoRequestMemory() {
    auto devices = master_->Devices();
    ASSERT_TRUE(devices.ok());
    for (const DeviceInfo& d : *devices) {
      EXPECT_EQ(d.memory.checkpoints, Bytes(0)) << d.spec.name;
      EXPECT_EQ(d.memory.activations, Bytes(0)) << d.spec.name;
    }
  }
  std::vector<int64_t> Direct(const v1::GenerateRequest& r) {
    std::vector<int64_t> prompt(r.prompt_token_ids().begin(), r.prompt_token_ids().end());
    std::vector<int64_t> stop(r.stop_token_ids().begin(), r.stop_token_ids().end());
    executor::SamplingParams sp{.temperature = r.sampling().temperature(),
                                .top_p = r.sampling().top_p() == 0 ? 1.0 : r.sampling().top_p(),
                                .seed = r.sampling().seed(),
                                .top_k = r.sampling().top_k()};
    auto t = executor::GenerateDirect(*weights_, prompt, static_cast<int>(r.max_tokens()), sp, stop);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? *t : std::vector<int64_t>{};
  }

  std::string devices_yaml_ = "{name: cpu, count: 2, type: cpu, memory: 256MiB, backend: cpu}";
  std::string extra_yaml_;  // appended to the config
  std::string dir_;
  std::unique_ptr<Master> master_;
  std::unique_ptr<SlicedServer> server_;
  std::unique_ptr<v1::Serving::Stub> serving_;
  std::shared_ptr<const executor::LlamaWeights> weights_;
};

TEST_F(GenerateTest, ConcurrentStreamsEqualDirectComputation) {
  std::vector<v1::GenerateRequest> reqs;
  for (uint32_t i = 0; i < 8; ++i) {
    v1::GenerateRequest r = Request({1 + i, 17, 3 * i + 2, 200 - i}, 5 + i % 3);
    if (i % 2 == 1) {  // nucleus sampling with an explicit seed
      r.mutable_sampling()->set_temperature(1.0f);
      r.mutable_sampling()->set_top_p(0.9f);
      r.mutable_sampling()->set_seed(1000 + i);
      if (i % 4 == 1) r.mutable_sampling()->set_top_k(8);
    }
    if (i % 4 == 3) r.set_priority_class(v1::PRIORITY_CLASS_OFFLINE);
    reqs.push_back(r);
  }
  std::vector<Stream> got(reqs.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < reqs.size(); ++i) threads.emplace_back([&, i] { got[i] = Generate(reqs[i]); });
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < reqs.size(); ++i) {
    SCOPED_TRACE(i);
    ASSERT_TRUE(got[i].status.ok()) << got[i].status.error_message();
    EXPECT_EQ(got[i].tokens(), Direct(reqs[i]));
    ASSERT_EQ(got[i].messages.size(), reqs[i].max_tokens());
    for (size_t k = 0; k < got[i].messages.size(); ++k) {
      const v1::GenerateResponse& m = got[i].messages[k];
      EXPECT_EQ(m.index(), k);
      EXPECT_EQ(m.request_id(), got[i].messages[0].request_id());
      EXPECT_EQ(m.finish_reason(), k + 1 == got[i].messages.size() ? v1::FINISH_REASON_LENGTH
                                                                    : v1::FINISH_REASON_UNSPECIFIED);
      if (k > 0) {
        EXPECT_GE(m.time_from_arrival_ms(), got[i].messages[k - 1].time_from_arrival_ms());
      }
    }
    EXPECT_GE(got[i].messages[0].queue_ms(), 0.0);
  }
  // Every KV cache was released when its request ended.
  auto devices = master_->Devices();
  ASSERT_TRUE(devices.ok());
  double offline_busy = 0;
  for (const DeviceInfo& d : *devices) {
    offline_busy += d.busy_fraction_offline;
    EXPECT_LE(d.busy_fraction_offline, d.busy_fraction) << d.spec.name;
  }
  EXPECT_GT(offline_busy, 0.0) << "two of the requests were offline";
  for (const DeviceInfo& d : *devices) {
    EXPECT_EQ(d.backend_used, "cpu (LibTorch)");
    EXPECT_EQ(d.memory.checkpoints, Bytes(0)) << d.spec.name;
    EXPECT_EQ(d.memory.activations, Bytes(0)) << d.spec.name;
  }
}

// With small pieces configured, prompts are prefilled in pieces (online 13
// tokens: pieces of 5, 4, 4; offline 9: 5, 4) that the scheduler may put on
// either device; the streams are still the direct computation's.
class ChunkedGenerateTest : public GenerateTest {
 protected:
  ChunkedGenerateTest() { extra_yaml_ = "scheduler: {prefill_chunk_tokens: 4, offline_prefill_chunk_tokens: 4}\n"; }

  // Three prompts at once (online 13 tokens, offline 9 with seeded
  // sampling, online 2): each stream equals the direct computation, and no
  // request memory is left on any device afterwards.
  void ExpectMixedStreamsEqualDirect() {
    std::vector<v1::GenerateRequest> reqs = {Request({5, 9, 11, 2, 7, 3, 19, 23, 1, 4, 8, 6, 12}, 6),
                                             Request({3, 1, 4, 1, 5, 9, 2, 6, 5}, 4), Request({42, 43}, 3)};
    reqs[1].set_priority_class(v1::PRIORITY_CLASS_OFFLINE);
    reqs[1].mutable_sampling()->set_temperature(1.0f);
    reqs[1].mutable_sampling()->set_seed(77);
    const std::vector<Stream> got = GenerateConcurrently(reqs);
    for (size_t i = 0; i < reqs.size(); ++i) {
      SCOPED_TRACE(i);
      ASSERT_TRUE(got[i].status.ok()) << got[i].status.error_message();
      EXPECT_EQ(got[i].tokens(), Direct(reqs[i]));
    }
    ExpectDevicesHoldNoRequestMemory();
  }
};

TEST_F(ChunkedGenerateTest, PrefillInPiecesEqualsDirectComputation) { ExpectMixedStreamsEqualDirect(); }

// The same daemon on two logical CUDA devices sharing GPU 0 (f32 weights):
// the streams equal the direct computation on the CPU. Skipped without a
// usable GPU (tools/gpu-check runs it on one).
class CudaGenerateTest : public ChunkedGenerateTest {
 protected:
  CudaGenerateTest() {
    devices_yaml_ = "{name: gpu, count: 2, type: H100, memory: 4GiB, backend: cuda, device: [0, 0]}";
  }
  void SetUp() override {
    SLICESCHED_CUDA_OR_SKIP(0);
    ChunkedGenerateTest::SetUp();
  }
};

TEST_F(CudaGenerateTest, StreamsEqualTheCpuComputation) {
  ExpectMixedStreamsEqualDirect();
  auto devices = master_->Devices();
  ASSERT_TRUE(devices.ok());
  for (const DeviceInfo& d : *devices) EXPECT_EQ(d.backend_used, "cuda (LibTorch)");
}

TEST(SchedulerConfigTest, PrefillChunkTokensMustNotBeNegative) {
  auto c = ParseSlicedConfig(YAML::Load("cluster:\n"
                                        "  devices: [{name: cpu, count: 1, type: cpu, memory: 256MiB, backend: cpu}]\n"
                                        "scheduler: {prefill_chunk_tokens: -1}\n"),
                             "<test>");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), ::testing::HasSubstr("prefill_chunk_tokens"));
  EXPECT_THAT(std::string(c.status().message()), ::testing::HasSubstr("must be >= 0"));
}

TEST_F(GenerateTest, StopTokenEndsTheStream) {
  v1::GenerateRequest r = Request({5, 6, 7}, 8);
  const std::vector<int64_t> full = Direct(r);
  ASSERT_EQ(full.size(), 8u);
  r.add_stop_token_ids(static_cast<uint32_t>(full[2]));
  const std::vector<int64_t> want = Direct(r);  // stops at the first occurrence
  ASSERT_LE(want.size(), 3u);
  Stream s = Generate(r);
  ASSERT_TRUE(s.status.ok()) << s.status.error_message();
  EXPECT_EQ(s.tokens(), want);
  EXPECT_EQ(s.messages.back().finish_reason(), v1::FINISH_REASON_STOP);
}

TEST_F(GenerateTest, BadRequestsNameTheField) {
  struct Case {
    v1::GenerateRequest req;
    grpc::StatusCode code;
    std::string mention;
  };
  std::vector<Case> cases;
  {
    v1::GenerateRequest r = Request({1}, 2);
    r.set_deployment("nope");
    cases.push_back({r, grpc::StatusCode::NOT_FOUND, "deployment"});
  }
  cases.push_back({Request({}, 2), grpc::StatusCode::INVALID_ARGUMENT, "prompt_token_ids"});
  cases.push_back({Request({1, 256}, 2), grpc::StatusCode::INVALID_ARGUMENT, "prompt_token_ids[1]"});
  cases.push_back({Request({1}, 0), grpc::StatusCode::INVALID_ARGUMENT, "max_tokens"});
  {
    v1::GenerateRequest r = Request({1}, 2);
    r.mutable_sampling()->set_top_p(1.5f);
    cases.push_back({r, grpc::StatusCode::INVALID_ARGUMENT, "sampling.top_p"});
  }
  {
    v1::GenerateRequest r = Request({1}, 2);
    r.set_priority_class(static_cast<v1::PriorityClass>(42));
    cases.push_back({r, grpc::StatusCode::INVALID_ARGUMENT, "priority_class"});
  }
  // 1 KiB of KV per token: a million tokens over two devices of 256 MiB.
  cases.push_back({Request({1}, 1000000), grpc::StatusCode::RESOURCE_EXHAUSTED, "KV cache"});
  for (const Case& c : cases) {
    Stream s = Generate(c.req);
    SCOPED_TRACE(c.mention);
    EXPECT_EQ(s.status.error_code(), c.code) << s.status.error_message();
    EXPECT_NE(s.status.error_message().find(c.mention), std::string::npos) << s.status.error_message();
    EXPECT_TRUE(s.messages.empty());
  }
  // Nothing was left behind, and the daemon still serves.
  auto live = master_->LiveGenerations();
  ASSERT_TRUE(live.ok());
  EXPECT_EQ(*live, 0u);
  v1::GenerateRequest ok = Request({9, 8, 7}, 3);
  Stream s = Generate(ok);
  ASSERT_TRUE(s.status.ok()) << s.status.error_message();
  EXPECT_EQ(s.tokens(), Direct(ok));
}

TEST_F(GenerateTest, ClientThatGoesAwayIsCancelledAndItsMemoryFreed) {
  v1::GenerateRequest r = Request({3, 1, 4, 1, 5}, 100000);
  grpc::ClientContext ctx;
  auto reader = serving_->Generate(&ctx, r);
  v1::GenerateResponse m;
  ASSERT_TRUE(reader->Read(&m));  // the first token: the request is running
  EXPECT_EQ(m.index(), 0u);
  ctx.TryCancel();
  while (reader->Read(&m)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  // Drain waits (bounded) for every instance to retire: the cancelled
  // request's current step among them.
  auto drained = master_->Drain(/*wait=*/true, absl::Seconds(60));
  ASSERT_TRUE(drained.ok()) << drained.status();
  EXPECT_EQ(drained->remaining_instances, 0u);
  auto live = master_->LiveGenerations();
  ASSERT_TRUE(live.ok());
  EXPECT_EQ(*live, 0u);
  ExpectDevicesHoldNoRequestMemory();
}

TEST_F(GenerateTest, RawSubmitRunsOnTheExecutors) {
  SubmitArgs a;
  a.template_name = "chat/prefill";
  a.bindings = {{"B", 2}, {"S", 3}};
  auto sub = master_->Submit(a);
  ASSERT_TRUE(sub.ok()) << sub.status();
  auto rec = master_->FindInstance(sub->instance_id);
  ASSERT_TRUE(rec.ok());
  bool closed = false;
  std::vector<InstanceUpdate> all;
  while (!closed) {
    auto more = (*rec)->WaitFrom(all.size(), absl::Seconds(60), &closed);
    if (more.empty() && !closed) break;  // 60 s without progress
    all.insert(all.end(), more.begin(), more.end());
  }
  ASSERT_FALSE(all.empty());
  EXPECT_EQ(all.back().state, InstanceState::kDone) << all.back().message;
}

}  // namespace
}  // namespace slicesched
