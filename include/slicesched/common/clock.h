// Clocks: the single source of "now" for every component.
//
// Code that needs the time takes a `const Clock&` (or `Clock*`) instead of
// calling std::chrono directly, so the same code runs against real time in the
// daemon (SteadyClock) and against virtual time in tests and in the simulator
// (ManualClock). There is deliberately no global default clock: whoever owns a
// component hands it its clock.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include "slicesched/common/units.h"

namespace slicesched {

class Clock {
 public:
  virtual ~Clock();
  // Current time, measured from this clock's epoch. Never decreases.
  // Thread-safe.
  virtual Timestamp Now() const = 0;
};

// Real, monotonic time from std::chrono::steady_clock. The epoch is the moment
// the SteadyClock was constructed, so Now() starts near Timestamp::Epoch() and
// timestamps stay small and readable in logs. Timestamps from two different
// SteadyClock objects are therefore not comparable.
class SteadyClock final : public Clock {
 public:
  SteadyClock();
  Timestamp Now() const override;

 private:
  const std::chrono::steady_clock::time_point origin_;
};

// Virtual time for tests and simulation: time moves only when told to.
// All methods are thread-safe (the time is a std::atomic<int64_t>).
//
// Time never moves backwards: Advance() with a negative duration and
// SetTime() to a time before Now() are programming errors and abort the
// process with a message (a CHECK failure), as does advancing past
// Timestamp::Infinite().
class ManualClock final : public Clock {
 public:
  explicit ManualClock(Timestamp start = Timestamp::Epoch());

  Timestamp Now() const override;
  // Moves the clock to `t`; `t` must be >= Now(). Setting the current time
  // again is allowed.
  void SetTime(Timestamp t);
  // Moves the clock forward by `d` (>= 0) and returns the new time.
  Timestamp Advance(Duration d);

 private:
  std::atomic<int64_t> now_ns_;
};

}  // namespace slicesched
