// Statistics over samples: order statistics (quantiles by linear
// interpolation between the closest ranks, numpy's default, and the median:
// the 0.5 quantile, the middle sample or the mean of the two middle ones),
// similarity and correlation of paired samples, and least-squares fits.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
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

// 100 num / den: num as a percentage of den; 0 when den <= 0.
double Percentage(int64_t num, int64_t den);

// sqrt(mean of v^2); 0 for no samples.
double RootMeanSquare(const std::vector<double>& v);

// The cosine of the angle between a and b (over a's size; b at least as
// long), a.b / (|a| |b|); 0 when either is all zero.
double CosineSimilarity(const std::vector<double>& a, const std::vector<double>& b);

// Pearson's correlation coefficient r of the pairs (x[i], y[i]) (over x's
// size; y at least as long); 0 when x or y is constant (or there are no
// pairs).
double PearsonCorrelation(const std::vector<double>& x, const std::vector<double>& y);

struct LinearFit {
  double intercept = 0;
  double slope = 0;
};
// Least squares y ~ intercept + slope x (slope 0 when x is constant; both 0
// for no points).
LinearFit FitLine(const std::vector<double>& x, const std::vector<double>& y);

// Least squares y ~ x w over rows x (each of the same size k, the first
// column the intercept's 1): the weights w (k of them; empty for no rows). A
// regressor that is 0 in every row, or collinear with the others, gets a
// weight of ~0 (a relative ridge of 1e-12 on every column but the first).
std::vector<double> FitLeastSquares(const std::vector<std::vector<double>>& x, const std::vector<double>& y);

}  // namespace slicesched
