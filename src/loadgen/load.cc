#include "slicesched/loadgen/load.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <memory>
#include <random>
#include <thread>
#include <utility>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "slicesched/v1/admin.grpc.pb.h"
#include "slicesched/v1/serving.grpc.pb.h"
#include "slicesched/workload/trace.h"

namespace slicesched {
namespace {

namespace v1 = ::slicesched::v1;
using SteadyTime = std::chrono::steady_clock::time_point;

struct Outcome {
  bool online = true;
  grpc::StatusCode code = grpc::StatusCode::OK;
  int64_t asked = 0;
  int64_t got = 0;
  bool stopped = false;
  double ttft_ms = 0;
  double latency_ms = 0;
  double tpot_ms = 0;  // mean time per token after the first
};

double MsSince(SteadyTime t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

std::string CodeName(grpc::StatusCode c) {
  switch (c) {
    case grpc::StatusCode::OK: return "OK";
    case grpc::StatusCode::CANCELLED: return "CANCELLED";
    case grpc::StatusCode::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND: return "NOT_FOUND";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case grpc::StatusCode::INTERNAL: return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE: return "UNAVAILABLE";
    default: return StrCat("CODE_", static_cast<int>(c));
  }
}

class Driver {
 public:
  explicit Driver(const LoadOptions& o) : o_(o) {}

  absl::Status Connect() {
    // One connection per 25 clients, so that 200 streams do not share one
    // HTTP/2 connection.
    const int clients = std::max(1, o_.streams > 0 ? o_.streams : 64);
    for (int i = 0; i < (clients + 24) / 25; ++i) {
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      args.SetInt("slicesched.loadgen.channel", i);  // distinct args: distinct connection
      channels_.push_back(grpc::CreateCustomChannel(o_.target, grpc::InsecureChannelCredentials(), args));
    }
    if (!channels_[0]->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(30))) {
      return absl::UnavailableError(StrCat("cannot connect to sliced at ", o_.target));
    }
    for (auto& c : channels_) stubs_.push_back(v1::Serving::NewStub(c));
    return absl::OkStatus();
  }

  v1::Serving::Stub* stub(int client) { return stubs_[static_cast<size_t>(client) % stubs_.size()].get(); }
  std::shared_ptr<grpc::Channel> channel() { return channels_[0]; }

  Outcome Request(int client, const std::string& deployment, bool online, int64_t prompt_tokens,
                  int64_t max_tokens, std::mt19937_64& rng) {
    v1::GenerateRequest req;
    req.set_deployment(deployment);
    std::uniform_int_distribution<int64_t> tok(0, o_.vocab - 1);
    for (int64_t i = 0; i < prompt_tokens; ++i) req.add_prompt_token_ids(static_cast<uint32_t>(tok(rng)));
    req.set_max_tokens(static_cast<uint32_t>(max_tokens));
    req.set_priority_class(online ? v1::PRIORITY_CLASS_ONLINE : v1::PRIORITY_CLASS_OFFLINE);
    if (online) req.mutable_slo()->set_ttft_ms(o_.ttft_slo_ms);
    req.set_client_tag(online ? "load-online" : "load-offline");
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::milliseconds(static_cast<int64_t>(o_.rpc_timeout_s * 1000)));
    Outcome out;
    out.online = online;
    out.asked = max_tokens;
    const SteadyTime t0 = std::chrono::steady_clock::now();
    auto reader = stub(client)->Generate(&ctx, req);
    v1::GenerateResponse m;
    double first = -1, last = 0;
    while (reader->Read(&m)) {
      const double t = MsSince(t0);
      if (first < 0) first = t;
      last = t;
      ++out.got;
      if (m.finish_reason() == v1::FINISH_REASON_STOP) out.stopped = true;
    }
    out.code = reader->Finish().error_code();
    out.ttft_ms = first;
    out.latency_ms = last;
    out.tpot_ms = out.got > 1 ? (last - first) / static_cast<double>(out.got - 1) : 0;
    return out;
  }

  void Record(Outcome o) {
    absl::MutexLock l(&mu_);
    outcomes_.push_back(o);
  }
  std::vector<Outcome> outcomes() {
    absl::MutexLock l(&mu_);
    return outcomes_;
  }

 private:
  const LoadOptions& o_;
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<v1::Serving::Stub>> stubs_;
  absl::Mutex mu_;
  std::vector<Outcome> outcomes_ ABSL_GUARDED_BY(mu_);
};

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size()))) - (q > 0 ? 1 : 0);
  return v[std::min(i, v.size() - 1)];
}

LoadReport::Class Summarise(const std::vector<Outcome>& all, bool online, const LoadOptions& o) {
  LoadReport::Class c;
  std::vector<double> ttft, latency;
  int64_t met = 0;
  for (const Outcome& x : all) {
    if (x.online != online) continue;
    ++c.sent;
    c.tokens += x.got;
    if (x.code != grpc::StatusCode::OK) {
      ++c.errors[CodeName(x.code)];
      continue;
    }
    if (x.got < x.asked && !x.stopped) {
      ++c.lost;
      continue;
    }
    ++c.completed;
    ttft.push_back(x.ttft_ms);
    latency.push_back(x.latency_ms);
    if (x.ttft_ms <= o.ttft_slo_ms && x.tpot_ms <= o.tpot_slo_ms) ++met;
  }
  c.ttft_p50_ms = Percentile(ttft, 0.5);
  c.ttft_p99_ms = Percentile(ttft, 0.99);
  c.latency_p50_ms = Percentile(latency, 0.5);
  c.latency_p99_ms = Percentile(latency, 0.99);
  c.slo_attainment = c.sent > 0 ? static_cast<double>(met) / static_cast<double>(c.sent) : 0;
  return c;
}

std::string ClassJson(const LoadReport::Class& c) {
  std::vector<std::string> errs;
  for (const auto& [k, v] : c.errors) errs.push_back(absl::StrFormat("\"%s\": %d", k, v));
  return absl::StrFormat(
      "{\"sent\": %d, \"completed\": %d, \"lost\": %d, \"errors\": {%s}, \"tokens\": %d, "
      "\"ttft_p50_ms\": %.2f, \"ttft_p99_ms\": %.2f, \"latency_p50_ms\": %.2f, \"latency_p99_ms\": %.2f, "
      "\"slo_attainment\": %.4f}",
      c.sent, c.completed, c.lost, absl::StrJoin(errs, ", "), c.tokens, c.ttft_p50_ms, c.ttft_p99_ms,
      c.latency_p50_ms, c.latency_p99_ms, c.slo_attainment);
}

}  // namespace

std::string LoadReport::ToJson() const {
  return absl::StrFormat(
      "{\"mode\": \"%s\", \"wall_s\": %.2f, \"tokens_per_s\": %.1f, \"mean_busy\": %.4f, \"device_busy\": [%s], "
      "\"online\": %s, \"offline\": %s}",
      mode, wall_s, tokens_per_s, mean_busy,
      absl::StrJoin(device_busy, ", ", [](std::string* out, double b) { out->append(absl::StrFormat("%.4f", b)); }),
      ClassJson(online), ClassJson(offline));
}

std::string LoadReport::ToText() const {
  auto line = [](const char* name, const Class& c, bool slo) {
    std::vector<std::string> errs;
    for (const auto& [k, v] : c.errors) errs.push_back(StrCat(k, "=", v));
    return absl::StrFormat(
        "  %-8s sent %5d  completed %5d  lost %d  errors [%s]  tokens %6d  TTFT p50/p99 %7.1f/%7.1f ms  "
        "latency p50/p99 %7.1f/%7.1f ms%s\n",
        name, c.sent, c.completed, c.lost, absl::StrJoin(errs, " "), c.tokens, c.ttft_p50_ms, c.ttft_p99_ms,
        c.latency_p50_ms, c.latency_p99_ms,
        slo ? absl::StrFormat("  SLO attainment %.1f%%", 100 * c.slo_attainment) : std::string());
  };
  std::string busy = absl::StrJoin(device_busy, " ", [](std::string* out, double b) {
    out->append(absl::StrFormat("%.0f%%", 100 * b));
  });
  return StrCat("load: ", mode, ", ", absl::StrFormat("%.1f", wall_s), " s\n", line("online", online, true),
                line("offline", offline, false),
                absl::StrFormat("  throughput %.1f tokens/s; device utilisation %.1f%% (per device: %s)\n",
                                tokens_per_s, 100 * mean_busy, busy));
}

absl::Status LoadOptions::Validate() const {
  if (!(seconds > 0) || !std::isfinite(seconds)) {
    return absl::InvalidArgumentError(StrCat("--seconds must be > 0, got '", seconds, "'"));
  }
  if (!(token_scale >= 1) || !std::isfinite(token_scale)) {
    return absl::InvalidArgumentError(StrCat("--token-scale must be at least 1, got '", token_scale, "'"));
  }
  for (const auto& [flag, v] : {std::pair{"--streams", streams}, std::pair{"--offline-streams", offline_streams}}) {
    if (v < 0 || v > 4096) return absl::InvalidArgumentError(StrCat(flag, " must be in 0..4096, got '", v, "'"));
  }
  if (vocab < 1) return absl::InvalidArgumentError(StrCat("vocab must be at least 1, got ", vocab));
  return absl::OkStatus();
}

absl::StatusOr<LoadReport> RunLoad(const LoadOptions& o) {
  SLICESCHED_RETURN_IF_ERROR(o.Validate());
  LoadReport report;
  std::vector<Request> arrivals;
  if (o.streams <= 0) {
    if (o.trace.empty()) {
      arrivals = GenerateBuiltInWorkload(BuiltInWorkloadModel{}, o.seconds, o.seed);
      report.mode = "open-loop (built-in Azure-derived model)";
    } else {
      SLICESCHED_ASSIGN_OR_RETURN(arrivals, LoadAzureLlmTrace(o.trace));
      arrivals = Window(arrivals, 0, o.seconds);
      report.mode = StrCat("open-loop (", o.trace, ")");
    }
  } else {
    report.mode = StrCat("closed-loop, ", o.streams, " streams");
  }
  Driver driver(o);
  SLICESCHED_RETURN_IF_ERROR(driver.Connect());

  const SteadyTime t0 = std::chrono::steady_clock::now();
  const SteadyTime end = t0 + std::chrono::milliseconds(static_cast<int64_t>(o.seconds * 1000));
  std::vector<std::thread> threads;
  auto closed_client = [&](int client, const std::string& dep, bool online, int64_t prompt, int64_t out) {
    std::mt19937_64 rng(o.seed * 1000003 + static_cast<uint64_t>(client));
    while (std::chrono::steady_clock::now() < end) driver.Record(driver.Request(client, dep, online, prompt, out, rng));
  };
  if (o.streams > 0) {
    for (int c = 0; c < o.streams; ++c) {
      threads.emplace_back(closed_client, c, o.online_deployment, true, o.closed_prompt_tokens, o.closed_output_tokens);
    }
  } else {
    if (!o.offline_deployment.empty()) {
      for (int c = 0; c < o.offline_streams; ++c) {
        threads.emplace_back(closed_client, 1000 + c, o.offline_deployment, false, 64, 32);
      }
    }
    auto scaled = [&](int64_t n) {
      return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(static_cast<double>(n) / o.token_scale)));
    };
    for (size_t i = 0; i < arrivals.size(); ++i) {
      std::this_thread::sleep_until(t0 + std::chrono::microseconds(static_cast<int64_t>(arrivals[i].arrival_s * 1e6)));
      const int64_t prompt = scaled(arrivals[i].context_tokens);
      const int64_t out = std::clamp<int64_t>(arrivals[i].generated_tokens, 1, o.max_output_tokens);
      threads.emplace_back([&, i, prompt, out] {
        std::mt19937_64 rng(o.seed * 7919 + i);
        driver.Record(driver.Request(static_cast<int>(i), o.online_deployment, true, prompt, out, rng));
      });
    }
  }
  for (auto& t : threads) t.join();
  report.wall_s = MsSince(t0) / 1000;

  const std::vector<Outcome> all = driver.outcomes();
  report.online = Summarise(all, true, o);
  report.offline = Summarise(all, false, o);
  report.tokens_per_s = static_cast<double>(report.online.tokens + report.offline.tokens) / report.wall_s;

  auto admin = v1::Admin::NewStub(driver.channel());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::DevicesResponse devices;
  if (grpc::Status s = admin->Devices(&ctx, v1::DevicesRequest(), &devices); s.ok()) {
    for (const v1::DeviceStatus& d : devices.devices()) report.device_busy.push_back(d.busy_fraction());
    double sum = 0;
    for (double b : report.device_busy) sum += b;
    report.mean_busy = report.device_busy.empty() ? 0 : sum / static_cast<double>(report.device_busy.size());
  }
  return report;
}

}  // namespace slicesched
