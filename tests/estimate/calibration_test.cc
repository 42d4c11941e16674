#include "slicesched/estimate/calibration.h"

#include <random>

#include <gtest/gtest.h>

namespace slicesched {
namespace {

TEST(RuntimeCalibrationTest, LearnsDeviceSkewAndOverlap) {
  RuntimeCalibration cal(3, 0.05);
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<double> noise(0.97, 1.03);
  const double skew[] = {0.96, 1.0, 1.04};
  for (int i = 0; i < 3000; ++i) {
    const int d = i % 3;
    const double model = 1e6 * (1 + i % 7);
    const bool overlapped = i % 5 == 0;
    const double measured = model * skew[d] * (overlapped ? 1.06 : 1.0) * noise(rng);
    cal.ObserveOp(DeviceId(d), model, measured, overlapped);
    cal.ObserveTransfer(model, model * (overlapped ? 1.1 : 1.0) * noise(rng), overlapped);
  }
  for (int d = 0; d < 3; ++d) EXPECT_NEAR(cal.device_factor(DeviceId(d)), skew[d], 0.01);
  EXPECT_NEAR(cal.overlap_factor(), 1.06, 0.015);
  EXPECT_NEAR(cal.transfer_overlap_factor(), 1.10, 0.015);
  EXPECT_NEAR(cal.NormalizeOp(DeviceId(2), 1.04 * 1.06e6, true), 1e6, 0.03e6);
}

TEST(RuntimeCalibrationTest, IgnoresNonsense) {
  RuntimeCalibration cal(1);
  cal.ObserveOp(DeviceId(0), 0, 5, false);
  cal.ObserveOp(DeviceId(0), 1, -5, false);
  cal.ObserveOp(DeviceId(0), 1, 1e9, false);
  cal.ObserveOp(DeviceId(7), 1, 1, false);
  EXPECT_EQ(cal.device_factor(DeviceId(0)), 1.0);
}

}  // namespace
}  // namespace slicesched
