// Internal to the job runner (server/job_runner.h): its per-job runtime and
// the helpers its files share. job_runner.cc holds creation, profiling,
// evaluation, checkpoints and the pass; job_runner_plan.cc the planning round,
// pairings and the stop-loss reference; job_runner_drive.cc the micro-batches
// and data-parallel waves; job_runner_joint.cc spatial joint training.
#pragma once

#include "slicesched/server/job_runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "slicesched/ymir/baselines.h"
#include "slicesched/ymir/gains.h"
#include "slicesched/server/job_runner_dp.h"
#include "slicesched/synth/tasks.h"
#include "slicesched/ymir/planner.h"
#include "slicesched/ymir/stop_loss.h"
#include "slicesched/ymir/time_lut.h"
#include "spdlog/spdlog.h"

#include "job_runner_spatial.h"
#include "slicesched/executor/kernels/llama_kernels.h"
#include "slicesched/executor/llama/llama_ops.h"
#include "slicesched/executor/train/train_ops.h"

namespace slicesched {

struct JobRunner::Gains {
  ymir::YmirGains table;
};

// Data parallelism's shared state (job_runner_dp.h): the time LUT and the
// measured sync cost per deployment.
struct JobRunner::DpState {
  bool has_lut = false;
  ymir::TimeLut lut;
  bool lut_dirty = false;  // online updates not written back yet
  std::map<std::string, double> sync_per_stream_s;  // deployment -> EMA
};

struct JobRunner::PairWatch {
  explicit PairWatch(ymir::StopLoss p) : policy(std::move(p)) {}
  ymir::StopLoss policy;
  // Spatial: member index -> job id. Temporal: [0] = the target (the one
  // member), [1] = its source.
  uint64_t members[2] = {0, 0};
  double start_metric[2] = {NAN, NAN};  // lower-is-better (sign-flipped accuracy)
  int64_t start_step[2] = {0, 0};
};


struct JobRunner::PlanInputs {
  std::vector<ymir::JobView> views;
  std::map<uint64_t, std::string> task_of;  // job id -> its gains-table task
  bool contended = false;  // the listed jobs' gpus.min exceed the devices
};

struct JobRunner::PairCandidates {
  std::vector<ymir::PairEstimate> pairs;
  std::map<std::pair<uint64_t, uint64_t>, ymir::PairEstimate> by_pair;
};

namespace job_runner_internal {

inline double MsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace job_runner_internal

using executor::LlamaTrainJob;
using executor::LlamaWeights;
using executor::TaskState;
using executor::Tensor;
using executor::TrainBatch;

struct JobRunner::Runtime {
  uint64_t id = 0;
  jobs::JobSpec spec;
  std::string deployment;
  std::string task_key;  // for the gains table
  std::shared_ptr<const LlamaWeights> weights;
  // Data.
  bool data_ready = false;
  std::vector<synth::Example> train, eval;
  bool next_token = false;
  int64_t head_outputs = 0;
  std::vector<size_t> perm;  // the current epoch's order
  int64_t perm_epoch = -1;
  // State.
  std::shared_ptr<LlamaTrainJob> job;  // null until started
  bool resumed_from_checkpoint = false;
  // The micro-batch in flight.
  std::shared_ptr<InstanceRecord> inflight;
  std::chrono::steady_clock::time_point inflight_since;
  int64_t inflight_step_before = 0;
  // Measurements.
  double iter_time_s = 0;  // EMA of measured seconds per iteration (0 = none)
  double last_loss = 0;
  double last_metric = NAN;
  int64_t last_eval_step = 0;
  Timestamp last_checkpoint = Timestamp::Never();
  bool checkpoint_due = false;  // left running: checkpoint once nothing is in flight
  bool eval_pending = false;    // an evaluation point passed, not evaluated yet
  std::map<std::string, double> pending_switch;  // context switch parts, for the next progress event
  bool first_step_pending = false;
  jobs::RunPlan plan;  // as last applied
  bool running = false;
  // Profiling: micro-batches on a scratch copy of the fresh state.
  std::shared_ptr<LlamaTrainJob> profile_job;
  std::vector<uint32_t> profile_devices;
  int64_t profile_done = 0;
  double profile_sum_s = 0;  // of the measured (non-warm-up) micro-batches
  // Data parallelism (job_runner_dp.h, SubmitWave / RecordWave): the
  // records of streams 1.. of the wave in flight (stream 0's is `inflight`).
  std::vector<std::shared_ptr<InstanceRecord>> wave;
  int wave_size = 1;   // micro-batches of the wave in flight
  // The joint micro-batch in flight carries none of this job's rows (it
  // completed its iteration's micro-batches and waits for its partner's).
  bool joint_without_rows = false;
  int wave_gpus = 0;   // devices of the plan it was submitted on
  std::chrono::steady_clock::time_point iteration_since;
  int iteration_gpus = 0;  // devices of every wave of the iteration so far; 0 = mixed / not seen from its start
  double micro_s = 0;      // EMA of seconds per micro-batch running alone
  int64_t one_stream_samples = 0;  // micro-batch times in micro_s (after profiling)
  std::map<int, double> measured_iter_s;  // devices -> EMA of measured seconds per iteration
  DpShape dp_shape() const {
    return DpShape{.pipeline_parallel = spec.pipeline_parallel,
                   .min_gpus = spec.min_gpus,
                   .max_gpus = spec.max_gpus,
                   .grad_accumulation = micro_per_iteration(),
                   .batch_size = spec.hyperparameters.batch_size};
  }

  int64_t micro_index() const;
  int64_t micro_per_iteration() const { return std::max<int64_t>(1, spec.hyperparameters.grad_accumulation); }
  int64_t iterations_per_epoch() const {
    const int64_t rows = spec.hyperparameters.batch_size * micro_per_iteration();
    return std::max<int64_t>(1, (static_cast<int64_t>(train.size()) + rows - 1) / rows);
  }
  int64_t iteration_limit() const {
    int64_t limit = spec.stop.max_epochs * iterations_per_epoch();
    if (spec.stop.max_iterations > 0) limit = std::min(limit, spec.stop.max_iterations);
    return limit;
  }
  int64_t step() const {
    if (job == nullptr) return 0;
    absl::MutexLock l(&job->mu);
    return job->state.step;
  }
};

namespace job_runner_internal {

constexpr int64_t kProfileMicroBatches = 3;  // the first is a warm-up

// Whether optimizer step `step` is an evaluation point: a multiple of
// eval_every_steps (0: an epoch end), or the job's iteration limit.
inline bool IsEvalPoint(const JobRunner::Runtime& rt, int64_t step, int64_t eval_every_steps) {
  const int64_t period = eval_every_steps > 0 ? eval_every_steps : rt.iterations_per_epoch();
  return step % period == 0 || step >= rt.iteration_limit();
}

// A job holding a complete iteration (grad_accumulation micro-batches
// accumulated, none parked), which only a spatial pairing leaves behind
// (the joint step waits for every member): its AdamW step, taken alone.
// True when it took one.
inline absl::StatusOr<bool> StepHeldIteration(JobRunner::Runtime& rt) {
  absl::MutexLock l(&rt.job->mu);
  if (!rt.job->pending.empty() || rt.job->state.accumulated < rt.micro_per_iteration()) return false;
  SLICESCHED_RETURN_IF_ERROR(executor::OptimizerStep(rt.job->state));
  return true;
}

inline std::pair<uint64_t, uint64_t> PairKey(uint64_t a, uint64_t b) { return {std::min(a, b), std::max(a, b)}; }

// Why two jobs' states cannot continue one joint training ("" when they
// can): the same step of the pairing and one shared adapter (bit-identical
// LoRA factors, one LoRA config). Each member's head, moments and
// accumulated micro-batches are its own and may differ.
inline std::string JointResumeProblem(uint64_t ida, const executor::TaskState& a, uint64_t idb,
                               const executor::TaskState& b) {
  if (a.step != b.step) {
    return StrCat("their checkpoints are at different steps of the pairing (job ", ida, " at step ", a.step,
                  ", job ", idb, " at step ", b.step, ")");
  }
  if (absl::Status same = executor::SameAdapter(a.params, b.params); !same.ok()) {
    return StrCat("their checkpoints (both at step ", a.step, ") do not hold one shared adapter: ", same.message());
  }
  return "";
}

// Rows [k*B, (k+1)*B) of the epoch-shuffled walk over `train`, left-padded
// with token 0 to the batch's longest row.
inline TrainBatch MicroBatch(JobRunner::Runtime& rt, int64_t k);

// The wave in flight (data parallelism; defined with SubmitWave).
inline InstanceUpdate WaveLast(JobRunner::Runtime& rt);
inline std::shared_ptr<InstanceRecord> WaveRecordToWaitOn(const JobRunner::Runtime& rt);

// The arguments of micro-batch k of `rt`'s data, trained into `job` on
// `devices` (the job's own state, or profiling's scratch copy).
inline TrainStepArgs MicroBatchStep(JobRunner::Runtime& rt, int64_t k, std::shared_ptr<LlamaTrainJob> job,
                             std::vector<uint32_t> devices, std::string label) {
  auto batch = std::make_shared<TrainBatch>(MicroBatch(rt, k));
  const std::vector<int64_t> shape = batch->tokens.shape();
  TrainStepArgs args;
  args.deployment = rt.deployment;
  args.job = std::move(job);
  args.batch = std::move(batch);
  args.rows = shape[0];
  args.tokens = shape[1];
  args.rank = rt.spec.hyperparameters.lora_rank;
  args.head_outputs = rt.head_outputs;
  args.devices = std::move(devices);
  args.priority = rt.spec.priority;
  args.label = std::move(label);
  return args;
}

struct EvalResult {
  double loss = 0;
  double accuracy = 0;
};

inline TrainBatch BuildBatch(const std::vector<const synth::Example*>& rows, bool next_token) {
  size_t len = 0;
  for (const synth::Example* e : rows) len = std::max(len, e->tokens.size());
  std::vector<int64_t> tokens, labels;
  TrainBatch b;
  for (const synth::Example* e : rows) {
    const size_t pad = len - e->tokens.size();
    b.row_pad.push_back(static_cast<int64_t>(pad));
    for (size_t j = 0; j < len; ++j) tokens.push_back(j < pad ? 0 : e->tokens[j - pad]);
    for (size_t j = 0; j < len; ++j) {
      if (next_token) {
        labels.push_back(j >= pad && j + 1 < len ? e->tokens[j + 1 - pad] : -1);
      } else {
        labels.push_back(j + 1 == len ? e->label : -1);
      }
    }
  }
  const std::vector<int64_t> shape = {static_cast<int64_t>(rows.size()), static_cast<int64_t>(len)};
  b.tokens = Tensor::FromInt64(tokens, shape);
  b.labels = Tensor::FromInt64(labels, shape);
  return b;
}

inline absl::StatusOr<EvalResult> EvaluateOn(const LlamaWeights& base, const executor::TaskAdapters& params,
                                      const std::vector<synth::Example>& eval, bool next_token) {
  std::vector<const synth::Example*> rows;
  for (const synth::Example& e : eval) rows.push_back(&e);
  const TrainBatch b = BuildBatch(rows, next_token);
  const executor::TaskAdapters* tasks[] = {&params};
  SLICESCHED_ASSIGN_OR_RETURN(Tensor hidden, executor::Embedding(base, b.tokens));
  for (int64_t g = 0; g < base.num_groups(); ++g) {
    SLICESCHED_ASSIGN_OR_RETURN(executor::GroupForwardResult f, executor::TrainGroupForward(base, g, tasks, {}, hidden, b.row_pad));
    hidden = f.hidden_out;
  }
  SLICESCHED_ASSIGN_OR_RETURN(executor::HeadLossResult h, executor::TrainHeadLoss(base, tasks, {}, hidden, b.labels, b.row_pad));
  EvalResult out;
  out.loss = h.loss[0];
  // Accuracy: argmax of head(final_norm(h)) at the labelled positions.
  const std::vector<float> hs = hidden.ToFloat();
  const std::vector<float> norm = base.norm().ToFloat();
  const std::vector<float> head = params.head.ToFloat();
  const std::vector<int64_t> labels = b.labels.ToInt64();
  const auto H = static_cast<size_t>(base.dims().hidden);
  const size_t nc = head.size() / H;
  const double eps = base.options().rms_eps;
  int64_t counted = 0, correct = 0;
  std::vector<double> x(H);
  for (size_t pos = 0; pos < labels.size(); ++pos) {
    if (labels[pos] < 0) continue;
    double ms = 0;
    for (size_t i = 0; i < H; ++i) ms += static_cast<double>(hs[pos * H + i]) * hs[pos * H + i];
    const double scale = 1.0 / std::sqrt(ms / static_cast<double>(H) + eps);
    for (size_t i = 0; i < H; ++i) x[i] = hs[pos * H + i] * scale * norm[i];
    size_t best = 0;
    double best_v = -INFINITY;
    for (size_t c = 0; c < nc; ++c) {
      double v = 0;
      for (size_t i = 0; i < H; ++i) v += head[c * H + i] * x[i];
      if (v > best_v) best_v = v, best = c;
    }
    ++counted;
    correct += static_cast<int64_t>(best) == labels[pos];
  }
  out.accuracy = counted > 0 ? static_cast<double>(correct) / static_cast<double>(counted) : 0.0;
  return out;
}

inline TrainBatch MicroBatch(JobRunner::Runtime& rt, int64_t k) {
  const auto n = static_cast<int64_t>(rt.train.size());
  const int64_t rows = rt.spec.hyperparameters.batch_size;
  std::vector<const synth::Example*> picked;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = k * rows + r;
    const int64_t epoch = i / n;
    if (epoch != rt.perm_epoch) {
      rt.perm.resize(static_cast<size_t>(n));
      for (size_t j = 0; j < rt.perm.size(); ++j) rt.perm[j] = j;
      synth::Rng rng(rt.spec.hyperparameters.seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(epoch) + 1);
      for (size_t j = rt.perm.size(); j > 1; --j) {
        std::swap(rt.perm[j - 1], rt.perm[static_cast<size_t>(rng.Below(static_cast<int64_t>(j)))]);
      }
      rt.perm_epoch = epoch;
    }
    picked.push_back(&rt.train[rt.perm[static_cast<size_t>(i % n)]]);
  }
  return BuildBatch(picked, rt.next_token);
}

inline absl::StatusOr<std::vector<synth::Example>> LoadJsonl(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(StrCat("dataset.path: cannot open '", path, "'"));
  std::vector<synth::Example> out;
  std::string line;
  size_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (absl::StripAsciiWhitespace(ToAbsl(line)).empty()) continue;
    synth::Example e;
    SLICESCHED_RETURN_IF_ERROR(synth::ParseJsonlExample(line, lineno, path, &e));
    out.push_back(std::move(e));
  }
  return out;
}

inline std::string CheckpointPath(const std::string& state_dir, uint64_t id) {
  return StrCat(state_dir, "/jobs/", id, "/checkpoint.safetensors");
}

// The combined state of the wave in flight: a record that has not ended if
// any, else the first that failed / was cancelled, else stream 0's DONE.
inline InstanceUpdate WaveLast(JobRunner::Runtime& rt) {
  std::optional<InstanceUpdate> failed;
  std::vector<std::shared_ptr<InstanceRecord>> records = {rt.inflight};
  records.insert(records.end(), rt.wave.begin(), rt.wave.end());
  for (const auto& rec : records) {
    InstanceUpdate u = rec->Last();
    if (!IsTerminalInstanceState(u.state)) return u;
    if (u.state != InstanceState::kDone && !failed.has_value()) failed = std::move(u);
  }
  return failed.has_value() ? *failed : rt.inflight->Last();
}

// The first record of the wave that has not ended (null: all ended).
inline std::shared_ptr<InstanceRecord> WaveRecordToWaitOn(const JobRunner::Runtime& rt) {
  if (rt.inflight != nullptr && !IsTerminalInstanceState(rt.inflight->Last().state)) return rt.inflight;
  for (const auto& rec : rt.wave) {
    if (!IsTerminalInstanceState(rec->Last().state)) return rec;
  }
  return nullptr;
}

inline double Ema(double old, double sample) { return old <= 0 ? sample : 0.8 * old + 0.2 * sample; }

}  // namespace job_runner_internal

}  // namespace slicesched
