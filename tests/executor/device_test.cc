// Tensor placement (device.h): CPU tensors everywhere; CUDA refusals that
// name what is missing; the memory reconciliation against a fake
// allocator's statistics; and, on a machine with a GPU, the Llama serving
// and training operators on cuda:0 against the CPU with the allocator's
// accounting.
// Torch-free TU.
#include "slicesched/executor/torch/device.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cuda_or_skip.h"
#include "slicesched/executor/llama/llama_ops.h"
#include "slicesched/executor/train/train_ops.h"
#include "slicesched/gmg/llama.h"

namespace slicesched::executor {
namespace {

using ::testing::HasSubstr;

TEST(TensorDeviceTest, NamesAndEquality) {
  EXPECT_EQ(TensorDevice::Cpu().ToString(), "cpu");
  EXPECT_EQ(TensorDevice::Cuda(3).ToString(), "cuda:3");
  EXPECT_EQ(TensorDevice::Cuda(1), TensorDevice::Cuda(1));
  EXPECT_NE(TensorDevice::Cuda(0), TensorDevice::Cpu());
  EXPECT_NE(TensorDevice::Cuda(0), TensorDevice::Cuda(1));
}

TEST(TensorDeviceTest, CpuTensorsStayWhereTheyAre) {
  const std::vector<float> values = {1, 2, 3, 4, 5, 6};
  const Tensor t = Tensor::FromFloat(values, {2, 3});
  EXPECT_EQ(DeviceOf(t), TensorDevice::Cpu());
  EXPECT_EQ(DeviceOf(Tensor()), TensorDevice::Cpu());
  absl::StatusOr<Tensor> same = ToDevice(t, TensorDevice::Cpu());
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ(same->ToFloat(), values);
  absl::StatusOr<Tensor> undefined = ToDevice(Tensor(), TensorDevice::Cpu());
  EXPECT_EQ(undefined.status().code(), absl::StatusCode::kInvalidArgument);
}

// No machine has a 1000th GPU: every refusal is FailedPrecondition and names
// the device, here or on a GPU machine.
TEST(TensorDeviceTest, AnUnusableCudaDeviceIsRefusedWithTheReason) {
  const absl::Status s = CheckCudaDevice(1000);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("cuda:1000"));
  EXPECT_EQ(BindThisThreadToCuda(1000).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(QueryCudaAllocator(1000).status().code(), absl::StatusCode::kFailedPrecondition);
  const std::vector<float> values = {1, 2};
  EXPECT_EQ(ToDevice(Tensor::FromFloat(values, {2}), TensorDevice::Cuda(1000)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // A thread never bound to a GPU has no work to wait for.
  EXPECT_TRUE(WaitForThisThreadsWork().ok());
}

TEST(TensorDeviceTest, WeightsOnTheirOwnDeviceAreShared) {
  auto dims = LlamaPreset("tiny");
  ASSERT_TRUE(dims.ok());
  auto w = LlamaWeights::FromSeed(*dims, 3);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->device(), TensorDevice::Cpu());
  auto same = (*w)->OnDevice(TensorDevice::Cpu());
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ((*same)->embed_tokens().MaxAbsDiff((*w)->embed_tokens()), 0.0);
  auto nowhere = (*w)->OnDevice(TensorDevice::Cuda(1000));
  EXPECT_EQ(nowhere.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(nowhere.status().message()), HasSubstr("model 'tiny'"));
}

// The reconciliation with a fake allocator's statistics: 3 live tensors of
// 1000, 512 and 24 bytes are blocks of 1024, 512 and 512 bytes.
TEST(MemoryReconciliationTest, AgreesUpToTheAllocatorsRounding) {
  const CudaAllocatorStats baseline{.allocated_bytes = 4096, .live_allocations = 2};
  const DeviceMemoryAccount ours{.pool_bytes = 1000 + 512, .resident_bytes = 24};
  CudaAllocatorStats now{.allocated_bytes = 4096 + 1024 + 512 + 512, .live_allocations = 2 + 3};
  MemoryReconciliation r = ReconcileDeviceMemory(ours, now, baseline);
  EXPECT_EQ(r.accounted, 1536);
  EXPECT_EQ(r.allocated, 2048);
  EXPECT_EQ(r.tolerance, 3 * 511);
  EXPECT_TRUE(r.agrees()) << r.ToString();

  // A tensor the executors charged but the allocator never held (it lives
  // elsewhere): the allocator holds less than accounted.
  now.allocated_bytes = 4096 + 1024;
  now.live_allocations = 2 + 1;
  r = ReconcileDeviceMemory(ours, now, baseline);
  EXPECT_LT(r.difference(), 0);
  EXPECT_FALSE(r.agrees()) << r.ToString();

  // A tensor the allocator holds that nobody accounted for (a leak).
  now.allocated_bytes = 4096 + 1024 + 512 + 512 + 2048;
  now.live_allocations = 2 + 4;
  r = ReconcileDeviceMemory(ours, now, baseline);
  EXPECT_EQ(r.difference(), 2048 + 512);
  EXPECT_FALSE(r.agrees()) << r.ToString();
  EXPECT_THAT(r.ToString(), HasSubstr("difference 2560 B"));
}

// ---- on a GPU -------------------------------------------------------------

class CudaOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SLICESCHED_CUDA_OR_SKIP(0);
    ASSERT_TRUE(BindThisThreadToCuda(0).ok());
  }
};

// The first hidden state of a prompt and a decode step, on cuda:0 and on
// the CPU, for the same weights: equal within f32 rounding, and within bf16
// rounding for bf16 weights. The KV cache stays on the GPU.
TEST_F(CudaOpsTest, FusedLayersMatchTheCpu) {
  auto dims = LlamaPreset("tiny");
  ASSERT_TRUE(dims.ok());
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    auto f32 = LlamaWeights::FromSeed(*dims, 11);
    ASSERT_TRUE(f32.ok());
    auto cpu = (*f32)->WithDType(dtype);
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    const CudaAllocatorStats before = *QueryCudaAllocator(0);
    auto gpu = (*cpu)->OnDevice(TensorDevice::Cuda(0));
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    EXPECT_EQ((*gpu)->device(), TensorDevice::Cuda(0));
    const MemoryReconciliation weights = ReconcileDeviceMemory(
        {.resident_bytes = (*gpu)->TotalBytes().count()}, *QueryCudaAllocator(0), before);
    EXPECT_TRUE(weights.agrees()) << weights.ToString();

    const std::vector<int64_t> prompt = {5, 9, 11, 2, 7, 3};
    const Tensor ids = Tensor::FromInt64(prompt, {1, 6});
    auto on_cpu = Embedding(**cpu, ids);
    auto on_gpu = Embedding(**gpu, ids);
    ASSERT_TRUE(on_cpu.ok() && on_gpu.ok());
    EXPECT_EQ(DeviceOf(*on_gpu), TensorDevice::Cuda(0));
    KvCache cache_cpu, cache_gpu;
    auto h_cpu = FusedLayers(**cpu, 0, *on_cpu, &cache_cpu, 0);
    auto h_gpu = FusedLayers(**gpu, 0, *on_gpu, &cache_gpu, 0);
    ASSERT_TRUE(h_cpu.ok() && h_gpu.ok()) << h_gpu.status();
    EXPECT_EQ(DeviceOf(cache_gpu.k()), TensorDevice::Cuda(0));
    const double tol = dtype == DType::kF32 ? 1e-4 : 5e-2;
    auto back = ToDevice(*h_gpu, TensorDevice::Cpu());
    ASSERT_TRUE(back.ok());
    EXPECT_LE(back->MaxAbsDiff(*h_cpu), tol);
    // One decode step against the cached prompt.
    const std::vector<int64_t> next = {13};
    auto d_cpu = Embedding(**cpu, Tensor::FromInt64(next, {1, 1}));
    auto d_gpu = Embedding(**gpu, Tensor::FromInt64(next, {1, 1}));
    ASSERT_TRUE(d_cpu.ok() && d_gpu.ok());
    auto s_cpu = FusedLayers(**cpu, 0, *d_cpu, &cache_cpu, 6);
    auto s_gpu = FusedLayers(**gpu, 0, *d_gpu, &cache_gpu, 6);
    ASSERT_TRUE(s_cpu.ok() && s_gpu.ok()) << s_gpu.status();
    ASSERT_TRUE(WaitForThisThreadsWork().ok());
    EXPECT_LE(ToDevice(*s_gpu, TensorDevice::Cpu())->MaxAbsDiff(*s_cpu), tol);
  }
}

// One training step (LoRA on the tiny preset, f32, two tasks with padded
// rows) on cuda:0 and on the CPU, from the same adapters: losses and every
// adapter gradient agree within f32 rounding, and the gradients come back to
// host memory, where the optimizer runs.
TEST_F(CudaOpsTest, TrainingGradientsMatchTheCpu) {
  auto dims = LlamaPreset("tiny");
  ASSERT_TRUE(dims.ok());
  auto cpu = LlamaWeights::FromSeed(*dims, 5);
  ASSERT_TRUE(cpu.ok());
  auto gpu = (*cpu)->OnDevice(TensorDevice::Cuda(0));
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  auto a = TaskAdapters::Init(*dims, LoraConfig{4, 8.0}, dims->vocab, 21);
  auto b = TaskAdapters::Init(*dims, LoraConfig{4, 8.0}, 3, 22);
  ASSERT_TRUE(a.ok() && b.ok());
  const std::vector<int64_t> ids = {3, 9, 27, 81, 243, 1, 2, 4, 8, 16, 5, 25, 125, 7, 49, 11};
  TrainBatch batch;
  batch.tokens = Tensor::FromInt64(ids, {4, 4});
  auto labels = NextTokenLabels(batch.tokens);
  ASSERT_TRUE(labels.ok());
  std::vector<int64_t> lab = labels->ToInt64();
  for (size_t i = 8; i < lab.size(); ++i) lab[i] = i % 4 == 3 ? static_cast<int64_t>(i % 3) : -1;  // task 1: classes
  batch.labels = Tensor::FromInt64(lab, {4, 4});
  batch.row_task = {0, 0, 1, 1};
  batch.row_pad = {0, 1, 0, 2};
  const TaskAdapters* slots[] = {&*a, &*b};
  auto on_cpu = ComputeGradients(**cpu, slots, batch, GradientPath::kPipelined);
  auto on_gpu = ComputeGradients(**gpu, slots, batch, GradientPath::kPipelined);
  ASSERT_TRUE(on_cpu.ok()) << on_cpu.status();
  ASSERT_TRUE(on_gpu.ok()) << on_gpu.status();
  for (size_t t = 0; t < 2; ++t) {
    EXPECT_NEAR(on_gpu->loss[t], on_cpu->loss[t], 1e-4 * std::max(1.0, std::fabs(on_cpu->loss[t])));
    const auto want = on_cpu->grads[t].NamedTensors();
    const auto got = on_gpu->grads[t].NamedTensors();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(DeviceOf(got[i].second), TensorDevice::Cpu()) << got[i].first;
      EXPECT_LE(got[i].second.MaxAbsDiff(want[i].second), 1e-4) << got[i].first;
    }
  }
}

}  // namespace
}  // namespace slicesched::executor
