// Graph templates: registered once, instantiated many times.
//
// A template is a DAG of fused operators whose tensor shapes are symbolic
// expressions over named symbols (B = batch, S = new tokens, C = context, ...).
// Binding the symbols at instantiation gives every operator concrete shapes
// and byte counts before anything runs (docs/architecture.md, invariant 3), so memory
// and time can be computed before placement.
//
// Inputs of an op are referenced by string:
//   "op"            first output of op
//   "op:tensor"     named output of op
//   "$name"         an external input supplied with the instance (host data,
//                   e.g. prompt token ids; not charged to device memory)
//   "@name"         a checkpoint input: a tensor retained on some device by an
//                   earlier instance (e.g. a conversation's KV cache), attached
//                   at instantiation
// An output marked `retain` outlives its instance as a new checkpoint; an
// output that `updates` a checkpoint input grows that checkpoint in place (a
// decode step appending to the KV cache) and must run where it lives.
//
// A template also carries predefined candidate partitions: maps from every op
// to an abstract device slot 0..k-1; the scheduler binds slots to devices.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "slicesched/common/ids.h"
#include "slicesched/common/units.h"
#include "slicesched/gmg/dtype.h"
#include "slicesched/gmg/shape_expr.h"

namespace slicesched {

enum class OpKind : uint8_t {
  kEmbedding,      // int token ids -> hidden states
  kFusedLayers,    // a group of transformer decoder layers (prefill/decode)
  kLmHead,         // hidden -> logits
  kSample,         // logits -> token ids
  kMatmul,         // batched matmul (paper Eq 2)
  kTrainForward,   // fused layers forward with autograd (fine-tuning)
  kTrainBackward,  // fused layers backward
  kOptimizerStep,  // adapter update
  kGeneric,        // anything else; no typing rules
  kTransfer,       // GMG-internal: a cross-device copy (never in templates)
  // Appended after kTransfer so that the numeric values above (stored in
  // snapshots) stay stable.
  kTrainLoss,      // task head + loss + the head's backward (fine-tuning)
};
absl::string_view OpKindName(OpKind k);
absl::StatusOr<OpKind> ParseOpKind(absl::string_view name);

struct TensorSpec {
  std::string name;
  DType dtype = DType::kBF16;
  std::vector<ShapeExpr> dims;
  bool retain = false;          // becomes a checkpoint when the op is done
  std::string updates;          // name of a checkpoint input grown in place
};

struct InputRef {
  enum class Kind : uint8_t { kOp, kExternal, kCheckpoint };
  Kind kind = Kind::kOp;
  int index = 0;   // op index, external-input index or checkpoint-input index
  int output = 0;  // output index for kOp
};

struct OpSpec {
  std::string name;
  OpKind kind = OpKind::kGeneric;
  std::vector<std::string> input_names;
  std::vector<InputRef> inputs;              // resolved by Build()
  std::vector<TensorSpec> outputs;
  std::vector<std::pair<std::string, ShapeExpr>> attrs;  // integer attributes
  std::string weight_key;                    // identity of resident weights
  Bytes weight_bytes;                        // resident once per device
  int64_t weight_params = 0;                 // parameter count (for reports)
  ShapeExpr workspace;                       // transient bytes while running
  std::vector<int> preds;                    // distinct op predecessors
  std::vector<int> succs;                    // distinct op successors
  int checkpoint_update_of = -1;             // checkpoint input updated, if any
  // "<template>|<op>": an op of another template that computes the same
  // thing with the same attributes (a chunked prefill's pieces and the
  // one-piece prefill's groups); the operator estimator then learns one
  // model for both (OpEstimator::Register). Empty: a model of its own.
  std::string cost_of;
};

struct ExternalInputSpec {
  std::string name;
  DType dtype = DType::kI64;
  std::vector<ShapeExpr> dims;
};

struct CheckpointInputSpec {
  std::string name;
  DType dtype = DType::kBF16;
  std::vector<ShapeExpr> dims;  // shape of the retained tensor when attached
};

struct CandidatePartition {
  std::string name;
  int num_slots = 1;
  std::vector<int> slot_of_op;  // indexed by op index
};

class GraphTemplate {
 public:
  const std::string& name() const { return name_; }
  TemplateId id() const { return id_; }
  const SymbolTable& symbols() const { return symbols_; }
  // Values fixed by the template itself (model dimensions); instances bind the rest.
  const SymbolValues& defines() const { return defines_; }
  const std::vector<OpSpec>& ops() const { return ops_; }
  const OpSpec& op(int i) const { return ops_[i]; }
  int num_ops() const { return static_cast<int>(ops_.size()); }
  const std::vector<int>& topo_order() const { return topo_order_; }
  const std::vector<ExternalInputSpec>& external_inputs() const { return externals_; }
  const std::vector<CheckpointInputSpec>& checkpoint_inputs() const { return checkpoints_; }
  const std::vector<CandidatePartition>& partitions() const { return partitions_; }
  absl::StatusOr<int> FindOp(absl::string_view name) const;
  int FindCheckpointInput(absl::string_view name) const;  // -1 if absent
  // Number of consumers of (op, output) inside the template.
  int NumConsumers(int op, int output) const {
    return consumer_counts_[op][output];
  }
  // Symbols an instance must bind (not fixed by defines()).
  std::vector<std::string> FreeSymbols() const;
  // Total resident weight bytes over distinct weight keys.
  Bytes TotalWeightBytes() const;

 private:
  friend class TemplateBuilder;
  friend class TemplateRegistry;
  GraphTemplate() = default;

  std::string name_;
  TemplateId id_;
  SymbolTable symbols_;
  SymbolValues defines_{0};
  std::vector<OpSpec> ops_;
  std::vector<int> topo_order_;
  std::vector<ExternalInputSpec> externals_;
  std::vector<CheckpointInputSpec> checkpoints_;
  std::vector<CandidatePartition> partitions_;
  std::vector<std::vector<int>> consumer_counts_;
};

// Builds and validates a template. Methods record the first error and
// Build() returns it; every message names the op (or partition) at fault.
class TemplateBuilder {
 public:
  explicit TemplateBuilder(std::string name);

  // Fixes a symbol for every instance (e.g. H = 4096).
  TemplateBuilder& Define(absl::string_view symbol, int64_t value);
  TemplateBuilder& ExternalInput(absl::string_view name, DType dtype,
                                 const std::vector<std::string>& dims);
  TemplateBuilder& CheckpointInput(absl::string_view name, DType dtype,
                                   const std::vector<std::string>& dims);

  // Starts a new op; the calls below apply to the op started last.
  TemplateBuilder& Op(absl::string_view name, OpKind kind);
  TemplateBuilder& Inputs(std::vector<std::string> refs);
  TemplateBuilder& Output(absl::string_view name, DType dtype,
                          const std::vector<std::string>& dims);
  TemplateBuilder& RetainedOutput(absl::string_view name, DType dtype,
                                  const std::vector<std::string>& dims);
  TemplateBuilder& UpdateOutput(absl::string_view name, absl::string_view checkpoint_input,
                                const std::vector<std::string>& dims);
  TemplateBuilder& Attr(absl::string_view name, absl::string_view expr);
  TemplateBuilder& Weights(absl::string_view key, Bytes bytes, int64_t params = 0);
  TemplateBuilder& Workspace(absl::string_view bytes_expr);
  // The op's cost is that of `op` in template `tpl` (OpSpec::cost_of).
  TemplateBuilder& CostOf(absl::string_view tpl, absl::string_view op);

  // A candidate partition: op name -> slot. Every op must be mapped.
  TemplateBuilder& Partition(absl::string_view name,
                             const std::vector<std::pair<std::string, int>>& slots);

  absl::StatusOr<std::shared_ptr<const GraphTemplate>> Build();

 private:
  absl::StatusOr<std::vector<ShapeExpr>> ParseDims(const std::vector<std::string>& dims);
  OpSpec* current();
  void Fail(absl::Status status);
  // Build()'s steps, each InvalidArgument naming the template and what is
  // wrong: unique names (and the ops' index by name), inputs resolved and
  // typed, successors and a topological order (a cycle named along its
  // path), then the partitions.
  using OpIndex = absl::flat_hash_map<std::string, int>;
  static absl::Status Invalid(const GraphTemplate& t, absl::string_view what);
  static absl::Status CheckNames(const GraphTemplate& t, OpIndex* op_index);
  static absl::Status ResolveInputs(GraphTemplate& t, const OpIndex& op_index);
  static absl::Status OrderOps(GraphTemplate& t);
  absl::Status AddPartitions(GraphTemplate& t, const OpIndex& op_index) const;

  std::unique_ptr<GraphTemplate> t_;
  std::vector<std::pair<std::string, int64_t>> defines_;
  std::vector<std::pair<std::string, std::vector<std::pair<std::string, int>>>> partitions_;
  absl::Status status_;
};

// Templates registered with the GMG, by id and by name. Registering a name
// twice is an error (templates are immutable once registered).
class TemplateRegistry {
 public:
  absl::StatusOr<TemplateId> Register(std::shared_ptr<const GraphTemplate> tpl);
  const GraphTemplate* Find(TemplateId id) const;
  absl::StatusOr<TemplateId> FindByName(absl::string_view name) const;
  size_t size() const { return templates_.size(); }
  const std::vector<std::shared_ptr<GraphTemplate>>& all() const { return templates_; }

 private:
  std::vector<std::shared_ptr<GraphTemplate>> templates_;
  absl::flat_hash_map<std::string, TemplateId> by_name_;
};

}  // namespace slicesched
