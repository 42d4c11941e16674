// The scheduling-overhead experiment (paper Table 1): N prefills of context
// length 1 on the tiny Llama, executed
//   (a) directly: Embedding -> FusedLayers per group -> LmHead -> Sample,
//       called in a loop on the calling thread;
//   (b) scheduled: each prefill instantiated in a GMG, placed by the
//       SliceScheduler (one CPU device, so the template's "single" partition
//       is its only candidate: the fast path without what-if simulation) and
//       run by the ExecutorSet with the LlamaKernelRunner, one prefill at a
//       time (the master waits for its completion, releases its KV
//       checkpoints and submits the next).
// The two alternate in one process `repetitions` times; the result reports
// the medians. Both paths produce the same tokens (checked).
//
// Torch-free header; the implementation links the LibTorch executors
// (library slicesched::executor_experiments, built with LibTorch only).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace slicesched {

struct OverheadOptions {
  int64_t prefills = 1000;
  int repetitions = 5;  // alternations of direct and scheduled
  uint64_t seed = 1;    // weights
  int warmup = 20;      // untimed prefills of each kind first
  std::string model = "tiny";  // a Llama preset: tiny, small, llama3-8b
};

struct OverheadResult {
  int64_t prefills = 0;
  int repetitions = 0;
  std::string model;
  std::string placement;  // how the scheduled prefills were placed
  double direct_s = 0;     // median over repetitions
  double scheduled_s = 0;  // median over repetitions
  double overhead_pct = 0; // 100 * (scheduled - direct) / direct
  std::vector<double> direct_runs_s, scheduled_runs_s;
  bool tokens_match = false;

  std::string ToJson() const;
};

absl::StatusOr<OverheadResult> RunOverhead(const OverheadOptions& options);

}  // namespace slicesched
