// Microbenchmark of the queue discipline's ReadyQueue as a device uses it:
// `window` instances in flight, five operators each, an instance's next
// operator pushed when its previous one is popped and a new instance
// admitted when one retires, until `total` instances have run. Priorities
// either first-come first-served (each instance one lower than the one
// before, so a bucket per instance in flight, as the overhead harness's
// --priorities fcfs) or four fixed levels (a bucket per level, as bench-sim).
//
//   build/bench/ready_queue_bench --benchmark_min_time=0.2
#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "slicesched/sim/queue_discipline.h"

namespace slicesched {
namespace {

constexpr int kOpsPerInstance = 5;
constexpr int kInstances = 5000;

void RunQueue(benchmark::State& state, bool fcfs) {
  const int window = static_cast<int>(state.range(0));
  for (auto _ : state) {
    ReadyQueue q;
    std::vector<int> left(kInstances, kOpsPerInstance - 1);
    std::vector<int> instance_of;  // per item
    instance_of.reserve(kInstances * kOpsPerInstance);
    int64_t now = 0;
    int admitted = 0;
    auto push = [&](int inst) {
      const uint32_t item = static_cast<uint32_t>(instance_of.size());
      q.Push(DisciplineKey{0, fcfs ? -inst : inst % 4, now++, item}, item);
      instance_of.push_back(inst);
    };
    while (admitted < window && admitted < kInstances) push(admitted++);
    while (!q.empty()) {
      const int inst = instance_of[q.Pop()];
      if (left[inst] > 0) {
        --left[inst];
        push(inst);
      } else if (admitted < kInstances) {
        push(admitted++);
      }
    }
    benchmark::DoNotOptimize(instance_of.data());
  }
  state.SetItemsProcessed(state.iterations() * kInstances * kOpsPerInstance);
}

void BM_ReadyQueueFcfs(benchmark::State& state) { RunQueue(state, true); }
void BM_ReadyQueueFourLevels(benchmark::State& state) { RunQueue(state, false); }

BENCHMARK(BM_ReadyQueueFcfs)->Arg(8)->Arg(1000)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_ReadyQueueFourLevels)->Arg(8)->Arg(1000)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace slicesched

BENCHMARK_MAIN();
