// What the two estimators (estimators.cc: OpEstimator; transfer_estimator.cc:
// TransferEstimator) share: the relative-error NNLS fit, time conversions
// and the saved state's root. Internal to the estimate library.
#pragma once

#include <vector>

#include "absl/strings/string_view.h"
#include "slicesched/common/config.h"
#include "slicesched/common/units.h"

namespace slicesched::estimate_internal {

inline constexpr int kStateVersion = 1;

// Nanoseconds (double) to a Duration: rounded, 0 for non-positive or NaN,
// Infinite() beyond the int64 range.
Duration NanosToDuration(double ns);
// A measured time in ns for the fits, floored at 1 ns.
double MeasuredNs(Duration d);
// The weighted, column-scaled NNLS fit of the relative error (estimators.cc).
bool FitRelativeNnls(const double* x, const double* t, int rows, int n, std::vector<double>& a,
                     double* beta);
// Scales `beta` so that the predictions' sum matches the measured sum.
void MeanUnbias(const double* x, const double* t, int rows, int n, double* beta);
// The root of a saved state: a map holding `version` and `list_key`.
ConfigReader ReadStateRoot(const ConfigReader& r, absl::string_view list_key, ConfigErrors* errors);

}  // namespace slicesched::estimate_internal
