// Tests for ThreadPool. Deterministic: completion is observed through
// counters, notifications and the pool's own draining destructor, never by
// sleeping.

#include "slicesched/common/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace slicesched {
namespace {

TEST(ThreadPoolTest, RunsEveryScheduledTask) {
  constexpr int kTasks = 1000;
  std::atomic<int> ran{0};
  absl::BlockingCounter done(kTasks);
  ThreadPool pool(4);
  EXPECT_EQ(pool.num_threads(), 4);
  for (int i = 0; i < kTasks; ++i) {
    pool.Schedule([&] {
      ran.fetch_add(1);
      done.DecrementCount();
    });
  }
  done.Wait();
  EXPECT_EQ(ran.load(), kTasks);
}

TEST(ThreadPoolTest, DestructorDrainsQueuedWork) {
  std::atomic<int> ran{0};
  absl::Notification release;
  {
    ThreadPool pool(1);
    // The only worker blocks until released, so the other tasks are still
    // queued when the destructor starts.
    pool.Schedule([&] { release.WaitForNotification(); });
    for (int i = 0; i < 100; ++i) pool.Schedule([&] { ran.fetch_add(1); });
    release.Notify();
  }
  EXPECT_EQ(ran.load(), 100);
}

TEST(ThreadPoolTest, TasksMayScheduleMoreTasks) {
  std::atomic<int> ran{0};
  {
    ThreadPool pool(2);
    for (int i = 0; i < 10; ++i) {
      pool.Schedule([&pool, &ran] {
        ran.fetch_add(1);
        pool.Schedule([&ran] { ran.fetch_add(1); });
      });
    }
  }
  EXPECT_EQ(ran.load(), 20);
}

TEST(ThreadPoolTest, AcceptsMoveOnlyTasks) {
  auto value = std::make_unique<int>(7);
  int seen = 0;
  absl::Notification done;
  ThreadPool pool(1);
  pool.Schedule([v = std::move(value), &seen, &done] {
    seen = *v;
    done.Notify();
  });
  done.WaitForNotification();
  EXPECT_EQ(seen, 7);
}

TEST(ThreadPoolTest, RunsTasksConcurrently) {
  // Two tasks that each wait for the other can only finish if they run on
  // different workers at the same time.
  ThreadPool pool(2);
  absl::Notification a_started, b_started;
  absl::BlockingCounter done(2);
  pool.Schedule([&] {
    a_started.Notify();
    b_started.WaitForNotification();
    done.DecrementCount();
  });
  pool.Schedule([&] {
    b_started.Notify();
    a_started.WaitForNotification();
    done.DecrementCount();
  });
  done.Wait();
}

TEST(ParallelForTest, ZeroIterationsDoesNothing) {
  ThreadPool pool(2);
  bool called = false;
  pool.ParallelFor(0, [&](size_t) { called = true; });
  EXPECT_FALSE(called);
}

TEST(ParallelForTest, VisitsEveryIndexExactlyOnce) {
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    for (size_t n :
         {size_t{1}, size_t{2}, size_t{3}, size_t{17}, size_t{1000}}) {
      std::vector<std::atomic<int>> hits(n);
      pool.ParallelFor(n, [&](size_t i) { hits[i].fetch_add(1); });
      for (size_t i = 0; i < n; ++i) {
        EXPECT_EQ(hits[i].load(), 1)
            << "threads=" << threads << " n=" << n << " i=" << i;
      }
    }
  }
}

TEST(ParallelForTest, CallerParticipates) {
  // With the only worker blocked, the calling thread must do all the work.
  ThreadPool pool(1);
  absl::Notification release;
  pool.Schedule([&] { release.WaitForNotification(); });
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<int> on_caller{0};
  pool.ParallelFor(50, [&](size_t) {
    if (std::this_thread::get_id() == caller) on_caller.fetch_add(1);
  });
  EXPECT_EQ(on_caller.load(), 50);
  release.Notify();
}

TEST(ParallelForTest, UsesWorkersToo) {
  // Index 0 blocks until some other index has run on another thread, which
  // proves that the work is really shared. (With one index per thread the
  // caller cannot finish alone.)
  ThreadPool pool(2);
  absl::Notification other_ran;
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<bool> off_caller{false};
  pool.ParallelFor(2, [&](size_t i) {
    if (std::this_thread::get_id() != caller) off_caller = true;
    if (i == 0) {
      other_ran.WaitForNotification();
    } else {
      other_ran.Notify();
    }
  });
  EXPECT_TRUE(off_caller.load());
}

TEST(ParallelForTest, NestedInsideATaskOfTheSamePool) {
  ThreadPool pool(1);
  std::atomic<int> sum{0};
  absl::Notification done;
  pool.Schedule([&] {
    // The only worker is busy running this task; ParallelFor must still
    // complete by running everything on this thread.
    pool.ParallelFor(10, [&](size_t i) { sum.fetch_add(static_cast<int>(i)); });
    done.Notify();
  });
  done.WaitForNotification();
  EXPECT_EQ(sum.load(), 45);
}

TEST(ParallelForTest, WritesAreVisibleAfterReturn) {
  ThreadPool pool(3);
  std::vector<int> out(10000, 0);  // plain ints: ParallelFor must synchronise
  pool.ParallelFor(out.size(),
                   [&](size_t i) { out[i] = static_cast<int>(i) * 2; });
  for (size_t i = 0; i < out.size(); ++i)
    ASSERT_EQ(out[i], static_cast<int>(i) * 2);
}

}  // namespace
}  // namespace slicesched
