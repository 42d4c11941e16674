// Numerics of the LibTorch Llama operators on the "tiny" preset (f32).
// Torch-free TU: everything goes through the public executor headers.
#include "slicesched/executor/llama/llama_ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "slicesched/gmg/llama.h"

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

// Deterministic pseudo-random prompt tokens [B, T].
std::vector<int64_t> PromptTokens(int64_t batch, int64_t tokens, int64_t vocab, uint64_t seed) {
  std::vector<int64_t> out;
  uint64_t x = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (int64_t i = 0; i < batch * tokens; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    out.push_back(static_cast<int64_t>((x >> 33) % static_cast<uint64_t>(vocab)));
  }
  return out;
}

double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
  return m;
}

// Logits of position `pos` from a [B, T, V] reference result.
std::vector<float> PositionLogits(const Tensor& all, int64_t pos) {
  const auto s = all.shape();
  const auto v = all.ToFloat();
  std::vector<float> out;
  for (int64_t b = 0; b < s[0]; ++b) {
    const auto* row = v.data() + (b * s[1] + pos) * s[2];
    out.insert(out.end(), row, row + s[2]);
  }
  return out;
}

// Runs all groups of `w` over `hidden` with one cache per group.
absl::StatusOr<Tensor> RunGroups(const LlamaWeights& w, Tensor hidden, std::vector<KvCache>& caches,
                                 int64_t start) {
  caches.resize(static_cast<size_t>(w.num_groups()));
  for (int64_t g = 0; g < w.num_groups(); ++g) {
    auto out = FusedLayers(w, g, hidden, &caches[static_cast<size_t>(g)], start);
    if (!out.ok()) return out.status();
    hidden = *out;
  }
  return hidden;
}

TEST(LlamaWeightsTest, FromSeedIsDeterministicAndSized) {
  const LlamaDims dims = Tiny();
  auto a = TinyWeights(7), b = TinyWeights(7), c = TinyWeights(8);
  const auto na = a->NamedTensors(), nb = b->NamedTensors(), nc = c->NamedTensors();
  ASSERT_EQ(na.size(), static_cast<size_t>(2 + 9 * dims.layers + 1));
  bool any_differs = false;
  for (size_t i = 0; i < na.size(); ++i) {
    EXPECT_EQ(na[i].second.MaxAbsDiff(nb[i].second), 0.0) << na[i].first;
    any_differs |= na[i].second.MaxAbsDiff(nc[i].second) > 0.0;
  }
  EXPECT_TRUE(any_differs);
  EXPECT_EQ(a->GroupBytes(0).count(), dims.ParamsPerGroup() * 4);
  EXPECT_EQ(a->GroupBytes(1).count(), dims.ParamsPerGroup() * 4);
  EXPECT_EQ(a->TotalBytes().count(), dims.TotalParams() * 4);
  EXPECT_EQ(a->EmbeddingBytes().count(), dims.EmbeddingParams() * 4);
  EXPECT_EQ(a->LmHeadBytes().count(), dims.LmHeadParams() * 4);
}

TEST(LlamaWeightsTest, RejectsInvalidDims) {
  LlamaDims dims = Tiny();
  dims.kv_heads = 3;
  auto w = LlamaWeights::FromSeed(dims, 1);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TinyWeights()->WithFusion(3).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(LlamaOpsTest, AllocationFailureIsResourceExhausted) {
  LlamaDims dims = Tiny();
  // The largest dims LlamaDims::Validate accepts: a 2^44-element (64 TiB)
  // embedding, more than any host can back.
  dims.vocab = LlamaDims::kMaxDim;
  dims.hidden = LlamaDims::kMaxDim;
  auto w = LlamaWeights::FromSeed(dims, 1);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kResourceExhausted) << w.status();
  EXPECT_NE(w.status().message().find("FromSeed"), absl::string_view::npos) << w.status();
}

double Rms(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += double(x) * x;
  return std::sqrt(s / static_cast<double>(v.size()));
}

TEST(LlamaOpsTest, ActivationsStayOrderOne) {
  auto w = TinyWeights();
  const int64_t B = 2, S = 16;
  std::vector<KvCache> caches;
  auto h = Embedding(*w, Tensor::FromInt64(PromptTokens(B, S, w->dims().vocab, 4), {B, S}));
  ASSERT_TRUE(h.ok());
  auto out = RunGroups(*w, *h, caches, 0);
  ASSERT_TRUE(out.ok());
  auto logits = LmHead(*w, *out);
  ASSERT_TRUE(logits.ok());
  const double rms_in = Rms(h->ToFloat()), rms_out = Rms(out->ToFloat()), rms_logits = Rms(logits->ToFloat());
  std::printf("[ numerics ] rms: embedding %.3f, after %lld layers %.3f, logits %.3f\n", rms_in,
              static_cast<long long>(w->dims().layers), rms_out, rms_logits);
  for (double r : {rms_in, rms_out, rms_logits}) {
    EXPECT_GT(r, 0.1);
    EXPECT_LT(r, 10.0);
  }
}

// (a) One fused operator (2 layers) equals its layers run one at a time.
TEST(LlamaOpsTest, FusedGroupEqualsLayersOneAtATime) {
  auto w2 = TinyWeights();
  auto w1_or = w2->WithFusion(1);
  ASSERT_TRUE(w1_or.ok()) << w1_or.status();
  auto w1 = *w1_or;
  ASSERT_EQ(w2->dims().fusion, 2);
  ASSERT_EQ(w1->num_groups(), 4);
  const int64_t B = 2, S = 7;
  const auto ids = PromptTokens(B, S, w2->dims().vocab, 1);
  auto h0 = Embedding(*w2, Tensor::FromInt64(ids, {B, S}));
  ASSERT_TRUE(h0.ok()) << h0.status();
  ASSERT_EQ(h0->shape(), (std::vector<int64_t>{B, S, 64}));

  double max_hidden = 0, max_kv = 0;
  Tensor fused = *h0, single = *h0;
  std::vector<KvCache> fused_caches(2), single_caches(4);
  for (int64_t g = 0; g < 2; ++g) {
    auto f = FusedLayers(*w2, g, fused, &fused_caches[g], 0);
    ASSERT_TRUE(f.ok()) << f.status();
    fused = *f;
    for (int64_t l = 2 * g; l < 2 * g + 2; ++l) {
      auto s = FusedLayers(*w1, l, single, &single_caches[l], 0);
      ASSERT_TRUE(s.ok()) << s.status();
      single = *s;
    }
    EXPECT_TRUE(fused.AllClose(single, 1e-5, 1e-5)) << "group " << g;
    max_hidden = std::max(max_hidden, fused.MaxAbsDiff(single));
    // The group's cache is its layers' caches stacked along the layer dim.
    EXPECT_EQ(fused_caches[g].k().shape(), (std::vector<int64_t>{2, B, 2, S, 16}));
    EXPECT_EQ(fused_caches[g].tokens(), S);
    EXPECT_EQ(fused_caches[g].bytes().count(), 2 * 2 * B * 2 * S * 16 * 4);
    std::vector<float> k_cat = single_caches[2 * g].k().ToFloat();
    std::vector<float> k_hi = single_caches[2 * g + 1].k().ToFloat();
    k_cat.insert(k_cat.end(), k_hi.begin(), k_hi.end());
    std::vector<float> v_cat = single_caches[2 * g].v().ToFloat();
    std::vector<float> v_hi = single_caches[2 * g + 1].v().ToFloat();
    v_cat.insert(v_cat.end(), v_hi.begin(), v_hi.end());
    max_kv = std::max({max_kv, MaxAbsDiff(fused_caches[g].k().ToFloat(), k_cat),
                       MaxAbsDiff(fused_caches[g].v().ToFloat(), v_cat)});
  }
  EXPECT_LE(max_kv, 1e-5);

  // One decode step through both cache layouts.
  const std::vector<int64_t> next = {3, 200};
  auto d0 = Embedding(*w2, Tensor::FromInt64(next, {B, 1}));
  ASSERT_TRUE(d0.ok());
  Tensor fd = *d0, sd = *d0;
  for (int64_t g = 0; g < 2; ++g) {
    auto f = FusedLayers(*w2, g, fd, &fused_caches[g], S);
    ASSERT_TRUE(f.ok()) << f.status();
    fd = *f;
    for (int64_t l = 2 * g; l < 2 * g + 2; ++l) {
      auto s = FusedLayers(*w1, l, sd, &single_caches[l], S);
      ASSERT_TRUE(s.ok()) << s.status();
      sd = *s;
    }
  }
  EXPECT_TRUE(fd.AllClose(sd, 1e-5, 1e-5));
  max_hidden = std::max(max_hidden, fd.MaxAbsDiff(sd));
  std::printf("[ numerics ] fused vs one-at-a-time: max |diff| hidden %.3g, kv %.3g\n", max_hidden,
              max_kv);
}

// (b) Prefill 7 tokens, then decode 5 tokens one by one through the cache;
// every step's logits equal a full recomputation by the reference path.
TEST(LlamaOpsTest, CachedDecodeMatchesFullRecomputation) {
  auto w = TinyWeights();
  const int64_t B = 2, prompt = 7, steps = 5, V = w->dims().vocab;
  std::vector<std::vector<int64_t>> seqs(B);
  const auto ids = PromptTokens(B, prompt, V, 2);
  for (int64_t b = 0; b < B; ++b) seqs[b].assign(ids.begin() + b * prompt, ids.begin() + (b + 1) * prompt);

  auto check_against_reference = [&](const Tensor& logits, double* max_diff) {
    const int64_t T = static_cast<int64_t>(seqs[0].size());
    std::vector<int64_t> flat;
    for (const auto& s : seqs) flat.insert(flat.end(), s.begin(), s.end());
    auto ref = ReferenceForward(*w, Tensor::FromInt64(flat, {B, T}));
    ASSERT_TRUE(ref.ok()) << ref.status();
    ASSERT_EQ(ref->shape(), (std::vector<int64_t>{B, T, V}));
    const double diff = MaxAbsDiff(logits.ToFloat(), PositionLogits(*ref, T - 1));
    EXPECT_LE(diff, 1e-4) << "at " << T << " tokens";
    *max_diff = std::max(*max_diff, diff);
  };

  std::vector<KvCache> caches;
  double max_prefill = 0, max_decode = 0;
  auto h = Embedding(*w, Tensor::FromInt64(ids, {B, prompt}));
  ASSERT_TRUE(h.ok()) << h.status();
  auto out = RunGroups(*w, *h, caches, 0);
  ASSERT_TRUE(out.ok()) << out.status();
  auto logits = LmHead(*w, *out);
  ASSERT_TRUE(logits.ok()) << logits.status();
  ASSERT_EQ(logits->shape(), (std::vector<int64_t>{B, V}));
  check_against_reference(*logits, &max_prefill);

  for (int64_t step = 0; step < steps; ++step) {
    auto next = Sample(*logits, SamplingParams{});
    ASSERT_TRUE(next.ok()) << next.status();
    const auto tok = next->ToInt64();
    ASSERT_EQ(tok.size(), static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b) seqs[b].push_back(tok[b]);
    auto e = Embedding(*w, *next);
    ASSERT_TRUE(e.ok()) << e.status();
    out = RunGroups(*w, *e, caches, caches[0].tokens());
    ASSERT_TRUE(out.ok()) << out.status();
    logits = LmHead(*w, *out);
    ASSERT_TRUE(logits.ok()) << logits.status();
    check_against_reference(*logits, &max_decode);
  }
  EXPECT_EQ(caches[0].tokens(), prompt + steps);
  EXPECT_EQ(caches[1].tokens(), prompt + steps);
  std::printf("[ numerics ] cached vs reference logits: max |diff| prefill %.3g, decode %.3g\n",
              max_prefill, max_decode);
}

std::vector<std::vector<int64_t>> Generate(const LlamaWeights& w, int64_t steps,
                                           SamplingParams params) {
  const int64_t B = 2, prompt = 5;
  std::vector<KvCache> caches;
  auto h = Embedding(w, Tensor::FromInt64(PromptTokens(B, prompt, w.dims().vocab, 3), {B, prompt}));
  EXPECT_TRUE(h.ok());
  std::vector<std::vector<int64_t>> generated;
  Tensor hidden = *h;
  const uint64_t base_seed = params.seed;
  for (int64_t step = 0; step < steps; ++step) {
    auto out = RunGroups(w, hidden, caches, caches.empty() ? 0 : caches[0].tokens());
    EXPECT_TRUE(out.ok()) << out.status();
    auto logits = LmHead(w, *out);
    EXPECT_TRUE(logits.ok()) << logits.status();
    params.seed = base_seed * 1000003 + static_cast<uint64_t>(step);
    auto next = Sample(*logits, params);
    EXPECT_TRUE(next.ok()) << next.status();
    generated.push_back(next->ToInt64());
    hidden = *Embedding(w, *next);
  }
  return generated;
}

// (c) Greedy is deterministic; top-p is reproducible per seed.
TEST(LlamaOpsTest, SamplingIsDeterministicPerSeed) {
  auto w = TinyWeights();
  const auto g1 = Generate(*w, 8, SamplingParams{0.0, 1.0, 1});
  const auto g2 = Generate(*w, 8, SamplingParams{0.0, 1.0, 99});  // seed unused when greedy
  EXPECT_EQ(g1, g2);
  const auto p1 = Generate(*w, 8, SamplingParams{1.0, 0.9, 7});
  const auto p2 = Generate(*w, 8, SamplingParams{1.0, 0.9, 7});
  const auto p3 = Generate(*w, 8, SamplingParams{1.0, 0.9, 8});
  EXPECT_EQ(p1, p2);
  EXPECT_NE(p1, p3);
  EXPECT_NE(p1, g1);
}

TEST(LlamaOpsTest, SampleSemantics) {
  // Row 0 peaks at 2, row 1 at 0.
  const std::vector<float> v = {0.f, 1.f, 5.f, 2.f, 9.f, 1.f, 0.f, 3.f};
  const Tensor logits = Tensor::FromFloat(v, {2, 4});
  for (SamplingParams p : {SamplingParams{0.0, 1.0, 0}, SamplingParams{1.0, 0.0, 0},
                           SamplingParams{1.0, 1e-6, 5}, SamplingParams{0.7, 1e-6, 6}}) {
    auto t = Sample(logits, p);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->shape(), (std::vector<int64_t>{2, 1}));
    EXPECT_EQ(t->ToInt64(), (std::vector<int64_t>{2, 0}));
  }
  // Top-p 1.0 at a high temperature reaches every token for some seed.
  std::vector<bool> seen(4, false);
  for (uint64_t seed = 0; seed < 200; ++seed) {
    seen[static_cast<size_t>(Sample(logits, SamplingParams{100.0, 1.0, seed})->ToInt64()[0])] = true;
  }
  EXPECT_EQ(std::count(seen.begin(), seen.end(), true), 4);
  // Top-k 2 at the same temperature reaches exactly the two most likely
  // tokens of row 0 (2 and 3); top-k 1 is greedy whatever the seed.
  std::vector<bool> seen_k(4, false);
  for (uint64_t seed = 0; seed < 200; ++seed) {
    auto t = Sample(logits, SamplingParams{100.0, 1.0, seed, 2});
    ASSERT_TRUE(t.ok()) << t.status();
    seen_k[static_cast<size_t>(t->ToInt64()[0])] = true;
    EXPECT_EQ(Sample(logits, SamplingParams{100.0, 1.0, seed, 1})->ToInt64(), (std::vector<int64_t>{2, 0}));
  }
  EXPECT_EQ(seen_k, (std::vector<bool>{false, false, true, true}));
  EXPECT_EQ(Sample(logits, SamplingParams{1.0, 1.0, 0, -1}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Sample(logits, SamplingParams{-1.0, 1.0, 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Sample(logits, SamplingParams{1.0, 1.5, 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// (e) Exceptions inside LibTorch and invalid inputs come back as Status.
TEST(TensorTest, HasShapeComparesEveryDimension) {
  const std::vector<int64_t> ids = {1, 2, 3, 4, 5, 6};
  const Tensor t = Tensor::FromInt64(ids, {2, 3});
  const std::vector<int64_t> same = {2, 3}, swapped = {3, 2}, longer = {2, 3, 1}, shorter = {2};
  EXPECT_TRUE(t.HasShape(same));
  EXPECT_FALSE(t.HasShape(swapped));
  EXPECT_FALSE(t.HasShape(longer));
  EXPECT_FALSE(t.HasShape(shorter));
  EXPECT_FALSE(Tensor().HasShape({}));
  const std::vector<int64_t> none;
  EXPECT_TRUE(Tensor::FromInt64(std::vector<int64_t>{7}, {}).HasShape(none));  // a scalar
}

TEST(LlamaOpsTest, ErrorsComeBackAsStatus) {
  auto w = TinyWeights();
  // A NaN reaches at::multinomial, which throws c10::Error.
  const std::vector<float> nan_logits = {0.f, std::nanf(""), 1.f, 2.f};
  auto s = Sample(Tensor::FromFloat(nan_logits, {1, 4}), SamplingParams{1.0, 0.9, 1});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInternal) << s.status();
  EXPECT_NE(s.status().message().find("Sample: LibTorch error"), absl::string_view::npos)
      << s.status();
  EXPECT_EQ(s.status().message().find("Exception raised from"), absl::string_view::npos)
      << "no C++ backtrace in the message: " << s.status();

  // Shape mismatches are caught before LibTorch sees them.
  const std::vector<float> wrong(2 * 3 * 32, 0.5f);
  auto f = FusedLayers(*w, 0, Tensor::FromFloat(wrong, {2, 3, 32}), nullptr, 0);
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(f.status().message().find("[2,3,32]"), absl::string_view::npos) << f.status();
  EXPECT_EQ(FusedLayers(*w, 2, Tensor(), nullptr, 0).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(LmHead(*w, Tensor::FromFloat(wrong, {2, 3, 32})).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Embedding(*w, Tensor::FromFloat(wrong, {2, 96})).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto oov = Embedding(*w, Tensor::FromInt64(std::vector<int64_t>{1, 256}, {1, 2}));
  EXPECT_EQ(oov.status().code(), absl::StatusCode::kOutOfRange) << oov.status();
  EXPECT_NE(oov.status().message().find("256"), absl::string_view::npos);
  EXPECT_FALSE(Tensor::FromInt64(std::vector<int64_t>{1, 2, 3}, {2, 2}).defined());

  // A cache for another batch or position is rejected, and left untouched.
  KvCache cache;
  auto h = Embedding(*w, Tensor::FromInt64(std::vector<int64_t>{1, 2, 3}, {1, 3}));
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE(FusedLayers(*w, 0, *h, &cache, 0).ok());
  const std::vector<float> k_before = cache.k().ToFloat();
  auto h2 = Embedding(*w, Tensor::FromInt64(std::vector<int64_t>{1, 2}, {2, 1}));
  ASSERT_TRUE(h2.ok());
  auto bad_batch = FusedLayers(*w, 0, *h2, &cache, 3);
  EXPECT_EQ(bad_batch.status().code(), absl::StatusCode::kInvalidArgument) << bad_batch.status();
  auto one = Embedding(*w, Tensor::FromInt64(std::vector<int64_t>{4}, {1, 1}));
  auto bad_pos = FusedLayers(*w, 0, *one, &cache, 2);
  EXPECT_EQ(bad_pos.status().code(), absl::StatusCode::kInvalidArgument) << bad_pos.status();
  EXPECT_EQ(cache.tokens(), 3);
  EXPECT_EQ(cache.k().ToFloat(), k_before);
  EXPECT_TRUE(FusedLayers(*w, 0, *one, &cache, 3).ok());
  EXPECT_EQ(cache.tokens(), 4);
}

}  // namespace
}  // namespace slicesched::executor
