// Percentages, root mean square, correlation and least squares of stats.h.
#include "slicesched/common/stats.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

namespace slicesched {

double Percentage(int64_t num, int64_t den) {
  return den > 0 ? 100.0 * static_cast<double>(num) / static_cast<double>(den) : 0.0;
}

double RootMeanSquare(const std::vector<double>& v) {
  if (v.empty()) return 0.0;
  double ss = 0;
  for (double x : v) ss += x * x;
  return std::sqrt(ss / static_cast<double>(v.size()));
}

double CosineSimilarity(const std::vector<double>& a, const std::vector<double>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ab += a[i] * b[i];
    aa += a[i] * a[i];
    bb += b[i] * b[i];
  }
  return aa > 0 && bb > 0 ? ab / std::sqrt(aa * bb) : 0.0;
}

double PearsonCorrelation(const std::vector<double>& x, const std::vector<double>& y) {
  const auto n = static_cast<double>(x.size());
  double mx = 0, my = 0;
  for (size_t i = 0; i < x.size(); ++i) mx += x[i] / n, my += y[i] / n;
  double sxy = 0, sxx = 0, syy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    sxy += (x[i] - mx) * (y[i] - my);
    sxx += (x[i] - mx) * (x[i] - mx);
    syy += (y[i] - my) * (y[i] - my);
  }
  return sxx > 0 && syy > 0 ? sxy / std::sqrt(sxx * syy) : 0.0;
}

LinearFit FitLine(const std::vector<double>& x, const std::vector<double>& y) {
  const auto n = static_cast<double>(x.size());
  if (x.empty()) return {};
  double mx = 0, my = 0;
  for (size_t i = 0; i < x.size(); ++i) mx += x[i] / n, my += y[i] / n;
  double sxy = 0, sxx = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    sxy += (x[i] - mx) * (y[i] - my);
    sxx += (x[i] - mx) * (x[i] - mx);
  }
  LinearFit f;
  f.slope = sxx > 0 ? sxy / sxx : 0.0;
  f.intercept = my - f.slope * mx;
  return f;
}

std::vector<double> FitLeastSquares(const std::vector<std::vector<double>>& x, const std::vector<double>& y) {
  if (x.empty()) return {};
  const size_t k = x[0].size();
  // Normal equations [X'X | X'y], a relative ridge of 1e-12 on every column
  // but the first (a constant or all-zero regressor gets weight ~0), and
  // Gauss-Jordan elimination with partial pivoting.
  std::vector<std::vector<double>> m(k, std::vector<double>(k + 1, 0.0));
  for (size_t n = 0; n < x.size(); ++n) {
    for (size_t i = 0; i < k; ++i) {
      for (size_t j = 0; j < k; ++j) m[i][j] += x[n][i] * x[n][j];
      m[i][k] += x[n][i] * y[n];
    }
  }
  double trace = 0;
  for (size_t i = 0; i < k; ++i) trace += m[i][i];
  for (size_t i = 1; i < k; ++i) m[i][i] += 1e-12 * std::max(trace, 1.0);
  for (size_t c = 0; c < k; ++c) {
    size_t piv = c;
    for (size_t r = c + 1; r < k; ++r) {
      if (std::abs(m[r][c]) > std::abs(m[piv][c])) piv = r;
    }
    std::swap(m[c], m[piv]);
    if (m[c][c] == 0.0) continue;  // an all-zero column: its weight stays 0
    for (size_t r = 0; r < k; ++r) {
      if (r == c) continue;
      const double f = m[r][c] / m[c][c];
      for (size_t q = c; q <= k; ++q) m[r][q] -= f * m[c][q];
    }
  }
  std::vector<double> w(k, 0.0);
  for (size_t i = 0; i < k; ++i) w[i] = m[i][i] != 0.0 ? m[i][k] / m[i][i] : 0.0;
  return w;
}

}  // namespace slicesched
