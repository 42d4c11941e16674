// Formatting and parsing of Bytes, Duration and Timestamp (see units.h).
//
// All arithmetic is done on integers (with a 128-bit intermediate where a
// product could overflow int64), so parsing and printing are exact and do not
// depend on floating-point rounding.

#include "slicesched/common/units.h"

#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace slicesched {
namespace {

using int128 = __int128;

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kInt64Min = std::numeric_limits<int64_t>::min();

// Divides `num` by `den` (den > 0), rounding half away from zero.
int128 DivRound(int128 num, int128 den) {
  if (num >= 0) return (num + den / 2) / den;
  return -((-num + den / 2) / den);
}

// Absolute value of an int64 as an unsigned value (well defined for INT64_MIN).
uint64_t AbsU64(int64_t v) {
  return v < 0 ? uint64_t{0} - static_cast<uint64_t>(v)
               : static_cast<uint64_t>(v);
}

absl::Status BadBytes(absl::string_view text, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("invalid byte size '", text, "': ", why));
}

// Maps a byte-size suffix (already stripped of surrounding spaces) to its
// multiplier, or returns 0 when the suffix is not recognised.
//
// Rule: a unit letter K, M, G, T or P (any case) on its own or followed by
// "i"/"iB" (any case) is binary (1024-based): "16k", "16K", "16Ki", "16KiB".
// The letter followed directly by "B" (any case, no "i") is decimal
// (1000-based): "16kB", "16KB", "16MB". "B" alone (or nothing) means bytes.
int64_t SuffixMultiplier(absl::string_view suffix) {
  if (suffix.empty() || suffix == "B" || suffix == "b") return 1;
  // Position in "kmgtp" + 1 is the power of 1024 (or 1000).
  constexpr absl::string_view kLetters = "kmgtp";
  const size_t letter =
      kLetters.find(absl::ascii_tolower(static_cast<unsigned char>(suffix[0])));
  if (letter == absl::string_view::npos) return 0;
  const int power = static_cast<int>(letter) + 1;
  const std::string rest = absl::AsciiStrToLower(suffix.substr(1));
  bool binary;
  if (rest.empty() || rest == "i" || rest == "ib") {
    binary = true;
  } else if (rest == "b") {
    binary = false;
  } else {
    return 0;
  }
  int64_t multiplier = 1;
  for (int i = 0; i < power; ++i) multiplier *= binary ? 1024 : 1000;
  return multiplier;
}

// Formats `units` (a count scaled by 1000, i.e. three implied decimals) with
// trailing zeros of the fraction removed: 10575 -> "10.575", 3000 -> "3".
std::string FormatMilliUnits(int128 milli_units) {
  const bool negative = milli_units < 0;
  const int128 abs_units = negative ? -milli_units : milli_units;
  const int64_t whole = static_cast<int64_t>(abs_units / 1000);
  int frac = static_cast<int>(abs_units % 1000);
  std::string out = negative ? "-" : "";
  absl::StrAppend(&out, whole);
  if (frac != 0) {
    int digits = 3;
    while (frac % 10 == 0) {
      frac /= 10;
      --digits;
    }
    absl::StrAppend(&out, ".", absl::StrFormat("%0*d", digits, frac));
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------
// Bytes

std::string Bytes::ToString() const {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB",
                                           "TiB", "PiB", "EiB"};
  const uint64_t abs = AbsU64(count_);
  if (abs < 1024) return absl::StrCat(count_, " B");
  int unit = 0;
  uint64_t scale = 1024;
  while (unit + 1 < 6 && abs / scale >= 1024) {
    scale *= 1024;
    ++unit;
  }
  // Two decimals, rounded half away from zero; promote to the next unit when
  // rounding reaches 1024.00 (e.g. 1048575 B is "1.00 MiB", not "1024.00 KiB").
  int128 hundredths = DivRound(static_cast<int128>(abs) * 100, scale);
  if (hundredths >= 1024 * 100 && unit + 1 < 6) {
    scale *= 1024;
    ++unit;
    hundredths = DivRound(static_cast<int128>(abs) * 100, scale);
  }
  return absl::StrFormat("%s%d.%02d %s", count_ < 0 ? "-" : "",
                         static_cast<int64_t>(hundredths / 100),
                         static_cast<int>(hundredths % 100), kUnits[unit]);
}

absl::StatusOr<Bytes> Bytes::Parse(absl::string_view text) {
  const absl::string_view s = absl::StripAsciiWhitespace(text);
  if (s.empty()) return BadBytes(text, "empty");
  if (s[0] == '-') return BadBytes(text, "must not be negative");

  // Number: digits, optionally followed by '.' and more digits.
  size_t pos = 0;
  int128 whole = 0;
  while (pos < s.size() &&
         absl::ascii_isdigit(static_cast<unsigned char>(s[pos]))) {
    whole = whole * 10 + (s[pos] - '0');
    if (whole > kInt64Max) return BadBytes(text, "out of range");
    ++pos;
  }
  if (pos == 0)
    return BadBytes(text, "expected a number such as 4096 or 64GiB");
  int128 frac = 0;
  int128 frac_scale = 1;
  if (pos < s.size() && s[pos] == '.') {
    ++pos;
    const size_t frac_start = pos;
    while (pos < s.size() &&
           absl::ascii_isdigit(static_cast<unsigned char>(s[pos]))) {
      if (pos - frac_start >= 9)
        return BadBytes(text, "too many decimal places");
      frac = frac * 10 + (s[pos] - '0');
      frac_scale *= 10;
      ++pos;
    }
    if (pos == frac_start) return BadBytes(text, "expected digits after '.'");
  }

  const absl::string_view suffix =
      absl::StripLeadingAsciiWhitespace(s.substr(pos));
  const int64_t multiplier = SuffixMultiplier(suffix);
  if (multiplier == 0) {
    return BadBytes(text, absl::StrCat("unknown unit '", suffix,
                                       "' (expected B, KiB/MiB/GiB/TiB/PiB, "
                                       "K/M/G/T/P or kB/MB/GB/TB/PB)"));
  }
  // whole <= INT64_MAX, frac_scale <= 1e9, multiplier <= 1024^5: the product
  // below stays far inside 128 bits.
  const int128 numerator = (whole * frac_scale + frac) * multiplier;
  if (numerator % frac_scale != 0 && multiplier == 1) {
    return BadBytes(text, "a byte count must be a whole number");
  }
  const int128 count = DivRound(numerator, frac_scale);
  if (count > kInt64Max) return BadBytes(text, "out of range");
  return Bytes(static_cast<int64_t>(count));
}

// ---------------------------------------------------------------------------
// Duration

std::string Duration::ToString() const {
  if (ns_ == kInt64Max) return "inf";
  if (ns_ == kInt64Min) return "-inf";
  if (ns_ == 0) return "0s";
  struct Unit {
    int64_t ns;
    const char* name;
  };
  static constexpr Unit kUnits[] = {
      {1, "ns"}, {1000, "us"}, {1000000, "ms"}, {1000000000, "s"}};
  const uint64_t abs = AbsU64(ns_);
  int unit = 0;
  while (unit + 1 < 4 && abs >= static_cast<uint64_t>(kUnits[unit + 1].ns)) {
    ++unit;
  }
  if (unit == 0) return absl::StrCat(ns_, "ns");
  int128 milli_units =
      DivRound(static_cast<int128>(ns_) * 1000, kUnits[unit].ns);
  // 999.9996us rounds to 1000us: print it as 1ms instead.
  const int128 abs_milli = milli_units < 0 ? -milli_units : milli_units;
  if (abs_milli >= 1000 * 1000 && unit + 1 < 4) {
    ++unit;
    milli_units = DivRound(static_cast<int128>(ns_) * 1000, kUnits[unit].ns);
  }
  return absl::StrCat(FormatMilliUnits(milli_units), kUnits[unit].name);
}

absl::StatusOr<Duration> Duration::Parse(absl::string_view text) {
  const absl::string_view s = absl::StripAsciiWhitespace(text);
  absl::Duration d;
  if (s.empty() || !absl::ParseDuration(s, &d)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid duration '", text,
        "': expected a number with a unit (ns, us, ms, s, m, h) such as 10ms, "
        "1.5s or 2m, or 0, or inf"));
  }
  if (d == absl::InfiniteDuration()) return Duration::Infinite();
  if (d == -absl::InfiniteDuration()) return Duration(kInt64Min);
  // Finite values must fit in int64 nanoseconds (about +-292 years); the two
  // extreme values are reserved for +-inf.
  if (d >= absl::Nanoseconds(kInt64Max) || d <= absl::Nanoseconds(kInt64Min)) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid duration '", text, "': out of range"));
  }
  return Duration(absl::ToInt64Nanoseconds(d));
}

// ---------------------------------------------------------------------------
// Timestamp

std::string Timestamp::ToString() const {
  if (is_never()) return "never";
  if (ns_ == kInt64Max) return "inf";
  const int128 micros = DivRound(ns_, 1000);
  const int128 abs_micros = micros < 0 ? -micros : micros;
  return absl::StrFormat("%s%d.%06ds", micros < 0 ? "-" : "",
                         static_cast<int64_t>(abs_micros / 1000000),
                         static_cast<int64_t>(abs_micros % 1000000));
}

}  // namespace slicesched
