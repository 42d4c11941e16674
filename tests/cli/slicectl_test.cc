// slicectl's commands run in-process (RunSlicectl with argv vectors and
// captured output) against a real Master and the gRPC services on a unix
// socket: tables and JSON, GMG DOT/JSON, the timeline's Chrome trace, and the
// exit codes (usage 2, cannot connect 3, server error 1).
#include "slicesched/cli/slicectl.h"

#include <gmock/gmock.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "docs/docs_text.h"
#include "slicesched/common/strings.h"
#include "slicesched/jobs/job_manager.h"
#include "slicesched/server/config.h"
#include "slicesched/server/master.h"
#include "slicesched/server/services.h"
#include "slicesched/v1/admin.grpc.pb.h"
#include "slicesched/v1/serving.grpc.pb.h"

namespace slicesched {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

struct Result {
  int code = -1;
  std::string out, err;
};

google::protobuf::Struct ParseJson(const std::string& json) {
  google::protobuf::Struct s;
  const auto status = google::protobuf::util::JsonStringToMessage(json, &s);
  EXPECT_TRUE(status.ok()) << status.ToString() << "\n" << json;
  return s;
}

class SlicectlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    dir_ = StrCat(::testing::TempDir(), "/slicectl_", ::getpid(), "_", counter++);
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    socket_ = dir_ + "/s.sock";
    auto c = ParseSlicedConfig(
        YAML::Load(StrCat("cluster:\n"
                          "  devices: [{name: v, count: 2, type: testdev, memory: 1GiB, backend: virtual}]\n"
                          "  links: {default: {bandwidth: 10GB/s, latency: 5us}}\n"
                          "deployments: [{name: tiny-a, model: tiny, weights: {seed: 1}, role: online, "
                          "partitions: [single]}]\n"
                          "listen: {unix_socket: ",
                          socket_, "}\nstate_dir: ", dir_, "/state\n")),
        "<test>");
    ASSERT_TRUE(c.ok()) << c.status();
    MasterOptions mo;
    mo.estimator_save_interval = Duration::Seconds(3600);
    auto m = Master::Start(*c, mo);
    ASSERT_TRUE(m.ok()) << m.status();
    master_ = *std::move(m);
    ServerOptions so;
    so.unix_socket = socket_;
    if (with_jobs_) {
      jobs::JobManager::Options jo;
      jo.now_unix_ms = [] { return int64_t{1'700'000'000'000}; };
      auto jm = jobs::JobManager::Open(dir_ + "/state", std::move(jo));
      ASSERT_TRUE(jm.ok()) << jm.status();
      jobs_ = *std::move(jm);
    }
    auto s = SlicedServer::Start(master_.get(), so, jobs_.get());
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
  }
  void TearDown() override {
    if (server_) server_->Shutdown(absl::Seconds(1));
    server_.reset();
    if (master_) master_->Shutdown();
    master_.reset();
  }

  // slicectl --socket <ours> ARGS...
  Result Run(std::vector<std::string> args) {
    args.insert(args.begin(), {"--socket", socket_});
    std::ostringstream out, err;
    Result r;
    r.code = RunSlicectl(args, out, err);
    r.out = out.str();
    r.err = err.str();
    return r;
  }

  // Runs one prefill instance to completion.
  void RunOneInstance() {
    SubmitArgs a;
    a.template_name = "tiny-a/prefill";
    a.bindings = {{"B", 1}, {"S", 8}};
    auto sub = master_->Submit(a);
    ASSERT_TRUE(sub.ok()) << sub.status();
    auto rec = master_->FindInstance(sub->instance_id);
    ASSERT_TRUE(rec.ok());
    bool closed = false;
    for (size_t seen = 0; !closed;) seen += (*rec)->WaitFrom(seen, absl::Seconds(30), &closed).size();
    ASSERT_EQ((*rec)->Last().state, InstanceState::kDone);
  }

  bool with_jobs_ = false;  // serve FineTune from a JobManager in the state dir
  std::string dir_, socket_;
  std::unique_ptr<Master> master_;
  std::unique_ptr<jobs::JobManager> jobs_;
  std::unique_ptr<SlicedServer> server_;
};

class SlicectlJobsTest : public SlicectlTest {
 protected:
  void SetUp() override {
    with_jobs_ = true;
    SlicectlTest::SetUp();
  }
};

// docs/operations.md: a job file's dataset.path is "relative to the file for
// files", as the examples in configs/jobs/ are written; slicectl used to send
// it as is and the daemon refused it ("must be an absolute path").
TEST_F(SlicectlJobsTest, SubmitAnchorsARelativeDatasetPathAtTheFile) {
  const std::string jobs_dir = std::filesystem::path(dir_ + "/jobs").lexically_normal().string();
  std::filesystem::create_directories(jobs_dir + "/data");
  std::ofstream(jobs_dir + "/data/d.jsonl") << "{\"tokens\": [1, 2, 3], \"label\": 1}\n";
  const std::string job = jobs_dir + "/j.yaml";
  std::ofstream(job) << "name: j\nbackbone: tiny\ndataset:\n  path: data/d.jsonl\n"
                        "hyperparameters: {learning_rate: 1e-3, batch_size: 1}\n"
                        "stop: {metric: loss, target: 0.1, max_epochs: 1}\nallow_sharing: false\n";
  Result r = Run({"submit", job});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "job 1 submitted\n");
  auto got = jobs_->Get(1);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->spec.dataset.path, jobs_dir + "/data/d.jsonl");

  // The daemon's errors name the file, at the file's own line:col.
  std::ofstream(job) << "name: j\nbackbone: tiny\ndataset: {path: data/missing.jsonl}\n"
                        "hyperparameters: {learning_rate: fast, batch_size: 1}\n"
                        "stop: {metric: loss, target: 0.1, max_epochs: 1}\n";
  r = Run({"submit", job, "--validate-only"});
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_THAT(r.err, HasSubstr(StrCat("\n", job, ":4:34: hyperparameters.learning_rate: expected a number")));
  EXPECT_THAT(r.err, HasSubstr(jobs_dir + "/data/missing.jsonl"));
  EXPECT_THAT(r.err, ::testing::Not(HasSubstr("<job>")));
}

// A directory where the job file belongs used to read as nothing: "cannot
// read 'DIR' (or it is empty)" did not say what was wrong. Both are usage
// errors (exit 2), named before connecting.
TEST_F(SlicectlTest, SubmitNamesADirectoryAndAnEmptyFile) {
  const std::string jobs_dir = dir_ + "/jobdir";
  std::filesystem::create_directories(jobs_dir);
  Result r = Run({"submit", jobs_dir});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr(StrCat("submit: '", jobs_dir, "' is a directory; expected a job YAML file")));
  std::ofstream(jobs_dir + "/empty.yaml").flush();
  r = Run({"submit", jobs_dir + "/empty.yaml"});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr(StrCat("submit: '", jobs_dir, "/empty.yaml' is empty; expected a job YAML file")));
  r = Run({"submit", jobs_dir + "/absent.yaml"});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr(StrCat("submit: cannot read '", jobs_dir, "/absent.yaml': No such file or directory")));
}

// operations.md documents FineTune.CancelJob, but slicectl had no command
// for it: a user could submit and watch a job, not stop it.
TEST_F(SlicectlJobsTest, CancelJob) {
  const std::string job = dir_ + "/synthetic.yaml";
  std::ofstream(job) << "name: s\nbackbone: tiny\ndataset: {synthetic: {task: parity, seed: 7}}\n"
                        "hyperparameters: {learning_rate: 1e-3, batch_size: 8}\n"
                        "stop: {metric: accuracy, target: 0.9, max_epochs: 1}\nallow_sharing: false\n";
  ASSERT_EQ(Run({"submit", job}).code, 0);
  Result r = Run({"cancel-job", "1", "--reason", "wrong learning rate"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "job 1: cancelled\n");
  auto events = jobs_->Events(1);
  ASSERT_TRUE(events.ok()) << events.status();
  EXPECT_THAT(events->back().details_json, HasSubstr("wrong learning rate"));
  r = Run({"cancel-job", "1"});  // finished: unchanged, its state printed
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "job 1: cancelled\n");
  r = Run({"cancel-job", "9"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, StartsWith("slicectl: NOT_FOUND: "));
  r = Run({"cancel-job", "x"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, StartsWith("slicectl: cancel-job: ID must be a positive number, got 'x'"));
}

TEST(SlicectlAnchor, OnlyTheRelativeDatasetPathChanges) {
  EXPECT_EQ(AnchorJobDatasetPath("dataset:\n  path: d/x.jsonl  # c\nname: a\n", "/w"),
            "dataset:\n  path: \"/w/d/x.jsonl\"  # c\nname: a\n");
  EXPECT_EQ(AnchorJobDatasetPath("dataset: {path: './x y.bin', format: tokens-bin}\n", "/w's"),
            "dataset: {path: '/w''s/./x y.bin', format: tokens-bin}\n");
  EXPECT_EQ(AnchorJobDatasetPath("dataset: {path: \"x.jsonl\"}\n", "/a\"b"), "dataset: {path: \"/a\\\"b/x.jsonl\"}\n");
  for (const std::string same : {"dataset: {path: /abs/x.jsonl}\n", "dataset: {synthetic: {task: lm, seed: 1}}\n",
                                 "dataset: {path: [1]}\n", "dataset: {path: ''}\n", "name: [unclosed\n", "- 1\n"}) {
    EXPECT_EQ(AnchorJobDatasetPath(same, "/w"), same);
  }
}

TEST_F(SlicectlTest, StatusTableAndJson) {
  Result r = Run({"status"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("state           SERVING\n"));
  EXPECT_THAT(r.out, HasSubstr("deployments     tiny-a\n"));
  EXPECT_THAT(r.out, HasSubstr("policy          SliceScheduler\n"));

  r = Run({"status", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = ParseJson(r.out);
  EXPECT_EQ(j.fields().at("state").string_value(), "SERVING_STATE_SERVING");
  EXPECT_EQ(j.fields().at("num_devices").number_value(), 2);
  EXPECT_EQ(j.fields().at("deployments").list_value().values(0).string_value(), "tiny-a");

  // The runtime calibration, per device and the overlap factors.
  RunOneInstance();
  r = Run({"status"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\ncalibration (speed factor per device"));
  EXPECT_THAT(r.out, HasSubstr("FACTOR OF         VALUE  DRIFT  RAW    WEIGHT  SAMPLES  OPERATORS  BUSY"));
  EXPECT_THAT(r.out, HasSubstr("\nv0                "));
  EXPECT_THAT(r.out, HasSubstr("\noverlap           "));
  EXPECT_THAT(r.out, HasSubstr("\ntransfer overlap  1.000"));
  r = Run({"status", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto cal = ParseJson(r.out).fields().at("calibration").struct_value();
  const auto& devices = cal.fields().at("devices").list_value();
  ASSERT_EQ(devices.values_size(), 2);
  int64_t operators = 0;
  for (int d = 0; d < 2; ++d) {
    const auto& dev = devices.values(d).struct_value().fields();
    EXPECT_EQ(dev.at("name").string_value(), StrCat("v", d));
    EXPECT_GT(dev.at("speed").struct_value().fields().at("factor").number_value(), 0.0);
    EXPECT_GT(dev.at("drift").struct_value().fields().at("factor").number_value(), 0.0);
    if (dev.contains("operators")) operators += std::stoll(dev.at("operators").string_value());
  }
  EXPECT_GT(operators, 0);
  EXPECT_TRUE(cal.fields().contains("overlap"));
}

TEST_F(SlicectlTest, DevicesAndDeploymentsTables) {
  Result r = Run({"devices"});
  ASSERT_EQ(r.code, 0) << r.err;
  std::vector<std::string> lines = absl::StrSplit(r.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3u) << r.out;  // header + 2 devices
  EXPECT_THAT(lines[0], StartsWith("ID  NAME  TYPE     BACKEND  MEMORY"));
  EXPECT_THAT(lines[1], StartsWith("0   v0    testdev  virtual  "));
  EXPECT_THAT(lines[2], HasSubstr(" / 1.0 GiB"));
  // Columns line up: every row has BACKEND at the header's offset.
  const size_t col = lines[0].find("BACKEND");
  for (size_t i = 1; i < lines.size(); ++i) EXPECT_EQ(lines[i].substr(col, 7), "virtual") << lines[i];

  r = Run({"--json", "devices"});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = ParseJson(r.out);
  ASSERT_EQ(j.fields().at("devices").list_value().values_size(), 2);
  EXPECT_EQ(j.fields()
                .at("devices")
                .list_value()
                .values(1)
                .struct_value()
                .fields()
                .at("device")
                .struct_value()
                .fields()
                .at("name")
                .string_value(),
            "v1");

  r = Run({"deployments"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, StartsWith("NAME    MODEL  ROLE    PARTITIONS  WEIGHTS"));
  EXPECT_THAT(r.out, HasSubstr("tiny-a  tiny   online  single"));
  EXPECT_THAT(r.out, HasSubstr("tiny-a/prefill tiny-a/decode\n"));
  r = Run({"deployments", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(ParseJson(r.out).fields().at("deployments").list_value().values_size(), 1);
}

TEST_F(SlicectlTest, GmgDumpJsonDotAndInstances) {
  RunOneInstance();
  Result r = Run({"gmg", "dump"});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = ParseJson(r.out);
  EXPECT_EQ(j.fields().at("devices").list_value().values_size(), 2);
  EXPECT_TRUE(j.fields().contains("taken_at_ns"));

  r = Run({"gmg", "dump", "--format", "dot"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, StartsWith("digraph gmg {\n"));
  EXPECT_THAT(r.out, ::testing::EndsWith("}\n"));

  r = Run({"instances"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, StartsWith("ID  TEMPLATE  CLASS  PRIO  STATE  OPS  AGE  DEADLINE IN  LABEL"));  // none live

  // DOT of a dump with nodes and an edge (the formatter, without a daemon).
  v1::GmgDump d;
  v1::Instance* inst = d.add_instances();
  inst->set_id(7);
  inst->set_template_name("t/prefill");
  v1::Node* a = d.add_nodes();
  a->set_id(1);
  a->set_instance(7);
  a->set_op("embed \"x\"");
  a->set_device(0);
  a->set_dst_device(-1);
  a->set_state(v1::NODE_STATE_DONE);
  v1::Node* b = d.add_nodes();
  b->set_id(2);
  b->set_instance(7);
  b->set_op("transfer");
  b->set_device(0);
  b->set_dst_device(1);
  b->add_preds(1);
  const std::string dot = GmgDumpToDot(d);
  EXPECT_THAT(dot, HasSubstr("subgraph cluster_7 {"));
  EXPECT_THAT(dot, HasSubstr("n1 [label=\"embed \\\"x\\\" dev0 done\", color=gray];"));
  EXPECT_THAT(dot, HasSubstr("shape=ellipse"));
  EXPECT_THAT(dot, HasSubstr("n1 -> n2;"));
}

TEST_F(SlicectlTest, TimelineWritesAChromeTrace) {
  RunOneInstance();
  Result r = Run({"timeline"});
  ASSERT_EQ(r.code, 0) << r.err;
  auto j = ParseJson(r.out);
  int complete = 0;
  for (const auto& v : j.fields().at("traceEvents").list_value().values()) {
    complete += v.struct_value().fields().at("ph").string_value() == "X";
  }
  EXPECT_GT(complete, 0);
  EXPECT_EQ(complete % 2, 0);  // every interval has its predicted twin

  const std::string path = dir_ + "/trace.json";
  r = Run({"timeline", "--out", path, "--max-events", "1"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("bytes to " + path));
  EXPECT_THAT(r.err, HasSubstr("truncated"));
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  j = ParseJson(ss.str());
  complete = 0;
  for (const auto& v : j.fields().at("traceEvents").list_value().values()) {
    complete += v.struct_value().fields().at("ph").string_value() == "X";
  }
  EXPECT_EQ(complete, 2);  // one event: actual + predicted
}

TEST_F(SlicectlTest, CancelUnknownInstanceIsAServerError) {
  Result r = Run({"cancel", "424242"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("slicectl: NOT_FOUND: instance_id: no instance 424242"));
}

TEST_F(SlicectlTest, ServerErrorsExitOne) {
  // The virtual backend computes no tokens: Generate is refused.
  Result r = Run({"generate", "tiny-a", "--prompt", "1 2 3", "--max-tokens", "4", "--seed", "7", "--top-p", "0.9"});
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_THAT(r.err, StartsWith("slicectl: FAILED_PRECONDITION: "));

  // This in-process server has no JobManager: FineTune is not served.

  const std::string job = dir_ + "/job.yaml";
  std::ofstream(job) << "name: j\n";
  r = Run({"submit", job});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, StartsWith("slicectl: UNIMPLEMENTED: "));
  EXPECT_EQ(Run({"jobs"}).code, 1);
  EXPECT_EQ(Run({"job", "3"}).code, 1);
}

TEST_F(SlicectlTest, UsageErrorsExitTwo) {
  const std::vector<std::vector<std::string>> bad = {
      {},
      {"frobnicate"},
      {"status", "extra"},
      {"status", "--bogus"},
      {"cancel"},
      {"cancel", "abc"},
      {"gmg", "show"},
      {"gmg", "dump", "--format", "svg"},
      {"generate", "tiny-a", "--max-tokens", "3"},
      {"generate", "tiny-a", "--prompt", "1 x", "--max-tokens", "3"},
      {"generate", "tiny-a", "--prompt", "1", "--max-tokens", "0"},
      {"generate", "tiny-a", "--prompt", "1", "--max-tokens", "2", "--top-p", "1.5"},
      {"submit", "/nonexistent/job.yaml"},
      {"timeline", "--max-events", "-1"},
      {"timeline", "--out"},
      {"status", "--timeout", "soon"},
      {"batch"},
      {"batch", "run"},
      {"batch", "get", "0"},
      {"batch", "get"},
      {"batch", "list", "--strict"},
      {"batch", "cancel", "x"},
      {"batch", "submit", "/nonexistent/requests.jsonl"},
      {"batch", "submit", "/"},
  };
  for (const auto& args : bad) {
    Result r = Run(args);
    EXPECT_EQ(r.code, 2) << absl::StrJoin(args, " ") << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr("usage: slicectl")) << absl::StrJoin(args, " ");
  }
  Result help = Run({"--help"});
  EXPECT_EQ(help.code, 0);
  EXPECT_THAT(help.out, HasSubstr("Exit codes: 0 ok, 1 server error, 2 usage error, 3 cannot connect."));
}

TEST_F(SlicectlTest, UnreachableSocketExitsThree) {
  std::ostringstream out, err;
  EXPECT_EQ(RunSlicectl({"--socket", dir_ + "/nobody.sock", "status"}, out, err), 3);
  EXPECT_THAT(err.str(), HasSubstr("cannot connect to unix:" + dir_ + "/nobody.sock"));
  // A file that is not a socket.
  std::ofstream(dir_ + "/plain") << "x";
  std::ostringstream out2, err2;
  EXPECT_EQ(RunSlicectl({"--socket", dir_ + "/plain", "status"}, out2, err2), 3);
  EXPECT_THAT(err2.str(), HasSubstr("not a socket"));
  // A stale socket file (bound, then closed): nothing listens; give up after
  // --connect-timeout.
  const std::string stale = dir_ + "/stale.sock";
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", stale.c_str());
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ::close(fd);
  std::ostringstream out3, err3;
  EXPECT_EQ(RunSlicectl({"--socket", stale, "--connect-timeout", "0.2", "status"}, out3, err3), 3);
  EXPECT_THAT(err3.str(), HasSubstr("nothing listening"));
}

// Serving.Generate is not implemented by the daemon yet; a stand-in server
// streams tokens so the client's streaming output is checked.
class StreamingServing final : public v1::Serving::Service {
 public:
  grpc::Status Generate(grpc::ServerContext*, const v1::GenerateRequest* req,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override {
    last_ = *req;
    for (uint32_t i = 0; i < req->max_tokens(); ++i) {
      v1::GenerateResponse r;
      r.set_request_id(9);
      r.set_token_id(req->prompt_token_ids(0) + i);
      r.set_index(i);
      r.set_time_from_arrival_ms(1.5 * (i + 1));
      if (i + 1 == req->max_tokens()) r.set_finish_reason(v1::FINISH_REASON_LENGTH);
      writer->Write(r);
    }
    return grpc::Status::OK;
  }
  v1::GenerateRequest last_;
};

TEST(SlicectlGenerate, PrintsTokensAsTheyStream) {
  const std::string sock = StrCat(::testing::TempDir(), "/slicectl_gen_", ::getpid(), ".sock");
  std::filesystem::remove(sock);
  StreamingServing serving;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + sock, grpc::InsecureServerCredentials());
  builder.RegisterService(&serving);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);

  std::ostringstream out, err;
  ASSERT_EQ(RunSlicectl({"--socket", sock, "generate", "tiny", "--prompt", "40 2,3", "--max-tokens", "3", "--seed", "7",
                         "--top-p", "0.5", "--offline"},
                        out, err),
            0)
      << err.str();
  EXPECT_EQ(out.str(), "40 41 42\n3 tokens, finish LENGTH, first token 1.5 ms, last 4.5 ms\n");
  EXPECT_EQ(serving.last_.deployment(), "tiny");
  EXPECT_THAT(serving.last_.prompt_token_ids(), ::testing::ElementsAre(40u, 2u, 3u));
  EXPECT_EQ(serving.last_.sampling().seed(), 7u);
  EXPECT_FLOAT_EQ(serving.last_.sampling().top_p(), 0.5f);
  EXPECT_EQ(serving.last_.priority_class(), v1::PRIORITY_CLASS_OFFLINE);

  std::ostringstream jout, jerr;
  ASSERT_EQ(
      RunSlicectl({"--socket", sock, "--json", "generate", "tiny", "--prompt", "5", "--max-tokens", "2"}, jout, jerr),
      0);
  std::vector<std::string> lines = absl::StrSplit(jout.str(), '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 2u) << jout.str();
  EXPECT_EQ(ParseJson(lines[1]).fields().at("finish_reason").string_value(), "FINISH_REASON_LENGTH");
  server->Shutdown();
  std::filesystem::remove(sock);
}

// --token travels as `authorization: Bearer TOKEN` (the daemon trusts unix
// socket peers, so a stand-in Admin service checks it here).
class TokenAdmin final : public v1::Admin::Service {
 public:
  grpc::Status Status(grpc::ServerContext* ctx, const v1::StatusRequest*, v1::StatusResponse* out) override {
    auto it = ctx->client_metadata().find("authorization");
    if (it == ctx->client_metadata().end() || it->second != "Bearer s3cret") {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "wrong admin token");
    }
    out->set_version("stand-in");
    return grpc::Status::OK;
  }
};

TEST(SlicectlToken, SentAsBearerMetadata) {
  const std::string sock = StrCat(::testing::TempDir(), "/slicectl_token_", ::getpid(), ".sock");
  std::filesystem::remove(sock);
  TokenAdmin admin;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + sock, grpc::InsecureServerCredentials());
  builder.RegisterService(&admin);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  std::ostringstream out, err;
  EXPECT_EQ(RunSlicectl({"--socket", sock, "--token", "s3cret", "status"}, out, err), 0) << err.str();
  EXPECT_THAT(out.str(), HasSubstr("stand-in"));
  std::ostringstream out2, err2;
  EXPECT_EQ(RunSlicectl({"--socket", sock, "--token", "nope", "status"}, out2, err2), 1);
  EXPECT_EQ(err2.str(), "slicectl: UNAUTHENTICATED: wrong admin token\n");
  server->Shutdown();
  std::filesystem::remove(sock);
}

TEST(SlicectlFormat, TableAndBytes) {
  EXPECT_EQ(FormatTable({"A", "LONGER"}, {{"xyz", "1"}, {"q", ""}}), "A    LONGER\nxyz  1\nq\n");
  EXPECT_EQ(FormatTable({}, {{"k", "v"}, {"key", "value"}}), "k    v\nkey  value\n");
  EXPECT_EQ(HumanBytes(0), "0 B");
  EXPECT_EQ(HumanBytes(1536), "1.5 KiB");
  EXPECT_EQ(HumanBytes(int64_t{3} << 30), "3.0 GiB");
  EXPECT_EQ(HumanBytes(int64_t{300} << 20), "300 MiB");
  EXPECT_EQ(GrpcCodeName(grpc::StatusCode::UNIMPLEMENTED), "UNIMPLEMENTED");
}

// Splits a documented shell line into words ("..." quotes one word), up to a
// comment or a pipe.
std::vector<std::string> ShellWords(std::string_view line) {
  std::vector<std::string> words;
  std::string word;
  bool quoted = false, in_word = false;
  for (char ch : line) {
    if (ch == '"') {
      quoted = !quoted;
      in_word = true;
    } else if (!quoted && (ch == '#' || ch == '|') && !in_word) {
      break;
    } else if (!quoted && ch == ' ') {
      if (in_word) words.push_back(std::move(word));
      word.clear();
      in_word = false;
    } else {
      word += ch;
      in_word = true;
    }
  }
  if (in_word) words.push_back(std::move(word));
  return words;
}

// Every slicectl command line the README and docs/operations.md show parses:
// with no daemon to reach it gets as far as connecting (exit 3), not a usage
// error (exit 2). Sockets and addresses are replaced by unreachable ones,
// --tls-ca by a readable file, and a job file is read from the source tree.
TEST(SlicectlDocs, EveryDocumentedCommandLineParses) {
  const std::string dir = StrCat(::testing::TempDir(), "/slicectl_docs_", ::getpid());
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/ca.pem") << "not used: nothing is reached\n";
  int lines = 0;
  for (const char* doc : {"README.md", "docs/operations.md"}) {
    for (const std::string& line : testing_docs::CodeBlockLines(testing_docs::ReadSourceFile(doc), "sh")) {
      std::vector<std::string> words = ShellWords(line);
      if (words.empty() || std::filesystem::path(words[0]).filename() != "slicectl") continue;
      words.erase(words.begin());
      for (size_t i = 0; i + 1 < words.size(); ++i) {
        if (words[i] == "--socket") words[i + 1] = dir + "/no.sock";
        if (words[i] == "--address") words[i + 1] = "127.0.0.1:1";
        if (words[i] == "--tls-ca") words[i + 1] = dir + "/ca.pem";
        if (words[i] == "submit" && words[i + 1][0] != '/') {
          words[i + 1] = StrCat(SLICESCHED_SOURCE_DIR, "/", words[i + 1]);
        }
      }
      words.insert(words.begin(), {"--socket", dir + "/no.sock", "--connect-timeout", "0.2"});
      std::ostringstream out, err;
      EXPECT_EQ(RunSlicectl(words, out, err), kSlicectlCannotConnect) << doc << ": " << line << "\n" << err.str();
      ++lines;
    }
  }
  EXPECT_GE(lines, 10);
  // The command table: each command's first word is one slicectl knows.
  const std::string ops = testing_docs::ReadSourceFile("docs/operations.md");
  int commands = 0;
  for (const std::string& code : testing_docs::FirstColumnCodes(testing_docs::MarkdownSection(ops, "## slicectl"))) {
    const std::string command = code.substr(0, code.find(' '));
    std::ostringstream out, err;
    RunSlicectl({"--socket", dir + "/no.sock", command}, out, err);
    EXPECT_THAT(err.str(), Not(HasSubstr("unknown command"))) << code;
    ++commands;
  }
  EXPECT_GE(commands, 10);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace slicesched
