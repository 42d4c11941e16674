#include "slicesched/ymir/stopping.h"

#include <vector>

#include "gtest/gtest.h"

namespace slicesched::ymir {
namespace {

TEST(Stopping, TargetIsWhatNormalTrainingReaches) {
  const std::vector<LossPoint> normal = {{0, 2.0}, {4, 1.5}, {8, 1.1}, {12, 1.0}, {16, 1.05}};
  auto t = NormalTarget(normal, 0.9);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_DOUBLE_EQ(*t, 2.0 - 0.9 * (2.0 - 1.0));
  EXPECT_DOUBLE_EQ(*NormalTarget(normal, 1.0), 1.0);  // the best loss itself
  EXPECT_EQ(NormalTarget(normal, 0.0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NormalTarget({}, 0.9).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Stopping, TransferChangesTheStepsNeverTheBar) {
  const std::vector<LossPoint> normal = {{0, 2.0}, {4, 1.5}, {8, 1.1}, {12, 1.0}};
  const double target = *NormalTarget(normal, 0.9);  // 1.1
  // The normal run reaches it exactly at step 8.
  auto n = StepsToTarget(normal, target, 20);
  ASSERT_TRUE(n.ok());
  EXPECT_DOUBLE_EQ(n->steps, 8.0);
  EXPECT_FALSE(n->censored);
  // A faster (transfer) run is measured against the same number: crossing
  // 1.1 between step 4 (1.3) and step 8 (0.9), interpolated to step 6.
  const std::vector<LossPoint> transfer = {{0, 2.0}, {4, 1.3}, {8, 0.9}};
  auto t = StepsToTarget(transfer, target, 20);
  ASSERT_TRUE(t.ok());
  EXPECT_DOUBLE_EQ(t->steps, 6.0);
  // A run already below the target at its start still needs its first
  // evaluated step (never 0).
  auto s = StepsToTarget({{0, 1.0}, {4, 0.9}}, target, 20);
  EXPECT_DOUBLE_EQ(s->steps, 4.0);
}

TEST(Stopping, RunHittingItsLimitIsCensored) {
  const std::vector<LossPoint> slow = {{0, 2.0}, {4, 1.8}, {8, 1.6}, {12, 1.0}};
  auto r = StepsToTarget(slow, 1.1, 8);  // reaches it only after the limit
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->censored);
  EXPECT_DOUBLE_EQ(r->steps, 9.0);
  auto never = StepsToTarget(slow, 0.5, 100);
  EXPECT_TRUE(never->censored);
  EXPECT_DOUBLE_EQ(never->steps, 101.0);
  EXPECT_EQ(ShouldStop(8, 1.6, 1.1, 8), StopReason::kCensored);
  EXPECT_EQ(ShouldStop(4, 1.0, 1.1, 8), StopReason::kReached);
  EXPECT_EQ(ShouldStop(0, 1.0, 1.1, 8), StopReason::kContinue);  // the start never counts
  EXPECT_EQ(ShouldStop(4, 1.8, 1.1, 8), StopReason::kContinue);
}

TEST(Stopping, BadCurvesAreNamed) {
  auto r = StepsToTarget({{0, 2.0}, {4, 1.0}, {4, 0.5}}, 1.1, 10);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(r.status().message()).find("point 2"), std::string::npos);
  EXPECT_EQ(StepsToTarget({{0, 2.0}}, 1.1, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace slicesched::ymir
