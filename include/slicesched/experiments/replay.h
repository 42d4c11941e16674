// `slicesim replay`: the paper's co-location experiment (§5.1, Fig 8) on the
// virtual-time cluster.
//
// Server: 8 A16-class devices (the embedded default), Llama3-8B with 8 layers
// per operator. Online: four model instances; instance k replays the trace
// cyclically shifted by k/4 of its span (the paper used four different days),
// arrivals compressed by the load scale. Each request is a prefill instance
// then one decode instance per further output token, each attached to the
// conversation's KV checkpoints. Offline: one request per second, 2048 input
// and 15 output tokens. Every policy runs on the same mechanism (GMG,
// virtual cluster with the ground-truth cost model, estimators learning
// online) and is measured over the replay window.
//
// SLO: time to first token within Static-Online's p90 TTFT (as in the paper).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "slicesched/experiments/replay_metrics.h"

namespace slicesched {

// Makes Static-Online's mean GPU time-utilisation about 64% (the paper's
// production figure) with the Azure code trace; see docs/results.md.
inline constexpr double kDefaultReplayLoadScale = 0.12;

struct ReplayOptions {
  std::string trace;             // Azure LLM format; empty = built-in model
  std::string policy = "all";    // a policy name, or "all"
  double minutes = 30;
  uint64_t seed = 1;
  double load_scale = kDefaultReplayLoadScale;
  std::string out_dir;           // where CSVs (and PNGs) go; empty = none
  bool progress = true;          // progress bar on stderr when it is a terminal
  int threads = 0;               // what-if threads; 0 = hardware threads - 1
  // InvalidArgument naming the option (as slicesim's flag) and its value:
  // minutes and load_scale > 0, threads in 0..1024, policy a name of
  // ReplayPolicyNames() or "all". RunReplay checks it first.
  absl::Status Validate() const;
};

struct PolicyResult {
  std::string policy;
  double req_per_s = 0, tok_per_s = 0, slo_attainment = 0, gpu_util = 0;
  double ttft_p50_ms = 0, ttft_p99_ms = 0;
  double online_req_per_s = 0, offline_tok_per_s = 0;
  int64_t online_requests = 0, online_completed = 0, offline_completed = 0;
  double wall_s = 0;
  // SliceScheduler only: decision latency of rounds that simulated.
  double round_p50_us = 0, round_p99_us = 0, mean_candidates = 0;
  int64_t rounds = 0;
};

struct ReplayResult {
  double load_scale = 0;
  double slo_ttft_ms = 0;
  std::string workload;
  std::vector<PolicyResult> policies;
  IdleSliceSummary idle;   // Static-Online, per GPU
  IdleOverlap overlap;     // Static-Online, across the four model instances
};

absl::StatusOr<ReplayResult> RunReplay(const ReplayOptions& options);

// Names accepted by --policy, in the order "all" runs them.
std::vector<std::string> ReplayPolicyNames();

}  // namespace slicesched
