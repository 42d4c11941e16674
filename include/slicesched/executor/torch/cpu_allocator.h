// A per-thread cache of LibTorch's CPU tensor memory, for device threads.
//
// Why: an operator allocates and frees a few dozen tensors, and glibc serves
// each from the thread's arena with posix_memalign, whose bin search and
// chunk splitting depend on what else the arena holds. On a device thread
// it holds the KV caches and outputs of every instance in flight (until the
// owner retires them), so the same operators ran ~1-2% slower there than in
// a loop that frees everything at once (docs/design/executor.md). With the
// cache, a thread that opted in gets each block back from
// a last-in-first-out list of its size class (the block it freed last, still
// in cache), whatever else is alive.
//
// How: the first opt-in installs a c10::Allocator as LibTorch's CPU
// allocator (process-wide, as LibTorch allows only one). A thread that did
// not opt in is served by c10::alloc_cpu as c10's default CPU allocator
// would, plus a 64-byte header. On an opted-in thread, requests of 1 byte to
// kCpuCacheMaxBlock are rounded up to a size class and served from the
// thread's free list of that class, or from c10::alloc_cpu when it is empty;
// larger ones are served uncached. Every block starts with a header naming
// its class, so one deleter frees any block on any thread (raw_allocate works
// too). A cached-class block freed on an opted-in thread goes to that
// thread's list (on any other thread it is freed at once); when that would take the
// thread's cache past kCpuCacheMaxBytes, every block it holds is freed
// first (what fills it is sizes not asked for again, e.g. a KV cache that
// grows by one token per decode step). A thread's cached blocks are freed
// when it exits. The cache is memory the device's DevicePool does not account:
// at most kCpuCacheMaxBytes per device thread. Torch-free header.
#pragma once

#include <cstddef>
#include <cstdint>

namespace slicesched::executor {

// Largest request served from the cache, and most bytes a thread keeps
// cached (free blocks, by their class size).
inline constexpr size_t kCpuCacheMaxBlock = size_t{1} << 20;
inline constexpr size_t kCpuCacheMaxBytes = size_t{64} << 20;

// Makes LibTorch's tensor allocations on this thread use the cache
// (idempotent; there is no opting out: the cache goes with the thread).
void UseCachingCpuAllocatorOnThisThread();

struct CpuCacheStats {
  bool enabled = false;      // this thread opted in
  int64_t hits = 0;          // requests served from the thread's free lists
  int64_t misses = 0;        // requests that allocated a new block
  int64_t cached_bytes = 0;  // free blocks held now, by class size
  int64_t released = 0;      // cached blocks freed because the cache was full
};

// This thread's counters (all zero on a thread that did not opt in).
CpuCacheStats CachingCpuAllocatorStatsOfThisThread();

}  // namespace slicesched::executor
