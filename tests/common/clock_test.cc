// Tests for SteadyClock and ManualClock.

#include "slicesched/common/clock.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "slicesched/common/units.h"

namespace slicesched {
namespace {

TEST(SteadyClockTest, StartsNearEpochAndNeverGoesBack) {
  SteadyClock clock;
  const Timestamp first = clock.Now();
  EXPECT_GE(first, Timestamp::Epoch());
  // The epoch is the construction time: far less than an hour has passed.
  EXPECT_LT(first, Timestamp::Epoch() + Duration::Seconds(3600));
  Timestamp previous = first;
  for (int i = 0; i < 1000; ++i) {
    const Timestamp now = clock.Now();
    EXPECT_GE(now, previous);
    previous = now;
  }
}

TEST(SteadyClockTest, UsableThroughTheInterface) {
  SteadyClock steady;
  const Clock& clock = steady;
  EXPECT_FALSE(clock.Now().is_never());
}

TEST(ManualClockTest, StartsAtGivenTime) {
  EXPECT_EQ(ManualClock().Now(), Timestamp::Epoch());
  EXPECT_EQ(ManualClock(Timestamp::FromNanos(42)).Now(),
            Timestamp::FromNanos(42));
}

TEST(ManualClockTest, MovesOnlyWhenTold) {
  ManualClock clock;
  EXPECT_EQ(clock.Now(), clock.Now());
  EXPECT_EQ(clock.Advance(Duration::Millis(5)),
            Timestamp::Epoch() + Duration::Millis(5));
  EXPECT_EQ(clock.Now(), Timestamp::Epoch() + Duration::Millis(5));
  clock.Advance(Duration::Zero());
  EXPECT_EQ(clock.Now(), Timestamp::Epoch() + Duration::Millis(5));
  clock.SetTime(Timestamp::FromNanos(Duration::Seconds(2).nanos()));
  EXPECT_EQ(clock.Now().ToString(), "2.000000s");
  clock.SetTime(clock.Now());  // same time again is fine
  EXPECT_EQ(clock.Now().ToString(), "2.000000s");
}

TEST(ManualClockTest, CanAdvanceToInfinite) {
  ManualClock clock;
  clock.SetTime(Timestamp::Infinite());
  EXPECT_EQ(clock.Now(), Timestamp::Infinite());
}

TEST(ManualClockTest, ConcurrentAdvancesAllCount) {
  ManualClock clock;
  constexpr int kThreads = 4;
  constexpr int kStepsPerThread = 10000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&clock] {
      for (int i = 0; i < kStepsPerThread; ++i)
        clock.Advance(Duration::Nanos(1));
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(clock.Now().nanos(), int64_t{kThreads} * kStepsPerThread);
}

using ManualClockDeathTest = ::testing::Test;

TEST(ManualClockDeathTest, NegativeAdvanceIsFatal) {
  ManualClock clock(Timestamp::FromNanos(1000));
  EXPECT_DEATH(clock.Advance(Duration::Nanos(-1)), "negative duration");
}

TEST(ManualClockDeathTest, SetTimeBackwardsIsFatal) {
  ManualClock clock(Timestamp::FromNanos(1000));
  EXPECT_DEATH(clock.SetTime(Timestamp::FromNanos(999)), "backwards");
}

TEST(ManualClockDeathTest, AdvancePastInfiniteIsFatal) {
  ManualClock clock(Timestamp::Infinite() - Duration::Nanos(1));
  EXPECT_DEATH(clock.Advance(Duration::Nanos(2)), "overflows");
}

}  // namespace
}  // namespace slicesched
