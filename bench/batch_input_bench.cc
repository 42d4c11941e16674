// Intake cost of a batch job's input file: parsing and validating N requests
// of the OpenAI Batch format (issue bar: 100,000 small requests accepted
// within 10 s).
#include <benchmark/benchmark.h>

#include <string>

#include "slicesched/common/strings.h"
#include "slicesched/jobs/batch_input.h"

namespace slicesched {
namespace {

std::string File(int n) {
  std::string out;
  for (int i = 0; i < n; ++i) {
    out += StrCat(R"({"custom_id": "req-)", i,
                  R"(", "method": "POST", "url": "/v1/completions", "body": {"model": "chat", "prompt": [)",
                  i % 251, ", 17, 3, ", (i * 7) % 251, R"(], "max_tokens": 16, "temperature": 0, "seed": )", i, "}}\n");
  }
  return out;
}

void BM_ParseBatchInput(benchmark::State& state) {
  const std::string file = File(static_cast<int>(state.range(0)));
  const BatchModelLookup models = [](std::string_view) {
    return std::optional<BatchModelInfo>(BatchModelInfo{.vocab = 256, .max_context_tokens = 4096});
  };
  for (auto _ : state) {
    auto r = ParseBatchInput(file, models, /*strict=*/true);
    if (!r.ok() || r->requests.size() != static_cast<size_t>(state.range(0))) state.SkipWithError("parse failed");
    benchmark::DoNotOptimize(r);
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
  state.counters["MiB"] = static_cast<double>(file.size()) / (1 << 20);
}
BENCHMARK(BM_ParseBatchInput)->Arg(1000)->Arg(100000)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace slicesched

BENCHMARK_MAIN();
