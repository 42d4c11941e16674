// `slicesim bench-sim`: simulator throughput on a realistic snapshot.
//
// Builds a server of N A16-class devices serving Llama3-8B (8 layers per
// fused operator) with a mix of issued work: decode steps of conversations
// whose KV caches live on device pairs (pp2, several online priorities),
// online and offline prefills placed pp2 or pp4 across devices with the
// cross-device transfers those placements imply, and one operator running on
// every device. Then it times Simulator::Create (construction) and Run (to
// completion) over a few repetitions and reports the median. Untimed warm-up
// repetitions come first: the scheduler reuses its simulator and scratch
// across decisions, so the steady state is what a decision costs, not the
// first touches of freshly grown buffers (and a process a few milliseconds
// old, whose core has just been handed to it).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace slicesched {

struct BenchSimOptions {
  int devices = 8;
  int ops = 6000;        // issued compute operators in the snapshot (at least)
  int repetitions = 5;
  int warmup = 5;        // untimed repetitions before the timed ones
  uint64_t seed = 1;
  int64_t horizon_us = -1;  // stop the run early (profiling); -1 = to completion
  // InvalidArgument naming the option (as slicesim's flag) and its value:
  // devices 2..4096, ops 1..10000000, repetitions >= 1, warmup >= 0,
  // horizon_us >= -1. RunBenchSim checks it first.
  absl::Status Validate() const;
};

struct BenchSimResult {
  int devices = 0;
  int64_t ops = 0;            // operators and transfers simulated
  int64_t compute_ops = 0;
  int64_t transfers = 0;
  int64_t instances = 0;
  int repetitions = 0;        // timed (the median is over these)
  int warmup = 0;             // untimed, before them
  double snapshot_us = 0;     // GMG -> snapshot (not part of ops_per_ms)
  double construct_us = 0;    // snapshot -> simulator state
  double simulate_us = 0;     // run to completion
  double ops_per_ms = 0;      // ops / (construct + simulate)
  double compute_ops_per_ms = 0;  // the same counting compute operators only
  double makespan_ms = 0;     // simulated time to drain the snapshot
  std::string ToJson() const;
};

absl::StatusOr<BenchSimResult> RunBenchSim(const BenchSimOptions& options);

// Runs the grid ops x devices and writes DIR/bench_sim.csv (one row per
// point: devices, ops, construct_us, simulate_us, ops_per_ms, ...).
absl::Status RunBenchSimSweep(const std::vector<int>& devices, const std::vector<int>& ops, int repetitions,
                              const std::string& out_dir);

}  // namespace slicesched
