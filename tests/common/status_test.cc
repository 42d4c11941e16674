// Tests for the status helpers in status.h, plus the logging setup (which is
// also just a Status-returning entry point).

#include "slicesched/common/status.h"

#include <memory>
#include <string>
#include <utility>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "slicesched/common/logging.h"
#include "spdlog/spdlog.h"

namespace slicesched {
namespace {

using ::testing::HasSubstr;

absl::Status Fails() { return absl::NotFoundError("no such device"); }
absl::Status Succeeds() { return absl::OkStatus(); }

absl::Status CallsBoth(int* reached) {
  SLICESCHED_RETURN_IF_ERROR(Succeeds());
  *reached = 1;
  SLICESCHED_RETURN_IF_ERROR(Fails());
  *reached = 2;
  return absl::OkStatus();
}

TEST(StatusMacrosTest, ReturnIfErrorPropagatesTheFirstError) {
  int reached = 0;
  absl::Status s = CallsBoth(&reached);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "no such device");
  EXPECT_EQ(reached, 1);
}

absl::StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError(absl::StrCat(x, " is odd"));
  return x / 2;
}

absl::StatusOr<int> Quarter(int x, int* steps) {
  SLICESCHED_ASSIGN_OR_RETURN(int half, Half(x));
  ++*steps;
  SLICESCHED_ASSIGN_OR_RETURN(const int quarter, Half(half));
  ++*steps;
  return quarter;
}

TEST(StatusMacrosTest, AssignOrReturnAssigns) {
  int steps = 0;
  absl::StatusOr<int> q = Quarter(12, &steps);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(*q, 3);
  EXPECT_EQ(steps, 2);
}

TEST(StatusMacrosTest, AssignOrReturnPropagates) {
  int steps = 0;
  absl::StatusOr<int> q = Quarter(6, &steps);  // 6 -> 3 -> odd
  EXPECT_EQ(q.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(q.status().message(), "3 is odd");
  EXPECT_EQ(steps, 1);

  steps = 0;
  q = Quarter(5, &steps);
  EXPECT_EQ(q.status().message(), "5 is odd");
  EXPECT_EQ(steps, 0);
}

absl::StatusOr<std::unique_ptr<std::string>> MakeName(bool ok) {
  if (!ok) return absl::UnavailableError("later");
  return std::make_unique<std::string>("gpu0");
}

absl::Status UseName(bool ok, std::string* out) {
  std::unique_ptr<std::string> name;  // assign into an existing variable
  SLICESCHED_ASSIGN_OR_RETURN(name, MakeName(ok));
  *out = *name;
  return absl::OkStatus();
}

TEST(StatusMacrosTest, AssignOrReturnMovesMoveOnlyValues) {
  std::string out;
  EXPECT_TRUE(UseName(true, &out).ok());
  EXPECT_EQ(out, "gpu0");
  EXPECT_EQ(UseName(false, &out).code(), absl::StatusCode::kUnavailable);
}

absl::Status WithStatusOrInReturnIfError(bool ok) {
  absl::StatusOr<int> v = ok ? absl::StatusOr<int>(1)
                             : absl::StatusOr<int>(absl::AbortedError("x"));
  SLICESCHED_RETURN_IF_ERROR(v.status());
  return absl::OkStatus();
}

TEST(StatusMacrosTest, ReturnIfErrorWorksInIfElseWithoutBraces) {
  EXPECT_TRUE(WithStatusOrInReturnIfError(true).ok());
  EXPECT_EQ(WithStatusOrInReturnIfError(false).code(),
            absl::StatusCode::kAborted);
  // The do/while(false) wrapper makes the macro a single statement.
  bool flag = true;
  auto f = [&]() -> absl::Status {
    if (flag)
      SLICESCHED_RETURN_IF_ERROR(Fails());
    else
      SLICESCHED_RETURN_IF_ERROR(Succeeds());
    return absl::OkStatus();
  };
  EXPECT_FALSE(f().ok());
  flag = false;
  EXPECT_TRUE(f().ok());
}

TEST(AnnotateTest, PrependsContextAndKeepsCode) {
  absl::Status s =
      Annotate(absl::NotFoundError("no such file"), "loading cluster.yaml");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "loading cluster.yaml: no such file");
}

TEST(AnnotateTest, LeavesOkAlone) {
  EXPECT_TRUE(Annotate(absl::OkStatus(), "context").ok());
}

TEST(StatusMacrosDeathTest, CheckOkAbortsWithTheMessage) {
  SLICESCHED_CHECK_OK(absl::OkStatus());  // no-op
  EXPECT_DEATH(SLICESCHED_CHECK_OK(absl::InternalError("broken invariant")),
               "broken invariant");
}

// --- logging.h --------------------------------------------------------------

TEST(LoggingTest, ParsesKnownLevels) {
  EXPECT_EQ(*ParseLogLevel("trace"), spdlog::level::trace);
  EXPECT_EQ(*ParseLogLevel("debug"), spdlog::level::debug);
  EXPECT_EQ(*ParseLogLevel("info"), spdlog::level::info);
  EXPECT_EQ(*ParseLogLevel("warn"), spdlog::level::warn);
  EXPECT_EQ(*ParseLogLevel("warning"), spdlog::level::warn);
  EXPECT_EQ(*ParseLogLevel("ERROR"), spdlog::level::err);
  EXPECT_EQ(*ParseLogLevel("critical"), spdlog::level::critical);
  EXPECT_EQ(*ParseLogLevel("off"), spdlog::level::off);
}

TEST(LoggingTest, SetupConfiguresTheDefaultLogger) {
  ASSERT_TRUE(SetupLogging("debug").ok());
  EXPECT_EQ(spdlog::default_logger()->level(), spdlog::level::debug);
  EXPECT_EQ(spdlog::default_logger()->name(), "slicesched");
  ASSERT_TRUE(SetupLogging("warn", "%v").ok());  // calling again is fine
  EXPECT_EQ(spdlog::default_logger()->level(), spdlog::level::warn);
  spdlog::info("not shown at warn level");
}

TEST(LoggingTest, UnknownLevelIsRejectedAndChangesNothing) {
  ASSERT_TRUE(SetupLogging("error").ok());
  absl::Status s = SetupLogging("verbose");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'verbose'"));
  EXPECT_EQ(spdlog::default_logger()->level(), spdlog::level::err);
  EXPECT_FALSE(SetupLogging("").ok());
}

}  // namespace
}  // namespace slicesched
