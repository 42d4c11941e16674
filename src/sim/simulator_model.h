// Internal to the simulator (sim/simulator.h): the built model and the
// per-run records it is made of, shared by simulator.cc (SimContext,
// Simulator and Rebuild, which builds the model from a snapshot) and
// simulator_engine.cc (the event loop, and the run and what-if entry points
// that drive it).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "slicesched/common/units.h"
#include "slicesched/gmg/gmg.h"
#include "slicesched/gmg/snapshot.h"
#include "slicesched/sim/simulator.h"

namespace slicesched {

// Layout. The model keeps what a run only reads (per compute node one
// immutable record of at most one cache line) apart from the small mutable
// state a run copies (16 bytes per node, 32 per tensor: the tensor record
// also carries the immutable facts a finish reads), so that starting a
// run is a few memcpy-like vector copies and an event touches few cache
// lines. Predicted start and end times are written straight into the
// result's vectors rather than kept in the state.

namespace simulator_internal {

inline constexpr uint32_t kNone = GmgSnapshot::kNone;
inline constexpr uint16_t kNoDevice = 0xffff;

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
inline int64_t InitialReadyAt(int64_t snapshot_ready_ns, int64_t now) {
  const int64_t ready = snapshot_ready_ns != Timestamp::Never().nanos() ? snapshot_ready_ns : -1;
  return ready >= 0 ? ready : now;
}

}  // namespace simulator_internal

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
  std::vector<simulator_internal::NodeInfo> info;  // per compute node, plus one (range ends)
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
  std::vector<uint32_t> model_index;  // see BuildComputeNodes
  std::vector<int64_t> out_bytes;     // see BuildTensors

  // Where a run starts: per node its predicted start as far as the snapshot
  // knows (-1 unless running or done), the completion events of running
  // nodes in node order (the order a run schedules them, which fixes their
  // sequence numbers), the nodes ready at once, and the devices whose
  // transfer slot is taken.
  std::vector<int64_t> init_start;
  std::vector<simulator_internal::InitialEvent> init_events;
  std::vector<simulator_internal::InitialReady> init_ready;
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
    std::vector<simulator_internal::NodeRun> node;
    std::vector<simulator_internal::TransferRun> xfer;
    std::vector<simulator_internal::TensorRun> tensor;  // per tensor
    std::vector<int64_t> mem, peak;                     // per device
    std::vector<uint32_t> running;                      // per device
    std::vector<int32_t> unfinished;                    // per instance
  } init;
};

}  // namespace slicesched
