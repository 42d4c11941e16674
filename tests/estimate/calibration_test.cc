#include "slicesched/estimate/calibration.h"

#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "slicesched/estimate/estimators.h"
#include "slicesched/gmg/graph_template.h"

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

TEST(RuntimeCalibrationTest, DeviceFactorsOfATypeKeepGeometricMeanOne) {
  // Devices 0 and 1 are one type, 2 another. Both devices of the first type
  // run 20% slower than the model: that is the type's speed, which the
  // per-type estimator holds, so their factors stay at 1. Device 2 alone in
  // its type likewise stays at 1, however far off its model is.
  RuntimeCalibration cal(std::vector<int>{0, 0, 1}, 0.05);
  for (int i = 0; i < 2000; ++i) {
    cal.ObserveOp(DeviceId(i % 3), 1e6, (i % 3 == 2 ? 2.0 : 1.2) * 1e6, false);
  }
  EXPECT_NEAR(cal.device_factor(DeviceId(0)), 1.0, 1e-9);
  EXPECT_NEAR(cal.device_factor(DeviceId(1)), 1.0, 1e-9);
  EXPECT_NEAR(cal.device_factor(DeviceId(2)), 1.0, 1e-9);
  // A relative skew inside the type is learned, around a geometric mean of 1.
  RuntimeCalibration skewed(std::vector<int>{0, 0}, 0.05);
  for (int i = 0; i < 2000; ++i) skewed.ObserveOp(DeviceId(i % 2), 1e6, (i % 2 ? 1.1 : 0.9) * 1e6, false);
  EXPECT_NEAR(skewed.device_factor(DeviceId(0)), 0.9 / std::sqrt(0.99), 1e-3);
  EXPECT_NEAR(skewed.device_factor(DeviceId(1)), 1.1 / std::sqrt(0.99), 1e-3);
  EXPECT_NEAR(skewed.device_factor(DeviceId(0)) * skewed.device_factor(DeviceId(1)), 1.0, 1e-9);
}

TEST(RuntimeCalibrationTest, GroupsDevicesByType) {
  std::vector<DeviceSpec> devs(3);
  for (int d = 0; d < 3; ++d) {
    devs[d].name = "d" + std::to_string(d);
    devs[d].type = d == 1 ? "B" : "A";
    devs[d].memory = Bytes::GiB(1);
  }
  auto accel = AcceleratorSet::Create(devs, LinkSpec{10e9, Duration::Micros(5)});
  ASSERT_TRUE(accel.ok()) << accel.status();
  RuntimeCalibration cal(*accel, 0.05);
  // Devices 0 and 2 (type A) differ; device 1 (type B) is alone.
  for (int i = 0; i < 3000; ++i) {
    const int d = i % 3;
    cal.ObserveOp(DeviceId(d), 1e6, (d == 0 ? 0.8 : d == 1 ? 3.0 : 1.25) * 1e6, false);
  }
  EXPECT_NEAR(cal.device_factor(DeviceId(0)), 0.8, 1e-3);
  EXPECT_NEAR(cal.device_factor(DeviceId(1)), 1.0, 1e-9);
  EXPECT_NEAR(cal.device_factor(DeviceId(2)), 1.25, 1e-3);
}

// The master's loop (OnlineLearner): predict with the calibrated model,
// train the estimator on the normalized measurement, then the calibration.
// With noise skewed as preemptions skew it, the estimator and the factors
// must not drift: the calibrated prediction stays at the mean measurement
// and the factors at the devices' true relative speeds. (With the former
// relative fit and mean-ratio factors, the factors climbed without bound.)
TEST(RuntimeCalibrationTest, EstimatorAndCalibrationDoNotDriftUnderSkewedNoise) {
  TemplateBuilder b("t");
  b.ExternalInput("x", DType::kF32, {"1"}).Op("op", OpKind::kGeneric).Inputs({"$x"}).Output("y", DType::kF32, {"1"});
  auto tpl = b.Build();
  ASSERT_TRUE(tpl.ok()) << tpl.status();
  OpEstimator est;
  const int key = est.Register("cpu", **tpl, 0);
  RuntimeCalibration cal(2);
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(0, 1);
  const double skew[] = {0.9, 1.1};
  double predicted = 0, measured = 0;
  for (int i = 0; i < 6000; ++i) {
    const int d = i % 2;
    // 10 ms on a mean-speed device; one in five samples is preempted (up to 3x).
    const double t = 10e6 * skew[d] * (u(rng) < 0.2 ? 1 + 2 * u(rng) : 1.0) * (0.95 + 0.1 * u(rng));
    const double model = est.PredictNs(key, {});
    if (i >= 4000) {
      predicted += model * cal.device_factor(DeviceId(d));
      measured += t;
    }
    const bool had_model = est.HasModel(key);
    est.Observe(key, {}, Duration::Nanos(static_cast<int64_t>(cal.NormalizeOp(DeviceId(d), t, false))));
    if (had_model) cal.ObserveOp(DeviceId(d), model, t, false);
  }
  EXPECT_NEAR(predicted / measured, 1.0, 0.03);
  EXPECT_NEAR(cal.device_factor(DeviceId(0)), 0.9 / std::sqrt(0.99), 0.05);
  EXPECT_NEAR(cal.device_factor(DeviceId(1)), 1.1 / std::sqrt(0.99), 0.05);
}

}  // namespace
}  // namespace slicesched
