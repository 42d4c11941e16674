// Issuing placements into the GMG, with the transfers they imply.
#pragma once

#include <optional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "slicesched/gmg/gmg.h"

namespace slicesched {

struct NodePlacement {
  NodeId node;
  DeviceId device;
};

// Issues the given compute nodes (in dependency order) on their devices, then
// a transfer for every input whose producer sits on another device and has
// no copy or pending transfer there (priority `transfer_priority`). Returns
// the issued node ids, compute nodes first, so a backend can be told.
absl::StatusOr<std::vector<NodeId>> IssuePlacements(GlobalMappingGraph& gmg, std::span<const NodePlacement> placements,
                                                    int32_t transfer_priority, Timestamp now);

// Issues every unscheduled node of `instance` on slots[partition.slot_of_op[op]].
absl::StatusOr<std::vector<NodeId>> IssueByPartition(GlobalMappingGraph& gmg, InstanceId instance,
                                                     const CandidatePartition& partition,
                                                     std::span<const DeviceId> slots, int32_t transfer_priority,
                                                     Timestamp now);

// The slot binding forced by an instance's attached checkpoints: an op that
// grows a checkpoint must run where it lives. Returns, per slot of
// `partition`, the forced device or an invalid id when free; nullopt when
// two checkpoints force one slot onto different devices (the partition
// cannot host this instance).
std::optional<std::vector<DeviceId>> ForcedSlots(const GlobalMappingGraph& gmg, const Instance& instance,
                                                 const CandidatePartition& partition);

}  // namespace slicesched
