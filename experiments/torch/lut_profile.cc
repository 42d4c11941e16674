// Torch-free TU: drives the training operators of train_ops.h.
#include "slicesched/experiments/lut_profile.h"

#include <algorithm>
#include <deque>
#include <memory>
#include <span>
#include <thread>

#include "absl/synchronization/mutex.h"

#include "slicesched/common/option_checks.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "slicesched/executor/torch/tensor.h"
#include "slicesched/executor/train/train_ops.h"

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

// One pipeline stage's groups [g0, g1) on one micro-batch: the forward
// keeps what the backward needs (the groups' tapes, or with checkpointing
// only their inputs, the tapes remade right before each backward); the
// backward fills the gradients of the stage's unfrozen groups and returns
// d(input), undefined when the backward stopped above a frozen layer.
// `counters` counts the group forwards and the tapes alive at once.
class StageRun {
 public:
  StageRun(const LlamaWeights& base, const TaskAdapters& params, int64_t g0, int64_t g1, int64_t frozen,
           bool grad_checkpoint, LutDeviceGradients* counters)
      : base_(base), params_(params), g0_(g0), g1_(g1), frozen_(frozen), ckpt_(grad_checkpoint), counters_(counters) {}

  absl::StatusOr<Tensor> Forward(Tensor hidden) {
    const TaskAdapters* tasks[] = {&params_};
    for (int64_t g = g0_; g < g1_; ++g) {
      inputs_.push_back(hidden);
      SLICESCHED_ASSIGN_OR_RETURN(GroupForwardResult f, TrainGroupForward(base_, g, tasks, {}, hidden));
      ++counters_->group_forwards;
      tapes_.push_back(nullptr);
      if (!ckpt_ && g >= frozen_) {  // without checkpointing the activations stay alive
        tapes_.back() = f.tape;
        Alive(+1);
      }
      hidden = f.hidden_out;
    }
    if (!ckpt_) inputs_.clear();  // with checkpointing the groups' inputs are all that is kept
    return hidden;
  }

  absl::StatusOr<Tensor> Backward(Tensor d, TaskAdapters* grads) {
    const TaskAdapters* tasks[] = {&params_};
    for (int64_t g = g1_ - 1; g >= std::max(g0_, frozen_); --g) {
      const size_t i = static_cast<size_t>(g - g0_);
      std::shared_ptr<GroupTape> tape = std::move(tapes_[i]);
      if (ckpt_) {  // recompute the group's activations from its saved input
        SLICESCHED_ASSIGN_OR_RETURN(GroupForwardResult f, TrainGroupForward(base_, g, tasks, {}, inputs_[i]));
        ++counters_->group_forwards;
        tape = f.tape;
        Alive(+1);
      }
      SLICESCHED_ASSIGN_OR_RETURN(GroupBackwardResult b, TrainGroupBackward(*tape, d));
      tape.reset();
      Alive(-1);
      d = b.d_hidden_in;
      grads->layers[static_cast<size_t>(g)] = b.grads[0][0];
    }
    return g0_ >= frozen_ ? d : Tensor();
  }

 private:
  void Alive(int delta) {
    live_ += delta;
    counters_->max_live_tapes = std::max(counters_->max_live_tapes, live_);
  }

  const LlamaWeights& base_;
  const TaskAdapters& params_;
  const int64_t g0_, g1_, frozen_;
  const bool ckpt_;
  LutDeviceGradients* counters_;
  std::vector<std::shared_ptr<GroupTape>> tapes_;
  std::vector<Tensor> inputs_;
  int64_t live_ = 0;
};

// Hidden states (or their gradients) between two pipeline stages, in order.
class Channel {
 public:
  void Push(Tensor t) {
    absl::MutexLock l(&mu_);
    queue_.push_back(std::move(t));
  }
  // The next tensor; Aborted once closed (another stage failed).
  absl::StatusOr<Tensor> Pop() {
    absl::MutexLock l(&mu_);
    mu_.Await(absl::Condition(+[](Channel* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->mu_) {
      return c->closed_ || !c->queue_.empty();
    }, this));
    if (queue_.empty()) return absl::AbortedError("LUT profile: another pipeline stage failed");
    Tensor t = std::move(queue_.front());
    queue_.pop_front();
    return t;
  }
  void Close() {
    absl::MutexLock l(&mu_);
    closed_ = true;
  }

 private:
  absl::Mutex mu_;
  std::deque<Tensor> queue_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

// One training iteration of `key` (see lut_profile.h).
absl::Status Iteration(const LlamaWeights& base, TaskState& st, const ymir::LutKey& key,
                       const std::vector<TrainBatch>& batches) {
  if (key.parallelism == ymir::Parallelism::kPipeline) {
    SLICESCHED_ASSIGN_OR_RETURN(std::vector<TaskAdapters> grads,
                                ComputeLutPipelineGradients(base, st.params, batches, key.devices, key.frozen_layers,
                                                            key.grad_checkpoint));
    for (const TaskAdapters& g : grads) SLICESCHED_RETURN_IF_ERROR(AccumulateGradients(st, g));
    return AdamWStep(st);
  }
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
  StageRun all(base, params, 0, base.num_groups(), frozen, grad_checkpoint, &out);
  SLICESCHED_ASSIGN_OR_RETURN(Tensor hidden, Embedding(base, batch.tokens));
  SLICESCHED_ASSIGN_OR_RETURN(hidden, all.Forward(std::move(hidden)));
  SLICESCHED_ASSIGN_OR_RETURN(HeadLossResult h, TrainHeadLoss(base, tasks, {}, hidden, batch.labels));
  SLICESCHED_ASSIGN_OR_RETURN(out.grads, TaskAdapters::ZerosLike(params));
  out.grads.head = h.d_head[0];
  SLICESCHED_RETURN_IF_ERROR(all.Backward(h.d_hidden, &out.grads).status());
  return out;
}

absl::StatusOr<std::vector<TaskAdapters>> ComputeLutPipelineGradients(const LlamaWeights& base,
                                                                      const TaskAdapters& params,
                                                                      std::span<const TrainBatch> micro_batches,
                                                                      int64_t stages, int64_t frozen,
                                                                      bool grad_checkpoint) {
  if (base.dims().fusion != 1) return absl::InvalidArgumentError("LUT profile: the backbone view needs fusion 1");
  const int64_t groups = base.num_groups();
  if (stages < 1 || groups % stages != 0) {
    return absl::InvalidArgumentError(StrCat("LUT profile: pipeline parallelism over ", stages,
                                             " devices needs a device count that divides the backbone's ", groups,
                                             " layers"));
  }
  if (micro_batches.empty()) return absl::InvalidArgumentError("LUT profile: a pipeline iteration needs micro-batches");
  const size_t m_count = micro_batches.size();
  const int64_t per = groups / stages;
  std::vector<TaskAdapters> grads;
  for (size_t m = 0; m < m_count; ++m) {
    SLICESCHED_ASSIGN_OR_RETURN(TaskAdapters g, TaskAdapters::ZerosLike(params));
    grads.push_back(std::move(g));
  }
  // forward[s]: stage s's inputs from stage s - 1; backward[s]: stage s's
  // output gradients from stage s + 1.
  std::vector<std::unique_ptr<Channel>> forward(static_cast<size_t>(stages)), backward(static_cast<size_t>(stages));
  for (int64_t s = 0; s < stages; ++s) {
    forward[static_cast<size_t>(s)] = std::make_unique<Channel>();
    backward[static_cast<size_t>(s)] = std::make_unique<Channel>();
  }
  std::vector<absl::Status> status(static_cast<size_t>(stages));
  std::vector<LutDeviceGradients> counters(static_cast<size_t>(stages));
  auto stage = [&](int64_t s) -> absl::Status {
    SetIntraOpThreadsForThisThread(1);
    const int64_t g0 = s * per, g1 = g0 + per;
    const bool last = s + 1 == stages;
    const bool below_trains = s > 0 && g0 > frozen;  // stage s - 1 has an unfrozen group
    const TaskAdapters* tasks[] = {&params};
    std::vector<std::unique_ptr<StageRun>> runs;
    std::vector<Tensor> d_out(m_count);
    for (size_t m = 0; m < m_count; ++m) {  // GPipe: every micro-batch's forward, then the backwards
      Tensor hidden;
      if (s == 0) {
        SLICESCHED_ASSIGN_OR_RETURN(hidden, Embedding(base, micro_batches[m].tokens));
      } else {
        SLICESCHED_ASSIGN_OR_RETURN(hidden, forward[static_cast<size_t>(s)]->Pop());
      }
      runs.push_back(std::make_unique<StageRun>(base, params, g0, g1, frozen, grad_checkpoint,
                                                &counters[static_cast<size_t>(s)]));
      SLICESCHED_ASSIGN_OR_RETURN(hidden, runs.back()->Forward(std::move(hidden)));
      if (last) {
        SLICESCHED_ASSIGN_OR_RETURN(HeadLossResult h, TrainHeadLoss(base, tasks, {}, hidden, micro_batches[m].labels));
        grads[m].head = h.d_head[0];
        d_out[m] = h.d_hidden;
      } else {
        forward[static_cast<size_t>(s + 1)]->Push(std::move(hidden));
      }
    }
    if (g1 <= frozen) return absl::OkStatus();  // a frozen stage: no backward
    for (size_t m = 0; m < m_count; ++m) {
      Tensor d;
      if (last) {
        d = d_out[m];
      } else {
        SLICESCHED_ASSIGN_OR_RETURN(d, backward[static_cast<size_t>(s)]->Pop());
      }
      SLICESCHED_ASSIGN_OR_RETURN(Tensor d_in, runs[m]->Backward(std::move(d), &grads[m]));
      runs[m].reset();
      if (below_trains) backward[static_cast<size_t>(s - 1)]->Push(std::move(d_in));
    }
    return absl::OkStatus();
  };
  std::vector<std::thread> threads;
  for (int64_t s = 0; s < stages; ++s) {
    threads.emplace_back([&, s] {
      status[static_cast<size_t>(s)] = stage(s);
      // A failed stage closes every channel, so no other stage waits forever.
      if (!status[static_cast<size_t>(s)].ok()) {
        for (auto& c : forward) c->Close();
        for (auto& c : backward) c->Close();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& st : status) SLICESCHED_RETURN_IF_ERROR(st);
  return grads;
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
  if (parallelism.empty()) return absl::InvalidArgumentError("LUT profile: parallelism needs data and/or pipeline");
  for (const auto& [name, values] : {std::pair<const char*, const std::vector<int64_t>*>{"amp", &amp},
                                     std::pair<const char*, const std::vector<int64_t>*>{"grad_checkpoint",
                                                                                         &grad_checkpoint}}) {
    if (values->empty()) return absl::InvalidArgumentError(StrCat("LUT profile: ", name, " needs a value"));
    for (int64_t x : *values) {
      if (x != 0 && x != 1) {
        return absl::InvalidArgumentError(StrCat("LUT profile: ", name, " values must be 0 or 1, got '", x, "'"));
      }
    }
  }
  return CheckAtLeast({{"sequence_length", 2, sequence_length},
                       {"num_classes", 2, num_classes},
                       {"lora_rank", 1, lora_rank},
                       {"warmup", 0, warmup},
                       {"iterations", 1, iterations}},
                      "LUT profile: ");
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
  for (ymir::Parallelism par : o.parallelism) {
    for (int64_t amp : o.amp) {
      for (int64_t ckpt : o.grad_checkpoint) {
        for (int64_t d : o.devices) {
          // Pipeline stages split the layers evenly: other counts are skipped.
          if (par == ymir::Parallelism::kPipeline && dims.layers % d != 0) continue;
          for (int64_t ga : o.grad_accum) {
            for (int64_t b : o.local_batch) {
              for (int64_t f : o.frozen_layers) {
                keys.push_back({.devices = d, .grad_accum = ga, .local_batch = b, .frozen_layers = f,
                                .amp = amp == 1, .grad_checkpoint = ckpt == 1, .parallelism = par});
              }
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
    // Data: every device's micro-batch of every round; pipeline: the
    // iteration's micro-batches, each through every stage.
    const int64_t micro = key.parallelism == ymir::Parallelism::kPipeline ? key.grad_accum
                                                                          : key.devices * key.grad_accum;
    for (int64_t i = 0; i < micro; ++i) {
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
