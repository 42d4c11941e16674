// The Llama layer math shared by the serving operators (llama_ops.cc) and the
// training operators (train_ops.cc). Torch header: include it only from torch
// TUs under executor/.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
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

}  // namespace slicesched::executor::internal
