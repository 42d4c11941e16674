// Order statistics over samples: quantiles by linear interpolation between
// the closest ranks (numpy's default), and the median (the 0.5 quantile: the
// middle sample, or the mean of the two middle ones).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <vector>

namespace slicesched {

// The q-quantile (0 <= q <= 1, clamped) of samples sorted ascending; 0 for
// no samples.
inline double QuantileOfSorted(std::span<const double> sorted, double q) {
  if (sorted.empty()) return 0;
  q = std::clamp(q, 0.0, 1.0);
  const double h = static_cast<double>(sorted.size() - 1) * q;
  const size_t i = static_cast<size_t>(std::floor(h));
  const size_t j = std::min(i + 1, sorted.size() - 1);
  return sorted[i] + (h - static_cast<double>(i)) * (sorted[j] - sorted[i]);
}

// The same for samples in any order (sorts its copy).
inline double Quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return QuantileOfSorted(v, q);
}

inline double Median(std::vector<double> v) { return Quantile(std::move(v), 0.5); }

}  // namespace slicesched
