#include "slicesched/experiments/replay.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
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
                      "offline_tok_per_s\n"));
  ASSERT_EQ(a->policies.size(), 5u);
  EXPECT_EQ(a->policies[0].policy, "Static-Online");
  EXPECT_EQ(a->policies[0].offline_tok_per_s, 0);
  EXPECT_NEAR(a->policies[0].slo_attainment, 0.9, 0.05);  // the SLO is its own p90
  EXPECT_TRUE(std::filesystem::exists(::testing::TempDir() + "/replay_a/idle_slices.csv"));
  o.seed = 2;
  auto c = RunReplay(o);
  ASSERT_TRUE(c.ok());
  EXPECT_NE(a->policies[4].tok_per_s, c->policies[4].tok_per_s);
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
