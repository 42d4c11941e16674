// The LoRA training operators on the "tiny" preset (f32): gradients against
// an independent f64 reference and finite differences, the pipeline split,
// learning, a frozen backbone, gradient accumulation, per-task optimizer
// state under joint training and decoupling, temporal transfer, checkpoints
// and input validation. Torch-free TU: only the public executor headers.
#include "slicesched/executor/train/train_ops.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "slicesched/executor/llama/llama_ops.h"
#include "slicesched/executor/torch/safetensors.h"
#include "slicesched/gmg/llama.h"
#include "slicesched/ymir/stop_loss.h"

namespace slicesched::executor {
namespace {

LlamaDims Tiny() {
  auto dims = LlamaPreset("tiny");
  EXPECT_TRUE(dims.ok()) << dims.status();
  return *dims;
}

std::shared_ptr<const LlamaWeights> TinyWeights(uint64_t seed = 1234) {
  auto w = LlamaWeights::FromSeed(Tiny(), seed);
  EXPECT_TRUE(w.ok()) << w.status();
  return *w;
}

uint64_t Next(uint64_t& x) {
  x = x * 6364136223846793005ull + 1442695040888963407ull;
  return x >> 33;
}

std::vector<int64_t> RandomTokens(int64_t n, int64_t vocab, uint64_t seed) {
  std::vector<int64_t> out;
  uint64_t x = seed;
  for (int64_t i = 0; i < n; ++i)
    out.push_back(static_cast<int64_t>(Next(x) % static_cast<uint64_t>(vocab)));
  return out;
}

// Uniform values in [-scale, scale].
Tensor RandomLike(const Tensor& like, double scale, uint64_t seed) {
  uint64_t x = seed;
  std::vector<float> v(static_cast<size_t>(like.numel()));
  for (float& f : v)
    f = static_cast<float>(scale * (2.0 * static_cast<double>(Next(x) % 100000) / 99999.0 - 1.0));
  return Tensor::FromFloat(v, like.shape());
}

// Non-zero B factors, so that every LoRA tensor gets a non-trivial gradient.
void RandomizeB(TaskAdapters& a, uint64_t seed) {
  for (LoraLayer& l : a.layers) {
    l.q_b = RandomLike(l.q_b, 0.2, seed++);
    l.v_b = RandomLike(l.v_b, 0.2, seed++);
  }
}

// Max |a - b| over all tensors of two adapter sets, and max |b|.
std::pair<double, double> MaxDiff(const TaskAdapters& a, const TaskAdapters& b) {
  const auto na = a.NamedTensors(), nb = b.NamedTensors();
  if (na.size() != nb.size()) return {std::numeric_limits<double>::infinity(), 0};
  double diff = 0, mag = 0;
  for (size_t i = 0; i < na.size(); ++i) {
    diff = std::max(diff, na[i].second.MaxAbsDiff(nb[i].second));
    for (float f : nb[i].second.ToFloat()) mag = std::max(mag, std::fabs(static_cast<double>(f)));
  }
  return {diff, mag};
}

bool BitEqual(const TaskAdapters& a, const TaskAdapters& b) {
  const auto na = a.NamedTensors(), nb = b.NamedTensors();
  if (na.size() != nb.size()) return false;
  for (size_t i = 0; i < na.size(); ++i) {
    if (na[i].first != nb[i].first || na[i].second.shape() != nb[i].second.shape() ||
        na[i].second.ToFloat() != nb[i].second.ToFloat()) {
      return false;
    }
  }
  return true;
}

bool BitEqual(const TaskState& a, const TaskState& b) {
  return BitEqual(a.params, b.params) && BitEqual(a.m, b.m) && BitEqual(a.v, b.v) &&
         BitEqual(a.grad_sum, b.grad_sum) && a.step == b.step && a.accumulated == b.accumulated &&
         a.params.lora.rank == b.params.lora.rank && a.params.lora.alpha == b.params.lora.alpha &&
         a.adamw.lr == b.adamw.lr && a.adamw.beta1 == b.adamw.beta1 &&
         a.adamw.beta2 == b.adamw.beta2 && a.adamw.eps == b.adamw.eps &&
         a.adamw.weight_decay == b.adamw.weight_decay;
}

// A classification batch: `rows` rows of S random tokens; the class of a row
// is its last token mod `classes` (learnable from the last position).
TrainBatch ClassBatch(int64_t rows, int64_t S, int64_t classes, int64_t vocab, uint64_t seed) {
  const auto ids = RandomTokens(rows * S, vocab, seed);
  std::vector<int64_t> cls;
  for (int64_t b = 0; b < rows; ++b)
    cls.push_back(ids[static_cast<size_t>(b * S + S - 1)] % classes);
  TrainBatch batch;
  batch.tokens = Tensor::FromInt64(ids, {rows, S});
  batch.labels = *LastPositionLabels(cls, S);
  return batch;
}

// Rows of `a` (task 0) followed by rows of `b` (task 1).
TrainBatch Mix(const TrainBatch& a, const TrainBatch& b) {
  const auto sa = a.tokens.shape(), sb = b.tokens.shape();
  std::vector<int64_t> ids = a.tokens.ToInt64(), lab = a.labels.ToInt64();
  const auto ib = b.tokens.ToInt64(), lb = b.labels.ToInt64();
  ids.insert(ids.end(), ib.begin(), ib.end());
  lab.insert(lab.end(), lb.begin(), lb.end());
  TrainBatch m;
  m.tokens = Tensor::FromInt64(ids, {sa[0] + sb[0], sa[1]});
  m.labels = Tensor::FromInt64(lab, {sa[0] + sb[0], sa[1]});
  m.row_task.assign(static_cast<size_t>(sa[0]), 0);
  m.row_task.insert(m.row_task.end(), static_cast<size_t>(sb[0]), 1);
  return m;
}

TaskState NewTask(int64_t classes, uint64_t seed, double lr = 1e-2) {
  AdamWOptions o;
  o.lr = lr;
  o.weight_decay = 0.01;
  auto s = TaskState::Init(Tiny(), LoraConfig{4, 8.0}, classes, seed, o);
  EXPECT_TRUE(s.ok()) << s.status();
  return *s;
}

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          (name + "." + std::to_string(::getpid()) + ".safetensors"))
      .string();
}

TEST(TrainOpsTest, InitIsSeededAndLoraStartsAtZero) {
  const LlamaDims d = Tiny();
  auto a = TaskAdapters::Init(d, LoraConfig{4, 8.0}, 3, 11);
  auto b = TaskAdapters::Init(d, LoraConfig{4, 8.0}, 3, 11);
  auto c = TaskAdapters::Init(d, LoraConfig{4, 8.0}, 3, 12);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_TRUE(BitEqual(*a, *b));
  EXPECT_FALSE(BitEqual(*a, *c));
  ASSERT_TRUE(a->Check(d).ok()) << a->Check(d);
  // Per layer: A 4x64 twice, B 64x4 (q) and 32x4 (v); head 3x64.
  EXPECT_EQ(a->NumParams(), d.layers * (4 * 64 * 2 + 64 * 4 + 32 * 4) + 3 * 64);
  for (const LoraLayer& l : a->layers) {
    for (float f : l.q_b.ToFloat()) EXPECT_EQ(f, 0.f);
    for (float f : l.v_b.ToFloat()) EXPECT_EQ(f, 0.f);
  }
  EXPECT_EQ(a->layers[0].q_a.shape(), (std::vector<int64_t>{4, 64}));
  EXPECT_EQ(a->layers[0].v_b.shape(), (std::vector<int64_t>{32, 4}));
  EXPECT_EQ(a->head.shape(), (std::vector<int64_t>{3, 64}));

  // B = 0: the adapted group computes the backbone's function, i.e. the
  // serving operator's output.
  auto w = TinyWeights();
  const int64_t B = 2, S = 5;
  auto h = Embedding(*w, Tensor::FromInt64(RandomTokens(B * S, 256, 3), {B, S}));
  ASSERT_TRUE(h.ok());
  const TaskAdapters* slots[] = {&*a};
  auto f = TrainGroupForward(*w, 0, slots, {}, *h);
  ASSERT_TRUE(f.ok()) << f.status();
  auto serving = FusedLayers(*w, 0, *h, nullptr, 0);
  ASSERT_TRUE(serving.ok());
  EXPECT_LE(f->hidden_out.MaxAbsDiff(*serving), 1e-5);
}

// Gradients of the fused-group path (f32) equal the independent f64
// reference (autograd over the whole model in one go), whose gradients in
// turn equal central finite differences; on a batch mixing two tasks with
// different heads (next-token over the vocabulary, 3-way classification).
TEST(TrainOpsTest, GradientsMatchReferenceAndFiniteDifferences) {
  auto w = TinyWeights();
  const LlamaDims d = Tiny();
  auto a = TaskAdapters::Init(d, LoraConfig{4, 8.0}, d.vocab, 21);
  auto b = TaskAdapters::Init(d, LoraConfig{4, 8.0}, 3, 22);
  ASSERT_TRUE(a.ok() && b.ok());
  RandomizeB(*a, 100);
  RandomizeB(*b, 200);
  const int64_t S = 6;
  TrainBatch lm;
  lm.tokens = Tensor::FromInt64(RandomTokens(2 * S, d.vocab, 5), {2, S});
  lm.labels = *NextTokenLabels(lm.tokens);
  const TrainBatch batch = Mix(lm, ClassBatch(2, S, 3, d.vocab, 6));
  const TaskAdapters* slots[] = {&*a, &*b};

  auto fused = ComputeGradients(*w, slots, batch, GradientPath::kPipelined);
  ASSERT_TRUE(fused.ok()) << fused.status();
  auto ref = ReferenceTrainLoss(*w, slots, batch);
  ASSERT_TRUE(ref.ok()) << ref.status();
  ASSERT_EQ(fused->loss.size(), 2u);
  EXPECT_EQ(fused->counted, (std::vector<int64_t>{2 * (S - 1), 2}));
  double worst_rel = 0;
  for (size_t t = 0; t < 2; ++t) {
    EXPECT_NEAR(fused->loss[t], ref->loss[t], 1e-5 * std::fabs(ref->loss[t]));
    const auto [diff, mag] = MaxDiff(fused->grads[t], ref->grads[t]);
    ASSERT_GT(mag, 1e-4) << "task " << t << ": a vanishing gradient tests nothing";
    EXPECT_LE(diff, 1e-4 * mag) << "task " << t;
    worst_rel = std::max(worst_rel, diff / mag);
    // Every LoRA tensor gets a non-zero gradient.
    for (const auto& [name, g] : fused->grads[t].NamedTensors()) {
      double m = 0;
      for (float f : g.ToFloat()) m = std::max(m, std::fabs(static_cast<double>(f)));
      EXPECT_GT(m, 0.0) << name;
    }
  }
  std::printf("[ numerics ] fused f32 vs reference f64 gradients: max rel diff %.3g\n", worst_rel);

  // Central differences on the reference, a few coordinates per task.
  const double delta = 1e-5;
  double worst_fd = 0;
  for (int64_t t = 0; t < 2; ++t) {
    for (const auto& [name, index] : std::vector<std::pair<std::string, int64_t>>{
             {"layers.0.q_a", 5}, {"layers.1.v_b", 7}, {"layers.3.q_b", 33}, {"head", 2}}) {
      auto plus =
          ReferenceTrainLoss(*w, slots, batch, ReferencePerturbation{t, name, index, delta});
      auto minus =
          ReferenceTrainLoss(*w, slots, batch, ReferencePerturbation{t, name, index, -delta});
      ASSERT_TRUE(plus.ok() && minus.ok()) << plus.status() << minus.status();
      // Only task t's loss depends on task t's adapters.
      const double fd =
          (plus->loss[static_cast<size_t>(t)] - minus->loss[static_cast<size_t>(t)]) / (2 * delta);
      EXPECT_EQ(plus->loss[static_cast<size_t>(1 - t)], ref->loss[static_cast<size_t>(1 - t)]);
      double analytic = 0;
      for (const auto& [n, g] : ref->grads[static_cast<size_t>(t)].NamedTensors()) {
        if (n == name) analytic = g.ToFloat()[static_cast<size_t>(index)];
      }
      EXPECT_NEAR(fd, analytic, 1e-6 + 1e-5 * std::fabs(analytic)) << "task " << t << " " << name;
      worst_fd = std::max(worst_fd, std::fabs(fd - analytic));
    }
  }
  std::printf("[ numerics ] reference gradient vs finite differences: max |diff| %.3g\n", worst_fd);
}

// A bf16 backbone trains too (LoRA branch and head in f32): its gradients
// are close to the f64 reference on the same (bf16) weights.
TEST(TrainOpsTest, Bf16BackboneGradientsAreCloseToReference) {
  LlamaDims d = Tiny();
  d.dtype = DType::kBF16;
  auto w = LlamaWeights::FromSeed(d, 1234);
  ASSERT_TRUE(w.ok()) << w.status();
  auto a = TaskAdapters::Init(d, LoraConfig{4, 8.0}, 3, 23);
  ASSERT_TRUE(a.ok()) << a.status();
  RandomizeB(*a, 400);
  const TrainBatch batch = ClassBatch(2, 6, 3, d.vocab, 7);
  const TaskAdapters* slots[] = {&*a};
  auto fused = ComputeGradients(**w, slots, batch);
  ASSERT_TRUE(fused.ok()) << fused.status();
  auto ref = ReferenceTrainLoss(**w, slots, batch);
  ASSERT_TRUE(ref.ok()) << ref.status();
  EXPECT_NEAR(fused->loss[0], ref->loss[0], 0.05 * std::fabs(ref->loss[0]));
  const auto [diff, mag] = MaxDiff(fused->grads[0], ref->grads[0]);
  EXPECT_GT(mag, 1e-4);
  EXPECT_LE(diff, 0.05 * mag);
  EXPECT_EQ(fused->grads[0].head.dtype(), DType::kF32);
  std::printf(
      "[ numerics ] bf16 backbone vs f64 reference: loss %.4f vs %.4f, grad max rel diff %.3g\n",
      fused->loss[0], ref->loss[0], diff / mag);
}

// The per-group operators, with every activation and gradient crossing a
// "device boundary" as a host copy, give the one-shot backward's gradients.
TEST(TrainOpsTest, PipelinedBackwardEqualsOneShot) {
  auto w = TinyWeights();
  const LlamaDims d = Tiny();
  auto a = TaskAdapters::Init(d, LoraConfig{4, 8.0}, 5, 31);
  ASSERT_TRUE(a.ok());
  RandomizeB(*a, 300);
  const TrainBatch batch = ClassBatch(3, 7, 5, d.vocab, 8);
  const TaskAdapters* slots[] = {&*a};
  auto one_shot = ComputeGradients(*w, slots, batch, GradientPath::kOneShot);
  ASSERT_TRUE(one_shot.ok()) << one_shot.status();

  auto copy = [](const Tensor& t) { return Tensor::FromFloat(t.ToFloat(), t.shape()); };
  auto h = Embedding(*w, batch.tokens);
  ASSERT_TRUE(h.ok());
  Tensor x = *h;
  std::vector<std::shared_ptr<GroupTape>> tapes;
  for (int64_t g = 0; g < d.num_groups(); ++g) {
    auto f = TrainGroupForward(*w, g, slots, {}, x);
    ASSERT_TRUE(f.ok()) << f.status();
    x = copy(f->hidden_out);  // to the next stage's device
    tapes.push_back(f->tape);
  }
  auto head = TrainHeadLoss(*w, slots, {}, x, batch.labels);
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(head->loss[0], one_shot->loss[0]);
  TaskAdapters grads = *a;
  grads.head = head->d_head[0];
  Tensor dx = copy(head->d_hidden);
  for (int64_t g = d.num_groups() - 1; g >= 0; --g) {
    auto bw = TrainGroupBackward(*tapes[static_cast<size_t>(g)], dx);
    ASSERT_TRUE(bw.ok()) << bw.status();
    dx = copy(bw->d_hidden_in);  // back to the previous stage's device
    for (int64_t l = 0; l < d.fusion; ++l) {
      grads.layers[static_cast<size_t>(g * d.fusion + l)] = bw->grads[0][static_cast<size_t>(l)];
    }
  }
  const auto [diff, mag] = MaxDiff(grads, one_shot->grads[0]);
  EXPECT_GT(mag, 1e-4);
  EXPECT_LE(diff, 1e-6 * mag);
  std::printf("[ numerics ] pipelined vs one-shot gradients: max |diff| %.3g (max |g| %.3g)\n",
              diff, mag);
  // The ComputeGradients composition is the same pipeline.
  auto piped = ComputeGradients(*w, slots, batch, GradientPath::kPipelined);
  ASSERT_TRUE(piped.ok());
  EXPECT_TRUE(BitEqual(piped->grads[0], grads));

  // A tape is single use.
  auto again = TrainGroupBackward(*tapes[0], dx);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition) << again.status();
}

// ~20 AdamW steps on a tiny learnable task lower the loss; the backbone is
// bit-for-bit unchanged.
TEST(TrainOpsTest, LossDecreasesAndBackboneStaysFrozen) {
  auto w = TinyWeights();
  std::vector<std::vector<float>> before;
  for (const auto& [name, t] : w->NamedTensors()) before.push_back(t.ToFloat());
  TaskState task = NewTask(2, 41, 2e-2);
  const TaskAdapters initial = task.params;
  const TrainBatch batch = ClassBatch(8, 6, 2, Tiny().vocab, 9);
  std::vector<double> losses;
  for (int step = 0; step < 20; ++step) {
    auto loss = AccumulateMicroBatch(*w, task, batch);
    ASSERT_TRUE(loss.ok()) << loss.status();
    losses.push_back(*loss);
    ASSERT_TRUE(AdamWStep(task).ok());
  }
  const TaskAdapters* slots[] = {&task.params};
  auto final_loss = ComputeGradients(*w, slots, batch);
  ASSERT_TRUE(final_loss.ok());
  std::printf("[ training ] loss %.4f -> %.4f after 20 steps\n", losses.front(),
              final_loss->loss[0]);
  EXPECT_LT(final_loss->loss[0], 0.5 * losses.front());
  EXPECT_EQ(task.step, 20);
  // The LoRA factors moved (B is no longer zero).
  EXPECT_GT(MaxDiff(task.params, initial).first, 0.0);
  double b_max = 0;
  for (float f : task.params.layers[2].v_b.ToFloat()) b_max = std::max(b_max, std::fabs(double(f)));
  EXPECT_GT(b_max, 0.0);
  const auto after = w->NamedTensors();
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i)
    EXPECT_EQ(after[i].second.ToFloat(), before[i]) << after[i].first;
}

// Accumulating two micro-batches of two rows equals one step on the
// four-row batch (each row has one labelled position, so the mean of the
// micro-batch means is the batch mean).
TEST(TrainOpsTest, GradientAccumulation) {
  auto w = TinyWeights();
  const TrainBatch m1 = ClassBatch(2, 5, 3, Tiny().vocab, 51);
  const TrainBatch m2 = ClassBatch(2, 5, 3, Tiny().vocab, 52);
  TrainBatch whole = Mix(m1, m2);
  whole.row_task.clear();  // one task
  TaskState acc = NewTask(3, 50), big = acc;
  EXPECT_EQ(AdamWStep(acc).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(AccumulateMicroBatch(*w, acc, m1).ok());
  ASSERT_TRUE(AccumulateMicroBatch(*w, acc, m2).ok());
  EXPECT_EQ(acc.accumulated, 2);
  ASSERT_TRUE(AdamWStep(acc).ok());
  ASSERT_TRUE(AccumulateMicroBatch(*w, big, whole).ok());
  ASSERT_TRUE(AdamWStep(big).ok());
  EXPECT_EQ(acc.accumulated, 0);
  EXPECT_EQ(acc.step, 1);
  const auto [dp, mp] = MaxDiff(acc.params, big.params);
  const auto [dm, mm] = MaxDiff(acc.m, big.m);
  EXPECT_LE(dp, 1e-6 * mp);
  EXPECT_LE(dm, 1e-5 * mm);
  EXPECT_GT(mm, 0.0);
}

// Spatial joint training with per-task optimizer state.
//  (1) A joint step equals the mean of the tasks' solo steps from the same
//      state, and each task's moments equal its solo step's moments.
//  (2) Decoupling after joint steps loses nothing: each task's state is an
//      independent task that continues bit-identically whether or not the
//      partner continues, and equally from a checkpoint of that state.
TEST(TrainOpsTest, JointTrainingDecouplesWithoutLoss) {
  auto w = TinyWeights();
  const int64_t V = Tiny().vocab;
  TaskState a = NewTask(2, 61), b = NewTask(3, 62);
  TaskState* both[] = {&a, &b};
  // Not sharing an adapter yet.
  const TrainBatch ba = ClassBatch(3, 6, 2, V, 63), bb = ClassBatch(2, 6, 3, V, 64);
  const TrainBatch mixed = Mix(ba, bb);
  ASSERT_TRUE(AccumulateJointMicroBatch(*w, both, mixed).ok());
  const absl::Status apart = JointOptimizerStep(both);
  EXPECT_EQ(apart.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(apart.message().find("different LoRA factors (layer 0 differs)"), std::string_view::npos) << apart;
  a.grad_sum = a.m;  // drop those gradients (m is still zero)
  b.grad_sum = b.m;
  a.accumulated = b.accumulated = 0;
  EXPECT_EQ(SameAdapter(a.params, b.params).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(ShareLora(both).ok());
  EXPECT_TRUE(SameAdapter(a.params, b.params).ok()) << "the heads differ, the adapter is one";
  {
    TaskAdapters other_alpha = b.params;
    other_alpha.lora.alpha += 1;
    const absl::Status config = SameAdapter(a.params, other_alpha);
    EXPECT_NE(config.message().find("different LoRA configs"), std::string_view::npos) << config;
  }

  // (1)
  TaskState solo_a = a, solo_b = b;
  ASSERT_TRUE(AccumulateMicroBatch(*w, solo_a, ba).ok());
  ASSERT_TRUE(AdamWStep(solo_a).ok());
  ASSERT_TRUE(AccumulateMicroBatch(*w, solo_b, bb).ok());
  ASSERT_TRUE(AdamWStep(solo_b).ok());
  auto losses = AccumulateJointMicroBatch(*w, both, mixed);
  ASSERT_TRUE(losses.ok()) << losses.status();
  ASSERT_TRUE(JointOptimizerStep(both).ok());
  EXPECT_TRUE(BitEqual(TaskAdapters{a.params.lora, a.params.layers, Tensor()},
                       TaskAdapters{b.params.lora, b.params.layers, Tensor()}))
      << "the tasks still share one adapter";
  EXPECT_LE(MaxDiff(a.m, solo_a.m).first, 1e-5 * MaxDiff(a.m, solo_a.m).second);
  EXPECT_LE(MaxDiff(b.v, solo_b.v).first, 1e-5 * MaxDiff(b.v, solo_b.v).second + 1e-12);
  EXPECT_LE(a.params.head.MaxAbsDiff(solo_a.params.head), 1e-6);
  double worst = 0;
  for (size_t l = 0; l < a.params.layers.size(); ++l) {
    const auto ja = a.params.layers[l].v_b.ToFloat();
    const auto sa = solo_a.params.layers[l].v_b.ToFloat(),
               sb = solo_b.params.layers[l].v_b.ToFloat();
    for (size_t i = 0; i < ja.size(); ++i) {
      worst = std::max(worst, std::fabs(double(ja[i]) - 0.5 * (double(sa[i]) + double(sb[i]))));
    }
  }
  EXPECT_LE(worst, 1e-6);
  EXPECT_EQ(a.step, 1);
  EXPECT_EQ(b.step, 1);

  // Two more joint steps, then decouple.
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(AccumulateJointMicroBatch(*w, both, mixed).ok());
    ASSERT_TRUE(JointOptimizerStep(both).ok());
  }
  const std::string path = TempPath("joint_a");
  ASSERT_TRUE(SaveTaskCheckpoint(path, a).ok());
  TaskState alone = a;    // decoupled A
  TaskState partner = b;  // decoupled B
  auto restored = LoadTaskCheckpoint(path, Tiny());
  ASSERT_TRUE(restored.ok()) << restored.status();
  std::filesystem::remove(path);
  ASSERT_TRUE(BitEqual(*restored, alone));
  TaskState isolated = *restored;  // A continuing in a run where B never existed
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(AccumulateMicroBatch(*w, alone, ba).ok());
    ASSERT_TRUE(AdamWStep(alone).ok());
    ASSERT_TRUE(AccumulateMicroBatch(*w, partner, bb).ok());  // B continues too
    ASSERT_TRUE(AdamWStep(partner).ok());
    ASSERT_TRUE(AccumulateMicroBatch(*w, isolated, ba).ok());
    ASSERT_TRUE(AdamWStep(isolated).ok());
  }
  EXPECT_TRUE(BitEqual(alone, isolated));
  EXPECT_EQ(alone.step, 6);
  // After decoupling the two copies of the adapter evolve independently.
  EXPECT_GT(alone.params.layers[0].q_b.MaxAbsDiff(partner.params.layers[0].q_b), 0.0);
}

// Rows of two lengths in one joint micro-batch (train_ops.h "Padding"): B's
// next-token rows (S = 5) left-padded to A's classification rows (S = 9),
// row_pad = 4. Each task's loss and gradient (shared LoRA and own head) from
// the mixed batch equal those of its rows run alone, unpadded, within 1e-5 of
// the gradient's magnitude (f32; the differently shaped matmuls round
// differently). Labels at pad positions are ignored whatever they hold. The
// same batch without row_pad (pad keys visible, RoPE shifted) gives B a loss
// and gradient that differ by far more: the tolerance would catch a missing
// mask. An all-zero row_pad is bit-identical to none.
TEST(TrainOpsTest, PaddedRowsInAJointBatchComputeWhatTheyComputeAlone) {
  auto w = TinyWeights();
  const int64_t V = Tiny().vocab;
  TaskState a = NewTask(2, 71), b = NewTask(V, 72);
  RandomizeB(a.params, 700);
  TaskState* both[] = {&a, &b};
  ASSERT_TRUE(ShareLora(both).ok());
  const TrainBatch ba = ClassBatch(3, 9, 2, V, 73);
  TrainBatch bb;
  bb.tokens = Tensor::FromInt64(RandomTokens(2 * 5, V, 74), {2, 5});
  bb.labels = *NextTokenLabels(bb.tokens);
  // The mixed batch: B's rows get 4 leading pad positions (token 0).
  TrainBatch mixed;
  {
    std::vector<int64_t> ids = ba.tokens.ToInt64(), lab = ba.labels.ToInt64();
    const auto ib = bb.tokens.ToInt64(), lb = bb.labels.ToInt64();
    for (int64_t r = 0; r < 2; ++r) {
      for (int64_t j = 0; j < 9; ++j) {
        ids.push_back(j < 4 ? 0 : ib[static_cast<size_t>(r * 5 + j - 4)]);
        lab.push_back(j < 4 ? -1 : lb[static_cast<size_t>(r * 5 + j - 4)]);
      }
    }
    mixed.tokens = Tensor::FromInt64(ids, {5, 9});
    mixed.labels = Tensor::FromInt64(lab, {5, 9});
    mixed.row_task = {0, 0, 0, 1, 1};
    mixed.row_pad = {0, 0, 0, 4, 4};
  }
  const TaskAdapters* pa[] = {&a.params};
  const TaskAdapters* pb[] = {&b.params};
  const TaskAdapters* pab[] = {&a.params, &b.params};
  auto alone_a = ComputeGradients(*w, pa, ba);
  auto alone_b = ComputeGradients(*w, pb, bb);
  ASSERT_TRUE(alone_a.ok()) << alone_a.status();
  ASSERT_TRUE(alone_b.ok()) << alone_b.status();
  ASSERT_EQ(alone_b->counted[0], 2 * 4);
  for (GradientPath path : {GradientPath::kPipelined, GradientPath::kOneShot}) {
    auto joint = ComputeGradients(*w, pab, mixed, path);
    ASSERT_TRUE(joint.ok()) << joint.status();
    EXPECT_EQ(joint->counted[0], alone_a->counted[0]);
    EXPECT_EQ(joint->counted[1], alone_b->counted[0]);
    EXPECT_NEAR(joint->loss[0], alone_a->loss[0], 1e-5 * alone_a->loss[0]);
    EXPECT_NEAR(joint->loss[1], alone_b->loss[0], 1e-5 * alone_b->loss[0]);
    const auto [da, ma] = MaxDiff(joint->grads[0], alone_a->grads[0]);
    const auto [db, mb] = MaxDiff(joint->grads[1], alone_b->grads[0]);
    EXPECT_GT(mb, 0.0);
    EXPECT_LE(da, 1e-5 * ma) << "task A's gradient";
    EXPECT_LE(db, 1e-5 * mb) << "task B's gradient (padded rows)";
    std::printf("[ numerics ] padded joint vs alone: A max|dg| %.3g (max|g| %.3g), B max|dg| %.3g "
                "(max|g| %.3g), B loss %.9g vs %.9g\n",
                da, ma, db, mb, joint->loss[1], alone_b->loss[0]);
  }
  // Labels at pad positions are ignored.
  {
    TrainBatch junk = mixed;
    std::vector<int64_t> lab = junk.labels.ToInt64();
    for (int64_t r = 3; r < 5; ++r) {
      for (int64_t j = 0; j < 4; ++j) lab[static_cast<size_t>(r * 9 + j)] = 1;
    }
    junk.labels = Tensor::FromInt64(lab, {5, 9});
    auto masked = ComputeGradients(*w, pab, mixed);
    auto with_junk = ComputeGradients(*w, pab, junk);
    ASSERT_TRUE(masked.ok() && with_junk.ok());
    EXPECT_EQ(with_junk->counted[1], alone_b->counted[0]);
    EXPECT_EQ(with_junk->loss, masked->loss);
    EXPECT_TRUE(BitEqual(with_junk->grads[1], masked->grads[1]));
  }
  // Without the mask the padded rows compute something else.
  {
    TrainBatch unmasked = mixed;
    unmasked.row_pad.clear();
    auto joint = ComputeGradients(*w, pab, unmasked);
    ASSERT_TRUE(joint.ok()) << joint.status();
    const auto [db, mb] = MaxDiff(joint->grads[1], alone_b->grads[0]);
    EXPECT_GT(db, 1e-3 * mb) << "the test cannot see a missing mask";
    std::printf("[ numerics ] without row_pad: B max|dg| %.3g (max|g| %.3g), B loss %.9g vs %.9g\n", db,
                mb, joint->loss[1], alone_b->loss[0]);
    EXPECT_GT(std::fabs(joint->loss[1] - alone_b->loss[0]), 1e-4 * alone_b->loss[0]);
  }
  // All-zero row_pad: exactly the unmasked computation.
  {
    TrainBatch zero = ba;
    zero.row_pad = {0, 0, 0};
    auto z = ComputeGradients(*w, pa, zero);
    ASSERT_TRUE(z.ok()) << z.status();
    EXPECT_EQ(z->loss, alone_a->loss);
    EXPECT_TRUE(BitEqual(z->grads[0], alone_a->grads[0]));
  }
  // The joint micro-batch accumulates each task's own gradient.
  TaskState ja = a, jb = b, sa = a, sb = b;
  TaskState* joint_states[] = {&ja, &jb};
  auto losses = AccumulateJointMicroBatch(*w, joint_states, mixed);
  ASSERT_TRUE(losses.ok()) << losses.status();
  ASSERT_TRUE(AccumulateMicroBatch(*w, sb, bb).ok());
  EXPECT_LE(MaxDiff(jb.grad_sum, sb.grad_sum).first, 1e-5 * MaxDiff(jb.grad_sum, sb.grad_sum).second);
  // Bad row_pad.
  TrainBatch bad = mixed;
  bad.row_pad = {0, 4};
  auto e1 = ComputeGradients(*w, pab, bad);
  EXPECT_EQ(e1.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(e1.status().message().find("row_pad has 2 entries for a batch of 5 rows"), std::string::npos)
      << e1.status();
  bad.row_pad = {0, 0, 0, 9, 4};
  auto e2 = ComputeGradients(*w, pab, bad);
  EXPECT_EQ(e2.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(e2.status().message().find("row 3 has 9 pad positions"), std::string::npos) << e2.status();
}

// SGD with momentum (OptimizerKind::kSgd): two steps, each on two
// accumulated micro-batch gradients, against a plain loop in double over the
// tensors' values (g = mean + wd p; m = momentum m + g; p -= lr m), within
// 1e-6 of the values' magnitude (f32 arithmetic). OptimizerStep dispatches
// on the state (AdamW gives other values), the momentum buffer is m (v stays
// zero), checkpoints keep the optimizer and momentum, a joint step of two
// SGD tasks is the mean of their solo SGD steps, and a bad momentum is an
// error naming it.
TEST(TrainOpsTest, SgdStepMatchesAPlainMomentumReference) {
  auto w = TinyWeights();
  const int64_t V = Tiny().vocab;
  TaskState s = NewTask(2, 81, 0.05);  // lr 0.05, weight_decay 0.01
  RandomizeB(s.params, 800);
  s.optimizer = OptimizerKind::kSgd;
  s.momentum = 0.9;
  const double lr = 0.05, wd = 0.01, mu = 0.9;
  std::vector<std::vector<double>> p, m;
  for (const auto& [name, t] : s.params.NamedTensors()) {
    const std::vector<float> f = t.ToFloat();
    p.emplace_back(f.begin(), f.end());
    m.emplace_back(f.size(), 0.0);
  }
  TaskState adamw_copy;
  for (int step = 0; step < 2; ++step) {
    std::vector<std::vector<double>> gsum(p.size());
    for (int k = 0; k < 2; ++k) {
      const TrainBatch b = ClassBatch(3, 6, 2, V, 90 + 2 * step + k);
      const TaskAdapters* slot[] = {&s.params};
      auto g = ComputeGradients(*w, slot, b);
      ASSERT_TRUE(g.ok()) << g.status();
      ASSERT_TRUE(AccumulateGradients(s, g->grads[0]).ok());
      const auto named = g->grads[0].NamedTensors();
      for (size_t i = 0; i < named.size(); ++i) {
        const std::vector<float> f = named[i].second.ToFloat();
        gsum[i].resize(f.size(), 0.0);
        for (size_t j = 0; j < f.size(); ++j) gsum[i][j] += f[j];
      }
    }
    if (step == 1) {
      adamw_copy = s;
      adamw_copy.optimizer = OptimizerKind::kAdamW;
    }
    ASSERT_TRUE(OptimizerStep(s).ok());
    for (size_t i = 0; i < p.size(); ++i) {
      for (size_t j = 0; j < p[i].size(); ++j) {
        const double g = gsum[i][j] / 2.0 + wd * p[i][j];
        m[i][j] = mu * m[i][j] + g;
        p[i][j] -= lr * m[i][j];
      }
    }
    double worst_p = 0, worst_m = 0, mag_p = 0, mag_m = 0;
    const auto np = s.params.NamedTensors(), nm = s.m.NamedTensors(), nv = s.v.NamedTensors();
    for (size_t i = 0; i < p.size(); ++i) {
      const std::vector<float> fp = np[i].second.ToFloat(), fm = nm[i].second.ToFloat();
      for (size_t j = 0; j < p[i].size(); ++j) {
        worst_p = std::max(worst_p, std::fabs(fp[j] - p[i][j]));
        worst_m = std::max(worst_m, std::fabs(fm[j] - m[i][j]));
        mag_p = std::max(mag_p, std::fabs(p[i][j]));
        mag_m = std::max(mag_m, std::fabs(m[i][j]));
      }
      for (float f : nv[i].second.ToFloat()) ASSERT_EQ(f, 0.0f) << "SGD leaves v at zero";
    }
    EXPECT_GT(mag_m, 0.0);
    EXPECT_LE(worst_p, 1e-6 * mag_p) << "step " << step;
    EXPECT_LE(worst_m, 1e-6 * mag_m) << "step " << step;
    EXPECT_EQ(s.step, step + 1);
    EXPECT_EQ(s.accumulated, 0);
  }
  ASSERT_TRUE(OptimizerStep(adamw_copy).ok());
  EXPECT_GT(MaxDiff(adamw_copy.params, s.params).first, 1e-4) << "OptimizerStep ignored the optimizer kind";
  // Checkpoints keep the optimizer and its momentum.
  s.momentum = 0.75;
  const std::string path = TempPath("sgd");
  ASSERT_TRUE(SaveTaskCheckpoint(path, s).ok());
  {
    // A format a reader that knows only AdamW (v1) refuses.
    auto file = SafetensorsFile::Open(path);
    ASSERT_TRUE(file.ok()) << file.status();
    EXPECT_EQ(file->metadata().at("format"), "slicesched-task-state-v2");
  }
  auto back = LoadTaskCheckpoint(path, Tiny());
  std::filesystem::remove(path);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->optimizer, OptimizerKind::kSgd);
  EXPECT_EQ(back->momentum, 0.75);
  EXPECT_TRUE(BitEqual(*back, s));
  // A joint step of two SGD tasks: the mean of their solo SGD steps.
  TaskState x = NewTask(2, 83, 0.05), y = NewTask(3, 84, 0.05);
  for (TaskState* t : {&x, &y}) t->optimizer = OptimizerKind::kSgd;
  TaskState* both[] = {&x, &y};
  ASSERT_TRUE(ShareLora(both).ok());
  const TrainBatch mixed = Mix(ClassBatch(3, 6, 2, V, 85), ClassBatch(2, 6, 3, V, 86));
  ASSERT_TRUE(AccumulateJointMicroBatch(*w, both, mixed).ok());
  TaskState sx = x, sy = y;
  ASSERT_TRUE(SgdStep(sx).ok());
  ASSERT_TRUE(SgdStep(sy).ok());
  ASSERT_TRUE(JointOptimizerStep(both).ok());
  EXPECT_LE(x.params.head.MaxAbsDiff(sx.params.head), 0.0);
  double worst = 0;
  for (size_t l = 0; l < x.params.layers.size(); ++l) {
    const auto jx = x.params.layers[l].q_b.ToFloat(), ax = sx.params.layers[l].q_b.ToFloat(),
               ay = sy.params.layers[l].q_b.ToFloat();
    for (size_t i = 0; i < jx.size(); ++i) {
      worst = std::max(worst, std::fabs(double(jx[i]) - 0.5 * (double(ax[i]) + double(ay[i]))));
    }
  }
  EXPECT_LE(worst, 1e-7);
  // Bad momentum.
  TaskState bad = x;
  ASSERT_TRUE(AccumulateJointMicroBatch(*w, both, mixed).ok());
  bad = x;
  bad.momentum = 1.0;
  const absl::Status e = SgdStep(bad);
  EXPECT_EQ(e.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(e.message().find("momentum must be in [0, 1), got 1"), std::string::npos) << e;
}

// The linear warm-up: the step at the state's step k < W is the step of
// lr (k + 1) / W, bit for bit, for AdamW and SGD; from step W on the full lr;
// checkpoints keep W; a negative W is an error naming it.
TEST(TrainOpsTest, WarmUpScalesTheFirstStepsLearningRate) {
  auto w = TinyWeights();
  const int64_t V = Tiny().vocab;
  for (OptimizerKind kind : {OptimizerKind::kAdamW, OptimizerKind::kSgd}) {
    // Powers of two: lr (k + 1) / W is exact, so the states match bit for bit.
    TaskState warm = NewTask(2, 95, 0.5);
    warm.optimizer = kind;
    warm.adamw.warmup_steps = 4;
    TaskState plain = warm;
    plain.adamw.warmup_steps = 0;
    for (int step = 0; step < 5; ++step) {
      const TrainBatch b = ClassBatch(3, 6, 2, V, 96 + step);
      for (TaskState* s : {&warm, &plain}) {
        const TaskAdapters* slot[] = {&s->params};
        auto g = ComputeGradients(*w, slot, b);
        ASSERT_TRUE(g.ok()) << g.status();
        ASSERT_TRUE(AccumulateGradients(*s, g->grads[0]).ok());
      }
      EXPECT_EQ(warm.adamw.LrAt(warm.step), step < 4 ? 0.5 * (step + 1) / 4 : 0.5);
      plain.adamw.lr = warm.adamw.LrAt(warm.step);
      ASSERT_TRUE(OptimizerStep(warm).ok());
      ASSERT_TRUE(OptimizerStep(plain).ok());
      EXPECT_EQ(MaxDiff(warm.params, plain.params).first, 0.0) << "step " << step;
    }
  }
  TaskState s = NewTask(2, 97);
  s.adamw.warmup_steps = 12;
  const std::string path = TempPath("warmup");
  ASSERT_TRUE(SaveTaskCheckpoint(path, s).ok());
  auto back = LoadTaskCheckpoint(path, Tiny());
  std::filesystem::remove(path);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->adamw.warmup_steps, 12);
  AdamWOptions bad;
  bad.warmup_steps = -1;
  EXPECT_NE(bad.Validate().message().find("warmup_steps must be >= 0, got -1"), std::string::npos) << bad.Validate();
}

// The kSum joint rule: the shared adapter moves by the SUM of the tasks' solo
// steps from the same state (each task's own full AdamW update), heads and
// moments are each task's solo ones, and the rule differs from kMean.
// Decoupling stays lossless (each TaskState continues alone exactly as a
// copy of it would).
TEST(TrainOpsTest, JointSumRuleAddsEveryTasksSoloStep) {
  auto w = TinyWeights();
  const int64_t V = Tiny().vocab;
  TaskState a = NewTask(2, 91), b = NewTask(3, 92);
  TaskState* both[] = {&a, &b};
  ASSERT_TRUE(ShareLora(both).ok());
  const TrainBatch ba = ClassBatch(3, 6, 2, V, 93), bb = ClassBatch(2, 6, 3, V, 94);
  const TrainBatch mixed = Mix(ba, bb);
  // A first joint step so that the adapter's B factors are non-zero (a
  // zero-B LoRA gives a zero gradient to the A factors).
  ASSERT_TRUE(AccumulateJointMicroBatch(*w, both, mixed).ok());
  ASSERT_TRUE(JointOptimizerStep(both, JointStepRule::kSum).ok());
  const TaskState start_a = a;
  TaskState solo_a = a, solo_b = b, mean_a = a, mean_b = b;
  ASSERT_TRUE(AccumulateMicroBatch(*w, solo_a, ba).ok());
  ASSERT_TRUE(AdamWStep(solo_a).ok());
  ASSERT_TRUE(AccumulateMicroBatch(*w, solo_b, bb).ok());
  ASSERT_TRUE(AdamWStep(solo_b).ok());
  ASSERT_TRUE(AccumulateJointMicroBatch(*w, both, mixed).ok());
  ASSERT_TRUE(JointOptimizerStep(both, JointStepRule::kSum).ok());
  TaskState* means[] = {&mean_a, &mean_b};
  ASSERT_TRUE(AccumulateJointMicroBatch(*w, means, mixed).ok());
  ASSERT_TRUE(JointOptimizerStep(means, JointStepRule::kMean).ok());
  EXPECT_TRUE(BitEqual(TaskAdapters{a.params.lora, a.params.layers, Tensor()},
                       TaskAdapters{b.params.lora, b.params.layers, Tensor()}))
      << "the tasks still share one adapter";
  double worst = 0, scale = 0, mean_gap = 0;
  for (size_t l = 0; l < a.params.layers.size(); ++l) {
    for (auto field : {&LoraLayer::q_a, &LoraLayer::q_b, &LoraLayer::v_a, &LoraLayer::v_b}) {
      const auto j = (a.params.layers[l].*field).ToFloat();
      const auto s0 = (start_a.params.layers[l].*field).ToFloat();
      const auto sa = (solo_a.params.layers[l].*field).ToFloat();
      const auto sb = (solo_b.params.layers[l].*field).ToFloat();
      const auto jm = (mean_a.params.layers[l].*field).ToFloat();
      for (size_t i = 0; i < j.size(); ++i) {
        const double expect = double(s0[i]) + (double(sa[i]) - double(s0[i])) +
                              (double(sb[i]) - double(s0[i]));
        worst = std::max(worst, std::fabs(double(j[i]) - expect));
        scale = std::max(scale, std::fabs(double(sa[i]) - double(s0[i])));
        mean_gap = std::max(mean_gap, std::fabs(double(j[i]) - double(jm[i])));
      }
    }
  }
  ASSERT_GT(scale, 1e-4) << "the solo steps move the adapter";
  EXPECT_LE(worst, 1e-6);
  EXPECT_GT(mean_gap, 0.1 * scale) << "kSum is not kMean";
  EXPECT_LE(MaxDiff(a.m, solo_a.m).first, 1e-5 * MaxDiff(a.m, solo_a.m).second);
  EXPECT_LE(a.params.head.MaxAbsDiff(solo_a.params.head), 1e-6);
  EXPECT_LE(b.params.head.MaxAbsDiff(solo_b.params.head), 1e-6);
  EXPECT_EQ(a.step, 2);
  EXPECT_EQ(b.step, 2);
  // Decoupled A continues exactly like an isolated copy of its state.
  TaskState isolated = a;
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(AccumulateMicroBatch(*w, a, ba).ok());
    ASSERT_TRUE(AdamWStep(a).ok());
    ASSERT_TRUE(AccumulateMicroBatch(*w, b, bb).ok());
    ASSERT_TRUE(AdamWStep(b).ok());
    ASSERT_TRUE(AccumulateMicroBatch(*w, isolated, ba).ok());
    ASSERT_TRUE(AdamWStep(isolated).ok());
  }
  EXPECT_TRUE(BitEqual(a, isolated));
}

// The stop-loss policy (ymir/stop_loss.h) driving a real spatial pairing:
// joint steps until the policy decouples, then each task continues alone
// and holds bit-exactly what it would hold with no partner at all (a copy of
// its state at the decoupling, continued in isolation), with its own head,
// moments and step count; the partner's later training never reaches it.
TEST(TrainOpsTest, StopLossDecouplesASpatialPairLosslessly) {
  auto w = TinyWeights();
  const int64_t V = Tiny().vocab;
  TaskState a = NewTask(2, 81), b = NewTask(3, 82);
  TaskState* both[] = {&a, &b};
  ASSERT_TRUE(ShareLora(both).ok());
  const TrainBatch ba = ClassBatch(3, 6, 2, V, 83), bb = ClassBatch(2, 6, 3, V, 84);
  const TrainBatch mixed = Mix(ba, bb);
  auto stop = ymir::StopLoss::Create(ymir::PairingMode::kSpatial, {.window_epochs = 2.0});
  ASSERT_TRUE(stop.ok());
  // One "epoch" per joint step. Constructed references: B's partner-free
  // training would be worse than the pairing (B improves), A's would be
  // better (A does not): the pairing must be decoupled at epoch 2.
  int64_t step = 0;
  while (stop->verdict() == ymir::StopLossVerdict::kUndecided && step < 5) {
    auto losses = AccumulateJointMicroBatch(*w, both, mixed);
    ASSERT_TRUE(losses.ok()) << losses.status();
    ASSERT_TRUE(JointOptimizerStep(both).ok());
    ++step;
    ASSERT_TRUE(stop->Observe(1, double(step), (*losses)[1], (*losses)[1] + 1.0).ok());
    ASSERT_TRUE(stop->Observe(0, double(step), (*losses)[0], (*losses)[0] - 1.0).ok());
  }
  ASSERT_EQ(stop->verdict(), ymir::StopLossVerdict::kDecouple) << stop->reason();
  EXPECT_EQ(step, 2);
  EXPECT_NE(stop->reason().find("member 0"), std::string::npos) << stop->reason();

  // Decoupling: each TaskState is now an independent task.
  EXPECT_EQ(a.step, 2);
  EXPECT_EQ(b.step, 2);
  EXPECT_TRUE(BitEqual(TaskAdapters{a.params.lora, a.params.layers, Tensor()},
                       TaskAdapters{b.params.lora, b.params.layers, Tensor()}))
      << "both leave with the shared adapter as it was";
  TaskState isolated_a = a, isolated_b = b;  // as if the partner had never existed from here
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(AccumulateMicroBatch(*w, a, ba).ok());
    ASSERT_TRUE(AdamWStep(a).ok());
    ASSERT_TRUE(AccumulateMicroBatch(*w, b, bb).ok());
    ASSERT_TRUE(AdamWStep(b).ok());
  }
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(AccumulateMicroBatch(*w, isolated_a, ba).ok());
    ASSERT_TRUE(AdamWStep(isolated_a).ok());
  }
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(AccumulateMicroBatch(*w, isolated_b, bb).ok());
    ASSERT_TRUE(AdamWStep(isolated_b).ok());
  }
  EXPECT_TRUE(BitEqual(a, isolated_a));
  EXPECT_TRUE(BitEqual(b, isolated_b));
  EXPECT_EQ(a.step, 5);
  EXPECT_GT(a.params.layers[0].q_b.MaxAbsDiff(b.params.layers[0].q_b), 0.0);
}

TEST(TrainOpsTest, TemporalTransferCopiesAdapters) {
  auto w = TinyWeights();
  const int64_t V = Tiny().vocab;
  TaskState a = NewTask(2, 71);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(AccumulateMicroBatch(*w, a, ClassBatch(4, 5, 2, V, 72)).ok());
    ASSERT_TRUE(AdamWStep(a).ok());
  }
  TaskState b = NewTask(4, 73);
  const Tensor b_head = b.params.head;
  ASSERT_TRUE(TransferLora(a, b).ok());
  EXPECT_TRUE(BitEqual(TaskAdapters{a.params.lora, a.params.layers, Tensor()},
                       TaskAdapters{b.params.lora, b.params.layers, Tensor()}));
  EXPECT_EQ(b.params.head.ToFloat(), b_head.ToFloat());
  EXPECT_EQ(b.step, 0);
  EXPECT_EQ(b.accumulated, 0);
  for (const auto& [name, t] : b.m.NamedTensors()) {
    for (float f : t.ToFloat()) ASSERT_EQ(f, 0.f) << name;
  }
  // B's training does not touch A.
  const TaskState a_before = a;
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(AccumulateMicroBatch(*w, b, ClassBatch(4, 5, 4, V, 74)).ok());
    ASSERT_TRUE(AdamWStep(b).ok());
  }
  EXPECT_TRUE(BitEqual(a, a_before));
  EXPECT_GT(b.params.layers[1].q_a.MaxAbsDiff(a.params.layers[1].q_a), 0.0);
  // Another rank cannot be transferred.
  auto c = TaskState::Init(Tiny(), LoraConfig{2, 4.0}, 2, 75);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(TransferLora(a, *c).code(), absl::StatusCode::kInvalidArgument);
}

// A paused job (mid-accumulation) resumes bit-identically from its
// checkpoint.
TEST(TrainOpsTest, CheckpointRoundTripResumesBitIdentically) {
  auto w = TinyWeights();
  const int64_t V = Tiny().vocab;
  TaskState task = NewTask(3, 81);
  // Metadata that only an exact (17-digit) spelling round-trips.
  task.adamw.beta2 = 0.9876543210987654;
  task.adamw.lr = 0.01 / 3.0;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(AccumulateMicroBatch(*w, task, ClassBatch(2, 5, 3, V, 82 + i)).ok());
    ASSERT_TRUE(AdamWStep(task).ok());
  }
  ASSERT_TRUE(AccumulateMicroBatch(*w, task, ClassBatch(2, 5, 3, V, 90)).ok());  // pending
  const std::string path = TempPath("ckpt");
  ASSERT_TRUE(SaveTaskCheckpoint(path, task).ok());
  auto restored = LoadTaskCheckpoint(path, Tiny());
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_TRUE(BitEqual(*restored, task));
  EXPECT_EQ(restored->accumulated, 1);
  EXPECT_EQ(restored->step, 3);
  // Loading into another model fails clearly.
  LlamaDims other = Tiny();
  other.layers = 2;
  other.fusion = 2;
  auto bad = LoadTaskCheckpoint(path, other);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
  std::filesystem::remove(path);

  std::vector<double> l1, l2;
  for (int i = 0; i < 3; ++i) {
    const TrainBatch b = ClassBatch(2, 5, 3, V, 91 + i);
    auto x1 = AccumulateMicroBatch(*w, task, b);
    auto x2 = AccumulateMicroBatch(*w, *restored, b);
    ASSERT_TRUE(x1.ok() && x2.ok());
    l1.push_back(*x1);
    l2.push_back(*x2);
    ASSERT_TRUE(AdamWStep(task).ok());
    ASSERT_TRUE(AdamWStep(*restored).ok());
  }
  EXPECT_EQ(l1, l2);
  EXPECT_TRUE(BitEqual(*restored, task));
}

TEST(TrainOpsTest, BadInputsGiveClearErrors) {
  auto w = TinyWeights();
  const LlamaDims d = Tiny();
  auto rank0 = TaskAdapters::Init(d, LoraConfig{0, 8.0}, 2, 1);
  EXPECT_EQ(rank0.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(rank0.status().message().find("rank"), absl::string_view::npos) << rank0.status();
  EXPECT_EQ(TaskAdapters::Init(d, LoraConfig{4, -1.0}, 2, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TaskAdapters::Init(d, LoraConfig{4, 8.0}, 0, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  AdamWOptions bad_opt;
  bad_opt.beta1 = 1.0;
  EXPECT_EQ(TaskState::Init(d, LoraConfig{}, 2, 1, bad_opt).status().code(),
            absl::StatusCode::kInvalidArgument);

  TaskState task = NewTask(2, 2);
  const TaskAdapters* slots[] = {&task.params};
  TrainBatch batch = ClassBatch(2, 4, 2, d.vocab, 3);
  // Labels of another shape.
  TrainBatch wrong = batch;
  wrong.labels = *LastPositionLabels(std::vector<int64_t>{0, 1}, 5);
  auto s = ComputeGradients(*w, slots, wrong);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << s.status();
  EXPECT_NE(s.status().message().find("[2,4]"), absl::string_view::npos) << s.status();
  // A label outside the head.
  wrong.labels = *LastPositionLabels(std::vector<int64_t>{0, 2}, 4);
  s = ComputeGradients(*w, slots, wrong);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kOutOfRange) << s.status();
  // A row naming a task the call does not have.
  wrong = batch;
  wrong.row_task = {0, 1};
  s = ComputeGradients(*w, slots, wrong);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kOutOfRange) << s.status();
  wrong.row_task = {0, 0, 0};
  EXPECT_EQ(ComputeGradients(*w, slots, wrong).status().code(), absl::StatusCode::kInvalidArgument);
  // Adapters of another shape.
  TaskAdapters broken = task.params;
  broken.layers[1].q_a = Tensor::FromFloat(std::vector<float>(3 * 64, 0.f), {3, 64});
  const TaskAdapters* broken_slots[] = {&broken};
  s = ComputeGradients(*w, broken_slots, batch);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << s.status();
  EXPECT_NE(s.status().message().find("layers.1.q_a"), absl::string_view::npos) << s.status();
  broken = task.params;
  broken.layers.pop_back();
  EXPECT_EQ(ComputeGradients(*w, broken_slots, batch).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Hidden states of the wrong width; a group out of range.
  const Tensor narrow = Tensor::FromFloat(std::vector<float>(2 * 3 * 32, 0.5f), {2, 3, 32});
  auto f = TrainGroupForward(*w, 0, slots, {}, narrow);
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(f.status().message().find("[2,3,32]"), absl::string_view::npos) << f.status();
  EXPECT_EQ(TrainGroupForward(*w, 2, slots, {}, narrow).status().code(),
            absl::StatusCode::kOutOfRange);
  // d(out) of the wrong shape; the tape stays usable.
  auto h = Embedding(*w, batch.tokens);
  ASSERT_TRUE(h.ok());
  auto fw = TrainGroupForward(*w, 0, slots, {}, *h);
  ASSERT_TRUE(fw.ok()) << fw.status();
  auto bw = TrainGroupBackward(*fw->tape, narrow);
  EXPECT_EQ(bw.status().code(), absl::StatusCode::kInvalidArgument) << bw.status();
  EXPECT_TRUE(TrainGroupBackward(*fw->tape, fw->hidden_out).ok());
  // Gradients of another shape.
  TaskState other = NewTask(5, 4);
  EXPECT_EQ(AccumulateGradients(task, other.params).code(), absl::StatusCode::kInvalidArgument);
  // Out-of-vocabulary tokens.
  wrong = batch;
  wrong.tokens = Tensor::FromInt64(std::vector<int64_t>{1, 2, 3, 256, 1, 2, 3, 4}, {2, 4});
  EXPECT_EQ(ComputeGradients(*w, slots, wrong).status().code(), absl::StatusCode::kOutOfRange);
  // A missing checkpoint.
  EXPECT_FALSE(LoadTaskCheckpoint("/nonexistent/ckpt.safetensors", d).ok());
}

}  // namespace
}  // namespace slicesched::executor
