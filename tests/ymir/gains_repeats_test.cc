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
  // The combined table is a gains table the simulator loads (extra columns
  // ignored).
  const std::string path = ::testing::TempDir() + "/combined_gains.csv";
  std::ofstream(path) << *out;
  auto loaded = LoadYmirGains(path);
  EXPECT_TRUE(loaded.ok()) << loaded.status();
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
