// SimContext, and the Simulator's model: Rebuild builds it from a snapshot,
// in phases (simulator_model.h has its layout). The runs over it are in
// simulator_engine.cc.
#include "slicesched/sim/simulator.h"

#include <algorithm>
#include <cassert>
#include <span>

#include "simulator_model.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "slicesched/gmg/gmg.h"

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
// Rebuild's phases, in the order it runs them. Their loops index raw
// pointers, not the vectors: the compiler cannot keep a vector's data
// pointer in a register across the stores to other vectors of the same
// element type. Each phase is inlined into Rebuild: left to the compiler,
// two of them stayed calls, and Rebuild ran 4.7% more instructions on the
// default bench-sim (callgrind).

namespace {

using simulator_internal::InitialReadyAt;
using simulator_internal::kNoDevice;
using simulator_internal::kNone;
using simulator_internal::NodeInfo;
using simulator_internal::NodeRun;
using simulator_internal::SimState;
using simulator_internal::SimStateOf;
using simulator_internal::TensorRun;
using enum simulator_internal::SimState;
using Model = Simulator::Model;

// Instances share a few templates: give each distinct template a dense
// slot (looked up in the registry once, at its first instance), so that
// the node loop finds a node's estimator models by (slot, device type)
// in a table, with no data-dependent branch (instances of different
// templates interleave: a cache of the last one mispredicted often).
// Small ids map directly; larger ones are searched among the few seen.
[[gnu::always_inline]] inline absl::Status SlotTemplates(const GmgSnapshot& snap, const SimContext& ctx, Model& m) {
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
  return absl::OkStatus();
}

// Devices: capacity, type and calibration, and where the run starts on
// each (its resident bytes and running node; BuildTransfers takes the
// transfer slots of the transfers in flight).
[[gnu::always_inline]] inline void BuildDevices(const GmgSnapshot& snap, const SimContext& ctx, Model& m) {
  const size_t nd = snap.devices.size();
  Model::State& s = m.init;
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
}

// Where the compute nodes' inputs end in the snapshot's inputs, and their
// outputs in its tensors.
struct ComputeEnds {
  uint32_t inputs = 0;
  uint32_t outputs = 0;
};

// Tensors. Each record is written in one store, below: first the copies
// and the number of compute consumers of each tensor (one per input that
// reads it), which that store needs. Each tensor's compute consumers get
// their range of Model::tcons here; BuildComputeNodes fills it.
[[gnu::always_inline]] inline ComputeEnds BuildTensors(const GmgSnapshot& snap, Model& m) {
  const uint32_t nc = m.num_compute;
  const size_t nt = snap.tensors.size();
  Model::State& s = m.init;
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
  tensor[nt] = {0, 0, kNone, cons_total, kNoDevice, true, false};  // ends the last range
  return {inputs_end, outputs_end};
}

// An operator's linear model, as the estimator holds it.
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

// The index in `tpl_models` of template `tpl`'s models on device type
// `type`, added on first use.
size_t FindTplModels(std::vector<TplModels>& tpl_models, uint32_t type, uint32_t tpl, const GmgSnapshot& snap,
                     SimContext& ctx) {
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
  return i;
}

// Operator `op`'s predicted duration in ns, before the device's factor.
inline double PredictOpNs(const TplModels& tm, uint32_t op, std::span<const int64_t> attrs, const SimContext& ctx) {
  const OpModel* const models = tm.ops.data();
  const uint32_t num_models = static_cast<uint32_t>(tm.ops.size());
  if (op < num_models && models[op].basis != nullptr) {
    // OpEstimator::PredictNs, inlined (same arithmetic).
    const OpModel& om = models[op];
    const double t = om.basis->Dot(om.coeffs, attrs);
    return t > 0 ? t : 0.0;
  }
  return ctx.ops().PredictNs(op < num_models ? models[op].key : -1, attrs);
}

// Compute nodes: placement, state, durations, initial wait counts. Each
// input also gets its entry among its tensor's compute consumers (CSR by
// counting sort, in the ranges BuildTensors assigned; ascending consumer
// order within each), filled as the loop meets each input. Every range is
// assigned before this loop, so the order in which the snapshot lists
// producers and consumers does not matter.
[[gnu::always_inline]] inline void BuildComputeNodes(const GmgSnapshot& snap, SimContext& ctx, const ComputeEnds& ends,
                                                     Model& m) {
  const uint32_t nc = m.num_compute;
  const size_t nn = snap.nodes.size();
  Model::State& s = m.init;
  const uint32_t* const inputs = snap.inputs.data();
  const GmgSnapshot::Node* const nodes = snap.nodes.data();
  const uint8_t* const initial_copy = m.initial_copy.data();
  const int64_t* const out_bytes = m.out_bytes.data();
  uint32_t* const fill = m.tcons_fill.data();
  m.tcons.resize(ends.inputs);
  Model::Consumer* const tcons = m.tcons.data();
  m.info.resize(size_t{nc} + 1);
  NodeInfo* const info = m.info.data();
  info[nc] = NodeInfo{0, 0, 0, 0, ends.inputs, ends.outputs};
  s.node.resize(nn);
  NodeRun* const node_run = s.node.data();
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
        index = static_cast<uint32_t>(FindTplModels(tpl_models, type, tpl, snap, ctx)) + 1;
      }
      const std::span<const int64_t> attrs(attrs_data + attr_offsets[n], attr_offsets[n + 1] - attr_offsets[n]);
      const double ns = PredictOpNs(tpl_models[index - 1], static_cast<uint32_t>(node.op_index), attrs, ctx);
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
}

// Transfers (after every compute node: they link into the tensor records).
[[gnu::always_inline]] inline void BuildTransfers(const GmgSnapshot& snap, const SimContext& ctx, Model& m) {
  const uint32_t nc = m.num_compute;
  const size_t nn = snap.nodes.size();
  Model::State& s = m.init;
  const uint32_t* const inputs = snap.inputs.data();
  const uint32_t* const input_offsets = snap.input_offsets.data();
  const GmgSnapshot::Node* const nodes = snap.nodes.data();
  TensorRun* const tensor = s.tensor.data();
  NodeRun* const node_run = s.node.data();
  int64_t* const init_start = m.init_start.data();
  s.xfer.resize(nn - nc);
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
}

// Node ids out of index order (not a GMG snapshot's numbering): ranks them.
[[gnu::always_inline]] inline void RankNodeIds(const GmgSnapshot& snap, Model& m) {
  const uint32_t nc = m.num_compute;
  std::vector<uint32_t> order(nc);
  for (uint32_t n = 0; n < nc; ++n) order[n] = n;
  std::stable_sort(order.begin(), order.end(),
                   [&snap](uint32_t a, uint32_t b) { return snap.nodes[a].id < snap.nodes[b].id; });
  m.tiebreak.resize(nc);
  for (uint32_t r = 0; r < nc; ++r) m.tiebreak[order[r]] = r;
}

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
  SLICESCHED_RETURN_IF_ERROR(SlotTemplates(snap, ctx, m));
  m.consumed = false;  // every part of the initial state is rewritten below
  BuildDevices(snap, ctx, m);
  const ComputeEnds ends = BuildTensors(snap, m);
  BuildComputeNodes(snap, ctx, ends, m);
  BuildTransfers(snap, ctx, m);
  if (!m.ids_ordered) RankNodeIds(snap, m);
  return absl::OkStatus();
}

}  // namespace slicesched
