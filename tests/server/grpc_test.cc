// The generated service stubs link and work end to end: an in-process gRPC
// server on a unix socket with trivial Admin and Serving implementations,
// called through the generated stubs (unary, server streaming, metadata).
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>

#include "slicesched/v1/admin.grpc.pb.h"
#include "slicesched/v1/finetune.grpc.pb.h"
#include "slicesched/v1/serving.grpc.pb.h"

namespace slicesched {
namespace {

namespace v1 = ::slicesched::v1;

class FakeAdmin final : public v1::Admin::Service {
 public:
  grpc::Status Status(grpc::ServerContext* ctx, const v1::StatusRequest*, v1::StatusResponse* out) override {
    auto it = ctx->client_metadata().find("authorization");
    if (it == ctx->client_metadata().end() || it->second != "Bearer token") {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "missing admin token");
    }
    out->set_version("test");
    out->set_state(v1::SERVING_STATE_SERVING);
    out->set_num_devices(4);
    out->add_deployments("tiny-online");
    return grpc::Status::OK;
  }
  grpc::Status DumpGmg(grpc::ServerContext*, const v1::DumpGmgRequest*, v1::GmgDump* out) override {
    out->set_taken_at_ns(123);
    out->add_devices()->set_name("cpu0");
    return grpc::Status::OK;
  }
};

class FakeServing final : public v1::Serving::Service {
 public:
  grpc::Status Generate(grpc::ServerContext*, const v1::GenerateRequest* req,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override {
    if (req->prompt_token_ids().empty()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "prompt_token_ids: empty");
    }
    for (uint32_t i = 0; i < req->max_tokens(); ++i) {
      v1::GenerateResponse r;
      r.set_request_id(9);
      r.set_token_id(req->prompt_token_ids(0) + i);
      r.set_index(i);
      r.set_time_from_arrival_ms(1.5 * (i + 1));
      if (i + 1 == req->max_tokens()) r.set_finish_reason(v1::FINISH_REASON_LENGTH);
      if (!writer->Write(r)) break;
    }
    return grpc::Status::OK;
  }
};

class GrpcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // One socket per process: ctest runs the cases of this suite in parallel.
    socket_ = ::testing::TempDir() + "/slicesched_grpc_test_" + std::to_string(::getpid()) + ".sock";
    std::filesystem::remove(socket_);
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + socket_, grpc::InsecureServerCredentials());
    builder.RegisterService(&admin_);
    builder.RegisterService(&serving_);
    builder.RegisterService(&finetune_);  // unimplemented methods answer UNIMPLEMENTED
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr) << "could not listen on " << socket_;
    channel_ = grpc::CreateChannel("unix:" + socket_, grpc::InsecureChannelCredentials());
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
    std::filesystem::remove(socket_);
  }

  std::string socket_;
  FakeAdmin admin_;
  FakeServing serving_;
  v1::FineTune::Service finetune_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(GrpcTest, AdminStatusOverUnixSocket) {
  auto stub = v1::Admin::NewStub(channel_);
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer token");
    v1::StatusResponse resp;
    grpc::Status s = stub->Status(&ctx, v1::StatusRequest(), &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(resp.version(), "test");
    EXPECT_EQ(resp.state(), v1::SERVING_STATE_SERVING);
    EXPECT_EQ(resp.num_devices(), 4u);
    ASSERT_EQ(resp.deployments_size(), 1);
  }
  {
    grpc::ClientContext ctx;
    v1::StatusResponse resp;
    EXPECT_EQ(stub->Status(&ctx, v1::StatusRequest(), &resp).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    grpc::ClientContext ctx;
    v1::GmgDump dump;
    ASSERT_TRUE(stub->DumpGmg(&ctx, v1::DumpGmgRequest(), &dump).ok());
    EXPECT_EQ(dump.taken_at_ns(), 123);
    EXPECT_EQ(dump.devices(0).name(), "cpu0");
  }
  {
    grpc::ClientContext ctx;
    v1::DrainResponse resp;
    EXPECT_EQ(stub->Drain(&ctx, v1::DrainRequest(), &resp).error_code(), grpc::StatusCode::UNIMPLEMENTED);
  }
}

TEST_F(GrpcTest, GenerateStreamsTokens) {
  auto stub = v1::Serving::NewStub(channel_);
  v1::GenerateRequest req;
  req.set_deployment("tiny-online");
  req.add_prompt_token_ids(40);
  req.set_max_tokens(3);
  req.set_priority_class(v1::PRIORITY_CLASS_ONLINE);
  grpc::ClientContext ctx;
  auto reader = stub->Generate(&ctx, req);
  std::vector<v1::GenerateResponse> got;
  v1::GenerateResponse r;
  while (reader->Read(&r)) got.push_back(r);
  ASSERT_TRUE(reader->Finish().ok());
  ASSERT_EQ(got.size(), 3u);
  for (uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(got[i].index(), i);
    EXPECT_EQ(got[i].token_id(), 40 + i);
  }
  EXPECT_EQ(got[0].finish_reason(), v1::FINISH_REASON_UNSPECIFIED);
  EXPECT_EQ(got[2].finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_DOUBLE_EQ(got[2].time_from_arrival_ms(), 4.5);
}

TEST_F(GrpcTest, UnimplementedFineTune) {
  auto stub = v1::FineTune::NewStub(channel_);
  grpc::ClientContext ctx;
  v1::SubmitJobRequest req;
  req.set_yaml("name: x\n");
  v1::SubmitJobResponse resp;
  EXPECT_EQ(stub->SubmitJob(&ctx, req, &resp).error_code(), grpc::StatusCode::UNIMPLEMENTED);
}

}  // namespace
}  // namespace slicesched
