// The communication graph: pending cross-device transfers and their
// arbitration (paper §3.5.2; docs/architecture.md).
//
// A transfer goes through three steps:
//   Intent  the tensor is ready at the source: AddIntent() makes it pending;
//   Recv    Arbitrate() grants a conflict-free set (ArbitrateTransfers: one
//           active transfer per device end, higher priority, then older, then
//           issue order first); for each granted transfer the destination
//           allocates its receive buffer first. If that allocation fails,
//           RecvFailed() puts the intent back to pending with its retry count
//           incremented and frees both ends: a retryable state, not an error;
//   Send    only after RecvReady() does the source send; Complete() (or
//           Abort()) frees both ends.
//
// The graph moves no bytes and knows no GMG: the executor runtime drives it.
// Threading: single-threaded (the owner thread of the GMG).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/status/status.h"
#include "slicesched/comm/arbitration.h"
#include "slicesched/common/ids.h"
#include "slicesched/common/units.h"

namespace slicesched {

struct TransferIntent {
  uint64_t id = 0;  // caller's handle (the GMG transfer node id)
  DeviceId src, dst;
  int32_t priority = 0;  // TransferPriority(...)
  int64_t ready_ns = 0;  // when the tensor became ready at the source
  Bytes bytes;
};

class CommGraph {
 public:
  enum class Phase : uint8_t { kPending, kReceiving, kSending };

  explicit CommGraph(size_t num_devices);

  // A new pending intent. InvalidArgument for unknown or equal ends,
  // AlreadyExists for a known id.
  absl::Status AddIntent(const TransferIntent& intent);

  // One arbitration round over the pending intents whose ends are both idle
  // (and not `blocked`, when given: per device, e.g. a stopped device).
  // Granted intents enter kReceiving with both ends busy; they are returned
  // in grant order.
  std::vector<TransferIntent> Arbitrate(const std::vector<uint8_t>* blocked = nullptr);

  // Recv outcome for a kReceiving intent.
  absl::Status RecvReady(uint64_t id);   // -> kSending
  absl::Status RecvFailed(uint64_t id);  // -> kPending, retries + 1, ends freed
  // A kSending intent finished; it is forgotten and its ends freed.
  absl::Status Complete(uint64_t id);
  // Forgets an intent in any phase (its transfer was cancelled), freeing its
  // ends if it held them. NotFound if unknown.
  absl::Status Abort(uint64_t id);

  bool contains(uint64_t id) const { return intents_.contains(id); }
  // -1 if unknown.
  int retries(uint64_t id) const;
  Phase phase(uint64_t id) const;  // requires contains(id)
  bool busy(DeviceId d) const { return busy_[d.value()] != 0; }
  size_t num_pending() const { return num_pending_; }
  size_t num_active() const { return intents_.size() - num_pending_; }
  size_t size() const { return intents_.size(); }
  // Pending intents that were put back after a failed Recv and not yet
  // granted again.
  size_t num_retrying() const { return num_retrying_; }
  int64_t total_retries() const { return total_retries_; }
  int64_t total_granted() const { return total_granted_; }

 private:
  struct Entry {
    TransferIntent intent;
    uint64_t seq = 0;
    Phase phase = Phase::kPending;
    int retries = 0;
  };
  void FreeEnds(const Entry& e);

  std::vector<uint8_t> busy_;
  absl::btree_map<uint64_t, Entry> intents_;
  uint64_t next_seq_ = 0;
  size_t num_pending_ = 0;
  size_t num_retrying_ = 0;
  int64_t total_retries_ = 0;
  int64_t total_granted_ = 0;
};

}  // namespace slicesched
