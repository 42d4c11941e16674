// Prometheus metrics of the `sliced` daemon.
//
// Master::Metrics() takes a MetricsSnapshot on the loop thread; the pure
// function RenderPrometheusText() turns it into the text exposition format
// 0.0.4 (https://prometheus.io/docs/instrumenting/exposition_formats/); and
// MetricsHttpServer serves it at GET /metrics when the config sets
// `listen.metrics: HOST:PORT`.
//
// Every metric is prefixed `slicesched_`. What is exported (the HELP lines in
// metrics.cc are the reference):
//   device_busy_ratio{device,type}            busy fraction over the last minute
//   device_busy_seconds_total{device,type}    operator time since start
//   device_busy_batch_seconds_total{device,type}  the part of it on batch jobs' requests
//   device_queue_length{device,type}          issued, unfinished operators
//   device_memory_used_bytes / _capacity_bytes{device,type}
//   live_instances, queued_instances{class}
//   instances_finished_total{class,state}
//   request_latency_seconds{class}            histogram: arrival -> DONE
//   slo_instances_total, slo_met_total        online instances with a deadline
//   slo_attainment_ratio                      met / total (NaN before the first)
//   estimator_mape_percent{estimator}         aggregated online MAPE (op, transfer)
//   estimator_observations_total{estimator}
//   estimator_key_mape_percent{device_type,op_key}  per op key with samples
//   schedule_call_seconds                     histogram: one Schedule() call
//   schedule_round_seconds                    histogram: one what-if round
//   schedule_rounds_total, schedule_whatif_runs_total, schedule_issued_nodes_total
//   schedule_simulated_ops_total, schedule_whatif_seconds_total
//   schedule_simulated_ops_per_ms             their ratio since start (what-if
//                                             throughput, all scheduler threads)
//   batches{state}                            batch jobs per state (when batches are served)
//   batch_requests_done_total{result}         results stored since start (ok, error)
//   batch_tokens_total                        generated tokens recorded since start
//   batch_requests_in_flight                  batch requests in the scheduler now
//   batch_device_time_ratio                   batch device time / all device time since start
//   uptime_seconds, build_info{version}
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"

namespace slicesched {

// A cumulative-bucket histogram (Prometheus semantics: bucket i counts
// observations <= upper_bounds[i]; +Inf is implicit).
struct Histogram {
  std::vector<double> upper_bounds;  // ascending
  std::vector<uint64_t> counts;      // per bucket, not cumulative; size = upper_bounds.size() + 1
  double sum = 0;
  uint64_t count = 0;

  static Histogram WithBounds(std::vector<double> upper_bounds);
  // Seconds from 1 ms to ~65 s (powers of two), for request latencies.
  static Histogram LatencySeconds();
  // Seconds from 10 us to ~1.3 s (powers of two), for scheduling decisions.
  static Histogram DecisionSeconds();
  void Observe(double value);
};

struct MetricsSnapshot {
  std::string version;
  double uptime_seconds = 0;

  struct Device {
    std::string name, type;
    double busy_ratio = 0;
    double busy_seconds_total = 0;
    double busy_batch_seconds_total = 0;
    uint32_t queue_length = 0;
    int64_t memory_used_bytes = 0;
    int64_t memory_capacity_bytes = 0;
  };
  std::vector<Device> devices;

  uint64_t live_instances = 0;
  uint64_t queued_online = 0;
  uint64_t queued_offline = 0;

  // Indexed by PriorityClass (0 online, 1 offline).
  struct ClassStats {
    uint64_t done = 0, failed = 0, cancelled = 0;
    Histogram latency = Histogram::LatencySeconds();  // DONE instances only
  };
  ClassStats classes[2];
  uint64_t slo_total = 0;  // online instances with a deadline that finished
  uint64_t slo_met = 0;    // ... DONE at or before it

  double op_mape_pct = 0;
  uint64_t op_observations = 0;
  double transfer_mape_pct = 0;
  uint64_t transfer_observations = 0;
  struct KeyMape {
    std::string device_type, op_key;
    double mape_pct = 0;
    uint64_t samples = 0;
  };
  std::vector<KeyMape> op_keys;  // keys with samples only

  Histogram schedule_call = Histogram::DecisionSeconds();
  Histogram schedule_round = Histogram::DecisionSeconds();
  uint64_t schedule_rounds = 0;
  uint64_t whatif_runs = 0;
  uint64_t issued_nodes = 0;
  uint64_t simulated_ops = 0;
  double whatif_seconds = 0;

  // Batch jobs (filled by the daemon beside Master::Metrics; absent when
  // it serves no batches).
  struct Batches {
    std::vector<std::pair<std::string, int64_t>> by_state;  // every state, 0 included
    uint64_t requests_ok = 0;
    uint64_t requests_error = 0;
    uint64_t tokens = 0;
    uint32_t in_flight = 0;
  };
  std::optional<Batches> batches;
};

// Text exposition format 0.0.4 of `m`: HELP and TYPE for every family,
// label values escaped (\\, \", \n), histograms as cumulative _bucket
// series with le="+Inf", _sum and _count.
std::string RenderPrometheusText(const MetricsSnapshot& m);

// The Prometheus exposition content type.
inline constexpr const char* kPrometheusContentType = "text/plain; version=0.0.4; charset=utf-8";

// A minimal HTTP/1.1 server for GET /metrics on its own thread (plain POSIX
// sockets). Connections are served one at a time and closed after one
// response ("Connection: close"). A request must arrive within
// `read_timeout_ms` and fit in `max_request_bytes` (headers included), or it
// gets 408 / 431. GET or HEAD /metrics (a query string is ignored) -> 200
// with the body from `render` (500 with its message when it fails); other
// paths -> 404; other methods -> 405; anything unparsable -> 400.
class MetricsHttpServer {
 public:
  struct Options {
    std::string address;  // "HOST:PORT", "[::1]:PORT"; port 0 = ephemeral
    size_t max_request_bytes = 8192;
    int read_timeout_ms = 2000;
  };
  using Render = std::function<absl::StatusOr<std::string>()>;

  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(Options options, Render render);
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;
  ~MetricsHttpServer();  // Stop()

  int port() const { return port_; }  // the bound port (resolves port 0)
  // Stops accepting and joins the thread. Idempotent.
  void Stop();

 private:
  MetricsHttpServer(Options options, Render render) : options_(std::move(options)), render_(std::move(render)) {}
  void Serve();
  void HandleConnection(int fd);

  const Options options_;
  const Render render_;
  int listen_fd_ = -1;
  int wake_pipe_[2] = {-1, -1};  // written by Stop() to wake poll()
  int port_ = 0;
  std::thread thread_;
};

// Parses one HTTP request head (the bytes up to and including the blank
// line) and returns the response (status line, headers, body) it deserves;
// `render` makes the /metrics body. Exposed for tests.
std::string HttpResponseFor(std::string_view request_head, const MetricsHttpServer::Render& render);

}  // namespace slicesched
