// Torch-free TU: the runner drives the training operators through their
// LibTorch-free API (executor/train/train_ops.h, llama_kernels.h). It is in
// the LibTorch library sliced_torch, which registers it with the daemon
// (server/extensions.h).
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
  YmirGains table;
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


namespace {

double MsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

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

int64_t JobRunner::Runtime::micro_index() const {
  if (job == nullptr) return 0;
  absl::MutexLock l(&job->mu);
  return job->state.step * micro_per_iteration() + job->state.accumulated;
}

namespace {

constexpr int64_t kProfileMicroBatches = 3;  // the first is a warm-up

// Whether optimizer step `step` is an evaluation point: a multiple of
// eval_every_steps (0: an epoch end), or the job's iteration limit.
bool IsEvalPoint(const JobRunner::Runtime& rt, int64_t step, int64_t eval_every_steps) {
  const int64_t period = eval_every_steps > 0 ? eval_every_steps : rt.iterations_per_epoch();
  return step % period == 0 || step >= rt.iteration_limit();
}

// A job holding a complete iteration (grad_accumulation micro-batches
// accumulated, none parked), which only a spatial pairing leaves behind
// (the joint step waits for every member): its AdamW step, taken alone.
// True when it took one.
absl::StatusOr<bool> StepHeldIteration(JobRunner::Runtime& rt) {
  absl::MutexLock l(&rt.job->mu);
  if (!rt.job->pending.empty() || rt.job->state.accumulated < rt.micro_per_iteration()) return false;
  SLICESCHED_RETURN_IF_ERROR(executor::OptimizerStep(rt.job->state));
  return true;
}

std::pair<uint64_t, uint64_t> PairKey(uint64_t a, uint64_t b) { return {std::min(a, b), std::max(a, b)}; }

// Why two jobs' states cannot continue one joint training ("" when they
// can): the same step of the pairing and one shared adapter (bit-identical
// LoRA factors, one LoRA config). Each member's head, moments and
// accumulated micro-batches are its own and may differ.
std::string JointResumeProblem(uint64_t ida, const executor::TaskState& a, uint64_t idb,
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
TrainBatch MicroBatch(JobRunner::Runtime& rt, int64_t k);

// The wave in flight (data parallelism; defined with SubmitWave).
InstanceUpdate WaveLast(JobRunner::Runtime& rt);
std::shared_ptr<InstanceRecord> WaveRecordToWaitOn(const JobRunner::Runtime& rt);

// The arguments of micro-batch k of `rt`'s data, trained into `job` on
// `devices` (the job's own state, or profiling's scratch copy).
TrainStepArgs MicroBatchStep(JobRunner::Runtime& rt, int64_t k, std::shared_ptr<LlamaTrainJob> job,
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

TrainBatch BuildBatch(const std::vector<const synth::Example*>& rows, bool next_token) {
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

absl::StatusOr<EvalResult> EvaluateOn(const LlamaWeights& base, const executor::TaskAdapters& params,
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

TrainBatch MicroBatch(JobRunner::Runtime& rt, int64_t k) {
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

absl::StatusOr<std::vector<synth::Example>> LoadJsonl(const std::string& path) {
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

std::string CheckpointPath(const std::string& state_dir, uint64_t id) {
  return StrCat(state_dir, "/jobs/", id, "/checkpoint.safetensors");
}

}  // namespace

JobRunner::JobRunner(Master* master, jobs::JobManager* jobs, JobRunnerOptions options)
    : master_(master), jobs_(jobs), options_(std::move(options)) {
  clock_ = options_.clock != nullptr ? options_.clock : &own_clock_;
}

absl::StatusOr<std::unique_ptr<JobRunner>> JobRunner::Create(Master* master, jobs::JobManager* jobs,
                                                             JobRunnerOptions options) {
  if (master == nullptr || jobs == nullptr) return absl::InvalidArgumentError("JobRunner: master and jobs are required");
  if (options.state_dir.empty()) return absl::InvalidArgumentError("JobRunner: state_dir is required");
  std::unique_ptr<JobRunner> r(new JobRunner(master, jobs, std::move(options)));
  r->gains_ = std::make_unique<Gains>();
  if (!r->options_.planner.gains_path.empty()) {
    auto g = LoadYmirGains(r->options_.planner.gains_path);
    if (!g.ok()) return Annotate(g.status(), "planner.gains");
    r->gains_->table = *std::move(g);
  }
  SLICESCHED_RETURN_IF_ERROR(r->LoadTimeLut());
  // Pairs the stop-loss decoupled before a restart stay apart.
  auto never = r->jobs_->NeverPairedAgain();
  if (!never.ok()) return Annotate(never.status(), "reading the decoupled pairs");
  r->decoupled_pairs_ = *std::move(never);
  // So do the normal runs the stop-loss compares pairing members with.
  auto runs = r->jobs_->NormalRuns();
  if (!runs.ok()) return Annotate(runs.status(), "reading the normal runs");
  for (StoredNormalRun& stored : *runs) {
    NormalRun& run = r->normal_runs_[stored.job_id];
    run.key = std::move(stored.run_key);
    run.points = std::move(stored.points);
  }
  return r;
}

std::pair<int64_t, int64_t> JobRunner::TrainingPosition(uint64_t job_id) const {
  auto it = runtimes_.find(job_id);
  if (it == runtimes_.end() || it->second->job == nullptr) return {-1, -1};
  absl::MutexLock l(&it->second->job->mu);
  return {it->second->job->state.step, it->second->job->state.accumulated};
}

std::string JobRunner::DeploymentFor(const jobs::JobSpec& spec, absl::Status* error) {
  auto list = master_->ListDeployments();
  if (!list.ok()) {
    *error = list.status();
    return "";
  }
  std::string best;
  for (const DeploymentInfo& d : *list) {
    if (d.spec.name == spec.backbone) return d.spec.name;
  }
  for (const DeploymentInfo& d : *list) {
    if (d.spec.model_preset != spec.backbone) continue;
    if (best.empty() || d.spec.role == DeploymentRole::kOffline) best = d.spec.name;
    if (d.spec.role == DeploymentRole::kOffline) break;
  }
  if (best.empty()) {
    *error = absl::FailedPreconditionError(
        StrCat("backbone: no deployment serves '", spec.backbone, "' (register a deployment of that model)"));
  }
  return best;
}

absl::Status JobRunner::Prepare(Runtime& rt, const jobs::JobInfo& info, bool with_state) {
  if (rt.weights == nullptr) {
    absl::Status err;
    rt.deployment = DeploymentFor(rt.spec, &err);
    SLICESCHED_RETURN_IF_ERROR(err);
    SLICESCHED_ASSIGN_OR_RETURN(rt.weights, master_->BackboneWeights(rt.deployment));
  }
  const int64_t vocab = rt.weights->dims().vocab;
  if (!rt.data_ready) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<synth::Example> all;
    const jobs::DatasetSpec& ds = rt.spec.dataset;
    if (ds.kind == jobs::DatasetSpec::Kind::kSynthetic) {
      synth::DatasetOptions o;
      o.task = ds.synthetic.task;
      o.seed = ds.synthetic.seed;
      o.examples = ds.synthetic.examples;
      o.sequence_length = ds.synthetic.sequence_length;
      o.num_classes = ds.synthetic.num_classes;
      o.language.vocab = vocab;
      SLICESCHED_ASSIGN_OR_RETURN(all, synth::Generate(o));
      SLICESCHED_ASSIGN_OR_RETURN(synth::TaskInfo task, synth::FindTask(ds.synthetic.task));
      rt.next_token = task.kind == synth::TaskKind::kNextToken;
      rt.head_outputs = rt.next_token ? vocab : ds.synthetic.num_classes;
    } else {
      if (ds.format == jobs::DatasetFormat::kJsonl) {
        SLICESCHED_ASSIGN_OR_RETURN(all, LoadJsonl(ds.path));
      } else {
        SLICESCHED_ASSIGN_OR_RETURN(all, synth::ReadTokensBin(ds.path));
      }
      int64_t max_label = 1;
      for (size_t i = 0; i < all.size(); ++i) {
        for (int64_t t : all[i].tokens) {
          if (t < 0 || t >= vocab) {
            return absl::InvalidArgumentError(StrCat("dataset: example ", i, " of '", ds.path, "' has token id ", t,
                                                     " outside the backbone's vocabulary [0, ", vocab, ")"));
          }
        }
        if (all[i].label < 0) {
          return absl::InvalidArgumentError(
              StrCat("dataset: example ", i, " of '", ds.path, "' has a negative label ", all[i].label));
        }
        max_label = std::max(max_label, all[i].label);
      }
      rt.head_outputs = max_label + 1;
    }
    if (all.size() < 2) {
      return absl::InvalidArgumentError(StrCat("dataset: ", all.size(), " examples; at least 2 are needed (train + eval)"));
    }
    const auto n_eval = static_cast<size_t>(std::clamp<int64_t>(static_cast<int64_t>(all.size()) / 5, 1,
                                                                 options_.max_eval_examples));
    rt.eval.assign(all.end() - static_cast<std::ptrdiff_t>(n_eval), all.end());
    all.resize(all.size() - n_eval);
    rt.train = std::move(all);
    rt.data_ready = true;
    rt.pending_switch["prepare_data_ms"] = MsSince(t0);
  }
  if (with_state && rt.job == nullptr) {
    const jobs::Hyperparameters& hp = rt.spec.hyperparameters;
    const auto t0 = std::chrono::steady_clock::now();
    auto job = std::make_shared<LlamaTrainJob>();
    job->accumulation = rt.micro_per_iteration();
    TaskState state;
    const std::string path = info.checkpoint_path;
    if (!path.empty()) {
      if (!std::filesystem::exists(path)) {
        return absl::NotFoundError(StrCat("checkpoint: '", path, "' (the job's resume point) does not exist"));
      }
      SLICESCHED_ASSIGN_OR_RETURN(state, executor::LoadTaskCheckpoint(path, rt.weights->dims()));
      rt.resumed_from_checkpoint = true;
    } else {
      executor::AdamWOptions adamw;
      adamw.lr = hp.learning_rate;
      SLICESCHED_ASSIGN_OR_RETURN(state, TaskState::Init(rt.weights->dims(),
                                                         executor::LoraConfig{hp.lora_rank, hp.lora_alpha},
                                                         rt.head_outputs, hp.seed));
      state.adamw = adamw;  // lr (and weight decay) of either optimizer
      state.optimizer = hp.optimizer == jobs::Optimizer::kSgd ? executor::OptimizerKind::kSgd
                                                              : executor::OptimizerKind::kAdamW;
      state.momentum = hp.momentum;
      // Temporal transfer: B starts from its source's trained adapters.
      auto src = temporal_source_.find(rt.id);
      if (src != temporal_source_.end()) {
        auto s = runtimes_.find(src->second);
        if (s != runtimes_.end() && s->second->job != nullptr) {
          TaskState from;
          {
            absl::MutexLock l(&s->second->job->mu);
            from = s->second->job->state;
          }
          const absl::Status t = executor::TransferLora(from, state);
          if (t.ok()) {
            spdlog::info("job {}: starts from the adapters of job {} (temporal transfer)", rt.id, src->second);
            rt.pending_switch["temporal_source"] = static_cast<double>(src->second);
          } else {
            spdlog::warn("job {}: temporal transfer from job {} skipped: {}", rt.id, src->second, t.ToString());
          }
        }
      }
    }
    {
      absl::MutexLock l(&job->mu);
      job->state = std::move(state);
    }
    rt.job = std::move(job);
    rt.pending_switch["load_checkpoint_ms"] = MsSince(t0);
    rt.last_eval_step = rt.step();
  }
  return absl::OkStatus();
}

void JobRunner::FailJob(uint64_t id, const std::string& reason) {
  spdlog::warn("job {} failed: {}", id, reason);
  auto r = jobs_->Fail(id, reason);
  if (!r.ok()) spdlog::error("job {}: recording the failure: {}", id, r.status().ToString());
  plan_requested_ = true;
  auto it = runtimes_.find(id);
  if (it != runtimes_.end()) it->second->running = false;
}

absl::Status JobRunner::Checkpoint(Runtime& rt, const std::map<std::string, double>& extra) {
  if (rt.job == nullptr) return absl::OkStatus();
  const std::string path = CheckpointPath(options_.state_dir, rt.id);
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  if (ec) return absl::InternalError(StrCat("checkpoint: cannot create the directory of '", path, "': ", ec.message()));
  TaskState snapshot;
  {
    absl::MutexLock l(&rt.job->mu);
    snapshot = rt.job->state;
  }
  const std::string tmp = path + ".tmp";
  SLICESCHED_RETURN_IF_ERROR(executor::SaveTaskCheckpoint(tmp, snapshot));
  std::filesystem::rename(tmp, path, ec);
  if (ec) return absl::InternalError(StrCat("checkpoint: renaming '", tmp, "': ", ec.message()));
  rt.last_checkpoint = clock_->Now();
  std::map<std::string, double> details = extra;
  details["micro_batches"] = static_cast<double>(snapshot.step * rt.micro_per_iteration() + snapshot.accumulated);
  auto r = jobs_->ReportProgress(rt.id, snapshot.step, rt.last_loss, path, details);
  return r.ok() ? absl::OkStatus() : r.status();
}

absl::Status JobRunner::Evaluate(Runtime& rt, double* metric, double* loss) {
  TaskState snapshot;
  {
    absl::MutexLock l(&rt.job->mu);
    snapshot = rt.job->state;
  }
  SLICESCHED_ASSIGN_OR_RETURN(EvalResult e, EvaluateOn(*rt.weights, snapshot.params, rt.eval, rt.next_token));
  *loss = e.loss;
  switch (rt.spec.stop.metric) {
    case jobs::StopMetric::kAccuracy: *metric = e.accuracy; break;
    case jobs::StopMetric::kLoss: *metric = e.loss; break;
    case jobs::StopMetric::kPerplexity: *metric = std::exp(e.loss); break;
  }
  return absl::OkStatus();
}

JobRunner::Runtime& JobRunner::RuntimeFor(const jobs::JobInfo& j) {
  auto& slot = runtimes_[j.id];
  if (slot == nullptr) {
    slot = std::make_unique<Runtime>();
    slot->id = j.id;
    slot->spec = j.spec;
    slot->task_key =
        j.spec.dataset.kind == jobs::DatasetSpec::Kind::kSynthetic ? j.spec.dataset.synthetic.task : j.spec.name;
    slot->running = j.state == jobs::JobState::kRunning;
    slot->plan = j.plan;
  }
  return *slot;
}

absl::Status JobRunner::Admit() {
  SLICESCHED_ASSIGN_OR_RETURN(jobs::ListJobsPage page,
                              jobs_->List({.states = {jobs::JobState::kSubmitted}, .page_size = 1000}));
  const int devices = static_cast<int>(master_->config().cluster.size());
  for (const jobs::JobInfo& j : page.jobs) {
    if (j.spec.min_gpus > devices) {
      FailJob(j.id, StrCat("gpus.min: ", j.spec.min_gpus, " devices requested, the daemon has ", devices));
      continue;
    }
    Runtime& rt = RuntimeFor(j);
    rt.profile_devices.clear();
    for (int d = 0; d < j.spec.min_gpus; ++d) rt.profile_devices.push_back(static_cast<uint32_t>(d));
    auto p = jobs_->StartProfiling(j.id, rt.profile_devices);
    if (!p.ok()) spdlog::warn("job {}: start profiling: {}", j.id, p.status().ToString());
  }
  return absl::OkStatus();
}

void JobRunner::Profile(Runtime& rt, const jobs::JobInfo& info) {
  const uint64_t id = rt.id;
  if (rt.inflight != nullptr) {
    const InstanceUpdate last = rt.inflight->Last();
    if (!IsTerminalInstanceState(last.state)) return;
    rt.inflight = nullptr;
    if (last.state != InstanceState::kDone) {
      stats_.steps_failed += 1;
      rt.profile_job = nullptr;
      if (info.state == jobs::JobState::kProfiling) {
        FailJob(id, StrCat("profiling micro-batch ", rt.profile_done, " failed: ",
                           last.message.empty() ? std::string(ToStd(InstanceStateName(last.state))) : last.message));
      }
      return;
    }
    stats_.profile_steps += 1;
    if (rt.profile_done > 0) rt.profile_sum_s += SpanSeconds(rt, 1, MsSince(rt.inflight_since) / 1000.0);
    rt.profile_done += 1;
  }
  if (info.state != jobs::JobState::kProfiling) {  // cancelled / failed meanwhile
    rt.profile_job = nullptr;
    return;
  }
  if (rt.profile_done >= kProfileMicroBatches) {
    rt.profile_job = nullptr;
    const double per_micro = rt.profile_sum_s / static_cast<double>(kProfileMicroBatches - 1);
    rt.iter_time_s = per_micro * static_cast<double>(rt.micro_per_iteration());
    rt.micro_s = per_micro;
    auto p = jobs_->ReportProgress(id, info.iterations_done, info.last_loss, "",
                                   {{"profiled_iter_time_s", rt.iter_time_s},
                                    {"profile_micro_batches", static_cast<double>(kProfileMicroBatches)}});
    if (!p.ok()) spdlog::warn("job {}: profile progress: {}", id, p.status().ToString());
    auto q = jobs_->Queue(id, rt.iteration_limit());
    if (!q.ok()) spdlog::warn("job {}: queueing: {}", id, q.status().ToString());
    spdlog::info("job {} profiled: {:.4f} s per iteration", id, rt.iter_time_s);
    plan_requested_ = true;
    return;
  }
  if (rt.profile_job == nullptr && rt.profile_done == 0 && ProfileFromLut(rt, info)) return;
  if (rt.profile_job == nullptr) {
    // The fresh state (Prepare's path), then handed to the scratch job: the
    // job's own state is created when it first runs (temporal transfer).
    absl::Status s = Prepare(rt, info, /*with_state=*/true);
    if (!s.ok()) {
      FailJob(id, std::string(ToStd(s.message())));
      return;
    }
    rt.profile_job = std::move(rt.job);
    rt.job = nullptr;
    rt.resumed_from_checkpoint = false;
    rt.pending_switch.erase("load_checkpoint_ms");
    rt.pending_switch["prepare_data_ms"] = 0;  // the data is prefetched for the first run
    rt.profile_done = 0;
    rt.profile_sum_s = 0;
  }
  const int64_t k = rt.profile_done;
  TrainStepArgs args = MicroBatchStep(rt, k, rt.profile_job, rt.profile_devices, StrCat("job-", id, "/profile-", k));
  rt.inflight_since = std::chrono::steady_clock::now();
  auto rec = master_->SubmitTrainStep(std::move(args));
  if (!rec.ok()) {
    if (absl::IsFailedPrecondition(rec.status()) && master_->draining()) return;
    rt.profile_job = nullptr;
    FailJob(id, StrCat("submitting profiling micro-batch ", k, ": ", rec.status().message()));
    return;
  }
  // One micro-batch on the scratch state (taken here, not by Drive's wave
  // bookkeeping); the wave fields say so all the same.
  rt.wave.clear();
  rt.wave_size = 1;
  rt.wave_gpus = static_cast<int>(rt.profile_devices.size());
  rt.iteration_gpus = 0;
  rt.inflight = *rec;
}

absl::Status JobRunner::StartPairWatch(Runtime& rt, const jobs::JobInfo& info) {
  if (info.plan.mode == jobs::RunMode::kAlone || rt.job == nullptr) return absl::OkStatus();
  auto w = pair_watch_.find(PairKey(rt.id, info.plan.partner));
  if (w == pair_watch_.end()) return absl::OkStatus();
  const int m = w->second->members[0] == rt.id ? 0 : 1;
  if (m >= w->second->policy.members()) return absl::OkStatus();  // a temporal source
  if (!std::isnan(w->second->start_metric[m])) return absl::OkStatus();
  double metric = 0, loss = 0;
  SLICESCHED_RETURN_IF_ERROR(Evaluate(rt, &metric, &loss));
  w->second->start_metric[m] = jobs::HigherIsBetter(rt.spec.stop.metric) ? -metric : metric;
  w->second->start_step[m] = rt.step();
  return absl::OkStatus();
}

void JobRunner::ObservePairing(Runtime& rt, const jobs::JobInfo& info, double metric,
                               std::map<std::string, double>* extra) {
  if (info.plan.mode == jobs::RunMode::kAlone) return;
  const auto key = PairKey(rt.id, info.plan.partner);
  auto w = pair_watch_.find(key);
  if (w == pair_watch_.end()) return;
  PairWatch& pw = *w->second;
  if (pw.policy.verdict() != ymir::StopLossVerdict::kUndecided) return;  // kept: final
  const int m = pw.members[0] == rt.id ? 0 : 1;
  if (m >= pw.policy.members()) return;  // a temporal source
  if (std::isnan(pw.start_metric[m])) return;  // started after this evaluation point
  const double signed_metric = jobs::HigherIsBetter(rt.spec.stop.metric) ? -metric : metric;
  const double epochs =
      static_cast<double>(rt.step() - pw.start_step[m]) / static_cast<double>(rt.iterations_per_epoch());
  // Both kinds of member (a spatial member, a temporal target) are compared
  // with the measured normal curve of their task where there is one.
  uint64_t curve_job = 0;
  const double reference = StopLossReference(rt, pw.start_metric[m], rt.step(), &curve_job);
  (*extra)["stop_loss_reference"] = jobs::HigherIsBetter(rt.spec.stop.metric) ? -reference : reference;
  (*extra)["stop_loss_normal_curve"] = curve_job != 0 ? 1 : 0;
  (*extra)["stop_loss_start_metric"] = jobs::HigherIsBetter(rt.spec.stop.metric) ? -pw.start_metric[m] : pw.start_metric[m];
  if (curve_job != 0) (*extra)["stop_loss_normal_run_job"] = static_cast<double>(curve_job);
  auto v = pw.policy.Observe(m, epochs, signed_metric, reference);
  if (!v.ok()) {
    spdlog::warn("job {}: stop-loss: {}", rt.id, v.status().ToString());
    return;
  }
  if (*v == ymir::StopLossVerdict::kKeep) {
    (*extra)["stop_loss_kept"] = 1;
    // The watch stays (with its final verdict) while the pairing lasts, so
    // the next planning round does not start a new one.
    spdlog::info("jobs {} + {}: {} pairing kept (stop-loss: {})", key.first, key.second,
                 ymir::PairingModeName(pw.policy.mode()), pw.policy.reason());
    return;
  }
  if (*v != ymir::StopLossVerdict::kDecouple) return;
  const std::string reason =
      StrCat("stop-loss: the ", ymir::PairingModeName(pw.policy.mode()), " pairing with job ", info.plan.partner,
             " did not improve ",
             jobs::StopMetricName(rt.spec.stop.metric), " within ", ymir::StopLossOptions{}.window_epochs,
             " epochs (", pw.policy.reason(), "; member ", m, " is job ", rt.id,
             jobs::HigherIsBetter(rt.spec.stop.metric) ? ", metric negated" : "", "; reference: ",
             curve_job != 0 ? StrCat("the normal run of job ", curve_job, " at step ", rt.step())
                            : StrCat("its metric at the pairing's start, step ", pw.start_step[m]),
             ")");
  auto d = jobs_->Decouple(rt.id, reason, {}, /*never_pair_again=*/true);
  if (!d.ok()) {
    spdlog::warn("job {}: decouple: {}", rt.id, d.status().ToString());
    return;
  }
  spdlog::info("job {}: {}", rt.id, reason);
  for (uint64_t id : {key.first, key.second}) {
    auto r = runtimes_.find(id);
    if (r == runtimes_.end()) continue;
    auto now_info = jobs_->Get(id);
    if (now_info.ok()) r->second->plan = now_info->plan;
  }
  decoupled_pairs_.insert(key);
  // A temporal target keeps the adapters it trained; it no longer counts as
  // its source's target (the source's state may now be released).
  if (pw.policy.mode() == ymir::PairingMode::kTemporal) temporal_source_.erase(pw.members[0]);
  pair_watch_.erase(w);
  plan_requested_ = true;
}

absl::Status JobRunner::ApplyPlan(uint64_t id, const jobs::RunPlan& plan, Timestamp now) {
  (void)now;
  auto it = runtimes_.find(id);
  if (it != runtimes_.end() && it->second->running && it->second->plan.devices == plan.devices &&
      it->second->plan.mode == plan.mode && it->second->plan.partner == plan.partner) {
    return absl::OkStatus();  // unchanged: no event
  }
  auto r = jobs_->Run(id, plan);
  if (!r.ok()) return r.status();
  Runtime& rt = *runtimes_.at(id);
  const bool was_running = rt.running;
  rt.plan = plan;
  rt.running = true;
  if (!was_running) rt.first_step_pending = true;
  return absl::OkStatus();
}

std::map<uint64_t, uint64_t> JobRunner::JointPartners(const std::vector<jobs::JobInfo>& listed) {
  std::map<uint64_t, const jobs::JobInfo*> info;
  for (const jobs::JobInfo& j : listed) info[j.id] = &j;
  std::map<uint64_t, uint64_t> out;
  // Pairs training jointly now: they may stay spatial.
  for (const auto& [a, b] : joint_started_) {
    auto ia = info.find(a), ib = info.find(b);
    if (ia == info.end() || ib == info.end()) continue;
    const jobs::RunPlan &pa = ia->second->plan, &pb = ib->second->plan;
    if (ia->second->state != jobs::JobState::kRunning || ib->second->state != jobs::JobState::kRunning ||
        pa.mode != jobs::RunMode::kSpatial || pa.partner != b || pb.mode != jobs::RunMode::kSpatial ||
        pb.partner != a) {
      continue;
    }
    out[a] = b;
    out[b] = a;
  }
  // Pairs that were training jointly when the daemon stopped (the store's
  // joint pairs, neither member running yet): resumable when both
  // checkpoints are at the same step of the pairing with one shared adapter.
  auto stored = jobs_->JointPairs();
  if (!stored.ok()) {
    spdlog::warn("reading the joint pairs: {}", stored.status().ToString());
    return out;
  }
  for (const auto& key : *stored) {
    const auto [a, b] = key;
    if (joint_started_.contains(key)) continue;  // running (above), or decoupled in this process
    auto ia = info.find(a), ib = info.find(b);
    std::string why;
    if (ia == info.end() || ib == info.end()) {
      // Not in this round's list: gone, or beyond the listed page (a round
      // lists at most one page of jobs), which keeps the pair stored (not
      // offered this round).
      bool unlisted = false;
      for (const uint64_t id : {a, b}) {
        if (info.contains(id)) continue;
        auto j = jobs_->Get(id);
        if (j.ok() && (j->state == jobs::JobState::kQueued || j->state == jobs::JobState::kPaused ||
                       j->state == jobs::JobState::kRunning)) {
          unlisted = true;
        } else if (why.empty()) {
          why = StrCat("job ", id, " is no longer queued, paused or running");
        }
      }
      if (why.empty() && unlisted) continue;
    } else if (ia->second->state == jobs::JobState::kRunning || ib->second->state == jobs::JobState::kRunning) {
      const jobs::RunPlan &pa = ia->second->plan, &pb = ib->second->plan;
      const bool a_with_b = ia->second->state == jobs::JobState::kRunning && pa.mode == jobs::RunMode::kSpatial &&
                            pa.partner == b;
      const bool b_with_a = ib->second->state == jobs::JobState::kRunning && pb.mode == jobs::RunMode::kSpatial &&
                            pb.partner == a;
      if (a_with_b && b_with_a) {
        // Resumed by an earlier round (checked then), its first joint
        // micro-batch not taken yet: kept spatial.
        out[a] = b;
        out[b] = a;
        continue;
      }
      const uint64_t apart = ia->second->state == jobs::JobState::kRunning && !a_with_b ? a : b;
      why = StrCat("the planner runs job ", apart, " without its partner");
    }
    const executor::TaskState* st[2] = {nullptr, nullptr};
    for (int i = 0; i < 2 && why.empty(); ++i) {
      const jobs::JobInfo& j = *(i == 0 ? ia : ib)->second;
      Runtime& rt = RuntimeFor(j);
      if (absl::Status s = Prepare(rt, j, /*with_state=*/true); !s.ok()) {
        why = StrCat("job ", j.id, "'s state does not load: ", s.message());
        break;
      }
      st[i] = &rt.job->state;
    }
    if (why.empty()) {
      const bool fresh = st[0]->step == 0 && st[0]->accumulated == 0 && st[1]->step == 0 && st[1]->accumulated == 0;
      if (fresh) {
        why = "both jobs start from scratch (no checkpoint of their joint training); as fresh jobs they may be "
              "paired again";
      } else {
        why = JointResumeProblem(a, *st[0], b, *st[1]);
      }
    }
    if (!why.empty()) {
      spdlog::info("jobs {} + {}: joint training not resumed: {}", a, b, why);
      if (absl::Status s = jobs_->EndJointTraining(a, b, StrCat("joint training not resumed after a restart: ", why));
          !s.ok()) {
        spdlog::warn("jobs {} + {}: recording the end of their joint training: {}", a, b, s.ToString());
      }
      continue;
    }
    out[a] = b;
    out[b] = a;
  }
  return out;
}

absl::Status JobRunner::PlanRound(Timestamp now) {
  const auto t0 = std::chrono::steady_clock::now();
  SLICESCHED_ASSIGN_OR_RETURN(
      jobs::ListJobsPage page,
      jobs_->List({.states = {jobs::JobState::kQueued, jobs::JobState::kRunning, jobs::JobState::kPaused},
                   .page_size = 1000}));
  const int devices = static_cast<int>(master_->config().cluster.size());
  // Measured iteration time per deployment (for jobs not yet measured).
  std::map<std::string, double> deployment_time;
  for (const auto& [id, rt] : runtimes_) {
    if (rt->iter_time_s > 0 && !rt->deployment.empty()) deployment_time[rt->deployment] = rt->iter_time_s;
  }
  std::map<uint64_t, uint64_t> joint_partner = JointPartners(page.jobs);
  std::vector<ymir::JobView> views;
  std::map<uint64_t, std::string> task_of;
  int demand = 0;
  for (const jobs::JobInfo& j : page.jobs) demand += j.spec.min_gpus;
  const int64_t now_ms = jobs_->NowUnixMs();  // the clock of submitted_unix_ms
  for (const jobs::JobInfo& j : page.jobs) {
    Runtime& rt = RuntimeFor(j);
    if (j.spec.min_gpus > devices) {
      FailJob(j.id, StrCat("gpus.min: ", j.spec.min_gpus, " devices requested, the daemon has ", devices));
      continue;
    }
    ymir::JobView v;
    v.id = j.id;
    v.backbone = j.spec.backbone;
    v.tenant = j.tenant;
    v.trust_domain = j.spec.trust_domain;
    v.allow_sharing = j.spec.allow_sharing;
    v.has_progress = j.iterations_done > 0 || rt.step() > 0 || rt.micro_index() > 0;
    if (auto jp = joint_partner.find(j.id); jp != joint_partner.end()) v.joint_partner = jp->second;
    v.min_gpus = j.spec.min_gpus;
    int64_t limit = j.iterations_target;
    if (rt.data_ready) limit = rt.iteration_limit();
    if (limit <= 0) limit = std::max<int64_t>(1, j.spec.stop.max_iterations > 0 ? j.spec.stop.max_iterations : 100);
    const int64_t done = std::max<int64_t>(j.iterations_done, rt.step());
    v.remaining_iterations = static_cast<double>(std::max<int64_t>(1, limit - done));
    double t = rt.iter_time_s;
    if (t <= 0) {
      auto d = deployment_time.find(rt.deployment);
      t = d != deployment_time.end() ? d->second : options_.default_iter_time_s;
    }
    OfferIterTimes(rt, t, devices, &v);
    v.fair_share_jct_s = v.remaining_iterations * t * std::max(1.0, static_cast<double>(demand) / devices);
    v.waited_s = std::max(0.0, static_cast<double>(now_ms - j.submitted_unix_ms) / 1000.0);
    task_of[j.id] = rt.task_key;
    views.push_back(std::move(v));
  }
  if (views.empty()) return absl::OkStatus();

  std::vector<ymir::PairEstimate> pairs;
  std::map<std::pair<uint64_t, uint64_t>, ymir::PairEstimate> by_pair;
  if (options_.planner.mode == PlannerConfig::Mode::kYmir) {
    for (const ymir::JobView& a : views) {
      for (const ymir::JobView& b : views) {
        if (a.id == b.id || decoupled_pairs_.contains(PairKey(a.id, b.id))) continue;
        double tg = 0, sg = 0;
        // A censored gain (format 2: the transfer never reached the target)
        // is only a bound: not offered, as in the simulator.
        const bool has_t = gains_->table.Plannable(task_of[a.id], task_of[b.id], ymir::Mode::kTemporal, &tg);
        const bool has_s = gains_->table.Plannable(task_of[a.id], task_of[b.id], ymir::Mode::kSpatial, &sg);
        if (!has_t && !has_s) continue;
        ymir::PairEstimate e;
        e.a = a.id;
        e.b = b.id;
        // YmirGains holds the saved fraction of iterations (LoadYmirGains
        // converted the file's definition).
        e.temporal_gain_ab = has_t ? tg : -1.0;
        e.spatial_gain = has_s ? sg : -1.0;
        e.spatial_iter_time_factor = 1.0;
        // A spatial pair's joint micro-batches run as one stream (no data
        // parallelism): priced from the one-stream times, at gpus.min.
        e.spatial_single_stream = true;
        pairs.push_back(e);
        by_pair[{a.id, b.id}] = e;
      }
    }
  }
  ymir::ClusterView cluster{.gpus = devices, .gpus_per_node = devices};
  ymir::PlannerOptions po;
  po.round_s = options_.planner.interval.ToSecondsF();
  po.time_limit_s = 5;
  SLICESCHED_ASSIGN_OR_RETURN(ymir::PlanResult plan, ymir::Plan(views, pairs, cluster, po));
  stats_.plans += 1;
  stats_.last_solve_s = plan.solve_seconds;

  // Concrete devices: keep a running job's set when it still fits, then
  // buddy-aligned blocks.
  std::vector<uint8_t> used(static_cast<size_t>(devices), 0);
  std::map<size_t, std::vector<uint32_t>> devs_of;  // assignment index -> devices
  std::vector<size_t> order;
  for (size_t i = 0; i < plan.assignments.size(); ++i) {
    if (plan.assignments[i].mode != ymir::Mode::kWait) order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return plan.assignments[a].gpus > plan.assignments[b].gpus; });
  for (size_t i : order) {
    const ymir::Assignment& a = plan.assignments[i];
    const Runtime& rt = *runtimes_.at(a.jobs[0]);
    if (rt.running && static_cast<int>(rt.plan.devices.size()) == a.gpus &&
        std::none_of(rt.plan.devices.begin(), rt.plan.devices.end(), [&](uint32_t d) { return d >= used.size() || used[d]; })) {
      for (uint32_t d : rt.plan.devices) used[d] = 1;
      devs_of[i] = rt.plan.devices;
    }
  }
  for (size_t i : order) {
    if (devs_of.contains(i)) continue;
    const int g = plan.assignments[i].gpus;
    std::vector<uint32_t> pick;
    for (int start = 0; start + g <= devices && pick.empty(); start += g) {
      bool free = true;
      for (int d = start; d < start + g; ++d) free &= !used[static_cast<size_t>(d)];
      if (free) {
        for (int d = start; d < start + g; ++d) pick.push_back(static_cast<uint32_t>(d));
      }
    }
    if (pick.empty()) {
      for (int d = 0; d < devices && static_cast<int>(pick.size()) < g; ++d) {
        if (!used[static_cast<size_t>(d)]) pick.push_back(static_cast<uint32_t>(d));
      }
    }
    for (uint32_t d : pick) used[d] = 1;
    devs_of[i] = pick;
  }

  // Apply: preemptions first (they free devices), then runs.
  for (const ymir::Assignment& a : plan.assignments) {
    if (a.mode != ymir::Mode::kWait) continue;
    for (uint64_t id : a.jobs) {
      Runtime& rt = *runtimes_.at(id);
      if (!rt.running) continue;
      auto r = jobs_->Preempt(id, "the planner gave its devices to other jobs this round");
      if (!r.ok()) {
        spdlog::warn("job {}: preempt: {}", id, r.status().ToString());
        continue;
      }
      rt.running = false;
      rt.checkpoint_due = true;
    }
  }
  for (size_t i = 0; i < plan.assignments.size(); ++i) {
    const ymir::Assignment& a = plan.assignments[i];
    if (a.mode == ymir::Mode::kWait) continue;
    jobs::RunPlan rp;
    rp.devices = devs_of[i];
    if (rp.devices.empty()) continue;
    if (a.mode == ymir::Mode::kNormal) {
      rp.mode = jobs::RunMode::kAlone;
      // A temporal target starts from its source's adapters only once the
      // source completed; run alone while the source still trains (or after
      // it failed), it starts from its own initialisation.
      // Once it did, the target runs as the temporal pair's second half
      // (mode temporal, partner = the completed source), watched by the
      // stop-loss.
      if (auto src = temporal_source_.find(a.jobs[0]); src != temporal_source_.end()) {
        auto s = jobs_->Get(src->second);
        if (!s.ok() || s->state != jobs::JobState::kCompleted) {
          temporal_source_.erase(src);
        } else {
          rp.mode = jobs::RunMode::kTemporal;
          rp.partner = src->second;
          const auto key = PairKey(a.jobs[0], src->second);
          if (!pair_watch_.contains(key)) {
            SLICESCHED_ASSIGN_OR_RETURN(ymir::StopLoss policy, ymir::StopLoss::Create(ymir::PairingMode::kTemporal));
            auto w = std::make_unique<PairWatch>(std::move(policy));
            w->members[0] = a.jobs[0];
            w->members[1] = src->second;
            pair_watch_[key] = std::move(w);
          }
        }
      }
      SLICESCHED_RETURN_IF_ERROR(ApplyPlan(a.jobs[0], rp, now));
      continue;
    }
    const uint64_t A = a.jobs[0], B = a.jobs[1];
    const ymir::PairEstimate& e = by_pair.count({A, B}) ? by_pair[{A, B}] : by_pair[{B, A}];
    if (a.mode == ymir::Mode::kTemporal) {
      rp.mode = jobs::RunMode::kTemporal;
      rp.partner = B;
      rp.predicted_gain = e.temporal_gain_ab;
      SLICESCHED_RETURN_IF_ERROR(ApplyPlan(A, rp, now));
      temporal_source_[B] = A;
      Runtime& rb = *runtimes_.at(B);
      if (rb.running) {
        auto r = jobs_->Preempt(B, StrCat("waits for its temporal source job ", A));
        if (r.ok()) {
          rb.running = false;
          rb.checkpoint_due = true;
        }
      }
    } else {
      temporal_source_.erase(A);
      temporal_source_.erase(B);
      rp.mode = jobs::RunMode::kSpatial;
      rp.predicted_gain = e.spatial_gain;
      rp.partner = B;
      SLICESCHED_RETURN_IF_ERROR(ApplyPlan(A, rp, now));
      rp.partner = A;
      SLICESCHED_RETURN_IF_ERROR(ApplyPlan(B, rp, now));
      const auto key = PairKey(A, B);
      if (!pair_watch_.contains(key)) {
        SLICESCHED_ASSIGN_OR_RETURN(ymir::StopLoss policy, ymir::StopLoss::Create(ymir::PairingMode::kSpatial));
        auto w = std::make_unique<PairWatch>(std::move(policy));
        w->members[0] = key.first;
        w->members[1] = key.second;
        pair_watch_[key] = std::move(w);
      }
    }
  }
  // Watches of pairings that ended (re-planned apart, paused, finished).
  for (auto w = pair_watch_.begin(); w != pair_watch_.end();) {
    const PairWatch& pw = *w->second;
    const jobs::RunMode mode =
        pw.policy.mode() == ymir::PairingMode::kSpatial ? jobs::RunMode::kSpatial : jobs::RunMode::kTemporal;
    auto ra = runtimes_.find(pw.members[0]);
    const bool alive = ra != runtimes_.end() && ra->second->running && ra->second->plan.mode == mode &&
                       ra->second->plan.partner == pw.members[1];
    w = alive ? std::next(w) : pair_watch_.erase(w);
  }
  SaveTimeLut();
  spdlog::info("planner ({}): {} jobs, {} candidates, {} pruned, solved in {:.3f} s",
               ToStd(PlannerModeName(options_.planner.mode)), views.size(), plan.candidates, plan.pruned,
               plan.solve_seconds);
  (void)t0;
  return absl::OkStatus();
}

void JobRunner::Prefetch(Timestamp now) {
  if (last_plan_ == Timestamp::Never()) return;
  if (now + options_.planner.prefetch < last_plan_ + options_.planner.interval) return;
  auto page = jobs_->List({.states = {jobs::JobState::kQueued, jobs::JobState::kPaused}, .page_size = 1000});
  if (!page.ok()) return;
  for (const jobs::JobInfo& j : page->jobs) {
    auto it = runtimes_.find(j.id);
    if (it == runtimes_.end() || it->second->data_ready) continue;
    Runtime& rt = *it->second;
    absl::Status s = Prepare(rt, j, /*with_state=*/false);
    if (!s.ok()) {
      FailJob(j.id, std::string(ToStd(s.message())));
      continue;
    }
    // Prepared ahead of the resume: not part of its context switch (which
    // reports prepare_data_ms 0), reported beside it.
    rt.pending_switch["prefetched_data_ms"] = rt.pending_switch["prepare_data_ms"];
    rt.pending_switch["prepare_data_ms"] = 0;
  }
}

absl::Status JobRunner::Drive(Timestamp now) {
  for (auto it = runtimes_.begin(); it != runtimes_.end();) {
    Runtime& rt = *it->second;
    const uint64_t id = rt.id;
    auto info = jobs_->Get(id);
    if (!info.ok()) return info.status();
    // 0. Profiling.
    if (info->state == jobs::JobState::kProfiling || rt.profile_job != nullptr) {
      Profile(rt, *info);
      if (rt.inflight != nullptr || rt.profile_job != nullptr) {
        ++it;
        continue;
      }
      info = jobs_->Get(id);
      if (!info.ok()) return info.status();
      if (info->state == jobs::JobState::kProfiling || info->state == jobs::JobState::kQueued) {
        ++it;
        continue;
      }
    }
    // 1. The micro-batch in flight (with data parallelism: the wave).
    if (rt.inflight != nullptr) {
      const InstanceUpdate last = WaveLast(rt);
      if (!IsTerminalInstanceState(last.state)) {
        ++it;
        continue;
      }
      rt.inflight = nullptr;
      rt.wave.clear();
      if (last.state != InstanceState::kDone) {
        stats_.steps_failed += 1;
        if (!jobs::IsTerminal(info->state)) {
          FailJob(id, StrCat("training micro-batch ", rt.micro_index(), " failed: ",
                             last.message.empty() ? std::string(ToStd(InstanceStateName(last.state))) : last.message));
        }
        ++it;
        continue;
      }
      // Per job: a joint micro-batch without this job's rows is none of its
      // micro-batches, and its time is no one-stream time of this job.
      const double ms = MsSince(rt.inflight_since);
      if (!rt.joint_without_rows) {
        stats_.steps_done += static_cast<uint64_t>(rt.wave_size);
        RecordWave(rt, ms);
      }
      rt.joint_without_rows = false;
      {
        absl::MutexLock l(&rt.job->mu);
        if (!rt.job->losses.empty()) rt.last_loss = rt.job->losses.back();
      }
      if (rt.first_step_pending) {
        rt.first_step_pending = false;
        rt.pending_switch["first_step_ms"] = ms;
        double total = 0;
        for (const char* k : {"first_step_ms", "load_checkpoint_ms", "prepare_data_ms"}) {
          auto f = rt.pending_switch.find(k);
          if (f != rt.pending_switch.end()) total += f->second;
        }
        rt.pending_switch["context_switch_ms"] = total;
        if (info->state == jobs::JobState::kRunning) {
          auto p = jobs_->ReportProgress(id, rt.step(), rt.last_loss, "", rt.pending_switch);
          if (!p.ok()) spdlog::warn("job {}: progress: {}", id, p.status().ToString());
        }
        rt.pending_switch.clear();
      }
      // Iteration boundary: an evaluation point (a multiple of
      // eval_every_steps, an epoch end, or the limit) is marked, and
      // evaluated once the job runs (a job paused at that instant is
      // evaluated on the same state when it resumes), so the evaluation
      // points never depend on scheduling.
      const int64_t step = rt.step();
      if (step > rt.inflight_step_before && IsEvalPoint(rt, step, options_.planner.eval_every_steps)) {
        rt.eval_pending = true;
      }
    }
    if (rt.eval_pending && rt.inflight == nullptr && info->state == jobs::JobState::kRunning) {
      rt.eval_pending = false;
      const int64_t step = rt.step();
      const bool at_limit = step >= rt.iteration_limit();
      double metric = 0, eval_loss = 0;
      absl::Status e = Evaluate(rt, &metric, &eval_loss);
      if (!e.ok()) {
        FailJob(id, StrCat("evaluation: ", e.message()));
        ++it;
        continue;
      }
      rt.last_eval_step = step;
      rt.last_metric = metric;
      RecordEvaluation(rt, *info, step, metric);
      const bool higher = jobs::HigherIsBetter(rt.spec.stop.metric);
      const bool reached = higher ? metric >= rt.spec.stop.target : metric <= rt.spec.stop.target;
      const double epochs = static_cast<double>(step) / static_cast<double>(rt.iterations_per_epoch());
      if (reached || at_limit) {
        SLICESCHED_RETURN_IF_ERROR(Checkpoint(rt, {{"epochs", epochs}, {"metric", metric}}));
        jobs::CompletionReport rep;
        rep.metrics[std::string(jobs::StopMetricName(rt.spec.stop.metric))] = metric;
        rep.metrics["eval_loss"] = eval_loss;
        rep.metrics["train_loss"] = rt.last_loss;
        rep.metrics["iterations"] = static_cast<double>(step);
        rep.metrics["epochs"] = epochs;
        rep.metrics["censored"] = reached ? 0.0 : 1.0;
        auto c = jobs_->Complete(id, rep);
        if (!c.ok()) spdlog::warn("job {}: complete: {}", id, c.status().ToString());
        spdlog::info("job {} completed after {} iterations ({:.2f} epochs): {} = {:.4f}{}", id, step, epochs,
                     jobs::StopMetricName(rt.spec.stop.metric), metric,
                     reached ? "" : " (censored: the limit came first)");
        rt.running = false;
        plan_requested_ = true;
        ++it;
        continue;
      }
      std::map<std::string, double> extra = {{"epochs", epochs}, {"metric", metric}, {"eval_loss", eval_loss}};
      ObservePairing(rt, *info, metric, &extra);
      auto p = jobs_->ReportProgress(id, step, rt.last_loss, "", extra);
      if (!p.ok()) spdlog::warn("job {}: progress: {}", id, p.status().ToString());
    }
    // 2. Terminal jobs leave (a temporal source's state stays for its target).
    if (jobs::IsTerminal(info->state)) {
      bool is_source = false;
      for (const auto& [target, source] : temporal_source_) is_source |= source == id;
      if (!is_source) {
        temporal_source_.erase(id);
        it = runtimes_.erase(it);
        continue;
      }
      rt.running = false;
      ++it;
      continue;
    }
    // 3. Checkpoints: left running, or the interval passed.
    if (rt.job != nullptr && (rt.checkpoint_due || (info->state == jobs::JobState::kRunning &&
                                                    rt.last_checkpoint != Timestamp::Never() &&
                                                    now - rt.last_checkpoint >= options_.planner.checkpoint_interval))) {
      SLICESCHED_RETURN_IF_ERROR(Checkpoint(rt, {}));
      rt.checkpoint_due = false;
    }
    // 4. The next micro-batch.
    if (info->state == jobs::JobState::kRunning && rt.running) {
      if (!rt.data_ready || rt.job == nullptr) {
        absl::Status s = Prepare(rt, *info, /*with_state=*/true);
        if (!s.ok()) {
          FailJob(id, std::string(ToStd(s.message())));
          ++it;
          continue;
        }
        if (rt.last_checkpoint == Timestamp::Never()) rt.last_checkpoint = now;
      }
      // A spatial pairing's stop-loss reference: the metric at its start.
      if (absl::Status s = StartPairWatch(rt, *info); !s.ok()) {
        FailJob(id, StrCat("evaluation at the start of the pairing: ", s.message()));
        ++it;
        continue;
      }
      // A spatial pair trains jointly ("Spatial joint training" below).
      if (info->plan.mode == jobs::RunMode::kSpatial) {
        SLICESCHED_RETURN_IF_ERROR(DriveSpatial(rt, *info));
        ++it;
        continue;
      }
      // Alone (or temporal) from here. A job decoupled from a spatial pair
      // between two joint micro-batches may hold a complete iteration whose
      // JointOptimizerStep waited for the partner (their grad_accumulation
      // differ; also after a restart from such a checkpoint): it takes that
      // optimizer step alone first, then continues with the next iteration.
      absl::StatusOr<bool> held = StepHeldIteration(rt);
      if (!held.ok()) {
        FailJob(id, StrCat("the optimizer step of the iteration accumulated with the spatial partner: ",
                           held.status().message()));
        ++it;
        continue;
      }
      if (*held && IsEvalPoint(rt, rt.step(), options_.planner.eval_every_steps)) {
        rt.eval_pending = true;  // evaluated (and maybe completed) in the next pass
        ++it;
        continue;
      }
      const int64_t k = rt.micro_index();
      rt.inflight_step_before = rt.step();
      rt.inflight_since = std::chrono::steady_clock::now();
      if (absl::Status sub = SubmitWave(rt, k); !sub.ok()) {
        if (absl::IsFailedPrecondition(sub) && master_->draining()) {
          ++it;
          continue;
        }
        FailJob(id, std::string(ToStd(sub.message())));
        ++it;
        continue;
      }
    }
    ++it;
  }
  return absl::OkStatus();
}

absl::Status JobRunner::Tick() {
  const Timestamp now = clock_->Now();
  SLICESCHED_RETURN_IF_ERROR(Admit());
  // A requested round waits while jobs are profiling (at most until the
  // interval is due), so jobs submitted together are planned together.
  bool profiling = false;
  if (plan_requested_) {
    auto p = jobs_->List({.states = {jobs::JobState::kProfiling}, .page_size = 1});
    profiling = p.ok() && !p->jobs.empty();
  }
  if ((plan_requested_ && !profiling) || last_plan_ == Timestamp::Never() ||
      now - last_plan_ >= options_.planner.interval) {
    plan_requested_ = false;
    last_plan_ = now;
    absl::Status s = PlanRound(now);
    if (!s.ok()) spdlog::error("planner: {}", s.ToString());
  }
  Prefetch(now);
  return Drive(now);
}

void JobRunner::WaitForProgress(absl::Duration timeout) {
  for (const auto& [id, rt] : runtimes_) {
    if (rt->inflight == nullptr) continue;
    const std::shared_ptr<InstanceRecord> rec = WaveRecordToWaitOn(*rt);
    if (rec == nullptr) return;  // the whole wave ended: the next Tick takes it
    bool closed = false;
    const size_t seen = rec->WaitFrom(0, absl::ZeroDuration(), &closed).size();
    if (!closed) (void)rec->WaitFrom(seen, timeout, &closed);
    return;
  }
  absl::MutexLock l(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&stop_), timeout);
}

void JobRunner::Start() {
  thread_ = std::thread([this] {
    for (;;) {
      {
        absl::MutexLock l(&mu_);
        if (stop_) return;
      }
      absl::Status s = Tick();
      if (!s.ok()) spdlog::error("job runner: {}", s.ToString());
      // Idle (no job known to the runner): look for arrivals 4 times a second.
      WaitForProgress(absl::Milliseconds(runtimes_.empty() ? 250 : 20));
    }
  });
}

void JobRunner::Stop(absl::Duration timeout) {
  if (stopped_) return;
  stopped_ = true;
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
  const absl::Time deadline = absl::Now() + timeout;
  for (auto& [id, rt] : runtimes_) {
    if (rt->inflight == nullptr) continue;
    std::vector<std::shared_ptr<InstanceRecord>> records = rt->wave;
    records.push_back(rt->inflight);
    for (const auto& rec : records) {
      bool closed = false;
      size_t seen = 0;
      while (!closed && !IsTerminalInstanceState(rec->Last().state) && absl::Now() < deadline) {
        auto ev = rec->WaitFrom(seen, deadline - absl::Now(), &closed);
        seen += ev.size();
      }
    }
  }
  SaveTimeLut();
  for (auto& [id, rt] : runtimes_) {
    if (rt->job == nullptr) continue;
    auto info = jobs_->Get(id);
    if (!info.ok() || jobs::IsTerminal(info->state)) continue;
    absl::Status s = Checkpoint(*rt, {});
    if (!s.ok()) spdlog::error("job {}: checkpoint at shutdown: {}", id, s.ToString());
  }
}

// ---------------------------------------------------------------------------
// Data parallelism (job_runner_dp.h): a job on g devices runs its iteration's
// micro-batches in waves of up to g / pipeline_parallel concurrent streams.

namespace {

// The combined state of the wave in flight: a record that has not ended if
// any, else the first that failed / was cancelled, else stream 0's DONE.
InstanceUpdate WaveLast(JobRunner::Runtime& rt) {
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
std::shared_ptr<InstanceRecord> WaveRecordToWaitOn(const JobRunner::Runtime& rt) {
  if (rt.inflight != nullptr && !IsTerminalInstanceState(rt.inflight->Last().state)) return rt.inflight;
  for (const auto& rec : rt.wave) {
    if (!IsTerminalInstanceState(rec->Last().state)) return rec;
  }
  return nullptr;
}

double Ema(double old, double sample) { return old <= 0 ? sample : 0.8 * old + 0.2 * sample; }

}  // namespace

absl::Status JobRunner::LoadTimeLut() {
  dp_ = std::make_unique<DpState>();
  const std::string& path = options_.planner.time_lut_path;
  if (path.empty()) return absl::OkStatus();
  dp_->has_lut = true;
  if (!std::filesystem::exists(path)) {
    spdlog::info("planner.time_lut: '{}' does not exist yet; it starts empty and is written with measured times",
                 path);
    return absl::OkStatus();
  }
  auto lut = ymir::TimeLut::Load(path);
  if (!lut.ok()) return Annotate(lut.status(), "planner.time_lut");
  dp_->lut = *std::move(lut);
  return absl::OkStatus();
}

void JobRunner::SaveTimeLut() {
  if (dp_ == nullptr || !dp_->has_lut || !dp_->lut_dirty) return;
  const std::string& path = options_.planner.time_lut_path;
  const std::string tmp = path + ".tmp";
  absl::Status s = dp_->lut.Save(tmp);
  std::error_code ec;
  if (s.ok()) std::filesystem::rename(tmp, path, ec);
  if (!s.ok() || ec) {
    spdlog::warn("planner.time_lut: writing the measured times to '{}': {}", path,
                 s.ok() ? ec.message() : s.ToString());
    return;
  }
  dp_->lut_dirty = false;
}

bool JobRunner::ProfileFromLut(Runtime& rt, const jobs::JobInfo& info) {
  if (!options_.planner.profile_from_lut || dp_ == nullptr || !dp_->has_lut) return false;
  const DpShape shape = rt.dp_shape();
  const ymir::LutKey key = DpLutKey(shape, shape.min_gpus);
  auto hit = dp_->lut.entries().find(key);  // measured keys only: no interpolation
  if (hit == dp_->lut.entries().end() || hit->second.seconds <= 0) return false;
  // The data is still loaded now (the job's first run needs it; this is
  // where profiling would have loaded it).
  if (absl::Status s = Prepare(rt, info, /*with_state=*/false); !s.ok()) {
    FailJob(rt.id, std::string(ToStd(s.message())));
    return true;
  }
  rt.iter_time_s = hit->second.seconds;
  rt.micro_s = rt.iter_time_s / static_cast<double>(DpWaves(shape, DpStreams(shape, shape.min_gpus)));
  rt.pending_switch["prepare_data_ms"] = 0;
  auto p = jobs_->ReportProgress(rt.id, info.iterations_done, info.last_loss, "",
                                 {{"profiled_iter_time_s", rt.iter_time_s},
                                  {"profile_micro_batches", 0.0},
                                  {"profile_from_lut", 1.0}});
  if (!p.ok()) spdlog::warn("job {}: profile progress: {}", rt.id, p.status().ToString());
  auto q = jobs_->Queue(rt.id, rt.iteration_limit());
  if (!q.ok()) spdlog::warn("job {}: queueing: {}", rt.id, q.status().ToString());
  spdlog::info("job {} profiled from the time LUT ({}): {:.4f} s per iteration", rt.id, key.ToString(),
               rt.iter_time_s);
  plan_requested_ = true;
  return true;
}

void JobRunner::OfferIterTimes(Runtime& rt, double min_time_s, int devices, ymir::JobView* v) {
  const DpShape shape = rt.dp_shape();
  DpInputs in;
  in.min_iter_s = min_time_s;
  in.micro_s = rt.micro_s > 0 ? rt.micro_s : min_time_s / static_cast<double>(rt.micro_per_iteration());
  in.measured_s = rt.measured_iter_s;
  in.lut = dp_ != nullptr && dp_->has_lut ? &dp_->lut : nullptr;
  if (dp_ != nullptr) {
    auto s = dp_->sync_per_stream_s.find(rt.deployment);
    if (s != dp_->sync_per_stream_s.end()) in.sync_per_stream_s = s->second;
  }
  const std::vector<DpTime> times = DpIterTimes(shape, in, devices);
  v->max_gpus = times.back().gpus;
  v->iter_time_s.assign(static_cast<size_t>(v->max_gpus) + 1, 0.0);
  for (const DpTime& t : times) v->iter_time_s[static_cast<size_t>(t.gpus)] = t.seconds;
  if (times.size() > 1) {
    std::string line;
    for (const DpTime& t : times) line += StrCat(line.empty() ? "" : ", ", t.gpus, ": ", t.seconds, " s (",
                                                 DpTimeSourceName(t.source), ")");
    spdlog::debug("job {}: iteration times offered {}", rt.id, line);
  }
}

absl::Status JobRunner::SubmitWave(Runtime& rt, int64_t k) {
  const DpShape shape = rt.dp_shape();
  const int gpus = static_cast<int>(rt.plan.devices.size());
  const int streams = DpStreams(shape, gpus);
  int64_t accumulated = 0;
  {
    absl::MutexLock l(&rt.job->mu);
    accumulated = rt.job->state.accumulated;
  }
  const auto size = static_cast<int>(std::min<int64_t>(streams, rt.micro_per_iteration() - accumulated));
  const std::vector<std::vector<uint32_t>> groups = DpStreamDevices(rt.plan.devices, shape.pipeline_parallel, size);
  rt.wave.clear();
  rt.inflight = nullptr;
  rt.wave_size = 0;
  rt.wave_gpus = gpus;
  if (accumulated == 0) {  // an iteration starts
    rt.iteration_since = rt.inflight_since;
    rt.iteration_gpus = gpus;
  } else if (rt.iteration_gpus != gpus) {
    rt.iteration_gpus = 0;  // re-planned mid-iteration: not a measurement of one count
  }
  for (int i = 0; i < static_cast<int>(groups.size()); ++i) {
    // One stream: its whole device set, as without data parallelism.
    std::vector<uint32_t> devs = groups.size() == 1 ? rt.plan.devices : groups[static_cast<size_t>(i)];
    TrainStepArgs args = MicroBatchStep(rt, k + i, rt.job, std::move(devs), StrCat("job-", rt.id, "/mb-", k + i));
    args.micro_index = k + i;
    auto rec = master_->SubmitTrainStep(std::move(args));
    if (!rec.ok()) {
      if (absl::IsFailedPrecondition(rec.status()) && master_->draining()) return rec.status();
      return absl::Status(rec.status().code(), StrCat("submitting micro-batch ", k + i, ": ", rec.status().message()));
    }
    if (rt.inflight == nullptr) {
      rt.inflight = *rec;
    } else {
      rt.wave.push_back(*rec);
    }
    rt.wave_size += 1;
  }
  return absl::OkStatus();
}

double JobRunner::SpanSeconds(const Runtime& rt, int64_t waves, double elapsed_s) const {
  return options_.span_seconds ? options_.span_seconds(rt.id, waves, elapsed_s) : elapsed_s;
}

void JobRunner::RecordWave(Runtime& rt, double ms) {
  const double s = SpanSeconds(rt, 1, ms / 1000.0);
  if (rt.wave_size == 1) {
    // A micro-batch alone: the one-stream times (the planner's gpus.min).
    rt.one_stream_samples += 1;
    rt.micro_s = Ema(rt.micro_s, s);
    rt.iter_time_s = Ema(rt.iter_time_s, s * static_cast<double>(rt.micro_per_iteration()));
  } else if (rt.micro_s > 0 && dp_ != nullptr) {
    const double extra = std::max(0.0, (s - rt.micro_s) / static_cast<double>(rt.wave_size - 1));
    double& sync = dp_->sync_per_stream_s[rt.deployment];
    sync = Ema(sync, extra);
  }
  // A whole iteration on one device count: measured, and fed to the LUT.
  if (rt.step() > rt.inflight_step_before && rt.iteration_gpus > 0 && rt.iteration_gpus == rt.wave_gpus) {
    const DpShape shape = rt.dp_shape();
    const double iter_s =
        SpanSeconds(rt, DpWaves(shape, DpStreams(shape, rt.iteration_gpus)),
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - rt.iteration_since).count());
    rt.measured_iter_s[rt.iteration_gpus] = Ema(rt.measured_iter_s[rt.iteration_gpus], iter_s);
    if (dp_ != nullptr && dp_->has_lut) {
      const ymir::LutKey key = DpLutKey(shape, rt.iteration_gpus);
      if (dp_->lut.Update(key, iter_s).ok()) dp_->lut_dirty = true;
    }
  }
  if (rt.step() > rt.inflight_step_before) rt.iteration_gpus = 0;
}

// ---------------------------------------------------------------------------
// Spatial joint training: the pair's micro-batches mix the rows of
// both jobs and run as one "<deployment>/train" instance with two task slots
// (slot 0 = the smaller job id, slot 1 = the other; llama_kernels.h), which
// accumulates each job's gradients into its own TaskState and takes one
// JointOptimizerStep once both jobs have their own grad_accumulation
// micro-batches (a job already complete for this iteration sends no rows).

bool JobRunner::CopyTaskState(uint64_t job_id, executor::TaskState* out) const {
  auto it = runtimes_.find(job_id);
  if (it == runtimes_.end() || it->second->job == nullptr) return false;
  absl::MutexLock l(&it->second->job->mu);
  *out = it->second->job->state;
  return true;
}

int64_t JobRunner::OneStreamSamples(uint64_t job_id) const {
  auto it = runtimes_.find(job_id);
  return it == runtimes_.end() ? -1 : it->second->one_stream_samples;
}

bool JobRunner::MicroBatchOf(uint64_t job_id, int64_t k, executor::TrainBatch* out) {
  auto it = runtimes_.find(job_id);
  if (it == runtimes_.end() || !it->second->data_ready) return false;
  *out = MicroBatch(*it->second, k);
  return true;
}

void JobRunner::DecoupleSpatial(uint64_t a, uint64_t b, const std::string& reason) {
  // Stored like the stop-loss's decouplings (decoupled_pairs, in the same
  // transaction), so a restarted runner does not plan and split the pair
  // again.
  auto d = jobs_->Decouple(a, reason, {}, /*never_pair_again=*/true);
  if (!d.ok()) {
    spdlog::warn("job {}: decouple: {}", a, d.status().ToString());
    return;
  }
  spdlog::info("jobs {} + {}: {}", a, b, reason);
  for (uint64_t id : {a, b}) {
    auto r = runtimes_.find(id);
    if (r == runtimes_.end()) continue;
    auto now_info = jobs_->Get(id);
    if (now_info.ok()) r->second->plan = now_info->plan;
  }
  decoupled_pairs_.insert(PairKey(a, b));
  pair_watch_.erase(PairKey(a, b));
  plan_requested_ = true;
}

absl::Status JobRunner::DriveSpatial(Runtime& rt, const jobs::JobInfo& info) {
  const uint64_t partner = info.plan.partner;
  auto pit = runtimes_.find(partner);
  if (pit == runtimes_.end()) {
    DecoupleSpatial(rt.id, partner, StrCat("spatial pairing: the runner holds no state of partner job ", partner));
    return absl::OkStatus();
  }
  // Drive visits jobs by increasing id: the larger id submits, once the
  // smaller one has finished its own pass (its step ended, evaluated).
  if (rt.id < partner) return absl::OkStatus();
  Runtime& a = *pit->second;  // slot 0
  Runtime& b = rt;            // slot 1
  SLICESCHED_ASSIGN_OR_RETURN(const jobs::JobInfo ainfo, jobs_->Get(a.id));
  if (ainfo.state != jobs::JobState::kRunning || ainfo.plan.mode != jobs::RunMode::kSpatial ||
      ainfo.plan.partner != b.id) {
    return absl::OkStatus();  // the JobManager decouples both together; wait for it
  }
  if (!a.running || a.inflight != nullptr || a.job == nullptr || !a.data_ready || a.eval_pending ||
      b.inflight != nullptr) {
    return absl::OkStatus();
  }
  const auto key = PairKey(a.id, b.id);
  if (!joint_started_.contains(key)) {
    // The pairing starts: both jobs fresh (the planner pairs only jobs
    // without progress; checked), then one shared adapter (job a's initial
    // LoRA; each keeps its own head and optimizer state).
    const jobs::Hyperparameters& ha = a.spec.hyperparameters;
    const jobs::Hyperparameters& hb = b.spec.hyperparameters;
    std::string why;
    if (a.deployment != b.deployment) {
      why = StrCat("jobs ", a.id, " and ", b.id, " train on different deployments ('", a.deployment, "', '",
                   b.deployment, "')");
    } else if (ha.lora_rank != hb.lora_rank || ha.lora_alpha != hb.lora_alpha) {
      why = StrCat("one shared adapter needs one LoRA config; job ", a.id, " has rank ", ha.lora_rank, " alpha ",
                   ha.lora_alpha, ", job ", b.id, " rank ", hb.lora_rank, " alpha ", hb.lora_alpha);
    }
    absl::Status shared = absl::OkStatus();
    int64_t resumed_step = -1;  // >= 0: a stored joint pair resumes at this step
    // A stored pair that JointPartners let the planner keep spatial: it
    // resumes the joint training of both checkpoints.
    SLICESCHED_ASSIGN_OR_RETURN(const auto stored, jobs_->JointPairs());
    if (why.empty()) {
      // Address order, as the optimizer kernel locks several jobs.
      executor::LlamaTrainJob* first = std::min(a.job.get(), b.job.get());
      executor::LlamaTrainJob* second = std::max(a.job.get(), b.job.get());
      absl::MutexLock l1(&first->mu);
      absl::MutexLock l2(&second->mu);
      const executor::TaskState &sa = a.job->state, &sb = b.job->state;
      const bool fresh = sa.step == 0 && sa.accumulated == 0 && sb.step == 0 && sb.accumulated == 0;
      if (!fresh && stored.contains(key)) {
        // A joint pair resumed after a restart from both members' checkpoints
        // (checked when planned; checked again on the states it trains).
        why = JointResumeProblem(a.id, sa, b.id, sb);
        if (why.empty()) resumed_step = sa.step;
      } else {
        for (const Runtime* r : {&a, &b}) {
          const executor::TaskState& st = r->job->state;
          if (why.empty() && (st.step > 0 || st.accumulated > 0)) {
            why = StrCat("job ", r->id, " already has progress (", st.step, " steps, ", st.accumulated,
                         " micro-batches accumulated); only fresh jobs train jointly");
          }
        }
        if (why.empty()) {
          executor::TaskState* both[] = {&a.job->state, &b.job->state};
          shared = executor::ShareLora(both);
        }
      }
    }
    if (!shared.ok()) why = StrCat("sharing the adapter failed: ", shared.message());
    if (!why.empty()) {
      DecoupleSpatial(b.id, a.id, StrCat("spatial joint training not possible: ", why));
      return absl::OkStatus();
    }
    // Stored (the store's joint pairs), so a restart can resume the pair;
    // marked started only once stored.
    SLICESCHED_RETURN_IF_ERROR(jobs_->StartJointTraining(a.id, b.id, std::max<int64_t>(resumed_step, 0),
                                                         /*resumed=*/resumed_step >= 0));
    joint_started_.insert(key);
    if (resumed_step >= 0) {
      spdlog::info("jobs {} + {}: spatial joint training resumes at step {} from both checkpoints", a.id, b.id,
                   resumed_step);
    } else {
      spdlog::info("jobs {} + {}: spatial joint training starts (shared adapter of job {})", a.id, b.id, a.id);
    }
  }
  // The rows of each job still accumulating this iteration.
  std::vector<TrainBatch> own;
  std::vector<int64_t> slots, ks;
  own.reserve(2);
  for (Runtime* r : {&a, &b}) {
    const int64_t k = r->micro_index();
    int64_t accumulated = 0;
    {
      absl::MutexLock l(&r->job->mu);
      accumulated = r->job->state.accumulated;
    }
    ks.push_back(k);
    if (accumulated >= r->micro_per_iteration()) continue;
    own.push_back(MicroBatch(*r, k));
    slots.push_back(r == &a ? 0 : 1);
  }
  std::vector<spatial::JointPart> parts;
  for (size_t i = 0; i < own.size(); ++i) parts.push_back({slots[i], &own[i]});
  auto mixed = spatial::MixMicroBatches(parts);
  if (!mixed.ok()) {
    FailJob(a.id, StrCat("joint micro-batch: ", mixed.status().message()));
    FailJob(b.id, StrCat("joint micro-batch: ", mixed.status().message()));
    return absl::OkStatus();
  }
  const std::vector<int64_t> shape = mixed->tokens.shape();
  TrainStepArgs args;
  args.deployment = a.deployment;
  args.job = a.job;
  args.partners = {b.job};
  args.batch = std::make_shared<TrainBatch>(*std::move(mixed));
  args.rows = shape[0];
  args.tokens = shape[1];
  args.rank = a.spec.hyperparameters.lora_rank;
  args.head_outputs = a.head_outputs + b.head_outputs;
  args.devices = info.plan.devices;
  args.priority = std::max(a.spec.priority, b.spec.priority);
  args.label = StrCat("job-", a.id, "+", b.id, "/mb-", ks[0], "+", ks[1]);
  const auto now = std::chrono::steady_clock::now();
  auto rec = master_->SubmitTrainStep(std::move(args));
  if (!rec.ok()) {
    if (absl::IsFailedPrecondition(rec.status()) && master_->draining()) return absl::OkStatus();
    for (Runtime* r : {&a, &b}) {
      FailJob(r->id, StrCat("submitting joint micro-batch ", ks[r == &a ? 0 : 1], " (with job ",
                            r == &a ? b.id : a.id, "): ", rec.status().message()));
    }
    return absl::OkStatus();
  }
  for (Runtime* r : {&a, &b}) {
    NotANormalRun(r->id);  // trained jointly
    r->joint_without_rows = std::find(slots.begin(), slots.end(), r == &a ? 0 : 1) == slots.end();
    // One joint stream, no data parallelism: a wave of one micro-batch that
    // is no measurement of a GPU count (joint timings stay out of the time
    // LUT and measured_iter_s; RecordWave still takes it as the job's
    // one-stream micro-batch time, as without data parallelism, when it
    // carries the job's rows).
    r->wave.clear();
    r->wave_size = 1;
    r->wave_gpus = static_cast<int>(info.plan.devices.size());
    r->iteration_gpus = 0;
    r->inflight = *rec;
    r->inflight_since = now;
    r->inflight_step_before = r->step();
  }
  return absl::OkStatus();
}

namespace {

// Jobs whose normal runs are comparable: the same task on the same
// deployment with the same data size, objective and training setup (the
// seeds may differ; SGD and AdamW runs are never compared).
std::string NormalRunKey(const JobRunner::Runtime& rt) {
  const jobs::Hyperparameters& h = rt.spec.hyperparameters;
  return StrCat(rt.deployment, "|", rt.task_key, "|", rt.train.size(), "+", rt.eval.size(), "|",
                jobs::StopMetricName(rt.spec.stop.metric), "|", h.learning_rate, "|", h.batch_size, "|",
                h.grad_accumulation, "|", h.lora_rank, "|", h.lora_alpha, "|", jobs::OptimizerName(h.optimizer),
                h.optimizer == jobs::Optimizer::kSgd ? StrCat("|", h.momentum) : std::string());
}

}  // namespace

void JobRunner::RecordEvaluation(const Runtime& rt, const jobs::JobInfo& info, int64_t step, double metric) {
  NormalRun& run = normal_runs_[rt.id];
  if (run.key.empty()) run.key = NormalRunKey(rt);
  // Normal: alone, or a temporal source (its own training); not a temporal
  // target (it started from another job's adapters), never joint
  // (DriveSpatial marks the members).
  bool target = temporal_source_.contains(rt.id);
  if (info.plan.mode == jobs::RunMode::kTemporal) {
    auto partner = jobs_->Get(info.plan.partner);
    target |= partner.ok() && partner->state == jobs::JobState::kCompleted;
  }
  if (info.plan.mode == jobs::RunMode::kSpatial || target) NotANormalRun(rt.id);
  // A job resumed from a checkpoint (after a restart) continues a normal run
  // only when the store had that run: a checkpoint alone does not say how
  // the job trained before (a decoupled pairing member, a temporal target).
  if (run.points.empty() && rt.resumed_from_checkpoint) NotANormalRun(rt.id);
  if (!run.normal) return;
  if (!run.points.empty() && run.points.back().first >= step) return;  // re-evaluated after a pause
  run.points.emplace_back(step, metric);
  // Stored, so that a restarted daemon still has the curve.
  if (absl::Status s = jobs_->RecordNormalEvaluation(rt.id, run.key, step, metric); !s.ok()) {
    spdlog::warn("job {}: storing its normal run's evaluation at step {}: {}", rt.id, step, s.ToString());
  }
}

void JobRunner::NotANormalRun(uint64_t id) {
  NormalRun& run = normal_runs_[id];
  if (!run.normal) return;
  run.normal = false;
  run.points.clear();
  if (absl::Status s = jobs_->ForgetNormalRun(id); !s.ok()) {
    spdlog::warn("job {}: forgetting its stored normal run: {}", id, s.ToString());
  }
}

double JobRunner::StopLossReference(const Runtime& rt, double start, int64_t step, uint64_t* curve_job) const {
  *curve_job = 0;
  const std::string key = NormalRunKey(rt);
  const NormalRun* best = nullptr;
  uint64_t best_id = 0;
  for (const auto& [id, run] : normal_runs_) {
    if (id == rt.id || !run.normal || run.key != key || run.points.empty()) continue;
    if (best == nullptr || run.points.back().first > best->points.back().first) {
      best = &run;
      best_id = id;
    }
  }
  if (best == nullptr) return start;
  spatial::MetricKind kind = spatial::MetricKind::kLoss;
  if (rt.spec.stop.metric == jobs::StopMetric::kAccuracy) kind = spatial::MetricKind::kAccuracy;
  if (rt.spec.stop.metric == jobs::StopMetric::kPerplexity) kind = spatial::MetricKind::kPerplexity;
  const std::optional<double> r = spatial::NormalReference(best->points, step, kind);
  if (!r.has_value()) return start;
  *curve_job = best_id;
  return jobs::HigherIsBetter(rt.spec.stop.metric) ? -*r : *r;
}

namespace {

absl::StatusOr<std::unique_ptr<TrainingRunner>> CreateJobRunner(Master* master, jobs::JobManager* jobs,
                                                                JobRunnerOptions options) {
  SLICESCHED_ASSIGN_OR_RETURN(std::unique_ptr<JobRunner> runner, JobRunner::Create(master, jobs, std::move(options)));
  return std::unique_ptr<TrainingRunner>(std::move(runner));
}

[[maybe_unused]] const bool kRegistered = RegisterTrainingRunner(&CreateJobRunner);

}  // namespace

JobRunner::~JobRunner() { Stop(); }

}  // namespace slicesched
