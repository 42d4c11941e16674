// LlamaWeights bookkeeping and safetensors loading (torch-free TU; FromSeed
// lives in llama_ops.cc).
#include <cmath>
#include <cstdint>
#include <cstring>

#include "llama_internal.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "slicesched/executor/llama/llama_ops.h"
#include "slicesched/executor/torch/safetensors.h"
#include "slicesched/executor/torch/aten_tensor.h"

namespace slicesched::executor {

namespace internal {

std::vector<LlamaParamSpec> LlamaParamSpecs(const LlamaDims& d) {
  const int64_t hd = d.head_dim();
  const double norm_std = 0.1;
  auto proj_std = [](int64_t in) { return 1.0 / std::sqrt(static_cast<double>(in)); };
  std::vector<LlamaParamSpec> specs;
  specs.push_back({"model.embed_tokens.weight", {d.vocab, d.hidden}, ParamInit::kNormal, 1.0});
  for (int64_t i = 0; i < d.layers; ++i) {
    const std::string p = StrCat("model.layers.", i, ".");
    specs.push_back({p + "self_attn.q_proj.weight", {d.heads * hd, d.hidden}, ParamInit::kNormal,
                     proj_std(d.hidden)});
    specs.push_back({p + "self_attn.k_proj.weight", {d.kv_heads * hd, d.hidden}, ParamInit::kNormal,
                     proj_std(d.hidden)});
    specs.push_back({p + "self_attn.v_proj.weight", {d.kv_heads * hd, d.hidden}, ParamInit::kNormal,
                     proj_std(d.hidden)});
    specs.push_back({p + "self_attn.o_proj.weight", {d.hidden, d.heads * hd}, ParamInit::kNormal,
                     proj_std(d.heads * hd)});
    specs.push_back({p + "mlp.gate_proj.weight", {d.ffn, d.hidden}, ParamInit::kNormal,
                     proj_std(d.hidden)});
    specs.push_back({p + "mlp.up_proj.weight", {d.ffn, d.hidden}, ParamInit::kNormal,
                     proj_std(d.hidden)});
    specs.push_back({p + "mlp.down_proj.weight", {d.hidden, d.ffn}, ParamInit::kNormal,
                     proj_std(d.ffn)});
    specs.push_back({p + "input_layernorm.weight", {d.hidden}, ParamInit::kNorm, norm_std});
    specs.push_back({p + "post_attention_layernorm.weight", {d.hidden}, ParamInit::kNorm, norm_std});
  }
  specs.push_back({"model.norm.weight", {d.hidden}, ParamInit::kNorm, norm_std});
  specs.push_back({"lm_head.weight", {d.vocab, d.hidden}, ParamInit::kNormal, proj_std(d.hidden)});
  return specs;
}

}  // namespace internal

absl::Status LlamaWeights::CheckDims(const LlamaDims& dims) {
  SLICESCHED_RETURN_IF_ERROR(dims.Validate());
  if (dims.head_dim() % 2 != 0) {
    return absl::InvalidArgumentError(
        StrCat("model '", dims.name, "': head_dim ", dims.head_dim(),
               " must be even for rotary embeddings"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const LlamaWeights>> LlamaWeights::Assemble(
    const LlamaDims& dims, const LlamaOptions& options, std::vector<Tensor> tensors) {
  SLICESCHED_RETURN_IF_ERROR(CheckDims(dims));
  const auto specs = internal::LlamaParamSpecs(dims);
  if (tensors.size() != specs.size()) {
    return absl::InternalError(StrCat("LlamaWeights: got ", tensors.size(), " tensors, expected ",
                                      specs.size()));
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    if (tensors[i].shape() != specs[i].shape || tensors[i].dtype() != dims.dtype) {
      return absl::InternalError(StrCat("LlamaWeights: ", specs[i].name, " is ",
                                        tensors[i].DebugString()));
    }
  }
  auto w = std::shared_ptr<LlamaWeights>(new LlamaWeights());
  w->dims_ = dims;
  w->options_ = options;
  size_t k = 0;
  w->embed_tokens_ = std::move(tensors[k++]);
  w->layers_.resize(static_cast<size_t>(dims.layers));
  for (auto& l : w->layers_) {
    l.q_proj = std::move(tensors[k++]);
    l.k_proj = std::move(tensors[k++]);
    l.v_proj = std::move(tensors[k++]);
    l.o_proj = std::move(tensors[k++]);
    l.gate_proj = std::move(tensors[k++]);
    l.up_proj = std::move(tensors[k++]);
    l.down_proj = std::move(tensors[k++]);
    l.input_layernorm = std::move(tensors[k++]);
    l.post_attention_layernorm = std::move(tensors[k++]);
  }
  w->norm_ = std::move(tensors[k++]);
  w->lm_head_ = std::move(tensors[k++]);
  return std::shared_ptr<const LlamaWeights>(std::move(w));
}

absl::StatusOr<std::shared_ptr<const LlamaWeights>> LlamaWeights::FromSafetensors(
    const LlamaDims& dims, const std::string& path, const LlamaOptions& options) {
  SLICESCHED_RETURN_IF_ERROR(CheckDims(dims));
  SLICESCHED_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open(path));
  std::vector<Tensor> tensors;
  for (const auto& spec : internal::LlamaParamSpecs(dims)) {
    SLICESCHED_ASSIGN_OR_RETURN(Tensor t, file.Get(spec.name, spec.shape, dims.dtype));
    tensors.push_back(std::move(t));
  }
  return Assemble(dims, options, std::move(tensors));
}

absl::StatusOr<std::shared_ptr<const LlamaWeights>> LlamaWeights::WithFusion(int64_t fusion) const {
  LlamaDims dims = dims_;
  dims.fusion = fusion;
  SLICESCHED_RETURN_IF_ERROR(CheckDims(dims));
  auto w = std::shared_ptr<LlamaWeights>(new LlamaWeights(*this));
  w->dims_ = dims;
  return std::shared_ptr<const LlamaWeights>(std::move(w));
}

namespace {

// f32 -> bf16 by round to nearest even (NaN stays a quiet NaN).
uint16_t Bf16Bits(float f) {
  uint32_t u = 0;
  std::memcpy(&u, &f, sizeof u);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

absl::StatusOr<Tensor> Converted(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  const std::vector<float> values = t.ToFloat();
  if (dtype == DType::kF32) {
    return internal::TensorFromBytes(dtype, t.shape(), values.data(), values.size() * sizeof(float));
  }
  std::vector<uint16_t> bits(values.size());
  for (size_t i = 0; i < values.size(); ++i) bits[i] = Bf16Bits(values[i]);
  return internal::TensorFromBytes(dtype, t.shape(), bits.data(), bits.size() * sizeof(uint16_t));
}

}  // namespace

absl::StatusOr<std::shared_ptr<const LlamaWeights>> LlamaWeights::WithDType(DType dtype) const {
  if (dtype != DType::kF32 && dtype != DType::kBF16) {
    return absl::InvalidArgumentError(
        StrCat("LlamaWeights::WithDType: ", DTypeName(dtype), " is not supported (f32 or bf16)"));
  }
  if (dtype == dims_.dtype) return std::shared_ptr<const LlamaWeights>(new LlamaWeights(*this));
  LlamaDims dims = dims_;
  dims.dtype = dtype;
  std::vector<Tensor> tensors;
  for (const auto& [name, t] : NamedTensors()) {
    SLICESCHED_ASSIGN_OR_RETURN(Tensor c, Converted(t, dtype));
    tensors.push_back(std::move(c));
  }
  return Assemble(dims, options_, std::move(tensors));
}

absl::StatusOr<std::shared_ptr<const LlamaWeights>> LlamaWeights::OnDevice(TensorDevice device) const {
  if (this->device() == device) return std::shared_ptr<const LlamaWeights>(new LlamaWeights(*this));
  std::vector<Tensor> tensors;
  for (const auto& [name, t] : NamedTensors()) {
    absl::StatusOr<Tensor> moved = ToDevice(t, device);
    if (!moved.ok()) return Annotate(moved.status(), StrCat("model '", dims_.name, "': ", name));
    tensors.push_back(*std::move(moved));
  }
  return Assemble(dims_, options_, std::move(tensors));
}

std::vector<std::pair<std::string, Tensor>> LlamaWeights::NamedTensors() const {
  const auto specs = internal::LlamaParamSpecs(dims_);
  std::vector<std::pair<std::string, Tensor>> out;
  out.reserve(specs.size());
  size_t k = 0;
  out.emplace_back(specs[k++].name, embed_tokens_);
  for (const auto& l : layers_) {
    for (const Tensor* t : {&l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.gate_proj, &l.up_proj,
                            &l.down_proj, &l.input_layernorm, &l.post_attention_layernorm}) {
      out.emplace_back(specs[k++].name, *t);
    }
  }
  out.emplace_back(specs[k++].name, norm_);
  out.emplace_back(specs[k++].name, lm_head_);
  return out;
}

Bytes LlamaWeights::EmbeddingBytes() const { return embed_tokens_.bytes(); }

Bytes LlamaWeights::LayerBytes(int64_t layer) const {
  if (layer < 0 || layer >= static_cast<int64_t>(layers_.size())) return Bytes(0);
  const auto& l = layers_[static_cast<size_t>(layer)];
  return l.q_proj.bytes() + l.k_proj.bytes() + l.v_proj.bytes() + l.o_proj.bytes() +
         l.gate_proj.bytes() + l.up_proj.bytes() + l.down_proj.bytes() +
         l.input_layernorm.bytes() + l.post_attention_layernorm.bytes();
}

Bytes LlamaWeights::GroupBytes(int64_t group) const {
  Bytes total(0);
  if (group < 0 || group >= dims_.num_groups()) return total;
  for (int64_t i = 0; i < dims_.fusion; ++i) total += LayerBytes(group * dims_.fusion + i);
  return total;
}

Bytes LlamaWeights::LmHeadBytes() const { return norm_.bytes() + lm_head_.bytes(); }

Bytes LlamaWeights::TotalBytes() const {
  Bytes total = EmbeddingBytes() + LmHeadBytes();
  for (int64_t i = 0; i < dims_.layers; ++i) total += LayerBytes(i);
  return total;
}

}  // namespace slicesched::executor
