// Ground truth with error bars: several measurements of one task family's
// gains table (`slicesim ymir-estimators --gains-out`, one per seed: other
// data draws and initialisations) combined into one table that says, per
// pair, how far the measured gain can be trusted.
//
// Per (task_a, task_b, mode) row, over the n tables: the mean gain and mean
// gain_steps (the table's gains), the sample standard deviation of the gain,
// and the 95% interval mean +- t(0.975, n-1) sd / sqrt(n). The pair is
// "positive" when the interval lies above 0, "negative" when below, and
// "neutral" otherwise: a sign that the repeats do not agree on is not a
// ground truth. steps_censored is 1 if any repeat's was.
//
// The output is gains-format 2 with the extra columns repeats, gain_sd,
// ci_low, ci_high (which LoadYmirGains ignores) and sign, whose neutral
// rows it loads as not plannable, so the combined table feeds `slicesim
// ymir --gains` and the daemon's planner as it is.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace slicesched::ymir {

struct GainsRepeatsSummary {
  int pairs = 0, positive = 0, negative = 0, neutral = 0;
  int repeats = 0;
};

// `tables`: (name for errors, CSV text) of n >= 2 tables with the same rows
// and the same gain-definition and gain-measure directives.
// InvalidArgument naming the table and what differs.
absl::StatusOr<std::string> CombineGainRepeats(const std::vector<std::pair<std::string, std::string>>& tables,
                                               GainsRepeatsSummary* summary = nullptr);

// Two-sided 95% Student t quantile for `dof` degrees of freedom (>= 1).
double StudentT975(int dof);

}  // namespace slicesched::ymir
