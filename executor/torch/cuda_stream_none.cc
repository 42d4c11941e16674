// device.h's CUDA functions in a build configured without the CUDA toolkit:
// the process can still hold a CUDA build of LibTorch, but slicesched was
// built without the headers to drive its streams, so every CUDA request is
// refused with the reason (CheckCudaDevice says the same).
#include "slicesched/executor/torch/device.h"

namespace slicesched::executor {

absl::Status BindThisThreadToCuda(int ordinal) { return CheckCudaDevice(ordinal); }

absl::Status WaitForThisThreadsWork() { return absl::OkStatus(); }

absl::StatusOr<CudaAllocatorStats> QueryCudaAllocator(int ordinal) {
  const absl::Status refused = CheckCudaDevice(ordinal);  // never OK in this build
  return refused.ok() ? absl::InternalError("CheckCudaDevice accepted a device in a build without CUDA") : refused;
}

}  // namespace slicesched::executor
