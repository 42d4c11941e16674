#include "slicesched/estimate/estimators.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "slicesched/common/strings.h"
#include "slicesched/gmg/llama.h"

// Counts heap allocations while g_count_allocations is set (for the
// allocation-free Predict check).
std::atomic<bool> g_count_allocations{false};
std::atomic<int64_t> g_allocations{0};

// A replacement global operator new/delete pair backed by malloc/free; GCC
// cannot tell that the pair matches once inlined into callers.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(std::size_t size) {
  if (g_count_allocations.load(std::memory_order_relaxed)) g_allocations.fetch_add(1);
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop

namespace slicesched {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// ---------------------------------------------------------------------------
// Fixtures and ground truths

// A template with one op of each basis kind; attribute declaration order is
// deliberately not the basis order (k before b) to check name resolution.
std::shared_ptr<const GraphTemplate> MixedTemplate() {
  TemplateBuilder b("mixed");
  b.ExternalInput("x", DType::kF32, {"B", "M", "K"})
      .ExternalInput("w", DType::kF32, {"B", "K", "N"})
      .ExternalInput("tokens", DType::kI64, {"B", "S"})
      .Op("mm", OpKind::kMatmul)
      .Inputs({"$x", "$w"})
      .Output("y", DType::kF32, {"B", "M", "N"})
      .Attr("k", "K")
      .Attr("b", "B")
      .Attr("m", "M")
      .Attr("n", "N")
      .Op("embed", OpKind::kEmbedding)
      .Inputs({"$tokens"})
      .Output("h", DType::kF32, {"B", "S", "M"})
      .Attr("batch", "B")
      .Attr("new_tokens", "S")
      .Op("layers", OpKind::kFusedLayers)
      .Inputs({"embed"})
      .Output("h", DType::kF32, {"B", "S", "M"})
      .Attr("new_tokens", "S")  // no batch, no context: 1 and 0
      .Op("head", OpKind::kLmHead)
      .Inputs({"layers"})
      .Output("logits", DType::kF32, {"B", "N"})
      .Attr("batch", "B")
      .Op("misc", OpKind::kGeneric)
      .Inputs({"mm"})
      .Output("z", DType::kF32, {"1"});
  auto t = b.Build();
  EXPECT_TRUE(t.ok()) << t.status();
  return *t;
}

LlamaTemplates Tiny() {
  auto dims = LlamaPreset("tiny");
  EXPECT_TRUE(dims.ok()) << dims.status();
  auto t = BuildLlamaTemplates(*dims);
  EXPECT_TRUE(t.ok()) << t.status();
  return *t;
}

int OpIndex(const GraphTemplate& t, absl::string_view name) {
  auto i = t.FindOp(name);
  EXPECT_TRUE(i.ok()) << i.status();
  return i.ok() ? *i : -1;
}

AcceleratorSet ThreeGpus() {
  std::vector<DeviceSpec> devices;
  for (int i = 0; i < 3; ++i) {
    DeviceSpec d;
    d.name = StrCat("gpu", i);
    d.type = "A16";
    d.memory = Bytes::GiB(64);
    devices.push_back(d);
  }
  auto set = AcceleratorSet::Create(devices, {12e9, Duration::Micros(20)});
  EXPECT_TRUE(set.ok()) << set.status();
  return *std::move(set);
}

// Matmul ground truth (ns): FLOP term, three tensor-size terms, launch.
constexpr double kMatmulTruth[] = {1e-4, 2e-3, 1.5e-3, 2.5e-3, 5000};

double MatmulTruth(const std::vector<int64_t>& kbmn, const double* beta = kMatmulTruth) {
  // Attribute order of MixedTemplate's mm: k, b, m, n.
  const double k = kbmn[0], b = kbmn[1], m = kbmn[2], n = kbmn[3];
  return beta[0] * b * m * n * k + beta[1] * b * m * k + beta[2] * b * k * n + beta[3] * b * m * n +
         beta[4];
}

std::vector<int64_t> RandomMatmul(std::mt19937_64& rng) {
  std::uniform_int_distribution<int64_t> batch(1, 8);
  std::uniform_real_distribution<double> log_dim(std::log(64.0), std::log(4096.0));
  auto dim = [&] { return static_cast<int64_t>(std::exp(log_dim(rng))); };
  const int64_t b = batch(rng);
  const int64_t m = dim(), n = dim(), k = dim();
  return {k, b, m, n};
}

// Fused 8-layer group ground truth (ns) over [B*S, B*S*(C+S), B*(C+S), 1].
constexpr double kLayersTruth[] = {35000, 2.6, 33, 3.5e6};

double LayersTruth(const std::vector<int64_t>& attrs) {
  const double b = attrs[0], s = attrs[1], c = attrs[2];
  return kLayersTruth[0] * b * s + kLayersTruth[1] * b * s * (c + s) +
         kLayersTruth[2] * b * (c + s) + kLayersTruth[3];
}

// Llama g0 attrs: batch, new_tokens, context, layers. Half prefill (C = 0,
// S up to 2048), half decode (S = 1, C up to 4096).
std::vector<int64_t> RandomLayers(std::mt19937_64& rng) {
  std::uniform_int_distribution<int64_t> batch(1, 32);
  std::uniform_int_distribution<int64_t> prompt(16, 2048);
  std::uniform_int_distribution<int64_t> context(16, 4096);
  std::bernoulli_distribution prefill(0.5);
  const int64_t b = batch(rng);
  if (prefill(rng)) return {b, prompt(rng), 0, 2};
  return {b, 1, context(rng), 2};
}

Duration Noisy(double ns, std::mt19937_64& rng, double rel_sigma = 0.01) {
  std::normal_distribution<double> noise(0.0, rel_sigma);
  return Duration::Nanos(std::llround(ns * (1.0 + noise(rng))));
}

double PctError(double predicted, double actual) {
  return std::abs(predicted - actual) / actual * 100.0;
}

// ---------------------------------------------------------------------------
// FeatureBasis

TEST(FeatureBasisTest, ResolvesAttributesByName) {
  auto t = MixedTemplate();
  const FeatureBasis mm = FeatureBasis::For(t->op(OpIndex(*t, "mm")));
  ASSERT_EQ(mm.size(), 5);
  EXPECT_THAT(mm.names(), ElementsAre("b*m*n*k", "b*m*k", "b*k*n", "b*m*n", "1"));
  const std::vector<int64_t> kbmn = {5, 2, 3, 7};  // k, b, m, n
  const Features f = mm.Compute(kbmn);
  ASSERT_EQ(f.n, 5);
  EXPECT_DOUBLE_EQ(f.v[0], 2 * 3 * 7 * 5);
  EXPECT_DOUBLE_EQ(f.v[1], 2 * 3 * 5);
  EXPECT_DOUBLE_EQ(f.v[2], 2 * 5 * 7);
  EXPECT_DOUBLE_EQ(f.v[3], 2 * 3 * 7);
  EXPECT_DOUBLE_EQ(f.v[4], 1);

  const FeatureBasis embed = FeatureBasis::For(t->op(OpIndex(*t, "embed")));
  EXPECT_THAT(embed.names(), ElementsAre("B*S", "1"));
  const std::vector<int64_t> bs = {4, 9};
  EXPECT_DOUBLE_EQ(embed.Compute(bs).v[0], 36);

  const FeatureBasis head = FeatureBasis::For(t->op(OpIndex(*t, "head")));
  EXPECT_THAT(head.names(), ElementsAre("B", "1"));
  const FeatureBasis misc = FeatureBasis::For(t->op(OpIndex(*t, "misc")));
  EXPECT_THAT(misc.names(), ElementsAre("1"));
  EXPECT_EQ(misc.Compute({}).n, 1);
}

TEST(FeatureBasisTest, MissingAttributesCountAsOneBatchAndZeroContext) {
  auto t = MixedTemplate();
  // "layers" declares only new_tokens: batch = 1, context = 0.
  const FeatureBasis fb = FeatureBasis::For(t->op(OpIndex(*t, "layers")));
  ASSERT_EQ(fb.size(), 4);
  const std::vector<int64_t> s = {10};
  const Features f = fb.Compute(s);
  EXPECT_DOUBLE_EQ(f.v[0], 10);   // B*S
  EXPECT_DOUBLE_EQ(f.v[1], 100);  // B*S*(C+S)
  EXPECT_DOUBLE_EQ(f.v[2], 10);   // B*(C+S)
  EXPECT_DOUBLE_EQ(f.v[3], 1);
}

TEST(FeatureBasisTest, LlamaGroupsUseBatchTokensContext) {
  LlamaTemplates t = Tiny();
  const FeatureBasis fb = FeatureBasis::For(t.decode->op(OpIndex(*t.decode, "g0")));
  EXPECT_THAT(fb.names(), ElementsAre("B*S", "B*S*(C+S)", "B*(C+S)", "1"));
  const std::vector<int64_t> attrs = {4, 1, 100, 2};  // batch, new_tokens, context, layers
  const Features f = fb.Compute(attrs);
  EXPECT_DOUBLE_EQ(f.v[0], 4);
  EXPECT_DOUBLE_EQ(f.v[1], 4 * 101);
  EXPECT_DOUBLE_EQ(f.v[2], 4 * 101);
  EXPECT_DOUBLE_EQ(f.v[3], 1);
}

// Dot is the prediction path (OpEstimator::PredictNs, the simulator's
// Rebuild): it must give bit for bit what the coefficients dotted with
// Compute()'s features give, summed from the first feature on, for every
// kind, with attributes missing (short spans) and with products that round.
TEST(FeatureBasisTest, DotIsComputeDottedInOrderBitForBit) {
  auto t = MixedTemplate();
  LlamaTemplates tiny = Tiny();
  std::vector<std::pair<std::string, FeatureBasis>> bases;
  for (const char* op : {"mm", "embed", "layers", "head", "misc"}) {
    bases.emplace_back(op, FeatureBasis::For(t->op(OpIndex(*t, op))));
  }
  bases.emplace_back("g0", FeatureBasis::For(tiny.decode->op(OpIndex(*tiny.decode, "g0"))));
  std::mt19937_64 rng(2026);
  std::uniform_real_distribution<double> coeff(0.0, 1e4);
  std::uniform_int_distribution<int64_t> attr(-1000, int64_t{1} << 40);
  std::uniform_int_distribution<int> count(0, 5);
  for (const auto& [name, basis] : bases) {
    for (int trial = 0; trial < 2000; ++trial) {
      // Zero past size(), as OpEstimator keeps them. One trial in three
      // weighs a single feature (in a full sum the largest term hides the
      // rounding of the others), one in nine none.
      double c[kMaxFeatures] = {};
      const int only = trial % 3 == 0 ? (trial / 3) % (basis.size() + 1) : -1;
      for (int i = 0; i < basis.size(); ++i) c[i] = only < 0 || only == i ? coeff(rng) : 0.0;
      std::vector<int64_t> attrs(static_cast<size_t>(count(rng)));
      for (int64_t& a : attrs) a = attr(rng);
      const Features f = basis.Compute(attrs);
      double expected = 0;
      for (int i = 0; i < f.n; ++i) expected += c[i] * f.v[i];
      const double dot = basis.Dot(c, attrs);
      ASSERT_EQ(std::bit_cast<uint64_t>(dot), std::bit_cast<uint64_t>(expected))
          << name << " trial " << trial << ": " << dot << " vs " << expected;
    }
  }
}

// ---------------------------------------------------------------------------
// OpEstimator: recovery from noisy data

TEST(OpEstimatorTest, RecoversMatmulCoefficientsUnderOnePercentNoise) {
  auto t = MixedTemplate();
  OpEstimator est;
  const int key = est.Register("A16", *t, OpIndex(*t, "mm"));
  std::mt19937_64 rng(1234);
  for (int i = 0; i < 400; ++i) {
    const auto attrs = RandomMatmul(rng);
    est.Observe(key, attrs, Noisy(MatmulTruth(attrs), rng));
  }
  double sum = 0;
  const int kFresh = 500;
  for (int i = 0; i < kFresh; ++i) {
    const auto attrs = RandomMatmul(rng);
    sum += PctError(est.PredictNs(key, attrs), MatmulTruth(attrs));
  }
  EXPECT_LE(sum / kFresh, 1.0);
  const auto stats = est.Stats();
  ASSERT_EQ(stats.size(), 1u);
  EXPECT_TRUE(stats[0].fitted);
  EXPECT_EQ(stats[0].samples, 400);
  // The dominant terms are identified well: FLOPs and launch.
  EXPECT_NEAR(stats[0].coeffs[0], kMatmulTruth[0], 0.02 * kMatmulTruth[0]);
  EXPECT_NEAR(stats[0].coeffs[4], kMatmulTruth[4], 0.05 * kMatmulTruth[4]);
}

TEST(OpEstimatorTest, RecoversFusedLayersOverPrefillAndDecodeShapes) {
  LlamaTemplates t = Tiny();
  OpEstimator est;
  const int key = est.Register("A16", *t.prefill, OpIndex(*t.prefill, "g0"));
  std::mt19937_64 rng(99);
  for (int i = 0; i < 400; ++i) {
    const auto attrs = RandomLayers(rng);
    est.Observe(key, attrs, Noisy(LayersTruth(attrs), rng));
  }
  double sum_prefill = 0, sum_decode = 0;
  int n_prefill = 0, n_decode = 0;
  for (int i = 0; i < 600; ++i) {
    const auto attrs = RandomLayers(rng);
    const double err = PctError(est.PredictNs(key, attrs), LayersTruth(attrs));
    if (attrs[2] == 0) {
      sum_prefill += err;
      ++n_prefill;
    } else {
      sum_decode += err;
      ++n_decode;
    }
  }
  ASSERT_GT(n_prefill, 0);
  ASSERT_GT(n_decode, 0);
  EXPECT_LE(sum_prefill / n_prefill, 1.0);
  EXPECT_LE(sum_decode / n_decode, 1.0);
  EXPECT_LE((sum_prefill + sum_decode) / (n_prefill + n_decode), 1.0);
}

// ---------------------------------------------------------------------------
// OpEstimator: constraints, cold start, window

TEST(OpEstimatorTest, NegativeTrueCoefficientStillGivesNonNegativePredictions) {
  auto t = MixedTemplate();
  OpEstimator est;
  const int key = est.Register("A16", *t, OpIndex(*t, "mm"));
  // A "truth" with a negative b*m*k term; positive on the training range
  // (n >= 64) but negative for thin matmuls.
  const double beta[] = {1e-4, -5e-3, 0, 0, 100};
  std::mt19937_64 rng(7);
  for (int i = 0; i < 300; ++i) {
    const auto attrs = RandomMatmul(rng);
    const double truth = MatmulTruth(attrs, beta);
    ASSERT_GT(truth, 0);
    est.Observe(key, attrs, Noisy(truth, rng));
  }
  const auto stats = est.Stats();
  for (double c : stats[0].coeffs) EXPECT_GE(c, 0);
  int negative_truths = 0;
  for (int64_t k : {1, 16, 512, 8192}) {
    for (int64_t b : {1, 8}) {
      for (int64_t m : {1, 64, 4096, 65536}) {
        for (int64_t n : {0, 1, 2, 8, 64, 4096}) {
          const std::vector<int64_t> attrs = {k, b, m, n};
          if (MatmulTruth(attrs, beta) < 0) ++negative_truths;
          EXPECT_GE(est.PredictNs(key, attrs), 0.0) << k << " " << b << " " << m << " " << n;
          EXPECT_GE(est.Predict(key, attrs), Duration::Zero());
        }
      }
    }
  }
  EXPECT_GT(negative_truths, 0);  // the test probes where the truth goes negative
}

TEST(OpEstimatorTest, ColdStartUsesPriorThenFit) {
  auto t = MixedTemplate();
  OpEstimator est;
  const int key = est.Register("A16", *t, OpIndex(*t, "head"));  // basis [B, 1]
  const std::vector<int64_t> b4 = {4};
  EXPECT_EQ(est.Predict(key, b4), Duration::Millis(1));  // the default default

  const double prior[] = {1000, 50000};
  ASSERT_TRUE(est.SetPrior(key, prior).ok());
  EXPECT_DOUBLE_EQ(est.PredictNs(key, b4), 54000);

  // Truth: 3000 * B + 20000. One sample is fewer than the two features.
  auto truth = [](int64_t b) { return 3000.0 * b + 20000; };
  est.Observe(key, std::vector<int64_t>{2}, Duration::Nanos(static_cast<int64_t>(truth(2))));
  EXPECT_FALSE(est.Stats()[0].fitted);
  EXPECT_DOUBLE_EQ(est.PredictNs(key, b4), 54000);

  est.Observe(key, std::vector<int64_t>{8}, Duration::Nanos(static_cast<int64_t>(truth(8))));
  EXPECT_TRUE(est.Stats()[0].fitted);
  for (int64_t b : {1, 4, 16, 64}) {
    EXPECT_NEAR(est.PredictNs(key, std::vector<int64_t>{b}), truth(b), 1e-6 * truth(b)) << b;
  }
  // A prior set after fitting is kept but does not replace the fit.
  const double other[] = {1, 1};
  ASSERT_TRUE(est.SetPrior(key, other).ok());
  EXPECT_NEAR(est.PredictNs(key, b4), truth(4), 1e-6 * truth(4));
}

TEST(OpEstimatorTest, DefaultDurationWithoutPrior) {
  auto t = MixedTemplate();
  OpEstimator est({.window = 16, .default_duration = Duration::Micros(250)});
  const int head = est.Register("A16", *t, OpIndex(*t, "head"));
  const int misc = est.Register("A16", *t, OpIndex(*t, "misc"));
  EXPECT_EQ(est.Predict(head, std::vector<int64_t>{32}), Duration::Micros(250));
  EXPECT_EQ(est.Predict(misc, {}), Duration::Micros(250));
  EXPECT_FALSE(est.Stats()[0].fitted);
  // The constant basis is fitted after a single sample.
  est.Observe(misc, {}, Duration::Micros(40));
  EXPECT_EQ(est.Predict(misc, {}), Duration::Micros(40));
  // Out-of-range handles answer the default, never crash.
  EXPECT_EQ(est.Predict(-1, {}), Duration::Micros(250));
  EXPECT_EQ(est.Predict(17, {}), Duration::Micros(250));
}

TEST(OpEstimatorTest, SetPriorRejectsWrongSizeAndNegativeCoefficients) {
  auto t = MixedTemplate();
  OpEstimator est;
  const int key = est.Register("A16", *t, OpIndex(*t, "head"));
  const double three[] = {1, 2, 3};
  absl::Status s = est.SetPrior(key, three);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("expected 2 coefficients"));
  const double negative[] = {1, -2};
  s = est.SetPrior(key, negative);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("non-negative"));
  EXPECT_EQ(est.SetPrior(5, negative).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(est.Predict(key, std::vector<int64_t>{1}), Duration::Millis(1));
}

TEST(OpEstimatorTest, RegisterIsIdempotentAndKeyedByDeviceType) {
  auto t = MixedTemplate();
  OpEstimator est;
  const int a = est.Register("A16", *t, OpIndex(*t, "mm"));
  const int b = est.Register("A16", *t, OpIndex(*t, "mm"));
  const int c = est.Register("H100", *t, OpIndex(*t, "mm"));
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_EQ(est.num_keys(), 2);
  EXPECT_EQ(est.Register("A16", *t, 99), -1);
  const auto stats = est.Stats();
  EXPECT_EQ(stats[1].device_type, "H100");
  EXPECT_EQ(stats[1].template_name, "mixed");
  EXPECT_EQ(stats[1].op_name, "mm");
}

// A chunked prefill's pieces compute what the one-piece prefill's ops do:
// they share its keys (whichever template registers first), so a template
// seen for the first time predicts from what the others measured.
TEST(OpEstimatorTest, ChunkedPrefillSharesTheOnePiecePrefillsKeys) {
  const LlamaTemplates t = Tiny();
  auto dims = LlamaPreset("tiny");
  ASSERT_TRUE(dims.ok()) << dims.status();
  auto chunked = BuildLlamaChunkedPrefill(*dims, 3);
  ASSERT_TRUE(chunked.ok()) << chunked.status();
  const GraphTemplate& c3 = **chunked;
  for (bool whole_first : {true, false}) {
    OpEstimator est;
    auto whole = [&](const std::string& op) { return est.Register("A16", *t.prefill, OpIndex(*t.prefill, op)); };
    auto piece = [&](const std::string& op) { return est.Register("A16", c3, OpIndex(c3, op)); };
    if (whole_first) (void)whole("g1");
    const int g1c2 = piece("g1c2");
    EXPECT_EQ(piece("g1"), g1c2);
    EXPECT_EQ(piece("g1c1"), g1c2);
    EXPECT_EQ(whole("g1"), g1c2) << whole_first;
    EXPECT_EQ(piece("embed_c2"), whole("embed"));
    EXPECT_EQ(piece("head"), whole("head"));
    EXPECT_EQ(piece("sample"), whole("sample"));
    EXPECT_NE(piece("g0c2"), g1c2);
    // Decode steps keep keys of their own.
    EXPECT_NE(est.Register("A16", *t.decode, OpIndex(*t.decode, "g1")), g1c2);
    // One model, named after the one-piece prefill: a sample measured on a
    // piece moves the prediction for a whole prompt.
    const auto stats = est.Stats();
    EXPECT_EQ(stats[g1c2].template_name, "tiny/prefill");
    EXPECT_EQ(stats[g1c2].op_name, "g1");
    const std::vector<int64_t> piece_attrs = {1, 40, 80, 2}, whole_attrs = {1, 120, 0, 2};
    const double before = est.PredictNs(whole("g1"), whole_attrs);
    for (int i = 0; i < 8; ++i) est.Observe(g1c2, piece_attrs, Duration::Millis(30 + i));
    EXPECT_NE(est.PredictNs(whole("g1"), whole_attrs), before);
  }
}

// An op whose cost_of names an op with another attribute layout cannot share
// its model: both keep their own, under distinct names.
TEST(OpEstimatorTest, CostOfWithAnotherFeatureBasisKeepsKeysApart) {
  TemplateBuilder a("a");
  a.ExternalInput("x", DType::kF32, {"B", "S"})
      .Op("op", OpKind::kFusedLayers)
      .Inputs({"$x"})
      .Output("h", DType::kF32, {"B", "S"})
      .Attr("batch", "B")
      .Attr("new_tokens", "S");
  TemplateBuilder b("b");
  b.ExternalInput("x", DType::kF32, {"B", "S"})
      .Op("op", OpKind::kFusedLayers)
      .Inputs({"$x"})
      .Output("h", DType::kF32, {"B", "S"})
      .Attr("new_tokens", "S")  // another position: another basis
      .Attr("batch", "B")
      .CostOf("a", "op");
  auto ta = a.Build();
  auto tb = b.Build();
  ASSERT_TRUE(ta.ok()) << ta.status();
  ASSERT_TRUE(tb.ok()) << tb.status();
  for (bool a_first : {true, false}) {
    OpEstimator est;
    const int ka = a_first ? est.Register("A16", **ta, 0) : -1;
    const int kb = est.Register("A16", **tb, 0);
    const int ka2 = est.Register("A16", **ta, 0);
    if (a_first) {
      EXPECT_EQ(ka, ka2);
    }
    EXPECT_NE(kb, ka2) << a_first;
    EXPECT_EQ(est.num_keys(), 2);
    EXPECT_EQ(est.Register("A16", **tb, 0), kb);
    EXPECT_EQ(est.Register("A16", **ta, 0), ka2);
  }
}

TEST(TemplateBuilderCostOfTest, RefusesNamesWithTheSeparator) {
  TemplateBuilder b("t");
  b.ExternalInput("x", DType::kI64, {"B"}).Op("op", OpKind::kGeneric).Inputs({"$x"}).Output("y", DType::kI64, {"B"}).CostOf(
      "other|x", "op");
  auto built = b.Build();
  ASSERT_FALSE(built.ok());
  EXPECT_THAT(built.status().message(), HasSubstr("cost_of"));
  EXPECT_THAT(built.status().message(), HasSubstr("'other|x'"));
}

TEST(OpEstimatorTest, WindowIsBoundedSoOldRegimeIsForgotten) {
  auto t = MixedTemplate();
  OpEstimator est({.window = 32});
  const int key = est.Register("A16", *t, OpIndex(*t, "head"));
  auto observe = [&](double slope, double intercept, int count, std::mt19937_64& rng) {
    std::uniform_int_distribution<int64_t> batch(1, 64);
    for (int i = 0; i < count; ++i) {
      const int64_t b = batch(rng);
      est.Observe(key, std::vector<int64_t>{b},
                  Duration::Nanos(std::llround(slope * static_cast<double>(b) + intercept)));
    }
  };
  std::mt19937_64 rng(5);
  observe(1000, 10000, 200, rng);  // old regime
  const std::vector<int64_t> b16 = {16};
  EXPECT_NEAR(est.PredictNs(key, b16), 26000, 1);
  observe(5000, 2000, 16, rng);  // half a window of the new regime: a blend
  const double blended = est.PredictNs(key, b16);
  EXPECT_GT(blended, 26000 + 1000);
  EXPECT_LT(blended, 82000 - 1000);
  observe(5000, 2000, 16, rng);  // a full window: the old regime is gone
  for (int64_t b : {1, 16, 64, 256}) {
    const double truth = 5000.0 * b + 2000;
    EXPECT_NEAR(est.PredictNs(key, std::vector<int64_t>{b}), truth, 1e-6 * truth) << b;
  }
  EXPECT_EQ(est.Stats()[0].samples, 232);
}

TEST(OpEstimatorTest, StatsRecordOnlineMapeBeforeEachSample) {
  auto t = MixedTemplate();
  OpEstimator est;  // default 1 ms
  const int key = est.Register("A16", *t, OpIndex(*t, "misc"));
  est.Observe(key, {}, Duration::Millis(2));  // predicted 1 ms: 50%
  est.Observe(key, {}, Duration::Millis(2));  // predicted 2 ms: 0%
  est.Observe(key, {}, Duration::Millis(4));  // predicted 2 ms: 50%
  const auto stats = est.Stats();
  ASSERT_EQ(stats.size(), 1u);
  EXPECT_EQ(stats[0].samples, 3);
  EXPECT_NEAR(stats[0].mape_pct, 100.0 / 3, 1e-9);
  EXPECT_TRUE(stats[0].fitted);
  // Relative least squares on {2, 2, 4} ms gives sum(1/t) / sum(1/t^2) =
  // 2.222 ms; made mean-unbiased (predicted total = measured total) the
  // constant is the mean, 8 / 3 ms.
  ASSERT_EQ(stats[0].coeffs.size(), 1u);
  EXPECT_NEAR(stats[0].coeffs[0], 8.0 / 3.0 * 1e6, 1e-3);
  EXPECT_THAT(stats[0].feature_names, ElementsAre("1"));
}

TEST(OpEstimatorTest, HasModelOnlyOnceFittedOrGivenAPrior) {
  auto t = MixedTemplate();
  OpEstimator est;
  const int misc = est.Register("A16", *t, OpIndex(*t, "misc"));
  const int head = est.Register("A16", *t, OpIndex(*t, "head"));  // [B, 1]: two samples to fit
  EXPECT_FALSE(est.HasModel(misc));
  EXPECT_FALSE(est.HasModel(-1));
  EXPECT_FALSE(est.HasModel(99));
  est.Observe(misc, {}, Duration::Millis(2));
  EXPECT_TRUE(est.HasModel(misc));
  const std::vector<int64_t> b1 = {1};
  est.Observe(head, b1, Duration::Millis(2));
  EXPECT_FALSE(est.HasModel(head));  // default duration still
  ASSERT_TRUE(est.SetPrior(head, std::vector<double>{1e6, 0}).ok());
  EXPECT_TRUE(est.HasModel(head));
}

TEST(OpEstimatorTest, FitIsMeanUnbiasedUnderSkewedNoise) {
  // A repeated shape whose time is usually 10 ms and sometimes (1 in 5)
  // 30 ms, as under preemption: the prediction is the mean, 14 ms, so sums
  // of predictions match sums of measurements. (The plain relative fit would
  // predict sum(1/t) / sum(1/t^2) = 10.7 ms.)
  auto t = MixedTemplate();
  OpEstimator est;
  const int key = est.Register("A16", *t, OpIndex(*t, "misc"));
  double measured = 0;
  for (int i = 0; i < 100; ++i) {
    const Duration d = Duration::Millis(i % 5 == 4 ? 30 : 10);
    measured += static_cast<double>(d.nanos());
    est.Observe(key, {}, d);
  }
  EXPECT_NEAR(est.PredictNs(key, {}), measured / 100, 1.0);
  EXPECT_NEAR(est.PredictNs(key, {}), 14e6, 1.0);
}

TEST(MapeCounterTest, AveragesAbsolutePercentErrors) {
  MapeCounter m;
  EXPECT_EQ(m.mape_pct(), 0.0);
  m.Add(110, 100);
  m.Add(90, 100);
  m.Add(100, 50);
  EXPECT_EQ(m.n, 3);
  EXPECT_NEAR(m.mape_pct(), (10 + 10 + 100) / 3.0, 1e-12);
  m.Add(5, 0);  // undefined relative error: ignored
  EXPECT_EQ(m.n, 3);
}

// ---------------------------------------------------------------------------
// OpEstimator: save / restore

// An estimator with fitted matmul and layers keys, a prior-only head key and
// an untouched misc key.
struct Trained {
  std::shared_ptr<const GraphTemplate> mixed = MixedTemplate();
  LlamaTemplates tiny = Tiny();
  OpEstimator est;
  Trained() {
    std::mt19937_64 rng(42);
    const int mm = est.Register("A16", *mixed, OpIndex(*mixed, "mm"));
    const int g0 = est.Register("A16", *tiny.prefill, OpIndex(*tiny.prefill, "g0"));
    const int head = est.Register("A16", *mixed, OpIndex(*mixed, "head"));
    est.Register("cpu", *mixed, OpIndex(*mixed, "misc"));
    for (int i = 0; i < 100; ++i) {
      const auto a = RandomMatmul(rng);
      est.Observe(mm, a, Noisy(MatmulTruth(a), rng));
      const auto l = RandomLayers(rng);
      est.Observe(g0, l, Noisy(LayersTruth(l), rng));
    }
    const double prior[] = {123.25, 4567.5};
    EXPECT_TRUE(est.SetPrior(head, prior).ok());
    est.Observe(head, std::vector<int64_t>{3}, Duration::Micros(9));  // 1 sample: not fitted
  }
  // Registers the same four keys in a different order.
  void RegisterAll(OpEstimator& other) const {
    other.Register("cpu", *mixed, OpIndex(*mixed, "misc"));
    other.Register("A16", *mixed, OpIndex(*mixed, "head"));
    other.Register("A16", *tiny.prefill, OpIndex(*tiny.prefill, "g0"));
    other.Register("A16", *mixed, OpIndex(*mixed, "mm"));
  }
};

int FindKey(OpEstimator& est, const Trained& t, absl::string_view device, absl::string_view tpl,
            absl::string_view op) {
  const GraphTemplate& g = tpl == "mixed" ? *t.mixed : *t.tiny.prefill;
  return est.Register(ToStd(device), g, OpIndex(g, op));  // idempotent lookup
}

void ExpectSamePredictions(OpEstimator& a, OpEstimator& b, const Trained& t) {
  std::mt19937_64 rng(77);
  const int mm_a = FindKey(a, t, "A16", "mixed", "mm"), mm_b = FindKey(b, t, "A16", "mixed", "mm");
  const int g0_a = FindKey(a, t, "A16", "tiny/prefill", "g0");
  const int g0_b = FindKey(b, t, "A16", "tiny/prefill", "g0");
  const int head_a = FindKey(a, t, "A16", "mixed", "head");
  const int head_b = FindKey(b, t, "A16", "mixed", "head");
  const int misc_a = FindKey(a, t, "cpu", "mixed", "misc");
  const int misc_b = FindKey(b, t, "cpu", "mixed", "misc");
  for (int i = 0; i < 100; ++i) {
    const auto m = RandomMatmul(rng);
    EXPECT_EQ(a.PredictNs(mm_a, m), b.PredictNs(mm_b, m));
    const auto l = RandomLayers(rng);
    EXPECT_EQ(a.PredictNs(g0_a, l), b.PredictNs(g0_b, l));
    const std::vector<int64_t> batch = {static_cast<int64_t>(i + 1)};
    EXPECT_EQ(a.PredictNs(head_a, batch), b.PredictNs(head_b, batch));
  }
  EXPECT_EQ(a.PredictNs(misc_a, {}), b.PredictNs(misc_b, {}));
  // Stats agree key by key (by name).
  for (const auto& sa : a.Stats()) {
    bool found = false;
    for (const auto& sb : b.Stats()) {
      if (sa.device_type != sb.device_type || sa.template_name != sb.template_name ||
          sa.op_name != sb.op_name) {
        continue;
      }
      found = true;
      EXPECT_EQ(sa.coeffs, sb.coeffs) << sa.op_name;
      EXPECT_EQ(sa.samples, sb.samples) << sa.op_name;
      EXPECT_EQ(sa.fitted, sb.fitted) << sa.op_name;
      EXPECT_NEAR(sa.mape_pct, sb.mape_pct, 1e-9) << sa.op_name;
    }
    EXPECT_TRUE(found) << sa.op_name;
  }
}

TEST(OpEstimatorTest, SaveRestoreAfterRegisterGivesIdenticalPredictions) {
  Trained t;
  const std::string text = t.est.Save();
  EXPECT_THAT(text, HasSubstr("tiny/prefill"));
  OpEstimator fresh;
  t.RegisterAll(fresh);
  ASSERT_TRUE(fresh.Restore(text).ok()) << fresh.Restore(text);
  ExpectSamePredictions(t.est, fresh, t);
}

TEST(OpEstimatorTest, SaveRestoreBeforeRegisterGivesIdenticalPredictions) {
  Trained t;
  const std::string text = t.est.Save();
  OpEstimator fresh;
  ASSERT_TRUE(fresh.Restore(text).ok());
  EXPECT_EQ(fresh.num_keys(), 0);
  // Keys restored but not yet registered survive another save / restore.
  OpEstimator relay;
  ASSERT_TRUE(relay.Restore(fresh.Save()).ok());
  t.RegisterAll(fresh);
  t.RegisterAll(relay);
  ExpectSamePredictions(t.est, fresh, t);
  ExpectSamePredictions(t.est, relay, t);
  // The restored fit keeps serving until the window refills.
  const int mm = FindKey(fresh, t, "A16", "mixed", "mm");
  const std::vector<int64_t> m = {128, 2, 256, 512};
  const double before = fresh.PredictNs(mm, m);
  fresh.Observe(mm, m, Duration::Nanos(std::llround(before * 3)));  // 1 of 5 samples
  EXPECT_EQ(fresh.PredictNs(mm, m), before);
}

TEST(OpEstimatorTest, MalformedRestoreIsRejectedAndChangesNothing) {
  Trained t;
  OpEstimator est;
  t.RegisterAll(est);
  ASSERT_TRUE(est.Restore(t.est.Save()).ok());
  const std::string before = est.Save();

  struct Case {
    std::string text;
    std::string expected;
  };
  const std::string valid_entry =
      "  - {device_type: A16, template: mixed, op: head, features: [B, '1'], coeffs: [1, 2], "
      "fitted: true}\n";
  const std::vector<Case> cases = {
      {"ops: [unclosed", "<op estimator state>"},
      {"", "<op estimator state>: estimator state must be a map"},
      {"- 1\n- 2\n", "<op estimator state>: estimator state must be a map"},
      {"version: 2\nops: []\n", "unsupported version 2"},
      {"version: 1\n", "ops"},
      {"version: 1\nops: 3\n", "expected a list"},
      {"version: 1\nops: []\nextra: 1\n", "unknown field 'extra'"},
      {"version: 1\nops:\n" + valid_entry +
           "  - {device_type: A16, template: mixed, op: mm, features: [b*m*n*k, b*m*k, b*k*n, "
           "b*m*n, '1'], coeffs: [1, -2, 0, 0, 1], fitted: true}\n",
       "ops[1].coeffs[1]"},
      {"version: 1\nops:\n  - {device_type: A16, template: mixed, op: head, features: [B, '1'], "
       "coeffs: [1, x], fitted: true}\n",
       "expected a number, got 'x'"},
      {"version: 1\nops:\n  - {device_type: A16, template: mixed, op: head, features: [B, '1'], "
       "coeffs: [1, 2, 3], fitted: true}\n",
       "expected 2 coefficients"},
      {"version: 1\nops:\n  - {device_type: A16, template: mixed, op: head, features: [B*S, '1'], "
       "coeffs: [1, 2], fitted: true}\n",
       "is registered with [B, 1]"},
      {"version: 1\nops:\n  - {template: mixed, op: head, features: [B, '1'], coeffs: [1, 2], "
       "fitted: true}\n",
       "device_type"},
      {"version: 1\nops:\n" + valid_entry + valid_entry, "appears twice"},
      {"version: 1\nops:\n  - {device_type: A16, template: mixed, op: head, features: [B, '1'], "
       "coeffs: [1, 2], fitted: maybe}\n",
       "fitted"},
  };
  for (const Case& c : cases) {
    const absl::Status s = est.Restore(c.text);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.expected)) << c.text;
    EXPECT_EQ(est.Save(), before) << c.text;
  }
  ExpectSamePredictions(t.est, est, t);
  // A malformed restore into an estimator with no keys leaves nothing pending.
  OpEstimator empty;
  EXPECT_FALSE(empty.Restore(cases[7].text).ok());
  const int head = FindKey(empty, t, "A16", "mixed", "head");
  EXPECT_EQ(empty.Predict(head, std::vector<int64_t>{1}), Duration::Millis(1));
}

TEST(EstimatorsTest, PredictDoesNotAllocate) {
  Trained t;
  AcceleratorSet set = ThreeGpus();
  TransferEstimator transfers(set);
  transfers.Observe(DeviceId(0), DeviceId(1), Bytes::MiB(1), Duration::Micros(90));
  transfers.Observe(DeviceId(0), DeviceId(1), Bytes::MiB(2), Duration::Micros(170));
  const int64_t layers[] = {8, 1, 1000, 2};
  const int64_t mm[] = {128, 2, 256, 512};
  double sink = 0;
  g_allocations = 0;
  g_count_allocations = true;
  for (int key = 0; key < t.est.num_keys(); ++key) {
    sink += t.est.PredictNs(key, layers);
    sink += t.est.PredictNs(key, mm);
    sink += t.est.Predict(key, mm).ToMicrosF();
  }
  sink += transfers.PredictNs(DeviceId(0), DeviceId(1), 1 << 22);
  sink += transfers.Predict(DeviceId(2), DeviceId(1), Bytes::MiB(3)).ToMicrosF();
  g_count_allocations = false;
  EXPECT_EQ(g_allocations.load(), 0);
  EXPECT_GT(sink, 0);
}

// ---------------------------------------------------------------------------
// TransferEstimator

TEST(TransferEstimatorTest, PriorFromLinkSpecAndSameDeviceIsFree) {
  AcceleratorSet set = ThreeGpus();
  ASSERT_TRUE(set.SetLink(DeviceId(0), DeviceId(1), {24e9, Duration::Micros(8)}).ok());
  TransferEstimator est(set);
  // 12 MB over 12 GB/s plus 20 us.
  EXPECT_NEAR(est.PredictNs(DeviceId(0), DeviceId(2), 12000000), 1020000, 1e-3);
  EXPECT_EQ(est.Predict(DeviceId(2), DeviceId(0), Bytes(12000000)), Duration::Micros(1020));
  EXPECT_EQ(est.Predict(DeviceId(1), DeviceId(0), Bytes(24000000)), Duration::Micros(1008));
  EXPECT_EQ(est.Predict(DeviceId(0), DeviceId(2), Bytes(0)), Duration::Micros(20));
  for (int d = 0; d < 3; ++d) {
    EXPECT_EQ(est.PredictNs(DeviceId(d), DeviceId(d), int64_t{1} << 30), 0.0);
    EXPECT_EQ(est.Predict(DeviceId(d), DeviceId(d), Bytes::GiB(1)), Duration::Zero());
  }
  // Same-device observations are ignored; no stats yet.
  est.Observe(DeviceId(1), DeviceId(1), Bytes::MiB(1), Duration::Millis(5));
  EXPECT_TRUE(est.Stats().empty());
}

TEST(TransferEstimatorTest, HandoffGapsAddToTheHopButNotToTheLinkModel) {
  AcceleratorSet set = ThreeGpus();
  TransferEstimator est(set, {.window = 128, .handoff_smoothing = 0.5});
  const DeviceId g0(0), g1(1), g2(2);
  const double link = est.PredictLinkNs(g0, g1, 1 << 20);
  EXPECT_EQ(est.PredictNs(g0, g1, 1 << 20), link);  // nothing learned yet
  // Launch gaps of 0 -> 1 (first sample taken as is, then halfway: 300 us),
  // delivery gaps on gpu1 (100 us; a negative sample counts as 0 -> 50 us).
  est.ObserveLaunchGap(g0, g1, Duration::Micros(200));
  est.ObserveLaunchGap(g0, g1, Duration::Micros(400));
  est.ObserveDeliveryGap(g1, Duration::Micros(100));
  est.ObserveDeliveryGap(g1, Duration::Micros(-7));
  EXPECT_DOUBLE_EQ(est.launch_gap_ns(g0, g1), 300000);
  EXPECT_DOUBLE_EQ(est.delivery_gap_ns(g1), 50000);
  EXPECT_DOUBLE_EQ(est.PredictNs(g0, g1, 1 << 20), link + 350000);
  EXPECT_EQ(est.Predict(g0, g1, Bytes::MiB(1)), Duration::Nanos(std::llround(link + 350000)));
  EXPECT_EQ(est.PredictLinkNs(g0, g1, 1 << 20), link);
  // Per pair and per destination: 1 -> 0 has no launch gap and gpu0 no
  // delivery gap; 2 -> 1 has gpu1's delivery gap only. Same device: free.
  EXPECT_EQ(est.PredictNs(g1, g0, 1 << 20), est.PredictLinkNs(g1, g0, 1 << 20));
  EXPECT_DOUBLE_EQ(est.PredictNs(g2, g1, 1 << 20), est.PredictLinkNs(g2, g1, 1 << 20) + 50000);
  EXPECT_EQ(est.PredictNs(g1, g1, 1 << 20), 0.0);
  // Same-device and out-of-range observations are ignored.
  est.ObserveLaunchGap(g1, g1, Duration::Millis(5));
  est.ObserveLaunchGap(g0, DeviceId(9), Duration::Millis(5));
  est.ObserveDeliveryGap(DeviceId(9), Duration::Millis(5));
  EXPECT_EQ(est.launch_gap_ns(g1, g1), 0.0);
  EXPECT_EQ(est.delivery_gap_ns(DeviceId(9)), 0.0);
  // The link fit is unaffected: its samples are compared with the link time.
  est.Observe(g0, g1, Bytes::MiB(1), Duration::Nanos(std::llround(link)));
  const auto stats = est.Stats();
  ASSERT_EQ(stats.size(), 1u);
  EXPECT_NEAR(stats[0].mape_pct, 0.0, 1e-3);
  // Not saved: a restored estimator starts without gaps.
  TransferEstimator fresh(set);
  ASSERT_TRUE(fresh.Restore(est.Save()).ok());
  EXPECT_EQ(fresh.launch_gap_ns(g0, g1), 0.0);
  EXPECT_EQ(fresh.PredictNs(g0, g1, 1 << 20), fresh.PredictLinkNs(g0, g1, 1 << 20));
}

TEST(TransferEstimatorTest, KeepsPriorSlopeUntilTwoDistinctSizes) {
  AcceleratorSet set = ThreeGpus();
  TransferEstimator est(set);
  const double prior_1mib = est.PredictNs(DeviceId(0), DeviceId(1), 1 << 20);
  const double prior_2mib = est.PredictNs(DeviceId(0), DeviceId(1), 2 << 20);
  for (int i = 0; i < 5; ++i) {
    est.Observe(DeviceId(0), DeviceId(1), Bytes::MiB(1), Duration::Micros(i % 2 ? 400 : 600));
  }
  // One size: the prior's slope stays, the constant is learned (the mean).
  EXPECT_NEAR(est.PredictNs(DeviceId(0), DeviceId(1), 1 << 20), 520e3, 1e-6);
  EXPECT_NEAR(est.PredictNs(DeviceId(0), DeviceId(1), 2 << 20) - est.PredictNs(DeviceId(0), DeviceId(1), 1 << 20),
              prior_2mib - prior_1mib, 1e-6);
  // True link: 0.05 ns/B, 10 us.
  est.Observe(DeviceId(0), DeviceId(1), Bytes::MiB(4),
              Duration::Nanos(std::llround(0.05 * (4 << 20) + 10000)));
  est.Observe(DeviceId(0), DeviceId(1), Bytes::MiB(1),
              Duration::Nanos(std::llround(0.05 * (1 << 20) + 10000)));
  // Fitted now (to a blend of the 500 us points and the truth); other pairs
  // keep their priors.
  EXPECT_NE(est.PredictNs(DeviceId(0), DeviceId(1), 1 << 20), prior_1mib);
  EXPECT_EQ(est.PredictNs(DeviceId(1), DeviceId(0), 1 << 20), prior_1mib);
  const auto stats = est.Stats();
  ASSERT_EQ(stats.size(), 1u);
  EXPECT_EQ(stats[0].src, "gpu0");
  EXPECT_EQ(stats[0].dst, "gpu1");
  EXPECT_EQ(stats[0].samples, 7);
  EXPECT_GT(stats[0].mape_pct, 0);
}

TEST(TransferEstimatorTest, RecoversAlphaAndLatencyUnderOnePercentNoise) {
  AcceleratorSet set = ThreeGpus();
  TransferEstimator est(set);
  const double alpha = 1e9 / 24e9, c = 8000;  // differs from the 12 GB/s, 20 us prior
  std::mt19937_64 rng(2024);
  std::uniform_real_distribution<double> log_size(std::log(4096.0), std::log(64.0 * (1 << 20)));
  auto size = [&] { return static_cast<int64_t>(std::exp(log_size(rng))); };
  for (int i = 0; i < 300; ++i) {
    const int64_t bytes = size();
    est.Observe(DeviceId(0), DeviceId(2), Bytes(bytes), Noisy(alpha * bytes + c, rng));
  }
  double sum = 0;
  const int kFresh = 500;
  for (int i = 0; i < kFresh; ++i) {
    const int64_t bytes = size();
    sum += PctError(est.PredictNs(DeviceId(0), DeviceId(2), bytes), alpha * bytes + c);
  }
  EXPECT_LE(sum / kFresh, 1.0);
  const auto stats = est.Stats();
  ASSERT_EQ(stats.size(), 1u);
  EXPECT_NEAR(stats[0].alpha_ns_per_byte, alpha, 0.01 * alpha);
  EXPECT_NEAR(stats[0].c_ns, c, 0.05 * c);
  EXPECT_EQ(stats[0].samples, 300);
}

TEST(TransferEstimatorTest, NegativeInterceptIsClampedToZero) {
  AcceleratorSet set = ThreeGpus();
  TransferEstimator est(set);
  // A "truth" with a negative fixed cost, positive on the observed sizes.
  for (int64_t mib = 1; mib <= 64; mib *= 2) {
    const double ns = 0.1 * static_cast<double>(mib << 20) - 50000;
    ASSERT_GT(ns, 0);
    est.Observe(DeviceId(1), DeviceId(2), Bytes::MiB(mib), Duration::Nanos(std::llround(ns)));
  }
  const auto stats = est.Stats();
  ASSERT_EQ(stats.size(), 1u);
  EXPECT_GE(stats[0].alpha_ns_per_byte, 0);
  EXPECT_GE(stats[0].c_ns, 0);
  for (int64_t bytes : {int64_t{0}, int64_t{1}, int64_t{4096}, int64_t{1} << 20}) {
    EXPECT_GE(est.PredictNs(DeviceId(1), DeviceId(2), bytes), 0.0);
  }
}

TEST(TransferEstimatorTest, WindowIsBounded) {
  AcceleratorSet set = ThreeGpus();
  TransferEstimator est(set, {.window = 16});
  auto observe = [&](double alpha, double c, int count) {
    for (int i = 0; i < count; ++i) {
      const int64_t bytes = int64_t{4096} << (i % 12);
      est.Observe(DeviceId(0), DeviceId(1), Bytes(bytes),
                  Duration::Nanos(std::llround(alpha * static_cast<double>(bytes) + c)));
    }
  };
  observe(0.1, 30000, 100);
  observe(0.02, 5000, 16);
  const auto stats = est.Stats();
  ASSERT_EQ(stats.size(), 1u);
  EXPECT_NEAR(stats[0].alpha_ns_per_byte, 0.02, 1e-5);
  EXPECT_NEAR(stats[0].c_ns, 5000, 5);
  EXPECT_EQ(stats[0].samples, 116);
}

TEST(TransferEstimatorTest, SaveRestoreRoundTripAndRejectsMalformed) {
  AcceleratorSet set = ThreeGpus();
  TransferEstimator est(set);
  std::mt19937_64 rng(11);
  for (int i = 0; i < 50; ++i) {
    const int64_t bytes = int64_t{4096} << (i % 14);
    est.Observe(DeviceId(0), DeviceId(1), Bytes(bytes), Noisy(0.05 * bytes + 9000, rng));
    est.Observe(DeviceId(2), DeviceId(0), Bytes(bytes), Noisy(0.07 * bytes + 4000, rng));
  }
  est.Observe(DeviceId(1), DeviceId(2), Bytes::MiB(1), Duration::Micros(80));  // unfitted
  const std::string text = est.Save();
  EXPECT_THAT(text, HasSubstr("gpu2"));

  TransferEstimator fresh(set);
  ASSERT_TRUE(fresh.Restore(text).ok()) << fresh.Restore(text);
  for (int s = 0; s < 3; ++s) {
    for (int d = 0; d < 3; ++d) {
      for (int64_t bytes : {int64_t{0}, int64_t{4096}, int64_t{1} << 20, int64_t{1} << 28}) {
        EXPECT_EQ(est.PredictNs(DeviceId(s), DeviceId(d), bytes),
                  fresh.PredictNs(DeviceId(s), DeviceId(d), bytes))
            << s << "->" << d << " " << bytes;
      }
    }
  }
  const auto a = est.Stats(), b = fresh.Stats();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].src, b[i].src);
    EXPECT_EQ(a[i].dst, b[i].dst);
    EXPECT_EQ(a[i].alpha_ns_per_byte, b[i].alpha_ns_per_byte);
    EXPECT_EQ(a[i].c_ns, b[i].c_ns);
    EXPECT_EQ(a[i].samples, b[i].samples);
    EXPECT_NEAR(a[i].mape_pct, b[i].mape_pct, 1e-9);
  }

  const std::string before = fresh.Save();
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"transfers: [", "<transfer estimator state>"},
      {"version: 1\nops: []\n", "unknown field 'ops'"},
      {"version: 1\ntransfers:\n  - {src: gpu0, dst: gpu9, alpha_ns_per_byte: 1, c_ns: 1, "
       "fitted: true}\n",
       "unknown device 'gpu9'"},
      {"version: 1\ntransfers:\n  - {src: gpu0, dst: gpu1, alpha_ns_per_byte: 1, c_ns: 1, "
       "fitted: true}\n  - {src: gpu1, dst: gpu0, alpha_ns_per_byte: -1, c_ns: 1, fitted: true}\n",
       "transfers[1].alpha_ns_per_byte: must be non-negative"},
      {"version: 1\ntransfers:\n  - {src: gpu0, dst: gpu0, alpha_ns_per_byte: 1, c_ns: 1, "
       "fitted: true}\n",
       "same device"},
      {"version: 1\ntransfers:\n  - {src: gpu0, dst: gpu1, c_ns: 1, fitted: true}\n",
       "alpha_ns_per_byte"},
  };
  for (const auto& [bad_text, expected] : bad) {
    const absl::Status s = fresh.Restore(bad_text);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad_text;
    EXPECT_THAT(std::string(s.message()), HasSubstr(expected)) << bad_text;
    EXPECT_EQ(fresh.Save(), before) << bad_text;
  }
}

TEST(TransferEstimatorTest, MovesKeepState) {
  AcceleratorSet set = ThreeGpus();
  TransferEstimator est(set);
  for (int i = 0; i < 4; ++i) {
    est.Observe(DeviceId(0), DeviceId(1), Bytes::MiB(1 << i),
                Duration::Nanos(std::llround(0.03 * (1 << 20) * (1 << i) + 1000)));
  }
  const double p = est.PredictNs(DeviceId(0), DeviceId(1), 1 << 22);
  TransferEstimator moved(std::move(est));
  EXPECT_EQ(moved.PredictNs(DeviceId(0), DeviceId(1), 1 << 22), p);
}

}  // namespace
}  // namespace slicesched
