// The Ymir experiment's options, its building blocks (distances, the
// Fisher embedding, the neutral band and sign scores, the area gain), the
// pairs CSV and the report. The run itself: task2vec_run.cc and
// task2vec_summary.cc. Torch-free TU.
#include "slicesched/experiments/task2vec.h"

#include <algorithm>
#include <cmath>
#include <span>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "slicesched/common/stats.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "slicesched/ymir/iteration_estimator.h"
#include "slicesched/ymir/stop_loss.h"
#include "task2vec_internal.h"

namespace slicesched::executor {

using task2vec_internal::Curve;
using task2vec_internal::LossAt;

namespace {

// [[step, loss], ...] of an eval curve (the report's "curve" fields).
std::string CurveJson(const std::vector<ymir::LossPoint>& c) {
  std::string j = "[";
  for (size_t k = 0; k < c.size(); ++k) j += absl::StrFormat("%s[%g, %.4f]", k ? ", " : "", c[k].step, c[k].loss);
  return j + "]";
}

// The report's "setup" line: the options that define the run.
std::string SetupJson(const YmirExperimentOptions& o) {
  std::string names;
  for (const YmirTaskSpec& t : o.tasks) {
    names += absl::StrFormat("%s\"%s:%d\"", names.empty() ? "" : ", ", t.name, t.num_classes);
  }
  return absl::StrFormat(
      "  \"setup\": {\"seed\": %d, \"tasks\": [%s], \"repeats\": %d, \"learning_rate\": %g, "
      "\"lr_warmup_steps\": %d, \"head\": \"%s\", \"spatial_step\": \"%s\", \"normal_steps\": %d, \"max_steps\": %d, "
      "\"eval_every\": %d, \"eval_examples\": %d, \"probe_steps\": %d, \"probe\": \"%s\", "
      "\"fisher_examples\": %d, \"fisher\": \"%s\", \"embed\": \"%s\", \"distance\": \"%s\", "
      "\"null_runs\": %d, \"band_k\": %g, "
      "\"gain_measure\": \"%s\", \"gain_window\": %d, \"iter_fit\": {\"envelope\": "
      "\"%s\", \"time_shift\": %s, \"recency_half_life\": %g, \"quadratic\": %s}, "
      "\"iter_online\": %s, \"iter_transfer_watch\": %g, \"iter_transfer_fit\": \"%s\", "
      "\"iter_transfer_prior_points\": %g, \"predictions_beyond_max_steps\": \"scored as max_steps + 1\", "
      "\"direction\": \"%s\", \"fit_on_rows\": %d, \"holdout_tasks\": \"%s\"},\n",
      o.seed, names, o.repeats, o.learning_rate, o.lr_warmup_steps, o.zero_head ? "zero" : "random",
      o.spatial_rule == JointStepRule::kSum ? "sum" : "mean", o.normal_steps, o.max_steps_factor * o.normal_steps, o.eval_every, o.eval_examples, o.probe_steps,
      o.probe == YmirProbe::kHead ? "head" : "trained", o.fisher_examples,
      o.fisher == YmirFisher::kModel ? "model" : "empirical",
      o.embed == YmirEmbedParams::kLoraHead ? "lora+head" : "lora",
      o.distance == YmirDistance::kCosine ? "cosine" : "normalised", o.null_runs, o.band_k,
      o.gain_measure == YmirGainMeasure::kArea ? "area" : "steps",
      o.gain_measure == YmirGainMeasure::kArea ? o.GainWindow() : 0,
      o.iter_fit.envelope == ymir::Envelope::kIsotonic ? "isotonic" : "min",
      o.iter_fit.time_shift ? "true" : "false", o.iter_fit.recency_half_life,
      o.iter_fit.quadratic ? "true" : "false", o.iter_online ? "true" : "false",
      o.iter_transfer_online ? o.iter_transfer_watch.watch : 0.0,
      o.iter_transfer_watch.fit == ymir::WatchFit::kLoss ? "loss" : "time", o.iter_transfer_watch.prior_points,
      o.direction == YmirDirection::kAsymmetry ? "asymmetry" : "none", o.fit_on.size(),
      absl::StrJoin(o.holdout_tasks, ","));
}

// One YmirIterationErrors as a JSON object.
std::string IterationErrorsJson(const YmirIterationErrors& e) {
  return absl::StrFormat(
      "{\"prefix_fraction\": %.2f, \"prefix_steps\": %d, \"iter_err_normal_pct\": %.1f, "
      "\"iter_err_normal_max_pct\": %.1f, \"iter_err_transfer_pct\": %.1f, "
      "\"iter_err_transfer_max_pct\": %.1f, \"iter_err_transfer_temporal_pct\": %.1f, "
      "\"iter_err_transfer_spatial_pct\": %.1f, \"iter_err_transfer_nogain_pct\": %.1f, "
      "\"transfer_pairs_scored\": %d, \"unreachable_fits\": %d, \"online\": %s, "
      "\"observed_steps_mean\": %.1f, \"observed_steps_max\": %.0f, \"plateaus\": %d, "
      "\"iter_err_transfer_prior_pct\": %.1f, \"iter_err_transfer_prior_temporal_pct\": %.1f, "
      "\"iter_err_transfer_prior_spatial_pct\": %.1f, \"transfer_watch_steps\": %.0f, "
      "\"transfer_reached_in_watch\": %d, \"iter_err_transfer_unreached_pct\": %.1f, "
      "\"iter_err_transfer_prior_unreached_pct\": %.1f, \"transfer_unreached_pairs\": %d, "
      "\"normal_beyond_limit\": %d, \"transfer_beyond_limit\": %d}",
      e.fraction, e.prefix_steps, e.normal_pct, e.normal_max_pct, e.transfer_pct,
      e.transfer_max_pct, e.transfer_temporal_pct, e.transfer_spatial_pct, e.transfer_nogain_pct,
      e.transfer_pairs, e.unreachable, e.online ? "true" : "false", e.observed_steps_mean,
      e.observed_steps_max, e.plateaus, e.transfer_prior_pct, e.transfer_prior_temporal_pct,
      e.transfer_prior_spatial_pct, e.watch_steps, e.reached_in_watch, e.transfer_unreached_pct,
      e.transfer_prior_unreached_pct, e.transfer_unreached_pairs, e.normal_beyond_limit,
      e.transfer_beyond_limit);
}

}  // namespace

namespace task2vec_internal {

double LossAt(const Curve& c, double step) {
  for (size_t i = 1; i < c.size(); ++i) {
    if (c[i].step >= step) {
      return c[i - 1].loss + (c[i].loss - c[i - 1].loss) * (step - c[i - 1].step) /
                                 (c[i].step - c[i - 1].step);
    }
  }
  return c.back().loss;
}

}  // namespace task2vec_internal

absl::Status YmirExperimentOptions::Validate() const {
  if (tasks.size() < 3)
    return absl::InvalidArgumentError("the Ymir experiment needs at least 3 tasks");
  for (const YmirTaskSpec& t : tasks) {
    if (wordnet != nullptr) {
      absl::StatusOr<synth::WordNetTask> w = synth::FindWordNetTask(t.name);
      if (!w.ok()) return absl::InvalidArgumentError(StrCat("--tasks: ", w.status().message()));
      if (t.num_classes != 2) {
        return absl::InvalidArgumentError(StrCat("WordNet task '", t.name, "' has 2 classes, not ", t.num_classes));
      }
      continue;
    }
    absl::StatusOr<synth::TaskInfo> info = synth::FindTask(t.name);  // NotFound: a bad option value here
    if (!info.ok()) return absl::InvalidArgumentError(StrCat("--tasks: ", info.status().message()));
    if (info->kind != synth::TaskKind::kClassification) {
      return absl::InvalidArgumentError(StrCat("task '", t.name, "' is not a classification task"));
    }
  }
  if (probe_steps < 0 || probe_steps > normal_steps) {
    return absl::InvalidArgumentError(
        StrCat("Ymir experiment: normal_steps (slicesim --steps) must be >= probe_steps (the Task2Vec probe "
               "is a prefix of the normal run) and probe_steps >= 0; got normal_steps ",
               normal_steps, ", probe_steps ", probe_steps));
  }
  if (sequence_length < 2 || batch_size < 1 || train_examples < 1 || eval_examples < 1 ||
      lora_rank < 1 || normal_steps < 1 || max_steps_factor < 1 || repeats < 1 || eval_every < 1 ||
      fisher_examples < 1 || stop_loss_epoch_steps < 1) {
    return absl::InvalidArgumentError(StrCat(
        "Ymir experiment: a size is out of range (need sequence_length >= 2 and batch_size, "
        "train_examples, eval_examples, lora_rank, normal_steps, max_steps_factor, repeats, "
        "eval_every, fisher_examples, stop_loss_epoch_steps >= 1); got sequence_length ",
        sequence_length, ", batch_size ", batch_size, ", train_examples ", train_examples,
        ", eval_examples ", eval_examples, ", lora_rank ", lora_rank, ", normal_steps ", normal_steps,
        ", max_steps_factor ", max_steps_factor, ", repeats ", repeats, ", eval_every ", eval_every,
        ", fisher_examples ", fisher_examples, ", stop_loss_epoch_steps ", stop_loss_epoch_steps));
  }
  if (gain_measure == YmirGainMeasure::kArea) {
    const int64_t w = GainWindow();
    if (w < eval_every || w % eval_every != 0 || w >= max_steps_factor * normal_steps) {
      return absl::InvalidArgumentError(StrCat(
          "Ymir experiment: the area gain's window (slicesim --gain-window) must be a positive multiple "
          "of eval_every (", eval_every, ") below max_steps (", max_steps_factor * normal_steps,
          "), got ", w));
    }
  }
  if (iter_transfer_online) {
    SLICESCHED_RETURN_IF_ERROR(Annotate(iter_transfer_watch.Validate(), "Ymir experiment (slicesim --iter-transfer-watch, "
                                                                         "--iter-transfer-prior-points)"));
    std::vector<double> watches = iter_transfer_watch_sweep;
    watches.push_back(iter_transfer_watch.watch);
    for (double w : watches) {
      if (!(w >= static_cast<double>(eval_every)) || !std::isfinite(w)) {
        return absl::InvalidArgumentError(StrCat(
            "Ymir experiment: a transfer watch (slicesim --iter-transfer-watch, iter_transfer_watch_sweep) must "
            "be 0 (off) or >= eval_every (", eval_every, ", a transfer run's first evaluation), got ", w));
      }
    }
  }
  if (null_runs < 0 || !(band_k >= 0)) {
    return absl::InvalidArgumentError(StrCat("Ymir experiment: null_runs (slicesim --null-runs) must be >= 0 and "
                                             "band_k (--band-k) >= 0, got ", null_runs, " and ", band_k));
  }
  if (curves_only && similarities_only) {
    return absl::InvalidArgumentError(
        "Ymir experiment: --curves-only and --similarities-only exclude each other");
  }
  if (lr_warmup_steps < 0) {
    return absl::InvalidArgumentError(
        StrCat("Ymir experiment: lr_warmup_steps must be >= 0, got ", lr_warmup_steps));
  }
  if (!(iter_prefix_fraction > 0 && iter_prefix_fraction <= 1)) {
    return absl::InvalidArgumentError(
        StrCat("iter_prefix_fraction must be in (0, 1], got ", iter_prefix_fraction));
  }
  for (double f : iter_prefix_sweep) {
    if (!(f > 0 && f <= 1)) {
      return absl::InvalidArgumentError(StrCat("iter_prefix_sweep values must be in (0, 1], got ", f));
    }
  }
  SLICESCHED_RETURN_IF_ERROR(ymir::StopLossOptions{.window_epochs = stop_loss_window_epochs}.Validate());
  SLICESCHED_RETURN_IF_ERROR(iter_plateau.Validate());
  SLICESCHED_RETURN_IF_ERROR(Annotate(iter_fit.Validate(), "Ymir experiment (slicesim --iter-half-life)"));
  for (const std::string& h : holdout_tasks) {
    const bool known = std::any_of(tasks.begin(), tasks.end(), [&](const YmirTaskSpec& t) { return t.name == h; });
    if (!known) {
      return absl::InvalidArgumentError(
          StrCat("holdout_tasks (slicesim --holdout-tasks): '", h, "' is not one of the run's tasks"));
    }
  }
  // Enough rows of each mode for the model's weights (YmirDirection), held-out
  // tasks' rows not counted.
  const size_t need = direction == YmirDirection::kAsymmetry ? 3 : 2;
  if (!fit_on.empty()) {
    for (const char* mode : {"temporal", "spatial"}) {
      size_t rows = 0;
      for (const YmirTrainingPair& t : fit_on) {
        if (t.mode != "temporal" && t.mode != "spatial") {
          return absl::InvalidArgumentError(StrCat("fit_on: mode '", t.mode, "' is not temporal or spatial"));
        }
        if (!std::isfinite(t.similarity) || !std::isfinite(t.asymmetry) || !std::isfinite(t.gain)) {
          return absl::InvalidArgumentError("fit_on: a row's similarity, asymmetry or gain is not finite");
        }
        rows += t.mode == mode && !InvolvesHeldOutTask(holdout_tasks, t.task_a, t.task_b) ? 1 : 0;
      }
      if (rows < need) {
        return absl::InvalidArgumentError(StrCat("fit_on (slicesim --fit-on) has ", rows, " ", mode,
                                                 " rows; the gain model needs at least ", need));
      }
    }
  }
  if (fit_on.empty() && !holdout_tasks.empty()) {
    // This run's pairs without a held-out task: kept x (kept - 1) per mode.
    size_t kept = 0;
    for (const YmirTaskSpec& t : tasks) kept += InvolvesHeldOutTask(holdout_tasks, t.name, t.name) ? 0 : 1;
    if (kept * (kept > 0 ? kept - 1 : 0) < need) {
      return absl::InvalidArgumentError(
          "holdout_tasks: too few pairs without a held-out task are left to fit the gain model on");
    }
  }
  if (!(target_fraction > 0 && target_fraction <= 1)) {
    return absl::InvalidArgumentError(
        StrCat("target_fraction must be in (0, 1], got ", target_fraction));
  }
  if (!(learning_rate > 0) || !(lora_alpha > 0) || !(alpha >= 0)) {
    return absl::InvalidArgumentError("learning_rate and lora_alpha must be > 0, alpha >= 0");
  }
  return language.Validate();
}

int64_t YmirExperimentOptions::PrefixSteps(double fraction) const {
  return std::max<int64_t>(3, std::llround(fraction * static_cast<double>(normal_steps)));
}

double SymmetricDistance(const std::vector<double>& a, const std::vector<double>& b,
                         YmirDistance kind) {
  if (kind == YmirDistance::kCosine) return 1.0 - CosineSimilarity(a, b);
  std::vector<double> na(a.size()), nb(b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const double s = a[i] + b[i];
    na[i] = s > 0 ? a[i] / s : 0.5;
    nb[i] = s > 0 ? b[i] / s : 0.5;
  }
  return 1.0 - CosineSimilarity(na, nb);
}

double AsymmetricDistance(const std::vector<double>& from, const std::vector<double>& to,
                          const std::vector<double>& trivial, double alpha, YmirDistance kind) {
  return SymmetricDistance(from, to, kind) - alpha * SymmetricDistance(from, trivial, kind);
}

absl::Status AddFisher(const TaskAdapters& grads, double w, YmirEmbedParams embed,
                       std::vector<double>& fisher) {
  std::vector<double> v;
  std::vector<float> head;
  for (const auto& [name, t] : grads.NamedTensors()) {
    if (name == "head") {
      head = t.ToFloat();
      continue;
    }
    for (float f : t.ToFloat()) v.push_back(static_cast<double>(f) * static_cast<double>(f));
  }
  if (embed == YmirEmbedParams::kLoraHead) {
    const std::vector<int64_t> shape = grads.head.shape();
    if (shape.size() != 2 || shape[1] < 1)
      return absl::InvalidArgumentError("AddFisher: the head gradient is not [outputs, hidden]");
    const auto hidden = static_cast<size_t>(shape[1]);
    std::vector<double> per_unit(hidden, 0.0);
    for (size_t k = 0; k < head.size(); ++k) {
      per_unit[k % hidden] += static_cast<double>(head[k]) * static_cast<double>(head[k]);
    }
    v.insert(v.end(), per_unit.begin(), per_unit.end());
  }
  if (fisher.empty()) fisher.assign(v.size(), 0.0);
  if (fisher.size() != v.size()) {
    return absl::InvalidArgumentError(StrCat("AddFisher: the gradient has ", v.size(),
                                             " embedding coordinates, the Fisher ", fisher.size()));
  }
  for (size_t k = 0; k < v.size(); ++k) fisher[k] += w * v[k];
  return absl::OkStatus();
}

double NeutralBand(const std::vector<double>& null_gains, double band_k) {
  if (null_gains.empty()) return 0.0;
  return band_k * RootMeanSquare(null_gains);
}

double SignScore::AccuracyPct() const { return Percentage(agree, pairs); }
double SignScore::MajorityPct() const { return Percentage(std::max(positive, pairs - positive), pairs); }
double SignScore::NonNeutralAccuracyPct() const { return Percentage(non_neutral_agree, pairs - neutral); }
double SignScore::NonNeutralMajorityPct() const {
  const int64_t m = pairs - neutral;
  return Percentage(std::max(non_neutral_positive, m - non_neutral_positive), m);
}

double SignScore::ThreeWayAccuracyPct() const { return Percentage(three_way_agree, pairs); }
double SignScore::ThreeWayMajorityPct() const {
  const int64_t negative = pairs - neutral - non_neutral_positive;
  return Percentage(std::max({non_neutral_positive, negative, neutral}), pairs);
}

SignScore ScoreSigns(const std::vector<double>& predicted, const std::vector<double>& measured,
                     double band) {
  SignScore s;  // pairs beyond the shorter vector are not scored
  auto cls = [&](double g) { return std::abs(g) < band ? 0 : (g > 0 ? 1 : -1); };
  for (size_t i = 0; i < std::min(predicted.size(), measured.size()); ++i) {
    const bool pos = measured[i] > 0;
    const bool agree = (predicted[i] > 0) == pos;
    ++s.pairs;
    s.positive += pos ? 1 : 0;
    s.agree += agree ? 1 : 0;
    s.three_way_agree += cls(predicted[i]) == cls(measured[i]) ? 1 : 0;
    if (std::abs(measured[i]) < band) {
      ++s.neutral;
      continue;
    }
    s.non_neutral_positive += pos ? 1 : 0;
    s.non_neutral_agree += agree ? 1 : 0;
  }
  return s;
}

double AreaEquivalentSpeedup(const std::vector<ymir::LossPoint>& reference,
                             const std::vector<double>& steps, double transfer_mean,
                             double min_speedup, double max_speedup, bool* clamped) {
  if (clamped != nullptr) *clamped = false;
  if (reference.empty() || steps.empty()) return 1.0;
  const Curve iso = ymir::IsotonicDecreasing(reference);
  // The mean of the reference at s t_k: non-increasing in s.
  auto mean_at = [&](double s) {
    double m = 0;
    for (double t : steps) m += LossAt(iso, s * t) / static_cast<double>(steps.size());
    return m;
  };
  if (transfer_mean >= mean_at(min_speedup)) {
    if (clamped != nullptr) *clamped = true;
    return min_speedup;
  }
  if (transfer_mean <= mean_at(max_speedup)) {
    if (clamped != nullptr) *clamped = true;
    return max_speedup;
  }
  double lo = std::log(min_speedup), hi = std::log(max_speedup);
  for (int it = 0; it < 100; ++it) {
    const double mid = 0.5 * (lo + hi);
    if (mean_at(std::exp(mid)) > transfer_mean) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return std::exp(0.5 * (lo + hi));
}

bool InvolvesHeldOutTask(const std::vector<std::string>& holdout, std::string_view a, std::string_view b) {
  auto base = [](std::string_view t) { return t.substr(0, t.find('@')); };
  for (const std::string& h : holdout) {
    if (base(a) == base(h) || base(b) == base(h)) return true;
  }
  return false;
}

std::vector<size_t> GainModelFitRows(const YmirExperimentOptions& o, const std::vector<YmirPair>& pairs,
                                     std::string_view mode) {
  std::vector<size_t> rows;
  if (!o.fit_on.empty()) {
    for (size_t i = 0; i < o.fit_on.size(); ++i) {
      const YmirTrainingPair& t = o.fit_on[i];
      if (t.mode == mode && !InvolvesHeldOutTask(o.holdout_tasks, t.task_a, t.task_b)) rows.push_back(i);
    }
    return rows;
  }
  for (size_t i = 0; i < pairs.size(); ++i) {
    const YmirPair& p = pairs[i];
    if (p.mode == mode && !InvolvesHeldOutTask(o.holdout_tasks, p.task_a, p.task_b)) rows.push_back(i);
  }
  return rows;
}

absl::StatusOr<std::vector<YmirTrainingPair>> ParseYmirPairsCsv(const std::string& text) {
  const std::vector<std::string> lines = absl::StrSplit(text, '\n', absl::SkipWhitespace());
  constexpr char kHeader[] = "task_a,task_b,mode,similarity,asymmetry,gain";
  if (lines.empty() || lines[0] != kHeader) {
    return absl::InvalidArgumentError(StrCat("Ymir pairs CSV: the first line must be '", kHeader, "'"));
  }
  std::vector<YmirTrainingPair> rows;
  for (size_t i = 1; i < lines.size(); ++i) {
    const std::vector<std::string> f = absl::StrSplit(lines[i], ',');
    if (f.size() != 6) {
      return absl::InvalidArgumentError(
          StrCat("Ymir pairs CSV line ", i + 1, ": expected 6 fields, got ", f.size()));
    }
    YmirTrainingPair row{.task_a = f[0], .task_b = f[1], .mode = f[2]};
    if (row.mode != "temporal" && row.mode != "spatial") {
      return absl::InvalidArgumentError(
          StrCat("Ymir pairs CSV line ", i + 1, ": mode '", row.mode, "' is not temporal or spatial"));
    }
    const char* names[] = {"similarity", "asymmetry", "gain"};
    double* out[] = {&row.similarity, &row.asymmetry, &row.gain};
    for (int k = 0; k < 3; ++k) {
      if (!absl::SimpleAtod(f[3 + k], out[k]) || !std::isfinite(*out[k])) {
        return absl::InvalidArgumentError(StrCat("Ymir pairs CSV line ", i + 1, ": ", names[k], " '",
                                                 f[3 + k], "' is not a finite number"));
      }
    }
    rows.push_back(row);
  }
  return rows;
}

std::vector<size_t> YmirEstimatorReport::BestPairsBySteps(size_t k) const {
  std::vector<size_t> order(pairs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t x, size_t y) { return pairs[x].gain_steps > pairs[y].gain_steps; });
  order.resize(std::min(k, order.size()));
  return order;
}

std::string YmirEstimatorReport::GainsCsv() const {
  // Format 2 (configs/ymir/README.md; read by LoadYmirGains): the measured
  // gain beside the steps-to-target gain, which is an upper bound when a
  // repeat of the transfer run was censored.
  std::string out = absl::StrFormat(
      "# gains-format: 2\n# gain-definition: speedup\n# gain-measure: %s\n"
      "task_a,task_b,mode,gain,gain_steps,steps_censored\n",
      options.gain_measure == YmirGainMeasure::kArea ? "area" : "steps");
  for (const YmirPair& p : pairs) {
    out += absl::StrFormat("%s,%s,%s,%.6f,%.6f,%d\n", p.task_a, p.task_b, p.mode, p.gain, p.gain_steps,
                           p.censored ? 1 : 0);
  }
  return out;
}

std::string YmirEstimatorReport::PairsCsv() const {
  std::string out = "task_a,task_b,mode,similarity,asymmetry,gain\n";
  for (const YmirPair& p : pairs) {
    out += absl::StrFormat("%s,%s,%s,%.6f,%.6f,%.6f\n", p.task_a, p.task_b, p.mode, p.similarity,
                           p.asymmetry, p.gain);
  }
  return out;
}

std::string YmirEstimatorReport::ToJson() const {
  std::string j = "{\n";
  // The headline numbers (the "all" scores are leave-one-out over both modes).
  const YmirModeScore* all = scores.size() == 3 ? &scores[2] : nullptr;
  if (!options.similarities_only) {
    j += absl::StrFormat(
        "  \"transfer_cls_accuracy\": %.1f,\n  \"gain_mape_pct\": %.1f,\n"
        "  \"iter_err_normal_pct\": %.1f,\n  \"iter_err_transfer_pct\": %.1f,\n"
        "  \"iter_err_transfer_prior_pct\": %.1f,\n  \"iter_transfer_watch_steps\": %.0f,\n"
        "  \"iter_observed_steps_mean\": %.1f,\n  \"iter_err_normal_first_window_pct\": %.1f,\n"
        "  \"iter_err_transfer_first_window_pct\": %.1f,\n"
        "  \"transfer_cls_accuracy_non_neutral\": %.1f,\n  \"neutral_pairs\": %d,\n"
        "  \"neutral_band\": %.4f,\n  \"transfer_cls3_accuracy\": %.1f,\n  \"transfer_cls3_majority\": %.1f,\n",
        all ? all->accuracy_pct : 0.0, all ? all->mape_pct : 0.0, iteration.normal_pct,
        iteration.transfer_pct, iteration.transfer_prior_pct, iteration.watch_steps, iteration.observed_steps_mean, iteration_first_window.normal_pct,
        iteration_first_window.transfer_pct, all ? all->non_neutral_accuracy_pct : 0.0,
        all ? all->neutral : 0, neutral_band, all ? all->three_way_accuracy_pct : 0.0,
        all ? all->three_way_majority_pct : 0.0);
  }
  j += SetupJson(options);
  j += "  \"similarity_matrix\": {\"tasks\": [";
  for (size_t i = 0; i < tasks.size(); ++i) j += absl::StrFormat("%s\"%s\"", i ? ", " : "", tasks[i]);
  j += "], \"s\": [";
  for (size_t a = 0; a < similarity.size(); ++a) {
    j += a ? ",\n    [" : "\n    [";
    for (size_t b = 0; b < similarity[a].size(); ++b)
      j += absl::StrFormat("%s%.6f", b ? ", " : "", similarity[a][b]);
    j += "]";
  }
  j += "]},\n";
  if (options.similarities_only) {
    return j + absl::StrFormat("  \"train_steps\": %d,\n  \"seconds\": %.1f\n}", train_steps, seconds);
  }
  j += "  \"null_runs\": [";
  for (size_t k = 0; k < null_runs.size(); ++k) {
    j += absl::StrFormat("%s{\"task\": \"%s\", \"steps\": %.2f, \"gain\": %.4f}", k ? ", " : "",
                         null_runs[k].task, null_runs[k].steps, null_runs[k].gain);
  }
  j += "],\n";
  j += "  \"iteration_estimator\": " + IterationErrorsJson(iteration) + ",\n";
  j += "  \"iteration_first_window\": " + IterationErrorsJson(iteration_first_window) + ",\n";
  j += "  \"iteration_prefix_sweep\": [";
  for (size_t k = 0; k < iteration_sweep.size(); ++k) {
    j += (k ? ",\n    " : "\n    ") + IterationErrorsJson(iteration_sweep[k]);
  }
  j += "],\n  \"transfer_watch_sweep\": [";
  for (size_t k = 0; k < transfer_watch_sweep.size(); ++k) {
    j += (k ? ",\n    " : "\n    ") + IterationErrorsJson(transfer_watch_sweep[k]);
  }
  j += "],\n";
  // The best pairs by measured speed-up (1 + gain; with --gain steps it is
  // steps_normal / steps_transfer).
  std::vector<size_t> order(pairs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t x, size_t y) { return pairs[x].gain > pairs[y].gain; });
  j += "  \"best_pairs\": [";
  for (size_t k = 0; k < std::min<size_t>(3, order.size()); ++k) {
    const YmirPair& p = pairs[order[k]];
    j += absl::StrFormat(
        "%s{\"a\": \"%s\", \"b\": \"%s\", \"mode\": \"%s\", \"steps_normal\": %.2f, "
        "\"steps_transfer\": %.2f, \"speedup\": %.3f, \"speedup_steps\": %.3f}",
        k ? ", " : "", p.task_a, p.task_b, p.mode, p.steps_normal, p.steps_transfer, 1.0 + p.gain,
        1.0 + p.gain_steps);
  }
  j += "],\n";
  // The best pairs by the measured speed-up in steps to target.
  j += "  \"best_pairs_steps\": [";
  const std::vector<size_t> by_steps = BestPairsBySteps(3);
  for (size_t k = 0; k < by_steps.size(); ++k) {
    const YmirPair& p = pairs[by_steps[k]];
    j += absl::StrFormat(
        "%s{\"a\": \"%s\", \"b\": \"%s\", \"mode\": \"%s\", \"steps_normal\": %.2f, "
        "\"steps_transfer\": %.2f, \"censored\": %s, \"speedup_steps\": %.3f, \"speedup\": %.3f}",
        k ? ", " : "", p.task_a, p.task_b, p.mode, p.steps_normal, p.steps_transfer,
        p.censored ? "true" : "false", 1.0 + p.gain_steps, 1.0 + p.gain);
  }
  j += "],\n";
  j += absl::StrFormat(
      "  \"negative_pairs\": %d,\n  \"negative_caught\": %d,\n"
      "  \"negative_caught_by_estimator\": %d,\n  \"negative_caught_by_stop_loss\": %d,\n"
      "  \"positive_decoupled\": %d,\n",
      negative_pairs, negative_caught, negative_caught_by_estimator, negative_caught_by_stop_loss,
      positive_decoupled);
  j += "  \"tasks\": [";
  for (size_t i = 0; i < tasks.size(); ++i) {
    j += absl::StrFormat(
        "%s\n    {\"name\": \"%s\", \"normal_steps_to_target\": %.2f, \"eval_loss_initial\": %.4f, "
        "\"eval_loss_best\": %.4f, \"eval_loss_target\": %.4f",
        i ? "," : "", tasks[i], normal_steps[i], normal_initial_loss[i], normal_best_loss[i],
        normal_target_loss[i]);
    if (i < iteration_fits.size()) {
      const YmirIterationFit& f = iteration_fits[i];
      j += absl::StrFormat(
          ", \"predicted_steps_to_target\": %.2f, \"unreachable\": %d, \"fit\": {\"r\": %.4f, "
          "\"d\": %.4f, \"b1\": %.5g, \"b2\": %.5g, \"scale\": %.4f, \"rmse\": %.4f, "
          "\"prefix_points\": %d, \"fit_from_step\": %.0f, \"fitted_points\": %d, "
          "\"convergence_step\": %d}",
          f.predicted_steps, f.unreachable, f.r, f.d, f.b1, f.b2, f.scale, f.rmse, f.prefix_points,
          f.fit_from_step, f.fitted_points, f.convergence_step);
      if (options.iter_online) {
        j += absl::StrFormat(
            ", \"online\": {\"plateau\": %s, \"onset\": %.0f, \"observed_until\": %.1f, "
            "\"predicted_steps_to_target\": %.2f}",
            f.plateau ? "true" : "false", f.onset, f.observed_until, f.online_predicted_steps);
      }
    }
    if (i < normal_curves.size()) j += ", \"curve\": " + CurveJson(normal_curves[i]);
    j += "}";
  }
  j += "],\n  \"paper\": {\"accuracy_pct\": [97.2, 98.6, 98.6], \"gain_mape_pct\": [15.53, 16.76, "
       "18.05], \"iter_err_normal_pct\": [5.69, 11.3], \"iter_err_transfer_pct\": [11.07, 15.35]},\n";
  j += "  \"scores\": [";
  for (size_t i = 0; i < scores.size(); ++i) {
    const YmirModeScore& s = scores[i];
    j += absl::StrFormat(
        "%s\n    {\"mode\": \"%s\", \"pairs\": %d, \"positive\": %d, \"accuracy_pct\": %.1f, "
        "\"majority_accuracy_pct\": %.1f, \"neutral\": %d, \"non_neutral_accuracy_pct\": %.1f, "
        "\"non_neutral_majority_pct\": %.1f, \"three_way_accuracy_pct\": %.1f, \"three_way_majority_pct\": %.1f, "
        "\"gain_mape_pct\": %.1f, \"in_sample_accuracy_pct\": "
        "%.1f, "
        "\"in_sample_gain_mape_pct\": %.1f, \"correlation\": %.3f, \"fit\": {\"intercept\": %.4f, "
        "\"slope\": %.4f}, \"model\": [%s]}",
        i ? "," : "", s.mode, s.pairs, s.positive, s.accuracy_pct, s.majority_accuracy_pct, s.neutral,
        s.non_neutral_accuracy_pct, s.non_neutral_majority_pct, s.three_way_accuracy_pct, s.three_way_majority_pct, s.mape_pct, s.in_sample_accuracy_pct, s.in_sample_mape_pct, s.correlation, s.fit.intercept,
        s.fit.slope, absl::StrJoin(s.model, ", ", [](std::string* out, double w) { absl::StrAppendFormat(out, "%.4f", w); }));
  }
  j += "],\n  \"pairs\": [";
  for (size_t i = 0; i < pairs.size(); ++i) {
    const YmirPair& p = pairs[i];
    j += absl::StrFormat(
        "%s\n    {\"a\": \"%s\", \"b\": \"%s\", \"mode\": \"%s\", \"similarity\": %.4f, "
        "\"asymmetry\": %.4f, \"steps_normal\": %.2f, "
        "\"steps_transfer\": %.2f, \"censored\": %s, \"gain\": %.4f, \"gain_steps\": %.4f, "
        "\"gain_clamped\": %s, \"predicted_gain\": %.4f, "
        "\"predicted_steps_transfer\": %.2f, \"stop_loss_decoupled\": %d, \"stop_loss_step\": %d, "
        "\"steps_transfer_stop_loss\": %.2f, \"predicted_steps_transfer_watched\": %.2f, "
        "\"watched_speedup\": %.4f, \"reached_in_watch\": %d, \"curve\": %s}",
        i ? "," : "", p.task_a, p.task_b, p.mode, p.similarity, p.asymmetry, p.steps_normal, p.steps_transfer,
        p.censored ? "true" : "false", p.gain, p.gain_steps, p.gain_clamped ? "true" : "false",
        p.predicted_gain, p.predicted_steps_transfer,
        p.stop_loss_decoupled, p.stop_loss_step, p.steps_transfer_stop_loss, p.predicted_steps_transfer_watched,
        p.watched_speedup, p.reached_in_watch, CurveJson(p.curve));
  }
  j += absl::StrFormat("],\n  \"train_steps\": %d,\n  \"seconds\": %.1f\n}", train_steps, seconds);
  return j;
}

}  // namespace slicesched::executor
