// ReferenceForward: a deliberately plain, independent implementation of the
// Llama forward pass used only to check the serving operators. It shares no
// helper with llama_ops.cc: the rotary tables are computed with scalar C++
// math, attention loops over query heads with an explicit triangular mask and
// no KV cache, and everything runs in f32. Torch TU (ATen only).
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>

#include <cmath>
#include <string>
#include <vector>

#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "slicesched/executor/llama/llama_ops.h"
#include "slicesched/executor/llama/reference_math.h"
#include "slicesched/executor/torch/aten_tensor.h"

namespace slicesched::executor {

namespace {

at::Tensor F32(const Tensor& t) { return TensorAccess::Unwrap(t).to(at::kFloat); }

}  // namespace

using reference::RefRmsNorm;
using reference::RefRope;

absl::StatusOr<Tensor> ReferenceForward(const LlamaWeights& weights, const Tensor& tokens) {
  const LlamaDims& d = weights.dims();
  if (!tokens.defined() || tokens.shape().size() != 2 || tokens.dtype() != DType::kI64) {
    return absl::InvalidArgumentError(
        StrCat("ReferenceForward: tokens must be int64 [B, T], got ", tokens.DebugString()));
  }
  for (int64_t id : tokens.ToInt64()) {
    if (id < 0 || id >= d.vocab) {
      return absl::OutOfRangeError(StrCat("ReferenceForward: token id ", id,
                                          " is outside the vocabulary [0, ", d.vocab, ")"));
    }
  }
  try {
    c10::InferenceMode guard;
    const at::Tensor ids = TensorAccess::Unwrap(tokens);
    const int64_t B = ids.size(0), T = ids.size(1);
    const int64_t hd = d.head_dim(), group_size = d.heads / d.kv_heads;
    const double eps = weights.options().rms_eps, theta = weights.options().rope_theta;
    at::Tensor x = F32(weights.embed_tokens()).index_select(0, ids.reshape({-1})).reshape({B, T, d.hidden});
    const at::Tensor future = at::ones({T, T}, at::TensorOptions().dtype(at::kBool)).triu(1);
    for (int64_t i = 0; i < d.layers; ++i) {
      const LlamaLayerWeights& lw = weights.layer(i);
      const at::Tensor h = RefRmsNorm(x, F32(lw.input_layernorm), eps);
      const at::Tensor q = RefRope(at::matmul(h, F32(lw.q_proj).t()).reshape({B, T, d.heads, hd}), theta);
      const at::Tensor k = RefRope(at::matmul(h, F32(lw.k_proj).t()).reshape({B, T, d.kv_heads, hd}), theta);
      const at::Tensor v = at::matmul(h, F32(lw.v_proj).t()).reshape({B, T, d.kv_heads, hd});
      std::vector<at::Tensor> heads;
      for (int64_t head = 0; head < d.heads; ++head) {
        const int64_t kv = head / group_size;
        const at::Tensor qh = q.select(2, head);  // [B, T, hd]
        const at::Tensor kh = k.select(2, kv);
        const at::Tensor vh = v.select(2, kv);
        at::Tensor scores = at::bmm(qh, kh.transpose(1, 2)) / std::sqrt(static_cast<double>(hd));
        scores = scores.masked_fill(future, -INFINITY);
        const at::Tensor e = at::exp(scores - std::get<0>(scores.max(-1, true)));
        heads.push_back(at::bmm(e / e.sum(-1, true), vh));  // [B, T, hd]
      }
      x = x + at::matmul(at::cat(heads, -1), F32(lw.o_proj).t());
      const at::Tensor h2 = RefRmsNorm(x, F32(lw.post_attention_layernorm), eps);
      const at::Tensor g = at::matmul(h2, F32(lw.gate_proj).t());
      const at::Tensor u = at::matmul(h2, F32(lw.up_proj).t());
      x = x + at::matmul(g * at::sigmoid(g) * u, F32(lw.down_proj).t());
    }
    const at::Tensor logits = at::matmul(RefRmsNorm(x, F32(weights.norm()), eps), F32(weights.lm_head()).t());
    return TensorAccess::Wrap(logits.contiguous());
  } catch (...) {
    return internal::CurrentExceptionToStatus("ReferenceForward");
  }
}

}  // namespace slicesched::executor
