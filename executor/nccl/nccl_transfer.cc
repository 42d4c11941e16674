// CUDA runtime + NCCL host code (no device code, no nvcc): see nccl_transfer.h.
#include "slicesched/executor/nccl/nccl_transfer.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <utility>

#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"

namespace slicesched::executor {
namespace {

absl::Status CudaError(cudaError_t e, absl::string_view what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(StrCat(what, ": CUDA error ", static_cast<int>(e), " (", cudaGetErrorString(e), ")"));
}

absl::Status NcclError(ncclResult_t r, absl::string_view what) {
  if (r == ncclSuccess) return absl::OkStatus();
  return absl::InternalError(StrCat(what, ": NCCL error ", static_cast<int>(r), " (", ncclGetErrorString(r), ")"));
}

const CudaBytes* CudaPayloadOf(const Buffer& b) {
  return b.kind == kCudaBytesPayload ? static_cast<const CudaBytes*>(b.payload.get()) : nullptr;
}

}  // namespace

CudaBytes::~CudaBytes() {
  if (ptr == nullptr) return;
  int previous = 0;
  if (cudaGetDevice(&previous) == cudaSuccess && cudaSetDevice(device) == cudaSuccess) {
    cudaFree(ptr);
    cudaSetDevice(previous);
  }
}

int CudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

absl::StatusOr<Buffer> AllocateCudaBuffer(DeviceId id, int device, size_t size) {
  SLICESCHED_RETURN_IF_ERROR(CudaError(cudaSetDevice(device), StrCat("cudaSetDevice(", device, ")")));
  auto bytes = std::make_shared<CudaBytes>();
  bytes->device = device;
  bytes->size = size;
  SLICESCHED_RETURN_IF_ERROR(
      CudaError(cudaMalloc(&bytes->ptr, size == 0 ? 1 : size), StrCat("cudaMalloc(", size, ") on GPU ", device)));
  Buffer b;
  b.bytes = Bytes(static_cast<int64_t>(size));
  b.device = id;
  b.kind = kCudaBytesPayload;
  b.payload = std::move(bytes);
  return b;
}

absl::Status CopyToCuda(const Buffer& b, const void* host, size_t size) {
  const CudaBytes* c = CudaPayloadOf(b);
  if (c == nullptr || c->size < size) return absl::InvalidArgumentError("CopyToCuda: not a large enough CUDA buffer");
  SLICESCHED_RETURN_IF_ERROR(CudaError(cudaSetDevice(c->device), "cudaSetDevice"));
  return CudaError(cudaMemcpy(c->ptr, host, size, cudaMemcpyHostToDevice), "cudaMemcpy to device");
}

absl::Status CopyFromCuda(const Buffer& b, void* host, size_t size) {
  const CudaBytes* c = CudaPayloadOf(b);
  if (c == nullptr || c->size < size) return absl::InvalidArgumentError("CopyFromCuda: not a large enough CUDA buffer");
  SLICESCHED_RETURN_IF_ERROR(CudaError(cudaSetDevice(c->device), "cudaSetDevice"));
  return CudaError(cudaMemcpy(host, c->ptr, size, cudaMemcpyDeviceToHost), "cudaMemcpy to host");
}

struct NcclTransferBackend::State {
  std::vector<int> cuda;  // executor device -> CUDA device
  std::vector<ncclComm_t> comms;
  std::vector<cudaStream_t> streams;
};

absl::StatusOr<std::unique_ptr<NcclTransferBackend>> NcclTransferBackend::Create(std::vector<int> cuda_devices) {
  if (cuda_devices.empty()) return absl::InvalidArgumentError("NcclTransferBackend: no devices");
  const int visible = CudaDeviceCount();
  for (int d : cuda_devices) {
    if (d < 0 || d >= visible) {
      return absl::FailedPreconditionError(
          StrCat("NcclTransferBackend: CUDA device ", d, " does not exist (", visible, " visible)"));
    }
  }
  auto state = std::make_unique<State>();
  state->cuda = std::move(cuda_devices);
  const int n = static_cast<int>(state->cuda.size());
  state->comms.assign(static_cast<size_t>(n), nullptr);
  SLICESCHED_RETURN_IF_ERROR(NcclError(ncclCommInitAll(state->comms.data(), n, state->cuda.data()), "ncclCommInitAll"));
  std::unique_ptr<NcclTransferBackend> b(new NcclTransferBackend(std::move(state)));
  for (int i = 0; i < n; ++i) {
    SLICESCHED_RETURN_IF_ERROR(CudaError(cudaSetDevice(b->state_->cuda[static_cast<size_t>(i)]), "cudaSetDevice"));
    cudaStream_t s = nullptr;
    SLICESCHED_RETURN_IF_ERROR(CudaError(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate"));
    b->state_->streams.push_back(s);
  }
  return b;
}

NcclTransferBackend::NcclTransferBackend(std::unique_ptr<State> state) : state_(std::move(state)) {}

NcclTransferBackend::~NcclTransferBackend() {
  for (size_t i = 0; i < state_->streams.size(); ++i) {
    cudaSetDevice(state_->cuda[i]);
    cudaStreamDestroy(state_->streams[i]);
  }
  for (ncclComm_t c : state_->comms) {
    if (c != nullptr) ncclCommDestroy(c);
  }
}

absl::Status NcclTransferBackend::Send(const TransferCall& call) {
  const size_t n = state_->cuda.size();
  const size_t src = call.src.value(), dst = call.dst.value();
  if (src >= n || dst >= n || src == dst) {
    return absl::InvalidArgumentError(StrCat("NCCL transfer ", call.node, ": devices ", src, " -> ", dst,
                                             " (", n, " devices)"));
  }
  if (call.from == nullptr || call.to == nullptr) {
    return absl::InvalidArgumentError(StrCat("NCCL transfer ", call.node, ": no source or destination buffer"));
  }
  const CudaBytes* from = CudaPayloadOf(*call.from);
  if (from == nullptr) {
    return absl::UnimplementedError(StrCat("NCCL transfer ", call.node, ": the source holds payload kind ",
                                           call.from->kind, ", not device memory"));
  }
  const size_t size = from->size;
  if (CudaPayloadOf(*call.to) == nullptr) {
    SLICESCHED_ASSIGN_OR_RETURN(Buffer fresh, AllocateCudaBuffer(call.dst, state_->cuda[dst], size));
    call.to->kind = fresh.kind;
    call.to->payload = std::move(fresh.payload);
  }
  const CudaBytes* to = CudaPayloadOf(*call.to);
  if (to->size < size) {
    return absl::InvalidArgumentError(
        StrCat("NCCL transfer ", call.node, ": receive buffer of ", to->size, " bytes for ", size));
  }
  const std::string what = StrCat("NCCL transfer ", call.node, " (GPU ", state_->cuda[src], " -> GPU ",
                                  state_->cuda[dst], ", ", size, " bytes)");
  {
    absl::MutexLock l(&launch_mu_);
    SLICESCHED_RETURN_IF_ERROR(NcclError(ncclGroupStart(), what));
    const ncclResult_t s = ncclSend(from->ptr, size, ncclChar, static_cast<int>(dst), state_->comms[src],
                                    state_->streams[src]);
    const ncclResult_t r = ncclRecv(to->ptr, size, ncclChar, static_cast<int>(src), state_->comms[dst],
                                    state_->streams[dst]);
    const ncclResult_t e = ncclGroupEnd();
    SLICESCHED_RETURN_IF_ERROR(NcclError(s, StrCat(what, ": ncclSend")));
    SLICESCHED_RETURN_IF_ERROR(NcclError(r, StrCat(what, ": ncclRecv")));
    SLICESCHED_RETURN_IF_ERROR(NcclError(e, StrCat(what, ": ncclGroupEnd")));
  }
  for (size_t d : {src, dst}) {
    SLICESCHED_RETURN_IF_ERROR(CudaError(cudaSetDevice(state_->cuda[d]), what));
    SLICESCHED_RETURN_IF_ERROR(CudaError(cudaStreamSynchronize(state_->streams[d]), StrCat(what, ": synchronize")));
  }
  return absl::OkStatus();
}

}  // namespace slicesched::executor
