#include "slicesched/experiments/replay.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace slicesched {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string SharedTrace() {
  const char* src = std::getenv("SLICESCHED_SOURCE_DIR");
  return std::string(src != nullptr ? src : ".") + "/../shared/traces/azure_llm_code_2023.csv";
}

TEST(ReplayTest, SameSeedSameSummary) {
  ReplayOptions o;
  o.minutes = 3;
  o.progress = false;
  o.out_dir = ::testing::TempDir() + "/replay_a";
  auto a = RunReplay(o);
  ASSERT_TRUE(a.ok()) << a.status();
  o.out_dir = ::testing::TempDir() + "/replay_b";
  o.threads = 1;  // a different what-if thread count must not change decisions
  auto b = RunReplay(o);
  ASSERT_TRUE(b.ok()) << b.status();
  const std::string sa = ReadFile(::testing::TempDir() + "/replay_a/summary.csv");
  EXPECT_EQ(sa, ReadFile(::testing::TempDir() + "/replay_b/summary.csv"));
  EXPECT_THAT(sa, ::testing::StartsWith(
                      "policy,req_per_s,tok_per_s,slo_attainment,gpu_util,ttft_p50_ms,ttft_p99_ms,online_req_per_s,"
                      "offline_tok_per_s,offline_offered_per_s,offline_completed_frac,tbt_p50_ms,tbt_p99_ms,harvest,"
                      "load_scale,offline_latency_p50_s,offline_latency_p90_s\n"));
  ASSERT_EQ(a->policies.size(), 6u);
  EXPECT_TRUE(a->load_scale_fitted);
  EXPECT_EQ(a->policies[0].policy, "Static-Online");
  EXPECT_EQ(a->policies[0].offline_tok_per_s, 0);
  EXPECT_EQ(a->policies[0].harvest, 0);
  EXPECT_NEAR(a->policies[0].slo_attainment, 0.9, 0.05);  // the SLO is its own p90
  for (size_t k = 1; k < a->policies.size(); ++k) {
    const PolicyResult& p = a->policies[k];
    EXPECT_GT(p.harvest, 0) << p.policy;
    EXPECT_GT(p.offline_completed_frac, 0) << p.policy;
    EXPECT_EQ(p.offline_offered_per_s, 1.0) << p.policy;
    EXPECT_GT(p.tbt_p99_ms, p.tbt_p50_ms) << p.policy;
    // A finished offline request took at least its own prefill and decode
    // steps (Full-Share finishes none in three minutes).
    if (p.offline_completed > 0) {
      EXPECT_GT(p.offline_latency_p50_s, 0) << p.policy;
    }
    EXPECT_GE(p.offline_latency_p90_s, p.offline_latency_p50_s) << p.policy;
  }
  EXPECT_GT(a->policies[5].offline_completed, 0);
  EXPECT_GT(a->policies[5].offline_latency_p50_s, 0);
  EXPECT_EQ(a->policies[4].policy, "Priority-Colocate");
  EXPECT_TRUE(std::filesystem::exists(::testing::TempDir() + "/replay_a/idle_slices.csv"));
  o.seed = 2;
  auto c = RunReplay(o);
  ASSERT_TRUE(c.ok());
  EXPECT_NE(a->policies[5].tok_per_s, c->policies[5].tok_per_s);
}

// A trace in the Azure format whose requests generate long outputs (chat-like),
// at a rate of its own: the fit must find its scale as well.
std::string WriteLongOutputTrace() {
  const std::string path = ::testing::TempDir() + "/long_outputs.csv";
  std::ofstream f(path);
  f << "TIMESTAMP,ContextTokens,GeneratedTokens\n";
  std::mt19937_64 rng(5);
  std::exponential_distribution<double> gap(2.0);
  std::uniform_int_distribution<int> context(100, 1500), output(150, 350);
  double t = 0;
  for (int i = 0; i < 4000; ++i) {
    t += gap(rng);
    const long long ms = static_cast<long long>(t * 1000);  // under an hour
    char line[96];
    std::snprintf(line, sizeof line, "2023-11-16 18:%02lld:%02lld.%03lld0000,%d,%d\n", ms / 60000, ms / 1000 % 60,
                  ms % 1000, context(rng), output(rng));
    f << line;
  }
  return path;
}

TEST(ReplayTest, TargetUtilisationFitConvergesOnTwoTraceShapes) {
  for (const std::string& trace : {std::string(), WriteLongOutputTrace()}) {
    ReplayOptions o;
    o.trace = trace;
    o.policy = "Static-Online";
    o.minutes = 4;
    o.progress = false;
    auto r = RunReplay(o);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->load_scale_fitted);
    EXPECT_NEAR(r->idle.utilization, kDefaultTargetUtil, kTargetUtilTolerance) << trace;
    EXPECT_NEAR(r->policies[0].gpu_util, kDefaultTargetUtil, kTargetUtilTolerance) << trace;
    EXPECT_GT(r->load_scale, 0);
    o.target_util = 0.25;
    auto low = RunReplay(o);
    ASSERT_TRUE(low.ok()) << low.status();
    EXPECT_NEAR(low->policies[0].gpu_util, 0.25, kTargetUtilTolerance) << trace;
    EXPECT_LT(low->load_scale, r->load_scale);
  }
}

TEST(ReplayTest, OfflineBacklogStaysBoundedBelowSaturation) {
  ReplayOptions o;
  o.policy = "SliceScheduler";
  o.minutes = 5;
  o.progress = false;
  o.offline_rate = 0.4;
  auto below = RunReplay(o);
  ASSERT_TRUE(below.ok()) << below.status();
  const PolicyResult& b = below->policies.back();
  EXPECT_GT(b.offline_completed_frac, 0.9);
  EXPECT_LE(b.offline_backlog, 12);  // the requests in flight, not a queue
  EXPECT_GE(b.offline_settled_frac, 0.95);
  o.offline_rate = 4;  // beyond the server's whole capacity
  auto above = RunReplay(o);
  ASSERT_TRUE(above.ok()) << above.status();
  EXPECT_GT(above->policies.back().offline_backlog, 300);
  EXPECT_LT(above->policies.back().offline_settled_frac, 0.5);
}

TEST(ReplayTest, SliceSchedulerLeadsOnTheAzureTrace) {
  if (!std::filesystem::exists(SharedTrace())) {
    GTEST_SKIP() << "../shared/traces is absent (a user's clone): skipping the trace replay";
  }
  ReplayOptions o;
  o.trace = SharedTrace();
  o.minutes = 10;
  o.progress = false;
  auto r = RunReplay(o);
  ASSERT_TRUE(r.ok()) << r.status();
  const PolicyResult& slice = r->policies.back();
  ASSERT_EQ(slice.policy, "SliceScheduler");
  for (size_t k = 0; k + 1 < r->policies.size(); ++k) {
    EXPECT_GT(slice.tok_per_s, r->policies[k].tok_per_s) << r->policies[k].policy;
  }
  EXPECT_GE(slice.slo_attainment, 0.989);
}

TEST(ReplayTest, RejectsBadOptions) {
  ReplayOptions o;
  o.policy = "Round-Robin";
  EXPECT_THAT(RunReplay(o).status().message(),
              ::testing::AllOf(::testing::HasSubstr("--policy must be Static-Online"),
                               ::testing::HasSubstr("got 'Round-Robin'")));
  EXPECT_EQ(o.Validate().code(), absl::StatusCode::kInvalidArgument);
  o.policy = "all";
  EXPECT_TRUE(o.Validate().ok());
  o.threads = 1025;  // once checked by slicesim's flags only
  EXPECT_EQ(o.Validate().message(), "--threads must be in 0..1024, got '1025'");
  o.threads = 0;
  o.minutes = -1;
  EXPECT_EQ(RunReplay(o).status().message(), "--minutes must be > 0, got '-1'");
  o.minutes = 1;
  o.trace = "/nonexistent.csv";
  EXPECT_FALSE(RunReplay(o).ok());
}

}  // namespace
}  // namespace slicesched
