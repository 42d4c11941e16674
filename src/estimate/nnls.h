// Non-negative least squares for the estimators' small fits.
//
// Solves   minimise ||A x - b||_2   subject to   x >= 0
// with the Lawson–Hanson active-set method (Lawson & Hanson, "Solving Least
// Squares Problems", 1974, ch. 23). Each passive-set subproblem is solved by
// QR (modified Gram–Schmidt with one reorthogonalisation pass) on A itself
// rather than on the normal equations, so the condition number is not
// squared; a column numerically dependent on the columns already in the
// passive set gets coefficient 0.
//
// Sized for the estimators: n <= kNnlsMaxCols unknowns, m rows (any m >= 1).
// Callers should scale A's columns to comparable norms first: the
// tolerances below are relative to unit-norm columns.
#pragma once

#include <span>

namespace slicesched::estimate_internal {

inline constexpr int kNnlsMaxCols = 8;

// A is m x n, column-major: a[j * m + i] is row i of column j. On return x
// (size n) holds the solution. Returns false when the iteration limit was hit
// or the input was unusable (x then holds the last feasible iterate, or 0).
bool SolveNnls(std::span<const double> a, int m, int n, std::span<const double> b,
               std::span<double> x);

}  // namespace slicesched::estimate_internal
