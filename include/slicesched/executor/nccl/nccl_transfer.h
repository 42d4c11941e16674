// Transfers between CUDA devices over NCCL (ncclSend/ncclRecv), the GPU
// counterpart of HostTransferBackend. Built only when CMake finds the CUDA
// toolkit and NCCL (SLICESCHED_HAVE_CUDA); this header is free of CUDA and
// NCCL types so that it can be included anywhere.
//
// Payload: a kCudaBytesPayload buffer (kernel.h) holds a CudaBytes, device memory owned
// by the buffer (freed with cudaFree on its device when the last reference
// goes). The executor's Recv has reserved the destination's bytes in its
// DevicePool; Send allocates the device memory for `to` on the destination
// if the buffer has none yet, then runs one NCCL group {ncclSend on the
// source's communicator, ncclRecv on the destination's} on per-device
// streams and waits for both. The executor's arbitration guarantees that a
// device is in at most one active transfer, so each communicator and stream
// is used by one transfer at a time; group launches are serialised by a
// mutex (NCCL requires a consistent launch order across ranks of a clique).
//
// Errors (CUDA or NCCL) come back as Status naming the call and the devices;
// nothing throws. A machine without a CUDA driver or device makes Create()
// fail with FailedPrecondition, and CudaDeviceCount() returns 0, which is how
// the tests skip.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "slicesched/executor/runtime/kernel.h"

namespace slicesched::executor {

// Device memory owned by a Buffer.
struct CudaBytes {
  void* ptr = nullptr;
  size_t size = 0;
  int device = -1;
  ~CudaBytes();  // cudaFree on `device`
};

// CUDA devices visible to this process; 0 when there is no driver or device.
int CudaDeviceCount();

// Allocates `size` bytes on CUDA device `device` as a kCudaBytesPayload
// buffer of `bytes` (the accounted size) on executor device `id`.
absl::StatusOr<Buffer> AllocateCudaBuffer(DeviceId id, int device, size_t size);
// Host <-> device copies for tests and loaders.
absl::Status CopyToCuda(const Buffer& b, const void* host, size_t size);
absl::Status CopyFromCuda(const Buffer& b, void* host, size_t size);

class NcclTransferBackend final : public TransferBackend {
 public:
  // Executor device i is CUDA device cuda_devices[i]; one NCCL communicator
  // per device (ncclCommInitAll) and one stream per device.
  static absl::StatusOr<std::unique_ptr<NcclTransferBackend>> Create(std::vector<int> cuda_devices);
  ~NcclTransferBackend() override;
  NcclTransferBackend(const NcclTransferBackend&) = delete;
  NcclTransferBackend& operator=(const NcclTransferBackend&) = delete;

  absl::Status Send(const TransferCall& call) override;

 private:
  struct State;
  explicit NcclTransferBackend(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
  absl::Mutex launch_mu_;
};

}  // namespace slicesched::executor
