// ReconcileDeviceMemory (device.h). Torch-free.
#include "slicesched/common/strings.h"
#include "slicesched/executor/torch/device.h"

namespace slicesched::executor {

MemoryReconciliation ReconcileDeviceMemory(const DeviceMemoryAccount& ours, const CudaAllocatorStats& now,
                                           const CudaAllocatorStats& baseline) {
  MemoryReconciliation r;
  r.accounted = ours.pool_bytes + ours.resident_bytes;
  r.allocated = now.allocated_bytes - baseline.allocated_bytes;
  const int64_t blocks = now.live_allocations - baseline.live_allocations;
  r.tolerance = (blocks > 0 ? blocks : 0) * (kCudaBlockRounding - 1);
  return r;
}

std::string MemoryReconciliation::ToString() const {
  return StrCat("accounted ", accounted, " B, allocated ", allocated, " B (difference ", difference(),
                " B, the allocator's rounding allows 0 to ", tolerance, " B)");
}

}  // namespace slicesched::executor
