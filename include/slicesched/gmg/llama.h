// Llama-family template builder.
//
// From model dimensions and a fusion factor (decoder layers per scheduled
// operator, default 8 as in the paper) it builds two templates:
//
//   <name>/prefill  symbols B (batch), S (prompt tokens)
//       $tokens[B,S] -> embed -> g0 -> ... -> g{G-1} -> head -> sample
//       each group retains its KV cache kv[2,F,B,S,NKV,HD] as a checkpoint
//   <name>/decode   symbols B (batch), C (tokens already cached)
//       $tokens[B,1] -> embed -> g0 (@kv0) -> ... -> head -> sample
//       each group grows its attached KV checkpoint from C to C+1 tokens
//
// Byte counts are exact for the weights and the KV cache; activations are the
// op outputs; workspace is the transient peak of one layer (QKV projections,
// fp32 attention scores, the SwiGLU gate and up projections).
//
// Weight keys ("<name>/layers0-7", ...) are shared by both templates, so a
// device holding a group's weights can run that group's prefill and decode.
//
// A third template runs one fine-tuning iteration (one micro-batch) of LoRA
// adapters on the frozen backbone (executor/train/train_ops.h):
//
//   <name>/train    symbols B (batch), S (tokens per row), R (LoRA rank),
//                   NC (head outputs: classes, or the vocabulary for a
//                   next-token objective), T (task slots: 1, or the jobs of
//                   a spatial joint step, whose rows B and head outputs NC
//                   are summed over the slots)
//       $tokens[B,S] -> embed -> f0 -> ... -> f{G-1} -> loss ($labels[B,S])
//       loss -> b{G-1} -> ... -> b0;  b*:grads + loss -> optimizer
//     f{g} (train_forward)  hidden -> hidden, tape (the autograd stash that
//                           b{g} consumes; an estimate of its bytes)
//     loss (train_loss)     final norm, task head, cross-entropy and the
//                           head's backward: d_hidden, head_grad[NC,H], loss[T]
//     b{g} (train_backward) d_hidden, tape -> d_hidden (of the group's input),
//                           grads[T*F, ..] (the group's LoRA gradients per
//                           slot, f32)
//     optimizer             accumulates the gradients of all groups and the
//       (optimizer_step)    head, and steps AdamW every N micro-batches
//                           (the N is the job's, not the template's; a joint
//                           step: one JointOptimizerStep over the slots)
//   The op kinds (and the estimators' features: batch, tokens) are those of
//   single-task training; a joint step is one instance with B = all rows.
//   f{g} and b{g} carry the group's weight key, so training shares the
//   serving backbone resident on a device. Partitions: as below, with f{g}
//   and b{g} on group g's slot and loss + optimizer on the last slot.
//
// Candidate partitions: "single" (everything on one slot), "pp2" (first half
// of the groups with the embedding on slot 0, the rest with the head on slot
// 1) and, when the group count allows, "pp4" and "pp8" (one group per slot,
// the embedding on the first slot, the head on the last).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "slicesched/common/config.h"
#include "slicesched/gmg/dtype.h"
#include "slicesched/gmg/gmg.h"
#include "slicesched/gmg/graph_template.h"

namespace slicesched {

struct LlamaDims {
  std::string name = "llama";
  int64_t layers = 0;
  int64_t hidden = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t ffn = 0;
  int64_t vocab = 0;
  DType dtype = DType::kBF16;
  int64_t fusion = 8;  // layers per fused operator

  int64_t head_dim() const { return hidden / heads; }
  int64_t num_groups() const { return layers / fusion; }
  int64_t ParamsPerLayer() const;
  int64_t ParamsPerGroup() const { return ParamsPerLayer() * fusion; }
  int64_t EmbeddingParams() const { return vocab * hidden; }
  int64_t LmHeadParams() const { return vocab * hidden + hidden; }  // + final norm
  int64_t TotalParams() const {
    return EmbeddingParams() + ParamsPerLayer() * layers + LmHeadParams();
  }
  // 2 (K and V) x kv_heads x head_dim x element size.
  int64_t KvBytesPerTokenPerLayer() const { return 2 * kv_heads * head_dim() * DTypeSize(dtype); }

  // Largest layers/hidden/heads/kv_heads/ffn/vocab and fused groups per pass
  // (layers / fusion) Validate accepts.
  static constexpr int64_t kMaxDim = int64_t{1} << 22;
  static constexpr int64_t kMaxGroups = 1024;
  // Positive dims within the bounds above, divisibility (hidden by heads,
  // heads by kv_heads, layers by fusion), a floating dtype. Errors name the
  // model and the field.
  absl::Status Validate() const;
  // Parses a `model:` section (name, family, layers, hidden, heads, kv_heads,
  // ffn, vocab, dtype, fusion; docs/operations.md, "deployments"). `family`
  // is optional and must be `llama`, the only family there are templates for.
  static LlamaDims FromConfig(const ConfigReader& model);
};

struct LlamaTemplates {
  std::shared_ptr<const GraphTemplate> prefill;
  std::shared_ptr<const GraphTemplate> decode;
};

absl::StatusOr<LlamaTemplates> BuildLlamaTemplates(const LlamaDims& dims);

// Weight key of fused group g ("<name>/layers0-7").
std::string LlamaGroupWeightKey(const LlamaDims& dims, int64_t group);

// The instance of one decode step of a conversation on a `<name>/decode`
// template: batch 1, `context` tokens already in the KV caches `kv` (one per
// fused group, in group order, as the prefill retained them), attached as
// @kv0, @kv1, ... Callers set tenant, priority or label on the result.
InstanceSpec LlamaDecodeStep(TemplateId decode, int64_t context, const std::vector<CheckpointId>& kv,
                             PriorityClass priority_class, Timestamp arrival);

// The arrival a decode step of a conversation is given, for the scheduler's
// queues and offline aging: an online step arrives now (each token has its
// own deadline); an offline step carries its request's admission time, so an
// offline request ages as one request, the oldest conversations finish
// first, and aging bounds a request's whole wait rather than each step's.
// The daemon and the replay both create decode steps through this rule.
Timestamp DecodeStepArrival(PriorityClass priority_class, Timestamp request_arrival, Timestamp now);

// A prefill cut into `chunks` pieces (2..kMaxPrefillChunks), named
// "<name>/prefill_c<chunks>", symbols B and S0..S<chunks-1> (the pieces'
// tokens): each piece runs every fused group on the KV cache of the pieces
// before it, so on a pipeline partition the pieces overlap across stages and
// a long prompt's first token comes sooner than in one piece. Its retained
// outputs are the one-piece prefill's (one KV cache per group, in group
// order), so decode steps attach them alike. Each embedding op carries
// `token_offset`, the first of the prompt's tokens it embeds.
inline constexpr int kMaxPrefillChunks = 8;
std::string LlamaChunkedPrefillName(const LlamaDims& dims, int chunks);
absl::StatusOr<std::shared_ptr<const GraphTemplate>> BuildLlamaChunkedPrefill(const LlamaDims& dims, int chunks);

// Where the fused-group operators of a chunked prefill template sit: op_at
// holds, for piece k and group j, the op index at k * groups + j, and
// piece/group map an op index back (-1 for the embeddings, the head and the
// sampling op). pieces == 0 for any other template.
struct ChunkedPrefillLayout {
  int pieces = 0;
  int groups = 0;
  std::vector<int> op_at;
  std::vector<int> piece, group;
  int Op(int k, int j) const { return op_at[static_cast<size_t>(k * groups + j)]; }
};
ChunkedPrefillLayout ChunkedPrefillLayoutOf(const GraphTemplate& tpl);

// The instance of a `tokens`-token prompt's prefill on a chunked template:
// batch 1, the prompt cut into `chunks` near-equal pieces (the first ones
// one token longer). Requires tokens >= chunks.
InstanceSpec LlamaChunkedPrefill(TemplateId chunked, int chunks, int64_t tokens, PriorityClass priority_class,
                                 Timestamp arrival);

// The "<name>/train" template described above.
absl::StatusOr<std::shared_ptr<const GraphTemplate>> BuildLlamaTrainTemplate(const LlamaDims& dims);

// The instance of one training iteration (micro-batch) on a `<name>/train`
// template: `batch` rows of `tokens` tokens, LoRA rank `rank`, a head with
// `head_outputs` outputs; a spatial joint step: `tasks` slots, `batch` and
// `head_outputs` summed over them.
InstanceSpec LlamaTrainStep(TemplateId train, int64_t batch, int64_t tokens, int64_t rank,
                            int64_t head_outputs, PriorityClass priority_class, Timestamp arrival,
                            int64_t tasks = 1);

// Presets compiled into the binary: "llama3-8b", "small" and "tiny".
absl::StatusOr<LlamaDims> LlamaPreset(absl::string_view name);

}  // namespace slicesched
