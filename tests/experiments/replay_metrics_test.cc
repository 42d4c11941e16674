#include "slicesched/experiments/replay_metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace slicesched {
namespace {

using Busy = std::vector<std::vector<BusyInterval>>;

constexpr int64_t kMs = 1'000'000;  // ns

std::vector<std::pair<int64_t, int64_t>> Pairs(const std::vector<BusyInterval>& v) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const auto& iv : v) out.emplace_back(iv.start_ns, iv.end_ns);
  return out;
}

struct SliceTuple {
  int unit;
  int64_t start, end;
  bool operator==(const SliceTuple&) const = default;
};

std::vector<SliceTuple> Tuples(const std::vector<IdleSlice>& v) {
  std::vector<SliceTuple> out;
  for (const auto& s : v) out.push_back({s.unit, s.start_ns, s.end_ns});
  return out;
}

void PrintTo(const SliceTuple& t, std::ostream* os) { *os << "{" << t.unit << "," << t.start << "," << t.end << "}"; }

TEST(TimeBetweenTokensTest, GapsWithinEachRequestOnly) {
  // Request 0: tokens at 0, 10 and 30 ms; request 1: a single token (no
  // gap); request 2: tokens at 100 ms and 150.5 ms. The gap between request
  // 0's last token and request 2's first is no token gap.
  const std::vector<std::vector<int64_t>> tokens = {
      {0, 10'000'000, 30'000'000}, {5'000'000}, {100'000'000, 150'500'000}, {}};
  EXPECT_EQ(TimeBetweenTokensMs(tokens), (std::vector<double>{10.0, 20.0, 50.5}));
  EXPECT_TRUE(TimeBetweenTokensMs({}).empty());
}

TEST(IntervalMergeTest, MergesUnsortedOverlappingAndTouching) {
  std::vector<BusyInterval> in = {{50, 60}, {0, 10}, {5, 20}, {20, 30}, {55, 58}, {40, 45}, {70, 70}, {90, 80}};
  EXPECT_THAT(Pairs(MergeIntervals(in)),
              ::testing::ElementsAre(std::pair<int64_t, int64_t>{0, 30}, std::pair<int64_t, int64_t>{40, 45},
                                     std::pair<int64_t, int64_t>{50, 60}));
}

TEST(IntervalMergeTest, EmptyAndContained) {
  EXPECT_TRUE(MergeIntervals({}).empty());
  EXPECT_TRUE(MergeIntervals({{5, 5}, {7, 3}}).empty());
  EXPECT_THAT(Pairs(MergeIntervals({{0, 100}, {10, 20}, {30, 40}, {99, 100}})),
              ::testing::ElementsAre(std::pair<int64_t, int64_t>{0, 100}));
}

TEST(IdleSlicesTest, LeadingAndTrailingGaps) {
  Busy busy = {{{30, 40}, {10, 20}, {15, 25}}};
  EXPECT_THAT(Tuples(IdleSlices(busy, 0, 50)),
              ::testing::ElementsAre(SliceTuple{0, 0, 10}, SliceTuple{0, 25, 30}, SliceTuple{0, 40, 50}));
}

TEST(IdleSlicesTest, BusyAtTheEdgesAndClipping) {
  // Intervals reaching outside the window are clipped; no zero-length slices.
  Busy busy = {{{-5, 10}, {20, 30}, {45, 70}, {100, 200}}};
  EXPECT_THAT(Tuples(IdleSlices(busy, 0, 50)), ::testing::ElementsAre(SliceTuple{0, 10, 20}, SliceTuple{0, 30, 45}));
  Busy full = {{{0, 50}}};
  EXPECT_TRUE(IdleSlices(full, 0, 50).empty());
}

TEST(IdleSlicesTest, EmptyBusyListsAreIdleThroughout) {
  Busy busy = {{}, {{10, 20}}, {}};
  EXPECT_THAT(Tuples(IdleSlices(busy, 5, 25)),
              ::testing::ElementsAre(SliceTuple{0, 5, 25}, SliceTuple{1, 5, 10}, SliceTuple{1, 20, 25},
                                     SliceTuple{2, 5, 25}));
  EXPECT_TRUE(IdleSlices(busy, 25, 25).empty());
  EXPECT_TRUE(IdleSlices(busy, 30, 25).empty());
  EXPECT_TRUE(IdleSlices({}, 0, 100).empty());
}

TEST(IdleSlicesTest, DurationMs) {
  IdleSlice s{3, 2 * kMs, 2 * kMs + 2'500'000};
  EXPECT_DOUBLE_EQ(s.duration_ms(), 2.5);
}

std::vector<IdleSlice> SlicesOfDurationsMs(const std::vector<double>& durations_ms) {
  std::vector<IdleSlice> slices;
  int64_t t = 0;
  for (double d : durations_ms) {
    const int64_t len = static_cast<int64_t>(d * kMs);
    slices.push_back({0, t, t + len});
    t += len + kMs;
  }
  return slices;
}

TEST(IdleSummaryTest, PercentilesWithTheFigure1Filter) {
  // 5 ms and exactly 10 ms fall below the filter, exactly 20 s and 25 s above.
  auto slices = SlicesOfDurationsMs({5, 10, 300, 100, 500, 200, 400, 20000, 25000});
  IdleSliceSummary s = SummarizeIdleSlices(slices, /*span_s=*/100, /*units=*/1);
  EXPECT_EQ(s.count, 5u);
  EXPECT_EQ(s.total_count, 9u);
  EXPECT_DOUBLE_EQ(s.p50_ms, 300);
  EXPECT_DOUBLE_EQ(s.p90_ms, 460);  // 400 + 0.6 * 100
  EXPECT_DOUBLE_EQ(s.p99_ms, 496);  // 400 + 0.96 * 100
  EXPECT_DOUBLE_EQ(s.share_of_idle_below_p99, 1000.0 / 1500.0);
  EXPECT_DOUBLE_EQ(s.filtered_idle_s, 1.5);
  EXPECT_DOUBLE_EQ(s.total_idle_s, 46.515);  // unfiltered
  EXPECT_DOUBLE_EQ(s.utilization, 1 - 46.515 / 100);
}

TEST(IdleSummaryTest, CustomFilterAndUtilizationOverUnits) {
  auto slices = SlicesOfDurationsMs({5, 10, 300, 100, 500, 200, 400, 20000, 25000});
  IdleSliceSummary s = SummarizeIdleSlices(slices, 100, 2, /*min_ms=*/1, /*max_ms=*/30000);
  EXPECT_EQ(s.count, 9u);
  EXPECT_DOUBLE_EQ(s.p50_ms, 300);
  EXPECT_DOUBLE_EQ(s.utilization, 1 - 46.515 / 200);
  // p99 = 20000 + 0.92 * 5000; only the 25 s slice is not below it.
  EXPECT_DOUBLE_EQ(s.p99_ms, 24600);
  EXPECT_DOUBLE_EQ(s.share_of_idle_below_p99, 21515.0 / 46515.0);
}

TEST(IdleSummaryTest, UtilizationFromIdleSlices) {
  // Two units over 10 s: unit 0 busy 6 s, unit 1 busy 2 s -> 40% utilization.
  Busy busy = {{{0, 3'000 * kMs}, {5'000 * kMs, 8'000 * kMs}}, {{1'000 * kMs, 3'000 * kMs}}};
  auto slices = IdleSlices(busy, 0, 10'000 * kMs);
  IdleSliceSummary s = SummarizeIdleSlices(slices, 10, 2);
  EXPECT_DOUBLE_EQ(s.total_idle_s, 12);
  EXPECT_NEAR(s.utilization, 0.4, 1e-12);
  // Unit 0 idle [3,5) [8,10) s, unit 1 idle [0,1) [3,10) s.
  EXPECT_EQ(s.total_count, 4u);
  EXPECT_EQ(s.count, 4u);
}

TEST(IdleSummaryTest, EmptyInputs) {
  IdleSliceSummary s = SummarizeIdleSlices({}, 10, 4);
  EXPECT_EQ(s.count, 0u);
  EXPECT_EQ(s.p50_ms, 0);
  EXPECT_EQ(s.p99_ms, 0);
  EXPECT_EQ(s.share_of_idle_below_p99, 0);
  EXPECT_DOUBLE_EQ(s.utilization, 1);
  EXPECT_EQ(SummarizeIdleSlices({}, 0, 4).utilization, 0);
}

TEST(IdleOverlapTest, IdenticalUnitsHaveJaccardOne) {
  std::vector<BusyInterval> u = {{10, 20}, {40, 70}};
  Busy busy = {u, {{40, 60}, {55, 70}, {10, 20}}, u};
  IdleOverlap o = ComputeIdleOverlap(busy, 0, 100);
  EXPECT_DOUBLE_EQ(o.pairwise_jaccard_mean, 1);
  EXPECT_DOUBLE_EQ(o.all_idle_share, 1);
  ASSERT_EQ(o.pairs.size(), 3u);
  for (const auto& p : o.pairs) EXPECT_DOUBLE_EQ(p.jaccard, 1);
}

TEST(IdleOverlapTest, DisjointIdleHasJaccardZero) {
  // Unit 0 idle in [0,50), unit 1 idle in [50,100).
  Busy busy = {{{50, 100}}, {{0, 50}}};
  IdleOverlap o = ComputeIdleOverlap(busy, 0, 100);
  EXPECT_DOUBLE_EQ(o.pairwise_jaccard_mean, 0);
  EXPECT_DOUBLE_EQ(o.all_idle_share, 0);
}

TEST(IdleOverlapTest, ThreeUnitsByHand) {
  // idle0 = [0,10) [40,60) [70,100)  |60|
  // idle1 = [20,50) [90,100)         |40|
  // idle2 = [0,30) [80,100)          |50|
  // 0^1 = [40,50) [90,100) = 20, union 80 -> 1/4
  // 0^2 = [0,10) [80,100)  = 30, union 80 -> 3/8
  // 1^2 = [20,30) [90,100) = 20, union 70 -> 2/7
  // all = [90,100) = 10; mean idle 50 -> 0.2
  Busy busy = {{{10, 40}, {60, 70}}, {{0, 20}, {50, 90}}, {{30, 80}}};
  IdleOverlap o = ComputeIdleOverlap(busy, 0, 100);
  ASSERT_EQ(o.pairs.size(), 3u);
  EXPECT_EQ(o.pairs[0].unit_a, 0);
  EXPECT_EQ(o.pairs[0].unit_b, 1);
  EXPECT_DOUBLE_EQ(o.pairs[0].jaccard, 0.25);
  EXPECT_EQ(o.pairs[1].unit_a, 0);
  EXPECT_EQ(o.pairs[1].unit_b, 2);
  EXPECT_DOUBLE_EQ(o.pairs[1].jaccard, 0.375);
  EXPECT_EQ(o.pairs[2].unit_a, 1);
  EXPECT_EQ(o.pairs[2].unit_b, 2);
  EXPECT_DOUBLE_EQ(o.pairs[2].jaccard, 2.0 / 7.0);
  EXPECT_DOUBLE_EQ(o.pairwise_jaccard_mean, 51.0 / 168.0);
  EXPECT_DOUBLE_EQ(o.all_idle_share, 0.2);
}

TEST(IdleOverlapTest, DegenerateCases) {
  IdleOverlap none = ComputeIdleOverlap({}, 0, 100);
  EXPECT_EQ(none.pairwise_jaccard_mean, 0);
  EXPECT_EQ(none.all_idle_share, 0);
  EXPECT_TRUE(none.pairs.empty());

  IdleOverlap single = ComputeIdleOverlap({{{10, 20}}}, 0, 100);
  EXPECT_EQ(single.pairwise_jaccard_mean, 0);  // no pairs
  EXPECT_DOUBLE_EQ(single.all_idle_share, 1);

  // Units 0 and 1 are never idle: their pair is left out of the mean.
  IdleOverlap busy = ComputeIdleOverlap({{{0, 100}}, {{0, 100}}, {{0, 50}}}, 0, 100);
  ASSERT_EQ(busy.pairs.size(), 3u);
  EXPECT_EQ(busy.pairs[0].jaccard, 0);
  EXPECT_DOUBLE_EQ(busy.pairwise_jaccard_mean, 0);
  EXPECT_DOUBLE_EQ(busy.all_idle_share, 0);

  IdleOverlap all_busy = ComputeIdleOverlap({{{0, 100}}, {{0, 100}}}, 0, 100);
  EXPECT_EQ(all_busy.pairwise_jaccard_mean, 0);
  EXPECT_EQ(all_busy.all_idle_share, 0);

  IdleOverlap empty_window = ComputeIdleOverlap({{}, {}}, 50, 50);
  EXPECT_EQ(empty_window.pairwise_jaccard_mean, 0);
  EXPECT_EQ(empty_window.pairs.size(), 1u);
}

// Brute force on a 1-ns grid: cell [t, t+1) is idle for unit u when no busy
// interval of u covers it.
std::vector<std::vector<bool>> IdleGrid(const Busy& busy, int64_t begin, int64_t end) {
  std::vector<std::vector<bool>> grid(busy.size(), std::vector<bool>(static_cast<size_t>(end - begin), true));
  for (size_t u = 0; u < busy.size(); ++u) {
    for (const auto& iv : busy[u]) {
      for (int64_t t = std::max(iv.start_ns, begin); t < std::min(iv.end_ns, end); ++t) grid[u][t - begin] = false;
    }
  }
  return grid;
}

TEST(IdleOverlapTest, SweepLineMatchesBruteForceOnRandomInputs) {
  std::mt19937_64 rng(20240611);
  auto uniform = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  for (int iter = 0; iter < 2000; ++iter) {
    const int units = static_cast<int>(uniform(1, 5));
    const int64_t begin = uniform(-10, 20);
    const int64_t end = begin + uniform(0, 150);
    Busy busy(units);
    for (auto& unit : busy) {
      const int n = static_cast<int>(uniform(0, 10));
      for (int i = 0; i < n; ++i) {
        const int64_t s = uniform(begin - 20, end + 20);
        unit.push_back({s, s + uniform(-3, 40)});  // negative length: ignored
      }
    }
    SCOPED_TRACE(::testing::Message() << "iteration " << iter << " units " << units << " window [" << begin << ","
                                      << end << ")");
    const auto grid = IdleGrid(busy, begin, end);
    const size_t cells = static_cast<size_t>(end - begin);

    // Idle slices: maximal runs of idle cells.
    std::vector<SliceTuple> expected_slices;
    std::vector<int64_t> idle_len(units, 0);
    for (int u = 0; u < units; ++u) {
      for (size_t t = 0; t < cells;) {
        if (!grid[u][t]) {
          ++t;
          continue;
        }
        size_t e = t;
        while (e < cells && grid[u][e]) ++e;
        expected_slices.push_back({u, begin + static_cast<int64_t>(t), begin + static_cast<int64_t>(e)});
        idle_len[u] += static_cast<int64_t>(e - t);
        t = e;
      }
    }
    ASSERT_EQ(Tuples(IdleSlices(busy, begin, end)), expected_slices);

    double jaccard_sum = 0;
    int jaccard_pairs = 0;
    std::vector<double> pair_j;
    for (int a = 0; a < units; ++a) {
      for (int b = a + 1; b < units; ++b) {
        int64_t inter = 0, uni = 0;
        for (size_t t = 0; t < cells; ++t) {
          inter += grid[a][t] && grid[b][t];
          uni += grid[a][t] || grid[b][t];
        }
        const double j = uni > 0 ? static_cast<double>(inter) / static_cast<double>(uni) : 0;
        pair_j.push_back(j);
        if (uni > 0) {
          jaccard_sum += j;
          ++jaccard_pairs;
        }
      }
    }
    int64_t all_idle = 0, idle_sum = 0;
    for (size_t t = 0; t < cells; ++t) {
      bool all = true;
      for (int u = 0; u < units; ++u) all = all && grid[u][t];
      all_idle += all;
    }
    for (int64_t len : idle_len) idle_sum += len;
    const double mean_idle = static_cast<double>(idle_sum) / units;

    IdleOverlap o = ComputeIdleOverlap(busy, begin, end);
    ASSERT_EQ(o.pairs.size(), pair_j.size());
    for (size_t p = 0; p < pair_j.size(); ++p) EXPECT_NEAR(o.pairs[p].jaccard, pair_j[p], 1e-12);
    EXPECT_NEAR(o.pairwise_jaccard_mean, jaccard_pairs > 0 ? jaccard_sum / jaccard_pairs : 0, 1e-12);
    EXPECT_NEAR(o.all_idle_share, mean_idle > 0 ? static_cast<double>(all_idle) / mean_idle : 0, 1e-12);
  }
}

TEST(IdleOverlapTest, ScalesToLongReplays) {
  // 4 units x 250k unsorted intervals each: must finish quickly (quadratic work
  // would take minutes).
  std::mt19937_64 rng(7);
  Busy busy(4);
  for (auto& unit : busy) {
    unit.reserve(250'000);
    int64_t t = 0;
    for (int i = 0; i < 250'000; ++i) {
      t += static_cast<int64_t>(rng() % 1000);
      const int64_t len = static_cast<int64_t>(rng() % 1000);
      unit.push_back({t, t + len});
      t += len;
    }
    std::shuffle(unit.begin(), unit.end(), rng);
  }
  IdleOverlap o = ComputeIdleOverlap(busy, 0, 250'000'000);
  EXPECT_GT(o.pairwise_jaccard_mean, 0);
  EXPECT_LT(o.pairwise_jaccard_mean, 1);
  auto slices = IdleSlices(busy, 0, 250'000'000);
  EXPECT_GT(slices.size(), 250'000u);
}

TEST(IdleSlicesCsvTest, WritesHeaderAndRows) {
  const std::string path = ::testing::TempDir() + "/replay_metrics_idle_slices.csv";
  std::vector<IdleSlice> slices = {{0, 0, 1'500'000'000}, {2, 2'000'000'000, 2'012'500'000}};
  ASSERT_TRUE(WriteIdleSlicesCsv(path, slices).ok());
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_EQ(ss.str(),
            "unit,start_s,end_s,duration_ms\n"
            "0,0.000000000,1.500000000,1500.000000\n"
            "2,2.000000000,2.012500000,12.500000\n");
  std::remove(path.c_str());
  EXPECT_FALSE(WriteIdleSlicesCsv("/nonexistent-dir/x.csv", slices).ok());
}

TEST(IdleOverlapCsvTest, WritesPairs) {
  const std::string path = ::testing::TempDir() + "/replay_metrics_idle_overlap.csv";
  IdleOverlap o = ComputeIdleOverlap({{{10, 40}, {60, 70}}, {{0, 20}, {50, 90}}}, 0, 100);
  ASSERT_TRUE(WriteIdleOverlapCsv(path, o).ok());
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_EQ(ss.str(), "unit_a,unit_b,jaccard\n0,1,0.250000\n");
  std::remove(path.c_str());
}

}  // namespace
}  // namespace slicesched
