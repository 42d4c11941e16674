// Training state bookkeeping: validation, labels, shared/transferred
// adapters and checkpoints. Torch-free TU (the numerics live in
// train_ops.cc).
#include <charconv>
#include <cmath>
#include <map>
#include <system_error>
#include <utility>

#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "slicesched/executor/torch/safetensors.h"
#include "slicesched/executor/train/train_ops.h"
#include "train_internal.h"

namespace slicesched::executor {

namespace internal {

std::vector<Tensor*> AdapterTensors(TaskAdapters& a) {
  std::vector<Tensor*> out;
  out.reserve(a.layers.size() * 4 + 1);
  for (LoraLayer& l : a.layers) {
    for (Tensor* t : {&l.q_a, &l.q_b, &l.v_a, &l.v_b}) out.push_back(t);
  }
  out.push_back(&a.head);
  return out;
}

std::vector<const Tensor*> AdapterTensors(const TaskAdapters& a) {
  std::vector<const Tensor*> out;
  out.reserve(a.layers.size() * 4 + 1);
  for (const LoraLayer& l : a.layers) {
    for (const Tensor* t : {&l.q_a, &l.q_b, &l.v_a, &l.v_b}) out.push_back(t);
  }
  out.push_back(&a.head);
  return out;
}

std::vector<std::vector<int64_t>> AdapterShapes(const LlamaDims& d, int64_t rank,
                                                int64_t head_outputs) {
  std::vector<std::vector<int64_t>> out;
  const int64_t hd = d.head_dim();
  for (int64_t i = 0; i < d.layers; ++i) {
    out.push_back({rank, d.hidden});
    out.push_back({d.heads * hd, rank});
    out.push_back({rank, d.hidden});
    out.push_back({d.kv_heads * hd, rank});
  }
  out.push_back({head_outputs, d.hidden});
  return out;
}

std::string ShapeString(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? "," : "") + std::to_string(s[i]);
  return out + "]";
}

}  // namespace internal

namespace {

constexpr const char* kLayerTensorNames[] = {"q_a", "q_b", "v_a", "v_b"};

// Exact (shortest round-trip) decimal spelling of a double.
std::string ExactDouble(double x) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof(buf), x);
  return std::string(buf, r.ptr);
}

absl::StatusOr<double> ParseDouble(const std::string& path, const std::string& key,
                                   const std::string& text) {
  double x = 0;
  const auto r = std::from_chars(text.data(), text.data() + text.size(), x);
  if (r.ec != std::errc() || r.ptr != text.data() + text.size()) {
    return absl::InvalidArgumentError(
        StrCat("checkpoint ", path, ": metadata '", key, "' is not a number: '", text, "'"));
  }
  return x;
}

absl::StatusOr<int64_t> ParseInt(const std::string& path, const std::string& key,
                                 const std::string& text) {
  int64_t x = 0;
  const auto r = std::from_chars(text.data(), text.data() + text.size(), x);
  if (r.ec != std::errc() || r.ptr != text.data() + text.size()) {
    return absl::InvalidArgumentError(
        StrCat("checkpoint ", path, ": metadata '", key, "' is not an integer: '", text, "'"));
  }
  return x;
}

}  // namespace

absl::Status LoraConfig::Validate() const {
  if (rank < 1) {
    return absl::InvalidArgumentError(StrCat("LoRA rank must be >= 1, got ", rank));
  }
  if (!std::isfinite(alpha) || alpha <= 0.0) {
    return absl::InvalidArgumentError(StrCat("LoRA alpha must be finite and > 0, got ", alpha));
  }
  return absl::OkStatus();
}

absl::Status AdamWOptions::Validate() const {
  auto bad = [](double x) { return !std::isfinite(x); };
  if (bad(lr) || lr < 0.0)
    return absl::InvalidArgumentError(StrCat("AdamW: lr must be >= 0, got ", lr));
  if (bad(beta1) || beta1 < 0.0 || beta1 >= 1.0) {
    return absl::InvalidArgumentError(StrCat("AdamW: beta1 must be in [0, 1), got ", beta1));
  }
  if (bad(beta2) || beta2 < 0.0 || beta2 >= 1.0) {
    return absl::InvalidArgumentError(StrCat("AdamW: beta2 must be in [0, 1), got ", beta2));
  }
  if (bad(eps) || eps <= 0.0)
    return absl::InvalidArgumentError(StrCat("AdamW: eps must be > 0, got ", eps));
  if (bad(weight_decay) || weight_decay < 0.0) {
    return absl::InvalidArgumentError(
        StrCat("AdamW: weight_decay must be >= 0, got ", weight_decay));
  }
  if (warmup_steps < 0) {
    return absl::InvalidArgumentError(StrCat("AdamW: warmup_steps must be >= 0, got ", warmup_steps));
  }
  return absl::OkStatus();
}

int64_t TaskAdapters::head_outputs() const {
  const auto s = head.shape();
  return s.size() == 2 ? s[0] : 0;
}

std::vector<std::pair<std::string, Tensor>> TaskAdapters::NamedTensors() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < layers.size(); ++i) {
    const LoraLayer& l = layers[i];
    const Tensor* ts[] = {&l.q_a, &l.q_b, &l.v_a, &l.v_b};
    for (size_t k = 0; k < 4; ++k) {
      out.emplace_back(StrCat("layers.", i, ".", kLayerTensorNames[k]), *ts[k]);
    }
  }
  out.emplace_back("head", head);
  return out;
}

int64_t TaskAdapters::NumParams() const {
  int64_t n = 0;
  for (const Tensor* t : internal::AdapterTensors(*this)) n += t->numel();
  return n;
}

absl::Status TaskAdapters::Check(const LlamaDims& dims) const {
  SLICESCHED_RETURN_IF_ERROR(lora.Validate());
  if (static_cast<int64_t>(layers.size()) != dims.layers) {
    return absl::InvalidArgumentError(StrCat("adapters have ", layers.size(), " layers, model '",
                                             dims.name, "' has ", dims.layers));
  }
  if (head_outputs() < 1) {
    return absl::InvalidArgumentError(
        StrCat("adapter head must be [outputs >= 1, ", dims.hidden, "], got ", head.DebugString()));
  }
  const auto shapes = internal::AdapterShapes(dims, lora.rank, head_outputs());
  const auto named = NamedTensors();
  for (size_t i = 0; i < named.size(); ++i) {
    const Tensor& t = named[i].second;
    if (!t.defined() || t.dtype() != DType::kF32 || t.shape() != shapes[i]) {
      return absl::InvalidArgumentError(StrCat("adapter tensor '", named[i].first, "' is ",
                                               t.DebugString(), ", expected f32",
                                               internal::ShapeString(shapes[i]), " (model '",
                                               dims.name, "', LoRA rank ", lora.rank, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status TaskState::Check(const LlamaDims& dims) const {
  SLICESCHED_RETURN_IF_ERROR(params.Check(dims));
  SLICESCHED_RETURN_IF_ERROR(adamw.Validate());
  for (const auto& [what, a] : {std::pair<const char*, const TaskAdapters*>{"first moments", &m},
                                {"second moments", &v},
                                {"accumulated gradients", &grad_sum}}) {
    absl::Status s = a->Check(dims);
    if (!s.ok()) return Annotate(s, StrCat("optimizer ", what));
    if (a->head_outputs() != params.head_outputs() || a->lora.rank != params.lora.rank) {
      return absl::InvalidArgumentError(StrCat("optimizer ", what, " do not match the parameters"));
    }
  }
  if (step < 0 || accumulated < 0) {
    return absl::InvalidArgumentError(
        StrCat("task state has negative step ", step, " or accumulated ", accumulated));
  }
  return absl::OkStatus();
}

absl::StatusOr<TaskState> TaskState::Init(const LlamaDims& dims, const LoraConfig& lora,
                                          int64_t head_outputs, uint64_t seed,
                                          const AdamWOptions& adamw) {
  SLICESCHED_RETURN_IF_ERROR(adamw.Validate());
  TaskState s;
  SLICESCHED_ASSIGN_OR_RETURN(s.params, TaskAdapters::Init(dims, lora, head_outputs, seed));
  SLICESCHED_ASSIGN_OR_RETURN(s.m, TaskAdapters::ZerosLike(s.params));
  s.v = s.m;  // immutable values: sharing the zeros is a copy
  s.grad_sum = s.m;
  s.adamw = adamw;
  return s;
}

absl::StatusOr<Tensor> NextTokenLabels(const Tensor& tokens) {
  const auto s = tokens.shape();
  if (!tokens.defined() || s.size() != 2 || tokens.dtype() != DType::kI64) {
    return absl::InvalidArgumentError(
        StrCat("NextTokenLabels: tokens must be int64 [B, S], got ", tokens.DebugString()));
  }
  const std::vector<int64_t> ids = tokens.ToInt64();
  std::vector<int64_t> labels(ids.size(), -1);
  for (int64_t b = 0; b < s[0]; ++b) {
    for (int64_t t = 0; t + 1 < s[1]; ++t) {
      labels[static_cast<size_t>(b * s[1] + t)] = ids[static_cast<size_t>(b * s[1] + t + 1)];
    }
  }
  return Tensor::FromInt64(labels, s);
}

absl::StatusOr<Tensor> LastPositionLabels(std::span<const int64_t> classes, int64_t seq_len) {
  if (seq_len < 1) {
    return absl::InvalidArgumentError(
        StrCat("LastPositionLabels: seq_len must be >= 1, got ", seq_len));
  }
  const int64_t B = static_cast<int64_t>(classes.size());
  std::vector<int64_t> labels(static_cast<size_t>(B * seq_len), -1);
  for (int64_t b = 0; b < B; ++b) {
    if (classes[static_cast<size_t>(b)] < 0) {
      return absl::InvalidArgumentError(StrCat("LastPositionLabels: negative class ",
                                               classes[static_cast<size_t>(b)], " in row ", b));
    }
    labels[static_cast<size_t>(b * seq_len + seq_len - 1)] = classes[static_cast<size_t>(b)];
  }
  return Tensor::FromInt64(labels, {B, seq_len});
}

absl::Status ShareLora(std::span<TaskState* const> tasks) {
  if (tasks.empty()) return absl::InvalidArgumentError("ShareLora: no tasks");
  for (size_t t = 0; t < tasks.size(); ++t) {
    if (tasks[t] == nullptr)
      return absl::InvalidArgumentError(StrCat("ShareLora: task ", t, " is null"));
  }
  const TaskAdapters& src = tasks[0]->params;
  for (size_t t = 1; t < tasks.size(); ++t) {
    const TaskAdapters& dst = tasks[t]->params;
    if (dst.layers.size() != src.layers.size() || dst.lora.rank != src.lora.rank) {
      return absl::InvalidArgumentError(StrCat("ShareLora: task ", t, " has ", dst.layers.size(),
                                               " layers of rank ", dst.lora.rank, ", task 0 has ",
                                               src.layers.size(), " of rank ", src.lora.rank));
    }
  }
  for (size_t t = 1; t < tasks.size(); ++t) {
    tasks[t]->params.lora = src.lora;
    tasks[t]->params.layers = src.layers;  // immutable values: a copy
  }
  return absl::OkStatus();
}

absl::Status SameAdapter(const TaskAdapters& a, const TaskAdapters& b) {
  if (a.lora.rank != b.lora.rank || a.lora.alpha != b.lora.alpha || a.layers.size() != b.layers.size()) {
    return absl::FailedPreconditionError(StrCat("different LoRA configs (rank ", a.lora.rank, ", alpha ",
                                                a.lora.alpha, ", ", a.layers.size(), " layers / rank ", b.lora.rank,
                                                ", alpha ", b.lora.alpha, ", ", b.layers.size(), " layers)"));
  }
  for (size_t l = 0; l < a.layers.size(); ++l) {
    const LoraLayer &x = a.layers[l], &y = b.layers[l];
    for (const auto& [p, q] : {std::pair{&x.q_a, &y.q_a}, std::pair{&x.q_b, &y.q_b}, std::pair{&x.v_a, &y.v_a},
                               std::pair{&x.v_b, &y.v_b}}) {
      // MaxAbsDiff is infinite for different shapes, NaN where a value is.
      if (!(p->MaxAbsDiff(*q) == 0.0)) {
        return absl::FailedPreconditionError(StrCat("different LoRA factors (layer ", l, " differs)"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status TransferLora(const TaskState& from, TaskState& to) {
  const TaskAdapters& src = from.params;
  const TaskAdapters& dst = to.params;
  if (src.layers.size() != dst.layers.size() || src.lora.rank != dst.lora.rank) {
    return absl::InvalidArgumentError(StrCat("TransferLora: source has ", src.layers.size(),
                                             " layers of rank ", src.lora.rank, ", destination ",
                                             dst.layers.size(), " of rank ", dst.lora.rank));
  }
  for (size_t i = 0; i < src.layers.size(); ++i) {
    const LoraLayer& a = src.layers[i];
    const LoraLayer& b = dst.layers[i];
    if (a.q_a.shape() != b.q_a.shape() || a.q_b.shape() != b.q_b.shape() ||
        a.v_a.shape() != b.v_a.shape() || a.v_b.shape() != b.v_b.shape()) {
      return absl::InvalidArgumentError(StrCat("TransferLora: layer ", i, " shapes differ"));
    }
  }
  TaskState next = to;
  next.params.lora = src.lora;
  next.params.layers = src.layers;  // immutable values: a copy
  SLICESCHED_ASSIGN_OR_RETURN(next.m, TaskAdapters::ZerosLike(next.params));
  next.v = next.m;
  next.grad_sum = next.m;
  next.step = 0;
  next.accumulated = 0;
  to = std::move(next);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Checkpoints

absl::Status SaveTaskCheckpoint(const std::string& path, const TaskState& state) {
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& [prefix, a] :
       {std::pair<const char*, const TaskAdapters*>{"params.", &state.params},
        {"m.", &state.m},
        {"v.", &state.v},
        {"grad_sum.", &state.grad_sum}}) {
    for (auto& [name, t] : a->NamedTensors()) tensors.emplace_back(prefix + name, t);
  }
  const std::map<std::string, std::string> meta = {
      // v2 for SGD: a v1 reader ignores the optimizer key and would load the
      // momentum buffer as AdamW's first moment; refusing the file is right.
      {"format", state.optimizer == OptimizerKind::kSgd ? "slicesched-task-state-v2" : "slicesched-task-state-v1"},
      {"layers", std::to_string(state.params.layers.size())},
      {"head_outputs", std::to_string(state.params.head_outputs())},
      {"lora_rank", std::to_string(state.params.lora.rank)},
      {"lora_alpha", ExactDouble(state.params.lora.alpha)},
      {"adamw_lr", ExactDouble(state.adamw.lr)},
      {"adamw_beta1", ExactDouble(state.adamw.beta1)},
      {"adamw_beta2", ExactDouble(state.adamw.beta2)},
      {"adamw_eps", ExactDouble(state.adamw.eps)},
      {"adamw_weight_decay", ExactDouble(state.adamw.weight_decay)},
      {"adamw_warmup_steps", std::to_string(state.adamw.warmup_steps)},
      {"optimizer", state.optimizer == OptimizerKind::kSgd ? "sgd" : "adamw"},
      {"sgd_momentum", ExactDouble(state.momentum)},
      {"step", std::to_string(state.step)},
      {"accumulated", std::to_string(state.accumulated)},
  };
  return Annotate(WriteSafetensors(path, tensors, meta), "SaveTaskCheckpoint");
}

absl::StatusOr<TaskState> LoadTaskCheckpoint(const std::string& path, const LlamaDims& dims) {
  SLICESCHED_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open(path));
  const auto& meta = file.metadata();
  auto get = [&](const std::string& key) -> absl::StatusOr<std::string> {
    auto it = meta.find(key);
    if (it == meta.end()) {
      return absl::InvalidArgumentError(
          StrCat("checkpoint ", path, ": metadata '", key, "' is missing"));
    }
    return it->second;
  };
  SLICESCHED_ASSIGN_OR_RETURN(std::string format, get("format"));
  if (format != "slicesched-task-state-v1" && format != "slicesched-task-state-v2") {
    return absl::InvalidArgumentError(
        StrCat("checkpoint ", path, ": unknown format '", format, "'"));
  }
  auto get_int = [&](const std::string& key) -> absl::StatusOr<int64_t> {
    SLICESCHED_ASSIGN_OR_RETURN(std::string text, get(key));
    return ParseInt(path, key, text);
  };
  auto get_double = [&](const std::string& key) -> absl::StatusOr<double> {
    SLICESCHED_ASSIGN_OR_RETURN(std::string text, get(key));
    return ParseDouble(path, key, text);
  };
  TaskState s;
  SLICESCHED_ASSIGN_OR_RETURN(const int64_t layers, get_int("layers"));
  if (layers != dims.layers) {
    return absl::InvalidArgumentError(StrCat("checkpoint ", path, " has ", layers,
                                             " layers, model '", dims.name, "' has ", dims.layers));
  }
  SLICESCHED_ASSIGN_OR_RETURN(const int64_t head_outputs, get_int("head_outputs"));
  SLICESCHED_ASSIGN_OR_RETURN(s.params.lora.rank, get_int("lora_rank"));
  SLICESCHED_ASSIGN_OR_RETURN(s.params.lora.alpha, get_double("lora_alpha"));
  SLICESCHED_ASSIGN_OR_RETURN(s.adamw.lr, get_double("adamw_lr"));
  SLICESCHED_ASSIGN_OR_RETURN(s.adamw.beta1, get_double("adamw_beta1"));
  SLICESCHED_ASSIGN_OR_RETURN(s.adamw.beta2, get_double("adamw_beta2"));
  SLICESCHED_ASSIGN_OR_RETURN(s.adamw.eps, get_double("adamw_eps"));
  SLICESCHED_ASSIGN_OR_RETURN(s.adamw.weight_decay, get_double("adamw_weight_decay"));
  // Optional (files written before the warm-up existed had none).
  if (meta.contains("adamw_warmup_steps")) {
    SLICESCHED_ASSIGN_OR_RETURN(s.adamw.warmup_steps, get_int("adamw_warmup_steps"));
  }
  // Optional (files written before SGD existed are AdamW states).
  if (auto it = meta.find("optimizer"); it != meta.end()) {
    if (it->second == "sgd") {
      s.optimizer = OptimizerKind::kSgd;
    } else if (it->second != "adamw") {
      return absl::InvalidArgumentError(
          StrCat("checkpoint ", path, ": metadata 'optimizer' is '", it->second, "', expected adamw or sgd"));
    }
  }
  if (meta.contains("sgd_momentum")) {
    SLICESCHED_ASSIGN_OR_RETURN(s.momentum, get_double("sgd_momentum"));
  }
  SLICESCHED_ASSIGN_OR_RETURN(s.step, get_int("step"));
  SLICESCHED_ASSIGN_OR_RETURN(s.accumulated, get_int("accumulated"));
  SLICESCHED_RETURN_IF_ERROR(s.params.lora.Validate());
  if (head_outputs < 1) {
    return absl::InvalidArgumentError(StrCat("checkpoint ", path, ": head_outputs ", head_outputs));
  }
  const auto shapes = internal::AdapterShapes(dims, s.params.lora.rank, head_outputs);
  for (const auto& [prefix, a] : {std::pair<const char*, TaskAdapters*>{"params.", &s.params},
                                  {"m.", &s.m},
                                  {"v.", &s.v},
                                  {"grad_sum.", &s.grad_sum}}) {
    a->lora = s.params.lora;
    a->layers.resize(static_cast<size_t>(dims.layers));
    const std::vector<Tensor*> slots = internal::AdapterTensors(*a);
    const auto named = a->NamedTensors();  // names only (tensors still undefined)
    for (size_t i = 0; i < slots.size(); ++i) {
      SLICESCHED_ASSIGN_OR_RETURN(*slots[i],
                                  file.Get(prefix + named[i].first, shapes[i], DType::kF32));
    }
  }
  SLICESCHED_RETURN_IF_ERROR(Annotate(s.Check(dims), StrCat("checkpoint ", path)));
  return s;
}

}  // namespace slicesched::executor
