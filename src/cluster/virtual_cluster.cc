#include "slicesched/cluster/virtual_cluster.h"

#include <algorithm>

#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"

namespace slicesched {

VirtualCluster::VirtualCluster(GlobalMappingGraph* gmg, const GroundTruthModel* truth, uint64_t seed)
    : gmg_(gmg),
      truth_(truth),
      rng_(seed),
      ready_(gmg->accelerators().size()),
      busy_ns_(gmg->accelerators().size(), 0) {}

void VirtualCluster::NodeIssued(NodeId id) {
  const OpNode* n = gmg_->FindNode(id);
  if (n == nullptr || n->state != NodeState::kIssued) return;
  MaybeQueue(id, n->times.issue);
}

// Queues `id` if it is issued, ready and not queued yet.
void VirtualCluster::MaybeQueue(NodeId id, Timestamp now) {
  if (queued_.contains(id.value()) || !gmg_->IsReady(id)) return;
  const OpNode* n = gmg_->FindNode(id);
  const int64_t ready_ns = n->times.ready.is_never() ? now.nanos() : n->times.ready.nanos();
  queued_.insert(id.value());
  if (n->kind == OpKind::kTransfer) {
    pending_.push_back({static_cast<uint32_t>(0), n->device.value(), n->dst_device.value(), n->transfer_priority,
                        ready_ns, id.value()});
    return;
  }
  const Instance* inst = gmg_->FindInstance(n->instance);
  uint32_t item;
  if (!free_items_.empty()) {
    item = free_items_.back();
    free_items_.pop_back();
    items_[item] = id;
  } else {
    item = static_cast<uint32_t>(items_.size());
    items_.push_back(id);
  }
  ready_[n->device.value()].Push(DisciplineKey{static_cast<uint8_t>(inst->spec.priority_class),
                                               inst->spec.priority, ready_ns, id.value()},
                                 item);
}

absl::Status VirtualCluster::Dispatch(Timestamp now) {
  // Compute: every idle device starts its discipline's choice.
  for (size_t d = 0; d < ready_.size(); ++d) {
    const DeviceId dev(static_cast<uint16_t>(d));
    while (!gmg_->running_compute(dev).valid() && !ready_[d].empty()) {
      const uint32_t item = ready_[d].Pop();
      const NodeId id = items_[item];
      free_items_.push_back(item);
      queued_.erase(id.value());
      const OpNode* n = gmg_->FindNode(id);
      if (n == nullptr || n->state != NodeState::kIssued) continue;  // cancelled meanwhile
      const Instance* inst = gmg_->FindInstance(n->instance);
      const bool overlapped = gmg_->active_transfer(dev).valid();
      const Duration t = truth_->OpTime(*inst->tpl, n->op_index, n->attrs, dev, overlapped, rng_);
      SLICESCHED_RETURN_IF_ERROR(gmg_->Start(id, now));
      events_.push_back({(now + t).nanos(), seq_++, id, overlapped});
      std::push_heap(events_.begin(), events_.end(), EventLater());
    }
  }
  // Transfers: the shared arbitration rule over ready transfers.
  if (!pending_.empty()) {
    std::vector<uint8_t> busy(ready_.size(), 0);
    for (size_t d = 0; d < busy.size(); ++d) busy[d] = gmg_->active_transfer(DeviceId(static_cast<uint16_t>(d))).valid();
    // TransferRequest ids are indices into pending_ for this round.
    for (uint32_t i = 0; i < pending_.size(); ++i) pending_[i].id = i;
    std::vector<TransferRequest> work = pending_;
    std::vector<uint32_t> granted;
    ArbitrateTransfers(&work, &busy, &granted);
    std::vector<uint8_t> take(pending_.size(), 0);
    for (uint32_t i : granted) take[i] = 1;
    std::vector<TransferRequest> rest;
    for (uint32_t i = 0; i < pending_.size(); ++i) {
      if (!take[i]) {
        rest.push_back(pending_[i]);
        continue;
      }
      const NodeId id(pending_[i].seq);
      queued_.erase(id.value());
      const OpNode* n = gmg_->FindNode(id);
      if (n == nullptr || n->state != NodeState::kIssued) continue;
      const OpNode* p = gmg_->FindNode(n->src_node);
      const bool overlapped = gmg_->running_compute(n->device).valid() || gmg_->running_compute(n->dst_device).valid();
      const Duration t = truth_->TransferTime(n->device, n->dst_device, p->outputs[n->src_output].bytes, overlapped, rng_);
      SLICESCHED_RETURN_IF_ERROR(gmg_->Start(id, now));
      events_.push_back({(now + t).nanos(), seq_++, id, overlapped});
      std::push_heap(events_.begin(), events_.end(), EventLater());
    }
    pending_.swap(rest);
  }
  return absl::OkStatus();
}

Timestamp VirtualCluster::NextEventTime() const {
  return events_.empty() ? Timestamp::Infinite() : Timestamp::FromNanos(events_.front().time);
}

absl::Status VirtualCluster::Complete(const Event& e, std::vector<Feedback>* feedback) {
  const Timestamp now = Timestamp::FromNanos(e.time);
  const OpNode* n = gmg_->FindNode(e.node);
  if (n == nullptr || n->state != NodeState::kRunning) return absl::OkStatus();  // cancelled meanwhile
  const Instance* inst = gmg_->FindInstance(n->instance);
  Feedback f;
  f.node = n->id;
  f.instance = n->instance;
  f.device = n->device;
  f.start = n->times.start;
  f.end = now;
  f.overlapped = e.overlapped;
  // What may become ready once this completes (read before Finish, which
  // may retire the instance).
  absl::InlinedVector<NodeId, 8> wake;
  if (n->kind == OpKind::kTransfer) {
    f.kind = Feedback::Kind::kTransfer;
    f.dst = n->dst_device;
    const OpNode* producer = gmg_->FindNode(n->src_node);
    f.bytes = producer->outputs[n->src_output].bytes;
    // The copy serves every consumer on the destination, not only the one
    // the transfer was issued for (one transfer per tensor and device).
    for (int s : inst->tpl->op(producer->op_index).succs) {
      if (inst->nodes[s].device == n->dst_device) wake.push_back(inst->nodes[s].id);
    }
    ++completed_transfers_;
  } else {
    f.kind = Feedback::Kind::kOp;
    f.tpl = inst->tpl->id();
    f.op = n->op_index;
    f.attrs = n->attrs;
    busy_ns_[n->device.value()] += (now - n->times.start).nanos();
    for (int s : inst->tpl->op(n->op_index).succs) wake.push_back(inst->nodes[s].id);
    for (NodeId t : inst->transfers) {
      const OpNode* tn = gmg_->FindNode(t);
      if (tn->src_node == n->id && tn->state == NodeState::kIssued) wake.push_back(t);
    }
    ++completed_ops_;
  }
  SLICESCHED_RETURN_IF_ERROR(gmg_->Finish(e.node, now));
  feedback->push_back(std::move(f));
  for (NodeId w : wake) {
    const OpNode* wn = gmg_->FindNode(w);
    if (wn != nullptr && wn->state == NodeState::kIssued) MaybeQueue(w, now);
  }
  return absl::OkStatus();
}

absl::Status VirtualCluster::AdvanceTo(Timestamp t, std::vector<Feedback>* feedback) {
  while (!events_.empty() && events_.front().time <= t.nanos()) {
    std::pop_heap(events_.begin(), events_.end(), EventLater());
    const Event e = events_.back();
    events_.pop_back();
    SLICESCHED_RETURN_IF_ERROR(Complete(e, feedback));
    // Cascade at the same instant before moving on.
    SLICESCHED_RETURN_IF_ERROR(Dispatch(Timestamp::FromNanos(e.time)));
  }
  return absl::OkStatus();
}

}  // namespace slicesched
