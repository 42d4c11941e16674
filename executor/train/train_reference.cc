// ReferenceTrainLoss: a deliberately plain, independent implementation of the
// LoRA training objective, used only to check the training operators. It
// shares no helper with train_ops.cc: merged weights W + s B A, per-head
// attention row by row, f64, one autograd graph for the whole model. Torch TU
// (ATen only).
#include "slicesched/executor/train/train_ops.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>

#include <cmath>
#include <string>
#include <vector>

#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "slicesched/executor/llama/reference_math.h"
#include "slicesched/executor/torch/aten_tensor.h"

namespace slicesched::executor {

using reference::RefRmsNorm;
using reference::RefRope;

// ReferenceTrainLoss: the training objective written plainly in f64, row by
// row with merged weights W + s B A and per-head attention; one autograd
// graph for the whole model.
absl::StatusOr<ReferenceTrainResult> ReferenceTrainLoss(
    const LlamaWeights& weights, std::span<const TaskAdapters* const> tasks,
    const TrainBatch& batch, const std::optional<ReferencePerturbation>& perturb) {
  const LlamaDims& d = weights.dims();
  constexpr std::string_view kOp = "ReferenceTrainLoss";
  const auto ts = batch.tokens.shape();
  if (!batch.tokens.defined() || ts.size() != 2 || batch.tokens.dtype() != DType::kI64 ||
      batch.labels.shape() != ts || batch.labels.dtype() != DType::kI64) {
    return absl::InvalidArgumentError(StrCat(kOp, ": tokens ", batch.tokens.DebugString(),
                                             " and labels ", batch.labels.DebugString(),
                                             " must both be int64 [B, T]"));
  }
  const int64_t B = ts[0], T = ts[1];
  if (tasks.empty()) return absl::InvalidArgumentError(StrCat(kOp, ": no tasks"));
  for (const TaskAdapters* t : tasks) {
    if (t == nullptr) return absl::InvalidArgumentError(StrCat(kOp, ": null task"));
    SLICESCHED_RETURN_IF_ERROR(t->Check(d));
  }
  std::vector<int64_t> rows = batch.row_task;
  if (rows.empty()) rows.assign(static_cast<size_t>(B), 0);
  if (static_cast<int64_t>(rows.size()) != B) {
    return absl::InvalidArgumentError(StrCat(kOp, ": row_task size differs from the batch"));
  }
  for (int64_t r : rows) {
    if (r < 0 || r >= static_cast<int64_t>(tasks.size())) {
      return absl::OutOfRangeError(StrCat(kOp, ": row task ", r, " out of range"));
    }
  }
  const std::vector<int64_t> ids = batch.tokens.ToInt64();
  const std::vector<int64_t> labels = batch.labels.ToInt64();
  try {
    c10::InferenceMode no_inference(false);
    c10::AutoGradMode grad_mode(true);
    auto D = [](const Tensor& t) { return TensorAccess::Unwrap(t).to(at::kDouble); };
    // Per task: f64 leaves in NamedTensors order.
    std::vector<std::vector<at::Tensor>> leaves(tasks.size());
    for (size_t t = 0; t < tasks.size(); ++t) {
      for (const auto& [name, tensor] : tasks[t]->NamedTensors()) {
        at::Tensor x = D(tensor).clone();
        if (perturb.has_value() && perturb->task == static_cast<int64_t>(t) &&
            perturb->name == name) {
          if (perturb->index < 0 || perturb->index >= x.numel()) {
            return absl::OutOfRangeError(
                StrCat(kOp, ": perturbation index ", perturb->index, " outside '", name, "'"));
          }
          x.view({-1})[perturb->index].add_(perturb->delta);
        }
        leaves[t].push_back(x.detach().requires_grad_(true));
      }
    }
    const int64_t hd = d.head_dim(), group_size = d.heads / d.kv_heads;
    const double eps = weights.options().rms_eps, theta = weights.options().rope_theta;
    const at::Tensor future = at::ones({T, T}, at::TensorOptions().dtype(at::kBool)).triu(1);
    const at::Tensor embed = D(weights.embed_tokens());
    std::vector<at::Tensor> loss_sum(tasks.size());
    std::vector<int64_t> count(tasks.size(), 0);
    for (int64_t b = 0; b < B; ++b) {
      const size_t task = static_cast<size_t>(rows[static_cast<size_t>(b)]);
      const std::vector<at::Tensor>& lv = leaves[task];
      const double s = tasks[task]->lora.scaling();
      std::vector<int64_t> row_ids(ids.begin() + b * T, ids.begin() + (b + 1) * T);
      at::Tensor x = embed.index_select(
          0, at::tensor(at::ArrayRef<int64_t>(row_ids), at::TensorOptions().dtype(at::kLong)));
      for (int64_t i = 0; i < d.layers; ++i) {
        const LlamaLayerWeights& lw = weights.layer(i);
        const size_t k = static_cast<size_t>(4 * i);
        const at::Tensor wq = D(lw.q_proj) + s * at::matmul(lv[k + 1], lv[k]);
        const at::Tensor wv = D(lw.v_proj) + s * at::matmul(lv[k + 3], lv[k + 2]);
        const at::Tensor h = RefRmsNorm(x, D(lw.input_layernorm), eps);
        const at::Tensor q = RefRope(at::matmul(h, wq.t()).reshape({1, T, d.heads, hd}), theta)[0];
        const at::Tensor kk =
            RefRope(at::matmul(h, D(lw.k_proj).t()).reshape({1, T, d.kv_heads, hd}), theta)[0];
        const at::Tensor v = at::matmul(h, wv.t()).reshape({T, d.kv_heads, hd});
        std::vector<at::Tensor> heads;
        for (int64_t head = 0; head < d.heads; ++head) {
          const int64_t kv = head / group_size;
          at::Tensor scores = at::matmul(q.select(1, head), kk.select(1, kv).t()) /
                              std::sqrt(static_cast<double>(hd));
          scores = scores.masked_fill(future, -INFINITY);
          const at::Tensor e = at::exp(scores - std::get<0>(scores.max(-1, true)));
          heads.push_back(at::matmul(e / e.sum(-1, true), v.select(1, kv)));  // [T, hd]
        }
        x = x + at::matmul(at::cat(heads, -1), D(lw.o_proj).t());
        const at::Tensor h2 = RefRmsNorm(x, D(lw.post_attention_layernorm), eps);
        const at::Tensor g = at::matmul(h2, D(lw.gate_proj).t());
        const at::Tensor u = at::matmul(h2, D(lw.up_proj).t());
        x = x + at::matmul(g * at::sigmoid(g) * u, D(lw.down_proj).t());
      }
      const at::Tensor logits = at::matmul(RefRmsNorm(x, D(weights.norm()), eps), lv.back().t());
      const at::Tensor logp = logits - at::logsumexp(logits, -1, true);  // [T, C]
      for (int64_t t = 0; t < T; ++t) {
        const int64_t y = labels[static_cast<size_t>(b * T + t)];
        if (y < 0) continue;
        if (y >= logits.size(1)) {
          return absl::OutOfRangeError(StrCat(kOp, ": label ", y, " outside the head"));
        }
        const at::Tensor nll = -logp[t][y];
        loss_sum[task] = loss_sum[task].defined() ? loss_sum[task] + nll : nll;
        ++count[task];
      }
    }
    at::Tensor total;
    std::vector<at::Tensor> losses(tasks.size());
    for (size_t t = 0; t < tasks.size(); ++t) {
      if (count[t] == 0) continue;
      losses[t] = loss_sum[t] / static_cast<double>(count[t]);
      total = total.defined() ? total + losses[t] : losses[t];
    }
    if (total.defined()) total.backward();
    ReferenceTrainResult r;
    for (size_t t = 0; t < tasks.size(); ++t) {
      r.loss.push_back(losses[t].defined() ? losses[t].item<double>() : 0.0);
      TaskAdapters g;
      g.lora = tasks[t]->lora;
      g.layers.resize(tasks[t]->layers.size());
      size_t k = 0;
      auto grad_of = [&](size_t j) {
        const at::Tensor& gr = leaves[t][j].grad();
        return TensorAccess::Wrap(gr.defined() ? gr.detach()
                                               : at::zeros_like(leaves[t][j].detach()));
      };
      for (LoraLayer& l : g.layers) {
        l.q_a = grad_of(k++);
        l.q_b = grad_of(k++);
        l.v_a = grad_of(k++);
        l.v_b = grad_of(k++);
      }
      g.head = grad_of(k++);
      r.grads.push_back(std::move(g));
    }
    return r;
  } catch (...) {
    return internal::CurrentExceptionToStatus(kOp);
  }
}

}  // namespace slicesched::executor
