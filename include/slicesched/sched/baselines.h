// The paper's four baselines (§5), as policies on the same mechanism.
//
// All of them place whole instances by a fixed partition on fixed devices;
// decode steps always follow their conversation's KV cache.
//
//   Static-Online  online model instance k (tenant k) is pinned to the GPU
//                  pair (2k, 2k+1), pipelined "pp2"; no offline work.
//   Full-Share     as Static-Online, plus one offline model instance
//                  pipelined across all 8 GPUs ("pp8" of a template fused 4
//                  layers per operator) that time-shares them; online work
//                  has priority in every device queue.
//   Subset-Share   (AntMan-like) the offline instance is confined to a fixed
//                  4-GPU subset (GPUs 4-7, "pp4"), priority-aware.
//   Dual-Share     (Orion-like) two offline instances on two 4-GPU subsets
//                  (0-3, 4-7, "pp4"); a new offline request is admitted to a
//                  subset only while no device of it has queued work beyond
//                  the operator it is running (interference-aware).
// An offline instance keeps at most as many requests in flight as its
// pipeline has stages.
//
// A fifth baseline, beside the paper's four:
//
//   Priority-Colocate  co-location as engines with priority scheduling do it
//                  (vLLM's priority policy, HyGen, ConServe): online as in
//                  Static-Online, and each online GPU pair also serves
//                  offline requests (pp2 of the same 8-layer operators; a
//                  new offline request goes to the pair with the fewest
//                  offline requests, ties to the lower pair). An offline
//                  operator is issued on its pair only while neither device
//                  of the pair has an online operator outstanding and the
//                  pair has no other offline operator outstanding, one
//                  fused operator at a time, so online work waits for at
//                  most the one offline operator in flight: it preempts at
//                  every fused-operator boundary.
#pragma once

#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"

#include "slicesched/sched/policy.h"

namespace slicesched {

struct OfflineGroup {
  std::vector<DeviceId> devices;  // bound to the partition's slots in order
  std::string partition;          // partition name in the offline template
};

class PinnedPolicy final : public PlacementPolicy {
 public:
  // `groups` empty: no offline work (Static-Online).
  PinnedPolicy(std::string name, std::vector<OfflineGroup> groups, bool interference_aware);

  static PinnedPolicy StaticOnline();
  static PinnedPolicy FullShare();
  static PinnedPolicy SubsetShare();
  static PinnedPolicy DualShare();

  std::string_view name() const override { return name_; }
  bool accepts_offline() const override { return !groups_.empty(); }
  int OfflineAdmissions(const SchedulerEnv& env, Timestamp now) override;
  absl::StatusOr<ScheduleStats> Schedule(SchedulerEnv& env, Timestamp now) override;

 private:
  int InFlight(const GlobalMappingGraph& g, size_t group);
  bool Quiet(const GlobalMappingGraph& g, size_t group) const;

  std::string name_;
  std::vector<OfflineGroup> groups_;
  bool interference_aware_;
  std::vector<std::vector<uint64_t>> inflight_;  // per group: live offline prefill/decode instance ids
};

class PriorityColocate final : public PlacementPolicy {
 public:
  // `per_pair`: offline requests admitted into the GMG per pair at once.
  explicit PriorityColocate(int per_pair = 2) : per_pair_(per_pair) {}

  std::string_view name() const override { return "Priority-Colocate"; }
  int OfflineAdmissions(const SchedulerEnv& env, Timestamp now) override;
  absl::StatusOr<ScheduleStats> Schedule(SchedulerEnv& env, Timestamp now) override;

 private:
  // True when an offline operator may be issued on pair `pair` now.
  bool PairFree(const GlobalMappingGraph& g, int pair) const;

  int per_pair_;
  absl::flat_hash_map<uint64_t, int> pair_of_;  // live offline instance id -> pair
};

}  // namespace slicesched
