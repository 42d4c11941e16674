// `slicesim accuracy`: how well the simulator predicts a cluster it does not
// know.
//
// A ground-truth run on the virtual-time cluster (8 A16-class devices,
// Llama3-8B, four online model instances on device pairs as in the paper's
// Static-Online deployment) replays requests — an Azure-format trace given
// with --trace, else the built-in model derived from the Azure code trace —
// with the ground-truth cost model (ground_truth.h: non-linear in shape,
// per-device skew, +-3% noise, slowdown when transfers overlap computation).
// Executor feedback trains the estimators online. At regular instants the
// simulator, built from a GMG snapshot with the estimators as they are then,
// predicts the completion of every in-flight instance; when the instance
// finishes, the prediction is scored.
//
//   completion_mape_pct  mean |predicted - actual| / (actual - snapshot time)
//                        over predictions made after the warm-up, where
//                        "actual" is the ground truth run on from the same
//                        state (a fork of the GMG and the cluster) without
//                        the arrivals that come after the snapshot: the
//                        work the snapshot knows, executed for real — the
//                        simulator's fidelity, comparable to the paper's
//                        1.83% end-to-end error
//   open_loop_mape_pct   the same against the real run, in which requests
//                        arriving later interleave with the predicted work
//                        (what a scheduler faces; not the simulator's error)
//   op_mape_pct          the operator estimator's error on each operator
//                        before it observed it, after the warm-up
//   transfer_mape_pct    the same for transfers
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace slicesched {

struct AccuracyOptions {
  std::string trace;            // Azure LLM format; empty = built-in model
  double minutes = 30;          // of arrivals replayed
  double load_scale = 0.5;      // arrival-rate multiplier
  double warmup_s = 60;         // predictions and estimator errors before this are not scored
  double predict_every_s = 1.0;
  uint64_t seed = 1;
  // InvalidArgument naming the option (as slicesim's flag) and its value:
  // minutes, load_scale and predict_every_s > 0, warmup_s >= 0, and the run
  // longer than the warm-up (else nothing is scored). RunAccuracy checks it
  // first.
  absl::Status Validate() const;
};

struct AccuracyResult {
  std::string workload;
  int64_t requests = 0;
  int64_t instances = 0;
  int64_t ops = 0;
  int64_t transfers = 0;
  int64_t predictions = 0;       // scored
  double completion_mape_pct = 0;
  double completion_p90_ape_pct = 0;
  double completion_bias_pct = 0;  // mean signed error (positive: predicted too late)
  double open_loop_mape_pct = 0;   // against the real run, where later arrivals interfere
  double op_mape_pct = 0;
  double transfer_mape_pct = 0;
  double simulated_s = 0;
  std::string ToJson() const;
};

absl::StatusOr<AccuracyResult> RunAccuracy(const AccuracyOptions& options);

}  // namespace slicesched
