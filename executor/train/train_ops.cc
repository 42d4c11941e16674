// Training operators on LibTorch: LoRA adapter init, the per-group training
// forward/backward with autograd, the head + cross-entropy loss, AdamW and
// the joint step. Torch TU (ATen only).
//
// Autograd and inference tensors: the backbone's tensors (and anything made
// under c10::InferenceMode, e.g. serving outputs or restored checkpoints) are
// inference tensors, which autograd refuses to save for backward. Plain()
// gives a normal tensor aliasing the same storage (no copy; the backbone is
// never written), so the frozen weights can take part in the graph.
#include "slicesched/executor/train/train_ops.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>

#include <array>
#include <cmath>
#include <limits>
#include <tuple>
#include <utility>

#include "slicesched/executor/llama/llama_math.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "slicesched/executor/torch/aten_tensor.h"
#include "train_internal.h"

namespace slicesched::executor {

// The autograd graph of one group's training forward (see train_ops.h).
class GroupTape {
 public:
  std::string op;     // for error messages
  at::Tensor input;   // leaf [B, S, hidden], requires grad
  at::Tensor output;  // [B, S, hidden] with history
  // leaves[slot][l] = {q_a, q_b, v_a, v_b} of layer group*fusion + l.
  std::vector<std::vector<std::array<at::Tensor, 4>>> leaves;
  bool used = false;
};

namespace {

using Access = TensorAccess;
using internal::ShapeString;
using LayerLeaves = std::array<at::Tensor, 4>;
using SlotLeaves = std::vector<std::vector<LayerLeaves>>;  // [slot][layer]

// Autograd on and inference mode off for the scope, whatever the caller's.
struct TrainingModeGuard {
  c10::InferenceMode no_inference{false};
  c10::AutoGradMode grad{true};
};

// A normal tensor with t's values: t itself, or for an inference tensor an
// alias of its storage (kept alive by the alias' deleter).
at::Tensor Plain(const at::Tensor& t) {
  if (!t.defined() || !t.is_inference()) return t;
  if (t.numel() == 0) return at::empty(t.sizes(), t.options());
  at::Tensor keep = t;
  return at::from_blob(
      keep.data_ptr(), keep.sizes(), keep.strides(), [keep](void*) {}, keep.options());
}

at::Tensor P(const Tensor& t) { return Plain(Access::Unwrap(t)); }

// A fresh autograd leaf holding t's values on `device` (never the caller's
// tensor): the adapters live in host memory (train_ops.h), the graph where
// its activations are.
at::Tensor Leaf(const Tensor& t, const at::Device& device) {
  return P(t).to(device).detach().requires_grad_(true);
}

at::Tensor GradOf(const at::Tensor& leaf) {
  const at::Tensor& g = leaf.grad();
  return g.defined() ? g.detach() : at::zeros_like(leaf.detach());
}

// An adapter leaf's gradient, in host memory with the adapters it updates.
at::Tensor HostGrad(const at::Tensor& leaf) { return GradOf(leaf).to(at::kCPU); }

// --- validation ---------------------------------------------------------------

absl::Status CheckSlots(std::string_view op, const LlamaDims& dims,
                        std::span<const TaskAdapters* const> tasks) {
  if (tasks.empty()) return absl::InvalidArgumentError(StrCat(op, ": no task adapters"));
  for (size_t t = 0; t < tasks.size(); ++t) {
    if (tasks[t] == nullptr) {
      return absl::InvalidArgumentError(StrCat(op, ": task adapters ", t, " are null"));
    }
    absl::Status s = tasks[t]->Check(dims);
    if (!s.ok()) return Annotate(s, StrCat(op, ": task ", t));
    if (tasks[t]->lora.rank != tasks[0]->lora.rank ||
        tasks[t]->lora.alpha != tasks[0]->lora.alpha) {
      return absl::InvalidArgumentError(
          StrCat(op, ": task ", t, " has LoRA rank ", tasks[t]->lora.rank, " alpha ",
                 tasks[t]->lora.alpha, ", task 0 has rank ", tasks[0]->lora.rank, " alpha ",
                 tasks[0]->lora.alpha, " (one call needs one LoRA config)"));
    }
  }
  return absl::OkStatus();
}

// row_task -> int64 [B] index tensor (all zeros when empty).
absl::StatusOr<std::vector<int64_t>> RowTasks(std::string_view op,
                                              std::span<const int64_t> row_task, int64_t batch,
                                              size_t num_tasks) {
  if (row_task.empty()) return std::vector<int64_t>(static_cast<size_t>(batch), 0);
  if (static_cast<int64_t>(row_task.size()) != batch) {
    return absl::InvalidArgumentError(
        StrCat(op, ": row_task has ", row_task.size(), " entries for a batch of ", batch, " rows"));
  }
  for (size_t b = 0; b < row_task.size(); ++b) {
    if (row_task[b] < 0 || row_task[b] >= static_cast<int64_t>(num_tasks)) {
      return absl::OutOfRangeError(StrCat(op, ": row ", b, " names task ", row_task[b],
                                          ", the call has ", num_tasks, " task(s)"));
    }
  }
  return std::vector<int64_t>(row_task.begin(), row_task.end());
}

// row_pad -> the rows' leading pad counts, each in [0, S); empty when
// row_pad is empty or all zero (the unmasked computation).
absl::StatusOr<std::vector<int64_t>> RowPads(std::string_view op, std::span<const int64_t> row_pad,
                                             int64_t batch, int64_t seq) {
  if (row_pad.empty()) return std::vector<int64_t>();
  if (static_cast<int64_t>(row_pad.size()) != batch) {
    return absl::InvalidArgumentError(
        StrCat(op, ": row_pad has ", row_pad.size(), " entries for a batch of ", batch, " rows"));
  }
  bool any = false;
  for (size_t b = 0; b < row_pad.size(); ++b) {
    if (row_pad[b] < 0 || row_pad[b] >= seq) {
      return absl::OutOfRangeError(StrCat(op, ": row ", b, " has ", row_pad[b],
                                          " pad positions, expected [0, ", seq,
                                          ") for rows of length ", seq,
                                          " (a row needs one real token)"));
    }
    any = any || row_pad[b] > 0;
  }
  if (!any) return std::vector<int64_t>();
  return std::vector<int64_t>(row_pad.begin(), row_pad.end());
}

// Indices on `device` (row tasks, pads, label rows), from the host.
at::Tensor IndexTensor(const std::vector<int64_t>& v, const at::Device& device) {
  return at::tensor(at::ArrayRef<int64_t>(v), at::TensorOptions().dtype(at::kLong)).to(device);
}

absl::Status CheckHidden(std::string_view op, std::string_view what, const LlamaDims& d,
                         const Tensor& hidden) {
  if (!hidden.defined()) return absl::InvalidArgumentError(StrCat(op, ": ", what, " is undefined"));
  const auto s = hidden.shape();
  if (s.size() != 3 || s[2] != d.hidden || s[0] < 1 || s[1] < 1) {
    return absl::InvalidArgumentError(StrCat(op, ": ", what, " has shape ", ShapeString(s),
                                             ", expected [B >= 1, S >= 1, ", d.hidden, "]"));
  }
  if (hidden.dtype() != d.dtype) {
    return absl::InvalidArgumentError(StrCat(op, ": ", what, " is ", hidden.DebugString(),
                                             ", the model dtype is ", DTypeName(d.dtype)));
  }
  return absl::OkStatus();
}

// labels int64 [B, S]; each row's labels are -1 or a class of its task's head.
absl::Status CheckLabels(std::string_view op, const Tensor& labels, int64_t B, int64_t S,
                         const std::vector<int64_t>& rows,
                         std::span<const TaskAdapters* const> tasks) {
  const std::vector<int64_t> want = {B, S};
  if (!labels.defined() || labels.dtype() != DType::kI64 || labels.shape() != want) {
    return absl::InvalidArgumentError(
        StrCat(op, ": labels are ", labels.DebugString(), ", expected i64", ShapeString(want)));
  }
  const std::vector<int64_t> v = labels.ToInt64();
  for (int64_t b = 0; b < B; ++b) {
    const int64_t classes =
        tasks[static_cast<size_t>(rows[static_cast<size_t>(b)])]->head_outputs();
    for (int64_t s = 0; s < S; ++s) {
      const int64_t y = v[static_cast<size_t>(b * S + s)];
      if (y < -1 || y >= classes) {
        return absl::OutOfRangeError(StrCat(op, ": label ", y, " at row ", b, " position ", s,
                                            " is outside [0, ", classes, ") of task ",
                                            rows[static_cast<size_t>(b)], "'s head (or -1)"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CheckBatch(std::string_view op, const LlamaDims& d, const TrainBatch& batch) {
  const auto s = batch.tokens.shape();
  if (!batch.tokens.defined() || batch.tokens.dtype() != DType::kI64 || s.size() != 2 || s[0] < 1 ||
      s[1] < 1) {
    return absl::InvalidArgumentError(
        StrCat(op, ": tokens are ", batch.tokens.DebugString(), ", expected i64[B >= 1, S >= 1]"));
  }
  for (int64_t id : batch.tokens.ToInt64()) {
    if (id < 0 || id >= d.vocab) {
      return absl::OutOfRangeError(
          StrCat(op, ": token id ", id, " is outside the vocabulary [0, ", d.vocab, ")"));
    }
  }
  return absl::OkStatus();
}

// --- graphs ---------------------------------------------------------------------

SlotLeaves MakeLeaves(std::span<const TaskAdapters* const> tasks, int64_t first_layer,
                      int64_t layers, const at::Device& device) {
  SlotLeaves out(tasks.size());
  for (size_t t = 0; t < tasks.size(); ++t) {
    for (int64_t l = first_layer; l < first_layer + layers; ++l) {
      const LoraLayer& ll = tasks[t]->layers[static_cast<size_t>(l)];
      out[t].push_back(
          {Leaf(ll.q_a, device), Leaf(ll.q_b, device), Leaf(ll.v_a, device), Leaf(ll.v_b, device)});
    }
  }
  return out;
}

// [B, S] true at each row's pad positions (pads: RowPads, non-empty).
at::Tensor PadPositions(const std::vector<int64_t>& pads, int64_t S, const at::Device& device) {
  const at::Tensor pos = at::arange(0, S, at::TensorOptions().dtype(at::kLong).device(device));
  return pos.unsqueeze(0) < IndexTensor(pads, device).unsqueeze(1);
}

// Decoder layers group*F .. group*F+F-1 on x [B, S, hidden] with per-row
// LoRA factors (leaves[slot][l], rows: int64 [B] slot of each row). `pads`
// (RowPads; empty: none): the key-padding mask and per-row RoPE positions
// of train_ops.h "Padding".
at::Tensor GroupGraph(const LlamaWeights& base, int64_t group, const SlotLeaves& leaves,
                      size_t leaf_offset, const at::Tensor& rows, double scaling, at::Tensor x,
                      const std::vector<int64_t>& pads) {
  const LlamaDims& d = base.dims();
  const int64_t S = x.size(1);
  const int64_t H = d.heads, KVH = d.kv_heads, HD = d.head_dim(), F = d.fusion;
  const double eps = base.options().rms_eps;
  const auto long_opts = at::TensorOptions().dtype(at::kLong).device(x.device());
  const at::Tensor pos = at::arange(0, S, long_opts);
  at::Tensor masked = pos.unsqueeze(0) > pos.unsqueeze(1);  // [S, S]: key after query
  at::Tensor rope_cos, rope_sin;
  if (pads.empty()) {
    std::tie(rope_cos, rope_sin) = internal::RopeTables(pos, HD, base.options().rope_theta);
  } else {
    // A real query never sees a pad key: [B, 1, S(query), S(key)].
    const at::Tensor is_pad = PadPositions(pads, S, x.device());  // [B, S]
    masked = (masked.unsqueeze(0) | (is_pad.unsqueeze(1) & is_pad.logical_not().unsqueeze(2)))
                 .unsqueeze(1);
    // Real tokens at positions 0, 1, .. from the row's first real token.
    const at::Tensor row_pos = at::clamp_min(pos.unsqueeze(0) - IndexTensor(pads, x.device()).unsqueeze(1), 0);
    std::tie(rope_cos, rope_sin) =
        internal::RopeTablesPerRow(row_pos, HD, base.options().rope_theta);
  }
  for (int64_t l = 0; l < F; ++l) {
    const LlamaLayerWeights& lw = base.layer(group * F + l);
    // Per-row LoRA factors: [B, ...] gathered from the slots' leaves.
    auto gather = [&](size_t k) {
      std::vector<at::Tensor> per_slot;
      for (const auto& slot : leaves)
        per_slot.push_back(slot[leaf_offset + static_cast<size_t>(l)][k]);
      return at::stack(per_slot, 0).index_select(0, rows);
    };
    const internal::LoraBranches lora{gather(0), gather(1), gather(2), gather(3), scaling};
    const at::Tensor h = internal::RmsNorm(x, P(lw.input_layernorm), eps);
    const internal::DecoderLayerWeights w{P(lw.q_proj),   P(lw.k_proj),  P(lw.v_proj),
                                          P(lw.o_proj),   P(lw.gate_proj), P(lw.up_proj),
                                          P(lw.down_proj), P(lw.post_attention_layernorm)};
    x = internal::DecoderLayerFromNormed(x, h, w, &lora, masked, rope_cos, rope_sin, eps, H, KVH, HD);
  }
  return x;
}

struct HeadGraphResult {
  std::vector<at::Tensor> loss;  // per slot; undefined when it has no labelled position
  std::vector<int64_t> counted;
};

HeadGraphResult HeadGraph(const LlamaWeights& base, const std::vector<at::Tensor>& heads,
                          const std::vector<int64_t>& rows, const at::Tensor& x,
                          at::Tensor labels, const std::vector<int64_t>& pads) {
  HeadGraphResult r;
  labels = labels.to(x.device());
  if (!pads.empty()) labels = labels.masked_fill(PadPositions(pads, labels.size(1), x.device()), -1);
  const at::Tensor h = internal::RmsNorm(x, P(base.norm()), base.options().rms_eps).to(at::kFloat);
  for (size_t t = 0; t < heads.size(); ++t) {
    std::vector<int64_t> mine;
    for (size_t b = 0; b < rows.size(); ++b) {
      if (rows[b] == static_cast<int64_t>(t)) mine.push_back(static_cast<int64_t>(b));
    }
    r.loss.emplace_back();
    r.counted.push_back(0);
    if (mine.empty()) continue;
    const at::Tensor idx = IndexTensor(mine, x.device());
    const at::Tensor lab = labels.index_select(0, idx).reshape({-1});
    const int64_t counted = (lab >= 0).sum().item<int64_t>();
    r.counted.back() = counted;
    if (counted == 0) continue;
    const at::Tensor logits = at::linear(h.index_select(0, idx), heads[t]);  // [b, S, C]
    r.loss.back() = at::nll_loss(at::log_softmax(logits.reshape({-1, heads[t].size(0)}), -1), lab,
                                 {}, at::Reduction::Mean, -1);
  }
  return r;
}

// Sum of the defined losses (undefined when none).
at::Tensor TotalLoss(const std::vector<at::Tensor>& losses) {
  at::Tensor total;
  for (const at::Tensor& l : losses) {
    if (l.defined()) total = total.defined() ? total + l : l;
  }
  return total;
}

LoraLayer LayerGrads(const LayerLeaves& leaves) {
  return {Access::Wrap(HostGrad(leaves[0])), Access::Wrap(HostGrad(leaves[1])),
          Access::Wrap(HostGrad(leaves[2])), Access::Wrap(HostGrad(leaves[3]))};
}

}  // namespace

// ---------------------------------------------------------------------------
// Init

absl::StatusOr<TaskAdapters> TaskAdapters::Init(const LlamaDims& dims, const LoraConfig& lora,
                                                int64_t head_outputs, uint64_t seed) {
  SLICESCHED_RETURN_IF_ERROR(dims.Validate());
  SLICESCHED_RETURN_IF_ERROR(lora.Validate());
  if (head_outputs < 1) {
    return absl::InvalidArgumentError(
        StrCat("TaskAdapters::Init: head_outputs must be >= 1, got ", head_outputs));
  }
  try {
    c10::InferenceMode guard;
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    const auto f32 = at::TensorOptions().dtype(at::kFloat);
    const double std_in = 1.0 / std::sqrt(static_cast<double>(dims.hidden));
    const int64_t hd = dims.head_dim(), r = lora.rank;
    TaskAdapters a;
    a.lora = lora;
    for (int64_t i = 0; i < dims.layers; ++i) {
      LoraLayer l;
      l.q_a = Access::Wrap(at::randn({r, dims.hidden}, gen, f32).mul_(std_in));
      l.q_b = Access::Wrap(at::zeros({dims.heads * hd, r}, f32));
      l.v_a = Access::Wrap(at::randn({r, dims.hidden}, gen, f32).mul_(std_in));
      l.v_b = Access::Wrap(at::zeros({dims.kv_heads * hd, r}, f32));
      a.layers.push_back(std::move(l));
    }
    a.head = Access::Wrap(at::randn({head_outputs, dims.hidden}, gen, f32).mul_(std_in));
    return a;
  } catch (...) {
    return internal::CurrentExceptionToStatus("TaskAdapters::Init");
  }
}

absl::StatusOr<TaskAdapters> TaskAdapters::ZerosLike(const TaskAdapters& like) {
  TaskAdapters out = like;
  try {
    c10::InferenceMode guard;
    for (Tensor* t : internal::AdapterTensors(out)) {
      if (!t->defined())
        return absl::InvalidArgumentError("TaskAdapters::ZerosLike: undefined tensor");
      *t = Access::Wrap(at::zeros(t->shape(), at::TensorOptions().dtype(at::kFloat)));
    }
  } catch (...) {
    return internal::CurrentExceptionToStatus("TaskAdapters::ZerosLike");
  }
  return out;
}

// ---------------------------------------------------------------------------
// Per-group operators

absl::StatusOr<GroupForwardResult> TrainGroupForward(const LlamaWeights& base, int64_t group,
                                                     std::span<const TaskAdapters* const> tasks,
                                                     std::span<const int64_t> row_task,
                                                     const Tensor& hidden,
                                                     std::span<const int64_t> row_pad) {
  const LlamaDims& d = base.dims();
  const std::string op = StrCat("TrainGroupForward(model '", d.name, "', group ", group, ")");
  if (group < 0 || group >= d.num_groups()) {
    return absl::OutOfRangeError(StrCat(op, ": group out of range [0, ", d.num_groups(), ")"));
  }
  SLICESCHED_RETURN_IF_ERROR(CheckHidden(op, "hidden", d, hidden));
  SLICESCHED_RETURN_IF_ERROR(CheckSlots(op, d, tasks));
  SLICESCHED_ASSIGN_OR_RETURN(const std::vector<int64_t> rows,
                              RowTasks(op, row_task, hidden.shape()[0], tasks.size()));
  SLICESCHED_ASSIGN_OR_RETURN(const std::vector<int64_t> pads,
                              RowPads(op, row_pad, hidden.shape()[0], hidden.shape()[1]));
  try {
    TrainingModeGuard guard;
    auto tape = std::make_shared<GroupTape>();
    tape->op = op;
    tape->input = P(hidden).detach().requires_grad_(true);
    tape->leaves = MakeLeaves(tasks, group * d.fusion, d.fusion, tape->input.device());
    tape->output = GroupGraph(base, group, tape->leaves, 0, IndexTensor(rows, tape->input.device()),
                              tasks[0]->lora.scaling(), tape->input, pads);
    GroupForwardResult r;
    r.hidden_out = Access::Wrap(tape->output.detach());
    r.tape = std::move(tape);
    return r;
  } catch (...) {
    return internal::CurrentExceptionToStatus(op);
  }
}

absl::StatusOr<GroupBackwardResult> TrainGroupBackward(GroupTape& tape,
                                                       const Tensor& d_hidden_out) {
  const std::string op = StrCat(tape.op, " backward");
  if (tape.used) {
    return absl::FailedPreconditionError(StrCat(op, ": this tape was already used by a backward"));
  }
  const auto want = std::vector<int64_t>(tape.output.sizes().begin(), tape.output.sizes().end());
  if (!d_hidden_out.defined() || d_hidden_out.shape() != want ||
      !IsFloating(d_hidden_out.dtype())) {
    return absl::InvalidArgumentError(StrCat(op, ": d_hidden_out is ", d_hidden_out.DebugString(),
                                             ", expected a floating ", ShapeString(want)));
  }
  try {
    TrainingModeGuard guard;
    std::vector<at::Tensor> inputs = {tape.input};
    for (const auto& slot : tape.leaves) {
      for (const auto& layer : slot) inputs.insert(inputs.end(), layer.begin(), layer.end());
    }
    // The gradient may come from a group on another device.
    const at::Tensor grad = P(d_hidden_out).to(tape.output.device(), tape.output.scalar_type());
    tape.output.backward(grad, /*retain_graph=*/false, /*create_graph=*/false,
                         at::TensorList(inputs));
    GroupBackwardResult r;
    r.d_hidden_in = Access::Wrap(GradOf(tape.input));
    for (const auto& slot : tape.leaves) {
      r.grads.emplace_back();
      for (const auto& layer : slot) r.grads.back().push_back(LayerGrads(layer));
    }
    // Free the graph and the leaves.
    tape.used = true;
    tape.output = at::Tensor();
    tape.input = at::Tensor();
    tape.leaves.clear();
    return r;
  } catch (...) {
    return internal::CurrentExceptionToStatus(op);
  }
}

absl::StatusOr<HeadLossResult> TrainHeadLoss(const LlamaWeights& base,
                                             std::span<const TaskAdapters* const> tasks,
                                             std::span<const int64_t> row_task,
                                             const Tensor& hidden, const Tensor& labels,
                                             std::span<const int64_t> row_pad) {
  const LlamaDims& d = base.dims();
  const std::string op = StrCat("TrainHeadLoss(model '", d.name, "')");
  SLICESCHED_RETURN_IF_ERROR(CheckHidden(op, "hidden", d, hidden));
  SLICESCHED_RETURN_IF_ERROR(CheckSlots(op, d, tasks));
  const int64_t B = hidden.shape()[0], S = hidden.shape()[1];
  SLICESCHED_ASSIGN_OR_RETURN(const std::vector<int64_t> rows,
                              RowTasks(op, row_task, B, tasks.size()));
  SLICESCHED_RETURN_IF_ERROR(CheckLabels(op, labels, B, S, rows, tasks));
  SLICESCHED_ASSIGN_OR_RETURN(const std::vector<int64_t> pads, RowPads(op, row_pad, B, S));
  try {
    TrainingModeGuard guard;
    const at::Tensor x = P(hidden).detach().requires_grad_(true);
    std::vector<at::Tensor> heads;
    for (const TaskAdapters* t : tasks) heads.push_back(Leaf(t->head, x.device()));
    const HeadGraphResult g = HeadGraph(base, heads, rows, x, Access::Unwrap(labels), pads);
    const at::Tensor total = TotalLoss(g.loss);
    if (total.defined()) {
      std::vector<at::Tensor> inputs = {x};
      inputs.insert(inputs.end(), heads.begin(), heads.end());
      total.backward({}, /*retain_graph=*/false, /*create_graph=*/false, at::TensorList(inputs));
    }
    HeadLossResult r;
    r.counted = g.counted;
    for (const at::Tensor& l : g.loss) r.loss.push_back(l.defined() ? l.item<double>() : 0.0);
    r.d_hidden = Access::Wrap(GradOf(x));
    for (const at::Tensor& h : heads) r.d_head.push_back(Access::Wrap(HostGrad(h)));
    return r;
  } catch (...) {
    return internal::CurrentExceptionToStatus(op);
  }
}

// ---------------------------------------------------------------------------
// Whole step

absl::StatusOr<TaskGradients> ComputeGradients(const LlamaWeights& base,
                                               std::span<const TaskAdapters* const> tasks,
                                               const TrainBatch& batch, GradientPath path) {
  const LlamaDims& d = base.dims();
  const std::string op = StrCat("ComputeGradients(model '", d.name, "')");
  SLICESCHED_RETURN_IF_ERROR(CheckBatch(op, d, batch));
  SLICESCHED_RETURN_IF_ERROR(CheckSlots(op, d, tasks));
  const int64_t B = batch.tokens.shape()[0], S = batch.tokens.shape()[1];
  SLICESCHED_ASSIGN_OR_RETURN(const std::vector<int64_t> rows,
                              RowTasks(op, batch.row_task, B, tasks.size()));
  SLICESCHED_RETURN_IF_ERROR(CheckLabels(op, batch.labels, B, S, rows, tasks));
  SLICESCHED_ASSIGN_OR_RETURN(const std::vector<int64_t> pads, RowPads(op, batch.row_pad, B, S));
  SLICESCHED_ASSIGN_OR_RETURN(const Tensor embedded, Embedding(base, batch.tokens));

  TaskGradients out;
  for (const TaskAdapters* t : tasks) {
    TaskAdapters g;
    g.lora = t->lora;
    g.layers.resize(t->layers.size());
    out.grads.push_back(std::move(g));
  }
  if (path == GradientPath::kPipelined) {
    std::vector<std::shared_ptr<GroupTape>> tapes;
    Tensor h = embedded;
    for (int64_t g = 0; g < d.num_groups(); ++g) {
      SLICESCHED_ASSIGN_OR_RETURN(GroupForwardResult f,
                                  TrainGroupForward(base, g, tasks, rows, h, pads));
      h = std::move(f.hidden_out);
      tapes.push_back(std::move(f.tape));
    }
    SLICESCHED_ASSIGN_OR_RETURN(HeadLossResult head,
                                TrainHeadLoss(base, tasks, rows, h, batch.labels, pads));
    out.loss = head.loss;
    out.counted = head.counted;
    for (size_t t = 0; t < tasks.size(); ++t) out.grads[t].head = head.d_head[t];
    Tensor dh = head.d_hidden;
    for (int64_t g = d.num_groups() - 1; g >= 0; --g) {
      SLICESCHED_ASSIGN_OR_RETURN(GroupBackwardResult b,
                                  TrainGroupBackward(*tapes[static_cast<size_t>(g)], dh));
      dh = std::move(b.d_hidden_in);
      for (size_t t = 0; t < tasks.size(); ++t) {
        for (int64_t l = 0; l < d.fusion; ++l) {
          out.grads[t].layers[static_cast<size_t>(g * d.fusion + l)] =
              std::move(b.grads[t][static_cast<size_t>(l)]);
        }
      }
    }
    return out;
  }
  // One graph over the whole model, one backward call.
  try {
    TrainingModeGuard guard;
    at::Tensor x = P(embedded);
    const SlotLeaves leaves = MakeLeaves(tasks, 0, d.layers, x.device());
    std::vector<at::Tensor> heads;
    for (const TaskAdapters* t : tasks) heads.push_back(Leaf(t->head, x.device()));
    const at::Tensor row_index = IndexTensor(rows, x.device());
    for (int64_t g = 0; g < d.num_groups(); ++g) {
      x = GroupGraph(base, g, leaves, static_cast<size_t>(g * d.fusion), row_index,
                     tasks[0]->lora.scaling(), x, pads);
    }
    const HeadGraphResult hg =
        HeadGraph(base, heads, rows, x, Access::Unwrap(batch.labels), pads);
    const at::Tensor total = TotalLoss(hg.loss);
    if (total.defined()) {
      std::vector<at::Tensor> inputs = heads;
      for (const auto& slot : leaves) {
        for (const auto& layer : slot) inputs.insert(inputs.end(), layer.begin(), layer.end());
      }
      total.backward({}, /*retain_graph=*/false, /*create_graph=*/false, at::TensorList(inputs));
    }
    out.counted = hg.counted;
    for (const at::Tensor& l : hg.loss) out.loss.push_back(l.defined() ? l.item<double>() : 0.0);
    for (size_t t = 0; t < tasks.size(); ++t) {
      out.grads[t].head = Access::Wrap(HostGrad(heads[t]));
      for (size_t l = 0; l < leaves[t].size(); ++l)
        out.grads[t].layers[l] = LayerGrads(leaves[t][l]);
    }
    return out;
  } catch (...) {
    return internal::CurrentExceptionToStatus(op);
  }
}

// ---------------------------------------------------------------------------
// Optimizer

absl::Status AccumulateGradients(TaskState& state, const TaskAdapters& grad) {
  constexpr std::string_view kOp = "AccumulateGradients";
  const std::vector<const Tensor*> g = internal::AdapterTensors(grad);
  const std::vector<const Tensor*> sum = internal::AdapterTensors(std::as_const(state.grad_sum));
  if (g.size() != sum.size()) {
    return absl::InvalidArgumentError(StrCat(kOp, ": the gradient has ", grad.layers.size(),
                                             " layers, the task ", state.grad_sum.layers.size()));
  }
  const auto names = state.grad_sum.NamedTensors();
  for (size_t i = 0; i < g.size(); ++i) {
    if (!g[i]->defined() || !IsFloating(g[i]->dtype()) || g[i]->shape() != sum[i]->shape()) {
      return absl::InvalidArgumentError(StrCat(kOp, ": gradient '", names[i].first, "' is ",
                                               g[i]->DebugString(), ", the task's is ",
                                               sum[i]->DebugString()));
    }
  }
  TaskAdapters next = state.grad_sum;
  try {
    c10::InferenceMode guard;
    std::vector<Tensor*> out = internal::AdapterTensors(next);
    for (size_t i = 0; i < g.size(); ++i) {
      *out[i] = Access::Wrap(Access::Unwrap(*sum[i]) + Access::Unwrap(*g[i]).to(at::kFloat));
    }
  } catch (...) {
    return internal::CurrentExceptionToStatus(kOp);
  }
  state.grad_sum = std::move(next);
  ++state.accumulated;
  return absl::OkStatus();
}

namespace {

// A parameter's new value and optimizer moments (`v` unused by SGD).
struct StepResult {
  at::Tensor p, m, v;
};

absl::Status CheckAccumulated(const TaskState& state, std::string_view op) {
  if (state.accumulated >= 1) return absl::OkStatus();
  return absl::FailedPreconditionError(StrCat(op, ": no gradients accumulated since step ", state.step));
}

// The frame AdamWStep and SgdStep share: walks the adapter tensors with their
// optimizer state, lets `update(param, mean_gradient, m, v)` compute the new
// value and moments, zeroes the gradient sums and advances the step. `state`
// changes only when every tensor was updated.
template <typename Update>
absl::Status StepAdapters(TaskState& state, std::string_view op, bool uses_v, Update update) {
  TaskState next = state;
  try {
    c10::InferenceMode guard;
    std::vector<Tensor*> p = internal::AdapterTensors(next.params);
    std::vector<Tensor*> m = internal::AdapterTensors(next.m);
    std::vector<Tensor*> v = internal::AdapterTensors(next.v);
    std::vector<Tensor*> gs = internal::AdapterTensors(next.grad_sum);
    if (m.size() != p.size() || (uses_v && v.size() != p.size()) || gs.size() != p.size()) {
      return absl::InvalidArgumentError(StrCat(op, ": optimizer state does not match the parameters"));
    }
    for (size_t i = 0; i < p.size(); ++i) {
      const at::Tensor param = Access::Unwrap(*p[i]);
      const at::Tensor g = Access::Unwrap(*gs[i]) / static_cast<double>(state.accumulated);
      const StepResult r = update(param, g, Access::Unwrap(*m[i]), uses_v ? Access::Unwrap(*v[i]) : at::Tensor());
      if (r.p.sizes() != param.sizes()) {
        return absl::InvalidArgumentError(StrCat(op, ": optimizer state does not match the parameters"));
      }
      *p[i] = Access::Wrap(r.p);
      *m[i] = Access::Wrap(r.m);
      if (uses_v) *v[i] = Access::Wrap(r.v);
      *gs[i] = Access::Wrap(at::zeros_like(g));
    }
  } catch (...) {
    return internal::CurrentExceptionToStatus(op);
  }
  next.step = state.step + 1;
  next.accumulated = 0;
  state = std::move(next);
  return absl::OkStatus();
}

}  // namespace

absl::Status AdamWStep(TaskState& state) {
  constexpr std::string_view kOp = "AdamWStep";
  SLICESCHED_RETURN_IF_ERROR(CheckAccumulated(state, kOp));
  SLICESCHED_RETURN_IF_ERROR(state.adamw.Validate());
  const AdamWOptions o = state.adamw;
  const double lr = o.LrAt(state.step);
  const double t = static_cast<double>(state.step + 1);
  const double bc1 = 1.0 - std::pow(o.beta1, t);
  const double bc2 = 1.0 - std::pow(o.beta2, t);
  return StepAdapters(state, kOp, /*uses_v=*/true,
                      [&](const at::Tensor& param, const at::Tensor& g, const at::Tensor& m, const at::Tensor& v) {
                        StepResult r;
                        r.m = m * o.beta1 + g * (1.0 - o.beta1);
                        r.v = v * o.beta2 + g * g * (1.0 - o.beta2);
                        const at::Tensor denom = (r.v / bc2).sqrt() + o.eps;
                        r.p = param * (1.0 - lr * o.weight_decay) - (r.m / bc1) / denom * lr;
                        return r;
                      });
}

absl::Status SgdStep(TaskState& state) {
  constexpr std::string_view kOp = "SgdStep";
  SLICESCHED_RETURN_IF_ERROR(CheckAccumulated(state, kOp));
  const double lr = state.adamw.LrAt(state.step), wd = state.adamw.weight_decay, mu = state.momentum;
  if (!std::isfinite(lr) || lr < 0.0) {
    return absl::InvalidArgumentError(StrCat(kOp, ": lr must be >= 0, got ", lr));
  }
  if (!std::isfinite(wd) || wd < 0.0) {
    return absl::InvalidArgumentError(StrCat(kOp, ": weight_decay must be >= 0, got ", wd));
  }
  if (!std::isfinite(mu) || mu < 0.0 || mu >= 1.0) {
    return absl::InvalidArgumentError(StrCat(kOp, ": momentum must be in [0, 1), got ", mu));
  }
  return StepAdapters(state, kOp, /*uses_v=*/false,
                      [&](const at::Tensor& param, const at::Tensor& g, const at::Tensor& m, const at::Tensor&) {
                        StepResult r;
                        const at::Tensor gd = g + param * wd;  // coupled weight decay (PyTorch's SGD)
                        r.m = m * mu + gd;
                        r.p = param - r.m * lr;
                        return r;
                      });
}

absl::Status OptimizerStep(TaskState& state) {
  return state.optimizer == OptimizerKind::kSgd ? SgdStep(state) : AdamWStep(state);
}

absl::StatusOr<double> AccumulateMicroBatch(const LlamaWeights& base, TaskState& state,
                                            const TrainBatch& batch) {
  const TaskAdapters* slots[] = {&state.params};
  SLICESCHED_ASSIGN_OR_RETURN(TaskGradients g, ComputeGradients(base, slots, batch));
  SLICESCHED_RETURN_IF_ERROR(AccumulateGradients(state, g.grads[0]));
  return g.loss[0];
}

absl::StatusOr<std::vector<double>> AccumulateJointMicroBatch(const LlamaWeights& base,
                                                              std::span<TaskState* const> tasks,
                                                              const TrainBatch& batch) {
  std::vector<const TaskAdapters*> slots;
  for (size_t t = 0; t < tasks.size(); ++t) {
    if (tasks[t] == nullptr) {
      return absl::InvalidArgumentError(StrCat("AccumulateJointMicroBatch: task ", t, " is null"));
    }
    slots.push_back(&tasks[t]->params);
  }
  SLICESCHED_ASSIGN_OR_RETURN(TaskGradients g, ComputeGradients(base, slots, batch));
  std::vector<TaskState> next;
  for (size_t t = 0; t < tasks.size(); ++t) {
    next.push_back(*tasks[t]);
    SLICESCHED_RETURN_IF_ERROR(AccumulateGradients(next.back(), g.grads[t]));
  }
  for (size_t t = 0; t < tasks.size(); ++t) *tasks[t] = std::move(next[t]);
  return g.loss;
}

absl::Status JointOptimizerStep(std::span<TaskState* const> tasks, JointStepRule rule) {
  constexpr std::string_view kOp = "JointOptimizerStep";
  if (tasks.empty()) return absl::InvalidArgumentError(StrCat(kOp, ": no tasks"));
  for (size_t t = 0; t < tasks.size(); ++t) {
    if (tasks[t] == nullptr)
      return absl::InvalidArgumentError(StrCat(kOp, ": task ", t, " is null"));
    if (tasks[t]->accumulated < 1) {
      return absl::FailedPreconditionError(
          StrCat(kOp, ": task ", t, " has no gradients accumulated"));
    }
  }
  const size_t num_lora = tasks[0]->params.layers.size() * 4;
  const std::vector<const Tensor*> shared =
      internal::AdapterTensors(std::as_const(tasks[0]->params));
  for (size_t t = 1; t < tasks.size(); ++t) {
    if (absl::Status same = SameAdapter(tasks[0]->params, tasks[t]->params); !same.ok()) {
      return absl::FailedPreconditionError(
          StrCat(kOp, ": task ", t, "'s LoRA adapter differs from task 0's (", same.message(),
                 "): the tasks do not share one adapter (call ShareLora first)"));
    }
  }
  std::vector<TaskState> stepped;
  for (TaskState* t : tasks) {
    stepped.push_back(*t);
    SLICESCHED_RETURN_IF_ERROR(OptimizerStep(stepped.back()));
  }
  std::vector<Tensor> mean(num_lora);
  try {
    c10::InferenceMode guard;
    for (size_t i = 0; i < num_lora; ++i) {
      std::vector<at::Tensor> values;
      for (const TaskState& s : stepped) {
        values.push_back(Access::Unwrap(*internal::AdapterTensors(s.params)[i]));
      }
      if (rule == JointStepRule::kMean) {
        mean[i] = Access::Wrap(at::stack(values, 0).mean(0));
      } else {
        // shared + sum_t (stepped_t - shared) = sum_t stepped_t - (n - 1) shared.
        const at::Tensor start = Access::Unwrap(*shared[i]);
        mean[i] = Access::Wrap(at::stack(values, 0).sum(0) -
                               start * static_cast<double>(values.size() - 1));
      }
    }
  } catch (...) {
    return internal::CurrentExceptionToStatus(kOp);
  }
  for (size_t t = 0; t < tasks.size(); ++t) {
    std::vector<Tensor*> p = internal::AdapterTensors(stepped[t].params);
    for (size_t i = 0; i < num_lora; ++i) *p[i] = mean[i];
    *tasks[t] = std::move(stepped[t]);
  }
  return absl::OkStatus();
}

}  // namespace slicesched::executor
