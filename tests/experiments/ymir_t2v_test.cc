// Backbone pretraining on the synthetic language and the Ymir transfer-gain
// estimator (pretrain.h, task2vec.h) on the "tiny" preset (f32).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <fstream>
#include <iterator>
#include <optional>
#include <random>

#include "absl/strings/str_format.h"
#include "slicesched/common/clock.h"
#include "slicesched/experiments/lut_profile.h"
#include "slicesched/experiments/pretrain.h"
#include "slicesched/executor/torch/safetensors.h"
#include "slicesched/experiments/task2vec.h"
#include "slicesched/gmg/llama.h"
#include "slicesched/ymir/iteration_estimator.h"

namespace slicesched::executor {
namespace {

LlamaDims Tiny() {
  auto dims = LlamaPreset("tiny");
  EXPECT_TRUE(dims.ok()) << dims.status();
  return *dims;
}

PretrainOptions SmallPretrain() {
  PretrainOptions o;
  o.rounds = 2;
  o.steps_per_round = 15;
  o.batch_size = 8;
  o.sequence_length = 16;
  o.eval_sentences = 32;
  return o;
}

TEST(Pretrain, LossDecreasesAndTheBackboneLearnsTheLanguage) {
  auto r = PretrainBackbone(Tiny(), SmallPretrain());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->train_loss.size(), 30u);
  // A random backbone is near-uniform over 256 tokens (ln 256 = 5.55); the
  // language is far more predictable than that.
  EXPECT_GT(r->initial_eval_loss, 5.0);
  EXPECT_LT(r->final_eval_loss, r->initial_eval_loss - 0.3);
  EXPECT_LT(r->train_loss.back(), r->train_loss.front());
  // The merged backbone is what the eval loss measured.
  auto again = LanguageModelLoss(*r->weights, {{1, 2, 3, 4}});
  EXPECT_TRUE(again.ok());
}

// Every weight learning beats the merged LoRA rounds on the same batches,
// and the written backbone is the one the eval loss measured.
TEST(Pretrain, FullParameterTrainingLearnsMoreThanLoraRoundsOnTheSameBatches) {
  PretrainOptions o = SmallPretrain();
  auto lora = PretrainBackbone(Tiny(), o);
  ASSERT_TRUE(lora.ok()) << lora.status();
  o.method = PretrainMethod::kFull;
  o.learning_rate = 3e-3;
  auto full = PretrainBackbone(Tiny(), o);
  ASSERT_TRUE(full.ok()) << full.status();
  ASSERT_EQ(full->train_loss.size(), 30u);
  EXPECT_EQ(full->initial_eval_loss, lora->initial_eval_loss);
  EXPECT_LT(full->final_eval_loss, lora->final_eval_loss);
  EXPECT_LT(full->final_eval_loss, full->initial_eval_loss - 0.3);
  // Every tensor moved, the embeddings and MLPs included.
  auto seeded = LlamaWeights::FromSeed(Tiny(), o.seed);
  ASSERT_TRUE(seeded.ok());
  const auto before = (*seeded)->NamedTensors(), after = full->weights->NamedTensors();
  ASSERT_EQ(before.size(), after.size());
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_NE(before[i].second.ToFloat(), after[i].second.ToFloat()) << before[i].first;
  }
}

// A backbone is pretrained once per content key: the second call reads the
// cache and gives the same weights and losses; another option is another key;
// a damaged entry is reported by path, not silently replaced.
TEST(Pretrain, TheCacheServesTheSameBackboneOncePretrained) {
  const std::string dir = testing::TempDir() + "/pretrain_cache";
  std::filesystem::remove_all(dir);
  PretrainOptions o = SmallPretrain();
  o.rounds = 1;
  o.steps_per_round = 5;
  bool hit = true;
  auto first = PretrainBackboneCached(Tiny(), o, dir, &hit);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(hit);
  auto second = PretrainBackboneCached(Tiny(), o, dir, &hit);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_TRUE(hit);
  EXPECT_EQ(second->train_loss, first->train_loss);
  EXPECT_EQ(second->initial_eval_loss, first->initial_eval_loss);
  EXPECT_EQ(second->final_eval_loss, first->final_eval_loss);
  const auto a = first->weights->NamedTensors(), b = second->weights->NamedTensors();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].second.ToFloat(), b[i].second.ToFloat()) << a[i].first;

  PretrainOptions other = o;
  other.seed = o.seed + 1;
  EXPECT_NE(PretrainKey(Tiny(), other), PretrainKey(Tiny(), o));
  other = o;
  other.method = PretrainMethod::kFull;
  EXPECT_NE(PretrainKey(Tiny(), other), PretrainKey(Tiny(), o));
  other = o;
  other.corpus_tokens = {1, 2, 3};
  EXPECT_NE(PretrainKey(Tiny(), other), PretrainKey(Tiny(), o));

  const std::string entry = dir + "/backbone-" + PretrainKey(Tiny(), o) + ".safetensors";
  ASSERT_TRUE(std::filesystem::exists(entry));
  std::ofstream(entry, std::ios::binary | std::ios::trunc) << "not a safetensors file";
  auto damaged = PretrainBackboneCached(Tiny(), o, dir, &hit);
  ASSERT_FALSE(damaged.ok());
  EXPECT_THAT(std::string(damaged.status().message()), testing::HasSubstr(entry));
  std::filesystem::remove_all(dir);
}

TEST(Pretrain, SameSeedSameBytesOtherSeedOtherWeights) {
  const std::string dir = testing::TempDir();
  std::vector<std::string> paths;
  for (uint64_t seed : {3, 3, 4}) {
    PretrainOptions o = SmallPretrain();
    o.rounds = 1;
    o.steps_per_round = 5;
    o.seed = seed;
    auto r = PretrainBackbone(Tiny(), o);
    ASSERT_TRUE(r.ok()) << r.status();
    paths.push_back(dir + "/pretrain_" + std::to_string(paths.size()) + ".safetensors");
    ASSERT_TRUE(WriteSafetensors(paths.back(), r->weights->NamedTensors()).ok());
  }
  auto slurp = [](const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  };
  EXPECT_EQ(slurp(paths[0]), slurp(paths[1]));
  EXPECT_NE(slurp(paths[0]), slurp(paths[2]));
  // Only q, v and lm_head change; the embeddings keep their seeded values.
  auto seeded = LlamaWeights::FromSeed(Tiny(), 3);
  auto loaded = LlamaWeights::FromSafetensors(Tiny(), paths[0]);
  ASSERT_TRUE(seeded.ok() && loaded.ok());
  EXPECT_EQ((*seeded)->embed_tokens().MaxAbsDiff((*loaded)->embed_tokens()), 0.0);
  EXPECT_EQ((*seeded)->layer(0).k_proj.MaxAbsDiff((*loaded)->layer(0).k_proj), 0.0);
  EXPECT_GT((*seeded)->layer(0).q_proj.MaxAbsDiff((*loaded)->layer(0).q_proj), 0.0);
  EXPECT_GT((*seeded)->lm_head().MaxAbsDiff((*loaded)->lm_head()), 0.0);
}

// A real corpus instead of the language: a stream with structure (a repeated
// phrase among seeded noise) is learnt below the loss of its seeded start,
// from windows that never include the held-out ones.
TEST(Pretrain, LearnsFromACorpusStream) {
  PretrainOptions o = SmallPretrain();
  std::mt19937_64 rng(9);
  for (int k = 0; k < 2000; ++k) {
    for (int64_t t : {10, 11, 12, 13}) o.corpus_tokens.push_back(t);
    o.corpus_tokens.push_back(20 + static_cast<int64_t>(rng() % 50));
  }
  auto r = PretrainBackbone(Tiny(), o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_LT(r->final_eval_loss, r->initial_eval_loss - 1.0);
  // A corpus too short for its held-out windows, and a token outside the
  // model's vocabulary, are refused by name.
  PretrainOptions tiny_corpus = SmallPretrain();
  tiny_corpus.corpus_tokens.assign(100, 5);
  EXPECT_THAT(std::string(PretrainBackbone(Tiny(), tiny_corpus).status().message()),
              testing::HasSubstr("the corpus has 100 tokens"));
  o.corpus_tokens[7] = 256;
  EXPECT_THAT(std::string(PretrainBackbone(Tiny(), o).status().message()),
              testing::HasSubstr("token 256, outside the model's vocab 256"));
}

TEST(Pretrain, RejectsBadOptions) {
  PretrainOptions o;
  o.rounds = 0;
  EXPECT_THAT(std::string(PretrainBackbone(Tiny(), o).status().message()),
              testing::HasSubstr("rounds"));
  LlamaDims bf16 = Tiny();
  bf16.dtype = DType::kBF16;
  EXPECT_THAT(std::string(PretrainBackbone(bf16, PretrainOptions{}).status().message()),
              testing::HasSubstr("f32"));
}

TEST(Task2Vec, DistancesFollowTheDefinitions) {
  const std::vector<double> a = {1, 2, 3, 4}, b = {2, 4, 6, 8}, c = {4, 3, 2, 1};
  // Proportional Fishers normalise to constant vectors: distance 0.
  EXPECT_NEAR(SymmetricDistance(a, b), 0.0, 1e-12);
  EXPECT_NEAR(SymmetricDistance(a, a), 0.0, 1e-12);
  EXPECT_GT(SymmetricDistance(a, c), 0.01);
  EXPECT_NEAR(SymmetricDistance(a, c), SymmetricDistance(c, a), 1e-12);
  // The asymmetric distance subtracts alpha x the source's distance from t0.
  EXPECT_NEAR(AsymmetricDistance(a, c, b, 0.5), SymmetricDistance(a, c), 1e-12);
  EXPECT_NEAR(AsymmetricDistance(c, a, b, 0.5),
              SymmetricDistance(a, c) - 0.5 * SymmetricDistance(c, b), 1e-12);
}

// The first setup's settings (task2vec.h), scaled down; the tests below
// set what they change from it.
YmirExperimentOptions SmallExperiment() {
  YmirExperimentOptions o;
  o.tasks = {{"fa-major", 2}, {"fa-inv", 2}, {"fb-major", 2}};
  o.language.vocab = 256;
  o.label_margin = 0;
  o.lr_warmup_steps = 0;
  o.zero_head = false;
  o.spatial_rule = JointStepRule::kMean;
  o.probe = YmirProbe::kTrained;
  o.gain_measure = YmirGainMeasure::kSteps;
  o.sequence_length = 8;
  o.batch_size = 8;
  o.train_examples = 64;
  o.eval_examples = 16;
  o.normal_steps = 6;
  o.probe_steps = 3;
  o.fisher_examples = 4;
  o.eval_every = 2;
  return o;
}

// A WordNet corpus in the package's format, written by the test: 40 synsets
// in each of four lexicographer files, glosses drawn from a word list per file
// with shared words between them.
std::shared_ptr<const synth::WordNetCorpus> FixtureWordNet() {
  const std::string dir = testing::TempDir() + "/t2v_wordnet";
  std::filesystem::create_directories(dir);
  std::ofstream f(dir + "/data.noun");
  const std::vector<std::pair<int, std::vector<std::string>>> files = {
      {5, {"animal", "fur", "legs", "hunts", "wild"}},
      {20, {"plant", "leaves", "flowers", "grows", "wild"}},
      {6, {"device", "made", "metal", "used", "tool"}},
      {13, {"food", "eaten", "cooked", "sweet", "used"}}};
  std::mt19937_64 rng(3);
  uint32_t offset = 100;
  for (const auto& [lexfile, words] : files) {
    for (int k = 0; k < 40; ++k) {
      ++offset;
      f << absl::StrFormat("%08d %02d n 01 w%d 0 000 | a", offset, lexfile, offset);
      for (int w = 0; w < 6; ++w) f << " " << words[rng() % words.size()] << (rng() % 3 == 0 ? " of the" : "");
      f << "\n";
    }
  }
  f.close();
  auto c = synth::WordNetCorpus::Load(dir, 256);
  EXPECT_TRUE(c.ok()) << c.status();
  return std::make_shared<const synth::WordNetCorpus>(std::move(*c));
}

TEST(Task2Vec, ExperimentRunsOnWordNetTasks) {
  auto w = LlamaWeights::FromSeed(Tiny(), 5);
  ASSERT_TRUE(w.ok());
  YmirExperimentOptions o = SmallExperiment();
  o.wordnet = FixtureWordNet();
  o.tasks = {{"animal-plant", 2}, {"animal-plant@1", 2}, {"artifact-food", 2}};
  auto r1 = RunYmirEstimators(**w, o);
  ASSERT_TRUE(r1.ok()) << r1.status();
  EXPECT_EQ(r1->pairs.size(), 12u);
  auto r2 = RunYmirEstimators(**w, o);
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(r1->GainsCsv(), r2->GainsCsv());
  EXPECT_THAT(r1->GainsCsv(), testing::HasSubstr("\nanimal-plant,animal-plant@1,temporal,"));
  // Names are checked against the family in use, and its tasks have 2 classes.
  o.tasks = {{"animal-plant", 2}, {"fa-major", 2}, {"artifact-food", 2}};
  EXPECT_THAT(std::string(RunYmirEstimators(**w, o).status().message()), testing::HasSubstr("fa-major"));
  o.tasks = {{"animal-plant", 4}, {"animal-plant@1", 2}, {"artifact-food", 2}};
  EXPECT_THAT(std::string(RunYmirEstimators(**w, o).status().message()), testing::HasSubstr("has 2 classes, not 4"));
}

TEST(Task2Vec, ExperimentIsDeterministicAndConsistent) {
  auto w = LlamaWeights::FromSeed(Tiny(), 5);
  ASSERT_TRUE(w.ok());
  auto r1 = RunYmirEstimators(**w, SmallExperiment());
  auto r2 = RunYmirEstimators(**w, SmallExperiment());
  ASSERT_TRUE(r1.ok()) << r1.status();
  ASSERT_TRUE(r2.ok());
  // 3 x 2 temporal pairs, 3 spatial runs giving two gains each.
  ASSERT_EQ(r1->pairs.size(), 12u);
  EXPECT_EQ(r1->GainsCsv(), r2->GainsCsv());
  EXPECT_THAT(r1->GainsCsv(),
              testing::StartsWith("# gains-format: 2\n# gain-definition: speedup\n# gain-measure: steps\n"
                                  "task_a,task_b,mode,gain,gain_steps,steps_censored\nfa-major,fa-inv,temporal,"));
  for (const YmirPair& p : r1->pairs) {
    // Each row: the gain, the steps gain and its censoring (format 2).
    EXPECT_THAT(r1->GainsCsv(), testing::HasSubstr(absl::StrFormat("\n%s,%s,%s,%.6f,%.6f,%d\n", p.task_a, p.task_b,
                                                                   p.mode, p.gain, p.gain_steps, p.censored ? 1 : 0)));
    EXPECT_NEAR(p.gain, p.steps_normal / p.steps_transfer - 1.0, 1e-12);
    EXPECT_GT(p.steps_transfer, 0.0);
    EXPECT_LE(p.steps_transfer, 13);
    EXPECT_TRUE(std::isfinite(p.similarity));
  }
  // Spatial similarity is symmetric: the two rows of one joint run agree.
  for (const YmirPair& p : r1->pairs) {
    if (p.mode != "spatial") continue;
    for (const YmirPair& q : r1->pairs) {
      if (q.mode == "spatial" && q.task_a == p.task_b && q.task_b == p.task_a) {
        EXPECT_EQ(p.similarity, q.similarity);
      }
    }
  }
  ASSERT_EQ(r1->scores.size(), 3u);
  EXPECT_EQ(r1->scores[2].pairs, 12);
  EXPECT_THAT(r1->ToJson(), testing::HasSubstr("\"gain_mape_pct\""));
  // Everything but the wall time is deterministic.
  auto strip = [](const std::string& j) { return j.substr(0, j.rfind("\"seconds\"")); };
  EXPECT_EQ(strip(r1->ToJson()), strip(r2->ToJson()));
}

void CheckBestPairsBySteps(const YmirEstimatorReport& r);  // below

// The iteration estimator and the stop-loss as wired into the experiment.
TEST(Task2Vec, IterationEstimatorAndStopLossAreReported) {
  auto w = LlamaWeights::FromSeed(Tiny(), 5);
  ASSERT_TRUE(w.ok());
  const YmirExperimentOptions o = SmallExperiment();
  EXPECT_EQ(o.IterPrefixSteps(), 3);  // max(3, 0.4 x 6)
  auto r = RunYmirEstimators(**w, o);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->iteration_fits.size(), 3u);
  for (const YmirIterationFit& f : r->iteration_fits) {
    EXPECT_EQ(f.prefix_points, 4);  // steps 0..3, every step
    // The transient rule drops at most the first point here (3 steps stay).
    EXPECT_GE(f.fitted_points, 3);
    EXPECT_LE(f.fitted_points, f.prefix_points);
    EXPECT_EQ(f.fit_from_step, static_cast<double>(f.prefix_points - f.fitted_points));
    // Never before the fit's first point (0 is right for a task whose loss
    // only rises: its target is its initial loss).
    EXPECT_GE(f.predicted_steps, f.fit_from_step);
    EXPECT_GE(f.r, 0.0);
    EXPECT_GE(f.d, 0.0);
  }
  // The headline is the online estimate (iteration_estimator.h,
  // EstimateOnline): it says which steps it saw, from the first window P = 3
  // to the end of the normal run (6 steps), and the fixed-prefix figure at P
  // is reported beside it; each is the mean error of its own per-task
  // predictions.
  ASSERT_TRUE(o.iter_online);
  EXPECT_TRUE(r->iteration.online);
  EXPECT_FALSE(r->iteration_first_window.online);
  EXPECT_EQ(r->iteration_first_window.prefix_steps, 3);
  EXPECT_EQ(r->iteration_first_window.observed_steps_mean, 3.0);
  double online_err = 0, fixed_err = 0, seen = 0, seen_max = 0;
  int64_t plateaus = 0, online_beyond = 0, fixed_beyond = 0;
  // A prediction beyond the runs' limit (max_steps = 12 here) is scored as
  // censored, max_steps + 1, like a fit that never reaches the target.
  const double max_steps = static_cast<double>(o.max_steps_factor * o.normal_steps);
  auto scored_as = [&](double predicted, int64_t* beyond) {
    if (predicted <= max_steps) return predicted;
    if (predicted != max_steps + 1) ++*beyond;
    return max_steps + 1;
  };
  for (size_t i = 0; i < r->iteration_fits.size(); ++i) {
    const YmirIterationFit& f = r->iteration_fits[i];
    EXPECT_GE(f.observed_until, 3.0);
    EXPECT_LE(f.observed_until, 6.0);
    // Without a plateau the estimate is the first window's fit, seen at P.
    if (!f.plateau) {
      EXPECT_EQ(f.observed_until, 3.0);
      EXPECT_DOUBLE_EQ(f.online_predicted_steps, f.predicted_steps);
    }
    plateaus += f.plateau ? 1 : 0;
    seen += f.observed_until / 3.0;
    seen_max = std::max(seen_max, f.observed_until);
    online_err += 100.0 * std::abs(scored_as(f.online_predicted_steps, &online_beyond) - r->normal_steps[i]) /
                  r->normal_steps[i] / 3.0;
    fixed_err += 100.0 * std::abs(scored_as(f.predicted_steps, &fixed_beyond) - r->normal_steps[i]) /
                 r->normal_steps[i] / 3.0;
  }
  EXPECT_EQ(r->iteration.normal_beyond_limit, online_beyond);
  EXPECT_EQ(r->iteration_first_window.normal_beyond_limit, fixed_beyond);
  EXPECT_EQ(r->iteration.plateaus, plateaus);
  EXPECT_NEAR(r->iteration.observed_steps_mean, seen, 1e-9);
  EXPECT_EQ(r->iteration.observed_steps_max, seen_max);
  EXPECT_NEAR(r->iteration.normal_pct, online_err, 1e-9);
  EXPECT_NEAR(r->iteration_first_window.normal_pct, fixed_err, 1e-9);
  int64_t scored = 0, negative = 0;
  for (const YmirPair& p : r->pairs) {
    // The transfer prediction is the task's (online) normal prediction
    // through the gain.
    size_t dst = 0;
    while (r->tasks[dst] != p.task_b) ++dst;
    EXPECT_NEAR(p.predicted_steps_transfer,
                r->iteration_fits[dst].online_predicted_steps / (1.0 + std::max(-0.9, p.predicted_gain)),
                1e-9);
    scored += p.censored ? 0 : 1;
    negative += p.gain < 0 ? 1 : 0;
    // Decoupling never changes a temporal run; a kept pairing is unchanged.
    if (p.mode == "temporal" || p.stop_loss_decoupled == 0) {
      EXPECT_DOUBLE_EQ(p.steps_transfer_stop_loss, p.steps_transfer) << p.task_a << "->" << p.task_b;
    }
    if (p.stop_loss_decoupled > 0) {
      // 2 epochs of 4 steps: judged at the first evaluation at or after step 8.
      EXPECT_EQ(p.stop_loss_step, 8);
    }
  }
  EXPECT_EQ(r->iteration.transfer_pairs, scored);
  EXPECT_EQ(r->iteration.prefix_steps, 3);
  ASSERT_EQ(r->iteration_sweep.size(), 2u);  // 0.2 and 0.6 of 6 steps
  EXPECT_EQ(r->iteration_sweep[0].prefix_steps, 3);
  EXPECT_EQ(r->iteration_sweep[1].prefix_steps, 4);
  EXPECT_EQ(r->negative_pairs, negative);
  EXPECT_LE(r->negative_caught, r->negative_pairs);
  EXPECT_GE(r->negative_caught,
            std::max(r->negative_caught_by_estimator, r->negative_caught_by_stop_loss));
  EXPECT_GE(r->iteration.normal_max_pct, r->iteration.normal_pct);
  CheckBestPairsBySteps(*r);
  const std::string json = r->ToJson();
  for (const char* key : {"\"transfer_cls_accuracy\"", "\"iter_err_normal_pct\"",
                          "\"iter_err_transfer_pct\"", "\"best_pairs\"", "\"negative_caught\"",
                          "\"speedup_steps\"", "\"gain_mape_pct\"", "\"negative_pairs\"",
                          "\"steps_transfer_stop_loss\"", "\"fit_from_step\"", "\"fitted_points\"",
                          "\"iter_observed_steps_mean\"", "\"iteration_first_window\"", "\"observed_until\""}) {
    EXPECT_THAT(json, testing::HasSubstr(key));
  }
  YmirExperimentOptions bad = o;
  bad.iter_prefix_fraction = 0;
  EXPECT_THAT(std::string(RunYmirEstimators(**w, bad).status().message()),
              testing::HasSubstr("iter_prefix_fraction"));
  bad = o;
  bad.iter_plateau.min_points = 2;
  EXPECT_THAT(std::string(RunYmirEstimators(**w, bad).status().message()),
              testing::HasSubstr("min_points"));
}

// The transfer watch (task2vec.h, iteration_estimator.h's
// EstimateTransferOnline): with the fixed-prefix normal estimate (iter_online
// off), whose curves the report carries, every pair's watched estimate is
// EstimateTransferOnline of its transfer curve against its target task's
// fitted curve; the headline transfer error is theirs, the prior's beside it.
TEST(Task2Vec, TransferRunsAreWatchedAfterTheirFirstSteps) {
  auto w = LlamaWeights::FromSeed(Tiny(), 5);
  ASSERT_TRUE(w.ok());
  YmirExperimentOptions o = SmallExperiment();
  o.iter_online = false;
  o.iter_transfer_watch.watch = 4;
  o.iter_transfer_watch_sweep = {2, 6};
  auto r = RunYmirEstimators(**w, o);
  ASSERT_TRUE(r.ok()) << r.status();
  double watched_err = 0, prior_err = 0, watched_unreached = 0, prior_unreached = 0;
  int64_t scored = 0, reached = 0, unreached = 0, beyond = 0;
  for (const YmirPair& p : r->pairs) {
    size_t dst = 0;
    while (r->tasks[dst] != p.task_b) ++dst;
    const YmirIterationFit& f = r->iteration_fits[dst];
    const ymir::LossCurve normal{.r = f.r, .d = f.d, .b1 = f.b1, .b2 = f.b2, .scale = f.scale,
                                 .fit_from_step = f.fit_from_step};
    ASSERT_FALSE(p.curve.empty());
    EXPECT_EQ(p.curve.front().step, 0.0);
    const double prior_gain = std::max(-0.9, p.predicted_gain);
    const double censored = static_cast<double>(o.max_steps_factor * o.normal_steps + 1);
    // A fit that never reaches the target is no estimate: then only a run
    // that reached it within the watch has one, else the prior's.
    auto e = ymir::EstimateTransferOnline(f.unreachable == 0 ? std::optional(normal) : std::nullopt, p.curve,
                                          r->normal_target_loss[dst], prior_gain, o.iter_transfer_watch);
    ASSERT_TRUE(e.ok()) << e.status();
    const double expected = e->steps.value_or(censored / (1.0 + prior_gain));
    EXPECT_EQ(p.reached_in_watch, e->reached ? 1 : 0);
    EXPECT_NEAR(p.predicted_steps_transfer_watched, expected, 1e-9 * expected) << p.task_a << "->" << p.task_b;
    if (p.censored) continue;
    ++scored;
    reached += p.reached_in_watch;
    // Predictions beyond max_steps are scored as censored (max_steps + 1).
    auto scored_as = [&](double x) { return x <= censored - 1 ? x : censored; };
    if (p.predicted_steps_transfer_watched > censored - 1 && p.predicted_steps_transfer_watched != censored) ++beyond;
    const double w_err =
        100.0 * std::abs(scored_as(p.predicted_steps_transfer_watched) - p.steps_transfer) / p.steps_transfer;
    const double p_err = 100.0 * std::abs(scored_as(p.predicted_steps_transfer) - p.steps_transfer) / p.steps_transfer;
    watched_err += w_err;
    prior_err += p_err;
    if (p.reached_in_watch == 0) watched_unreached += w_err, prior_unreached += p_err, ++unreached;
  }
  ASSERT_GT(scored, 0);
  EXPECT_NEAR(r->iteration.transfer_pct, watched_err / static_cast<double>(scored), 1e-9);
  EXPECT_NEAR(r->iteration.transfer_prior_pct, prior_err / static_cast<double>(scored), 1e-9);
  EXPECT_EQ(r->iteration.watch_steps, 4.0);
  EXPECT_EQ(r->iteration.reached_in_watch, reached);
  EXPECT_EQ(r->iteration.transfer_beyond_limit, beyond);
  // The pairs not reached within the watch, apart.
  EXPECT_EQ(r->iteration.transfer_unreached_pairs, unreached);
  ASSERT_GT(unreached, 0);
  EXPECT_NEAR(r->iteration.transfer_unreached_pct, watched_unreached / static_cast<double>(unreached), 1e-9);
  EXPECT_NEAR(r->iteration.transfer_prior_unreached_pct, prior_unreached / static_cast<double>(unreached), 1e-9);
  // The other prefixes keep the prior (with iter_online off the first window
  // is the headline); the watch sweep has one block a watch.
  EXPECT_DOUBLE_EQ(r->iteration_first_window.transfer_pct, r->iteration.transfer_pct);
  ASSERT_FALSE(r->iteration_sweep.empty());
  EXPECT_DOUBLE_EQ(r->iteration_sweep[0].transfer_pct, r->iteration_sweep[0].transfer_prior_pct);
  ASSERT_EQ(r->transfer_watch_sweep.size(), 2u);
  EXPECT_EQ(r->transfer_watch_sweep[0].watch_steps, 2.0);
  EXPECT_EQ(r->transfer_watch_sweep[1].watch_steps, 6.0);
  EXPECT_DOUBLE_EQ(r->transfer_watch_sweep[1].transfer_prior_pct, r->iteration.transfer_prior_pct);
  const std::string json = r->ToJson();
  for (const char* key : {"\"iter_err_transfer_prior_pct\"", "\"iter_transfer_watch_steps\"",
                          "\"transfer_watch_sweep\"", "\"predicted_steps_transfer_watched\"",
                          "\"transfer_reached_in_watch\"", "\"iter_transfer_watch\"",
                          "\"iter_err_transfer_unreached_pct\"", "\"transfer_beyond_limit\"",
                          "\"iter_transfer_prior_points\"", "\"predictions_beyond_max_steps\""}) {
    EXPECT_THAT(json, testing::HasSubstr(key));
  }
  // Off: the headline is the prior, no sweep.
  o.iter_transfer_online = false;
  auto off = RunYmirEstimators(**w, o);
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_DOUBLE_EQ(off->iteration.transfer_pct, r->iteration.transfer_prior_pct);
  EXPECT_DOUBLE_EQ(off->iteration.transfer_prior_pct, r->iteration.transfer_prior_pct);
  EXPECT_EQ(off->iteration.watch_steps, 0.0);
  EXPECT_TRUE(off->transfer_watch_sweep.empty());
  // Bad watches are named.
  YmirExperimentOptions bad = SmallExperiment();
  bad.iter_transfer_watch.watch = 1;  // below eval_every (2)
  EXPECT_THAT(std::string(RunYmirEstimators(**w, bad).status().message()),
              testing::HasSubstr("transfer watch"));
  bad = SmallExperiment();
  bad.iter_transfer_watch_sweep = {4, 0.5};
  EXPECT_THAT(std::string(RunYmirEstimators(**w, bad).status().message()),
              testing::HasSubstr("got 0.5"));
  bad = SmallExperiment();
  bad.iter_transfer_watch.min_speedup = 0;
  EXPECT_THAT(std::string(RunYmirEstimators(**w, bad).status().message()),
              testing::HasSubstr("min_speedup"));
  bad = SmallExperiment();
  bad.iter_transfer_watch.prior_points = -1;
  EXPECT_THAT(std::string(RunYmirEstimators(**w, bad).status().message()),
              testing::HasSubstr("--iter-transfer-prior-points"));
}

// A clock that advances by 1 ms at every reading: the profiler's entries are
// then exactly the clock's ticks per timed iteration.
class TickingClock final : public Clock {
 public:
  Timestamp Now() const override {
    return Timestamp::Epoch() + Duration::Millis(ticks_.fetch_add(1) + 1);
  }

 private:
  mutable std::atomic<int64_t> ticks_{0};
};

TEST(LutProfile, ProfilesEveryKeyOfTheGrid) {
  auto w = LlamaWeights::FromSeed(Tiny(), 5);
  ASSERT_TRUE(w.ok());
  LutProfileOptions o;
  EXPECT_EQ(o.amp, (std::vector<int64_t>{0, 1}));  // both profiled by default
  EXPECT_EQ(o.grad_checkpoint, (std::vector<int64_t>{0, 1}));
  o.devices = {1, 2};
  o.grad_accum = {1};
  o.local_batch = {2, 4};
  o.frozen_layers = {0, 1};
  o.warmup = 0;
  o.iterations = 1;
  TickingClock clock;
  auto lut = ProfileTimeLut(**w, o, clock);
  ASSERT_TRUE(lut.ok()) << lut.status();
  EXPECT_EQ(lut->entries().size(), 64u);  // 2 x 2 x 2 x 1 x 2 x 2 x 2 (both device counts divide 4 layers)
  int amp = 0, ckpt = 0, pipeline = 0;
  for (const auto& [key, e] : lut->entries()) {
    EXPECT_NEAR(e.seconds, 0.001, 1e-12) << key.ToString();  // one tick per iteration
    EXPECT_EQ(e.samples, 1);
    amp += key.amp ? 1 : 0;
    ckpt += key.grad_checkpoint ? 1 : 0;
    pipeline += key.parallelism == ymir::Parallelism::kPipeline ? 1 : 0;
  }
  EXPECT_EQ(amp, 32);
  EXPECT_EQ(ckpt, 32);
  EXPECT_EQ(pipeline, 32);
  auto mid = lut->Lookup({.devices = 1, .grad_accum = 1, .local_batch = 3});
  ASSERT_TRUE(mid.ok()) << mid.status();
  EXPECT_TRUE(mid->interpolated);
  // AMP and checkpointing keys interpolate among their own kind only.
  auto mid_amp = lut->Lookup({.devices = 1, .grad_accum = 1, .local_batch = 3, .amp = true, .grad_checkpoint = true});
  ASSERT_TRUE(mid_amp.ok()) << mid_amp.status();
  EXPECT_TRUE(mid_amp->interpolated);
  for (const ymir::LutKey& k : mid_amp->source) {
    EXPECT_TRUE(k.amp && k.grad_checkpoint) << k.ToString();
  }
  // Pipeline keys are measured, and interpolate among pipeline keys only.
  auto pp = lut->Lookup({.devices = 2, .grad_accum = 1, .local_batch = 3, .parallelism = ymir::Parallelism::kPipeline});
  ASSERT_TRUE(pp.ok()) << pp.status();
  EXPECT_TRUE(pp->interpolated);
  for (const ymir::LutKey& k : pp->source) EXPECT_EQ(k.parallelism, ymir::Parallelism::kPipeline) << k.ToString();
  // A pipeline over a device count that does not divide the layers is skipped.
  o.devices = {3};
  o.parallelism = {ymir::Parallelism::kData, ymir::Parallelism::kPipeline};
  auto three = ProfileTimeLut(**w, o, clock);
  ASSERT_TRUE(three.ok()) << three.status();
  for (const auto& [key, e] : three->entries()) EXPECT_EQ(key.parallelism, ymir::Parallelism::kData) << key.ToString();
  EXPECT_EQ(three->entries().size(), 16u);
  // Only the listed values are profiled.
  o.parallelism = {ymir::Parallelism::kData};
  o.amp = {1};
  o.grad_checkpoint = {0};
  o.devices = {1};
  o.frozen_layers = {0};
  auto only = ProfileTimeLut(**w, o, clock);
  ASSERT_TRUE(only.ok()) << only.status();
  ASSERT_EQ(only->entries().size(), 2u);
  for (const auto& [key, e] : only->entries()) EXPECT_TRUE(key.amp && !key.grad_checkpoint) << key.ToString();
  o.parallelism = {};
  EXPECT_THAT(std::string(ProfileTimeLut(**w, o, clock).status().message()),
              testing::HasSubstr("parallelism needs data and/or pipeline"));
  o.parallelism = {ymir::Parallelism::kData};
  o.amp = {0, 2};
  EXPECT_THAT(std::string(ProfileTimeLut(**w, o, clock).status().message()),
              testing::HasSubstr("amp values must be 0 or 1, got '2'"));
  o.amp = {0};
  o.grad_checkpoint = {};
  EXPECT_THAT(std::string(ProfileTimeLut(**w, o, clock).status().message()),
              testing::HasSubstr("grad_checkpoint needs a value"));
  o.grad_checkpoint = {0};
  o.frozen_layers = {Tiny().layers};
  EXPECT_THAT(std::string(ProfileTimeLut(**w, o, clock).status().message()),
              testing::HasSubstr("frozen_layers"));
}

bool SameValues(const TaskAdapters& a, const TaskAdapters& b) {
  const auto na = a.NamedTensors(), nb = b.NamedTensors();
  if (na.size() != nb.size()) return false;
  for (size_t i = 0; i < na.size(); ++i) {
    if (na[i].first != nb[i].first || na[i].second.ToFloat() != nb[i].second.ToFloat()) return false;
  }
  return true;
}

// Gradient checkpointing in the profiler (lut_profile.h): the group forwards
// are run again before their backward and at most one group's activations
// are alive, yet every gradient is bit-identical to keeping them all; frozen
// bottom layers get no gradient (and no recomputation) either way.
TEST(LutProfile, GradientCheckpointingRecomputesAndGivesTheSameGradients) {
  auto w = LlamaWeights::FromSeed(Tiny(), 5);
  ASSERT_TRUE(w.ok());
  auto base = (*w)->WithFusion(1);
  ASSERT_TRUE(base.ok());
  const int64_t layers = Tiny().layers;
  ASSERT_EQ((*base)->num_groups(), layers);
  auto st = TaskState::Init(Tiny(), LoraConfig{.rank = 4, .alpha = 8.0}, 2, 3);
  ASSERT_TRUE(st.ok());
  // Adapters away from their zero init, so every layer's gradient is nonzero.
  TrainBatch batch;
  {
    std::vector<int64_t> tokens, labels;
    for (int64_t r = 0; r < 3; ++r) {
      for (int64_t s = 0; s < 6; ++s) {
        tokens.push_back((r * 31 + s * 7) % Tiny().vocab);
        labels.push_back(s == 5 ? r % 2 : -1);
      }
    }
    batch.tokens = Tensor::FromInt64(tokens, {3, 6});
    batch.labels = Tensor::FromInt64(labels, {3, 6});
  }
  for (int i = 0; i < 2; ++i) {
    auto g = ComputeLutDeviceGradients(**base, st->params, batch, 0, false);
    ASSERT_TRUE(g.ok()) << g.status();
    ASSERT_TRUE(AccumulateGradients(*st, g->grads).ok());
    ASSERT_TRUE(AdamWStep(*st).ok());
  }
  for (int64_t frozen : {int64_t{0}, int64_t{1}}) {
    auto kept = ComputeLutDeviceGradients(**base, st->params, batch, frozen, false);
    auto ckpt = ComputeLutDeviceGradients(**base, st->params, batch, frozen, true);
    ASSERT_TRUE(kept.ok()) << kept.status();
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();
    EXPECT_TRUE(SameValues(kept->grads, ckpt->grads)) << "frozen " << frozen;
    EXPECT_EQ(kept->group_forwards, layers);
    EXPECT_EQ(ckpt->group_forwards, layers + (layers - frozen));
    EXPECT_EQ(kept->max_live_tapes, layers - frozen);
    EXPECT_EQ(ckpt->max_live_tapes, 1);
    for (int64_t l = 0; l < layers; ++l) {
      const std::vector<float> q = ckpt->grads.layers[static_cast<size_t>(l)].q_b.ToFloat();
      const bool any = std::any_of(q.begin(), q.end(), [](float x) { return x != 0.f; });
      EXPECT_EQ(any, l >= frozen) << "layer " << l << ", frozen " << frozen;
    }
  }
  EXPECT_THAT(std::string(ComputeLutDeviceGradients(**w, st->params, batch, 0, true).status().message()),
              testing::HasSubstr("fusion 1"));
}

// Pipeline parallelism in the profiler: 2 and 4 stages (threads over
// consecutive layers, GPipe), with and without frozen layers and
// checkpointing, give every micro-batch exactly the gradient one device
// computes for it; a stage count that does not divide the layers is refused.
TEST(LutProfile, PipelineStagesGiveEachMicroBatchItsOwnGradient) {
  SetIntraOpThreadsForThisThread(1);  // the stages' setting, for bit-identical sums
  auto w = LlamaWeights::FromSeed(Tiny(), 5);
  ASSERT_TRUE(w.ok());
  auto base = (*w)->WithFusion(1);
  ASSERT_TRUE(base.ok());
  auto st = TaskState::Init(Tiny(), LoraConfig{.rank = 4, .alpha = 8.0}, 2, 3);
  ASSERT_TRUE(st.ok());
  std::vector<TrainBatch> micro;
  for (int64_t m = 0; m < 3; ++m) {
    std::vector<int64_t> tokens, labels;
    for (int64_t r = 0; r < 2; ++r) {
      for (int64_t s = 0; s < 5; ++s) {
        tokens.push_back((m * 53 + r * 31 + s * 7) % Tiny().vocab);
        labels.push_back(s == 4 ? (m + r) % 2 : -1);
      }
    }
    TrainBatch b;
    b.tokens = Tensor::FromInt64(tokens, {2, 5});
    b.labels = Tensor::FromInt64(labels, {2, 5});
    micro.push_back(b);
  }
  // Adapters away from their zero init (every layer then has a gradient).
  for (int i = 0; i < 2; ++i) {
    auto g = ComputeLutDeviceGradients(**base, st->params, micro[0], 0, false);
    ASSERT_TRUE(g.ok()) << g.status();
    ASSERT_TRUE(AccumulateGradients(*st, g->grads).ok());
    ASSERT_TRUE(AdamWStep(*st).ok());
  }
  for (int64_t stages : {int64_t{2}, int64_t{4}}) {
    for (int64_t frozen : {int64_t{0}, int64_t{1}, int64_t{2}}) {
      for (bool ckpt : {false, true}) {
        auto pp = ComputeLutPipelineGradients(**base, st->params, micro, stages, frozen, ckpt);
        ASSERT_TRUE(pp.ok()) << pp.status();
        ASSERT_EQ(pp->size(), micro.size());
        for (size_t m = 0; m < micro.size(); ++m) {
          auto one = ComputeLutDeviceGradients(**base, st->params, micro[m], frozen, false);
          ASSERT_TRUE(one.ok()) << one.status();
          EXPECT_TRUE(SameValues((*pp)[m], one->grads))
              << "stages " << stages << " frozen " << frozen << " ckpt " << ckpt << " micro-batch " << m;
        }
      }
    }
  }
  EXPECT_THAT(std::string(ComputeLutPipelineGradients(**base, st->params, micro, 3, 0, false).status().message()),
              testing::HasSubstr("pipeline parallelism over 3 devices needs a device count that divides the "
                                 "backbone's 4 layers"));
  EXPECT_THAT(std::string(ComputeLutPipelineGradients(**base, st->params, {}, 2, 0, false).status().message()),
              testing::HasSubstr("needs micro-batches"));
}

// AMP in the profiler: the bf16 copy of the backbone (LlamaWeights::WithDType)
// holds every parameter rounded to the nearest bf16 (ties to even), converts
// back to f32 exactly, and trains: its gradients are near the f32 ones but
// not the same (the backbone really runs in bf16).
TEST(LutProfile, AmpRunsTheBackboneInBf16) {
  auto w = LlamaWeights::FromSeed(Tiny(), 5);
  ASSERT_TRUE(w.ok());
  ASSERT_EQ((*w)->dims().dtype, DType::kF32);
  auto bf = (*w)->WithDType(DType::kBF16);
  ASSERT_TRUE(bf.ok()) << bf.status();
  EXPECT_EQ((*bf)->dims().dtype, DType::kBF16);
  auto rne = [](float f) {
    uint32_t u = 0;
    std::memcpy(&u, &f, sizeof u);
    u = ((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16) << 16;
    float out = 0;
    std::memcpy(&out, &u, sizeof out);
    return out;
  };
  const auto f32_named = (*w)->NamedTensors(), bf_named = (*bf)->NamedTensors();
  ASSERT_EQ(f32_named.size(), bf_named.size());
  int64_t rounded = 0;
  for (size_t i = 0; i < f32_named.size(); ++i) {
    EXPECT_EQ(bf_named[i].second.dtype(), DType::kBF16) << bf_named[i].first;
    const std::vector<float> a = f32_named[i].second.ToFloat(), b = bf_named[i].second.ToFloat();
    ASSERT_EQ(a.size(), b.size());
    for (size_t k = 0; k < a.size(); ++k) {
      ASSERT_EQ(b[k], rne(a[k])) << bf_named[i].first << "[" << k << "]";
      rounded += a[k] != b[k] ? 1 : 0;
    }
  }
  EXPECT_GT(rounded, 0);
  auto back = (*bf)->WithDType(DType::kF32);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ((*back)->dims().dtype, DType::kF32);
  const auto back_named = (*back)->NamedTensors();
  for (size_t i = 0; i < back_named.size(); ++i) {
    EXPECT_EQ(back_named[i].second.dtype(), DType::kF32);
    EXPECT_EQ(back_named[i].second.ToFloat(), bf_named[i].second.ToFloat()) << back_named[i].first;
  }
  EXPECT_THAT(std::string((*w)->WithDType(DType::kF16).status().message()),
              testing::HasSubstr("f16 is not supported (f32 or bf16)"));

  auto f1 = (*w)->WithFusion(1);
  auto b1 = (*bf)->WithFusion(1);
  ASSERT_TRUE(f1.ok() && b1.ok());
  auto st = TaskState::Init(Tiny(), LoraConfig{.rank = 4, .alpha = 8.0}, 2, 3);
  ASSERT_TRUE(st.ok());
  TrainBatch batch;
  batch.tokens = Tensor::FromInt64(std::vector<int64_t>{1, 5, 9, 13, 17, 21, 2, 6, 10, 14, 18, 22}, {2, 6});
  batch.labels = Tensor::FromInt64(std::vector<int64_t>{-1, -1, -1, -1, -1, 1, -1, -1, -1, -1, -1, 0}, {2, 6});
  auto gf = ComputeLutDeviceGradients(**f1, st->params, batch, 0, false);
  auto gb = ComputeLutDeviceGradients(**b1, st->params, batch, 0, false);
  ASSERT_TRUE(gf.ok()) << gf.status();
  ASSERT_TRUE(gb.ok()) << gb.status();
  EXPECT_EQ(gb->grads.head.dtype(), DType::kF32);  // f32 master state
  const double scale = gf->grads.head.MaxAbsDiff(Tensor::FromFloat(std::vector<float>(
                                                     static_cast<size_t>(gf->grads.head.numel()), 0.f),
                                                 gf->grads.head.shape()));
  const double diff = gb->grads.head.MaxAbsDiff(gf->grads.head);
  EXPECT_GT(diff, 0.0);
  EXPECT_LT(diff, 0.05 * scale);
}

TEST(Task2Vec, RepeatsAverageTheStepsOfIndependentSeeds) {
  auto w = LlamaWeights::FromSeed(Tiny(), 5);
  ASSERT_TRUE(w.ok());
  YmirExperimentOptions o = SmallExperiment();
  auto one = RunYmirEstimators(**w, o);
  o.seed += 1000;
  auto other = RunYmirEstimators(**w, o);
  o.seed -= 1000;
  o.repeats = 2;
  auto both = RunYmirEstimators(**w, o);
  ASSERT_TRUE(one.ok() && other.ok() && both.ok()) << both.status();
  ASSERT_EQ(both->pairs.size(), one->pairs.size());
  for (size_t k = 0; k < both->pairs.size(); ++k) {
    const YmirPair &p = both->pairs[k], &a = one->pairs[k], &b = other->pairs[k];
    EXPECT_NEAR(p.steps_transfer, 0.5 * (a.steps_transfer + b.steps_transfer), 1e-9);
    EXPECT_NEAR(p.steps_normal, 0.5 * (a.steps_normal + b.steps_normal), 1e-9);
    EXPECT_EQ(p.similarity, a.similarity);  // embeddings from repeat 0
  }
}

TEST(Task2Vec, ZeroHeadStartsUniformAndTheWarmUpRampsTheLearningRate) {
  auto w = LlamaWeights::FromSeed(Tiny(), 5);
  ASSERT_TRUE(w.ok());
  YmirExperimentOptions o = SmallExperiment();
  o.tasks = {{"fa-major", 2}, {"fa-bins", 3}, {"last-class", 4}};
  o.zero_head = true;
  o.lr_warmup_steps = 0;
  auto plain = RunYmirEstimators(**w, o);
  o.lr_warmup_steps = 1000;  // the first step runs at lr / 1000
  auto warm = RunYmirEstimators(**w, o);
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_TRUE(warm.ok()) << warm.status();
  for (size_t i = 0; i < o.tasks.size(); ++i) {
    // A zero head predicts the uniform distribution: loss ln C exactly.
    const double uniform = std::log(static_cast<double>(o.tasks[i].num_classes));
    EXPECT_NEAR(plain->normal_initial_loss[i], uniform, 1e-5) << o.tasks[i].name;
    EXPECT_NEAR(warm->normal_initial_loss[i], uniform, 1e-5) << o.tasks[i].name;
    // Step 1 (evaluated: it is in the estimator's prefix) moves far less
    // under the warm-up.
    ASSERT_GE(plain->normal_curves[i].size(), 2u);
    ASSERT_EQ(plain->normal_curves[i][1].step, 1.0);
    const double moved = std::abs(plain->normal_curves[i][1].loss - uniform);
    const double moved_warm = std::abs(warm->normal_curves[i][1].loss - uniform);
    EXPECT_GT(moved, 1e-4) << o.tasks[i].name;
    EXPECT_LT(moved_warm, 0.1 * moved) << o.tasks[i].name;
  }
  o.lr_warmup_steps = -1;
  EXPECT_THAT(std::string(RunYmirEstimators(**w, o).status().message()),
              testing::HasSubstr("lr_warmup_steps must be >= 0, got -1"));
}

// --curves-only: the normal runs of the full experiment, nothing else; the
// graded family (data salts, label margin) runs through it.
TEST(Task2Vec, CurvesOnlyGivesTheFullRunsNormalCurves) {
  auto w = LlamaWeights::FromSeed(Tiny(), 5);
  ASSERT_TRUE(w.ok());
  YmirExperimentOptions o = SmallExperiment();
  o.tasks = {{"fa-bins", 4}, {"fa-bins@1", 4}, {"fb-bins", 4}};
  o.sequence_length = 16;
  o.label_margin = 1;
  o.zero_head = true;
  auto full = RunYmirEstimators(**w, o);
  o.curves_only = true;
  auto curves = RunYmirEstimators(**w, o);
  ASSERT_TRUE(full.ok()) << full.status();
  ASSERT_TRUE(curves.ok()) << curves.status();
  EXPECT_EQ(full->pairs.size(), 12u);
  EXPECT_TRUE(curves->pairs.empty());
  EXPECT_TRUE(curves->scores.empty());
  EXPECT_LT(curves->train_steps, full->train_steps);
  ASSERT_EQ(curves->normal_curves.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_EQ(curves->normal_curves[i].size(), full->normal_curves[i].size());
    for (size_t k = 0; k < curves->normal_curves[i].size(); ++k) {
      EXPECT_EQ(curves->normal_curves[i][k].loss, full->normal_curves[i][k].loss);
    }
    EXPECT_EQ(curves->normal_target_loss[i], full->normal_target_loss[i]);
    EXPECT_EQ(curves->normal_steps[i], full->normal_steps[i]);
  }
  // The same rule on other sentences: a different curve.
  EXPECT_NE(curves->normal_curves[0].back().loss, curves->normal_curves[1].back().loss);
  EXPECT_THAT(curves->ToJson(), testing::HasSubstr("\"curve\""));
}

// The area gain inverts a time rescaling of the reference: a transfer curve
// T(t) = N(s t) gives back s from the window's mean alone.
TEST(Task2Vec, AreaSpeedupRecoversATimeRescaling) {
  auto n = [](double t) { return 0.5 + 1.0 / (1.0 + 0.2 * t); };
  std::vector<ymir::LossPoint> reference;
  for (int t = 0; t <= 80; ++t) reference.push_back({static_cast<double>(t), n(t)});
  const std::vector<double> window = {4, 8, 12, 16, 20};
  for (double s : {0.25, 0.5, 1.0, 2.0, 3.5}) {
    double mean = 0;
    for (double t : window) mean += n(s * t) / static_cast<double>(window.size());
    bool clamped = true;
    EXPECT_NEAR(AreaEquivalentSpeedup(reference, window, mean, 0.1, 4.0, &clamped), s, 1e-3 * s) << s;
    EXPECT_FALSE(clamped);
  }
  // Bumps of a wandering reference are pooled (isotonic), so the answer
  // stays the one of the trend: add +-0.02 alternating noise to the reference.
  std::vector<ymir::LossPoint> noisy = reference;
  for (size_t k = 0; k < noisy.size(); ++k) noisy[k].loss += (k % 2 == 0 ? 0.02 : -0.02);
  double mean = 0;
  for (double t : window) mean += n(2.0 * t) / static_cast<double>(window.size());
  EXPECT_NEAR(AreaEquivalentSpeedup(noisy, window, mean, 0.1, 4.0, nullptr), 2.0, 0.15);
  // Beyond the range: clamped at the bounds.
  bool clamped = false;
  EXPECT_EQ(AreaEquivalentSpeedup(reference, window, 2.0, 0.1, 4.0, &clamped), 0.1);
  EXPECT_TRUE(clamped);
  EXPECT_EQ(AreaEquivalentSpeedup(reference, window, 0.4, 0.1, 4.0, &clamped), 4.0);
  EXPECT_TRUE(clamped);
}

// The best pairs by the measured speed-up in steps to target (the
// acceptance's field, "best_pairs_steps"), whatever the gain measure: the
// largest steps_normal / steps_transfer first, no other pair above the last,
// printed with the steps speed-up and, beside it, the measured gain's.
void CheckBestPairsBySteps(const YmirEstimatorReport& r) {
  const std::vector<size_t> best = r.BestPairsBySteps(3);
  ASSERT_EQ(best.size(), std::min<size_t>(3, r.pairs.size()));
  ASSERT_FALSE(best.empty());
  for (size_t k = 0; k < best.size(); ++k) {
    const YmirPair& p = r.pairs[best[k]];
    EXPECT_NEAR(1.0 + p.gain_steps, p.steps_normal / p.steps_transfer, 1e-12);
    if (k > 0) {
      EXPECT_LE(p.gain_steps, r.pairs[best[k - 1]].gain_steps);
    }
  }
  for (size_t i = 0; i < r.pairs.size(); ++i) {
    if (std::find(best.begin(), best.end(), i) == best.end()) {
      EXPECT_LE(r.pairs[i].gain_steps, r.pairs[best.back()].gain_steps);
    }
  }
  EXPECT_EQ(r.BestPairsBySteps(1000).size(), r.pairs.size());
  const YmirPair& top = r.pairs[best[0]];
  EXPECT_THAT(r.ToJson(), testing::HasSubstr(absl::StrFormat(
                              "\"best_pairs_steps\": [{\"a\": \"%s\", \"b\": \"%s\", \"mode\": \"%s\", "
                              "\"steps_normal\": %.2f, \"steps_transfer\": %.2f, \"censored\": %s, "
                              "\"speedup_steps\": %.3f, \"speedup\": %.3f}",
                              top.task_a, top.task_b, top.mode, top.steps_normal, top.steps_transfer,
                              top.censored ? "true" : "false", 1.0 + top.gain_steps, 1.0 + top.gain)));
}

// --gain area and --probe head, wired into the experiment.
TEST(Task2Vec, AreaGainAndHeadProbeAreWired) {
  auto w = LlamaWeights::FromSeed(Tiny(), 5);
  ASSERT_TRUE(w.ok());
  YmirExperimentOptions o = SmallExperiment();
  o.probe = YmirProbe::kTrained;
  auto steps = RunYmirEstimators(**w, o);
  // The probe changes the similarities only: the measured gains (and so a
  // gains CSV such as configs/ymir/gains_synth.csv) are the same.
  o.probe = YmirProbe::kHead;
  auto head = RunYmirEstimators(**w, o);
  ASSERT_TRUE(head.ok()) << head.status();
  ASSERT_TRUE(steps.ok()) << steps.status();
  EXPECT_EQ(head->GainsCsv(), steps->GainsCsv());
  o.gain_measure = YmirGainMeasure::kArea;
  o.gain_window = 4;
  o.probe = YmirProbe::kHead;
  auto area = RunYmirEstimators(**w, o);
  ASSERT_TRUE(steps.ok()) << steps.status();
  ASSERT_TRUE(area.ok()) << area.status();
  ASSERT_EQ(area->pairs.size(), steps->pairs.size());
  bool some_differ = false, some_similarity_differs = false;
  for (size_t k = 0; k < area->pairs.size(); ++k) {
    const YmirPair &a = area->pairs[k], &s = steps->pairs[k];
    // The steps gain is still reported beside the area gain.
    EXPECT_NEAR(a.gain_steps, a.steps_normal / a.steps_transfer - 1.0, 1e-12);
    EXPECT_NEAR(s.gain, s.gain_steps, 0.0);
    // Speed-up within [0.1, max_steps / W] = [0.1, 3].
    EXPECT_GE(a.gain, 0.1 - 1.0 - 1e-12);
    EXPECT_LE(a.gain, 3.0 - 1.0 + 1e-12);
    some_differ = some_differ || std::abs(a.gain - a.gain_steps) > 1e-6;
    EXPECT_TRUE(std::isfinite(a.similarity));
    some_similarity_differs = some_similarity_differs || a.similarity != s.similarity;
  }
  EXPECT_TRUE(some_differ);
  EXPECT_TRUE(some_similarity_differs);  // the head probe's embeddings are other ones
  // Under the area gain the best pairs by steps to target are still ranked
  // and printed by the steps speed-up.
  CheckBestPairsBySteps(*area);
  CheckBestPairsBySteps(*steps);
  // The area gain does not change the normal runs' targets or steps.
  EXPECT_EQ(area->normal_steps, steps->normal_steps);
  EXPECT_EQ(area->normal_target_loss, steps->normal_target_loss);
  EXPECT_THAT(area->ToJson(), testing::HasSubstr("\"probe\": \"head\", \"fisher_examples\": 4, "
                                                 "\"fisher\": \"empirical\", \"embed\": \"lora\", "
                                                 "\"distance\": \"normalised\", \"null_runs\": 2, "
                                                 "\"band_k\": 2, \"gain_measure\": \"area\", \"gain_window\": 4"));
  o.gain_window = 3;  // not a multiple of eval_every (2)
  EXPECT_THAT(std::string(RunYmirEstimators(**w, o).status().message()),
              testing::HasSubstr("window (slicesim --gain-window) must be a positive multiple of eval_every (2) "
                                 "below max_steps (12), got 3"));
}

// The Fisher of a constructed gradient, in the coordinates of each embedding.
TEST(Task2Vec, FisherCoordinatesOfAConstructedGradient) {
  TaskAdapters g;
  g.layers.push_back(LoraLayer{.q_a = Tensor::FromFloat(std::vector<float>{1, 2}, {1, 2}),
                               .q_b = Tensor::FromFloat(std::vector<float>{3, 0}, {2, 1}),
                               .v_a = Tensor::FromFloat(std::vector<float>{0, 1}, {1, 2}),
                               .v_b = Tensor::FromFloat(std::vector<float>{2}, {1, 1})});
  g.head = Tensor::FromFloat(std::vector<float>{1, 2, 3, 4}, {2, 2});  // [outputs 2, hidden 2]
  std::vector<double> lora, both;
  ASSERT_TRUE(AddFisher(g, 0.5, YmirEmbedParams::kLora, lora).ok());
  EXPECT_THAT(lora, testing::ElementsAre(0.5, 2, 4.5, 0, 0, 0.5, 2));
  ASSERT_TRUE(AddFisher(g, 1.0, YmirEmbedParams::kLora, lora).ok());  // accumulates
  EXPECT_THAT(lora, testing::ElementsAre(1.5, 6, 13.5, 0, 0, 1.5, 6));
  // The head summed over its outputs per hidden unit: 1 + 9, 4 + 16.
  ASSERT_TRUE(AddFisher(g, 0.5, YmirEmbedParams::kLoraHead, both).ok());
  EXPECT_THAT(both, testing::ElementsAre(0.5, 2, 4.5, 0, 0, 0.5, 2, 5, 10));
  // Another coordinate count is named, not mixed in.
  const absl::Status bad = AddFisher(g, 1.0, YmirEmbedParams::kLoraHead, lora);
  EXPECT_THAT(std::string(bad.message()), testing::HasSubstr("9 embedding coordinates, the Fisher 7"));
  EXPECT_THAT(lora, testing::ElementsAre(1.5, 6, 13.5, 0, 0, 1.5, 6));
  // Plain cosine distance against Task2Vec's normalised one.
  const std::vector<double> a = {1, 2, 3, 4}, c = {4, 3, 2, 1};
  EXPECT_NEAR(SymmetricDistance(a, c, YmirDistance::kCosine), 1.0 - 20.0 / 30.0, 1e-12);
  EXPECT_NEAR(SymmetricDistance({1, 0}, {0, 1}, YmirDistance::kCosine), 1.0, 1e-12);
  EXPECT_NEAR(SymmetricDistance(a, {2, 4, 6, 8}, YmirDistance::kCosine), 0.0, 1e-12);
  // {1, 1} against {1, 3}: cosine 4 / sqrt(20); normalised {1/2, 1/4} against {1/2, 3/4}.
  EXPECT_NEAR(SymmetricDistance({1, 1}, {1, 3}, YmirDistance::kCosine), 1.0 - 4.0 / std::sqrt(20.0), 1e-12);
  EXPECT_NEAR(SymmetricDistance({1, 1}, {1, 3}),
              1.0 - (0.25 + 0.1875) / std::sqrt((0.25 + 0.0625) * (0.25 + 0.5625)), 1e-12);
  EXPECT_NEAR(AsymmetricDistance(c, a, {2, 4, 6, 8}, 0.5, YmirDistance::kCosine),
              SymmetricDistance(a, c, YmirDistance::kCosine) -
                  0.5 * SymmetricDistance(c, a, YmirDistance::kCosine),
              1e-12);
}

// The neutral band and the sign scores on constructed gains.
TEST(Task2Vec, NeutralBandSetsPairsApart) {
  // RMS of the null gains sqrt((0.01 + 0.01 + 0.04 + 0.04) / 4) = 0.1581.
  const double band = NeutralBand({0.1, -0.1, 0.2, -0.2}, 2.0);
  EXPECT_NEAR(band, 2.0 * std::sqrt(0.025), 1e-12);
  EXPECT_EQ(NeutralBand({}, 2.0), 0.0);
  const std::vector<double> measured = {1.0, -0.5, 0.1, -0.2, 0.4};
  const std::vector<double> predicted = {0.5, 0.3, -0.1, 0.2, 0.1};
  const SignScore s = ScoreSigns(predicted, measured, band);
  EXPECT_EQ(s.pairs, 5);
  EXPECT_EQ(s.neutral, 2);  // 0.1 and -0.2 lie inside +-0.316
  EXPECT_DOUBLE_EQ(s.AccuracyPct(), 40.0);           // 1.0 and 0.4 of 5
  EXPECT_DOUBLE_EQ(s.MajorityPct(), 60.0);           // 3 of 5 positive
  EXPECT_NEAR(s.NonNeutralAccuracyPct(), 200.0 / 3.0, 1e-12);  // 1.0 and 0.4 of 1.0, -0.5, 0.4
  EXPECT_NEAR(s.NonNeutralMajorityPct(), 200.0 / 3.0, 1e-12);
  // Three classes by the same band (+-0.316): measured +, -, 0, 0, +;
  // predicted +, 0, 0, 0, 0: agree on 1.0, 0.1, -0.2 (3 of 5); the most
  // common measured class (positive or neutral) is 2 of 5.
  EXPECT_EQ(s.three_way_agree, 3);
  EXPECT_DOUBLE_EQ(s.ThreeWayAccuracyPct(), 60.0);
  EXPECT_DOUBLE_EQ(s.ThreeWayMajorityPct(), 40.0);
  // No band: every pair is scored by its sign.
  const SignScore none = ScoreSigns(predicted, measured, 0.0);
  EXPECT_EQ(none.neutral, 0);
  EXPECT_DOUBLE_EQ(none.NonNeutralAccuracyPct(), none.AccuracyPct());
  EXPECT_EQ(none.three_way_agree, none.agree);  // no band, no neutral class: the sign agreement
  // Every pair neutral: no non-neutral accuracy to report.
  EXPECT_EQ(ScoreSigns(predicted, measured, 5.0).NonNeutralAccuracyPct(), 0.0);
}

// --similarities-only computes the full run's similarity matrix and nothing
// else; the null runs give the band the scores use.
TEST(Task2Vec, SimilaritiesOnlyAndTheNeutralBandAreWired) {
  auto w = LlamaWeights::FromSeed(Tiny(), 5);
  ASSERT_TRUE(w.ok());
  YmirExperimentOptions o = SmallExperiment();
  auto full = RunYmirEstimators(**w, o);
  ASSERT_TRUE(full.ok()) << full.status();
  o.similarities_only = true;
  auto sim = RunYmirEstimators(**w, o);
  ASSERT_TRUE(sim.ok()) << sim.status();
  EXPECT_TRUE(sim->pairs.empty());
  EXPECT_TRUE(sim->null_runs.empty());
  EXPECT_LT(sim->train_steps, full->train_steps / 10);
  ASSERT_EQ(sim->similarity.size(), 3u);
  EXPECT_EQ(sim->similarity, full->similarity);
  for (const YmirPair& p : full->pairs) {
    const auto idx = [&](const std::string& t) {
      return static_cast<size_t>(std::find(full->tasks.begin(), full->tasks.end(), t) - full->tasks.begin());
    };
    const double s_ab = full->similarity[idx(p.task_a)][idx(p.task_b)];
    const double s_ba = full->similarity[idx(p.task_b)][idx(p.task_a)];
    EXPECT_EQ(p.similarity, p.mode == "temporal" ? s_ab : 0.5 * (s_ab + s_ba));
  }
  EXPECT_THAT(sim->ToJson(), testing::HasSubstr("\"similarity_matrix\""));
  EXPECT_THAT(sim->ToJson(), testing::Not(testing::HasSubstr("\"pairs\"")));
  // Task2Vec's model Fisher and the head's coordinates give other similarities.
  o.fisher = YmirFisher::kModel;
  auto model = RunYmirEstimators(**w, o);
  o.fisher = YmirFisher::kEmpirical;
  o.embed = YmirEmbedParams::kLoraHead;
  auto head = RunYmirEstimators(**w, o);
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_TRUE(head.ok()) << head.status();
  for (const auto* r : {&*model, &*head}) {
    EXPECT_NE(r->similarity, sim->similarity);
    for (const auto& row : r->similarity) {
      for (double v : row) EXPECT_TRUE(std::isfinite(v));
    }
  }
  // Two null runs per task, band = 2 x their RMS gain, the scores use it.
  ASSERT_EQ(full->null_runs.size(), 6u);
  std::vector<double> null_gains;
  for (const auto& u : full->null_runs) {
    EXPECT_NEAR(u.gain, full->normal_steps[static_cast<size_t>(&u - &full->null_runs[0]) / 2] / u.steps - 1.0,
                1e-12);
    null_gains.push_back(u.gain);
  }
  EXPECT_EQ(full->neutral_band, NeutralBand(null_gains, 2.0));
  EXPECT_GT(full->neutral_band, 0.0);
  // The band is a property of the normal runs: --curves-only reports it too.
  o.similarities_only = false;
  o.embed = YmirEmbedParams::kLora;
  o.curves_only = true;
  auto curves = RunYmirEstimators(**w, o);
  ASSERT_TRUE(curves.ok()) << curves.status();
  EXPECT_EQ(curves->neutral_band, full->neutral_band);
  ASSERT_EQ(curves->null_runs.size(), 6u);
  EXPECT_EQ(curves->null_runs[5].steps, full->null_runs[5].steps);
  std::vector<double> measured, predicted;
  for (const YmirPair& p : full->pairs) measured.push_back(p.gain), predicted.push_back(p.predicted_gain);
  const SignScore expect = ScoreSigns(predicted, measured, full->neutral_band);
  EXPECT_EQ(full->scores[2].neutral, expect.neutral);
  EXPECT_EQ(full->scores[2].non_neutral_accuracy_pct, expect.NonNeutralAccuracyPct());
  // Null runs change no pair's measurement.
  o = SmallExperiment();
  o.null_runs = 0;
  auto no_null = RunYmirEstimators(**w, o);
  ASSERT_TRUE(no_null.ok()) << no_null.status();
  EXPECT_EQ(no_null->GainsCsv(), full->GainsCsv());
  EXPECT_EQ(no_null->neutral_band, 0.0);
  EXPECT_EQ(no_null->scores[2].non_neutral_accuracy_pct, no_null->scores[2].accuracy_pct);
}

// The gain model with the direction term (YmirDirection::kAsymmetry):
// leave-one-out on the run's own pairs by default, or fitted on a training
// seed's PairsCsv (fit_on) and applied out of sample (FitLeastSquares
// itself: tests/common/stats_test.cc).
TEST(Task2Vec, DirectionTermIsFittedLeaveOneOutOrOnTrainingSeeds) {
  auto wts = LlamaWeights::FromSeed(Tiny(), 5);
  ASSERT_TRUE(wts.ok());
  YmirExperimentOptions o = SmallExperiment();
  ASSERT_EQ(o.direction, YmirDirection::kAsymmetry);  // the default
  auto r = RunYmirEstimators(**wts, o);
  ASSERT_TRUE(r.ok()) << r.status();
  auto row = [](const YmirPair& p) { return std::vector<double>{1.0, p.similarity, p.asymmetry}; };
  auto dot = [](const std::vector<double>& a, const std::vector<double>& b) {
    double s = 0;
    for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
    return s;
  };
  auto index = [&](const std::string& t) {
    return static_cast<size_t>(std::find(r->tasks.begin(), r->tasks.end(), t) - r->tasks.begin());
  };
  for (size_t k = 0; k < r->pairs.size(); ++k) {
    const YmirPair& p = r->pairs[k];
    const size_t a = index(p.task_a), b = index(p.task_b);
    EXPECT_DOUBLE_EQ(p.asymmetry, r->similarity[a][b] - r->similarity[b][a]);
    std::vector<std::vector<double>> rows;
    std::vector<double> gains;
    for (size_t j = 0; j < r->pairs.size(); ++j) {
      if (j != k && r->pairs[j].mode == p.mode) rows.push_back(row(r->pairs[j])), gains.push_back(r->pairs[j].gain);
    }
    EXPECT_NEAR(p.predicted_gain, dot(FitLeastSquares(rows, gains), row(p)), 1e-9) << p.task_a << "->" << p.task_b;
  }
  EXPECT_EQ(r->scores[0].model.size(), 3u);
  EXPECT_THAT(r->ToJson(), testing::HasSubstr("\"direction\": \"asymmetry\""));
  // A training seed's pairs, through their CSV, fit the model for seed 1.
  YmirExperimentOptions train = o;
  train.seed = 2;
  auto t = RunYmirEstimators(**wts, train);
  ASSERT_TRUE(t.ok()) << t.status();
  auto rows = ParseYmirPairsCsv(t->PairsCsv());
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), t->pairs.size());
  for (size_t k = 0; k < rows->size(); ++k) {
    EXPECT_EQ((*rows)[k].mode, t->pairs[k].mode);
    EXPECT_NEAR((*rows)[k].asymmetry, t->pairs[k].asymmetry, 5e-7);  // 6 decimals
    EXPECT_NEAR((*rows)[k].gain, t->pairs[k].gain, 5e-7);
  }
  o.fit_on = *rows;
  auto held = RunYmirEstimators(**wts, o);
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ(held->GainsCsv(), r->GainsCsv());  // the measurements do not change
  for (int m = 0; m < 2; ++m) {
    std::vector<std::vector<double>> xs;
    std::vector<double> ys;
    for (const YmirTrainingPair& p : *rows) {
      if (p.mode == held->scores[m].mode) xs.push_back({1.0, p.similarity, p.asymmetry}), ys.push_back(p.gain);
    }
    const std::vector<double> model = FitLeastSquares(xs, ys);
    for (size_t i = 0; i < 3; ++i) EXPECT_DOUBLE_EQ(held->scores[m].model[i], model[i]);
    for (const YmirPair& p : held->pairs) {
      if (p.mode == held->scores[m].mode) {
        EXPECT_NEAR(p.predicted_gain, dot(held->scores[m].model, row(p)), 1e-12);
      }
    }
  }
  // A held-out task: each mode's model is fitted on exactly the pairs
  // without fb-major, and exactly fb-major's pairs are scored.
  YmirExperimentOptions ho = o;
  ho.fit_on.clear();
  ho.direction = YmirDirection::kNone;
  ho.holdout_tasks = {"fb-major"};
  auto h = RunYmirEstimators(**wts, ho);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->GainsCsv(), r->GainsCsv());
  for (int m = 0; m < 2; ++m) {
    const std::vector<size_t> fit = GainModelFitRows(ho, h->pairs, h->scores[m].mode);
    std::vector<std::vector<double>> xs;
    std::vector<double> ys;
    int64_t scored = 0;
    for (size_t i = 0; i < h->pairs.size(); ++i) {
      const YmirPair& p = h->pairs[i];
      if (p.mode != h->scores[m].mode) continue;
      const bool held_out = p.task_a == "fb-major" || p.task_b == "fb-major";
      const bool fitted = std::find(fit.begin(), fit.end(), i) != fit.end();
      EXPECT_NE(held_out, fitted) << p.task_a << "->" << p.task_b;
      if (fitted) xs.push_back({1.0, p.similarity}), ys.push_back(p.gain);
      scored += held_out ? 1 : 0;
    }
    const std::vector<double> model = FitLeastSquares(xs, ys);
    ASSERT_EQ(h->scores[m].model.size(), model.size());
    for (size_t i = 0; i < model.size(); ++i) EXPECT_DOUBLE_EQ(h->scores[m].model[i], model[i]);
    EXPECT_EQ(h->scores[m].pairs, scored);
  }
  EXPECT_THAT(h->ToJson(), testing::HasSubstr("\"holdout_tasks\": \"fb-major\""));
  // Bad CSV text and too few training rows are named.
  EXPECT_THAT(std::string(ParseYmirPairsCsv("a,b\n").status().message()), testing::HasSubstr("first line"));
  EXPECT_THAT(std::string(ParseYmirPairsCsv("task_a,task_b,mode,similarity,asymmetry,gain\n"
                                            "x,y,temporal,0.5,zz,0.1\n")
                              .status()
                              .message()),
              testing::HasSubstr("line 2: asymmetry 'zz'"));
  EXPECT_THAT(std::string(ParseYmirPairsCsv("task_a,task_b,mode,similarity,asymmetry,gain\n"
                                            "x,y,sideways,0.5,0,0.1\n")
                              .status()
                              .message()),
              testing::HasSubstr("mode 'sideways'"));
  o.fit_on.resize(2);
  EXPECT_THAT(std::string(RunYmirEstimators(**wts, o).status().message()), testing::HasSubstr("--fit-on"));
}

// The held-out split never leaks a task into the gain model's rows: a pair
// naming a held-out task (or the same rule on other data, NAME@K) is left
// out of the rows it is fitted on, whether those come from this run or from
// training seeds' files; a held-out name the run does not have, or one that
// leaves too few rows, is refused by name.
TEST(Task2Vec, HeldOutTasksNeverReachTheGainModelsRows) {
  YmirExperimentOptions o;
  o.holdout_tasks = {"animal-plant"};
  EXPECT_TRUE(InvolvesHeldOutTask(o.holdout_tasks, "animal-plant@1", "cross-ap"));
  EXPECT_TRUE(InvolvesHeldOutTask(o.holdout_tasks, "cross-ap", "animal-plant"));
  EXPECT_FALSE(InvolvesHeldOutTask(o.holdout_tasks, "animal-artifact", "cross-ap"));
  o.fit_on = {{.task_a = "cross-ap", .task_b = "animal-artifact", .mode = "temporal"},
              {.task_a = "animal-plant@1", .task_b = "cross-ap", .mode = "temporal"},
              {.task_a = "artifact-food", .task_b = "cross-ap", .mode = "spatial"},
              {.task_a = "cross-ap", .task_b = "animal-plant", .mode = "temporal"}};
  EXPECT_EQ(GainModelFitRows(o, {}, "temporal"), (std::vector<size_t>{0}));
  EXPECT_EQ(GainModelFitRows(o, {}, "spatial"), (std::vector<size_t>{2}));
  o.fit_on.clear();
  std::vector<YmirPair> pairs(4);
  pairs[0].task_a = "animal-plant", pairs[0].task_b = "cross-ap", pairs[0].mode = "temporal";
  pairs[1].task_a = "cross-ap", pairs[1].task_b = "artifact-food", pairs[1].mode = "temporal";
  pairs[2].task_a = "artifact-food", pairs[2].task_b = "animal-plant@2", pairs[2].mode = "spatial";
  pairs[3].task_a = "artifact-food", pairs[3].task_b = "cross-ap", pairs[3].mode = "spatial";
  EXPECT_EQ(GainModelFitRows(o, pairs, "temporal"), (std::vector<size_t>{1}));
  EXPECT_EQ(GainModelFitRows(o, pairs, "spatial"), (std::vector<size_t>{3}));

  YmirExperimentOptions v;  // the synthetic family: fa-bins, fa-bins@1, fb-bins, first-class
  v.holdout_tasks = {"first-class"};
  EXPECT_TRUE(v.Validate().ok()) << v.Validate();
  v.holdout_tasks = {"fc-bins"};
  EXPECT_THAT(std::string(v.Validate().message()), testing::HasSubstr("'fc-bins' is not one of the run's tasks"));
  v.holdout_tasks = {"fa-bins", "first-class"};  // leaves fb-bins alone: no pair to fit on
  EXPECT_THAT(std::string(v.Validate().message()), testing::HasSubstr("too few pairs without a held-out task"));
}

TEST(Task2Vec, RejectsBadOptions) {
  auto w = LlamaWeights::FromSeed(Tiny(), 5);
  ASSERT_TRUE(w.ok());
  YmirExperimentOptions o = SmallExperiment();
  o.tasks[0].name = "lm";
  EXPECT_THAT(std::string(RunYmirEstimators(**w, o).status().message()),
              testing::HasSubstr("not a classification"));
  o = SmallExperiment();
  o.tasks.pop_back();
  EXPECT_THAT(std::string(RunYmirEstimators(**w, o).status().message()),
              testing::HasSubstr("at least 3"));
  // Fewer normal steps than the probe's: named, with the CLI flag.
  o = SmallExperiment();
  o.normal_steps = o.probe_steps - 1;
  const std::string msg(RunYmirEstimators(**w, o).status().message());
  EXPECT_THAT(msg, testing::HasSubstr("normal_steps (slicesim --steps) must be >= probe_steps"));
  EXPECT_THAT(msg, testing::HasSubstr("got normal_steps 2, probe_steps 3"));
  o = SmallExperiment();
  o.band_k = -1;
  EXPECT_THAT(std::string(RunYmirEstimators(**w, o).status().message()),
              testing::HasSubstr("band_k (--band-k) >= 0"));
  o = SmallExperiment();
  o.curves_only = o.similarities_only = true;
  EXPECT_THAT(std::string(RunYmirEstimators(**w, o).status().message()),
              testing::HasSubstr("exclude each other"));
  // A bad fit option is named before anything trains (Validate), with the flag.
  o = SmallExperiment();
  o.iter_fit.recency_half_life = -1;
  EXPECT_THAT(std::string(o.Validate().message()),
              testing::HasSubstr("slicesim --iter-half-life"));
  EXPECT_THAT(std::string(RunYmirEstimators(**w, o).status().message()),
              testing::HasSubstr("recency_half_life must be finite and >= 0, got -1"));
}

// The defaults (task2vec.h): the area gain over the whole
// normal run; with a budget of one normal run (max_steps_factor 1) that
// window no longer fits, and the error names it.
TEST(Task2Vec, DefaultAreaWindowIsTheWholeNormalRun) {
  YmirExperimentOptions o;
  EXPECT_EQ(o.gain_measure, YmirGainMeasure::kArea);
  EXPECT_EQ(o.GainWindow(), o.normal_steps);
  EXPECT_EQ(o.GainWindow(), 80);
  EXPECT_TRUE(o.Validate().ok()) << o.Validate();
  o.max_steps_factor = 1;
  EXPECT_THAT(std::string(o.Validate().message()),
              testing::HasSubstr("the area gain's window (slicesim --gain-window) must be a positive multiple of "
                                 "eval_every (4) below max_steps (80), got 80"));
  o.gain_window = 40;
  EXPECT_TRUE(o.Validate().ok()) << o.Validate();
}

// The default iteration fit (task2vec.h, iter_fit: recency weights) on a
// normal run that stays at its start until step 16
// and then decays (the target at step 60), evaluated on the default schedule
// (every step to the longest prefix, 48, then every eval_every) with 2%
// seeded noise: the estimate at the first window (32 steps) is within 16% on
// 8 seeds. With equal weights the noisy flat start's running minimum reads as
// an early slow decay and the estimates come 16-34% late
// (iteration_estimator_test.cc, RecencyWeightsDiscountTheEnvelopeOfANoisyFlatStart).
TEST(Task2Vec, DefaultIterationFitEstimatesADelayedDecayFromTheFirstWindow) {
  const YmirExperimentOptions o;
  ASSERT_EQ(o.IterPrefixSteps(), 32);
  ymir::LossCurve truth{.r = 0.3, .d = 0.7, .b1 = 0.04, .scale = 1.4};
  truth.t0 = 16;
  const double target = truth.Loss(60);
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    std::mt19937_64 rng(seed);
    std::vector<ymir::LossPoint> run;
    for (int64_t t = 0; t <= o.normal_steps; t += t < o.PrefixSteps(0.6) ? 1 : o.eval_every) {
      const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;  // [0, 1)
      run.push_back({static_cast<double>(t), truth.Loss(static_cast<double>(t)) * (1.0 + 0.02 * (2.0 * u - 1.0))});
    }
    auto e = ymir::EstimateOnline(run, static_cast<double>(o.IterPrefixSteps()), target, o.iter_fit, o.iter_plateau);
    ASSERT_TRUE(e.ok()) << e.status();
    EXPECT_EQ(e->observed_until, 32.0) << "seed " << seed;
    ASSERT_TRUE(e->steps.has_value()) << "seed " << seed;
    EXPECT_NEAR(*e->steps, 60.0, 0.16 * 60.0) << "seed " << seed;
  }
}

}  // namespace
}  // namespace slicesched::executor
