// The daemon in-process: a Master plus the gRPC services on a unix socket in
// the test's temp dir, exercised through the generated stubs.
#include <gmock/gmock.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <memory>
#include <set>
#include <string>

#include "slicesched/common/strings.h"
#include "slicesched/server/config.h"
#include "slicesched/server/extensions.h"
#include "slicesched/server/master.h"
#include "slicesched/server/metrics.h"
#include "slicesched/server/services.h"
#include "slicesched/v1/admin.grpc.pb.h"
#include "slicesched/v1/serving.grpc.pb.h"

namespace slicesched {
namespace {

namespace v1 = ::slicesched::v1;
using ::testing::HasSubstr;

std::string UniqueDir(const std::string& name) {
  static std::atomic<int> counter{0};
  std::string dir = StrCat(::testing::TempDir(), "/sliced_", name, "_", ::getpid(), "_", counter++);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

SlicedConfig TestConfig(const std::string& dir) {
  const std::string yaml = StrCat(
      "cluster:\n"
      "  devices: [{name: v, count: 2, type: testdev, memory: 1GiB, backend: virtual}]\n"
      "  links: {default: {bandwidth: 10GB/s, latency: 5us}}\n"
      "listen: {unix_socket: ", dir, "/s.sock}\n",
      "state_dir: ", dir, "/state\n");
  auto c = ParseSlicedConfig(YAML::Load(yaml), "<test>");
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

class DaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = UniqueDir("daemon");
    config_ = TestConfig(dir_);
    StartDaemon();
  }
  void TearDown() override { StopDaemon(); }

  void StartDaemon() {
    MasterOptions mo;
    mo.estimator_save_interval = Duration::Seconds(3600);
    auto m = Master::Start(config_, mo);
    ASSERT_TRUE(m.ok()) << m.status();
    master_ = *std::move(m);
    ServerOptions so;
    so.unix_socket = config_.listen.unix_socket;
    so.max_receive_message_bytes = 64 << 10;
    auto s = SlicedServer::Start(master_.get(), so);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
    channel_ = grpc::CreateChannel("unix:" + so.unix_socket, grpc::InsecureChannelCredentials());
    admin_ = v1::Admin::NewStub(channel_);
    serving_ = v1::Serving::NewStub(channel_);
  }
  void StopDaemon() {
    if (server_) server_->Shutdown(absl::Seconds(1));
    server_.reset();
    if (master_) master_->Shutdown();
    master_.reset();
  }

  grpc::Status Register(const std::string& name, v1::RegisterDeploymentResponse* out,
                        v1::DeploymentRole role = v1::DEPLOYMENT_ROLE_ONLINE) {
    v1::RegisterDeploymentRequest req;
    req.mutable_spec()->set_name(name);
    req.mutable_spec()->mutable_model()->set_preset("tiny");
    req.mutable_spec()->mutable_weights()->set_seed(3);
    req.mutable_spec()->set_role(role);
    req.mutable_spec()->add_partitions("single");
    grpc::ClientContext ctx;
    return serving_->RegisterDeployment(&ctx, req, out);
  }

  grpc::Status Submit(const std::string& tpl, std::map<std::string, int64_t> bindings, v1::SubmitResponse* out,
                      const std::string& label = "") {
    v1::SubmitRequest req;
    req.set_template_name(tpl);
    for (const auto& [k, v] : bindings) (*req.mutable_bindings())[k] = v;
    req.set_label(label);
    grpc::ClientContext ctx;
    return serving_->Submit(&ctx, req, out);
  }

  // Every event of a Watch, until the stream ends.
  std::vector<v1::InstanceEvent> WatchAll(uint64_t id, grpc::Status* status) {
    v1::WatchRequest req;
    req.set_instance_id(id);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    auto reader = serving_->Watch(&ctx, req);
    std::vector<v1::InstanceEvent> events;
    v1::InstanceEvent e;
    while (reader->Read(&e)) events.push_back(e);
    *status = reader->Finish();
    return events;
  }

  std::string dir_;
  SlicedConfig config_;
  std::unique_ptr<Master> master_;
  std::unique_ptr<SlicedServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Admin::Stub> admin_;
  std::unique_ptr<v1::Serving::Stub> serving_;
};

TEST_F(DaemonTest, RegisterSubmitWatchDumpDrain) {
  v1::RegisterDeploymentResponse reg;
  grpc::Status s = Register("tiny-a", &reg);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(reg.prefill_template(), "tiny-a/prefill");
  EXPECT_EQ(reg.decode_template(), "tiny-a/decode");
  ASSERT_EQ(reg.partitions_size(), 1);
  EXPECT_EQ(reg.partitions(0).name(), "single");
  EXPECT_GT(reg.weight_bytes(), 0);
  EXPECT_GT(reg.kv_bytes_per_token(), 0);

  v1::SubmitResponse sub;
  s = Submit("tiny-a/prefill", {{"B", 1}, {"S", 16}}, &sub, "first");
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_NE(sub.instance_id(), 0u);

  grpc::Status ws;
  std::vector<v1::InstanceEvent> events = WatchAll(sub.instance_id(), &ws);
  ASSERT_TRUE(ws.ok()) << ws.error_message();
  ASSERT_FALSE(events.empty());
  const v1::InstanceEvent last = events.back();  // a copy: `events` is reassigned below
  EXPECT_EQ(last.state(), v1::INSTANCE_STATE_DONE) << last.message();
  EXPECT_EQ(last.ops_done(), last.ops_total());
  EXPECT_GT(last.ops_total(), 0u);
  EXPECT_FALSE(last.produced_checkpoints().empty());  // the prefill's KV caches
  for (size_t i = 1; i < events.size(); ++i) EXPECT_GE(events[i].time_ns(), events[i - 1].time_ns());

  // Watching a finished instance reports its terminal state once.
  events = WatchAll(sub.instance_id(), &ws);
  ASSERT_TRUE(ws.ok());
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].state(), v1::INSTANCE_STATE_DONE);

  {
    grpc::ClientContext ctx;
    v1::GmgDump dump;
    ASSERT_TRUE(admin_->DumpGmg(&ctx, v1::DumpGmgRequest(), &dump).ok());
    ASSERT_EQ(dump.devices_size(), 2);
    EXPECT_EQ(dump.devices(0).backend(), "virtual");
    ASSERT_EQ(dump.memory_size(), 2);
    EXPECT_GT(dump.memory(0).weights_bytes(), 0);
    EXPECT_GT(dump.memory(0).checkpoints_bytes() + dump.memory(1).checkpoints_bytes(), 0);
  }
  {
    grpc::ClientContext ctx;
    v1::DevicesResponse devs;
    ASSERT_TRUE(admin_->Devices(&ctx, v1::DevicesRequest(), &devs).ok());
    ASSERT_EQ(devs.devices_size(), 2);
    EXPECT_EQ(devs.devices(1).device().name(), "v1");
    EXPECT_GT(devs.devices(1).memory().weights_bytes(), 0);
  }
  {
    grpc::ClientContext ctx;
    v1::EstimatorsResponse est;
    v1::EstimatorsRequest req;
    req.set_device_type("testdev");
    ASSERT_TRUE(admin_->Estimators(&ctx, req, &est).ok());
    uint64_t samples = 0;
    for (const v1::OpEstimate& o : est.ops()) samples += o.samples();
    EXPECT_GE(samples, last.ops_total());
    EXPECT_THAT(est.ops(0).op_key(), HasSubstr("tiny-a/"));
  }
  {
    grpc::ClientContext ctx;
    v1::StatusResponse st;
    ASSERT_TRUE(admin_->Status(&ctx, v1::StatusRequest(), &st).ok());
    EXPECT_EQ(st.state(), v1::SERVING_STATE_SERVING);
    EXPECT_EQ(st.num_devices(), 2u);
    EXPECT_THAT(st.deployments(), ::testing::Contains("tiny-a"));
    EXPECT_EQ(st.policy(), "SliceScheduler");
    EXPECT_EQ(st.state_dir(), config_.state_dir);
  }
  {
    grpc::ClientContext ctx;
    v1::DrainRequest req;
    req.set_wait(true);
    req.set_timeout_ms(10000);
    v1::DrainResponse dr;
    ASSERT_TRUE(admin_->Drain(&ctx, req, &dr).ok());
    EXPECT_EQ(dr.state(), v1::SERVING_STATE_DRAINED);
    EXPECT_EQ(dr.remaining_instances(), 0u);
  }
  s = Submit("tiny-a/prefill", {{"B", 1}, {"S", 16}}, &sub);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_TRUE(std::filesystem::exists(config_.state_dir + "/sliced.db"));
}

TEST_F(DaemonTest, TimelineAndMetricsAfterCompletions) {
  v1::RegisterDeploymentResponse reg;
  ASSERT_TRUE(Register("tiny-t", &reg).ok());
  std::set<uint64_t> ids;
  uint32_t ops_total = 0;
  for (int i = 0; i < 3; ++i) {
    v1::SubmitResponse sub;
    ASSERT_TRUE(Submit("tiny-t/prefill", {{"B", 1}, {"S", 8 + i}}, &sub).ok());
    grpc::Status ws;
    auto events = WatchAll(sub.instance_id(), &ws);
    ASSERT_TRUE(ws.ok());
    ASSERT_EQ(events.back().state(), v1::INSTANCE_STATE_DONE);
    ops_total += events.back().ops_total();
    ids.insert(sub.instance_id());
  }

  // One offline instance: its events (including the last one, whose instance
  // retires in the same loop step) carry its class.
  uint64_t offline_id = 0;
  {
    v1::SubmitRequest req;
    req.set_template_name("tiny-t/prefill");
    (*req.mutable_bindings())["B"] = 1;
    (*req.mutable_bindings())["S"] = 4;
    req.set_priority_class(v1::PRIORITY_CLASS_OFFLINE);
    v1::SubmitResponse sub;
    grpc::ClientContext ctx;
    ASSERT_TRUE(serving_->Submit(&ctx, req, &sub).ok());
    grpc::Status ws;
    auto events = WatchAll(sub.instance_id(), &ws);
    ASSERT_TRUE(ws.ok());
    ASSERT_EQ(events.back().state(), v1::INSTANCE_STATE_DONE);
    ops_total += events.back().ops_total();
    offline_id = sub.instance_id();
    ids.insert(offline_id);
  }

  v1::TimelineResponse tl;
  {
    grpc::ClientContext ctx;
    v1::TimelineRequest req;
    req.set_format(v1::TIMELINE_FORMAT_STRUCTURED);
    grpc::Status s = admin_->Timeline(&ctx, req, &tl);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  EXPECT_FALSE(tl.truncated());
  uint32_t ops = 0;
  for (int i = 0; i < tl.events_size(); ++i) {
    const v1::TimelineEvent& e = tl.events(i);
    EXPECT_TRUE(ids.contains(e.instance_id())) << e.instance_id();
    EXPECT_EQ(e.priority_class(), e.instance_id() == offline_id ? "offline" : "online") << e.node_id();
    EXPECT_GT(e.start_ns(), 0);
    EXPECT_GE(e.end_ns(), e.start_ns());  // all finished
    EXPECT_GT(e.predicted_end_ns(), e.start_ns());
    EXPECT_LT(e.device(), 2u);
    if (i > 0) {
      EXPECT_GE(e.start_ns(), tl.events(i - 1).start_ns());
    }
    if (e.name() == "transfer") {
      EXPECT_GE(e.dst_device(), 0);
    } else {
      EXPECT_EQ(e.dst_device(), -1);
      EXPECT_THAT(e.name(), ::testing::Not(::testing::IsEmpty()));
      ++ops;
    }
  }
  EXPECT_EQ(ops, ops_total);  // every operator of the three instances, once

  // The Chrome trace has one actual interval per event and one predicted one.
  v1::TimelineResponse chrome;
  {
    grpc::ClientContext ctx;
    v1::TimelineRequest req;
    req.set_format(v1::TIMELINE_FORMAT_CHROME_TRACE);
    ASSERT_TRUE(admin_->Timeline(&ctx, req, &chrome).ok());
  }
  EXPECT_EQ(chrome.events_size(), 0);
  google::protobuf::Struct root;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(chrome.chrome_trace_json(), &root).ok());
  int actual = 0, predicted = 0;
  for (const auto& v : root.fields().at("traceEvents").list_value().values()) {
    const auto& f = v.struct_value().fields();
    if (f.at("ph").string_value() != "X") continue;
    (static_cast<int>(f.at("tid").number_value()) % 2 == 1 ? actual : predicted) += 1;
  }
  EXPECT_EQ(actual, tl.events_size());
  EXPECT_EQ(predicted, tl.events_size());

  // max_events keeps the latest starts and says so.
  {
    grpc::ClientContext ctx;
    v1::TimelineRequest req;
    req.set_max_events(2);
    v1::TimelineResponse few;
    ASSERT_TRUE(admin_->Timeline(&ctx, req, &few).ok());
    EXPECT_TRUE(few.truncated());
    ASSERT_EQ(few.events_size(), 2);
    EXPECT_EQ(few.events(1).node_id(), tl.events(tl.events_size() - 1).node_id());
  }
  // A window before the first event is empty; a reversed one is refused.
  {
    grpc::ClientContext ctx;
    v1::TimelineRequest req;
    req.set_since_ns(1);
    req.set_until_ns(tl.events(0).start_ns() - 1);
    v1::TimelineResponse none;
    ASSERT_TRUE(admin_->Timeline(&ctx, req, &none).ok());
    EXPECT_EQ(none.events_size(), 0);
  }
  {
    grpc::ClientContext ctx;
    v1::TimelineRequest req;
    req.set_since_ns(10);
    req.set_until_ns(5);
    v1::TimelineResponse bad;
    EXPECT_EQ(admin_->Timeline(&ctx, req, &bad).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }

  auto m = master_->Metrics();
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->classes[0].done, 3u);
  EXPECT_EQ(m->classes[0].latency.count, 3u);
  EXPECT_GT(m->classes[0].latency.sum, 0);
  EXPECT_EQ(m->classes[1].done, 1u);
  EXPECT_EQ(m->classes[1].latency.count, 1u);
  EXPECT_EQ(m->op_observations, ops_total);
  EXPECT_GT(m->schedule_call.count, 0u);
  EXPECT_GE(m->issued_nodes, ops_total);
  ASSERT_EQ(m->devices.size(), 2u);
  EXPECT_GT(m->devices[0].memory_used_bytes, 0);
  EXPECT_EQ(m->devices[0].memory_capacity_bytes, int64_t{1} << 30);
  EXPECT_GT(m->devices[0].busy_seconds_total + m->devices[1].busy_seconds_total, 0);
  EXPECT_FALSE(m->op_keys.empty());
  const std::string text = RenderPrometheusText(*m);
  EXPECT_THAT(text, HasSubstr("slicesched_request_latency_seconds_count{class=\"online\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("slicesched_instances_finished_total{class=\"offline\",state=\"done\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("slicesched_device_memory_capacity_bytes{device=\"v0\",type=\"testdev\"} 1073741824\n"));
}

TEST_F(DaemonTest, SloAttainmentCountsOnlineDeadlines) {
  v1::RegisterDeploymentResponse reg;
  ASSERT_TRUE(Register("tiny-s", &reg).ok());
  for (uint32_t deadline_ms : {60000u, 0u}) {
    v1::SubmitRequest req;
    req.set_template_name("tiny-s/prefill");
    (*req.mutable_bindings())["B"] = 1;
    (*req.mutable_bindings())["S"] = 8;
    req.set_deadline_ms(deadline_ms);
    v1::SubmitResponse sub;
    grpc::ClientContext ctx;
    ASSERT_TRUE(serving_->Submit(&ctx, req, &sub).ok());
    grpc::Status ws;
    ASSERT_EQ(WatchAll(sub.instance_id(), &ws).back().state(), v1::INSTANCE_STATE_DONE);
  }
  auto m = master_->Metrics();
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->slo_total, 1u);  // only the one with a deadline
  EXPECT_EQ(m->slo_met, 1u);    // a tiny prefill finishes well within a minute
}

TEST_F(DaemonTest, CancelAndDecodeWithCheckpoints) {
  v1::RegisterDeploymentResponse reg;
  ASSERT_TRUE(Register("tiny-c", &reg).ok());
  v1::SubmitResponse pre;
  ASSERT_TRUE(Submit("tiny-c/prefill", {{"B", 1}, {"S", 8}}, &pre).ok());
  grpc::Status ws;
  auto events = WatchAll(pre.instance_id(), &ws);
  ASSERT_TRUE(ws.ok());
  ASSERT_EQ(events.back().state(), v1::INSTANCE_STATE_DONE);

  // A decode step attaching the prefill's KV checkpoints kv0, kv1, ...
  v1::SubmitRequest req;
  req.set_template_name("tiny-c/decode");
  (*req.mutable_bindings())["B"] = 1;
  (*req.mutable_bindings())["C"] = 8;
  for (int i = 0; i < events.back().produced_checkpoints_size(); ++i) {
    v1::CheckpointBinding* c = req.add_checkpoints();
    c->set_name(StrCat("kv", i));
    c->set_checkpoint_id(events.back().produced_checkpoints(i));
  }
  v1::SubmitResponse dec;
  {
    grpc::ClientContext ctx;
    grpc::Status s = serving_->Submit(&ctx, req, &dec);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  events = WatchAll(dec.instance_id(), &ws);
  ASSERT_TRUE(ws.ok());
  EXPECT_EQ(events.back().state(), v1::INSTANCE_STATE_DONE) << events.back().message();

  // Cancel: a terminal answer either way, and Watch agrees.
  v1::SubmitResponse big;
  ASSERT_TRUE(Submit("tiny-c/prefill", {{"B", 4}, {"S", 4096}}, &big).ok());
  v1::CancelRequest creq;
  creq.set_instance_id(big.instance_id());
  v1::CancelResponse cresp;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(serving_->Cancel(&ctx, creq, &cresp).ok());
  }
  EXPECT_TRUE(cresp.state() == v1::INSTANCE_STATE_CANCELLED || cresp.state() == v1::INSTANCE_STATE_DONE);
  events = WatchAll(big.instance_id(), &ws);
  ASSERT_TRUE(ws.ok());
  EXPECT_EQ(events.back().state(), cresp.state());
}

TEST_F(DaemonTest, BadInput) {
  v1::RegisterDeploymentResponse reg;
  ASSERT_TRUE(Register("tiny-b", &reg).ok());
  EXPECT_EQ(Register("tiny-b", &reg).error_code(), grpc::StatusCode::ALREADY_EXISTS);

  v1::SubmitResponse sub;
  grpc::Status s = Submit("nope/prefill", {{"B", 1}, {"S", 4}}, &sub);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(s.error_message(), HasSubstr("template_name"));

  s = Submit("tiny-b/prefill", {{"B", 1}}, &sub);  // S missing
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("bindings"));
  s = Submit("tiny-b/prefill", {{"B", 1}, {"S", 4}, {"Q", 2}}, &sub);  // unknown symbol
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("bindings"));
  s = Submit("tiny-b/prefill", {{"B", 0}, {"S", 4}}, &sub);  // out of range
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("bindings[B]"));
  s = Submit("", {}, &sub);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("template_name"));
  s = Submit("tiny-b/prefill", {{"B", 1}, {"S", 4}}, &sub, std::string(300, 'x'));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("label"));
  // Larger than the server's max receive size (64 KiB here).
  s = Submit("tiny-b/prefill", {{"B", 1}, {"S", 4}}, &sub, std::string(100 << 10, 'x'));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);

  {
    v1::SubmitRequest req;
    req.set_template_name("tiny-b/decode");
    (*req.mutable_bindings())["B"] = 1;
    (*req.mutable_bindings())["C"] = 4;
    v1::CheckpointBinding* c = req.add_checkpoints();
    c->set_name("kv0");
    c->set_checkpoint_id(987654);
    grpc::ClientContext ctx;
    s = serving_->Submit(&ctx, req, &sub);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_THAT(s.error_message(), HasSubstr("checkpoints[kv0]"));
  }

  grpc::Status ws;
  WatchAll(424242, &ws);
  EXPECT_EQ(ws.error_code(), grpc::StatusCode::NOT_FOUND);
  {
    v1::CancelRequest req;
    req.set_instance_id(424242);
    v1::CancelResponse resp;
    grpc::ClientContext ctx;
    EXPECT_EQ(serving_->Cancel(&ctx, req, &resp).error_code(), grpc::StatusCode::NOT_FOUND);
  }

  auto reg_with = [&](auto mutate) {
    v1::RegisterDeploymentRequest req;
    req.mutable_spec()->set_name("x");
    req.mutable_spec()->mutable_model()->set_preset("tiny");
    req.mutable_spec()->mutable_weights()->set_seed(1);
    req.mutable_spec()->set_role(v1::DEPLOYMENT_ROLE_OFFLINE);
    mutate(req.mutable_spec());
    v1::RegisterDeploymentResponse out;
    grpc::ClientContext ctx;
    return serving_->RegisterDeployment(&ctx, req, &out);
  };
  struct Case {
    std::function<void(v1::DeploymentSpec*)> mutate;
    std::string field;
  };
  const std::vector<Case> cases = {
      {[](v1::DeploymentSpec* s) { s->set_role(v1::DEPLOYMENT_ROLE_UNSPECIFIED); }, "spec.role"},
      {[](v1::DeploymentSpec* s) { s->set_name("bad name!"); }, "spec.name"},
      {[](v1::DeploymentSpec* s) { s->set_name(""); }, "spec.name"},
      {[](v1::DeploymentSpec* s) { s->mutable_model()->set_preset("gpt-9"); }, "spec.model.preset"},
      {[](v1::DeploymentSpec* s) { s->clear_model(); }, "spec.model"},
      {[](v1::DeploymentSpec* s) { s->clear_weights(); }, "spec.weights"},
      {[](v1::DeploymentSpec* s) { s->mutable_weights()->set_safetensors_path("/nonexistent/w.safetensors"); },
       "spec.weights.safetensors_path"},
      {[](v1::DeploymentSpec* s) { s->add_partitions("pp64"); }, "spec.partitions"},
      {[](v1::DeploymentSpec* s) {
         auto* m = s->mutable_model()->mutable_llama();
         m->set_layers(4);
         m->set_hidden(65);
         m->set_heads(4);
         m->set_ffn(8);
         m->set_vocab(8);
       },
       "spec.model.llama"},
      {[](v1::DeploymentSpec* s) {
         auto* m = s->mutable_model()->mutable_llama();
         m->set_layers(1 << 30);
         m->set_hidden(64);
         m->set_heads(4);
         m->set_ffn(8);
         m->set_vocab(8);
         m->set_fusion(1);
       },
       "spec.model"},
  };
  for (const Case& c : cases) {
    grpc::Status r = reg_with(c.mutate);
    EXPECT_EQ(r.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.field << ": " << r.error_message();
    EXPECT_THAT(r.error_message(), HasSubstr(c.field));
  }
  // Nothing half-registered: the daemon still serves, "x" does not exist.
  v1::ListDeploymentsResponse list;
  grpc::ClientContext ctx;
  ASSERT_TRUE(serving_->ListDeployments(&ctx, v1::ListDeploymentsRequest(), &list).ok());
  ASSERT_EQ(list.deployments_size(), 1);
  EXPECT_EQ(list.deployments(0).spec().name(), "tiny-b");
}

TEST_F(DaemonTest, DeploymentsAndEstimatorsSurviveRestart) {
  v1::RegisterDeploymentResponse reg;
  ASSERT_TRUE(Register("tiny-r", &reg, v1::DEPLOYMENT_ROLE_OFFLINE).ok());
  v1::SubmitResponse sub;
  ASSERT_TRUE(Submit("tiny-r/prefill", {{"B", 2}, {"S", 32}}, &sub).ok());
  grpc::Status ws;
  auto events = WatchAll(sub.instance_id(), &ws);
  ASSERT_TRUE(ws.ok());
  ASSERT_EQ(events.back().state(), v1::INSTANCE_STATE_DONE);

  auto before = master_->Estimators();
  ASSERT_TRUE(before.ok());
  std::map<std::string, int64_t> samples_before;
  for (const auto& k : before->ops) {
    if (k.samples > 0) samples_before[StrCat(k.device_type, "|", k.template_name, "|", k.op_name)] = k.samples;
  }
  ASSERT_FALSE(samples_before.empty());

  StopDaemon();
  StartDaemon();

  v1::ListDeploymentsResponse list;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(serving_->ListDeployments(&ctx, v1::ListDeploymentsRequest(), &list).ok());
  }
  ASSERT_EQ(list.deployments_size(), 1);
  const v1::Deployment& d = list.deployments(0);
  EXPECT_EQ(d.spec().name(), "tiny-r");
  EXPECT_EQ(d.spec().model().preset(), "tiny");
  EXPECT_EQ(d.spec().role(), v1::DEPLOYMENT_ROLE_OFFLINE);
  EXPECT_EQ(d.spec().weights().seed(), 3u);
  EXPECT_EQ(d.info().prefill_template(), "tiny-r/prefill");
  EXPECT_GT(d.created_unix_ms(), 0);

  auto after = master_->Estimators();
  ASSERT_TRUE(after.ok());
  for (const auto& k : after->ops) {
    auto it = samples_before.find(StrCat(k.device_type, "|", k.template_name, "|", k.op_name));
    if (it == samples_before.end()) continue;
    EXPECT_EQ(k.samples, it->second) << k.template_name << ":" << k.op_name;
    samples_before.erase(it);
  }
  EXPECT_TRUE(samples_before.empty()) << "estimator keys lost in the restart";

  // The restored deployment serves.
  ASSERT_TRUE(Submit("tiny-r/prefill", {{"B", 1}, {"S", 4}}, &sub).ok());
  events = WatchAll(sub.instance_id(), &ws);
  ASSERT_TRUE(ws.ok());
  EXPECT_EQ(events.back().state(), v1::INSTANCE_STATE_DONE);
}

// The runtime calibration in Status (RPC), restored from the state dir at
// start, saved at shutdown; a state saved for other devices is ignored (the
// daemon starts with the default factors) rather than refused or applied.
TEST_F(DaemonTest, CalibrationIsInStatusAndSurvivesRestart) {
  auto status = [&] {
    v1::StatusResponse r;
    grpc::ClientContext ctx;
    EXPECT_TRUE(admin_->Status(&ctx, v1::StatusRequest(), &r).ok());
    return r;
  };
  auto plant = [&](const RuntimeCalibration& cal) {
    StopDaemon();
    {
      auto store = StateStore::Open(config_.state_dir);
      ASSERT_TRUE(store.ok()) << store.status();
      ASSERT_TRUE((*store)->PutEstimator("calibration", cal.Save()).ok());
    }
    StartDaemon();
  };
  v1::StatusResponse r = status();
  ASSERT_EQ(r.calibration().devices_size(), 2);
  EXPECT_EQ(r.calibration().devices(0).name(), "v0");
  EXPECT_EQ(r.calibration().devices(1).speed().factor(), 1.0);
  EXPECT_EQ(r.calibration().devices(1).speed().samples(), 0u);

  // A learned state (device v1 20% slower than v0) is restored as it was.
  RuntimeCalibration learned(config_.cluster);
  for (int i = 0; i < 200; ++i) learned.ObserveOp(DeviceId(i % 2), 1e6, (i % 2 ? 1.2 : 1.0) * 1e6, false);
  plant(learned);
  r = status();
  ASSERT_EQ(r.calibration().devices_size(), 2);
  for (int d = 0; d < 2; ++d) {
    EXPECT_EQ(r.calibration().devices(d).speed().factor(), learned.device_factor(DeviceId(d))) << d;
    EXPECT_EQ(r.calibration().devices(d).speed().samples(), 100u) << d;
  }
  EXPECT_GT(r.calibration().devices(1).speed().factor(), 1.05);

  // Operators and their time per device.
  v1::RegisterDeploymentResponse reg;
  ASSERT_TRUE(Register("tiny-c", &reg).ok());
  v1::SubmitResponse sub;
  ASSERT_TRUE(Submit("tiny-c/prefill", {{"B", 1}, {"S", 8}}, &sub).ok());
  grpc::Status ws;
  ASSERT_EQ(WatchAll(sub.instance_id(), &ws).back().state(), v1::INSTANCE_STATE_DONE);
  r = status();
  const v1::Calibration& c = r.calibration();
  EXPECT_GT(c.devices(0).operators() + c.devices(1).operators(), 0u);
  EXPECT_GT(c.devices(0).busy_seconds() + c.devices(1).busy_seconds(), 0.0);

  // Shutdown saves it; what it saved restores.
  StopDaemon();
  {
    auto store = StateStore::Open(config_.state_dir);
    ASSERT_TRUE(store.ok()) << store.status();
    auto saved = (*store)->GetEstimator("calibration");
    ASSERT_TRUE(saved.ok()) << saved.status();
    RuntimeCalibration again(config_.cluster);
    EXPECT_TRUE(again.Restore(saved->text).ok()) << saved->text;
    EXPECT_GT(again.device_factor(DeviceId(1)), 1.05);
  }
  StartDaemon();

  // Saved for three devices: ignored, the daemon starts with the defaults.
  RuntimeCalibration three(std::vector<int>{0, 0, 0});
  for (int i = 0; i < 200; ++i) three.ObserveOp(DeviceId(i % 3), 1e6, (i % 3 ? 1.2 : 1.0) * 1e6, false);
  plant(three);
  r = status();
  ASSERT_EQ(r.calibration().devices_size(), 2);
  EXPECT_EQ(r.calibration().devices(1).speed().factor(), 1.0);
  EXPECT_EQ(r.calibration().devices(1).speed().samples(), 0u);
}

TEST(DaemonConfig, CpuDevicesRunOnLibTorchOrSayTheyDoNot) {
  const std::string dir = UniqueDir("cpu");
  auto c = ParseSlicedConfig(
      YAML::Load(StrCat("cluster: {devices: [{name: cpu, count: 1, type: cpu, memory: 1GiB, backend: cpu}]}\n"
                        "listen: {unix_socket: ", dir, "/s.sock}\nstate_dir: ", dir, "/state\n")),
      "<test>");
  ASSERT_TRUE(c.ok()) << c.status();
  auto m = Master::Start(*c);
  ASSERT_TRUE(m.ok()) << m.status();
  auto devices = (*m)->Devices();
  ASSERT_TRUE(devices.ok());
  // A LibTorch build registers the real backend (server/extensions.h).
  if (RegisteredRealBackend() != nullptr) {
    EXPECT_EQ((*devices)[0].backend_used, "cpu (LibTorch)");
    EXPECT_EQ((*m)->backend_name(), "cpu (LibTorch)");
  } else {
    EXPECT_EQ((*devices)[0].backend_used, "virtual (configured: cpu)");
    EXPECT_EQ((*m)->backend_name(), "virtual");
  }
}

TEST(DaemonConfig, MixingCpuWithOtherBackendsIsRefused) {
  const std::string dir = UniqueDir("mixed");
  auto c = ParseSlicedConfig(
      YAML::Load(StrCat("cluster: {devices: [{name: cpu, count: 1, type: cpu, memory: 1GiB, backend: cpu},\n"
                        "                    {name: v, count: 1, type: cpu, memory: 1GiB, backend: virtual}]}\n"
                        "listen: {unix_socket: ", dir, "/s.sock}\nstate_dir: ", dir, "/state\n")),
      "<test>");
  ASSERT_TRUE(c.ok()) << c.status();
  auto m = Master::Start(*c);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(m.status().message()), HasSubstr("cluster.devices"));
}

// A 'cuda' device this process cannot use (no GPU here, and never an
// ordinal as high as 64) stops the start with the reason: the device, its
// ordinal and what is missing.
TEST(DaemonConfig, CudaDevicesWithoutTheirGpuAreRefused) {
  const std::string dir = UniqueDir("cuda");
  auto c = ParseSlicedConfig(
      YAML::Load(StrCat("cluster: {devices: [{name: gpu, count: 1, type: A16, memory: 1GiB, backend: cuda, device: 64}]}\n"
                        "listen: {unix_socket: ", dir, "/s.sock}\nstate_dir: ", dir, "/state\n")),
      "<test>");
  ASSERT_TRUE(c.ok()) << c.status();
  auto m = Master::Start(*c);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(m.status().message()), HasSubstr("gpu0"));
  EXPECT_THAT(std::string(m.status().message()), HasSubstr("cuda"));
}

TEST(AdminAuthorization, Rules) {
  const std::string good = "Bearer s3cret";
  const std::string bad = "Bearer nope";
  // Unix socket peers are trusted.
  EXPECT_TRUE(AuthorizeAdmin("unix:/run/sliced/sliced.sock", nullptr, "s3cret", true).ok());
  EXPECT_TRUE(AuthorizeAdmin("unix:", nullptr, "", true).ok());
  // TCP with a token: every call needs it.
  EXPECT_EQ(AuthorizeAdmin("ipv4:10.0.0.1:5555", nullptr, "s3cret", false).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(AuthorizeAdmin("ipv4:10.0.0.1:5555", &bad, "s3cret", true).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(AuthorizeAdmin("ipv4:10.0.0.1:5555", &good, "s3cret", true).ok());
  // TCP without a token: read-only yes, mutating no.
  EXPECT_TRUE(AuthorizeAdmin("ipv6:[::1]:5555", nullptr, "", false).ok());
  EXPECT_EQ(AuthorizeAdmin("ipv6:[::1]:5555", nullptr, "", true).error_code(), grpc::StatusCode::PERMISSION_DENIED);
}

}  // namespace
}  // namespace slicesched
