// A briefly pre-trained tiny backbone: language
// modelling on the synthetic language of slicesched/synth/tasks.h, or on a
// real corpus (WordNet's glosses, synth/wordnet.h), so that
// the backbone the fine-tuning experiments share has seen the language its
// tasks are written in (`slicesim make-backbone`).
//
// Method: repeated merged LoRA (ReLoRA-style), built only from the training
// operators of train_ops.h, so no extra LibTorch code and no autograd on the
// base weights. Each of `rounds` rounds
//
//   1. starts a fresh next-token task whose head is a copy of the current
//      lm_head (the head of train_ops.h is exactly the LM head: a linear map
//      after the backbone's final RMSNorm) and fresh LoRA factors
//      (seed + round) on every layer's q and v projections;
//   2. trains it with AdamW for `steps_per_round` steps on batches of
//      language sentences (next-token labels on every position);
//   3. merges it into the backbone: W_q += s B_q A_q, W_v += s B_v A_v
//      (s = alpha / rank, computed in f64, stored in the model dtype), and
//      lm_head = the trained head.
//
// So the pretraining updates q_proj, v_proj and lm_head of the backbone
// (rank `lora_rank` per round, up to rounds x lora_rank in total); the
// embeddings, k/o projections, MLPs and norms keep their seeded values.
// That is a deliberate, documented limit: enough to make the backbone a
// language model of the synthetic language in seconds on one core.
//
// Determinism: the same options give bit-identical weights (seeded
// generators, one intra-op thread for this call's thread). Needs an f32
// model (the tiny preset); other dtypes are InvalidArgument.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "slicesched/executor/llama/llama_ops.h"
#include "slicesched/gmg/llama.h"
#include "slicesched/synth/tasks.h"
#include "slicesched/synth/wordnet.h"

namespace slicesched::executor {

// How the backbone learns. kMergedLora: each round trains LoRA factors on
// the attention's q and v and the LM head, then merges them (the embeddings
// and MLPs keep their random init). kFull: every weight learns by AdamW
// (FullModelTrainer, executor/train/full_train.h); rounds only group the
// steps for the loss curve.
enum class PretrainMethod : uint8_t { kMergedLora, kFull };

struct PretrainOptions {
  PretrainMethod method = PretrainMethod::kMergedLora;
  uint64_t seed = 1;  // backbone init (LlamaWeights::FromSeed), LoRA inits and batches
  int64_t rounds = 4;
  int64_t steps_per_round = 40;
  int64_t batch_size = 16;
  int64_t sequence_length = 32;
  int64_t lora_rank = 16;
  double lora_alpha = 16.0;
  double learning_rate = 1e-2;
  int64_t eval_sentences = 64;  // held-out sentences for the eval loss
  synth::LanguageOptions language;
  // A real corpus instead of the synthetic language: its token stream (ids
  // below the model's vocab) is cut into windows of sequence_length; every
  // window whose index is 0 mod 16 is held out for the eval loss (the first
  // eval_sentences of them), the rest are sampled for training. Empty: the
  // synthetic language.
  std::vector<int64_t> corpus_tokens;
  absl::Status Validate() const;
};

// WordNet's noun glosses as one token stream for PretrainOptions::
// corpus_tokens: each gloss's word tokens (synth/wordnet.h, vocabulary of
// `vocab` ids), in synset order, each followed by kWordNetPad as a separator.
std::vector<int64_t> WordNetGlossStream(const synth::WordNetCorpus& corpus);

struct PretrainResult {
  std::shared_ptr<const LlamaWeights> weights;
  std::vector<double> train_loss;  // per step, over all rounds
  double initial_eval_loss = 0;    // next-token CE of the seeded backbone on held-out sentences
  double final_eval_loss = 0;      // the same after pretraining
};

absl::StatusOr<PretrainResult> PretrainBackbone(const LlamaDims& dims,
                                                const PretrainOptions& options);

// The content key of a pretraining: a hash of the model's dimensions, every
// option and the corpus's tokens, with a version of the procedure. Pretraining
// is deterministic, so two runs with the same key give the same bytes.
std::string PretrainKey(const LlamaDims& dims, const PretrainOptions& options);

// PretrainBackbone through a cache of backbones by content key: reads
// CACHE_DIR/backbone-<key>.safetensors when it is there (the losses come from
// its metadata) and otherwise pretrains and writes it (a temporary file
// renamed into place, so a crash leaves no partial entry). *hit says which.
// A cache entry that cannot be read is reported by path, not replaced.
absl::StatusOr<PretrainResult> PretrainBackboneCached(const LlamaDims& dims, const PretrainOptions& options,
                                                      const std::string& cache_dir, bool* hit = nullptr);

// The metadata make-backbone and the cache write beside the weights: the
// model, the procedure, its key and the losses.
std::map<std::string, std::string> PretrainMetadata(const LlamaDims& dims, const PretrainOptions& options,
                                                    const PretrainResult& result);

// Mean next-token cross-entropy of the backbone itself (its lm_head) on
// `sentences` (all of one length >= 2).
absl::StatusOr<double> LanguageModelLoss(const LlamaWeights& weights,
                                         const std::vector<std::vector<int64_t>>& sentences);

// Builds LlamaWeights from tensors under their HuggingFace names (in any
// order; every name of LlamaWeights::NamedTensors must be present) by way of
// a temporary safetensors file in `scratch_dir`.
absl::StatusOr<std::shared_ptr<const LlamaWeights>> WeightsFromTensors(
    const LlamaDims& dims, const std::vector<std::pair<std::string, Tensor>>& tensors,
    const std::string& scratch_dir, const LlamaOptions& options = {});

}  // namespace slicesched::executor
