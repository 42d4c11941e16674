#include "slicesched/sim/simulator.h"

#include <algorithm>
#include <cassert>
#include <limits>

#include "slicesched/comm/arbitration.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "slicesched/gmg/gmg.h"
#include "slicesched/sim/queue_discipline.h"

namespace slicesched {

// ---------------------------------------------------------------------------
// SimContext

SimContext::SimContext(const TemplateRegistry* templates, OpEstimator* ops,
                       const TransferEstimator* transfers)
    : templates_(templates), ops_(ops), transfers_(transfers) {}

int SimContext::OpKey(const std::string& device_type, uint32_t template_id, int op) {
  const std::vector<int>& keys = OpKeys(device_type, template_id);
  return op >= 0 && op < static_cast<int>(keys.size()) ? keys[op] : -1;
}

const std::vector<int>& SimContext::OpKeys(const std::string& device_type, uint32_t template_id) {
  size_t type = 0;
  while (type < types_.size() && types_[type] != device_type) ++type;
  if (type == types_.size()) {
    types_.push_back(device_type);
    keys_.emplace_back();
  }
  auto& by_tpl = keys_[type];
  if (template_id >= by_tpl.size()) by_tpl.resize(template_id + 1);
  auto& by_op = by_tpl[template_id];
  if (by_op.empty()) {
    const GraphTemplate* tpl = templates_->Find(TemplateId(template_id));
    if (tpl != nullptr) {
      for (int op = 0; op < tpl->num_ops(); ++op) by_op.push_back(ops_->Register(device_type, *tpl, op));
    }
  }
  return by_op;
}

// ---------------------------------------------------------------------------
// Layout. The model keeps what a run only reads (per compute node one
// immutable record of at most one cache line) apart from the small mutable
// state a run copies (16 bytes per node, 32 per tensor: the tensor record
// also carries the immutable facts a finish reads), so that starting a
// run is a few memcpy-like vector copies and an event touches few cache
// lines. Predicted start and end times are written straight into the
// result's vectors rather than kept in the state.

namespace {

constexpr uint32_t kNone = GmgSnapshot::kNone;
constexpr uint16_t kNoDevice = 0xffff;

// A scoped enum, not a plain uint8_t: stores through a character type may
// alias anything, which would make the compiler reload every vector's data
// pointer after each state change in the event loop.
// kArriving: a transfer whose link time is over (its ends are free) and
// whose bytes reach the consumer after the master's hand-off gaps.
enum class SimState : uint8_t { kUnplaced = 0, kWaiting = 1, kQueued = 2, kRunning = 3, kDone = 4, kArriving = 5 };
using enum SimState;

// A snapshot node's state as the run sees it (failed/cancelled nodes never
// appear live, so anything else is done).
inline SimState SimStateOf(uint8_t node_state) {
  switch (static_cast<NodeState>(node_state)) {
    case NodeState::kUnscheduled: return kUnplaced;
    case NodeState::kIssued: return kWaiting;
    case NodeState::kRunning: return kRunning;
    default: return kDone;
  }
}

// 16 bytes, ordered as one 128-bit key: the time (sign bit flipped, so that
// unsigned order is signed order), then the sequence number (32 bits) and
// the node (32 bits), so comparing events compares (time, seq); sequence
// numbers are unique within a run. A run
// schedules at most one completion per node (a node completes once), so
// sequence numbers stay below the node count and fit in 32 bits.
struct Event {
  uint64_t hi;  // time with the sign bit flipped
  uint64_t lo;  // seq << 32 | node
  static Event Make(int64_t time, uint32_t seq, uint32_t node) {
    return {static_cast<uint64_t>(time) ^ (uint64_t{1} << 63), (uint64_t{seq} << 32) | node};
  }
  int64_t time() const { return static_cast<int64_t>(hi ^ (uint64_t{1} << 63)); }
  uint32_t node() const { return static_cast<uint32_t>(lo); }
  // Times rarely tie, so the second comparison is rarely reached.
  friend bool operator<(const Event& a, const Event& b) { return a.hi < b.hi || (a.hi == b.hi && a.lo < b.lo); }
};
static_assert(sizeof(Event) == 16);

// Pending completions, popped in (time, seq) order. Keys are unique, so the
// order is total and any correct priority queue pops the same sequence.
// This is a binary heap (the queue holds about one event per compute slot
// and per active transfer, so it stays small) with a deferred pop: Pop
// leaves a hole at the root, and the next Push fills it with one sift-down
// (most completions start the device's next operator at once, so a pop is
// usually followed by a push); top() and the next Pop fill a hole that is
// still open with the last element, as a plain pop would.
class EventQueue {
 public:
  void Clear() {
    heap_.clear();
    hole_ = false;
  }
  bool empty() const { return heap_.size() == static_cast<size_t>(hole_); }
  // Requires !empty().
  const Event& top() {
    if (hole_) FillHole();
    return heap_.front();
  }

  // Inlined into its callers: called once per event, its out-of-line
  // prologue and epilogue cost a fifth of its work.
  [[gnu::always_inline]] void Push(const Event& e) {
    if (hole_) {
      hole_ = false;
      SiftDown(e, heap_.size());
      return;
    }
    size_t i = heap_.size();
    heap_.push_back(e);
    while (i > 0) {
      const size_t parent = (i - 1) / 2;
      if (!(e < heap_[parent])) break;
      heap_[i] = heap_[parent];
      i = parent;
    }
    heap_[i] = e;
  }

  // Removes and returns the earliest event. Requires !empty().
  Event Pop() {
    if (hole_) FillHole();
    hole_ = true;
    return heap_.front();
  }

  // The root's children: one of them, or an event pushed meanwhile, comes
  // next (for prefetching). Null where absent.
  const Event* child(size_t i) const { return i < heap_.size() ? &heap_[i] : nullptr; }

 private:
  // Moves the last element into the hole at the root.
  void FillHole() {
    hole_ = false;
    const Event last = heap_.back();
    heap_.pop_back();  // with a single slot, that was the hole itself
    if (!heap_.empty()) SiftDown(last, heap_.size());
  }
  // Places `e` in the hole at the root of heap_[0, n).
  void SiftDown(const Event& e, size_t n) {
    Event* h = heap_.data();
    size_t i = 0;
    for (;;) {
      size_t child = 2 * i + 1;
      if (child >= n) break;
      if (child + 1 < n && h[child + 1] < h[child]) ++child;
      if (!(h[child] < e)) break;
      h[i] = h[child];
      i = child;
    }
    h[i] = e;
  }

  std::vector<Event> heap_;
  bool hole_ = false;  // heap_[0] was popped and not refilled
};

// Immutable per compute node: everything an event of the node reads, in
// 32 bytes (two records per cache line). The ranges end where the next
// node's begin (the model keeps one record past the last compute node).
// The queue discipline's tiebreak is the node index (see Model::tiebreak)
// and the priority class sits in the node's NodeRun.
struct alignas(32) NodeInfo {
  int64_t alloc_bytes;  // outputs (growth for checkpoint updates) + workspace, at start
  int64_t workspace;    // released at finish
  uint32_t instance;
  int32_t priority;
  uint32_t in_begin;   // snapshot inputs [in_begin, next in_begin)
  uint32_t out_begin;  // snapshot tensors [out_begin, next out_begin)
};
static_assert(sizeof(NodeInfo) == 32);

// Mutable per node (compute and transfer).
struct NodeRun {
  int64_t dur;   // predicted duration (before overlap slowdowns)
  int32_t wait;  // inputs not yet local
  uint16_t dev;  // compute: device; transfer: source
  SimState st;
  uint8_t cls;   // compute: priority class (immutable; fills the padding)
};
static_assert(sizeof(NodeRun) == 16);

// Mutable per tensor, 24 bytes. It also carries the immutable facts a
// finish needs (size, consumers), so that consuming or freeing a tensor
// touches one record: the event loop is bound by memory latency more than
// by instructions. The model keeps one record past the last tensor (where
// the last consumer range ends).
struct TensorRun {
  int64_t bytes;
  int32_t pending;          // consumers (compute and transfers) not finished
  uint32_t first_transfer;  // transfers of this tensor, linked through TransferRun::next
  uint32_t cons_begin;      // compute consumers: Model::tcons [cons_begin, next cons_begin)
  uint16_t dev;             // the producer's device, once `produced`
  // Freed, or never to be freed (retained, or a checkpoint update): either
  // way a finish frees nothing. bool, not uint8_t: see SimState.
  bool released;
  bool produced;            // the producer is done
};
static_assert(sizeof(TensorRun) == 24);

// Mutable per transfer (indexed by node - num_compute).
struct TransferRun {
  uint64_t seq;            // arbitration sequence (GMG transfer id order)
  uint32_t tensor;
  uint32_t next;           // next transfer of the same tensor, or kNone
  int32_t priority;
  uint16_t dst;
};

// A node the snapshot shows running: its completion event.
struct InitialEvent {
  int64_t time;
  uint32_t node;
};

// A node already ready when the run starts.
struct InitialReady {
  uint32_t node;
  int64_t ready_at;
};

// The ready time a run gives a waiting node whose inputs are all local.
int64_t InitialReadyAt(int64_t snapshot_ready_ns, int64_t now) {
  const int64_t ready = snapshot_ready_ns != Timestamp::Never().nanos() ? snapshot_ready_ns : -1;
  return ready >= 0 ? ready : now;
}

}  // namespace

struct Simulator::Model {
  const GmgSnapshot* snap = nullptr;
  SimContext* ctx = nullptr;
  int64_t now = 0;
  uint32_t num_compute = 0;
  uint32_t num_nodes = 0;   // snapshot nodes (compute and transfers)
  bool consumed = false;    // RunOnceInto moved the initial state out; Rebuild first
  std::vector<int64_t> capacity;
  std::vector<std::string> device_type;
  std::vector<double> device_factor;   // calibration, per device
  double overlap_factor = 1.0;          // compute while a transfer touches the device
  double transfer_overlap_factor = 1.0; // transfer while an end computes
  std::vector<NodeInfo> info;        // per compute node, plus one (range ends)
  // Per tensor: the snapshot lists a copy and the producer is done.
  std::vector<uint8_t> initial_copy;
  // The queue discipline's tiebreak is the GMG node id. Compute node ids
  // grow with the snapshot index (instances in id order, ops in template
  // order; gmg.h's ComputeNodeId), which Rebuild checks: then the index
  // itself is the tiebreak (ids_ordered). Otherwise tiebreak[n] is the
  // rank of node n's id.
  bool ids_ordered = true;
  std::vector<uint32_t> tiebreak;
  // Compute consumers per tensor (CSR; each tensor's range is in its
  // TensorRun), one entry per input that reads the tensor, in consumer
  // order. Each carries the consumer's priority, so that waking it reads
  // no NodeInfo (that load stalled the event loop more than any other).
  struct Consumer {
    uint32_t node;
    int32_t priority;  // NodeInfo::priority of `node`
  };
  std::vector<Consumer> tcons;
  std::vector<uint32_t> tcons_fill;  // Rebuild's scratch: counts, then cursors
  // Rebuild's scratch: the distinct templates of the snapshot's instances
  // (in order of first use) and each instance's index among them.
  std::vector<uint32_t> templates_seen;
  std::vector<uint32_t> instance_slot;
  std::vector<uint32_t> model_index;  // see Rebuild
  std::vector<int64_t> out_bytes;     // see Rebuild

  // Where a run starts: per node its predicted start as far as the snapshot
  // knows (-1 unless running or done), the completion events of running
  // nodes in node order (the order a run schedules them, which fixes their
  // sequence numbers), the nodes ready at once, and the devices whose
  // transfer slot is taken.
  std::vector<int64_t> init_start;
  std::vector<InitialEvent> init_events;
  std::vector<InitialReady> init_ready;
  std::vector<uint8_t> init_busy;

  // Copies recorded in the snapshot (the tensor was present before it). The
  // GMG allocates an output's buffer when its producer starts, so a copy
  // counts only once the producer is done; initial_copy caches both facts.
  bool InitialCopy(uint32_t t, uint16_t d) const {
    if (!initial_copy[t]) return false;
    // The snapshot lists copies in tensor order.
    const std::vector<GmgSnapshot::Copy>& copies = snap->copies;
    auto it = std::lower_bound(copies.begin(), copies.end(), t,
                               [](const GmgSnapshot::Copy& c, uint32_t tensor) { return c.tensor < tensor; });
    for (; it != copies.end() && it->tensor == t; ++it) {
      if (it->device == d) return true;
    }
    return false;
  }

  struct State {
    std::vector<NodeRun> node;
    std::vector<TransferRun> xfer;
    std::vector<TensorRun> tensor;         // per tensor
    std::vector<int64_t> mem, peak;        // per device
    std::vector<uint32_t> running;         // per device
    std::vector<int32_t> unfinished;       // per instance
  } init;
};

struct SimScratch::Impl {
  Simulator::Model::State state;
  EventQueue events;
  std::vector<ReadyQueue> ready;
  std::vector<TransferRequest> pending;
  std::vector<uint8_t> busy;
  std::vector<uint32_t> granted;
  std::vector<uint32_t> batch;
  std::vector<uint8_t> in_batch;
  std::vector<std::pair<uint32_t, int64_t>> inst_end;
};

SimScratch::SimScratch() : impl_(std::make_unique<Impl>()) {}
SimScratch::~SimScratch() = default;
SimScratch::SimScratch(SimScratch&&) noexcept = default;
SimScratch& SimScratch::operator=(SimScratch&&) noexcept = default;

namespace {

using Model = Simulator::Model;

// One run over a scratch: the state copied from the model's initial state
// (vector assignment reuses capacity) and the event machinery.
class Engine {
 public:
  // With `state_moved`, the caller has already swapped the model's initial
  // state, init_start and init_busy into the scratch and the result
  // (RunOnceInto), so nothing is copied.
  Engine(const Model& m, SimScratch::Impl& x, SimResult& result, bool state_moved = false)
      : m_(m),
        s_(x.state),
        snap_(*m.snap),
        events_(x.events),
        ready_(x.ready),
        pending_(x.pending),
        busy_(x.busy),
        granted_(x.granted),
        batch_(x.batch),
        in_batch_(x.in_batch),
        inst_end_(x.inst_end),
        result_(result),
        start_(result.node_start_ns),
        end_(result.node_end_ns) {
    if (!state_moved) {
      s_.node = m.init.node;
      s_.xfer = m.init.xfer;
      s_.tensor = m.init.tensor;
      s_.mem = m.init.mem;
      s_.peak = m.init.peak;
      s_.running = m.init.running;
      s_.unfinished = m.init.unfinished;
      start_ = m.init_start;
      busy_ = m.init_busy;
    }
    end_.assign(m.num_nodes, -1);
    const size_t nd = m.capacity.size();
    ready_.resize(nd);
    for (ReadyQueue& q : ready_) q.Clear();
    events_.Clear();
    pending_.clear();
    granted_.clear();
    batch_.clear();
    in_batch_.clear();
    inst_end_.clear();
    result_.start_ns = m.now;
    result_.end_ns = m.now;
    result_.oom = false;
    result_.oom_device = -1;
    result_.oom_at_ns = -1;
    result_.simulated_ops = 0;
    result_.batch_mean_completion_ns = 0;
    result_.batch_completed = 0;
    result_.inserted_transfers = 0;
    now_ = m.now;
    // Read once per run, not per transfer: no learned gap, no lookups.
    handoff_ = m.ctx->transfers().handoff_gaps_observed();
    overlap_factor_ = m.overlap_factor;
    slow_overlap_ = m.overlap_factor != 1.0;
    transfer_overlap_factor_ = m.transfer_overlap_factor;
    Bind();
  }

  absl::Status Place(const Placement& pl) {
    const uint32_t n = pl.node;
    if (n >= m_.num_compute || node_[n].st != kUnplaced) {
      return absl::InvalidArgumentError(StrCat("what-if: node index ", n, " is not an unscheduled compute node"));
    }
    if (pl.device >= m_.capacity.size()) {
      return absl::InvalidArgumentError(StrCat("what-if: node index ", n, ": no device ", pl.device));
    }
    const GmgSnapshot::Node& node = snap_.nodes[n];
    NodeRun& r = node_[n];
    r.dev = pl.device;
    r.st = kWaiting;
    r.wait = 0;
    const int key = m_.ctx->OpKey(m_.device_type[pl.device], snap_.instances[node.instance].template_id,
                                  node.op_index);
    r.dur = static_cast<int64_t>(m_.ctx->ops().PredictNs(
                                     key, std::span<const int64_t>(snap_.attrs.data() + snap_.attr_offsets[n],
                                                                   snap_.attr_offsets[n + 1] - snap_.attr_offsets[n])) *
                                 m_.device_factor[pl.device]);
    const int32_t prio = TransferPriority(node.priority_class, node.priority);
    for (uint32_t k = snap_.input_offsets[n]; k < snap_.input_offsets[n + 1]; ++k) {
      const uint32_t t = inputs_[k];
      const uint32_t p = snap_.tensors[t].node;
      if (node_[p].st == kUnplaced) {
        return absl::InvalidArgumentError(StrCat("what-if: node ", node.id, " reads node ", snap_.nodes[p].id,
                                                 " which is neither scheduled nor earlier in the batch"));
      }
      if (TensorOn(t, pl.device) || InitialCopy(t, pl.device)) continue;
      ++node_[n].wait;  // not through `r`: AddTransfer below may move the node array
      if (node_[p].dev == pl.device) continue;  // arrives when the producer finishes
      bool coming = false;
      for (uint32_t x = tensor_[t].first_transfer; x != kNone; x = Xfer(x).next) coming |= Xfer(x).dst == pl.device;
      if (!coming) {
        AddTransfer(t, pl.device, prio);
        ++result_.inserted_transfers;
      }
    }
    batch_.push_back(n);
    if (in_batch_.size() <= n) in_batch_.resize(m_.num_compute, 0);
    in_batch_[n] = 1;
    return absl::OkStatus();
  }

  void Run(const SimOptions& options) {
    Bind();
    horizon_end_ = options.horizon == Duration::Infinite()
                       ? std::numeric_limits<int64_t>::max()
                       : m_.now + options.horizon.nanos();
    stop_when_batch_done_ = options.stop_when_batch_done && !batch_.empty();
    batch_left_ = static_cast<int>(batch_.size());
    // Nodes running in the snapshot, in node order (their sequence numbers).
    for (const InitialEvent& e : m_.init_events) Push(e.time, e.node);
    // Ready nodes. Neither queue depends on the order of these pushes (the
    // queue discipline and the arbitration are total orders), and nothing
    // dispatches until every device's turn below.
    for (const InitialReady& r : m_.init_ready) MakeReady(r.node, r.ready_at, false);
    for (uint32_t n : batch_) {  // what-if placements
      if (node_[n].wait == 0) MakeReady(n, InitialReadyAt(snap_.nodes[n].ready_ns, m_.now), false);
    }
    for (uint32_t x = m_.num_nodes; x < s_.node.size(); ++x) {  // inserted transfers
      if (node_[x].wait == 0) MakeReady(x, m_.now, false);
    }
    for (uint16_t d = 0; d < m_.capacity.size(); ++d) {
      if (running_[d] == kNone) Dispatch(d);
    }
    Arbitrate();
    while (!events_.empty() && !(stop_when_batch_done_ && batch_left_ == 0)) {
      if (events_.top().time() > horizon_end_) break;
      const Event e = events_.Pop();
      now_ = e.time();
      const uint32_t node = e.node();
      // The next event is most likely one of the root's children: fetch
      // their records while this one is processed. (info_ has num_compute_
      // + 1 records: a transfer's index fetches the last one, harmlessly.)
      for (size_t c = 1; c <= 2; ++c) {
        if (const Event* next = events_.child(c)) {
          const uint32_t nn = next->node();
          __builtin_prefetch(&node_[nn]);
          __builtin_prefetch(&info_[std::min(nn, num_compute_)]);
        }
      }
      if (node < num_compute_) {
        FinishCompute(node);
      } else {
        FinishTransfer(node);
      }
    }
    result_.end_ns = now_;
    result_.simulated_ops = simulated_ops_;
    Collect();
  }

 private:
  // Raw data pointers of the vectors the event loop indexes, so that an
  // access is one load from the engine rather than two (vector reference,
  // then its data). Rebound whenever a vector may have grown.
  void Bind() {
    num_compute_ = m_.num_compute;
    ready_q_ = ready_.data();
    busy_p_ = busy_.data();
    start_p_ = start_.data();
    end_p_ = end_.data();
    node_ = s_.node.data();
    xfer_ = s_.xfer.data();
    tensor_ = s_.tensor.data();
    mem_ = s_.mem.data();
    peak_ = s_.peak.data();
    running_ = s_.running.data();
    unfinished_ = s_.unfinished.data();
    info_ = m_.info.data();
    tiebreak_ = m_.ids_ordered ? nullptr : m_.tiebreak.data();
    tcons_ = m_.tcons.data();
    inputs_ = snap_.inputs.data();
    capacity_ = m_.capacity.data();
  }

  TransferRun& Xfer(uint32_t n) { return xfer_[n - num_compute_]; }

  uint32_t AddTransfer(uint32_t t, uint16_t dst, int32_t prio) {
    const uint32_t x = static_cast<uint32_t>(s_.node.size());
    const uint16_t src = node_[snap_.tensors[t].node].dev;
    NodeRun r{};
    r.dur = static_cast<int64_t>(m_.ctx->transfers().PredictLinkNs(DeviceId(src), DeviceId(dst), tensor_[t].bytes));
    r.wait = TensorOn(t, src) || InitialCopy(t, src) ? 0 : 1;
    r.dev = src;
    r.st = kWaiting;
    s_.node.push_back(r);
    start_.push_back(-1);
    end_.push_back(-1);
    s_.xfer.push_back({(uint64_t{1} << 62) + x, t, tensor_[t].first_transfer, prio, dst});
    Bind();  // the push_backs may have moved node, xfer, start and end
    tensor_[t].first_transfer = x;
    tensor_[t].pending += 1;
    return x;
  }

  // Tensor t is present on device d (produced or received during the run).
  bool TensorOn(uint32_t t, uint16_t d) {
    const NodeRun& p = node_[snap_.tensors[t].node];
    if (p.st == kDone && p.dev == d) return true;
    for (uint32_t x = tensor_[t].first_transfer; x != kNone; x = Xfer(x).next) {
      if (node_[x].st == kDone && Xfer(x).dst == d) return true;
    }
    return false;
  }
  bool InitialCopy(uint32_t t, uint16_t d) const { return m_.InitialCopy(t, d); }

  void Push(int64_t time, uint32_t node) { events_.Push(Event::Make(time, seq_++, node)); }

  void Alloc(uint16_t d, int64_t bytes) {
    const int64_t mem = mem_[d] + bytes;
    mem_[d] = mem;
    const int64_t peak = peak_[d];
    peak_[d] = mem > peak ? mem : peak;
    // OOM: a new peak above the capacity. One branch, rarely taken (a branch
    // on a new peak alone mispredicted often).
    if ((mem > peak) & (mem > capacity_[d])) [[unlikely]] {
      if (!result_.oom) {
        result_.oom = true;
        result_.oom_device = d;
        result_.oom_at_ns = now_;
      }
    }
  }

  // Queues compute node n, of the given priority, on its device.
  void QueueCompute(uint32_t n, int32_t priority, int64_t ready_at, bool dispatch) {
    NodeRun& r = node_[n];
    r.st = kQueued;
    const uint64_t tiebreak = tiebreak_ == nullptr ? n : tiebreak_[n];
    ready_q_[r.dev].Push(DisciplineKey{r.cls, priority, ready_at, tiebreak}, n);
    if (dispatch && running_[r.dev] == kNone) Dispatch(r.dev);
  }

  void MakeReady(uint32_t n, int64_t ready_at, bool dispatch) {
    if (n < num_compute_) {
      QueueCompute(n, info_[n].priority, ready_at, dispatch);
    } else {
      NodeRun& r = node_[n];
      r.st = kQueued;
      const TransferRun& x = Xfer(n);
      pending_.push_back({n, r.dev, x.dst, x.priority, ready_at, x.seq});
      if (!dispatch) {
        arbitrated_ = false;
      } else {
        // Granted by Settle once the event that made it ready has woken
        // all its consumers: one producer's finish can make several
        // transfers ready at the same instant, and the rule must see them
        // together (the first one woken is not the one to go first).
        ++fresh_;
      }
    }
  }

  // Grants what the transfers made ready by the current event allow (after
  // all of its wake-ups, before its device picks its next operator).
  void Settle() {
    const uint32_t fresh = fresh_;
    if (!arbitrated_) {
      Arbitrate();
      return;
    }
    if (fresh == 0) return;
    fresh_ = 0;
    // Every older request is still blocked (no slot was freed since the
    // last arbitration), so only the new ones can be granted.
    granted_.clear();
    if (fresh == 1) {
      const TransferRequest& q = pending_.back();
      if (busy_p_[q.src] | busy_p_[q.dst]) return;
      busy_p_[q.src] = 1;
      busy_p_[q.dst] = 1;
      granted_.push_back(q.id);
      pending_.pop_back();
    } else {
      ArbitrateNewTransfers(&pending_, pending_.size() - fresh, &busy_, &granted_);
    }
    StartGranted();
  }

  // Starts the best ready operator on device d. Requires d idle
  // (running[d] == kNone); callers check that inline, since most wake-ups
  // find the device busy.
  void Dispatch(uint16_t d) {
    ReadyQueue& q = ready_q_[d];
    if (q.empty()) return;
    const uint32_t n = q.Pop();
    NodeRun& r = node_[n];
    running_[d] = n;
    r.st = kRunning;
    start_p_[n] = now_;
    const NodeInfo& info = info_[n];
    // The finish of n reads its output and input records, and the record
    // after its own (where its ranges end; usually also its consumer, the
    // next operator of the instance, which the finish wakes): start
    // fetching them now, while other events run (the run is bound by
    // memory latency).
    __builtin_prefetch(&tensor_[info.out_begin]);
    __builtin_prefetch(&inputs_[info.in_begin]);
    __builtin_prefetch(&info_[n + 1]);
    __builtin_prefetch(&node_[n + 1]);
    // And the next node's outputs, which follow n's: a short operator's
    // finish comes too soon after its start for a fetch begun then.
    __builtin_prefetch(&tensor_[info.out_begin] + 2);
    __builtin_prefetch(&end_p_[n], 1);  // written at the finish
    Alloc(d, info.alloc_bytes);
    int64_t dur = r.dur;
    // A factor of exactly 1 changes nothing (a duration is an integer that
    // came from a double, so the conversion back and forth is exact): skip
    // the test of the transfer slot, which mispredicts.
    if (slow_overlap_ && busy_p_[d]) dur = static_cast<int64_t>(static_cast<double>(dur) * overlap_factor_);
    Push(now_ + dur, n);
  }

  // Grants pending transfers by the shared rule. Afterwards every request
  // still pending has a busy end (arbitrated_), which stays true until a
  // transfer slot is freed or a request is queued without arbitration.
  void Arbitrate() {
    arbitrated_ = true;
    fresh_ = 0;
    if (pending_.empty()) return;
    granted_.clear();
    if (pending_.size() == 1) {
      // One request: the rule grants it iff both ends are free (what
      // ArbitrateTransfers decides, without the sort check and the copy).
      const TransferRequest& q = pending_.front();
      if (busy_p_[q.src] | busy_p_[q.dst]) return;
      busy_p_[q.src] = 1;
      busy_p_[q.dst] = 1;
      granted_.push_back(q.id);
      pending_.clear();
    } else {
      ArbitrateTransfers(&pending_, &busy_, &granted_);
    }
    StartGranted();
  }

  // Starts the transfers in granted_, in grant order.
  void StartGranted() {
    for (uint32_t x : granted_) {
      NodeRun& r = node_[x];
      const TransferRun& xr = Xfer(x);
      r.st = kRunning;
      start_p_[x] = now_;
      Alloc(xr.dst, tensor_[xr.tensor].bytes);
      int64_t dur = r.dur;
      if (running_[r.dev] != kNone || running_[xr.dst] != kNone) {
        dur = static_cast<int64_t>(static_cast<double>(dur) * transfer_overlap_factor_);
      }
      Push(now_ + dur, x);
    }
  }

  // Tensor t became present on device d: wake its consumers there.
  // The arrays in locals: the loop calls Dispatch, after which members
  // would be loaded again (the run never moves these arrays).
  void Arrived(uint32_t t, uint16_t d) {
    const TensorRun* const tensor = tensor_;
    const Model::Consumer* const tcons = tcons_;
    NodeRun* const node = node_;
    for (uint32_t k = tensor[t].cons_begin, end = tensor[t + 1].cons_begin; k < end; ++k) {
      const Model::Consumer cons = tcons[k];
      NodeRun& r = node[cons.node];
      // A consumer reading t more than once has one entry per input, so it
      // is woken once its last input that reads t is counted.
      if (r.st != kWaiting || r.dev != d) continue;
      if (--r.wait <= 0) QueueCompute(cons.node, cons.priority, now_, true);
    }
    for (uint32_t x = tensor[t].first_transfer; x != kNone; x = Xfer(x).next) {
      NodeRun& r = node[x];
      if (r.st == kWaiting && r.dev == d && --r.wait <= 0) MakeReady(x, now_, true);
    }
  }

  void Consume(uint32_t t) {
    TensorRun& tr = tensor_[t];
    if (--tr.pending > 0 || tr.released || !tr.produced) return;
    Free(t);
  }

  // Releases t on every device holding it. Requires its producer done.
  void Free(uint32_t t) {
    TensorRun& tr = tensor_[t];
    if (tr.released) return;
    tr.released = true;
    mem_[tr.dev] -= tr.bytes;
    for (uint32_t x = tr.first_transfer; x != kNone; x = Xfer(x).next) {
      const SimState st = node_[x].st;
      if (st == kRunning || st == kDone || st == kArriving) mem_[Xfer(x).dst] -= tr.bytes;
    }
  }

  void FinishCompute(uint32_t n) {
    NodeRun& r = node_[n];
    const NodeInfo& info = info_[n];
    const uint16_t d = r.dev;
    r.st = kDone;
    end_p_[n] = now_;
    running_[d] = kNone;
    ++simulated_ops_;
    mem_[d] -= info.workspace;
    if (--unfinished_[info.instance] == 0) inst_end_.emplace_back(info.instance, now_);
    if (stop_when_batch_done_ && in_batch_[n]) --batch_left_;
    const uint32_t out_begin = info.out_begin, out_end = info_[n + 1].out_begin;
    for (uint32_t t = out_begin; t < out_end; ++t) {
      TensorRun& tr = tensor_[t];
      __builtin_prefetch(&tcons_[tr.cons_begin]);  // Arrived reads it below
      tr.produced = true;
      tr.dev = d;
      if ((tr.pending == 0) & !tr.released) Free(t);
    }
    for (uint32_t k = info.in_begin, in_end = info_[n + 1].in_begin; k < in_end; ++k) Consume(inputs_[k]);
    for (uint32_t t = out_begin; t < out_end; ++t) Arrived(t, d);
    if (fresh_ != 0) Settle();
    if (running_[d] == kNone) Dispatch(d);  // Arrived may have started one
  }

  void FinishTransfer(uint32_t x) {
    NodeRun& r = node_[x];
    const TransferRun& xr = Xfer(x);
    if (r.st == kRunning) {
      // The link time is over: the ends are free. The bytes reach the
      // consumer after the master's learned hand-off gaps (launch + delivery,
      // TransferEstimator), which hold no transfer slot.
      busy_p_[r.dev] = 0;
      busy_p_[xr.dst] = 0;
      arbitrated_ = false;  // requests blocked on these slots may now go
      if (handoff_) {
        const TransferEstimator& te = m_.ctx->transfers();
        const int64_t handoff = static_cast<int64_t>(te.launch_gap_ns(DeviceId(r.dev), DeviceId(xr.dst)) +
                                                     te.delivery_gap_ns(DeviceId(xr.dst)));
        if (handoff > 0) {
          r.st = kArriving;
          Push(now_ + handoff, x);
          Arbitrate();
          return;
        }
      }
    }
    r.st = kDone;
    end_p_[x] = now_;
    ++simulated_ops_;
    Arrived(xr.tensor, xr.dst);
    Consume(xr.tensor);
    Settle();
  }

  void Collect() {
    SimResult& r = result_;
    r.peak_bytes.swap(s_.peak);
    r.final_bytes.swap(s_.mem);
    r.instance_end_ns.assign(snap_.instances.size(), -1);
    for (const auto& [inst, t] : inst_end_) r.instance_end_ns[inst] = t;
    double sum = 0;
    for (uint32_t b : batch_) {
      if (end_[b] >= 0) {
        sum += static_cast<double>(end_[b] - m_.now);
        ++r.batch_completed;
      }
    }
    r.batch_mean_completion_ns = r.batch_completed > 0 ? sum / r.batch_completed : 0;
  }

  const Model& m_;
  Model::State& s_;
  const GmgSnapshot& snap_;
  EventQueue& events_;
  std::vector<ReadyQueue>& ready_;
  std::vector<TransferRequest>& pending_;
  std::vector<uint8_t>& busy_;
  std::vector<uint32_t>& granted_;
  std::vector<uint32_t>& batch_;
  std::vector<uint8_t>& in_batch_;
  std::vector<std::pair<uint32_t, int64_t>>& inst_end_;
  SimResult& result_;
  std::vector<int64_t>& start_;  // result_.node_start_ns
  std::vector<int64_t>& end_;    // result_.node_end_ns
  uint32_t num_compute_ = 0;  // m_.num_compute
  // The same for the scratch's and the result's vectors, which the
  // engine holds by reference (an access through them is two dependent
  // loads): the ready queues, the transfer slots, the start and end times.
  ReadyQueue* ready_q_ = nullptr;
  uint8_t* busy_p_ = nullptr;
  int64_t* start_p_ = nullptr;
  int64_t* end_p_ = nullptr;
  double overlap_factor_ = 1.0;           // m_.overlap_factor
  bool slow_overlap_ = false;             // overlap_factor_ != 1
  double transfer_overlap_factor_ = 1.0;  // m_.transfer_overlap_factor
  NodeRun* node_ = nullptr;
  TransferRun* xfer_ = nullptr;
  TensorRun* tensor_ = nullptr;
  int64_t* mem_ = nullptr;
  int64_t* peak_ = nullptr;
  uint32_t* running_ = nullptr;
  int32_t* unfinished_ = nullptr;
  const NodeInfo* info_ = nullptr;
  const uint32_t* tiebreak_ = nullptr;  // null: the node index (Model::ids_ordered)
  const Model::Consumer* tcons_ = nullptr;
  const uint32_t* inputs_ = nullptr;
  const int64_t* capacity_ = nullptr;
  int64_t now_ = 0;
  int64_t horizon_end_ = 0;
  uint32_t seq_ = 0;  // see Event
  // Completions so far, copied to result_.simulated_ops at the end (one
  // load less per event than through the result reference).
  int64_t simulated_ops_ = 0;
  bool stop_when_batch_done_ = false;
  bool arbitrated_ = false;  // see Arbitrate
  uint32_t fresh_ = 0;       // requests queued by this event, at pending_'s end (see Settle)
  bool handoff_ = false;     // the transfer estimator has learned hand-off gaps
  int batch_left_ = 0;
};

}  // namespace
// ---------------------------------------------------------------------------
// Simulator

Simulator::Simulator() : model_(std::make_unique<Model>()) {}
Simulator::Simulator(Simulator&&) noexcept = default;
Simulator& Simulator::operator=(Simulator&&) noexcept = default;
Simulator::~Simulator() = default;

size_t Simulator::num_nodes() const { return model_->num_nodes; }
size_t Simulator::num_devices() const { return model_->capacity.size(); }
int64_t Simulator::duration_ns(uint32_t node) const {
  assert(!model_->consumed && "Simulator used after RunOnceInto without a Rebuild");
  return model_->init.node[node].dur;
}

uint32_t Simulator::running(size_t device) const {
  assert(!model_->consumed && "Simulator used after RunOnceInto without a Rebuild");
  return model_->init.running[device];
}

std::vector<SimResidentBuffer> Simulator::ResidentBuffers() const {
  const Model& m = *model_;
  assert(!m.consumed && "Simulator used after RunOnceInto without a Rebuild");
  const GmgSnapshot& snap = *m.snap;
  std::vector<SimResidentBuffer> out;
  for (const GmgSnapshot::Copy& c : snap.copies) {
    const uint32_t t = c.tensor;
    // initial_copy: listed and the producer is done (the buffer is complete).
    // The initial state's `freed` is the snapshot's.
    if (!m.initial_copy[t] || snap.tensors[t].freed) continue;
    const uint32_t p = snap.tensors[t].node;
    out.push_back({snap.nodes[p].id, static_cast<int32_t>(t - snap.tensor_offsets[p]), c.device});
  }
  for (const GmgSnapshot::Checkpoint& c : snap.checkpoints) out.push_back({c.id, -1, c.device});
  std::sort(out.begin(), out.end());
  return out;
}

absl::StatusOr<Simulator> Simulator::Create(const GmgSnapshot& snap, SimContext& ctx) {
  Simulator sim;
  SLICESCHED_RETURN_IF_ERROR(sim.Rebuild(snap, ctx));
  return sim;
}

absl::Status Simulator::Rebuild(const GmgSnapshot& snap, SimContext& ctx) {
  Model& m = *model_;
  m.snap = &snap;
  m.ctx = &ctx;
  m.now = snap.taken_at.nanos();
  m.num_compute = snap.num_compute_nodes;
  m.num_nodes = static_cast<uint32_t>(snap.nodes.size());
  const uint32_t nc = m.num_compute;
  const size_t nd = snap.devices.size();
  const size_t nn = snap.nodes.size();
  const size_t nt = snap.tensors.size();
  Model::State& s = m.init;

  // Instances share a few templates: give each distinct template a dense
  // slot (looked up in the registry once, at its first instance), so that
  // the node loop finds a node's estimator models by (slot, device type)
  // in a table, with no data-dependent branch (instances of different
  // templates interleave: a cache of the last one mispredicted often).
  // Small ids map directly; larger ones are searched among the few seen.
  constexpr uint32_t kDirectTemplates = 64;
  uint32_t slot_of_template[kDirectTemplates];
  std::fill(std::begin(slot_of_template), std::end(slot_of_template), kNone);
  m.templates_seen.clear();
  m.instance_slot.resize(snap.instances.size());
  for (size_t i = 0; i < snap.instances.size(); ++i) {
    const GmgSnapshot::Instance& inst = snap.instances[i];
    const uint32_t tid = inst.template_id;
    uint32_t slot = tid < kDirectTemplates ? slot_of_template[tid] : kNone;
    if (slot == kNone) {
      slot = 0;
      while (slot < m.templates_seen.size() && m.templates_seen[slot] != tid) ++slot;
      if (slot == m.templates_seen.size()) {
        if (ctx.templates().Find(TemplateId(tid)) == nullptr) {
          return absl::FailedPreconditionError(
              StrCat("snapshot instance ", inst.id, " uses template ", tid, " unknown to the registry"));
        }
        m.templates_seen.push_back(tid);
      }
      if (tid < kDirectTemplates) slot_of_template[tid] = slot;
    }
    m.instance_slot[i] = slot;
  }

  m.consumed = false;  // every part of the initial state is rewritten below

  // Devices.
  m.capacity.resize(nd);
  m.device_type.resize(nd);
  m.device_factor.assign(nd, 1.0);
  if (const RuntimeCalibration* cal = ctx.calibration()) {
    for (size_t d = 0; d < nd; ++d) m.device_factor[d] = cal->device_factor(DeviceId(static_cast<uint16_t>(d)));
    m.overlap_factor = cal->overlap_factor();
    m.transfer_overlap_factor = cal->transfer_overlap_factor();
  } else {
    m.overlap_factor = m.transfer_overlap_factor = 1.0;
  }
  s.mem.resize(nd);
  s.running.assign(nd, kNone);
  for (size_t d = 0; d < nd; ++d) {
    const GmgSnapshot::Device& dev = snap.devices[d];
    m.capacity[d] = dev.capacity;
    m.device_type[d] = snap.device_types[dev.type];
    s.mem[d] = dev.weights + dev.activations + dev.workspace + dev.checkpoints;
    s.running[d] = dev.running;
  }
  s.peak = s.mem;
  m.init_busy.assign(nd, 0);

  // Tensors. Each record is written in one store, below: first the copies
  // and the number of compute consumers of each tensor (one per input that
  // reads it), which that store needs.
  // The loops below index raw pointers, not the vectors: the compiler cannot
  // keep a vector's data pointer in a register across the stores to other
  // vectors of the same element type.
  const uint32_t* const inputs = snap.inputs.data();
  const GmgSnapshot::Tensor* const tensors = snap.tensors.data();
  const GmgSnapshot::Node* const nodes = snap.nodes.data();
  m.initial_copy.assign(nt, 0);
  uint8_t* const initial_copy = m.initial_copy.data();
  for (const GmgSnapshot::Copy& c : snap.copies) {
    if (nodes[tensors[c.tensor].node].state == static_cast<uint8_t>(NodeState::kDone)) initial_copy[c.tensor] = 1;
  }
  // Where the compute nodes' inputs and outputs end (the offsets are empty
  // in an empty snapshot). The snapshot puts no tensor past the compute
  // nodes' outputs, but one there would still get a record.
  const uint32_t inputs_end = nc < snap.input_offsets.size() ? snap.input_offsets[nc] : 0;
  const uint32_t outputs_end = nc < snap.tensor_offsets.size() ? snap.tensor_offsets[nc] : 0;
  m.tcons_fill.assign(nt, 0);
  uint32_t* const fill = m.tcons_fill.data();
  for (uint32_t k = 0; k < inputs_end; ++k) fill[inputs[k]]++;
  s.tensor.resize(nt + 1);
  TensorRun* const tensor = s.tensor.data();
  // Writes tensor t's record; its consumers get the next range of tcons
  // (fill turns from the count into the fill cursor). Returns its bytes.
  uint32_t cons_total = 0;
  auto init_tensor = [&](uint32_t t, uint16_t dev, bool produced) {
    const GmgSnapshot::Tensor& ts = tensors[t];
    // Bitwise, not short-circuit: which flags are set varies from tensor to
    // tensor, and a branch on them mispredicts.
    const bool released = (ts.freed != 0) | (ts.retained != 0) | (ts.update_of >= 0);
    const uint32_t begin = cons_total;
    cons_total += fill[t];
    fill[t] = begin;
    tensor[t] = {ts.bytes, ts.pending_consumers, kNone, begin, dev, released, produced};
    return ts.bytes;
  };
  // Every compute node's outputs, in one flat loop rather than a loop per
  // node over its one or two outputs (whose exit mispredicted at most
  // nodes): a record takes its producer's device and state (the producer
  // of tensor t is tensors[t].node), and out_bytes[t] sums the bytes of the
  // tensors before t, so that the node loop reads the bytes of a node's
  // outputs [out_begin, out_end) as a difference.
  m.out_bytes.resize(size_t{outputs_end} + 1);
  int64_t* const out_bytes = m.out_bytes.data();
  int64_t bytes_sum = 0;
  for (uint32_t t = 0; t < outputs_end; ++t) {
    const GmgSnapshot::Node& producer = nodes[tensors[t].node];
    out_bytes[t] = bytes_sum;
    // Done, or failed/cancelled (which never appear live): see the node
    // loop's states.
    const bool produced = producer.state >= static_cast<uint8_t>(NodeState::kDone);
    bytes_sum += init_tensor(t, producer.device, produced);
  }
  out_bytes[outputs_end] = bytes_sum;
  for (uint32_t t = outputs_end; t < nt; ++t) init_tensor(t, kNoDevice, false);

  // Compute consumers of each tensor (CSR by counting sort, in the ranges
  // init_tensor assigned above; ascending consumer order within each), one
  // entry per input, filled by the node loop as it meets each input. Every
  // range is assigned before that loop, so the order in which the snapshot
  // lists producers and consumers does not matter.
  m.tcons.resize(inputs_end);
  Model::Consumer* const tcons = m.tcons.data();

  // Compute nodes: placement, state, durations, initial wait counts.
  m.info.resize(size_t{nc} + 1);
  NodeInfo* const info = m.info.data();
  info[nc] = NodeInfo{0, 0, 0, 0, inputs_end, outputs_end};
  s.node.resize(nn);
  NodeRun* const node_run = s.node.data();
  s.xfer.resize(nn - nc);
  s.unfinished.assign(snap.instances.size(), 0);
  int32_t* const unfinished = s.unfinished.data();
  m.init_start.resize(nn);
  int64_t* const init_start = m.init_start.data();
  m.init_events.clear();
  m.init_ready.clear();
  const uint32_t* const input_offsets = snap.input_offsets.data();
  const uint32_t* const tensor_offsets = snap.tensor_offsets.data();
  const uint32_t* const attr_offsets = snap.attr_offsets.data();
  const int64_t* const attrs_data = snap.attrs.data();
  const double* const device_factor = m.device_factor.data();
  bool ids_ordered = true;
  uint64_t prev_id = 0;
  struct OpModel {
    int key;
    const FeatureBasis* basis;  // nullptr: unknown key, PredictNs's default
    const double* coeffs;
  };
  // Per (device type, template) seen in this build: its op keys and models.
  struct TplModels {
    uint32_t type, tpl;
    std::vector<int> keys;
    std::vector<OpModel> ops;
  };
  std::vector<TplModels> tpl_models;
  // Per (template slot, device type): its index in tpl_models, + 1 (0: not
  // yet looked up).
  const size_t num_types = snap.device_types.size();
  m.model_index.assign(m.templates_seen.size() * num_types, 0);
  uint32_t* const model_index = m.model_index.data();
  const uint32_t* const instance_slot = m.instance_slot.data();
  const GmgSnapshot::Device* const devices = snap.devices.data();
  for (uint32_t n = 0; n < nc; ++n) {
    const GmgSnapshot::Node& node = nodes[n];
    // The record is assembled in locals and stored once: reading back
    // fields just written piecewise would stall on store forwarding.
    const SimState st = SimStateOf(node.state);
    const uint16_t dev = node.device;
    init_start[n] = st == kRunning || st == kDone ? node.start_ns : -1;
    ids_ordered &= n == 0 || node.id > prev_id;
    prev_id = node.id;
    const uint32_t in_begin = input_offsets[n], in_end = input_offsets[n + 1];
    const uint32_t out_begin = tensor_offsets[n], out_end = tensor_offsets[n + 1];
    const int64_t alloc = node.workspace_bytes + (out_bytes[out_end] - out_bytes[out_begin]);
    info[n] = NodeInfo{alloc, node.workspace_bytes, node.instance, node.priority, in_begin, out_begin};
    unfinished[node.instance] += st != kDone;
    // Inputs: this node's consumer entries, and (waiting) its wait count.
    int32_t wait = 0;
    for (uint32_t k = in_begin; k < in_end; ++k) {
      const uint32_t t = inputs[k];
      tcons[fill[t]++] = {n, node.priority};
      if (st == kWaiting) wait += !(initial_copy[t] && m.InitialCopy(t, dev));
    }
    int64_t dur = 0;
    if (st != kUnplaced) {
      const uint32_t type = devices[dev].type;
      uint32_t& index = model_index[instance_slot[node.instance] * num_types + type];
      if (index == 0) {
        const uint32_t tpl = m.templates_seen[instance_slot[node.instance]];
        size_t i = 0;
        while (i < tpl_models.size() && (tpl_models[i].type != type || tpl_models[i].tpl != tpl)) ++i;
        if (i == tpl_models.size()) {
          tpl_models.push_back({type, tpl, ctx.OpKeys(snap.device_types[type], tpl), {}});
          // OpKeys may have registered keys, which moves the estimator's
          // models: fetch every cached pointer again.
          for (TplModels& tm : tpl_models) {
            tm.ops.resize(tm.keys.size());
            for (size_t op = 0; op < tm.keys.size(); ++op) {
              OpModel& om = tm.ops[op];
              om.key = tm.keys[op];
              if (!ctx.ops().LinearModel(om.key, &om.basis, &om.coeffs)) om.basis = nullptr;
            }
          }
        }
        index = static_cast<uint32_t>(i) + 1;
      }
      const TplModels& tm = tpl_models[index - 1];
      const OpModel* const models = tm.ops.data();
      const uint32_t num_models = static_cast<uint32_t>(tm.ops.size());
      const std::span<const int64_t> attrs(attrs_data + attr_offsets[n], attr_offsets[n + 1] - attr_offsets[n]);
      const uint32_t op = static_cast<uint32_t>(node.op_index);
      double ns;
      if (op < num_models && models[op].basis != nullptr) {
        // OpEstimator::PredictNs, inlined (same arithmetic).
        const OpModel& om = models[op];
        const double t = om.basis->Dot(om.coeffs, attrs);
        ns = t > 0 ? t : 0.0;
      } else {
        ns = ctx.ops().PredictNs(op < num_models ? models[op].key : -1, attrs);
      }
      dur = static_cast<int64_t>(ns * device_factor[dev]);
    }
    node_run[n] = NodeRun{dur, wait, dev, st, node.priority_class};
    if (st == kRunning) {
      m.init_events.push_back({std::max(m.now, node.start_ns + dur), n});
    } else if (st == kWaiting && wait == 0) {
      m.init_ready.push_back({n, InitialReadyAt(node.ready_ns, m.now)});
    }
  }
  m.ids_ordered = ids_ordered;
  tensor[nt] = {0, 0, kNone, cons_total, kNoDevice, true, false};  // ends the last range

  // Transfers (after every compute node: they link into the tensor records).
  for (uint32_t n = nc; n < nn; ++n) {
    const GmgSnapshot::Node& node = nodes[n];
    const SimState st = SimStateOf(node.state);
    const uint16_t dev = node.device;
    init_start[n] = st == kRunning || st == kDone ? node.start_ns : -1;
    const uint32_t t = inputs[input_offsets[n]];
    s.xfer[n - nc] = {node.id, t, tensor[t].first_transfer, node.priority, node.dst_device};
    tensor[t].first_transfer = n;
    const int64_t dur = static_cast<int64_t>(
        ctx.transfers().PredictLinkNs(DeviceId(node.device), DeviceId(node.dst_device), node.transfer_bytes));
    const int32_t wait = st == kWaiting && !m.InitialCopy(t, dev) ? 1 : 0;
    node_run[n] = NodeRun{dur, wait, dev, st, uint8_t{0}};
    if (st == kRunning) {
      m.init_busy[dev] = 1;
      m.init_busy[node.dst_device] = 1;
      m.init_events.push_back({std::max(m.now, node.start_ns + dur), n});
    } else if (st == kWaiting && wait == 0) {
      m.init_ready.push_back({n, InitialReadyAt(node.ready_ns, m.now)});
    }
  }

  // Node ids out of index order (not a GMG snapshot's numbering): rank them.
  if (!m.ids_ordered) {
    std::vector<uint32_t> order(nc);
    for (uint32_t n = 0; n < nc; ++n) order[n] = n;
    std::stable_sort(order.begin(), order.end(),
                     [&snap](uint32_t a, uint32_t b) { return snap.nodes[a].id < snap.nodes[b].id; });
    m.tiebreak.resize(nc);
    for (uint32_t r = 0; r < nc; ++r) m.tiebreak[order[r]] = r;
  }
  return absl::OkStatus();
}

SimResult Simulator::Run(const SimOptions& options) const {
  SimScratch scratch;
  SimResult result;
  RunInto(options, &scratch, &result);
  return result;
}

void Simulator::RunInto(const SimOptions& options, SimScratch* scratch, SimResult* result) const {
  assert(!model_->consumed && "Simulator used after RunOnceInto without a Rebuild");
  Engine engine(*model_, *scratch->impl_, *result);
  engine.Run(options);
}

void Simulator::RunOnceInto(const SimOptions& options, SimScratch* scratch, SimResult* result) {
  Model& m = *model_;
  assert(!m.consumed && "Simulator used after RunOnceInto without a Rebuild");
  // Move (swap) the initial state into the scratch instead of copying it:
  // the model gets the scratch's old buffers, which Rebuild overwrites
  // entirely, so a warm Rebuild + RunOnceInto cycle stays allocation-free.
  Model::State& s = scratch->impl_->state;
  s.node.swap(m.init.node);
  s.xfer.swap(m.init.xfer);
  s.tensor.swap(m.init.tensor);
  s.mem.swap(m.init.mem);
  s.peak.swap(m.init.peak);
  s.running.swap(m.init.running);
  s.unfinished.swap(m.init.unfinished);
  result->node_start_ns.swap(m.init_start);
  scratch->impl_->busy.swap(m.init_busy);
  m.consumed = true;
  {
    Engine engine(m, *scratch->impl_, *result, /*state_moved=*/true);
    engine.Run(options);
  }
  // Hand the buffers the run worked in back to the model (nothing reads a
  // scratch's state after a run; mem and peak went to the result): the next
  // Rebuild then overwrites buffers this run has just left in the cache,
  // rather than the other set, last touched a round earlier.
  s.node.swap(m.init.node);
  s.xfer.swap(m.init.xfer);
  s.tensor.swap(m.init.tensor);
  s.running.swap(m.init.running);
  s.unfinished.swap(m.init.unfinished);
  scratch->impl_->busy.swap(m.init_busy);
}

absl::StatusOr<SimResult> Simulator::WhatIf(std::span<const Placement> batch, const SimOptions& options) const {
  SimScratch scratch;
  SimResult result;
  SLICESCHED_RETURN_IF_ERROR(WhatIfInto(batch, options, &scratch, &result));
  return result;
}

absl::Status Simulator::WhatIfInto(std::span<const Placement> batch, const SimOptions& options,
                                   SimScratch* scratch, SimResult* result) const {
  assert(!model_->consumed && "Simulator used after RunOnceInto without a Rebuild");
  Engine engine(*model_, *scratch->impl_, *result);
  for (const Placement& p : batch) SLICESCHED_RETURN_IF_ERROR(engine.Place(p));
  engine.Run(options);
  return absl::OkStatus();
}

}  // namespace slicesched
