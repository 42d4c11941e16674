// Where a tensor lives, and what the executors need of the CUDA runtime,
// behind torch-free types.
//
// A `cuda` device of the cluster is one executor thread bound to one CUDA
// ordinal (several logical devices may share an ordinal: tests on a one-GPU
// machine). The thread owns a stream of its own, so its operators never
// serialise behind the default stream or another device thread's work, and
// it waits for an operator's completion on an event recorded after the
// operator's last kernel (never a synchronisation of the whole device).
//
// The functions here never throw. Without a GPU, a driver, or in a build
// without the CUDA toolkit they return FailedPrecondition naming what is
// missing; CPU tensors work everywhere.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "slicesched/executor/torch/tensor.h"

namespace slicesched::executor {

struct TensorDevice {
  enum class Kind : uint8_t { kCpu, kCuda };
  Kind kind = Kind::kCpu;
  int index = 0;  // the CUDA ordinal (0 for the CPU)

  static TensorDevice Cpu() { return {}; }
  static TensorDevice Cuda(int ordinal) { return {Kind::kCuda, ordinal}; }
  bool is_cuda() const { return kind == Kind::kCuda; }
  std::string ToString() const;  // "cpu", "cuda:0"
  friend bool operator==(const TensorDevice&, const TensorDevice&) = default;
};

// The device `t` lives on (the CPU for an undefined tensor).
TensorDevice DeviceOf(const Tensor& t);
// `t` on `device`: the same tensor when it is there already, else a copy
// (host to device through pinned memory; device to device on the copy
// engine). Errors: an undefined tensor, a device CheckCudaDevice rejects, or
// the copy's own failure (ResourceExhausted when the device is out of
// memory).
absl::StatusOr<Tensor> ToDevice(const Tensor& t, TensorDevice device);

// OK when this process can run operators on CUDA device `ordinal`; otherwise
// FailedPrecondition saying why: a build without CUDA, no driver or GPU, or
// an ordinal beyond the devices it sees.
absl::Status CheckCudaDevice(int ordinal);

// Binds the calling thread to CUDA device `ordinal` and to a stream of its
// own (from LibTorch's stream pool, never the default stream): every later
// LibTorch call of this thread queues its kernels there.
absl::Status BindThisThreadToCuda(int ordinal);

// Waits until the work this thread queued so far on its current stream has
// run: records an event and sleeps on it. The operator's kernels are then
// complete, and its errors (an illegal address, say) surface here as
// Internal. A no-op on a thread not bound to CUDA.
absl::Status WaitForThisThreadsWork();

// One CUDA device's caching-allocator statistics (current values).
struct CudaAllocatorStats {
  int64_t allocated_bytes = 0;       // held by live tensors, rounded as allocated
  int64_t reserved_bytes = 0;        // held from the driver (cached included)
  int64_t peak_allocated_bytes = 0;  // since the process started
  int64_t live_allocations = 0;      // live tensors' blocks
  int64_t alloc_retries = 0;         // cudaMalloc retried after freeing the cache
  int64_t ooms = 0;                  // allocations that failed
};
absl::StatusOr<CudaAllocatorStats> QueryCudaAllocator(int ordinal);

// The executors' memory accounting of one GPU against its caching
// allocator's. The allocator hands out blocks rounded up to a multiple of
// kCudaBlockRounding bytes, and allocated_bytes sums the rounded sizes; so,
// with no operator running, what the executors charged (their pools' bytes,
// whose tensors are the live allocations) plus what they hold outside the
// pools (the weights copied there) must equal the allocator's growth since
// the baseline, up to the rounding of each live block.
inline constexpr int64_t kCudaBlockRounding = 512;
struct DeviceMemoryAccount {
  int64_t pool_bytes = 0;        // DevicePool::used() of the devices on the GPU
  int64_t resident_bytes = 0;    // tensors outside the pools (weights)
};
struct MemoryReconciliation {
  int64_t accounted = 0;   // pool + resident bytes
  int64_t allocated = 0;   // the allocator's allocated bytes above the baseline
  int64_t tolerance = 0;   // live blocks x (kCudaBlockRounding - 1)
  int64_t difference() const { return allocated - accounted; }
  bool agrees() const { return difference() >= 0 && difference() <= tolerance; }
  std::string ToString() const;  // "accounted A, allocated B (difference D, rounding allows T)"
};
// `baseline` is the allocator's state before the executors allocated (its
// allocated bytes and live blocks are subtracted: other users of the GPU).
MemoryReconciliation ReconcileDeviceMemory(const DeviceMemoryAccount& ours, const CudaAllocatorStats& now,
                                           const CudaAllocatorStats& baseline);

}  // namespace slicesched::executor
