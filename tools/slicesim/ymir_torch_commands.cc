// slicesim's commands: Ymir experiments on the LibTorch training operators: make-backbone,
// ymir-estimators, ymir-lut. Linked only into a build with LibTorch.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "command.h"
#include "slicesched/common/clock.h"
#include "slicesched/common/json.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "slicesched/executor/torch/safetensors.h"
#include "slicesched/experiments/lut_profile.h"
#include "slicesched/experiments/pretrain.h"
#include "slicesched/experiments/task2vec.h"
#include "slicesched/synth/tasks.h"
#include "slicesched/synth/wordnet.h"
#include "slicesched/ymir/time_lut.h"

namespace slicesim {
namespace {

int MakeBackbone(const std::vector<std::string>& args) {
  slicesched::executor::PretrainOptions o;
  std::string out, corpus = "synthetic", wordnet_dir = slicesched::synth::kWordNetDefaultDir;
  std::string method = "lora", model = "tiny", cache;
  double learning_rate = 0;
  bool json = false;
  if (int rc = Flags("make-backbone")
                   .Text("--out", &out).Required()
                   .Text("--cache", &cache)
                   .Seed("--seed", &o.seed)
                   .Int("--rounds", &o.rounds)
                   .Int("--steps", &o.steps_per_round)
                   .Int("--batch-size", &o.batch_size)
                   .Num("--learning-rate", &learning_rate)
                   .Choice("--method", {"lora", "full"}, &method)
                   .Text("--model", &model)
                   .Text("--corpus", &corpus)
                   .Text("--wordnet-dir", &wordnet_dir)
                   .Switch("--json", &json)
                   .Parse(args)) {
    return rc;
  }
  if (corpus != "synthetic" && corpus != "wordnet") {
    return UsageError("make-backbone", "--corpus must be synthetic or wordnet, got '" + corpus + "'");
  }
  o.method = method == "full" ? slicesched::executor::PretrainMethod::kFull
                              : slicesched::executor::PretrainMethod::kMergedLora;
  // Full-parameter AdamW takes a smaller step than the LoRA rounds.
  if (learning_rate != 0) {
    o.learning_rate = learning_rate;
  } else if (method == "full") {
    o.learning_rate = 3e-3;
  }
  auto dims = slicesched::LlamaPreset(model);
  if (!dims.ok()) return UsageError("make-backbone", "--model: " + std::string(dims.status().message()));
  if (corpus == "wordnet") {
    // The model's vocabulary bounds the corpus's: its most frequent words.
    auto wn = slicesched::synth::WordNetCorpus::Load(wordnet_dir, dims->vocab);
    if (!wn.ok()) return Failed("make-backbone", wn.status());
    o.corpus_tokens = slicesched::executor::WordNetGlossStream(*wn);
  }
  if (absl::Status v = o.Validate(); !v.ok()) return Rejected("make-backbone", v);
  bool cached = false;
  auto r = cache.empty() ? slicesched::executor::PretrainBackbone(*dims, o)
                         : slicesched::executor::PretrainBackboneCached(*dims, o, cache, &cached);
  if (!r.ok()) return Failed("make-backbone", r.status());
  std::map<std::string, std::string> meta = slicesched::executor::PretrainMetadata(*dims, o, *r);
  meta["slicesched.corpus"] = corpus;
  if (auto st = slicesched::executor::WriteSafetensors(out, r->weights->NamedTensors(), meta); !st.ok()) {
    return Failed("make-backbone", st);
  }
  if (json) {
    std::printf("{\"out\": \"%s\", \"steps\": %zu, \"initial_eval_loss\": %.4f, \"final_eval_loss\": %.4f}\n",
                out.c_str(), r->train_loss.size(), r->initial_eval_loss, r->final_eval_loss);
  } else {
    // The loss curve, one mean per round.
    for (int64_t round = 0; round < o.rounds; ++round) {
      double sum = 0;
      for (int64_t k = 0; k < o.steps_per_round; ++k) sum += r->train_loss[static_cast<size_t>(round * o.steps_per_round + k)];
      std::printf("round %lld: mean training loss %.4f\n", static_cast<long long>(round + 1),
                  sum / static_cast<double>(o.steps_per_round));
    }
    std::printf("wrote %s: %zu steps on the %s corpus%s, held-out next-token loss %.4f -> %.4f\n", out.c_str(),
                r->train_loss.size(), corpus.c_str(), cached ? " (from the cache)" : "", r->initial_eval_loss,
                r->final_eval_loss);
  }
  return 0;
}

void PrintEstimatorReport(const slicesched::executor::YmirEstimatorReport& rep,
                          const slicesched::executor::YmirExperimentOptions& o);

// --fit-on A.csv,B.csv: the pairs tables (ymir-estimators --pairs-out) the
// gain model is fitted on.
absl::Status ReadFitOn(const std::string& list, std::vector<slicesched::executor::YmirTrainingPair>* out) {
  for (const std::string& path : std::vector<std::string>(absl::StrSplit(list, ',', absl::SkipEmpty()))) {
    std::ifstream in(path);
    if (!in) return absl::NotFoundError("--fit-on: cannot read " + path);
    std::stringstream text;
    text << in.rdbuf();
    auto rows = slicesched::executor::ParseYmirPairsCsv(text.str());
    if (!rows.ok()) return slicesched::Annotate(rows.status(), "--fit-on " + path);
    out->insert(out->end(), rows->begin(), rows->end());
  }
  return absl::OkStatus();
}

// --tasks NAME[:CLASSES],... (CLASSES defaults to 2).
absl::StatusOr<std::vector<slicesched::executor::YmirTaskSpec>> ParseTaskList(const std::string& list) {
  std::vector<slicesched::executor::YmirTaskSpec> out;
  for (const std::string& item : std::vector<std::string>(absl::StrSplit(list, ','))) {
    const size_t colon = item.find(':');
    slicesched::executor::YmirTaskSpec t{.name = item.substr(0, colon)};
    if (colon != std::string::npos && !absl::SimpleAtoi(item.substr(colon + 1), &t.num_classes)) {
      return absl::InvalidArgumentError("--tasks item '" + item + "': CLASSES after ':' is not an integer");
    }
    out.push_back(t);
  }
  return out;
}

// The backbone's model: a file names its own (make-backbone writes it); the
// default backbone is the tiny preset unless --model says otherwise.
// InvalidArgument for options that contradict each other or the file.
absl::StatusOr<slicesched::LlamaDims> BackboneModel(const std::string& backbone, std::string model) {
  if (!backbone.empty()) {
    SLICESCHED_ASSIGN_OR_RETURN(auto file, slicesched::executor::SafetensorsFile::Open(backbone));
    if (auto it = file.metadata().find("slicesched.model"); it != file.metadata().end()) {
      if (!model.empty() && model != it->second) {
        return absl::InvalidArgumentError("--model " + model + " but " + backbone + " is a '" + it->second +
                                          "' backbone");
      }
      model = it->second;
    }
  }
  auto dims = slicesched::LlamaPreset(model.empty() ? "tiny" : model);
  if (!dims.ok()) return absl::InvalidArgumentError("--model: " + std::string(dims.status().message()));
  return dims;
}

// The backbone file, or the default backbone: `slicesim make-backbone
// --seed SEED` on the tasks' own language or the glosses (through the cache
// in `cache_dir` when one is given).
absl::StatusOr<std::shared_ptr<const slicesched::executor::LlamaWeights>> LoadOrPretrain(
    const slicesched::LlamaDims& dims, const std::string& backbone, uint64_t seed, const std::string& cache_dir,
    const slicesched::executor::YmirExperimentOptions& o) {
  if (!backbone.empty()) return slicesched::executor::LlamaWeights::FromSafetensors(dims, backbone);
  slicesched::executor::PretrainOptions p;
  p.seed = seed;
  p.language = o.language;
  if (o.wordnet != nullptr) p.corpus_tokens = slicesched::executor::WordNetGlossStream(*o.wordnet);
  SLICESCHED_ASSIGN_OR_RETURN(slicesched::executor::PretrainResult r,
                              cache_dir.empty() ? slicesched::executor::PretrainBackbone(dims, p)
                                                : slicesched::executor::PretrainBackboneCached(dims, p, cache_dir));
  return r.weights;
}

// Writes `text` to `path` (nothing when `path` is empty).
absl::Status WriteText(const std::string& path, const std::string& text) {
  if (path.empty()) return absl::OkStatus();
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return absl::UnavailableError("cannot write " + path);
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok) return absl::DataLossError("writing " + path);
  return absl::OkStatus();
}

int YmirEstimators(const std::vector<std::string>& args) {
  slicesched::executor::YmirExperimentOptions o;
  std::string backbone, gains_out;
  bool json = false;
  uint64_t backbone_seed = 1;
  std::string head = o.zero_head ? "zero" : "random", tasks;
  std::string envelope = o.iter_fit.envelope == slicesched::ymir::Envelope::kIsotonic ? "isotonic" : "min";
  std::string time_shift = o.iter_fit.time_shift ? "on" : "off";
  std::string online = o.iter_online ? "on" : "off";
  std::string direction = o.direction == slicesched::executor::YmirDirection::kAsymmetry ? "asymmetry" : "none";
  std::string fit_on, pairs_out, model, backbone_cache, holdout;
  std::string family = "synthetic", wordnet_dir = slicesched::synth::kWordNetDefaultDir;
  double transfer_watch = o.iter_transfer_online ? o.iter_transfer_watch.watch : 0.0;
  std::string transfer_fit = o.iter_transfer_watch.fit == slicesched::ymir::WatchFit::kLoss ? "loss" : "time";
  std::string spatial_step = o.spatial_rule == slicesched::executor::JointStepRule::kSum ? "sum" : "mean";
  std::string probe = o.probe == slicesched::executor::YmirProbe::kHead ? "head" : "trained";
  std::string gain_measure = o.gain_measure == slicesched::executor::YmirGainMeasure::kArea ? "area" : "steps";
  std::string fisher = o.fisher == slicesched::executor::YmirFisher::kModel ? "model" : "empirical";
  std::string embed = o.embed == slicesched::executor::YmirEmbedParams::kLoraHead ? "lora+head" : "lora";
  std::string distance = o.distance == slicesched::executor::YmirDistance::kCosine ? "cosine" : "normalised";
  if (int rc = Flags("ymir-estimators")
                   .Text("--backbone", &backbone)
                   .Seed("--backbone-seed", &backbone_seed)
                   .Text("--backbone-cache", &backbone_cache)
                   .Text("--model", &model)
                   .Seed("--seed", &o.seed)
                   .Int("--steps", &o.normal_steps)
                   .Num("--learning-rate", &o.learning_rate)
                   .Int("--warmup-steps", &o.lr_warmup_steps)
                   .Choice("--head", {"zero", "random"}, &head)
                   .Choice("--spatial-step", {"mean", "sum"}, &spatial_step)
                   .Choice("--probe", {"trained", "head"}, &probe)
                   .Int("--probe-steps", &o.probe_steps)
                   .Int("--fisher-examples", &o.fisher_examples)
                   .Choice("--gain", {"steps", "area"}, &gain_measure)
                   .Int("--gain-window", &o.gain_window)
                   .Text("--tasks", &tasks)
                   .Text("--family", &family)
                   .Text("--wordnet-dir", &wordnet_dir)
                   .Int("--eval-every", &o.eval_every)
                   .Int("--max-steps-factor", &o.max_steps_factor)
                   .Int("--lora-rank", &o.lora_rank)
                   .Int("--repeats", &o.repeats)
                   .Int("--sequence-length", &o.sequence_length)
                   .Int("--eval-examples", &o.eval_examples)
                   .Num("--iter-prefix-fraction", &o.iter_prefix_fraction)
                   .Int("--stop-loss-epoch-steps", &o.stop_loss_epoch_steps)
                   .Switch("--iter-quadratic", &o.iter_fit.quadratic)
                   .Choice("--iter-envelope", {"min", "isotonic"}, &envelope)
                   .Choice("--iter-time-shift", {"on", "off"}, &time_shift)
                   .Num("--iter-half-life", &o.iter_fit.recency_half_life)
                   .Choice("--iter-online", {"on", "off"}, &online)
                   .Num("--iter-plateau-k", &o.iter_plateau.noise_k)
                   .Num("--iter-plateau-drop", &o.iter_plateau.min_drop)
                   .Num("--iter-plateau-span", &o.iter_plateau.min_span)
                   .Num("--iter-transfer-watch", &transfer_watch)
                   .Choice("--iter-transfer-fit", {"time", "loss"}, &transfer_fit)
                   .Num("--iter-transfer-prior-points", &o.iter_transfer_watch.prior_points)
                   .Choice("--direction", {"none", "asymmetry"}, &direction)
                   .Text("--fit-on", &fit_on)
                   .Text("--holdout-tasks", &holdout)
                   .Text("--pairs-out", &pairs_out)
                   .Text("--gains-out", &gains_out)
                   .Switch("--curves-only", &o.curves_only)
                   .Switch("--similarities-only", &o.similarities_only)
                   .Choice("--fisher", {"empirical", "model"}, &fisher)
                   .Choice("--embed", {"lora", "lora+head"}, &embed)
                   .Choice("--distance", {"normalised", "cosine"}, &distance)
                   .Int("--null-runs", &o.null_runs)
                   .Num("--band-k", &o.band_k)
                   .Int("--label-margin", &o.label_margin)
                   .Num("--lora-alpha", &o.lora_alpha)
                   .Int("--language-vocab", &o.language.vocab)
                   .Int("--language-classes", &o.language.classes)
                   .Int("--train-examples", &o.train_examples)
                   .Int("--batch-size", &o.batch_size)
                   .Switch("--json", &json)
                   .Parse(args)) {
    return rc;
  }
  namespace ex = slicesched::executor;
  o.zero_head = head == "zero";
  o.probe = probe == "head" ? ex::YmirProbe::kHead : ex::YmirProbe::kTrained;
  o.gain_measure = gain_measure == "area" ? ex::YmirGainMeasure::kArea : ex::YmirGainMeasure::kSteps;
  o.fisher = fisher == "model" ? ex::YmirFisher::kModel : ex::YmirFisher::kEmpirical;
  o.embed = embed == "lora+head" ? ex::YmirEmbedParams::kLoraHead : ex::YmirEmbedParams::kLora;
  o.distance = distance == "cosine" ? ex::YmirDistance::kCosine : ex::YmirDistance::kNormalised;
  o.spatial_rule = spatial_step == "sum" ? ex::JointStepRule::kSum : ex::JointStepRule::kMean;
  o.iter_fit.envelope =
      envelope == "min" ? slicesched::ymir::Envelope::kRunningMin : slicesched::ymir::Envelope::kIsotonic;
  o.iter_fit.time_shift = time_shift == "on";
  o.iter_online = online == "on";
  // 0 turns the watch off; anything else is validated by the experiment.
  o.iter_transfer_online = transfer_watch != 0;
  if (o.iter_transfer_online) o.iter_transfer_watch.watch = transfer_watch;
  o.iter_transfer_watch.fit =
      transfer_fit == "loss" ? slicesched::ymir::WatchFit::kLoss : slicesched::ymir::WatchFit::kTime;
  o.direction = direction == "asymmetry" ? ex::YmirDirection::kAsymmetry : ex::YmirDirection::kNone;
  if (absl::Status st = ReadFitOn(fit_on, &o.fit_on); !st.ok()) return Failed("ymir-estimators", st);
  if (!holdout.empty()) o.holdout_tasks = absl::StrSplit(holdout, ',', absl::SkipEmpty());
  if (!tasks.empty()) {
    auto parsed = ParseTaskList(tasks);
    if (!parsed.ok()) return UsageError("ymir-estimators", std::string(parsed.status().message()));
    o.tasks = *std::move(parsed);
  }
  if (family != "synthetic" && family != "wordnet") {
    return UsageError("ymir-estimators", "--family must be synthetic or wordnet, got '" + family + "'");
  }
  auto dims = BackboneModel(backbone, model);
  if (!dims.ok()) {
    return dims.status().code() == absl::StatusCode::kInvalidArgument
               ? UsageError("ymir-estimators", std::string(dims.status().message()))
               : Failed("ymir-estimators", dims.status());
  }
  if (family == "wordnet") {
    // Words of the backbone's vocabulary; four levels of relatedness
    // (synth/wordnet.h) unless --tasks names others.
    auto wn = slicesched::synth::WordNetCorpus::Load(wordnet_dir, dims->vocab);
    if (!wn.ok()) return Failed("ymir-estimators", wn.status());
    o.wordnet = std::make_shared<const slicesched::synth::WordNetCorpus>(std::move(*wn));
    if (tasks.empty()) {
      o.tasks = {{"animal-plant", 2}, {"animal-plant@1", 2}, {"animal-artifact", 2}, {"artifact-food", 2},
                 {"cross-ap", 2}};
    }
  }
  // Bad options are named before the backbone is pretrained (~20 s).
  if (absl::Status v = o.Validate(); !v.ok()) return Rejected("ymir-estimators", v);
  auto w = LoadOrPretrain(*dims, backbone, backbone_seed, backbone_cache, o);
  if (!w.ok()) return Failed("ymir-estimators", w.status());
  auto rep = slicesched::executor::RunYmirEstimators(**w, o);
  if (!rep.ok()) return Failed("ymir-estimators", rep.status());
  for (const auto& [path, csv] : {std::pair{gains_out, rep->GainsCsv()}, std::pair{pairs_out, rep->PairsCsv()}}) {
    if (absl::Status st = WriteText(path, csv); !st.ok()) return Failed("ymir-estimators", st);
  }
  if (json) {
    std::printf("%s\n", rep->ToJson().c_str());
  } else {
    PrintEstimatorReport(*rep, o);
  }
  return 0;
}

// The text report of ymir-estimators (--json prints the whole report).
void PrintEstimatorReport(const slicesched::executor::YmirEstimatorReport& r,
                          const slicesched::executor::YmirExperimentOptions& o) {
  const auto* rep = &r;
  if (o.similarities_only) {
    for (size_t a = 0; a < rep->tasks.size(); ++a) {
      std::printf("S(%s, .):", rep->tasks[a].c_str());
      for (double v : rep->similarity[a]) std::printf(" %.4f", v);
      std::printf("\n");
    }
  } else {
    for (const auto& s : rep->scores) {
      std::printf("%-8s %3lld pairs (%lld positive): sign accuracy %.1f%% (majority %.1f%%), gain MAPE %.1f%%, r=%.2f;"
                  " %lld neutral, non-neutral accuracy %.1f%% (majority %.1f%%),"
                  " three-way %.1f%% (majority %.1f%%)\n",
                  s.mode.c_str(), static_cast<long long>(s.pairs), static_cast<long long>(s.positive), s.accuracy_pct,
                  s.majority_accuracy_pct, s.mape_pct, s.correlation, static_cast<long long>(s.neutral),
                  s.non_neutral_accuracy_pct, s.non_neutral_majority_pct, s.three_way_accuracy_pct,
                  s.three_way_majority_pct);
    }
    std::printf("neutral band %.4f (%g x RMS of %zu null-run gains)\n", rep->neutral_band, o.band_k,
                rep->null_runs.size());
    std::printf("iteration estimator (%s, first window %lld steps, estimates available at step %.1f on "
                "average, %lld plateaus): error normal %.1f%%, transfer %.1f%% (%lld pairs; ignoring the gain %.1f%%)\n",
                rep->iteration.online ? "online" : "fixed prefix", static_cast<long long>(o.IterPrefixSteps()),
                rep->iteration.observed_steps_mean, static_cast<long long>(rep->iteration.plateaus),
                rep->iteration.normal_pct, rep->iteration.transfer_pct,
                static_cast<long long>(rep->iteration.transfer_pairs), rep->iteration.transfer_nogain_pct);
    if (rep->iteration.online) {
      std::printf("  fixed prefix %lld steps: error normal %.1f%%, transfer %.1f%%\n",
                  static_cast<long long>(rep->iteration_first_window.prefix_steps),
                  rep->iteration_first_window.normal_pct, rep->iteration_first_window.transfer_pct);
    }
    for (const auto& e : rep->iteration_sweep) {
      std::printf("  prefix %lld steps: error normal %.1f%%, transfer %.1f%%\n", static_cast<long long>(e.prefix_steps),
                  e.normal_pct, e.transfer_pct);
    }
    std::printf("negative pairs %lld: caught %lld (estimator %lld, stop-loss %lld); positive pairs decoupled %lld\n",
                static_cast<long long>(rep->negative_pairs), static_cast<long long>(rep->negative_caught),
                static_cast<long long>(rep->negative_caught_by_estimator),
                static_cast<long long>(rep->negative_caught_by_stop_loss),
                static_cast<long long>(rep->positive_decoupled));
    std::printf("paper (Table 2): accuracy 97.2-98.6%%, gain MAPE 15.5-18.1%%, iteration error 5.7-11.3%% normal, "
                "11.1-15.4%% transfer; %lld training steps in %.1f s\n",
                static_cast<long long>(rep->train_steps), rep->seconds);
  }
}

int YmirLut(const std::vector<std::string>& args) {
  slicesched::executor::LutProfileOptions o;
  std::string out, backbone, devices = "1,2", grad_accum = "1,2", batches = "4,8,16", frozen = "0,2", amp = "0,1",
                                  ckpt = "0,1", parallelism = "data,pipeline";
  bool json = false;
  if (int rc = Flags("ymir-lut")
                   .Text("--out", &out).Required()
                   .Text("--backbone", &backbone)
                   .Text("--devices", &devices)
                   .Text("--grad-accum", &grad_accum)
                   .Text("--batches", &batches)
                   .Text("--frozen", &frozen)
                   .Text("--amp", &amp)
                   .Text("--ckpt", &ckpt)
                   .Text("--parallelism", &parallelism)
                   .Int("--iterations", &o.iterations)
                   .Switch("--json", &json)
                   .Parse(args)) {
    return rc;
  }
  auto list = [](const std::string& text, const char* flag, std::vector<int64_t>* v) -> absl::Status {
    v->clear();
    for (absl::string_view part : absl::StrSplit(text, ',')) {
      int64_t x = 0;
      if (!absl::SimpleAtoi(part, &x)) {
        return absl::InvalidArgumentError(std::string(flag) + ": '" + text + "' is not a comma-separated integer list");
      }
      v->push_back(x);
    }
    return absl::OkStatus();
  };
  for (auto [text, flag, v] : {std::tuple{&devices, "--devices", &o.devices},
                               std::tuple{&grad_accum, "--grad-accum", &o.grad_accum},
                               std::tuple{&batches, "--batches", &o.local_batch},
                               std::tuple{&frozen, "--frozen", &o.frozen_layers},
                               std::tuple{&amp, "--amp", &o.amp},
                               std::tuple{&ckpt, "--ckpt", &o.grad_checkpoint}}) {
    if (auto st = list(*text, flag, v); !st.ok()) return UsageError("ymir-lut", std::string(st.message()));
  }
  o.parallelism.clear();
  for (absl::string_view part : absl::StrSplit(parallelism, ',')) {
    if (part == "data") {
      o.parallelism.push_back(slicesched::ymir::Parallelism::kData);
    } else if (part == "pipeline") {
      o.parallelism.push_back(slicesched::ymir::Parallelism::kPipeline);
    } else {
      return UsageError("ymir-lut", "--parallelism: values must be data or pipeline, got '" + parallelism + "'");
    }
  }
  if (absl::Status v = o.Validate(); !v.ok()) return Rejected("ymir-lut", v);
  auto dims = slicesched::LlamaPreset("tiny");
  if (!dims.ok()) return Failed("ymir-lut", dims.status());
  // Iteration times do not depend on the weights' values: without
  // --backbone, the seeded tiny preset.
  std::shared_ptr<const slicesched::executor::LlamaWeights> w;
  if (backbone.empty()) {
    auto r = slicesched::executor::LlamaWeights::FromSeed(*dims, 1);
    if (!r.ok()) return Failed("ymir-lut", r.status());
    w = *r;
  } else {
    auto r = slicesched::executor::LlamaWeights::FromSafetensors(*dims, backbone);
    if (!r.ok()) return Failed("ymir-lut", r.status());
    w = *r;
  }
  const slicesched::SteadyClock clock;
  const slicesched::Timestamp t0 = clock.Now();
  auto lut = slicesched::executor::ProfileTimeLut(*w, o, clock);
  if (!lut.ok()) return Failed("ymir-lut", lut.status());
  const double seconds = (clock.Now() - t0).ToSecondsF();
  if (auto st = lut->Save(out); !st.ok()) return Failed("ymir-lut", st);
  // Example lookups: keys the grid did not measure are interpolated (and
  // marked); categorical keys that were not profiled (pipeline parallelism,
  // or an AMP / checkpointing value left out of the grid) are not found.
  using slicesched::ymir::LutKey;
  std::vector<LutKey> probes = {
      LutKey{.devices = o.devices.front(), .grad_accum = o.grad_accum.front(), .local_batch = o.local_batch.front()},
      LutKey{.devices = o.devices.front(), .grad_accum = o.grad_accum.front(), .local_batch = 12},
      LutKey{.devices = o.devices.back(), .grad_accum = 3, .local_batch = 6, .frozen_layers = 1},
      LutKey{.devices = 4, .grad_accum = 1, .local_batch = 8},
      LutKey{.devices = 1, .grad_accum = 1, .local_batch = 8, .amp = true},
      LutKey{.devices = 1, .grad_accum = 1, .local_batch = 12, .grad_checkpoint = true},
      LutKey{.devices = 2, .grad_accum = 1, .local_batch = 8, .parallelism = slicesched::ymir::Parallelism::kPipeline}};
  std::string lookups;
  for (const LutKey& k : probes) {
    auto r = lut->Lookup(k);
    std::string line = json ? "    {\"key\": \"" + k.ToString() + "\", " : "  " + k.ToString() + ": ";
    if (r.ok()) {
      char buf[96];
      std::snprintf(buf, sizeof buf, json ? "\"seconds\": %.6f, \"interpolated\": %s, \"sources\": %zu}"
                                          : "%.6f s%s (%zu source key(s))",
                    r->seconds, json ? (r->interpolated ? "true" : "false") : (r->interpolated ? " interpolated" : ""),
                    r->source.size());
      line += buf;
    } else {
      line += json ? "\"error\": " + slicesched::JsonQuote(slicesched::ToStd(r.status().message())) + "}"
                   : "not found (" + std::string(r.status().message()) + ")";
    }
    lookups += (lookups.empty() ? "" : json ? ",\n" : "\n") + line;
  }
  if (json) {
    std::printf("{\"out\": \"%s\", \"keys\": %zu, \"profile_seconds\": %.1f,\n  \"lookups\": [\n%s\n  ]}\n",
                out.c_str(), lut->entries().size(), seconds, lookups.c_str());
  } else {
    std::printf("wrote %s: %zu keys profiled in %.1f s\n%s\n%s", out.c_str(), lut->entries().size(), seconds,
                lookups.c_str(), lut->ToCsv().c_str());
  }
  return 0;
}

[[maybe_unused]] const bool kRegistered = RegisterCommands({
    {"make-backbone", &MakeBackbone},
    {"ymir-estimators", &YmirEstimators},
    {"ymir-lut", &YmirLut},
});

}  // namespace
}  // namespace slicesim
