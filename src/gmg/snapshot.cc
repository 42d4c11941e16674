#include "slicesched/gmg/snapshot.h"

#include <algorithm>

namespace slicesched {
namespace {

constexpr uint32_t kNone = GmgSnapshot::kNone;

template <typename T>
size_t VecBytes(const std::vector<T>& v) {
  return v.capacity() * sizeof(T);
}

// The index of checkpoint `id` among the snapshot's checkpoints (in id
// order), or kNone.
uint32_t CheckpointIndex(const GmgSnapshot& s, CheckpointId id) {
  auto it = std::lower_bound(s.checkpoints.begin(), s.checkpoints.end(), id.value(),
                             [](const GmgSnapshot::Checkpoint& c, uint64_t v) { return c.id < v; });
  return it != s.checkpoints.end() && it->id == id.value() ? static_cast<uint32_t>(it - s.checkpoints.begin())
                                                           : kNone;
}

// The fields every snapshot node takes from its GMG node and its instance.
void FillCommon(GmgSnapshot::Node& out, const Instance& inst, uint32_t inst_idx, const OpNode& n) {
  out.id = n.id.value();
  out.instance = inst_idx;
  out.op_index = n.op_index;
  out.kind = static_cast<uint8_t>(n.kind);
  out.state = static_cast<uint8_t>(n.state);
  out.device = n.device.valid() ? n.device.value() : 0xffff;
  out.dst_device = n.dst_device.valid() ? n.dst_device.value() : 0xffff;
  out.priority = inst.spec.priority;
  out.priority_class = static_cast<uint8_t>(inst.spec.priority_class);
  out.issue_ns = n.times.issue.nanos();
  out.ready_ns = n.times.ready.nanos();
  out.start_ns = n.times.start.nanos();
  out.predicted_end_ns = n.times.predicted_end.nanos();
  out.workspace_bytes = n.workspace.count();
  out.transfer_bytes = 0;
  out.consumer = kNone;
}

// Successors: CSR from the predecessor lists (counting sort keeps order).
// succ_offsets holds per-node counts; turn it into exclusive prefix sums,
// fill, then shift back.
void FillSuccessors(GmgSnapshot& s) {
  const size_t total = s.nodes.size();
  uint32_t running = 0;
  for (size_t n = 0; n <= total; ++n) {
    const uint32_t c = s.succ_offsets[n];
    s.succ_offsets[n] = running;
    running += c;
  }
  s.succs.resize(s.preds.size());
  for (size_t n = 0; n < total; ++n) {
    for (uint32_t k = s.pred_offsets[n]; k < s.pred_offsets[n + 1]; ++k) {
      s.succs[s.succ_offsets[s.preds[k]]++] = static_cast<uint32_t>(n);
    }
  }
  for (size_t n = total; n > 0; --n) s.succ_offsets[n] = s.succ_offsets[n - 1];
  s.succ_offsets[0] = 0;
}

}  // namespace

size_t GmgSnapshot::ByteSize() const {
  return VecBytes(devices) + VecBytes(instances) + VecBytes(nodes) + VecBytes(pred_offsets) +
         VecBytes(preds) + VecBytes(succ_offsets) + VecBytes(succs) + VecBytes(input_offsets) +
         VecBytes(inputs) + VecBytes(tensor_offsets) + VecBytes(tensors) + VecBytes(copies) +
         VecBytes(ckpt_offsets) + VecBytes(ckpt_inputs) + VecBytes(checkpoints) +
         VecBytes(attr_offsets) + VecBytes(attrs);
}

void GmgSnapshot::Clear() {
  device_types.clear();
  devices.clear();
  instances.clear();
  nodes.clear();
  num_compute_nodes = 0;
  pred_offsets.clear();
  preds.clear();
  succ_offsets.clear();
  succs.clear();
  input_offsets.clear();
  inputs.clear();
  tensor_offsets.clear();
  tensors.clear();
  copies.clear();
  ckpt_offsets.clear();
  ckpt_inputs.clear();
  checkpoints.clear();
  attr_offsets.clear();
  attrs.clear();
}

GmgSnapshot GlobalMappingGraph::Snapshot(Timestamp now) const {
  GmgSnapshot s;
  SnapshotInto(now, &s);
  return s;
}

void GlobalMappingGraph::SnapshotInto(Timestamp now, GmgSnapshot* out) const {
  GmgSnapshot& s = *out;
  s.Clear();
  s.taken_at = now;
  SnapshotCheckpoints(s);
  SnapshotInstances(s);
  ReserveSnapshot(s);
  SnapshotComputeNodes(s);
  SnapshotInputs(s);
  SnapshotTransfers(s);
  FillSuccessors(s);
  SnapshotDevices(s);
}

// Checkpoints first, in id order, so nodes find theirs by binary search.
void GlobalMappingGraph::SnapshotCheckpoints(GmgSnapshot& s) const {
  s.checkpoints.reserve(checkpoints_.size());
  for (const auto& [cid, id] : checkpoint_ids_) {
    const Checkpoint& c = checkpoints_.at(cid);
    s.checkpoints.push_back({cid, c.device.value(), c.bytes.count(), kNone});
  }
}

// Dense node numbering: compute nodes by instance, then transfers.
void GlobalMappingGraph::SnapshotInstances(GmgSnapshot& s) const {
  size_t compute = 0;
  for (const auto& [iid, inst] : instances_) compute += inst->nodes.size();
  s.num_compute_nodes = static_cast<uint32_t>(compute);
  s.nodes.resize(num_nodes_);
  s.instances.reserve(instances_.size());
  uint32_t next_compute = 0;
  for (const auto& [iid, inst] : instances_) {
    s.instances.push_back({iid, inst->tpl->id().value(), next_compute,
                           static_cast<uint32_t>(inst->nodes.size()),
                           static_cast<uint8_t>(inst->spec.priority_class), inst->spec.priority,
                           inst->spec.arrival.nanos(), inst->spec.deadline.nanos()});
    next_compute += static_cast<uint32_t>(inst->nodes.size());
  }
}

// Reserve everything up front: the snapshot is rebuilt every scheduling
// round and reallocation would dominate.
void GlobalMappingGraph::ReserveSnapshot(GmgSnapshot& s) const {
  const size_t total = num_nodes_;
  size_t preds = 0, tensors = 0, inputs = 0, attrs = 0;
  for (const auto& [iid, inst] : instances_) {
    for (const OpSpec& op : inst->tpl->ops()) {
      preds += op.preds.size();
      tensors += op.outputs.size();
      inputs += op.inputs.size();
      attrs += op.attrs.size();
    }
    preds += inst->transfers.size();
    inputs += inst->transfers.size();
  }
  s.preds.reserve(preds);
  s.succs.reserve(preds);
  s.tensors.reserve(tensors);
  s.copies.reserve(tensors * 2);
  s.inputs.reserve(inputs);
  s.ckpt_inputs.reserve(inputs);
  s.attrs.reserve(attrs);
  s.pred_offsets.reserve(total + 1);
  s.input_offsets.reserve(total + 1);
  s.tensor_offsets.reserve(total + 1);
  s.ckpt_offsets.reserve(total + 1);
  s.attr_offsets.reserve(total + 1);
  s.succ_offsets.assign(total + 1, 0);  // counts first (FillSuccessors makes them offsets)
}

// Compute nodes: their predecessors, outputs and copies, and attributes.
void GlobalMappingGraph::SnapshotComputeNodes(GmgSnapshot& s) const {
  std::vector<uint32_t>& succ_count = s.succ_offsets;
  uint32_t inst_idx = 0;
  for (const auto& [iid, inst] : instances_) {
    const GraphTemplate& tpl = *inst->tpl;
    const uint32_t base = s.instances[inst_idx].first_node;
    for (const OpNode& n : inst->nodes) {
      const uint32_t idx = base + static_cast<uint32_t>(n.op_index);
      FillCommon(s.nodes[idx], *inst, inst_idx, n);
      const OpSpec& op = tpl.op(n.op_index);
      s.pred_offsets.push_back(static_cast<uint32_t>(s.preds.size()));
      for (int p : op.preds) {
        s.preds.push_back(base + static_cast<uint32_t>(p));
        succ_count[base + p]++;
      }
      s.tensor_offsets.push_back(static_cast<uint32_t>(s.tensors.size()));
      for (const TensorState& t : n.outputs) {
        const uint32_t tidx = static_cast<uint32_t>(s.tensors.size());
        int32_t upd = -1;
        if (t.update_of >= 0) upd = static_cast<int32_t>(CheckpointIndex(s, inst->attached[t.update_of]));
        s.tensors.push_back({idx, t.bytes.count(), t.pending_consumers, t.allocated, t.freed,
                             t.retained, upd});
        for (DeviceId d : t.copies) s.copies.push_back({tidx, d.value()});
      }
      s.attr_offsets.push_back(static_cast<uint32_t>(s.attrs.size()));
      s.attrs.insert(s.attrs.end(), n.attrs.begin(), n.attrs.end());
    }
    ++inst_idx;
  }
}

// The compute nodes' inputs and checkpoint inputs, and the checkpoints they
// are updating: a second pass, since inputs need every tensor offset.
void GlobalMappingGraph::SnapshotInputs(GmgSnapshot& s) const {
  uint32_t inst_idx = 0;
  for (const auto& [iid, inst] : instances_) {
    const GraphTemplate& tpl = *inst->tpl;
    const uint32_t base = s.instances[inst_idx].first_node;
    for (const OpNode& n : inst->nodes) {
      const uint32_t idx = base + static_cast<uint32_t>(n.op_index);
      s.input_offsets.push_back(static_cast<uint32_t>(s.inputs.size()));
      s.ckpt_offsets.push_back(static_cast<uint32_t>(s.ckpt_inputs.size()));
      for (const InputRef& r : tpl.op(n.op_index).inputs) {
        if (r.kind == InputRef::Kind::kOp) {
          s.inputs.push_back(s.tensor_offsets[base + r.index] + static_cast<uint32_t>(r.output));
        } else if (r.kind == InputRef::Kind::kCheckpoint) {
          const uint32_t c = CheckpointIndex(s, inst->attached[r.index]);
          if (c != kNone) s.ckpt_inputs.push_back(c);
        }
      }
      if (n.op_index >= 0) {
        const int ck = tpl.op(n.op_index).checkpoint_update_of;
        if (ck >= 0 && IsScheduled(n.state) && n.state != NodeState::kDone) {
          const uint32_t c = CheckpointIndex(s, inst->attached[ck]);
          if (c != kNone) s.checkpoints[c].updating = idx;
        }
      }
    }
    ++inst_idx;
  }
}

// Transfers, numbered after the compute nodes in instance order; then the
// end of every offset array.
void GlobalMappingGraph::SnapshotTransfers(GmgSnapshot& s) const {
  std::vector<uint32_t>& succ_count = s.succ_offsets;
  uint32_t inst_idx = 0;
  uint32_t next_transfer = s.num_compute_nodes;
  for (const auto& [iid, inst] : instances_) {
    const uint32_t base = s.instances[inst_idx].first_node;
    for (NodeId tid : inst->transfers) {
      const OpNode& tn = transfers_.at(tid.value());
      const uint32_t idx = next_transfer++;
      GmgSnapshot::Node& out = s.nodes[idx];
      FillCommon(out, *inst, inst_idx, tn);
      out.priority = tn.transfer_priority;
      const uint32_t src = base + static_cast<uint32_t>(OpIndexOfComputeId(tn.src_node));
      out.transfer_bytes = inst->nodes[OpIndexOfComputeId(tn.src_node)].outputs[tn.src_output].bytes.count();
      out.consumer = base + static_cast<uint32_t>(OpIndexOfComputeId(tn.consumer));
      s.pred_offsets.push_back(static_cast<uint32_t>(s.preds.size()));
      s.preds.push_back(src);
      succ_count[src]++;
      s.input_offsets.push_back(static_cast<uint32_t>(s.inputs.size()));
      s.inputs.push_back(s.tensor_offsets[src] + static_cast<uint32_t>(tn.src_output));
      s.tensor_offsets.push_back(static_cast<uint32_t>(s.tensors.size()));
      s.ckpt_offsets.push_back(static_cast<uint32_t>(s.ckpt_inputs.size()));
      s.attr_offsets.push_back(static_cast<uint32_t>(s.attrs.size()));
    }
    ++inst_idx;
  }
  s.pred_offsets.push_back(static_cast<uint32_t>(s.preds.size()));
  s.input_offsets.push_back(static_cast<uint32_t>(s.inputs.size()));
  s.tensor_offsets.push_back(static_cast<uint32_t>(s.tensors.size()));
  s.ckpt_offsets.push_back(static_cast<uint32_t>(s.ckpt_inputs.size()));
  s.attr_offsets.push_back(static_cast<uint32_t>(s.attrs.size()));
}

// Devices; occupancy from the nodes' states.
void GlobalMappingGraph::SnapshotDevices(GmgSnapshot& s) const {
  s.devices.reserve(accel_.size());
  for (const DeviceSpec& d : accel_.devices()) {
    uint16_t type = 0;
    while (type < s.device_types.size() && s.device_types[type] != d.type) ++type;
    if (type == s.device_types.size()) s.device_types.push_back(d.type);
    const DeviceMemory& m = memory_[d.id.value()];
    s.devices.push_back({d.memory.count(), m.weights.count(), m.activations.count(),
                         m.workspace.count(), m.checkpoints.count(), kNone, kNone, type});
  }
  for (uint32_t n = 0; n < s.nodes.size(); ++n) {
    const GmgSnapshot::Node& node = s.nodes[n];
    if (node.state != static_cast<uint8_t>(NodeState::kRunning)) continue;
    if (node.kind == static_cast<uint8_t>(OpKind::kTransfer)) {
      s.devices[node.device].active_transfer = n;
      s.devices[node.dst_device].active_transfer = n;
    } else {
      s.devices[node.device].running = n;
    }
  }
}

}  // namespace slicesched
