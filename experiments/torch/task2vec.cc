// Torch-free TU: the experiment drives the training operators of train_ops.h.
#include "slicesched/experiments/task2vec.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <span>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "slicesched/executor/train/train_ops.h"
#include "slicesched/experiments/pretrain.h"
#include "slicesched/ymir/iteration_estimator.h"
#include "slicesched/ymir/stop_loss.h"
#include "slicesched/ymir/stopping.h"

namespace slicesched::executor {
namespace {

struct TaskData {
  YmirTaskSpec spec;
  std::vector<synth::Example> train, eval;
};

TrainBatch MakeBatch(std::span<const synth::Example* const> rows,
                     std::span<const int64_t> row_task) {
  std::vector<int64_t> tokens, labels;
  const size_t s = rows.front()->tokens.size();
  for (const synth::Example* e : rows) {
    tokens.insert(tokens.end(), e->tokens.begin(), e->tokens.end());
    for (size_t j = 0; j < s; ++j) labels.push_back(j + 1 == s ? e->label : -1);
  }
  const std::vector<int64_t> shape = {static_cast<int64_t>(rows.size()), static_cast<int64_t>(s)};
  TrainBatch b;
  b.tokens = Tensor::FromInt64(tokens, shape);
  b.labels = Tensor::FromInt64(labels, shape);
  b.row_task.assign(row_task.begin(), row_task.end());
  return b;
}

// Rows of training step `step` (0-based) of one task: a cyclic walk.
std::vector<const synth::Example*> StepRows(const TaskData& t, int64_t step, int64_t batch) {
  std::vector<const synth::Example*> rows;
  const auto n = static_cast<int64_t>(t.train.size());
  for (int64_t i = 0; i < batch; ++i)
    rows.push_back(&t.train[static_cast<size_t>((step * batch + i) % n)]);
  return rows;
}

absl::StatusOr<double> EvalLoss(const LlamaWeights& base, const TaskAdapters& params,
                                const TaskData& t) {
  std::vector<const synth::Example*> rows;
  for (const auto& e : t.eval) rows.push_back(&e);
  // Forward through the groups (no group backward), then the head's loss.
  const TaskAdapters* tasks[] = {&params};
  const TrainBatch b = MakeBatch(rows, {});
  SLICESCHED_ASSIGN_OR_RETURN(Tensor hidden, Embedding(base, b.tokens));
  for (int64_t g = 0; g < base.num_groups(); ++g) {
    SLICESCHED_ASSIGN_OR_RETURN(GroupForwardResult f,
                                TrainGroupForward(base, g, tasks, {}, hidden));
    hidden = f.hidden_out;
  }
  SLICESCHED_ASSIGN_OR_RETURN(HeadLossResult h, TrainHeadLoss(base, tasks, {}, hidden, b.labels));
  return h.loss[0];
}

// An eval curve: (step, eval loss), step 0 first.
using Curve = std::vector<ymir::LossPoint>;

// The loss of `c` at `step`, linear between its points (the last point's
// loss beyond it).
double LossAt(const Curve& c, double step) {
  for (size_t i = 1; i < c.size(); ++i) {
    if (c[i].step >= step) {
      return c[i - 1].loss + (c[i].loss - c[i - 1].loss) * (step - c[i - 1].step) /
                                 (c[i].step - c[i - 1].step);
    }
  }
  return c.back().loss;
}

double Cosine(const std::vector<double>& a, const std::vector<double>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ab += a[i] * b[i];
    aa += a[i] * a[i];
    bb += b[i] * b[i];
  }
  return aa > 0 && bb > 0 ? ab / std::sqrt(aa * bb) : 0.0;
}

double Pearson(const std::vector<double>& x, const std::vector<double>& y) {
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

double Pct(int64_t num, int64_t den) {
  return den > 0 ? 100.0 * static_cast<double>(num) / static_cast<double>(den) : 0.0;
}

// [[step, loss], ...] of an eval curve (the report's "curve" fields).
std::string CurveJson(const std::vector<ymir::LossPoint>& c) {
  std::string j = "[";
  for (size_t k = 0; k < c.size(); ++k) j += absl::StrFormat("%s[%g, %.4f]", k ? ", " : "", c[k].step, c[k].loss);
  return j + "]";
}

}  // namespace

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
  if (!fit_on.empty()) {
    // Enough rows of each mode for the model's weights (YmirDirection).
    const size_t need = direction == YmirDirection::kAsymmetry ? 3 : 2;
    for (const char* mode : {"temporal", "spatial"}) {
      size_t rows = 0;
      for (const YmirTrainingPair& t : fit_on) {
        if (t.mode != "temporal" && t.mode != "spatial") {
          return absl::InvalidArgumentError(StrCat("fit_on: mode '", t.mode, "' is not temporal or spatial"));
        }
        if (!std::isfinite(t.similarity) || !std::isfinite(t.asymmetry) || !std::isfinite(t.gain)) {
          return absl::InvalidArgumentError("fit_on: a row's similarity, asymmetry or gain is not finite");
        }
        rows += t.mode == mode ? 1 : 0;
      }
      if (rows < need) {
        return absl::InvalidArgumentError(StrCat("fit_on (slicesim --fit-on) has ", rows, " ", mode,
                                                 " rows; the gain model needs at least ", need));
      }
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
  if (kind == YmirDistance::kCosine) return 1.0 - Cosine(a, b);
  std::vector<double> na(a.size()), nb(b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const double s = a[i] + b[i];
    na[i] = s > 0 ? a[i] / s : 0.5;
    nb[i] = s > 0 ? b[i] / s : 0.5;
  }
  return 1.0 - Cosine(na, nb);
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
  double ss = 0;
  for (double g : null_gains) ss += g * g;
  return band_k * std::sqrt(ss / static_cast<double>(null_gains.size()));
}

double SignScore::AccuracyPct() const { return Pct(agree, pairs); }
double SignScore::MajorityPct() const { return Pct(std::max(positive, pairs - positive), pairs); }
double SignScore::NonNeutralAccuracyPct() const { return Pct(non_neutral_agree, pairs - neutral); }
double SignScore::NonNeutralMajorityPct() const {
  const int64_t m = pairs - neutral;
  return Pct(std::max(non_neutral_positive, m - non_neutral_positive), m);
}

SignScore ScoreSigns(const std::vector<double>& predicted, const std::vector<double>& measured,
                     double band) {
  SignScore s;  // pairs beyond the shorter vector are not scored
  for (size_t i = 0; i < std::min(predicted.size(), measured.size()); ++i) {
    const bool pos = measured[i] > 0;
    const bool agree = (predicted[i] > 0) == pos;
    ++s.pairs;
    s.positive += pos ? 1 : 0;
    s.agree += agree ? 1 : 0;
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
    YmirTrainingPair row{.mode = f[2]};
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

absl::StatusOr<YmirEstimatorReport> RunYmirEstimators(const LlamaWeights& base,
                                                      const YmirExperimentOptions& o) {
  SLICESCHED_RETURN_IF_ERROR(o.Validate());
  const LlamaDims& dims = base.dims();
  if (dims.dtype != DType::kF32)
    return absl::InvalidArgumentError("the Ymir experiment needs an f32 backbone");
  if (o.wordnet == nullptr && o.language.vocab > dims.vocab)
    return absl::InvalidArgumentError("the language's vocab exceeds the backbone's");
  if (o.wordnet != nullptr && o.wordnet->vocab_size() > dims.vocab) {
    return absl::InvalidArgumentError(StrCat("the WordNet vocabulary (", o.wordnet->vocab_size(),
                                             " ids) exceeds the backbone's ", dims.vocab));
  }
  SetIntraOpThreadsForThisThread(1);
  const auto t0 = std::chrono::steady_clock::now();
  YmirEstimatorReport rep;
  rep.options = o;
  const LoraConfig lora{.rank = o.lora_rank, .alpha = o.lora_alpha};
  const AdamWOptions adamw{.lr = o.learning_rate};
  const int64_t max_steps = o.max_steps_factor * o.normal_steps;
  const double censored = static_cast<double>(max_steps + 1);

  const size_t n = o.tasks.size();
  for (const YmirTaskSpec& spec : o.tasks) rep.tasks.push_back(spec.name);
  std::vector<std::vector<double>> emb(n);
  std::vector<double> trivial;
  std::vector<double> normal_sum(n, 0.0);
  std::vector<size_t> pair_dst;  // per pair: the index of its task B
  uint64_t seed = o.seed;        // of the current repeat
  std::vector<TaskData> data;
  // The probe init of a task (of another seed for the null runs).
  auto init_seeded = [&](const TaskData& t, uint64_t init_seed) -> absl::StatusOr<TaskState> {
    SLICESCHED_ASSIGN_OR_RETURN(TaskState st,
                                TaskState::Init(dims, lora, t.spec.num_classes, init_seed, adamw));
    if (o.zero_head) {
      SLICESCHED_ASSIGN_OR_RETURN(TaskAdapters zeros, TaskAdapters::ZerosLike(st.params));
      st.params.head = zeros.head;
    }
    return st;
  };
  auto init = [&](const TaskData& t) { return init_seeded(t, seed); };
  // The warm-up schedule (task2vec.h): the lr of the state's next step.
  auto schedule = [&](TaskState& st) {
    if (o.lr_warmup_steps > 0 && st.step < o.lr_warmup_steps) {
      st.adamw.lr = o.learning_rate * static_cast<double>(st.step + 1) /
                    static_cast<double>(o.lr_warmup_steps);
    } else {
      st.adamw.lr = o.learning_rate;
    }
  };

  // Prefixes of the iteration estimator: the headline one, then the sweep.
  std::vector<double> fractions = {o.iter_prefix_fraction};
  fractions.insert(fractions.end(), o.iter_prefix_sweep.begin(), o.iter_prefix_sweep.end());
  int64_t dense_until = 0;  // normal runs evaluate every step up to the longest prefix
  for (double f : fractions) dense_until = std::max(dense_until, o.PrefixSteps(f));
  const ymir::StopLossOptions stop_opts{.window_epochs = o.stop_loss_window_epochs};
  // Evaluation schedule (task2vec.h): every step of the prefix, then every eval_every.
  auto eval_at = [&](int64_t step, int64_t dense) { return step <= dense || step % o.eval_every == 0; };
  auto epochs = [&](int64_t step) {
    return static_cast<double>(step) / static_cast<double>(o.stop_loss_epoch_steps);
  };
  // The measurement grid: step 0 and every eval_every steps (the extra
  // prefix evaluations feed only the estimator and the stop-loss).
  auto on_grid = [&](int64_t step) { return step % o.eval_every == 0; };
  auto grid = [&](const Curve& c) {
    Curve g;
    for (const ymir::LossPoint& p : c) {
      if (on_grid(static_cast<int64_t>(p.step))) g.push_back(p);
    }
    return g;
  };
  auto steps_to = [&](const Curve& c, double target) -> absl::StatusOr<double> {
    SLICESCHED_ASSIGN_OR_RETURN(ymir::StepsToTargetResult res,
                                ymir::StepsToTarget(grid(c), target, max_steps));
    return res.steps;
  };
  auto reached = [&](const Curve& c, double target) {
    const Curve g = grid(c);
    for (size_t i = 1; i < g.size(); ++i) {
      if (g[i].loss <= target) return true;
    }
    return false;
  };

  // One single-task training run of `st` over steps first_step + 1 .. last,
  // evaluating on the schedule and appending to *c (step 0 is evaluated when
  // first_step == 0); stops at the first evaluation at or below `stop_at`.
  // With `monitor` (a temporal stop-loss), every evaluation is observed
  // against `reference` and *decoupled_at gets the step of a decoupling.
  // Evaluates every step up to `dense` (normal runs: the estimator's prefixes).
  auto run = [&](TaskState& st, const TaskData& t, int64_t first_step, int64_t last, double stop_at,
                 Curve* c, TaskState* snapshot, ymir::StopLoss* monitor, const Curve* reference,
                 int64_t* decoupled_at, int64_t dense, int64_t run_at_least = 0) -> absl::Status {
    if (first_step == 0) {
      SLICESCHED_ASSIGN_OR_RETURN(double l0, EvalLoss(base, st.params, t));
      c->push_back({0, l0});
      if (snapshot != nullptr && o.probe_steps == 0) *snapshot = st;
    }
    for (int64_t step = first_step + 1; step <= last; ++step) {
      const auto rows = StepRows(t, step - 1, o.batch_size);
      SLICESCHED_RETURN_IF_ERROR(AccumulateMicroBatch(base, st, MakeBatch(rows, {})).status());
      schedule(st);
      SLICESCHED_RETURN_IF_ERROR(AdamWStep(st));
      ++rep.train_steps;
      if (snapshot != nullptr && step == o.probe_steps) *snapshot = st;
      if (!eval_at(step, dense)) continue;
      SLICESCHED_ASSIGN_OR_RETURN(double l, EvalLoss(base, st.params, t));
      c->push_back({static_cast<double>(step), l});
      if (monitor != nullptr && monitor->verdict() == ymir::StopLossVerdict::kUndecided) {
        SLICESCHED_ASSIGN_OR_RETURN(ymir::StopLossVerdict v,
                                    monitor->Observe(0, epochs(step), l, LossAt(*reference, step)));
        if (v == ymir::StopLossVerdict::kDecouple) *decoupled_at = step;
      }
      if (on_grid(step) && step >= run_at_least &&
          ymir::ShouldStop(static_cast<double>(step), l, stop_at, last) != ymir::StopReason::kContinue)
        break;
    }
    return absl::OkStatus();
  };
  // Per prefix fraction and task: predicted steps summed over repeats, and
  // the repeats whose fit never reached the target.
  std::vector<std::vector<double>> pred_normal_sum(fractions.size(), std::vector<double>(n, 0.0));
  std::vector<std::vector<int64_t>> unreachable(fractions.size(), std::vector<int64_t>(n, 0));
  // The online estimate (iter_online), per task over repeats: predicted
  // steps, runs without an estimate, the steps seen, runs with a plateau.
  std::vector<double> online_sum(n, 0.0), observed_sum(n, 0.0), observed_max(n, 0.0);
  std::vector<int64_t> online_missing(n, 0), online_plateaus(n, 0);
  // The transfer watch (iter_transfer_online), per pair and repeat: the
  // run's watched evaluations, B's headline normal estimate (none when it
  // has none) and B's target in that repeat.
  struct WatchedRun {
    Curve curve;
    std::optional<ymir::LossCurve> normal;
    double target = 0;
  };
  std::vector<std::vector<WatchedRun>> watched_runs;
  double longest_watch = o.iter_transfer_watch.watch;
  for (double w : o.iter_transfer_watch_sweep) longest_watch = std::max(longest_watch, w);
  // The area gain (kArea): per task the sum over repeats of the normal grid
  // curve continued to max_steps, per pair the sum of the transfer's window
  // mean, and the window's steps.
  const bool area = o.gain_measure == YmirGainMeasure::kArea;
  const int64_t window = area ? o.GainWindow() : 0;
  std::vector<Curve> normal_ext_sum(n);
  std::vector<double> pair_window_sum, null_window_sum;  // per pair, per null run
  std::vector<double> window_steps;
  for (int64_t t = o.eval_every; t <= window; t += o.eval_every) window_steps.push_back(static_cast<double>(t));
  auto window_mean = [&](const Curve& c) {
    double m = 0;
    for (double t : window_steps) m += LossAt(c, t) / static_cast<double>(window_steps.size());
    return m;
  };

  auto generate = [&](const YmirTaskSpec& spec, uint64_t data_seed,
                      int64_t examples) -> absl::StatusOr<std::vector<synth::Example>> {
    if (o.wordnet != nullptr) {
      return synth::GenerateWordNet(
          *o.wordnet,
          {.task = spec.name, .seed = data_seed, .examples = examples, .sequence_length = o.sequence_length});
    }
    return synth::Generate({.task = spec.name,
                            .seed = data_seed,
                            .examples = examples,
                            .sequence_length = o.sequence_length,
                            .num_classes = spec.num_classes,
                            .margin = o.label_margin,
                            .language = o.language});
  };
  // The WordNet backbone's own task, for the trivial embedding (once, not per repeat).
  const std::vector<int64_t> glosses = o.wordnet != nullptr ? WordNetGlossStream(*o.wordnet) : std::vector<int64_t>();
  for (int64_t r = 0; r < o.repeats; ++r) {
    seed = o.seed + 1000 * static_cast<uint64_t>(r);
    data.clear();
    for (const YmirTaskSpec& spec : o.tasks) {
      TaskData d;
      d.spec = spec;
      SLICESCHED_ASSIGN_OR_RETURN(d.train, generate(spec, seed, o.train_examples));
      SLICESCHED_ASSIGN_OR_RETURN(d.eval, generate(spec, seed + 1, o.eval_examples));
      data.push_back(std::move(d));
    }
    // Normal runs: targets, trained sources for temporal transfer, probes.
    std::vector<TaskState> trained(n), probe(n);
    std::vector<double> target(n);
    std::vector<Curve> normal_curve(n);
    // Per task, the curve of this repeat's headline normal estimate (none
    // when it has no estimate): what a transfer run is watched against.
    std::vector<std::optional<ymir::LossCurve>> normal_estimate(n);
    size_t pair_index = 0;
    // Adds one repeat's measurement of a pair (its row is created by repeat 0):
    // B's steps without and with stop-loss, and the step of a decoupling (0: none).
    auto record = [&](const std::string& mode, size_t src, size_t dst, double sim, double steps,
                      int64_t decoupled_at, double steps_stop_loss, const Curve& transfer) {
      if (area) {
        if (r == 0) pair_window_sum.push_back(0.0);
        pair_window_sum[pair_index] += window_mean(transfer);
      }
      if (r == 0) {
        YmirPair p{.task_a = o.tasks[src].name,
                   .task_b = o.tasks[dst].name,
                   .mode = mode,
                   .similarity = sim,
                   .asymmetry = rep.similarity[src][dst] - rep.similarity[dst][src]};
        rep.pairs.push_back(p);
        pair_dst.push_back(dst);
      }
      YmirPair& p = rep.pairs[pair_index++];
      if (r == 0) p.curve = transfer;
      if (o.iter_transfer_online) {
        // Watched once the predicted gains are known (below).
        if (r == 0) watched_runs.emplace_back();
        watched_runs[pair_index - 1].push_back({.curve = ymir::Prefix(transfer, longest_watch),
                                                .normal = normal_estimate[dst],
                                                .target = target[dst]});
      }
      p.steps_transfer += steps / static_cast<double>(o.repeats);
      p.censored = p.censored || steps == censored;
      p.steps_transfer_stop_loss += steps_stop_loss / static_cast<double>(o.repeats);
      if (decoupled_at > 0) {
        if (p.stop_loss_decoupled == 0) p.stop_loss_step = decoupled_at;
        ++p.stop_loss_decoupled;
      }
    };
    for (size_t i = 0; i < n; ++i) {
      SLICESCHED_ASSIGN_OR_RETURN(TaskState st, init(data[i]));
      Curve c;
      if (o.similarities_only) {
        // Only the trained probe needs (the start of) the normal run.
        if (o.probe == YmirProbe::kTrained) {
          SLICESCHED_RETURN_IF_ERROR(run(st, data[i], 0, o.probe_steps, -1.0, &c, &probe[i], nullptr,
                                         nullptr, nullptr, 0));
        }
        continue;
      }
      SLICESCHED_RETURN_IF_ERROR(run(st, data[i], 0, o.normal_steps, -1.0, &c, &probe[i], nullptr,
                                     nullptr, nullptr, dense_until));
      // The bar every run of this task is measured against (stopping.h).
      SLICESCHED_ASSIGN_OR_RETURN(target[i], ymir::NormalTarget(grid(c), o.target_fraction));
      double best = c[0].loss;
      for (const ymir::LossPoint& pt : grid(c)) best = std::min(best, pt.loss);
      if (r == 0) {
        rep.normal_target_loss.push_back(target[i]);
        rep.normal_initial_loss.push_back(c[0].loss);
        rep.normal_best_loss.push_back(best);
      }
      SLICESCHED_ASSIGN_OR_RETURN(double measured, steps_to(c, target[i]));
      normal_sum[i] += measured;
      // The iteration estimator sees only a prefix of this run.
      for (size_t f = 0; f < fractions.size(); ++f) {
        const std::vector<ymir::LossPoint> prefix =
            ymir::Prefix(c, static_cast<double>(o.PrefixSteps(fractions[f])));
        auto fit = ymir::FitLossCurve(prefix, o.iter_fit);
        if (!fit.ok()) return Annotate(fit.status(), StrCat("iteration estimator on ", data[i].spec.name));
        const std::optional<double> predicted = fit->StepsToLoss(target[i]);
        pred_normal_sum[f][i] += predicted ? *predicted : censored;
        if (!predicted) ++unreachable[f][i];
        if (f == 0 && !o.iter_online && predicted) normal_estimate[i] = *fit;
        if (r == 0 && f == 0) {
          rep.iteration_fits.push_back(YmirIterationFit{.r = fit->r,
                                                        .d = fit->d,
                                                        .b1 = fit->b1,
                                                        .b2 = fit->b2,
                                                        .scale = fit->scale,
                                                        .rmse = fit->rmse,
                                                        .prefix_points = static_cast<int64_t>(prefix.size()),
                                                        .fit_from_step = fit->fit_from_step,
                                                        .fitted_points = fit->fitted_points,
                                                        .convergence_step = fit->ConvergenceStep(0.001)});
        }
      }
      if (o.iter_online) {
        auto est = ymir::EstimateOnline(c, static_cast<double>(o.IterPrefixSteps()), target[i],
                                        o.iter_fit, o.iter_plateau);
        if (!est.ok()) return Annotate(est.status(), StrCat("online iteration estimate on ", data[i].spec.name));
        online_sum[i] += est->steps ? *est->steps : censored;
        if (est->steps) normal_estimate[i] = est->curve;
        online_missing[i] += est->steps ? 0 : 1;
        online_plateaus[i] += est->plateau ? 1 : 0;
        observed_sum[i] += est->observed_until;
        observed_max[i] = std::max(observed_max[i], est->observed_until);
        if (r == 0) {
          rep.iteration_fits[i].plateau = est->plateau;
          rep.iteration_fits[i].onset = est->onset;
        }
      }
      normal_curve[i] = c;
      if (r == 0) rep.normal_curves.push_back(c);
      trained[i] = st;
      if (area) {
        // The area gain's reference: the same run continued to max_steps
        // (a copy: the temporal source stays the normal_steps state).
        TaskState more = st;
        Curve ext = c;
        SLICESCHED_RETURN_IF_ERROR(run(more, data[i], o.normal_steps, max_steps, -1.0, &ext, nullptr,
                                       nullptr, nullptr, nullptr, 0));
        const Curve g = grid(ext);
        if (r == 0) {
          normal_ext_sum[i] = g;
        } else {
          // Every repeat runs to max_steps on the same grid; a shorter or
          // longer one would skew the average, so it is an error, not cut.
          if (g.size() != normal_ext_sum[i].size()) {
            return absl::InternalError(StrCat("Ymir experiment: task '", o.tasks[i].name, "': repeat ", r,
                                              "'s continued normal run has ", g.size(),
                                              " grid points, the first repeat's ", normal_ext_sum[i].size()));
          }
          for (size_t k = 0; k < g.size(); ++k) normal_ext_sum[i][k].loss += g[k].loss;
        }
      }
    }
    // Null runs (NeutralBand): the task's normal run again on another
    // seed's training sentences and init (the same eval set), measured like
    // a transfer run of that task.
    for (size_t i = 0; i < n && !o.similarities_only; ++i) {
      for (int64_t u = 1; u <= o.null_runs; ++u) {
        const uint64_t null_seed = seed + 7919 * static_cast<uint64_t>(u);
        TaskData other{.spec = data[i].spec, .eval = data[i].eval};
        SLICESCHED_ASSIGN_OR_RETURN(other.train, generate(other.spec, null_seed, o.train_examples));
        SLICESCHED_ASSIGN_OR_RETURN(TaskState st, init_seeded(other, null_seed));
        Curve c;
        SLICESCHED_RETURN_IF_ERROR(
            run(st, other, 0, max_steps, target[i], &c, nullptr, nullptr, nullptr, nullptr, 0, window));
        SLICESCHED_ASSIGN_OR_RETURN(double steps, steps_to(c, target[i]));
        const size_t k = i * static_cast<size_t>(o.null_runs) + static_cast<size_t>(u - 1);
        if (r == 0) {
          rep.null_runs.push_back({.task = o.tasks[i].name});
          null_window_sum.push_back(0.0);
        }
        rep.null_runs[k].steps += steps / static_cast<double>(o.repeats);
        if (area) null_window_sum[k] += window_mean(c);
      }
    }
    if (o.curves_only) continue;  // the normal runs (and null runs) only (task2vec.h)
    if (r == 0) {
      // Task2Vec embeddings: per-example squared gradients (task2vec.h,
      // YmirFisher and YmirEmbedParams).
      auto embed = [&](const TaskAdapters& params, const std::vector<const synth::Example*>& rows,
                       bool next_token) -> absl::StatusOr<std::vector<double>> {
        std::vector<double> fisher;
        const double per_row = 1.0 / static_cast<double>(rows.size());
        const TaskAdapters* tasks[] = {&params};
        for (const synth::Example* e : rows) {
          TrainBatch b = MakeBatch(std::span<const synth::Example* const>(&e, 1), {});
          if (next_token) {
            SLICESCHED_ASSIGN_OR_RETURN(b.labels, NextTokenLabels(b.tokens));
          }
          if (next_token || o.fisher == YmirFisher::kEmpirical) {
            SLICESCHED_ASSIGN_OR_RETURN(TaskGradients g, ComputeGradients(base, tasks, b));
            SLICESCHED_RETURN_IF_ERROR(AddFisher(g.grads[0], per_row, o.embed, fisher));
            continue;
          }
          // kModel: every label, weighted by the probe's p(c | x) = exp(-loss_c).
          const int64_t classes = params.head_outputs();
          std::vector<TaskGradients> per_class;
          double z = 0;
          for (int64_t c = 0; c < classes; ++c) {
            SLICESCHED_ASSIGN_OR_RETURN(
                b.labels, LastPositionLabels(std::span<const int64_t>(&c, 1),
                                             static_cast<int64_t>(e->tokens.size())));
            SLICESCHED_ASSIGN_OR_RETURN(TaskGradients g, ComputeGradients(base, tasks, b));
            z += std::exp(-g.loss[0]);
            per_class.push_back(std::move(g));
          }
          for (const TaskGradients& g : per_class) {
            SLICESCHED_RETURN_IF_ERROR(
                AddFisher(g.grads[0], per_row * std::exp(-g.loss[0]) / z, o.embed, fisher));
          }
        }
        return fisher;
      };
      for (size_t i = 0; i < n; ++i) {
        std::vector<const synth::Example*> rows;
        for (int64_t k = 0; k < o.fisher_examples; ++k) {
          rows.push_back(&data[i].train[static_cast<size_t>(k) % data[i].train.size()]);
        }
        if (o.probe == YmirProbe::kHead) {
          // Task2Vec's probe (task2vec.h): the LoRA factors stay at their
          // init, only the head learns the task.
          SLICESCHED_ASSIGN_OR_RETURN(TaskState st, init(data[i]));
          for (int64_t step = 0; step < o.probe_steps; ++step) {
            const std::vector<LoraLayer> frozen = st.params.layers;
            SLICESCHED_RETURN_IF_ERROR(
                AccumulateMicroBatch(base, st, MakeBatch(StepRows(data[i], step, o.batch_size), {}))
                    .status());
            schedule(st);
            SLICESCHED_RETURN_IF_ERROR(AdamWStep(st));
            st.params.layers = frozen;
            ++rep.train_steps;
          }
          SLICESCHED_ASSIGN_OR_RETURN(emb[i], embed(st.params, rows, false));
        } else {
          SLICESCHED_ASSIGN_OR_RETURN(emb[i], embed(probe[i].params, rows, false));
        }
      }
      // The trivial embedding: the same probe trained on the backbone's own task.
      {
        SLICESCHED_ASSIGN_OR_RETURN(synth::Language lang, synth::Language::Make(o.language));
        synth::Rng rng(o.seed ^ 0x6c6dull);
        std::vector<synth::Example> lm;
        // The backbone's own task: its language, or windows of the glosses.
        for (int64_t k = 0; k < std::max(o.fisher_examples, o.probe_steps * o.batch_size); ++k) {
          if (glosses.size() > static_cast<size_t>(o.sequence_length)) {
            const auto at = glosses.begin() + rng.Below(static_cast<int64_t>(glosses.size()) - o.sequence_length);
            lm.push_back({std::vector<int64_t>(at, at + o.sequence_length), 0});
          } else {
            lm.push_back({lang.Sample(o.sequence_length, rng), 0});
          }
        }
        SLICESCHED_ASSIGN_OR_RETURN(TaskState st,
                                    TaskState::Init(dims, lora, dims.vocab, o.seed, adamw));
        st.params.head = base.lm_head();
        // kHead: the pretrained lm head already fits `lm`; LoRA stays at init.
        const int64_t lm_steps = o.probe == YmirProbe::kHead ? 0 : o.probe_steps;
        for (int64_t step = 0; step < lm_steps; ++step) {
          std::vector<const synth::Example*> rows;
          for (int64_t b = 0; b < o.batch_size; ++b)
            rows.push_back(&lm[static_cast<size_t>(step * o.batch_size + b)]);
          TrainBatch batch = MakeBatch(rows, {});
          SLICESCHED_ASSIGN_OR_RETURN(batch.labels, NextTokenLabels(batch.tokens));
          SLICESCHED_RETURN_IF_ERROR(AccumulateMicroBatch(base, st, batch).status());
          schedule(st);
          SLICESCHED_RETURN_IF_ERROR(AdamWStep(st));
          ++rep.train_steps;
        }
        std::vector<const synth::Example*> rows;
        for (int64_t k = 0; k < o.fisher_examples; ++k) rows.push_back(&lm[static_cast<size_t>(k)]);
        SLICESCHED_ASSIGN_OR_RETURN(trivial, embed(st.params, rows, true));
      }
      if (o.probe == YmirProbe::kHead) {
        // Drop the coordinates that are zero in every embedding (task2vec.h).
        std::vector<size_t> keep;
        for (size_t k = 0; k < trivial.size(); ++k) {
          bool nonzero = trivial[k] != 0.0;
          for (size_t i = 0; i < n && !nonzero; ++i) nonzero = emb[i][k] != 0.0;
          if (nonzero) keep.push_back(k);
        }
        auto squeeze = [&](std::vector<double>& v) {
          std::vector<double> out;
          out.reserve(keep.size());
          for (size_t k : keep) out.push_back(v[k]);
          v = std::move(out);
        };
        for (size_t i = 0; i < n; ++i) squeeze(emb[i]);
        squeeze(trivial);
      }
      rep.similarity.assign(n, std::vector<double>(n, 0.0));
      for (size_t a = 0; a < n; ++a) {
        for (size_t b = 0; b < n; ++b)
          rep.similarity[a][b] = 1.0 - AsymmetricDistance(emb[a], emb[b], trivial, o.alpha, o.distance);
      }
      if (o.similarities_only) break;  // nothing else (task2vec.h)
    }  // r == 0: embeddings
    auto similarity = [&](size_t a, size_t b) { return rep.similarity[a][b]; };

    // Temporal A -> B, watched by a temporal stop-loss (decoupling leaves
    // B's training as it is, so its steps with stop-loss are the same).
    for (size_t a = 0; a < n; ++a) {
      for (size_t b = 0; b < n; ++b) {
        if (a == b) continue;
        SLICESCHED_ASSIGN_OR_RETURN(TaskState st, init(data[b]));
        SLICESCHED_RETURN_IF_ERROR(TransferLora(trained[a], st));
        SLICESCHED_ASSIGN_OR_RETURN(ymir::StopLoss monitor,
                                    ymir::StopLoss::Create(ymir::PairingMode::kTemporal, stop_opts));
        Curve c;
        int64_t decoupled_at = 0;
        SLICESCHED_RETURN_IF_ERROR(run(st, data[b], 0, max_steps, target[b], &c, nullptr, &monitor,
                                       &normal_curve[b], &decoupled_at, 0, window));
        SLICESCHED_ASSIGN_OR_RETURN(double steps, steps_to(c, target[b]));
        record("temporal", a, b, similarity(a, b), steps, decoupled_at, steps, c);
      }
    }
    // Spatial A + B (a < b): one joint run gives both tasks' gains. A spatial
    // stop-loss watches it; when it decouples at step s, copies of both
    // states also continue alone from s (the steps with stop-loss).
    for (size_t a = 0; a < n; ++a) {
      for (size_t b = a + 1; b < n; ++b) {
        SLICESCHED_ASSIGN_OR_RETURN(TaskState sa, init(data[a]));
        SLICESCHED_ASSIGN_OR_RETURN(TaskState sb, init(data[b]));
        TaskState* both[] = {&sa, &sb};
        SLICESCHED_RETURN_IF_ERROR(ShareLora(both));
        SLICESCHED_ASSIGN_OR_RETURN(ymir::StopLoss monitor,
                                    ymir::StopLoss::Create(ymir::PairingMode::kSpatial, stop_opts));
        Curve ca, cb;
        int64_t decoupled_at = 0;
        TaskState alone_a, alone_b;  // the decoupled tasks
        Curve ca_alone, cb_alone;
        SLICESCHED_ASSIGN_OR_RETURN(double la, EvalLoss(base, sa.params, data[a]));
        SLICESCHED_ASSIGN_OR_RETURN(double lb, EvalLoss(base, sb.params, data[b]));
        ca.push_back({0, la});
        cb.push_back({0, lb});
        for (int64_t step = 1; step <= max_steps; ++step) {
          std::vector<const synth::Example*> rows = StepRows(data[a], step - 1, o.batch_size);
          const std::vector<const synth::Example*> rb = StepRows(data[b], step - 1, o.batch_size);
          rows.insert(rows.end(), rb.begin(), rb.end());
          std::vector<int64_t> row_task(static_cast<size_t>(o.batch_size), 0);
          row_task.resize(static_cast<size_t>(2 * o.batch_size), 1);
          SLICESCHED_RETURN_IF_ERROR(
              AccumulateJointMicroBatch(base, both, MakeBatch(rows, row_task)).status());
          schedule(sa);
          schedule(sb);
          SLICESCHED_RETURN_IF_ERROR(JointOptimizerStep(both, o.spatial_rule));
          rep.train_steps += 2;
          if (!eval_at(step, 0)) continue;
          SLICESCHED_ASSIGN_OR_RETURN(la, EvalLoss(base, sa.params, data[a]));
          SLICESCHED_ASSIGN_OR_RETURN(lb, EvalLoss(base, sb.params, data[b]));
          ca.push_back({static_cast<double>(step), la});
          cb.push_back({static_cast<double>(step), lb});
          if (monitor.verdict() == ymir::StopLossVerdict::kUndecided) {
            SLICESCHED_RETURN_IF_ERROR(
                monitor.Observe(0, epochs(step), la, LossAt(normal_curve[a], step)).status());
            SLICESCHED_RETURN_IF_ERROR(
                monitor.Observe(1, epochs(step), lb, LossAt(normal_curve[b], step)).status());
            if (monitor.verdict() == ymir::StopLossVerdict::kDecouple) {
              decoupled_at = step;
              alone_a = sa, alone_b = sb, ca_alone = ca, cb_alone = cb;
            }
          }
          if (step >= window && reached(ca, target[a]) && reached(cb, target[b])) break;
        }
        double stop_loss_steps[2] = {0, 0};  // of a, of b
        for (int side = 0; side < 2; ++side) {
          const size_t task = side == 0 ? a : b;
          Curve& joint = side == 0 ? ca : cb;
          Curve& alone = side == 0 ? ca_alone : cb_alone;
          if (decoupled_at == 0) {
            SLICESCHED_ASSIGN_OR_RETURN(stop_loss_steps[side], steps_to(joint, target[task]));
            continue;
          }
          if (!reached(alone, target[task])) {
            SLICESCHED_RETURN_IF_ERROR(run(side == 0 ? alone_a : alone_b, data[task], decoupled_at,
                                           max_steps, target[task], &alone, nullptr, nullptr,
                                           nullptr, nullptr, 0));
          }
          SLICESCHED_ASSIGN_OR_RETURN(stop_loss_steps[side], steps_to(alone, target[task]));
        }
        const double s = 0.5 * (similarity(a, b) + similarity(b, a));
        for (int side = 0; side < 2; ++side) {
          const size_t src = side == 0 ? a : b, dst = side == 0 ? b : a;
          SLICESCHED_ASSIGN_OR_RETURN(double steps, steps_to(side == 0 ? cb : ca, target[dst]));
          record("spatial", src, dst, s, steps, decoupled_at, stop_loss_steps[side == 0 ? 1 : 0],
                 side == 0 ? cb : ca);
        }
      }
    }
  }  // repeats
  for (size_t i = 0; i < n; ++i)
    rep.normal_steps.push_back(normal_sum[i] / static_cast<double>(o.repeats));
  if (o.similarities_only) {
    rep.normal_steps.clear();
    rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return rep;
  }
  // The measured gain of a run of task `dst` (gain_measure): from its steps
  // to target and, for kArea, the sum over repeats of its window means.
  auto measured_gain = [&](size_t dst, double steps_transfer, double window_sum,
                           bool* clamped) -> double {
    if (!area) return rep.normal_steps[dst] / steps_transfer - 1.0;
    Curve ref = normal_ext_sum[dst];
    for (ymir::LossPoint& pt : ref) pt.loss /= static_cast<double>(o.repeats);
    return AreaEquivalentSpeedup(ref, window_steps, window_sum / static_cast<double>(o.repeats), 0.1,
                                 static_cast<double>(max_steps) / static_cast<double>(window),
                                 clamped) -
           1.0;
  };
  std::vector<double> null_gains;
  for (size_t k = 0; k < rep.null_runs.size(); ++k) {
    const size_t task = k / static_cast<size_t>(o.null_runs);
    rep.null_runs[k].gain =
        measured_gain(task, rep.null_runs[k].steps, area ? null_window_sum[k] : 0.0, nullptr);
    null_gains.push_back(rep.null_runs[k].gain);
  }
  rep.neutral_band = NeutralBand(null_gains, o.band_k);
  if (o.curves_only) {
    rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return rep;
  }
  for (size_t k = 0; k < rep.pairs.size(); ++k) {
    YmirPair& p = rep.pairs[k];
    p.steps_normal = rep.normal_steps[pair_dst[k]];
    p.gain_steps = p.steps_normal / p.steps_transfer - 1.0;
    p.gain = measured_gain(pair_dst[k], p.steps_transfer, area ? pair_window_sum[k] : 0.0,
                           &p.gain_clamped);
  }

  // The gain model per mode (YmirDirection): fitted on fit_on's rows of
  // the mode (out of sample), else leave-one-out on this run's pairs; scores.
  auto regressors = [&](double similarity, double asymmetry) {
    std::vector<double> r = {1.0, similarity};
    if (o.direction == YmirDirection::kAsymmetry) r.push_back(asymmetry);
    return r;
  };
  auto predict = [](const std::vector<double>& w, const std::vector<double>& r) {
    double g = 0;
    for (size_t i = 0; i < w.size(); ++i) g += w[i] * r[i];
    return g;
  };
  for (const char* mode : {"temporal", "spatial"}) {
    std::vector<size_t> idx;
    for (size_t i = 0; i < rep.pairs.size(); ++i) {
      if (rep.pairs[i].mode == mode) idx.push_back(i);
    }
    std::vector<double> x, y;
    std::vector<std::vector<double>> rows;
    for (size_t i : idx) {
      const YmirPair& p = rep.pairs[i];
      x.push_back(p.similarity), y.push_back(p.gain), rows.push_back(regressors(p.similarity, p.asymmetry));
    }
    YmirModeScore sc;
    sc.mode = mode;
    sc.pairs = static_cast<int64_t>(idx.size());
    sc.fit = FitLine(x, y);
    sc.correlation = Pearson(x, y);
    if (!o.fit_on.empty()) {
      std::vector<std::vector<double>> train;
      std::vector<double> train_y;
      for (const YmirTrainingPair& t : o.fit_on) {
        if (t.mode == mode) train.push_back(regressors(t.similarity, t.asymmetry)), train_y.push_back(t.gain);
      }
      sc.model = FitLeastSquares(train, train_y);
      for (size_t k = 0; k < idx.size(); ++k) rep.pairs[idx[k]].predicted_gain = predict(sc.model, rows[k]);
    } else {
      sc.model = FitLeastSquares(rows, y);
      for (size_t k = 0; k < idx.size(); ++k) {
        std::vector<std::vector<double>> rs;
        std::vector<double> ys;
        for (size_t j = 0; j < idx.size(); ++j) {
          if (j != k) rs.push_back(rows[j]), ys.push_back(y[j]);
        }
        rep.pairs[idx[k]].predicted_gain = predict(FitLeastSquares(rs, ys), rows[k]);
      }
    }
    rep.scores.push_back(sc);
  }
  auto score = [&](YmirModeScore& sc, const std::string& mode) {
    std::vector<double> measured, loo, in_sample;
    double ape = 0, ape_in = 0;
    for (const YmirPair& p : rep.pairs) {
      if (mode != "all" && p.mode != mode) continue;
      const double in =
          predict(rep.scores[p.mode == "temporal" ? 0 : 1].model, regressors(p.similarity, p.asymmetry));
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
    sc.in_sample_accuracy_pct = ScoreSigns(in_sample, measured, rep.neutral_band).AccuracyPct();
    const double c = static_cast<double>(std::max<int64_t>(signs.pairs, 1));
    sc.mape_pct = 100.0 * ape / c;
    sc.in_sample_mape_pct = 100.0 * ape_in / c;
  };
  score(rep.scores[0], "temporal");
  score(rep.scores[1], "spatial");
  YmirModeScore all;
  all.mode = "all";
  score(all, "all");
  {
    std::vector<double> x, y;
    for (const YmirPair& p : rep.pairs) x.push_back(p.similarity), y.push_back(p.gain);
    all.correlation = Pearson(x, y);
  }
  rep.scores.push_back(all);

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
  auto watch_pairs = [&](double watch) -> absl::StatusOr<Watched> {
    ymir::TransferWatchOptions wo = o.iter_transfer_watch;
    wo.watch = watch;
    Watched out{.watch = watch};
    for (size_t k = 0; k < watched_runs.size(); ++k) {
      const YmirPair& p = rep.pairs[k];
      double steps = 0, speedup = 0;
      int64_t reached = 0;
      const double prior_gain = std::max(-0.9, p.predicted_gain);
      for (const WatchedRun& w : watched_runs[k]) {
        auto est = ymir::EstimateTransferOnline(w.normal, w.curve, w.target, prior_gain, wo);
        if (!est.ok()) return Annotate(est.status(), StrCat("transfer estimate of ", p.task_a, " -> ", p.task_b));
        steps += est->steps.value_or(censored / (1.0 + prior_gain)) / static_cast<double>(o.repeats);
        speedup += est->speedup / static_cast<double>(o.repeats);
        reached += est->reached ? 1 : 0;
      }
      out.steps.push_back(steps), out.speedup.push_back(speedup), out.reached.push_back(reached);
    }
    return out;
  };
  std::optional<Watched> watched_head;
  if (o.iter_transfer_online) {
    SLICESCHED_ASSIGN_OR_RETURN(watched_head, watch_pairs(o.iter_transfer_watch.watch));
    for (size_t k = 0; k < rep.pairs.size(); ++k) {
      rep.pairs[k].predicted_steps_transfer_watched = watched_head->steps[k];
      rep.pairs[k].watched_speedup = watched_head->speedup[k];
      rep.pairs[k].reached_in_watch = watched_head->reached[k];
    }
  }
  // Iteration estimator: normal runs, then transfer runs through the
  // leave-one-out predicted gain (task2vec.h), for every prefix and the
  // online estimate. `pred_sum` and `missing` are per task over repeats; the
  // headline's predictions are the pairs' predicted_steps_transfer. With
  // `watched`, the transfer errors are those of the watched estimates (the
  // prior's beside them), else of the prior.
  auto iteration_errors = [&](const std::vector<double>& pred_sum, const std::vector<int64_t>& missing,
                              bool headline, const Watched* watched) {
    YmirIterationErrors e;
    // A prediction beyond the runs' step limit says "not within the run":
    // scored as censored, max_steps + 1, as a fit that never reaches the
    // target is (the runs are cut at max_steps, so no measured step count
    // exceeds it either).
    auto scored = [&](double predicted, int64_t* beyond) {
      if (predicted <= static_cast<double>(max_steps)) return predicted;
      if (predicted != censored) ++*beyond;
      return censored;
    };
    std::vector<double> pred_normal(n);
    for (size_t i = 0; i < n; ++i) {
      pred_normal[i] = pred_sum[i] / static_cast<double>(o.repeats);
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
      const double prior = pred_normal[pair_dst[k]] / (1.0 + std::max(-0.9, p.predicted_gain));
      if (headline) p.predicted_steps_transfer = prior;
      if (p.censored) continue;
      int64_t not_counted = 0;
      const double err = error(scored(watched ? watched->steps[k] : prior, &e.transfer_beyond_limit), p.steps_transfer);
      const double prior_err = error(scored(prior, &not_counted), p.steps_transfer);
      e.transfer_pct += err;
      e.transfer_prior_pct += prior_err;
      sum_nogain += error(scored(pred_normal[pair_dst[k]], &not_counted), p.steps_transfer);
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
  };
  for (size_t f = 0; f < fractions.size(); ++f) {
    const bool head = f == 0 && !o.iter_online;
    YmirIterationErrors e = iteration_errors(pred_normal_sum[f], unreachable[f], head,
                                             head && watched_head ? &*watched_head : nullptr);
    e.fraction = fractions[f];
    e.prefix_steps = o.PrefixSteps(fractions[f]);
    e.observed_steps_mean = e.observed_steps_max = static_cast<double>(e.prefix_steps);
    if (f == 0) {
      for (size_t i = 0; i < n; ++i) {
        rep.iteration_fits[i].predicted_steps = pred_normal_sum[f][i] / static_cast<double>(o.repeats);
        rep.iteration_fits[i].unreachable = unreachable[f][i];
      }
      rep.iteration_first_window = e;
      rep.iteration = e;
    } else {
      rep.iteration_sweep.push_back(e);
    }
  }
  if (o.iter_online) {
    YmirIterationErrors e = iteration_errors(online_sum, online_missing, true, watched_head ? &*watched_head : nullptr);
    e.fraction = fractions[0];
    e.prefix_steps = o.PrefixSteps(fractions[0]);
    e.online = true;
    for (size_t i = 0; i < n; ++i) {
      e.observed_steps_mean += observed_sum[i] / static_cast<double>(o.repeats * static_cast<int64_t>(n));
      e.observed_steps_max = std::max(e.observed_steps_max, observed_max[i]);
      e.plateaus += online_plateaus[i];
      rep.iteration_fits[i].observed_until = observed_sum[i] / static_cast<double>(o.repeats);
      rep.iteration_fits[i].online_predicted_steps = online_sum[i] / static_cast<double>(o.repeats);
    }
    rep.iteration = e;
  }
  // The other watches (iter_transfer_watch_sweep), on the headline's normal estimates.
  for (double watch : o.iter_transfer_online ? o.iter_transfer_watch_sweep : std::vector<double>{}) {
    SLICESCHED_ASSIGN_OR_RETURN(const Watched w, watch_pairs(watch));
    YmirIterationErrors e = o.iter_online ? iteration_errors(online_sum, online_missing, false, &w)
                                          : iteration_errors(pred_normal_sum[0], unreachable[0], false, &w);
    e.fraction = rep.iteration.fraction;
    e.prefix_steps = rep.iteration.prefix_steps;
    e.online = rep.iteration.online;
    e.observed_steps_mean = rep.iteration.observed_steps_mean;
    e.observed_steps_max = rep.iteration.observed_steps_max;
    e.plateaus = rep.iteration.plateaus;
    rep.transfer_watch_sweep.push_back(e);
  }
  // Negative pairs and who caught them.
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
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
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
        "  \"neutral_band\": %.4f,\n",
        all ? all->accuracy_pct : 0.0, all ? all->mape_pct : 0.0, iteration.normal_pct,
        iteration.transfer_pct, iteration.transfer_prior_pct, iteration.watch_steps, iteration.observed_steps_mean, iteration_first_window.normal_pct,
        iteration_first_window.transfer_pct, all ? all->non_neutral_accuracy_pct : 0.0,
        all ? all->neutral : 0, neutral_band);
  }
  {
    const YmirExperimentOptions& o = options;
    std::string names;
    for (const YmirTaskSpec& t : o.tasks) {
      names += absl::StrFormat("%s\"%s:%d\"", names.empty() ? "" : ", ", t.name, t.num_classes);
    }
    j += absl::StrFormat(
        "  \"setup\": {\"seed\": %d, \"tasks\": [%s], \"repeats\": %d, \"learning_rate\": %g, "
        "\"lr_warmup_steps\": %d, \"head\": \"%s\", \"spatial_step\": \"%s\", \"normal_steps\": %d, \"max_steps\": %d, "
        "\"eval_every\": %d, \"eval_examples\": %d, \"probe_steps\": %d, \"probe\": \"%s\", "
        "\"fisher_examples\": %d, \"fisher\": \"%s\", \"embed\": \"%s\", \"distance\": \"%s\", "
        "\"null_runs\": %d, \"band_k\": %g, "
        "\"gain_measure\": \"%s\", \"gain_window\": %d, \"iter_fit\": {\"envelope\": "
        "\"%s\", \"time_shift\": %s, \"recency_half_life\": %g, \"quadratic\": %s}, "
        "\"iter_online\": %s, \"iter_transfer_watch\": %g, \"iter_transfer_fit\": \"%s\", "
        "\"iter_transfer_prior_points\": %g, \"predictions_beyond_max_steps\": \"scored as max_steps + 1\", "
        "\"direction\": \"%s\", \"fit_on_rows\": %d},\n",
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
        o.direction == YmirDirection::kAsymmetry ? "asymmetry" : "none", o.fit_on.size());
  }
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
  auto iter_json = [](const YmirIterationErrors& e) {
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
  };
  j += "  \"iteration_estimator\": " + iter_json(iteration) + ",\n";
  j += "  \"iteration_first_window\": " + iter_json(iteration_first_window) + ",\n";
  j += "  \"iteration_prefix_sweep\": [";
  for (size_t k = 0; k < iteration_sweep.size(); ++k) {
    j += (k ? ",\n    " : "\n    ") + iter_json(iteration_sweep[k]);
  }
  j += "],\n  \"transfer_watch_sweep\": [";
  for (size_t k = 0; k < transfer_watch_sweep.size(); ++k) {
    j += (k ? ",\n    " : "\n    ") + iter_json(transfer_watch_sweep[k]);
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
        "\"non_neutral_majority_pct\": %.1f, \"gain_mape_pct\": %.1f, \"in_sample_accuracy_pct\": "
        "%.1f, "
        "\"in_sample_gain_mape_pct\": %.1f, \"correlation\": %.3f, \"fit\": {\"intercept\": %.4f, "
        "\"slope\": %.4f}, \"model\": [%s]}",
        i ? "," : "", s.mode, s.pairs, s.positive, s.accuracy_pct, s.majority_accuracy_pct, s.neutral,
        s.non_neutral_accuracy_pct, s.non_neutral_majority_pct, s.mape_pct, s.in_sample_accuracy_pct, s.in_sample_mape_pct, s.correlation, s.fit.intercept,
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
