// Ymir's stop-loss (../shared/papers/ymir.md §4.3):
// a temporal or spatial pairing that does not improve the target metric
// within its first 2 epochs is decoupled, and each task continues in normal
// mode with its own progress. This is the torch-free policy; the runtime that
// trains (the experiment in experiments/torch/task2vec.cc, the daemon's job runner)
// feeds it evaluations and carries out its verdict.
//
// "Improve" is measured against independent training, because that is what a
// transfer gain is defined against: each evaluation of a member comes with
// `reference`, the metric the same task would have after the same number of
// its own steps in normal training (measured, or predicted by the iteration
// estimator: LossCurve::Loss(step) of the task's normal curve). The metric is
// lower-is-better (a loss). A member IMPROVED when, at the end of the window,
//   metric < reference - min_improvement * |reference|.
// The member is judged at its first evaluation at or after `window_epochs`
// epochs since the pairing began (the epochs are the member's own data
// epochs; the caller converts steps).
//
// Verdict. Temporal A -> B has one member, B (A has finished): decouple when B
// did not improve. Spatial A + B has two: decouple as soon as either judged
// member did not improve; keep once both improved. The verdict is final:
// later evaluations are accepted and ignored. While undecided the pairing
// continues.
//
// Carrying out kDecouple (the caller's part; train_ops.h makes both exact):
//   temporal: B keeps its adapters (initialised from A's, trained since) and
//             its own optimizer state, and continues as a normal task; the
//             scheduler stops counting on the pairing's gain.
//   spatial:  each task's TaskState (its copy of the shared adapter, its own
//             head, moments and step count) becomes an independent task that
//             continues with plain AdamWStep; nothing is re-initialised.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace slicesched::ymir {

enum class PairingMode { kTemporal, kSpatial };
const char* PairingModeName(PairingMode mode);

struct StopLossOptions {
  double window_epochs = 2.0;    // > 0
  double min_improvement = 0.0;  // >= 0, relative to |reference|
  absl::Status Validate() const;
};

enum class StopLossVerdict { kUndecided, kKeep, kDecouple };
const char* StopLossVerdictName(StopLossVerdict v);

class StopLoss {
 public:
  static absl::StatusOr<StopLoss> Create(PairingMode mode, const StopLossOptions& options = {});

  PairingMode mode() const { return mode_; }
  int members() const { return mode_ == PairingMode::kTemporal ? 1 : 2; }

  // One evaluation of `member` (0 = B for temporal; 0 = A, 1 = B for
  // spatial), `epochs` since the pairing began (non-decreasing per member).
  // Returns the verdict after it. InvalidArgument for an unknown member,
  // non-finite numbers or epochs going backwards.
  absl::StatusOr<StopLossVerdict> Observe(int member, double epochs, double metric,
                                          double reference);

  StopLossVerdict verdict() const { return verdict_; }
  // Why the verdict was reached ("" while undecided), e.g.
  // "member 1 at 2.00 epochs: 0.71 >= reference 0.65".
  const std::string& reason() const { return reason_; }

 private:
  StopLoss(PairingMode mode, const StopLossOptions& options);

  struct Member {
    double last_epochs = -1;
    bool judged = false;
    bool improved = false;
  };
  PairingMode mode_;
  StopLossOptions options_;
  std::vector<Member> state_;
  StopLossVerdict verdict_ = StopLossVerdict::kUndecided;
  std::string reason_;
};

}  // namespace slicesched::ymir
