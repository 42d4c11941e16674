// The per-thread cache of LibTorch's CPU tensor memory (see cpu_allocator.h).
// Torch TU, but c10 headers only (no ATen): cheap to compile.
#include "slicesched/executor/torch/cpu_allocator.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <array>
#include <memory>
#include <mutex>
#include <vector>

namespace slicesched::executor {
namespace {

// Each cached block starts with a header that names its class; the data
// follows at kHeader, which keeps it at c10's 64-byte alignment.
constexpr size_t kHeader = 64;
// Classes: multiples of 64 bytes up to 64 KiB, then of 4 KiB up to
// kCpuCacheMaxBlock (at most 6% of a block unused).
constexpr size_t kSmallStep = 64;
constexpr size_t kSmallMax = size_t{64} << 10;
constexpr size_t kLargeStep = size_t{4} << 10;
constexpr size_t kSmallClasses = kSmallMax / kSmallStep;
constexpr size_t kClasses = kSmallClasses + (kCpuCacheMaxBlock - kSmallMax) / kLargeStep;
static_assert(kSmallMax % kSmallStep == 0 && (kCpuCacheMaxBlock - kSmallMax) % kLargeStep == 0);

// n in [1, kCpuCacheMaxBlock].
size_t ClassOf(size_t n) {
  if (n <= kSmallMax) return (n - 1) / kSmallStep;
  return kSmallClasses + (n - kSmallMax - 1) / kLargeStep;
}

size_t ClassBytes(size_t c) {
  if (c < kSmallClasses) return (c + 1) * kSmallStep;
  return kSmallMax + (c - kSmallClasses + 1) * kLargeStep;
}

// The size class of a block served without the cache (a thread that did
// not opt in, or a request above kCpuCacheMaxBlock): freed at once.
constexpr uint32_t kUncached = UINT32_MAX;

struct Header {
  uint32_t size_class;
};
static_assert(sizeof(Header) <= kHeader);

struct ThreadCache {
  std::array<std::vector<void*>, kClasses> free;  // last in, first out
  size_t bytes = 0;
  CpuCacheStats stats;

  // Frees every cached block.
  void Flush() {
    for (std::vector<void*>& list : free) {
      for (void* block : list) c10::free_cpu(block);
      stats.released += static_cast<int64_t>(list.size());
      list.clear();
    }
    bytes = 0;
  }
  ~ThreadCache() { Flush(); }
};

// The thread's cache, if it opted in. The pointer (trivially destructible)
// outlives the owner below, so a tensor freed by a later thread_local
// destructor of this thread finds no cache and frees its block at once.
thread_local ThreadCache* tls_cache = nullptr;

struct CacheOwner {
  std::unique_ptr<ThreadCache> cache;
  ~CacheOwner() { tls_cache = nullptr; }  // before `cache` frees the blocks
};
thread_local CacheOwner tls_owner;

void CachedDelete(void* data) {
  if (data == nullptr) return;
  c10::profiledCPUMemoryReporter().Delete(data);
  void* block = static_cast<char*>(data) - kHeader;
  const uint32_t c = static_cast<const Header*>(block)->size_class;
  ThreadCache* cache = tls_cache;
  if (cache == nullptr || c == kUncached) {
    c10::free_cpu(block);
    return;
  }
  // Full: start afresh rather than stop caching. What fills the cache is
  // sizes that are not asked for again (a KV cache grows by one token per
  // decode step); the sizes in use come back at once.
  if (cache->bytes + ClassBytes(c) > kCpuCacheMaxBytes) cache->Flush();
  cache->free[c].push_back(block);
  cache->bytes += ClassBytes(c);
}

class CachingCpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    ThreadCache* cache = tls_cache;
    void* block;
    if (cache == nullptr || n == 0 || n > kCpuCacheMaxBlock) {
      // Every block carries the header, so one deleter frees any of them
      // on any thread (and raw_deleter() can name it).
      block = c10::alloc_cpu(kHeader + n);  // throws c10::Error when out of memory
      static_cast<Header*>(block)->size_class = kUncached;
    } else {
      const size_t c = ClassOf(n);
      std::vector<void*>& list = cache->free[c];
      if (!list.empty()) {
        block = list.back();
        list.pop_back();
        cache->bytes -= ClassBytes(c);
        ++cache->stats.hits;
      } else {
        block = c10::alloc_cpu(kHeader + ClassBytes(c));
        static_cast<Header*>(block)->size_class = static_cast<uint32_t>(c);
        ++cache->stats.misses;
      }
    }
    void* data = static_cast<char*>(block) + kHeader;
    c10::profiledCPUMemoryReporter().New(data, n);
    return {data, data, &CachedDelete, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &CachedDelete; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

}  // namespace

void UseCachingCpuAllocatorOnThisThread() {
  if (tls_cache != nullptr) return;
  static std::once_flag installed;
  std::call_once(installed, [] {
    // Never destroyed: tensors may be allocated while other statics go.
    static auto* allocator = new CachingCpuAllocator;
    // Priority 1: above c10's default registration (0).
    c10::SetCPUAllocator(allocator, /*priority=*/1);
  });
  tls_owner.cache = std::make_unique<ThreadCache>();
  tls_cache = tls_owner.cache.get();
  tls_cache->stats.enabled = true;
}

CpuCacheStats CachingCpuAllocatorStatsOfThisThread() {
  if (tls_cache == nullptr) return CpuCacheStats{};
  CpuCacheStats s = tls_cache->stats;
  s.cached_bytes = static_cast<int64_t>(tls_cache->bytes);
  return s;
}

}  // namespace slicesched::executor
