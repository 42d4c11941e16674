// The NCCL transfer backend: compiled wherever CUDA and NCCL are found; the
// tests that move bytes need two CUDA devices and skip cleanly without them.
#include "slicesched/executor/nccl/nccl_transfer.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <numeric>
#include <vector>

namespace slicesched::executor {
namespace {

TEST(NcclTransfer, RefusesDevicesThatDoNotExist) {
  const int n = CudaDeviceCount();
  auto b = NcclTransferBackend::Create({n + 3});
  EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition) << b.status();
  EXPECT_EQ(NcclTransferBackend::Create({}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(NcclTransfer, MovesBytesBetweenTwoGpus) {
  if (CudaDeviceCount() < 2) GTEST_SKIP() << "needs 2 CUDA devices, found " << CudaDeviceCount();
  auto backend = NcclTransferBackend::Create({0, 1});
  ASSERT_TRUE(backend.ok()) << backend.status();
  for (size_t size : {size_t{1}, size_t{4096}, size_t{3} << 20}) {
    std::vector<std::byte> host(size);
    for (size_t i = 0; i < size; ++i) host[i] = static_cast<std::byte>((i * 131 + size) & 0xff);
    auto from = AllocateCudaBuffer(DeviceId(0), 0, size);
    ASSERT_TRUE(from.ok()) << from.status();
    ASSERT_TRUE(CopyToCuda(*from, host.data(), size).ok());
    Buffer to;  // the executor's Recv reserved it; Send allocates the memory
    to.bytes = Bytes(static_cast<int64_t>(size));
    to.device = DeviceId(1);
    TransferCall call{.node = NodeId(1), .src = DeviceId(0), .dst = DeviceId(1), .bytes = to.bytes,
                      .from = &*from, .to = &to};
    ASSERT_TRUE((*backend)->Send(call).ok());
    ASSERT_EQ(to.kind, kCudaBytesPayload);
    std::vector<std::byte> back(size);
    ASSERT_TRUE(CopyFromCuda(to, back.data(), size).ok());
    EXPECT_EQ(back, host) << size << " bytes";
  }
}

TEST(NcclTransfer, RejectsHostPayloads) {
  if (CudaDeviceCount() < 2) GTEST_SKIP() << "needs 2 CUDA devices, found " << CudaDeviceCount();
  auto backend = NcclTransferBackend::Create({0, 1});
  ASSERT_TRUE(backend.ok()) << backend.status();
  Buffer from, to;
  from.kind = kHostBytesPayload;
  TransferCall call{.node = NodeId(2), .src = DeviceId(0), .dst = DeviceId(1), .bytes = Bytes(0),
                    .from = &from, .to = &to};
  EXPECT_EQ((*backend)->Send(call).code(), absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace slicesched::executor
