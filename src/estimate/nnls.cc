#include "nnls.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace slicesched::estimate_internal {
namespace {

// A column whose component orthogonal to the passive columns before it is
// below this fraction of its norm is treated as dependent (coefficient 0).
constexpr double kDependentTol = 1e-9;

double Dot(const double* u, const double* v, int m) {
  double s = 0;
  for (int i = 0; i < m; ++i) s += u[i] * v[i];
  return s;
}

// Unconstrained least squares over the passive columns: z minimises
// ||A_P z_P - b|| with z_j = 0 for j outside P. A_P = Q R by modified
// Gram–Schmidt, run twice per column ("twice is enough") so Q stays
// orthogonal to working precision; then R z = Q^T b by back substitution.
void SolvePassive(const double* a, int m, int n, const double* b, const bool* passive, double* z,
                  std::vector<double>& q) {
  double r[kNnlsMaxCols][kNnlsMaxCols] = {};
  int cols[kNnlsMaxCols];
  int p = 0;
  for (int j = 0; j < n; ++j) z[j] = 0;
  for (int j = 0; j < n; ++j) {
    if (!passive[j]) continue;
    const double* col = a + static_cast<size_t>(j) * m;
    double* v = q.data() + static_cast<size_t>(p) * m;
    std::copy(col, col + m, v);
    const double norm0 = std::sqrt(Dot(col, col, m));
    for (int k = 0; k < p; ++k) r[k][p] = 0;
    for (int pass = 0; pass < 2; ++pass) {
      for (int k = 0; k < p; ++k) {
        const double* qk = q.data() + static_cast<size_t>(k) * m;
        const double d = Dot(qk, v, m);
        r[k][p] += d;
        for (int i = 0; i < m; ++i) v[i] -= d * qk[i];
      }
    }
    const double norm = std::sqrt(Dot(v, v, m));
    if (!(norm > kDependentTol * norm0)) continue;  // dependent or zero column
    for (int i = 0; i < m; ++i) v[i] /= norm;
    r[p][p] = norm;
    cols[p] = j;
    ++p;
  }
  double y[kNnlsMaxCols];
  for (int k = 0; k < p; ++k) y[k] = Dot(q.data() + static_cast<size_t>(k) * m, b, m);
  for (int k = p - 1; k >= 0; --k) {
    double s = y[k];
    for (int l = k + 1; l < p; ++l) s -= r[k][l] * y[l];
    y[k] = s / r[k][k];  // y now holds the solution for accepted column k
  }
  for (int k = 0; k < p; ++k) z[cols[k]] = y[k];
}

}  // namespace

bool SolveNnls(std::span<const double> a, int m, int n, std::span<const double> b,
               std::span<double> x) {
  for (double& v : x) v = 0;
  if (m <= 0 || n <= 0 || n > kNnlsMaxCols || x.size() < static_cast<size_t>(n) ||
      a.size() < static_cast<size_t>(m) * n || b.size() < static_cast<size_t>(m)) {
    return false;
  }
  const double* A = a.data();
  const double* B = b.data();
  std::vector<double> q(static_cast<size_t>(m) * n);
  std::vector<double> resid(m);
  bool passive[kNnlsMaxCols] = {};
  // Columns whose gradient is positive but which cannot enter the passive set
  // with a positive coefficient (numerical degeneracy); cleared after any step.
  bool blocked[kNnlsMaxCols] = {};
  double z[kNnlsMaxCols];
  // Gradient entries below this are rounding noise (columns have unit norm).
  const double tol = 1e-10 * std::max(1.0, std::sqrt(Dot(B, B, m)));
  const int max_iterations = 30 * n + 30;
  int iterations = 0;

  while (true) {
    // w = A^T (b - A x): the negative gradient of ||Ax - b||^2 / 2.
    for (int i = 0; i < m; ++i) resid[i] = B[i];
    for (int j = 0; j < n; ++j) {
      if (x[j] == 0) continue;
      const double* col = A + static_cast<size_t>(j) * m;
      for (int i = 0; i < m; ++i) resid[i] -= x[j] * col[i];
    }
    int t = -1;
    double best = tol;
    for (int j = 0; j < n; ++j) {
      if (passive[j] || blocked[j]) continue;
      const double w = Dot(A + static_cast<size_t>(j) * m, resid.data(), m);
      if (w > best) {
        best = w;
        t = j;
      }
    }
    if (t < 0) return true;  // Kuhn–Tucker conditions hold
    passive[t] = true;
    bool first = true;
    while (true) {
      if (++iterations > max_iterations) return false;
      SolvePassive(A, m, n, B, passive, z, q);
      if (first && !(z[t] > 0)) {
        passive[t] = false;
        blocked[t] = true;
        break;
      }
      first = false;
      bool feasible = true;
      for (int j = 0; j < n; ++j) {
        if (passive[j] && !(z[j] > 0)) feasible = false;
      }
      if (feasible) {
        for (int j = 0; j < n; ++j) x[j] = passive[j] ? z[j] : 0;
        std::fill(blocked, blocked + n, false);
        break;
      }
      // Step from x towards z as far as feasibility allows; the coefficient
      // that reaches zero first (and any other at zero) leaves the passive set.
      double alpha = 1;
      int leaving = -1;
      for (int j = 0; j < n; ++j) {
        if (!passive[j] || z[j] > 0) continue;
        const double denom = x[j] - z[j];  // >= 0: x_j >= 0 >= z_j
        const double step = denom > 0 ? x[j] / denom : 0.0;
        if (leaving < 0 || step < alpha) {
          alpha = step;
          leaving = j;
        }
      }
      for (int j = 0; j < n; ++j) {
        if (passive[j]) x[j] += alpha * (z[j] - x[j]);
      }
      for (int j = 0; j < n; ++j) {
        if (passive[j] && (j == leaving || !(x[j] > 0))) {
          passive[j] = false;
          x[j] = 0;
        }
      }
    }
  }
}

}  // namespace slicesched::estimate_internal
