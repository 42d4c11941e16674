// The executor's operator library for Llama-family models (paper §3.5, §4):
// an embedding, fused groups of decoder layers with a KV cache, the LM head
// and sampling, plus an independent reference forward pass for tests.
//
// Every function returns absl::Status/StatusOr and never throws: LibTorch
// exceptions are caught at this boundary and come back as Internal (or
// ResourceExhausted for allocation failures). Inputs are validated first
// (InvalidArgument / OutOfRange with the expected and actual shapes). All
// computation runs under c10::InferenceMode on the CPU.
//
// Numerics follow HuggingFace's LlamaForCausalLM: RMSNorm (x * rsqrt(mean
// x^2 + eps) * w, computed in f32), rotary embeddings in the rotate-half
// layout with theta = options.rope_theta (Llama 3's frequency rescaling for
// long contexts is not applied), grouped-query attention with causal masking,
// SwiGLU MLP, untied LM head.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "slicesched/common/units.h"
#include "slicesched/executor/torch/device.h"
#include "slicesched/executor/torch/tensor.h"
#include "slicesched/gmg/llama.h"

namespace slicesched::executor {

struct LlamaOptions {
  double rope_theta = 500000.0;  // Llama 3
  double rms_eps = 1e-5;
};

// The parameters of one decoder layer, HuggingFace layout (out x in).
struct LlamaLayerWeights {
  Tensor q_proj;                    // [heads*head_dim, hidden]
  Tensor k_proj;                    // [kv_heads*head_dim, hidden]
  Tensor v_proj;                    // [kv_heads*head_dim, hidden]
  Tensor o_proj;                    // [hidden, heads*head_dim]
  Tensor gate_proj;                 // [ffn, hidden]
  Tensor up_proj;                   // [ffn, hidden]
  Tensor down_proj;                 // [hidden, ffn]
  Tensor input_layernorm;           // [hidden]
  Tensor post_attention_layernorm;  // [hidden]
};

class LlamaWeights {
 public:
  // Deterministic random weights from `seed` (an explicitly seeded generator,
  // independent of the global torch seed and of threads). Scaled so that
  // activations stay O(1) in f32: embeddings ~ N(0, 1), projections
  // ~ N(0, 1/in_features), norms ~ 1 + N(0, 0.1^2).
  static absl::StatusOr<std::shared_ptr<const LlamaWeights>> FromSeed(
      const LlamaDims& dims, uint64_t seed, const LlamaOptions& options = {});

  // Loads HuggingFace names (model.embed_tokens.weight,
  // model.layers.{i}.self_attn.{q,k,v,o}_proj.weight,
  // model.layers.{i}.mlp.{gate,up,down}_proj.weight,
  // model.layers.{i}.{input,post_attention}_layernorm.weight,
  // model.norm.weight, lm_head.weight), checking every shape and dtype
  // against `dims`.
  static absl::StatusOr<std::shared_ptr<const LlamaWeights>> FromSafetensors(
      const LlamaDims& dims, const std::string& path, const LlamaOptions& options = {});

  // The same parameters (shared, not copied) viewed with another fusion
  // factor, e.g. fusion 1 to run a fused group's layers one at a time.
  absl::StatusOr<std::shared_ptr<const LlamaWeights>> WithFusion(int64_t fusion) const;

  // A copy of every parameter in `dtype` (f32 or bf16; InvalidArgument
  // otherwise): f32 -> bf16 rounds to nearest even, bf16 -> f32 is exact. The
  // same dtype returns the same parameters (shared). E.g. the time LUT's
  // AMP profile (lut_profile.h) runs the backbone in bf16.
  absl::StatusOr<std::shared_ptr<const LlamaWeights>> WithDType(DType dtype) const;

  // A copy of every parameter on `device` (ToDevice's errors; the same
  // parameters, shared, when they are there already): what the operators of
  // a CUDA device read. Operators run where their weights are.
  absl::StatusOr<std::shared_ptr<const LlamaWeights>> OnDevice(TensorDevice device) const;
  TensorDevice device() const { return DeviceOf(embed_tokens_); }

  // All tensors under their HuggingFace names (for WriteSafetensors).
  std::vector<std::pair<std::string, Tensor>> NamedTensors() const;

  const LlamaDims& dims() const { return dims_; }
  const LlamaOptions& options() const { return options_; }
  int64_t num_groups() const { return dims_.num_groups(); }

  const Tensor& embed_tokens() const { return embed_tokens_; }  // [vocab, hidden]
  const LlamaLayerWeights& layer(int64_t i) const { return layers_[static_cast<size_t>(i)]; }
  const Tensor& norm() const { return norm_; }        // [hidden]
  const Tensor& lm_head() const { return lm_head_; }  // [vocab, hidden]

  Bytes EmbeddingBytes() const;
  Bytes LayerBytes(int64_t layer) const;
  Bytes GroupBytes(int64_t group) const;  // layers group*fusion .. +fusion-1
  Bytes LmHeadBytes() const;              // final norm + projection
  Bytes TotalBytes() const;

 private:
  LlamaWeights() = default;
  static absl::Status CheckDims(const LlamaDims& dims);
  // Builds the weights from tensors in LlamaParamSpecs order, checking shapes.
  static absl::StatusOr<std::shared_ptr<const LlamaWeights>> Assemble(
      const LlamaDims& dims, const LlamaOptions& options, std::vector<Tensor> tensors);

  LlamaDims dims_;
  LlamaOptions options_;
  Tensor embed_tokens_;
  std::vector<LlamaLayerWeights> layers_;
  Tensor norm_;
  Tensor lm_head_;
};

// The KV cache of one fused group: K and V, each
// [layers_in_group, batch, kv_heads, tokens, head_dim] in the model dtype,
// growing along `tokens` as FusedLayers appends. Empty until the first call.
class KvCache {
 public:
  KvCache() = default;

  int64_t tokens() const;  // 0 when empty
  int64_t batch() const;   // 0 when empty
  int64_t layers() const;  // 0 when empty
  Bytes bytes() const;     // K + V
  bool empty() const { return !k_.defined(); }
  void Clear();
  // Copies K and V to `device` (nothing when empty or there already);
  // ToDevice's errors, the cache unchanged.
  absl::Status MoveTo(TensorDevice device);

  // For tests and transfers: the raw K and V tensors (undefined when empty).
  const Tensor& k() const { return k_; }
  const Tensor& v() const { return v_; }

 private:
  friend struct KvCacheAccess;  // executor/llama/llama_ops.cc
  Tensor k_;
  Tensor v_;
};

// token_ids: int64 [B, S] with 0 <= id < vocab -> hidden [B, S, hidden].
absl::StatusOr<Tensor> Embedding(const LlamaWeights& weights, const Tensor& token_ids);

// Runs decoder layers group*fusion .. group*fusion+fusion-1 on hidden
// [B, S, hidden]. The new tokens sit at positions start_position ..
// start_position+S-1 and attend causally to the tokens already in `cache`
// and to each other; their K/V are appended to `cache` (only when the whole
// group succeeds). With a non-empty cache start_position must equal
// cache->tokens() (prefill: empty cache, start 0; decode: S = 1). `cache`
// may be null: then only the new tokens are attended to.
absl::StatusOr<Tensor> FusedLayers(const LlamaWeights& weights, int64_t group,
                                   const Tensor& hidden, KvCache* cache,
                                   int64_t start_position);

// Final RMSNorm and LM head projection of the LAST position only:
// hidden [B, S, hidden] -> f32 logits [B, vocab].
absl::StatusOr<Tensor> LmHead(const LlamaWeights& weights, const Tensor& hidden);

struct SamplingParams {
  double temperature = 0.0;  // 0: greedy
  double top_p = 1.0;        // 0: greedy; otherwise nucleus sampling
  uint64_t seed = 0;         // seeds a generator private to this call
  int64_t top_k = 0;         // > 0: also keep only the k most likely tokens
};

// logits [B, vocab] (floating) -> token ids int64 [B, 1]. Greedy (argmax)
// when temperature == 0 or top_p == 0; otherwise samples from the smallest
// set of most likely tokens whose probability mass reaches top_p (and, with
// top_k > 0, at most the k most likely of them), using a
// generator seeded with params.seed (the same seed and logits give the same
// tokens; callers vary the seed per step, e.g. seed + position).
absl::StatusOr<Tensor> Sample(const Tensor& logits, const SamplingParams& params);

// Reference path for tests: all layers one by one with full (non-cached)
// causal attention, written independently of FusedLayers.
// tokens int64 [B, T] -> f32 logits of every position [B, T, vocab].
absl::StatusOr<Tensor> ReferenceForward(const LlamaWeights& weights, const Tensor& tokens);

}  // namespace slicesched::executor
