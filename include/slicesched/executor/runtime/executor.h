// ExecutorSet: the per-device executors behind the ExecutionBackend interface.
//
// One std::thread per device runs that device's operators one at a time
// (docs/architecture.md, invariant 1), always the ready operator the shared queue
// discipline (ReadyQueue) puts first (invariant 2). Transfers go through the
// CommGraph (Intent -> Recv on the destination, which allocates first and is
// retried when that fails -> Send on the source), arbitrated by the shared
// rule each round, and run on transfer worker threads.
//
// Threading
//   The GMG has one owner thread: the thread that calls NodeIssued(),
//   Dispatch(), AdvanceTo(), WaitForCompletion(), Pause()/Resume() and
//   StopDevice(). Only it touches the GMG, the CommGraph and the tensor store.
//   Device threads and transfer workers never see the GMG: the owner hands
//   each ready (or locally ready, below) operator to its device as a
//   self-contained work item (inputs resolved to Buffers). Each device keeps
//   a record buffer (DeviceState::records): one record per operator (its
//   start and its end, or its failure) and per transfer ending there. The
//   owner drains the buffers in AdvanceTo() and makes every GMG call
//   (Start/Finish/Fail) itself, in posting order: every timestamp is read
//   under the lock together with a sequence number, so merging the buffers
//   by sequence number gives every start and completion in time order. A
//   node still running (or whose record is later than the drain's time) has
//   its start applied from the device's state (DeviceState::running_start),
//   so after Pause(), AdvanceTo(now) the GMG names the running operators.
//   A device thread takes the lock once per operator: the critical section
//   that records a node's completion goes on to pick the next node.
//
// Local readiness (dependency-driven devices)
//   A device does not wait for the owner to learn that an operator finished
//   before it runs that operator's successors on the same device. When the
//   owner hands over an operator whose every op input either has a copy on
//   the device (producer done in the GMG) or comes from a producer on the same
//   device that was already handed to it (queued, pending or running; plain
//   outputs only, not retained or checkpoint growth), and whose checkpoint
//   inputs satisfy the GMG's rule already, it hands the item over "pending on
//   local producers" (WorkItem::local). Under the lock, each local producer is
//   then
//     - finished here but not yet applied by the owner (its slot is done,
//       DeviceState::done holds its outputs): the input is resolved at once
//       from its output buffers;
//     - live here (DeviceState::live: queued, pending or running): the item
//       waits for it (listed in the producer's WorkItem::dependents);
//     - neither: it failed or was dropped, so the item fails too.
//   When a device thread finishes a producer it resolves its waiters' inputs
//   from the buffers it just produced and pushes those whose last producer
//   this was onto its ReadyQueue with ready time = that finish time (what the
//   GMG records as their ready time). When a producer fails, is cancelled or
//   dropped, its pending dependents are failed in turn (kFailed events, after
//   the producer's own, so the instance's failure names the producer).
//   Whenever the owner queues a compute node it also tries that node's
//   successors on the same device, so a whole same-device chain is handed
//   over at once. The owner still makes every GMG call, in time order: a
//   dependent's start is stamped after its producer's end, so the GMG sees
//   exactly the history it saw before, only later.
//   Local-successor fast path: when a finish makes a dependent ready and the
//   queue discipline would pick it next (nothing queued runs before it, a
//   newly queued higher-priority operator included), the device keeps it as
//   its next item (DeviceState::next) and runs it without the ReadyQueue
//   round trip, in the same critical section; the owner is not involved.
//   The owner frees a finished node's slot (and its DeviceState::done
//   entry) once it has applied its kFinished (from then on the GMG says the producer is done and inputs come
//   from the tensor store). Output buffers still travel to the owner with
//   kFinished and are accounted as before; a dependent holds only Buffer
//   copies (payload references), never an Allocation.
//
// Memory: outputs and workspace are allocated from the device's DevicePool
// before the kernel runs (failure: the node fails with the pool's reason);
// workspace is released when the kernel returns; outputs live in the
// owner's tensor store, keyed by (producer node, output) and device, until
// the GMG frees the tensor (its last consumer is done), mirroring the GMG's
// accounting. Retained outputs move to a checkpoint store and are released
// when the GMG no longer knows the checkpoint. Weights are not charged to the
// pools (the GMG accounts for them).
//
// Feedback: one record per completed operator or transfer, with the
// master's hand-off gap of cross-device hops (Feedback::handoff: launch gap
// on transfers, delivery gap on operators fed by one), measured from the GMG
// times the owner applies.
//
// Time: execution is real (or driven by the kernels on a ManualClock); every
// timestamp comes from the injected Clock. The owner blocks in one of the
// waits below instead of sleeping.
//
// Owner waits (WaitForCompletion, WaitForFinish[Batch], and OwnerSleeps()
// for an owner that blocks elsewhere)
//   Waking a thread that sleeps on another CPU costs the waker far more than
//   the futex call: on this project's KVM guests an inter-processor
//   interrupt, ~40 us of the device thread's CPU per wake with the LibTorch
//   kernels (docs/design/executor.md).
//   So device threads do not wake the owner per completion. While any device
//   holds work, the owner naps: it sleeps at most ExecutorOptions::owner_nap
//   at a time on its own timer (owner_mu_/owner_cv_, never the set's lock)
//   and, awake, looks at counters the devices publish (atomics, no lock).
//   Except beside a device: when the owner runs on the CPU a device thread
//   last ran on (each device publishes sched_getcpu() per operator), its
//   timer would preempt that device mid-kernel at every nap (measured: far
//   dearer than a wake, docs/design/executor.md), while a wake
//   on the same CPU is cheap; it then blocks and is woken per event
//   ("blocked": every event its wait is satisfied by). With no device
//   holding work it blocks until its deadline. A device thread (or transfer
//   worker) reads the atomic sleep state (awake / napping / blocked) after
//   publishing its event (no extra lock: it already holds the set's lock)
//   and wakes the owner, once per sleep, when what the owner waits for holds
//   and the owner is blocked, or, napping, when progress needs it now:
//     - the device goes idle (busy -> not busy): it waits for the owner;
//     - an operator fails, a transfer ends or fails;
//     - an operator completes whose successors leave the device (a transfer
//       node, or a node on another device): that hop needs the owner
//       (transfer arbitration, then the consumer's hand-over), the devices
//       do not pass work to each other.
//   Every other completion (the end of an instance, a successor not held by
//   the device yet, a start) waits for the end of the owner's nap: the
//   owner adds at most owner_nap (plus the kernel's timer slack, ~50 us) to
//   its latency, and the device, busy with its next operator, loses nothing.
//   owner_nap = 0: no naps; the owner sleeps until a device wakes it for
//   every event that satisfies its wait (one wake per
//   completion or batch). owner_wakes() counts the wakes.
//   Where it expects the completion soon (WaitForFinishBatch's `spin`), an
//   owner that would nap polls instead: a nap's end or a wake reaches an
//   idle virtual CPU only ~0.1 ms later on this project's VMs. Having seen
//   the completion, it polls for the set's lock too (the device thread
//   still holds it, finishing), rather than sleeping on it and being woken
//   by that thread's unlock (docs/design/executor.md).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/optimization.h"
#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "slicesched/comm/comm_graph.h"
#include "slicesched/common/clock.h"
#include "slicesched/common/thread_pool.h"
#include "slicesched/executor/runtime/kernel.h"
#include "slicesched/executor/runtime/memory_pool.h"
#include "slicesched/gmg/gmg.h"
#include "slicesched/backend/backend.h"
#include "slicesched/sim/queue_discipline.h"

namespace slicesched::executor {

struct ExecutorOptions {
  // Per-device pool capacity; empty: each device's AcceleratorSet memory.
  std::vector<Bytes> capacities;
  // Transfer worker threads; 0: one per two devices (the most that can run).
  int transfer_threads = 0;
  // Per device, the CPU its thread is pinned to (sched affinity); missing or
  // negative: not pinned. A CPU device thread that the master's wake-ups may
  // not preempt keeps its caches; an invalid CPU leaves the thread unpinned.
  std::vector<int> device_cpus;
  // The owner's nap while a device holds work (see "Owner waits"): the most
  // an owner wait adds to the latency of a completion the owner is not woken
  // for. Zero: woken for every completion it waits for.
  absl::Duration owner_nap = kDefaultOwnerNap;
  static constexpr absl::Duration kDefaultOwnerNap = absl::Microseconds(100);
};

class ExecutorSet final : public ExecutionBackend {
 public:
  // An idle device thread wakes to free the payloads handed back to it (see
  // DeviceState::graveyard) once this many bytes have piled up; a busy one
  // frees them before its next operator.
  static constexpr int64_t kGraveyardWakeBytes = int64_t{64} << 20;

  // `gmg`, `clock`, `kernels` and `transfers` must outlive the set. Starts
  // one thread per device of the GMG's accelerator set.
  ExecutorSet(GlobalMappingGraph* gmg, const Clock* clock, KernelRunner* kernels,
              TransferBackend* transfers, ExecutorOptions options = {});
  // Stops and joins every thread (running kernels finish first). Pending
  // work is abandoned, not reported to the GMG; every buffer is released.
  ~ExecutorSet() override;
  ExecutorSet(const ExecutorSet&) = delete;
  ExecutorSet& operator=(const ExecutorSet&) = delete;

  // ---- ExecutionBackend (owner thread) -----------------------------------
  void NodeIssued(NodeId node) override;
  // Releases buffers the GMG has freed and runs one transfer arbitration
  // round (Recv allocation, then Send). Completions are applied only by
  // AdvanceTo(), which has a feedback sink; ready operators are queued on
  // their devices as soon as they become ready.
  absl::Status Dispatch(Timestamp now) override;
  Timestamp NextEventTime() const override;
  // Applies every completion posted at or before `t` (in time order) to the
  // GMG, appends feedback, then dispatches.
  absl::Status AdvanceTo(Timestamp t, std::vector<Feedback>* feedback) override;

  // ---- owner-thread extras ------------------------------------------------
  // Blocks until an event is pending (true) or `timeout` passes (false):
  // a record (the finish or failure of an operator, a transfer's end) or a
  // start since the last drain (starts are not records of their own; see
  // "Threading"). Returns true at once while Recv retries are waiting.
  bool WaitForCompletion(absl::Duration timeout);
  // The same, but only for events the owner has to act on: a failure, a
  // transfer's end, or the completion of an operator whose every successor
  // its device already held and released locally (see "Local readiness")
  // does not end the wait, nor does a start. It returns once an operator
  // completes that ends its instance, feeds another device, or has a
  // successor the device did not hold yet (or while Recv retries wait). A
  // same-device chain thus wakes the owner once, at its end, instead of
  // twice per operator; the quiet events reach the GMG, in time order, with
  // the next AdvanceTo() (which a Pause()/AdvanceTo() pair still forces).
  bool WaitForFinish(absl::Duration timeout);
  // WaitForFinish(timeout), but returns only once `min_completions` such
  // completions are pending, or at least one is and no device holds queued,
  // pending or running work (so a caller cannot wait for completions that
  // will not come). An owner that keeps several instances in flight
  // retires them in batches (and, with owner_nap = 0, is woken
  // min_completions times less often).
  //
  // `spin`: for up to this long the owner polls instead of napping (while
  // it would nap: not beside a device), so the completion it waits for is
  // seen at once, without a wake-up of its CPU (on a VM, an interrupt to a
  // halted virtual CPU: ~0.1 ms; see "Owner waits"). Worth it only where
  // that completion is expected within about `spin` (e.g. the last
  // instance in flight); the polling costs the owner's CPU.
  bool WaitForFinishBatch(absl::Duration timeout, int min_completions,
                          absl::Duration spin = absl::ZeroDuration());
  // An owner that waits on something else too (the daemon's command queue)
  // sets this and blocks on its own wait: between OwnerSleeps() and
  // OwnerAwake() the notifier is called (once) where WaitForFinish would be
  // woken (see "Owner waits"), from a device thread or transfer worker with
  // the set's internal lock held, so it must be cheap and must not call
  // back into the ExecutorSet. Set it before issuing work.
  void SetEventNotifier(std::function<void()> notify) { notify_ = std::move(notify); }
  // The owner is about to block on its own wait (with the notifier set):
  // call before NextEventTime(), which then says how long it may block (the
  // nap while a device holds work). OwnerAwake() when it wakes.
  void OwnerSleeps();
  void OwnerAwake();
  // Wakes device threads (or transfer workers) gave the owner (any thread).
  int64_t owner_wakes() const { return owner_wakes_.load(std::memory_order_relaxed); }
  // Whether the owner sleeps in a wait now, and whether it naps there (any
  // thread; for tests).
  bool owner_asleep() const { return owner_sleep_.load(std::memory_order_acquire) != OwnerSleep::kAwake; }
  bool owner_napping() const { return owner_sleep_.load(std::memory_order_acquire) == OwnerSleep::kNapping; }
  // Whether the owner is inside one of the waits (asleep or polling).
  bool owner_waiting() const { return owner_wait_.load(std::memory_order_acquire) != OwnerWait::kNone; }
  // Stops device `d`'s thread: its running node (once its kernel returns)
  // and its queued nodes fail with a reason, as does anything later queued
  // on it or any transfer touching it.
  void StopDevice(DeviceId d);
  bool device_stopped(DeviceId d) const;
  // Pause hook: while paused, no device thread starts or finishes a node and
  // no transfer completes (kernels already running go on, but their
  // completion waits). After Pause(), AdvanceTo(now) brings the GMG up to
  // date (it drains every device's records and applies the starts of the
  // running nodes), and then the GMG and RunningNow() agree until Resume().
  void Pause();
  void Resume();

  // ---- observation (any thread) -------------------------------------------
  // The node each device's thread runs now (invalid when idle), by device.
  std::vector<NodeId> RunningNow() const;
  DevicePool& pool(DeviceId d) { return *pools_[d.value()]; }
  const DevicePool& pool(DeviceId d) const { return *pools_[d.value()]; }
  size_t num_devices() const { return pools_.size(); }

  // ---- owner-thread statistics --------------------------------------------
  const CommGraph& comm() const { return comm_; }
  int64_t completed_ops() const { return completed_ops_; }
  int64_t completed_transfers() const { return completed_transfers_; }
  int64_t failed_nodes() const { return failed_nodes_; }
  // Operators the devices ran through the local-successor fast path (any
  // thread).
  int64_t fast_path_ops() const {
    absl::MutexLock l(&mu_);
    return fast_path_ops_;
  }
  // Buffers held in the tensor and checkpoint stores.
  size_t stored_tensors() const;
  // What the stores hold now, sorted and without duplicates: one entry per
  // (producer node, output, device) of the tensor store, and one per
  // (checkpoint, device) of the checkpoint store (output -1; a checkpoint's
  // growth buffers on its device collapse into one entry). Outputs still
  // travelling to the owner (a device finished the node, the owner has not
  // applied it) are not in the stores yet: Pause() and AdvanceTo() first to
  // compare with the GMG.
  struct StoredBuffer {
    uint64_t id = 0;      // producer NodeId, or CheckpointId when output < 0
    int32_t output = -1;
    uint16_t device = 0;
    auto operator<=>(const StoredBuffer&) const = default;
  };
  std::vector<StoredBuffer> StoredBuffers() const;

 private:
  struct Held {
    Buffer buffer;
    Allocation alloc;
  };
  // Per-operator containers are inlined at the sizes operators have (a
  // Llama serving op has at most 2 inputs and 2 outputs; the training
  // step's loss and optimizer spill to the heap, once per step), so that
  // the device thread's path between kernels allocates nothing: every heap
  // block a WorkItem, an Event or a LocalDone carried was allocated on one
  // thread and freed on the other, a glibc arena round trip per block per
  // operator.
  using Outputs = absl::InlinedVector<Held, 2>;
  using OutputBuffers = absl::InlinedVector<Buffer, 2>;
  // A ready operator, self-contained for its device thread. Nearly every
  // field is read once per operator by whichever thread touches the item
  // first (the pick, the kernel call, the finish, a producer's finish
  // releasing it), so what counts is the number of cache lines it spans:
  // it starts on a line of its own and the inline capacities are the
  // operators' (see Outputs above), 5 lines instead of the 7 or 8 a 408-byte
  // item spanned. Fields a producer's finish reads in a dependent (node,
  // waiting, key, local, then the inputs it fills) come first.
  struct alignas(ABSL_CACHELINE_SIZE) WorkItem {
    NodeId node;
    InstanceId instance;
    const GraphTemplate* tpl = nullptr;
    int op_index = -1;
    // Inputs still to come from producers on this device (see "Local
    // readiness"): how many of them have not finished yet.
    int waiting = 0;
    // The node's successors (template ops): when the device releases that
    // many local dependents at its finish, the owner need not wake for it.
    int successors = 0;
    // Set by the owner (lock held) once the instance failed or was
    // cancelled (CancelItems): the device drops the item instead of running
    // it. In the item, which the pick reads anyway, not behind a pointer: a
    // flag elsewhere is one more cache miss per operator.
    bool cancelled = false;
    // A successor is a transfer or runs on another device: the owner has to
    // act on this node's completion promptly (see "Owner waits").
    bool hands_off = false;
    // Finished here, its outputs in DeviceState::done[slot], and not yet
    // applied by the owner, who frees the slot when it drains the record.
    bool done = false;
    // Ready-queue key; for a pending item ready_ns is the latest finish time
    // of its local producers, final once the last one finished.
    DisciplineKey key;
    // The local inputs: which input slot, from which producer's output, and
    // the producer's item slot (set by Hand(): the finish of this item
    // reaches the producer's DeviceState::done entry by slot, not through a
    // table; the slot still names the producer until the owner applied it).
    // 16 bit indices keep the entry at 16 bytes (the item at 5 lines);
    // QueueOne resolves larger indices through the owner instead.
    struct LocalInput {
      NodeId producer;
      uint32_t item;
      uint16_t input;
      uint16_t output;
    };
    static constexpr size_t kMaxLocalIndex = 0xffff;
    absl::InlinedVector<LocalInput, 2> local;
    // Inline for the serving ops (one or two inputs: the hidden state, and a
    // decode group's KV cache); the training step's optimizer, which reads
    // every group's gradients, spills to the heap once per step.
    absl::InlinedVector<Buffer, 2> inputs;
    absl::InlinedVector<Bytes, 2> output_bytes;
    Bytes workspace;
    absl::InlinedVector<int64_t, 4> attrs;
    // Per output, how many inputs of the template's ops read it, when it is
    // a plain output (0 for retained outputs and checkpoint growth: never
    // released early; see ReleaseConsumed()).
    absl::InlinedVector<int32_t, 2> readers;
    // The items pending on this one (see "Local readiness"), by slot: its
    // finish resolves their inputs without a look-up in a table the owner
    // writes. Written by the owner, read by the device, both with the lock
    // held (never by the device thread running the item without it). A
    // dependent dropped meanwhile has left its slot (see Waits()).
    struct Dependent {
      uint32_t item;
      NodeId node;
    };
    absl::InlinedVector<Dependent, 2> dependents;
  };
  // A later field or a larger capacity that adds a cache line shows here.
  static_assert(sizeof(WorkItem) <= 5 * ABSL_CACHELINE_SIZE,
                "WorkItem spans more than 5 cache lines");
  struct Event {
    enum class Kind : uint8_t { kFinished, kFailed, kTransferDone, kTransferFailed };
    Kind kind;
    NodeId node;
    DeviceId device;
    Timestamp time;
    std::string reason;
    Outputs outputs;  // kFinished: the node's outputs; kTransferDone: the dst copy
    // kFinished whose successors all continued on the device (WaitForFinish
    // does not wake for it).
    bool quiet = false;
    // kFinished of a WorkItem::hands_off node.
    bool hands_off = false;
    // Operator records (kFinished, kFailed): whether the node started, when,
    // and the start's place in the posting order.
    bool started = false;
    Timestamp start;
    uint64_t start_seq = 0;
    // Place in the posting order (set by Post).
    uint64_t seq = 0;
    // kFinished of an operator: its item slot, done until the owner has
    // applied this record and frees it.
    uint32_t item = 0xffffffffu;
  };
  // Outputs of a node finished on its device whose kFinished the owner has
  // not applied yet.
  struct LocalDone {
    Timestamp end;
    OutputBuffers outputs;
    // Per output, the reads still to come from local dependents (from
    // WorkItem::readers); at 0 every reader ran here.
    absl::InlinedVector<int32_t, 2> unread;
  };
  static constexpr uint32_t kNoItem = 0xffffffffu;
  // Slots that never move once created (a device thread runs an item in its
  // slot without the lock while the owner appends more, lock held), in
  // chunks of 2^kChunkBits: an access is a shift, a mask and two loads.
  // (std::deque holds one 320-byte WorkItem per node and indexes through
  // its iterator arithmetic: ~15 instructions and two branches per access,
  // several accesses per operator.) Every slot of a chunk is constructed
  // with the chunk.
  template <typename T>
  class Slots {
   public:
    static constexpr size_t kChunkBits = 4;
    static constexpr size_t kChunk = size_t{1} << kChunkBits;
    T& operator[](size_t i) { return chunks_[i >> kChunkBits][i & (kChunk - 1)]; }
    const T& operator[](size_t i) const { return chunks_[i >> kChunkBits][i & (kChunk - 1)]; }
    size_t size() const { return size_; }
    // Appends a default-constructed slot; returns it.
    T& emplace_back() {
      if (size_ == chunks_.size() * kChunk) chunks_.push_back(std::make_unique<T[]>(kChunk));
      return (*this)[size_++];
    }
    void clear() {
      chunks_.clear();
      size_ = 0;
    }

   private:
    std::vector<std::unique_ptr<T[]>> chunks_;
    size_t size_ = 0;
  };
  struct DeviceState {
    DeviceState() = default;
    DeviceState(DeviceState&&) = default;  // (devices_ is sized once)
    DeviceState(const DeviceState&) = delete;
    ReadyQueue ready;
    // The fast path's next item (see "Local readiness"): set by a finish,
    // taken by the pick in the same critical section.
    uint32_t next = kNoItem;
    // This device's records for the owner, in posting order.
    std::vector<Event> records;
    // ReadyQueue / pending item -> work. Slots: the device thread runs an
    // item in its slot, without the lock, while the owner appends items. A
    // slot is reused (free_items)
    // only after its node failed or was dropped, or once the owner has
    // applied its finish.
    Slots<WorkItem> items;
    std::vector<uint32_t> free_items;
    // Nodes handed here, by item slot: queued, pending, running or finished
    // (WorkItem::done) while their slot still names them. A dropped node
    // leaves at once; a node that failed clears its slot's node; the owner
    // erases the entry when it drains the node's record, and frees a
    // finished node's slot then (the device thread does no hash-table work
    // on a table the owner writes for it).
    absl::flat_hash_map<uint64_t, uint32_t> live;
    // Items pending on local producers (WorkItem::waiting > 0).
    int num_pending = 0;
    // By item slot, beside `items`: the outputs of the slot's node once it
    // finished here (WorkItem::done) until the owner applies it. A slot, not
    // a table by node: the finish writes it and a dependent's finish reads
    // it without hashing (no per-operator insert, look-up and erase).
    Slots<LocalDone> done;
    // Payloads of this device's buffers the owner no longer needs, handed
    // back so that the device thread, not the owner, drops the last
    // reference (and frees the memory) before its next operator: the direct
    // loop frees its tensors on its own thread and reuses that memory, hot in
    // its cache and its allocator's thread cache; freed by the owner it would
    // cross cores both ways, every operator. An idle device frees them when
    // kGraveyardWakeBytes have piled up (or on exit).
    std::vector<std::shared_ptr<void>> graveyard;
    int64_t graveyard_bytes = 0;
    NodeId running;
    Timestamp running_start;
    uint64_t running_seq = 0;
    // Holds queued, pending or running work (counted in busy_devices_).
    bool busy = false;
    bool stopped = false;
    bool exited = false;
  };
  using TensorKey = std::pair<uint64_t, int>;  // (producer node, output)

  void DeviceLoop(DeviceId d, int cpu);
  // A device thread's per-operator scratch, kept across operators
  // (device_loop.cc).
  struct DeviceScratch;
  // DeviceLoop's steps: failing what a stopped device still holds, running
  // an item's kernel (without the lock), and recording its finish or
  // failure (the lock held, kept for picking the next item).
  void FailStopped(DeviceId d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status RunKernel(DeviceId d, const WorkItem& w, Bytes workspace, DeviceScratch& x);
  void RecordFinish(DeviceId d, uint32_t item, WorkItem& w, absl::Status st, DeviceScratch& x)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The per-operator steps before the kernel (lock held; inline, defined in
  // device_loop.cc): taking what the owner handed back into `x` (freed
  // after unlocking), getting the item's outputs and workspace (false: the
  // node failed, its event posted), and publishing its start.
  inline void CollectHandedBack(DeviceState& s, DeviceScratch& x) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  inline bool AllocateMemory(DeviceId d, DevicePool& pool, const WorkItem& w, DeviceScratch& x,
                             Allocation& workspace) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  inline void NoteStart(size_t di, DeviceState& s, const WorkItem& w, DeviceScratch& x)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues `e` for the owner, stamped with the clock's now unless `stamp`
  // is false (e.time is then already set).
  void Post(Event e, bool stamp = true) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Post() for a record already appended to device `d`'s records (built in
  // place there).
  void Publish(size_t d, bool stamp) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What the owner blocks on (WaitForCompletion / WaitForFinish[Batch]).
  enum class OwnerWait : uint8_t { kNone, kEvent, kCompletions };
  // Reads only atomics: the owner checks it without the set's lock.
  bool OwnerWaitSatisfied() const;
  // Wakes the sleeping owner (the notifier, or owner_cv_) when what it waits
  // for holds and progress needs it (see "Owner waits"): `urgent` for the
  // event just posted, or the device `d` went idle (its busy flag is
  // refreshed first, so the check is O(1) in the number of devices).
  // Called by whoever changes it (Post, a start, a device thread about to
  // wait for work).
  void MaybeWakeOwner(size_t d, bool urgent = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Refreshes `s.busy` and busy_devices_; true when `s` went idle.
  bool NoteWork(DeviceState& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool OwnerWaitFor(OwnerWait kind, size_t min_completions, absl::Duration timeout, absl::Duration spin);
  // How the owner sleeps (see "Owner waits"): awake, napping (woken only
  // for what needs it now) or blocked (woken for every event its wait is
  // satisfied by).
  enum class OwnerSleep : uint8_t { kAwake, kNapping, kBlocked };
  // Napping while a device holds work, unless the owner runs beside one.
  OwnerSleep OwnerSleepMode() const;
  // The calling thread runs on the CPU a device thread last ran on.
  bool OwnerBesideADevice() const;
  // Publishes the sleep `mode`, then sleeps until `until` unless the wait
  // already holds or a device wakes it: napping on owner_mu_/owner_cv_,
  // blocked on mu_/owner_blocked_cv_.
  void OwnerSleepUntil(absl::Time until, OwnerSleep mode);
  // Device-state helpers (lock held; owner or device thread).
  // Hands `w` to device `d`: ready, or pending on its local producers.
  void Hand(DeviceId d, WorkItem w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint32_t StoreItem(DeviceState& s, WorkItem w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Empties slot `item` (a node dropped or failed before it ran: no
  // dependent list can name it any more) and frees it; returns what it held.
  WorkItem TakeItem(DeviceState& s, uint32_t item) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `dep` still waits in its slot (neither dropped nor the slot
  // reused since it was listed).
  static bool Waits(const DeviceState& s, const WorkItem::Dependent& dep);
  // `producer`, the item running on `d`, finished at `end` with `outputs`:
  // its pending dependents get those inputs; the ones now complete become
  // ready. The one the queue discipline picks next, if it is one of them,
  // goes to `s.next` (the fast path) instead of the ReadyQueue. Returns how
  // many dependents it had.
  int ReleaseDependents(DeviceId d, WorkItem& producer, Timestamp end, std::span<const Buffer> outputs)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `w` finished on `d`: each local input whose every reader has now run on
  // this device loses its payload (moved to `freed`, dropped by the device
  // thread after unlocking), in its producer's DeviceState::done entry and
  // in its producer's record if the owner has not drained it yet, so its
  // memory returns to this thread's heap before the next kernel, as the
  // direct loop frees its tensors. The Allocation (the accounting the GMG
  // mirrors) stays with the record until the GMG frees the tensor.
  void ReleaseConsumed(DeviceId d, const WorkItem& w, std::vector<std::shared_ptr<void>>* freed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `producer` will not finish on `d`: its pending `dependents` (taken from
  // its item) and theirs fail.
  void DropDependents(DeviceId d, NodeId producer, absl::InlinedVector<WorkItem::Dependent, 2> dependents)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Owner-thread helpers.
  // Queues `id` if it is ready or locally ready (then also tries its
  // same-device successors).
  void MaybeQueue(NodeId id, Timestamp now);
  // One node; true when a compute node was handed to its device.
  bool QueueOne(NodeId id, Timestamp now);
  absl::Status Drain(Timestamp t, std::vector<Feedback>* feedback);
  absl::Status Apply(Event& e, std::vector<Feedback>* feedback);
  absl::Status ApplyStart(NodeId node, DeviceId device, Timestamp start);
  absl::Status ArbitrateTransfers(Timestamp now);
  absl::Status FailNode(NodeId id, absl::string_view reason, Timestamp now);
  void CancelInstanceWork(InstanceId inst);
  // Marks every item of `inst` on every device cancelled.
  void CancelItems(InstanceId inst);
  void Reconcile();
  void ReconcileTensor(const TensorKey& key);
  void Touch(NodeId producer, int output) { touched_.insert({producer.value(), output}); }
  // Owner side: queue `h`'s payload for its device's thread (released there);
  // the Allocation stays with `h` (released by the caller, as before).
  void Bury(Held& h);
  // Hands what Bury() collected to the device threads (one lock round trip).
  void FlushBuried();

  GlobalMappingGraph* gmg_;
  const Clock* clock_;
  KernelRunner* kernels_;
  TransferBackend* transfers_;

  // Pools first: every Allocation below is destroyed before them.
  std::vector<std::unique_ptr<DevicePool>> pools_;

  // ---- owner thread only ----
  // (From a new cache line: the device threads read the members above per
  // operator, the owner writes these.)
  alignas(ABSL_CACHELINE_SIZE) CommGraph comm_;
  absl::flat_hash_set<uint64_t> queued_;       // compute nodes handed to a device
  absl::flat_hash_set<uint64_t> handed_instances_;  // with compute nodes handed to a device
  absl::btree_map<TensorKey, absl::btree_map<uint16_t, Held>> tensors_;
  absl::btree_map<uint64_t, std::vector<Held>> checkpoints_;  // by CheckpointId
  absl::btree_set<TensorKey> touched_;
  struct Buried {
    std::vector<std::shared_ptr<void>> payloads;
    int64_t bytes = 0;
  };
  std::vector<Buried> buried_;  // by device; owner-only, emptied by FlushBuried()
  bool any_buried_ = false;
  absl::flat_hash_map<uint64_t, bool> start_overlapped_;      // running node -> overlapped
  // By device: the end of its last applied operator, and of its last
  // transfer (either end), for Feedback::handoff.
  std::vector<Timestamp> op_free_;
  std::vector<Timestamp> xfer_free_;
  int64_t completed_ops_ = 0;
  int64_t completed_transfers_ = 0;
  int64_t failed_nodes_ = 0;

  // ---- shared ----
  // Cache lines: a device thread reads and writes these per operator while
  // the owner, on another CPU, writes its own state per nap. What the two
  // write at different times sits on different lines, so that a device
  // misses in its cache only where the owner changed what it reads
  // (docs/design/executor.md).
  //
  // The lock's line: what a device thread reads and writes with mu_ held,
  // on the line its Lock() has just taken. The counters are what the
  // owner's waits look at (see "Owner waits"): written with mu_ held, read
  // by the owner without it.
  alignas(ABSL_CACHELINE_SIZE) mutable absl::Mutex mu_;
  // Next sequence number of a stamp (records and starts).
  uint64_t seq_ ABSL_GUARDED_BY(mu_) = 0;
  // Records held in the devices' buffers.
  std::atomic<size_t> num_records_{0};
  // Records WaitForFinish wakes for (not quiet).
  std::atomic<size_t> pending_completions_{0};
  // Devices whose busy flag is set (see NoteWork).
  std::atomic<size_t> busy_devices_{0};
  // A node started since the owner's last drain (WaitForCompletion and
  // NextEventTime report it; it is applied from DeviceState::running).
  std::atomic<bool> start_unseen_{false};
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  int64_t fast_path_ops_ ABSL_GUARDED_BY(mu_) = 0;
  // The owner's sleep: what it waits for (set before owner_sleep_) and the
  // flag device threads read before waking it. Written by the owner per
  // nap, read by the devices per event.
  alignas(ABSL_CACHELINE_SIZE) std::atomic<OwnerWait> owner_wait_{OwnerWait::kNone};
  std::atomic<size_t> owner_wait_min_{0};
  std::atomic<OwnerSleep> owner_sleep_{OwnerSleep::kAwake};
  // The owner's own lock and condition (a device takes owner_mu_ only to
  // wake it).
  alignas(ABSL_CACHELINE_SIZE) absl::Mutex owner_mu_;
  absl::CondVar owner_cv_;          // napping, with owner_mu_
  absl::CondVar owner_blocked_cv_;  // blocked, with mu_
  bool owner_woken_ ABSL_GUARDED_BY(owner_mu_) = false;
  std::atomic<int64_t> owner_wakes_{0};
  // Constant once the threads run (the vector; its states are guarded).
  alignas(ABSL_CACHELINE_SIZE) std::vector<DeviceState> devices_ ABSL_GUARDED_BY(mu_);
  const absl::Duration owner_nap_;
  // By device: the CPU its thread last started an operator on (-1: none),
  // a line each (the owner reads them per nap; see DeviceLoop).
  struct alignas(ABSL_CACHELINE_SIZE) DeviceCpu {
    std::atomic<int> cpu{-1};
  };
  std::unique_ptr<DeviceCpu[]> device_cpu_;
  std::function<void()> notify_;  // constant once work is issued

  std::vector<std::thread> threads_;
  std::unique_ptr<ThreadPool> transfer_pool_;
};

}  // namespace slicesched::executor
