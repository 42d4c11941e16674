// The Llama layer math shared by the serving operators (llama_ops.cc) and the
// training operators (train_ops.cc). Torch header: include it only from torch
// TUs under executor/.
#pragma once

#include <ATen/ATen.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>

namespace slicesched::executor::internal {

// RMSNorm in f32, scaled in the model dtype (as HuggingFace does).
inline at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& w, double eps) {
  const at::Tensor xf = x.to(at::kFloat);
  const at::Tensor normed = xf * at::rsqrt(xf.pow(2).mean({-1}, /*keepdim=*/true) + eps);
  return w * normed.to(x.scalar_type());
}

// cos/sin tables [..., head_dim] (rotate-half layout) for absolute positions
// of any shape [...] (serving: [S]).
inline std::pair<at::Tensor, at::Tensor> RopeTables(const at::Tensor& positions, int64_t head_dim,
                                                    double theta) {
  const at::Tensor exponents =
      at::arange(0, head_dim, 2, at::TensorOptions().dtype(at::kDouble).device(positions.device())) /
      static_cast<double>(head_dim);
  const at::Tensor inv_freq = at::pow(theta, exponents).reciprocal();             // [hd/2]
  // at::outer's product for 1-D positions, element for element.
  const at::Tensor angles = positions.to(at::kDouble).unsqueeze(-1) * inv_freq;   // [..., hd/2]
  const at::Tensor emb = at::cat({angles, angles}, -1);                           // [..., hd]
  return {emb.cos().to(at::kFloat), emb.sin().to(at::kFloat)};
}

// Per-row positions int64 [B, S] -> cos/sin [B, 1, S, hd] (broadcast over
// the heads of x [B, heads, S, hd]): RopeTables' values for each row.
inline std::pair<at::Tensor, at::Tensor> RopeTablesPerRow(const at::Tensor& positions,
                                                          int64_t head_dim, double theta) {
  auto [cos, sin] = RopeTables(positions, head_dim, theta);  // [B, S, hd]
  return {cos.unsqueeze(1), sin.unsqueeze(1)};
}

inline at::Tensor RotateHalf(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

// x [B, heads, S, hd]; cos/sin [S, hd].
inline at::Tensor ApplyRope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const at::Tensor xf = x.to(at::kFloat);
  return (xf * cos + RotateHalf(xf) * sin).to(x.scalar_type());
}

// One decoder layer's weights, as the graph reads them.
struct DecoderLayerWeights {
  at::Tensor q, k, v, o, gate, up, down, post_norm;
};

// Per-row LoRA factors of one layer's q and v projections ([B, r, hidden]
// and [B, out, r]) and their scaling, for DecoderLayerFromNormed.
struct LoraBranches {
  at::Tensor qa, qb, va, vb;
  double scaling = 1.0;
};

// A decoder layer's training forward after its input norm: x [B, S, hidden]
// the residual stream, h = RmsNorm(x) its normed input. Attention over
// `heads` query and `kv_heads` key/value heads of `head_dim`, RoPE from
// cos/sin, keys masked where `masked` is true ([S, S] or [B, 1, S, S]),
// scores in f32; then the SwiGLU MLP. With `lora` the q and v projections
// get the LoRA branch s * (h A^T) B^T, computed in f32 (the training
// operators); the full-parameter trainer passes none. The graph is built in
// one fixed order (q, then k, then v), which fixes the order in which
// backward sums h's gradient: a reordering changes the trained bits.
inline at::Tensor DecoderLayerFromNormed(const at::Tensor& x, const at::Tensor& h, const DecoderLayerWeights& w,
                                         const LoraBranches* lora, const at::Tensor& masked, const at::Tensor& cos,
                                         const at::Tensor& sin, double eps, int64_t heads, int64_t kv_heads,
                                         int64_t head_dim) {
  const int64_t B = x.size(0), S = x.size(1);
  const at::Tensor hf = lora != nullptr ? h.to(at::kFloat) : at::Tensor();
  auto branch = [&](const at::Tensor& a, const at::Tensor& b) {
    return (at::matmul(at::matmul(hf, a.transpose(1, 2)), b.transpose(1, 2)) * lora->scaling).to(h.scalar_type());
  };
  at::Tensor q = (lora != nullptr ? at::linear(h, w.q) + branch(lora->qa, lora->qb) : at::linear(h, w.q))
                     .view({B, S, heads, head_dim})
                     .transpose(1, 2);
  at::Tensor k = at::linear(h, w.k).view({B, S, kv_heads, head_dim}).transpose(1, 2);
  at::Tensor v = (lora != nullptr ? at::linear(h, w.v) + branch(lora->va, lora->vb) : at::linear(h, w.v))
                     .view({B, S, kv_heads, head_dim})
                     .transpose(1, 2);
  q = ApplyRope(q, cos, sin);
  k = ApplyRope(k, cos, sin);
  if (heads != kv_heads) {
    k = k.repeat_interleave(heads / kv_heads, 1);
    v = v.repeat_interleave(heads / kv_heads, 1);
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  at::Tensor scores = at::matmul(q.to(at::kFloat), k.to(at::kFloat).transpose(-2, -1)) * scale;
  scores = scores.masked_fill(masked, -std::numeric_limits<float>::infinity());
  const at::Tensor probs = at::softmax(scores, -1).to(x.scalar_type());
  const at::Tensor attn = at::matmul(probs, v).transpose(1, 2).reshape({B, S, heads * head_dim});
  const at::Tensor mid = x + at::linear(attn, w.o);
  const at::Tensor h2 = RmsNorm(mid, w.post_norm, eps);
  const at::Tensor gate = at::silu(at::linear(h2, w.gate));
  const at::Tensor up = at::linear(h2, w.up);
  return mid + at::linear(gate * up, w.down);
}

}  // namespace slicesched::executor::internal
