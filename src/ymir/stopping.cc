#include "slicesched/ymir/stopping.h"

#include <algorithm>
#include <cmath>

#include "slicesched/common/strings.h"

namespace slicesched::ymir {

absl::StatusOr<double> NormalTarget(const std::vector<LossPoint>& curve, double fraction) {
  if (curve.empty()) return absl::InvalidArgumentError("the normal run's curve is empty");
  if (!(fraction > 0 && fraction <= 1)) {
    return absl::InvalidArgumentError(StrCat("target fraction must be in (0, 1], got ", fraction));
  }
  double best = curve.front().loss;
  for (size_t i = 0; i < curve.size(); ++i) {
    if (!std::isfinite(curve[i].loss)) {
      return absl::InvalidArgumentError(StrCat("normal curve point ", i, ": loss is not finite"));
    }
    best = std::min(best, curve[i].loss);
  }
  const double l0 = curve.front().loss;
  return l0 - fraction * (l0 - best);
}

absl::StatusOr<StepsToTargetResult> StepsToTarget(const std::vector<LossPoint>& c, double target,
                                                  int64_t step_limit) {
  if (c.empty()) return absl::InvalidArgumentError("the run's curve is empty");
  if (step_limit < 1) return absl::InvalidArgumentError(StrCat("step_limit must be >= 1, got ", step_limit));
  for (size_t i = 1; i < c.size(); ++i) {
    if (!(c[i].step > c[i - 1].step)) {
      return absl::InvalidArgumentError(
          StrCat("curve point ", i, " (step ", c[i].step, ") is not after point ", i - 1));
    }
  }
  for (size_t i = 1; i < c.size(); ++i) {
    if (c[i].step > static_cast<double>(step_limit)) break;
    if (c[i].loss > target) continue;
    const double s0 = c[i - 1].step, s1 = c[i].step;
    if (c[i - 1].loss <= target || i == 1) return StepsToTargetResult{s1, false};
    return StepsToTargetResult{s0 + (s1 - s0) * (c[i - 1].loss - target) / (c[i - 1].loss - c[i].loss),
                               false};
  }
  return StepsToTargetResult{static_cast<double>(step_limit + 1), true};
}

StopReason ShouldStop(double step, double eval_loss, double target, int64_t step_limit) {
  if (step > 0 && eval_loss <= target) return StopReason::kReached;
  if (step >= static_cast<double>(step_limit)) return StopReason::kCensored;
  return StopReason::kContinue;
}

}  // namespace slicesched::ymir
