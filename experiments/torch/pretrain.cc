// Torch-free TU: everything goes through the training operators.
#include "slicesched/experiments/pretrain.h"

#include <unistd.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "slicesched/common/hash.h"
#include "slicesched/common/option_checks.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "slicesched/executor/torch/safetensors.h"
#include "slicesched/executor/train/full_train.h"
#include "slicesched/executor/train/train_ops.h"

namespace slicesched::executor {
namespace {

Tensor Tokens(const std::vector<std::vector<int64_t>>& rows) {
  std::vector<int64_t> flat;
  for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  return Tensor::FromInt64(
      flat, {static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows.front().size())});
}

// W + s B A, all row-major f32 ([out, in] += s [out, r] x [r, in]).
Tensor Merge(const Tensor& w, const Tensor& b, const Tensor& a, double s) {
  const auto ws = w.shape(), bs = b.shape();
  const int64_t out = ws[0], in = ws[1], r = bs[1];
  std::vector<float> wv = w.ToFloat();
  const std::vector<float> bv = b.ToFloat(), av = a.ToFloat();
  for (int64_t i = 0; i < out; ++i) {
    for (int64_t j = 0; j < in; ++j) {
      double acc = 0;
      for (int64_t k = 0; k < r; ++k) {
        acc += static_cast<double>(bv[static_cast<size_t>(i * r + k)]) *
               static_cast<double>(av[static_cast<size_t>(k * in + j)]);
      }
      float& x = wv[static_cast<size_t>(i * in + j)];
      x = static_cast<float>(static_cast<double>(x) + s * acc);
    }
  }
  return Tensor::FromFloat(wv, ws);
}

}  // namespace

absl::Status PretrainOptions::Validate() const {
  SLICESCHED_RETURN_IF_ERROR(CheckAtLeast({{"rounds", 1, rounds},
                                           {"steps_per_round (slicesim make-backbone --steps)", 1, steps_per_round},
                                           {"batch_size", 1, batch_size},
                                           {"lora_rank", 1, lora_rank},
                                           {"eval_sentences", 1, eval_sentences},
                                           {"sequence_length", 2, sequence_length}},
                                          "pretraining: "));
  if (!(learning_rate > 0) || !(lora_alpha > 0)) {
    return absl::InvalidArgumentError("pretraining: learning_rate and lora_alpha must be > 0");
  }
  if (!corpus_tokens.empty()) {
    const int64_t windows = static_cast<int64_t>(corpus_tokens.size()) / sequence_length;
    if (windows < 16 * eval_sentences + 2) {
      return absl::InvalidArgumentError(StrCat("pretraining: the corpus has ", corpus_tokens.size(),
                                               " tokens, ", windows, " windows of ", sequence_length,
                                               "; want at least ", 16 * eval_sentences + 2));
    }
    return absl::OkStatus();
  }
  return language.Validate();
}

std::vector<int64_t> WordNetGlossStream(const synth::WordNetCorpus& corpus) {
  std::vector<int64_t> out;
  for (const synth::WordNetSynset& s : corpus.synsets()) {
    const std::vector<int64_t> words = corpus.Encode(s.gloss);
    out.insert(out.end(), words.begin(), words.end());
    out.push_back(synth::kWordNetPad);
  }
  return out;
}

absl::StatusOr<std::shared_ptr<const LlamaWeights>> WeightsFromTensors(
    const LlamaDims& dims, const std::vector<std::pair<std::string, Tensor>>& tensors,
    const std::string& scratch_dir, const LlamaOptions& options) {
  static std::atomic<uint64_t> counter{0};
  const std::string path = (std::filesystem::path(scratch_dir) /
                            StrCat("slicesched-weights-", getpid(), "-", counter++, ".safetensors"))
                               .string();
  absl::Status written = WriteSafetensors(path, tensors);
  absl::StatusOr<std::shared_ptr<const LlamaWeights>> w =
      written.ok() ? LlamaWeights::FromSafetensors(dims, path, options)
                   : absl::StatusOr<std::shared_ptr<const LlamaWeights>>(written);
  std::error_code ec;
  std::filesystem::remove(path, ec);
  return w;
}

absl::StatusOr<double> LanguageModelLoss(const LlamaWeights& weights,
                                         const std::vector<std::vector<int64_t>>& sentences) {
  if (sentences.empty() || sentences.front().size() < 2) {
    return absl::InvalidArgumentError("LanguageModelLoss needs sentences of at least 2 tokens");
  }
  const LlamaDims& d = weights.dims();
  SLICESCHED_ASSIGN_OR_RETURN(
      TaskAdapters probe, TaskAdapters::Init(d, LoraConfig{.rank = 1, .alpha = 1.0}, d.vocab, 0));
  probe.head = weights.lm_head();  // B = 0: the probe is the backbone itself
  TrainBatch batch;
  batch.tokens = Tokens(sentences);
  SLICESCHED_ASSIGN_OR_RETURN(batch.labels, NextTokenLabels(batch.tokens));
  const TaskAdapters* tasks[] = {&probe};
  SLICESCHED_ASSIGN_OR_RETURN(TaskGradients g, ComputeGradients(weights, tasks, batch));
  return g.loss[0];
}

absl::StatusOr<PretrainResult> PretrainBackbone(const LlamaDims& dims, const PretrainOptions& o) {
  SLICESCHED_RETURN_IF_ERROR(o.Validate());
  SLICESCHED_RETURN_IF_ERROR(dims.Validate());
  if (dims.dtype != DType::kF32) {
    return absl::InvalidArgumentError(
        StrCat("pretraining needs an f32 model; '", dims.name, "' is not"));
  }
  const bool corpus = !o.corpus_tokens.empty();
  if (!corpus && o.language.vocab > dims.vocab) {
    return absl::InvalidArgumentError(
        StrCat("the language's vocab ", o.language.vocab, " exceeds the model's ", dims.vocab));
  }
  for (int64_t t : o.corpus_tokens) {
    if (t < 0 || t >= dims.vocab) {
      return absl::InvalidArgumentError(StrCat("the corpus has token ", t, ", outside the model's vocab ", dims.vocab));
    }
  }
  SetIntraOpThreadsForThisThread(1);
  SLICESCHED_ASSIGN_OR_RETURN(synth::Language lang, synth::Language::Make(o.language));
  SLICESCHED_ASSIGN_OR_RETURN(std::shared_ptr<const LlamaWeights> w,
                              LlamaWeights::FromSeed(dims, o.seed));
  // Corpus windows: every 16th held out, the rest for training.
  const auto window = [&](int64_t k) {
    const auto at = o.corpus_tokens.begin() + k * o.sequence_length;
    return std::vector<int64_t>(at, at + o.sequence_length);
  };
  std::vector<int64_t> train_windows;
  std::vector<std::vector<int64_t>> eval;
  if (corpus) {
    const int64_t windows = static_cast<int64_t>(o.corpus_tokens.size()) / o.sequence_length;
    for (int64_t k = 0; k < windows; ++k) {
      if (k % 16 != 0) {
        train_windows.push_back(k);
      } else if (static_cast<int64_t>(eval.size()) < o.eval_sentences) {
        eval.push_back(window(k));
      }
    }
  } else {
    synth::Rng eval_rng(o.seed ^ 0x6576616cull);  // "eval": held out from the training stream
    for (int64_t i = 0; i < o.eval_sentences; ++i) eval.push_back(lang.Sample(o.sequence_length, eval_rng));
  }
  PretrainResult out;
  SLICESCHED_ASSIGN_OR_RETURN(out.initial_eval_loss, LanguageModelLoss(*w, eval));

  synth::Rng rng(o.seed);
  auto next_batch = [&] {
    std::vector<std::vector<int64_t>> rows;
    for (int64_t b = 0; b < o.batch_size; ++b) {
      rows.push_back(corpus ? window(train_windows[static_cast<size_t>(rng.Below(static_cast<int64_t>(train_windows.size())))])
                            : lang.Sample(o.sequence_length, rng));
    }
    return rows;
  };
  const std::string scratch = std::filesystem::temp_directory_path().string();
  if (o.method == PretrainMethod::kFull) {
    SLICESCHED_ASSIGN_OR_RETURN(FullModelTrainer trainer,
                                FullModelTrainer::Create(*w, AdamWOptions{.lr = o.learning_rate}));
    for (int64_t step = 0; step < o.rounds * o.steps_per_round; ++step) {
      SLICESCHED_ASSIGN_OR_RETURN(double loss, trainer.Step(Tokens(next_batch())));
      out.train_loss.push_back(loss);
    }
    SLICESCHED_ASSIGN_OR_RETURN(w, WeightsFromTensors(dims, trainer.NamedTensors(), scratch, w->options()));
    SLICESCHED_ASSIGN_OR_RETURN(out.final_eval_loss, LanguageModelLoss(*w, eval));
    out.weights = w;
    return out;
  }
  const LoraConfig lora{.rank = o.lora_rank, .alpha = o.lora_alpha};
  for (int64_t round = 0; round < o.rounds; ++round) {
    SLICESCHED_ASSIGN_OR_RETURN(
        TaskState st,
        TaskState::Init(dims, lora, dims.vocab, o.seed + 1000 + static_cast<uint64_t>(round),
                        AdamWOptions{.lr = o.learning_rate}));
    st.params.head = w->lm_head();
    for (int64_t step = 0; step < o.steps_per_round; ++step) {
      TrainBatch batch;
      batch.tokens = Tokens(next_batch());
      SLICESCHED_ASSIGN_OR_RETURN(batch.labels, NextTokenLabels(batch.tokens));
      SLICESCHED_ASSIGN_OR_RETURN(double loss, AccumulateMicroBatch(*w, st, batch));
      SLICESCHED_RETURN_IF_ERROR(AdamWStep(st));
      out.train_loss.push_back(loss);
    }
    // Merge into a new backbone.
    std::vector<std::pair<std::string, Tensor>> named = w->NamedTensors();
    std::map<std::string, Tensor> replace;
    const double s = lora.scaling();
    for (int64_t l = 0; l < dims.layers; ++l) {
      const LoraLayer& ll = st.params.layers[static_cast<size_t>(l)];
      const std::string p = StrCat("model.layers.", l, ".self_attn.");
      replace[p + "q_proj.weight"] = Merge(w->layer(l).q_proj, ll.q_b, ll.q_a, s);
      replace[p + "v_proj.weight"] = Merge(w->layer(l).v_proj, ll.v_b, ll.v_a, s);
    }
    replace["lm_head.weight"] = Tensor::FromFloat(st.params.head.ToFloat(), st.params.head.shape());
    for (auto& [name, t] : named) {
      if (auto it = replace.find(name); it != replace.end()) t = it->second;
    }
    SLICESCHED_ASSIGN_OR_RETURN(w, WeightsFromTensors(dims, named, scratch, w->options()));
  }
  SLICESCHED_ASSIGN_OR_RETURN(out.final_eval_loss, LanguageModelLoss(*w, eval));
  out.weights = w;
  return out;
}

namespace {

// Bumped whenever PretrainBackbone's procedure changes what it computes, so
// that a cache never serves a backbone another procedure made.
constexpr char kPretrainVersion[] = "pretrain-v1";

std::string Num(double v) { return absl::StrFormat("%.17g", v); }

}  // namespace

std::string PretrainKey(const LlamaDims& d, const PretrainOptions& o) {
  std::string text = StrCat(kPretrainVersion, "|", d.name, ",", d.layers, ",", d.hidden, ",", d.heads, ",",
                            d.kv_heads, ",", d.ffn, ",", d.vocab, ",", DTypeName(d.dtype), ",", d.fusion, "|",
                            o.method == PretrainMethod::kFull ? "full" : "lora", ",", o.seed, ",", o.rounds, ",",
                            o.steps_per_round, ",", o.batch_size, ",", o.sequence_length, ",", o.lora_rank, ",",
                            Num(o.lora_alpha), ",", Num(o.learning_rate), ",", o.eval_sentences, "|");
  if (o.corpus_tokens.empty()) {
    text += StrCat("language,", o.language.vocab, ",", o.language.classes, ",", o.language.seed);
  } else {
    uint64_t h = Fnv1a("corpus");
    for (int64_t t : o.corpus_tokens) h = Fnv1a(std::string_view(reinterpret_cast<const char*>(&t), sizeof(t)), h);
    text += StrCat("corpus,", o.corpus_tokens.size(), ",", h);
  }
  return absl::StrFormat("%016x", Fnv1a(text));
}

std::map<std::string, std::string> PretrainMetadata(const LlamaDims& dims, const PretrainOptions& o,
                                                    const PretrainResult& r) {
  std::vector<std::string> losses;
  losses.reserve(r.train_loss.size());
  for (double l : r.train_loss) losses.push_back(Num(l));
  return {{"slicesched.pretrain", o.method == PretrainMethod::kFull ? "full-parameter" : "merged-LoRA"},
          {"slicesched.model", dims.name},
          {"slicesched.key", PretrainKey(dims, o)},
          {"slicesched.seed", std::to_string(o.seed)},
          {"slicesched.rounds", std::to_string(o.rounds)},
          {"slicesched.steps_per_round", std::to_string(o.steps_per_round)},
          {"slicesched.learning_rate", Num(o.learning_rate)},
          {"slicesched.initial_eval_loss", Num(r.initial_eval_loss)},
          {"slicesched.final_eval_loss", Num(r.final_eval_loss)},
          {"slicesched.train_loss", absl::StrJoin(losses, ",")}};
}

absl::StatusOr<PretrainResult> PretrainBackboneCached(const LlamaDims& dims, const PretrainOptions& o,
                                                      const std::string& cache_dir, bool* hit) {
  SLICESCHED_RETURN_IF_ERROR(o.Validate());
  const std::string key = PretrainKey(dims, o);
  const std::filesystem::path path = std::filesystem::path(cache_dir) / StrCat("backbone-", key, ".safetensors");
  std::error_code ec;
  if (std::filesystem::exists(path, ec)) {
    auto cached = [&]() -> absl::StatusOr<PretrainResult> {
      SLICESCHED_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open(path.string()));
      const auto& meta = file.metadata();
      auto get = [&](const std::string& k) -> absl::StatusOr<std::string> {
        auto it = meta.find(k);
        if (it == meta.end()) return absl::DataLossError(StrCat("metadata '", k, "' is missing"));
        return it->second;
      };
      SLICESCHED_ASSIGN_OR_RETURN(std::string stored_key, get("slicesched.key"));
      if (stored_key != key) return absl::DataLossError(StrCat("its key is ", stored_key, ", its name says ", key));
      PretrainResult r;
      SLICESCHED_ASSIGN_OR_RETURN(std::string initial, get("slicesched.initial_eval_loss"));
      SLICESCHED_ASSIGN_OR_RETURN(std::string final_loss, get("slicesched.final_eval_loss"));
      SLICESCHED_ASSIGN_OR_RETURN(std::string losses, get("slicesched.train_loss"));
      bool ok = absl::SimpleAtod(initial, &r.initial_eval_loss) && absl::SimpleAtod(final_loss, &r.final_eval_loss);
      for (absl::string_view l : absl::StrSplit(losses, ',', absl::SkipEmpty())) {
        double v = 0;
        ok = ok && absl::SimpleAtod(l, &v);
        r.train_loss.push_back(v);
      }
      if (!ok) return absl::DataLossError("a loss in its metadata is not a number");
      SLICESCHED_ASSIGN_OR_RETURN(r.weights, LlamaWeights::FromSafetensors(dims, path.string()));
      return r;
    }();
    if (!cached.ok()) return Annotate(cached.status(), StrCat("backbone cache entry ", path.string()));
    if (hit != nullptr) *hit = true;
    return cached;
  }
  SLICESCHED_ASSIGN_OR_RETURN(PretrainResult r, PretrainBackbone(dims, o));
  std::filesystem::create_directories(cache_dir, ec);
  if (ec) return absl::UnavailableError(StrCat("backbone cache: cannot create ", cache_dir, ": ", ec.message()));
  const std::string tmp = StrCat(path.string(), ".tmp-", getpid());
  SLICESCHED_RETURN_IF_ERROR(WriteSafetensors(tmp, r.weights->NamedTensors(), PretrainMetadata(dims, o, r)));
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    return absl::UnavailableError(StrCat("backbone cache: cannot write ", path.string()));
  }
  if (hit != nullptr) *hit = false;
  return r;
}

}  // namespace slicesched::executor
