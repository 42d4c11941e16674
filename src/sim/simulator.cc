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
// state a run copies (16 bytes per node, 12 per tensor), so that starting a
// run is a few memcpy-like vector copies and an event touches few cache
// lines. Predicted start and end times are written straight into the
// result's vectors rather than kept in the state.

namespace {

constexpr uint32_t kNone = GmgSnapshot::kNone;
constexpr uint16_t kNoDevice = 0xffff;

enum SimState : uint8_t { kUnplaced = 0, kWaiting = 1, kQueued = 2, kRunning = 3, kDone = 4 };

// 16 bytes: the sequence number (high 32 bits) and the node (low 32 bits)
// share one word, so comparing `key` compares sequence numbers, which are
// unique within a run. A run schedules at most one completion per node (a
// node completes once), so sequence numbers stay below the node count and
// fit in 32 bits.
struct Event {
  int64_t time;
  uint64_t key;  // seq << 32 | node
  uint32_t node() const { return static_cast<uint32_t>(key); }
};
static_assert(sizeof(Event) == 16);

// Pending completions, popped in (time, seq) order. Sequence numbers are
// unique, so the order is total and any correct priority queue pops the same
// sequence; this is a plain binary heap with hole-based sifting (the queue
// holds about one event per compute slot and per active transfer, so it stays
// small and the sifts are short).
class EventQueue {
 public:
  void Clear() { heap_.clear(); }
  bool empty() const { return heap_.empty(); }
  const Event& top() const { return heap_.front(); }

  void Push(const Event& e) {
    size_t i = heap_.size();
    heap_.push_back(e);
    while (i > 0) {
      const size_t parent = (i - 1) / 2;
      if (!Before(e, heap_[parent])) break;
      heap_[i] = heap_[parent];
      i = parent;
    }
    heap_[i] = e;
  }

  // Removes and returns the earliest event. Requires !empty().
  Event Pop() {
    const Event first = heap_.front();
    const Event last = heap_.back();
    heap_.pop_back();
    const size_t n = heap_.size();
    if (n > 0) {
      size_t i = 0;
      for (;;) {
        size_t child = 2 * i + 1;
        if (child >= n) break;
        if (child + 1 < n && Before(heap_[child + 1], heap_[child])) ++child;
        if (!Before(heap_[child], last)) break;
        heap_[i] = heap_[child];
        i = child;
      }
      heap_[i] = last;
    }
    return first;
  }

 private:
  static bool Before(const Event& a, const Event& b) {
    return a.time != b.time ? a.time < b.time : a.key < b.key;
  }
  std::vector<Event> heap_;
};

// Immutable per compute node: everything an event of the node reads.
struct NodeInfo {
  uint64_t id;          // tiebreak of the queue discipline
  int64_t alloc_bytes;  // outputs (growth for checkpoint updates) + workspace, at start
  int64_t workspace;    // released at finish
  uint32_t instance;
  int32_t priority;
  uint32_t in_begin, in_end;    // snapshot inputs range
  uint32_t out_begin, out_end;  // snapshot tensors range
  uint8_t priority_class;
};

// Immutable per tensor.
struct TensorInfo {
  int64_t bytes;
  uint32_t producer;
  uint8_t keep;          // retained or a checkpoint update: never freed
  uint8_t initial_copy;  // the snapshot lists a copy and the producer is done
};

// Mutable per node (compute and transfer).
struct NodeRun {
  int64_t dur;   // predicted duration (before overlap slowdowns)
  int32_t wait;  // inputs not yet local
  uint16_t dev;  // compute: device; transfer: source
  uint8_t st;
};

// Mutable per tensor.
struct TensorRun {
  int32_t pending;          // consumers (compute and transfers) not finished
  uint32_t first_transfer;  // transfers of this tensor, linked through TransferRun::next
  uint8_t freed;
};

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
  std::vector<NodeInfo> info;        // per compute node
  std::vector<TensorInfo> tinfo;     // per tensor
  std::vector<uint32_t> tcons_off, tcons;  // compute consumers per tensor (CSR)
  std::vector<uint8_t> tcons_cnt;          // how many inputs of that consumer read the tensor

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
    if (!tinfo[t].initial_copy) return false;
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
  }

  absl::Status Place(const Placement& pl) {
    const uint32_t n = pl.node;
    if (n >= m_.num_compute || s_.node[n].st != kUnplaced) {
      return absl::InvalidArgumentError(StrCat("what-if: node index ", n, " is not an unscheduled compute node"));
    }
    if (pl.device >= m_.capacity.size()) {
      return absl::InvalidArgumentError(StrCat("what-if: node index ", n, ": no device ", pl.device));
    }
    const GmgSnapshot::Node& node = snap_.nodes[n];
    NodeRun& r = s_.node[n];
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
      const uint32_t t = snap_.inputs[k];
      const uint32_t p = m_.tinfo[t].producer;
      if (s_.node[p].st == kUnplaced) {
        return absl::InvalidArgumentError(StrCat("what-if: node ", node.id, " reads node ", snap_.nodes[p].id,
                                                 " which is neither scheduled nor earlier in the batch"));
      }
      if (TensorOn(t, pl.device) || InitialCopy(t, pl.device)) continue;
      ++r.wait;
      if (s_.node[p].dev == pl.device) continue;  // arrives when the producer finishes
      bool coming = false;
      for (uint32_t x = s_.tensor[t].first_transfer; x != kNone; x = Xfer(x).next) coming |= Xfer(x).dst == pl.device;
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
      if (s_.node[n].wait == 0) MakeReady(n, InitialReadyAt(snap_.nodes[n].ready_ns, m_.now), false);
    }
    for (uint32_t x = m_.num_nodes; x < s_.node.size(); ++x) {  // inserted transfers
      if (s_.node[x].wait == 0) MakeReady(x, m_.now, false);
    }
    for (uint16_t d = 0; d < m_.capacity.size(); ++d) {
      if (s_.running[d] == kNone) Dispatch(d);
    }
    Arbitrate();
    while (!events_.empty() && !(stop_when_batch_done_ && batch_left_ == 0)) {
      if (events_.top().time > horizon_end_) break;
      const Event e = events_.Pop();
      now_ = e.time;
      const uint32_t node = e.node();
      if (node < m_.num_compute) {
        FinishCompute(node);
      } else {
        FinishTransfer(node);
      }
    }
    result_.end_ns = now_;
    Collect();
  }

 private:
  TransferRun& Xfer(uint32_t n) { return s_.xfer[n - m_.num_compute]; }

  uint32_t AddTransfer(uint32_t t, uint16_t dst, int32_t prio) {
    const uint32_t x = static_cast<uint32_t>(s_.node.size());
    const uint16_t src = s_.node[m_.tinfo[t].producer].dev;
    NodeRun r{};
    r.dur = static_cast<int64_t>(m_.ctx->transfers().PredictNs(DeviceId(src), DeviceId(dst), m_.tinfo[t].bytes));
    r.wait = TensorOn(t, src) || InitialCopy(t, src) ? 0 : 1;
    r.dev = src;
    r.st = kWaiting;
    s_.node.push_back(r);
    start_.push_back(-1);
    end_.push_back(-1);
    s_.xfer.push_back({(uint64_t{1} << 62) + x, t, s_.tensor[t].first_transfer, prio, dst});
    s_.tensor[t].first_transfer = x;
    s_.tensor[t].pending += 1;
    return x;
  }

  // Tensor t is present on device d (produced or received during the run).
  bool TensorOn(uint32_t t, uint16_t d) {
    const NodeRun& p = s_.node[m_.tinfo[t].producer];
    if (p.st == kDone && p.dev == d) return true;
    for (uint32_t x = s_.tensor[t].first_transfer; x != kNone; x = Xfer(x).next) {
      if (s_.node[x].st == kDone && Xfer(x).dst == d) return true;
    }
    return false;
  }
  bool InitialCopy(uint32_t t, uint16_t d) const { return m_.InitialCopy(t, d); }

  void Push(int64_t time, uint32_t node) { events_.Push({time, (uint64_t{seq_++} << 32) | node}); }

  void Alloc(uint16_t d, int64_t bytes) {
    int64_t& mem = s_.mem[d];
    mem += bytes;
    if (mem > s_.peak[d]) {
      s_.peak[d] = mem;
      if (mem > m_.capacity[d] && !result_.oom) {
        result_.oom = true;
        result_.oom_device = d;
        result_.oom_at_ns = now_;
      }
    }
  }

  void MakeReady(uint32_t n, int64_t ready_at, bool dispatch) {
    NodeRun& r = s_.node[n];
    r.st = kQueued;
    if (n < m_.num_compute) {
      const NodeInfo& info = m_.info[n];
      ready_[r.dev].Push(DisciplineKey{info.priority_class, info.priority, ready_at, info.id}, n);
      if (dispatch && s_.running[r.dev] == kNone) Dispatch(r.dev);
    } else {
      const TransferRun& x = Xfer(n);
      pending_.push_back({n, r.dev, x.dst, x.priority, ready_at, x.seq});
      if (dispatch) Arbitrate();
    }
  }

  // Starts the best ready operator on device d. Requires d idle
  // (running[d] == kNone); callers check that inline, since most wake-ups
  // find the device busy.
  void Dispatch(uint16_t d) {
    if (ready_[d].empty()) return;
    const uint32_t n = ready_[d].Pop();
    NodeRun& r = s_.node[n];
    s_.running[d] = n;
    r.st = kRunning;
    start_[n] = now_;
    Alloc(d, m_.info[n].alloc_bytes);
    int64_t dur = r.dur;
    if (busy_[d]) dur = static_cast<int64_t>(static_cast<double>(dur) * m_.overlap_factor);
    Push(now_ + dur, n);
  }

  void Arbitrate() {
    if (pending_.empty()) return;
    granted_.clear();
    ArbitrateTransfers(&pending_, &busy_, &granted_);
    for (uint32_t x : granted_) {
      NodeRun& r = s_.node[x];
      const TransferRun& xr = Xfer(x);
      r.st = kRunning;
      start_[x] = now_;
      Alloc(xr.dst, m_.tinfo[xr.tensor].bytes);
      int64_t dur = r.dur;
      if (s_.running[r.dev] != kNone || s_.running[xr.dst] != kNone) {
        dur = static_cast<int64_t>(static_cast<double>(dur) * m_.transfer_overlap_factor);
      }
      Push(now_ + dur, x);
    }
  }

  // Tensor t became present on device d: wake its consumers there.
  void Arrived(uint32_t t, uint16_t d) {
    for (uint32_t k = m_.tcons_off[t]; k < m_.tcons_off[t + 1]; ++k) {
      const uint32_t c = m_.tcons[k];
      NodeRun& r = s_.node[c];
      if (r.st != kWaiting || r.dev != d) continue;
      r.wait -= m_.tcons_cnt[k];  // every input occurrence of t
      if (r.wait <= 0) MakeReady(c, now_, true);
    }
    for (uint32_t x = s_.tensor[t].first_transfer; x != kNone; x = Xfer(x).next) {
      NodeRun& r = s_.node[x];
      if (r.st == kWaiting && r.dev == d && --r.wait <= 0) MakeReady(x, now_, true);
    }
  }

  void Consume(uint32_t t) {
    if (--s_.tensor[t].pending > 0 || s_.tensor[t].freed) return;
    if (s_.node[m_.tinfo[t].producer].st != kDone) return;
    Free(t);
  }

  void Free(uint32_t t) {
    const TensorInfo& ti = m_.tinfo[t];
    if (ti.keep || s_.tensor[t].freed) return;
    s_.tensor[t].freed = 1;
    s_.mem[s_.node[ti.producer].dev] -= ti.bytes;
    for (uint32_t x = s_.tensor[t].first_transfer; x != kNone; x = Xfer(x).next) {
      const uint8_t st = s_.node[x].st;
      if (st == kRunning || st == kDone) s_.mem[Xfer(x).dst] -= ti.bytes;
    }
  }

  void FinishCompute(uint32_t n) {
    NodeRun& r = s_.node[n];
    const NodeInfo& info = m_.info[n];
    const uint16_t d = r.dev;
    r.st = kDone;
    end_[n] = now_;
    s_.running[d] = kNone;
    ++result_.simulated_ops;
    s_.mem[d] -= info.workspace;
    if (--s_.unfinished[info.instance] == 0) inst_end_.emplace_back(info.instance, now_);
    if (stop_when_batch_done_ && in_batch_[n]) --batch_left_;
    const uint32_t out_begin = info.out_begin, out_end = info.out_end;
    for (uint32_t t = out_begin; t < out_end; ++t) {
      if (s_.tensor[t].pending == 0) Free(t);
    }
    for (uint32_t k = info.in_begin; k < info.in_end; ++k) Consume(snap_.inputs[k]);
    for (uint32_t t = out_begin; t < out_end; ++t) Arrived(t, d);
    if (s_.running[d] == kNone) Dispatch(d);  // Arrived may have started one
  }

  void FinishTransfer(uint32_t x) {
    NodeRun& r = s_.node[x];
    const TransferRun& xr = Xfer(x);
    r.st = kDone;
    end_[x] = now_;
    ++result_.simulated_ops;
    busy_[r.dev] = 0;
    busy_[xr.dst] = 0;
    Arrived(xr.tensor, xr.dst);
    Consume(xr.tensor);
    Arbitrate();
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
  int64_t now_ = 0;
  int64_t horizon_end_ = 0;
  uint32_t seq_ = 0;  // see Event
  bool stop_when_batch_done_ = false;
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
    if (!m.tinfo[t].initial_copy || m.init.tensor[t].freed) continue;
    const uint32_t p = m.tinfo[t].producer;
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

  for (const GmgSnapshot::Instance& inst : snap.instances) {
    if (ctx.templates().Find(TemplateId(inst.template_id)) == nullptr) {
      return absl::FailedPreconditionError(StrCat("snapshot instance ", inst.id, " uses template ",
                                                  inst.template_id, " unknown to the registry"));
    }
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

  // Tensors.
  m.tinfo.resize(nt);
  s.tensor.resize(nt);
  for (size_t t = 0; t < nt; ++t) {
    const GmgSnapshot::Tensor& ts = snap.tensors[t];
    m.tinfo[t] = {ts.bytes, ts.node, static_cast<uint8_t>(ts.retained || ts.update_of >= 0), 0};
    s.tensor[t] = {ts.pending_consumers, kNone, ts.freed};
  }
  for (const GmgSnapshot::Copy& c : snap.copies) {
    TensorInfo& ti = m.tinfo[c.tensor];
    if (snap.nodes[ti.producer].state == static_cast<uint8_t>(NodeState::kDone)) ti.initial_copy = 1;
  }

  // Nodes: placement, state, durations, initial wait counts, and the number
  // of (distinct consecutive) compute consumers of each tensor.
  m.info.resize(nc);
  s.node.resize(nn);
  s.xfer.resize(nn - nc);
  s.unfinished.assign(snap.instances.size(), 0);
  m.init_start.resize(nn);
  m.init_events.clear();
  m.init_ready.clear();
  m.tcons_off.assign(nt + 1, 0);
  uint32_t cached_type = kNone, cached_tpl = kNone;
  const std::vector<int>* keys = nullptr;
  for (uint32_t n = 0; n < nn; ++n) {
    const GmgSnapshot::Node& node = snap.nodes[n];
    const NodeState state = static_cast<NodeState>(node.state);
    NodeRun& r = s.node[n];
    r.dur = 0;
    r.wait = 0;
    r.dev = node.device;
    switch (state) {
      case NodeState::kUnscheduled: r.st = kUnplaced; break;
      case NodeState::kIssued: r.st = kWaiting; break;
      case NodeState::kRunning: r.st = kRunning; break;
      default: r.st = kDone; break;  // failed/cancelled never appear live
    }
    m.init_start[n] = r.st == kRunning || r.st == kDone ? node.start_ns : -1;
    const uint32_t in_begin = snap.input_offsets[n], in_end = snap.input_offsets[n + 1];
    if (n >= nc) {
      const uint32_t t = snap.inputs[in_begin];
      TransferRun& x = s.xfer[n - nc];
      x = {node.id, t, s.tensor[t].first_transfer, node.priority, node.dst_device};
      s.tensor[t].first_transfer = n;
      r.dur = static_cast<int64_t>(
          ctx.transfers().PredictNs(DeviceId(node.device), DeviceId(node.dst_device), node.transfer_bytes));
      if (r.st == kWaiting && !m.InitialCopy(t, node.device)) r.wait = 1;
    } else {
      NodeInfo& info = m.info[n];
      info.id = node.id;
      info.workspace = node.workspace_bytes;
      int64_t alloc = node.workspace_bytes;
      const uint32_t out_begin = snap.tensor_offsets[n], out_end = snap.tensor_offsets[n + 1];
      for (uint32_t t = out_begin; t < out_end; ++t) alloc += m.tinfo[t].bytes;
      info.alloc_bytes = alloc;
      info.instance = node.instance;
      info.priority = node.priority;
      info.in_begin = in_begin;
      info.in_end = in_end;
      info.out_begin = out_begin;
      info.out_end = out_end;
      info.priority_class = node.priority_class;
      uint32_t last = kNone;
      for (uint32_t k = in_begin; k < in_end; ++k) {
        const uint32_t t = snap.inputs[k];
        if (t != last) m.tcons_off[t + 1]++;
        last = t;
      }
      s.unfinished[node.instance] += r.st != kDone;
      if (r.st == kUnplaced) continue;
      const uint32_t type = snap.devices[node.device].type;
      const uint32_t tpl = snap.instances[node.instance].template_id;
      if (type != cached_type || tpl != cached_tpl) {
        keys = &ctx.OpKeys(snap.device_types[type], tpl);
        cached_type = type;
        cached_tpl = tpl;
      }
      r.dur = static_cast<int64_t>(ctx.ops().PredictNs(
                                       (*keys)[node.op_index],
                                       std::span<const int64_t>(snap.attrs.data() + snap.attr_offsets[n],
                                                                snap.attr_offsets[n + 1] - snap.attr_offsets[n])) *
                                   m.device_factor[node.device]);
      if (r.st == kWaiting) {
        for (uint32_t k = in_begin; k < in_end; ++k) {
          if (!m.InitialCopy(snap.inputs[k], node.device)) ++r.wait;
        }
      }
    }
    if (r.st == kRunning) {
      if (n >= nc) {
        m.init_busy[r.dev] = 1;
        m.init_busy[node.dst_device] = 1;
      }
      m.init_events.push_back({std::max(m.now, node.start_ns + r.dur), n});
    } else if (r.st == kWaiting && r.wait == 0) {
      m.init_ready.push_back({n, InitialReadyAt(node.ready_ns, m.now)});
    }
  }

  // Compute consumers of each tensor (CSR by counting sort; a consumer that
  // reads a tensor twice in a row is listed once, with the count).
  for (size_t t = 0; t < nt; ++t) m.tcons_off[t + 1] += m.tcons_off[t];
  m.tcons.resize(m.tcons_off[nt]);
  m.tcons_cnt.resize(m.tcons_off[nt]);
  {
    // fill[t]: next free slot of tensor t; tcons_off[t + 1] is used as the
    // cursor and restored afterwards by shifting.
    std::vector<uint32_t>& off = m.tcons_off;
    for (uint32_t n = 0; n < nc; ++n) {
      uint32_t last = kNone;
      for (uint32_t k = snap.input_offsets[n]; k < snap.input_offsets[n + 1]; ++k) {
        const uint32_t t = snap.inputs[k];
        if (t != last) {
          const uint32_t slot = off[t]++;
          m.tcons[slot] = n;
          m.tcons_cnt[slot] = 1;
        } else {
          m.tcons_cnt[off[t] - 1]++;
        }
        last = t;
      }
    }
    // off[t] now holds the end of t's range, i.e. the begin of t + 1.
    for (size_t t = nt; t > 0; --t) off[t] = off[t - 1];
    off[0] = 0;
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
  Engine engine(m, *scratch->impl_, *result, /*state_moved=*/true);
  engine.Run(options);
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
