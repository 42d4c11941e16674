// Full-parameter language-model training of a Llama backbone: every weight
// (token embeddings, attention and MLP projections, norms and the LM head)
// learns by AdamW on next-token cross-entropy. It exists to pretrain a
// backbone of our own (experiments/pretrain.h): LoRA rounds merged into the
// backbone move only the attention's q and v projections and the head, so
// the embeddings and MLPs stay at their random init and a word-level
// vocabulary of thousands stays out of reach.
//
// The fine-tuning runtime (train_ops.h) never uses this: its backbone is
// frozen and shared. Here the trainer owns a private copy of the weights
// (f32, on the CPU) and hands out snapshots as LlamaWeights. Deterministic:
// the same weights, batches and options give bit-identical results on one
// intra-op thread.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "slicesched/executor/llama/llama_ops.h"
#include "slicesched/executor/train/train_ops.h"

namespace slicesched::executor {

class FullModelTrainer {
 public:
  // Starts from a copy of `init` (an f32 model). The options' weight decay
  // applies to every matrix, not to the norms' gains.
  static absl::StatusOr<FullModelTrainer> Create(const LlamaWeights& init, const AdamWOptions& adamw);
  FullModelTrainer(FullModelTrainer&&) noexcept;
  FullModelTrainer& operator=(FullModelTrainer&&) noexcept;
  ~FullModelTrainer();

  // One AdamW step on int64 `tokens` [B, S] (S >= 2, ids below the vocab):
  // the mean next-token cross-entropy over the B x (S - 1) predicted
  // positions, before the step.
  absl::StatusOr<double> Step(const Tensor& tokens);
  // The learning rate of the steps that follow (a schedule).
  void set_learning_rate(double lr);
  int64_t steps() const;

  // The current weights under their HuggingFace names (LlamaWeights::
  // NamedTensors order), copies that later steps do not change.
  std::vector<std::pair<std::string, Tensor>> NamedTensors() const;

 private:
  struct Impl;
  explicit FullModelTrainer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace slicesched::executor
