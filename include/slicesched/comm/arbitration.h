// Transfer arbitration: the rule that picks which pending transfers start.
//
// A device takes part in at most one active transfer at a time (as source or
// destination). Each round, among transfers whose tensor is ready at the
// source, the arbiter grants a conflict-free set greedily in this order:
//
//   1. higher priority first;
//   2. older first (earlier ready time);
//   3. lower sequence number first (issue order).
//
// A transfer is granted when neither of its ends is busy; granting marks both
// ends busy. The greedy order means a high-priority transfer is never held
// back by a lower-priority one that could have waited, and since every
// granted transfer finishes and frees its ends, every pending transfer is
// eventually granted (no deadlock, no starvation of old transfers within a
// priority level). The simulator and the communication graph both call this.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

namespace slicesched {

struct TransferRequest {
  uint32_t id = 0;       // caller's handle
  uint16_t src = 0;
  uint16_t dst = 0;
  int32_t priority = 0;
  int64_t ready_ns = 0;
  uint64_t seq = 0;
};

// Orders requests by the arbitration rule (highest precedence first).
constexpr bool ArbitratesBefore(const TransferRequest& a, const TransferRequest& b) {
  if (a.priority != b.priority) return a.priority > b.priority;
  if (a.ready_ns != b.ready_ns) return a.ready_ns < b.ready_ns;
  return a.seq < b.seq;
}

// Grants a conflict-free subset of `pending` given per-device `busy` flags
// (indexed by device; updated for granted transfers). Appends the granted
// requests' ids to `granted` in grant order and removes them from `pending`,
// which it leaves sorted by precedence.
void ArbitrateTransfers(std::vector<TransferRequest>* pending, std::vector<uint8_t>* busy,
                        std::vector<uint32_t>* granted);

// The same rule when only the requests from index `first` on can be granted:
// every request before `first` already has a busy end (it was arbitrated and
// no end has been freed since), so granting more transfers cannot unblock
// it. Sorts the tail by precedence, grants from it greedily, removes the
// granted ones (the head is left as it is). ArbitrateTransfers(p, ...) is
// ArbitrateNewTransfers(p, 0, ...).
void ArbitrateNewTransfers(std::vector<TransferRequest>* pending, size_t first, std::vector<uint8_t>* busy,
                           std::vector<uint32_t>* granted);

}  // namespace slicesched

namespace slicesched {

// The arbitration priority of a transfer feeding an operator of the given
// priority class (0 online, 1 offline) and numeric priority: online transfers
// outrank every offline one, then the numeric priority decides.
constexpr int32_t TransferPriority(uint8_t priority_class, int32_t priority) {
  const int64_t p = (priority_class == 0 ? (int64_t{1} << 24) : 0) +
                    std::clamp<int64_t>(priority, -(int64_t{1} << 23), (int64_t{1} << 23) - 1);
  return static_cast<int32_t>(p);
}

}  // namespace slicesched
