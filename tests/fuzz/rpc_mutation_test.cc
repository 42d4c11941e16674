// The input-robustness campaign over the daemon's gRPC surface: the real
// Master and services (Serving, Admin, FineTune) in-process on a unix socket,
// as tests/server/master_test.cc runs them, fed seeded mutations of valid
// requests of every RPC (Drain excepted: a valid Drain stops admission by
// design). Mutations are structure-aware, through protobuf reflection (a
// field set to an extreme number, an odd string, an unknown enum value, an
// extra repeated/map element, a cleared field), and byte-level (the
// serialized request mutated and parsed back).
//
// Each answer must be OK or an error that is not INTERNAL/UNKNOWN/DATA_LOSS,
// whose message is non-empty and (for INVALID_ARGUMENT) names a field of the
// request or a position in its YAML. Afterwards the daemon must be intact:
// the deployments are exactly those whose registration succeeded, with the
// spec of their last successful registration; the job submitted first is
// still there with its YAML; a fresh Submit on the first deployment runs to
// DONE; Status, Devices and DumpGmg answer.
#include <google/protobuf/descriptor.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/message.h>
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "fuzz/mutator.h"
#include "slicesched/common/strings.h"
#include "slicesched/jobs/job_manager.h"
#include "slicesched/server/config.h"
#include "slicesched/server/master.h"
#include "slicesched/server/services.h"
#include "slicesched/v1/admin.grpc.pb.h"
#include "slicesched/v1/finetune.grpc.pb.h"
#include "slicesched/v1/serving.grpc.pb.h"

namespace slicesched {
namespace {

namespace v1 = ::slicesched::v1;
namespace pb = ::google::protobuf;

constexpr uint64_t kSeed = 20261201;

int Iterations(int default_count) {
  const char* env = std::getenv("SLICESCHED_FUZZ_ITERATIONS");
  return env != nullptr ? std::atoi(env) : default_count;
}

// Structure-aware mutation of a protobuf message through reflection.
class ProtoMutator {
 public:
  explicit ProtoMutator(fuzz::Mutator* m) : m_(*m) {}

  void Mutate(pb::Message* msg, int depth = 0) {
    const pb::Descriptor* d = msg->GetDescriptor();
    if (d->field_count() == 0) return;
    const pb::Reflection* r = msg->GetReflection();
    const pb::FieldDescriptor* f = d->field(static_cast<int>(m_.Below(static_cast<size_t>(d->field_count()))));
    if (m_.Below(8) == 0) {
      r->ClearField(msg, f);
      return;
    }
    if (f->is_map()) {
      pb::Message* entry = r->AddMessage(msg, f);
      SetScalar(entry, entry->GetDescriptor()->map_key());
      SetScalar(entry, entry->GetDescriptor()->map_value());
      return;
    }
    if (f->is_repeated()) {
      const size_t adds = m_.Below(4) == 0 ? 1 + m_.Below(2000) : 1;  // sometimes very many
      for (size_t i = 0; i < adds; ++i) AddRepeated(msg, f, depth);
      return;
    }
    if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
      if (depth < 4) Mutate(r->MutableMessage(msg, f), depth + 1);
      return;
    }
    SetScalar(msg, f);
  }

 private:
  double OddDouble() {
    static const double kValues[] = {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(),
                                     -std::numeric_limits<double>::infinity(), -1, 0, 1e308, 4.9e-324, 0.5, 2};
    return kValues[m_.Below(std::size(kValues))];
  }
  int EnumValue() {
    static const int kValues[] = {-1, 0, 1, 2, 3, 5, 99, std::numeric_limits<int>::max(),
                                  std::numeric_limits<int>::min()};
    return kValues[m_.Below(std::size(kValues))];
  }
  std::string String(const std::string& current) {
    return m_.Below(2) == 0 ? m_.OddString() : m_.Mutate(current);
  }

  void SetScalar(pb::Message* msg, const pb::FieldDescriptor* f) {
    const pb::Reflection* r = msg->GetReflection();
    switch (f->cpp_type()) {
      case pb::FieldDescriptor::CPPTYPE_INT32: r->SetInt32(msg, f, static_cast<int32_t>(m_.ExtremeInteger())); break;
      case pb::FieldDescriptor::CPPTYPE_INT64: r->SetInt64(msg, f, m_.ExtremeInteger()); break;
      case pb::FieldDescriptor::CPPTYPE_UINT32: r->SetUInt32(msg, f, static_cast<uint32_t>(m_.ExtremeInteger())); break;
      case pb::FieldDescriptor::CPPTYPE_UINT64: r->SetUInt64(msg, f, static_cast<uint64_t>(m_.ExtremeInteger())); break;
      case pb::FieldDescriptor::CPPTYPE_DOUBLE: r->SetDouble(msg, f, OddDouble()); break;
      case pb::FieldDescriptor::CPPTYPE_FLOAT: r->SetFloat(msg, f, static_cast<float>(OddDouble())); break;
      case pb::FieldDescriptor::CPPTYPE_BOOL: r->SetBool(msg, f, !r->GetBool(*msg, f)); break;
      case pb::FieldDescriptor::CPPTYPE_ENUM: r->SetEnumValue(msg, f, EnumValue()); break;
      case pb::FieldDescriptor::CPPTYPE_STRING: r->SetString(msg, f, String(r->GetString(*msg, f))); break;
      case pb::FieldDescriptor::CPPTYPE_MESSAGE: Mutate(r->MutableMessage(msg, f)); break;
    }
  }

  void AddRepeated(pb::Message* msg, const pb::FieldDescriptor* f, int depth) {
    const pb::Reflection* r = msg->GetReflection();
    switch (f->cpp_type()) {
      case pb::FieldDescriptor::CPPTYPE_INT32: r->AddInt32(msg, f, static_cast<int32_t>(m_.ExtremeInteger())); break;
      case pb::FieldDescriptor::CPPTYPE_INT64: r->AddInt64(msg, f, m_.ExtremeInteger()); break;
      case pb::FieldDescriptor::CPPTYPE_UINT32: r->AddUInt32(msg, f, static_cast<uint32_t>(m_.ExtremeInteger())); break;
      case pb::FieldDescriptor::CPPTYPE_UINT64: r->AddUInt64(msg, f, static_cast<uint64_t>(m_.ExtremeInteger())); break;
      case pb::FieldDescriptor::CPPTYPE_DOUBLE: r->AddDouble(msg, f, OddDouble()); break;
      case pb::FieldDescriptor::CPPTYPE_FLOAT: r->AddFloat(msg, f, static_cast<float>(OddDouble())); break;
      case pb::FieldDescriptor::CPPTYPE_BOOL: r->AddBool(msg, f, m_.Below(2) == 0); break;
      case pb::FieldDescriptor::CPPTYPE_ENUM: r->AddEnumValue(msg, f, EnumValue()); break;
      case pb::FieldDescriptor::CPPTYPE_STRING: r->AddString(msg, f, String("single")); break;
      case pb::FieldDescriptor::CPPTYPE_MESSAGE: {
        pb::Message* sub = r->AddMessage(msg, f);
        if (depth < 4) Mutate(sub, depth + 1);
        break;
      }
    }
  }

  fuzz::Mutator& m_;
};

// `m` serialized with map entries in key order (the default order is a
// per-process hash order), so that byte-level mutations repeat across runs.
std::string DeterministicBytes(const pb::Message& m) {
  std::string out;
  {
    pb::io::StringOutputStream stream(&out);
    pb::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    m.SerializePartialToCodedStream(&coded);
  }
  return out;
}

// Every field name of `d` and its sub-messages ("spec", "name", ...).
void FieldNames(const pb::Descriptor* d, std::set<std::string>* out, int depth = 0) {
  if (depth > 4) return;
  for (int i = 0; i < d->field_count(); ++i) {
    const pb::FieldDescriptor* f = d->field(i);
    out->insert(f->name());
    if (f->message_type() != nullptr) FieldNames(f->message_type(), out, depth + 1);
  }
}

std::string JobYaml(const std::string& name) {
  return StrCat("name: ", name,
                "\nbackbone: tiny\n"
                "dataset: {synthetic: {task: parity, seed: 1}}\n"
                "hyperparameters: {learning_rate: 0.001, batch_size: 8}\n"
                "stop: {metric: accuracy, target: 0.9, max_epochs: 2}\n"
                "gpus: {min: 1, max: 2}\n");
}

class RpcMutationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = StrCat(::testing::TempDir(), "/fuzz_rpc_", ::getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    const std::string yaml = StrCat(
        "cluster:\n"
        "  devices: [{name: v, count: 2, type: testdev, memory: 1GiB, backend: virtual}]\n"
        "  links: {default: {bandwidth: 10GB/s, latency: 5us}}\n"
        "listen: {unix_socket: ",
        dir_, "/s.sock}\n", "state_dir: ", dir_, "/state\n");
    auto config = ParseSlicedConfig(YAML::Load(yaml), "<test>");
    ASSERT_TRUE(config.ok()) << config.status();
    MasterOptions mo;
    mo.estimator_save_interval = Duration::Seconds(3600);
    auto m = Master::Start(*config, mo);
    ASSERT_TRUE(m.ok()) << m.status();
    master_ = *std::move(m);
    jobs::JobManager::Options jo;
    jo.now_unix_ms = [] { return int64_t{1'700'000'000'000}; };
    // No is_deployment: jobs name a preset backbone (deployments as
    // backbones are the runner's business, not this surface's).
    auto jm = jobs::JobManager::Open(config->state_dir, std::move(jo));
    ASSERT_TRUE(jm.ok()) << jm.status();
    jobs_ = *std::move(jm);
    ServerOptions so;
    so.unix_socket = config->listen.unix_socket;
    so.max_receive_message_bytes = 1 << 20;
    auto s = SlicedServer::Start(master_.get(), so, jobs_.get());
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
    auto channel = grpc::CreateChannel("unix:" + so.unix_socket, grpc::InsecureChannelCredentials());
    admin_ = v1::Admin::NewStub(channel);
    serving_ = v1::Serving::NewStub(channel);
    finetune_ = v1::FineTune::NewStub(channel);
  }
  void TearDown() override {
    if (server_) server_->Shutdown(absl::Seconds(1));
    server_.reset();
    if (master_) master_->Shutdown();
    master_.reset();
    jobs_.reset();
  }

  static void Deadline(grpc::ClientContext* ctx, int seconds) {
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
  }

  // Submits B=1, S=4 on `deployment`'s prefill and watches it to the end.
  v1::InstanceState RunPrefill(const std::string& deployment) {
    v1::SubmitRequest req;
    req.set_template_name(deployment + "/prefill");
    (*req.mutable_bindings())["B"] = 1;
    (*req.mutable_bindings())["S"] = 4;
    v1::SubmitResponse sub;
    grpc::ClientContext ctx;
    Deadline(&ctx, 30);
    grpc::Status s = serving_->Submit(&ctx, req, &sub);
    EXPECT_TRUE(s.ok()) << s.error_message();
    if (!s.ok()) return v1::INSTANCE_STATE_UNSPECIFIED;
    v1::WatchRequest w;
    w.set_instance_id(sub.instance_id());
    grpc::ClientContext wctx;
    Deadline(&wctx, 30);
    auto reader = serving_->Watch(&wctx, w);
    v1::InstanceEvent e, last;
    while (reader->Read(&e)) last = e;
    EXPECT_TRUE(reader->Finish().ok());
    return last.state();
  }

  std::string dir_;
  std::unique_ptr<Master> master_;
  std::unique_ptr<jobs::JobManager> jobs_;
  std::unique_ptr<SlicedServer> server_;
  std::unique_ptr<v1::Admin::Stub> admin_;
  std::unique_ptr<v1::Serving::Stub> serving_;
  std::unique_ptr<v1::FineTune::Stub> finetune_;
};

// One RPC of the campaign: a valid request and how to call it.
struct Rpc {
  std::string name;
  std::unique_ptr<pb::Message> valid;
  std::function<grpc::Status(const pb::Message& req, pb::Message* reply)> call;
  std::unique_ptr<pb::Message> reply;  // the response type (for the state checks)
};

template <typename Req, typename Resp, typename Fn>
Rpc Unary(std::string name, Req valid, Fn fn) {
  Rpc r;
  r.name = std::move(name);
  r.valid = std::make_unique<Req>(std::move(valid));
  r.reply = std::make_unique<Resp>();
  r.call = [fn](const pb::Message& req, pb::Message* reply) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return fn(&ctx, static_cast<const Req&>(req), static_cast<Resp*>(reply));
  };
  return r;
}

template <typename Req, typename Event, typename Fn>
Rpc Streaming(std::string name, Req valid, Fn fn) {
  Rpc r;
  r.name = std::move(name);
  r.valid = std::make_unique<Req>(std::move(valid));
  r.reply = std::make_unique<Event>();
  r.call = [fn](const pb::Message& req, pb::Message* reply) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto reader = fn(&ctx, static_cast<const Req&>(req));
    Event e;
    while (reader->Read(&e)) static_cast<Event*>(reply)->CopyFrom(e);
    return reader->Finish();
  };
  return r;
}

TEST_F(RpcMutationTest, MutatedRequestsGetNamedErrorsAndLeaveStateIntact) {
  // Baseline state: one deployment, one finished instance, one job.
  v1::RegisterDeploymentRequest reg;
  reg.mutable_spec()->set_name("base");
  reg.mutable_spec()->mutable_model()->set_preset("tiny");
  reg.mutable_spec()->mutable_weights()->set_seed(3);
  reg.mutable_spec()->set_role(v1::DEPLOYMENT_ROLE_ONLINE);
  reg.mutable_spec()->add_partitions("single");
  {
    v1::RegisterDeploymentResponse out;
    grpc::ClientContext ctx;
    ASSERT_TRUE(serving_->RegisterDeployment(&ctx, reg, &out).ok());
  }
  ASSERT_EQ(RunPrefill("base"), v1::INSTANCE_STATE_DONE);
  v1::SubmitJobRequest job;
  job.set_yaml(JobYaml("first"));
  uint64_t job_id = 0;
  {
    v1::SubmitJobResponse out;
    grpc::ClientContext ctx;
    grpc::Status s = finetune_->SubmitJob(&ctx, job, &out);
    ASSERT_TRUE(s.ok()) << s.error_message();
    job_id = out.job_id();
  }

  // Valid requests of every RPC.
  v1::SubmitRequest submit;
  submit.set_template_name("base/prefill");
  (*submit.mutable_bindings())["B"] = 1;
  (*submit.mutable_bindings())["S"] = 4;
  submit.set_label("x");
  v1::SubmitRequest decode;
  decode.set_template_name("base/decode");
  (*decode.mutable_bindings())["B"] = 1;
  (*decode.mutable_bindings())["C"] = 4;
  decode.add_checkpoints()->set_name("kv0");
  v1::GenerateRequest generate;
  generate.set_deployment("base");
  generate.add_prompt_token_ids(1);
  generate.add_prompt_token_ids(2);
  generate.set_max_tokens(2);
  v1::WatchRequest watch;
  watch.set_instance_id(1);
  v1::CancelRequest cancel;
  cancel.set_instance_id(1);
  v1::EstimatorsRequest estimators;
  estimators.set_device_type("testdev");
  v1::TimelineRequest timeline;
  timeline.set_max_events(10);
  v1::ListJobsRequest list_jobs;
  list_jobs.set_page_size(2);
  v1::GetJobRequest get_job;
  get_job.set_job_id(job_id);
  get_job.set_include_events(true);
  v1::CancelJobRequest cancel_job;
  cancel_job.set_job_id(job_id + 1);
  v1::SubmitJobRequest submit_job;
  submit_job.set_yaml(JobYaml("second"));
  submit_job.set_validate_only(false);

  v1::Serving::Stub* serving = serving_.get();
  v1::Admin::Stub* admin = admin_.get();
  v1::FineTune::Stub* finetune = finetune_.get();
  std::vector<Rpc> rpcs;
  rpcs.push_back(Unary<v1::RegisterDeploymentRequest, v1::RegisterDeploymentResponse>(
      "Serving.RegisterDeployment", reg,
      [serving](auto* c, const auto& q, auto* a) { return serving->RegisterDeployment(c, q, a); }));
  rpcs.push_back(Unary<v1::ListDeploymentsRequest, v1::ListDeploymentsResponse>(
      "Serving.ListDeployments", v1::ListDeploymentsRequest(),
      [serving](auto* c, const auto& q, auto* a) { return serving->ListDeployments(c, q, a); }));
  rpcs.push_back(Unary<v1::SubmitRequest, v1::SubmitResponse>(
      "Serving.Submit", submit, [serving](auto* c, const auto& q, auto* a) { return serving->Submit(c, q, a); }));
  rpcs.push_back(Unary<v1::SubmitRequest, v1::SubmitResponse>(
      "Serving.Submit(decode)", decode,
      [serving](auto* c, const auto& q, auto* a) { return serving->Submit(c, q, a); }));
  rpcs.push_back(Streaming<v1::GenerateRequest, v1::GenerateResponse>(
      "Serving.Generate", generate, [serving](auto* c, const auto& q) { return serving->Generate(c, q); }));
  rpcs.push_back(Streaming<v1::WatchRequest, v1::InstanceEvent>(
      "Serving.Watch", watch, [serving](auto* c, const auto& q) { return serving->Watch(c, q); }));
  rpcs.push_back(Unary<v1::CancelRequest, v1::CancelResponse>(
      "Serving.Cancel", cancel, [serving](auto* c, const auto& q, auto* a) { return serving->Cancel(c, q, a); }));
  rpcs.push_back(Unary<v1::StatusRequest, v1::StatusResponse>(
      "Admin.Status", v1::StatusRequest(), [admin](auto* c, const auto& q, auto* a) { return admin->Status(c, q, a); }));
  rpcs.push_back(Unary<v1::DevicesRequest, v1::DevicesResponse>(
      "Admin.Devices", v1::DevicesRequest(),
      [admin](auto* c, const auto& q, auto* a) { return admin->Devices(c, q, a); }));
  rpcs.push_back(Unary<v1::EstimatorsRequest, v1::EstimatorsResponse>(
      "Admin.Estimators", estimators, [admin](auto* c, const auto& q, auto* a) { return admin->Estimators(c, q, a); }));
  rpcs.push_back(Unary<v1::DumpGmgRequest, v1::GmgDump>(
      "Admin.DumpGmg", v1::DumpGmgRequest(), [admin](auto* c, const auto& q, auto* a) { return admin->DumpGmg(c, q, a); }));
  rpcs.push_back(Unary<v1::TimelineRequest, v1::TimelineResponse>(
      "Admin.Timeline", timeline, [admin](auto* c, const auto& q, auto* a) { return admin->Timeline(c, q, a); }));
  rpcs.push_back(Unary<v1::SubmitJobRequest, v1::SubmitJobResponse>(
      "FineTune.SubmitJob", submit_job,
      [finetune](auto* c, const auto& q, auto* a) { return finetune->SubmitJob(c, q, a); }));
  rpcs.push_back(Unary<v1::ListJobsRequest, v1::ListJobsResponse>(
      "FineTune.ListJobs", list_jobs, [finetune](auto* c, const auto& q, auto* a) { return finetune->ListJobs(c, q, a); }));
  rpcs.push_back(Unary<v1::GetJobRequest, v1::GetJobResponse>(
      "FineTune.GetJob", get_job, [finetune](auto* c, const auto& q, auto* a) { return finetune->GetJob(c, q, a); }));
  rpcs.push_back(Unary<v1::CancelJobRequest, v1::CancelJobResponse>(
      "FineTune.CancelJob", cancel_job,
      [finetune](auto* c, const auto& q, auto* a) { return finetune->CancelJob(c, q, a); }));

  // The deployments the daemon must hold afterwards: name -> spec of the last
  // successful registration.
  std::map<std::string, v1::DeploymentSpec> expected;
  expected["base"] = reg.spec();

  fuzz::Mutator bytes(kSeed);
  ProtoMutator fields(&bytes);
  const int iterations = Iterations(1200);
  std::map<std::string, std::pair<int, int>> counts;  // rpc -> (ok, error)
  std::map<std::string, std::map<int, int>> codes;     // rpc -> error code -> count
  int reported = 0;
  int transport_rejected = 0;
  pb::LogSilencer silence_invalid_utf8_logs;
  for (int i = 0; i < iterations; ++i) {
    Rpc& rpc = rpcs[static_cast<size_t>(i) % rpcs.size()];
    std::unique_ptr<pb::Message> req(rpc.valid->New());
    req->CopyFrom(*rpc.valid);
    const size_t n = 1 + bytes.Below(3);
    for (size_t k = 0; k < n; ++k) fields.Mutate(req.get());
    if (bytes.Below(4) == 0) {
      // Byte-level: the serialized request mutated; kept when it still parses.
      std::unique_ptr<pb::Message> parsed(rpc.valid->New());
      if (parsed->ParsePartialFromString(bytes.Mutate(DeterministicBytes(*req)))) req = std::move(parsed);
    }
    // A string field with invalid UTF-8 does not survive the server's proto3
    // parsing: gRPC answers INTERNAL before any handler runs.
    const bool unparseable = !std::unique_ptr<pb::Message>(rpc.valid->New())->ParseFromString(DeterministicBytes(*req));
    std::unique_ptr<pb::Message> reply(rpc.reply->New());
    const grpc::Status s = rpc.call(*req, reply.get());
    if (unparseable) {
      ++transport_rejected;
      // (or RESOURCE_EXHAUSTED when it is also over the size limit)
      EXPECT_TRUE(s.error_code() == grpc::StatusCode::INTERNAL ||
                  s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED)
          << rpc.name << ": " << s.error_code() << " " << req->ShortDebugString().substr(0, 1000);
      continue;
    }
    auto& [ok, err] = counts[rpc.name];
    if (s.ok()) {
      ++ok;
      if (rpc.name == "Serving.RegisterDeployment") {
        const auto& r = static_cast<const v1::RegisterDeploymentRequest&>(*req);
        expected[r.spec().name()] = r.spec();
      }
      continue;
    }
    ++err;
    if (++codes[rpc.name][static_cast<int>(s.error_code())] == 1 && std::getenv("SLICESCHED_FUZZ_VERBOSE") != nullptr) {
      std::printf("[fuzz] %s code %d: %s\n", rpc.name.c_str(), static_cast<int>(s.error_code()),
                  s.error_message().substr(0, 300).c_str());
    }
    std::set<std::string> names;
    FieldNames(req->GetDescriptor(), &names);
    bool names_field = false;
    for (const std::string& f : names) names_field = names_field || s.error_message().find(f) != std::string::npos;
    names_field = names_field || s.error_message().find("<job>:") != std::string::npos;
    const bool bad_code = s.error_code() == grpc::StatusCode::INTERNAL || s.error_code() == grpc::StatusCode::UNKNOWN ||
                          s.error_code() == grpc::StatusCode::DATA_LOSS;
    const bool unnamed = s.error_code() == grpc::StatusCode::INVALID_ARGUMENT && !names_field;
    if ((bad_code || unnamed || s.error_message().empty()) && reported++ < 10) {
      ADD_FAILURE() << rpc.name << " answered " << s.error_code() << " '" << s.error_message().substr(0, 400)
                    << "' to\n" << req->ShortDebugString().substr(0, 1500);
    }
  }
  std::printf("[fuzz] rpc: %d of %d requests had invalid UTF-8 in a string field (rejected by gRPC)\n",
              transport_rejected, iterations);
  for (const auto& [name, c] : counts) {
    std::string by_code;
    for (const auto& [code, n] : codes[name]) by_code += StrCat(" code", code, "=", n);
    std::printf("[fuzz] rpc %s: %d OK, %d errors (%s)\n", name.c_str(), c.first, c.second, by_code.c_str());
  }

  // The daemon's state afterwards.
  v1::ListDeploymentsResponse list;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(serving_->ListDeployments(&ctx, v1::ListDeploymentsRequest(), &list).ok());
  }
  std::map<std::string, v1::DeploymentSpec> held;
  for (const v1::Deployment& d : list.deployments()) held[d.spec().name()] = d.spec();
  ASSERT_EQ(held.size(), expected.size());
  for (const auto& [name, spec] : expected) {
    ASSERT_TRUE(held.count(name)) << name;
    // The daemon reports the spec as it holds it (e.g. the partitions it
    // enabled), so compare what a client controls.
    EXPECT_EQ(held[name].model().ShortDebugString(), spec.model().ShortDebugString()) << name;
    EXPECT_EQ(held[name].role(), spec.role()) << name;
  }
  EXPECT_EQ(RunPrefill("base"), v1::INSTANCE_STATE_DONE);
  {
    v1::GetJobResponse out;
    grpc::ClientContext ctx;
    v1::GetJobRequest q;
    q.set_job_id(job_id);
    grpc::Status s = finetune_->GetJob(&ctx, q, &out);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(out.job().yaml(), job.yaml());
  }
  {
    grpc::ClientContext ctx;
    v1::StatusResponse st;
    ASSERT_TRUE(admin_->Status(&ctx, v1::StatusRequest(), &st).ok());
    EXPECT_EQ(st.deployments_size(), static_cast<int>(expected.size()));
  }
  {
    grpc::ClientContext ctx;
    v1::DevicesResponse devs;
    ASSERT_TRUE(admin_->Devices(&ctx, v1::DevicesRequest(), &devs).ok());
    for (const auto& d : devs.devices()) EXPECT_TRUE(d.healthy()) << d.error();
  }
  {
    grpc::ClientContext ctx;
    v1::GmgDump dump;
    ASSERT_TRUE(admin_->DumpGmg(&ctx, v1::DumpGmgRequest(), &dump).ok());
  }
}

TEST_F(RpcMutationTest, LongNamesInErrorsDoNotExceedTheClientsMetadataLimit) {
  // Found by the campaign: an error echoing a 64 KiB deployment name went
  // over gRPC's metadata limit, so the client saw RESOURCE_EXHAUSTED
  // "received initial metadata size exceeds limit" instead of the error.
  const std::string name(64 << 10, 'a');
  {
    v1::GenerateRequest req;
    req.set_deployment(name);
    req.add_prompt_token_ids(1);
    req.set_max_tokens(1);
    grpc::ClientContext ctx;
    Deadline(&ctx, 30);
    auto reader = serving_->Generate(&ctx, req);
    v1::GenerateResponse out;
    while (reader->Read(&out)) {
    }
    const grpc::Status s = reader->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
    EXPECT_THAT(s.error_message(), ::testing::HasSubstr("deployment: no deployment 'aaaa"));
  }
  {
    v1::SubmitRequest req;
    req.set_template_name(name);
    v1::SubmitResponse out;
    grpc::ClientContext ctx;
    Deadline(&ctx, 30);
    const grpc::Status s = serving_->Submit(&ctx, req, &out);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
    EXPECT_THAT(s.error_message(), ::testing::HasSubstr("template_name: no template 'aaaa"));
  }
}

}  // namespace
}  // namespace slicesched
