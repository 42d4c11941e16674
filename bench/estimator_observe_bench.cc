// Microbenchmark of OpEstimator::Observe, what the master pays per operator
// of feedback (OnlineLearner::Apply): each call appends the sample to its
// key's window and refits the key (NNLS on the window, then the unbiasing
// scale). Keys: the tiny Llama prefill's ops (embed, layer groups, head,
// sample), observed in instance order with varying prompt lengths and a
// few percent of noise, the window full (steady state).
//
//   build/bench/estimator_observe_bench --benchmark_min_time=0.2
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

#include "slicesched/estimate/estimators.h"
#include "slicesched/gmg/llama.h"

namespace slicesched {
namespace {

void BM_Observe(benchmark::State& state) {
  absl::StatusOr<LlamaDims> dims = LlamaPreset("tiny");
  absl::StatusOr<LlamaTemplates> templates = dims.ok() ? BuildLlamaTemplates(*dims) : dims.status();
  if (!templates.ok()) {
    state.SkipWithError(templates.status().ToString().c_str());
    return;
  }
  const GraphTemplate& prefill = *templates->prefill;
  OpEstimatorOptions options;
  options.window = static_cast<int>(state.range(0));
  OpEstimator est(options);
  std::vector<int> keys;
  for (int op = 0; op < prefill.num_ops(); ++op) keys.push_back(est.Register("cpu", prefill, op));
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<double> noise(0.97, 1.03);
  // A fixed pool of samples: attributes and measured times (linear in the
  // tokens, plus a launch cost).
  struct Sample {
    int key;
    std::vector<int64_t> attrs;
    Duration t;
  };
  std::vector<Sample> pool;
  for (int inst = 0; inst < 512; ++inst) {
    const int64_t tokens = 1 + static_cast<int64_t>(rng() % 64);
    for (int op = 0; op < prefill.num_ops(); ++op) {
      std::vector<int64_t> attrs(prefill.op(op).attrs.size());
      for (size_t k = 0; k < attrs.size(); ++k) attrs[k] = k == 1 ? tokens : 1;
      const double ns = (20e3 + 3e3 * static_cast<double>(tokens) * (1 + op)) * noise(rng);
      pool.push_back({keys[op], std::move(attrs), Duration::Nanos(static_cast<int64_t>(ns))});
    }
  }
  // Fill every window first: the steady state is a full window.
  for (const Sample& s : pool) est.Observe(s.key, s.attrs, s.t);
  size_t i = 0;
  for (auto _ : state) {
    const Sample& s = pool[i];
    est.Observe(s.key, s.attrs, s.t);
    if (++i == pool.size()) i = 0;
  }
  benchmark::DoNotOptimize(est.PredictNs(keys[1], pool[1].attrs));
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Observe)->Arg(64)->Arg(256);

}  // namespace
}  // namespace slicesched

BENCHMARK_MAIN();
