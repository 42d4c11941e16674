// RunYmirEstimators: per repeat the normal runs, the null runs, the Task2Vec
// embeddings (repeat 0) and the temporal and spatial transfer runs, summed
// over the repeats for the summary (task2vec_summary.cc). Torch-free TU: the
// experiment drives the training operators of train_ops.h.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <span>
#include <string>
#include <utility>

#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "slicesched/executor/train/train_ops.h"
#include "slicesched/experiments/pretrain.h"
#include "slicesched/experiments/task2vec.h"
#include "slicesched/ymir/iteration_estimator.h"
#include "slicesched/ymir/stop_loss.h"
#include "slicesched/ymir/stopping.h"
#include "task2vec_internal.h"

namespace slicesched::executor {
namespace {

using task2vec_internal::Accumulators;
using task2vec_internal::Context;
using task2vec_internal::Curve;
using task2vec_internal::LossAt;
using task2vec_internal::TaskData;

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

// One repeat: its seed and data, and what its normal runs leave for the
// transfer runs.
struct RepeatState {
  int64_t r = 0;
  uint64_t seed = 0;
  std::vector<TaskData> data;
  // Normal runs: targets, trained sources for temporal transfer, probes.
  std::vector<TaskState> trained, probe;
  std::vector<double> target;
  std::vector<Curve> normal_curve;
  // Per task, the curve of this repeat's headline normal estimate (none
  // when it has no estimate): what a transfer run is watched against.
  std::vector<std::optional<ymir::LossCurve>> normal_estimate;
  size_t pair_index = 0;  // of the next pair measured (RecordPair)
};

absl::StatusOr<RepeatState> StartRepeat(const Context& ctx, int64_t r) {
  RepeatState s{.r = r, .seed = ctx.o.seed + 1000 * static_cast<uint64_t>(r)};
  for (const YmirTaskSpec& spec : ctx.o.tasks) {
    TaskData d;
    d.spec = spec;
    SLICESCHED_ASSIGN_OR_RETURN(d.train, ctx.Generate(spec, s.seed, ctx.o.train_examples));
    SLICESCHED_ASSIGN_OR_RETURN(d.eval, ctx.Generate(spec, s.seed + 1, ctx.o.eval_examples));
    s.data.push_back(std::move(d));
  }
  s.trained.resize(ctx.n);
  s.probe.resize(ctx.n);
  s.target.resize(ctx.n);
  s.normal_curve.resize(ctx.n);
  s.normal_estimate.resize(ctx.n);
  return s;
}

// One single-task training run of a state over steps first_step + 1 ..
// last, evaluating on the schedule and appending to *curve (step 0 is
// evaluated when first_step == 0); stops at the first grid evaluation at or
// below `stop_at` from step run_at_least on. With `monitor` (a temporal
// stop-loss), every evaluation is observed against `reference` and
// *decoupled_at gets the step of a decoupling. Evaluates every step up to
// `dense` (normal runs: the estimator's prefixes). *snapshot (when given)
// gets the state after probe_steps: the trained probe.
struct RunRequest {
  int64_t first_step = 0;
  int64_t last = 0;
  double stop_at = -1.0;
  Curve* curve = nullptr;
  TaskState* snapshot = nullptr;
  ymir::StopLoss* monitor = nullptr;
  const Curve* reference = nullptr;
  int64_t* decoupled_at = nullptr;
  int64_t dense = 0;
  int64_t run_at_least = 0;
};

absl::Status TrainRun(const Context& ctx, int64_t& train_steps, TaskState& st, const TaskData& t,
                      const RunRequest& q) {
  const YmirExperimentOptions& o = ctx.o;
  if (q.first_step == 0) {
    SLICESCHED_ASSIGN_OR_RETURN(double l0, EvalLoss(ctx.base, st.params, t));
    q.curve->push_back({0, l0});
    if (q.snapshot != nullptr && o.probe_steps == 0) *q.snapshot = st;
  }
  for (int64_t step = q.first_step + 1; step <= q.last; ++step) {
    const auto rows = StepRows(t, step - 1, o.batch_size);
    SLICESCHED_RETURN_IF_ERROR(AccumulateMicroBatch(ctx.base, st, MakeBatch(rows, {})).status());
    ctx.Schedule(st);
    SLICESCHED_RETURN_IF_ERROR(AdamWStep(st));
    ++train_steps;
    if (q.snapshot != nullptr && step == o.probe_steps) *q.snapshot = st;
    if (!ctx.EvalAt(step, q.dense)) continue;
    SLICESCHED_ASSIGN_OR_RETURN(double l, EvalLoss(ctx.base, st.params, t));
    q.curve->push_back({static_cast<double>(step), l});
    if (q.monitor != nullptr && q.monitor->verdict() == ymir::StopLossVerdict::kUndecided) {
      SLICESCHED_ASSIGN_OR_RETURN(ymir::StopLossVerdict v,
                                  q.monitor->Observe(0, ctx.Epochs(step), l, LossAt(*q.reference, step)));
      if (v == ymir::StopLossVerdict::kDecouple) *q.decoupled_at = step;
    }
    if (ctx.OnGrid(step) && step >= q.run_at_least &&
        ymir::ShouldStop(static_cast<double>(step), l, q.stop_at, q.last) != ymir::StopReason::kContinue)
      break;
  }
  return absl::OkStatus();
}

// The iteration estimator on the prefixes of task i's normal run `c`.
absl::Status PredictNormalRun(const Context& ctx, RepeatState& s, Accumulators& acc,
                              YmirEstimatorReport& rep, size_t i, const Curve& c) {
  const YmirExperimentOptions& o = ctx.o;
  for (size_t f = 0; f < ctx.fractions.size(); ++f) {
    const std::vector<ymir::LossPoint> prefix =
        ymir::Prefix(c, static_cast<double>(o.PrefixSteps(ctx.fractions[f])));
    auto fit = ymir::FitLossCurve(prefix, o.iter_fit);
    if (!fit.ok()) return Annotate(fit.status(), StrCat("iteration estimator on ", s.data[i].spec.name));
    const std::optional<double> predicted = fit->StepsToLoss(s.target[i]);
    acc.pred_normal_sum[f][i] += predicted ? *predicted : ctx.censored;
    if (!predicted) ++acc.unreachable[f][i];
    if (f == 0 && !o.iter_online && predicted) s.normal_estimate[i] = *fit;
    if (s.r == 0 && f == 0) {
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
  return absl::OkStatus();
}

// The online estimate (iter_online) on task i's normal run `c`.
absl::Status EstimateNormalRunOnline(const Context& ctx, RepeatState& s, Accumulators& acc,
                                     YmirEstimatorReport& rep, size_t i, const Curve& c) {
  const YmirExperimentOptions& o = ctx.o;
  auto est = ymir::EstimateOnline(c, static_cast<double>(o.IterPrefixSteps()), s.target[i], o.iter_fit,
                                  o.iter_plateau);
  if (!est.ok()) return Annotate(est.status(), StrCat("online iteration estimate on ", s.data[i].spec.name));
  acc.online_sum[i] += est->steps ? *est->steps : ctx.censored;
  if (est->steps) s.normal_estimate[i] = est->curve;
  acc.online_missing[i] += est->steps ? 0 : 1;
  acc.online_plateaus[i] += est->plateau ? 1 : 0;
  acc.observed_sum[i] += est->observed_until;
  acc.observed_max[i] = std::max(acc.observed_max[i], est->observed_until);
  if (s.r == 0) {
    rep.iteration_fits[i].plateau = est->plateau;
    rep.iteration_fits[i].onset = est->onset;
  }
  return absl::OkStatus();
}

// The area gain's reference: task i's normal run (state `st`, curve `c`)
// continued to max_steps on a copy of the state, added to the sum over
// repeats.
absl::Status ContinueNormalRun(const Context& ctx, RepeatState& s, Accumulators& acc,
                               YmirEstimatorReport& rep, size_t i, const TaskState& st, const Curve& c) {
  TaskState more = st;
  Curve ext = c;
  SLICESCHED_RETURN_IF_ERROR(TrainRun(ctx, rep.train_steps, more, s.data[i],
                                      {.first_step = ctx.o.normal_steps, .last = ctx.max_steps, .curve = &ext}));
  const Curve g = ctx.Grid(ext);
  if (s.r == 0) {
    acc.normal_ext_sum[i] = g;
    return absl::OkStatus();
  }
  // Every repeat runs to max_steps on the same grid; a shorter or
  // longer one would skew the average, so it is an error, not cut.
  if (g.size() != acc.normal_ext_sum[i].size()) {
    return absl::InternalError(StrCat("Ymir experiment: task '", ctx.o.tasks[i].name, "': repeat ", s.r,
                                      "'s continued normal run has ", g.size(),
                                      " grid points, the first repeat's ", acc.normal_ext_sum[i].size()));
  }
  for (size_t k = 0; k < g.size(); ++k) acc.normal_ext_sum[i][k].loss += g[k].loss;
  return absl::OkStatus();
}

// Task i's normal run: its target, the trained source for temporal
// transfer, its probe, and the iteration estimates.
absl::Status NormalRun(const Context& ctx, RepeatState& s, Accumulators& acc, YmirEstimatorReport& rep,
                       size_t i) {
  const YmirExperimentOptions& o = ctx.o;
  SLICESCHED_ASSIGN_OR_RETURN(TaskState st, ctx.InitSeeded(s.data[i], s.seed));
  Curve c;
  if (o.similarities_only) {
    // Only the trained probe needs (the start of) the normal run.
    if (o.probe == YmirProbe::kTrained) {
      SLICESCHED_RETURN_IF_ERROR(TrainRun(ctx, rep.train_steps, st, s.data[i],
                                          {.last = o.probe_steps, .curve = &c, .snapshot = &s.probe[i]}));
    }
    return absl::OkStatus();
  }
  SLICESCHED_RETURN_IF_ERROR(
      TrainRun(ctx, rep.train_steps, st, s.data[i],
               {.last = o.normal_steps, .curve = &c, .snapshot = &s.probe[i], .dense = ctx.dense_until}));
  // The bar every run of this task is measured against (stopping.h).
  SLICESCHED_ASSIGN_OR_RETURN(s.target[i], ymir::NormalTarget(ctx.Grid(c), o.target_fraction));
  double best = c[0].loss;
  for (const ymir::LossPoint& pt : ctx.Grid(c)) best = std::min(best, pt.loss);
  if (s.r == 0) {
    rep.normal_target_loss.push_back(s.target[i]);
    rep.normal_initial_loss.push_back(c[0].loss);
    rep.normal_best_loss.push_back(best);
  }
  SLICESCHED_ASSIGN_OR_RETURN(double measured, ctx.StepsTo(c, s.target[i]));
  acc.normal_sum[i] += measured;
  // The iteration estimator sees only a prefix of this run.
  SLICESCHED_RETURN_IF_ERROR(PredictNormalRun(ctx, s, acc, rep, i, c));
  if (o.iter_online) {
    SLICESCHED_RETURN_IF_ERROR(EstimateNormalRunOnline(ctx, s, acc, rep, i, c));
  }
  s.normal_curve[i] = c;
  if (s.r == 0) rep.normal_curves.push_back(c);
  s.trained[i] = st;
  if (ctx.area) {
    // The area gain's reference (a copy: the temporal source stays the
    // normal_steps state).
    SLICESCHED_RETURN_IF_ERROR(ContinueNormalRun(ctx, s, acc, rep, i, st, c));
  }
  return absl::OkStatus();
}

// Null runs (NeutralBand): the task's normal run again on another seed's
// training sentences and init (the same eval set), measured like a
// transfer run of that task.
absl::Status NullRuns(const Context& ctx, RepeatState& s, Accumulators& acc, YmirEstimatorReport& rep) {
  const YmirExperimentOptions& o = ctx.o;
  for (size_t i = 0; i < ctx.n && !o.similarities_only; ++i) {
    for (int64_t u = 1; u <= o.null_runs; ++u) {
      const uint64_t null_seed = s.seed + 7919 * static_cast<uint64_t>(u);
      TaskData other{.spec = s.data[i].spec, .eval = s.data[i].eval};
      SLICESCHED_ASSIGN_OR_RETURN(other.train, ctx.Generate(other.spec, null_seed, o.train_examples));
      SLICESCHED_ASSIGN_OR_RETURN(TaskState st, ctx.InitSeeded(other, null_seed));
      Curve c;
      SLICESCHED_RETURN_IF_ERROR(TrainRun(
          ctx, rep.train_steps, st, other,
          {.last = ctx.max_steps, .stop_at = s.target[i], .curve = &c, .run_at_least = ctx.window}));
      SLICESCHED_ASSIGN_OR_RETURN(double steps, ctx.StepsTo(c, s.target[i]));
      const size_t k = i * static_cast<size_t>(o.null_runs) + static_cast<size_t>(u - 1);
      if (s.r == 0) {
        rep.null_runs.push_back({.task = o.tasks[i].name});
        acc.null_window_sum.push_back(0.0);
      }
      rep.null_runs[k].steps += steps / static_cast<double>(o.repeats);
      if (ctx.area) acc.null_window_sum[k] += ctx.WindowMean(c);
    }
  }
  return absl::OkStatus();
}

// Task2Vec embeddings: per-example squared gradients (task2vec.h,
// YmirFisher and YmirEmbedParams).
absl::StatusOr<std::vector<double>> Embed(const Context& ctx, const TaskAdapters& params,
                                          const std::vector<const synth::Example*>& rows, bool next_token) {
  const YmirExperimentOptions& o = ctx.o;
  std::vector<double> fisher;
  const double per_row = 1.0 / static_cast<double>(rows.size());
  const TaskAdapters* tasks[] = {&params};
  for (const synth::Example* e : rows) {
    TrainBatch b = MakeBatch(std::span<const synth::Example* const>(&e, 1), {});
    if (next_token) {
      SLICESCHED_ASSIGN_OR_RETURN(b.labels, NextTokenLabels(b.tokens));
    }
    if (next_token || o.fisher == YmirFisher::kEmpirical) {
      SLICESCHED_ASSIGN_OR_RETURN(TaskGradients g, ComputeGradients(ctx.base, tasks, b));
      SLICESCHED_RETURN_IF_ERROR(AddFisher(g.grads[0], per_row, o.embed, fisher));
      continue;
    }
    // kModel: every label, weighted by the probe's p(c | x) = exp(-loss_c).
    const int64_t classes = params.head_outputs();
    std::vector<TaskGradients> per_class;
    double z = 0;
    for (int64_t c = 0; c < classes; ++c) {
      SLICESCHED_ASSIGN_OR_RETURN(
          b.labels,
          LastPositionLabels(std::span<const int64_t>(&c, 1), static_cast<int64_t>(e->tokens.size())));
      SLICESCHED_ASSIGN_OR_RETURN(TaskGradients g, ComputeGradients(ctx.base, tasks, b));
      z += std::exp(-g.loss[0]);
      per_class.push_back(std::move(g));
    }
    for (const TaskGradients& g : per_class) {
      SLICESCHED_RETURN_IF_ERROR(AddFisher(g.grads[0], per_row * std::exp(-g.loss[0]) / z, o.embed, fisher));
    }
  }
  return fisher;
}

// Task i's embedding at its probe.
absl::StatusOr<std::vector<double>> TaskEmbedding(const Context& ctx, const RepeatState& s,
                                                  YmirEstimatorReport& rep, size_t i) {
  const YmirExperimentOptions& o = ctx.o;
  std::vector<const synth::Example*> rows;
  for (int64_t k = 0; k < o.fisher_examples; ++k) {
    rows.push_back(&s.data[i].train[static_cast<size_t>(k) % s.data[i].train.size()]);
  }
  if (o.probe != YmirProbe::kHead) return Embed(ctx, s.probe[i].params, rows, false);
  // Task2Vec's probe (task2vec.h): the LoRA factors stay at their
  // init, only the head learns the task.
  SLICESCHED_ASSIGN_OR_RETURN(TaskState st, ctx.InitSeeded(s.data[i], s.seed));
  for (int64_t step = 0; step < o.probe_steps; ++step) {
    const std::vector<LoraLayer> frozen = st.params.layers;
    SLICESCHED_RETURN_IF_ERROR(
        AccumulateMicroBatch(ctx.base, st, MakeBatch(StepRows(s.data[i], step, o.batch_size), {})).status());
    ctx.Schedule(st);
    SLICESCHED_RETURN_IF_ERROR(AdamWStep(st));
    st.params.layers = frozen;
    ++rep.train_steps;
  }
  return Embed(ctx, st.params, rows, false);
}

// The trivial embedding: the same probe trained on the backbone's own task.
absl::StatusOr<std::vector<double>> TrivialEmbedding(const Context& ctx, YmirEstimatorReport& rep) {
  const YmirExperimentOptions& o = ctx.o;
  SLICESCHED_ASSIGN_OR_RETURN(synth::Language lang, synth::Language::Make(o.language));
  synth::Rng rng(o.seed ^ 0x6c6dull);
  std::vector<synth::Example> lm;
  // The backbone's own task: its language, or windows of the glosses.
  const std::vector<int64_t>& glosses = ctx.glosses;
  for (int64_t k = 0; k < std::max(o.fisher_examples, o.probe_steps * o.batch_size); ++k) {
    if (glosses.size() > static_cast<size_t>(o.sequence_length)) {
      const auto at = glosses.begin() + rng.Below(static_cast<int64_t>(glosses.size()) - o.sequence_length);
      lm.push_back({std::vector<int64_t>(at, at + o.sequence_length), 0});
    } else {
      lm.push_back({lang.Sample(o.sequence_length, rng), 0});
    }
  }
  SLICESCHED_ASSIGN_OR_RETURN(TaskState st,
                              TaskState::Init(ctx.dims, ctx.lora, ctx.dims.vocab, o.seed, ctx.adamw));
  st.params.head = ctx.base.lm_head();
  // kHead: the pretrained lm head already fits `lm`; LoRA stays at init.
  const int64_t lm_steps = o.probe == YmirProbe::kHead ? 0 : o.probe_steps;
  for (int64_t step = 0; step < lm_steps; ++step) {
    std::vector<const synth::Example*> rows;
    for (int64_t b = 0; b < o.batch_size; ++b) rows.push_back(&lm[static_cast<size_t>(step * o.batch_size + b)]);
    TrainBatch batch = MakeBatch(rows, {});
    SLICESCHED_ASSIGN_OR_RETURN(batch.labels, NextTokenLabels(batch.tokens));
    SLICESCHED_RETURN_IF_ERROR(AccumulateMicroBatch(ctx.base, st, batch).status());
    ctx.Schedule(st);
    SLICESCHED_RETURN_IF_ERROR(AdamWStep(st));
    ++rep.train_steps;
  }
  std::vector<const synth::Example*> rows;
  for (int64_t k = 0; k < o.fisher_examples; ++k) rows.push_back(&lm[static_cast<size_t>(k)]);
  return Embed(ctx, st.params, rows, true);
}

// Drops the coordinates that are zero in every embedding (task2vec.h).
void DropZeroCoordinates(std::vector<std::vector<double>>& emb, std::vector<double>& trivial) {
  std::vector<size_t> keep;
  for (size_t k = 0; k < trivial.size(); ++k) {
    bool nonzero = trivial[k] != 0.0;
    for (size_t i = 0; i < emb.size() && !nonzero; ++i) nonzero = emb[i][k] != 0.0;
    if (nonzero) keep.push_back(k);
  }
  auto squeeze = [&](std::vector<double>& v) {
    std::vector<double> out;
    out.reserve(keep.size());
    for (size_t k : keep) out.push_back(v[k]);
    v = std::move(out);
  };
  for (std::vector<double>& e : emb) squeeze(e);
  squeeze(trivial);
}

// Repeat 0: every task's embedding, the trivial one and the similarity
// matrix S(a, b).
absl::Status Embeddings(const Context& ctx, const RepeatState& s, YmirEstimatorReport& rep) {
  const YmirExperimentOptions& o = ctx.o;
  std::vector<std::vector<double>> emb(ctx.n);
  for (size_t i = 0; i < ctx.n; ++i) {
    SLICESCHED_ASSIGN_OR_RETURN(emb[i], TaskEmbedding(ctx, s, rep, i));
  }
  SLICESCHED_ASSIGN_OR_RETURN(std::vector<double> trivial, TrivialEmbedding(ctx, rep));
  if (o.probe == YmirProbe::kHead) DropZeroCoordinates(emb, trivial);
  rep.similarity.assign(ctx.n, std::vector<double>(ctx.n, 0.0));
  for (size_t a = 0; a < ctx.n; ++a) {
    for (size_t b = 0; b < ctx.n; ++b)
      rep.similarity[a][b] = 1.0 - AsymmetricDistance(emb[a], emb[b], trivial, o.alpha, o.distance);
  }
  return absl::OkStatus();
}

// One repeat's measurement of a pair: B's steps without and with
// stop-loss, and the step of a decoupling (0: none).
struct PairRun {
  const char* mode = nullptr;  // "temporal" or "spatial"
  size_t src = 0, dst = 0;
  double similarity = 0;
  double steps = 0;
  int64_t decoupled_at = 0;
  double steps_stop_loss = 0;
  const Curve* transfer = nullptr;  // B's eval curve
};

// Adds one repeat's measurement of the next pair (its row is created by repeat 0).
void RecordPair(const Context& ctx, RepeatState& s, Accumulators& acc, YmirEstimatorReport& rep,
                const PairRun& m) {
  const YmirExperimentOptions& o = ctx.o;
  if (ctx.area) {
    if (s.r == 0) acc.pair_window_sum.push_back(0.0);
    acc.pair_window_sum[s.pair_index] += ctx.WindowMean(*m.transfer);
  }
  if (s.r == 0) {
    YmirPair p{.task_a = o.tasks[m.src].name,
               .task_b = o.tasks[m.dst].name,
               .mode = m.mode,
               .similarity = m.similarity,
               .asymmetry = rep.similarity[m.src][m.dst] - rep.similarity[m.dst][m.src]};
    rep.pairs.push_back(p);
    acc.pair_dst.push_back(m.dst);
  }
  YmirPair& p = rep.pairs[s.pair_index++];
  if (s.r == 0) p.curve = *m.transfer;
  if (o.iter_transfer_online) {
    // Watched once the predicted gains are known (the summary).
    if (s.r == 0) acc.watched_runs.emplace_back();
    acc.watched_runs[s.pair_index - 1].push_back({.curve = ymir::Prefix(*m.transfer, ctx.longest_watch),
                                                  .normal = s.normal_estimate[m.dst],
                                                  .target = s.target[m.dst]});
  }
  p.steps_transfer += m.steps / static_cast<double>(o.repeats);
  p.censored = p.censored || m.steps == ctx.censored;
  p.steps_transfer_stop_loss += m.steps_stop_loss / static_cast<double>(o.repeats);
  if (m.decoupled_at > 0) {
    if (p.stop_loss_decoupled == 0) p.stop_loss_step = m.decoupled_at;
    ++p.stop_loss_decoupled;
  }
}

// Temporal A -> B, watched by a temporal stop-loss (decoupling leaves
// B's training as it is, so its steps with stop-loss are the same).
absl::Status TemporalPairs(const Context& ctx, RepeatState& s, Accumulators& acc, YmirEstimatorReport& rep) {
  for (size_t a = 0; a < ctx.n; ++a) {
    for (size_t b = 0; b < ctx.n; ++b) {
      if (a == b) continue;
      SLICESCHED_ASSIGN_OR_RETURN(TaskState st, ctx.InitSeeded(s.data[b], s.seed));
      SLICESCHED_RETURN_IF_ERROR(TransferLora(s.trained[a], st));
      SLICESCHED_ASSIGN_OR_RETURN(ymir::StopLoss monitor,
                                  ymir::StopLoss::Create(ymir::PairingMode::kTemporal, ctx.stop_opts));
      Curve c;
      int64_t decoupled_at = 0;
      SLICESCHED_RETURN_IF_ERROR(TrainRun(ctx, rep.train_steps, st, s.data[b],
                                          {.last = ctx.max_steps,
                                           .stop_at = s.target[b],
                                           .curve = &c,
                                           .monitor = &monitor,
                                           .reference = &s.normal_curve[b],
                                           .decoupled_at = &decoupled_at,
                                           .run_at_least = ctx.window}));
      SLICESCHED_ASSIGN_OR_RETURN(double steps, ctx.StepsTo(c, s.target[b]));
      RecordPair(ctx, s, acc, rep,
                 {.mode = "temporal",
                  .src = a,
                  .dst = b,
                  .similarity = rep.similarity[a][b],
                  .steps = steps,
                  .decoupled_at = decoupled_at,
                  .steps_stop_loss = steps,
                  .transfer = &c});
    }
  }
  return absl::OkStatus();
}

// Spatial A + B: one joint run gives both tasks' gains. A spatial stop-loss
// watches it; when it decouples at step s, copies of both states also
// continue alone from s (the steps with stop-loss).
absl::Status SpatialPair(const Context& ctx, RepeatState& s, Accumulators& acc, YmirEstimatorReport& rep,
                         size_t a, size_t b) {
  const YmirExperimentOptions& o = ctx.o;
  SLICESCHED_ASSIGN_OR_RETURN(TaskState sa, ctx.InitSeeded(s.data[a], s.seed));
  SLICESCHED_ASSIGN_OR_RETURN(TaskState sb, ctx.InitSeeded(s.data[b], s.seed));
  TaskState* both[] = {&sa, &sb};
  SLICESCHED_RETURN_IF_ERROR(ShareLora(both));
  SLICESCHED_ASSIGN_OR_RETURN(ymir::StopLoss monitor,
                              ymir::StopLoss::Create(ymir::PairingMode::kSpatial, ctx.stop_opts));
  Curve ca, cb;
  int64_t decoupled_at = 0;
  TaskState alone_a, alone_b;  // the decoupled tasks
  Curve ca_alone, cb_alone;
  SLICESCHED_ASSIGN_OR_RETURN(double la, EvalLoss(ctx.base, sa.params, s.data[a]));
  SLICESCHED_ASSIGN_OR_RETURN(double lb, EvalLoss(ctx.base, sb.params, s.data[b]));
  ca.push_back({0, la});
  cb.push_back({0, lb});
  for (int64_t step = 1; step <= ctx.max_steps; ++step) {
    std::vector<const synth::Example*> rows = StepRows(s.data[a], step - 1, o.batch_size);
    const std::vector<const synth::Example*> rb = StepRows(s.data[b], step - 1, o.batch_size);
    rows.insert(rows.end(), rb.begin(), rb.end());
    std::vector<int64_t> row_task(static_cast<size_t>(o.batch_size), 0);
    row_task.resize(static_cast<size_t>(2 * o.batch_size), 1);
    SLICESCHED_RETURN_IF_ERROR(AccumulateJointMicroBatch(ctx.base, both, MakeBatch(rows, row_task)).status());
    ctx.Schedule(sa);
    ctx.Schedule(sb);
    SLICESCHED_RETURN_IF_ERROR(JointOptimizerStep(both, o.spatial_rule));
    rep.train_steps += 2;
    if (!ctx.EvalAt(step, 0)) continue;
    SLICESCHED_ASSIGN_OR_RETURN(la, EvalLoss(ctx.base, sa.params, s.data[a]));
    SLICESCHED_ASSIGN_OR_RETURN(lb, EvalLoss(ctx.base, sb.params, s.data[b]));
    ca.push_back({static_cast<double>(step), la});
    cb.push_back({static_cast<double>(step), lb});
    if (monitor.verdict() == ymir::StopLossVerdict::kUndecided) {
      SLICESCHED_RETURN_IF_ERROR(
          monitor.Observe(0, ctx.Epochs(step), la, LossAt(s.normal_curve[a], step)).status());
      SLICESCHED_RETURN_IF_ERROR(
          monitor.Observe(1, ctx.Epochs(step), lb, LossAt(s.normal_curve[b], step)).status());
      if (monitor.verdict() == ymir::StopLossVerdict::kDecouple) {
        decoupled_at = step;
        alone_a = sa, alone_b = sb, ca_alone = ca, cb_alone = cb;
      }
    }
    if (step >= ctx.window && ctx.Reached(ca, s.target[a]) && ctx.Reached(cb, s.target[b])) break;
  }
  double stop_loss_steps[2] = {0, 0};  // of a, of b
  for (int side = 0; side < 2; ++side) {
    const size_t task = side == 0 ? a : b;
    Curve& joint = side == 0 ? ca : cb;
    Curve& alone = side == 0 ? ca_alone : cb_alone;
    if (decoupled_at == 0) {
      SLICESCHED_ASSIGN_OR_RETURN(stop_loss_steps[side], ctx.StepsTo(joint, s.target[task]));
      continue;
    }
    if (!ctx.Reached(alone, s.target[task])) {
      SLICESCHED_RETURN_IF_ERROR(TrainRun(ctx, rep.train_steps, side == 0 ? alone_a : alone_b, s.data[task],
                                          {.first_step = decoupled_at,
                                           .last = ctx.max_steps,
                                           .stop_at = s.target[task],
                                           .curve = &alone}));
    }
    SLICESCHED_ASSIGN_OR_RETURN(stop_loss_steps[side], ctx.StepsTo(alone, s.target[task]));
  }
  const double sim = 0.5 * (rep.similarity[a][b] + rep.similarity[b][a]);
  for (int side = 0; side < 2; ++side) {
    const size_t src = side == 0 ? a : b, dst = side == 0 ? b : a;
    SLICESCHED_ASSIGN_OR_RETURN(double steps, ctx.StepsTo(side == 0 ? cb : ca, s.target[dst]));
    RecordPair(ctx, s, acc, rep,
               {.mode = "spatial",
                .src = src,
                .dst = dst,
                .similarity = sim,
                .steps = steps,
                .decoupled_at = decoupled_at,
                .steps_stop_loss = stop_loss_steps[side == 0 ? 1 : 0],
                .transfer = side == 0 ? &cb : &ca});
  }
  return absl::OkStatus();
}

// Spatial A + B for every a < b.
absl::Status SpatialPairs(const Context& ctx, RepeatState& s, Accumulators& acc, YmirEstimatorReport& rep) {
  for (size_t a = 0; a < ctx.n; ++a) {
    for (size_t b = a + 1; b < ctx.n; ++b) {
      SLICESCHED_RETURN_IF_ERROR(SpatialPair(ctx, s, acc, rep, a, b));
    }
  }
  return absl::OkStatus();
}

}  // namespace

namespace task2vec_internal {

Context::Context(const LlamaWeights& backbone, const YmirExperimentOptions& options)
    : base(backbone),
      o(options),
      dims(backbone.dims()),
      lora{.rank = o.lora_rank, .alpha = o.lora_alpha},
      adamw{.lr = o.learning_rate},
      max_steps(o.max_steps_factor * o.normal_steps),
      censored(static_cast<double>(max_steps + 1)),
      n(o.tasks.size()),
      fractions{o.iter_prefix_fraction},
      stop_opts{.window_epochs = o.stop_loss_window_epochs},
      longest_watch(o.iter_transfer_watch.watch),
      area(o.gain_measure == YmirGainMeasure::kArea),
      window(area ? o.GainWindow() : 0),
      glosses(o.wordnet != nullptr ? WordNetGlossStream(*o.wordnet) : std::vector<int64_t>()) {
  fractions.insert(fractions.end(), o.iter_prefix_sweep.begin(), o.iter_prefix_sweep.end());
  for (double f : fractions) dense_until = std::max(dense_until, o.PrefixSteps(f));
  for (double w : o.iter_transfer_watch_sweep) longest_watch = std::max(longest_watch, w);
  for (int64_t t = o.eval_every; t <= window; t += o.eval_every) window_steps.push_back(static_cast<double>(t));
}

absl::StatusOr<TaskState> Context::InitSeeded(const TaskData& t, uint64_t init_seed) const {
  SLICESCHED_ASSIGN_OR_RETURN(TaskState st, TaskState::Init(dims, lora, t.spec.num_classes, init_seed, adamw));
  if (o.zero_head) {
    SLICESCHED_ASSIGN_OR_RETURN(TaskAdapters zeros, TaskAdapters::ZerosLike(st.params));
    st.params.head = zeros.head;
  }
  return st;
}

void Context::Schedule(TaskState& st) const {
  if (o.lr_warmup_steps > 0 && st.step < o.lr_warmup_steps) {
    st.adamw.lr = o.learning_rate * static_cast<double>(st.step + 1) / static_cast<double>(o.lr_warmup_steps);
  } else {
    st.adamw.lr = o.learning_rate;
  }
}

absl::StatusOr<std::vector<synth::Example>> Context::Generate(const YmirTaskSpec& spec, uint64_t data_seed,
                                                              int64_t examples) const {
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
}

double Context::Epochs(int64_t step) const {
  return static_cast<double>(step) / static_cast<double>(o.stop_loss_epoch_steps);
}

Curve Context::Grid(const Curve& c) const {
  Curve g;
  for (const ymir::LossPoint& p : c) {
    if (OnGrid(static_cast<int64_t>(p.step))) g.push_back(p);
  }
  return g;
}

absl::StatusOr<double> Context::StepsTo(const Curve& c, double target) const {
  SLICESCHED_ASSIGN_OR_RETURN(ymir::StepsToTargetResult res, ymir::StepsToTarget(Grid(c), target, max_steps));
  return res.steps;
}

bool Context::Reached(const Curve& c, double target) const {
  const Curve g = Grid(c);
  for (size_t i = 1; i < g.size(); ++i) {
    if (g[i].loss <= target) return true;
  }
  return false;
}

double Context::WindowMean(const Curve& c) const {
  double m = 0;
  for (double t : window_steps) m += LossAt(c, t) / static_cast<double>(window_steps.size());
  return m;
}

Accumulators::Accumulators(const Context& ctx)
    : normal_sum(ctx.n, 0.0),
      pred_normal_sum(ctx.fractions.size(), std::vector<double>(ctx.n, 0.0)),
      unreachable(ctx.fractions.size(), std::vector<int64_t>(ctx.n, 0)),
      online_sum(ctx.n, 0.0),
      observed_sum(ctx.n, 0.0),
      observed_max(ctx.n, 0.0),
      online_missing(ctx.n, 0),
      online_plateaus(ctx.n, 0),
      normal_ext_sum(ctx.n) {}

}  // namespace task2vec_internal

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
  const Context ctx(base, o);
  for (const YmirTaskSpec& spec : o.tasks) rep.tasks.push_back(spec.name);
  Accumulators acc(ctx);
  for (int64_t r = 0; r < o.repeats; ++r) {
    SLICESCHED_ASSIGN_OR_RETURN(RepeatState s, StartRepeat(ctx, r));
    for (size_t i = 0; i < ctx.n; ++i) {
      SLICESCHED_RETURN_IF_ERROR(NormalRun(ctx, s, acc, rep, i));
    }
    SLICESCHED_RETURN_IF_ERROR(NullRuns(ctx, s, acc, rep));
    if (o.curves_only) continue;  // the normal runs (and null runs) only (task2vec.h)
    if (r == 0) {
      SLICESCHED_RETURN_IF_ERROR(Embeddings(ctx, s, rep));
      if (o.similarities_only) break;  // nothing else (task2vec.h)
    }
    SLICESCHED_RETURN_IF_ERROR(TemporalPairs(ctx, s, acc, rep));
    SLICESCHED_RETURN_IF_ERROR(SpatialPairs(ctx, s, acc, rep));
  }
  SLICESCHED_RETURN_IF_ERROR(task2vec_internal::Summarize(ctx, acc, rep));
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

}  // namespace slicesched::executor
