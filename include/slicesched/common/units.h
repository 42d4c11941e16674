// Units: byte counts, durations and timestamps.
//
// All three are thin wrappers over int64 so that arithmetic stays as cheap as
// plain integers in the simulator's inner loop, while the type system keeps a
// byte count from being added to a duration. Durations and timestamps count
// nanoseconds; a Timestamp is measured from the epoch of the Clock that made it
// (see clock.h), never from the Unix epoch unless that clock says so.
#pragma once

#include <cstdint>
#include <compare>
#include <limits>
#include <ostream>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace slicesched {

class Bytes {
 public:
  constexpr Bytes() = default;
  constexpr explicit Bytes(int64_t count) : count_(count) {}

  static constexpr Bytes Zero() { return Bytes(0); }
  static constexpr Bytes KiB(int64_t n) { return Bytes(n << 10); }
  static constexpr Bytes MiB(int64_t n) { return Bytes(n << 20); }
  static constexpr Bytes GiB(int64_t n) { return Bytes(n << 30); }

  constexpr int64_t count() const { return count_; }
  constexpr double ToGiB() const { return static_cast<double>(count_) / (1LL << 30); }
  constexpr double ToMiB() const { return static_cast<double>(count_) / (1LL << 20); }

  constexpr auto operator<=>(const Bytes&) const = default;
  constexpr Bytes operator+(Bytes o) const { return Bytes(count_ + o.count_); }
  constexpr Bytes operator-(Bytes o) const { return Bytes(count_ - o.count_); }
  constexpr Bytes operator*(int64_t k) const { return Bytes(count_ * k); }
  constexpr Bytes& operator+=(Bytes o) { count_ += o.count_; return *this; }
  constexpr Bytes& operator-=(Bytes o) { count_ -= o.count_; return *this; }

  // "512 B" below 1 KiB, else two decimals in the largest binary unit that
  // keeps the value >= 1: "1.50 KiB", "3.49 GiB".
  std::string ToString() const;
  // Parses "4096", "64GiB", "64 GiB", "1.5MiB", "16k", "40GB". The rule:
  //   - no suffix or "B"/"b": bytes;
  //   - a unit letter K, M, G, T, P alone or followed by "i"/"iB" is binary
  //     (1024-based): "16k" == "16K" == "16KiB" == 16384;
  //   - the letter followed directly by "B" is decimal (1000-based):
  //     "16kB" == "16KB" == 16000.
  // Letters are case-insensitive. A fraction (up to 9 digits) is allowed
  // with a unit and rounds to the nearest byte. Empty text, negatives,
  // garbage and values above INT64_MAX give InvalidArgumentError quoting
  // `text`.
  static absl::StatusOr<Bytes> Parse(absl::string_view text);

  friend std::ostream& operator<<(std::ostream& os, Bytes b) { return os << b.ToString(); }

 private:
  int64_t count_ = 0;
};

class Duration {
 public:
  constexpr Duration() = default;
  static constexpr Duration Nanos(int64_t n) { return Duration(n); }
  static constexpr Duration Micros(int64_t n) { return Duration(n * 1000); }
  static constexpr Duration Millis(int64_t n) { return Duration(n * 1000000); }
  static constexpr Duration Seconds(int64_t n) { return Duration(n * 1000000000); }
  static constexpr Duration FromSecondsF(double s) { return Duration(static_cast<int64_t>(s * 1e9)); }
  static constexpr Duration FromMillisF(double ms) { return Duration(static_cast<int64_t>(ms * 1e6)); }
  static constexpr Duration Zero() { return Duration(0); }
  static constexpr Duration Infinite() { return Duration(std::numeric_limits<int64_t>::max()); }

  constexpr int64_t nanos() const { return ns_; }
  constexpr double ToMillisF() const { return static_cast<double>(ns_) / 1e6; }
  constexpr double ToMicrosF() const { return static_cast<double>(ns_) / 1e3; }
  constexpr double ToSecondsF() const { return static_cast<double>(ns_) / 1e9; }
  absl::Duration ToAbsl() const { return absl::Nanoseconds(ns_); }
  static Duration FromAbsl(absl::Duration d) { return Duration(absl::ToInt64Nanoseconds(d)); }

  constexpr auto operator<=>(const Duration&) const = default;
  constexpr Duration operator+(Duration o) const { return Duration(ns_ + o.ns_); }
  constexpr Duration operator-(Duration o) const { return Duration(ns_ - o.ns_); }
  constexpr Duration operator*(int64_t k) const { return Duration(ns_ * k); }
  constexpr Duration& operator+=(Duration o) { ns_ += o.ns_; return *this; }
  constexpr Duration& operator-=(Duration o) { ns_ -= o.ns_; return *this; }

  // "10.575ms", "3s", "250us", "100ns": the largest of ns/us/ms/s that keeps
  // the value >= 1, up to 3 decimals (rounded, trailing zeros dropped); "0s"
  // for zero and "inf" for Infinite(). Parse() reads every output back.
  std::string ToString() const;
  // Parses "10ms", "1.5s", "250us", "100ns", "2m", "1h", "1h30m", "-5ms",
  // "0" and "inf" (absl::ParseDuration syntax). A number without a unit other
  // than "0", garbage and values beyond +-292 years give InvalidArgumentError
  // quoting `text`.
  static absl::StatusOr<Duration> Parse(absl::string_view text);

  friend std::ostream& operator<<(std::ostream& os, Duration d) { return os << d.ToString(); }

 private:
  constexpr explicit Duration(int64_t ns) : ns_(ns) {}
  int64_t ns_ = 0;
};

class Timestamp {
 public:
  constexpr Timestamp() = default;
  static constexpr Timestamp FromNanos(int64_t ns) { return Timestamp(ns); }
  static constexpr Timestamp Epoch() { return Timestamp(0); }
  // Sentinel for "not yet happened".
  static constexpr Timestamp Never() { return Timestamp(std::numeric_limits<int64_t>::min()); }
  static constexpr Timestamp Infinite() { return Timestamp(std::numeric_limits<int64_t>::max()); }

  constexpr int64_t nanos() const { return ns_; }
  constexpr bool is_never() const { return ns_ == std::numeric_limits<int64_t>::min(); }
  constexpr double ToSecondsF() const { return static_cast<double>(ns_) / 1e9; }
  constexpr double ToMillisF() const { return static_cast<double>(ns_) / 1e6; }

  constexpr auto operator<=>(const Timestamp&) const = default;
  constexpr Timestamp operator+(Duration d) const { return Timestamp(ns_ + d.nanos()); }
  constexpr Timestamp operator-(Duration d) const { return Timestamp(ns_ - d.nanos()); }
  constexpr Duration operator-(Timestamp o) const { return Duration::Nanos(ns_ - o.ns_); }
  constexpr Timestamp& operator+=(Duration d) { ns_ += d.nanos(); return *this; }

  // Seconds since the clock's epoch with 6 decimals, "12.345679s"; "never"
  // for Never() and "inf" for Infinite().
  std::string ToString() const;
  friend std::ostream& operator<<(std::ostream& os, Timestamp t) { return os << t.ToString(); }

 private:
  constexpr explicit Timestamp(int64_t ns) : ns_(ns) {}
  int64_t ns_ = 0;
};

}  // namespace slicesched
