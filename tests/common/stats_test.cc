#include "slicesched/common/stats.h"

#include <vector>

#include "gtest/gtest.h"

namespace slicesched {
namespace {

TEST(Stats, QuantilesInterpolateBetweenTheClosestRanks) {
  const std::vector<double> v = {4, 1, 3, 2};  // sorted: 1 2 3 4
  EXPECT_DOUBLE_EQ(Quantile(v, 0.0), 1.0);
  EXPECT_DOUBLE_EQ(Quantile(v, 1.0), 4.0);
  EXPECT_DOUBLE_EQ(Quantile(v, 0.25), 1.75);  // h = 0.75
  EXPECT_DOUBLE_EQ(Quantile(v, 0.75), 3.25);  // h = 2.25
  // Out-of-range q is clamped to the extremes.
  EXPECT_DOUBLE_EQ(Quantile(v, -1.0), 1.0);
  EXPECT_DOUBLE_EQ(Quantile(v, 2.0), 4.0);
}

TEST(Stats, MedianIsTheMiddleSampleOrTheMeanOfTheTwoMiddleOnes) {
  EXPECT_DOUBLE_EQ(Median({5, 1, 3}), 3.0);
  EXPECT_DOUBLE_EQ(Median({5, 1, 3, 10}), 4.0);
  EXPECT_DOUBLE_EQ(Median({7}), 7.0);
  EXPECT_DOUBLE_EQ(Median({}), 0.0);
  EXPECT_DOUBLE_EQ(QuantileOfSorted({}, 0.5), 0.0);
}

}  // namespace
}  // namespace slicesched
