// Ymir's iteration estimator (../shared/papers/ymir.md §4.2, Eq. 2-3): how
// many optimizer steps a fine-tuning task still needs,
// from an early prefix of its loss curve. Torch-free; the experiment in
// experiments/torch/task2vec.cc and the daemon's job runner both use it.
//
// Normalised curve. Observations (step t_i >= 0, loss L_i > 0) are divided by
// the loss at the first observation, y_i = L_i / L_first, so every curve
// starts near 1 and fits are comparable across tasks.
//
// Model: a quadratic rational function of the step t,
//
//   y(t) = (a0 + a1 t + a2 t^2) / (1 + b1 t + b2 t^2),
//
// constrained to a monotone decay towards an asymptote r >= 0:
//   a0 = r + D,  a1 = r b1,  a2 = r b2,   i.e.   y(t) = r + D / q(t),
//   q(t) = 1 + b1 t + b2 t^2,  D >= 0 (the total drop), b1, b2 >= 0,
// so q has no pole on t >= 0 and y falls from r + D at t = 0 to r. (b2 = 0 is
// Optimus' 1/(b t + c) + r curve; b2 > 0 lets the tail fall faster.)
//
// Transient rule (FitOptions::skip_transient, on by default). Fine-tuning
// curves with a fresh head fall steeply for a few steps, overshoot (the loss
// bumps back up) and then creep down with +-5% wander; a monotone rational
// curve fitted to the raw points settles on the early plateau and predicts
// "never" (docs/design/ymir-estimators.md). So, before fitting, on
// the normalised points sorted by step:
//  1. Warm-up: the fit starts at the top of the overshoot, the first local
//     maximum after the first local minimum (the first point i >= 1 whose
//     successor is not lower, y_{i+1} >= y_i); else (no later maximum, or
//     fewer than 3 distinct steps after it) at that minimum; the points
//     before it (the initial drop and the climb) are dropped. A curve that
//     falls at every observation has no local minimum and keeps all its
//     points; so does one where fewer than 3 distinct steps would remain.
//  2. Envelope: each remaining loss is replaced by the running minimum from
//     the warm-up end, min_{j <= i} y_j (the best loss seen so far, a
//     monotone lower envelope), so bumps after the overshoot do not lift the
//     fitted asymptote.
// The rule uses only the given points (no look-ahead, no per-task knobs);
// steps keep their original values (no time shift), and the normalisation
// is still by the first observation. With the rule off the raw points are
// fitted as they are.
//
// Fit: least squares on the normalised points (after the transient rule);
// b2 is held at 0 unless FitOptions::quadratic. For fixed (b1, b2) the model
// is linear in (r, D), so the fit is separable (variable projection): a
// log-spaced grid over b1 x b2 (b2 = 0 included) with the constrained
// two-variable linear least squares at each node, then a projected
// Levenberg-Marquardt polish of all four parameters from the best node
// (every iterate clamped to r, D, b1, b2 >= 0; a step is kept only when it
// lowers the residual). Needs >= 3 points at >= 3 distinct steps.
//
// Convergence (Eq. 3): the per-step improvement y(t) - y(t + 1) <= 0.001
// (in normalised units). ConvergenceStep is the first integer t from which
// the improvement stays <= the threshold (it may rise at first when b2 > 0,
// then falls for good).
//
// Iterations to a target: the smallest real t >= fit_from_step with
// y(t) <= y*, solved in closed form from q(t) = D / (y* - r); unreachable
// (nullopt) when y* <= r (the curve never gets there).
//
// Transfer gain. Ymir's gain g of task B under a transfer is defined by
// steps: steps(transfer) = steps(normal) / (1 + g) to the same target (see
// experiments/task2vec.h). The estimator applies it as a time scaling of the
// normal curve, y_g(t) = y((1 + g) t): b1 -> (1 + g) b1, b2 -> (1 + g)^2 b2,
// the start r + D and the asymptote r unchanged (the bar never moves), and
// fit_from_step -> fit_from_step / (1 + g). So iterations to any target
// divide by exactly 1 + g; g must be > -1.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace slicesched::ymir {

struct LossPoint {
  double step = 0;  // optimizer steps taken, >= 0
  double loss = 0;  // > 0, finite
};

// y(t) = r + D / (1 + b1 t + b2 t^2), normalised by `scale` (the first
// observed loss): loss(t) = scale * y(t).
struct LossCurve {
  double r = 0;   // asymptote
  double d = 0;   // drop: y(0) = r + d
  double b1 = 0;  // >= 0
  double b2 = 0;  // >= 0
  double scale = 1;
  double rmse = 0;  // of the fit to the points fitted, in normalised units
  // Where the fitted points start (the warm-up end of the transient rule; the
  // first observed step when nothing was dropped) and how many were fitted.
  double fit_from_step = 0;
  int64_t fitted_points = 0;
  // The curve's time origin (FitOptions::time_shift): y(t) = r + D / q(t - t0)
  // for t >= t0 and r + D before it; 0 = unshifted (the model above).
  double t0 = 0;

  double Normalised(double step) const;  // y(t)
  double Loss(double step) const { return scale * Normalised(step); }
  // y(t) - y(t + 1).
  double Improvement(double step) const;
  // The first integer t >= 0 from which Improvement(t) <= threshold (0 when
  // the curve is flat). threshold > 0. A shifted curve (t0 > 0) gives the
  // unshifted curve's step plus ceil(t0) (0 stays 0).
  int64_t ConvergenceStep(double threshold = 0.001) const;
  // Steps until the (unnormalised) loss first reaches `target_loss`, counted
  // from step 0 but never before fit_from_step (the curve describes the loss
  // only from where its fitted points start: a dip below the target during
  // the dropped warm-up does not count); fit_from_step when the curve is
  // already at or below it there, nullopt when it never gets there.
  std::optional<double> StepsToLoss(double target_loss) const;
  // The curve of the same task under a transfer with gain g (> -1): see above.
  absl::StatusOr<LossCurve> WithGain(double gain) const;
};

// The monotone envelope of the transient rule's step 2.
enum class Envelope : uint8_t {
  kRunningMin,  // the best loss so far (biased low by lucky dips)
  kIsotonic,    // the least-squares non-increasing sequence (pool adjacent violators)
};

struct FitOptions {
  int grid_points = 48;       // per axis of the (b1, b2) grid
  double min_rate = 1e-4;     // grid range of b1 (and of sqrt(b2))
  double max_rate = 1e2;
  int polish_iterations = 50;
  // Drop the warm-up and fit the running-minimum envelope (see above).
  bool skip_transient = true;
  // Fit b2 too; by default b2 = 0 (Optimus' r + D / (1 + b1 t) curve): after
  // the transient rule a short prefix leaves ~8-20 settled points, and the
  // b2 term extrapolates them erratically (docs/design/ymir-estimators.md;
  // IterationEstimator.TransientRuleRecoversTheCreepAfterTheWarmUp).
  bool quadratic = false;
  Envelope envelope = Envelope::kRunningMin;
  // Time shift: the curve gets an origin t0, y(t) = r + D for t < t0 and
  // r + D / q(t - t0) after it (a flat warm-up, then the decay), with t0
  // fitted too: every settled step that leaves >= 3 distinct steps at or
  // after it is tried (each with the whole (b1, b2) grid, on all the settled
  // points), the least squares wins, and the polish keeps t0. So r + D is the
  // level where the decay starts instead of an extrapolation back to step 0
  // (without it, a fit that starts after a dropped warm-up can trade D
  // against b1 without bound, and a warm-up that stays flat for a few steps,
  // e.g. under a learning-rate warm-up, cannot be described at all:
  // docs/design/ymir-estimators.md).
  bool time_shift = false;
  // Recency weighting: point i weighs 2^(-(t_last - t_i) / h) in the least
  // squares (h in steps), so the end of the prefix, closest to what is
  // extrapolated, counts most; 0 = equal weights. It also discounts the
  // running-minimum envelope of a noisy flat start, a slow staircase that an
  // equal-weight fit reads as an early, slow decay
  // (docs/design/ymir-estimators.md; IterationEstimator.RecencyWeightsDiscountTheEnvelopeOfANoisyFlatStart).
  // In steps, so no default suits every schedule: the Ymir experiment sets
  // its own (experiments/task2vec.h, iter_fit).
  double recency_half_life = 0;
  // InvalidArgument naming the field out of range (FitLossCurve checks it).
  absl::Status Validate() const;
};

// The transient rule alone: the points FitLossCurve fits when
// skip_transient is on, in loss units (not normalised), sorted by step.
// Requires valid points (as FitLossCurve); an empty input gives an empty
// result.
std::vector<LossPoint> SettledEnvelope(const std::vector<LossPoint>& points,
                                       Envelope envelope = Envelope::kRunningMin);

// Isotonic (non-increasing) least-squares regression of the losses, by pool
// adjacent violators: sorted by step, each loss replaced by its block's mean.
std::vector<LossPoint> IsotonicDecreasing(const std::vector<LossPoint>& points);

// Fits the curve above to `points` (any order; steps need not be integers).
// InvalidArgument naming the bad point when a loss is not finite and > 0 or a
// step is negative, or with fewer than 3 distinct steps.
absl::StatusOr<LossCurve> FitLossCurve(const std::vector<LossPoint>& points,
                                       const FitOptions& options = {});

// The points with step <= max_step (the early prefix a prediction may see).
std::vector<LossPoint> Prefix(const std::vector<LossPoint>& points, double max_step);

// ---------------------------------------------------------------------------
// Online estimation through a plateau (docs/design/ymir-estimators.md).
// Some curves sit at their starting level for a long time and then
// drop (a zero head that must grow before the adapters get a gradient; the
// synthetic first-class task sits at chance for ~40 steps). A fit of such a
// prefix says nothing about when the drop comes; a scheduler does not trust
// it but keeps watching. EstimateOnline does that:
//
//  1. Plateau test on the first window (the points with step <= window): the
//     improvement is level - (mean of the last `recent_points` losses), level
//     = the first observed loss; the per-point noise sigma is the RMS of
//     successive differences / sqrt(2) (noise of one point when the curve is
//     flat). The window is a PLATEAU when improvement < max(noise_k sigma,
//     min_drop level): no improvement beyond noise. Otherwise the estimate is
//     FitLossCurve of the window, available at the window's end.
//  2. A plateau is not fitted. The observation window grows one observation
//     at a time; the curve has LEFT the plateau when its last `recent_points`
//     losses all lie below floor - max(noise_k sigma, min_drop floor), floor
//     = the lowest loss of the first window (sigma as above). The ONSET is
//     the last observation at or above that threshold.
//  3. Once min_span steps and min_points points are observed from the onset
//     on, the points from the onset are fitted in time since the onset, on
//     their monotone envelope (FitOptions::envelope; the warm-up rule is not
//     applied: the drop is the decay itself), normalised by the loss at the
//     onset; the curve gets t0 = fit_from_step = onset, so its steps to a
//     target count from step 0 (the elapsed steps added). A fit that never
//     reaches the target is not an estimate: the window grows and the fit is
//     redone at the next observation.
//  4. observed_until is the last step the estimator had seen when its
//     estimate became available (the window's end without a plateau); with
//     no estimate by the last observation, steps is nullopt.
struct PlateauOptions {
  double noise_k = 3.0;
  double min_drop = 0.05;     // fraction of the level
  int64_t recent_points = 3;  // >= 1
  double min_span = 12;       // steps observed from the onset before fitting, >= 0
  int64_t min_points = 4;     // points from the onset on before fitting, >= 3
  // InvalidArgument naming the field out of range.
  absl::Status Validate() const;
};

struct PlateauCheck {
  bool plateau = false;
  double level = 0;        // the first observed loss
  double improvement = 0;  // level - mean of the last recent_points losses
  double noise = 0;        // sigma, in loss units
  double threshold = 0;    // max(noise_k sigma, min_drop level)
};

// Step 1 above on `window` (any order). InvalidArgument like FitLossCurve
// (bad points, fewer than 3 distinct steps) or for bad options.
absl::StatusOr<PlateauCheck> CheckPlateau(const std::vector<LossPoint>& window,
                                          const PlateauOptions& options = {});

struct OnlineEstimate {
  bool plateau = false;       // the first window was a plateau
  double observed_until = 0;  // the last step seen when the estimate was made
  double onset = 0;           // plateau: where the fitted decay starts
  // The curve the estimate comes from (for a plateau, the last fit tried;
  // nullopt when the plateau was never left in the observations).
  std::optional<LossCurve> curve;
  std::optional<double> steps;  // to target_loss, from step 0; nullopt: no estimate
};

// Steps 1-4 above: `curve` is every observation of the run (any order), the
// first window the points with step <= window. InvalidArgument like
// CheckPlateau, or when target_loss is not finite and > 0.
absl::StatusOr<OnlineEstimate> EstimateOnline(const std::vector<LossPoint>& curve, double window,
                                              double target_loss, const FitOptions& fit = {},
                                              const PlateauOptions& plateau = {});

// ---------------------------------------------------------------------------
// Online refinement of a transfer estimate (docs/design/ymir-estimators.md).
// Before a transferred run of task B starts, its steps are B's
// estimated normal steps / (1 + g), g the predicted gain (the PRIOR). Once
// the run has run `watch` steps, its own losses say where it stands against
// B's estimated normal curve `normal` (EstimateOnline's or FitLossCurve's),
// as a scheduler watching it would see them:
//  1. The watched points are the run's observations with 0 < step <= watch,
//     on their running minimum from step 0 (the best loss so far). A run
//     whose observations reach target_loss within the watch is done: its
//     steps are StepsToTarget's (interpolated; stopping.h), `reached`.
//  2. Otherwise each watched point (t, L) is matched to the step t* at which
//     the normal curve reaches L (LossCurve::StepsToLoss). A loss at or above
//     the curve's level at fit_from_step (where the curve starts describing
//     the run) only says that the run is not past that step: at t <=
//     fit_from_step it carries no position and is left out (a flat start, e.g.
//     a plateau, is not a head start); after it, t* = fit_from_step (behind).
//  3. The run's speed-up against the normal curve, s_fit, from the matched
//     points (TransferWatchOptions::fit): kTime, the least-squares s of
//     t* = s t; kLoss, the least squares of the watched losses against the
//     time-scaled curve, L_i - normal.Loss(max(s t_i, fit_from_step)) (the
//     curve is flat before fit_from_step, as step 2 reads it), minimised over
//     s in [min_speedup, 1 / min_speedup] (a log grid, then golden-section
//     search). Either is clamped below at min_speedup.
//  4. Shrinkage toward the prior ("transfer gain adjusts the curve", the
//     predicted gain being the prior): with n matched points and
//     k = prior_points, log s = (n log s_fit + k log(1 + prior_gain)) / (n + k),
//     so the prior counts as k watched points and the watch takes over as it
//     sees more (k = 0: s = s_fit). The estimate is the normal curve's steps
//     / s (the effective gain s - 1 applied as LossCurve::WithGain does, the
//     same time scaling as the prior's). With no matched point the watch
//     says nothing and the estimate is the prior's (speedup = 1 +
//     prior_gain). No estimate (steps nullopt) when the normal curve never
//     reaches the target, or when there is no normal curve (`normal`
//     nullopt: B's normal run has no estimate; step 1 still applies).
enum class WatchFit : uint8_t {
  kTime,  // t* = s t on the matched steps
  kLoss,  // the losses against the time-scaled normal curve
};
struct TransferWatchOptions {
  // Steps of the transferred run watched, > 0: a fifth of the experiment's
  // normal run (chosen on seed 1 among 8 / 16 / 24 / 32;
  // docs/design/ymir-estimators.md). The experiment's default (YmirEstimatorOptions::
  // iter_transfer_watch) is this one.
  double watch = 16;
  double min_speedup = 0.1;  // the prior's clamp (a gain >= -0.9); in (0, 1]
  WatchFit fit = WatchFit::kTime;
  double prior_points = 0;  // k of step 4, finite and >= 0
  // InvalidArgument naming the field out of range.
  absl::Status Validate() const;
};
struct TransferEstimate {
  double observed_until = 0;    // the last watched step
  int64_t watched_points = 0;   // observations in (0, watch]
  int64_t matched_points = 0;   // of them, those that placed the run (step 2)
  bool reached = false;         // the target was reached within the watch
  double speedup = 1;           // s (step 4), 1 + prior_gain when nothing matched
  double fitted_speedup = 0;    // s_fit (step 3) before the shrinkage; 0 when nothing matched
  std::optional<double> steps;  // to target_loss, from step 0
};
// Steps 1-4 above. InvalidArgument for bad options, bad points (as
// FitLossCurve), a target_loss that is not finite and > 0, a prior_gain that
// is not finite and > -1, or no observation in (0, watch].
absl::StatusOr<TransferEstimate> EstimateTransferOnline(const std::optional<LossCurve>& normal,
                                                        const std::vector<LossPoint>& transfer,
                                                        double target_loss, double prior_gain,
                                                        const TransferWatchOptions& options = {});

// One prediction, as the experiment and the job runner use it: fit the
// prefix, then the steps until `target_loss` under transfer gain `gain`
// (0 = normal training). Fails like FitLossCurve / WithGain; NotFound when the
// fitted curve never reaches the target.
absl::StatusOr<double> PredictStepsToLoss(const std::vector<LossPoint>& prefix,
                                          double target_loss, double gain = 0.0,
                                          const FitOptions& options = {});

}  // namespace slicesched::ymir
