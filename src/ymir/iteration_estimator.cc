#include "slicesched/ymir/iteration_estimator.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <limits>
#include <set>

#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "slicesched/ymir/stopping.h"

namespace slicesched::ymir {
namespace {

struct Params {
  double r = 0, d = 0, b1 = 0, b2 = 0;
};

double Q(const Params& p, double t) { return 1.0 + p.b1 * t + p.b2 * t * t; }

// A fitted point: time since the curve's origin, normalised loss, weight.
struct WPoint {
  double step = 0, loss = 0, w = 1;
};

double Sse(const Params& p, const std::vector<WPoint>& pts) {
  double s = 0;
  for (const WPoint& x : pts) {
    const double e = x.loss - (p.r + p.d / Q(p, x.step));
    s += x.w * e * e;
  }
  return s;
}

// The constrained (r, D >= 0) linear least squares for fixed (b1, b2): the
// best of the interior solution (when feasible) and the three faces.
void SolveLinear(Params& p, const std::vector<WPoint>& pts) {
  double n = 0, sf = 0, sff = 0, sy = 0, sfy = 0;
  for (const WPoint& x : pts) {
    const double f = 1.0 / Q(p, x.step);
    n += x.w, sf += x.w * f, sff += x.w * f * f, sy += x.w * x.loss, sfy += x.w * f * x.loss;
  }
  std::array<Params, 4> cand;
  int count = 0;
  const double det = n * sff - sf * sf;
  if (det > 1e-12 * n * sff) {
    Params c = p;
    c.r = (sff * sy - sf * sfy) / det;
    c.d = (n * sfy - sf * sy) / det;
    if (c.r >= 0 && c.d >= 0) cand[count++] = c;
  }
  Params c = p;  // r = 0
  c.r = 0, c.d = std::max(0.0, sfy / sff);
  cand[count++] = c;
  c.r = std::max(0.0, sy / n), c.d = 0;  // D = 0
  cand[count++] = c;
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i < count; ++i) {
    const double s = Sse(cand[i], pts);
    if (s < best) best = s, p = cand[i];
  }
}

// Solves the 4x4 system a x = b by Gaussian elimination with partial
// pivoting; false when singular.
bool Solve4(std::array<std::array<double, 4>, 4> a, std::array<double, 4> b,
            std::array<double, 4>& x) {
  for (int c = 0; c < 4; ++c) {
    int piv = c;
    for (int r = c + 1; r < 4; ++r) {
      if (std::abs(a[r][c]) > std::abs(a[piv][c])) piv = r;
    }
    if (!(std::abs(a[piv][c]) > 1e-300)) return false;
    std::swap(a[c], a[piv]);
    std::swap(b[c], b[piv]);
    for (int r = c + 1; r < 4; ++r) {
      const double f = a[r][c] / a[c][c];
      for (int k = c; k < 4; ++k) a[r][k] -= f * a[c][k];
      b[r] -= f * b[c];
    }
  }
  for (int c = 3; c >= 0; --c) {
    double s = b[c];
    for (int k = c + 1; k < 4; ++k) s -= a[c][k] * x[k];
    x[c] = s / a[c][c];
  }
  return true;
}

// Projected Levenberg-Marquardt on (r, D, b1, b2).
// With quadratic false, b2 stays 0 (its row and column are left out).
void Polish(Params& p, const std::vector<WPoint>& pts, int iterations, bool quadratic) {
  double sse = Sse(p, pts);
  double lambda = 1e-3;
  for (int it = 0; it < iterations; ++it) {
    std::array<std::array<double, 4>, 4> jtj{};
    std::array<double, 4> jte{};
    for (const WPoint& x : pts) {
      const double q = Q(p, x.step);
      const double e = x.loss - (p.r + p.d / q);
      const std::array<double, 4> j = {1.0, 1.0 / q, -p.d * x.step / (q * q),
                                       quadratic ? -p.d * x.step * x.step / (q * q) : 0.0};
      for (int a = 0; a < 4; ++a) {
        jte[a] += x.w * j[a] * e;
        for (int b = 0; b < 4; ++b) jtj[a][b] += x.w * j[a] * j[b];
      }
    }
    bool improved = false;
    for (int tries = 0; tries < 10 && !improved; ++tries) {
      auto m = jtj;
      for (int a = 0; a < 4; ++a) m[a][a] += lambda * std::max(jtj[a][a], 1e-12);
      if (!quadratic) m[3][3] = 1.0;  // delta b2 = 0
      std::array<double, 4> delta{};
      if (!Solve4(m, jte, delta)) {
        lambda *= 10;
        continue;
      }
      Params n{std::max(0.0, p.r + delta[0]), std::max(0.0, p.d + delta[1]),
               std::max(0.0, p.b1 + delta[2]), std::max(0.0, p.b2 + delta[3])};
      const double s = Sse(n, pts);
      if (std::isfinite(s) && s < sse) {
        improved = true;
        const bool tiny = sse - s <= 1e-14 * std::max(sse, 1e-300);
        p = n, sse = s, lambda = std::max(lambda / 3, 1e-12);
        if (tiny) return;
      } else {
        lambda *= 4;
      }
    }
    if (!improved) return;
  }
}

// Every point a valid observation, at >= min_distinct steps (`what` names the
// caller in the error).
absl::Status ValidatePoints(const std::vector<LossPoint>& points, const char* what, size_t min_distinct = 3) {
  std::set<double> steps;
  for (size_t i = 0; i < points.size(); ++i) {
    const LossPoint& p = points[i];
    if (!std::isfinite(p.step) || p.step < 0) {
      return absl::InvalidArgumentError(StrCat("loss point ", i, ": step ", p.step, " is not >= 0"));
    }
    if (!std::isfinite(p.loss) || !(p.loss > 0)) {
      return absl::InvalidArgumentError(StrCat("loss point ", i, " (step ", p.step, "): loss ", p.loss,
                                               " is not finite and > 0"));
    }
    steps.insert(p.step);
  }
  if (steps.size() < min_distinct) {
    return absl::InvalidArgumentError(
        StrCat(what, " needs points at >= ", min_distinct, " distinct steps, got ", steps.size()));
  }
  return absl::OkStatus();
}

std::vector<LossPoint> SortedByStep(std::vector<LossPoint> pts) {
  std::stable_sort(pts.begin(), pts.end(),
                   [](const LossPoint& a, const LossPoint& b) { return a.step < b.step; });
  return pts;
}

// The per-point noise of a sorted window: RMS of successive differences / sqrt(2).
double SuccessiveNoise(const std::vector<LossPoint>& sorted) {
  double s = 0;
  for (size_t i = 1; i < sorted.size(); ++i) {
    const double d = sorted[i].loss - sorted[i - 1].loss;
    s += d * d;
  }
  return sorted.size() > 1 ? std::sqrt(s / static_cast<double>(sorted.size() - 1) / 2.0) : 0.0;
}

// The monotone envelope (Envelope) of points sorted by step, in place.
void MakeMonotone(std::vector<LossPoint>* pts, Envelope envelope) {
  std::vector<LossPoint>& p = *pts;
  if (envelope == Envelope::kRunningMin) {
    for (size_t j = 1; j < p.size(); ++j) p[j].loss = std::min(p[j].loss, p[j - 1].loss);
  } else {
    p = IsotonicDecreasing(p);
  }
}

// EstimateOnline's step 3: the fit of the points from `onset` on, in time
// since the onset, on their monotone envelope; t0 = fit_from_step = onset.
absl::StatusOr<LossCurve> FitFromOnset(const std::vector<LossPoint>& sorted, double onset,
                                       const FitOptions& options) {
  std::vector<LossPoint> after;
  for (const LossPoint& p : sorted) {
    if (p.step >= onset) after.push_back({p.step - onset, p.loss});
  }
  FitOptions o = options;
  o.skip_transient = false;
  MakeMonotone(&after, options.envelope);
  SLICESCHED_ASSIGN_OR_RETURN(LossCurve c, FitLossCurve(after, o));
  c.t0 += onset;
  c.fit_from_step += onset;
  return c;
}

// EstimateTransferOnline's step 3 with WatchFit::kLoss: the s in
// [lo, 1 / lo] minimising sum_i (L_i - normal.Loss(max(s t_i, fit_from_step)))^2,
// by a log-spaced grid, then golden-section search between the best node's
// neighbours (the sum need not be unimodal over the whole range).
double LossSpeedup(const LossCurve& normal, const std::vector<LossPoint>& matched, double lo) {
  auto sse = [&](double log_s) {
    const double s = std::exp(log_s);
    double sum = 0;
    for (const LossPoint& p : matched) {
      const double e = p.loss - normal.Loss(std::max(s * p.step, normal.fit_from_step));
      sum += e * e;
    }
    return sum;
  };
  constexpr int kGrid = 200;
  const double a = std::log(lo), b = -std::log(lo), h = (b - a) / kGrid;
  int best = 0;
  double best_sse = sse(a);
  for (int i = 1; i <= kGrid; ++i) {
    const double v = sse(a + h * i);
    if (v < best_sse) best_sse = v, best = i;
  }
  double x0 = a + h * std::max(0, best - 1), x3 = a + h * std::min(kGrid, best + 1);
  const double phi = (std::sqrt(5.0) - 1) / 2;
  double x1 = x3 - phi * (x3 - x0), x2 = x0 + phi * (x3 - x0);
  double f1 = sse(x1), f2 = sse(x2);
  for (int it = 0; it < 60; ++it) {
    if (f1 <= f2) {
      x3 = x2, x2 = x1, f2 = f1;
      x1 = x3 - phi * (x3 - x0), f1 = sse(x1);
    } else {
      x0 = x1, x1 = x2, f1 = f2;
      x2 = x0 + phi * (x3 - x0), f2 = sse(x2);
    }
  }
  const double x = f1 <= f2 ? x1 : x2;
  return std::exp(std::min(f1, f2) <= best_sse ? x : a + h * best);
}

}  // namespace

absl::Status PlateauOptions::Validate() const {
  if (!(noise_k >= 0) || !std::isfinite(noise_k)) {
    return absl::InvalidArgumentError(StrCat("PlateauOptions: noise_k must be finite and >= 0, got ", noise_k));
  }
  if (!(min_drop >= 0 && min_drop < 1)) {
    return absl::InvalidArgumentError(StrCat("PlateauOptions: min_drop must be in [0, 1), got ", min_drop));
  }
  if (recent_points < 1) {
    return absl::InvalidArgumentError(
        StrCat("PlateauOptions: recent_points must be >= 1, got ", recent_points));
  }
  if (!(min_span >= 0) || !std::isfinite(min_span)) {
    return absl::InvalidArgumentError(StrCat("PlateauOptions: min_span must be finite and >= 0, got ", min_span));
  }
  if (min_points < 3) {
    return absl::InvalidArgumentError(StrCat("PlateauOptions: min_points must be >= 3, got ", min_points));
  }
  return absl::OkStatus();
}

absl::StatusOr<PlateauCheck> CheckPlateau(const std::vector<LossPoint>& window,
                                          const PlateauOptions& options) {
  SLICESCHED_RETURN_IF_ERROR(options.Validate());
  SLICESCHED_RETURN_IF_ERROR(ValidatePoints(window, "the plateau test"));
  const std::vector<LossPoint> pts = SortedByStep(window);
  PlateauCheck c;
  c.level = pts.front().loss;
  const size_t k = std::min(pts.size(), static_cast<size_t>(options.recent_points));
  double recent = 0;
  for (size_t i = pts.size() - k; i < pts.size(); ++i) recent += pts[i].loss / static_cast<double>(k);
  c.improvement = c.level - recent;
  c.noise = SuccessiveNoise(pts);
  c.threshold = std::max(options.noise_k * c.noise, options.min_drop * c.level);
  c.plateau = c.improvement < c.threshold;
  return c;
}

absl::StatusOr<OnlineEstimate> EstimateOnline(const std::vector<LossPoint>& curve, double window,
                                              double target_loss, const FitOptions& fit,
                                              const PlateauOptions& plateau) {
  if (!std::isfinite(target_loss) || !(target_loss > 0)) {
    return absl::InvalidArgumentError(StrCat("online estimate: target loss ", target_loss,
                                             " is not finite and > 0"));
  }
  SLICESCHED_RETURN_IF_ERROR(ValidatePoints(curve, "the online estimate"));
  const std::vector<LossPoint> all = SortedByStep(curve);
  const std::vector<LossPoint> first = Prefix(all, window);
  SLICESCHED_ASSIGN_OR_RETURN(PlateauCheck check, CheckPlateau(first, plateau));
  OnlineEstimate e;
  e.observed_until = first.back().step;
  if (!check.plateau) {
    SLICESCHED_ASSIGN_OR_RETURN(LossCurve c, FitLossCurve(first, fit));
    e.steps = c.StepsToLoss(target_loss);
    e.curve = c;
    return e;
  }
  e.plateau = true;
  double floor = first.front().loss;
  for (const LossPoint& p : first) floor = std::min(floor, p.loss);
  const double threshold = floor - std::max(plateau.noise_k * check.noise, plateau.min_drop * floor);
  const size_t recent = static_cast<size_t>(plateau.recent_points);
  for (size_t end = first.size(); end < all.size(); ++end) {
    // The observations up to and including all[end].
    e.observed_until = all[end].step;
    if (end + 1 < recent) continue;
    bool left = true;
    for (size_t i = end + 1 - recent; i <= end && left; ++i) left = all[i].loss < threshold;
    if (!left) continue;
    size_t onset = end;
    while (onset > 0 && all[onset].loss < threshold) --onset;
    const std::vector<LossPoint> seen(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(end + 1));
    const auto points = static_cast<int64_t>(end - onset + 1);
    if (all[end].step - all[onset].step < plateau.min_span || points < plateau.min_points) continue;
    std::set<double> distinct;
    for (size_t i = onset; i <= end; ++i) distinct.insert(all[i].step);
    if (distinct.size() < 3) continue;
    e.onset = all[onset].step;
    SLICESCHED_ASSIGN_OR_RETURN(LossCurve c, FitFromOnset(seen, e.onset, fit));
    e.curve = c;
    e.steps = c.StepsToLoss(target_loss);
    if (e.steps) return e;
  }
  return e;
}

absl::Status TransferWatchOptions::Validate() const {
  if (!(watch > 0) || !std::isfinite(watch)) {
    return absl::InvalidArgumentError(StrCat("TransferWatchOptions: watch must be finite and > 0, got ", watch));
  }
  if (!(min_speedup > 0 && min_speedup <= 1)) {
    return absl::InvalidArgumentError(
        StrCat("TransferWatchOptions: min_speedup must be in (0, 1], got ", min_speedup));
  }
  if (!(prior_points >= 0) || !std::isfinite(prior_points)) {
    return absl::InvalidArgumentError(
        StrCat("TransferWatchOptions: prior_points must be finite and >= 0, got ", prior_points));
  }
  if (fit != WatchFit::kTime && fit != WatchFit::kLoss) {
    return absl::InvalidArgumentError(
        StrCat("TransferWatchOptions: fit must be kTime or kLoss, got ", static_cast<int>(fit)));
  }
  return absl::OkStatus();
}

absl::StatusOr<TransferEstimate> EstimateTransferOnline(const std::optional<LossCurve>& normal,
                                                        const std::vector<LossPoint>& transfer,
                                                        double target_loss, double prior_gain,
                                                        const TransferWatchOptions& options) {
  SLICESCHED_RETURN_IF_ERROR(options.Validate());
  if (!std::isfinite(target_loss) || !(target_loss > 0)) {
    return absl::InvalidArgumentError(StrCat("transfer estimate: target loss ", target_loss,
                                             " is not finite and > 0"));
  }
  if (!std::isfinite(prior_gain) || !(prior_gain > -1)) {
    return absl::InvalidArgumentError(StrCat("transfer estimate: prior gain ", prior_gain,
                                             " is not finite and > -1"));
  }
  SLICESCHED_RETURN_IF_ERROR(ValidatePoints(transfer, "the transfer estimate", 1));
  const std::vector<LossPoint> seen = Prefix(SortedByStep(transfer), options.watch);
  TransferEstimate e;
  std::vector<LossPoint> envelope = seen;
  MakeMonotone(&envelope, Envelope::kRunningMin);
  for (const LossPoint& p : seen) {
    if (p.step > 0) ++e.watched_points;
  }
  if (e.watched_points == 0) {
    return absl::InvalidArgumentError(
        StrCat("transfer estimate: no observation of the transferred run in (0, ", options.watch, "]"));
  }
  e.observed_until = seen.back().step;
  if (envelope.back().loss <= target_loss) {
    SLICESCHED_ASSIGN_OR_RETURN(
        StepsToTargetResult done,
        StepsToTarget(seen, target_loss, static_cast<int64_t>(std::ceil(e.observed_until))));
    e.reached = true;
    e.steps = done.steps;
    return e;
  }
  e.speedup = 1.0 + prior_gain;
  const std::optional<double> normal_steps = normal ? normal->StepsToLoss(target_loss) : std::nullopt;
  if (!normal_steps) return e;  // every watched loss is above the target, so matched ones are finite
  std::vector<LossPoint> matched;  // (t, L) that place the run
  double tt = 0, ts = 0;           // sums of t t* and t^2
  for (const LossPoint& p : envelope) {
    if (p.step <= 0) continue;
    const double at = *normal->StepsToLoss(p.loss);
    if (at <= normal->fit_from_step && p.step <= normal->fit_from_step) continue;  // no position
    tt += p.step * at;
    ts += p.step * p.step;
    matched.push_back(p);
  }
  e.matched_points = static_cast<int64_t>(matched.size());
  if (matched.empty()) {
    e.steps = *normal_steps / e.speedup;
    return e;
  }
  e.fitted_speedup = options.fit == WatchFit::kTime
                         ? std::max(options.min_speedup, tt / ts)
                         : LossSpeedup(*normal, matched, options.min_speedup);
  const double n = static_cast<double>(e.matched_points), k = options.prior_points;
  e.speedup = std::exp((n * std::log(e.fitted_speedup) + k * std::log(1.0 + prior_gain)) / (n + k));
  e.steps = *normal_steps / e.speedup;
  return e;
}

double LossCurve::Normalised(double step) const {
  const double t = std::max(0.0, step - t0);
  return r + d / (1.0 + b1 * t + b2 * t * t);
}

double LossCurve::Improvement(double step) const { return Normalised(step) - Normalised(step + 1); }

int64_t LossCurve::ConvergenceStep(double threshold) const {
  if (d <= 0 || (b1 <= 0 && b2 <= 0)) return 0;
  if (t0 > 0) {
    // Flat before its origin: the unshifted curve's step, moved by t0.
    LossCurve at_origin = *this;
    at_origin.t0 = 0;
    const int64_t k = at_origin.ConvergenceStep(threshold);
    return k == 0 ? 0 : k + static_cast<int64_t>(std::ceil(t0));
  }
  constexpr int64_t kCap = int64_t{1} << 50;
  // First t with Improvement(t + 1) <= Improvement(t): the peak (the
  // improvement rises, if at all, only while q's curvature dominates).
  auto after_peak = [&](int64_t t) { return Improvement(double(t + 1)) <= Improvement(double(t)); };
  auto first_true = [&](auto pred) {
    if (pred(0)) return int64_t{0};
    int64_t lo = 0, hi = 1;  // pred(lo) false
    while (!pred(hi)) {
      lo = hi;
      if (hi >= kCap) return kCap;
      hi *= 2;
    }
    while (hi - lo > 1) {
      const int64_t mid = lo + (hi - lo) / 2;
      (pred(mid) ? hi : lo) = mid;
    }
    return hi;
  };
  const int64_t peak = first_true(after_peak);
  if (Improvement(double(peak)) <= threshold) return 0;
  return peak + first_true([&](int64_t k) { return Improvement(double(peak + k)) <= threshold; });
}

std::optional<double> LossCurve::StepsToLoss(double target_loss) const {
  const double y = target_loss / scale;
  if (y >= r + d) return fit_from_step;
  if (y <= r || (b1 <= 0 && b2 <= 0)) return std::nullopt;
  const double qm1 = d / (y - r) - 1.0;  // q(t) - 1 = b1 t + b2 t^2 > 0
  // The positive root of b2 t^2 + b1 t - qm1 = 0, in the form stable for b2 -> 0.
  return std::max(fit_from_step, t0 + 2.0 * qm1 / (b1 + std::sqrt(b1 * b1 + 4.0 * b2 * qm1)));
}

absl::StatusOr<LossCurve> LossCurve::WithGain(double gain) const {
  if (!(gain > -1.0) || !std::isfinite(gain)) {
    return absl::InvalidArgumentError(StrCat("transfer gain must be finite and > -1, got ", gain));
  }
  LossCurve c = *this;
  c.b1 = b1 * (1.0 + gain);
  c.b2 = b2 * (1.0 + gain) * (1.0 + gain);
  c.fit_from_step = fit_from_step / (1.0 + gain);
  c.t0 = t0 / (1.0 + gain);
  return c;
}

std::vector<LossPoint> SettledEnvelope(const std::vector<LossPoint>& points, Envelope envelope) {
  std::vector<LossPoint> pts = points;
  std::stable_sort(pts.begin(), pts.end(),
                   [](const LossPoint& a, const LossPoint& b) { return a.step < b.step; });
  auto enough_from = [&](size_t i) {
    std::set<double> rest;
    for (size_t j = i; j < pts.size(); ++j) rest.insert(pts[j].step);
    return rest.size() >= 3;
  };
  // 1. Warm-up end: the first local maximum after the first local minimum
  // (the top of the overshoot), else that minimum, else the first point.
  size_t start = 0;
  size_t i = 1;
  while (i + 1 < pts.size() && pts[i + 1].loss < pts[i].loss) ++i;
  if (i + 1 < pts.size()) {  // pts[i] is the first local minimum
    size_t k = i + 1;
    while (k + 1 < pts.size() && pts[k + 1].loss >= pts[k].loss) ++k;
    if (k + 1 < pts.size() && enough_from(k)) {
      start = k;
    } else if (enough_from(i)) {
      start = i;
    }
  }
  pts.erase(pts.begin(), pts.begin() + static_cast<std::ptrdiff_t>(start));
  // 2. The monotone envelope.
  MakeMonotone(&pts, envelope);
  return pts;
}

std::vector<LossPoint> IsotonicDecreasing(const std::vector<LossPoint>& points) {
  std::vector<LossPoint> pts = points;
  std::stable_sort(pts.begin(), pts.end(),
                   [](const LossPoint& a, const LossPoint& b) { return a.step < b.step; });
  // Pool adjacent violators: blocks (mean, size); a block higher than the one
  // before it is merged into it.
  std::vector<std::pair<double, size_t>> blocks;
  for (const LossPoint& p : pts) {
    blocks.emplace_back(p.loss, 1);
    while (blocks.size() > 1 && blocks.back().first > blocks[blocks.size() - 2].first) {
      const auto [m, k] = blocks.back();
      blocks.pop_back();
      auto& prev = blocks.back();
      prev.first = (prev.first * static_cast<double>(prev.second) + m * static_cast<double>(k)) /
                   static_cast<double>(prev.second + k);
      prev.second += k;
    }
  }
  size_t i = 0;
  for (const auto& [m, k] : blocks) {
    for (size_t j = 0; j < k; ++j) pts[i++].loss = m;
  }
  return pts;
}

std::vector<LossPoint> Prefix(const std::vector<LossPoint>& points, double max_step) {
  std::vector<LossPoint> out;
  for (const LossPoint& p : points) {
    if (p.step <= max_step) out.push_back(p);
  }
  return out;
}

absl::Status FitOptions::Validate() const {
  if (grid_points < 2) {
    return absl::InvalidArgumentError(StrCat("FitOptions: grid_points must be >= 2, got ", grid_points));
  }
  if (!(min_rate > 0) || !(max_rate > min_rate) || !std::isfinite(max_rate)) {
    return absl::InvalidArgumentError(
        StrCat("FitOptions: min_rate and max_rate must be finite with 0 < min_rate < max_rate, got ", min_rate,
               " and ", max_rate));
  }
  if (polish_iterations < 0) {
    return absl::InvalidArgumentError(
        StrCat("FitOptions: polish_iterations must be >= 0, got ", polish_iterations));
  }
  if (!(recency_half_life >= 0) || !std::isfinite(recency_half_life)) {
    return absl::InvalidArgumentError(
        StrCat("FitOptions: recency_half_life must be finite and >= 0, got ", recency_half_life));
  }
  return absl::OkStatus();
}

absl::StatusOr<LossCurve> FitLossCurve(const std::vector<LossPoint>& points,
                                       const FitOptions& options) {
  SLICESCHED_RETURN_IF_ERROR(options.Validate());
  SLICESCHED_RETURN_IF_ERROR(ValidatePoints(points, "fitting a loss curve"));
  // Normalise by the loss at the earliest observation.
  const auto first = std::min_element(points.begin(), points.end(),
                                      [](const LossPoint& a, const LossPoint& b) { return a.step < b.step; });
  const double scale = first->loss;
  std::vector<LossPoint> settled =
      options.skip_transient ? SettledEnvelope(points, options.envelope) : points;
  std::stable_sort(settled.begin(), settled.end(),
                   [](const LossPoint& a, const LossPoint& b) { return a.step < b.step; });
  const double from = settled.front().step, last = settled.back().step;
  // Candidate origins: 0 (unshifted), or with the time shift every settled
  // step that leaves >= 3 distinct steps at or after it.
  std::vector<double> origins = {0.0};
  if (options.time_shift) {
    origins.clear();
    std::set<double> distinct;
    for (const LossPoint& p : settled) distinct.insert(p.step);
    std::vector<double> d(distinct.begin(), distinct.end());
    for (size_t i = 0; i + 2 < d.size(); ++i) origins.push_back(d[i]);
  }
  std::vector<double> rates = {0.0};
  const int n = options.grid_points;
  for (int i = 0; i < n; ++i) {
    rates.push_back(options.min_rate *
                    std::pow(options.max_rate / options.min_rate, double(i) / double(n - 1)));
  }
  const std::vector<double> b2_rates = options.quadratic ? rates : std::vector<double>{0.0};
  // Points in time since `origin` (0 before it: the flat warm-up).
  auto shifted = [&](double origin) {
    std::vector<WPoint> pts;
    for (const LossPoint& p : settled) {
      const double w = options.recency_half_life > 0
                           ? std::exp2(-(last - p.step) / options.recency_half_life)
                           : 1.0;
      pts.push_back({std::max(0.0, p.step - origin), p.loss / scale, w});
    }
    return pts;
  };
  Params best;
  double best_origin = origins.front();
  double best_sse = std::numeric_limits<double>::infinity();
  for (double origin : origins) {
    const std::vector<WPoint> pts = shifted(origin);
    for (double b1 : rates) {
      for (double s2 : b2_rates) {
        Params p{0, 0, b1, s2 * s2};
        SolveLinear(p, pts);
        const double s = Sse(p, pts);
        if (s < best_sse) best_sse = s, best = p, best_origin = origin;
      }
    }
  }
  const std::vector<WPoint> pts = shifted(best_origin);
  Polish(best, pts, options.polish_iterations, options.quadratic);
  LossCurve c{.r = best.r, .d = best.d, .b1 = best.b1, .b2 = best.b2, .scale = scale};
  double wsum = 0;
  for (const WPoint& p : pts) wsum += p.w;
  c.rmse = std::sqrt(Sse(best, pts) / wsum);
  c.fit_from_step = from;
  c.t0 = best_origin;
  c.fitted_points = static_cast<int64_t>(pts.size());
  return c;
}

absl::StatusOr<double> PredictStepsToLoss(const std::vector<LossPoint>& prefix, double target_loss,
                                          double gain, const FitOptions& options) {
  SLICESCHED_ASSIGN_OR_RETURN(LossCurve normal, FitLossCurve(prefix, options));
  SLICESCHED_ASSIGN_OR_RETURN(LossCurve c, normal.WithGain(gain));
  const std::optional<double> s = c.StepsToLoss(target_loss);
  if (!s) {
    return absl::NotFoundError(StrCat("the fitted curve never reaches loss ", target_loss,
                                      " (asymptote ", c.r * c.scale, ")"));
  }
  return *s;
}

}  // namespace slicesched::ymir
