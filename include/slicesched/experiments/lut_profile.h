// The offline profiler of Ymir's time LUT (slicesched/ymir/time_lut.h):
// times real LoRA training iterations of a backbone on
// this machine's CPU devices over a small grid of LUT keys.
//
// What one iteration is, for a key (devices d, grad_accum ga, local_batch b,
// frozen_layers f): ga rounds; in each, d CPU "devices" (one thread each,
// one intra-op thread per device, the backbone shared read-only, as resident
// once per device in the executors) compute the gradients of their own b
// rows concurrently; every device's gradient is accumulated into the task's
// state (the data-parallel all-reduce, here a sum in host memory); then one
// AdamW step on the mean. The forward runs group by group (fusion 1); the
// backward stops above the first f decoder layers, whose LoRA factors get
// no gradient (a frozen bottom: the backward through them is skipped).
//
// AMP (amp = 1): the backbone runs in bf16 (LlamaWeights::WithDType), while
// the LoRA branch, the head, the gradients and AdamW stay f32 (train_ops.h:
// the LoRA branch is computed in f32 and cast to the model dtype): mixed
// precision with f32 master weights. Gradient checkpointing
// (grad_checkpoint = 1): during the forward a device keeps only each group's
// input hidden state, and recomputes the group's forward right before its
// backward, so at most one group's activations are alive at a time (per
// fused group of one layer; the gradients are bit-identical to keeping every
// activation, see LutDeviceGradients).
//
// Pipeline parallelism (parallelism = pipeline): the d devices are d
// stages, each a thread holding layers/d consecutive layers (d must divide
// the layers; other device counts are skipped for pipeline keys); an
// iteration is grad_accum micro-batches of local_batch rows, scheduled as
// GPipe: every micro-batch's forward flows stage to stage (stage 0 embeds,
// the last stage runs the head and the loss), then every backward flows
// back; hidden states and their gradients pass between the stages' threads
// (the pp activation transfer, in host memory); the per-micro-batch
// gradients are accumulated in micro-batch order, then one AdamW step. The
// key's fields mean what the daemon's runner writes (server/job_runner_dp.h,
// DpLutKey: devices = all the job's devices, grad_accum = micro-batches per
// iteration).
//
// What the profiler varies: devices, grad_accum, local_batch,
// frozen_layers, amp, grad_checkpoint and parallelism over the option
// lists (their product, less the pipeline keys whose device count does not
// divide the layers).
//
// Each key: `warmup` untimed iterations, then `iterations` timed ones; the
// entry is their median (samples = iterations). Times come from the
// injected clock.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "slicesched/common/clock.h"
#include "slicesched/executor/llama/llama_ops.h"
#include "slicesched/executor/train/train_ops.h"
#include "slicesched/ymir/time_lut.h"

namespace slicesched::executor {

struct LutProfileOptions {
  std::vector<int64_t> devices = {1, 2};
  std::vector<int64_t> grad_accum = {1, 2};
  std::vector<int64_t> local_batch = {4, 8, 16};
  std::vector<int64_t> frozen_layers = {0, 2};
  std::vector<int64_t> amp = {0, 1};              // 0 / 1 each
  std::vector<int64_t> grad_checkpoint = {0, 1};  // 0 / 1 each
  std::vector<ymir::Parallelism> parallelism = {ymir::Parallelism::kData, ymir::Parallelism::kPipeline};
  int64_t sequence_length = 8;
  int64_t num_classes = 2;
  int64_t lora_rank = 8;
  int64_t warmup = 1;
  int64_t iterations = 3;
  uint64_t seed = 1;
  // Every list non-empty with values >= 1 (frozen_layers >= 0 and < the
  // backbone's layers, checked by ProfileTimeLut; amp and grad_checkpoint 0
  // or 1); iterations >= 1.
  absl::Status Validate() const;
};

// What one device computes in a profiled iteration: the gradient of `batch`
// on `base` (fusion 1: one group per layer) with the bottom `frozen` layers
// frozen (no gradient, their backward skipped), with or without gradient
// checkpointing (above); the forwards it ran and the most group tapes
// (saved activations) alive at once.
struct LutDeviceGradients {
  TaskAdapters grads;
  int64_t group_forwards = 0;
  int64_t max_live_tapes = 0;
};
absl::StatusOr<LutDeviceGradients> ComputeLutDeviceGradients(const LlamaWeights& base, const TaskAdapters& params,
                                                             const TrainBatch& batch, int64_t frozen,
                                                             bool grad_checkpoint);

// A pipeline iteration's gradients (above), one TaskAdapters per
// micro-batch: `stages` threads over layers/stages consecutive groups each
// (`base` with fusion 1; stages must divide the layers), GPipe order. Each
// equals ComputeLutDeviceGradients of that micro-batch (bit-identical with
// one intra-op thread: the same operators on the same inputs). A failing
// stage fails the call (the other stages are released).
absl::StatusOr<std::vector<TaskAdapters>> ComputeLutPipelineGradients(const LlamaWeights& base,
                                                                      const TaskAdapters& params,
                                                                      std::span<const TrainBatch> micro_batches,
                                                                      int64_t stages, int64_t frozen,
                                                                      bool grad_checkpoint);

// Profiles every key of the grid (their product) on `base` (f32; the AMP
// keys on its bf16 copy).
absl::StatusOr<ymir::TimeLut> ProfileTimeLut(const LlamaWeights& base, const LutProfileOptions& options,
                                             const Clock& clock);

}  // namespace slicesched::executor
