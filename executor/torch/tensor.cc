// Tensor handle and the torch <-> Status glue. Torch TU (ATen only).
#include "slicesched/executor/torch/tensor.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/Exception.h>
#include <torch/headeronly/version.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <optional>
#include <span>

#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "slicesched/executor/torch/aten_tensor.h"
#include "slicesched/executor/torch/device.h"

namespace slicesched::executor {

struct Tensor::Impl {
  at::Tensor t;
};

namespace {

std::optional<at::ScalarType> ToScalarType(DType d) {
  switch (d) {
    case DType::kF32: return at::kFloat;
    case DType::kBF16: return at::kBFloat16;
    case DType::kF16: return at::kHalf;
    case DType::kI64: return at::kLong;
    case DType::kI32: return at::kInt;
    case DType::kI8: return at::kChar;
    case DType::kU8: return at::kByte;
    case DType::kBool: return at::kBool;
  }
  return std::nullopt;
}

std::optional<DType> FromScalarType(at::ScalarType s) {
  switch (s) {
    case at::kFloat: return DType::kF32;
    case at::kBFloat16: return DType::kBF16;
    case at::kHalf: return DType::kF16;
    case at::kLong: return DType::kI64;
    case at::kInt: return DType::kI32;
    case at::kChar: return DType::kI8;
    case at::kByte: return DType::kU8;
    case at::kBool: return DType::kBool;
    default: return std::nullopt;
  }
}

bool ValidShape(const std::vector<int64_t>& shape, size_t count) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return false;
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d) return false;
    n *= d;
  }
  return static_cast<uint64_t>(n) == count;
}

template <typename T>
Tensor FromValues(std::span<const T> values, std::vector<int64_t> shape, at::ScalarType type) {
  if (!ValidShape(shape, values.size())) return Tensor();
  try {
    c10::InferenceMode guard;
    at::Tensor t = at::empty(shape, at::TensorOptions().dtype(type));
    if (!values.empty()) std::memcpy(t.data_ptr(), values.data(), values.size_bytes());
    return TensorAccess::Wrap(std::move(t));
  } catch (...) {
    return Tensor();
  }
}

}  // namespace

Tensor::Tensor() = default;
Tensor::~Tensor() = default;
Tensor::Tensor(const Tensor&) = default;
Tensor::Tensor(Tensor&&) noexcept = default;
Tensor& Tensor::operator=(const Tensor&) = default;
Tensor& Tensor::operator=(Tensor&&) noexcept = default;

Tensor Tensor::FromInt64(std::span<const int64_t> values, std::vector<int64_t> shape) {
  return FromValues(values, std::move(shape), at::kLong);
}

Tensor Tensor::FromFloat(std::span<const float> values, std::vector<int64_t> shape) {
  return FromValues(values, std::move(shape), at::kFloat);
}

bool Tensor::defined() const { return impl_ != nullptr && impl_->t.defined(); }

std::vector<int64_t> Tensor::shape() const {
  if (!defined()) return {};
  const auto sizes = impl_->t.sizes();
  return std::vector<int64_t>(sizes.begin(), sizes.end());
}

bool Tensor::HasShape(std::span<const int64_t> dims) const {
  if (!defined()) return false;
  const auto sizes = impl_->t.sizes();
  return std::equal(sizes.begin(), sizes.end(), dims.begin(), dims.end());
}

int64_t Tensor::numel() const { return defined() ? impl_->t.numel() : 0; }

DType Tensor::dtype() const {
  if (!defined()) return DType::kF32;
  return FromScalarType(impl_->t.scalar_type()).value_or(DType::kF32);
}

Bytes Tensor::bytes() const {
  if (!defined()) return Bytes(0);
  return Bytes(impl_->t.numel() * static_cast<int64_t>(impl_->t.element_size()));
}

std::vector<int64_t> Tensor::ToInt64() const {
  if (!defined()) return {};
  try {
    c10::InferenceMode guard;
    const at::Tensor& t = impl_->t;
    if (at::isFloatingType(t.scalar_type()) || at::isComplexType(t.scalar_type())) return {};
    at::Tensor c = t.to(at::kCPU, at::kLong).contiguous();
    const int64_t* p = c.data_ptr<int64_t>();
    return std::vector<int64_t>(p, p + c.numel());
  } catch (...) {
    return {};
  }
}

std::vector<float> Tensor::ToFloat() const {
  if (!defined()) return {};
  try {
    c10::InferenceMode guard;
    const at::Tensor& t = impl_->t;
    if (!at::isFloatingType(t.scalar_type())) return {};
    at::Tensor c = t.to(at::kCPU, at::kFloat).contiguous();
    const float* p = c.data_ptr<float>();
    return std::vector<float>(p, p + c.numel());
  } catch (...) {
    return {};
  }
}

bool Tensor::AllClose(const Tensor& other, double rtol, double atol) const {
  if (!defined() || !other.defined()) return false;
  try {
    c10::InferenceMode guard;
    const at::Tensor& a = impl_->t;
    const at::Tensor& b = other.impl_->t;
    if (a.sizes() != b.sizes()) return false;
    return at::allclose(a.to(at::kDouble), b.to(at::kDouble), rtol, atol);
  } catch (...) {
    return false;
  }
}

double Tensor::MaxAbsDiff(const Tensor& other) const {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  if (!defined() || !other.defined()) return kInf;
  try {
    c10::InferenceMode guard;
    const at::Tensor& a = impl_->t;
    const at::Tensor& b = other.impl_->t;
    if (a.sizes() != b.sizes()) return kInf;
    if (a.numel() == 0) return 0.0;
    return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
  } catch (...) {
    return kInf;
  }
}

std::string Tensor::DebugString() const {
  if (!defined()) return "undefined";
  std::string out = defined() && FromScalarType(impl_->t.scalar_type())
                        ? std::string(DTypeName(dtype()))
                        : std::string(c10::toString(impl_->t.scalar_type()));
  out += "[";
  const auto s = shape();
  for (size_t i = 0; i < s.size(); ++i) {
    if (i > 0) out += ",";
    out += std::to_string(s[i]);
  }
  return out + "]";
}

const at::Tensor& TensorAccess::Unwrap(const Tensor& t) {
  static const at::Tensor* const kUndefined = new at::Tensor();
  return t.impl_ ? t.impl_->t : *kUndefined;
}

Tensor TensorAccess::Wrap(at::Tensor t) {
  Tensor out;
  if (t.defined()) out.impl_ = std::make_shared<Tensor::Impl>(Tensor::Impl{std::move(t)});
  return out;
}

namespace internal {

namespace {

bool LooksLikeAllocationFailure(std::string_view msg) {
  return msg.find("not enough memory") != std::string_view::npos ||
         msg.find("can't allocate memory") != std::string_view::npos ||
         msg.find("Cannot allocate memory") != std::string_view::npos ||
         msg.find("out of memory") != std::string_view::npos ||
         msg.find("Out of memory") != std::string_view::npos;
}

}  // namespace

absl::Status CurrentExceptionToStatus(std::string_view context) {
  try {
    throw;
  } catch (const c10::OutOfMemoryError& e) {
    return absl::ResourceExhaustedError(
        StrCat(context, ": allocation failed: ", e.what_without_backtrace()));
  } catch (const c10::Error& e) {
    const std::string_view msg = e.what_without_backtrace();
    if (LooksLikeAllocationFailure(msg)) {
      return absl::ResourceExhaustedError(StrCat(context, ": allocation failed: ", msg));
    }
    return absl::InternalError(StrCat(context, ": LibTorch error: ", msg));
  } catch (const std::bad_alloc& e) {
    return absl::ResourceExhaustedError(StrCat(context, ": allocation failed: ", e.what()));
  } catch (const std::exception& e) {
    return absl::InternalError(StrCat(context, ": exception: ", e.what()));
  } catch (...) {
    return absl::InternalError(StrCat(context, ": unknown exception"));
  }
}

absl::StatusOr<Tensor> TensorFromBytes(DType dtype, const std::vector<int64_t>& shape,
                                       const void* data, size_t size) {
  const auto type = ToScalarType(dtype);
  if (!type) return absl::InvalidArgumentError("TensorFromBytes: unsupported dtype");
  if (!ValidShape(shape, size / static_cast<size_t>(DTypeSize(dtype))) ||
      size % static_cast<size_t>(DTypeSize(dtype)) != 0) {
    return absl::InvalidArgumentError(
        StrCat("TensorFromBytes: ", size, " bytes do not match the shape"));
  }
  try {
    c10::InferenceMode guard;
    at::Tensor t = at::empty(shape, at::TensorOptions().dtype(*type));
    if (size > 0) std::memcpy(t.data_ptr(), data, size);
    return TensorAccess::Wrap(std::move(t));
  } catch (...) {
    return CurrentExceptionToStatus("TensorFromBytes");
  }
}

absl::StatusOr<std::string> TensorToBytes(const Tensor& tensor) {
  if (!tensor.defined()) return absl::InvalidArgumentError("TensorToBytes: undefined tensor");
  try {
    c10::InferenceMode guard;
    const at::Tensor& t = TensorAccess::Unwrap(tensor);
    if (!FromScalarType(t.scalar_type())) {
      return absl::InvalidArgumentError(
          StrCat("TensorToBytes: unsupported dtype ", std::string(c10::toString(t.scalar_type()))));
    }
    at::Tensor c = t.to(at::kCPU).contiguous();
    const size_t n = static_cast<size_t>(c.numel()) * c.element_size();
    return std::string(static_cast<const char*>(c.data_ptr()), n);
  } catch (...) {
    return CurrentExceptionToStatus("TensorToBytes");
  }
}

}  // namespace internal
void SetIntraOpThreadsForThisThread(int threads) { at::set_num_threads(threads > 0 ? threads : 1); }

TorchRuntimeInfo QueryTorchRuntime() {
  TorchRuntimeInfo info;
  info.version = StrCat(TORCH_VERSION_MAJOR, ".", TORCH_VERSION_MINOR, ".", TORCH_VERSION_PATCH);
  // versionCUDART() throws in a CPU build (no CUDA hooks registered).
  try {
    info.cuda_build = static_cast<int>(at::detail::getCUDAHooks().versionCUDART());
  } catch (...) {
    info.cuda_build = 0;
  }
  info.cuda_devices = at::hasCUDA() ? static_cast<int>(at::getNumGPUs()) : 0;
  return info;
}

// ---------------------------------------------------------------------------
// Devices (device.h)

std::string TensorDevice::ToString() const { return is_cuda() ? StrCat("cuda:", index) : "cpu"; }

TensorDevice DeviceOf(const Tensor& t) {
  if (!t.defined()) return TensorDevice::Cpu();
  const at::Device d = TensorAccess::Unwrap(t).device();
  return d.is_cuda() ? TensorDevice::Cuda(d.index()) : TensorDevice::Cpu();
}

absl::Status CheckCudaDevice(int ordinal) {
  const std::string what = StrCat("cuda:", ordinal);
#ifndef SLICESCHED_EXECUTOR_CUDA
  return absl::FailedPreconditionError(
      StrCat(what, ": this slicesched was built without the CUDA toolkit, so it cannot drive CUDA devices "
                   "(install the toolkit and reconfigure)"));
#else
  // Fixed for the process (ToDevice checks on every copy to a GPU).
  static const TorchRuntimeInfo info = QueryTorchRuntime();
  if (info.cuda_build == 0) {
    return absl::FailedPreconditionError(
        StrCat(what, ": the LibTorch this process loaded (", info.version, ") is a CPU build"));
  }
  if (info.cuda_devices == 0) {
    return absl::FailedPreconditionError(
        StrCat(what, ": LibTorch ", info.version, " (CUDA ", info.cuda_build / 1000, ".", info.cuda_build % 1000 / 10,
               ") sees no CUDA device (no GPU, or no driver: libcuda.so.1 not loadable)"));
  }
  if (ordinal < 0 || ordinal >= info.cuda_devices) {
    return absl::FailedPreconditionError(
        StrCat(what, ": no such CUDA device; this process sees ", info.cuda_devices, " (cuda:0 to cuda:",
               info.cuda_devices - 1, ")"));
  }
  return absl::OkStatus();
#endif
}

absl::StatusOr<Tensor> ToDevice(const Tensor& t, TensorDevice device) {
  if (!t.defined()) return absl::InvalidArgumentError(StrCat("moving an undefined tensor to ", device.ToString()));
  if (DeviceOf(t) == device) return t;
  if (device.is_cuda()) SLICESCHED_RETURN_IF_ERROR(CheckCudaDevice(device.index));
  try {
    c10::InferenceMode guard;
    const at::Tensor& from = TensorAccess::Unwrap(t);
    if (!device.is_cuda()) return TensorAccess::Wrap(from.to(at::kCPU));
    const at::Device to(at::kCUDA, static_cast<c10::DeviceIndex>(device.index));
    if (from.is_cuda()) return TensorAccess::Wrap(from.to(to));  // device to device (copy engine)
    // Host to device through pinned memory: the copy is queued on the
    // thread's stream and the caching host allocator keeps the pinned
    // buffer until it has run.
    return TensorAccess::Wrap(from.contiguous().pin_memory().to(to, /*non_blocking=*/true));
  } catch (...) {
    return internal::CurrentExceptionToStatus(StrCat("copying ", t.DebugString(), " to ", device.ToString()));
  }
}

}  // namespace slicesched::executor
