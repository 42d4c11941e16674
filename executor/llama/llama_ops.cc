// Llama operators on LibTorch: weights from a seed, embedding, fused decoder
// layer groups with a KV cache, LM head and sampling. Torch TU (ATen only).
#include "slicesched/executor/llama/llama_ops.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/InferenceMode.h>

#include <cmath>
#include <optional>

#include "llama_internal.h"
#include "slicesched/executor/llama/llama_math.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "slicesched/executor/torch/aten_tensor.h"

namespace slicesched::executor {

struct KvCacheAccess {
  static void Set(KvCache& c, Tensor k, Tensor v) {
    c.k_ = std::move(k);
    c.v_ = std::move(v);
  }
};

namespace {

using Access = TensorAccess;

at::ScalarType FloatScalarType(DType d) {
  switch (d) {
    case DType::kBF16: return at::kBFloat16;
    case DType::kF16: return at::kHalf;
    default: return at::kFloat;
  }
}

std::string ShapeStr(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? "," : "") + std::to_string(s[i]);
  return out + "]";
}

// Checks that `t` is defined with rank `rank`, and last dimension `last`
// (when last >= 0).
absl::Status CheckInput(std::string_view op, std::string_view what, const Tensor& t, size_t rank,
                        int64_t last) {
  if (!t.defined()) return absl::InvalidArgumentError(StrCat(op, ": ", what, " is undefined"));
  const auto s = t.shape();
  if (s.size() != rank || (last >= 0 && s.back() != last)) {
    return absl::InvalidArgumentError(StrCat(op, ": ", what, " has shape ", ShapeStr(s),
                                             ", expected rank ", rank,
                                             last >= 0 ? StrCat(" ending in ", last) : ""));
  }
  return absl::OkStatus();
}

using internal::ApplyRope;
using internal::RmsNorm;
using internal::RopeTables;

}  // namespace

// ---------------------------------------------------------------------------
// LlamaWeights::FromSeed

absl::StatusOr<std::shared_ptr<const LlamaWeights>> LlamaWeights::FromSeed(
    const LlamaDims& dims, uint64_t seed, const LlamaOptions& options) {
  SLICESCHED_RETURN_IF_ERROR(CheckDims(dims));
  std::vector<Tensor> tensors;
  try {
    c10::InferenceMode guard;
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    const at::ScalarType type = FloatScalarType(dims.dtype);
    for (const auto& spec : internal::LlamaParamSpecs(dims)) {
      at::Tensor t = at::randn(spec.shape, gen, at::TensorOptions().dtype(at::kFloat));
      t.mul_(spec.std);
      if (spec.init == internal::ParamInit::kNorm) t.add_(1.0);
      tensors.push_back(Access::Wrap(t.to(type).contiguous()));
    }
  } catch (...) {
    return internal::CurrentExceptionToStatus(
        StrCat("LlamaWeights::FromSeed(model '", dims.name, "')"));
  }
  return Assemble(dims, options, std::move(tensors));
}

// ---------------------------------------------------------------------------
// KvCache

int64_t KvCache::tokens() const { return k_.defined() ? k_.shape()[3] : 0; }
int64_t KvCache::batch() const { return k_.defined() ? k_.shape()[1] : 0; }
int64_t KvCache::layers() const { return k_.defined() ? k_.shape()[0] : 0; }
Bytes KvCache::bytes() const { return k_.bytes() + v_.bytes(); }
void KvCache::Clear() {
  k_ = Tensor();
  v_ = Tensor();
}

absl::Status KvCache::MoveTo(TensorDevice device) {
  if (empty()) return absl::OkStatus();
  SLICESCHED_ASSIGN_OR_RETURN(Tensor k, ToDevice(k_, device));
  SLICESCHED_ASSIGN_OR_RETURN(Tensor v, ToDevice(v_, device));
  k_ = std::move(k);
  v_ = std::move(v);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Operators

absl::StatusOr<Tensor> Embedding(const LlamaWeights& weights, const Tensor& token_ids) {
  constexpr std::string_view kOp = "Embedding";
  SLICESCHED_RETURN_IF_ERROR(CheckInput(kOp, "token_ids", token_ids, 2, -1));
  if (token_ids.dtype() != DType::kI64 && token_ids.dtype() != DType::kI32) {
    return absl::InvalidArgumentError(
        StrCat(kOp, ": token_ids must be int64 or int32, got ", token_ids.DebugString()));
  }
  try {
    c10::InferenceMode guard;
    const at::Tensor& ids = Access::Unwrap(token_ids);
    if (ids.numel() > 0) {
      const int64_t lo = ids.min().item<int64_t>();
      const int64_t hi = ids.max().item<int64_t>();
      const int64_t vocab = weights.dims().vocab;
      if (lo < 0 || hi >= vocab) {
        return absl::OutOfRangeError(StrCat(kOp, ": token id ", lo < 0 ? lo : hi,
                                            " is outside the vocabulary [0, ", vocab, ")"));
      }
    }
    // The ids arrive from the host; the lookup runs where the table lives.
    const at::Tensor& table = Access::Unwrap(weights.embed_tokens());
    return Access::Wrap(at::embedding(table, ids.to(table.device())));
  } catch (...) {
    return internal::CurrentExceptionToStatus(kOp);
  }
}

absl::StatusOr<Tensor> FusedLayers(const LlamaWeights& weights, int64_t group,
                                   const Tensor& hidden, KvCache* cache,
                                   int64_t start_position) {
  const LlamaDims& d = weights.dims();
  const std::string op = StrCat("FusedLayers(model '", d.name, "', group ", group, ")");
  if (group < 0 || group >= d.num_groups()) {
    return absl::OutOfRangeError(
        StrCat(op, ": group out of range [0, ", d.num_groups(), ")"));
  }
  SLICESCHED_RETURN_IF_ERROR(CheckInput(op, "hidden", hidden, 3, d.hidden));
  if (hidden.dtype() != d.dtype) {
    return absl::InvalidArgumentError(StrCat(op, ": hidden is ", hidden.DebugString(),
                                             ", the model dtype is ", DTypeName(d.dtype)));
  }
  if (start_position < 0) {
    return absl::InvalidArgumentError(StrCat(op, ": negative start_position ", start_position));
  }
  const auto hs = hidden.shape();
  const int64_t B = hs[0], S = hs[1];
  const int64_t H = d.heads, KVH = d.kv_heads, HD = d.head_dim(), F = d.fusion;
  int64_t past = 0;
  if (cache != nullptr && !cache->empty()) {
    const std::vector<int64_t> want = {F, B, KVH, cache->tokens(), HD};
    if (cache->k().shape() != want || cache->v().shape() != want) {
      return absl::InvalidArgumentError(StrCat(op, ": KV cache has shape ",
                                               ShapeStr(cache->k().shape()), ", expected ",
                                               ShapeStr(want), " for this group and batch"));
    }
    if (cache->k().dtype() != d.dtype) {
      return absl::InvalidArgumentError(StrCat(op, ": KV cache is ", cache->k().DebugString()));
    }
    past = cache->tokens();
    if (start_position != past) {
      return absl::InvalidArgumentError(StrCat(op, ": start_position ", start_position,
                                               " differs from the ", past, " cached tokens"));
    }
  }
  try {
    c10::InferenceMode guard;
    const double eps = weights.options().rms_eps;
    at::Tensor x = Access::Unwrap(hidden);
    const auto long_opts = at::TensorOptions().dtype(at::kLong).device(x.device());
    const at::Tensor q_pos = at::arange(start_position, start_position + S, long_opts);  // [S]
    // Which keys each query attends to (true: attends), for SDPA. A single
    // query (decode) sees every cached key, so it needs no mask, and a
    // prefill without a cache is SDPA's own causal case; only a chunk after
    // cached tokens needs one: [S, past+S].
    std::optional<at::Tensor> attends;
    if (past > 0 && S > 1) {
      const at::Tensor k_pos = at::cat({at::arange(0, past, long_opts), q_pos});
      attends = k_pos.unsqueeze(0) <= q_pos.unsqueeze(1);
    }
    const bool causal = past == 0 && S > 1;
    const auto [rope_cos, rope_sin] = RopeTables(q_pos, HD, weights.options().rope_theta);
    const double scale = 1.0 / std::sqrt(static_cast<double>(HD));
    const at::Tensor& cache_k = cache != nullptr ? Access::Unwrap(cache->k()) : Access::Unwrap(Tensor());
    const at::Tensor& cache_v = cache != nullptr ? Access::Unwrap(cache->v()) : Access::Unwrap(Tensor());

    std::vector<at::Tensor> new_k, new_v;
    for (int64_t l = 0; l < F; ++l) {
      const LlamaLayerWeights& lw = weights.layer(group * F + l);
      // Attention.
      const at::Tensor h = RmsNorm(x, Access::Unwrap(lw.input_layernorm), eps);
      at::Tensor q = at::linear(h, Access::Unwrap(lw.q_proj)).view({B, S, H, HD}).transpose(1, 2);
      at::Tensor k = at::linear(h, Access::Unwrap(lw.k_proj)).view({B, S, KVH, HD}).transpose(1, 2);
      at::Tensor v = at::linear(h, Access::Unwrap(lw.v_proj)).view({B, S, KVH, HD}).transpose(1, 2);
      q = ApplyRope(q, rope_cos, rope_sin);
      k = ApplyRope(k, rope_cos, rope_sin);
      new_k.push_back(k);
      new_v.push_back(v);
      const at::Tensor k_all = past > 0 ? at::cat({cache_k[l], k}, 2) : k;  // [B, KVH, past+S, HD]
      const at::Tensor v_all = past > 0 ? at::cat({cache_v[l], v}, 2) : v;
      // Fused attention (flash or memory-efficient kernels on a GPU, the
      // flash CPU kernel on a CPU), grouped-query heads shared in place.
      const at::Tensor attn = at::scaled_dot_product_attention(q, k_all, v_all, attends, /*dropout_p=*/0.0, causal,
                                                               scale, /*enable_gqa=*/H != KVH)
                                  .transpose(1, 2)
                                  .reshape({B, S, H * HD});
      x = x + at::linear(attn, Access::Unwrap(lw.o_proj));
      // SwiGLU MLP.
      const at::Tensor h2 = RmsNorm(x, Access::Unwrap(lw.post_attention_layernorm), eps);
      const at::Tensor gate = at::silu(at::linear(h2, Access::Unwrap(lw.gate_proj)));
      const at::Tensor up = at::linear(h2, Access::Unwrap(lw.up_proj));
      x = x + at::linear(gate * up, Access::Unwrap(lw.down_proj));
    }
    if (cache != nullptr) {
      at::Tensor k_step = at::stack(new_k, 0);  // [F, B, KVH, S, HD]
      at::Tensor v_step = at::stack(new_v, 0);
      at::Tensor k_next = past > 0 ? at::cat({cache_k, k_step}, 3) : k_step.contiguous();
      at::Tensor v_next = past > 0 ? at::cat({cache_v, v_step}, 3) : v_step.contiguous();
      KvCacheAccess::Set(*cache, Access::Wrap(std::move(k_next)), Access::Wrap(std::move(v_next)));
    }
    return Access::Wrap(x.contiguous());
  } catch (...) {
    return internal::CurrentExceptionToStatus(op);
  }
}

absl::StatusOr<Tensor> LmHead(const LlamaWeights& weights, const Tensor& hidden) {
  const LlamaDims& d = weights.dims();
  constexpr std::string_view kOp = "LmHead";
  SLICESCHED_RETURN_IF_ERROR(CheckInput(kOp, "hidden", hidden, 3, d.hidden));
  if (hidden.shape()[1] == 0) {
    return absl::InvalidArgumentError(StrCat(kOp, ": hidden has no positions"));
  }
  if (hidden.dtype() != d.dtype) {
    return absl::InvalidArgumentError(StrCat(kOp, ": hidden is ", hidden.DebugString(),
                                             ", the model dtype is ", DTypeName(d.dtype)));
  }
  try {
    c10::InferenceMode guard;
    const at::Tensor& x = Access::Unwrap(hidden);
    const at::Tensor last = x.select(1, x.size(1) - 1);  // [B, H]
    const at::Tensor h = RmsNorm(last, Access::Unwrap(weights.norm()), weights.options().rms_eps);
    return Access::Wrap(at::linear(h, Access::Unwrap(weights.lm_head())).to(at::kFloat).contiguous());
  } catch (...) {
    return internal::CurrentExceptionToStatus(kOp);
  }
}

absl::StatusOr<Tensor> Sample(const Tensor& logits, const SamplingParams& params) {
  constexpr std::string_view kOp = "Sample";
  SLICESCHED_RETURN_IF_ERROR(CheckInput(kOp, "logits", logits, 2, -1));
  if (!IsFloating(logits.dtype())) {
    return absl::InvalidArgumentError(StrCat(kOp, ": logits must be floating, got ",
                                             logits.DebugString()));
  }
  if (logits.shape()[1] == 0) return absl::InvalidArgumentError(StrCat(kOp, ": empty vocabulary"));
  if (!(params.temperature >= 0.0) || !std::isfinite(params.temperature)) {
    return absl::InvalidArgumentError(StrCat(kOp, ": temperature must be finite and >= 0, got ",
                                             params.temperature));
  }
  if (!(params.top_p >= 0.0 && params.top_p <= 1.0)) {
    return absl::InvalidArgumentError(StrCat(kOp, ": top_p must be in [0, 1], got ", params.top_p));
  }
  if (params.top_k < 0) return absl::InvalidArgumentError(StrCat(kOp, ": top_k must be >= 0, got ", params.top_k));
  try {
    c10::InferenceMode guard;
    const at::Tensor& on_device = Access::Unwrap(logits);
    // The tokens stay where the logits are, like every operator's output.
    // Greedy picks them there; sampling draws on the host from the seed's CPU
    // generator, so a seed gives the same tokens on every device.
    if (params.temperature == 0.0 || params.top_p == 0.0) {
      return Access::Wrap(on_device.argmax(-1, /*keepdim=*/true).contiguous());
    }
    const at::Tensor l = on_device.to(at::kCPU, at::kFloat);
    const at::Tensor probs = at::softmax(l / params.temperature, -1);
    const auto [sorted, order] = probs.sort(-1, /*descending=*/true);
    // Drop a token when the tokens before it already hold top_p of the mass
    // (the most likely token is always kept).
    const at::Tensor before = sorted.cumsum(-1) - sorted;
    at::Tensor kept = sorted.masked_fill(before >= params.top_p, 0.0f);
    if (params.top_k > 0 && params.top_k < kept.size(-1)) {
      kept.narrow(-1, params.top_k, kept.size(-1) - params.top_k).zero_();  // only the k most likely
    }
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(params.seed);
    const at::Tensor choice = at::multinomial(kept, 1, /*replacement=*/false, gen);  // [B, 1]
    return Access::Wrap(order.gather(-1, choice).to(on_device.device()).contiguous());
  } catch (...) {
    return internal::CurrentExceptionToStatus(kOp);
  }
}

}  // namespace slicesched::executor
