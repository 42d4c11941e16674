// The simulator-fidelity experiment (paper Table 2, §5.3): how well the
// what-if simulator predicts the time of one iteration that the real
// executors then run.
//
// Setup: a Llama preset (default "tiny") on two CPU devices, every instance
// placed by its template's "pp2" partition (the first half of the fused
// groups with the embedding on device 0, the rest with the head, loss and
// optimizer on device 1), run by the ExecutorSet with the LlamaKernelRunner
// and the LlamaTransferBackend (real LibTorch operators, real transfers).
// Two kinds of iteration alternate, each starting on idle executors:
//   training  one "<name>/train" micro-batch of a LoRA fine-tuning job
//             (forward, loss, backward, optimizer; AdamW every iteration);
//   serving   one prefill of a new conversation plus one decode step of each
//             conversation still generating (their KV checkpoints live on
//             both devices), all submitted at once, as a continuous-batching
//             iteration; a conversation leaves after `decode_steps` steps
//             and its checkpoints are released.
// Protocol, per iteration: instantiate and issue its instances (pp2), take a
// GMG snapshot, build a Simulator from it and run it: the prediction is the
// latest predicted completion of the iteration's instances minus the
// snapshot time. Then hand the nodes to the executors and run them to
// retirement: the measurement is the latest end of any of the iteration's
// operators or transfers (executor feedback) minus the time just before the
// first node was handed over. Every feedback record is fed to an
// OnlineLearner (operator and transfer estimators + RuntimeCalibration), so
// the estimators keep learning as the master's would; predictions are always
// made before the iteration runs. The first `warmup` iterations of each kind
// are run and forgotten (their feedback goes nowhere), the next
// `calibration` of each kind only train the estimators (untimed), and the
// next `iterations` of each kind are scored.
// Errors: error_pct = |mean predicted - mean measured| / mean measured (the
// Table 2 figure, per kind and overall), and mean_abs_error_pct = the mean of
// the per-iteration |predicted - measured| / measured. Nothing is tuned to
// the target: the report says whether the 2% target is met
// (docs/results.md explains why it is not on a shared 2-vCPU machine).
//
// Torch-free header; the implementation links the LibTorch executors
// (library slicesched::executor_experiments, built with LibTorch only).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "slicesched/estimate/calibration.h"

namespace slicesched {

struct FidelityOptions {
  std::string model = "tiny";  // a Llama preset: tiny, small
  // "cpu", or "cuda": the two devices are two logical cuda devices sharing
  // GPU 0 (FailedPrecondition where this process cannot use it).
  std::string device = "cpu";
  // Iterations of each kind run first and not learned from: LibTorch's lazy
  // initialisation, first-call allocations and cold caches make them up to
  // 100x slower than the steady state they would otherwise teach.
  int warmup = 2;
  int calibration = 20;        // then untimed iterations of each kind, learned from
  int iterations = 150;        // then scored iterations of each kind
  uint64_t seed = 1;           // weights, adapters, prompts
  // Training micro-batch: rows x tokens, LoRA rank, head outputs (classes).
  int64_t train_batch = 4;
  int64_t train_tokens = 32;
  int64_t lora_rank = 8;
  int64_t head_outputs = 3;
  // Serving: prompt length of each new conversation, decode steps each.
  int64_t prompt_tokens = 32;
  int decode_steps = 4;  // 0: each conversation is a prefill only
  // The calibration's drift weight per sample (calibration.h); 0 turns the
  // common-mode drift off (the estimators alone follow the machine's speed).
  double drift_smoothing = RuntimeCalibration::kDefaultDriftSmoothing;
  // InvalidArgument naming the option (as slicesim fidelity's flag, else the
  // field) and its value: device cpu or cuda, iterations >= 1, warmup, calibration and
  // decode_steps >= 0, train_batch, train_tokens, prompt_tokens, lora_rank
  // and head_outputs >= 1, drift_smoothing in [0, 1]. RunFidelity checks it
  // first.
  absl::Status Validate() const;
};

struct FidelityKindResult {
  int64_t iterations = 0;
  double predicted_ms = 0;        // mean per iteration
  double measured_ms = 0;         // mean per iteration
  double error_pct = 0;           // |predicted - measured| / measured of the means
  double mean_abs_error_pct = 0;  // mean of per-iteration |pred - meas| / meas
  std::vector<double> predicted_runs_ms, measured_runs_ms;
  // Diagnostics of what the simulator does not model: per cross-device
  // transfer, the measured time from its producer's end to the transfer's
  // start (the owner applying the completion and arbitrating) and from the
  // transfer's end to its consumer's start (the owner applying it and handing
  // the consumer to its device, plus any queueing there). The learner feeds
  // the executors' measurements of these hand-offs (Feedback::handoff) to
  // the transfer estimator, which adds their running means to every hop it
  // predicts, so the simulator's predictions include them.
  double transfers_per_iteration = 0;
  double launch_gap_ms = 0;    // mean per transfer
  double delivery_gap_ms = 0;  // mean per transfer
  std::vector<double> launch_gaps_ms, delivery_gaps_ms;  // per transfer (not in the JSON)
};

// One operator (template/op) or hop over the scored iterations: the
// simulator's predicted duration of the node against the executors'. A hop
// ("hop cpuA -> cpuB to <consumer template/op>") runs from the transfer's
// start to its consumer's start (link time plus the master's hand-off gaps,
// plus any queueing).
struct FidelityOpStat {
  std::string name;
  int device = 0;  // where it runs (a hop: its source)
  int64_t samples = 0;
  double predicted_ms = 0;  // mean
  double measured_ms = 0;   // mean
  double mape_pct = 0;      // mean of |predicted - measured| / measured
};

struct FidelityResult {
  std::string model;
  std::string device;  // "cpu" or "cuda"
  std::string placement;
  int devices = 0;
  int warmup = 0;
  int calibration = 0;
  FidelityKindResult train, serve, overall;
  // Online MAPE of the estimators over the scored phase (each prediction
  // made before the observation).
  double op_mape_pct = 0;
  double transfer_mape_pct = 0;
  // The simulator's per-operator error weighted by duration: sum of
  // |predicted - measured| / sum of measured over every scored operator.
  // MAPE counts a 5 us operator inflated 100x by a preemption like a 20 ms
  // one; this is the error that reaches an iteration's time.
  double op_wape_pct = 0;
  // The hand-off time the transfer estimator adds to a hop (launch plus
  // delivery gap) at the end of the run: device 0 -> 1 and 1 -> 0.
  double learned_handoff_01_ms = 0;
  double learned_handoff_10_ms = 0;
  // RuntimeCalibration at the end of the run.
  std::vector<double> device_factors;  // as the simulator used them: relative x drift
  double drift_factor = 1.0;           // the devices' (one type's) drift at the end
  double overlap_factor = 1.0, transfer_overlap_factor = 1.0;
  std::vector<FidelityOpStat> ops;  // by name
  double target_error_pct = 2.0;  // the paper reports 1.83%

  std::string ToJson() const;
};

absl::StatusOr<FidelityResult> RunFidelity(const FidelityOptions& options);

}  // namespace slicesched
