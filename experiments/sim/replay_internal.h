// Shared by replay.cc (the experiment and the load-scale fit), replay_run.cc
// (one policy over the window) and replay_sweep.cc (the capacity sweep).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "slicesched/experiments/replay.h"
#include "slicesched/sched/policy.h"
#include "slicesched/workload/trace.h"

namespace slicesched::replay_internal {

struct TaggedRequest {
  double arrival_s;
  int64_t context, output;
  int instance;  // online model instance k
};

// Policy by its replay name; null for an unknown name.
std::unique_ptr<PlacementPolicy> MakePolicy(const std::string& name);

// The trace (or the built-in model) as loaded once, before scaling.
struct BaseWorkload {
  std::vector<Request> requests;
  std::string name;
};
absl::StatusOr<BaseWorkload> LoadBaseWorkload(const std::string& trace, uint64_t seed);

// The four shifted copies, scaled by `load_scale` and cut to the window,
// ordered by arrival.
std::vector<TaggedRequest> OnlineWorkload(const std::vector<Request>& base, double load_scale, double minutes,
                                          uint64_t seed);

// What one policy's run produced.
struct RunOutput {
  PolicyResult result;
  std::vector<double> ttft_ms;                    // online, first token reached
  std::vector<double> waiting_ms;                 // online, no first token by the end
  std::vector<double> offline_latency_s;          // offline, arrival to last token
  std::vector<std::vector<BusyInterval>> busy;    // per device, all operators
};

// What RunPolicy needs besides the workload.
struct RunSettings {
  double minutes = 30;
  uint64_t seed = 1;
  double offline_rate = 1.0;
  int threads = 0;
  bool progress = false;
};

absl::StatusOr<RunOutput> RunPolicy(const std::string& name, const std::vector<TaggedRequest>& online,
                                    const RunSettings& s);

// Static-Online's run on the workload at `load_scale`, without offline work.
absl::StatusOr<RunOutput> RunReference(const std::vector<Request>& base, double load_scale, RunSettings s);

// The paper's SLO: Static-Online's p90 time to first token.
double SloMs(const RunOutput& reference);

// The fraction of online requests within `slo_ms` TTFT (requests still
// waiting past the SLO at the end count as misses).
double Attainment(const RunOutput& run, double slo_ms);

// Fills the fields measured against Static-Online: SLO attainment and harvest.
void JudgeAgainstReference(double slo_ms, double reference_idle_s, RunOutput* run);

// Fits the load scale so that Static-Online's utilisation is target ±
// kTargetUtilTolerance: bracketed search (secant steps through the origin,
// bisection when they leave the bracket). Returns the scale and, in
// *reference, the Static-Online run at it.
absl::StatusOr<double> FitLoadScale(const std::vector<Request>& base, double target, const RunSettings& s,
                                    RunOutput* reference, int* runs);

}  // namespace slicesched::replay_internal
