// GmgSnapshot: a compact, pointer-free copy of the GMG for the simulator.
//
// Everything is a flat std::vector of plain structs indexed by dense uint32
// positions, so copying a snapshot is a handful of memcpy-like vector copies
// and the simulator never chases pointers or hashes ids.
//
// Layout
//   devices[d]            one per accelerator, d = DeviceId value
//   instances[i]          live instances in id order; nodes of instance i are
//                         nodes[first_node, first_node + num_nodes) in
//                         template op order, followed by nothing else
//   nodes[n]              compute nodes (grouped by instance, as above) then
//                         transfer nodes (n >= num_compute_nodes)
//   pred_offsets / preds  CSR: predecessors of node n are
//                         preds[pred_offsets[n] .. pred_offsets[n+1]); a
//                         transfer's single predecessor is its producer
//   succ_offsets / succs  CSR, the reverse relation (compute successors, and
//                         transfers out of a producer)
//   input_offsets/inputs  CSR: tensors a compute node reads (indices into
//                         tensors); a transfer reads one tensor
//   tensors[t]            outputs of compute nodes: node n's outputs are
//                         tensors[tensor_offsets[n] .. tensor_offsets[n+1])
//   copies                (tensor, device) pairs: where each tensor has a copy
//   ckpt_inputs           CSR by node (ckpt_offsets): checkpoint indices read
//   checkpoints[c]        retained tensors
//   attrs                 CSR by node (attr_offsets): evaluated template
//                         attributes, the estimator's feature inputs
// Indices use kNone (0xffffffff) for "none".
#pragma once

#include <cstdint>
#include <vector>

#include "slicesched/common/ids.h"
#include "slicesched/common/units.h"
#include "slicesched/gmg/gmg.h"

namespace slicesched {

class GmgSnapshot {
 public:
  static constexpr uint32_t kNone = 0xffffffffu;

  struct Device {
    int64_t capacity;
    int64_t weights, activations, workspace, checkpoints;  // bytes now
    uint32_t running;          // node index of the running compute node
    uint32_t active_transfer;  // node index of its active transfer
    uint16_t type;             // index into device_types
  };
  struct Instance {
    uint64_t id;
    uint32_t template_id;
    uint32_t first_node;
    uint32_t num_nodes;
    uint8_t priority_class;
    int32_t priority;
    int64_t arrival_ns;
    int64_t deadline_ns;
  };
  struct Node {
    uint64_t id;
    uint32_t instance;       // index into instances
    int32_t op_index;        // -1 for transfers
    uint8_t kind;            // OpKind
    uint8_t state;           // NodeState
    uint16_t device;         // DeviceId value, 0xffff if unplaced
    uint16_t dst_device;     // transfers
    int32_t priority;        // instance priority (transfers: their own)
    uint8_t priority_class;
    int64_t issue_ns, ready_ns, start_ns, predicted_end_ns;
    int64_t workspace_bytes;
    int64_t transfer_bytes;  // transfers: bytes moved
    uint32_t consumer;       // transfers: node index of the consumer
  };
  struct Tensor {
    uint32_t node;
    int64_t bytes;
    int32_t pending_consumers;
    uint8_t allocated, freed, retained;
    int32_t update_of;        // checkpoint index (into checkpoints) or -1
  };
  struct Copy {
    uint32_t tensor;
    uint16_t device;
  };
  struct Checkpoint {
    uint64_t id;
    uint16_t device;
    int64_t bytes;
    uint32_t updating;  // node index, kNone when idle
  };

  Timestamp taken_at;
  std::vector<std::string> device_types;
  std::vector<Device> devices;
  std::vector<Instance> instances;
  std::vector<Node> nodes;
  uint32_t num_compute_nodes = 0;
  std::vector<uint32_t> pred_offsets, preds;
  std::vector<uint32_t> succ_offsets, succs;
  std::vector<uint32_t> input_offsets, inputs;
  std::vector<uint32_t> tensor_offsets;
  std::vector<Tensor> tensors;
  std::vector<Copy> copies;
  std::vector<uint32_t> ckpt_offsets, ckpt_inputs;
  std::vector<Checkpoint> checkpoints;
  std::vector<uint32_t> attr_offsets;
  std::vector<int64_t> attrs;

  // Empties every array, keeping capacity (for reuse with SnapshotInto).
  void Clear();
  // Approximate heap bytes held (for reports and benchmarks).
  size_t ByteSize() const;
};

}  // namespace slicesched
