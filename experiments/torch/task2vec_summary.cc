// What the repeats of RunYmirEstimators add up to (task2vec_internal.h's
// Summarize): the measured gains and the neutral band, the gain model and
// its scores, the watched transfer estimates, the iteration estimator's
// errors and the negative pairs.
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "slicesched/common/stats.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "slicesched/experiments/task2vec.h"
#include "slicesched/ymir/iteration_estimator.h"
#include "task2vec_internal.h"

namespace slicesched::executor::task2vec_internal {
namespace {

// The measured gain of a run of task `dst` (gain_measure): from its steps
// to target and, for kArea, the sum over repeats of its window means.
double MeasuredGain(const Context& ctx, const Accumulators& acc, const YmirEstimatorReport& rep, size_t dst,
                    double steps_transfer, double window_sum, bool* clamped) {
  const YmirExperimentOptions& o = ctx.o;
  if (!ctx.area) return rep.normal_steps[dst] / steps_transfer - 1.0;
  Curve ref = acc.normal_ext_sum[dst];
  for (ymir::LossPoint& pt : ref) pt.loss /= static_cast<double>(o.repeats);
  return AreaEquivalentSpeedup(ref, ctx.window_steps, window_sum / static_cast<double>(o.repeats), 0.1,
                               static_cast<double>(ctx.max_steps) / static_cast<double>(ctx.window), clamped) -
         1.0;
}

// The null runs' gains and the neutral band they set.
void MeasureNullGains(const Context& ctx, const Accumulators& acc, YmirEstimatorReport& rep) {
  std::vector<double> null_gains;
  for (size_t k = 0; k < rep.null_runs.size(); ++k) {
    const size_t task = k / static_cast<size_t>(ctx.o.null_runs);
    rep.null_runs[k].gain =
        MeasuredGain(ctx, acc, rep, task, rep.null_runs[k].steps, ctx.area ? acc.null_window_sum[k] : 0.0, nullptr);
    null_gains.push_back(rep.null_runs[k].gain);
  }
  rep.neutral_band = NeutralBand(null_gains, ctx.o.band_k);
}

void MeasurePairGains(const Context& ctx, const Accumulators& acc, YmirEstimatorReport& rep) {
  for (size_t k = 0; k < rep.pairs.size(); ++k) {
    YmirPair& p = rep.pairs[k];
    p.steps_normal = rep.normal_steps[acc.pair_dst[k]];
    p.gain_steps = p.steps_normal / p.steps_transfer - 1.0;
    p.gain = MeasuredGain(ctx, acc, rep, acc.pair_dst[k], p.steps_transfer,
                          ctx.area ? acc.pair_window_sum[k] : 0.0, &p.gain_clamped);
  }
}

// The gain model's regressors of a pair (YmirDirection).
std::vector<double> GainRegressors(const YmirExperimentOptions& o, double similarity, double asymmetry) {
  std::vector<double> r = {1.0, similarity};
  if (o.direction == YmirDirection::kAsymmetry) r.push_back(asymmetry);
  return r;
}

double PredictGain(const std::vector<double>& w, const std::vector<double>& r) {
  double g = 0;
  for (size_t i = 0; i < w.size(); ++i) g += w[i] * r[i];
  return g;
}

// The gain model per mode (YmirDirection): fitted on fit_on's rows of
// the mode (out of sample), else leave-one-out on this run's pairs; a
// score per mode (temporal, spatial) with its fit and correlation.
void FitGainModels(const YmirExperimentOptions& o, YmirEstimatorReport& rep) {
  for (const char* mode : {"temporal", "spatial"}) {
    std::vector<size_t> idx;
    for (size_t i = 0; i < rep.pairs.size(); ++i) {
      if (rep.pairs[i].mode == mode) idx.push_back(i);
    }
    std::vector<double> x, y;
    std::vector<std::vector<double>> rows;
    for (size_t i : idx) {
      const YmirPair& p = rep.pairs[i];
      x.push_back(p.similarity), y.push_back(p.gain), rows.push_back(GainRegressors(o, p.similarity, p.asymmetry));
    }
    YmirModeScore sc;
    sc.mode = mode;
    sc.pairs = static_cast<int64_t>(idx.size());
    sc.fit = FitLine(x, y);
    sc.correlation = PearsonCorrelation(x, y);
    if (!o.fit_on.empty() || !o.holdout_tasks.empty()) {
      // Out of sample: fitted on other seeds' rows or on the pairs without a
      // held-out task (GainModelFitRows), and applied to every pair.
      std::vector<std::vector<double>> train;
      std::vector<double> train_y;
      for (size_t i : GainModelFitRows(o, rep.pairs, mode)) {
        if (!o.fit_on.empty()) {
          const YmirTrainingPair& t = o.fit_on[i];
          train.push_back(GainRegressors(o, t.similarity, t.asymmetry)), train_y.push_back(t.gain);
        } else {
          const YmirPair& p = rep.pairs[i];
          train.push_back(GainRegressors(o, p.similarity, p.asymmetry)), train_y.push_back(p.gain);
        }
      }
      sc.model = FitLeastSquares(train, train_y);
      for (size_t k = 0; k < idx.size(); ++k) rep.pairs[idx[k]].predicted_gain = PredictGain(sc.model, rows[k]);
    } else {
      sc.model = FitLeastSquares(rows, y);
      for (size_t k = 0; k < idx.size(); ++k) {
        std::vector<std::vector<double>> rs;
        std::vector<double> ys;
        for (size_t j = 0; j < idx.size(); ++j) {
          if (j != k) rs.push_back(rows[j]), ys.push_back(y[j]);
        }
        rep.pairs[idx[k]].predicted_gain = PredictGain(FitLeastSquares(rs, ys), rows[k]);
      }
    }
    rep.scores.push_back(sc);
  }
}

// The sign and MAPE scores of `mode`'s pairs ("all": every pair) into `sc`.
void ScoreMode(const YmirExperimentOptions& o, const YmirEstimatorReport& rep, YmirModeScore& sc,
               const std::string& mode) {
  std::vector<double> measured, loo, in_sample;
  double ape = 0, ape_in = 0;
  for (const YmirPair& p : rep.pairs) {
    if (mode != "all" && p.mode != mode) continue;
    // With held-out tasks only their pairs are scored (the rest were fitted on).
    if (!o.holdout_tasks.empty() && !InvolvesHeldOutTask(o.holdout_tasks, p.task_a, p.task_b)) continue;
    const double in = PredictGain(rep.scores[p.mode == "temporal" ? 0 : 1].model,
                                  GainRegressors(o, p.similarity, p.asymmetry));
    measured.push_back(p.gain);
    loo.push_back(p.predicted_gain);
    in_sample.push_back(in);
    ape += std::abs(p.predicted_gain - p.gain) / (1.0 + p.gain);
    ape_in += std::abs(in - p.gain) / (1.0 + p.gain);
  }
  const SignScore signs = ScoreSigns(loo, measured, rep.neutral_band);
  sc.pairs = signs.pairs;
  sc.positive = signs.positive;
  sc.accuracy_pct = signs.AccuracyPct();
  sc.majority_accuracy_pct = signs.MajorityPct();
  sc.neutral = signs.neutral;
  sc.non_neutral_accuracy_pct = signs.NonNeutralAccuracyPct();
  sc.non_neutral_majority_pct = signs.NonNeutralMajorityPct();
  sc.three_way_accuracy_pct = signs.ThreeWayAccuracyPct();
  sc.three_way_majority_pct = signs.ThreeWayMajorityPct();
  sc.in_sample_accuracy_pct = ScoreSigns(in_sample, measured, rep.neutral_band).AccuracyPct();
  const double c = static_cast<double>(std::max<int64_t>(signs.pairs, 1));
  sc.mape_pct = 100.0 * ape / c;
  sc.in_sample_mape_pct = 100.0 * ape_in / c;
}

// The scores of the temporal and spatial modes, then of all pairs.
void ScoreModes(const YmirExperimentOptions& o, YmirEstimatorReport& rep) {
  ScoreMode(o, rep, rep.scores[0], "temporal");
  ScoreMode(o, rep, rep.scores[1], "spatial");
  YmirModeScore all;
  all.mode = "all";
  ScoreMode(o, rep, all, "all");
  {
    std::vector<double> x, y;
    for (const YmirPair& p : rep.pairs) x.push_back(p.similarity), y.push_back(p.gain);
    all.correlation = PearsonCorrelation(x, y);
  }
  rep.scores.push_back(all);
}

// The transfer watch (task2vec.h): each run of a pair refined after its
// first `watch` steps, with the prior's clamped predicted gain where the
// watch places nothing; without a normal estimate for B (nothing to watch
// against) it is the prior's, max_steps + 1 over 1 + that gain, unless
// the run reached its target within the watch. Per pair, averaged over
// repeats (reached: a count of repeats).
struct Watched {
  double watch = 0;
  std::vector<double> steps, speedup;
  std::vector<int64_t> reached;
};

absl::StatusOr<Watched> WatchPairs(const Context& ctx, const Accumulators& acc, const YmirEstimatorReport& rep,
                                   double watch) {
  const YmirExperimentOptions& o = ctx.o;
  ymir::TransferWatchOptions wo = o.iter_transfer_watch;
  wo.watch = watch;
  Watched out{.watch = watch};
  for (size_t k = 0; k < acc.watched_runs.size(); ++k) {
    const YmirPair& p = rep.pairs[k];
    double steps = 0, speedup = 0;
    int64_t reached = 0;
    const double prior_gain = std::max(-0.9, p.predicted_gain);
    for (const WatchedRun& w : acc.watched_runs[k]) {
      auto est = ymir::EstimateTransferOnline(w.normal, w.curve, w.target, prior_gain, wo);
      if (!est.ok()) return Annotate(est.status(), StrCat("transfer estimate of ", p.task_a, " -> ", p.task_b));
      steps += est->steps.value_or(ctx.censored / (1.0 + prior_gain)) / static_cast<double>(o.repeats);
      speedup += est->speedup / static_cast<double>(o.repeats);
      reached += est->reached ? 1 : 0;
    }
    out.steps.push_back(steps), out.speedup.push_back(speedup), out.reached.push_back(reached);
  }
  return out;
}

// Iteration estimator: normal runs, then transfer runs through the
// leave-one-out predicted gain (task2vec.h), for every prefix and the
// online estimate. `pred_sum` and `missing` are per task over repeats; the
// headline's predictions are the pairs' predicted_steps_transfer. With
// `watched`, the transfer errors are those of the watched estimates (the
// prior's beside them), else of the prior.
YmirIterationErrors IterationErrors(const Context& ctx, const Accumulators& acc, YmirEstimatorReport& rep,
                                    const std::vector<double>& pred_sum, const std::vector<int64_t>& missing,
                                    bool headline, const Watched* watched) {
  const size_t n = ctx.n;
  YmirIterationErrors e;
  // A prediction beyond the runs' step limit says "not within the run":
  // scored as censored, max_steps + 1, as a fit that never reaches the
  // target is (the runs are cut at max_steps, so no measured step count
  // exceeds it either).
  auto scored = [&](double predicted, int64_t* beyond) {
    if (predicted <= static_cast<double>(ctx.max_steps)) return predicted;
    if (predicted != ctx.censored) ++*beyond;
    return ctx.censored;
  };
  std::vector<double> pred_normal(n);
  for (size_t i = 0; i < n; ++i) {
    pred_normal[i] = pred_sum[i] / static_cast<double>(ctx.o.repeats);
    e.unreachable += missing[i];
    const double err = 100.0 * std::abs(scored(pred_normal[i], &e.normal_beyond_limit) - rep.normal_steps[i]) /
                       rep.normal_steps[i];
    e.normal_pct += err / static_cast<double>(n);
    e.normal_max_pct = std::max(e.normal_max_pct, err);
  }
  double sum_nogain = 0, sum_mode[2] = {0, 0}, sum_prior_mode[2] = {0, 0};
  int64_t count_mode[2] = {0, 0};
  auto error = [](double predicted, double measured) { return 100.0 * std::abs(predicted - measured) / measured; };
  for (size_t k = 0; k < rep.pairs.size(); ++k) {
    YmirPair& p = rep.pairs[k];
    const double prior = pred_normal[acc.pair_dst[k]] / (1.0 + std::max(-0.9, p.predicted_gain));
    if (headline) p.predicted_steps_transfer = prior;
    if (p.censored) continue;
    int64_t not_counted = 0;
    const double err = error(scored(watched ? watched->steps[k] : prior, &e.transfer_beyond_limit), p.steps_transfer);
    const double prior_err = error(scored(prior, &not_counted), p.steps_transfer);
    e.transfer_pct += err;
    e.transfer_prior_pct += prior_err;
    sum_nogain += error(scored(pred_normal[acc.pair_dst[k]], &not_counted), p.steps_transfer);
    const int m = p.mode == "temporal" ? 0 : 1;
    sum_mode[m] += err;
    sum_prior_mode[m] += prior_err;
    ++count_mode[m];
    ++e.transfer_pairs;
    e.transfer_max_pct = std::max(e.transfer_max_pct, err);
    if (watched) e.reached_in_watch += watched->reached[k];
    if (watched && watched->reached[k] == 0) {
      e.transfer_unreached_pct += err;
      e.transfer_prior_unreached_pct += prior_err;
      ++e.transfer_unreached_pairs;
    }
  }
  const double c = static_cast<double>(std::max<int64_t>(e.transfer_pairs, 1));
  e.transfer_pct /= c;
  e.transfer_prior_pct /= c;
  e.transfer_nogain_pct = sum_nogain / c;
  const double ct = static_cast<double>(std::max<int64_t>(count_mode[0], 1));
  const double cs = static_cast<double>(std::max<int64_t>(count_mode[1], 1));
  e.transfer_temporal_pct = sum_mode[0] / ct;
  e.transfer_spatial_pct = sum_mode[1] / cs;
  e.transfer_prior_temporal_pct = sum_prior_mode[0] / ct;
  e.transfer_prior_spatial_pct = sum_prior_mode[1] / cs;
  e.watch_steps = watched ? watched->watch : 0.0;
  const double cu = static_cast<double>(std::max<int64_t>(e.transfer_unreached_pairs, 1));
  e.transfer_unreached_pct /= cu;
  e.transfer_prior_unreached_pct /= cu;
  return e;
}

// The iteration estimator's report: the headline (with the transfer runs
// watched), every fixed prefix, the online estimate and the other watches.
absl::Status ScoreIterationEstimator(const Context& ctx, const Accumulators& acc, YmirEstimatorReport& rep) {
  const YmirExperimentOptions& o = ctx.o;
  const size_t n = ctx.n;
  std::optional<Watched> watched_head;
  if (o.iter_transfer_online) {
    SLICESCHED_ASSIGN_OR_RETURN(watched_head, WatchPairs(ctx, acc, rep, o.iter_transfer_watch.watch));
    for (size_t k = 0; k < rep.pairs.size(); ++k) {
      rep.pairs[k].predicted_steps_transfer_watched = watched_head->steps[k];
      rep.pairs[k].watched_speedup = watched_head->speedup[k];
      rep.pairs[k].reached_in_watch = watched_head->reached[k];
    }
  }
  for (size_t f = 0; f < ctx.fractions.size(); ++f) {
    const bool head = f == 0 && !o.iter_online;
    YmirIterationErrors e = IterationErrors(ctx, acc, rep, acc.pred_normal_sum[f], acc.unreachable[f], head,
                                            head && watched_head ? &*watched_head : nullptr);
    e.fraction = ctx.fractions[f];
    e.prefix_steps = o.PrefixSteps(ctx.fractions[f]);
    e.observed_steps_mean = e.observed_steps_max = static_cast<double>(e.prefix_steps);
    if (f == 0) {
      for (size_t i = 0; i < n; ++i) {
        rep.iteration_fits[i].predicted_steps = acc.pred_normal_sum[f][i] / static_cast<double>(o.repeats);
        rep.iteration_fits[i].unreachable = acc.unreachable[f][i];
      }
      rep.iteration_first_window = e;
      rep.iteration = e;
    } else {
      rep.iteration_sweep.push_back(e);
    }
  }
  if (o.iter_online) {
    YmirIterationErrors e = IterationErrors(ctx, acc, rep, acc.online_sum, acc.online_missing, true,
                                            watched_head ? &*watched_head : nullptr);
    e.fraction = ctx.fractions[0];
    e.prefix_steps = o.PrefixSteps(ctx.fractions[0]);
    e.online = true;
    for (size_t i = 0; i < n; ++i) {
      e.observed_steps_mean += acc.observed_sum[i] / static_cast<double>(o.repeats * static_cast<int64_t>(n));
      e.observed_steps_max = std::max(e.observed_steps_max, acc.observed_max[i]);
      e.plateaus += acc.online_plateaus[i];
      rep.iteration_fits[i].observed_until = acc.observed_sum[i] / static_cast<double>(o.repeats);
      rep.iteration_fits[i].online_predicted_steps = acc.online_sum[i] / static_cast<double>(o.repeats);
    }
    rep.iteration = e;
  }
  // The other watches (iter_transfer_watch_sweep), on the headline's normal estimates.
  for (double watch : o.iter_transfer_online ? o.iter_transfer_watch_sweep : std::vector<double>{}) {
    SLICESCHED_ASSIGN_OR_RETURN(const Watched w, WatchPairs(ctx, acc, rep, watch));
    YmirIterationErrors e =
        o.iter_online ? IterationErrors(ctx, acc, rep, acc.online_sum, acc.online_missing, false, &w)
                      : IterationErrors(ctx, acc, rep, acc.pred_normal_sum[0], acc.unreachable[0], false, &w);
    e.fraction = rep.iteration.fraction;
    e.prefix_steps = rep.iteration.prefix_steps;
    e.online = rep.iteration.online;
    e.observed_steps_mean = rep.iteration.observed_steps_mean;
    e.observed_steps_max = rep.iteration.observed_steps_max;
    e.plateaus = rep.iteration.plateaus;
    rep.transfer_watch_sweep.push_back(e);
  }
  return absl::OkStatus();
}

// Negative pairs and who caught them.
void CountNegativePairs(const YmirExperimentOptions& o, YmirEstimatorReport& rep) {
  for (const YmirPair& p : rep.pairs) {
    const bool decoupled = 2 * p.stop_loss_decoupled > o.repeats;
    if (p.gain > 0 && decoupled) ++rep.positive_decoupled;
    if (!(p.gain < 0)) continue;
    ++rep.negative_pairs;
    const bool by_estimator = p.predicted_gain <= 0;
    rep.negative_caught_by_estimator += by_estimator ? 1 : 0;
    rep.negative_caught_by_stop_loss += decoupled ? 1 : 0;
    rep.negative_caught += by_estimator || decoupled ? 1 : 0;
  }
}

}  // namespace

absl::Status Summarize(const Context& ctx, const Accumulators& acc, YmirEstimatorReport& rep) {
  const YmirExperimentOptions& o = ctx.o;
  for (size_t i = 0; i < ctx.n; ++i) rep.normal_steps.push_back(acc.normal_sum[i] / static_cast<double>(o.repeats));
  if (o.similarities_only) {
    rep.normal_steps.clear();
    return absl::OkStatus();
  }
  MeasureNullGains(ctx, acc, rep);
  if (o.curves_only) return absl::OkStatus();
  MeasurePairGains(ctx, acc, rep);
  FitGainModels(o, rep);
  ScoreModes(o, rep);
  SLICESCHED_RETURN_IF_ERROR(ScoreIterationEstimator(ctx, acc, rep));
  CountNegativePairs(o, rep);
  return absl::OkStatus();
}

}  // namespace slicesched::executor::task2vec_internal
