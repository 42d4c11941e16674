// Executor-internal glue between the torch-free Tensor handle and LibTorch.
//
// This header itself includes no LibTorch header (at::Tensor is only
// forward-declared), so torch-free TUs such as safetensors.cc can use the
// byte-level helpers; only the torch TUs (tensor.cc, llama_ops.cc,
// llama_reference.cc) call Wrap/Unwrap.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "slicesched/executor/torch/tensor.h"

namespace at {
class Tensor;
}  // namespace at

namespace slicesched::executor {

struct TensorAccess {
  // The wrapped tensor; a static undefined at::Tensor for an undefined handle.
  static const at::Tensor& Unwrap(const Tensor& t);
  static Tensor Wrap(at::Tensor t);

  // The handle's shared state as an opaque owner, and back: what a Buffer
  // holds as a tensor payload (llama_kernels.h). The owner is the handle's
  // own shared_ptr, so a payload adds no allocation and no control block of
  // its own; null for an undefined handle. Shared() requires an owner that
  // Share() made (or null, which gives an undefined handle).
  static std::shared_ptr<void> Share(Tensor&& t) { return std::move(t.impl_); }
  static Tensor Shared(const std::shared_ptr<void>& owner) {
    Tensor out;
    out.impl_ = std::static_pointer_cast<Tensor::Impl>(owner);
    return out;
  }
};

namespace internal {

// Call only from inside a catch block: classifies the in-flight exception
// (c10::Error, std::bad_alloc, std::exception, anything else) as
// ResourceExhausted (allocation failures) or Internal, prefixed by `context`.
absl::Status CurrentExceptionToStatus(std::string_view context);

// A new contiguous CPU tensor holding a copy of `data` (size must equal
// numel x DTypeSize(dtype)).
absl::StatusOr<Tensor> TensorFromBytes(DType dtype, const std::vector<int64_t>& shape,
                                       const void* data, size_t size);
// The row-major little-endian bytes of `t`.
absl::StatusOr<std::string> TensorToBytes(const Tensor& t);

}  // namespace internal
}  // namespace slicesched::executor
