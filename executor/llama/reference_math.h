// The plain math of the reference Llama implementations (ReferenceForward
// for serving, ReferenceTrainLoss for training): scalar rotary tables and an
// unfused RMSNorm, sharing nothing with the operators they check. Torch
// header: include it only from torch TUs under executor/.
#pragma once

#include <ATen/ATen.h>

#include <cmath>
#include <cstdint>
#include <vector>

namespace slicesched::executor::reference {

inline at::Tensor RefRmsNorm(const at::Tensor& x, const at::Tensor& w, double eps) {
  const at::Tensor rms = at::sqrt((x * x).mean({-1}, /*keepdim=*/true) + eps);
  return (x / rms) * w;
}

// x [B, T, n, hd]: rotates each pair (x[i], x[i + hd/2]) by angle
// position / theta^(2i/hd). The tables are computed in double and used in
// x's dtype.
inline at::Tensor RefRope(const at::Tensor& x, double theta) {
  const int64_t T = x.size(1), hd = x.size(3), half = hd / 2;
  std::vector<double> c(static_cast<size_t>(T * half)), s(c.size());
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(t) / std::pow(theta, 2.0 * static_cast<double>(i) /
                                                                        static_cast<double>(hd));
      c[static_cast<size_t>(t * half + i)] = std::cos(angle);
      s[static_cast<size_t>(t * half + i)] = std::sin(angle);
    }
  }
  const auto opts = at::TensorOptions().dtype(at::kDouble);
  // Copies: autograd keeps the tables for the backward, after c and s die.
  const at::Tensor cs = at::from_blob(c.data(), {1, T, 1, half}, opts)
                            .to(x.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
  const at::Tensor sn = at::from_blob(s.data(), {1, T, 1, half}, opts)
                            .to(x.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
  const at::Tensor x1 = x.slice(3, 0, half);
  const at::Tensor x2 = x.slice(3, half, hd);
  return at::cat({x1 * cs - x2 * sn, x2 * cs + x1 * sn}, 3);
}

}  // namespace slicesched::executor::reference
