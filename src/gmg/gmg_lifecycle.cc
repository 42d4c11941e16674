// A node's life in the GMG: issue, start, finish, failure and cancellation,
// and the retirement of finished instances.
#include <algorithm>
#include <string>

#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "slicesched/gmg/gmg.h"

namespace slicesched {

namespace {

std::string NodeName(const Instance& inst, const OpNode& node) {
  if (node.kind == OpKind::kTransfer) return StrCat(node.id, " (transfer)");
  return StrCat(node.id, " (", inst.tpl->name(), "/", inst.tpl->op(node.op_index).name, ")");
}

}  // namespace

// ---------------------------------------------------------------------------
// Issue

void GlobalMappingGraph::CountOutstanding(const Instance& inst, DeviceId d, int32_t delta) {
  outstanding_[d.value()] += delta;
  total_outstanding_ += delta;
  if (inst.spec.priority_class == PriorityClass::kOffline) outstanding_offline_[d.value()] += delta;
}

absl::Status GlobalMappingGraph::Issue(NodeId id, DeviceId device, Timestamp now) {
  if (IsTransferId(id)) {
    return absl::InvalidArgumentError(StrCat("node ", id, " is a transfer; use IssueTransfer"));
  }
  OpNode* node = MutableNode(id);
  if (node == nullptr) return absl::NotFoundError(StrCat("no live node ", id));
  Instance& inst = *MutableInstance(node->instance);
  if (node->state != NodeState::kUnscheduled) {
    return absl::FailedPreconditionError(StrCat("node ", NodeName(inst, *node), " is ",
                                                      NodeStateName(node->state),
                                                      "; only unscheduled nodes can be issued"));
  }
  if (!device.valid() || device.value() >= accel_.size()) {
    return absl::InvalidArgumentError(StrCat("node ", NodeName(inst, *node), ": no device ", device));
  }
  if (node->unscheduled_preds > 0) {
    return absl::FailedPreconditionError(StrCat(
        "node ", NodeName(inst, *node), " has ", node->unscheduled_preds,
        " unscheduled predecessor(s); issue in dependency order"));
  }
  const OpSpec& op = inst.tpl->op(node->op_index);
  if (!op.weight_key.empty() && !HasWeights(device, op.weight_key)) {
    return absl::FailedPreconditionError(StrCat("node ", NodeName(inst, *node), ": weights '",
                                                      op.weight_key, "' are not resident on ",
                                                      accel_.device(device).name));
  }
  for (const InputRef& r : op.inputs) {
    if (r.kind != InputRef::Kind::kCheckpoint) continue;
    const Checkpoint* c = FindCheckpoint(inst.attached[r.index]);
    if (c == nullptr) {
      return absl::FailedPreconditionError(StrCat("node ", NodeName(inst, *node),
                                                        ": attached checkpoint was released"));
    }
    if (op.checkpoint_update_of == r.index && c->device != device) {
      return absl::InvalidArgumentError(StrCat(
          "node ", NodeName(inst, *node), " grows checkpoint ", c->id, " which lives on ",
          accel_.device(c->device).name, "; it must run there"));
    }
  }

  RemoveFromUnscheduled(inst, *node);
  node->state = NodeState::kIssued;
  CountOutstanding(inst, device, +1);
  node->device = device;
  node->times.issue = now;
  if (inst.state == InstanceState::kPending) inst.state = InstanceState::kRunning;
  for (int p : op.preds) {
    OpNode& pn = inst.nodes[p];
    if (--pn.unscheduled_succs == 0) scheduled_frontier_.erase(pn.id);
  }
  if (node->unscheduled_succs > 0) scheduled_frontier_.insert(node->id);
  for (int s : op.succs) {
    OpNode& sn = inst.nodes[s];
    if (--sn.unscheduled_preds == 0 && sn.state == NodeState::kUnscheduled) AddToUnscheduled(inst, sn);
  }
  if (ComputeReady(inst, *node)) node->times.ready = now;
  return absl::OkStatus();
}

absl::StatusOr<NodeId> GlobalMappingGraph::IssueTransfer(NodeId producer, int output, DeviceId dst,
                                                         NodeId consumer, int32_t priority,
                                                         Timestamp now) {
  if (IsTransferId(producer) || IsTransferId(consumer)) {
    return absl::InvalidArgumentError("transfers connect compute nodes");
  }
  OpNode* p = MutableNode(producer);
  OpNode* c = MutableNode(consumer);
  if (p == nullptr) return absl::NotFoundError(StrCat("no live producer node ", producer));
  if (c == nullptr) return absl::NotFoundError(StrCat("no live consumer node ", consumer));
  if (p->instance != c->instance) {
    return absl::InvalidArgumentError("producer and consumer belong to different instances");
  }
  Instance& inst = *MutableInstance(p->instance);
  if (output < 0 || output >= static_cast<int>(p->outputs.size())) {
    return absl::InvalidArgumentError(StrCat("node ", NodeName(inst, *p), " has no output ", output));
  }
  if (!IsScheduled(p->state) || !IsScheduled(c->state) || c->state == NodeState::kDone) {
    return absl::FailedPreconditionError(StrCat(
        "transfer needs a scheduled producer and an unfinished scheduled consumer (producer ",
        NodeStateName(p->state), ", consumer ", NodeStateName(c->state), ")"));
  }
  if (c->device != dst) {
    return absl::InvalidArgumentError(StrCat("consumer ", NodeName(inst, *c), " runs on ",
                                                   accel_.device(c->device).name, ", not on ",
                                                   dst.valid() && dst.value() < accel_.size()
                                                       ? accel_.device(dst).name : "?"));
  }
  if (p->device == dst) {
    return absl::InvalidArgumentError("producer and consumer share a device; no transfer needed");
  }
  const OpSpec& cop = inst.tpl->op(c->op_index);
  bool reads = std::any_of(cop.inputs.begin(), cop.inputs.end(), [&](const InputRef& r) {
    return r.kind == InputRef::Kind::kOp && r.index == p->op_index && r.output == output;
  });
  if (!reads) {
    return absl::InvalidArgumentError(StrCat(NodeName(inst, *c), " does not read output ",
                                                   output, " of ", NodeName(inst, *p)));
  }
  TensorState& t = p->outputs[output];
  if (std::find(t.copies.begin(), t.copies.end(), dst) != t.copies.end()) {
    return absl::AlreadyExistsError("the tensor already has a copy on the destination");
  }
  for (NodeId tid : inst.transfers) {
    const OpNode& tn = transfers_.at(tid.value());
    if (tn.src_node == producer && tn.src_output == output && tn.dst_device == dst &&
        !IsTerminal(tn.state)) {
      return absl::AlreadyExistsError(StrCat("transfer ", tid, " already moves this tensor there"));
    }
  }
  OpNode n;
  n.id = NodeId(kTransferIdBit | next_transfer_++);
  n.instance = inst.id;
  n.kind = OpKind::kTransfer;
  n.state = NodeState::kIssued;
  n.device = p->device;
  n.dst_device = dst;
  n.src_node = producer;
  n.src_output = output;
  n.consumer = consumer;
  n.transfer_priority = priority;
  n.times.issue = now;
  t.pending_consumers += 1;
  inst.transfers.push_back(n.id);
  ++num_nodes_;
  auto [it, inserted] = transfers_.emplace(n.id.value(), std::move(n));
  if (TransferReady(it->second)) it->second.times.ready = now;
  return it->second.id;
}

// ---------------------------------------------------------------------------
// Start

absl::Status GlobalMappingGraph::Start(NodeId id, Timestamp now) {
  OpNode* node = MutableNode(id);
  if (node == nullptr) return absl::NotFoundError(StrCat("no live node ", id));
  Instance& inst = *MutableInstance(node->instance);
  if (node->state != NodeState::kIssued) {
    return absl::FailedPreconditionError(StrCat("node ", NodeName(inst, *node), " is ",
                                                      NodeStateName(node->state),
                                                      "; only issued nodes can start"));
  }
  if (node->kind == OpKind::kTransfer) return StartTransfer(*node, now);
  return StartCompute(inst, *node, now);
}

absl::Status GlobalMappingGraph::StartCompute(Instance& inst, OpNode& node, Timestamp now) {
  const DeviceId d = node.device;
  if (running_compute_[d.value()].valid()) {
    return absl::FailedPreconditionError(StrCat(
        "node ", NodeName(inst, node), ": device ", accel_.device(d).name,
        " is already running node ", running_compute_[d.value()]));
  }
  if (!ComputeReady(inst, node)) {
    return absl::FailedPreconditionError(StrCat(
        "node ", NodeName(inst, node), " is not ready on ", accel_.device(d).name,
        " (a predecessor is not done or an input is not on this device)"));
  }
  for (TensorState& t : node.outputs) {
    if (t.update_of >= 0) {
      Checkpoint& c = checkpoints_[inst.attached[t.update_of].value()];
      c.bytes += t.bytes;
      Charge(d, &DeviceMemory::checkpoints, t.bytes);
    } else {
      Charge(d, &DeviceMemory::activations, t.bytes);
      t.copies.assign(1, d);
    }
    t.allocated = true;
  }
  Charge(d, &DeviceMemory::workspace, node.workspace);
  if (node.times.ready.is_never()) node.times.ready = now;
  node.times.start = now;
  node.state = NodeState::kRunning;
  running_compute_[d.value()] = node.id;
  return absl::OkStatus();
}

absl::Status GlobalMappingGraph::StartTransfer(OpNode& node, Timestamp now) {
  const DeviceId s = node.device, d = node.dst_device;
  for (DeviceId end : {s, d}) {
    if (active_transfer_[end.value()].valid()) {
      return absl::FailedPreconditionError(StrCat(
          "transfer ", node.id, ": device ", accel_.device(end).name,
          " is already in transfer ", active_transfer_[end.value()]));
    }
  }
  if (!TransferReady(node)) {
    return absl::FailedPreconditionError(
        StrCat("transfer ", node.id, " is not ready: its tensor is not yet on the source"));
  }
  const OpNode& p = *FindNode(node.src_node);
  Charge(d, &DeviceMemory::activations, p.outputs[node.src_output].bytes);
  if (node.times.ready.is_never()) node.times.ready = now;
  node.times.start = now;
  node.state = NodeState::kRunning;
  active_transfer_[s.value()] = node.id;
  active_transfer_[d.value()] = node.id;
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Finish

void GlobalMappingGraph::FreeTensor(OpNode& producer, TensorState& t) {
  if (t.freed || !t.allocated) return;
  if (t.update_of < 0 && !(t.retained && producer.state == NodeState::kDone)) {
    for (DeviceId d : t.copies) Charge(d, &DeviceMemory::activations, Bytes(0) - t.bytes);
  }
  t.copies.clear();
  t.freed = true;
}

void GlobalMappingGraph::ConsumeTensor(NodeId producer, int output) {
  OpNode* p = MutableNode(producer);
  if (p == nullptr) return;
  TensorState& t = p->outputs[output];
  if (--t.pending_consumers == 0 && p->state == NodeState::kDone) FreeTensor(*p, t);
}

absl::Status GlobalMappingGraph::Finish(NodeId id, Timestamp now) {
  OpNode* node = MutableNode(id);
  if (node == nullptr) return absl::NotFoundError(StrCat("no live node ", id));
  Instance& inst = *MutableInstance(node->instance);
  if (node->state != NodeState::kRunning) {
    return absl::FailedPreconditionError(StrCat("node ", NodeName(inst, *node), " is ",
                                                      NodeStateName(node->state),
                                                      "; only running nodes can finish"));
  }
  if (node->kind == OpKind::kTransfer) return FinishTransfer(*node, now);
  return FinishCompute(inst, *node, now);
}

absl::Status GlobalMappingGraph::FinishCompute(Instance& inst, OpNode& node, Timestamp now) {
  const DeviceId d = node.device;
  const OpSpec& op = inst.tpl->op(node.op_index);
  Charge(d, &DeviceMemory::workspace, Bytes(0) - node.workspace);
  node.state = NodeState::kDone;
  node.times.end = now;
  running_compute_[d.value()] = NodeId();
  CountOutstanding(inst, d, -1);
  for (size_t o = 0; o < node.outputs.size(); ++o) {
    TensorState& t = node.outputs[o];
    if (t.update_of >= 0) {
      Checkpoint& grown = checkpoints_[inst.attached[t.update_of].value()];
      grown.updating = NodeId();
      if (grown.priority_class == PriorityClass::kOnline) online_kv_touched_[grown.device.value()] = now;
      t.freed = true;  // the growth now belongs to the checkpoint
    } else if (t.retained) {
      Charge(d, &DeviceMemory::activations, Bytes(0) - t.bytes);
      Charge(d, &DeviceMemory::checkpoints, t.bytes);
      Checkpoint c;
      c.id = CheckpointId(next_checkpoint_++);
      c.device = d;
      c.bytes = t.bytes;
      c.dtype = op.outputs[o].dtype;
      c.created_by = inst.id;
      c.priority_class = inst.spec.priority_class;
      if (c.priority_class == PriorityClass::kOnline) {
        ++online_checkpoints_[d.value()];
        online_kv_touched_[d.value()] = now;
      }
      c.name = StrCat(inst.tpl->name(), "/", op.name, ":", op.outputs[o].name);
      inst.produced.push_back(c.id);
      checkpoint_ids_.emplace(c.id.value(), c.id);
      checkpoints_.emplace(c.id.value(), std::move(c));
      t.copies.clear();
      t.freed = true;
    } else if (t.pending_consumers == 0) {
      FreeTensor(node, t);
    }
  }
  for (const InputRef& r : op.inputs) {
    if (r.kind == InputRef::Kind::kOp) ConsumeTensor(inst.nodes[r.index].id, r.output);
  }
  for (int s : op.succs) {
    OpNode& sn = inst.nodes[s];
    if (sn.state == NodeState::kIssued && sn.times.ready.is_never() && ComputeReady(inst, sn)) {
      sn.times.ready = now;
    }
  }
  for (NodeId tid : inst.transfers) {
    OpNode& tn = transfers_.at(tid.value());
    if (tn.src_node == node.id && tn.state == NodeState::kIssued && TransferReady(tn)) tn.times.ready = now;
  }
  if (--inst.unfinished == 0) {
    inst.state = InstanceState::kDone;
    inst.finished = now;
    MaybeRetire(inst);
  }
  return absl::OkStatus();
}

absl::Status GlobalMappingGraph::FinishTransfer(OpNode& node, Timestamp now) {
  node.state = NodeState::kDone;
  node.times.end = now;
  active_transfer_[node.device.value()] = NodeId();
  active_transfer_[node.dst_device.value()] = NodeId();
  OpNode& p = *MutableNode(node.src_node);
  TensorState& t = p.outputs[node.src_output];
  t.copies.push_back(node.dst_device);
  ConsumeTensor(node.src_node, node.src_output);
  Instance& inst = *MutableInstance(node.instance);
  OpNode* c = MutableNode(node.consumer);
  if (c != nullptr && c->state == NodeState::kIssued && c->times.ready.is_never() &&
      ComputeReady(inst, *c)) {
    c->times.ready = now;
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Failure and cancellation

void GlobalMappingGraph::ReleaseNodeHoldings(Instance& inst, OpNode& node) {
  if (node.state != NodeState::kRunning) return;
  if (node.kind == OpKind::kTransfer) {
    const OpNode* p = FindNode(node.src_node);
    Charge(node.dst_device, &DeviceMemory::activations, Bytes(0) - p->outputs[node.src_output].bytes);
    active_transfer_[node.device.value()] = NodeId();
    active_transfer_[node.dst_device.value()] = NodeId();
    return;
  }
  const DeviceId d = node.device;
  Charge(d, &DeviceMemory::workspace, Bytes(0) - node.workspace);
  for (TensorState& t : node.outputs) {
    if (t.update_of >= 0 && t.allocated && !t.freed) {
      Checkpoint* c = &checkpoints_[inst.attached[t.update_of].value()];
      c->bytes -= t.bytes;
      Charge(d, &DeviceMemory::checkpoints, Bytes(0) - t.bytes);
      t.freed = true;
    }
  }
  running_compute_[d.value()] = NodeId();
}

void GlobalMappingGraph::FailInstance(Instance& inst, absl::string_view reason, Timestamp now,
                                      NodeState terminal_for_others) {
  for (NodeId tid : inst.transfers) {
    OpNode& tn = transfers_.at(tid.value());
    if (IsTerminal(tn.state)) continue;
    ReleaseNodeHoldings(inst, tn);
    tn.state = terminal_for_others;
    tn.times.end = now;
  }
  for (OpNode& n : inst.nodes) {
    if (n.state == NodeState::kUnscheduled && n.unscheduled_preds == 0) RemoveFromUnscheduled(inst, n);
    scheduled_frontier_.erase(n.id);
    if (IsTerminal(n.state)) continue;
    ReleaseNodeHoldings(inst, n);
    if (IsScheduled(n.state)) CountOutstanding(inst, n.device, -1);
    n.state = terminal_for_others;
    n.times.end = now;
    if (n.failure.empty()) n.failure = std::string(reason);
  }
  for (OpNode& n : inst.nodes) {
    for (TensorState& t : n.outputs) {
      if (t.update_of >= 0) continue;
      if (t.retained) {
        if (n.state == NodeState::kDone) continue;  // already a checkpoint
        // A retained output of a node that never finished: free as activation.
        if (t.allocated && !t.freed) {
          for (DeviceId d : t.copies) Charge(d, &DeviceMemory::activations, Bytes(0) - t.bytes);
          t.copies.clear();
          t.freed = true;
        }
        continue;
      }
      if (t.allocated && !t.freed) {
        for (DeviceId d : t.copies) Charge(d, &DeviceMemory::activations, Bytes(0) - t.bytes);
        t.copies.clear();
        t.freed = true;
      }
    }
    const int ck = inst.tpl->op(n.op_index).checkpoint_update_of;
    if (ck >= 0) {
      auto it = checkpoints_.find(inst.attached[ck].value());
      if (it != checkpoints_.end() && it->second.updating == n.id) it->second.updating = NodeId();
    }
  }
  // Checkpoints this instance produced go with it: nobody can attach to them.
  for (CheckpointId c : inst.produced) (void)ReleaseCheckpoint(c);
  inst.produced.clear();
  inst.unfinished = 0;
  inst.state = terminal_for_others == NodeState::kCancelled && inst.failure.empty()
                   ? InstanceState::kCancelled
                   : InstanceState::kFailed;
  if (inst.failure.empty()) inst.failure = std::string(reason);
  inst.finished = now;
  MaybeRetire(inst);
}

absl::Status GlobalMappingGraph::Fail(NodeId id, absl::string_view reason, Timestamp now) {
  OpNode* node = MutableNode(id);
  if (node == nullptr) return absl::NotFoundError(StrCat("no live node ", id));
  Instance& inst = *MutableInstance(node->instance);
  if (node->state != NodeState::kIssued && node->state != NodeState::kRunning) {
    return absl::FailedPreconditionError(StrCat("node ", NodeName(inst, *node), " is ",
                                                      NodeStateName(node->state),
                                                      "; only issued or running nodes can fail"));
  }
  ReleaseNodeHoldings(inst, *node);
  if (node->kind != OpKind::kTransfer) CountOutstanding(inst, node->device, -1);
  node->state = NodeState::kFailed;
  node->times.end = now;
  node->failure = std::string(reason);
  inst.failure = StrCat("node ", NodeName(inst, *node), " failed: ", reason);
  FailInstance(inst, inst.failure, now, NodeState::kCancelled);
  return absl::OkStatus();
}

absl::Status GlobalMappingGraph::CancelInstance(InstanceId id, absl::string_view reason, Timestamp now) {
  Instance* inst = MutableInstance(id);
  if (inst == nullptr) return absl::NotFoundError(StrCat("no live instance ", id));
  FailInstance(*inst, reason, now, NodeState::kCancelled);
  return absl::OkStatus();
}

absl::Status GlobalMappingGraph::SetPrediction(NodeId id, Timestamp start, Timestamp end) {
  OpNode* node = MutableNode(id);
  if (node == nullptr) return absl::NotFoundError(StrCat("no live node ", id));
  if (end < start) return absl::InvalidArgumentError("predicted end precedes predicted start");
  node->times.predicted_start = start;
  node->times.predicted_end = end;
  return absl::OkStatus();
}

void GlobalMappingGraph::MaybeRetire(Instance& inst) {
  if (inst.state != InstanceState::kDone && inst.state != InstanceState::kFailed &&
      inst.state != InstanceState::kCancelled) {
    return;
  }
  RetiredInstance r;
  r.id = inst.id;
  r.template_id = inst.tpl->id();
  r.label = inst.spec.label;
  r.state = inst.state;
  r.priority_class = inst.spec.priority_class;
  r.arrival = inst.spec.arrival;
  r.deadline = inst.spec.deadline;
  r.finished = inst.finished;
  r.produced = inst.produced;
  r.failure = inst.failure;
  retired_.push_back(std::move(r));
  for (const OpNode& n : inst.nodes) scheduled_frontier_.erase(n.id);
  for (NodeId tid : inst.transfers) transfers_.erase(tid.value());
  num_nodes_ -= inst.nodes.size() + inst.transfers.size();
  instances_.erase(inst.id.value());
}

std::vector<RetiredInstance> GlobalMappingGraph::TakeRetired() {
  std::vector<RetiredInstance> out;
  out.swap(retired_);
  return out;
}

}  // namespace slicesched
