// Shared by task2vec.cc (the options, the experiment's building blocks and
// the report), task2vec_run.cc (RunYmirEstimators: the training phases of
// each repeat) and task2vec_summary.cc (what the repeats add up to: the
// measured gains, the gain model's scores and the iteration estimator's
// errors).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "slicesched/executor/llama/llama_ops.h"
#include "slicesched/executor/train/train_ops.h"
#include "slicesched/experiments/task2vec.h"
#include "slicesched/synth/tasks.h"
#include "slicesched/ymir/iteration_estimator.h"
#include "slicesched/ymir/stop_loss.h"

namespace slicesched::executor::task2vec_internal {

// An eval curve: (step, eval loss), step 0 first.
using Curve = std::vector<ymir::LossPoint>;

// The loss of `c` at `step`, linear between its points (the last point's
// loss beyond it).
double LossAt(const Curve& c, double step);

struct TaskData {
  YmirTaskSpec spec;
  std::vector<synth::Example> train, eval;
};

// What every phase of one experiment shares: the options, the backbone and
// the settings derived from them, fixed for the whole run.
struct Context {
  Context(const LlamaWeights& backbone, const YmirExperimentOptions& options);

  const LlamaWeights& base;
  const YmirExperimentOptions& o;
  const LlamaDims& dims;
  LoraConfig lora;
  AdamWOptions adamw;
  int64_t max_steps = 0;
  double censored = 0;  // max_steps + 1: the steps of a run that never reaches its target
  size_t n = 0;         // tasks
  // Prefixes of the iteration estimator: the headline one, then the sweep.
  std::vector<double> fractions;
  int64_t dense_until = 0;  // normal runs evaluate every step up to the longest prefix
  ymir::StopLossOptions stop_opts;
  double longest_watch = 0;  // of the transfer watch and its sweep
  // The area gain (kArea): the window and its grid steps.
  bool area = false;
  int64_t window = 0;
  std::vector<double> window_steps;
  // The WordNet backbone's own task, for the trivial embedding (once, not per repeat).
  std::vector<int64_t> glosses;

  // The probe init of a task (of another seed for the null runs).
  absl::StatusOr<TaskState> InitSeeded(const TaskData& t, uint64_t init_seed) const;
  // The warm-up schedule (task2vec.h): the lr of the state's next step.
  void Schedule(TaskState& st) const;
  absl::StatusOr<std::vector<synth::Example>> Generate(const YmirTaskSpec& spec, uint64_t data_seed,
                                                       int64_t examples) const;
  // Evaluation schedule (task2vec.h): every step of the prefix, then every eval_every.
  bool EvalAt(int64_t step, int64_t dense) const { return step <= dense || step % o.eval_every == 0; }
  // `step` in the stop-loss's epochs.
  double Epochs(int64_t step) const;
  // The measurement grid: step 0 and every eval_every steps (the extra
  // prefix evaluations feed only the estimator and the stop-loss).
  bool OnGrid(int64_t step) const { return step % o.eval_every == 0; }
  Curve Grid(const Curve& c) const;
  absl::StatusOr<double> StepsTo(const Curve& c, double target) const;
  // Whether a grid point after step 0 is at or below `target`.
  bool Reached(const Curve& c, double target) const;
  // The mean of `c` over the area gain's window.
  double WindowMean(const Curve& c) const;
};

// The transfer watch (iter_transfer_online), per pair and repeat: the
// run's watched evaluations, B's headline normal estimate (none when it
// has none) and B's target in that repeat.
struct WatchedRun {
  Curve curve;
  std::optional<ymir::LossCurve> normal;
  double target = 0;
};

// Sums over the repeats, for the summary.
struct Accumulators {
  explicit Accumulators(const Context& ctx);

  std::vector<double> normal_sum;  // per task: the normal run's steps to target
  std::vector<size_t> pair_dst;    // per pair: the index of its task B
  // Per prefix fraction and task: predicted steps summed over repeats, and
  // the repeats whose fit never reached the target.
  std::vector<std::vector<double>> pred_normal_sum;
  std::vector<std::vector<int64_t>> unreachable;
  // The online estimate (iter_online), per task over repeats: predicted
  // steps, runs without an estimate, the steps seen, runs with a plateau.
  std::vector<double> online_sum, observed_sum, observed_max;
  std::vector<int64_t> online_missing, online_plateaus;
  std::vector<std::vector<WatchedRun>> watched_runs;  // per pair, per repeat
  // The area gain (kArea): per task the sum over repeats of the normal grid
  // curve continued to max_steps, per pair the sum of the transfer's window
  // mean.
  std::vector<Curve> normal_ext_sum;
  std::vector<double> pair_window_sum, null_window_sum;  // per pair, per null run
};

// Fills the report's summary from the repeats' sums: the normal steps, the
// measured gains and neutral band, the gain model and its scores, the
// iteration estimator's errors and the negative pairs (task2vec_summary.cc).
absl::Status Summarize(const Context& ctx, const Accumulators& acc, YmirEstimatorReport& rep);

}  // namespace slicesched::executor::task2vec_internal
