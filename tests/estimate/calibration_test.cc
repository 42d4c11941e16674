#include "slicesched/estimate/calibration.h"

#include <cmath>
#include <functional>
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
    if (had_model) {
      cal.ObserveOp(DeviceId(d), model, t, false);
      cal.ObserveSpeed(DeviceId(d), model, t);
    }
    // The drift stays near 1 throughout: it does not walk with the
    // estimator (which is not trained with it taken out).
    if (i >= 1000) {
      ASSERT_NEAR(cal.drift_factor(DeviceId(d)), 1.0, 0.1) << "sample " << i;
    }
  }
  EXPECT_NEAR(predicted / measured, 1.0, 0.03);
  EXPECT_NEAR(cal.device_factor(DeviceId(0)), 0.9 / std::sqrt(0.99), 0.05);
  EXPECT_NEAR(cal.device_factor(DeviceId(1)), 1.1 / std::sqrt(0.99), 0.05);
}

// The fidelity rig's case: two devices of one type, each key running on
// one device only (so no sample is informative for the device factors),
// one sample per key per iteration, and the whole machine changing speed.
// The estimators' 256-sample windows follow over hundreds of iterations;
// the group's drift follows within tens of samples, and once the windows
// have caught up it is back at 1.
TEST(RuntimeCalibrationTest, DriftFollowsAWholeGroupsChangeOfSpeed) {
  TemplateBuilder b("t");
  b.ExternalInput("x", DType::kF32, {"1"})
      .Op("a", OpKind::kGeneric)
      .Inputs({"$x"})
      .Output("y", DType::kF32, {"1"})
      .Op("b", OpKind::kGeneric)
      .Inputs({"a"})
      .Output("z", DType::kF32, {"1"});
  auto tpl = b.Build();
  ASSERT_TRUE(tpl.ok()) << tpl.status();
  // Predicted over measured over `from`..`to` (iterations), with the drift
  // on or off; speed(i) scales every operator of iteration i.
  auto run = [&](double drift_smoothing, const std::function<double(int)>& speed, int from, int to,
                 double* drift_at_end) {
    OpEstimator est;
    const int key[] = {est.Register("cpu", **tpl, 0), est.Register("cpu", **tpl, 1)};
    RuntimeCalibration cal(2);
    cal.set_drift_smoothing(drift_smoothing);
    std::mt19937_64 rng(3);
    std::uniform_real_distribution<double> u(0.96, 1.04);
    double predicted = 0, measured = 0;
    for (int i = 0; i < to; ++i) {
      for (int d = 0; d < 2; ++d) {  // op a on device 0 (4 ms), op b on device 1 (6 ms)
        const double t = (d == 0 ? 4e6 : 6e6) * speed(i) * u(rng);
        const double model = est.PredictNs(key[d], {});
        if (i >= from) {
          predicted += model * cal.device_factor(DeviceId(d));
          measured += t;
        }
        const bool had_model = est.HasModel(key[d]);
        est.Observe(key[d], {}, Duration::Nanos(static_cast<int64_t>(cal.NormalizeOp(DeviceId(d), t, false))));
        if (had_model) cal.ObserveSpeed(DeviceId(d), model, t);
      }
    }
    *drift_at_end = cal.drift_factor(DeviceId(0));
    return predicted / measured;
  };
  // The machine gets 30% faster at iteration 200; scored 100 iterations
  // from 300 on (200 samples after the step, the drift's memory).
  const auto step = [](int i) { return i < 200 ? 1.0 : 0.7; };
  double drift = 0, off_drift = 0;
  const double on = run(RuntimeCalibration::kDefaultDriftSmoothing, step, 300, 400, &drift);
  const double off = run(0, step, 300, 400, &off_drift);
  EXPECT_NEAR(on, 1.0, 0.02);
  EXPECT_GT(off, 1.15);  // the windows still hold most of the slower past
  // At 400 each key's window (iterations 144..399) means 0.766 of the old
  // speed; the drift carries the rest (its means lag a little: ~0.85).
  EXPECT_GT(drift, 0.75);
  EXPECT_LT(drift, 0.92);
  EXPECT_EQ(off_drift, 1.0);
  // Long after, the windows hold only the new speed and the drift is ~1.
  double late = 0;
  EXPECT_NEAR(run(RuntimeCalibration::kDefaultDriftSmoothing, step, 900, 1000, &late), 1.0, 0.02);
  EXPECT_NEAR(late, 1.0, 0.03);
  // The drift is the group's: a device of another type is not moved.
  RuntimeCalibration two(std::vector<int>{0, 1}, 0.05);
  two.set_drift_smoothing(0.05);
  for (int i = 0; i < 200; ++i) two.ObserveSpeed(DeviceId(0), 1e6, 0.7e6);
  EXPECT_NEAR(two.drift_factor(DeviceId(0)), 0.7, 0.01);
  EXPECT_NEAR(two.device_factor(DeviceId(0)), 0.7, 0.01);
  EXPECT_EQ(two.drift_factor(DeviceId(1)), 1.0);
  EXPECT_EQ(two.View().drift[0].samples, 200);
  EXPECT_EQ(two.View().devices[0].factor, 1.0);  // the relative factor, without the drift
  // The estimators are trained without it taken out.
  EXPECT_DOUBLE_EQ(two.NormalizeOp(DeviceId(0), 1e6, false), 1e6);
  // Not saved: a restored calibration starts its drift at 1.
  RuntimeCalibration restored(std::vector<int>{0, 1}, 0.05);
  ASSERT_TRUE(restored.Restore(two.Save()).ok());
  EXPECT_EQ(restored.drift_factor(DeviceId(0)), 1.0);
  // Nonsense samples are ignored, as for the other factors.
  two.ObserveSpeed(DeviceId(0), 1e6, 50e6);
  two.ObserveSpeed(DeviceId(0), 0, 1e6);
  two.ObserveSpeed(DeviceId(9), 1e6, 1e6);
  EXPECT_EQ(two.View().drift[0].samples, 200);
}

TEST(RuntimeCalibrationTest, EvidenceOfADeviceWithoutSamplesAgesToItsGroup) {
  RuntimeCalibration cal(std::vector<int>{0, 0, 0, 1}, 0.05);
  cal.set_ageing({.grace_samples = 500, .half_life_samples = 1000});
  // Device 2 looks 2x slow, device 3 (alone in its type) 3x.
  for (int i = 0; i < 400; ++i) {
    cal.ObserveOp(DeviceId(i % 4), 1e6, (i % 4 == 2 ? 2.0 : i % 4 == 3 ? 3.0 : 1.0) * 1e6, false);
  }
  const double slow = cal.View().devices[2].raw;
  EXPECT_GT(slow, 1.9);
  // Then only devices 0 and 1 get samples. For their first 500 (the grace)
  // device 2 keeps its evidence; after that its weight halves every 1000.
  // (Device 3's samples do not count: it is in another group.)
  auto others = [&](int n) {
    for (int i = 0; i < n; ++i) cal.ObserveOp(DeviceId(i % 2), 1e6, 1e6, false);
  };
  others(500);
  EXPECT_EQ(cal.View().devices[2].raw, slow);
  const double w0 = cal.View().devices[2].weight;
  others(1000);  // one half-life past the grace
  EXPECT_NEAR(cal.View().devices[2].weight, w0 * 0.5, 1e-9);
  others(9000);
  const CalibrationView v = cal.View();
  EXPECT_LT(v.devices[2].weight, 0.002);
  EXPECT_NEAR(v.devices[2].factor, 1.0, 0.01);  // the group's value
  EXPECT_NEAR(v.devices[0].factor, 1.0, 0.01);
  EXPECT_GT(v.devices[0].weight, 0.99);  // sampled devices do not age
  EXPECT_EQ(v.devices[2].samples, 100);
  // Device 3 is alone in its type: the others' samples do not age it.
  EXPECT_DOUBLE_EQ(v.devices[3].factor, 1.0);
  EXPECT_GT(v.devices[3].weight, 0.99);
  // Device 2's first new samples outweigh its aged ones: ten at the true
  // speed (1) give weight ~0.4 of them, and no trace of the old 2x.
  for (int i = 0; i < 10; ++i) cal.ObserveOp(DeviceId(2), 1e6, 1e6, false);
  EXPECT_NEAR(cal.View().devices[2].raw, 1.0, 0.01);
  // Ageing can be switched off: the evidence stays.
  RuntimeCalibration kept(std::vector<int>{0, 0}, 0.05);
  kept.set_ageing({.half_life_samples = CalibrationAgeing::kNever});
  for (int i = 0; i < 100; ++i) kept.ObserveOp(DeviceId(0), 1e6, 2e6, false);
  const double before = kept.View().devices[0].raw;
  for (int i = 0; i < 100000; ++i) kept.ObserveOp(DeviceId(1), 1e6, 1e6, false);
  EXPECT_EQ(kept.View().devices[0].raw, before);
}

// What does not age evidence: time without samples anywhere (there is no
// clock to pass), the device's own samples, overlapped samples and ignored
// ones of the others (they are not evidence about device speed).
TEST(RuntimeCalibrationTest, OnlyTheGroupsInformativeSamplesAgeEvidence) {
  RuntimeCalibration cal(std::vector<int>{0, 0}, 0.05);
  cal.set_ageing({.grace_samples = 0, .half_life_samples = 10});
  for (int i = 0; i < 200; ++i) cal.ObserveOp(DeviceId(i % 2), 1e6, (i % 2 == 0 ? 1.1 : 0.9) * 1e6, false);
  const CalibrationView before = cal.View();
  for (int i = 0; i < 100; ++i) {
    cal.ObserveOp(DeviceId(1), 1e6, 0.9e6, true);   // overlapped: the overlap factor's
    cal.ObserveOp(DeviceId(1), 1e6, 50e6, false);   // ignored: 50x off
    cal.ObserveTransfer(1e6, 1.2e6, true);
  }
  EXPECT_EQ(cal.View().devices[0].weight, before.devices[0].weight);
  EXPECT_EQ(cal.View().devices[0].raw, before.devices[0].raw);
  cal.ObserveOp(DeviceId(1), 1e6, 0.9e6, false);  // one informative sample: one step
  EXPECT_NEAR(cal.View().devices[0].weight, before.devices[0].weight * std::exp2(-0.1), 1e-12);
}

AcceleratorSet Devices(const std::vector<std::pair<std::string, std::string>>& name_type) {
  std::vector<DeviceSpec> devs;
  for (const auto& [name, type] : name_type) {
    DeviceSpec d;
    d.name = name;
    d.type = type;
    d.memory = Bytes::GiB(1);
    devs.push_back(d);
  }
  auto accel = AcceleratorSet::Create(devs, LinkSpec{10e9, Duration::Micros(5)});
  EXPECT_TRUE(accel.ok()) << accel.status();
  return *std::move(accel);
}

void Learn(RuntimeCalibration& cal, int n) {
  for (int i = 0; i < n; ++i) {
    const int d = i % static_cast<int>(cal.num_devices());
    cal.ObserveOp(DeviceId(d), 1e6, (0.8 + 0.1 * d) * 1e6, false);
    cal.ObserveOp(DeviceId(d), 1e6, 1.2e6, true);
    cal.ObserveTransfer(1e6, 1.3e6, true);
  }
}

TEST(RuntimeCalibrationTest, ViewShowsFactorsWeightsAndSamples) {
  RuntimeCalibration cal(std::vector<int>{0, 0, 1}, 0.05);
  cal.ObserveOp(DeviceId(0), 1e6, 2e6, false);
  cal.ObserveOp(DeviceId(1), 1e6, 1e6, false);
  cal.ObserveOp(DeviceId(1), 1e6, 1e9, false);  // ignored: not counted
  const CalibrationView v = cal.View();
  ASSERT_EQ(v.devices.size(), 3u);
  EXPECT_EQ(v.device_groups, (std::vector<int>{0, 0, 1}));
  EXPECT_DOUBLE_EQ(v.devices[0].raw, 1.05);  // (1 - 0.05) + 0.05 * 2
  EXPECT_DOUBLE_EQ(v.devices[0].factor, cal.device_factor(DeviceId(0)));
  EXPECT_NEAR(v.devices[0].factor * v.devices[1].factor, 1.0, 1e-12);
  EXPECT_DOUBLE_EQ(v.devices[0].weight, 0.05);
  EXPECT_EQ(v.devices[0].samples, 1);
  EXPECT_EQ(v.devices[1].samples, 1);
  EXPECT_EQ(v.devices[2].samples, 0);
  EXPECT_EQ(v.devices[2].weight, 0.0);
  EXPECT_EQ(v.overlap.samples, 0);
  EXPECT_EQ(v.overlap.factor, 1.0);
}

TEST(RuntimeCalibrationTest, SaveAndRestoreGiveTheSameFactors) {
  const AcceleratorSet accel = Devices({{"a0", "A"}, {"a1", "A"}, {"b0", "B"}});
  RuntimeCalibration cal(accel, 0.05);
  Learn(cal, 300);
  const std::string text = cal.Save();
  RuntimeCalibration restored(accel, 0.05);
  ASSERT_TRUE(restored.Restore(text).ok()) << restored.Restore(text) << "\n" << text;
  const CalibrationView a = cal.View(), b = restored.View();
  for (size_t d = 0; d < 3; ++d) {
    EXPECT_EQ(a.devices[d].factor, b.devices[d].factor) << d;
    EXPECT_EQ(a.devices[d].raw, b.devices[d].raw) << d;
    EXPECT_EQ(a.devices[d].weight, b.devices[d].weight) << d;
    EXPECT_EQ(a.devices[d].samples, b.devices[d].samples) << d;
  }
  EXPECT_NE(a.devices[0].factor, 1.0);
  EXPECT_EQ(a.overlap.factor, b.overlap.factor);
  EXPECT_EQ(a.overlap.samples, b.overlap.samples);
  EXPECT_EQ(a.transfer_overlap.factor, b.transfer_overlap.factor);
  // Learning goes on from the same state.
  Learn(cal, 7);
  Learn(restored, 7);
  EXPECT_EQ(cal.Save(), restored.Save());
}

TEST(RuntimeCalibrationTest, RestoreRejectsAMismatchedOrCorruptStateAndKeepsItsOwn) {
  RuntimeCalibration three(Devices({{"c0", "cpu"}, {"c1", "cpu"}, {"c2", "cpu"}}));
  Learn(three, 200);
  const std::string saved = three.Save();
  auto rejected = [](RuntimeCalibration& cal, const std::string& text, const std::string& what) {
    const std::string before = cal.Save();
    const absl::Status s = cal.Restore(text);
    EXPECT_FALSE(s.ok()) << text;
    EXPECT_NE(std::string(s.message()).find(what), std::string::npos) << s;
    EXPECT_EQ(cal.Save(), before);
  };
  RuntimeCalibration four(Devices({{"c0", "cpu"}, {"c1", "cpu"}, {"c2", "cpu"}, {"c3", "cpu"}}));
  Learn(four, 50);
  rejected(four, saved, "saved for 3 devices, but this daemon has 4");
  RuntimeCalibration renamed(Devices({{"c0", "cpu"}, {"x1", "cpu"}, {"c2", "cpu"}}));
  rejected(renamed, saved, "device 1 was saved as 'c1' but is 'x1' now");
  RuntimeCalibration retyped(Devices({{"c0", "cpu"}, {"c1", "gpu"}, {"c2", "cpu"}}));
  rejected(retyped, saved, "device 1 was saved in device group 0 but is in group 1");
  RuntimeCalibration same(Devices({{"c0", "cpu"}, {"c1", "cpu"}, {"c2", "cpu"}}));
  auto edit = [&](const std::string& from, const std::string& to) {
    std::string t = saved;
    const size_t at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return at == std::string::npos ? t : t.replace(at, from.size(), to);
  };
  rejected(same, edit("version: 1", "version: 2"), "unsupported version 2 (expected 1)");
  rejected(same, edit("weight: 0.", "weight: 1."), "weight: must be in [0, 1], got 1.");
  rejected(same, edit("weight: 0.", "weight: -0."), "must be in [0, 1], got -0.");
  rejected(same, edit("samples: ", "samples: -"), "samples: must be non-negative");
  rejected(same, "{version: 1, devices: [", "calibration state");
  rejected(same, "just text", "must be a map");
  rejected(same, saved.substr(0, saved.find("overlap")), "overlap");
  ASSERT_TRUE(same.Restore(saved).ok());
  EXPECT_EQ(same.Save(), saved);
}

// A large smoothing saturates the evidence's weight at exactly 1 in double
// arithmetic (0.5: after ~55 samples); such a state must restore too.
TEST(RuntimeCalibrationTest, ASaturatedWeightSavesAndRestores) {
  const AcceleratorSet accel = Devices({{"c0", "cpu"}, {"c1", "cpu"}});
  RuntimeCalibration cal(accel, /*smoothing=*/0.5);
  Learn(cal, 400);
  ASSERT_EQ(cal.View().devices[0].weight, 1.0);
  const std::string saved = cal.Save();
  RuntimeCalibration restored(accel, 0.5);
  const absl::Status s = restored.Restore(saved);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(restored.Save(), saved);
}

}  // namespace
}  // namespace slicesched
