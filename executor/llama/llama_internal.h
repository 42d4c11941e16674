// Executor-internal description of a Llama model's parameters (torch-free).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "slicesched/gmg/llama.h"

namespace slicesched::executor::internal {

enum class ParamInit { kNormal, kNorm };  // N(0, std^2) or 1 + N(0, std^2)

struct LlamaParamSpec {
  std::string name;  // HuggingFace name
  std::vector<int64_t> shape;
  ParamInit init = ParamInit::kNormal;
  double std = 1.0;
};

// All parameters in a fixed order: embed_tokens, then per layer q, k, v, o,
// gate, up, down, input_layernorm, post_attention_layernorm, then norm and
// lm_head. FromSeed draws them in this order.
std::vector<LlamaParamSpec> LlamaParamSpecs(const LlamaDims& dims);

}  // namespace slicesched::executor::internal
