// `slicesim replay`: the paper's co-location experiment (§5.1, Fig 8) on the
// virtual-time cluster, and a capacity sweep around it.
//
// Server: 8 A16-class devices (the embedded default), Llama3-8B with 8 layers
// per operator. Online: four model instances; instance k replays the trace
// cyclically shifted by k/4 of its span (the paper used four different days),
// arrivals thinned (or compressed) by the load scale. Each request is a
// prefill instance then one decode instance per further output token, each
// attached to the conversation's KV checkpoints. Offline: `offline_rate`
// requests per second, 2048 input and 15 output tokens. Every policy runs on
// the same mechanism (GMG, virtual cluster with the ground-truth cost model,
// estimators learning online) and is measured over the replay window.
//
// The regime: by default the load scale is fitted so that Static-Online's
// mean GPU time-utilisation over the window is `target_util` (the paper's
// Fig 8 ran at 40.7%), whatever the trace's own rate; `load_scale` > 0
// overrides the fit.
//
// SLO: time to first token within Static-Online's p90 TTFT (as in the paper).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "slicesched/common/units.h"
#include "slicesched/experiments/replay_metrics.h"

namespace slicesched {

// Static-Online's GPU time-utilisation in the paper's Fig 8.
inline constexpr double kDefaultTargetUtil = 0.407;
// The fitted utilisation is accepted within this of the target.
inline constexpr double kTargetUtilTolerance = 0.01;
// Offline requests: 2048 prompt tokens, 15 generated (the paper's).
inline constexpr int64_t kReplayOfflineInput = 2048;
inline constexpr int64_t kReplayOfflineOutput = 15;

inline constexpr Duration kOfflineSettle = Duration::Seconds(60);

struct ReplayOptions {
  std::string trace;             // Azure LLM format; empty = built-in model
  std::string policy = "all";    // a policy name, or "all"
  double minutes = 30;
  uint64_t seed = 1;
  double target_util = kDefaultTargetUtil;  // Static-Online utilisation the load scale is fitted to
  double load_scale = 0;         // > 0: use this scale, no fit
  double offline_rate = 1.0;     // offline requests per second
  std::string out_dir;           // where CSVs (and PNGs) go; empty = none
  bool progress = true;          // progress bar on stderr when it is a terminal
  int threads = 0;               // what-if threads; 0 = hardware threads - 1
  // InvalidArgument naming the option (as slicesim's flag) and its value:
  // minutes > 0, target_util in (0, 1), load_scale >= 0, offline_rate >= 0,
  // threads in 0..1024, policy a name of ReplayPolicyNames() or "all".
  // RunReplay checks it first.
  absl::Status Validate() const;
};

struct PolicyResult {
  std::string policy;
  double req_per_s = 0, tok_per_s = 0, slo_attainment = 0, gpu_util = 0;
  double ttft_p50_ms = 0, ttft_p99_ms = 0;
  double online_req_per_s = 0, offline_tok_per_s = 0;
  double offline_offered_per_s = 0;   // offline requests offered per second
  double offline_completed_frac = 0;  // offline tokens done / offline tokens offered
  // Offline requests that arrived at least kOfflineSettle before the end:
  // the fraction done by the end. Unlike offline_completed_frac it does not
  // count the requests still in flight at the end against a policy, so a
  // short window can tell a sustained rate from a growing backlog.
  double offline_settled_frac = 0;
  // Seconds from an offline request's arrival to its last token, over the
  // requests done by the end (those still in flight are not counted).
  double offline_latency_p50_s = 0, offline_latency_p90_s = 0;
  double tbt_p50_ms = 0, tbt_p99_ms = 0;  // time between an online request's tokens
  // Offline GPU-busy time / Static-Online's idle GPU time, same window and
  // devices.
  double harvest = 0;
  double offline_busy_s = 0;          // GPU-seconds of offline operators
  int64_t offline_backlog = 0;        // offline requests arrived and not finished at the end
  int64_t online_requests = 0, online_completed = 0, offline_completed = 0;
  double wall_s = 0;
  // SliceScheduler only: decision latency of rounds that simulated.
  double round_p50_us = 0, round_p99_us = 0, mean_candidates = 0;
  int64_t rounds = 0;
};

struct ReplayResult {
  double load_scale = 0;
  bool load_scale_fitted = false;  // found by the target-utilisation fit
  int fit_runs = 0;                // Static-Online runs the fit took
  double slo_ttft_ms = 0;
  std::string workload;
  std::vector<PolicyResult> policies;
  IdleSliceSummary idle;   // Static-Online, per GPU
  IdleOverlap overlap;     // Static-Online, across the four model instances
};

absl::StatusOr<ReplayResult> RunReplay(const ReplayOptions& options);

// Names accepted by --policy, in the order "all" runs them.
std::vector<std::string> ReplayPolicyNames();

// The capacity sweep (`slicesim replay --sweep`): for each online target
// utilisation and policy, offline load is raised step by step until the
// policy no longer sustains it: online SLO attainment below min_slo, or
// fewer than min_completed of the offline requests that arrived a settling
// time before the end done by then.
struct SweepOptions {
  std::string trace;
  double minutes = 10;  // window per point (shorter than the default replay)
  uint64_t seed = 1;
  std::vector<double> utils = {0.2, 0.3, 0.4, 0.5, 0.6, 0.7};
  // Offline rates tried in order per (policy, util) until one fails; the
  // last is also the saturating load at which harvest is reported.
  std::vector<double> rates = {0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 2.5};
  double saturating_rate = 4.0;  // beyond the server's whole capacity
  double min_slo = 0.99;         // online SLO attainment a sustained point keeps
  double min_completed = 0.95;   // offline requests it completes (offline_settled_frac)
  std::string out_dir;
  bool progress = true;
  int jobs = 0;  // points run at once; 0 = hardware threads
  absl::Status Validate() const;
};

struct SweepPoint {
  double util = 0, load_scale = 0;
  std::string policy;
  double max_sustained_rate = 0;  // 0 when not even the first rate holds
  PolicyResult saturated;         // at saturating_rate
};

// Runs the sweep; writes sweep.csv (and figures, when the plot script runs)
// into out_dir.
absl::StatusOr<std::vector<SweepPoint>> RunReplaySweep(const SweepOptions& options);

}  // namespace slicesched
