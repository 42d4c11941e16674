// Torch-free TU: drives the training operators of train_ops.h.
#include "slicesched/executor/lut_profile.h"

#include <algorithm>
#include <thread>

#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "slicesched/executor/tensor.h"
#include "slicesched/executor/train_ops.h"

namespace slicesched::executor {
namespace {

// Seeded classification rows (tokens in [0, vocab), the class at the last position).
TrainBatch Batch(int64_t rows, int64_t seq, int64_t vocab, int64_t classes, uint64_t seed) {
  std::vector<int64_t> tokens, labels;
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  auto next = [&] {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return x;
  };
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t s = 0; s < seq; ++s) {
      tokens.push_back(static_cast<int64_t>(next() % static_cast<uint64_t>(vocab)));
      labels.push_back(s + 1 == seq ? static_cast<int64_t>(next() % static_cast<uint64_t>(classes)) : -1);
    }
  }
  TrainBatch b;
  b.tokens = Tensor::FromInt64(tokens, {rows, seq});
  b.labels = Tensor::FromInt64(labels, {rows, seq});
  return b;
}

// One training iteration of `key` (see lut_profile.h).
absl::Status Iteration(const LlamaWeights& base, TaskState& st, const ymir::LutKey& key,
                       const std::vector<TrainBatch>& batches) {
  for (int64_t round = 0; round < key.grad_accum; ++round) {
    std::vector<absl::StatusOr<TaskAdapters>> grads(static_cast<size_t>(key.devices),
                                                    absl::UnknownError("not run"));
    std::vector<std::thread> devices;
    for (int64_t d = 0; d < key.devices; ++d) {
      devices.emplace_back([&, d] {
        SetIntraOpThreadsForThisThread(1);
        const TrainBatch& b = batches[static_cast<size_t>((round * key.devices + d) % static_cast<int64_t>(batches.size()))];
        auto g = ComputeLutDeviceGradients(base, st.params, b, key.frozen_layers, key.grad_checkpoint);
        grads[static_cast<size_t>(d)] = g.ok() ? absl::StatusOr<TaskAdapters>(std::move(g->grads))
                                               : absl::StatusOr<TaskAdapters>(g.status());
      });
    }
    for (std::thread& t : devices) t.join();
    for (auto& g : grads) {
      if (!g.ok()) return g.status();
      SLICESCHED_RETURN_IF_ERROR(AccumulateGradients(st, *g));
    }
  }
  return AdamWStep(st);
}

}  // namespace

absl::StatusOr<LutDeviceGradients> ComputeLutDeviceGradients(const LlamaWeights& base, const TaskAdapters& params,
                                                             const TrainBatch& batch, int64_t frozen,
                                                             bool grad_checkpoint) {
  if (base.dims().fusion != 1) return absl::InvalidArgumentError("LUT profile: the backbone view needs fusion 1");
  const TaskAdapters* tasks[] = {&params};
  LutDeviceGradients out;
  SLICESCHED_ASSIGN_OR_RETURN(Tensor hidden, Embedding(base, batch.tokens));
  // Without checkpointing every group's tape (its activations) stays alive
  // until its backward; with it only the groups' inputs are kept.
  std::vector<std::shared_ptr<GroupTape>> tapes(static_cast<size_t>(base.num_groups()));
  std::vector<Tensor> inputs(static_cast<size_t>(base.num_groups()));
  int64_t live = 0;
  for (int64_t g = 0; g < base.num_groups(); ++g) {
    inputs[static_cast<size_t>(g)] = hidden;
    SLICESCHED_ASSIGN_OR_RETURN(GroupForwardResult f, TrainGroupForward(base, g, tasks, {}, hidden));
    ++out.group_forwards;
    if (!grad_checkpoint && g >= frozen) {
      tapes[static_cast<size_t>(g)] = f.tape;
      out.max_live_tapes = std::max(out.max_live_tapes, ++live);
    }
    hidden = f.hidden_out;
  }
  SLICESCHED_ASSIGN_OR_RETURN(HeadLossResult h, TrainHeadLoss(base, tasks, {}, hidden, batch.labels));
  SLICESCHED_ASSIGN_OR_RETURN(out.grads, TaskAdapters::ZerosLike(params));
  out.grads.head = h.d_head[0];
  Tensor d = h.d_hidden;
  for (int64_t g = base.num_groups() - 1; g >= frozen; --g) {
    std::shared_ptr<GroupTape> tape = std::move(tapes[static_cast<size_t>(g)]);
    if (grad_checkpoint) {  // recompute the group's activations from its saved input
      SLICESCHED_ASSIGN_OR_RETURN(GroupForwardResult f,
                                  TrainGroupForward(base, g, tasks, {}, inputs[static_cast<size_t>(g)]));
      ++out.group_forwards;
      tape = f.tape;
      out.max_live_tapes = std::max(out.max_live_tapes, ++live);
    }
    SLICESCHED_ASSIGN_OR_RETURN(GroupBackwardResult b, TrainGroupBackward(*tape, d));
    tape.reset();
    --live;
    d = b.d_hidden_in;
    out.grads.layers[static_cast<size_t>(g)] = b.grads[0][0];
  }
  return out;
}

absl::Status LutProfileOptions::Validate() const {
  auto positive = [](const std::vector<int64_t>& v, int64_t min) {
    return !v.empty() && std::all_of(v.begin(), v.end(), [&](int64_t x) { return x >= min; });
  };
  if (!positive(devices, 1) || !positive(grad_accum, 1) || !positive(local_batch, 1) ||
      !positive(frozen_layers, 0)) {
    return absl::InvalidArgumentError(
        "LUT profile: devices, grad_accum, local_batch need values >= 1 and frozen_layers >= 0 (none empty)");
  }
  auto flags = [](const std::vector<int64_t>& v) {
    return !v.empty() && std::all_of(v.begin(), v.end(), [](int64_t x) { return x == 0 || x == 1; });
  };
  if (!flags(amp) || !flags(grad_checkpoint)) {
    return absl::InvalidArgumentError("LUT profile: amp and grad_checkpoint need values 0 or 1 (none empty)");
  }
  if (sequence_length < 2 || num_classes < 2 || lora_rank < 1 || warmup < 0 || iterations < 1) {
    return absl::InvalidArgumentError(StrCat("LUT profile: sequence_length ", sequence_length, " (>= 2), num_classes ",
                                             num_classes, " (>= 2), lora_rank ", lora_rank, " (>= 1), warmup ",
                                             warmup, " (>= 0), iterations ", iterations, " (>= 1)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ymir::TimeLut> ProfileTimeLut(const LlamaWeights& weights, const LutProfileOptions& o,
                                             const Clock& clock) {
  SLICESCHED_RETURN_IF_ERROR(o.Validate());
  if (weights.dims().dtype != DType::kF32) return absl::InvalidArgumentError("the LUT profiler needs an f32 backbone");
  for (int64_t f : o.frozen_layers) {
    if (f >= weights.dims().layers) {
      return absl::InvalidArgumentError(StrCat("LUT profile: frozen_layers ", f, " must be < the backbone's ",
                                               weights.dims().layers, " layers"));
    }
  }
  SLICESCHED_ASSIGN_OR_RETURN(std::shared_ptr<const LlamaWeights> f32, weights.WithFusion(1));
  std::shared_ptr<const LlamaWeights> bf16;
  if (std::find(o.amp.begin(), o.amp.end(), 1) != o.amp.end()) {
    SLICESCHED_ASSIGN_OR_RETURN(bf16, f32->WithDType(DType::kBF16));
  }
  const LlamaDims& dims = f32->dims();
  std::vector<ymir::LutKey> keys;
  for (int64_t amp : o.amp) {
    for (int64_t ckpt : o.grad_checkpoint) {
      for (int64_t d : o.devices) {
        for (int64_t ga : o.grad_accum) {
          for (int64_t b : o.local_batch) {
            for (int64_t f : o.frozen_layers) {
              keys.push_back({.devices = d, .grad_accum = ga, .local_batch = b, .frozen_layers = f,
                              .amp = amp == 1, .grad_checkpoint = ckpt == 1});
            }
          }
        }
      }
    }
  }
  ymir::TimeLut lut;
  for (const ymir::LutKey& key : keys) {
    const LlamaWeights& base = key.amp ? *bf16 : *f32;
    std::vector<TrainBatch> batches;
    for (int64_t i = 0; i < key.devices * key.grad_accum; ++i) {
      batches.push_back(
          Batch(key.local_batch, o.sequence_length, dims.vocab, o.num_classes, o.seed + static_cast<uint64_t>(i)));
    }
    SLICESCHED_ASSIGN_OR_RETURN(TaskState st, TaskState::Init(dims, LoraConfig{.rank = o.lora_rank, .alpha = 8.0},
                                                              o.num_classes, o.seed, AdamWOptions{.lr = 1e-3}));
    for (int64_t w = 0; w < o.warmup; ++w) SLICESCHED_RETURN_IF_ERROR(Iteration(base, st, key, batches));
    std::vector<double> times;
    for (int64_t it = 0; it < o.iterations; ++it) {
      const Timestamp t0 = clock.Now();
      SLICESCHED_RETURN_IF_ERROR(Iteration(base, st, key, batches));
      times.push_back((clock.Now() - t0).ToSecondsF());
    }
    std::sort(times.begin(), times.end());
    const double median = times[times.size() / 2];
    SLICESCHED_RETURN_IF_ERROR(lut.Set(key, std::max(median, 1e-9), o.iterations));
  }
  return lut;
}

}  // namespace slicesched::executor
