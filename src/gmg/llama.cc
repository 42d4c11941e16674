#include "slicesched/gmg/llama.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"

namespace slicesched {
namespace presets {
extern const std::string_view kLlama3_8bYaml;
extern const std::string_view kTinyYaml;
extern const std::string_view kSmallYaml;
extern const std::string_view kGlossYaml;
}  // namespace presets

int64_t LlamaDims::ParamsPerLayer() const {
  const int64_t hd = head_dim();
  const int64_t attn = hidden * heads * hd          // q
                       + 2 * hidden * kv_heads * hd // k, v
                       + heads * hd * hidden;       // o
  const int64_t mlp = 3 * hidden * ffn;             // gate, up, down
  const int64_t norms = 2 * hidden;                 // attention and MLP RMSNorm
  return attn + mlp + norms;
}

absl::Status LlamaDims::Validate() const {
  auto bad = [&](std::string msg) {
    return absl::InvalidArgumentError(StrCat("model '", name, "': ", msg));
  };
  if (name.empty()) return absl::InvalidArgumentError("model has no name");
  for (auto [field, v] : {std::pair<const char*, int64_t>{"layers", layers}, {"hidden", hidden},
                          {"heads", heads}, {"kv_heads", kv_heads}, {"ffn", ffn}, {"vocab", vocab},
                          {"fusion", fusion}}) {
    if (v <= 0) return bad(StrCat(field, " must be positive, got ", v));
  }
  // Bounds that keep the templates (one operator per fused group) and the
  // parameter counts (int64) finite, whichever front end the dims come from.
  for (auto [field, v] : {std::pair<const char*, int64_t>{"layers", layers}, {"hidden", hidden},
                          {"heads", heads}, {"kv_heads", kv_heads}, {"ffn", ffn}, {"vocab", vocab}}) {
    if (v > kMaxDim) return bad(StrCat(field, " ", v, " is too large (at most ", kMaxDim, ")"));
  }
  if (hidden % heads != 0) return bad(StrCat("hidden ", hidden, " is not divisible by heads ", heads));
  if (heads % kv_heads != 0) return bad(StrCat("heads ", heads, " is not divisible by kv_heads ", kv_heads));
  if (layers % fusion != 0) return bad(StrCat("layers ", layers, " is not divisible by fusion ", fusion));
  if (num_groups() > kMaxGroups) {
    return bad(StrCat(num_groups(), " fused operators per pass (layers / fusion) is too many (at most ", kMaxGroups,
                      ")"));
  }
  if (!IsFloating(dtype)) return bad("dtype must be floating point");
  return absl::OkStatus();
}

LlamaDims LlamaDims::FromConfig(const ConfigReader& m) {
  LlamaDims d;
  m.RejectUnknownKeys({"name", "family", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab",
                       "dtype", "fusion"});
  d.name = m.Required<std::string>("name");
  std::string family = m.Optional<std::string>("family", "llama");
  // The templates are Llama-shaped (GQA attention, SwiGLU MLP, RMSNorm);
  // another architecture would get wrong memory and time figures, so any
  // other family is refused rather than built as a Llama.
  m.Check(family == "llama", "family",
          StrCat("unsupported model family '", family, "' (the only family is llama: a Llama-shaped decoder)"));
  d.layers = m.Required<int64_t>("layers");
  d.hidden = m.Required<int64_t>("hidden");
  d.heads = m.Required<int64_t>("heads");
  d.kv_heads = m.Optional<int64_t>("kv_heads", d.heads);
  d.ffn = m.Required<int64_t>("ffn");
  d.vocab = m.Required<int64_t>("vocab");
  d.fusion = m.Optional<int64_t>("fusion", 8);
  for (auto [k, v] : {std::pair<const char*, int64_t>{"layers", d.layers}, {"hidden", d.hidden},
                      {"heads", d.heads}, {"kv_heads", d.kv_heads}, {"ffn", d.ffn},
                      {"vocab", d.vocab}, {"fusion", d.fusion}}) {
    m.CheckPositive(k, v);
  }
  std::string dtype = m.Optional<std::string>("dtype", "bf16");
  auto dt = ParseDType(dtype);
  m.Check(dt.ok(), "dtype", dt.ok() ? "" : dt.status().message());
  if (dt.ok()) d.dtype = *dt;
  if (d.heads > 0 && d.kv_heads > 0 && d.fusion > 0) {
    m.Check(d.hidden % d.heads == 0, "heads", "hidden must be divisible by heads");
    m.Check(d.heads % d.kv_heads == 0, "kv_heads", "heads must be divisible by kv_heads");
    m.Check(d.layers % d.fusion == 0, "fusion", "layers must be divisible by fusion");
  }
  return d;
}

std::string LlamaGroupWeightKey(const LlamaDims& dims, int64_t group) {
  return StrCat(dims.name, "/layers", group * dims.fusion, "-", (group + 1) * dims.fusion - 1);
}

namespace {

enum class Phase { kPrefill, kDecode };

void DefineDims(TemplateBuilder& b, const LlamaDims& d) {
  b.Define("H", d.hidden)
      .Define("NH", d.heads)
      .Define("NKV", d.kv_heads)
      .Define("HD", d.head_dim())
      .Define("FFN", d.ffn)
      .Define("V", d.vocab)
      .Define("F", d.fusion)
      .Define("ES", DTypeSize(d.dtype));
}

std::vector<std::pair<std::string, std::vector<std::pair<std::string, int>>>> Partitions(
    const LlamaDims& d) {
  const int g = static_cast<int>(d.num_groups());
  std::vector<std::pair<std::string, std::vector<std::pair<std::string, int>>>> out;
  auto make = [&](std::string name, int slots) {
    std::vector<std::pair<std::string, int>> m;
    m.emplace_back("embed", 0);
    for (int k = 0; k < g; ++k) m.emplace_back(StrCat("g", k), k * slots / g);
    m.emplace_back("head", slots - 1);
    m.emplace_back("sample", slots - 1);
    out.emplace_back(std::move(name), std::move(m));
  };
  make("single", 1);
  if (g >= 2 && g % 2 == 0) make("pp2", 2);
  if (g >= 4 && g % 4 == 0) make("pp4", 4);
  if (g >= 8 && g % 8 == 0) make("pp8", 8);
  return out;
}

// The embedding op over s new tokens after ctx cached ones (the caller adds
// its inputs' attributes beyond these).
TemplateBuilder& EmbedOp(TemplateBuilder& b, const LlamaDims& d, const std::string& name, const std::string& s,
                         const std::string& ctx) {
  return b.Op(name, OpKind::kEmbedding)
      .Inputs({"$tokens"})
      .Output("hidden", d.dtype, {"B", s, "H"})
      .Weights(StrCat(d.name, "/embed"), Bytes(d.EmbeddingParams() * DTypeSize(d.dtype)), d.EmbeddingParams())
      .Attr("batch", "B")
      .Attr("new_tokens", s)
      .Attr("context", ctx);
}

// The weights, workspace and attributes of group g's fused op over s new
// tokens after ctx cached ones (attention span `span`). The workspace is the
// per-layer transient peak: QKV, fp32 attention scores, gate + up.
void GroupBody(TemplateBuilder& b, const LlamaDims& d, int64_t g, const std::string& s, const std::string& span,
               const std::string& ctx) {
  b.Weights(LlamaGroupWeightKey(d, g), Bytes(d.ParamsPerGroup() * DTypeSize(d.dtype)), d.ParamsPerGroup())
      .Workspace(StrCat("B*", s, "*(H+2*NKV*HD)*ES + B*NH*", s, "*", span, "*4 + 2*B*", s, "*FFN*ES"))
      .Attr("batch", "B")
      .Attr("new_tokens", s)
      .Attr("context", ctx)
      .Attr("layers", "F");
}

// LM head over the last position of `hidden`, then sampling; their cost is
// that of `cost_template`'s head and sample when it is given.
void HeadAndSample(TemplateBuilder& b, const LlamaDims& d, const std::string& hidden,
                   const std::string& cost_template = "") {
  b.Op("head", OpKind::kLmHead)
      .Inputs({hidden})
      .Output("logits", DType::kF32, {"B", "V"})
      .Weights(StrCat(d.name, "/lm_head"), Bytes(d.LmHeadParams() * DTypeSize(d.dtype)), d.LmHeadParams())
      .Workspace("B*H*ES")
      .Attr("batch", "B");
  if (!cost_template.empty()) b.CostOf(cost_template, "head");
  b.Op("sample", OpKind::kSample)
      .Inputs({"head"})
      .Output("token", DType::kI64, {"B", "1"})
      .Workspace("B*V*4")
      .Attr("batch", "B");
  if (!cost_template.empty()) b.CostOf(cost_template, "sample");
}

absl::StatusOr<std::shared_ptr<const GraphTemplate>> Build(const LlamaDims& d, Phase phase) {
  const bool prefill = phase == Phase::kPrefill;
  TemplateBuilder b(StrCat(d.name, prefill ? "/prefill" : "/decode"));
  DefineDims(b, d);
  const DType dt = d.dtype;
  const std::string es = std::to_string(DTypeSize(dt));
  // New tokens per sequence and the attention span.
  const std::string s = prefill ? "S" : "1";
  const std::string span = prefill ? "S" : "(C+1)";
  const std::string ctx = prefill ? "0" : "C";
  const int64_t groups = d.num_groups();

  b.ExternalInput("tokens", DType::kI64, {"B", s});
  if (!prefill) {
    for (int64_t g = 0; g < groups; ++g) {
      b.CheckpointInput(StrCat("kv", g), dt, {"2", "F", "B", "C", "NKV", "HD"});
    }
  }
  EmbedOp(b, d, "embed", s, ctx);
  std::string prev = "embed";
  for (int64_t g = 0; g < groups; ++g) {
    const std::string name = StrCat("g", g);
    b.Op(name, OpKind::kFusedLayers)
        .Inputs(prefill ? std::vector<std::string>{prev}
                        : std::vector<std::string>{prev, StrCat("@kv", g)})
        .Output("hidden", dt, {"B", s, "H"});
    if (prefill) {
      b.RetainedOutput("kv", dt, {"2", "F", "B", "S", "NKV", "HD"});
    } else {
      b.UpdateOutput("kv", StrCat("kv", g), {"2", "F", "B", "C+1", "NKV", "HD"});
    }
    GroupBody(b, d, g, s, span, ctx);
    prev = StrCat(name, ":hidden");
  }
  HeadAndSample(b, d, prev);
  for (const auto& [pname, slots] : Partitions(d)) b.Partition(pname, slots);
  return b.Build();
}

// A prefill in `chunks` pieces: chunk k's operators (embed_c{k}, g{i}c{k};
// chunk 0 keeps the plain names) process S{k} new tokens on the KV cache of
// the chunks before it, which g{i}c{k-1} hands over as an output; the last
// chunk's groups retain the whole cache, in group order, as the one-piece
// prefill does. In every partition a group's chunks share its slot; a
// scheduler placing operator by operator may also move a later piece to
// another device (its cache so far follows as a transfer).
absl::StatusOr<std::shared_ptr<const GraphTemplate>> BuildChunked(const LlamaDims& d, int chunks) {
  TemplateBuilder b(LlamaChunkedPrefillName(d, chunks));
  DefineDims(b, d);
  const DType dt = d.dtype;
  const int64_t groups = d.num_groups();
  std::string total = "S0";
  for (int k = 1; k < chunks; ++k) total += StrCat("+S", k);
  b.ExternalInput("tokens", DType::kI64, {"B", total});
  auto name = [](std::string base, int k) { return k == 0 ? base : StrCat(base, "c", k); };
  // Each piece's ops compute what the one-piece prefill's do, on fewer new
  // tokens after a longer context: one operator model serves every length.
  const std::string whole = StrCat(d.name, "/prefill");
  std::string before = "0";  // tokens of the chunks before chunk k
  std::string last_hidden;
  for (int k = 0; k < chunks; ++k) {
    const std::string s = StrCat("S", k);
    const std::string span = StrCat("(", before, "+", s, ")");
    const std::string embed = k == 0 ? "embed" : StrCat("embed_c", k);
    EmbedOp(b, d, embed, s, before).Attr("token_offset", before).CostOf(whole, "embed");
    std::string prev = embed;
    for (int64_t g = 0; g < groups; ++g) {
      const std::string op = name(StrCat("g", g), k);
      std::vector<std::string> inputs = {prev};
      if (k > 0) inputs.push_back(StrCat(name(StrCat("g", g), k - 1), ":kv"));
      b.Op(op, OpKind::kFusedLayers).Inputs(inputs).Output("hidden", dt, {"B", s, "H"});
      if (k == chunks - 1) {
        b.RetainedOutput("kv", dt, {"2", "F", "B", span, "NKV", "HD"});
      } else {
        b.Output("kv", dt, {"2", "F", "B", span, "NKV", "HD"});
      }
      GroupBody(b, d, g, s, span, before);
      b.CostOf(whole, StrCat("g", g));
      prev = StrCat(op, ":hidden");
    }
    last_hidden = prev;
    before = StrCat(before, "+", s);
  }
  HeadAndSample(b, d, last_hidden, whole);
  for (const auto& [pname, serving_slots] : Partitions(d)) {
    std::vector<std::pair<std::string, int>> slots;
    for (const auto& [op, slot] : serving_slots) {
      if (op == "embed" || (op.size() > 1 && op[0] == 'g')) {
        for (int k = 0; k < chunks; ++k) {
          slots.emplace_back(op == "embed" ? (k == 0 ? op : StrCat("embed_c", k)) : name(op, k), slot);
        }
      } else {
        slots.emplace_back(op, slot);
      }
    }
    b.Partition(pname, slots);
  }
  return b.Build();
}

absl::StatusOr<std::shared_ptr<const GraphTemplate>> BuildTrain(const LlamaDims& d) {
  TemplateBuilder b(StrCat(d.name, "/train"));
  DefineDims(b, d);
  const DType dt = d.dtype;
  const int64_t groups = d.num_groups();
  b.ExternalInput("tokens", DType::kI64, {"B", "S"});
  b.ExternalInput("labels", DType::kI64, {"B", "S"});
  b.Op("embed", OpKind::kEmbedding)
      .Inputs({"$tokens"})
      .Output("hidden", dt, {"B", "S", "H"})
      .Weights(StrCat(d.name, "/embed"), Bytes(d.EmbeddingParams() * DTypeSize(dt)),
               d.EmbeddingParams())
      .Attr("batch", "B")
      .Attr("new_tokens", "S")
      .Attr("context", "0");
  // Per-layer transient peak as in serving (QKV, fp32 scores, gate + up);
  // the backward holds about twice that.
  const std::string workspace = "B*S*(H+2*NKV*HD)*ES + B*NH*S*S*4 + 2*B*S*FFN*ES";
  // What autograd keeps per layer for the backward (f32 elements, estimate):
  // the normed inputs, q/k/v, attention output, residuals, gate, up and their
  // product, and the attention probabilities and scores.
  const std::string stash = "B*S*(8*H+3*FFN) + 2*B*NH*S*S";
  std::string prev = "embed";
  for (int64_t g = 0; g < groups; ++g) {
    b.Op(StrCat("f", g), OpKind::kTrainForward)
        .Inputs({prev})
        .Output("hidden", dt, {"B", "S", "H"})
        .Output("tape", DType::kF32, {"F", stash})
        .Weights(LlamaGroupWeightKey(d, g), Bytes(d.ParamsPerGroup() * DTypeSize(dt)),
                 d.ParamsPerGroup())
        .Workspace(workspace)
        .Attr("batch", "B")
        .Attr("new_tokens", "S")
        .Attr("context", "0")
        .Attr("layers", "F")
        .Attr("rank", "R");
    prev = StrCat("f", g, ":hidden");
  }
  b.Op("loss", OpKind::kTrainLoss)
      .Inputs({prev, "$labels"})
      .Output("d_hidden", dt, {"B", "S", "H"})
      .Output("head_grad", DType::kF32, {"NC", "H"})
      .Output("loss", DType::kF32, {"T"})
      .Workspace("3*B*S*NC*4 + B*S*H*4")
      .Attr("batch", "B")
      .Attr("new_tokens", "S")
      .Attr("outputs", "NC")
      .Attr("tasks", "T");
  std::string grad = "loss:d_hidden";
  std::vector<std::string> opt_inputs;
  for (int64_t g = groups - 1; g >= 0; --g) {
    b.Op(StrCat("b", g), OpKind::kTrainBackward)
        .Inputs({grad, StrCat("f", g, ":tape")})
        .Output("d_hidden", dt, {"B", "S", "H"})
        .Output("grads", DType::kF32, {"T*F", "R*(2*H+NH*HD+NKV*HD)"})
        .Weights(LlamaGroupWeightKey(d, g), Bytes(d.ParamsPerGroup() * DTypeSize(dt)),
                 d.ParamsPerGroup())
        .Workspace(StrCat("2*(", workspace, ")"))
        .Attr("batch", "B")
        .Attr("new_tokens", "S")
        .Attr("context", "0")
        .Attr("layers", "F")
        .Attr("rank", "R")
        .Attr("tasks", "T");
    grad = StrCat("b", g, ":d_hidden");
    opt_inputs.insert(opt_inputs.begin(), StrCat("b", g, ":grads"));
  }
  opt_inputs.push_back("loss:head_grad");
  opt_inputs.push_back("loss:loss");
  // AdamW keeps two moments and the accumulated gradient per parameter.
  b.Op("optimizer", OpKind::kOptimizerStep)
      .Inputs(opt_inputs)
      .Output("step", DType::kI64, {"1"})
      .Workspace(StrCat("4*(T*", d.layers, "*R*(2*H+NH*HD+NKV*HD) + NC*H)*4"))
      .Attr("rank", "R")
      .Attr("outputs", "NC")
      .Attr("tasks", "T");
  for (const auto& [pname, serving_slots] : Partitions(d)) {
    // Same slot layout as serving: embed with g0's slot, the head's slot for
    // loss and optimizer; b{g} next to f{g}.
    std::vector<std::pair<std::string, int>> slots;
    for (const auto& [op, slot] : serving_slots) {
      if (op == "embed") {
        slots.emplace_back("embed", slot);
      } else if (op == "head") {
        slots.emplace_back("loss", slot);
        slots.emplace_back("optimizer", slot);
      } else if (op.size() > 1 && op[0] == 'g') {
        slots.emplace_back(StrCat("f", op.substr(1)), slot);
        slots.emplace_back(StrCat("b", op.substr(1)), slot);
      }
    }
    b.Partition(pname, slots);
  }
  return b.Build();
}

}  // namespace

absl::StatusOr<std::shared_ptr<const GraphTemplate>> BuildLlamaTrainTemplate(
    const LlamaDims& dims) {
  SLICESCHED_RETURN_IF_ERROR(dims.Validate());
  return BuildTrain(dims);
}

InstanceSpec LlamaTrainStep(TemplateId train, int64_t batch, int64_t tokens, int64_t rank,
                            int64_t head_outputs, PriorityClass priority_class, Timestamp arrival,
                            int64_t tasks) {
  InstanceSpec s;
  s.template_id = train;
  s.bindings = {{"B", batch}, {"S", tokens}, {"R", rank}, {"NC", head_outputs}, {"T", tasks}};
  s.priority_class = priority_class;
  s.arrival = arrival;
  return s;
}

absl::StatusOr<LlamaTemplates> BuildLlamaTemplates(const LlamaDims& dims) {
  SLICESCHED_RETURN_IF_ERROR(dims.Validate());
  LlamaTemplates t;
  SLICESCHED_ASSIGN_OR_RETURN(t.prefill, Build(dims, Phase::kPrefill));
  SLICESCHED_ASSIGN_OR_RETURN(t.decode, Build(dims, Phase::kDecode));
  return t;
}

std::string LlamaChunkedPrefillName(const LlamaDims& dims, int chunks) {
  return StrCat(dims.name, "/prefill_c", chunks);
}

absl::StatusOr<std::shared_ptr<const GraphTemplate>> BuildLlamaChunkedPrefill(const LlamaDims& dims, int chunks) {
  SLICESCHED_RETURN_IF_ERROR(dims.Validate());
  if (chunks < 2 || chunks > kMaxPrefillChunks) {
    return absl::InvalidArgumentError(StrCat("model '", dims.name, "': a chunked prefill has 2 to ",
                                             kMaxPrefillChunks, " chunks, got ", chunks));
  }
  return BuildChunked(dims, chunks);
}

ChunkedPrefillLayout ChunkedPrefillLayoutOf(const GraphTemplate& tpl) {
  ChunkedPrefillLayout out;
  const size_t at = tpl.name().rfind("/prefill_c");
  int chunks = 0;
  if (at == std::string::npos || !absl::SimpleAtoi(tpl.name().substr(at + 10), &chunks) || chunks < 2) return out;
  // BuildChunked names piece k's group j "g<j>" (k = 0) or "g<j>c<k>".
  std::vector<std::pair<int, int>> where(static_cast<size_t>(tpl.num_ops()), {-1, -1});
  int groups = 0;
  for (int op = 0; op < tpl.num_ops(); ++op) {
    const std::string& name = tpl.op(op).name;
    if (tpl.op(op).kind != OpKind::kFusedLayers || name.size() < 2 || name[0] != 'g') continue;
    const size_t c = name.find('c');
    int j = 0, k = 0;
    if (!absl::SimpleAtoi(name.substr(1, c == std::string::npos ? std::string::npos : c - 1), &j) ||
        (c != std::string::npos && !absl::SimpleAtoi(name.substr(c + 1), &k)) || k >= chunks) {
      continue;
    }
    where[static_cast<size_t>(op)] = {k, j};
    groups = std::max(groups, j + 1);
  }
  out.pieces = chunks;
  out.groups = groups;
  out.op_at.assign(static_cast<size_t>(chunks * groups), -1);
  out.piece.assign(where.size(), -1);
  out.group.assign(where.size(), -1);
  for (size_t op = 0; op < where.size(); ++op) {
    const auto [k, j] = where[op];
    if (k < 0) continue;
    out.op_at[static_cast<size_t>(k * groups + j)] = static_cast<int>(op);
    out.piece[op] = k;
    out.group[op] = j;
  }
  // Every (piece, group) must be there; anything else is not a chunked prefill.
  if (groups == 0 || std::find(out.op_at.begin(), out.op_at.end(), -1) != out.op_at.end()) return {};
  return out;
}

InstanceSpec LlamaChunkedPrefill(TemplateId chunked, int chunks, int64_t tokens, PriorityClass priority_class,
                                 Timestamp arrival) {
  InstanceSpec s;
  s.template_id = chunked;
  s.bindings = {{"B", 1}};
  for (int k = 0; k < chunks; ++k) {
    // Even pieces; the first ones take the remainder.
    const int64_t piece = tokens / chunks + (k < tokens % chunks ? 1 : 0);
    s.bindings.emplace_back(StrCat("S", k), piece);
  }
  s.priority_class = priority_class;
  s.arrival = arrival;
  return s;
}

absl::StatusOr<LlamaDims> LlamaPreset(absl::string_view name) {
  std::string_view text;
  if (name == "llama3-8b") {
    text = presets::kLlama3_8bYaml;
  } else if (name == "tiny") {
    text = presets::kTinyYaml;
  } else if (name == "small") {
    text = presets::kSmallYaml;
  } else if (name == "gloss") {
    text = presets::kGlossYaml;
  } else {
    return absl::NotFoundError(StrCat("no model preset named '", name,
                                            "' (presets: gloss, llama3-8b, small, tiny)"));
  }
  const std::string source = StrCat("<embedded:configs/models/", name, ".yaml>");
  SLICESCHED_ASSIGN_OR_RETURN(YAML::Node root, LoadYamlString(ToAbsl(text), source));
  ConfigErrors errors;
  ConfigReader r(root, source, &errors);
  r.RejectUnknownKeys({"model"});
  LlamaDims d = LlamaDims::FromConfig(r.RequiredChild("model"));
  SLICESCHED_RETURN_IF_ERROR(errors.ToStatus());
  SLICESCHED_RETURN_IF_ERROR(d.Validate());
  return d;
}

InstanceSpec LlamaDecodeStep(TemplateId decode, int64_t context, const std::vector<CheckpointId>& kv,
                             PriorityClass priority_class, Timestamp arrival) {
  InstanceSpec s;
  s.template_id = decode;
  s.bindings = {{"B", 1}, {"C", context}};
  s.priority_class = priority_class;
  s.arrival = arrival;
  for (size_t k = 0; k < kv.size(); ++k) s.checkpoints.emplace_back(StrCat("kv", k), kv[k]);
  return s;
}

Timestamp DecodeStepArrival(PriorityClass priority_class, Timestamp request_arrival, Timestamp now) {
  return priority_class == PriorityClass::kOffline ? request_arrival : now;
}

}  // namespace slicesched
