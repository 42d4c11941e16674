// A virtual-time cluster: executes the GMG's issued operators with the
// ground-truth cost model, the way the per-device executors do on hardware.
//
// Each device runs one compute operator at a time, chosen among its ready
// issued operators by the shared queue discipline (ReadyQueue); transfers are
// granted by the shared arbitration rule (one active transfer per device).
// Completions are reported into the GMG (Start/Finish with virtual
// timestamps) and returned as feedback records for the estimators. The
// cluster owns no clock: the caller advances it to each event time.
//
// Threading: single-threaded, driven by the GMG's owner.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "slicesched/cluster/ground_truth.h"
#include "slicesched/comm/arbitration.h"
#include "slicesched/gmg/gmg.h"
#include "slicesched/backend/backend.h"
#include "slicesched/sim/queue_discipline.h"

namespace slicesched {

class VirtualCluster final : public ExecutionBackend {
 public:
  VirtualCluster(GlobalMappingGraph* gmg, const GroundTruthModel* truth, uint64_t seed);

  // A copy of this cluster's state driving `gmg` (a Clone() of its GMG):
  // the same queues, in-flight operators and random state.
  VirtualCluster Fork(GlobalMappingGraph* gmg) const {
    VirtualCluster c = *this;
    c.gmg_ = gmg;
    return c;
  }

  // Tells the cluster that `node` (compute or transfer) was issued.
  void NodeIssued(NodeId node) override;
  // Starts whatever can start at `now`.
  absl::Status Dispatch(Timestamp now) override;
  // Time of the next completion, or Timestamp::Infinite() when idle.
  Timestamp NextEventTime() const override;
  // Completes, in time order, everything finishing at or before `t`,
  // starting successors as devices free up; appends feedback records.
  absl::Status AdvanceTo(Timestamp t, std::vector<Feedback>* feedback) override;

  // Compute time each device has spent running operators so far.
  Duration busy_time(DeviceId d) const { return Duration::Nanos(busy_ns_[d.value()]); }
  int64_t completed_ops() const { return completed_ops_; }
  int64_t completed_transfers() const { return completed_transfers_; }

 private:
  struct Event {
    int64_t time;
    uint64_t seq;
    NodeId node;
    bool overlapped;
  };
  struct EventLater {
    bool operator()(const Event& a, const Event& b) const {
      return a.time != b.time ? a.time > b.time : a.seq > b.seq;
    }
  };

  void MaybeQueue(NodeId id, Timestamp now);
  absl::Status Complete(const Event& e, std::vector<Feedback>* feedback);

  GlobalMappingGraph* gmg_;
  const GroundTruthModel* truth_;
  std::mt19937_64 rng_;
  std::vector<ReadyQueue> ready_;          // per device
  std::vector<NodeId> items_;              // ReadyQueue item -> node
  std::vector<uint32_t> free_items_;
  absl::flat_hash_set<uint64_t> queued_;   // compute nodes in a ReadyQueue, transfers pending
  std::vector<TransferRequest> pending_;   // ready transfers awaiting arbitration
  std::vector<Event> events_;
  uint64_t seq_ = 0;
  std::vector<int64_t> busy_ns_;
  int64_t completed_ops_ = 0;
  int64_t completed_transfers_ = 0;
};

}  // namespace slicesched
