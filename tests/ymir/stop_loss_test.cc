#include "slicesched/ymir/stop_loss.h"

#include <vector>

#include "gtest/gtest.h"

namespace slicesched::ymir {
namespace {

// A normal run's loss after e epochs, and a pairing's curve that is `factor`
// times as fast (factor > 1: positive transfer; < 1: negative).
double Normal(double e) { return 0.5 + 1.0 / (1.0 + e); }
double Paired(double e, double factor) { return Normal(factor * e); }

// Evaluations every quarter epoch in (from, until].
StopLossVerdict Feed(StopLoss& s, int member, double factor, double until, double from = 0.0) {
  StopLossVerdict v = s.verdict();
  for (double e = from + 0.25; e <= until + 1e-9; e += 0.25) {
    auto r = s.Observe(member, e, Paired(e, factor), Normal(e));
    EXPECT_TRUE(r.ok()) << r.status();
    v = *r;
  }
  return v;
}

TEST(StopLoss, TemporalKeepsAPairingThatBeatsNormalTraining) {
  auto s = StopLoss::Create(PairingMode::kTemporal);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(Feed(*s, 0, 1.5, 1.75), StopLossVerdict::kUndecided);  // still inside the window
  EXPECT_EQ(Feed(*s, 0, 1.5, 2.0, 1.75), StopLossVerdict::kKeep);
  EXPECT_NE(s->reason().find("improved"), std::string::npos);
}

TEST(StopLoss, TemporalDecouplesANegativeTransferAtTwoEpochs) {
  auto s = StopLoss::Create(PairingMode::kTemporal);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(Feed(*s, 0, 0.8, 1.75), StopLossVerdict::kUndecided);
  EXPECT_EQ(*s->Observe(0, 2.0, Paired(2.0, 0.8), Normal(2.0)), StopLossVerdict::kDecouple);
  EXPECT_NE(s->reason().find("member 0 at 2.00 epochs"), std::string::npos) << s->reason();
  // Final: a later recovery does not undo it.
  EXPECT_EQ(*s->Observe(0, 3.0, 0.1, Normal(3.0)), StopLossVerdict::kDecouple);
}

TEST(StopLoss, NoGainIsNotAnImprovement) {
  // Exactly as fast as normal training does not improve the target metric.
  auto s = StopLoss::Create(PairingMode::kTemporal);
  EXPECT_EQ(Feed(*s, 0, 1.0, 2.0), StopLossVerdict::kDecouple);
  // With a required margin, a small gain is not enough either.
  auto m = StopLoss::Create(PairingMode::kTemporal, {.window_epochs = 2.0, .min_improvement = 0.05});
  EXPECT_EQ(Feed(*m, 0, 1.05, 2.0), StopLossVerdict::kDecouple);
  auto ok = StopLoss::Create(PairingMode::kTemporal, {.window_epochs = 2.0, .min_improvement = 0.05});
  EXPECT_EQ(Feed(*ok, 0, 3.0, 2.0), StopLossVerdict::kKeep);
}

TEST(StopLoss, SpatialDecouplesWhenEitherTaskFails) {
  auto s = StopLoss::Create(PairingMode::kSpatial);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(Feed(*s, 0, 1.4, 2.0), StopLossVerdict::kUndecided);  // A improved; B not judged
  EXPECT_EQ(Feed(*s, 1, 0.9, 2.0), StopLossVerdict::kDecouple);
  EXPECT_NE(s->reason().find("member 1"), std::string::npos);

  auto both = StopLoss::Create(PairingMode::kSpatial);
  EXPECT_EQ(Feed(*both, 1, 1.2, 2.0), StopLossVerdict::kUndecided);
  EXPECT_EQ(Feed(*both, 0, 1.3, 2.0), StopLossVerdict::kKeep);

  // The first failing member decides at once, before the other is judged.
  auto early = StopLoss::Create(PairingMode::kSpatial);
  EXPECT_EQ(Feed(*early, 0, 0.5, 2.0), StopLossVerdict::kDecouple);
}

TEST(StopLoss, WindowIsConfigurableAndInputsAreChecked) {
  auto s = StopLoss::Create(PairingMode::kTemporal, {.window_epochs = 1.0});
  EXPECT_EQ(Feed(*s, 0, 0.9, 1.0), StopLossVerdict::kDecouple);
  EXPECT_EQ(StopLoss::Create(PairingMode::kSpatial, {.window_epochs = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto t = StopLoss::Create(PairingMode::kTemporal);
  EXPECT_EQ(t->Observe(1, 1.0, 1.0, 1.0).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(t->Observe(0, 1.0, 1.0, 1.0).ok());
  auto back = t->Observe(0, 0.5, 1.0, 1.0);
  EXPECT_EQ(back.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(back.status().message()).find("went back"), std::string::npos);
  EXPECT_EQ(t->Observe(0, 1.5, std::nan(""), 1.0).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace slicesched::ymir
