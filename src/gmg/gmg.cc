// The Global Mapping Graph's structure: construction, lookup, frontiers,
// instantiation, readiness, weights and checkpoints, and the queries and
// invariant checks. A node's life from issue to retirement is in
// gmg_lifecycle.cc; snapshots are in snapshot.cc.
#include "slicesched/gmg/gmg.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "slicesched/gmg/snapshot.h"

namespace slicesched {

absl::string_view NodeStateName(NodeState s) {
  switch (s) {
    case NodeState::kUnscheduled: return "unscheduled";
    case NodeState::kIssued: return "issued";
    case NodeState::kRunning: return "running";
    case NodeState::kDone: return "done";
    case NodeState::kFailed: return "failed";
    case NodeState::kCancelled: return "cancelled";
  }
  return "?";
}

absl::string_view PriorityClassName(PriorityClass c) {
  return c == PriorityClass::kOnline ? "online" : "offline";
}

absl::string_view InstanceStateName(InstanceState s) {
  switch (s) {
    case InstanceState::kPending: return "pending";
    case InstanceState::kRunning: return "running";
    case InstanceState::kDone: return "done";
    case InstanceState::kFailed: return "failed";
    case InstanceState::kCancelled: return "cancelled";
  }
  return "?";
}

GlobalMappingGraph::GlobalMappingGraph(AcceleratorSet accelerators)
    : accel_(std::move(accelerators)),
      weights_(accel_.size()),
      memory_(accel_.size()),
      running_compute_(accel_.size()),
      active_transfer_(accel_.size()),
      outstanding_(accel_.size(), 0),
      outstanding_offline_(accel_.size(), 0),
      online_checkpoints_(accel_.size(), 0),
      online_kv_touched_(accel_.size(), Timestamp::Epoch()) {}

GlobalMappingGraph GlobalMappingGraph::Clone() const {
  GlobalMappingGraph c(accel_);
  c.templates_ = templates_;
  c.next_instance_ = next_instance_;
  c.next_transfer_ = next_transfer_;
  c.next_checkpoint_ = next_checkpoint_;
  c.num_nodes_ = num_nodes_;
  for (const auto& [id, inst] : instances_) c.instances_.emplace(id, std::make_unique<Instance>(*inst));
  c.transfers_ = transfers_;
  c.checkpoint_ids_ = checkpoint_ids_;
  c.checkpoints_ = checkpoints_;
  c.weights_ = weights_;
  c.memory_ = memory_;
  c.running_compute_ = running_compute_;
  c.outstanding_ = outstanding_;
  c.outstanding_offline_ = outstanding_offline_;
  c.online_checkpoints_ = online_checkpoints_;
  c.online_kv_touched_ = online_kv_touched_;
  c.total_outstanding_ = total_outstanding_;
  c.active_transfer_ = active_transfer_;
  c.unscheduled_ = unscheduled_;
  c.scheduled_frontier_ = scheduled_frontier_;
  c.retired_ = retired_;
  return c;
}

absl::StatusOr<TemplateId> GlobalMappingGraph::RegisterTemplate(
    std::shared_ptr<const GraphTemplate> tpl) {
  return templates_.Register(std::move(tpl));
}

// ---------------------------------------------------------------------------
// Lookup

OpNode* GlobalMappingGraph::MutableNode(NodeId id) {
  if (IsTransferId(id)) {
    auto it = transfers_.find(id.value());
    return it == transfers_.end() ? nullptr : &it->second;
  }
  auto it = instances_.find(InstanceOfComputeId(id).value());
  if (it == instances_.end()) return nullptr;
  const int op = OpIndexOfComputeId(id);
  if (op >= static_cast<int>(it->second->nodes.size())) return nullptr;
  return &it->second->nodes[op];
}

const OpNode* GlobalMappingGraph::FindNode(NodeId id) const {
  return const_cast<GlobalMappingGraph*>(this)->MutableNode(id);
}

Instance* GlobalMappingGraph::MutableInstance(InstanceId id) {
  auto it = instances_.find(id.value());
  return it == instances_.end() ? nullptr : it->second.get();
}

const Instance* GlobalMappingGraph::FindInstance(InstanceId id) const {
  return const_cast<GlobalMappingGraph*>(this)->MutableInstance(id);
}

absl::StatusOr<NodeId> GlobalMappingGraph::NodeOf(InstanceId instance,
                                                  absl::string_view op_name) const {
  const Instance* inst = FindInstance(instance);
  if (inst == nullptr) return absl::NotFoundError(StrCat("no live instance ", instance));
  SLICESCHED_ASSIGN_OR_RETURN(int op, inst->tpl->FindOp(op_name));
  return inst->nodes[op].id;
}

const Checkpoint* GlobalMappingGraph::FindCheckpoint(CheckpointId id) const {
  auto it = checkpoints_.find(id.value());
  return it == checkpoints_.end() ? nullptr : &it->second;
}

void GlobalMappingGraph::Charge(DeviceId d, Bytes DeviceMemory::*field, Bytes delta) {
  memory_[d.value()].*field += delta;
}

// ---------------------------------------------------------------------------
// Frontiers

FrontierKey GlobalMappingGraph::KeyOf(const Instance& inst, const OpNode& node) const {
  return FrontierKey{inst.spec.priority_class, -inst.spec.priority, inst.spec.arrival, node.id};
}

void GlobalMappingGraph::AddToUnscheduled(const Instance& inst, const OpNode& node) {
  unscheduled_.insert(KeyOf(inst, node));
}

void GlobalMappingGraph::RemoveFromUnscheduled(const Instance& inst, const OpNode& node) {
  unscheduled_.erase(KeyOf(inst, node));
}

// ---------------------------------------------------------------------------
// Instantiation

namespace {

// Instantiate's errors name the template.
absl::Status InstanceError(const GraphTemplate& tpl, absl::StatusCode code, std::string msg) {
  return absl::Status(code, StrCat("instance of '", tpl.name(), "': ", msg));
}

// The spec's bindings on top of the template's defines: each symbol bound
// exactly once, none fixed by the template, none left unbound.
absl::Status BindSymbols(Instance& inst) {
  const GraphTemplate& tpl = *inst.tpl;
  inst.symbols = tpl.defines();
  for (const auto& [name, value] : inst.spec.bindings) {
    auto sym = tpl.symbols().Find(name);
    if (!sym.has_value()) {
      return InstanceError(tpl, absl::StatusCode::kInvalidArgument, StrCat("unknown symbol '", name, "'"));
    }
    if (tpl.defines().IsBound(*sym)) {
      return InstanceError(tpl, absl::StatusCode::kInvalidArgument,
                           StrCat("symbol '", name, "' is fixed by the template"));
    }
    if (inst.symbols.IsBound(*sym)) {
      return InstanceError(tpl, absl::StatusCode::kInvalidArgument, StrCat("symbol '", name, "' bound twice"));
    }
    inst.symbols.Set(*sym, value);
  }
  for (size_t s = 0; s < tpl.symbols().size(); ++s) {
    if (!inst.symbols.IsBound(static_cast<int>(s))) {
      return InstanceError(tpl, absl::StatusCode::kInvalidArgument,
                           StrCat("symbol '", tpl.symbols().name(static_cast<int>(s)), "' is not bound"));
    }
  }
  return absl::OkStatus();
}

// Checkpoints: each checkpoint input attached exactly once, to a resident,
// idle checkpoint of exactly the expected size.
absl::Status AttachCheckpoints(const GlobalMappingGraph& gmg, Instance& inst) {
  const GraphTemplate& tpl = *inst.tpl;
  inst.attached.assign(tpl.checkpoint_inputs().size(), CheckpointId());
  for (const auto& [name, ck_id] : inst.spec.checkpoints) {
    int ck = tpl.FindCheckpointInput(name);
    if (ck < 0) {
      return InstanceError(tpl, absl::StatusCode::kInvalidArgument,
                           StrCat("template has no checkpoint input '@", name, "'"));
    }
    if (inst.attached[ck].valid()) {
      return InstanceError(tpl, absl::StatusCode::kInvalidArgument,
                           StrCat("checkpoint '@", name, "' attached twice"));
    }
    const Checkpoint* c = gmg.FindCheckpoint(ck_id);
    if (c == nullptr) {
      return InstanceError(tpl, absl::StatusCode::kNotFound,
                           StrCat("checkpoint ", ck_id, " for '@", name, "' is not retained"));
    }
    if (c->updating.valid()) {
      return InstanceError(tpl, absl::StatusCode::kFailedPrecondition,
                           StrCat("checkpoint ", ck_id, " is being updated by node ", c->updating));
    }
    const auto& cin = tpl.checkpoint_inputs()[ck];
    auto elems = NumElements(cin.dims, inst.symbols);
    if (!elems.ok()) {
      return Annotate(elems.status(), StrCat("instance of '", tpl.name(), "': checkpoint '@", name, "'"));
    }
    const Bytes expect(*elems * DTypeSize(cin.dtype));
    if (expect != c->bytes) {
      return InstanceError(tpl, absl::StatusCode::kInvalidArgument,
                           StrCat("checkpoint ", ck_id, " for '@", name, "' holds ", c->bytes.count(),
                                  " bytes but the template expects ", expect.count()));
    }
    inst.attached[ck] = ck_id;
  }
  for (size_t ck = 0; ck < inst.attached.size(); ++ck) {
    if (!inst.attached[ck].valid()) {
      return InstanceError(tpl, absl::StatusCode::kInvalidArgument,
                           StrCat("checkpoint input '@", tpl.checkpoint_inputs()[ck].name, "' is not attached"));
    }
  }
  return absl::OkStatus();
}

// Output `o` of op `i` with concrete bytes; a checkpoint update is charged
// its growth only.
absl::Status BuildOutput(const GlobalMappingGraph& gmg, const Instance& inst, int i, size_t o,
                         TensorState& t) {
  const GraphTemplate& tpl = *inst.tpl;
  const OpSpec& op = tpl.op(i);
  const TensorSpec& ts = op.outputs[o];
  auto shape = EvaluateShape(ts.dims, inst.symbols);
  if (!shape.ok()) {
    return Annotate(shape.status(),
                    StrCat("instance of '", tpl.name(), "': op '", op.name, "' output '", ts.name, "'"));
  }
  auto elems = NumElements(ts.dims, inst.symbols);
  if (!elems.ok()) return elems.status();
  int64_t bytes = 0;
  if (__builtin_mul_overflow(*elems, DTypeSize(ts.dtype), &bytes)) {
    return InstanceError(tpl, absl::StatusCode::kOutOfRange,
                         StrCat("op '", op.name, "' output '", ts.name, "' is too large"));
  }
  t.bytes = Bytes(bytes);
  t.pending_consumers = tpl.NumConsumers(i, static_cast<int>(o));
  t.retained = ts.retain;
  if (!ts.updates.empty()) {
    t.update_of = op.checkpoint_update_of;
    const Checkpoint* c = gmg.FindCheckpoint(inst.attached[t.update_of]);
    if (t.bytes < c->bytes) {
      return InstanceError(tpl, absl::StatusCode::kInvalidArgument,
                           StrCat("op '", op.name, "' output '", ts.name, "' would shrink checkpoint ", c->id,
                                  " from ", c->bytes.count(), " to ", t.bytes.count(), " bytes"));
    }
    t.bytes = t.bytes - c->bytes;  // an update is charged its growth only
  }
  return absl::OkStatus();
}

// Node `i` of `inst` (symbols bound, checkpoints attached) with concrete
// bytes, workspace and attributes.
absl::Status BuildNode(const GlobalMappingGraph& gmg, const Instance& inst, int i, OpNode& n) {
  const GraphTemplate& tpl = *inst.tpl;
  const OpSpec& op = tpl.op(i);
  n.id = ComputeNodeId(inst.id, i);
  n.instance = inst.id;
  n.kind = op.kind;
  n.op_index = i;
  n.unscheduled_preds = static_cast<int32_t>(op.preds.size());
  n.unscheduled_succs = static_cast<int32_t>(op.succs.size());
  n.outputs.resize(op.outputs.size());
  for (size_t o = 0; o < op.outputs.size(); ++o) {
    SLICESCHED_RETURN_IF_ERROR(BuildOutput(gmg, inst, i, o, n.outputs[o]));
  }
  auto ws = op.workspace.Evaluate(inst.symbols);
  if (!ws.ok()) {
    return Annotate(ws.status(), StrCat("instance of '", tpl.name(), "': op '", op.name, "' workspace"));
  }
  if (*ws < 0) {
    return InstanceError(tpl, absl::StatusCode::kInvalidArgument,
                         StrCat("op '", op.name, "' workspace evaluated to ", *ws, " bytes"));
  }
  n.workspace = Bytes(*ws);
  for (const auto& [aname, expr] : op.attrs) {
    auto v = expr.Evaluate(inst.symbols);
    if (!v.ok()) {
      return Annotate(v.status(),
                      StrCat("instance of '", tpl.name(), "': op '", op.name, "' attribute '", aname, "'"));
    }
    n.attrs.push_back(*v);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<InstanceId> GlobalMappingGraph::Instantiate(const InstanceSpec& spec) {
  const GraphTemplate* tpl = templates_.Find(spec.template_id);
  if (tpl == nullptr) {
    return absl::NotFoundError(StrCat("no template with id ", spec.template_id));
  }
  if (tpl->num_ops() >= (1 << kOpIndexBits)) {
    return InstanceError(*tpl, absl::StatusCode::kInvalidArgument, "template has too many ops");
  }
  // The frontier orders by -priority (KeyOf), which INT32_MIN has not.
  if (spec.priority == std::numeric_limits<int32_t>::min()) {
    return InstanceError(*tpl, absl::StatusCode::kInvalidArgument,
                         StrCat("priority ", spec.priority, " is out of range (at least ",
                                std::numeric_limits<int32_t>::min() + 1, ")"));
  }

  auto inst = std::make_unique<Instance>();
  inst->id = InstanceId(next_instance_);
  inst->tpl = tpl;
  inst->spec = spec;
  SLICESCHED_RETURN_IF_ERROR(BindSymbols(*inst));
  SLICESCHED_RETURN_IF_ERROR(AttachCheckpoints(*this, *inst));
  inst->nodes.resize(tpl->num_ops());
  for (int i = 0; i < tpl->num_ops(); ++i) {
    SLICESCHED_RETURN_IF_ERROR(BuildNode(*this, *inst, i, inst->nodes[i]));
  }

  // Commit.
  ++next_instance_;
  inst->unfinished = tpl->num_ops();
  for (int i = 0; i < tpl->num_ops(); ++i) {
    const int ck = tpl->op(i).checkpoint_update_of;
    if (ck >= 0) checkpoints_[inst->attached[ck].value()].updating = inst->nodes[i].id;
  }
  Instance& ref = *inst;
  instances_.emplace(ref.id.value(), std::move(inst));
  num_nodes_ += ref.nodes.size();
  for (const OpNode& n : ref.nodes) {
    if (n.unscheduled_preds == 0) AddToUnscheduled(ref, n);
  }
  return ref.id;
}

// ---------------------------------------------------------------------------
// Readiness

bool GlobalMappingGraph::ComputeReady(const Instance& inst, const OpNode& node) const {
  const OpSpec& op = inst.tpl->op(node.op_index);
  for (const InputRef& r : op.inputs) {
    if (r.kind == InputRef::Kind::kOp) {
      const OpNode& p = inst.nodes[r.index];
      if (p.state != NodeState::kDone) return false;
      const auto& copies = p.outputs[r.output].copies;
      if (std::find(copies.begin(), copies.end(), node.device) == copies.end()) return false;
    } else if (r.kind == InputRef::Kind::kCheckpoint) {
      const Checkpoint* c = FindCheckpoint(inst.attached[r.index]);
      if (c == nullptr || c->device != node.device) return false;
      if (c->updating.valid() && c->updating != node.id) return false;
    }
  }
  // Predecessors are exactly the op inputs' producers, checked above.
  return true;
}

bool GlobalMappingGraph::TransferReady(const OpNode& node) const {
  const OpNode* p = FindNode(node.src_node);
  if (p == nullptr || p->state != NodeState::kDone) return false;
  const auto& copies = p->outputs[node.src_output].copies;
  return std::find(copies.begin(), copies.end(), node.device) != copies.end();
}

bool GlobalMappingGraph::IsReady(NodeId id) const {
  const OpNode* n = FindNode(id);
  if (n == nullptr || n->state != NodeState::kIssued) return false;
  if (n->kind == OpKind::kTransfer) return TransferReady(*n);
  return ComputeReady(*FindInstance(n->instance), *n);
}

// ---------------------------------------------------------------------------
// Weights and checkpoints

absl::Status GlobalMappingGraph::LoadWeights(DeviceId device, absl::string_view key, Bytes bytes) {
  if (!device.valid() || device.value() >= accel_.size()) {
    return absl::InvalidArgumentError(StrCat("no device ", device));
  }
  if (key.empty()) return absl::InvalidArgumentError("empty weight key");
  if (bytes < Bytes(0)) return absl::InvalidArgumentError("negative weight bytes");
  auto& w = weights_[device.value()];
  if (w.contains(key)) return absl::OkStatus();  // already resident
  w.emplace(std::string(key), bytes);
  Charge(device, &DeviceMemory::weights, bytes);
  return absl::OkStatus();
}

absl::Status GlobalMappingGraph::UnloadWeights(DeviceId device, absl::string_view key) {
  if (!device.valid() || device.value() >= accel_.size()) {
    return absl::InvalidArgumentError(StrCat("no device ", device));
  }
  auto& w = weights_[device.value()];
  auto it = w.find(key);
  if (it == w.end()) {
    return absl::NotFoundError(StrCat("weights '", key, "' are not resident on ",
                                            accel_.device(device).name));
  }
  // Refuse while a scheduled, unfinished node needs them there.
  for (const auto& [iid, inst] : instances_) {
    for (const OpNode& n : inst->nodes) {
      if ((n.state == NodeState::kIssued || n.state == NodeState::kRunning) && n.device == device &&
          inst->tpl->op(n.op_index).weight_key == key) {
        return absl::FailedPreconditionError(StrCat("weights '", key, "' are in use by node ", n.id));
      }
    }
  }
  Charge(device, &DeviceMemory::weights, Bytes(0) - it->second);
  w.erase(it);
  return absl::OkStatus();
}

bool GlobalMappingGraph::HasWeights(DeviceId device, absl::string_view key) const {
  if (!device.valid() || device.value() >= accel_.size()) return false;
  return weights_[device.value()].contains(key);
}

absl::Status GlobalMappingGraph::ReleaseCheckpoint(CheckpointId id) {
  auto it = checkpoints_.find(id.value());
  if (it == checkpoints_.end()) return absl::NotFoundError(StrCat("checkpoint ", id, " is not retained"));
  if (it->second.updating.valid()) {
    return absl::FailedPreconditionError(
        StrCat("checkpoint ", id, " is reserved for update by node ", it->second.updating));
  }
  // Refuse while a live instance still reads it.
  for (const auto& [iid, inst] : instances_) {
    if (std::find(inst->attached.begin(), inst->attached.end(), id) != inst->attached.end() &&
        inst->state != InstanceState::kDone) {
      return absl::FailedPreconditionError(
          StrCat("checkpoint ", id, " is attached to live instance ", inst->id));
    }
  }
  Charge(it->second.device, &DeviceMemory::checkpoints, Bytes(0) - it->second.bytes);
  if (it->second.priority_class == PriorityClass::kOnline) --online_checkpoints_[it->second.device.value()];
  checkpoint_ids_.erase(id.value());
  checkpoints_.erase(it);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Queries and verification

std::vector<ResidentItem> GlobalMappingGraph::ResidentSet(DeviceId d) const {
  std::vector<ResidentItem> out;
  if (!d.valid() || d.value() >= accel_.size()) return out;
  for (const auto& [key, bytes] : weights_[d.value()]) {
    out.push_back({ResidentItem::Kind::kWeights, key, bytes});
  }
  for (const auto& [iid, inst] : instances_) {
    for (const OpNode& n : inst->nodes) {
      if (n.state == NodeState::kRunning && n.device == d && n.workspace > Bytes(0)) {
        out.push_back({ResidentItem::Kind::kWorkspace, StrCat(n.id), n.workspace});
      }
      for (size_t o = 0; o < n.outputs.size(); ++o) {
        const TensorState& t = n.outputs[o];
        if (!t.allocated || t.freed || t.update_of >= 0) continue;
        if (std::find(t.copies.begin(), t.copies.end(), d) != t.copies.end()) {
          out.push_back({ResidentItem::Kind::kActivation, StrCat(n.id, ":", o), t.bytes});
        }
      }
    }
    for (NodeId tid : inst->transfers) {
      const OpNode& tn = transfers_.at(tid.value());
      if (tn.state == NodeState::kRunning && tn.dst_device == d) {
        const OpNode* p = FindNode(tn.src_node);
        out.push_back({ResidentItem::Kind::kActivation,
                       StrCat(tn.src_node, ":", tn.src_output, " (receiving)"),
                       p->outputs[tn.src_output].bytes});
      }
    }
  }
  for (const auto& [cid, id] : checkpoint_ids_) {
    const Checkpoint& c = checkpoints_.at(cid);
    if (c.device == d) out.push_back({ResidentItem::Kind::kCheckpoint, StrCat(c.id), c.bytes});
  }
  return out;
}

absl::Status GlobalMappingGraph::VerifyInvariants() const {
  std::vector<DeviceMemory> mem(accel_.size());
  absl::btree_set<FrontierKey> unsched;
  absl::btree_set<NodeId> sched;
  std::vector<NodeId> running(accel_.size()), transferring(accel_.size());
  std::vector<int32_t> outstanding(accel_.size(), 0);
  std::vector<int32_t> outstanding_offline(accel_.size(), 0);
  size_t nodes = 0;
  for (size_t d = 0; d < accel_.size(); ++d) {
    for (const auto& [key, bytes] : weights_[d]) mem[d].weights += bytes;
  }
  std::vector<int32_t> online_checkpoints(accel_.size(), 0);
  for (const auto& [cid, c] : checkpoints_) {
    mem[c.device.value()].checkpoints += c.bytes;
    if (c.priority_class == PriorityClass::kOnline) ++online_checkpoints[c.device.value()];
  }
  for (const auto& [iid, inst] : instances_) {
    const GraphTemplate& tpl = *inst->tpl;
    if (inst->state != InstanceState::kPending && inst->state != InstanceState::kRunning) {
      return absl::InternalError(StrCat("terminal instance ", inst->id, " was not retired"));
    }
    nodes += inst->nodes.size() + inst->transfers.size();
    int unfinished = 0;
    for (const OpNode& n : inst->nodes) {
      const OpSpec& op = tpl.op(n.op_index);
      int up = 0, us = 0;
      for (int p : op.preds) up += inst->nodes[p].state == NodeState::kUnscheduled;
      for (int s : op.succs) us += inst->nodes[s].state == NodeState::kUnscheduled;
      if (!IsTerminal(n.state)) ++unfinished;
      if (n.state == NodeState::kIssued || n.state == NodeState::kRunning) {
        ++outstanding[n.device.value()];
        if (inst->spec.priority_class == PriorityClass::kOffline) ++outstanding_offline[n.device.value()];
      }
      if (n.state == NodeState::kUnscheduled && up != n.unscheduled_preds) {
        return absl::InternalError(StrCat("node ", n.id, ": unscheduled_preds ",
                                                n.unscheduled_preds, " != ", up));
      }
      if (IsScheduled(n.state) && us != n.unscheduled_succs) {
        return absl::InternalError(StrCat("node ", n.id, ": unscheduled_succs ",
                                                n.unscheduled_succs, " != ", us));
      }
      if (n.state == NodeState::kUnscheduled && up == 0) unsched.insert(KeyOf(*inst, n));
      if (IsScheduled(n.state) && us > 0) sched.insert(n.id);
      if (n.state == NodeState::kRunning) {
        if (running[n.device.value()].valid()) {
          return absl::InternalError(StrCat("two running nodes on device ", n.device));
        }
        running[n.device.value()] = n.id;
        mem[n.device.value()].workspace += n.workspace;
      }
      for (const TensorState& t : n.outputs) {
        if (!t.allocated || t.freed || t.update_of >= 0) continue;
        if (t.retained && n.state == NodeState::kDone) continue;
        for (DeviceId d : t.copies) mem[d.value()].activations += t.bytes;
      }
      // Pending consumers: template consumers not done + transfers not done.
      for (size_t o = 0; o < n.outputs.size(); ++o) {
        int pending = 0;
        for (int s : op.succs) {
          for (const InputRef& r : tpl.op(s).inputs) {
            if (r.kind == InputRef::Kind::kOp && r.index == n.op_index &&
                r.output == static_cast<int>(o) && inst->nodes[s].state != NodeState::kDone) {
              ++pending;
            }
          }
        }
        for (NodeId tid : inst->transfers) {
          const OpNode& tn = transfers_.at(tid.value());
          if (tn.src_node == n.id && tn.src_output == static_cast<int>(o) && tn.state != NodeState::kDone) {
            ++pending;
          }
        }
        if (pending != n.outputs[o].pending_consumers) {
          return absl::InternalError(StrCat("node ", n.id, " output ", o, ": pending_consumers ",
                                                  n.outputs[o].pending_consumers, " != ", pending));
        }
      }
    }
    if (unfinished != inst->unfinished) {
      return absl::InternalError(StrCat("instance ", inst->id, ": unfinished count ",
                                              inst->unfinished, " != ", unfinished));
    }
    for (NodeId tid : inst->transfers) {
      const OpNode& tn = transfers_.at(tid.value());
      if (tn.state == NodeState::kRunning) {
        for (DeviceId end : {tn.device, tn.dst_device}) {
          if (transferring[end.value()].valid()) {
            return absl::InternalError(StrCat("two active transfers on device ", end));
          }
          transferring[end.value()] = tn.id;
        }
        const OpNode* p = FindNode(tn.src_node);
        mem[tn.dst_device.value()].activations += p->outputs[tn.src_output].bytes;
      }
    }
  }
  if (nodes != num_nodes_) {
    return absl::InternalError(StrCat("node count ", num_nodes_, " != ", nodes));
  }
  if (transfers_.size() > nodes) return absl::InternalError("orphan transfer nodes");
  for (size_t d = 0; d < accel_.size(); ++d) {
    if (!(mem[d] == memory_[d])) {
      return absl::InternalError(StrCat(
          "device ", accel_.device(DeviceId(d)).name, " memory mismatch: incremental (w ",
          memory_[d].weights.count(), ", a ", memory_[d].activations.count(), ", ws ",
          memory_[d].workspace.count(), ", ck ", memory_[d].checkpoints.count(), ") vs recomputed (w ",
          mem[d].weights.count(), ", a ", mem[d].activations.count(), ", ws ", mem[d].workspace.count(),
          ", ck ", mem[d].checkpoints.count(), ")"));
    }
    if (outstanding[d] != outstanding_[d]) {
      return absl::InternalError(absl::StrCat("device ", d, " outstanding count ", outstanding_[d], " != ",
                                              outstanding[d]));
    }
    if (outstanding_offline[d] != outstanding_offline_[d]) {
      return absl::InternalError(absl::StrCat("device ", d, " offline outstanding count ",
                                              outstanding_offline_[d], " != ", outstanding_offline[d]));
    }
    if (online_checkpoints[d] != online_checkpoints_[d]) {
      return absl::InternalError(absl::StrCat("device ", d, " online checkpoint count ", online_checkpoints_[d],
                                              " != ", online_checkpoints[d]));
    }
    if (running[d] != running_compute_[d]) {
      return absl::InternalError(StrCat("device ", d, " running node mismatch"));
    }
    if (transferring[d] != active_transfer_[d]) {
      return absl::InternalError(StrCat("device ", d, " active transfer mismatch"));
    }
  }
  if (unsched != unscheduled_) {
    return absl::InternalError(StrCat("unscheduled frontier mismatch: incremental ",
                                            unscheduled_.size(), " vs recomputed ", unsched.size()));
  }
  if (sched != scheduled_frontier_) {
    return absl::InternalError(StrCat("scheduled frontier mismatch: incremental ",
                                            scheduled_frontier_.size(), " vs recomputed ", sched.size()));
  }
  return absl::OkStatus();
}

}  // namespace slicesched
