// The Global Mapping Graph (GMG): the master's single picture of the server.
//
// It holds the registered templates, the live graph instances, one node per
// operator (and per cross-device transfer) with its state, placement and
// timestamps, the accelerator set, per-device memory residency, retained
// checkpoints, and the scheduled / unscheduled frontiers. It runs and times
// nothing: the scheduler issues nodes into it and executor feedback moves them
// along, each call carrying the timestamp of the event it reports.
//
// Node state machine (anything else is rejected with FailedPrecondition):
//
//   unscheduled --Issue--> issued --Start--> running --Finish--> done
//        |                    |                 |
//        +-----Cancel---------+                 +--Fail--> failed
//                             +--Fail--> failed
//
// Failing a node fails its instance: the instance's other unfinished nodes
// are cancelled and every byte they held is released.
//
// Device occupancy (docs/architecture.md, invariant 1): each device runs at most one
// compute node at a time, and takes part in at most one active transfer at a
// time (as source or destination). Start() enforces both, and the readiness
// rule (invariant 2): all predecessors done, every input tensor present on the
// node's device, every checkpoint input resident there and not being updated.
//
// Memory accounting, per device:
//   weights      bytes of weight keys resident on the device (LoadWeights)
//   activations  op outputs and transfer buffers: allocated when the node
//                starts, freed when the tensor's last consumer (compute node
//                or transfer) is done; outputs nobody consumes are freed when
//                their producer is done, unless retained
//   workspace    transient bytes of running nodes, freed at done
//   checkpoints  retained tensors (KV caches); grow when an update starts,
//                released explicitly with ReleaseCheckpoint
//
// Frontiers (compute nodes only; maintained incrementally):
//   unscheduled frontier: unscheduled nodes whose predecessors are all
//     scheduled (issued, running or done), ordered online before offline,
//     then higher priority, then earlier arrival, then lower node id;
//   scheduled frontier: scheduled nodes that still have an unscheduled
//     successor, i.e. the boundary the next round continues from.
//
// Finished instances (done, failed or cancelled with every byte released)
// are retired: their nodes are dropped and a summary is kept only until the
// owner drains it with TakeRetired(), so memory stays bounded in a daemon.
//
// Threading: the GMG has one owner thread; it takes no locks.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "slicesched/common/ids.h"
#include "slicesched/common/units.h"
#include "slicesched/gmg/accelerator.h"
#include "slicesched/gmg/graph_template.h"

namespace slicesched {

class GmgSnapshot;

enum class NodeState : uint8_t { kUnscheduled, kIssued, kRunning, kDone, kFailed, kCancelled };
absl::string_view NodeStateName(NodeState s);
inline bool IsScheduled(NodeState s) {
  return s == NodeState::kIssued || s == NodeState::kRunning || s == NodeState::kDone;
}
inline bool IsTerminal(NodeState s) {
  return s == NodeState::kDone || s == NodeState::kFailed || s == NodeState::kCancelled;
}

enum class PriorityClass : uint8_t { kOnline = 0, kOffline = 1 };
absl::string_view PriorityClassName(PriorityClass c);

enum class InstanceState : uint8_t { kPending, kRunning, kDone, kFailed, kCancelled };
absl::string_view InstanceStateName(InstanceState s);

struct InstanceSpec {
  TemplateId template_id;
  std::vector<std::pair<std::string, int64_t>> bindings;  // symbol -> value
  PriorityClass priority_class = PriorityClass::kOffline;
  int32_t priority = 0;  // higher runs first within a class
  TenantId tenant{0};
  Timestamp arrival;
  Timestamp deadline = Timestamp::Infinite();  // SLO
  // checkpoint input name -> retained checkpoint to attach
  std::vector<std::pair<std::string, CheckpointId>> checkpoints;
  std::string label;
  // Devices the instance's operators may be placed on (a job-level
  // allocation, e.g. the Ymir planner's GPU set of a fine-tuning job);
  // empty = any device. SliceScheduler drops every candidate placement that
  // puts one of the instance's operators outside this set; an instance whose
  // partitions cannot be bound inside it waits (it is never placed outside).
  std::vector<DeviceId> allowed_devices;
};

struct NodeTimes {
  Timestamp issue = Timestamp::Never();
  Timestamp ready = Timestamp::Never();
  Timestamp start = Timestamp::Never();
  Timestamp end = Timestamp::Never();
  Timestamp predicted_start = Timestamp::Never();
  Timestamp predicted_end = Timestamp::Never();
};

// A tensor produced by a node: its size and where copies of it live.
struct TensorState {
  Bytes bytes;
  absl::InlinedVector<DeviceId, 2> copies;  // devices holding a copy
  int32_t pending_consumers = 0;  // compute consumers + transfers not yet done
  bool allocated = false;         // producer has started
  bool freed = false;
  bool retained = false;          // becomes a checkpoint at done
  int update_of = -1;             // checkpoint-input index grown in place
};

struct OpNode {
  NodeId id;
  InstanceId instance;
  OpKind kind = OpKind::kGeneric;
  int32_t op_index = -1;  // template op; -1 for transfers
  NodeState state = NodeState::kUnscheduled;
  DeviceId device;        // where it runs; for a transfer, the source
  DeviceId dst_device;    // transfers only
  NodeTimes times;
  Bytes workspace;
  std::vector<TensorState> outputs;          // compute nodes only
  absl::InlinedVector<int64_t, 4> attrs;     // evaluated template attributes
  // Transfers: the tensor moved (producer node, output index) and its consumer.
  NodeId src_node;
  int32_t src_output = 0;
  NodeId consumer;
  int32_t transfer_priority = 0;
  // Frontier bookkeeping.
  int32_t unscheduled_preds = 0;
  int32_t unscheduled_succs = 0;
  std::string failure;
};

struct Checkpoint {
  CheckpointId id;
  DeviceId device;
  Bytes bytes;
  DType dtype = DType::kBF16;
  InstanceId created_by;
  // The creating instance's class: an online checkpoint on a device is a
  // conversation whose next decode step will run there.
  PriorityClass priority_class = PriorityClass::kOnline;
  NodeId updating;  // valid while a node that grows it is issued or running
  std::string name;
};

struct Instance {
  InstanceId id;
  const GraphTemplate* tpl = nullptr;
  InstanceSpec spec;
  SymbolValues symbols{0};
  InstanceState state = InstanceState::kPending;
  std::vector<OpNode> nodes;                       // indexed by template op
  std::vector<CheckpointId> attached;              // by checkpoint-input index
  std::vector<NodeId> transfers;                   // transfer nodes of this instance
  std::vector<CheckpointId> produced;              // retained outputs
  int32_t unfinished = 0;                          // compute nodes not terminal
  Timestamp finished = Timestamp::Never();
  std::string failure;
};

// What is left of an instance once retired.
struct RetiredInstance {
  InstanceId id;
  TemplateId template_id;
  std::string label;
  InstanceState state;
  PriorityClass priority_class;
  Timestamp arrival;
  Timestamp deadline;
  Timestamp finished;
  std::vector<CheckpointId> produced;
  std::string failure;
};

struct DeviceMemory {
  Bytes weights;
  Bytes activations;
  Bytes workspace;
  Bytes checkpoints;
  Bytes total() const { return weights + activations + workspace + checkpoints; }
  bool operator==(const DeviceMemory&) const = default;
};

// One item resident on a device.
struct ResidentItem {
  enum class Kind : uint8_t { kWeights, kActivation, kWorkspace, kCheckpoint };
  Kind kind;
  std::string what;  // weight key, "node:output", "node", "ckpt"
  Bytes bytes;
};

struct FrontierKey {
  PriorityClass cls;
  int32_t neg_priority;
  Timestamp arrival;
  NodeId node;
  auto operator<=>(const FrontierKey&) const = default;
};

class GlobalMappingGraph {
 public:
  explicit GlobalMappingGraph(AcceleratorSet accelerators);
  GlobalMappingGraph(GlobalMappingGraph&&) = default;
  GlobalMappingGraph& operator=(GlobalMappingGraph&&) = default;

  // A deep copy (templates are shared, immutable). For counterfactual runs
  // such as the accuracy experiment's "what happens with no new arrivals".
  GlobalMappingGraph Clone() const;

  // ---- templates and instances ------------------------------------------
  absl::StatusOr<TemplateId> RegisterTemplate(std::shared_ptr<const GraphTemplate> tpl);
  const TemplateRegistry& templates() const { return templates_; }

  // Binds the symbols, computes every op's shapes and bytes, attaches the
  // checkpoints, and adds the instance's nodes as unscheduled.
  absl::StatusOr<InstanceId> Instantiate(const InstanceSpec& spec);

  // ---- placement and progress (the state machine above) -----------------
  absl::Status Issue(NodeId node, DeviceId device, Timestamp now);
  // Adds an issued transfer of (producer, output) to `dst` for `consumer`.
  absl::StatusOr<NodeId> IssueTransfer(NodeId producer, int output, DeviceId dst,
                                       NodeId consumer, int32_t priority, Timestamp now);
  absl::Status Start(NodeId node, Timestamp now);
  absl::Status Finish(NodeId node, Timestamp now);
  absl::Status Fail(NodeId node, absl::string_view reason, Timestamp now);
  absl::Status CancelInstance(InstanceId instance, absl::string_view reason, Timestamp now);
  absl::Status SetPrediction(NodeId node, Timestamp start, Timestamp end);

  // ---- weights and checkpoints --------------------------------------------
  absl::Status LoadWeights(DeviceId device, absl::string_view key, Bytes bytes);
  absl::Status UnloadWeights(DeviceId device, absl::string_view key);
  bool HasWeights(DeviceId device, absl::string_view key) const;
  absl::Status ReleaseCheckpoint(CheckpointId id);
  const Checkpoint* FindCheckpoint(CheckpointId id) const;

  // ---- queries ------------------------------------------------------------
  const AcceleratorSet& accelerators() const { return accel_; }
  const OpNode* FindNode(NodeId id) const;
  const Instance* FindInstance(InstanceId id) const;
  absl::StatusOr<NodeId> NodeOf(InstanceId instance, absl::string_view op_name) const;
  // True when the node satisfies the readiness rule on its device.
  bool IsReady(NodeId node) const;
  // Bytes of one input (op input index) of a compute node.
  const absl::btree_set<FrontierKey>& unscheduled_frontier() const { return unscheduled_; }
  const absl::btree_set<NodeId>& scheduled_frontier() const { return scheduled_frontier_; }
  const DeviceMemory& memory(DeviceId d) const { return memory_[d.value()]; }
  std::vector<ResidentItem> ResidentSet(DeviceId d) const;
  NodeId running_compute(DeviceId d) const { return running_compute_[d.value()]; }
  // Compute nodes issued to `d` and not finished (queued or running).
  int32_t outstanding_compute(DeviceId d) const { return outstanding_[d.value()]; }
  // Of those, the ones of one priority class.
  int32_t outstanding_compute(DeviceId d, PriorityClass c) const {
    const int32_t offline = outstanding_offline_[d.value()];
    return c == PriorityClass::kOffline ? offline : outstanding_[d.value()] - offline;
  }
  int64_t total_outstanding_compute() const { return total_outstanding_; }
  // Live checkpoints of online instances on `d`: the KV caches of the
  // conversations whose decode steps come back to that device.
  int32_t online_checkpoints(DeviceId d) const { return online_checkpoints_[d.value()]; }
  // When an online checkpoint on `d` was last made or grown (a prefill or
  // decode step of a conversation finishing there); Timestamp::Epoch()
  // before any. A conversation that still streams touches its devices once
  // per token; a cache kept for later (Submit's retained outputs) does not.
  Timestamp online_kv_touched(DeviceId d) const { return online_kv_touched_[d.value()]; }
  NodeId active_transfer(DeviceId d) const { return active_transfer_[d.value()]; }
  size_t num_instances() const { return instances_.size(); }
  size_t num_nodes() const { return num_nodes_; }
  const absl::btree_map<uint64_t, std::unique_ptr<Instance>>& instances() const { return instances_; }
  const absl::btree_map<uint64_t, CheckpointId>& checkpoint_index() const { return checkpoint_ids_; }
  std::vector<RetiredInstance> TakeRetired();

  // Recomputes frontiers and memory from scratch and compares them with the
  // incrementally maintained ones. For tests and debug checks.
  absl::Status VerifyInvariants() const;

  // A compact, pointer-free copy of everything the simulator needs.
  GmgSnapshot Snapshot(Timestamp now) const;
  // The same into an existing snapshot, reusing its capacity (no allocation
  // once warm): the scheduler keeps one and refreshes it every round.
  void SnapshotInto(Timestamp now, GmgSnapshot* out) const;

 private:
  OpNode* MutableNode(NodeId id);
  Instance* MutableInstance(InstanceId id);
  absl::Status StartCompute(Instance& inst, OpNode& node, Timestamp now);
  absl::Status StartTransfer(OpNode& node, Timestamp now);
  absl::Status FinishCompute(Instance& inst, OpNode& node, Timestamp now);
  absl::Status FinishTransfer(OpNode& node, Timestamp now);
  void ConsumeTensor(NodeId producer, int output);
  void FreeTensor(OpNode& producer, TensorState& t);
  void ReleaseNodeHoldings(Instance& inst, OpNode& node);
  void FailInstance(Instance& inst, absl::string_view reason, Timestamp now,
                    NodeState terminal_for_others);
  void MaybeRetire(Instance& inst);
  void AddToUnscheduled(const Instance& inst, const OpNode& node);
  void RemoveFromUnscheduled(const Instance& inst, const OpNode& node);
  FrontierKey KeyOf(const Instance& inst, const OpNode& node) const;
  bool ComputeReady(const Instance& inst, const OpNode& node) const;
  bool TransferReady(const OpNode& node) const;
  void Charge(DeviceId d, Bytes DeviceMemory::*field, Bytes delta);
  // Issued or finished/failed compute node of `inst` on `d`: delta +1 / -1.
  void CountOutstanding(const Instance& inst, DeviceId d, int32_t delta);
  // SnapshotInto's phases (snapshot.cc), in the order it runs them.
  void SnapshotCheckpoints(GmgSnapshot& s) const;
  void SnapshotInstances(GmgSnapshot& s) const;
  void ReserveSnapshot(GmgSnapshot& s) const;
  void SnapshotComputeNodes(GmgSnapshot& s) const;
  void SnapshotInputs(GmgSnapshot& s) const;
  void SnapshotTransfers(GmgSnapshot& s) const;
  void SnapshotDevices(GmgSnapshot& s) const;

  AcceleratorSet accel_;
  TemplateRegistry templates_;
  uint64_t next_instance_ = 1;
  uint64_t next_transfer_ = 1;
  uint64_t next_checkpoint_ = 1;
  size_t num_nodes_ = 0;
  absl::btree_map<uint64_t, std::unique_ptr<Instance>> instances_;
  absl::flat_hash_map<uint64_t, OpNode> transfers_;
  absl::btree_map<uint64_t, CheckpointId> checkpoint_ids_;
  absl::flat_hash_map<uint64_t, Checkpoint> checkpoints_;
  std::vector<absl::btree_map<std::string, Bytes>> weights_;  // per device
  std::vector<DeviceMemory> memory_;
  std::vector<NodeId> running_compute_;
  std::vector<NodeId> active_transfer_;
  std::vector<int32_t> outstanding_;  // issued or running compute nodes per device
  std::vector<int32_t> outstanding_offline_;  // the offline instances' share of outstanding_
  std::vector<int32_t> online_checkpoints_;   // per device
  std::vector<Timestamp> online_kv_touched_;  // per device
  int64_t total_outstanding_ = 0;
  absl::btree_set<FrontierKey> unscheduled_;
  absl::btree_set<NodeId> scheduled_frontier_;
  std::vector<RetiredInstance> retired_;
};

// Node ids: a compute node's id encodes its instance and template op index
// (instance << 20 | op); transfer ids have the top bit set. Ids are never
// reused within one GMG.
constexpr uint64_t kTransferIdBit = uint64_t{1} << 63;
constexpr int kOpIndexBits = 20;
inline NodeId ComputeNodeId(InstanceId inst, int op) {
  return NodeId((inst.value() << kOpIndexBits) | static_cast<uint64_t>(op));
}
inline bool IsTransferId(NodeId id) { return (id.value() & kTransferIdBit) != 0; }
inline InstanceId InstanceOfComputeId(NodeId id) {
  return InstanceId(id.value() >> kOpIndexBits);
}
inline int OpIndexOfComputeId(NodeId id) {
  return static_cast<int>(id.value() & ((uint64_t{1} << kOpIndexBits) - 1));
}

}  // namespace slicesched
