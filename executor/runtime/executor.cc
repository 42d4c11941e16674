// ExecutorSet: construction, and the owner's side (queueing issued nodes,
// transfers, draining the devices' records into the GMG, cancellation,
// stopping). The device threads are in device_loop.cc, the owner's waits in
// owner_wait.cc (executor.h describes the whole).
#include "slicesched/executor/runtime/executor.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <cstddef>
#include <exception>
#include <iterator>
#include <utility>

#include "absl/time/clock.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "executor_internal.h"

namespace slicesched::executor {

using runtime_internal::AddLocked;
using runtime_internal::NodeLabel;

ExecutorSet::ExecutorSet(GlobalMappingGraph* gmg, const Clock* clock, KernelRunner* kernels,
                         TransferBackend* transfers, ExecutorOptions options)
    : gmg_(gmg),
      clock_(clock),
      kernels_(kernels),
      transfers_(transfers),
      comm_(gmg->accelerators().size()),
      op_free_(gmg->accelerators().size()),
      xfer_free_(gmg->accelerators().size()),
      owner_nap_(std::max(absl::ZeroDuration(), options.owner_nap)) {
  const size_t n = gmg->accelerators().size();
  for (size_t d = 0; d < n; ++d) {
    const DeviceSpec& spec = gmg->accelerators().devices()[d];
    const Bytes cap = d < options.capacities.size() ? options.capacities[d] : spec.memory;
    pools_.push_back(std::make_unique<DevicePool>(spec.id, spec.name, cap));
  }
  buried_.resize(n);
  {
    absl::MutexLock l(&mu_);
    devices_.resize(n);
  }
  device_cpu_ = std::make_unique<DeviceCpu[]>(n);
  int workers = options.transfer_threads > 0 ? options.transfer_threads
                                             : std::max<int>(1, static_cast<int>(n / 2));
  transfer_pool_ = std::make_unique<ThreadPool>(workers);
  threads_.reserve(n);
  for (size_t d = 0; d < n; ++d) {
    const int cpu = d < options.device_cpus.size() ? options.device_cpus[d] : -1;
    threads_.emplace_back([this, d, cpu] { DeviceLoop(DeviceId(static_cast<uint16_t>(d)), cpu); });
  }
}

ExecutorSet::~ExecutorSet() {
  {
    absl::MutexLock l(&mu_);
    shutdown_ = true;
  }
  for (std::thread& t : threads_) t.join();
  transfer_pool_.reset();  // runs (and finishes) every queued Send
  absl::MutexLock l(&mu_);
  num_records_.store(0, std::memory_order_relaxed);
  pending_completions_.store(0, std::memory_order_relaxed);
  for (DeviceState& s : devices_) {
    s.records.clear();
    s.items.clear();
    s.done.clear();
    s.graveyard.clear();
    s.graveyard_bytes = 0;
  }
}


// ---------------------------------------------------------------------------
// Owner thread

void ExecutorSet::NodeIssued(NodeId id) {
  const OpNode* n = gmg_->FindNode(id);
  if (n == nullptr || n->state != NodeState::kIssued) return;
  MaybeQueue(id, clock_->Now());
}

void ExecutorSet::MaybeQueue(NodeId id, Timestamp now) {
  // Queuing a compute node may make its same-device successors locally
  // ready: try them too, so a same-device chain is handed over at once.
  absl::InlinedVector<NodeId, 8> worklist{id};
  while (!worklist.empty()) {
    const NodeId next = worklist.back();
    worklist.pop_back();
    if (!QueueOne(next, now)) continue;
    const OpNode* n = gmg_->FindNode(next);
    const Instance* inst = gmg_->FindInstance(n->instance);
    for (int s : inst->tpl->op(n->op_index).succs) {
      const OpNode& sn = inst->nodes[s];
      if (sn.state == NodeState::kIssued && sn.device == n->device && !queued_.contains(sn.id.value())) {
        worklist.push_back(sn.id);
      }
    }
  }
}

bool ExecutorSet::QueueOne(NodeId id, Timestamp now) {
  if (queued_.contains(id.value())) return false;
  const OpNode* n = gmg_->FindNode(id);
  if (n == nullptr || n->state != NodeState::kIssued) return false;
  if (n->kind == OpKind::kTransfer) {
    if (!gmg_->IsReady(id)) return false;
    const int64_t ready_ns = n->times.ready.is_never() ? now.nanos() : n->times.ready.nanos();
    if (device_stopped(n->device) || device_stopped(n->dst_device)) {
      (void)FailNode(id, StrCat("transfer ", id, ": device ",
                                device_stopped(n->device) ? pools_[n->device.value()]->name()
                                                          : pools_[n->dst_device.value()]->name(),
                                " is stopped"),
                     now);
      return false;
    }
    const OpNode* p = gmg_->FindNode(n->src_node);
    const TransferIntent intent{id.value(), n->device, n->dst_device, n->transfer_priority,
                                ready_ns, p->outputs[n->src_output].bytes};
    if (comm_.AddIntent(intent).ok()) queued_.insert(id.value());
    return false;
  }
  const Instance* inst = gmg_->FindInstance(n->instance);
  const OpSpec& op = inst->tpl->op(n->op_index);
  const DeviceId d = n->device;
  WorkItem w;
  w.inputs.reserve(op.inputs.size());
  for (const InputRef& r : op.inputs) {
    Buffer b;
    b.device = d;
    if (r.kind == InputRef::Kind::kOp) {
      const OpNode& p = inst->nodes[r.index];
      const TensorState& t = p.outputs[r.output];
      b.bytes = t.bytes;
      if (p.state == NodeState::kDone) {
        // Done: ready only with a copy here (else a transfer is pending).
        if (std::find(t.copies.begin(), t.copies.end(), d) == t.copies.end()) return false;
        auto it = tensors_.find(TensorKey{p.id.value(), r.output});
        if (it != tensors_.end()) {
          auto c = it->second.find(d.value());
          if (c != it->second.end()) b = c->second.buffer;
        }
      } else if (p.device == d && t.update_of < 0 && !t.retained &&
                 w.inputs.size() <= WorkItem::kMaxLocalIndex &&
                 static_cast<size_t>(r.output) <= WorkItem::kMaxLocalIndex &&
                 (p.state == NodeState::kRunning ||
                  (p.state == NodeState::kIssued && queued_.contains(p.id.value())))) {
        // Produced here by a node the device already has: resolved there
        // (the producer's slot is filled in by Hand).
        w.local.push_back({p.id, kNoItem, static_cast<uint16_t>(w.inputs.size()),
                           static_cast<uint16_t>(r.output)});
      } else {
        return false;
      }
    } else if (r.kind == InputRef::Kind::kCheckpoint) {
      const CheckpointId cid = inst->attached[r.index];
      const Checkpoint* c = gmg_->FindCheckpoint(cid);
      // The GMG's rule, which stays true until the node starts.
      if (c == nullptr || c->device != d || (c->updating.valid() && c->updating != id)) return false;
      b.bytes = c->bytes;
      auto it = checkpoints_.find(cid.value());
      if (it != checkpoints_.end() && !it->second.empty()) {
        b.kind = it->second.front().buffer.kind;
        b.payload = it->second.front().buffer.payload;
      }
    }
    w.inputs.push_back(std::move(b));
  }
  if (w.local.empty() && !gmg_->IsReady(id)) return false;  // (the rule above is the GMG's)
  w.node = id;
  w.instance = n->instance;
  w.tpl = inst->tpl;
  w.op_index = n->op_index;
  w.attrs.assign(n->attrs.begin(), n->attrs.end());
  w.workspace = n->workspace;
  w.successors = static_cast<int>(op.succs.size());
  for (const TensorState& t : n->outputs) w.output_bytes.push_back(t.bytes);
  w.readers.assign(n->outputs.size(), 0);
  for (int sx : op.succs) {
    const OpNode& sn = inst->nodes[sx];
    if (sn.kind == OpKind::kTransfer || sn.device != d) w.hands_off = true;
    for (const InputRef& r : inst->tpl->op(sx).inputs) {
      if (r.kind != InputRef::Kind::kOp || r.index != n->op_index) continue;
      const TensorState& t = n->outputs[r.output];
      if (t.update_of < 0 && !t.retained) ++w.readers[r.output];
    }
  }
  handed_instances_.insert(n->instance.value());
  // A locally ready node's ready time is its last local producer's finish
  // time, filled in by the device.
  const int64_t ready_ns =
      !w.local.empty() ? 0 : n->times.ready.is_never() ? now.nanos() : n->times.ready.nanos();
  w.key = DisciplineKey{static_cast<uint8_t>(inst->spec.priority_class), inst->spec.priority,
                        ready_ns, id.value()};
  bool stopped;
  {
    absl::MutexLock l(&mu_);
    stopped = devices_[d.value()].stopped;
    if (!stopped) {
      Hand(d, std::move(w));
      NoteWork(devices_[d.value()]);
    }
  }
  if (stopped) {
    (void)FailNode(id, StrCat("node ", NodeLabel(inst->tpl, n->op_index, id), ": device ",
                              pools_[d.value()]->name(), " is stopped"),
                   now);
    return false;
  }
  queued_.insert(id.value());
  return true;
}

absl::Status ExecutorSet::Dispatch(Timestamp now) {
  Reconcile();
  return ArbitrateTransfers(now);
}

absl::Status ExecutorSet::ArbitrateTransfers(Timestamp now) {
  if (comm_.num_pending() == 0) return absl::OkStatus();
  std::vector<uint8_t> blocked(pools_.size(), 0);
  {
    absl::MutexLock l(&mu_);
    for (size_t d = 0; d < devices_.size(); ++d) blocked[d] = devices_[d].stopped;
  }
  for (const TransferIntent& g : comm_.Arbitrate(&blocked)) {
    const NodeId id(g.id);
    const OpNode* n = gmg_->FindNode(id);
    if (n == nullptr || n->state != NodeState::kIssued) {
      (void)comm_.Abort(g.id);
      queued_.erase(g.id);
      continue;
    }
    // Recv: the destination allocates first; a failure is retried later.
    absl::StatusOr<Allocation> a = pools_[g.dst.value()]->Allocate(g.bytes, AllocPurpose::kRecv);
    if (!a.ok()) {
      SLICESCHED_RETURN_IF_ERROR(comm_.RecvFailed(g.id));
      continue;
    }
    SLICESCHED_RETURN_IF_ERROR(comm_.RecvReady(g.id));
    const bool overlapped =
        gmg_->running_compute(g.src).valid() || gmg_->running_compute(g.dst).valid();
    SLICESCHED_RETURN_IF_ERROR(gmg_->Start(id, now));
    start_overlapped_[g.id] = overlapped;
    Buffer from;
    from.bytes = g.bytes;
    from.device = g.src;
    auto it = tensors_.find(TensorKey{n->src_node.value(), n->src_output});
    if (it != tensors_.end()) {
      auto c = it->second.find(g.src.value());
      if (c != it->second.end()) from = c->second.buffer;
    }
    // Send: on a transfer worker; the receive buffer travels with it.
    transfer_pool_->Schedule([this, id, g, from = std::move(from),
                              alloc = std::move(*a)]() mutable {
      Buffer to{g.bytes, g.dst, kNoPayload, nullptr};
      const TransferCall call{id, g.src, g.dst, g.bytes, &from, &to};
      absl::Status st;
      try {
        st = transfers_->Send(call);
      } catch (const std::exception& e) {
        st = absl::InternalError(StrCat("transfer backend threw: ", e.what()));
      } catch (...) {
        st = absl::InternalError("transfer backend threw a non-standard exception");
      }
      absl::MutexLock l(&mu_);
      auto may_finish = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return shutdown_ || !paused_; };
      mu_.Await(absl::Condition(&may_finish));
      Event e{st.ok() ? Event::Kind::kTransferDone : Event::Kind::kTransferFailed,
              id, g.dst, Timestamp(), "", {}};
      if (st.ok()) {
        e.outputs.push_back(Held{std::move(to), std::move(alloc)});
      } else {
        alloc.Release();
        e.reason = StrCat("transfer ", id, " ", g.src, " -> ", g.dst, ": ", st.message());
      }
      Post(std::move(e));
    });
  }
  return absl::OkStatus();
}

Timestamp ExecutorSet::NextEventTime() const {
  if (comm_.num_retrying() > 0) return clock_->Now();
  const bool events = num_records_.load(std::memory_order_relaxed) > 0 || start_unseen_.load(std::memory_order_relaxed);
  if (owner_sleep_.load(std::memory_order_relaxed) != OwnerSleep::kNapping) {
    return events ? clock_->Now() : Timestamp::Infinite();
  }
  // Napping (see "Owner waits"): at once for a completion the owner waits
  // for, after a nap for the rest (starts, quiet completions) and while a
  // device holds work.
  if (pending_completions_.load(std::memory_order_relaxed) > 0) return clock_->Now();
  if (events || busy_devices_.load(std::memory_order_relaxed) > 0) {
    return clock_->Now() + Duration::Nanos(absl::ToInt64Nanoseconds(owner_nap_));
  }
  return Timestamp::Infinite();
}

absl::Status ExecutorSet::AdvanceTo(Timestamp t, std::vector<Feedback>* feedback) {
  SLICESCHED_RETURN_IF_ERROR(Drain(t, feedback));
  return Dispatch(t);
}

absl::Status ExecutorSet::Drain(Timestamp t, std::vector<Feedback>* feedback) {
  // Records at or before `t`, and the starts at or before `t` of nodes
  // whose record is not (still running, or ended after `t`).
  std::vector<Event> batch;
  struct LateStart {
    uint64_t seq;
    NodeId node;
    DeviceId device;
    Timestamp start;
  };
  absl::InlinedVector<LateStart, 8> late;
  {
    absl::MutexLock l(&mu_);
    // A start after `t` (the device began between the owner reading its
    // clock and taking mu_) is not applied here, so it stays unseen: else a
    // WaitForCompletion() would sleep through it, and a node held in its
    // kernel would never show as running.
    bool start_after_t = false;
    batch.reserve(num_records_.load(std::memory_order_relaxed));
    for (size_t d = 0; d < devices_.size(); ++d) {
      DeviceState& s = devices_[d];
      const DeviceId dev(static_cast<uint16_t>(d));
      size_t k = 0;
      for (; k < s.records.size() && s.records[k].time <= t; ++k) {
        if (!s.records[k].quiet) AddLocked(pending_completions_, -1);
        batch.push_back(std::move(s.records[k]));
      }
      for (size_t i = k; i < s.records.size(); ++i) {
        const Event& e = s.records[i];
        if (e.started && e.start <= t) late.push_back({e.start_seq, e.node, dev, e.start});
        if (e.started && e.start > t) start_after_t = true;
      }
      s.records.erase(s.records.begin(), s.records.begin() + static_cast<std::ptrdiff_t>(k));
      AddLocked(num_records_, -static_cast<ptrdiff_t>(k));
      if (s.running.valid() && s.running_start <= t) {
        late.push_back({s.running_seq, s.running, dev, s.running_start});
      } else if (s.running.valid()) {
        start_after_t = true;
      }
    }
    start_unseen_.store(start_after_t, std::memory_order_relaxed);
  }
  // Every start and completion in posting (= time) order. A start applied
  // here from a node's running state is skipped when its record comes.
  struct Step {
    uint64_t seq;
    uint32_t index;  // into batch, or into late
    enum class What : uint8_t { kRecordStart, kRecord, kLateStart } what;
  };
  std::vector<Step> steps;
  steps.reserve(2 * batch.size() + late.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    const auto idx = static_cast<uint32_t>(i);
    if (batch[i].started) steps.push_back({batch[i].start_seq, idx, Step::What::kRecordStart});
    steps.push_back({batch[i].seq, idx, Step::What::kRecord});
  }
  for (size_t i = 0; i < late.size(); ++i) {
    steps.push_back({late[i].seq, static_cast<uint32_t>(i), Step::What::kLateStart});
  }
  std::sort(steps.begin(), steps.end(), [](const Step& a, const Step& b) { return a.seq < b.seq; });
  absl::Status status;
  bool ended = false;  // an operator's record (finished or failed)
  for (const Step& step : steps) {
    absl::Status s;
    if (step.what == Step::What::kLateStart) {
      const LateStart& ls = late[step.index];
      s = ApplyStart(ls.node, ls.device, ls.start);
    } else if (Event& e = batch[step.index]; step.what == Step::What::kRecordStart) {
      s = ApplyStart(e.node, e.device, e.start);
    } else {
      ended = ended || e.kind == Event::Kind::kFinished || e.kind == Event::Kind::kFailed;
      s = Apply(e, feedback);
    }
    if (!s.ok() && status.ok()) status = s;
  }
  if (ended) {
    // The GMG knows these nodes are done (or failed) now: their dependents'
    // inputs come from the tensor store from here on, and their devices'
    // live entries (stale since the finish) go.
    absl::MutexLock l(&mu_);
    for (const Event& e : batch) {
      if (e.kind != Event::Kind::kFinished && e.kind != Event::Kind::kFailed) continue;
      DeviceState& s = devices_[e.device.value()];
      if (e.kind == Event::Kind::kFinished && e.item != kNoItem && s.items[e.item].node == e.node &&
          s.items[e.item].done) {
        s.items[e.item] = WorkItem();
        s.done[e.item] = LocalDone();
        s.free_items.push_back(e.item);
      }
      s.live.erase(e.node.value());
    }
  }
  Reconcile();
  return status;
}

absl::Status ExecutorSet::ApplyStart(NodeId node, DeviceId device, Timestamp start) {
  queued_.erase(node.value());
  const OpNode* n = gmg_->FindNode(node);
  // Applied already (from the running state), or the instance failed
  // meanwhile (its completion is ignored too).
  if (n == nullptr || n->state != NodeState::kIssued) return absl::OkStatus();
  start_overlapped_[node.value()] = gmg_->active_transfer(device).valid();
  return gmg_->Start(node, start);
}

absl::Status ExecutorSet::Apply(Event& e, std::vector<Feedback>* feedback) {
  const OpNode* n = gmg_->FindNode(e.node);
  switch (e.kind) {
    case Event::Kind::kFailed: {
      queued_.erase(e.node.value());
      start_overlapped_.erase(e.node.value());
      if (n == nullptr || IsTerminal(n->state)) return absl::OkStatus();
      return FailNode(e.node, e.reason, e.time);
    }
    case Event::Kind::kFinished: {
      auto ov = start_overlapped_.find(e.node.value());
      const bool overlapped = ov != start_overlapped_.end() && ov->second;
      if (ov != start_overlapped_.end()) start_overlapped_.erase(ov);
      if (n == nullptr || n->state != NodeState::kRunning) return absl::OkStatus();
      const Instance* inst = gmg_->FindInstance(n->instance);
      const OpSpec& op = inst->tpl->op(n->op_index);
      Feedback f;
      f.kind = Feedback::Kind::kOp;
      f.node = n->id;
      f.instance = n->instance;
      f.device = n->device;
      f.tpl = inst->tpl->id();
      f.op = n->op_index;
      f.attrs = n->attrs;
      f.start = n->times.start;
      f.end = e.time;
      f.overlapped = overlapped;
      // The delivery gap, when the node's last input to arrive came by a
      // transfer: start minus the later of that transfer's end and the end
      // of the device's previous operator (waiting for a busy device is
      // queueing, which the simulator models, not hand-off).
      Timestamp last_hop = Timestamp::Never();
      for (NodeId t : inst->transfers) {
        const OpNode* tn = gmg_->FindNode(t);
        if (tn != nullptr && tn->consumer == n->id && tn->state == NodeState::kDone &&
            (last_hop.is_never() || tn->times.end > last_hop)) {
          last_hop = tn->times.end;
        }
      }
      Timestamp& dev_free = op_free_[n->device.value()];
      if (!last_hop.is_never() && !n->times.ready.is_never() && last_hop >= n->times.ready) {
        const Duration gap = n->times.start - std::max(last_hop, dev_free);
        f.handoff = std::max(gap, Duration::Zero());
      }
      dev_free = e.time;
      absl::InlinedVector<NodeId, 8> wake;
      for (int s : op.succs) wake.push_back(inst->nodes[s].id);
      for (NodeId t : inst->transfers) {
        const OpNode* tn = gmg_->FindNode(t);
        if (tn->src_node == n->id && tn->state == NodeState::kIssued) wake.push_back(t);
      }
      for (const InputRef& r : op.inputs) {
        if (r.kind == InputRef::Kind::kOp) Touch(inst->nodes[r.index].id, r.output);
      }
      // Outputs: plain tensors go to the store; retained ones become
      // checkpoints (matched by the ids Finish creates, in output order);
      // checkpoint growth joins the checkpoint it grows.
      std::vector<size_t> retained;
      for (size_t o = 0; o < e.outputs.size() && o < n->outputs.size(); ++o) {
        const TensorState& t = n->outputs[o];
        if (t.update_of >= 0) {
          checkpoints_[inst->attached[t.update_of].value()].push_back(std::move(e.outputs[o]));
        } else if (t.retained) {
          retained.push_back(o);
        } else {
          tensors_[TensorKey{n->id.value(), static_cast<int>(o)}].emplace(e.device.value(),
                                                                          std::move(e.outputs[o]));
          Touch(n->id, static_cast<int>(o));
        }
      }
      const uint64_t prev_ckpt =
          gmg_->checkpoint_index().empty() ? 0 : gmg_->checkpoint_index().rbegin()->first;
      const NodeId id = n->id;
      SLICESCHED_RETURN_IF_ERROR(gmg_->Finish(id, e.time));  // may retire the instance
      size_t next = 0;
      for (auto it = gmg_->checkpoint_index().upper_bound(prev_ckpt);
           it != gmg_->checkpoint_index().end() && next < retained.size(); ++it) {
        checkpoints_[it->first].push_back(std::move(e.outputs[retained[next++]]));
      }
      ++completed_ops_;
      feedback->push_back(std::move(f));
      for (NodeId w : wake) {
        const OpNode* wn = gmg_->FindNode(w);
        if (wn != nullptr && wn->state == NodeState::kIssued) MaybeQueue(w, e.time);
      }
      return absl::OkStatus();
    }
    case Event::Kind::kTransferDone:
    case Event::Kind::kTransferFailed: {
      queued_.erase(e.node.value());
      auto ov = start_overlapped_.find(e.node.value());
      const bool overlapped = ov != start_overlapped_.end() && ov->second;
      if (ov != start_overlapped_.end()) start_overlapped_.erase(ov);
      if (comm_.contains(e.node.value())) (void)comm_.Abort(e.node.value());
      if (n == nullptr || n->state != NodeState::kRunning) return absl::OkStatus();
      if (e.kind == Event::Kind::kTransferFailed) return FailNode(e.node, e.reason, e.time);
      const OpNode* p = gmg_->FindNode(n->src_node);
      Feedback f;
      f.kind = Feedback::Kind::kTransfer;
      f.node = n->id;
      f.instance = n->instance;
      f.device = n->device;
      f.dst = n->dst_device;
      f.bytes = p->outputs[n->src_output].bytes;
      f.start = n->times.start;
      f.end = e.time;
      f.overlapped = overlapped;
      // The launch gap: start minus the later of the producer's end (the
      // ready time) and both ends being free of other transfers.
      Timestamp& src_free = xfer_free_[n->device.value()];
      Timestamp& dst_free = xfer_free_[n->dst_device.value()];
      if (!n->times.ready.is_never()) {
        const Duration gap = n->times.start - std::max({n->times.ready, src_free, dst_free});
        f.handoff = std::max(gap, Duration::Zero());
      }
      src_free = dst_free = e.time;
      // Every issued consumer of the tensor on the destination may be ready
      // now (one transfer serves all consumers there), not only `consumer`.
      absl::InlinedVector<NodeId, 4> wake{n->consumer};
      if (const Instance* inst = gmg_->FindInstance(n->instance); inst != nullptr && p != nullptr) {
        for (int s : inst->tpl->op(p->op_index).succs) {
          const OpNode& sn = inst->nodes[s];
          if (sn.id != n->consumer && sn.device == n->dst_device && sn.state == NodeState::kIssued) {
            wake.push_back(sn.id);
          }
        }
      }
      const TensorKey key{n->src_node.value(), n->src_output};
      tensors_[key].insert_or_assign(n->dst_device.value(), std::move(e.outputs.front()));
      Touch(n->src_node, n->src_output);
      SLICESCHED_RETURN_IF_ERROR(gmg_->Finish(e.node, e.time));
      ++completed_transfers_;
      feedback->push_back(std::move(f));
      for (NodeId w : wake) {
        const OpNode* c = gmg_->FindNode(w);
        if (c != nullptr && c->state == NodeState::kIssued) MaybeQueue(w, e.time);
      }
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

absl::Status ExecutorSet::FailNode(NodeId id, absl::string_view reason, Timestamp now) {
  const OpNode* n = gmg_->FindNode(id);
  if (n == nullptr || IsTerminal(n->state)) return absl::OkStatus();
  const InstanceId inst_id = n->instance;
  SLICESCHED_RETURN_IF_ERROR(gmg_->Fail(id, reason, now));
  ++failed_nodes_;
  CancelInstanceWork(inst_id);
  return absl::OkStatus();
}

// The instance failed (its nodes are terminal in the GMG): drop its queued
// work, its pending transfers and, via Reconcile, its tensors.
void ExecutorSet::CancelInstanceWork(InstanceId inst_id) {
  if (handed_instances_.erase(inst_id.value()) > 0) CancelItems(inst_id);
  const uint64_t lo = inst_id.value() << kOpIndexBits, hi = (inst_id.value() + 1) << kOpIndexBits;
  for (auto it = queued_.begin(); it != queued_.end();) {
    const uint64_t v = *it;
    if (v >= lo && v < hi) {
      queued_.erase(it++);
    } else {
      ++it;
    }
  }
  for (auto it = tensors_.lower_bound(TensorKey{lo, 0});
       it != tensors_.end() && it->first.first < hi; ++it) {
    touched_.insert(it->first);
  }
  // Transfers of the instance: pending ones leave the communication graph;
  // one being sent stays until its Send returns (its ends are in use).
  std::vector<uint64_t> drop;
  for (uint64_t q : queued_) {
    if (!IsTransferId(NodeId(q)) || !comm_.contains(q)) continue;
    const OpNode* tn = gmg_->FindNode(NodeId(q));
    if ((tn == nullptr || tn->instance == inst_id) && comm_.phase(q) == CommGraph::Phase::kPending) {
      drop.push_back(q);
    }
  }
  for (uint64_t q : drop) {
    (void)comm_.Abort(q);
    queued_.erase(q);
  }
}

void ExecutorSet::CancelItems(InstanceId inst) {
  absl::MutexLock l(&mu_);
  // Free slots keep their last item's instance: marked too, harmlessly (a
  // slot is reused only by move-assigning a new item).
  for (DeviceState& s : devices_) {
    for (size_t i = 0; i < s.items.size(); ++i) {
      if (s.items[i].instance == inst) s.items[i].cancelled = true;
    }
  }
}

void ExecutorSet::Bury(Held& h) {
  if (h.buffer.payload == nullptr) return;
  const size_t d = h.buffer.device.value();
  if (d >= buried_.size()) {
    h.buffer.payload.reset();
    return;
  }
  buried_[d].bytes += h.buffer.bytes.count();
  buried_[d].payloads.push_back(std::move(h.buffer.payload));
  any_buried_ = true;
}

void ExecutorSet::FlushBuried() {
  if (!any_buried_) return;
  any_buried_ = false;
  std::vector<std::shared_ptr<void>> orphans;  // of exited devices: freed here
  {
    absl::MutexLock l(&mu_);
    for (size_t d = 0; d < buried_.size(); ++d) {
      Buried& b = buried_[d];
      if (b.payloads.empty()) continue;
      DeviceState& s = devices_[d];
      const bool orphaned = s.exited || shutdown_;
      std::vector<std::shared_ptr<void>>& to = orphaned ? orphans : s.graveyard;
      std::move(b.payloads.begin(), b.payloads.end(), std::back_inserter(to));
      if (!orphaned) s.graveyard_bytes += b.bytes;
      b.payloads.clear();
      b.bytes = 0;
    }
  }
}

void ExecutorSet::ReconcileTensor(const TensorKey& key) {
  auto it = tensors_.find(key);
  if (it == tensors_.end()) return;
  auto drop_all = [&] {
    for (auto& [device, held] : it->second) Bury(held);
    tensors_.erase(it);
  };
  const OpNode* n = gmg_->FindNode(NodeId(key.first));
  if (n == nullptr || static_cast<size_t>(key.second) >= n->outputs.size()) {
    drop_all();
    return;
  }
  const TensorState& t = n->outputs[key.second];
  if (t.freed || !t.allocated) {
    drop_all();
    return;
  }
  for (auto c = it->second.begin(); c != it->second.end();) {
    if (std::find(t.copies.begin(), t.copies.end(), DeviceId(c->first)) == t.copies.end()) {
      Bury(c->second);
      c = it->second.erase(c);
    } else {
      ++c;
    }
  }
  if (it->second.empty()) tensors_.erase(it);
}

void ExecutorSet::Reconcile() {
  for (const TensorKey& k : touched_) ReconcileTensor(k);
  touched_.clear();
  for (auto it = checkpoints_.begin(); it != checkpoints_.end();) {
    if (gmg_->FindCheckpoint(CheckpointId(it->first)) == nullptr) {
      for (Held& h : it->second) Bury(h);
      it = checkpoints_.erase(it);
    } else {
      ++it;
    }
  }
  FlushBuried();
  for (auto it = handed_instances_.begin(); it != handed_instances_.end();) {
    const InstanceId id(*it);
    const Instance* inst = gmg_->FindInstance(id);
    if (inst == nullptr || inst->state == InstanceState::kDone ||
        inst->state == InstanceState::kFailed || inst->state == InstanceState::kCancelled) {
      if (inst != nullptr && inst->state != InstanceState::kDone) CancelItems(id);
      handed_instances_.erase(it++);
    } else {
      ++it;
    }
  }
}

void ExecutorSet::StopDevice(DeviceId d) {
  {
    absl::MutexLock l(&mu_);
    devices_[d.value()].stopped = true;
  }
  // Pending transfers touching the device fail now.
  std::vector<uint64_t> dead;
  for (uint64_t q : queued_) {
    if (!IsTransferId(NodeId(q)) || !comm_.contains(q)) continue;
    if (comm_.phase(q) != CommGraph::Phase::kPending) continue;
    const OpNode* tn = gmg_->FindNode(NodeId(q));
    if (tn == nullptr || tn->device == d || tn->dst_device == d) dead.push_back(q);
  }
  const Timestamp now = clock_->Now();
  for (uint64_t q : dead) {
    if (!comm_.contains(q)) continue;  // dropped with an instance failed earlier in this loop
    (void)comm_.Abort(q);
    queued_.erase(q);
    (void)FailNode(NodeId(q), StrCat("transfer ", NodeId(q), ": device ", pools_[d.value()]->name(),
                                     " stopped"),
                   now);
  }
  Reconcile();
}

bool ExecutorSet::device_stopped(DeviceId d) const {
  absl::MutexLock l(&mu_);
  return devices_[d.value()].stopped;
}

void ExecutorSet::Pause() {
  absl::MutexLock l(&mu_);
  paused_ = true;
}

void ExecutorSet::Resume() {
  absl::MutexLock l(&mu_);
  paused_ = false;
}

std::vector<NodeId> ExecutorSet::RunningNow() const {
  absl::MutexLock l(&mu_);
  std::vector<NodeId> out;
  out.reserve(devices_.size());
  for (const DeviceState& s : devices_) out.push_back(s.running);
  return out;
}

size_t ExecutorSet::stored_tensors() const {
  size_t n = 0;
  for (const auto& [k, copies] : tensors_) n += copies.size();
  for (const auto& [k, held] : checkpoints_) n += held.size();
  return n;
}

std::vector<ExecutorSet::StoredBuffer> ExecutorSet::StoredBuffers() const {
  std::vector<StoredBuffer> out;
  for (const auto& [key, copies] : tensors_) {
    for (const auto& [device, held] : copies) out.push_back({key.first, key.second, device});
  }
  for (const auto& [id, held] : checkpoints_) {
    for (const Held& h : held) out.push_back({id, -1, h.buffer.device.value()});
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace slicesched::executor
