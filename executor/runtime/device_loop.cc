// ExecutorSet's device threads: one per device, each picking its next ready
// node, allocating its outputs, running its kernel without the lock and
// recording its finish (executor.h: "Device threads").
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

// Per-operator scratch, kept across operators (no per-operator construction
// and destruction): the pool requests, their allocations (outputs, then
// workspace; the outputs' move to the record at the finish) and the output
// buffers the kernel fills.
struct ExecutorSet::DeviceScratch {
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
};

namespace {

// Pins the calling thread to `cpu` (best effort; a negative one: unpinned).
void PinToCpu(int cpu) {
  if (cpu >= 0 && cpu < CPU_SETSIZE) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    (void)pthread_setaffinity_np(pthread_self(), sizeof(set), &set);  // best effort
  }
}

}  // namespace

[[gnu::always_inline]] inline void ExecutorSet::CollectHandedBack(DeviceState& s, DeviceScratch& x) {
  if (s.graveyard.empty()) return;
  if (x.handed_back.empty()) {
    x.handed_back.swap(s.graveyard);
  } else {  // kept from a pass that skipped its operator with the lock held
    std::move(s.graveyard.begin(), s.graveyard.end(), std::back_inserter(x.handed_back));
    s.graveyard.clear();
  }
  s.graveyard_bytes = 0;
}

[[gnu::always_inline]] inline bool ExecutorSet::AllocateMemory(DeviceId d, DevicePool& pool, const WorkItem& w,
                                                               DeviceScratch& x, Allocation& workspace) {
  // One pool critical section for all of them (same order, accounting
  // and failures as one Allocate() each).
  const size_t n_out = w.output_bytes.size();
  x.requests.clear();
  for (Bytes b : w.output_bytes) x.requests.push_back({b, AllocPurpose::kOutput});
  x.requests.push_back({w.workspace, AllocPurpose::kWorkspace});
  x.allocs.resize(x.requests.size());  // empty: the last pass moved them all out
  const absl::Status alloc =
      pool.AllocateEach(x.requests, std::span<Allocation>(x.allocs.data(), x.allocs.size()));
  if (alloc.ok()) {
    workspace = std::move(x.allocs[n_out]);
    return true;
  }
  x.allocs.clear();  // releases what was allocated before the failure
  Post(Event{Event::Kind::kFailed, w.node, d, Timestamp(),
             StrCat("node ", NodeLabel(w.tpl, w.op_index, w.node),
                    ": memory allocation failed: ", alloc.message()),
             {}});
  return false;
}

[[gnu::always_inline]] inline void ExecutorSet::NoteStart(size_t di, DeviceState& s, const WorkItem& w,
                                                          DeviceScratch& x) {
  // The start is recorded with the node's completion (one record per
  // operator); until then the owner reads it here (see Drain()).
  s.running = w.node;
  // (vDSO: no system call.) Stored only when it changes: the owner reads
  // it per nap, and a store would take the line back from its cache.
  if (const int on = sched_getcpu(); device_cpu_[di].cpu.load(std::memory_order_relaxed) != on) {
    device_cpu_[di].cpu.store(on, std::memory_order_relaxed);
  }
  s.running_start = x.boundary.is_never() ? clock_->Now() : x.boundary;
  x.boundary = Timestamp::Never();
  s.running_seq = seq_++;
  x.started_at = s.running_start;
  x.started_seq = s.running_seq;
  // An owner waiting for any event (WaitForCompletion) hears of the
  // start when it blocks; one waiting for completions (the daemon's
  // loop included) does not.
  start_unseen_.store(true, std::memory_order_relaxed);
  if (owner_wait_.load(std::memory_order_relaxed) == OwnerWait::kEvent) MaybeWakeOwner(di);
}

void ExecutorSet::DeviceLoop(DeviceId d, int cpu) {
  PinToCpu(cpu);
  const size_t di = d.value();
  DevicePool& pool = *pools_[di];
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
  DeviceScratch x;
  mu_.Lock();
  for (;;) {
    // The item runs in its slot (no per-operator move; see
    // DeviceState::items), which stays off the free list until its finish.
    uint32_t item = kNoItem;
    WorkItem* wp = nullptr;
    Allocation workspace;
    {
      if (!can_go()) {
        x.boundary = Timestamp::Never();
        if (!x.handed_back.empty()) {
          // Free what the last operator's finish released before waiting.
          mu_.Unlock();
          x.handed_back.clear();
          mu_.Lock();
          continue;
        }
        // Running dry (or paused): an owner waiting for this device to hold
        // no work may be satisfied now without an event (a cancelled node
        // was dropped).
        MaybeWakeOwner(di);
        mu_.Await(absl::Condition(&can_go));
      }
      CollectHandedBack(devices_[di], x);
      if (shutdown_) {
        mu_.Unlock();
        return;
      }
      DeviceState& s = devices_[di];
      if (!s.stopped && (paused_ || (s.next == kNoItem && s.ready.empty()))) {
        // Woken only to free what was handed back.
        x.boundary = Timestamp::Never();
        mu_.Unlock();
        x.handed_back.clear();
        mu_.Lock();
        continue;
      }
      if (s.stopped) {
        FailStopped(d);
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
        x.boundary = Timestamp::Never();
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
      if (!AllocateMemory(d, pool, w, x, workspace)) {
        drop();
        continue;
      }
      NoteStart(di, s, w, x);
    }
    mu_.Unlock();
    x.handed_back.clear();  // frees what the owner handed back, on this thread
    WorkItem& w = *wp;  // this thread's alone until its slot is freed

    absl::Status st = RunKernel(d, w, workspace.bytes(), x);
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
    RecordFinish(d, item, w, std::move(st), x);
    // A finished node keeps its slot (done) until the owner applied it.
    // The lock stays held: the next iteration picks the next node.
  }
}

void ExecutorSet::FailStopped(DeviceId d) {
  // Everything still queued or pending here fails (producers first); the
  // thread then exits.
  const size_t di = d.value();
  DeviceState& s = devices_[di];
  if (s.next != kNoItem) {
    s.ready.Push(s.items[s.next].key, s.next);
    s.next = kNoItem;
  }
  auto fail = [&](uint32_t item) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const WorkItem dead = TakeItem(s, item);
    Post(Event{Event::Kind::kFailed, dead.node, d, Timestamp(),
               StrCat("device ", pools_[di]->name(), " stopped before node ",
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
}

absl::Status ExecutorSet::RunKernel(DeviceId d, const WorkItem& w, Bytes workspace, DeviceScratch& x) {
  // Filled in place, not push_back(): the owner's QueueOne pushes into a
  // vector of the same type (WorkItem::inputs), which gets the compiler to
  // call push_back out of line here too.
  x.out_buffers.resize(w.output_bytes.size());
  for (size_t i = 0; i < x.out_buffers.size(); ++i) {
    x.out_buffers[i] = Buffer{w.output_bytes[i], d, kNoPayload, nullptr};
  }
  KernelCall call;
  call.node = w.node;
  call.instance = w.instance;
  call.tpl = w.tpl;
  call.op_index = w.op_index;
  call.attrs = std::span<const int64_t>(w.attrs);
  call.device = d;
  call.inputs = std::span<const Buffer>(w.inputs);
  call.outputs = std::span<Buffer>(x.out_buffers);
  call.workspace = workspace;
  try {
    return kernels_->Run(call);
  } catch (const std::exception& e) {
    return absl::InternalError(StrCat("kernel threw: ", e.what()));
  } catch (...) {
    return absl::InternalError("kernel threw a non-standard exception");
  }
}

void ExecutorSet::RecordFinish(DeviceId d, uint32_t item, WorkItem& w, absl::Status st, DeviceScratch& x) {
  const size_t di = d.value();
  DeviceState& s = devices_[di];
  s.running = NodeId();
  if (st.ok() && s.stopped) {
    st = absl::AbortedError(StrCat("device ", pools_[di]->name(), " stopped while the node ran"));
  }
  if (!st.ok()) {
    x.allocs.clear();  // the outputs' allocations
    Event failed{Event::Kind::kFailed, w.node, d, Timestamp(),
                 StrCat("node ", NodeLabel(w.tpl, w.op_index, w.node), " on ", pools_[di]->name(), ": ",
                        st.message()),
                 {}};
    failed.started = true;
    failed.start = x.started_at;
    failed.start_seq = x.started_seq;
    Post(std::move(failed));
    DropDependents(d, w.node, std::move(w.dependents));
    // Not live any more (see DeviceState::live): the owner erases its
    // entry when it drains the record, not this thread.
    w.node = NodeId();
    s.free_items.push_back(item);
    return;
  }
  // Keep the outputs' buffers (not their allocations) for dependents on
  // this device until the owner has applied this completion. Built in
  // place (the table entry and the record): nothing per operator is
  // moved or destroyed twice. Neither container changes size until the
  // record is published, so both references stay valid.
  for (size_t i = 0; i < x.out_buffers.size(); ++i) {
    // The kernel fills kind and payload; size and place are the node's.
    x.out_buffers[i].bytes = w.output_bytes[i];
    x.out_buffers[i].device = d;
  }
  LocalDone& done = s.done[item];
  w.done = true;
  done.outputs = x.out_buffers;
  done.end = clock_->Now();
  x.boundary = done.end;
  done.unread = std::move(w.readers);  // (not read again)
  // Quiet when every successor was here, waiting for this node (the
  // owner is needed only where the work leaves the device).
  const int released = ReleaseDependents(d, w, done.end, done.outputs);
  ReleaseConsumed(d, w, &x.handed_back);
  // Stamped with the time the dependents saw.
  Event& fin = s.records.emplace_back();
  fin.kind = Event::Kind::kFinished;
  fin.node = w.node;
  fin.device = d;
  fin.time = done.end;
  const size_t n_out = x.out_buffers.size();
  fin.outputs.resize(n_out);
  for (size_t i = 0; i < n_out; ++i) {
    fin.outputs[i].buffer = std::move(x.out_buffers[i]);
    fin.outputs[i].alloc = std::move(x.allocs[i]);
  }
  fin.quiet = w.successors > 0 && released == w.successors;
  fin.hands_off = w.hands_off;
  fin.started = true;
  fin.start = x.started_at;
  fin.start_seq = x.started_seq;
  fin.item = item;
  Publish(di, /*stamp=*/false);
}

}  // namespace slicesched::executor
