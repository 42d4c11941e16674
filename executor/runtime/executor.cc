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

namespace slicesched::executor {
namespace {

std::string NodeLabel(const GraphTemplate* tpl, int op, NodeId id) {
  if (tpl == nullptr || op < 0) return id.ToString();
  return StrCat(id, " (", tpl->name(), "/", tpl->op(op).name, ")");
}

// Adds `delta` to one of the counters the owner's waits read without the
// set's lock (see "Owner waits"). They are written only with mu_ held, so a
// plain load and store does: no locked read-modify-write per operator.
void AddLocked(std::atomic<size_t>& counter, ptrdiff_t delta) {
  counter.store(counter.load(std::memory_order_relaxed) + static_cast<size_t>(delta), std::memory_order_relaxed);
}

// A spin-wait iteration's hint to the CPU.
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

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
// Device threads

void ExecutorSet::Post(Event e, bool stamp) {
  const size_t d = e.device.value();
  devices_[d].records.push_back(std::move(e));
  Publish(d, stamp);
}

void ExecutorSet::Publish(size_t d, bool stamp) {
  Event& e = devices_[d].records.back();
  if (stamp) e.time = clock_->Now();
  e.seq = seq_++;
  if (!e.quiet) AddLocked(pending_completions_, 1);
  AddLocked(num_records_, 1);
  // What the owner must act on promptly (see "Owner waits").
  MaybeWakeOwner(d, /*urgent=*/e.kind != Event::Kind::kFinished || e.hands_off);
}

uint32_t ExecutorSet::StoreItem(DeviceState& s, WorkItem w) {
  if (!s.free_items.empty()) {
    const uint32_t item = s.free_items.back();
    s.free_items.pop_back();
    s.items[item] = std::move(w);
    return item;
  }
  s.items.emplace_back() = std::move(w);
  s.done.emplace_back();
  return static_cast<uint32_t>(s.items.size() - 1);
}

void ExecutorSet::Hand(DeviceId d, WorkItem w) {
  DeviceState& s = devices_[d.value()];
  int64_t ready_ns = w.key.ready_ns;
  absl::InlinedVector<uint32_t, 2> producers;  // the items of the live ones
  for (WorkItem::LocalInput& li : w.local) {
    if (auto l = s.live.find(li.producer.value());
        l != s.live.end() && s.items[l->second].node == li.producer) {
      li.item = l->second;
      if (s.items[li.item].done) {  // finished, not applied yet
        const LocalDone& done = s.done[li.item];
        w.inputs[li.input] = done.outputs[li.output];
        ready_ns = std::max(ready_ns, done.end.nanos());
      } else {
        ++w.waiting;
        producers.push_back(li.item);
      }
    } else {
      Post(Event{Event::Kind::kFailed, w.node, d, Timestamp(),
                 StrCat("node ", NodeLabel(w.tpl, w.op_index, w.node), ": its input producer ",
                        li.producer, " did not finish"),
                 {}});
      return;
    }
  }
  w.key.ready_ns = ready_ns;
  const NodeId node = w.node;
  const DisciplineKey key = w.key;
  const bool pending = w.waiting > 0;
  const uint32_t item = StoreItem(s, std::move(w));
  s.live.emplace(node.value(), item);
  if (!pending) {
    s.ready.Push(key, item);
    return;
  }
  ++s.num_pending;
  for (uint32_t p : producers) {
    absl::InlinedVector<WorkItem::Dependent, 2>& deps = s.items[p].dependents;
    if (deps.empty() || deps.back().node != node) deps.push_back({item, node});  // once per producer
  }
}

bool ExecutorSet::Waits(const DeviceState& s, const WorkItem::Dependent& dep) {
  const WorkItem& w = s.items[dep.item];
  return w.node == dep.node && w.waiting > 0;
}

ExecutorSet::WorkItem ExecutorSet::TakeItem(DeviceState& s, uint32_t item) {
  WorkItem w = std::move(s.items[item]);
  s.items[item] = WorkItem();
  s.free_items.push_back(item);
  return w;
}

int ExecutorSet::ReleaseDependents(DeviceId d, WorkItem& producer, Timestamp end,
                                   std::span<const Buffer> outputs) {
  if (producer.dependents.empty()) return 0;
  DeviceState& s = devices_[d.value()];
  const NodeId p = producer.node;
  for (const WorkItem::Dependent& dep : producer.dependents) {
    if (!Waits(s, dep)) continue;  // dropped meanwhile
    WorkItem& w = s.items[dep.item];
    for (const WorkItem::LocalInput& li : w.local) {
      if (li.producer == p) w.inputs[li.input] = outputs[li.output];
    }
    w.key.ready_ns = std::max(w.key.ready_ns, end.nanos());
    // A dependent reading two outputs of `producer` is listed once per input.
    w.waiting -= static_cast<int>(
        std::count_if(w.local.begin(), w.local.end(),
                      [&](const WorkItem::LocalInput& li) { return li.producer == p; }));
    if (w.waiting > 0) continue;
    --s.num_pending;
    // The fast path: of the dependents released here, the one that runs
    // first is kept as the device's next item, the others are queued.
    if (s.next == kNoItem) {
      s.next = dep.item;
    } else if (RunsBefore(w.key, s.items[s.next].key)) {
      s.ready.Push(s.items[s.next].key, s.next);
      s.next = dep.item;
    } else {
      s.ready.Push(w.key, dep.item);
    }
  }
  // Anything queued that runs before it (a newly queued higher-priority
  // operator) wins: the discipline's pick is unchanged.
  if (s.next != kNoItem && !s.ready.empty() && RunsBefore(s.ready.Front(), s.items[s.next].key)) {
    s.ready.Push(s.items[s.next].key, s.next);
    s.next = kNoItem;
  }
  const int released = static_cast<int>(producer.dependents.size());
  producer.dependents.clear();
  return released;
}

void ExecutorSet::ReleaseConsumed(DeviceId d, const WorkItem& w, std::vector<std::shared_ptr<void>>* freed) {
  DeviceState& s = devices_[d.value()];
  for (const WorkItem::LocalInput& li : w.local) {
    const WorkItem& p = s.items[li.item];
    if (p.node != li.producer || !p.done) continue;  // applied: the owner's store frees it
    LocalDone& done = s.done[li.item];
    const auto o = static_cast<size_t>(li.output);
    if (o >= done.unread.size() || done.unread[o] <= 0 || --done.unread[o] > 0) continue;
    if (done.outputs[o].payload != nullptr) freed->push_back(std::move(done.outputs[o].payload));
    // The producer's record, if still here: usually the last few.
    for (auto r = s.records.rbegin(); r != s.records.rend(); ++r) {
      if (r->node != li.producer || r->kind != Event::Kind::kFinished) continue;
      if (o < r->outputs.size() && r->outputs[o].buffer.payload != nullptr) {
        freed->push_back(std::move(r->outputs[o].buffer.payload));
      }
      break;
    }
  }
}

void ExecutorSet::DropDependents(DeviceId d, NodeId producer,
                                 absl::InlinedVector<WorkItem::Dependent, 2> dependents) {
  if (dependents.empty()) return;
  DeviceState& s = devices_[d.value()];
  struct Dropped {
    NodeId producer;
    absl::InlinedVector<WorkItem::Dependent, 2> dependents;
  };
  std::vector<Dropped> worklist;
  worklist.push_back({producer, std::move(dependents)});
  while (!worklist.empty()) {
    const Dropped p = std::move(worklist.back());
    worklist.pop_back();
    for (const WorkItem::Dependent& dep : p.dependents) {
      if (!Waits(s, dep)) continue;  // already dropped (a second input of p)
      WorkItem dead = TakeItem(s, dep.item);
      --s.num_pending;
      s.live.erase(dep.node.value());
      Post(Event{Event::Kind::kFailed, dep.node, d, Timestamp(),
                 StrCat("node ", NodeLabel(dead.tpl, dead.op_index, dep.node), ": its input producer ",
                        p.producer, " did not finish"),
                 {}});
      worklist.push_back({dep.node, std::move(dead.dependents)});
    }
  }
}

void ExecutorSet::DeviceLoop(DeviceId d, int cpu) {
  if (cpu >= 0 && cpu < CPU_SETSIZE) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    (void)pthread_setaffinity_np(pthread_self(), sizeof(set), &set);  // best effort
  }
  const size_t di = d.value();
  DevicePool& pool = *pools_[di];
  const std::string& dev_name = pool.name();
  // One critical section per operator: the lock taken to record a node's
  // completion is kept to pick the next node, and released only while a
  // kernel runs (or while waiting for work). Every lock round trip is a
  // chance to meet the owner thread on the lock and sleep, and every
  // unlock re-evaluates the owner's wait condition.
  auto can_go = [this, di]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const DeviceState& s = devices_[di];
    return shutdown_ || s.stopped || (!paused_ && (s.next != kNoItem || !s.ready.empty())) ||
           s.graveyard_bytes >= kGraveyardWakeBytes;
  };
  auto may_finish = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return shutdown_ || !paused_; };
  // Per-operator scratch, kept across operators (no per-operator
  // construction and destruction): the pool requests, their allocations
  // (outputs, then workspace; the outputs' move to the record at the
  // finish) and the output buffers the kernel fills.
  absl::InlinedVector<DevicePool::Request, 3> requests;
  absl::InlinedVector<Allocation, 3> allocs;
  OutputBuffers out_buffers;
  Timestamp started_at;  // the running node's start, for its record
  uint64_t started_seq = 0;
  // The last finish's time while the lock has been held since: a node
  // picked in that same critical section starts then (one clock read per
  // operator boundary, not two; the end of one operator is the start of the
  // next). Never once the lock was let go or a node dropped.
  Timestamp boundary = Timestamp::Never();
  // Payloads handed back by the owner, taken from the graveyard under the
  // lock and freed here after unlocking.
  std::vector<std::shared_ptr<void>> handed_back;
  auto collect_handed_back = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    DeviceState& s = devices_[di];
    if (s.graveyard.empty()) return;
    if (handed_back.empty()) {
      handed_back.swap(s.graveyard);
    } else {  // kept from a pass that skipped its operator with the lock held
      std::move(s.graveyard.begin(), s.graveyard.end(), std::back_inserter(handed_back));
      s.graveyard.clear();
    }
    s.graveyard_bytes = 0;
  };
  mu_.Lock();
  for (;;) {
    // The item runs in its slot (no per-operator move; see
    // DeviceState::items), which stays off the free list until its finish.
    uint32_t item = kNoItem;
    WorkItem* wp = nullptr;
    Allocation workspace;
    {
      if (!can_go()) {
        boundary = Timestamp::Never();
        if (!handed_back.empty()) {
          // Free what the last operator's finish released before waiting.
          mu_.Unlock();
          handed_back.clear();
          mu_.Lock();
          continue;
        }
        // Running dry (or paused): an owner waiting for this device to hold
        // no work may be satisfied now without an event (a cancelled node
        // was dropped).
        MaybeWakeOwner(di);
        mu_.Await(absl::Condition(&can_go));
      }
      collect_handed_back();
      if (shutdown_) {
        mu_.Unlock();
        return;
      }
      DeviceState& s = devices_[di];
      if (!s.stopped && (paused_ || (s.next == kNoItem && s.ready.empty()))) {
        // Woken only to free what was handed back.
        boundary = Timestamp::Never();
        mu_.Unlock();
        handed_back.clear();
        mu_.Lock();
        continue;
      }
      if (s.stopped) {
        // Fail everything still queued or pending here (producers first),
        // then exit.
        if (s.next != kNoItem) {
          s.ready.Push(s.items[s.next].key, s.next);
          s.next = kNoItem;
        }
        auto fail = [&](uint32_t item) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          const WorkItem dead = TakeItem(s, item);
          Post(Event{Event::Kind::kFailed, dead.node, d, Timestamp(),
                     StrCat("device ", dev_name, " stopped before node ",
                            NodeLabel(dead.tpl, dead.op_index, dead.node), " ran"),
                     {}});
        };
        while (!s.ready.empty()) fail(s.ready.Pop());
        std::vector<std::pair<uint64_t, uint32_t>> pending;  // (node, item), by node
        for (uint32_t i = 0; i < s.items.size(); ++i) {
          if (s.items[i].waiting > 0) pending.emplace_back(s.items[i].node.value(), i);
        }
        std::sort(pending.begin(), pending.end());
        for (const auto& [node, item] : pending) fail(item);
        s.num_pending = 0;
        s.live.clear();
        s.exited = true;
        MaybeWakeOwner(di);  // it holds no work now
        mu_.Unlock();
        return;
      }
      item = s.next;
      if (item != kNoItem) {
        s.next = kNoItem;
        ++fast_path_ops_;
      } else {
        item = s.ready.Pop();
      }
      wp = &s.items[item];
      WorkItem& w = *wp;
      // A node dropped before it ran: its slot is emptied (its input
      // references released, under the lock as before) and freed.
      auto drop = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        boundary = Timestamp::Never();
        WorkItem dead = TakeItem(s, item);
        s.live.erase(dead.node.value());
        DropDependents(d, dead.node, std::move(dead.dependents));
      };
      if (w.cancelled) {
        drop();
        continue;
      }
      // Outputs and workspace first: a node that cannot get its memory
      // fails here, before it starts.
      // One pool critical section for all of them (same order, accounting
      // and failures as one Allocate() each).
      const size_t n_out = w.output_bytes.size();
      requests.clear();
      for (Bytes b : w.output_bytes) requests.push_back({b, AllocPurpose::kOutput});
      requests.push_back({w.workspace, AllocPurpose::kWorkspace});
      allocs.resize(requests.size());  // empty: the last pass moved them all out
      const absl::Status alloc = pool.AllocateEach(requests, std::span<Allocation>(allocs.data(), allocs.size()));
      if (alloc.ok()) {
        workspace = std::move(allocs[n_out]);
      } else {
        allocs.clear();  // releases what was allocated before the failure
        Post(Event{Event::Kind::kFailed, w.node, d, Timestamp(),
                   StrCat("node ", NodeLabel(w.tpl, w.op_index, w.node),
                          ": memory allocation failed: ", alloc.message()),
                   {}});
        drop();
        continue;
      }
      // The start is recorded with the node's completion (one record per
      // operator); until then the owner reads it here (see Drain()).
      s.running = w.node;
      // (vDSO: no system call.) Stored only when it changes: the owner reads
      // it per nap, and a store would take the line back from its cache.
      if (const int on = sched_getcpu(); device_cpu_[di].cpu.load(std::memory_order_relaxed) != on) {
        device_cpu_[di].cpu.store(on, std::memory_order_relaxed);
      }
      s.running_start = boundary.is_never() ? clock_->Now() : boundary;
      boundary = Timestamp::Never();
      s.running_seq = seq_++;
      started_at = s.running_start;
      started_seq = s.running_seq;
      // An owner waiting for any event (WaitForCompletion) hears of the
      // start when it blocks; one waiting for completions (the daemon's
      // loop included) does not.
      start_unseen_.store(true, std::memory_order_relaxed);
      if (owner_wait_.load(std::memory_order_relaxed) == OwnerWait::kEvent) MaybeWakeOwner(di);
    }
    mu_.Unlock();
    handed_back.clear();  // frees what the owner handed back, on this thread
    WorkItem& w = *wp;  // this thread's alone until its slot is freed

    // The kernel runs without the lock.
    // Filled in place, not push_back(): the owner's QueueOne pushes into a
    // vector of the same type (WorkItem::inputs), which gets the compiler to
    // call push_back out of line here too.
    out_buffers.resize(w.output_bytes.size());
    for (size_t i = 0; i < out_buffers.size(); ++i) {
      out_buffers[i] = Buffer{w.output_bytes[i], d, kNoPayload, nullptr};
    }
    KernelCall call;
    call.node = w.node;
    call.instance = w.instance;
    call.tpl = w.tpl;
    call.op_index = w.op_index;
    call.attrs = std::span<const int64_t>(w.attrs);
    call.device = d;
    call.inputs = std::span<const Buffer>(w.inputs);
    call.outputs = std::span<Buffer>(out_buffers);
    call.workspace = workspace.bytes();
    absl::Status st;
    try {
      st = kernels_->Run(call);
    } catch (const std::exception& e) {
      st = absl::InternalError(StrCat("kernel threw: ", e.what()));
    } catch (...) {
      st = absl::InternalError("kernel threw a non-standard exception");
    }
    // The kernel evicted the item, and the finish reads (and writes) all of
    // its lines: fetched while the workspace goes back to its pool and the
    // lock is taken, not one miss after another.
    for (size_t at = 0; at < sizeof(WorkItem); at += ABSL_CACHELINE_SIZE) {
      __builtin_prefetch(reinterpret_cast<const char*>(&w) + at, /*rw=*/1);
    }
    workspace.Release();
    // Drop this thread's input references before taking the lock.
    w.inputs.clear();

    mu_.Lock();
    if (!may_finish()) mu_.Await(absl::Condition(&may_finish));
    DeviceState& s = devices_[di];
    s.running = NodeId();
    if (st.ok() && s.stopped) {
      st = absl::AbortedError(StrCat("device ", dev_name, " stopped while the node ran"));
    }
    if (st.ok()) {
      // Keep the outputs' buffers (not their allocations) for dependents on
      // this device until the owner has applied this completion. Built in
      // place (the table entry and the record): nothing per operator is
      // moved or destroyed twice. Neither container changes size until the
      // record is published, so both references stay valid.
      for (size_t i = 0; i < out_buffers.size(); ++i) {
        // The kernel fills kind and payload; size and place are the node's.
        out_buffers[i].bytes = w.output_bytes[i];
        out_buffers[i].device = d;
      }
      LocalDone& done = s.done[item];
      w.done = true;
      done.outputs = out_buffers;
      done.end = clock_->Now();
      boundary = done.end;
      done.unread = std::move(w.readers);  // (not read again)
      // Quiet when every successor was here, waiting for this node (the
      // owner is needed only where the work leaves the device).
      const int released = ReleaseDependents(d, w, done.end, done.outputs);
      ReleaseConsumed(d, w, &handed_back);
      // Stamped with the time the dependents saw.
      Event& fin = s.records.emplace_back();
      fin.kind = Event::Kind::kFinished;
      fin.node = w.node;
      fin.device = d;
      fin.time = done.end;
      const size_t n_out = out_buffers.size();
      fin.outputs.resize(n_out);
      for (size_t i = 0; i < n_out; ++i) {
        fin.outputs[i].buffer = std::move(out_buffers[i]);
        fin.outputs[i].alloc = std::move(allocs[i]);
      }
      fin.quiet = w.successors > 0 && released == w.successors;
      fin.hands_off = w.hands_off;
      fin.started = true;
      fin.start = started_at;
      fin.start_seq = started_seq;
      fin.item = item;
      Publish(di, /*stamp=*/false);
    } else {
      allocs.clear();  // the outputs' allocations
      Event failed{Event::Kind::kFailed, w.node, d, Timestamp(),
                   StrCat("node ", NodeLabel(w.tpl, w.op_index, w.node), " on ", dev_name, ": ",
                          st.message()),
                   {}};
      failed.started = true;
      failed.start = started_at;
      failed.start_seq = started_seq;
      Post(std::move(failed));
      DropDependents(d, w.node, std::move(w.dependents));
      // Not live any more (see DeviceState::live): the owner erases its
      // entry when it drains the record, not this thread.
      w.node = NodeId();
      s.free_items.push_back(item);
    }
    // A finished node keeps its slot (done) until the owner applied it.
    // The lock stays held: the next iteration picks the next node.
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

bool ExecutorSet::OwnerWaitSatisfied() const {
  switch (owner_wait_.load(std::memory_order_relaxed)) {
    case OwnerWait::kNone:
      return false;
    case OwnerWait::kEvent:
      return num_records_.load(std::memory_order_relaxed) > 0 || start_unseen_.load(std::memory_order_relaxed);
    case OwnerWait::kCompletions: {
      const size_t pending = pending_completions_.load(std::memory_order_relaxed);
      return pending >= owner_wait_min_.load(std::memory_order_relaxed) ||
             (pending > 0 && busy_devices_.load(std::memory_order_relaxed) == 0);
    }
  }
  return false;
}

bool ExecutorSet::NoteWork(DeviceState& s) {
  const bool busy = s.next != kNoItem || !s.ready.empty() || s.num_pending > 0 || s.running.valid();
  if (busy == s.busy) return false;
  s.busy = busy;
  AddLocked(busy_devices_, busy ? 1 : -1);
  return !busy;
}

void ExecutorSet::MaybeWakeOwner(size_t d, bool urgent) {
  const bool went_idle = NoteWork(devices_[d]);
  // Pairs with the fence in OwnerSleepUntil()/OwnerSleeps(): either the
  // owner sees what this thread published, or this thread sees it asleep.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  const OwnerSleep sleep = owner_sleep_.load(std::memory_order_acquire);
  if (sleep == OwnerSleep::kAwake || !OwnerWaitSatisfied()) return;
  // Napping, the owner looks again within owner_nap_ by itself.
  if (sleep == OwnerSleep::kNapping && !urgent && !went_idle) return;
  OwnerSleep expected = sleep;  // one wake per sleep
  if (!owner_sleep_.compare_exchange_strong(expected, OwnerSleep::kAwake, std::memory_order_acq_rel)) return;
  owner_wakes_.fetch_add(1, std::memory_order_relaxed);
  if (notify_) {
    notify_();
    return;
  }
  if (sleep == OwnerSleep::kBlocked) {
    // Under mu_: the owner wakes when this thread releases mu_ (absl moves
    // it to mu_'s queue), not to block on mu_ at once.
    owner_blocked_cv_.Signal();
    return;
  }
  absl::MutexLock l(&owner_mu_);
  owner_woken_ = true;
  owner_cv_.Signal();
}

bool ExecutorSet::OwnerBesideADevice() const {
  const int cpu = sched_getcpu();
  if (cpu < 0) return false;
  for (size_t d = 0; d < pools_.size(); ++d) {
    if (device_cpu_[d].cpu.load(std::memory_order_relaxed) == cpu) return true;
  }
  return false;
}

ExecutorSet::OwnerSleep ExecutorSet::OwnerSleepMode() const {
  const bool nap = owner_nap_ > absl::ZeroDuration() && busy_devices_.load(std::memory_order_relaxed) > 0 &&
                   !OwnerBesideADevice();
  return nap ? OwnerSleep::kNapping : OwnerSleep::kBlocked;
}

void ExecutorSet::OwnerSleepUntil(absl::Time until, OwnerSleep mode) {
  if (mode == OwnerSleep::kBlocked) {
    // On the set's lock: the device threads that wake
    // it hold that lock anyway (the caller loops on spurious returns).
    absl::MutexLock l(&mu_);
    owner_sleep_.store(mode, std::memory_order_relaxed);
    if (!OwnerWaitSatisfied()) owner_blocked_cv_.WaitWithDeadline(&mu_, until);
    owner_sleep_.store(OwnerSleep::kAwake, std::memory_order_relaxed);
    return;
  }
  absl::MutexLock l(&owner_mu_);
  owner_woken_ = false;
  owner_sleep_.store(mode, std::memory_order_release);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (!OwnerWaitSatisfied()) {
    // WaitWithDeadline returns true once `until` passes.
    while (!owner_woken_ && !owner_cv_.WaitWithDeadline(&owner_mu_, until)) {
    }
  }
  owner_sleep_.store(OwnerSleep::kAwake, std::memory_order_relaxed);
}

bool ExecutorSet::OwnerWaitFor(OwnerWait kind, size_t min_completions, absl::Duration timeout,
                               absl::Duration spin) {
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + timeout;
  const absl::Time spin_until = start + std::min(spin, timeout);
  owner_wait_min_.store(min_completions, std::memory_order_relaxed);
  owner_wait_.store(kind, std::memory_order_relaxed);
  bool ok = false;
  bool polled = false;  // the last look was a poll, not a sleep
  for (;;) {
    if (OwnerWaitSatisfied()) {
      ok = true;
      if (polled) {
        // Seen at once, the completion's device thread still holds mu_
        // (its finish goes on to pick its next node or to wait), and the
        // drain that follows would sleep on mu_ and be woken by that
        // thread's unlock: the wake-up the poll avoided. Poll for mu_ too.
        const absl::Time until = absl::Now() + absl::Microseconds(100);
        for (int i = 0; !mu_.TryLock(); ++i) {
          if ((i & 15) == 15 && absl::Now() >= until) {
            mu_.Lock();
            break;
          }
          for (int k = 0; k < 64; ++k) CpuRelax();
        }
        mu_.Unlock();
      }
      break;
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) break;
    // No lock here: the owner never waits for a device thread's critical
    // section (and never needs that thread's unlock to wake it).
    const OwnerSleep mode = OwnerSleepMode();
    polled = mode == OwnerSleep::kNapping && now < spin_until;
    if (polled) {
      // Polling (see WaitForFinishBatch): awake, so no device wakes it.
      for (int i = 0; i < 64; ++i) CpuRelax();
      continue;
    }
    OwnerSleepUntil(mode == OwnerSleep::kNapping ? std::min(deadline, now + owner_nap_) : deadline, mode);
  }
  owner_wait_.store(OwnerWait::kNone, std::memory_order_relaxed);
  return ok;
}

bool ExecutorSet::WaitForCompletion(absl::Duration timeout) {
  if (comm_.num_retrying() > 0) return true;
  return OwnerWaitFor(OwnerWait::kEvent, 0, timeout, absl::ZeroDuration());
}

bool ExecutorSet::WaitForFinish(absl::Duration timeout) {
  if (comm_.num_retrying() > 0) return true;
  return OwnerWaitFor(OwnerWait::kCompletions, 1, timeout, absl::ZeroDuration());
}

bool ExecutorSet::WaitForFinishBatch(absl::Duration timeout, int min_completions, absl::Duration spin) {
  if (comm_.num_retrying() > 0) return true;
  return OwnerWaitFor(OwnerWait::kCompletions, static_cast<size_t>(std::max(min_completions, 1)), timeout,
                      spin);
}

void ExecutorSet::OwnerSleeps() {
  owner_wait_min_.store(1, std::memory_order_relaxed);
  owner_wait_.store(OwnerWait::kCompletions, std::memory_order_relaxed);
  owner_sleep_.store(OwnerSleepMode(), std::memory_order_release);
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

void ExecutorSet::OwnerAwake() {
  owner_sleep_.store(OwnerSleep::kAwake, std::memory_order_relaxed);
  owner_wait_.store(OwnerWait::kNone, std::memory_order_relaxed);
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
