// Torch TU (ATen only): the full-parameter trainer of full_train.h.
#include "slicesched/executor/train/full_train.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>

#include <cmath>
#include <limits>

#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "slicesched/executor/llama/llama_math.h"
#include "slicesched/executor/torch/aten_tensor.h"

namespace slicesched::executor {
namespace {

using Access = TensorAccess;

// Per layer, in LlamaWeights::NamedTensors order after the embedding.
enum LayerParam { kQ, kK, kV, kO, kGate, kUp, kDown, kInNorm, kPostNorm, kLayerParams };

}  // namespace

struct FullModelTrainer::Impl {
  LlamaDims dims;
  LlamaOptions options;
  AdamWOptions adamw;
  std::vector<std::string> names;
  std::vector<at::Tensor> params, m, v;  // NamedTensors order
  std::vector<bool> decays;              // weight decay applies (matrices only)
  int64_t step = 0;

  const at::Tensor& layer(int64_t l, LayerParam p) const {
    return params[1 + static_cast<size_t>(l * kLayerParams + p)];
  }

  at::Tensor Loss(const at::Tensor& tokens) const {
    const int64_t S = tokens.size(1);
    const int64_t H = dims.heads, KVH = dims.kv_heads, HD = dims.head_dim();
    const double eps = options.rms_eps;
    const at::Tensor pos = at::arange(0, S, at::TensorOptions().dtype(at::kLong));
    const at::Tensor masked = pos.unsqueeze(0) > pos.unsqueeze(1);  // [S, S]: key after query
    const auto [cos, sin] = internal::RopeTables(pos, HD, options.rope_theta);
    at::Tensor x = at::embedding(params.front(), tokens);
    for (int64_t l = 0; l < dims.layers; ++l) {
      const at::Tensor h = internal::RmsNorm(x, layer(l, kInNorm), eps);
      const internal::DecoderLayerWeights w{layer(l, kQ),    layer(l, kK),  layer(l, kV),
                                            layer(l, kO),    layer(l, kGate), layer(l, kUp),
                                            layer(l, kDown), layer(l, kPostNorm)};
      x = internal::DecoderLayerFromNormed(x, h, w, nullptr, masked, cos, sin, eps, H, KVH, HD);
    }
    const at::Tensor h = internal::RmsNorm(x, params[params.size() - 2], eps);
    const at::Tensor logits = at::linear(h.narrow(1, 0, S - 1), params.back());  // [B, S-1, V]
    const at::Tensor labels = tokens.narrow(1, 1, S - 1).reshape({-1});
    return at::nll_loss(at::log_softmax(logits.reshape({-1, dims.vocab}), -1), labels);
  }
};

FullModelTrainer::FullModelTrainer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
FullModelTrainer::FullModelTrainer(FullModelTrainer&&) noexcept = default;
FullModelTrainer& FullModelTrainer::operator=(FullModelTrainer&&) noexcept = default;
FullModelTrainer::~FullModelTrainer() = default;

absl::StatusOr<FullModelTrainer> FullModelTrainer::Create(const LlamaWeights& init, const AdamWOptions& adamw) {
  SLICESCHED_RETURN_IF_ERROR(adamw.Validate());
  if (init.dims().dtype != DType::kF32) {
    return absl::InvalidArgumentError(StrCat("full-parameter training needs an f32 model; '", init.dims().name, "' is not"));
  }
  auto impl = std::make_unique<Impl>();
  impl->dims = init.dims();
  impl->options = init.options();
  impl->adamw = adamw;
  try {
    c10::InferenceMode no_inference(false);
    for (const auto& [name, t] : init.NamedTensors()) {
      // A private, normal (not inference) copy on the host.
      at::Tensor p = Access::Unwrap(t).to(at::kCPU).to(at::kFloat).clone().detach();
      impl->names.push_back(name);
      impl->decays.push_back(p.dim() >= 2);
      impl->m.push_back(at::zeros_like(p));
      impl->v.push_back(at::zeros_like(p));
      impl->params.push_back(p.requires_grad_(true));
    }
  } catch (...) {
    return internal::CurrentExceptionToStatus("FullModelTrainer::Create");
  }
  const size_t want = 3 + static_cast<size_t>(impl->dims.layers * kLayerParams);
  if (impl->params.size() != want) {
    return absl::InternalError(StrCat("FullModelTrainer: the model has ", impl->params.size(), " tensors, expected ", want));
  }
  return FullModelTrainer(std::move(impl));
}

absl::StatusOr<double> FullModelTrainer::Step(const Tensor& tokens) {
  Impl& s = *impl_;
  const std::vector<int64_t> shape = tokens.shape();
  if (!tokens.defined() || tokens.dtype() != DType::kI64 || shape.size() != 2 || shape[0] < 1 || shape[1] < 2) {
    return absl::InvalidArgumentError("FullModelTrainer::Step: tokens must be int64 [B, S] with B >= 1, S >= 2");
  }
  for (int64_t id : tokens.ToInt64()) {
    if (id < 0 || id >= s.dims.vocab) {
      return absl::InvalidArgumentError(StrCat("FullModelTrainer::Step: token ", id, " is outside the vocab ", s.dims.vocab));
    }
  }
  double loss_value = 0;
  try {
    c10::InferenceMode no_inference(false);
    c10::AutoGradMode grad(true);
    for (at::Tensor& p : s.params) p.mutable_grad() = at::Tensor();
    // A normal tensor: the embedding saves its indices for backward.
    const at::Tensor loss = s.Loss(Access::Unwrap(tokens).to(at::kCPU).clone());
    loss.backward();
    loss_value = loss.item<double>();
    if (!std::isfinite(loss_value)) {
      return absl::FailedPreconditionError(StrCat("FullModelTrainer::Step: the loss is ", loss_value, " at step ", s.step));
    }
    c10::AutoGradMode no_grad(false);
    const AdamWOptions& o = s.adamw;
    const double t = static_cast<double>(s.step + 1);
    const double bc1 = 1.0 - std::pow(o.beta1, t), bc2 = 1.0 - std::pow(o.beta2, t);
    for (size_t i = 0; i < s.params.size(); ++i) {
      at::Tensor& p = s.params[i];
      const at::Tensor g = p.grad();
      s.m[i] = s.m[i] * o.beta1 + g * (1.0 - o.beta1);
      s.v[i] = s.v[i] * o.beta2 + g * g * (1.0 - o.beta2);
      const at::Tensor update = (s.m[i] / bc1) / ((s.v[i] / bc2).sqrt() + o.eps) * o.lr;
      if (s.decays[i] && o.weight_decay > 0) p.mul_(1.0 - o.lr * o.weight_decay);
      p.sub_(update);
    }
  } catch (...) {
    return internal::CurrentExceptionToStatus("FullModelTrainer::Step");
  }
  ++s.step;
  return loss_value;
}

void FullModelTrainer::set_learning_rate(double lr) { impl_->adamw.lr = lr; }
int64_t FullModelTrainer::steps() const { return impl_->step; }

std::vector<std::pair<std::string, Tensor>> FullModelTrainer::NamedTensors() const {
  std::vector<std::pair<std::string, Tensor>> out;
  c10::InferenceMode no_inference(false);
  for (size_t i = 0; i < impl_->params.size(); ++i) {
    out.emplace_back(impl_->names[i], Access::Wrap(impl_->params[i].detach().clone()));
  }
  return out;
}

}  // namespace slicesched::executor
