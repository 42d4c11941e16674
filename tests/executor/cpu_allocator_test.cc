// The per-thread cache of LibTorch's CPU tensor memory (cpu_allocator.h).
// Each test runs its allocations on a thread of its own, so that which
// threads opted in is known (there is no opting out).
#include "slicesched/executor/torch/cpu_allocator.h"

#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>

#include <functional>
#include <optional>
#include <thread>
#include <vector>

#include "slicesched/executor/torch/tensor.h"

namespace slicesched::executor {
namespace {

void OnNewThread(const std::function<void()>& f) {
  std::thread t(f);
  t.join();
}

// A float tensor of n elements filled with `v` (one allocation of 4n bytes).
Tensor Filled(size_t n, float v) { return Tensor::FromFloat(std::vector<float>(n, v), {static_cast<int64_t>(n)}); }

TEST(CachingCpuAllocatorTest, OptedInThreadGetsItsFreedBlockBack) {
  OnNewThread([] {
    EXPECT_FALSE(CachingCpuAllocatorStatsOfThisThread().enabled);
    UseCachingCpuAllocatorOnThisThread();
    UseCachingCpuAllocatorOnThisThread();  // idempotent
    CpuCacheStats s = CachingCpuAllocatorStatsOfThisThread();
    EXPECT_TRUE(s.enabled);
    EXPECT_EQ(s.hits, 0);
    EXPECT_EQ(s.misses, 0);
    {
      const Tensor a = Filled(1000, 1.5f);  // 4,000 bytes: the 4,032-byte class
      EXPECT_EQ(a.ToFloat(), std::vector<float>(1000, 1.5f));
    }
    s = CachingCpuAllocatorStatsOfThisThread();
    EXPECT_EQ(s.misses, 1);
    EXPECT_EQ(s.cached_bytes, 4032);
    {
      const Tensor b = Filled(1001, 2.5f);  // 4,004 bytes: the same class, served from the cache
      EXPECT_EQ(b.ToFloat(), std::vector<float>(1001, 2.5f));
      s = CachingCpuAllocatorStatsOfThisThread();
      EXPECT_EQ(s.hits, 1);
      EXPECT_EQ(s.misses, 1);
      EXPECT_EQ(s.cached_bytes, 0);
      const Tensor c = Filled(2000, 3.0f);  // another class: a new block
      EXPECT_EQ(CachingCpuAllocatorStatsOfThisThread().misses, 2);
      // Past kCpuCacheMaxBlock: served uncached, not counted.
      const Tensor big = Filled(kCpuCacheMaxBlock / sizeof(float) + 1, 4.0f);
      EXPECT_EQ(big.ToFloat().back(), 4.0f);
      s = CachingCpuAllocatorStatsOfThisThread();
      EXPECT_EQ(s.hits, 1);
      EXPECT_EQ(s.misses, 2);
    }
    EXPECT_EQ(CachingCpuAllocatorStatsOfThisThread().cached_bytes, 4032 + 8000);
  });
}

TEST(CachingCpuAllocatorTest, OtherThreadsAreServedAsBeforeAndFreeAtOnce) {
  std::optional<Tensor> from_cache;
  OnNewThread([&] {
    UseCachingCpuAllocatorOnThisThread();
    from_cache = Filled(256, 7.0f);
    EXPECT_EQ(CachingCpuAllocatorStatsOfThisThread().misses, 1);
  });
  // The allocating thread is gone (its cache freed); the block it handed
  // out is still valid, and a thread that did not opt in frees it at once.
  OnNewThread([&] {
    EXPECT_EQ(from_cache->ToFloat(), std::vector<float>(256, 7.0f));
    const Tensor plain = Filled(256, 8.0f);  // uncached
    EXPECT_EQ(plain.ToFloat(), std::vector<float>(256, 8.0f));
    from_cache.reset();
    const CpuCacheStats s = CachingCpuAllocatorStatsOfThisThread();
    EXPECT_FALSE(s.enabled);
    EXPECT_EQ(s.hits + s.misses + s.cached_bytes + s.released, 0);
  });
}

TEST(CachingCpuAllocatorTest, AFullCacheStartsAfreshAndKeepsServingTheSizesInUse) {
  OnNewThread([] {
    UseCachingCpuAllocatorOnThisThread();
    const size_t mib = kCpuCacheMaxBlock / sizeof(float);  // floats in the largest class
    const int64_t fit = static_cast<int64_t>(kCpuCacheMaxBytes / kCpuCacheMaxBlock);
    auto live_then_freed = [&](int64_t blocks) {
      std::vector<Tensor> live;
      for (int64_t i = 0; i < blocks; ++i) live.push_back(Filled(mib, static_cast<float>(i)));
      EXPECT_EQ(live.back().ToFloat().front(), static_cast<float>(blocks - 1));
    };
    // Fill the cache exactly with blocks of a size not asked for again.
    live_then_freed(fit);
    CpuCacheStats s = CachingCpuAllocatorStatsOfThisThread();
    EXPECT_EQ(s.misses, fit);
    EXPECT_EQ(s.cached_bytes, static_cast<int64_t>(kCpuCacheMaxBytes));
    EXPECT_EQ(s.released, 0);
    // A size in use, freed and asked for again and again: its first free
    // finds the cache full and empties it, then it is served from the cache.
    for (int round = 0; round < 3; ++round) {
      const Tensor t = Filled(1024, static_cast<float>(round));  // 4 KiB
      EXPECT_EQ(t.ToFloat().back(), static_cast<float>(round));
    }
    s = CachingCpuAllocatorStatsOfThisThread();
    EXPECT_EQ(s.hits, 2);
    EXPECT_EQ(s.misses, fit + 1);
    EXPECT_EQ(s.released, fit);
    EXPECT_EQ(s.cached_bytes, 4096);
    // Never more than the bound: 80 MiB freed after the 4 KiB block.
    live_then_freed(80);
    s = CachingCpuAllocatorStatsOfThisThread();
    EXPECT_EQ(s.released, fit + fit);  // 4 KiB + 63 MiB, then the 64th emptied it
    EXPECT_EQ(s.cached_bytes, static_cast<int64_t>((80 - 63) * kCpuCacheMaxBlock));
  });
}

// LibTorch's raw interface (raw_allocate / raw_deallocate) frees any block
// with the same deleter, whichever thread allocated it and whether it was
// cached: every block names its class in its header.
TEST(CachingCpuAllocatorTest, RawAllocationsWorkOnEveryThread) {
  void* cached = nullptr;
  void* uncached = nullptr;
  OnNewThread([&] {
    UseCachingCpuAllocatorOnThisThread();
    c10::Allocator* a = c10::GetCPUAllocator();
    ASSERT_NE(a->raw_deleter(), nullptr);
    cached = a->raw_allocate(100);
    uncached = a->raw_allocate(kCpuCacheMaxBlock + 1);
    static_cast<char*>(cached)[99] = 1;
    static_cast<char*>(uncached)[kCpuCacheMaxBlock] = 2;
    EXPECT_EQ(CachingCpuAllocatorStatsOfThisThread().misses, 1);
    void* again = a->raw_allocate(64);  // freed here: back to this thread's list
    a->raw_deallocate(again);
    EXPECT_EQ(CachingCpuAllocatorStatsOfThisThread().cached_bytes, 64);
  });
  OnNewThread([&] {  // did not opt in: both are freed at once
    c10::Allocator* a = c10::GetCPUAllocator();
    void* plain = a->raw_allocate(100);
    static_cast<char*>(plain)[99] = 3;
    a->raw_deallocate(plain);
    a->raw_deallocate(cached);
    a->raw_deallocate(uncached);
    EXPECT_FALSE(CachingCpuAllocatorStatsOfThisThread().enabled);
  });
}

}  // namespace
}  // namespace slicesched::executor
