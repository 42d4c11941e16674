// Issuing a whole instance by one of its template's candidate partitions.
#pragma once

#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "slicesched/gmg/gmg.h"

namespace slicesched {

// Issues every unscheduled node of `instance` in topological order on
// slots[partition.slot_of_op[op]], then the transfers that edges crossing
// slots need (priority `transfer_priority`). Returns the issued node ids,
// compute nodes first, so a backend can be told about them.
absl::StatusOr<std::vector<NodeId>> IssueByPartition(GlobalMappingGraph& gmg, InstanceId instance,
                                                     const CandidatePartition& partition,
                                                     std::span<const DeviceId> slots, int32_t transfer_priority,
                                                     Timestamp now);

}  // namespace slicesched
