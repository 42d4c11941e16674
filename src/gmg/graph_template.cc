#include "slicesched/gmg/graph_template.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"

namespace slicesched {
namespace {

struct KindRule {
  OpKind kind;
  absl::string_view name;
  int min_inputs;
  int max_inputs;
  // Type class required of input 0: 'f' floating, 'i' integer, '*' any.
  char input0;
};

constexpr KindRule kKindRules[] = {
    {OpKind::kEmbedding, "embedding", 1, 1, 'i'},
    {OpKind::kFusedLayers, "fused_layers", 1, 64, 'f'},
    {OpKind::kLmHead, "lm_head", 1, 1, 'f'},
    {OpKind::kSample, "sample", 1, 1, 'f'},
    {OpKind::kMatmul, "matmul", 2, 2, 'f'},
    {OpKind::kTrainForward, "train_forward", 1, 64, 'f'},
    {OpKind::kTrainBackward, "train_backward", 1, 64, 'f'},
    {OpKind::kOptimizerStep, "optimizer_step", 1, 64, '*'},
    {OpKind::kGeneric, "generic", 0, 1 << 20, '*'},
    {OpKind::kTransfer, "transfer", 1, 1, '*'},
    {OpKind::kTrainLoss, "train_loss", 1, 2, 'f'},
};

const KindRule& RuleFor(OpKind k) {
  for (const auto& r : kKindRules) {
    if (r.kind == k) return r;
  }
  return kKindRules[8];
}

}  // namespace

absl::string_view OpKindName(OpKind k) { return RuleFor(k).name; }

absl::StatusOr<OpKind> ParseOpKind(absl::string_view name) {
  for (const auto& r : kKindRules) {
    if (r.name == name && r.kind != OpKind::kTransfer) return r.kind;
  }
  return absl::InvalidArgumentError(StrCat("unknown op kind '", name, "'"));
}

absl::StatusOr<int> GraphTemplate::FindOp(absl::string_view name) const {
  for (int i = 0; i < num_ops(); ++i) {
    if (ops_[i].name == name) return i;
  }
  return absl::NotFoundError(StrCat("template '", name_, "' has no op '", name, "'"));
}

int GraphTemplate::FindCheckpointInput(absl::string_view name) const {
  for (size_t i = 0; i < checkpoints_.size(); ++i) {
    if (checkpoints_[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

std::vector<std::string> GraphTemplate::FreeSymbols() const {
  std::vector<std::string> out;
  for (size_t i = 0; i < symbols_.size(); ++i) {
    if (!defines_.IsBound(static_cast<int>(i))) out.push_back(symbols_.name(static_cast<int>(i)));
  }
  return out;
}

Bytes GraphTemplate::TotalWeightBytes() const {
  absl::flat_hash_map<std::string, Bytes> keys;
  for (const auto& op : ops_) {
    if (!op.weight_key.empty()) keys[op.weight_key] = op.weight_bytes;
  }
  Bytes total;
  for (const auto& [k, b] : keys) total += b;
  return total;
}

// ---------------------------------------------------------------------------

TemplateBuilder::TemplateBuilder(std::string name) : t_(new GraphTemplate()) {
  t_->name_ = std::move(name);
  if (t_->name_.empty()) Fail(absl::InvalidArgumentError("template name must not be empty"));
}

void TemplateBuilder::Fail(absl::Status status) {
  if (status_.ok()) {
    status_ = Annotate(status, StrCat("template '", t_->name_, "'"));
  }
}

OpSpec* TemplateBuilder::current() {
  if (t_->ops_.empty()) {
    Fail(absl::FailedPreconditionError("an op property was set before any Op() call"));
    return nullptr;
  }
  return &t_->ops_.back();
}

absl::StatusOr<std::vector<ShapeExpr>> TemplateBuilder::ParseDims(
    const std::vector<std::string>& dims) {
  std::vector<ShapeExpr> out;
  out.reserve(dims.size());
  for (const auto& d : dims) {
    SLICESCHED_ASSIGN_OR_RETURN(ShapeExpr e, ShapeExpr::Parse(d, &t_->symbols_));
    out.push_back(std::move(e));
  }
  return out;
}

TemplateBuilder& TemplateBuilder::Define(absl::string_view symbol, int64_t value) {
  t_->symbols_.Intern(ToStd(symbol));
  defines_.emplace_back(std::string(symbol), value);
  return *this;
}

TemplateBuilder& TemplateBuilder::ExternalInput(absl::string_view name, DType dtype,
                                                const std::vector<std::string>& dims) {
  auto parsed = ParseDims(dims);
  if (!parsed.ok()) {
    Fail(Annotate(parsed.status(), StrCat("external input '", name, "'")));
    return *this;
  }
  t_->externals_.push_back({std::string(name), dtype, *std::move(parsed)});
  return *this;
}

TemplateBuilder& TemplateBuilder::CheckpointInput(absl::string_view name, DType dtype,
                                                  const std::vector<std::string>& dims) {
  auto parsed = ParseDims(dims);
  if (!parsed.ok()) {
    Fail(Annotate(parsed.status(), StrCat("checkpoint input '", name, "'")));
    return *this;
  }
  t_->checkpoints_.push_back({std::string(name), dtype, *std::move(parsed)});
  return *this;
}

TemplateBuilder& TemplateBuilder::Op(absl::string_view name, OpKind kind) {
  OpSpec op;
  op.name = std::string(name);
  op.kind = kind;
  op.workspace = ShapeExpr::Constant(0);
  if (kind == OpKind::kTransfer) {
    Fail(absl::InvalidArgumentError(
        StrCat("op '", name, "': transfers are inserted by the scheduler, not declared")));
  }
  t_->ops_.push_back(std::move(op));
  return *this;
}

TemplateBuilder& TemplateBuilder::Inputs(std::vector<std::string> refs) {
  if (OpSpec* op = current()) op->input_names = std::move(refs);
  return *this;
}

TemplateBuilder& TemplateBuilder::Output(absl::string_view name, DType dtype,
                                         const std::vector<std::string>& dims) {
  OpSpec* op = current();
  if (op == nullptr) return *this;
  auto parsed = ParseDims(dims);
  if (!parsed.ok()) {
    Fail(Annotate(parsed.status(), StrCat("op '", op->name, "' output '", name, "'")));
    return *this;
  }
  TensorSpec t;
  t.name = std::string(name);
  t.dtype = dtype;
  t.dims = *std::move(parsed);
  op->outputs.push_back(std::move(t));
  return *this;
}

TemplateBuilder& TemplateBuilder::RetainedOutput(absl::string_view name, DType dtype,
                                                 const std::vector<std::string>& dims) {
  Output(name, dtype, dims);
  if (OpSpec* op = current(); op != nullptr && !op->outputs.empty()) op->outputs.back().retain = true;
  return *this;
}

TemplateBuilder& TemplateBuilder::UpdateOutput(absl::string_view name,
                                               absl::string_view checkpoint_input,
                                               const std::vector<std::string>& dims) {
  OpSpec* op = current();
  if (op == nullptr) return *this;
  int ck = t_->FindCheckpointInput(checkpoint_input);
  if (ck < 0) {
    Fail(absl::InvalidArgumentError(StrCat("op '", op->name, "' output '", name,
                                                 "' updates unknown checkpoint input '",
                                                 checkpoint_input, "'")));
    return *this;
  }
  Output(name, t_->checkpoints_[ck].dtype, dims);
  if (!op->outputs.empty()) op->outputs.back().updates = std::string(checkpoint_input);
  return *this;
}

TemplateBuilder& TemplateBuilder::Attr(absl::string_view name, absl::string_view expr) {
  OpSpec* op = current();
  if (op == nullptr) return *this;
  auto e = ShapeExpr::Parse(ToStd(expr), &t_->symbols_);
  if (!e.ok()) {
    Fail(Annotate(e.status(), StrCat("op '", op->name, "' attribute '", name, "'")));
    return *this;
  }
  op->attrs.emplace_back(std::string(name), *std::move(e));
  return *this;
}

TemplateBuilder& TemplateBuilder::Weights(absl::string_view key, Bytes bytes, int64_t params) {
  OpSpec* op = current();
  if (op == nullptr) return *this;
  if (bytes < Bytes(0)) {
    Fail(absl::InvalidArgumentError(StrCat("op '", op->name, "': negative weight bytes")));
  }
  op->weight_key = std::string(key);
  op->weight_bytes = bytes;
  op->weight_params = params;
  return *this;
}

TemplateBuilder& TemplateBuilder::CostOf(absl::string_view tpl, absl::string_view op_name) {
  OpSpec* op = current();
  if (op == nullptr) return *this;
  if (tpl.empty() || op_name.empty() || absl::StrContains(tpl, "|") || absl::StrContains(op_name, "|")) {
    Fail(absl::InvalidArgumentError(StrCat("op '", op->name, "': cost_of needs a template and an op name without '|', got '",
                                           tpl, "' and '", op_name, "'")));
    return *this;
  }
  op->cost_of = StrCat(tpl, "|", op_name);
  return *this;
}

TemplateBuilder& TemplateBuilder::Workspace(absl::string_view bytes_expr) {
  OpSpec* op = current();
  if (op == nullptr) return *this;
  auto e = ShapeExpr::Parse(ToStd(bytes_expr), &t_->symbols_);
  if (!e.ok()) {
    Fail(Annotate(e.status(), StrCat("op '", op->name, "' workspace")));
    return *this;
  }
  op->workspace = *std::move(e);
  return *this;
}

TemplateBuilder& TemplateBuilder::Partition(
    absl::string_view name, const std::vector<std::pair<std::string, int>>& slots) {
  partitions_.emplace_back(std::string(name), slots);
  return *this;
}

absl::Status TemplateBuilder::Invalid(const GraphTemplate& t, absl::string_view what) {
  return absl::InvalidArgumentError(StrCat("template '", t.name_, "': ", what));
}

absl::StatusOr<std::shared_ptr<const GraphTemplate>> TemplateBuilder::Build() {
  if (!status_.ok()) return status_;
  GraphTemplate& t = *t_;
  if (t.ops_.empty()) return Invalid(t, "has no ops");
  if (t.ops_.size() >= (size_t{1} << 20)) {
    return Invalid(t, "too many ops");
  }
  OpIndex op_index;
  SLICESCHED_RETURN_IF_ERROR(CheckNames(t, &op_index));
  SLICESCHED_RETURN_IF_ERROR(ResolveInputs(t, op_index));
  SLICESCHED_RETURN_IF_ERROR(OrderOps(t));
  // Defines.
  t.defines_ = SymbolValues(t.symbols_.size());
  for (const auto& [name, value] : defines_) {
    auto sym = t.symbols_.Find(name);
    t.defines_.Set(*sym, value);
  }
  SLICESCHED_RETURN_IF_ERROR(AddPartitions(t, op_index));

  std::shared_ptr<const GraphTemplate> out(t_.release());
  t_.reset(new GraphTemplate());
  status_ = absl::FailedPreconditionError("Build() was already called");
  return out;
}

// Names: ops, external inputs and checkpoint inputs must be unique.
absl::Status TemplateBuilder::CheckNames(const GraphTemplate& t, OpIndex* op_index) {
  for (int i = 0; i < t.num_ops(); ++i) {
    const OpSpec& op = t.ops_[i];
    if (op.name.empty()) return Invalid(t, StrCat("op #", i, " has an empty name"));
    if (op.name.find_first_of(":$@") != std::string::npos) {
      return Invalid(t, StrCat("op '", op.name, "': names may not contain ':', '$' or '@'"));
    }
    if (!op_index->emplace(op.name, i).second) {
      return Invalid(t, StrCat("duplicate op name '", op.name, "'"));
    }
    if (op.outputs.empty()) return Invalid(t, StrCat("op '", op.name, "' has no outputs"));
    absl::flat_hash_map<std::string, int> out_names;
    for (const auto& o : op.outputs) {
      if (o.retain && !o.updates.empty()) {
        return Invalid(t, StrCat("op '", op.name, "' output '", o.name,
                                 "' cannot both be retained and update a checkpoint"));
      }
      if (!out_names.emplace(o.name, 0).second) {
        return Invalid(t, StrCat("op '", op.name, "': duplicate output name '", o.name, "'"));
      }
    }
  }
  {
    absl::flat_hash_map<std::string, int> seen;
    for (const auto& e : t.externals_) {
      if (!seen.emplace("$" + e.name, 0).second) {
        return Invalid(t, StrCat("duplicate external input '", e.name, "'"));
      }
    }
    for (const auto& c : t.checkpoints_) {
      if (!seen.emplace("@" + c.name, 0).second) {
        return Invalid(t, StrCat("duplicate checkpoint input '", c.name, "'"));
      }
    }
  }
  return absl::OkStatus();
}

// Resolves each op's inputs (ops, $external and @checkpoint inputs), checks
// arity and types, and which checkpoint each op updates.
absl::Status TemplateBuilder::ResolveInputs(GraphTemplate& t, const OpIndex& op_index) {
  std::vector<int> ckpt_updater(t.checkpoints_.size(), -1);
  for (int i = 0; i < t.num_ops(); ++i) {
    OpSpec& op = t.ops_[i];
    op.inputs.clear();
    op.preds.clear();
    const KindRule& rule = RuleFor(op.kind);
    const int n = static_cast<int>(op.input_names.size());
    if (n < rule.min_inputs || n > rule.max_inputs) {
      return Invalid(t, StrCat("op '", op.name, "' (", rule.name, ") takes ", rule.min_inputs,
                               rule.min_inputs == rule.max_inputs ? "" : StrCat("..", rule.max_inputs),
                               " inputs, got ", n));
    }
    for (int k = 0; k < n; ++k) {
      const std::string& ref = op.input_names[k];
      InputRef r;
      DType dtype;
      if (!ref.empty() && ref[0] == '$') {
        auto it = std::find_if(t.externals_.begin(), t.externals_.end(),
                               [&](const auto& e) { return e.name == ref.substr(1); });
        if (it == t.externals_.end()) {
          return Invalid(t, StrCat("op '", op.name, "': input '", ref, "' names no external input"));
        }
        r.kind = InputRef::Kind::kExternal;
        r.index = static_cast<int>(it - t.externals_.begin());
        dtype = it->dtype;
      } else if (!ref.empty() && ref[0] == '@') {
        int ck = t.FindCheckpointInput(ref.substr(1));
        if (ck < 0) {
          return Invalid(t, StrCat("op '", op.name, "': input '", ref, "' names no checkpoint input"));
        }
        r.kind = InputRef::Kind::kCheckpoint;
        r.index = ck;
        dtype = t.checkpoints_[ck].dtype;
      } else {
        std::string producer = ref, out_name;
        if (auto colon = ref.find(':'); colon != std::string::npos) {
          producer = ref.substr(0, colon);
          out_name = ref.substr(colon + 1);
        }
        auto it = op_index.find(producer);
        if (it == op_index.end()) {
          return Invalid(t, StrCat("op '", op.name, "': input '", ref,
                                   "' names no op, external input ($name) or checkpoint (@name)"));
        }
        if (it->second == i) return Invalid(t, StrCat("op '", op.name, "' reads its own output"));
        const OpSpec& p = t.ops_[it->second];
        int out = 0;
        if (!out_name.empty()) {
          out = -1;
          for (size_t o = 0; o < p.outputs.size(); ++o) {
            if (p.outputs[o].name == out_name) out = static_cast<int>(o);
          }
          if (out < 0) {
            return Invalid(t, StrCat("op '", op.name, "': input '", ref, "': op '", producer,
                                     "' has no output '", out_name, "'"));
          }
        }
        r.kind = InputRef::Kind::kOp;
        r.index = it->second;
        r.output = out;
        dtype = p.outputs[out].dtype;
        if (std::find(op.preds.begin(), op.preds.end(), it->second) == op.preds.end()) {
          op.preds.push_back(it->second);
        }
      }
      if (k == 0 && rule.input0 == 'f' && !IsFloating(dtype)) {
        return Invalid(t, StrCat("op '", op.name, "' (", rule.name, "): input 0 '", ref, "' is ",
                                 DTypeName(dtype), ", expected a floating-point tensor"));
      }
      if (k == 0 && rule.input0 == 'i' && !IsInteger(dtype)) {
        return Invalid(t, StrCat("op '", op.name, "' (", rule.name, "): input 0 '", ref, "' is ",
                                 DTypeName(dtype), ", expected an integer tensor"));
      }
      op.inputs.push_back(r);
    }
    if (op.kind == OpKind::kMatmul && op.inputs.size() == 2) {
      // Both operands must be floating point.
      const InputRef& r1 = op.inputs[1];
      DType d1 = r1.kind == InputRef::Kind::kOp ? t.ops_[r1.index].outputs[r1.output].dtype
                 : r1.kind == InputRef::Kind::kExternal ? t.externals_[r1.index].dtype
                                                        : t.checkpoints_[r1.index].dtype;
      if (!IsFloating(d1)) {
        return Invalid(t, StrCat("op '", op.name, "' (matmul): input 1 '", op.input_names[1],
                                 "' is ", DTypeName(d1), ", expected a floating-point tensor"));
      }
    }
    op.checkpoint_update_of = -1;
    for (const auto& o : op.outputs) {
      if (o.updates.empty()) continue;
      int ck = t.FindCheckpointInput(o.updates);
      bool reads = std::any_of(op.inputs.begin(), op.inputs.end(), [&](const InputRef& r) {
        return r.kind == InputRef::Kind::kCheckpoint && r.index == ck;
      });
      if (!reads) {
        return Invalid(t, StrCat("op '", op.name, "' output '", o.name, "' updates checkpoint '@",
                                 o.updates, "' but does not read it"));
      }
      if (op.checkpoint_update_of >= 0) {
        return Invalid(t, StrCat("op '", op.name, "' updates more than one checkpoint"));
      }
      if (ckpt_updater[ck] >= 0) {
        return Invalid(t, StrCat("checkpoint '@", o.updates, "' is updated by both '",
                                 t.ops_[ckpt_updater[ck]].name, "' and '", op.name, "'"));
      }
      ckpt_updater[ck] = i;
      op.checkpoint_update_of = ck;
    }
  }
  return absl::OkStatus();
}

  // Successors, consumer counts and a topological order (Kahn); a leftover
  // node means a cycle, reported along one cycle path.
absl::Status TemplateBuilder::OrderOps(GraphTemplate& t) {
  t.consumer_counts_.assign(t.ops_.size(), {});
  for (int i = 0; i < t.num_ops(); ++i) {
    t.ops_[i].succs.clear();
    t.consumer_counts_[i].assign(t.ops_[i].outputs.size(), 0);
  }
  for (int i = 0; i < t.num_ops(); ++i) {
    for (int p : t.ops_[i].preds) t.ops_[p].succs.push_back(i);
    for (const InputRef& r : t.ops_[i].inputs) {
      if (r.kind == InputRef::Kind::kOp) t.consumer_counts_[r.index][r.output]++;
    }
  }
  for (int i = 0; i < t.num_ops(); ++i) {
    for (size_t o = 0; o < t.ops_[i].outputs.size(); ++o) {
      const TensorSpec& out = t.ops_[i].outputs[o];
      if ((out.retain || !out.updates.empty()) && t.consumer_counts_[i][o] > 0) {
        return Invalid(t, StrCat("op '", t.ops_[i].name, "' output '", out.name,
                                 "' is a checkpoint and may not be consumed inside the template"));
      }
    }
  }
  std::vector<int> indeg(t.ops_.size());
  std::vector<int> queue;
  for (int i = 0; i < t.num_ops(); ++i) {
    indeg[i] = static_cast<int>(t.ops_[i].preds.size());
    if (indeg[i] == 0) queue.push_back(i);
  }
  t.topo_order_.clear();
  for (size_t q = 0; q < queue.size(); ++q) {
    int i = queue[q];
    t.topo_order_.push_back(i);
    for (int s : t.ops_[i].succs) {
      if (--indeg[s] == 0) queue.push_back(s);
    }
  }
  if (t.topo_order_.size() != t.ops_.size()) {
    // Walk predecessors among the leftover nodes until one repeats.
    int start = 0;
    while (indeg[start] == 0) ++start;
    std::vector<int> path;
    std::vector<int> pos(t.ops_.size(), -1);
    int cur = start;
    while (pos[cur] < 0) {
      pos[cur] = static_cast<int>(path.size());
      path.push_back(cur);
      for (int p : t.ops_[cur].preds) {
        if (indeg[p] > 0) { cur = p; break; }
      }
    }
    std::vector<std::string> names;
    for (size_t k = pos[cur]; k < path.size(); ++k) names.push_back(t.ops_[path[k]].name);
    std::reverse(names.begin(), names.end());
    names.push_back(names.front());
    return Invalid(t, StrCat("cycle through ops ", absl::StrJoin(names, " -> ")));
  }
  return absl::OkStatus();
}

absl::Status TemplateBuilder::AddPartitions(GraphTemplate& t, const OpIndex& op_index) const {
  absl::flat_hash_map<std::string, int> part_names;
  for (const auto& [pname, slots] : partitions_) {
    if (!part_names.emplace(pname, 0).second) {
      return Invalid(t, StrCat("duplicate partition '", pname, "'"));
    }
    CandidatePartition p;
    p.name = pname;
    p.slot_of_op.assign(t.ops_.size(), -1);
    int max_slot = -1;
    for (const auto& [op_name, slot] : slots) {
      auto it = op_index.find(op_name);
      if (it == op_index.end()) {
        return Invalid(t, StrCat("partition '", pname, "' maps unknown op '", op_name, "'"));
      }
      if (slot < 0) {
        return Invalid(t, StrCat("partition '", pname, "' maps op '", op_name, "' to negative slot ", slot));
      }
      if (p.slot_of_op[it->second] >= 0) {
        return Invalid(t, StrCat("partition '", pname, "' maps op '", op_name, "' twice"));
      }
      p.slot_of_op[it->second] = slot;
      max_slot = std::max(max_slot, slot);
    }
    for (int i = 0; i < t.num_ops(); ++i) {
      if (p.slot_of_op[i] < 0) {
        return Invalid(t, StrCat("partition '", pname, "' does not map op '", t.ops_[i].name, "'"));
      }
    }
    std::vector<bool> used(max_slot + 1, false);
    for (int s : p.slot_of_op) used[s] = true;
    for (int s = 0; s <= max_slot; ++s) {
      if (!used[s]) {
        return Invalid(t, StrCat("partition '", pname, "' leaves slot ", s,
                                 " empty (slots must be numbered 0..k-1)"));
      }
    }
    // An op that updates a checkpoint and an op reading it must share a slot
    // only when both read it; nothing to check here beyond coverage.
    p.num_slots = max_slot + 1;
    t.partitions_.push_back(std::move(p));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------

absl::StatusOr<TemplateId> TemplateRegistry::Register(std::shared_ptr<const GraphTemplate> tpl) {
  if (tpl == nullptr) return absl::InvalidArgumentError("null template");
  if (by_name_.contains(tpl->name())) {
    return absl::AlreadyExistsError(StrCat("template '", tpl->name(), "' is already registered"));
  }
  auto copy = std::shared_ptr<GraphTemplate>(new GraphTemplate(*tpl));
  TemplateId id(static_cast<uint32_t>(templates_.size()));
  copy->id_ = id;
  by_name_[copy->name()] = id;
  templates_.push_back(std::move(copy));
  return id;
}

const GraphTemplate* TemplateRegistry::Find(TemplateId id) const {
  if (!id.valid() || id.value() >= templates_.size()) return nullptr;
  return templates_[id.value()].get();
}

absl::StatusOr<TemplateId> TemplateRegistry::FindByName(absl::string_view name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return absl::NotFoundError(StrCat("no template named '", name, "'"));
  return it->second;
}

}  // namespace slicesched
