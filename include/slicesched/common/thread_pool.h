// A fixed-size pool of worker threads.
//
// Schedule() queues fire-and-forget work; ParallelFor() splits an index range
// over the workers and the calling thread and returns when every index has
// been processed. The destructor runs everything still queued, then joins.
// Each component that needs parallelism owns its pool; there is no shared
// global pool.
#pragma once

#include <cstddef>
#include <deque>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"

namespace slicesched {

class ThreadPool {
 public:
  // Starts `num_threads` workers; `num_threads` must be >= 1 (CHECK).
  explicit ThreadPool(int num_threads);
  // Runs all work that is still queued (including work scheduled by that
  // work), then joins the workers. Must not be called from a worker.
  ~ThreadPool();

  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(threads_.size()); }

  // Queues `fn` to run on some worker. Thread-safe; may be called from
  // inside a task.
  void Schedule(absl::AnyInvocable<void()> fn);

  // Calls fn(0), ..., fn(n - 1), each exactly once, spread over the workers
  // and the calling thread, and returns when all calls have returned. The
  // calls may run concurrently and in any order. Works for n == 0, for a pool
  // of one thread, and from inside a task of this pool (the caller then does
  // the work itself if no worker is free), so it cannot deadlock on a busy
  // pool.
  void ParallelFor(size_t n, absl::FunctionRef<void(size_t)> fn);

 private:
  void WorkerLoop();

  // mu_ guards the task queue and the shutdown flag. Workers wait on
  // work_available_ until the queue is non-empty or shutdown was requested.
  absl::Mutex mu_;
  absl::CondVar work_available_;
  std::deque<absl::AnyInvocable<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;

  // Written only by the constructor and destructor.
  std::vector<std::thread> threads_;
};

}  // namespace slicesched
