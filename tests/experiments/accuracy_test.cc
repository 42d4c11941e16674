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
  EXPECT_EQ(RunAccuracy(o).status().message(), "--minutes must be > 0, got '0'");
  // A run within the warm-up scores nothing; it used to report 0.00% errors.
  o.minutes = 0.5;
  EXPECT_THAT(RunAccuracy(o).status().message(),
              ::testing::HasSubstr("--minutes 0.5 (30 s) must exceed --warmup 60 s"));
  o.warmup_s = -1;  // once checked by slicesim's flags only
  EXPECT_EQ(o.Validate().message(), "--warmup must be at least 0, got '-1'");
  o.warmup_s = 60;
  o.minutes = 2;
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

// The warm-up repetitions are untimed: they change the timing, never what is
// simulated, and the report says how many of each there were.
TEST(BenchSimTest, WarmUpRepetitionsSimulateTheSameAndAreReported) {
  BenchSimOptions o;
  o.devices = 8;
  o.ops = 500;
  o.repetitions = 1;
  o.warmup = 0;
  auto cold = RunBenchSim(o);
  ASSERT_TRUE(cold.ok()) << cold.status();
  o.repetitions = 3;
  o.warmup = 2;
  auto warm = RunBenchSim(o);
  ASSERT_TRUE(warm.ok()) << warm.status();
  EXPECT_EQ(warm->ops, cold->ops);
  EXPECT_EQ(warm->makespan_ms, cold->makespan_ms);
  EXPECT_EQ(warm->repetitions, 3);
  EXPECT_EQ(warm->warmup, 2);
  EXPECT_NE(warm->ToJson().find("\"repetitions\": 3, \"warmup\": 2"), std::string::npos) << warm->ToJson();
  o.warmup = -1;
  auto bad = RunBenchSim(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--warmup"), std::string::npos) << bad.status();
}

}  // namespace
}  // namespace slicesched
