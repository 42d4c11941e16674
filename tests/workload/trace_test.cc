#include "slicesched/workload/trace.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <cmath>
#include <fstream>
#include <iostream>
#include <set>
#include <string>
#include <vector>

namespace slicesched {
namespace {

using ::testing::HasSubstr;

// Writes `content` byte-for-byte to a file in the test temp dir named after
// the running test and `suffix`; returns its path.
std::string WriteTemp(const std::string& content, const std::string& suffix = "") {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string path = ::testing::TempDir() + "/slicesched_workload_" +
                           info->test_suite_name() + "_" + info->name() + suffix + ".csv";
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << content;
  return path;
}

// ../shared/traces next to the repository root (SLICESCHED_SOURCE_DIR, set by
// ctest; the current directory otherwise), or "" when it does not exist.
std::string TracesDir() {
  const char* root = std::getenv("SLICESCHED_SOURCE_DIR");
  const std::filesystem::path dir =
      std::filesystem::path(root != nullptr && *root != '\0' ? root : ".") / ".." / "shared" / "traces";
  std::error_code ec;
  return std::filesystem::is_directory(dir, ec) ? dir.string() : "";
}

#define SKIP_WITHOUT_TRACES(dir)                                                          \
  const std::string dir = TracesDir();                                                    \
  if (dir.empty())                                                                        \
  GTEST_SKIP() << "../shared/traces not found next to the repository root (set "          \
                  "SLICESCHED_SOURCE_DIR); the real traces are only in development checkouts"

// Loads and expects success.
std::vector<Request> MustLoad(const std::string& content) {
  auto r = LoadAzureLlmTrace(WriteTemp(content));
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : std::vector<Request>{};
}

// Loads, expects InvalidArgument, returns the message.
std::string LoadError(const std::string& content) {
  const std::string path = WriteTemp(content);
  auto r = LoadAzureLlmTrace(path);
  EXPECT_FALSE(r.ok());
  if (r.ok()) return "";
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr(path)) << r.status();
  return std::string(r.status().message());
}

// ----------------------------------------------------------------------------
// LoadAzureLlmTrace

TEST(LoadAzureLlmTraceTest, ParsesRowsRelativeToFirstRequest) {
  const auto reqs = MustLoad(
      "TIMESTAMP,ContextTokens,GeneratedTokens\n"
      "2023-11-16 18:17:03.9799600,4808,10\n"
      "2023-11-16 18:17:04.0319600,3180,8\n"
      "2023-11-16 18:18:03.9799600,0,1899\n");
  ASSERT_EQ(reqs.size(), 3u);
  EXPECT_EQ(reqs[0].arrival_s, 0.0);
  EXPECT_NEAR(reqs[1].arrival_s, 0.052, 1e-9);
  EXPECT_NEAR(reqs[2].arrival_s, 60.0, 1e-9);
  EXPECT_EQ(reqs[0].context_tokens, 4808);
  EXPECT_EQ(reqs[0].generated_tokens, 10);
  EXPECT_EQ(reqs[1].context_tokens, 3180);
  EXPECT_EQ(reqs[2].context_tokens, 0);
  EXPECT_EQ(reqs[2].generated_tokens, 1899);
}

TEST(LoadAzureLlmTraceTest, ColumnsInAnyOrderAndExtraColumnsIgnored) {
  const auto reqs = MustLoad(
      "GeneratedTokens,Service,ContextTokens,TIMESTAMP\n"
      "7,code,100,2023-11-16 18:17:03.5\n"
      "9,conv,200,2023-11-16 18:17:05\n");
  ASSERT_EQ(reqs.size(), 2u);
  EXPECT_EQ(reqs[0], (Request{0.0, 100, 7}));
  EXPECT_EQ(reqs[1], (Request{1.5, 200, 9}));
}

TEST(LoadAzureLlmTraceTest, HeaderIsCaseInsensitiveTrimmedAndMayHaveBom) {
  const auto reqs = MustLoad(
      "\xEF\xBB\xBFtimestamp, contexttokens ,\"GENERATEDTOKENS\"\n"
      "2023-11-16 18:17:03, 5 ,6\n");
  ASSERT_EQ(reqs.size(), 1u);
  EXPECT_EQ(reqs[0], (Request{0.0, 5, 6}));
}

TEST(LoadAzureLlmTraceTest, CrlfAndNoTrailingNewline) {
  const auto reqs = MustLoad(
      "TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
      "2023-11-16 18:17:03.0000000,1,2\r\n"
      "2023-11-16 18:17:04.2500000,3,4");
  ASSERT_EQ(reqs.size(), 2u);
  EXPECT_EQ(reqs[1], (Request{1.25, 3, 4}));
}

TEST(LoadAzureLlmTraceTest, NoTrailingNewlineLf) {
  const auto reqs = MustLoad(
      "TIMESTAMP,ContextTokens,GeneratedTokens\n"
      "2023-11-16 18:17:03,1,2\n"
      "2023-11-16 18:17:05,3,4");
  ASSERT_EQ(reqs.size(), 2u);
  EXPECT_EQ(reqs[1], (Request{2.0, 3, 4}));
}

TEST(LoadAzureLlmTraceTest, BlankLinesSkipped) {
  const auto reqs = MustLoad(
      "TIMESTAMP,ContextTokens,GeneratedTokens\n\n"
      "2023-11-16 18:17:03,1,2\r\n\r\n"
      "2023-11-16 18:17:05,3,4\n\n");
  EXPECT_EQ(reqs.size(), 2u);
}

TEST(LoadAzureLlmTraceTest, SevenAndZeroFractionalDigits) {
  const auto reqs = MustLoad(
      "TIMESTAMP,ContextTokens,GeneratedTokens\n"
      "2023-11-16 18:17:03,1,1\n"            // 0 digits, no dot
      "2023-11-16 18:17:03.0000001,2,2\n"    // 7 digits: 100 ns
      "2023-11-16 18:17:03.5,3,3\n"          // 1 digit
      "2023-11-16 18:17:03.750000000,4,4\n"  // 9 digits
      "2023-11-16 18:17:04.,5,5\n");         // a dot and 0 digits
  ASSERT_EQ(reqs.size(), 5u);
  EXPECT_EQ(reqs[0].arrival_s, 0.0);
  EXPECT_NEAR(reqs[1].arrival_s, 1e-7, 1e-12);
  EXPECT_EQ(reqs[2].arrival_s, 0.5);
  EXPECT_EQ(reqs[3].arrival_s, 0.75);
  EXPECT_EQ(reqs[4].arrival_s, 1.0);
}

TEST(LoadAzureLlmTraceTest, CrossesMidnightMonthYearAndLeapDay) {
  const auto reqs = MustLoad(
      "TIMESTAMP,ContextTokens,GeneratedTokens\n"
      "2023-12-31 23:59:59.5,1,1\n"
      "2024-01-01 00:00:00.25,2,2\n"
      "2024-02-29 00:00:00.5,3,3\n"
      "2024-03-01T00:00:00.5,4,4\n");
  ASSERT_EQ(reqs.size(), 4u);
  EXPECT_NEAR(reqs[1].arrival_s, 0.75, 1e-9);
  EXPECT_NEAR(reqs[2].arrival_s, 1.0 + 59 * 86400.0, 1e-6);
  EXPECT_NEAR(reqs[3].arrival_s, 1.0 + 60 * 86400.0, 1e-6);
}

TEST(LoadAzureLlmTraceTest, UnsortedRowsAreSortedAndTiesKeepFileOrder) {
  const auto reqs = MustLoad(
      "TIMESTAMP,ContextTokens,GeneratedTokens\n"
      "2023-11-16 18:17:05,1,1\n"
      "2023-11-16 18:17:03,2,2\n"
      "2023-11-16 18:17:04,3,3\n"
      "2023-11-16 18:17:03,4,4\n");
  ASSERT_EQ(reqs.size(), 4u);
  EXPECT_EQ(reqs[0], (Request{0, 2, 2}));
  EXPECT_EQ(reqs[1], (Request{0, 4, 4}));
  EXPECT_EQ(reqs[2], (Request{1, 3, 3}));
  EXPECT_EQ(reqs[3], (Request{2, 1, 1}));
}

TEST(LoadAzureLlmTraceTest, MissingFileIsNotFound) {
  const std::string path = ::testing::TempDir() + "/slicesched_workload_does_not_exist.csv";
  auto r = LoadAzureLlmTrace(path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr(path));
}

TEST(LoadAzureLlmTraceTest, EmptyFile) {
  EXPECT_THAT(LoadError(""), HasSubstr(":1: empty file"));
  EXPECT_THAT(LoadError("\n \r\n"), HasSubstr(":1: empty file"));
}

TEST(LoadAzureLlmTraceTest, HeaderWithoutRows) {
  EXPECT_THAT(LoadError("TIMESTAMP,ContextTokens,GeneratedTokens"),
              HasSubstr(":1: no requests after the header"));
  EXPECT_THAT(LoadError("TIMESTAMP,ContextTokens,GeneratedTokens\n\n"),
              HasSubstr("no requests after the header"));
}

TEST(LoadAzureLlmTraceTest, MissingColumn) {
  const std::string msg = LoadError("TIMESTAMP,GeneratedTokens\n2023-11-16 18:17:03,1\n");
  EXPECT_THAT(msg, HasSubstr(":1: missing column 'ContextTokens'"));
  EXPECT_THAT(LoadError("Time,ContextTokens,GeneratedTokens\n"),
              HasSubstr(":1: missing column 'TIMESTAMP'"));
}

TEST(LoadAzureLlmTraceTest, DuplicateColumn) {
  EXPECT_THAT(LoadError("TIMESTAMP,ContextTokens,GeneratedTokens,contexttokens\n"),
              HasSubstr(":1: duplicate column 'ContextTokens'"));
}

TEST(LoadAzureLlmTraceTest, ShortRow) {
  const std::string msg = LoadError(
      "TIMESTAMP,ContextTokens,GeneratedTokens\n"
      "2023-11-16 18:17:03,1,2\n"
      "2023-11-16 18:17:04,1\n");
  EXPECT_THAT(msg, HasSubstr(":3: expected at least 3 fields, got 2"));
}

TEST(LoadAzureLlmTraceTest, BadTimestamps) {
  const std::string header = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,1,2\n";
  struct Case {
    std::string timestamp, problem;
  };
  for (const Case& c : std::vector<Case>{
           {"yesterday", "expected YYYY-MM-DD HH:MM:SS"},
           {"2023-11-16", "expected YYYY-MM-DD HH:MM:SS"},
           {"2023/11/16 18:17:03", "expected YYYY-MM-DD HH:MM:SS"},
           {"2023-11-16 18:17:03Z", "expected YYYY-MM-DD HH:MM:SS"},
           {"2023-11-16 18:17:03.1234567890", "more than 9 fractional digits"},
           {"2023-11-16 18:17:03.12a", "non-digit in the fractional seconds"},
           {"2023-13-16 18:17:03", "month out of range"},
           {"2023-02-29 18:17:03", "day out of range"},
           {"2023-11-00 18:17:03", "day out of range"},
           {"2023-11-16 24:00:00", "hour out of range"},
           {"2023-11-16 18:60:03", "minute out of range"},
           {"2023-11-16 18:17:61", "second out of range"},
           {"", "expected YYYY-MM-DD HH:MM:SS"},
       }) {
    SCOPED_TRACE(c.timestamp);
    const std::string msg = LoadError(header + "\n" + c.timestamp + ",1,2\n");
    EXPECT_THAT(msg, HasSubstr(":4: column 'TIMESTAMP': bad timestamp '" + c.timestamp + "'"));
    EXPECT_THAT(msg, HasSubstr(c.problem));
  }
}

TEST(LoadAzureLlmTraceTest, BadTokenCounts) {
  const std::string header = "TIMESTAMP,ContextTokens,GeneratedTokens\n";
  for (const std::string bad : {"-3", "1.5", "1e3", "abc", "", "+4", "12x", "99999999999999999999"}) {
    SCOPED_TRACE(bad);
    EXPECT_THAT(LoadError(header + "2023-11-16 18:17:03," + bad + ",2\n"),
                HasSubstr(":2: column 'ContextTokens': expected a non-negative integer, got '" + bad +
                          "'"));
    EXPECT_THAT(LoadError(header + "2023-11-16 18:17:03,1,2\r\n2023-11-16 18:17:04,1," + bad),
                HasSubstr(":3: column 'GeneratedTokens': expected a non-negative integer, got '" +
                          bad + "'"));
  }
}

// ----------------------------------------------------------------------------
// Summarize

TEST(SummarizeTest, TinyKnownInput) {
  // Unsorted on purpose: arrivals 0, 1, 3, 6 -> gaps 1, 2, 3.
  const std::vector<Request> reqs = {{3, 30, 3}, {0, 10, 1}, {6, 40, 100}, {1, 20, 2}};
  const TraceSummary s = Summarize(reqs);
  EXPECT_EQ(s.requests, 4u);
  EXPECT_DOUBLE_EQ(s.span_s, 6);
  EXPECT_DOUBLE_EQ(s.mean_rate_per_s, 4.0 / 6.0);
  EXPECT_NEAR(s.interarrival_cv, std::sqrt(2.0 / 3.0) / 2.0, 1e-12);
  EXPECT_DOUBLE_EQ(s.context_p50, 25);
  EXPECT_DOUBLE_EQ(s.context_p90, 37);
  EXPECT_DOUBLE_EQ(s.context_p99, 39.7);
  EXPECT_DOUBLE_EQ(s.context_mean, 25);
  EXPECT_DOUBLE_EQ(s.output_p50, 2.5);
  EXPECT_DOUBLE_EQ(s.output_p90, 3 + 0.7 * 97);
  EXPECT_DOUBLE_EQ(s.output_p99, 3 + 0.97 * 97);
  EXPECT_DOUBLE_EQ(s.output_mean, 26.5);
}

TEST(SummarizeTest, EmptyAndSingle) {
  const TraceSummary empty = Summarize({});
  EXPECT_EQ(empty.requests, 0u);
  EXPECT_EQ(empty.span_s, 0);
  EXPECT_EQ(empty.mean_rate_per_s, 0);
  EXPECT_EQ(empty.context_p50, 0);
  const TraceSummary one = Summarize({{5, 7, 8}});
  EXPECT_EQ(one.requests, 1u);
  EXPECT_EQ(one.span_s, 0);
  EXPECT_EQ(one.mean_rate_per_s, 0);
  EXPECT_EQ(one.interarrival_cv, 0);
  EXPECT_EQ(one.context_p99, 7);
  EXPECT_EQ(one.output_mean, 8);
}

TEST(SummarizeTest, EvenlySpacedHasZeroCv) {
  std::vector<Request> reqs;
  for (int i = 0; i < 11; ++i) reqs.push_back({i * 0.5, 1, 1});
  const TraceSummary s = Summarize(reqs);
  EXPECT_DOUBLE_EQ(s.span_s, 5);
  EXPECT_DOUBLE_EQ(s.mean_rate_per_s, 11.0 / 5.0);
  EXPECT_NEAR(s.interarrival_cv, 0, 1e-12);
}

// ----------------------------------------------------------------------------
// Transformations

const std::vector<Request> kSmall = {{0, 10, 1}, {1, 20, 2}, {2, 30, 3}, {3, 40, 4}};

TEST(ScaleLoadTest, CompressesTimeAndKeepsLengths) {
  const auto twice = ScaleLoad(kSmall, 2.0);
  ASSERT_EQ(twice.size(), kSmall.size());
  for (size_t i = 0; i < kSmall.size(); ++i) {
    EXPECT_DOUBLE_EQ(twice[i].arrival_s, kSmall[i].arrival_s / 2);
    EXPECT_EQ(twice[i].context_tokens, kSmall[i].context_tokens);
    EXPECT_EQ(twice[i].generated_tokens, kSmall[i].generated_tokens);
  }
  EXPECT_DOUBLE_EQ(Summarize(twice).mean_rate_per_s, 2 * Summarize(kSmall).mean_rate_per_s);
  const auto half = ScaleLoad(kSmall, 0.5);
  EXPECT_DOUBLE_EQ(half.back().arrival_s, 6.0);
  EXPECT_EQ(ScaleLoad(kSmall, 1.0), kSmall);
}

TEST(ScaleLoadTest, KeepsBurstStructure) {
  const std::vector<Request> bursty = {{0, 1, 1}, {0.1, 1, 1}, {10, 1, 1}, {10.2, 1, 1}, {30, 1, 1}};
  EXPECT_NEAR(Summarize(ScaleLoad(bursty, 3.0)).interarrival_cv, Summarize(bursty).interarrival_cv,
              1e-12);
}

TEST(WindowTest, HalfOpenIntervalRebasedToStart) {
  const auto w = Window(kSmall, 1.0, 2.0);  // [1, 3)
  ASSERT_EQ(w.size(), 2u);
  EXPECT_EQ(w[0], (Request{0.0, 20, 2}));
  EXPECT_EQ(w[1], (Request{1.0, 30, 3}));
  const auto idle_start = Window(kSmall, 0.5, 1.0);  // [0.5, 1.5): keeps the idle 0.5 s
  ASSERT_EQ(idle_start.size(), 1u);
  EXPECT_DOUBLE_EQ(idle_start[0].arrival_s, 0.5);
  EXPECT_TRUE(Window(kSmall, 0, 0).empty());
  EXPECT_TRUE(Window(kSmall, 0, -1).empty());
  EXPECT_TRUE(Window(kSmall, 10, 5).empty());
  EXPECT_EQ(Window(kSmall, 0, 100), kSmall);
}

TEST(CyclicShiftTest, ZeroAndWholeFractionsAreIdentity) {
  EXPECT_EQ(CyclicShift(kSmall, 0.0), kSmall);
  EXPECT_EQ(CyclicShift(kSmall, 1.0), kSmall);
  EXPECT_EQ(CyclicShift(kSmall, -2.0), kSmall);
}

TEST(CyclicShiftTest, WrapsAroundWithPeriodOfNMeanGaps) {
  // Span 3, 4 requests: period 4, so a quarter shift moves each request by 1
  // and the last one wraps around to the start.
  const auto q = CyclicShift(kSmall, 0.25);
  ASSERT_EQ(q.size(), 4u);
  EXPECT_EQ(q[0], (Request{0.0, 40, 4}));
  EXPECT_EQ(q[1], (Request{1.0, 10, 1}));
  EXPECT_EQ(q[2], (Request{2.0, 20, 2}));
  EXPECT_EQ(q[3], (Request{3.0, 30, 3}));
  EXPECT_EQ(CyclicShift(kSmall, 1.25), q);
  EXPECT_EQ(CyclicShift(kSmall, -0.75), q);

  // Arrivals 0, 0.5, 3: period 4.5, half shift 2.25.
  const std::vector<Request> uneven = {{0, 1, 1}, {0.5, 2, 2}, {3, 3, 3}};
  const auto h = CyclicShift(uneven, 0.5);
  ASSERT_EQ(h.size(), 3u);
  EXPECT_EQ(h[0].context_tokens, 3);
  EXPECT_NEAR(h[0].arrival_s, 0.75, 1e-12);
  EXPECT_NEAR(h[1].arrival_s, 2.25, 1e-12);
  EXPECT_NEAR(h[2].arrival_s, 2.75, 1e-12);
}

TEST(CyclicShiftTest, KeepsRequestsSortedInsidePeriod) {
  BuiltInWorkloadModel model;
  const auto day = GenerateBuiltInWorkload(model, 600, 7);
  ASSERT_GT(day.size(), 100u);
  const TraceSummary base = Summarize(day);
  const double t0 = day.front().arrival_s;
  const double period = base.span_s * day.size() / (day.size() - 1.0);
  std::vector<std::vector<Request>> shifted;
  for (int k = 0; k < 4; ++k) {
    const auto s = CyclicShift(day, k / 4.0);
    ASSERT_EQ(s.size(), day.size());
    EXPECT_TRUE(std::is_sorted(s.begin(), s.end(), [](const Request& a, const Request& b) {
      return a.arrival_s < b.arrival_s;
    }));
    EXPECT_GE(s.front().arrival_s, t0);
    EXPECT_LT(s.back().arrival_s, t0 + period);
    const TraceSummary sum = Summarize(s);
    EXPECT_DOUBLE_EQ(sum.context_mean, base.context_mean);
    EXPECT_DOUBLE_EQ(sum.output_p90, base.output_p90);
    shifted.push_back(s);
  }
  EXPECT_EQ(shifted[0], day);
  EXPECT_NE(shifted[1], shifted[0]);
  EXPECT_NE(shifted[2], shifted[1]);
  EXPECT_NE(shifted[3], shifted[2]);
}

TEST(CyclicShiftTest, DegenerateInputs) {
  EXPECT_TRUE(CyclicShift({}, 0.5).empty());
  const std::vector<Request> one = {{2, 1, 1}};
  EXPECT_EQ(CyclicShift(one, 0.5), one);
  const std::vector<Request> same = {{2, 1, 1}, {2, 2, 2}};
  EXPECT_EQ(CyclicShift(same, 0.5), same);
}

// ----------------------------------------------------------------------------
// Built-in workload

TEST(BuiltInWorkloadTest, DeterministicPerSeed) {
  const BuiltInWorkloadModel model;
  const auto a = GenerateBuiltInWorkload(model, 600, 42);
  const auto b = GenerateBuiltInWorkload(model, 600, 42);
  const auto c = GenerateBuiltInWorkload(model, 600, 43);
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST(BuiltInWorkloadTest, SortedInsideWindowAndClamped) {
  const BuiltInWorkloadModel model;
  const auto reqs = GenerateBuiltInWorkload(model, 1800, 3);
  ASSERT_FALSE(reqs.empty());
  EXPECT_TRUE(std::is_sorted(reqs.begin(), reqs.end(), [](const Request& a, const Request& b) {
    return a.arrival_s < b.arrival_s;
  }));
  for (const Request& r : reqs) {
    ASSERT_GE(r.arrival_s, 0);
    ASSERT_LT(r.arrival_s, 1800);
    ASSERT_GE(r.context_tokens, model.context_min);
    ASSERT_LE(r.context_tokens, model.context_max);
    ASSERT_GE(r.generated_tokens, model.output_min);
    ASSERT_LE(r.generated_tokens, model.output_max);
  }
  EXPECT_TRUE(GenerateBuiltInWorkload(model, 0, 3).empty());
  EXPECT_TRUE(GenerateBuiltInWorkload(model, -5, 3).empty());
}

TEST(BuiltInWorkloadTest, WithoutNormalizationStillGeneratesBursts) {
  BuiltInWorkloadModel model;
  model.normalize_rate = false;
  const TraceSummary s = Summarize(GenerateBuiltInWorkload(model, 3600, 11));
  EXPECT_GT(s.requests, 1000u);
  EXPECT_GT(s.interarrival_cv, 3);
}

// The statistics the generator must reproduce: the real trace's when it is
// available, otherwise the model's own constants (which were fitted to it).
struct Reference {
  double rate, context_p50, context_p90, output_p50, output_p90;
};

Reference GetReference(std::string* source) {
  const BuiltInWorkloadModel model;
  const std::string dir = TracesDir();
  if (!dir.empty()) {
    auto trace = LoadAzureLlmTrace(dir + "/azure_llm_code_2023.csv");
    if (trace.ok()) {
      const TraceSummary s = Summarize(*trace);
      *source = "the Azure trace";
      return {s.mean_rate_per_s, s.context_p50, s.context_p90, s.output_p50, s.output_p90};
    }
  }
  *source = "the model constants (../shared/traces not found)";
  return {model.mean_rate_per_s, model.context_median, model.context_p90, model.output_median,
          model.output_p90};
}

TEST(BuiltInWorkloadTest, SixtyMinutesMatchesTraceStatistics) {
  std::string source;
  const Reference ref = GetReference(&source);
  SCOPED_TRACE("reference: " + source);
  const BuiltInWorkloadModel model;
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const TraceSummary s = Summarize(GenerateBuiltInWorkload(model, 3600, seed));
    std::cout << "seed " << seed << ": " << s.requests << " requests, rate " << s.mean_rate_per_s
              << "/s, interarrival CV " << s.interarrival_cv << ", context p50/p90 "
              << s.context_p50 << "/" << s.context_p90 << ", output p50/p90 " << s.output_p50
              << "/" << s.output_p90 << "\n";
    EXPECT_NEAR(s.mean_rate_per_s, ref.rate, 0.15 * ref.rate);
    EXPECT_NEAR(s.context_p50, ref.context_p50, 0.10 * ref.context_p50);
    EXPECT_NEAR(s.context_p90, ref.context_p90, 0.10 * ref.context_p90);
    EXPECT_NEAR(s.output_p50, ref.output_p50, 0.10 * ref.output_p50);
    EXPECT_NEAR(s.output_p90, ref.output_p90, 0.10 * ref.output_p90);
    // Bursty like the trace (CV 13.2), far from Poisson (CV 1).
    EXPECT_GT(s.interarrival_cv, 5);
  }
}

// ----------------------------------------------------------------------------
// LoadJobTrace

TEST(LoadJobTraceTest, ParsesSortsAndUsesClusterAsTenant) {
  auto jobs = LoadJobTrace(WriteTemp(
      "timestamp,duration,num_gpus,gpu_time,cluster\n"
      "2017-10-09 07:01:55,66.0,1,66.0,11cb48\n"
      "2017-10-09 06:13:03,2951.0,4,11804.0,6214e9\r\n"
      "2017-10-09 07:01:55,10,2,20,b436b2"));
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 3u);
  EXPECT_EQ((*jobs)[0], (Job{0, 2951, 4, "6214e9"}));
  EXPECT_EQ((*jobs)[1], (Job{2932, 66, 1, "11cb48"}));
  EXPECT_EQ((*jobs)[2], (Job{2932, 10, 2, "b436b2"}));
}

TEST(LoadJobTraceTest, TenantColumnPreferredAndOptional) {
  auto both = LoadJobTrace(WriteTemp(
      "cluster,tenant,num_gpus,duration,timestamp\n"
      "vc1,teamA,8,1.5,2017-10-09 07:00:00\n", "both"));
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ(both->at(0), (Job{0, 1.5, 8, "teamA"}));
  auto none = LoadJobTrace(WriteTemp("timestamp,duration,num_gpus\n2017-10-09 07:00:00,5,1\n", "none"));
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->at(0), (Job{0, 5, 1, ""}));
}

TEST(LoadJobTraceTest, Errors) {
  const auto error = [](const std::string& content, const std::string& suffix) {
    const std::string path = WriteTemp(content, suffix);
    auto r = LoadJobTrace(path);
    EXPECT_FALSE(r.ok());
    if (r.ok()) return std::string();
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(path));
    return std::string(r.status().message());
  };
  const std::string header = "timestamp,duration,num_gpus,cluster\n";
  EXPECT_THAT(error("", "empty"), HasSubstr(":1: empty file"));
  EXPECT_THAT(error(header, "norows"), HasSubstr(":1: no jobs after the header"));
  EXPECT_THAT(error("timestamp,num_gpus\n", "missing"), HasSubstr(":1: missing column 'duration'"));
  EXPECT_THAT(error(header + "2017-10-09 07:00,5,1,a\n", "ts"),
              HasSubstr(":2: column 'timestamp': bad timestamp '2017-10-09 07:00'"));
  EXPECT_THAT(error(header + "2017-10-09 07:00:00,5,1,a\n2017-10-09 07:00:00,-5,1,a\n", "dur"),
              HasSubstr(":3: column 'duration': expected a finite number of seconds >= 0, got '-5'"));
  EXPECT_THAT(error(header + "2017-10-09 07:00:00,nan,1,a\n", "nan"),
              HasSubstr(":2: column 'duration'"));
  EXPECT_THAT(error(header + "2017-10-09 07:00:00,5,0,a\n", "gpus0"),
              HasSubstr(":2: column 'num_gpus': expected a positive integer, got '0'"));
  EXPECT_THAT(error(header + "2017-10-09 07:00:00,5,1.5,a\n", "gpus15"),
              HasSubstr(":2: column 'num_gpus': expected a positive integer, got '1.5'"));
  EXPECT_THAT(error(header + "2017-10-09 07:00:00,5,1\n", "short"),
              HasSubstr(":2: expected at least 4 fields, got 3"));
}

// ----------------------------------------------------------------------------
// The real traces (development checkouts only).

TEST(RealTraceTest, AzureCodeTrace) {
  SKIP_WITHOUT_TRACES(dir);
  const auto start = std::chrono::steady_clock::now();
  auto trace = LoadAzureLlmTrace(dir + "/azure_llm_code_2023.csv");
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(trace.ok()) << trace.status();
  std::cout << "loaded " << trace->size() << " requests in " << ms << " ms\n";
  EXPECT_LT(ms, 1000);  // a few ms in practice; generous for sanitizer builds
  EXPECT_EQ(trace->size(), 8819u);
  EXPECT_EQ(trace->front().arrival_s, 0);
  EXPECT_EQ(trace->front(), (Request{0, 4808, 10}));
  EXPECT_EQ(trace->back().context_tokens, 549);
  EXPECT_EQ(trace->back().generated_tokens, 173);
  const TraceSummary s = Summarize(*trace);
  EXPECT_NEAR(s.span_s, 3436, 1);
  EXPECT_NEAR(s.mean_rate_per_s, 2.57, 0.01);
  EXPECT_NEAR(s.interarrival_cv, 13.2, 0.1);
  EXPECT_NEAR(s.context_p50, 1469, 0.5);
  EXPECT_NEAR(s.context_p90, 5188, 0.5);
  EXPECT_NEAR(s.context_p99, 7436, 0.5);
  EXPECT_NEAR(s.output_p50, 13, 0.5);
  EXPECT_NEAR(s.output_p90, 55, 0.5);
  EXPECT_NEAR(s.context_mean, 2048, 1);
  EXPECT_NEAR(s.output_mean, 28, 0.5);

  // Four instances replaying "different days": same requests, other times.
  const auto shifted = CyclicShift(*trace, 0.25);
  EXPECT_EQ(shifted.size(), trace->size());
  EXPECT_DOUBLE_EQ(Summarize(shifted).context_mean, s.context_mean);
  EXPECT_NE(shifted, *trace);
}

TEST(RealTraceTest, PhillyJobTrace) {
  SKIP_WITHOUT_TRACES(dir);
  auto jobs = LoadJobTrace(dir + "/philly_jobs_pollux.csv");
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  EXPECT_EQ(jobs->size(), 82247u);
  EXPECT_EQ(jobs->front().submit_s, 0);
  EXPECT_TRUE(std::is_sorted(jobs->begin(), jobs->end(),
                             [](const Job& a, const Job& b) { return a.submit_s < b.submit_s; }));
  // 2017-09-04 10:30:41 -> 2017-12-22 08:02:11 (108.9 days).
  EXPECT_DOUBLE_EQ(jobs->back().submit_s, 109 * 86400.0 + (8 * 3600 + 2 * 60 + 11) -
                                              (10 * 3600 + 30 * 60 + 41));
  std::set<std::string> tenants;
  int max_gpus = 0;
  for (const Job& j : *jobs) {
    ASSERT_GT(j.duration_s, 0);
    ASSERT_GE(j.num_gpus, 1);
    max_gpus = std::max(max_gpus, j.num_gpus);
    tenants.insert(j.tenant);
  }
  EXPECT_EQ(max_gpus, 128);
  EXPECT_EQ(tenants.size(), 15u);
  EXPECT_EQ(tenants.count(""), 0u);
}

}  // namespace
}  // namespace slicesched
