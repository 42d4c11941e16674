// Microbenchmark of FeatureBasis::Dot, the prediction the simulator's
// Rebuild makes per compute node: llama3-8b prefill instances (embed, four
// layer groups, head, sample), their nodes in the order Rebuild meets them
// (instance by instance, so the basis kinds repeat with period 7), sorted by
// op, or shuffled. Dot switches on the kind; the three orders tell how much
// of its cost is that switch mispredicting (see docs/design/simulator.md).
//
//   build/bench/feature_basis_bench --benchmark_min_time=0.2
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "slicesched/estimate/estimators.h"
#include "slicesched/gmg/llama.h"

namespace slicesched {
namespace {

constexpr int kInstances = 858;  // bench-sim --devices 8 --ops 6000

struct Node {
  const FeatureBasis* basis;
  const double* coeffs;
  std::vector<int64_t> attrs;
};

enum class Order { kInstances, kSortedByOp, kShuffled };

void RunDot(benchmark::State& state, Order order) {
  absl::StatusOr<LlamaDims> dims = LlamaPreset("llama3-8b");
  absl::StatusOr<LlamaTemplates> templates = dims.ok() ? BuildLlamaTemplates(*dims) : dims.status();
  if (!templates.ok()) {
    state.SkipWithError(templates.status().ToString().c_str());
    return;
  }
  const GraphTemplate& prefill = *templates->prefill;
  std::vector<FeatureBasis> bases;
  std::vector<std::vector<double>> coeffs;
  for (int op = 0; op < prefill.num_ops(); ++op) {
    bases.push_back(FeatureBasis::For(prefill.op(op)));
    coeffs.emplace_back(kMaxFeatures, 0.0);
    for (int i = 0; i < bases.back().size(); ++i) coeffs.back()[i] = 1.0 + i;
  }
  std::mt19937_64 rng(1);
  std::vector<Node> nodes;
  for (int inst = 0; inst < kInstances; ++inst) {
    const int64_t tokens = 100 + static_cast<int64_t>(rng() % 3900);
    for (int op = 0; op < prefill.num_ops(); ++op) {
      std::vector<int64_t> attrs(prefill.op(op).attrs.size());
      for (size_t k = 0; k < attrs.size(); ++k) attrs[k] = k == 1 ? tokens : 1 + static_cast<int64_t>(rng() % 4);
      nodes.push_back({&bases[op], coeffs[op].data(), std::move(attrs)});
    }
  }
  if (order == Order::kSortedByOp) {
    std::stable_sort(nodes.begin(), nodes.end(), [](const Node& a, const Node& b) { return a.basis < b.basis; });
  } else if (order == Order::kShuffled) {
    std::shuffle(nodes.begin(), nodes.end(), rng);
  }
  // Coefficients and attributes are small integers, so every sum is exact
  // and the same in any order: the timed sum must equal Compute()'s.
  double expected = 0;
  for (const Node& n : nodes) {
    const Features f = n.basis->Compute(n.attrs);
    for (int i = 0; i < f.n; ++i) expected += n.coeffs[i] * f.v[i];
  }
  double sum = 0;
  for (auto _ : state) {
    sum = 0;
    for (const Node& n : nodes) sum += n.basis->Dot(n.coeffs, n.attrs);
    benchmark::DoNotOptimize(sum);
  }
  if (sum != expected) state.SkipWithError("Dot disagrees with Compute()");
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(nodes.size()));
}

void BM_DotInstanceOrder(benchmark::State& state) { RunDot(state, Order::kInstances); }
void BM_DotSortedByOp(benchmark::State& state) { RunDot(state, Order::kSortedByOp); }
void BM_DotShuffled(benchmark::State& state) { RunDot(state, Order::kShuffled); }
BENCHMARK(BM_DotInstanceOrder);
BENCHMARK(BM_DotSortedByOp);
BENCHMARK(BM_DotShuffled);

}  // namespace
}  // namespace slicesched

BENCHMARK_MAIN();
