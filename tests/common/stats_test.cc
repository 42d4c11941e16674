#include "slicesched/common/stats.h"

#include <cmath>
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

TEST(Stats, PercentageIsZeroWithoutADenominator) {
  EXPECT_DOUBLE_EQ(Percentage(1, 4), 25.0);
  EXPECT_DOUBLE_EQ(Percentage(5, 5), 100.0);
  EXPECT_DOUBLE_EQ(Percentage(1, 3), 100.0 / 3.0);
  EXPECT_DOUBLE_EQ(Percentage(0, 7), 0.0);
  EXPECT_EQ(Percentage(3, 0), 0.0);
  EXPECT_EQ(Percentage(2, -1), 0.0);
}

TEST(Stats, RootMeanSquare) {
  EXPECT_DOUBLE_EQ(RootMeanSquare({3, 4}), std::sqrt(12.5));  // (9 + 16) / 2
  EXPECT_DOUBLE_EQ(RootMeanSquare({-2, 2, -2, 2}), 2.0);
  EXPECT_EQ(RootMeanSquare({}), 0.0);
}

TEST(Stats, CosineSimilarityIsZeroForAnAllZeroVector) {
  EXPECT_DOUBLE_EQ(CosineSimilarity({1, 2, 2}, {2, 4, 4}), 1.0);  // 18 / sqrt(9 x 36)
  EXPECT_DOUBLE_EQ(CosineSimilarity({3, 4}, {4, 3}), 0.96);       // 24 / 25
  EXPECT_DOUBLE_EQ(CosineSimilarity({1, 0}, {1, 1}), 1.0 / std::sqrt(2.0));
  EXPECT_DOUBLE_EQ(CosineSimilarity({1, 0}, {-1, 0}), -1.0);
  EXPECT_EQ(CosineSimilarity({1, 0}, {0, 1}), 0.0);
  EXPECT_EQ(CosineSimilarity({0, 0}, {1, 1}), 0.0);
  EXPECT_EQ(CosineSimilarity({}, {}), 0.0);
}

TEST(Stats, PearsonCorrelationIsZeroForAConstantSample) {
  EXPECT_DOUBLE_EQ(PearsonCorrelation({1, 2, 3}, {2, 4, 6}), 1.0);
  EXPECT_DOUBLE_EQ(PearsonCorrelation({1, 2, 3}, {6, 4, 2}), -1.0);
  // Deviations from the means 2.5: x (-1.5, -0.5, 0.5, 1.5), y (-1.5, 0.5,
  // -0.5, 1.5); sxy = 4, sxx = syy = 5.
  EXPECT_DOUBLE_EQ(PearsonCorrelation({1, 2, 3, 4}, {1, 3, 2, 4}), 0.8);
  EXPECT_EQ(PearsonCorrelation({1, 2, 3}, {5, 5, 5}), 0.0);
  EXPECT_EQ(PearsonCorrelation({2, 2}, {1, 3}), 0.0);
  EXPECT_EQ(PearsonCorrelation({}, {}), 0.0);
}

TEST(Stats, FitLineIsLeastSquares) {
  const LinearFit exact = FitLine({0, 1, 2, 3}, {1, 3, 5, 7});
  EXPECT_NEAR(exact.intercept, 1.0, 1e-12);
  EXPECT_NEAR(exact.slope, 2.0, 1e-12);
  // Means 1.75 and 4; sxy = 14, sxx = 8.75: slope 1.6, intercept 4 - 1.6 x 1.75.
  const LinearFit f = FitLine({0, 1, 2, 4}, {1, 2, 6, 7});
  EXPECT_NEAR(f.slope, 1.6, 1e-12);
  EXPECT_NEAR(f.intercept, 1.2, 1e-12);
  // A constant x: slope 0 through the mean of y; no points: both 0.
  const LinearFit flat = FitLine({1, 1}, {2, 4});
  EXPECT_EQ(flat.slope, 0.0);
  EXPECT_DOUBLE_EQ(flat.intercept, 3.0);
  EXPECT_EQ(FitLine({}, {}).slope, 0.0);
  EXPECT_EQ(FitLine({}, {}).intercept, 0.0);
}

TEST(Stats, FitLeastSquaresRecoversAPlaneAndGivesAZeroRegressorNoWeight) {
  // y = 1 + 2 a - 3 b exactly, with an all-zero fourth regressor.
  std::vector<std::vector<double>> x;
  std::vector<double> y;
  for (double a : {0.0, 1.0, 2.0, 3.0}) {
    for (double b : {-1.0, 0.5, 2.0}) x.push_back({1.0, a, b, 0.0}), y.push_back(1 + 2 * a - 3 * b);
  }
  const std::vector<double> w = FitLeastSquares(x, y);
  ASSERT_EQ(w.size(), 4u);
  EXPECT_NEAR(w[0], 1.0, 1e-8);
  EXPECT_NEAR(w[1], 2.0, 1e-8);
  EXPECT_NEAR(w[2], -3.0, 1e-8);
  EXPECT_EQ(w[3], 0.0);
  // With one regressor beside the intercept it is FitLine (the example above).
  const std::vector<double> line = FitLeastSquares({{1, 0}, {1, 1}, {1, 2}, {1, 4}}, {1, 2, 6, 7});
  ASSERT_EQ(line.size(), 2u);
  EXPECT_NEAR(line[0], 1.2, 1e-9);
  EXPECT_NEAR(line[1], 1.6, 1e-9);
  EXPECT_TRUE(FitLeastSquares({}, {}).empty());
}

}  // namespace
}  // namespace slicesched
