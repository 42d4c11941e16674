// Implementation of the clocks declared in clock.h.

#include "slicesched/common/clock.h"

#include <chrono>
#include <cstdint>
#include <limits>

#include "absl/base/internal/raw_logging.h"

namespace slicesched {

Clock::~Clock() = default;

SteadyClock::SteadyClock() : origin_(std::chrono::steady_clock::now()) {}

Timestamp SteadyClock::Now() const {
  const auto elapsed = std::chrono::steady_clock::now() - origin_;
  return Timestamp::FromNanos(
      std::chrono::duration_cast<std::chrono::nanoseconds>(elapsed).count());
}

ManualClock::ManualClock(Timestamp start) : now_ns_(start.nanos()) {}

Timestamp ManualClock::Now() const {
  return Timestamp::FromNanos(now_ns_.load(std::memory_order_acquire));
}

void ManualClock::SetTime(Timestamp t) {
  int64_t current = now_ns_.load(std::memory_order_acquire);
  do {
    if (t.nanos() < current) {
      ABSL_RAW_LOG(FATAL,
                   "ManualClock::SetTime(%s) would move time backwards from %s",
                   t.ToString().c_str(),
                   Timestamp::FromNanos(current).ToString().c_str());
    }
  } while (!now_ns_.compare_exchange_weak(current, t.nanos(),
                                          std::memory_order_acq_rel,
                                          std::memory_order_acquire));
}

Timestamp ManualClock::Advance(Duration d) {
  if (d < Duration::Zero()) {
    ABSL_RAW_LOG(FATAL, "ManualClock::Advance(%s): negative duration",
                 d.ToString().c_str());
  }
  int64_t current = now_ns_.load(std::memory_order_acquire);
  int64_t next;
  do {
    if (current > std::numeric_limits<int64_t>::max() - d.nanos()) {
      ABSL_RAW_LOG(FATAL, "ManualClock::Advance(%s) from %s overflows",
                   d.ToString().c_str(),
                   Timestamp::FromNanos(current).ToString().c_str());
    }
    next = current + d.nanos();
  } while (!now_ns_.compare_exchange_weak(
      current, next, std::memory_order_acq_rel, std::memory_order_acquire));
  return Timestamp::FromNanos(next);
}

}  // namespace slicesched
