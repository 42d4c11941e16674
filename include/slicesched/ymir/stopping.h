// Stopping rules that compare training modes fairly.
//
// Bar. Every task's target metric is what its NORMAL training reaches: over
// the normal run's evaluation curve (eval loss, lower is better) with start
// L0 = the loss at the first evaluation and best = its lowest loss,
//   target = L0 - fraction (L0 - best),   fraction in (0, 1].
// A transfer (temporal or spatial) changes how many steps reach that target,
// never the target itself: the caller computes it once from the normal run
// and hands the same number to every run of the task.
//
// Steps to target. The first evaluation at or below the target, linearly
// interpolated between it and the evaluation before (so measured steps are
// not quantised to the evaluation interval). The first interval after the
// start is not interpolated: a run is credited with at least its first
// evaluated step, and a run that starts at or below the target needs the
// steps to its first evaluation (never 0 steps, which would make a gain
// infinite).
//
// Censoring. A run that hits its step (or epoch) limit before reaching the
// target is CENSORED: its steps are recorded as limit + 1 and the flag says
// so, so averages stay finite and readers can tell a slow run from a
// stopped one.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "slicesched/ymir/iteration_estimator.h"

namespace slicesched::ymir {

// The target above from a normal run's curve (points in step order,
// the first one the start). InvalidArgument for an empty curve, a
// non-finite loss or a fraction outside (0, 1].
absl::StatusOr<double> NormalTarget(const std::vector<LossPoint>& normal_curve, double fraction);

struct StepsToTargetResult {
  double steps = 0;       // interpolated; step_limit + 1 when censored
  bool censored = false;  // the run stopped (at step_limit) before the target
};

// Steps until `curve` (points in increasing step order, the first one the
// start of the run) reaches `target`, for a run limited to `step_limit`
// steps. InvalidArgument when the curve is empty, not in increasing step
// order, or step_limit < 1.
absl::StatusOr<StepsToTargetResult> StepsToTarget(const std::vector<LossPoint>& curve,
                                                  double target, int64_t step_limit);

// The online form, for a run loop after each evaluation: stop when the
// target is reached (kReached) or the limit is hit (kCensored).
enum class StopReason { kContinue, kReached, kCensored };
StopReason ShouldStop(double step, double eval_loss, double target, int64_t step_limit);

}  // namespace slicesched::ymir
