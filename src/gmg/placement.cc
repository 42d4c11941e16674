#include "slicesched/gmg/placement.h"

#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"

namespace slicesched {

absl::StatusOr<std::vector<NodeId>> IssueByPartition(GlobalMappingGraph& gmg, InstanceId instance,
                                                     const CandidatePartition& partition,
                                                     std::span<const DeviceId> slots, int32_t transfer_priority,
                                                     Timestamp now) {
  const Instance* inst = gmg.FindInstance(instance);
  if (inst == nullptr) return absl::NotFoundError(StrCat("no live instance ", instance));
  const GraphTemplate& tpl = *inst->tpl;
  if (static_cast<int>(partition.slot_of_op.size()) != tpl.num_ops()) {
    return absl::InvalidArgumentError(StrCat("partition '", partition.name, "' does not fit template '", tpl.name(), "'"));
  }
  if (static_cast<int>(slots.size()) < partition.num_slots) {
    return absl::InvalidArgumentError(StrCat("partition '", partition.name, "' needs ", partition.num_slots,
                                             " devices, got ", slots.size()));
  }
  std::vector<NodeId> issued;
  for (int op : tpl.topo_order()) {
    const NodeId id = inst->nodes[op].id;
    if (inst->nodes[op].state != NodeState::kUnscheduled) continue;
    SLICESCHED_RETURN_IF_ERROR(gmg.Issue(id, slots[partition.slot_of_op[op]], now));
    issued.push_back(id);
  }
  for (int op : tpl.topo_order()) {
    const DeviceId dst = inst->nodes[op].device;
    for (const InputRef& r : tpl.op(op).inputs) {
      if (r.kind != InputRef::Kind::kOp || inst->nodes[r.index].device == dst) continue;
      auto t = gmg.IssueTransfer(inst->nodes[r.index].id, r.output, dst, inst->nodes[op].id, transfer_priority, now);
      if (t.ok()) {
        issued.push_back(*t);
      } else if (t.status().code() != absl::StatusCode::kAlreadyExists) {
        return t.status();
      }
    }
  }
  return issued;
}

}  // namespace slicesched
