#include "slicesched/experiments/ymir_sim.h"

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace slicesched {
namespace {

using ::testing::HasSubstr;

const std::string kFixture = std::string(SLICESCHED_SOURCE_DIR) + "/tests/experiments/data/ymir_jobs.csv";

// Two backbones x two families x two tasks.
ymir::YmirGains FamilyGains(double same_temporal, double same_spatial, double cross) {
  ymir::YmirGains g;
  for (const std::string bb : {"vit", "bert"}) {
    std::vector<std::pair<std::string, int>> tasks = {
        {bb + "/a1", 0}, {bb + "/a2", 0}, {bb + "/b1", 1}, {bb + "/b2", 1}};
    for (const auto& [a, fa] : tasks) {
      for (const auto& [b, fb] : tasks) {
        if (a == b) continue;
        g.Set(a, b, ymir::Mode::kTemporal, fa == fb ? same_temporal : cross);
        g.Set(a, b, ymir::Mode::kSpatial, fa == fb ? same_spatial : cross);
      }
    }
  }
  return g;
}

YmirSimConfig SmallCluster(int gpus) {
  YmirSimConfig c;
  c.gpus = gpus;
  c.gpus_per_node = 4;
  return c;
}

YmirSimResult RunPolicy(const std::vector<YmirSimJob>& jobs, const ymir::YmirGains& gains, const YmirSimConfig& c,
                  const std::string& policy) {
  auto p = MakeYmirSimPolicy(policy);
  EXPECT_TRUE(p.ok()) << p.status();
  auto r = RunYmirSim(jobs, gains, c, **p);
  EXPECT_TRUE(r.ok()) << policy << ": " << r.status();
  return r.ok() ? *r : YmirSimResult{};
}

TEST(YmirSim, EveryJobCompletesUnderEveryPolicyWithinCapacity) {
  const ymir::YmirGains gains = ymir::DefaultYmirGains();
  for (double load : {1.0, 2.0}) {
    auto jobs = LoadYmirJobs(kFixture, 40, load, 3, 16, gains);
    ASSERT_TRUE(jobs.ok()) << jobs.status();
    ASSERT_EQ(jobs->size(), 40u);
    for (const auto& name : YmirSimPolicyNames()) {
      YmirSimResult r = RunPolicy(*jobs, gains, SmallCluster(16), name);
      ASSERT_EQ(r.jobs.size(), jobs->size()) << name;
      for (size_t i = 0; i < r.jobs.size(); ++i) {
        EXPECT_GT(r.jobs[i].jct_s, 0) << name << " job " << i;
        EXPECT_NEAR(r.jobs[i].finish_s, (*jobs)[i].submit_s + r.jobs[i].jct_s, 1e-6);
      }
      EXPECT_LE(r.peak_gpus, 16) << name;
      EXPECT_GT(r.peak_gpus, 0) << name;
      EXPECT_GT(r.avg_jct_s, 0);
      EXPECT_GE(r.p99_jct_s, r.avg_jct_s * 0.5);
      if (name == "Ymir" || name == "Ymir-elastic") {
        EXPECT_GT(r.ilp_calls, 0) << name;
        EXPECT_GE(r.ilp_max_s, r.ilp_avg_s);
      } else {
        EXPECT_EQ(r.ilp_calls, 0) << name;
      }
    }
  }
}

// A policy that ignores capacity: the simulator must refuse its decision.
class GreedyOverAllocator : public YmirSimPolicy {
 public:
  std::string Name() const override { return "over"; }
  absl::StatusOr<YmirSimDecision> Decide(const YmirSimState& s) override {
    YmirSimDecision d;
    for (const auto& u : s.units) d.gpus.push_back(u.trace_gpus);
    return d;
  }
};

TEST(YmirSim, OverAllocationIsAnError) {
  std::vector<YmirSimJob> jobs = {{0, 100, 4, "vit/a1"}, {0, 100, 4, "vit/a2"}, {0, 100, 4, "vit/b1"}};
  GreedyOverAllocator over;
  auto r = RunYmirSim(jobs, FamilyGains(0, 0, 0), SmallCluster(8), over);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("over-allocated"));
}

TEST(YmirSim, SingleJobRunsItsDuration) {
  const YmirSimConfig c = SmallCluster(8);
  std::vector<YmirSimJob> jobs = {{50, 1000, 2, "vit/a1"}};
  for (const auto& name : YmirSimPolicyNames()) {
    YmirSimResult r = RunPolicy(jobs, FamilyGains(0.5, 0.5, 0), c, name);
    ASSERT_EQ(r.jobs.size(), 1u);
    const int g = r.jobs[0].final_gpus;
    // Its work is 1000 s on 2 GPUs; an elastic policy may give it more.
    EXPECT_NEAR(r.jobs[0].jct_s, 1000 * YmirSpeedup(c, 2) / YmirSpeedup(c, g), 1e-6) << name;
    if (name == "Tiresias" || name == "Themis" || name == "SRTF") {
      EXPECT_EQ(g, 2) << name;
      EXPECT_NEAR(r.jobs[0].jct_s, 1000, 1e-6) << name;
    } else {
      EXPECT_EQ(g, 4) << name;  // alone: the largest allowed count
    }
    EXPECT_EQ(r.restarts, 0) << name;
  }
}

TEST(YmirSim, SrtfRunsShortestFirstAndPreempts) {
  YmirSimConfig c = SmallCluster(1);
  c.gpus_per_node = 1;
  std::vector<YmirSimJob> jobs = {{0, 300, 1, "vit/a1"}, {0, 100, 1, "vit/a2"}, {0, 200, 1, "vit/b1"}};
  YmirSimResult r = RunPolicy(jobs, FamilyGains(0, 0, 0), c, "SRTF");
  ASSERT_EQ(r.jobs.size(), 3u);
  EXPECT_NEAR(r.jobs[1].finish_s, 100, 1e-6);
  EXPECT_NEAR(r.jobs[2].finish_s, 300, 1e-6);
  EXPECT_NEAR(r.jobs[0].finish_s, 600, 1e-6);

  // A short arrival preempts the long job, which pays one restart on resume.
  c.restart_s = 30;
  std::vector<YmirSimJob> pre = {{0, 300, 1, "vit/a1"}, {100, 50, 1, "vit/a2"}};
  r = RunPolicy(pre, FamilyGains(0, 0, 0), c, "SRTF");
  EXPECT_NEAR(r.jobs[1].finish_s, 150, 1e-6);
  EXPECT_NEAR(r.jobs[0].finish_s, 300 + 50 + 30, 1e-6);
  EXPECT_EQ(r.restarts, 1);
}

TEST(YmirSim, YmirWithZeroGainsDecidesLikeTheElasticFallback) {
  const ymir::YmirGains zero = FamilyGains(0, 0, 0);
  auto jobs = LoadYmirJobs(kFixture, 40, 2, 5, 8, zero);
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  YmirSimResult ymir = RunPolicy(*jobs, zero, SmallCluster(8), "Ymir");
  YmirSimResult elastic = RunPolicy(*jobs, zero, SmallCluster(8), "Ymir-elastic");
  EXPECT_EQ(ymir.transfer_share, 0);
  EXPECT_EQ(ymir.log, elastic.log);
  ASSERT_EQ(ymir.jobs.size(), elastic.jobs.size());
  for (size_t i = 0; i < ymir.jobs.size(); ++i) EXPECT_EQ(ymir.jobs[i].finish_s, elastic.jobs[i].finish_s) << i;
  EXPECT_GT(ymir.decisions, 10);
}

TEST(YmirSim, YmirUsesPositiveTransferAndBeatsTheFallback) {
  const ymir::YmirGains strong = FamilyGains(0.6, 0.5, -0.3);
  auto jobs = LoadYmirJobs(kFixture, 40, 2, 5, 8, strong);
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  YmirSimConfig c = SmallCluster(8);
  YmirSimResult ymir = RunPolicy(*jobs, strong, c, "Ymir");
  YmirSimResult elastic = RunPolicy(*jobs, strong, c, "Ymir-elastic");
  EXPECT_GT(ymir.transfer_share, 0.1);
  EXPECT_EQ(elastic.transfer_share, 0);
  EXPECT_LT(ymir.avg_jct_s, elastic.avg_jct_s);
  // Only same-family (positive) pairs were formed.
  for (const auto& line : ymir.log) {
    EXPECT_THAT(line, ::testing::Not(HasSubstr("decouple")));
  }
}

TEST(YmirSim, NegativeRealizedGainTriggersStopLoss) {
  // The estimator says +0.3 but every realized gain is far below zero.
  YmirSimConfig c = SmallCluster(4);
  c.gain_noise_rel = 0;
  c.gain_noise_abs = 0;
  ymir::YmirGains g = FamilyGains(0.3, 0.3, 0);
  std::vector<YmirSimJob> jobs = {{0, 1000, 1, "vit/a1"}, {0, 1000, 1, "vit/a2"}};
  YmirSimResult honest = RunPolicy(jobs, g, c, "Ymir");
  EXPECT_EQ(honest.decoupled_jobs, 0);
  c.gain_noise_abs = 3;  // huge error: some realized gains become negative
  int decoupled = 0;
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    c.seed = seed;
    YmirSimResult r = RunPolicy(jobs, g, c, "Ymir");
    decoupled += r.decoupled_jobs;
    for (const auto& o : r.jobs) EXPECT_GT(o.jct_s, 0);
  }
  EXPECT_GT(decoupled, 0);
}

TEST(YmirSim, JobsAndSeedAreReproducible) {
  const ymir::YmirGains gains = ymir::DefaultYmirGains();
  auto a = LoadYmirJobs(kFixture, 20, 1, 7, 16, gains);
  auto b = LoadYmirJobs(kFixture, 20, 1, 7, 16, gains);
  auto other = LoadYmirJobs(kFixture, 20, 1, 8, 16, gains);
  ASSERT_TRUE(a.ok() && b.ok() && other.ok());
  ASSERT_EQ(a->size(), 20u);
  bool same_other = a->size() == other->size();
  for (size_t i = 0; i < a->size(); ++i) {
    EXPECT_EQ((*a)[i].task, (*b)[i].task);
    EXPECT_EQ((*a)[i].submit_s, (*b)[i].submit_s);
    EXPECT_EQ((*a)[i].duration_s, (*b)[i].duration_s);
    if (same_other && ((*a)[i].task != (*other)[i].task || (*a)[i].duration_s != (*other)[i].duration_s)) {
      same_other = false;
    }
  }
  EXPECT_FALSE(same_other);
  EXPECT_EQ((*a)[0].submit_s, 0);
  // Load 2 halves every submission time of the same window.
  auto twice = LoadYmirJobs(kFixture, 20, 2, 7, 16, gains);
  ASSERT_TRUE(twice.ok());
  for (size_t i = 0; i < a->size(); ++i) EXPECT_DOUBLE_EQ((*twice)[i].submit_s, (*a)[i].submit_s / 2);
  // The filter drops the 30 s job: at most 48 of the 49 rows are kept.
  auto all = LoadYmirJobs(kFixture, 1000, 1, 7, 16, gains);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 48u);
  for (const auto& j : *all) EXPECT_GE(j.duration_s, 60);

  YmirSimResult r1 = RunPolicy(*a, gains, SmallCluster(16), "Ymir");
  YmirSimResult r2 = RunPolicy(*b, gains, SmallCluster(16), "Ymir");
  EXPECT_EQ(r1.log, r2.log);
  EXPECT_EQ(r1.avg_jct_s, r2.avg_jct_s);
}

TEST(YmirSim, GainsTableLoadsAndRejectsBadInput) {
  const std::string dir = ::testing::TempDir();
  auto write = [&](const std::string& name, const std::string& text) {
    std::string path = dir + "/" + name;
    std::ofstream(path) << text;
    return path;
  };
  auto ok = ymir::LoadYmirGains(write("g.csv", "task_a,task_b,mode,gain\nvit/x,vit/y,temporal,0.4\n"
                                        "vit/x,vit/y,spatial,-0.1\r\nvit/y,vit/x,Temporal,0.2"));
  ASSERT_TRUE(ok.ok()) << ok.status();
  double v = 0;
  EXPECT_TRUE(ok->Get("vit/x", "vit/y", ymir::Mode::kTemporal, &v));
  EXPECT_DOUBLE_EQ(v, 0.4);
  EXPECT_TRUE(ok->Get("vit/y", "vit/x", ymir::Mode::kSpatial, &v));
  EXPECT_DOUBLE_EQ(v, -0.1);
  EXPECT_TRUE(ok->Get("vit/y", "vit/x", ymir::Mode::kTemporal, &v));
  EXPECT_DOUBLE_EQ(v, 0.2);
  EXPECT_EQ(ok->Tasks(), (std::vector<std::string>{"vit/x", "vit/y"}));

  auto bad_mode = ymir::LoadYmirGains(write("b1.csv", "task_a,task_b,mode,gain\nvit/x,vit/y,sideways,0.4\n"));
  ASSERT_FALSE(bad_mode.ok());
  EXPECT_THAT(std::string(bad_mode.status().message()), HasSubstr("b1.csv:2: column 'mode'"));
  auto bad_gain = ymir::LoadYmirGains(write("b2.csv", "task_a,task_b,mode,gain\nvit/x,vit/y,temporal,1.5\n"));
  ASSERT_FALSE(bad_gain.ok());
  EXPECT_THAT(std::string(bad_gain.status().message()), HasSubstr("column 'gain'"));
  auto missing = ymir::LoadYmirGains(write("b3.csv", "task_a,task_b,gain\nvit/x,vit/y,0.4\n"));
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("missing column 'mode'"));
  auto dup = ymir::LoadYmirGains(write("b4.csv", "task_a,task_b,mode,gain\na,b,spatial,0.1\nb,a,spatial,0.2\n"));
  ASSERT_FALSE(dup.ok());
  EXPECT_THAT(std::string(dup.status().message()), HasSubstr("duplicate"));
  EXPECT_FALSE(ymir::LoadYmirGains(dir + "/nope.csv").ok());
  auto directory = ymir::LoadYmirGains(dir);
  ASSERT_FALSE(directory.ok());
  EXPECT_THAT(std::string(directory.status().message()), HasSubstr(": is a directory, expected a gains table"));
}

TEST(YmirSim, SpeedupGainsAreConvertedToIterationsSaved) {
  const std::string dir = ::testing::TempDir();
  auto write = [&](const std::string& name, const std::string& text) {
    std::string path = dir + "/" + name;
    std::ofstream(path) << text;
    return path;
  };
  // Estimators' definition: gain = steps(normal B) / steps(transfer B) - 1.
  const std::string rows =
      "task_a,task_b,mode,gain\n"
      "x,y,temporal,1.0\n"      // B in half the steps: saves 1/2
      "y,x,temporal,-0.5\n"     // B in twice the steps: saves -1
      "x,y,spatial,1.0\n"       // y: 1/2 of its steps
      "y,x,spatial,0.25\n";     // x: 1/1.25 = 0.8 of its steps
  auto g = ymir::LoadYmirGains(write("s.csv", "# gain-definition: speedup\n" + rows));
  ASSERT_TRUE(g.ok()) << g.status();
  double v = 0;
  ASSERT_TRUE(g->Get("x", "y", ymir::Mode::kTemporal, &v));
  EXPECT_DOUBLE_EQ(v, 0.5);
  ASSERT_TRUE(g->Get("y", "x", ymir::Mode::kTemporal, &v));
  EXPECT_DOUBLE_EQ(v, -1.0);
  // Joint iterations (equal work) = mean(0.5, 0.8) of the sum: saves 0.35.
  ASSERT_TRUE(g->Get("y", "x", ymir::Mode::kSpatial, &v));
  EXPECT_NEAR(v, 0.35, 1e-12);
  // The same rows forced to the estimators' definition without the comment.
  auto forced = ymir::LoadYmirGains(write("s2.csv", rows), {.definition = ymir::YmirGainsDefinition::kSpeedup});
  ASSERT_TRUE(forced.ok()) << forced.status();
  ASSERT_TRUE(forced->Get("x", "y", ymir::Mode::kTemporal, &v));
  EXPECT_DOUBLE_EQ(v, 0.5);
  // Read as "saved", a gain of 1.0 is impossible and both spatial rows clash.
  auto as_saved = ymir::LoadYmirGains(write("s3.csv", rows));
  ASSERT_FALSE(as_saved.ok());
  EXPECT_THAT(std::string(as_saved.status().message()), HasSubstr("s3.csv:2: column 'gain'"));
  // A directive that contradicts the caller, an unknown one, a speedup <= -1.
  auto clash = ymir::LoadYmirGains(write("s4.csv", "# gain-definition: speedup\n" + rows), {.definition = ymir::YmirGainsDefinition::kSaved});
  ASSERT_FALSE(clash.ok());
  EXPECT_THAT(std::string(clash.status().message()), HasSubstr("contradicts"));
  auto unknown = ymir::LoadYmirGains(write("s5.csv", "# gain-definition: ratio\n" + rows));
  ASSERT_FALSE(unknown.ok());
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("s5.csv:1: gain-definition"));
  auto low = ymir::LoadYmirGains(write("s6.csv", "# gain-definition: speedup\ntask_a,task_b,mode,gain\nx,y,temporal,-1\n"));
  ASSERT_FALSE(low.ok());
  EXPECT_THAT(std::string(low.status().message()), HasSubstr("above -1"));
  auto dup = ymir::LoadYmirGains(write("s7.csv", "# gain-definition: speedup\n" + rows + "x,y,spatial,0.3\n"));
  ASSERT_FALSE(dup.ok());
  EXPECT_THAT(std::string(dup.status().message()), HasSubstr("s7.csv:7: duplicate spatial gain for x, y"));
}

// Format 2 (what slicesim ymir-estimators --gains-out writes): the
// measured (area) gain beside the steps-to-target gain; the
// steps gain is what the simulator reads by default.
constexpr char kFormat2Head[] =
    "# gains-format: 2\n# gain-definition: speedup\n# gain-measure: area\n"
    "task_a,task_b,mode,gain,gain_steps,steps_censored\n";

std::string WriteTemp(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(YmirSim, Format2TableIsReadFromTheStepsGain) {
  const std::string rows =
      "x,y,temporal,1.000000,3.000000,0\n"     // area clamp 2x; 4x fewer steps: saves 3/4
      "y,x,temporal,-0.400000,-0.600000,1\n"   // censored: at least 2.5x the steps
      "x,y,spatial,0.450000,0.250000,0\n"      // y: 1/1.25 = 0.8 of its steps
      "y,x,spatial,0.600000,1.000000,0\n";     // x: 1/2 of its steps
  const std::string path = WriteTemp("v2.csv", kFormat2Head + rows);
  auto g = ymir::LoadYmirGains(path);
  ASSERT_TRUE(g.ok()) << g.status();
  double v = 0;
  ASSERT_TRUE(g->Get("x", "y", ymir::Mode::kTemporal, &v));
  EXPECT_DOUBLE_EQ(v, 0.75);
  EXPECT_FALSE(g->Censored("x", "y", ymir::Mode::kTemporal));
  // The censored row keeps its bound (saved -1.5: the least slowdown) and is flagged.
  ASSERT_TRUE(g->Get("y", "x", ymir::Mode::kTemporal, &v));
  EXPECT_DOUBLE_EQ(v, -0.6 / 0.4);
  EXPECT_TRUE(g->Censored("y", "x", ymir::Mode::kTemporal));
  // What a planner may pair on: the known gain, never the censored bound.
  EXPECT_TRUE(g->Plannable("x", "y", ymir::Mode::kTemporal, &v));
  EXPECT_DOUBLE_EQ(v, 0.75);
  EXPECT_FALSE(g->Plannable("y", "x", ymir::Mode::kTemporal, &v));
  EXPECT_FALSE(g->Plannable("x", "z", ymir::Mode::kTemporal, &v));
  ASSERT_TRUE(g->Get("x", "y", ymir::Mode::kSpatial, &v));
  EXPECT_NEAR(v, 1 - (0.8 + 0.5) / 2, 1e-12);
  EXPECT_EQ(g->source().format, 2);
  EXPECT_EQ(g->source().column, "gain_steps");
  EXPECT_EQ(g->source().definition, "speedup");
  EXPECT_EQ(g->source().measure, "area");
  EXPECT_EQ(g->source().censored_rows, 1);
  EXPECT_THAT(g->source().Describe(), HasSubstr("gain_steps (format 2, speedup in steps to target; 1 censored"));
  // The flag survives the per-backbone copy.
  ymir::YmirGains r = g->WithBackbones({"vit"});
  EXPECT_TRUE(r.Censored("vit/y", "vit/x", ymir::Mode::kTemporal));
  EXPECT_FALSE(r.Censored("vit/x", "vit/y", ymir::Mode::kTemporal));
  EXPECT_EQ(r.source().column, "gain_steps");

  // Asked for the area column: the old reading, nothing censored.
  auto area = ymir::LoadYmirGains(path, ymir::YmirGainsLoadOptions{.column = "gain"});
  ASSERT_TRUE(area.ok()) << area.status();
  ASSERT_TRUE(area->Get("x", "y", ymir::Mode::kTemporal, &v));
  EXPECT_DOUBLE_EQ(v, 0.5);
  EXPECT_FALSE(area->Censored("y", "x", ymir::Mode::kTemporal));
  EXPECT_EQ(area->source().column, "gain");
  EXPECT_EQ(area->source().censored_rows, 0);

  // A format-1 file (no version line) is read from its one gain column, and says so.
  auto v1 = ymir::LoadYmirGains(WriteTemp("v1.csv", "# gain-definition: speedup\ntask_a,task_b,mode,gain\nx,y,temporal,1\n"));
  ASSERT_TRUE(v1.ok()) << v1.status();
  EXPECT_EQ(v1->source().format, 1);
  EXPECT_EQ(v1->source().column, "gain");
  EXPECT_EQ(v1->source().Describe(), "gain (format 1, speedup)");
  auto saved = ymir::LoadYmirGains(WriteTemp("v1s.csv", "task_a,task_b,mode,gain\nx,y,temporal,0.5\n"));
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(saved->source().Describe(), "gain (format 1, saved)");
}

TEST(YmirSim, Format2TableRejectsMalformedAndContradictoryFiles) {
  struct Case {
    std::string name, text, error;
  };
  const std::string v1head = "# gain-definition: speedup\n";
  const std::vector<Case> cases = {
      {"nosteps.csv", "# gains-format: 2\ntask_a,task_b,mode,gain,steps_censored\nx,y,temporal,1,0\n",
       "nosteps.csv:2: gains-format 2 needs the column 'gain_steps'"},
      {"nocens.csv", "# gains-format: 2\ntask_a,task_b,mode,gain,gain_steps\nx,y,temporal,1,2\n",
       "nocens.csv:2: gains-format 2 needs the column 'steps_censored'"},
      {"unversioned.csv", v1head + "task_a,task_b,mode,gain,gain_steps,steps_censored\nx,y,temporal,1,2,0\n",
       "unversioned.csv:2: column 'gain_steps' needs a '# gains-format: 2' line before the header"},
      {"v3.csv", "# gains-format: 3\n" + v1head + "task_a,task_b,mode,gain\nx,y,temporal,1\n",
       "v3.csv:1: gains-format must be 1 or 2, got '3'"},
      {"saved2.csv", "# gains-format: 2\n# gain-definition: saved\ntask_a,task_b,mode,gain,gain_steps,steps_censored\n",
       "saved2.csv:3: gains-format 2 is a speed-up table, but the file says gain-definition 'saved'"},
      {"cens.csv", std::string(kFormat2Head) + "x,y,temporal,1,2,yes\n",
       "cens.csv:5: column 'steps_censored': expected 0 or 1, got 'yes'"},
      {"low.csv", std::string(kFormat2Head) + "x,y,temporal,1,-1,0\n",
       "low.csv:5: column 'gain_steps': expected a finite number above -1"},
      {"nan.csv", std::string(kFormat2Head) + "x,y,temporal,1,nan,0\n",
       "nan.csv:5: column 'gain_steps': expected a finite number"},
      {"measure.csv",
       "# gains-format: 2\n# gain-measure: steps\ntask_a,task_b,mode,gain,gain_steps,steps_censored\n"
       "x,y,temporal,0.5,0.5,0\nx,y,spatial,1.0,0.4,0\n",
       "measure.csv:5: gain-measure is 'steps', but gain 1.0 differs from gain_steps 0.4"},
      {"badmeasure.csv", "# gains-format: 2\n# gain-measure: crossing\n", "badmeasure.csv:2: gain-measure must be"},
      {"late.csv", std::string(kFormat2Head) + "# gains-format: 1\nx,y,temporal,1,2,0\n",
       "late.csv:5: the gains-format comment must come before the header"},
  };
  for (const Case& c : cases) {
    auto g = ymir::LoadYmirGains(WriteTemp(c.name, c.text));
    ASSERT_FALSE(g.ok()) << c.name;
    EXPECT_THAT(std::string(g.status().message()), HasSubstr(c.error)) << c.name;
  }
  // The caller's choices against the file: 'saved' contradicts format 2, the
  // steps column is not in a format-1 file, an unknown column is named.
  const std::string v2 = WriteTemp("ok2.csv", std::string(kFormat2Head) + "x,y,temporal,1,2,0\n");
  auto forced = ymir::LoadYmirGains(v2, {.definition = ymir::YmirGainsDefinition::kSaved});
  ASSERT_FALSE(forced.ok());
  EXPECT_THAT(std::string(forced.status().message()), HasSubstr("ok2.csv:2: the file says gain-definition 'speedup'"));
  auto forced_v2 = ymir::LoadYmirGains(WriteTemp("ok2b.csv", "# gains-format: 2\ntask_a,task_b,mode,gain,gain_steps,steps_censored\n"),
                                 {.definition = ymir::YmirGainsDefinition::kSaved});
  ASSERT_FALSE(forced_v2.ok());
  EXPECT_THAT(std::string(forced_v2.status().message()), HasSubstr("ok2b.csv:2: gains-format 2 is a speed-up table"));
  const std::string v1 = WriteTemp("ok1.csv", v1head + "task_a,task_b,mode,gain\nx,y,temporal,1\n");
  auto steps_of_v1 = ymir::LoadYmirGains(v1, ymir::YmirGainsLoadOptions{.column = "gain_steps"});
  ASSERT_FALSE(steps_of_v1.ok());
  EXPECT_THAT(std::string(steps_of_v1.status().message()),
              HasSubstr("ok1.csv:2: gain_steps asked for, but the file is gains-format 1"));
  auto bogus = ymir::LoadYmirGains(v2, ymir::YmirGainsLoadOptions{.column = "gain_area"});
  ASSERT_FALSE(bogus.ok());
  EXPECT_THAT(std::string(bogus.status().message()), HasSubstr("must be 'gain' or 'gain_steps', got 'gain_area'"));
}

// A pair with a known steps gain shortens the target's work by exactly that
// factor: x -> y with gain_steps 3 (the area gain says 1, a 2x clamp) on one
// GPU, no estimation noise: x runs its 1,000 s, then y its 800 s / (1 + 3).
TEST(YmirSim, StepsGainShortensTheTargetByExactlyItsFactor) {
  const std::string path = WriteTemp("pair.csv", std::string(kFormat2Head) +
                                                     "bb/x,bb/y,temporal,1.000000,3.000000,0\n"
                                                     "bb/y,bb/x,temporal,-0.300000,-0.500000,0\n");
  YmirSimConfig c = SmallCluster(1);
  c.gpus_per_node = 1;
  c.gain_noise_rel = 0;
  c.gain_noise_abs = 0;
  const std::vector<YmirSimJob> jobs = {{0, 1000, 1, "bb/x"}, {0, 800, 1, "bb/y"}};
  for (const char* column : {"", "gain"}) {  // "": the default, gain_steps
    auto g = ymir::LoadYmirGains(path, ymir::YmirGainsLoadOptions{.column = column});
    ASSERT_TRUE(g.ok()) << g.status();
    YmirSimResult r = RunPolicy(jobs, *g, c, "Ymir");
    ASSERT_EQ(r.jobs.size(), 2u);
    EXPECT_EQ(r.jobs[1].transfer, ymir::Mode::kTemporal) << column;
    EXPECT_NEAR(r.jobs[0].finish_s, 1000, 1e-6) << column;
    // gain_steps: 800 / 4 = 200 s; the area gain's 2x gives 400 s.
    EXPECT_NEAR(r.jobs[1].finish_s, 1000 + 800 / (std::string(column).empty() ? 4.0 : 2.0), 1e-6) << column;
  }
  // A censored pair is never offered, whatever its bound: the same rows with
  // x -> y censored run both jobs alone.
  const std::string censored = WriteTemp("cpair.csv", std::string(kFormat2Head) +
                                                          "bb/x,bb/y,temporal,1.000000,3.000000,1\n"
                                                          "bb/y,bb/x,temporal,-0.300000,-0.500000,0\n");
  auto g = ymir::LoadYmirGains(censored);
  ASSERT_TRUE(g.ok()) << g.status();
  YmirSimResult alone = RunPolicy(jobs, *g, c, "Ymir");
  EXPECT_EQ(alone.transfer_share, 0);
  for (const YmirJobOutcome& o : alone.jobs) EXPECT_EQ(o.transfer, ymir::Mode::kNormal);
}

// The first setup's table stays for tools/ymir_real_run --family
// first-setup, whose job mix is that family (fab-major -> fb-major is its
// positive pair).
TEST(YmirSim, FirstSetupTableIsKeptForTheRealRun) {
  auto g = ymir::LoadYmirGains(std::string(SLICESCHED_SOURCE_DIR) + "/configs/ymir/gains_first_setup.csv");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->Tasks(), (std::vector<std::string>{"fa-inv", "fa-major", "fab-major", "fb-major", "last-class"}));
  EXPECT_EQ(g->size(), 30u);  // 20 directed temporal + 10 merged spatial
  EXPECT_EQ(g->source().Describe(), "gain (format 1, speedup)");  // one column, read as it is
  double v = 0;
  ASSERT_TRUE(g->Get("fab-major", "fb-major", ymir::Mode::kTemporal, &v));
  EXPECT_NEAR(v, 0.858098 / 1.858098, 1e-9);
  ASSERT_TRUE(g->Get("fb-major", "fab-major", ymir::Mode::kSpatial, &v));
  EXPECT_NEAR(v, 1 - (1 / (1 - 0.180377) + 1 / (1 - 0.250722)) / 2, 1e-9);
}

// configs/ymir/gains_synth.csv: the estimators' default family (the graded
// one with a negative level), --repeats 3, format 2;
// the values are the file's rows, read from gain_steps.
TEST(YmirSim, CommittedMeasuredTableLoadsAndIsReplicatedPerBackbone) {
  const std::string path = std::string(SLICESCHED_SOURCE_DIR) + "/configs/ymir/gains_synth.csv";
  auto g = ymir::LoadYmirGains(path);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->Tasks(), (std::vector<std::string>{"fa-bins", "fa-bins@1", "fb-bins", "first-class"}));
  EXPECT_EQ(g->size(), 18u);  // 12 directed temporal + 6 merged spatial
  EXPECT_EQ(g->source().format, 2);
  EXPECT_EQ(g->source().column, "gain_steps");
  EXPECT_EQ(g->source().measure, "area");
  EXPECT_EQ(g->source().censored_rows, 6);
  double v = 0;
  // The identical rule (row fa-bins,fa-bins@1,temporal,1.000000,2.644406,0:
  // the area gain's clamp, 3.6x fewer steps).
  ASSERT_TRUE(g->Get("fa-bins", "fa-bins@1", ymir::Mode::kTemporal, &v));
  EXPECT_NEAR(v, 2.644406 / 3.644406, 1e-9);
  EXPECT_FALSE(g->Censored("fa-bins", "fa-bins@1", ymir::Mode::kTemporal));
  // A small area positive that is negative in steps (fb-bins,fa-bins,temporal,0.037870,-0.040829,0).
  ASSERT_TRUE(g->Get("fb-bins", "fa-bins", ymir::Mode::kTemporal, &v));
  EXPECT_NEAR(v, -0.040829 / (1 - 0.040829), 1e-9);
  // The negative level, first-class as the source, censored (first-class,fa-bins,temporal,-0.405454,-0.465251,1).
  ASSERT_TRUE(g->Get("first-class", "fa-bins", ymir::Mode::kTemporal, &v));
  EXPECT_NEAR(v, -0.465251 / (1 - 0.465251), 1e-9);
  EXPECT_TRUE(g->Censored("first-class", "fa-bins", ymir::Mode::kTemporal));
  // The two rows of one joint run merged (fa-bins,fa-bins@1 0.215323 and fa-bins@1,fa-bins 0.598290).
  ASSERT_TRUE(g->Get("fa-bins@1", "fa-bins", ymir::Mode::kSpatial, &v));
  EXPECT_NEAR(v, 1 - (1 / (1 + 0.215323) + 1 / (1 + 0.598290)) / 2, 1e-9);
  // A spatial pair with one censored row is censored (first-class,fb-bins,spatial,...,1).
  EXPECT_TRUE(g->Censored("fb-bins", "first-class", ymir::Mode::kSpatial));
  // The area column (`gain`) still reads on its own.
  auto area = ymir::LoadYmirGains(path, ymir::YmirGainsLoadOptions{.column = "gain"});
  ASSERT_TRUE(area.ok()) << area.status();
  ASSERT_TRUE(area->Get("fa-bins", "fa-bins@1", ymir::Mode::kTemporal, &v));
  EXPECT_NEAR(v, 0.5, 1e-9);
  ASSERT_TRUE(area->Get("fa-bins@1", "fa-bins", ymir::Mode::kSpatial, &v));
  EXPECT_NEAR(v, 1 - (1 / (1 + 0.449872) + 1 / (1 + 0.675705)) / 2, 1e-9);
  ymir::YmirGains r = g->WithBackbones({"vit-base", "roberta-base"});
  EXPECT_EQ(r.Tasks().size(), 8u);
  EXPECT_EQ(r.size(), 36u);
  ASSERT_TRUE(r.Get("roberta-base/first-class", "roberta-base/fa-bins", ymir::Mode::kTemporal, &v));
  EXPECT_NEAR(v, -0.465251 / (1 - 0.465251), 1e-9);
  EXPECT_FALSE(r.Get("vit-base/fa-bins", "roberta-base/fa-bins@1", ymir::Mode::kTemporal, &v));
  // The comparison replicates it onto the default three backbones, runs and
  // says which column it used.
  YmirCompareOptions o;
  o.trace = kFixture;
  o.gains = path;
  o.config.gpus = 16;
  o.nodes = 4;
  o.jobs = 30;
  o.policy = "Ymir";
  auto res = RunYmirCompare(o);
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_THAT(res->gains, HasSubstr("replicated per backbone: vit-base roberta-base vicuna-7b"));
  EXPECT_THAT(res->ToJson(o), HasSubstr("\"gains_column\": \"gain_steps\", \"gains_censored_rows\": 6"));
  o.gains_column = "gain";
  auto res_area = RunYmirCompare(o);
  ASSERT_TRUE(res_area.ok()) << res_area.status();
  EXPECT_THAT(res_area->ToJson(o), HasSubstr("\"gains_column\": \"gain\", \"gains_censored_rows\": 0"));
  o.gains_column.clear();
  o.gains_definition = "saved";  // contradicts the file's directive
  EXPECT_FALSE(RunYmirCompare(o).ok());
  o.gains_definition = "bogus";
  EXPECT_FALSE(RunYmirCompare(o).ok());
}

TEST(YmirSim, DefaultGainsAreTheDocumentedStandIn) {
  ymir::YmirGains g = ymir::DefaultYmirGains();
  EXPECT_EQ(g.Tasks().size(), 27u);
  double v = 0;
  ASSERT_TRUE(g.Get("roberta-base/stsb", "roberta-base/qqp", ymir::Mode::kTemporal, &v));
  EXPECT_GE(v, 0.25);
  EXPECT_LE(v, 0.60);
  ASSERT_TRUE(g.Get("roberta-base/stsb", "roberta-base/sst2", ymir::Mode::kSpatial, &v));
  EXPECT_LE(v, 0.0);
  EXPECT_FALSE(g.Get("vit-base/food101", "roberta-base/qqp", ymir::Mode::kTemporal, &v));
}

TEST(YmirSim, CompareRejectsBadClusterAndMissingTrace) {
  YmirCompareOptions o;
  o.trace = kFixture;
  o.config.gpus = 10;
  o.nodes = 4;
  auto r = RunYmirCompare(o);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("multiple of --nodes"));
  o.config.gpus = 16;
  o.trace = "/nonexistent/trace.csv";
  EXPECT_FALSE(RunYmirCompare(o).ok());
  o.trace = kFixture;
  o.jobs = 30;
  o.policy = "SRTF";
  auto ok = RunYmirCompare(o);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_THAT(ok->ToJson(o), HasSubstr("\"policy\": \"SRTF\""));
  o.policy = "FIFO";
  EXPECT_FALSE(RunYmirCompare(o).ok());
  // No --trace and no ../shared: a clear error, not a crash.
  o.policy = "SRTF";
  o.trace.clear();
  o.shared_dir = "/nonexistent/shared";
  auto absent = RunYmirCompare(o);
  ASSERT_FALSE(absent.ok());
  EXPECT_THAT(std::string(absent.status().message()),
              HasSubstr("no --trace given and the default trace /nonexistent/shared/traces/"
                        "philly_jobs_pollux.csv is absent"));
}

}  // namespace
}  // namespace slicesched
