#include "slicesched/experiments/accuracy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "slicesched/experiments/bench_sim.h"

namespace slicesched {
namespace {

TEST(AccuracyTest, ShortRunIsAccurateAndDeterministic) {
  AccuracyOptions o;
  o.minutes = 4;
  o.warmup_s = 60;
  auto a = RunAccuracy(o);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_GT(a->requests, 50);
  EXPECT_GT(a->predictions, 100);
  // The estimators reach the ground truth's noise floor (+-3% uniform noise
  // has a mean absolute error of 1.5%) and the simulator stays close.
  EXPECT_LT(a->op_mape_pct, 2.5);
  EXPECT_LT(a->transfer_mape_pct, 3.0);
  EXPECT_LT(a->completion_mape_pct, 5.0);
  auto b = RunAccuracy(o);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(a->ToJson(), b->ToJson());
}

TEST(AccuracyTest, RejectsBadOptions) {
  AccuracyOptions o;
  o.minutes = 0;
  EXPECT_FALSE(RunAccuracy(o).ok());
  o.minutes = 1;
  o.trace = "/nonexistent/trace.csv";
  EXPECT_EQ(RunAccuracy(o).status().code(), absl::StatusCode::kNotFound);
}

TEST(BenchSimTest, SimulatesEverythingIssued) {
  BenchSimOptions o;
  o.devices = 8;
  o.ops = 500;
  o.repetitions = 1;
  auto r = RunBenchSim(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_GE(r->compute_ops, 500);
  EXPECT_EQ(r->ops, r->compute_ops + r->transfers);
  EXPECT_GT(r->ops_per_ms, 0);
  EXPECT_NE(r->ToJson().find("\"ops_per_ms\""), std::string::npos);
  o.devices = 1;
  EXPECT_FALSE(RunBenchSim(o).ok());
}

}  // namespace
}  // namespace slicesched
