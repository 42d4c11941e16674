// An opaque, copyable handle to a LibTorch tensor.
//
// Public executor headers are LibTorch-free (each TU that includes a LibTorch
// header costs ~40 s to compile), so the tensor is held through a pimpl whose
// definition lives in executor/torch/tensor.cc. Copies share storage, like
// at::Tensor copies. A default-constructed Tensor is undefined.
//
// The accessors and conversions never throw: on an undefined tensor or a
// dtype they cannot convert they return an empty result.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "slicesched/common/units.h"
#include "slicesched/gmg/dtype.h"

namespace slicesched::executor {

class Tensor {
 public:
  struct Impl;  // defined in executor/torch/tensor.cc

  Tensor();  // undefined
  ~Tensor();
  Tensor(const Tensor&);
  Tensor(Tensor&&) noexcept;
  Tensor& operator=(const Tensor&);
  Tensor& operator=(Tensor&&) noexcept;

  // Copies `values` into a new CPU tensor of the given shape. Returns an
  // undefined tensor when the shape's element count differs from
  // values.size() or a dimension is negative.
  static Tensor FromInt64(std::span<const int64_t> values, std::vector<int64_t> shape);
  static Tensor FromFloat(std::span<const float> values, std::vector<int64_t> shape);

  bool defined() const;
  std::vector<int64_t> shape() const;  // empty when undefined
  // Whether the tensor is defined and has exactly these dimensions (unlike
  // comparing shape(), copies nothing).
  bool HasShape(std::span<const int64_t> dims) const;
  int64_t numel() const;               // 0 when undefined
  DType dtype() const;                 // kF32 when undefined
  Bytes bytes() const;                 // numel x element size; 0 when undefined

  // Row-major copies of the elements. ToInt64 accepts integer and bool
  // tensors, ToFloat floating ones (converted to f32); otherwise empty.
  std::vector<int64_t> ToInt64() const;
  std::vector<float> ToFloat() const;

  // Element-wise |a - b| <= atol + rtol * |b| with equal shapes (false when
  // the shapes differ or either tensor is undefined).
  bool AllClose(const Tensor& other, double rtol, double atol) const;
  // max |a - b| over all elements; +infinity when the shapes differ or either
  // tensor is undefined.
  double MaxAbsDiff(const Tensor& other) const;

  // "f32[2,3]" (or "undefined").
  std::string DebugString() const;

 private:
  friend struct TensorAccess;  // executor/tensor_internal.h
  std::shared_ptr<Impl> impl_;
};

// Sets how many intra-op threads LibTorch uses for operators called from
// the calling thread. Executors run one thread per device, each standing for
// one device, so they set 1 (one core per device) unless configured
// otherwise; LibTorch's default would let every device thread spread over
// every core and contend with the others.
void SetIntraOpThreadsForThisThread(int threads);

// What the LibTorch this process loaded offers. A CUDA build loads the CUDA
// driver lazily, on its first CUDA call (this one): without a GPU or driver
// it reports cuda_build > 0 and cuda_devices == 0, and the process goes on
// with cpu devices.
struct TorchRuntimeInfo {
  std::string version;          // e.g. "2.11.0"
  int cuda_build = 0;           // CUDA runtime version it was built with (13000), 0 for a CPU build
  int cuda_devices = 0;         // CUDA devices it can use now
};
TorchRuntimeInfo QueryTorchRuntime();

}  // namespace slicesched::executor
