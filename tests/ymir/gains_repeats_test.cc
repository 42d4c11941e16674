#include "slicesched/ymir/gains_repeats.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "slicesched/ymir/gains.h"

namespace slicesched::ymir {
namespace {

using ::testing::HasSubstr;

std::string Table(double ab, double ba, double cd, int censored = 0) {
  return "# gains-format: 2\n# gain-definition: speedup\n# gain-measure: area\n"
         "task_a,task_b,mode,gain,gain_steps,steps_censored\n"
         "a,b,temporal," + std::to_string(ab) + ",0.5," + std::to_string(censored) + "\n" +
         "b,a,temporal," + std::to_string(ba) + ",0.1,0\n" + "c,d,spatial," + std::to_string(cd) + ",-0.2,0\n";
}

// Hand-computed: a,b gains 0.4, 0.5, 0.6: mean 0.5, sd 0.1, half-width
// 4.303 x 0.1 / sqrt(3) = 0.248434: positive. b,a: -0.3, 0.2, 0.1: mean 0,
// neutral. c,d: -0.5, -0.6, -0.4: negative.
TEST(GainRepeats, TheIntervalDecidesTheSign) {
  GainsRepeatsSummary s;
  auto out = CombineGainRepeats({{"s1", Table(0.4, -0.3, -0.5)}, {"s2", Table(0.5, 0.2, -0.6, 1)},
                                 {"s3", Table(0.6, 0.1, -0.4)}},
                                &s);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(*out, HasSubstr("a,b,temporal,0.500000,0.500000,1,3,0.100000,0.251566,0.748434,positive\n"));
  EXPECT_THAT(*out, HasSubstr("b,a,temporal,0.000000,0.100000,0,3,"));
  EXPECT_THAT(*out, HasSubstr(",neutral\n"));
  EXPECT_THAT(*out, HasSubstr("c,d,spatial,-0.500000,-0.200000,0,3,0.100000,-0.748434,-0.251566,negative\n"));
  EXPECT_EQ(s.pairs, 3);
  EXPECT_EQ(s.positive, 1);
  EXPECT_EQ(s.negative, 1);
  EXPECT_EQ(s.neutral, 1);
  EXPECT_NEAR(StudentT975(2), 4.303, 1e-9);
  // The combined table is a gains table the planners load: the interval
  // columns ignored, the neutral row kept but never paired.
  const std::string path = ::testing::TempDir() + "/combined_gains.csv";
  std::ofstream(path) << *out;
  auto loaded = LoadYmirGains(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  double g = 0;
  EXPECT_TRUE(loaded->Neutral("b", "a", Mode::kTemporal));
  EXPECT_TRUE(loaded->Get("b", "a", Mode::kTemporal, &g));
  EXPECT_FALSE(loaded->Plannable("b", "a", Mode::kTemporal, &g));
  EXPECT_FALSE(loaded->Neutral("c", "d", Mode::kSpatial));  // negative: measured, a planner may weigh it
  EXPECT_TRUE(loaded->Plannable("c", "d", Mode::kSpatial, &g));
  EXPECT_EQ(loaded->source().neutral_rows, 1);
  EXPECT_THAT(loaded->source().Describe(), HasSubstr("1 neutral rows: interval includes 0, never paired"));
  // planner.neutral_pairs: plan pairs it on its point estimate.
  auto point = LoadYmirGains(path, {.pair_neutral = true});
  ASSERT_TRUE(point.ok()) << point.status();
  EXPECT_FALSE(point->Neutral("b", "a", Mode::kTemporal));
  EXPECT_TRUE(point->Plannable("b", "a", Mode::kTemporal, &g));
  EXPECT_NEAR(g, 0.1 / 1.1, 1e-9);  // gain_steps 0.1 as a saved fraction
  EXPECT_THAT(point->source().Describe(), HasSubstr("1 neutral rows: paired on their point estimates"));
}

// A speed-up spatial pair's two rows make one symmetric gain: neutral only
// when both rows are (one measured row is a measured pair). The flag
// survives WithBackbones; a sign that is not one of the three is named.
TEST(GainRepeats, NeutralRowsAreLoadedButNotPlannable) {
  const std::string head =
      "# gains-format: 2\ntask_a,task_b,mode,gain,gain_steps,steps_censored,sign\n";
  const std::string path = ::testing::TempDir() + "/neutral_gains.csv";
  std::ofstream(path) << head << "a,b,spatial,0.1,0.1,0,neutral\nb,a,spatial,0.3,0.3,0,positive\n"
                      << "c,d,spatial,0.1,0.1,0,neutral\nd,c,spatial,0.0,0.0,0,Neutral\n"
                      << "a,c,temporal,0.5,0.5,0,positive\n";
  auto g = LoadYmirGains(path);
  ASSERT_TRUE(g.ok()) << g.status();
  double v = 0;
  EXPECT_TRUE(g->Plannable("a", "b", Mode::kSpatial, &v));
  EXPECT_FALSE(g->Plannable("c", "d", Mode::kSpatial, &v));
  EXPECT_FALSE(g->Plannable("d", "c", Mode::kSpatial, &v));
  EXPECT_TRUE(g->Plannable("a", "c", Mode::kTemporal, &v));
  EXPECT_EQ(g->source().neutral_rows, 3);
  const YmirGains bb = g->WithBackbones({"vit"});
  EXPECT_FALSE(bb.Plannable("vit/c", "vit/d", Mode::kSpatial, &v));
  EXPECT_TRUE(bb.Plannable("vit/a", "vit/b", Mode::kSpatial, &v));
  const std::string bad = ::testing::TempDir() + "/bad_sign.csv";
  std::ofstream(bad) << head << "a,b,temporal,0.1,0.1,0,positive\na,c,temporal,0.1,0.1,0,maybe\n";
  EXPECT_THAT(LoadYmirGains(bad).status().message(),
              HasSubstr("bad_sign.csv:4: column 'sign': expected positive, negative or neutral, got 'maybe'"));
}

TEST(GainRepeats, TablesThatDoNotMatchAreNamed) {
  EXPECT_THAT(CombineGainRepeats({{"s1", Table(0.1, 0.1, 0.1)}}).status().message(), HasSubstr("at least 2"));
  std::string fewer = Table(0.1, 0.1, 0.1);
  fewer.resize(fewer.rfind("c,d"));
  EXPECT_THAT(CombineGainRepeats({{"s1", Table(0.1, 0.1, 0.1)}, {"s2", fewer}}).status().message(),
              HasSubstr("s2: no row c,d,spatial (s1 has it)"));
  std::string steps = Table(0.1, 0.1, 0.1);
  steps.replace(steps.find("area"), 4, "steps");
  EXPECT_THAT(CombineGainRepeats({{"s1", Table(0.1, 0.1, 0.1)}, {"s2", steps}}).status().message(),
              HasSubstr("s2: gain-definition 'speedup' / gain-measure 'steps' differ"));
  std::string bad = Table(0.1, 0.1, 0.1);
  bad.replace(bad.find("0.100000"), 8, "oops");
  EXPECT_THAT(CombineGainRepeats({{"s1", Table(0.1, 0.1, 0.1)}, {"s2", bad}}).status().message(),
              HasSubstr("s2:5: gain 'oops'"));
}

}  // namespace
}  // namespace slicesched::ymir
