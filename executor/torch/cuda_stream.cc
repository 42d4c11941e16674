// The CUDA side of device.h: a device thread's binding, its completion
// event, and the caching allocator's statistics. Includes c10's CUDA headers
// only (no ATen), so it compiles in seconds; built when the CUDA toolkit is
// found (cuda_stream_none.cc otherwise). Every CUDA call goes through
// libc10_cuda (c10::Event, not c10::cuda::CUDAEvent, whose inline methods
// call the CUDA runtime directly): the binaries then need no libcudart of
// their own, and the process loads only the one the torch wheel's libraries
// load.
#include <c10/core/Allocator.h>
#include <c10/core/Event.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <optional>

#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "slicesched/executor/torch/aten_tensor.h"
#include "slicesched/executor/torch/device.h"

namespace slicesched::executor {
namespace {

// The stream this thread was bound to (BindThisThreadToCuda); the event it
// waits on is created once per thread, on the bound device.
struct Binding {
  int ordinal = -1;
  std::optional<c10::Event> done;
};
thread_local Binding binding;

}  // namespace

absl::Status BindThisThreadToCuda(int ordinal) {
  SLICESCHED_RETURN_IF_ERROR(CheckCudaDevice(ordinal));
  try {
    const auto index = static_cast<c10::DeviceIndex>(ordinal);
    c10::cuda::set_device(index);
    // A stream of the pool, not the default stream: the default stream would
    // serialise this device thread behind every other thread's kernels.
    c10::cuda::setCurrentCUDAStream(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, index));
    binding.ordinal = ordinal;
    binding.done.emplace(c10::DeviceType::CUDA, c10::EventFlag::PYTORCH_DEFAULT);  // no timing: cheapest
    return absl::OkStatus();
  } catch (...) {
    return internal::CurrentExceptionToStatus(StrCat("binding a device thread to cuda:", ordinal));
  }
}

absl::Status WaitForThisThreadsWork() {
  if (binding.ordinal < 0) return absl::OkStatus();
  try {
    binding.done->record(c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(binding.ordinal)));
    binding.done->synchronize();
    return absl::OkStatus();
  } catch (...) {
    return internal::CurrentExceptionToStatus(StrCat("waiting for the work queued on cuda:", binding.ordinal));
  }
}

absl::StatusOr<CudaAllocatorStats> QueryCudaAllocator(int ordinal) {
  SLICESCHED_RETURN_IF_ERROR(CheckCudaDevice(ordinal));
  try {
    const auto s = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(ordinal));
    const auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    CudaAllocatorStats out;
    out.allocated_bytes = s.allocated_bytes[all].current;
    out.reserved_bytes = s.reserved_bytes[all].current;
    out.peak_allocated_bytes = s.allocated_bytes[all].peak;
    out.live_allocations = s.allocation[all].current;
    out.alloc_retries = s.num_alloc_retries;
    out.ooms = s.num_ooms;
    return out;
  } catch (...) {
    return internal::CurrentExceptionToStatus(StrCat("reading the allocator statistics of cuda:", ordinal));
  }
}

}  // namespace slicesched::executor
