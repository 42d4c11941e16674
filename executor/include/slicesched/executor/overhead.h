// The scheduling-overhead experiment (paper Table 1): N prefills of context
// length 1 on the tiny Llama, executed
//   (a) directly: Embedding -> FusedLayers per group -> LmHead -> Sample,
//       called in a loop on the calling thread;
//   (b) scheduled: each prefill instantiated in a GMG, placed by the
//       SliceScheduler (one CPU device, so the template's "single" partition
//       is its only candidate: the fast path without what-if simulation) and
//       run by the ExecutorSet with the LlamaKernelRunner. The master keeps
//       up to `window` prefills in flight, as a serving master does with a
//       backlog: while the device runs one prefill's operators, the next
//       ones are already instantiated, scheduled and queued on it, and the
//       master retires finished prefills (releasing their KV checkpoints)
//       and submits more. With window 1 the master submits a prefill only
//       after the previous one retired, so every hand-off (submit, schedule,
//       queue, completion, retirement) is on the critical path.
// The timed region of (b) runs from the first submission to the last
// retirement; the device runs the same operators on the same tokens as (a)
// (the sampled tokens are compared).
// The two alternate in one process: each repetition runs the N prompts in
// blocks of `block` (default 100), a block directly, then the same block
// scheduled (from an empty pipeline to its last retirement), and so on; a
// path's time for the repetition is the sum over its blocks. Alternating in
// blocks of ~50 ms rather than whole runs of ~0.5 s makes both paths see the
// same machine when other work comes and goes (block = N is the coarse
// alternation). The result reports the medians over `repetitions`. Both
// paths produce the same tokens (checked).
//
// Torch-free header; the implementation links the LibTorch executors
// (library slicesched::executor_experiments, built with LibTorch only).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace slicesched {

struct OverheadOptions {
  int64_t prefills = 1000;
  int repetitions = 5;  // alternations of direct and scheduled
  int window = 4;       // scheduled prefills in flight at once (>= 1)
  int64_t block = 100;  // prefills per alternation block (>= 1; capped at prefills)
  // With two or more CPUs allowed: the direct loop and the device thread run
  // pinned to the same CPU, the master on the others (its own core, as in
  // the paper's setup), so its wake-ups do not preempt the device thread.
  // Off by default: on a machine whose cores are shared with other work, a
  // master pinned to a busy core is preempted while it holds the executors'
  // lock, which costs far more (docs/experiments.md).
  bool pin = false;
  uint64_t seed = 1;    // weights
  int warmup = 20;      // untimed prefills of each kind first
  std::string model = "tiny";  // a Llama preset: tiny, small, llama3-8b
};

struct OverheadResult {
  int64_t prefills = 0;
  int repetitions = 0;
  int window = 0;
  int64_t block = 0;
  std::string model;
  std::string placement;  // how the scheduled prefills were placed
  std::string pinning;    // which CPUs ran what
  double direct_s = 0;     // median over repetitions
  double scheduled_s = 0;  // median over repetitions
  double overhead_pct = 0; // 100 * (scheduled - direct) / direct
  std::vector<double> direct_runs_s, scheduled_runs_s;
  bool tokens_match = false;
  // CPU time (medians over repetitions): the calling thread during (a); the
  // device thread and the master (calling) thread during (b). On a machine
  // whose cores are shared, wall time includes waiting for a core; these
  // show how much work each path did.
  double direct_cpu_s = 0, device_cpu_s = 0, master_cpu_s = 0;

  std::string ToJson() const;
};

absl::StatusOr<OverheadResult> RunOverhead(const OverheadOptions& options);

}  // namespace slicesched
