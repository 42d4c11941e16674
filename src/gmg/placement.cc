#include "slicesched/gmg/placement.h"

#include <algorithm>

#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"

namespace slicesched {

absl::StatusOr<std::vector<NodeId>> IssuePlacements(GlobalMappingGraph& gmg, std::span<const NodePlacement> placements,
                                                    int32_t transfer_priority, Timestamp now) {
  std::vector<NodeId> issued;
  issued.reserve(placements.size() * 2);
  for (const NodePlacement& p : placements) {
    SLICESCHED_RETURN_IF_ERROR(gmg.Issue(p.node, p.device, now));
    issued.push_back(p.node);
  }
  for (const NodePlacement& p : placements) {
    const OpNode* n = gmg.FindNode(p.node);
    const Instance* inst = gmg.FindInstance(n->instance);
    for (const InputRef& r : inst->tpl->op(n->op_index).inputs) {
      if (r.kind != InputRef::Kind::kOp) continue;
      const OpNode& producer = inst->nodes[r.index];
      if (producer.device == p.device) continue;
      const auto& copies = producer.outputs[r.output].copies;
      if (producer.state == NodeState::kDone &&
          std::find(copies.begin(), copies.end(), p.device) != copies.end()) {
        continue;
      }
      auto t = gmg.IssueTransfer(producer.id, r.output, p.device, p.node, transfer_priority, now);
      if (t.ok()) {
        issued.push_back(*t);
      } else if (t.status().code() != absl::StatusCode::kAlreadyExists) {
        return t.status();
      }
    }
  }
  return issued;
}

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
  std::vector<NodePlacement> placements;
  for (int op : tpl.topo_order()) {
    if (inst->nodes[op].state != NodeState::kUnscheduled) continue;
    placements.push_back({inst->nodes[op].id, slots[partition.slot_of_op[op]]});
  }
  return IssuePlacements(gmg, placements, transfer_priority, now);
}

std::optional<std::vector<DeviceId>> ForcedSlots(const GlobalMappingGraph& gmg, const Instance& instance,
                                                 const CandidatePartition& partition) {
  std::vector<DeviceId> forced(partition.num_slots);
  const GraphTemplate& tpl = *instance.tpl;
  for (int op = 0; op < tpl.num_ops(); ++op) {
    const int ck = tpl.op(op).checkpoint_update_of;
    if (ck < 0) continue;
    const Checkpoint* c = gmg.FindCheckpoint(instance.attached[ck]);
    if (c == nullptr) return std::nullopt;
    DeviceId& slot = forced[partition.slot_of_op[op]];
    if (slot.valid() && slot != c->device) return std::nullopt;
    slot = c->device;
  }
  return forced;
}

}  // namespace slicesched
