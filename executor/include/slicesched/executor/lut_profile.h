// The offline profiler of Ymir's time LUT (slicesched/ymir/time_lut.h; issue
// 7, deliverable 4): times real LoRA training iterations of a backbone on
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
// What the profiler varies: devices, grad_accum, local_batch and
// frozen_layers over the option lists. It does NOT vary AMP (the CPU build
// trains in f32), gradient checkpointing (train_ops.h keeps every
// activation) or parallelism (data parallel only): those keys are recorded
// as amp = 0, grad_checkpoint = 0, parallelism = data, and lookups with other
// values are NotFound until measured (e.g. by online feedback).
//
// Each key: `warmup` untimed iterations, then `iterations` timed ones; the
// entry is their median (samples = iterations). Times come from the
// injected clock.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "slicesched/common/clock.h"
#include "slicesched/executor/llama_ops.h"
#include "slicesched/ymir/time_lut.h"

namespace slicesched::executor {

struct LutProfileOptions {
  std::vector<int64_t> devices = {1, 2};
  std::vector<int64_t> grad_accum = {1, 2};
  std::vector<int64_t> local_batch = {4, 8, 16};
  std::vector<int64_t> frozen_layers = {0, 2};
  int64_t sequence_length = 8;
  int64_t num_classes = 2;
  int64_t lora_rank = 8;
  int64_t warmup = 1;
  int64_t iterations = 3;
  uint64_t seed = 1;
  // Every list non-empty with values >= 1 (frozen_layers >= 0 and < the
  // backbone's layers, checked by ProfileTimeLut); iterations >= 1.
  absl::Status Validate() const;
};

// Profiles every key of the grid (their product) on `base` (f32).
absl::StatusOr<ymir::TimeLut> ProfileTimeLut(const LlamaWeights& base, const LutProfileOptions& options,
                                             const Clock& clock);

}  // namespace slicesched::executor
