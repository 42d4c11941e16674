// Implementation of ThreadPool (see thread_pool.h).

#include "slicesched/common/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <memory>
#include <utility>

#include "absl/base/internal/raw_logging.h"
#include "absl/synchronization/notification.h"

namespace slicesched {

ThreadPool::ThreadPool(int num_threads) {
  ABSL_RAW_CHECK(num_threads >= 1, "ThreadPool needs at least one thread");
  threads_.reserve(static_cast<size_t>(num_threads));
  for (int i = 0; i < num_threads; ++i) {
    threads_.emplace_back([this] { WorkerLoop(); });
  }
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
  }
  work_available_.SignalAll();
  for (std::thread& t : threads_) t.join();
}

void ThreadPool::Schedule(absl::AnyInvocable<void()> fn) {
  {
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(fn));
  }
  work_available_.Signal();
}

void ThreadPool::WorkerLoop() {
  while (true) {
    absl::AnyInvocable<void()> task;
    {
      absl::MutexLock lock(&mu_);
      while (queue_.empty() && !shutting_down_) work_available_.Wait(&mu_);
      // Drain before exiting: shutdown only wins once the queue is empty.
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

namespace {

// Shared by the caller of ParallelFor and the helper tasks it schedules. It is
// reference counted because a helper may start only after ParallelFor has
// returned (when the pool was busy); such a helper finds no index left and
// touches nothing but this state.
struct ParallelForState {
  ParallelForState(size_t n, absl::FunctionRef<void(size_t)> fn)
      : n(n), fn(fn), remaining(n) {}

  // Claims and runs indices until none are left. `fn` is only called for a
  // claimed index < n, i.e. while the caller is still blocked in ParallelFor,
  // so the FunctionRef (which points into the caller's frame) is still valid.
  void Run() {
    size_t done = 0;
    for (size_t i = next.fetch_add(1, std::memory_order_relaxed); i < n;
         i = next.fetch_add(1, std::memory_order_relaxed)) {
      fn(i);
      ++done;
    }
    if (done > 0 &&
        remaining.fetch_sub(done, std::memory_order_acq_rel) == done) {
      all_done.Notify();
    }
  }

  const size_t n;
  const absl::FunctionRef<void(size_t)> fn;
  std::atomic<size_t> next{0};
  std::atomic<size_t> remaining;
  absl::Notification all_done;
};

}  // namespace

void ThreadPool::ParallelFor(size_t n, absl::FunctionRef<void(size_t)> fn) {
  if (n == 0) return;
  if (n == 1) {
    fn(0);
    return;
  }
  auto state = std::make_shared<ParallelForState>(n, fn);
  const size_t helpers = std::min(n - 1, threads_.size());
  for (size_t h = 0; h < helpers; ++h) {
    Schedule([state] { state->Run(); });
  }
  state->Run();
  state->all_done.WaitForNotification();
}

}  // namespace slicesched
