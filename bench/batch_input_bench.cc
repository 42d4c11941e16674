// Intake cost of a batch job's input file: parsing and validating N requests
// of the OpenAI Batch format, and the whole submit with the durable store
// (issue bar: 100,000 small requests accepted within 10 s).
#include <benchmark/benchmark.h>

#include <unistd.h>

#include <filesystem>
#include <string>

#include "slicesched/common/strings.h"
#include "slicesched/jobs/batch_input.h"
#include "slicesched/jobs/batch_manager.h"

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

// What Batch.Submit does after receiving the file: parse, validate, encode
// and store the batch with every request in one SQLite transaction (WAL,
// synchronous=NORMAL) in a fresh state directory.
void BM_SubmitBatch(benchmark::State& state) {
  const std::string file = File(static_cast<int>(state.range(0)));
  const std::string dir = StrCat(std::filesystem::temp_directory_path().string(), "/batch_bench_", ::getpid());
  std::filesystem::remove_all(dir);
  jobs::BatchManager::Options o;
  o.models = [](std::string_view) {
    return std::optional<BatchModelInfo>(BatchModelInfo{.vocab = 256, .max_context_tokens = 4096});
  };
  auto m = jobs::BatchManager::Open(dir, o);
  if (!m.ok()) {
    state.SkipWithError("cannot open the state store");
    return;
  }
  for (auto _ : state) {
    auto r = (*m)->Submit({.jsonl = file, .deployment = "chat"});
    if (!r.ok() || r->accepted != state.range(0)) state.SkipWithError("submit failed");
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
  m->reset();
  std::filesystem::remove_all(dir);
}
BENCHMARK(BM_SubmitBatch)->Arg(100000)->Unit(benchmark::kMillisecond)->Iterations(3);

}  // namespace
}  // namespace slicesched

BENCHMARK_MAIN();
