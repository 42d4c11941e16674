// The simulator's event loop over a built model (Engine: one run over a
// scratch), and the entry points that drive it: Run, RunInto and
// RunOnceInto, and WhatIf and WhatIfInto, which first place a candidate
// batch on the copy.
#include <algorithm>
#include <cassert>
#include <limits>

#include "simulator_model.h"
#include "slicesched/comm/arbitration.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "slicesched/sim/queue_discipline.h"
#include "slicesched/sim/simulator.h"

namespace slicesched {

namespace {

using simulator_internal::InitialEvent;
using simulator_internal::InitialReady;
using simulator_internal::InitialReadyAt;
using simulator_internal::kNone;
using simulator_internal::NodeInfo;
using simulator_internal::NodeRun;
using simulator_internal::SimState;
using simulator_internal::TensorRun;
using simulator_internal::TransferRun;
using enum simulator_internal::SimState;

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

}  // namespace

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
// Runs

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
