// Tests for Bytes, Duration and Timestamp formatting and parsing.

#include "slicesched/common/units.h"

#include <cstdint>
#include <limits>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace slicesched {
namespace {

using ::testing::HasSubstr;

// Parses `text`, expecting success.
int64_t ParseBytesOrDie(const std::string& text) {
  absl::StatusOr<Bytes> b = Bytes::Parse(text);
  EXPECT_TRUE(b.ok()) << text << ": " << b.status();
  return b.ok() ? b->count() : -1;
}

TEST(BytesTest, ToStringPicksUnit) {
  EXPECT_EQ(Bytes(0).ToString(), "0 B");
  EXPECT_EQ(Bytes(512).ToString(), "512 B");
  EXPECT_EQ(Bytes(1023).ToString(), "1023 B");
  EXPECT_EQ(Bytes(1024).ToString(), "1.00 KiB");
  EXPECT_EQ(Bytes(1536).ToString(), "1.50 KiB");
  EXPECT_EQ(Bytes::MiB(3).ToString(), "3.00 MiB");
  EXPECT_EQ(Bytes(static_cast<int64_t>(3.49 * (1LL << 30))).ToString(),
            "3.49 GiB");
  EXPECT_EQ(Bytes::GiB(80).ToString(), "80.00 GiB");
  EXPECT_EQ(Bytes(int64_t{5} << 40).ToString(), "5.00 TiB");
  EXPECT_EQ(Bytes(-1536).ToString(), "-1.50 KiB");
  EXPECT_EQ(Bytes(-5).ToString(), "-5 B");
}

TEST(BytesTest, ToStringPromotesWhenRoundingReachesNextUnit) {
  EXPECT_EQ(Bytes((1 << 20) - 1).ToString(), "1.00 MiB");
}

TEST(BytesTest, ToStringExtremes) {
  EXPECT_EQ(Bytes(std::numeric_limits<int64_t>::max()).ToString(), "8.00 EiB");
  EXPECT_EQ(Bytes(std::numeric_limits<int64_t>::min()).ToString(), "-8.00 EiB");
}

TEST(BytesTest, StreamsAsToString) {
  std::ostringstream os;
  os << Bytes::KiB(2);
  EXPECT_EQ(os.str(), "2.00 KiB");
}

TEST(BytesTest, ParsesPlainIntegers) {
  EXPECT_EQ(ParseBytesOrDie("0"), 0);
  EXPECT_EQ(ParseBytesOrDie("4096"), 4096);
  EXPECT_EQ(ParseBytesOrDie("  4096  "), 4096);
  EXPECT_EQ(ParseBytesOrDie("9223372036854775807"),
            std::numeric_limits<int64_t>::max());
}

TEST(BytesTest, ParsesBinarySuffixes) {
  EXPECT_EQ(ParseBytesOrDie("64GiB"), int64_t{64} << 30);
  EXPECT_EQ(ParseBytesOrDie("64 GiB"), int64_t{64} << 30);
  EXPECT_EQ(ParseBytesOrDie("64gib"), int64_t{64} << 30);
  EXPECT_EQ(ParseBytesOrDie("64Gi"), int64_t{64} << 30);
  EXPECT_EQ(ParseBytesOrDie("64G"), int64_t{64} << 30);
  EXPECT_EQ(ParseBytesOrDie("16k"), 16 * 1024);
  EXPECT_EQ(ParseBytesOrDie("16K"), 16 * 1024);
  EXPECT_EQ(ParseBytesOrDie("16KiB"), 16 * 1024);
  EXPECT_EQ(ParseBytesOrDie("1.5MiB"), 1536 * 1024);
  EXPECT_EQ(ParseBytesOrDie("2TiB"), int64_t{2} << 40);
  EXPECT_EQ(ParseBytesOrDie("1PiB"), int64_t{1} << 50);
  EXPECT_EQ(ParseBytesOrDie("0.5K"), 512);
}

TEST(BytesTest, ParsesDecimalSuffixes) {
  EXPECT_EQ(ParseBytesOrDie("16kB"), 16000);
  EXPECT_EQ(ParseBytesOrDie("16KB"), 16000);
  EXPECT_EQ(ParseBytesOrDie("3MB"), 3000000);
  EXPECT_EQ(ParseBytesOrDie("64 GB"), 64000000000);
  EXPECT_EQ(ParseBytesOrDie("2TB"), 2000000000000);
  EXPECT_EQ(ParseBytesOrDie("1.5GB"), 1500000000);
}

TEST(BytesTest, ParsesByteSuffix) {
  EXPECT_EQ(ParseBytesOrDie("512B"), 512);
  EXPECT_EQ(ParseBytesOrDie("512 b"), 512);
}

TEST(BytesTest, FractionsRoundToNearestByte) {
  EXPECT_EQ(ParseBytesOrDie("1.1KiB"), 1126);  // 1126.4
  EXPECT_EQ(ParseBytesOrDie("0.001K"), 1);     // 1.024
  EXPECT_EQ(ParseBytesOrDie("1.0"), 1);
}

TEST(BytesTest, RoundTripsThroughToStringForExactValues) {
  for (Bytes b : {Bytes(0), Bytes(512), Bytes::KiB(3), Bytes::MiB(1536),
                  Bytes::GiB(80)}) {
    // ToString inserts a space and two decimals; Parse accepts both.
    EXPECT_EQ(ParseBytesOrDie(b.ToString()), b.count()) << b;
  }
}

TEST(BytesTest, RejectsBadInputNamingTheText) {
  for (const char* bad : {"", "   ", "-1", "-4GiB", "abc", "GiB", "12 apples",
                          "1.5.5K", "1.", ".5K", "1e3", "0x10", "4 GiBs",
                          "4 KiBB", "1.5", "3.5 B", "+4", "1.1234567891GiB"}) {
    absl::StatusOr<Bytes> b = Bytes::Parse(bad);
    ASSERT_FALSE(b.ok()) << "'" << bad << "' parsed as " << *b;
    EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(b.status().message(), HasSubstr(absl::StrCat("'", bad, "'")));
  }
}

TEST(BytesTest, RejectsOverflow) {
  for (const char* bad : {"9223372036854775808", "99999999999999999999999",
                          "8192PiB", "9223372036854775807K", "10000000TB"}) {
    absl::StatusOr<Bytes> b = Bytes::Parse(bad);
    ASSERT_FALSE(b.ok()) << bad;
    EXPECT_THAT(b.status().message(), HasSubstr("out of range")) << bad;
  }
  // The largest value that fits is fine.
  EXPECT_EQ(ParseBytesOrDie("8191PiB"), int64_t{8191} << 50);
}

TEST(BytesTest, Arithmetic) {
  EXPECT_EQ(Bytes::KiB(1) + Bytes(24), Bytes(1048));
  EXPECT_EQ(Bytes::MiB(1) - Bytes::KiB(1024), Bytes::Zero());
  EXPECT_EQ(Bytes::KiB(2) * 3, Bytes::KiB(6));
  EXPECT_LT(Bytes::KiB(1), Bytes::MiB(1));
  EXPECT_DOUBLE_EQ(Bytes::MiB(512).ToGiB(), 0.5);
}

// --- Duration ---------------------------------------------------------------

TEST(DurationTest, ToStringPicksUnit) {
  EXPECT_EQ(Duration::Zero().ToString(), "0s");
  EXPECT_EQ(Duration::Nanos(100).ToString(), "100ns");
  EXPECT_EQ(Duration::Nanos(999).ToString(), "999ns");
  EXPECT_EQ(Duration::Micros(250).ToString(), "250us");
  EXPECT_EQ(Duration::Nanos(1500).ToString(), "1.5us");
  EXPECT_EQ(Duration::Nanos(10575000).ToString(), "10.575ms");
  EXPECT_EQ(Duration::Nanos(10575499).ToString(), "10.575ms");
  EXPECT_EQ(Duration::Nanos(10575500).ToString(), "10.576ms");
  EXPECT_EQ(Duration::Seconds(3).ToString(), "3s");
  EXPECT_EQ(Duration::Millis(1500).ToString(), "1.5s");
  EXPECT_EQ(Duration::Seconds(3600).ToString(), "3600s");
  EXPECT_EQ(Duration::Millis(-5).ToString(), "-5ms");
  EXPECT_EQ(Duration::Nanos(-1500).ToString(), "-1.5us");
  EXPECT_EQ(Duration::Infinite().ToString(), "inf");
}

TEST(DurationTest, ToStringPromotesWhenRoundingReachesNextUnit) {
  EXPECT_EQ(Duration::Nanos(999999).ToString(), "999.999us");  // exact
  EXPECT_EQ(Duration::Nanos(999999999).ToString(), "1s");      // not "1000ms"
  EXPECT_EQ(Duration::Nanos(999999500).ToString(), "1s");
}

TEST(DurationTest, Parses) {
  struct Case {
    const char* text;
    Duration want;
  };
  for (const Case& c : {
           Case{"10ms", Duration::Millis(10)},
           Case{"1.5s", Duration::Millis(1500)},
           Case{"250us", Duration::Micros(250)},
           Case{"100ns", Duration::Nanos(100)},
           Case{"2m", Duration::Seconds(120)},
           Case{"1h", Duration::Seconds(3600)},
           Case{"1h30m", Duration::Seconds(5400)},
           Case{"0", Duration::Zero()},
           Case{" 10ms ", Duration::Millis(10)},
           Case{"-5ms", Duration::Millis(-5)},
           Case{"10.575ms", Duration::Nanos(10575000)},
           Case{"inf", Duration::Infinite()},
       }) {
    absl::StatusOr<Duration> d = Duration::Parse(c.text);
    ASSERT_TRUE(d.ok()) << c.text << ": " << d.status();
    EXPECT_EQ(*d, c.want) << c.text;
  }
}

TEST(DurationTest, RoundTripsThroughToString) {
  for (Duration d :
       {Duration::Nanos(7), Duration::Micros(250), Duration::Nanos(10575000),
        Duration::Seconds(42), Duration::Millis(-3), Duration::Zero(),
        Duration::Infinite()}) {
    absl::StatusOr<Duration> back = Duration::Parse(d.ToString());
    ASSERT_TRUE(back.ok()) << d << ": " << back.status();
    EXPECT_EQ(*back, d);
  }
}

TEST(DurationTest, RejectsBadInputNamingTheText) {
  for (const char* bad :
       {"", "10", "1.5", "abc", "10 ms", "10sec", "ms", "1d", "10ms garbage"}) {
    absl::StatusOr<Duration> d = Duration::Parse(bad);
    ASSERT_FALSE(d.ok()) << "'" << bad << "' parsed as " << *d;
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(d.status().message(), HasSubstr(absl::StrCat("'", bad, "'")));
  }
}

TEST(DurationTest, RejectsOverflow) {
  absl::StatusOr<Duration> d = Duration::Parse("3000000h");
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(d.status().message(), HasSubstr("out of range"));
}

TEST(DurationTest, ConvertsToAndFromAbsl) {
  EXPECT_EQ(Duration::Millis(3).ToAbsl(), absl::Milliseconds(3));
  EXPECT_EQ(Duration::FromAbsl(absl::Microseconds(7)), Duration::Micros(7));
  EXPECT_DOUBLE_EQ(Duration::Micros(1500).ToMillisF(), 1.5);
}

// --- Timestamp --------------------------------------------------------------

TEST(TimestampTest, ToString) {
  EXPECT_EQ(Timestamp::Epoch().ToString(), "0.000000s");
  EXPECT_EQ(Timestamp::FromNanos(12345678901).ToString(), "12.345679s");
  EXPECT_EQ(Timestamp::FromNanos(1500).ToString(), "0.000002s");
  EXPECT_EQ(Timestamp::FromNanos(-1500000).ToString(), "-0.001500s");
  EXPECT_EQ(Timestamp::Never().ToString(), "never");
  EXPECT_EQ(Timestamp::Infinite().ToString(), "inf");
}

TEST(TimestampTest, Arithmetic) {
  const Timestamp t = Timestamp::Epoch() + Duration::Millis(5);
  EXPECT_EQ(t.nanos(), 5000000);
  EXPECT_EQ(t - Timestamp::Epoch(), Duration::Millis(5));
  EXPECT_EQ(t - Duration::Millis(5), Timestamp::Epoch());
  EXPECT_TRUE(Timestamp::Never().is_never());
  EXPECT_FALSE(Timestamp::Epoch().is_never());
  EXPECT_LT(Timestamp::Never(), Timestamp::Epoch());
}

}  // namespace
}  // namespace slicesched
