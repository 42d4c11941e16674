// How ExecutorSet's owner waits for the devices and is woken by them
// (executor.h: "Owner waits"): the wait conditions, napping or blocking
// beside a device, and the device threads' wake-ups.
#include "slicesched/executor/runtime/executor.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <cstddef>
#include <exception>
#include <iterator>
#include <utility>

#include "absl/time/clock.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "executor_internal.h"

namespace slicesched::executor {

using runtime_internal::AddLocked;
using runtime_internal::CpuRelax;

// ---------------------------------------------------------------------------
// Owner waits

bool ExecutorSet::OwnerWaitSatisfied() const {
  switch (owner_wait_.load(std::memory_order_relaxed)) {
    case OwnerWait::kNone:
      return false;
    case OwnerWait::kEvent:
      return num_records_.load(std::memory_order_relaxed) > 0 || start_unseen_.load(std::memory_order_relaxed);
    case OwnerWait::kCompletions: {
      const size_t pending = pending_completions_.load(std::memory_order_relaxed);
      return pending >= owner_wait_min_.load(std::memory_order_relaxed) ||
             (pending > 0 && busy_devices_.load(std::memory_order_relaxed) == 0);
    }
  }
  return false;
}

bool ExecutorSet::NoteWork(DeviceState& s) {
  const bool busy = s.next != kNoItem || !s.ready.empty() || s.num_pending > 0 || s.running.valid();
  if (busy == s.busy) return false;
  s.busy = busy;
  AddLocked(busy_devices_, busy ? 1 : -1);
  return !busy;
}

void ExecutorSet::MaybeWakeOwner(size_t d, bool urgent) {
  const bool went_idle = NoteWork(devices_[d]);
  // Pairs with the fence in OwnerSleepUntil()/OwnerSleeps(): either the
  // owner sees what this thread published, or this thread sees it asleep.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  const OwnerSleep sleep = owner_sleep_.load(std::memory_order_acquire);
  if (sleep == OwnerSleep::kAwake || !OwnerWaitSatisfied()) return;
  // Napping, the owner looks again within owner_nap_ by itself.
  if (sleep == OwnerSleep::kNapping && !urgent && !went_idle) return;
  OwnerSleep expected = sleep;  // one wake per sleep
  if (!owner_sleep_.compare_exchange_strong(expected, OwnerSleep::kAwake, std::memory_order_acq_rel)) return;
  owner_wakes_.fetch_add(1, std::memory_order_relaxed);
  if (notify_) {
    notify_();
    return;
  }
  if (sleep == OwnerSleep::kBlocked) {
    // Under mu_: the owner wakes when this thread releases mu_ (absl moves
    // it to mu_'s queue), not to block on mu_ at once.
    owner_blocked_cv_.Signal();
    return;
  }
  absl::MutexLock l(&owner_mu_);
  owner_woken_ = true;
  owner_cv_.Signal();
}

bool ExecutorSet::OwnerBesideADevice() const {
  const int cpu = sched_getcpu();
  if (cpu < 0) return false;
  for (size_t d = 0; d < pools_.size(); ++d) {
    if (device_cpu_[d].cpu.load(std::memory_order_relaxed) == cpu) return true;
  }
  return false;
}

ExecutorSet::OwnerSleep ExecutorSet::OwnerSleepMode() const {
  const bool nap = owner_nap_ > absl::ZeroDuration() && busy_devices_.load(std::memory_order_relaxed) > 0 &&
                   !OwnerBesideADevice();
  return nap ? OwnerSleep::kNapping : OwnerSleep::kBlocked;
}

void ExecutorSet::OwnerSleepUntil(absl::Time until, OwnerSleep mode) {
  if (mode == OwnerSleep::kBlocked) {
    // On the set's lock: the device threads that wake
    // it hold that lock anyway (the caller loops on spurious returns).
    absl::MutexLock l(&mu_);
    owner_sleep_.store(mode, std::memory_order_relaxed);
    if (!OwnerWaitSatisfied()) owner_blocked_cv_.WaitWithDeadline(&mu_, until);
    owner_sleep_.store(OwnerSleep::kAwake, std::memory_order_relaxed);
    return;
  }
  absl::MutexLock l(&owner_mu_);
  owner_woken_ = false;
  owner_sleep_.store(mode, std::memory_order_release);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (!OwnerWaitSatisfied()) {
    // WaitWithDeadline returns true once `until` passes.
    while (!owner_woken_ && !owner_cv_.WaitWithDeadline(&owner_mu_, until)) {
    }
  }
  owner_sleep_.store(OwnerSleep::kAwake, std::memory_order_relaxed);
}

bool ExecutorSet::OwnerWaitFor(OwnerWait kind, size_t min_completions, absl::Duration timeout,
                               absl::Duration spin) {
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + timeout;
  const absl::Time spin_until = start + std::min(spin, timeout);
  owner_wait_min_.store(min_completions, std::memory_order_relaxed);
  owner_wait_.store(kind, std::memory_order_relaxed);
  bool ok = false;
  bool polled = false;  // the last look was a poll, not a sleep
  for (;;) {
    if (OwnerWaitSatisfied()) {
      ok = true;
      if (polled) {
        // Seen at once, the completion's device thread still holds mu_
        // (its finish goes on to pick its next node or to wait), and the
        // drain that follows would sleep on mu_ and be woken by that
        // thread's unlock: the wake-up the poll avoided. Poll for mu_ too.
        const absl::Time until = absl::Now() + absl::Microseconds(100);
        for (int i = 0; !mu_.TryLock(); ++i) {
          if ((i & 15) == 15 && absl::Now() >= until) {
            mu_.Lock();
            break;
          }
          for (int k = 0; k < 64; ++k) CpuRelax();
        }
        mu_.Unlock();
      }
      break;
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) break;
    // No lock here: the owner never waits for a device thread's critical
    // section (and never needs that thread's unlock to wake it).
    const OwnerSleep mode = OwnerSleepMode();
    polled = mode == OwnerSleep::kNapping && now < spin_until;
    if (polled) {
      // Polling (see WaitForFinishBatch): awake, so no device wakes it.
      for (int i = 0; i < 64; ++i) CpuRelax();
      continue;
    }
    OwnerSleepUntil(mode == OwnerSleep::kNapping ? std::min(deadline, now + owner_nap_) : deadline, mode);
  }
  owner_wait_.store(OwnerWait::kNone, std::memory_order_relaxed);
  return ok;
}

bool ExecutorSet::WaitForCompletion(absl::Duration timeout) {
  if (comm_.num_retrying() > 0) return true;
  return OwnerWaitFor(OwnerWait::kEvent, 0, timeout, absl::ZeroDuration());
}

bool ExecutorSet::WaitForFinish(absl::Duration timeout) {
  if (comm_.num_retrying() > 0) return true;
  return OwnerWaitFor(OwnerWait::kCompletions, 1, timeout, absl::ZeroDuration());
}

bool ExecutorSet::WaitForFinishBatch(absl::Duration timeout, int min_completions, absl::Duration spin) {
  if (comm_.num_retrying() > 0) return true;
  return OwnerWaitFor(OwnerWait::kCompletions, static_cast<size_t>(std::max(min_completions, 1)), timeout,
                      spin);
}

void ExecutorSet::OwnerSleeps() {
  owner_wait_min_.store(1, std::memory_order_relaxed);
  owner_wait_.store(OwnerWait::kCompletions, std::memory_order_relaxed);
  owner_sleep_.store(OwnerSleepMode(), std::memory_order_release);
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

void ExecutorSet::OwnerAwake() {
  owner_sleep_.store(OwnerSleep::kAwake, std::memory_order_relaxed);
  owner_wait_.store(OwnerWait::kNone, std::memory_order_relaxed);
}

}  // namespace slicesched::executor
