// The FineTune service over gRPC, in-process on a unix socket, on a real
// JobManager (SQLite in a temp state dir); and Admin.Status's job counts with
// a Master on the virtual backend.
#include "slicesched/server/finetune_service.h"

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <memory>
#include <string>

#include "slicesched/common/strings.h"
#include "slicesched/server/master.h"
#include "slicesched/server/services.h"
#include "slicesched/v1/admin.grpc.pb.h"

namespace slicesched {
namespace {

namespace v1 = ::slicesched::v1;
using ::testing::HasSubstr;

std::string UniqueDir(const std::string& name) {
  static std::atomic<int> counter{0};
  std::string dir = StrCat(::testing::TempDir(), "/finetune_", name, "_", ::getpid(), "_", counter++);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::string JobYaml(const std::string& name, const std::string& extra = "") {
  return StrCat("name: ", name,
                "\nbackbone: tiny\n"
                "dataset: {synthetic: {task: parity, seed: 1}}\n"
                "hyperparameters: {learning_rate: 0.001, batch_size: 8}\n"
                "stop: {metric: accuracy, target: 0.9, max_epochs: 2}\n"
                "gpus: {min: 1, max: 4}\n"
                "trust_domain: lab\n",
                extra);
}

class FineTuneServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = UniqueDir("svc");
    jobs::JobManager::Options o;
    o.now_unix_ms = [this] { return now_ms_.load(); };
    auto m = jobs::JobManager::Open(dir_ + "/state", o);
    ASSERT_TRUE(m.ok()) << m.status();
    jobs_ = *std::move(m);
    service_ = std::make_unique<FineTuneServiceImpl>(jobs_.get());
    const std::string socket = dir_ + "/s.sock";
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + socket, grpc::InsecureServerCredentials());
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = v1::FineTune::NewStub(grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
  }

  grpc::Status Submit(const std::string& yaml, const std::string& tenant, bool validate_only,
                      v1::SubmitJobResponse* out) {
    grpc::ClientContext ctx;
    v1::SubmitJobRequest req;
    req.set_yaml(yaml);
    req.set_tenant(tenant);
    req.set_validate_only(validate_only);
    return stub_->SubmitJob(&ctx, req, out);
  }
  uint64_t SubmitOk(const std::string& name, const std::string& tenant = "") {
    v1::SubmitJobResponse out;
    grpc::Status s = Submit(JobYaml(name), tenant, false, &out);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return out.job_id();
  }
  v1::ListJobsResponse List(v1::JobState state, const std::string& tenant, uint32_t page_size,
                            const std::string& token, grpc::Status* status = nullptr) {
    grpc::ClientContext ctx;
    v1::ListJobsRequest req;
    req.set_state(state);
    req.set_tenant(tenant);
    req.set_page_size(page_size);
    req.set_page_token(token);
    v1::ListJobsResponse out;
    grpc::Status s = stub_->ListJobs(&ctx, req, &out);
    if (status != nullptr) {
      *status = s;
    } else {
      EXPECT_TRUE(s.ok()) << s.error_message();
    }
    return out;
  }

  std::string dir_;
  std::atomic<int64_t> now_ms_{5'000};
  std::unique_ptr<jobs::JobManager> jobs_;
  std::unique_ptr<FineTuneServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::FineTune::Stub> stub_;
};

TEST_F(FineTuneServiceTest, SubmitValidInvalidAndValidateOnly) {
  v1::SubmitJobResponse out;
  grpc::Status s = Submit(JobYaml("a"), "team-a", /*validate_only=*/true, &out);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(out.job_id(), 0u);
  EXPECT_EQ(List(v1::JOB_STATE_UNSPECIFIED, "", 0, "").jobs_size(), 0);

  v1::SubmitJobResponse bad;
  s = Submit("name: a\nbackbone: tiny\nhyperparameters: {learning_rate: -1, batch_size: 0}\npriority: 200\n",
             "", false, &bad);
  ASSERT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("5 configuration errors:"));
  EXPECT_THAT(s.error_message(), HasSubstr("\n<job>:3:34: hyperparameters.learning_rate: must be positive, got -1"));
  EXPECT_THAT(s.error_message(), HasSubstr("\n<job>:3:50: hyperparameters.batch_size: must be at least 1, got 0"));
  EXPECT_THAT(s.error_message(), HasSubstr("\n<job>:4:11: priority: must be in 0..100, got 200"));
  EXPECT_THAT(s.error_message(), HasSubstr("missing required field 'dataset'"));
  EXPECT_THAT(s.error_message(), HasSubstr("missing required field 'stop'"));
  // Bad validate_only input gets the same answer.
  EXPECT_EQ(Submit("name: a\n", "", true, &bad).error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  v1::SubmitJobResponse warned;
  s = Submit(StrCat("name: w\nbackbone: tiny\ndataset: {synthetic: {task: parity, seed: 1}}\n",
                    "hyperparameters: {learning_rate: 0.001, batch_size: 8}\n",
                    "stop: {metric: loss, target: 0.5, max_epochs: 1}\n"),
             "team-a", false, &warned);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(warned.job_id(), 1u);
  ASSERT_EQ(warned.warnings_size(), 1);
  EXPECT_THAT(warned.warnings(0), HasSubstr("trust_domain is not set"));

  // The tenant of the request and of the YAML must agree.
  s = Submit(JobYaml("t", "tenant: team-b\n"), "team-a", false, &bad);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("tenant: is 'team-b' but the job is submitted for tenant 'team-a'"));
  // Too big.
  s = Submit(std::string(FineTuneServiceImpl::kMaxYamlBytes + 1, '#'), "", false, &bad);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(FineTuneServiceTest, ListFiltersAndPages) {
  for (int i = 1; i <= 5; ++i) SubmitOk(StrCat("j", i), i <= 3 ? "a" : "b");
  // 2 profiles, 3 runs, 4 is paused, 5 cancelled; 1 stays submitted.
  ASSERT_TRUE(jobs_->StartProfiling(2, {0}).ok());
  jobs::RunPlan plan;
  plan.devices = {1};
  for (uint64_t id : {3, 4}) {
    ASSERT_TRUE(jobs_->Queue(id).ok());
    ASSERT_TRUE(jobs_->Run(id, plan).ok());
  }
  ASSERT_TRUE(jobs_->Preempt(4, "burst").ok());
  ASSERT_TRUE(jobs_->Cancel(5, "").ok());

  auto ids = [](const v1::ListJobsResponse& r) {
    std::vector<uint64_t> out;
    for (const v1::Job& j : r.jobs()) out.push_back(j.id());
    return out;
  };
  EXPECT_THAT(ids(List(v1::JOB_STATE_UNSPECIFIED, "", 0, "")), ::testing::ElementsAre(1, 2, 3, 4, 5));
  // QUEUED covers submitted and profiling.
  v1::ListJobsResponse queued = List(v1::JOB_STATE_QUEUED, "", 0, "");
  EXPECT_THAT(ids(queued), ::testing::ElementsAre(1, 2));
  EXPECT_EQ(queued.jobs(1).message(), "profiling on 1 GPU");
  EXPECT_THAT(ids(List(v1::JOB_STATE_RUNNING, "", 0, "")), ::testing::ElementsAre(3));
  EXPECT_THAT(ids(List(v1::JOB_STATE_PAUSED, "", 0, "")), ::testing::ElementsAre(4));
  EXPECT_THAT(ids(List(v1::JOB_STATE_CANCELLED, "b", 0, "")), ::testing::ElementsAre(5));
  EXPECT_THAT(ids(List(v1::JOB_STATE_UNSPECIFIED, "b", 0, "")), ::testing::ElementsAre(4, 5));
  EXPECT_TRUE(List(v1::JOB_STATE_SUCCEEDED, "", 0, "").jobs().empty());

  v1::ListJobsResponse p1 = List(v1::JOB_STATE_UNSPECIFIED, "", 2, "");
  EXPECT_THAT(ids(p1), ::testing::ElementsAre(1, 2));
  v1::ListJobsResponse p2 = List(v1::JOB_STATE_UNSPECIFIED, "", 2, p1.next_page_token());
  EXPECT_THAT(ids(p2), ::testing::ElementsAre(3, 4));
  v1::ListJobsResponse p3 = List(v1::JOB_STATE_UNSPECIFIED, "", 2, p2.next_page_token());
  EXPECT_THAT(ids(p3), ::testing::ElementsAre(5));
  EXPECT_EQ(p3.next_page_token(), "");
  grpc::Status s;
  List(v1::JOB_STATE_RUNNING, "", 2, p1.next_page_token(), &s);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  List(static_cast<v1::JobState>(42), "", 0, "", &s);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(FineTuneServiceTest, GetWithEventsAndCancel) {
  const uint64_t id = SubmitOk("a", "team-a");
  ASSERT_TRUE(jobs_->Queue(id, 500).ok());
  jobs::RunPlan plan;
  plan.devices = {0, 1};
  now_ms_ = 6'000;
  ASSERT_TRUE(jobs_->Run(id, plan).ok());
  ASSERT_TRUE(jobs_->ReportProgress(id, 42, 0.75, "/ckpt/42").ok());

  {
    grpc::ClientContext ctx;
    v1::GetJobRequest req;
    req.set_job_id(id);
    req.set_include_events(true);
    v1::GetJobResponse out;
    grpc::Status s = stub_->GetJob(&ctx, req, &out);
    ASSERT_TRUE(s.ok()) << s.error_message();
    const v1::Job& j = out.job();
    EXPECT_EQ(j.id(), id);
    EXPECT_EQ(j.name(), "a");
    EXPECT_EQ(j.tenant(), "team-a");
    EXPECT_EQ(j.state(), v1::JOB_STATE_RUNNING);
    EXPECT_EQ(j.yaml(), JobYaml("a"));
    EXPECT_EQ(j.submitted_unix_ms(), 5'000);
    EXPECT_EQ(j.updated_unix_ms(), 6'000);
    EXPECT_EQ(j.iterations_done(), 42);
    EXPECT_EQ(j.iterations_target(), 500);
    EXPECT_DOUBLE_EQ(j.last_loss(), 0.75);
    EXPECT_THAT(j.devices(), ::testing::ElementsAre(0, 1));
    EXPECT_EQ(j.transfer_source_job(), 0u);
    EXPECT_EQ(j.message(), "running alone on 2 GPUs");
    ASSERT_EQ(out.events_size(), 4);
    for (int i = 0; i < out.events_size(); ++i) {
      EXPECT_EQ(out.events(i).seq(), static_cast<uint64_t>(i + 1));
      EXPECT_EQ(out.events(i).job_id(), id);
    }
    EXPECT_EQ(out.events(0).kind(), "submitted");
    EXPECT_EQ(out.events(0).time_unix_ms(), 5'000);
    EXPECT_EQ(out.events(2).kind(), "running");
    EXPECT_THAT(out.events(2).details_json(), HasSubstr("\"devices\":[0,1]"));
    EXPECT_EQ(out.events(3).kind(), "checkpoint");
  }
  {
    grpc::ClientContext ctx;
    v1::GetJobRequest req;
    req.set_job_id(id);
    v1::GetJobResponse out;
    ASSERT_TRUE(stub_->GetJob(&ctx, req, &out).ok());
    EXPECT_EQ(out.events_size(), 0);  // only when asked
  }
  auto cancel = [&](uint64_t job, v1::CancelJobResponse* out) {
    grpc::ClientContext ctx;
    v1::CancelJobRequest req;
    req.set_job_id(job);
    req.set_reason("user request");
    return stub_->CancelJob(&ctx, req, out);
  };
  v1::CancelJobResponse c;
  ASSERT_TRUE(cancel(id, &c).ok());
  EXPECT_EQ(c.job().state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(c.job().message(), "cancelled: user request");
  EXPECT_EQ(c.job().devices_size(), 0);
  // A terminal job answers with the state it reached.
  const uint64_t done = SubmitOk("done");
  ASSERT_TRUE(jobs_->Queue(done).ok());
  ASSERT_TRUE(jobs_->Run(done, plan).ok());
  jobs::CompletionReport report;
  report.metrics = {{"accuracy", 0.95}};
  ASSERT_TRUE(jobs_->Complete(done, report).ok());
  ASSERT_TRUE(cancel(done, &c).ok());
  EXPECT_EQ(c.job().state(), v1::JOB_STATE_SUCCEEDED);
  ASSERT_TRUE(cancel(id, &c).ok());
  EXPECT_EQ(c.job().state(), v1::JOB_STATE_CANCELLED);

  EXPECT_EQ(cancel(999, &c).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(cancel(0, &c).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  grpc::ClientContext ctx;
  v1::GetJobRequest req;
  req.set_job_id(999);
  v1::GetJobResponse out;
  EXPECT_EQ(stub_->GetJob(&ctx, req, &out).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST(ProtoJobState, Mapping) {
  using jobs::JobState;
  EXPECT_EQ(ToProtoJobState(JobState::kSubmitted), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(ToProtoJobState(JobState::kProfiling), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(ToProtoJobState(JobState::kQueued), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(ToProtoJobState(JobState::kRunning), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(ToProtoJobState(JobState::kPaused), v1::JOB_STATE_PAUSED);
  EXPECT_EQ(ToProtoJobState(JobState::kCompleted), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(ToProtoJobState(JobState::kFailed), v1::JOB_STATE_FAILED);
  EXPECT_EQ(ToProtoJobState(JobState::kCancelled), v1::JOB_STATE_CANCELLED);
  // Every v1 state maps back onto the internal states that map to it.
  for (int v = 1; v <= 6; ++v) {
    auto states = FromProtoJobState(static_cast<v1::JobState>(v));
    ASSERT_TRUE(states.ok());
    ASSERT_FALSE(states->empty());
    for (JobState s : *states) EXPECT_EQ(ToProtoJobState(s), v);
  }
  EXPECT_TRUE(FromProtoJobState(v1::JOB_STATE_UNSPECIFIED)->empty());
}

// The daemon's wiring: SlicedServer registers FineTune when given a
// JobManager, and Admin.Status counts its jobs.
TEST(SlicedServerJobs, FineTuneRegisteredAndStatusCountsJobs) {
  const std::string dir = UniqueDir("daemon");
  const std::string yaml = StrCat(
      "cluster:\n"
      "  devices: [{name: v, count: 2, type: testdev, memory: 1GiB, backend: virtual}]\n"
      "  links: {default: {bandwidth: 10GB/s, latency: 5us}}\n"
      "listen: {unix_socket: ", dir, "/s.sock}\n",
      "state_dir: ", dir, "/state\n");
  auto config = ParseSlicedConfig(YAML::Load(yaml), "<test>");
  ASSERT_TRUE(config.ok()) << config.status();
  MasterOptions mo;
  mo.estimator_save_interval = Duration::Seconds(3600);
  auto master = Master::Start(*config, mo);
  ASSERT_TRUE(master.ok()) << master.status();
  auto jobs = jobs::JobManager::Open(config->state_dir, {});
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  for (const char* name : {"a", "b", "c"}) ASSERT_TRUE((*jobs)->Submit(JobYaml(name), "", false).ok());
  ASSERT_TRUE((*jobs)->Queue(1).ok());
  jobs::RunPlan plan;
  plan.devices = {0};
  ASSERT_TRUE((*jobs)->Run(1, plan).ok());
  ASSERT_TRUE((*jobs)->Cancel(3, "").ok());

  ServerOptions so;
  so.unix_socket = config->listen.unix_socket;
  auto server = SlicedServer::Start(master->get(), so, jobs->get());
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = grpc::CreateChannel("unix:" + so.unix_socket, grpc::InsecureChannelCredentials());
  {
    grpc::ClientContext ctx;
    v1::StatusResponse st;
    grpc::Status s = v1::Admin::NewStub(channel)->Status(&ctx, v1::StatusRequest(), &st);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(st.jobs_running(), 1u);
    EXPECT_EQ(st.jobs_queued(), 1u);
  }
  {
    grpc::ClientContext ctx;
    v1::ListJobsResponse out;
    grpc::Status s = v1::FineTune::NewStub(channel)->ListJobs(&ctx, v1::ListJobsRequest(), &out);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(out.jobs_size(), 3);
  }
  (*server)->Shutdown(absl::ZeroDuration());
  (*master)->Shutdown();
}

// A restart of the service (a new JobManager on the same state directory,
// a new server) loses no job: a running job comes back queued, with its
// event log continued by "recovered".
TEST(FineTuneRestart, JobsSurviveOverGrpc) {
  const std::string dir = UniqueDir("restart");
  const std::string socket = dir + "/s.sock";
  uint64_t running = 0;
  uint64_t waiting = 0;
  for (int round = 0; round < 2; ++round) {
    auto jobs = jobs::JobManager::Open(dir + "/state", {});
    ASSERT_TRUE(jobs.ok()) << jobs.status();
    FineTuneServiceImpl service(jobs->get());
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + socket, grpc::InsecureServerCredentials());
    builder.RegisterService(&service);
    std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
    ASSERT_NE(server, nullptr);
    auto stub = v1::FineTune::NewStub(grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials()));
    if (round == 0) {
      for (uint64_t* id : {&running, &waiting}) {
        grpc::ClientContext ctx;
        v1::SubmitJobRequest req;
        req.set_yaml(JobYaml(*id == running ? "r" : "w"));
        v1::SubmitJobResponse out;
        ASSERT_TRUE(stub->SubmitJob(&ctx, req, &out).ok());
        *id = out.job_id();
      }
      ASSERT_TRUE((*jobs)->Queue(running).ok());
      jobs::RunPlan plan;
      plan.devices = {0};
      ASSERT_TRUE((*jobs)->Run(running, plan).ok());
      ASSERT_TRUE((*jobs)->ReportProgress(running, 7, 1.25, "/ckpt/r/7").ok());
    } else {
      grpc::ClientContext ctx;
      v1::ListJobsResponse list;
      ASSERT_TRUE(stub->ListJobs(&ctx, v1::ListJobsRequest(), &list).ok());
      ASSERT_EQ(list.jobs_size(), 2);
      EXPECT_EQ(list.jobs(0).id(), running);
      EXPECT_EQ(list.jobs(0).state(), v1::JOB_STATE_QUEUED);
      EXPECT_EQ(list.jobs(0).iterations_done(), 7);
      EXPECT_EQ(list.jobs(0).message(), "queued after a restart (was running); resumes from /ckpt/r/7");
      EXPECT_EQ(list.jobs(1).id(), waiting);
      EXPECT_EQ(list.jobs(1).state(), v1::JOB_STATE_QUEUED);
      grpc::ClientContext ctx2;
      v1::GetJobRequest req;
      req.set_job_id(running);
      req.set_include_events(true);
      v1::GetJobResponse got;
      ASSERT_TRUE(stub->GetJob(&ctx2, req, &got).ok());
      std::vector<std::string> kinds;
      for (const v1::JobEvent& e : got.events()) kinds.push_back(e.kind());
      EXPECT_THAT(kinds, ::testing::ElementsAre("submitted", "queued", "running", "checkpoint", "recovered"));
    }
    server->Shutdown();
  }
}

}  // namespace
}  // namespace slicesched
