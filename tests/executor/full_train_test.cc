// Full-parameter training of a backbone (executor/train/full_train.h).
#include "slicesched/executor/train/full_train.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "slicesched/executor/llama/llama_ops.h"
#include "slicesched/gmg/llama.h"

namespace slicesched::executor {
namespace {

using ::testing::HasSubstr;

std::shared_ptr<const LlamaWeights> Tiny(uint64_t seed = 7) {
  auto dims = LlamaPreset("tiny");
  EXPECT_TRUE(dims.ok()) << dims.status();
  auto w = LlamaWeights::FromSeed(*dims, seed);
  EXPECT_TRUE(w.ok()) << w.status();
  return *w;
}

Tensor Tokens(int64_t rows, int64_t len, int64_t vocab, uint64_t seed) {
  std::vector<int64_t> ids;
  uint64_t x = seed;
  for (int64_t i = 0; i < rows * len; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    ids.push_back(static_cast<int64_t>((x >> 33) % static_cast<uint64_t>(vocab)));
  }
  return Tensor::FromInt64(ids, {rows, len});
}

// The reference forward of the training operators: the backbone as a probe
// (LoRA B = 0, head = the LM head), next-token labels.
double ReferenceLoss(const LlamaWeights& w, const Tensor& tokens) {
  auto probe = TaskAdapters::Init(w.dims(), LoraConfig{.rank = 1, .alpha = 1.0}, w.dims().vocab, 0);
  EXPECT_TRUE(probe.ok()) << probe.status();
  probe->head = w.lm_head();
  TrainBatch batch;
  batch.tokens = tokens;
  auto labels = NextTokenLabels(tokens);
  EXPECT_TRUE(labels.ok()) << labels.status();
  batch.labels = *labels;
  const TaskAdapters* tasks[] = {&*probe};
  auto g = ComputeGradients(w, tasks, batch);
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? g->loss[0] : NAN;
}

TEST(FullModelTrainerTest, FirstLossIsTheTrainingOperatorsForward) {
  auto w = Tiny();
  const Tensor tokens = Tokens(4, 12, w->dims().vocab, 3);
  auto trainer = FullModelTrainer::Create(*w, AdamWOptions{.lr = 1e-3});
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  auto loss = trainer->Step(tokens);
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_NEAR(*loss, ReferenceLoss(*w, tokens), 1e-4 * *loss);
  EXPECT_EQ(trainer->steps(), 1);
}

// Every weight learns: a fixed batch is memorised far below the loss of
// uniform guessing, and every tensor has moved from its init.
TEST(FullModelTrainerTest, EveryWeightLearnsAFixedBatch) {
  auto w = Tiny();
  const Tensor tokens = Tokens(4, 16, w->dims().vocab, 5);
  auto trainer = FullModelTrainer::Create(*w, AdamWOptions{.lr = 3e-3});
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  double first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    auto loss = trainer->Step(tokens);
    ASSERT_TRUE(loss.ok()) << loss.status();
    if (step == 0) first = *loss;
    last = *loss;
  }
  EXPECT_GT(first, 0.9 * std::log(static_cast<double>(w->dims().vocab)));
  EXPECT_LT(last, 0.25 * first);
  const auto before = w->NamedTensors();
  const auto after = trainer->NamedTensors();
  ASSERT_EQ(before.size(), after.size());
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_EQ(before[i].first, after[i].first);
    EXPECT_NE(before[i].second.ToFloat(), after[i].second.ToFloat()) << before[i].first << " did not learn";
  }
  // The snapshot is a copy: later steps leave it as it was.
  const std::vector<float> head = after.back().second.ToFloat();
  ASSERT_TRUE(trainer->Step(tokens).ok());
  EXPECT_EQ(after.back().second.ToFloat(), head);
}

TEST(FullModelTrainerTest, SameInputsGiveBitIdenticalWeights) {
  auto w = Tiny();
  std::vector<std::vector<float>> runs[2];
  for (auto& run : runs) {
    auto trainer = FullModelTrainer::Create(*w, AdamWOptions{.lr = 1e-3, .weight_decay = 0.01});
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    for (int step = 0; step < 3; ++step) ASSERT_TRUE(trainer->Step(Tokens(2, 8, w->dims().vocab, 10 + step)).ok());
    for (const auto& [name, t] : trainer->NamedTensors()) run.push_back(t.ToFloat());
  }
  EXPECT_EQ(runs[0], runs[1]);
}

TEST(FullModelTrainerTest, BadInputIsRefusedByName) {
  auto w = Tiny();
  auto trainer = FullModelTrainer::Create(*w, AdamWOptions{.lr = 1e-3});
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  const std::vector<int64_t> out_ids = {1, 2, w->dims().vocab}, short_ids = {1, 2};
  auto out_of_vocab = trainer->Step(Tensor::FromInt64(out_ids, {1, 3}));
  ASSERT_FALSE(out_of_vocab.ok());
  EXPECT_THAT(out_of_vocab.status().message(), HasSubstr("token 256 is outside the vocab 256"));
  auto one_token = trainer->Step(Tensor::FromInt64(short_ids, {2, 1}));
  ASSERT_FALSE(one_token.ok());
  EXPECT_THAT(one_token.status().message(), HasSubstr("S >= 2"));
  EXPECT_EQ(trainer->steps(), 0);
  auto bad_lr = FullModelTrainer::Create(*w, AdamWOptions{.lr = -1});
  EXPECT_FALSE(bad_lr.ok());
}

}  // namespace
}  // namespace slicesched::executor
