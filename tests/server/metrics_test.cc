// Prometheus text rendering (families, HELP/TYPE, histogram buckets, label
// escaping), the HTTP request handling, and the listener end to end on an
// ephemeral 127.0.0.1 port with a plain socket client.
#include "slicesched/server/metrics.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "docs/docs_text.h"
#include "slicesched/common/strings.h"

namespace slicesched {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

MetricsSnapshot Sample() {
  MetricsSnapshot m;
  m.version = "0.1.0";
  m.uptime_seconds = 12.5;
  m.devices.push_back({.name = "gpu\"0\"",
                       .type = "A16\\x\n",
                       .busy_ratio = 0.25,
                       .busy_seconds_total = 3,
                       .busy_batch_seconds_total = 0.75,
                       .queue_length = 2,
                       .memory_used_bytes = 1024,
                       .memory_capacity_bytes = 4096});
  m.devices.push_back({.name = "gpu1", .type = "A16", .busy_ratio = 0.5});
  for (double v : {0.0005, 0.003, 0.003, 0.2, 500.0}) m.classes[0].latency.Observe(v);
  m.classes[0].done = 5;
  m.classes[1].cancelled = 1;
  m.slo_total = 4;
  m.slo_met = 3;
  m.op_mape_pct = 7.5;
  m.op_observations = 40;
  m.op_keys.push_back({.device_type = "A16", .op_key = "tiny/prefill:g0", .mape_pct = 3, .samples = 9});
  m.schedule_call.Observe(0.0001);
  m.schedule_round.Observe(0.002);
  m.schedule_rounds = 3;
  m.simulated_ops = 5000;
  m.whatif_seconds = 0.5;
  m.batches = MetricsSnapshot::Batches{
      .by_state = {{"in_progress", 1}, {"completed", 2}}, .requests_ok = 7, .requests_error = 1, .tokens = 90,
      .in_flight = 3};
  return m;
}

// name{labels} -> value, for every sample line.
std::map<std::string, std::string> Samples(const std::string& text) {
  std::map<std::string, std::string> out;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    const size_t sp = line.rfind(' ');
    out[std::string(line.substr(0, sp))] = std::string(line.substr(sp + 1));
  }
  return out;
}

TEST(PrometheusText, EveryFamilyHasHelpAndTypeOnce) {
  const std::string text = RenderPrometheusText(Sample());
  std::map<std::string, int> help, type;
  std::vector<std::string> sample_names;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.empty()) continue;
    std::vector<std::string> parts = absl::StrSplit(line, ' ');
    if (line.substr(0, 7) == "# HELP ") {
      ++help[parts[2]];
    } else if (line.substr(0, 7) == "# TYPE ") {
      ++type[parts[2]];
      EXPECT_THAT((std::vector<std::string>{"counter", "gauge", "histogram"}), ::testing::Contains(parts[3]));
    } else {
      const std::string name(line.substr(0, line.find_first_of("{ ")));
      EXPECT_THAT(name, StartsWith("slicesched_"));
      sample_names.push_back(name);
    }
  }
  EXPECT_EQ(help, type);
  for (const auto& [name, n] : help) EXPECT_EQ(n, 1) << name;
  for (const std::string& s : sample_names) {
    std::string family = s;
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      if (!type.contains(family) && absl::EndsWith(family, suffix)) family.resize(family.size() - strlen(suffix));
    }
    EXPECT_TRUE(type.contains(family)) << s << " has no TYPE line";
  }
  for (const char* f :
       {"slicesched_device_busy_ratio", "slicesched_device_queue_length", "slicesched_device_memory_used_bytes",
        "slicesched_device_memory_capacity_bytes", "slicesched_request_latency_seconds",
        "slicesched_slo_attainment_ratio", "slicesched_estimator_mape_percent", "slicesched_estimator_key_mape_percent",
        "slicesched_schedule_call_seconds", "slicesched_schedule_round_seconds"}) {
    EXPECT_TRUE(type.contains(f)) << f;
  }
  EXPECT_THAT(text, HasSubstr("# TYPE slicesched_request_latency_seconds histogram\n"));
}

TEST(PrometheusText, ValuesAndEscaping) {
  const auto s = Samples(RenderPrometheusText(Sample()));
  EXPECT_EQ(s.at(R"(slicesched_device_busy_ratio{device="gpu\"0\"",type="A16\\x\n"})"), "0.25");
  EXPECT_EQ(s.at(R"(slicesched_device_memory_used_bytes{device="gpu1",type="A16"})"), "0");
  EXPECT_EQ(s.at("slicesched_slo_attainment_ratio"), "0.75");
  EXPECT_EQ(s.at(R"(slicesched_estimator_mape_percent{estimator="op"})"), "7.5");
  EXPECT_EQ(s.at(R"(slicesched_estimator_key_mape_percent{device_type="A16",op_key="tiny/prefill:g0"})"), "3");
  EXPECT_EQ(s.at(R"(slicesched_instances_finished_total{class="offline",state="cancelled"})"), "1");
  EXPECT_EQ(s.at(R"(slicesched_build_info{version="0.1.0"})"), "1");
  EXPECT_EQ(s.at("slicesched_schedule_rounds_total"), "3");
  EXPECT_EQ(s.at("slicesched_schedule_simulated_ops_total"), "5000");
  EXPECT_EQ(s.at("slicesched_schedule_simulated_ops_per_ms"), "10");

  MetricsSnapshot empty;
  EXPECT_EQ(Samples(RenderPrometheusText(empty)).at("slicesched_slo_attainment_ratio"), "NaN");
  EXPECT_EQ(Samples(RenderPrometheusText(empty)).at("slicesched_schedule_simulated_ops_per_ms"), "0");
}

TEST(PrometheusText, HistogramBucketsAreCumulativeAndEndAtCount) {
  const std::string text = RenderPrometheusText(Sample());
  std::vector<std::pair<double, double>> buckets;  // le, value
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::StartsWith(line, "slicesched_request_latency_seconds_bucket{class=\"online\"")) continue;
    const size_t le = line.find("le=\"") + 4;
    const std::string bound(line.substr(le, line.find('"', le) - le));
    buckets.emplace_back(bound == "+Inf" ? 1e300 : std::strtod(bound.c_str(), nullptr),
                         std::strtod(std::string(line.substr(line.rfind(' ') + 1)).c_str(), nullptr));
  }
  ASSERT_GT(buckets.size(), 5u);
  for (size_t i = 1; i < buckets.size(); ++i) {
    EXPECT_GT(buckets[i].first, buckets[i - 1].first);
    EXPECT_GE(buckets[i].second, buckets[i - 1].second);
  }
  EXPECT_EQ(buckets.front().second, 1);  // 0.5 ms <= 1 ms
  EXPECT_EQ(buckets.back().second, 5);   // +Inf = count (500 s is past the last bound)
  const auto s = Samples(text);
  EXPECT_EQ(s.at(R"(slicesched_request_latency_seconds_count{class="online"})"), "5");
  EXPECT_EQ(s.at(R"(slicesched_request_latency_seconds_bucket{class="online",le="0.004"})"), "3");
  EXPECT_EQ(std::strtod(s.at(R"(slicesched_request_latency_seconds_sum{class="online"})").c_str(), nullptr),
            0.0005 + 0.003 + 0.003 + 0.2 + 500.0);
}

MetricsHttpServer::Render Body(std::string body) {
  return [body] { return absl::StatusOr<std::string>(body); };
}

TEST(MetricsHttp, Responses) {
  const auto r = Body("m 1\n");
  std::string ok = HttpResponseFor("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", r);
  EXPECT_THAT(ok, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(ok, HasSubstr("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"));
  EXPECT_THAT(ok, HasSubstr("Content-Length: 4\r\n"));
  EXPECT_THAT(ok, ::testing::EndsWith("\r\n\r\nm 1\n"));
  EXPECT_THAT(HttpResponseFor("GET /metrics?x=1 HTTP/1.0\r\n\r\n", r), StartsWith("HTTP/1.1 200 "));
  const std::string head = HttpResponseFor("HEAD /metrics HTTP/1.1\r\n\r\n", r);
  EXPECT_THAT(head, StartsWith("HTTP/1.1 200 "));
  EXPECT_THAT(head, ::testing::EndsWith("\r\n\r\n"));
  EXPECT_THAT(HttpResponseFor("GET / HTTP/1.1\r\n\r\n", r), StartsWith("HTTP/1.1 404 "));
  EXPECT_THAT(HttpResponseFor("GET /metricsx HTTP/1.1\r\n\r\n", r), StartsWith("HTTP/1.1 404 "));
  EXPECT_THAT(HttpResponseFor("POST /metrics HTTP/1.1\r\n\r\n", r), StartsWith("HTTP/1.1 405 "));
  for (const char* garbage :
       {"\r\n\r\n", "GET\r\n\r\n", "GET /metrics\r\n\r\n", "GET /metrics HTTP/9\r\n\r\n",
        "get /metrics HTTP/1.1\r\n\r\n", "GET /metrics HTTP/1.1 x\r\n\r\n", "\x16\x03\x01\x02\x00\r\n\r\n"}) {
    EXPECT_THAT(HttpResponseFor(garbage, r), StartsWith("HTTP/1.1 400 ")) << garbage;
  }
  const MetricsHttpServer::Render failing = [] {
    return absl::StatusOr<std::string>(absl::UnavailableError("master stopped"));
  };
  const std::string err = HttpResponseFor("GET /metrics HTTP/1.1\r\n\r\n", failing);
  EXPECT_THAT(err, StartsWith("HTTP/1.1 500 "));
  EXPECT_THAT(err, HasSubstr("master stopped"));
}

// Connects to 127.0.0.1:port, sends `request`, reads until the server closes.
std::string Exchange(int port, const std::string& request) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  size_t sent = 0;
  while (sent < request.size()) {
    const ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;  // the server may answer and close before reading it all
    sent += static_cast<size_t>(n);
  }
  ::shutdown(fd, SHUT_WR);  // all sent: the server sees EOF instead of waiting
  std::string response;
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) response.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return response;
}

TEST(MetricsHttp, ServesOnAnEphemeralPort) {
  int renders = 0;
  auto server = MetricsHttpServer::Start({.address = "127.0.0.1:0", .max_request_bytes = 1024},
                                         [&renders]() -> absl::StatusOr<std::string> {
                                           ++renders;
                                           return RenderPrometheusText(Sample());
                                         });
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  ASSERT_GT(port, 0);

  const std::string ok = Exchange(port, "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n");
  EXPECT_THAT(ok, StartsWith("HTTP/1.1 200 OK\r\n"));
  const std::string body = ok.substr(ok.find("\r\n\r\n") + 4);
  EXPECT_EQ(body, RenderPrometheusText(Sample()));
  EXPECT_THAT(ok, HasSubstr(StrCat("Content-Length: ", body.size(), "\r\n")));

  EXPECT_THAT(Exchange(port, "GET /other HTTP/1.1\r\n\r\n"), StartsWith("HTTP/1.1 404 "));
  EXPECT_THAT(Exchange(port, "\x01\x02garbage\r\n\r\n"), StartsWith("HTTP/1.1 400 "));
  // Larger than max_request_bytes without a blank line: refused, not buffered.
  EXPECT_THAT(Exchange(port, "GET /metrics HTTP/1.1\r\nX: " + std::string(5000, 'a')), StartsWith("HTTP/1.1 431 "));
  // Connect and close without a request: nothing to answer; still serving.
  EXPECT_EQ(Exchange(port, ""), "");
  EXPECT_THAT(Exchange(port, "GET /metrics HTTP/1.0\r\n\r\n"), StartsWith("HTTP/1.1 200 "));
  EXPECT_EQ(renders, 2);

  (*server)->Stop();
  (*server)->Stop();  // idempotent
}

TEST(MetricsHttp, BadAddresses) {
  EXPECT_EQ(MetricsHttpServer::Start({.address = "nonsense"}, Body("")).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MetricsHttpServer::Start({.address = "127.0.0.1:http"}, Body("")).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto first = MetricsHttpServer::Start({.address = "127.0.0.1:0"}, Body(""));
  ASSERT_TRUE(first.ok());
  auto second = MetricsHttpServer::Start({.address = StrCat("127.0.0.1:", (*first)->port())}, Body(""));
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(), HasSubstr("listen.metrics"));
}

TEST(PrometheusText, BatchJobsPerStateAndTheirShareOfDeviceTime) {
  const std::string text = RenderPrometheusText(Sample());
  EXPECT_THAT(text, HasSubstr("slicesched_batches{state=\"in_progress\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("slicesched_batches{state=\"completed\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("slicesched_batch_requests_done_total{result=\"error\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("slicesched_batch_tokens_total 90\n"));
  EXPECT_THAT(text, HasSubstr("slicesched_batch_requests_in_flight 3\n"));
  EXPECT_THAT(text, HasSubstr("slicesched_batch_device_time_ratio 0.25\n"));  // 0.75 of 3 s
  MetricsSnapshot none = Sample();
  none.batches.reset();
  EXPECT_THAT(RenderPrometheusText(none), Not(HasSubstr("slicesched_batch")));
}

// docs/operations.md's metrics table names exactly the families sliced
// serves (with their `slicesched_` prefix and without the label sets).
TEST(PrometheusText, TheDocumentedMetricsAreTheServedOnes) {
  const std::string doc = testing_docs::ReadSourceFile("docs/operations.md");
  std::set<std::string> documented;
  for (const std::string& code :
       testing_docs::FirstColumnCodes(testing_docs::MarkdownSection(doc, "## Metrics (Prometheus)"))) {
    documented.insert(StrCat("slicesched_", code.substr(0, code.find('{'))));
  }
  std::set<std::string> served;
  for (absl::string_view line : absl::StrSplit(RenderPrometheusText(Sample()), '\n')) {
    if (!absl::StartsWith(line, "# TYPE ")) continue;
    std::vector<absl::string_view> parts = absl::StrSplit(line, ' ');
    served.emplace(parts.at(2));
  }
  EXPECT_FALSE(served.empty());
  EXPECT_EQ(documented, served);
}

}  // namespace
}  // namespace slicesched
