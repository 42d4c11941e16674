// The scheduling-overhead experiment (paper Table 1): N prefills of context
// length 1 on the tiny Llama, executed
//   (a) directly: Embedding -> FusedLayers per group -> LmHead -> Sample,
//       called in a loop on a thread of its own (like the device thread;
//       OverheadOptions::direct_on_main: on the calling thread);
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
//       queue, completion, retirement) is on the critical path. The
//       prefills are ranked first come, first served by default (see
//       OverheadOptions::priorities), so the device runs them one after the
//       other, in the direct loop's order.
// The timed region of (b) runs from the first submission to the last
// retirement; the device runs the same operators on the same tokens as (a)
// (the sampled tokens are compared).
// The two alternate in one process: each repetition runs the N prompts in
// blocks of `block` (default 100), a block directly and the same block
// scheduled (from an empty pipeline to its last retirement), in either order
// (OverheadOptions::order), and so on; a
// path's time for the repetition is the sum over its blocks. Alternating in
// blocks of ~50 ms rather than whole runs of ~0.5 s makes both paths see the
// same machine when other work comes and goes (block = N is the coarse
// alternation). The result reports the medians over `repetitions`, and
// each block pair's ratio (OverheadResult::block_ratios). Both paths
// produce the same tokens (checked).
//
// Torch-free header; the implementation links the LibTorch executors
// (library slicesched::executor_experiments, built with LibTorch only).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "slicesched/executor/runtime/executor.h"

namespace slicesched {

struct OverheadOptions {
  int64_t prefills = 1000;
  int repetitions = 5;  // alternations of direct and scheduled
  // Scheduled prefills in flight at once (>= 1). 8 with wake_batch 4: the
  // master refills four at a time while the other four (~2 ms of work) are
  // still queued on the device, so the device never waits for the master.
  int window = 8;
  int64_t block = 100;  // prefills per alternation block (>= 1; capped at prefills)
  // With two or more CPUs allowed: the direct loop and the device thread run
  // pinned to the same CPU, the master on the others (its own core, as in
  // the paper's setup), so its wake-ups do not preempt the device thread and
  // both paths run their operators on the same CPU. On by default: on one
  // of this project's VMs the unpinned figure swung from
  // -12% to +47% between runs of one binary (the kernel placed the two
  // threads on different vCPUs, which the host runs at different speeds
  // from moment to moment) while the pinned one stayed at 0.5-3%
  // (docs/design/executor.md). `slicesim overhead --no-pin` turns it
  // off: on a machine whose cores are busy with other work a master pinned
  // to a busy core is preempted while it holds the executors' lock, which
  // costs far more than its wake-ups.
  bool pin = true;
  // The executors' owner nap in microseconds (ExecutorOptions::owner_nap,
  // >= 0): while the device holds work the master naps this long between
  // looks instead of being woken by the device thread; 0: woken for every
  // batch of completions.
  int64_t nap_us = absl::ToInt64Microseconds(executor::ExecutorOptions::kDefaultOwnerNap);
  // Once a block's last prefill is the only one in flight, the master polls
  // for its completion for up to this many microseconds (>= 0; the `spin`
  // of ExecutorSet::WaitForFinishBatch) instead of napping: a wake-up of
  // the master's idle CPU costs ~0.1 ms on this project's VMs. It polls
  // only while it does not share a CPU with the device thread. 0: naps.
  int64_t tail_spin_us = 500;
  // The master retires prefills in batches of this many (>= 1, at most
  // `window`): its wait returns once that many prefills have finished (or
  // the device ran out of work; ExecutorSet::WaitForFinishBatch). 1: every
  // prefill. Batching pays
  // only with "fcfs" priorities: with equal ones the prefills in flight
  // finish together anyway.
  int wake_batch = 4;
  // The direct loop runs on a thread of its own by default, like the
  // device thread (see overhead.cc: DirectThread); true: on the calling
  // thread, which is also the master's.
  bool direct_on_main = false;
  // The device threads take their tensor memory from a per-thread cache
  // (cpu_allocator.h). By default the direct loop's thread uses the same
  // cache, so both paths allocate alike and the figure is the executor's
  // own cost. false: the direct loop calls the operators on c10's default
  // allocator (glibc), which shows what the cache itself is worth, not the
  // scheduling overhead (docs/design/executor.md).
  bool direct_cache = true;
  // How the master ranks its prefills for the devices' queue discipline:
  // "fcfs" (first come, first served: each prefill gets a lower priority
  // than the one submitted before it, so a device runs the oldest prefill's
  // operators first, one prefill after the other, as the direct loop does),
  // or "equal" (every prefill the same priority: the
  // discipline then runs the operators in the order they became ready, so
  // the prefills in flight advance in lockstep, finish within a few
  // microseconds of each other and the device runs dry until the master
  // has refilled the window; docs/design/executor.md).
  std::string priorities = "fcfs";
  // The order of each block pair: "abba" (the direct block first in every
  // other pair, the scheduled one first in the rest, flipping between
  // repetitions too, so a drift of the host's speed or what one path leaves
  // behind for the next weighs on both alike) or "direct-first" (every pair
  // direct, then scheduled).
  std::string order = "abba";
  uint64_t seed = 1;    // weights
  int warmup = 20;      // untimed prefills of each kind first
  std::string model = "tiny";  // a Llama preset: tiny, small, llama3-8b
  // "cpu", or "cuda": both paths on GPU 0 (FailedPrecondition where this
  // process cannot use it). The direct loop's thread is bound to the GPU
  // like a device thread, with a stream of its own, and reads its own copy
  // of the weights there; it waits only for each prefill's token, as an
  // engine calling the operators would, while the executor waits for each
  // operator's completion event: that wait is part of what is measured.
  std::string device = "cpu";
  // "" (both), "direct" or "scheduled": time only that path (for profiling
  // one path with perf or valgrind). The other path still runs once,
  // untimed, before the repetitions so the tokens are still compared;
  // overhead_pct is then 0 and the skipped path's times are 0.
  std::string only;
  // The null check (`slicesim overhead --null`): the scheduled path is
  // replaced by the direct loop itself on a twin thread (a second thread of
  // its own, set up and pinned like the first), alternated with the direct
  // loop exactly as the scheduled blocks are. Two identical paths: the
  // overhead_pct and paired figures of this A/A comparison are what a
  // scheduler that cost nothing would get on this machine, i.e. the
  // resolution of the measurement. Quote it beside the real figure, from
  // runs alternated with it.
  bool null_check = false;
  // InvalidArgument naming the option (as slicesim overhead's flag) and its
  // value: prefills, repetitions, window and block >= 1, nap_us >= 0,
  // wake_batch in 1..window, priorities, order, only and device one of their names;
  // null_check with only or direct_on_main (the twin is the direct loop's
  // thread's double; both paths are timed). RunOverhead checks it first.
  absl::Status Validate() const;
};

// What the kernel's scheduler accounted to one thread over the timed blocks
// of one path (medians over repetitions; from /proc/self/task/<tid>):
// runqueue waits are time the thread was runnable but not running (another
// thread or process had its CPU); voluntary switches are its blocking waits
// (a futex, a condition); involuntary ones are preemptions.
struct ThreadSched {
  double run_s = 0;      // on a CPU (schedstat)
  double rq_wait_s = 0;  // runnable, waiting for a CPU (schedstat)
  double sys_s = 0;      // of run_s, in the kernel (stat, clock-tick resolution)
  int64_t voluntary = 0, involuntary = 0;  // context switches
  int64_t minor_faults = 0;
  int64_t migrations = 0;  // moves to another CPU (sched; 0 where the kernel hides it)

  std::string ToJson() const;
};

struct OverheadResult {
  int64_t prefills = 0;
  int repetitions = 0;
  int window = 0;
  int64_t block = 0;
  int64_t nap_us = 0;
  int64_t tail_spin_us = 0;
  int wake_batch = 0;
  std::string model;
  std::string device;     // "cpu" or "cuda"
  std::string placement;  // how the scheduled prefills were placed
  std::string pinning;    // which CPUs ran what
  double direct_s = 0;     // median over repetitions
  double scheduled_s = 0;  // median over repetitions
  double overhead_pct = 0; // 100 * (scheduled - direct) / direct
  std::vector<double> direct_runs_s, scheduled_runs_s;
  // Each block's pair (its direct and scheduled runs, back to back in the
  // order OverheadOptions::order gives; every block of every repetition,
  // when both paths are timed): the scheduled block's time over the direct
  // one's.
  // The paired figure follows the machine's speed from block to block
  // (~50 ms apart), where the sums over a repetition mix blocks run at
  // different speeds. Median and quartiles, as percentages over 1.
  std::vector<double> block_ratios;
  double paired_overhead_pct = 0, paired_q1_pct = 0, paired_q3_pct = 0;
  // Operators in one prefill (the prefill template's: embedding, the fused
  // layer groups, LM head, sampling), and the paired figure as a time: the
  // median over the block pairs of the scheduled block's extra time over
  // its direct twin, per operator, in microseconds. The fixed cost of
  // scheduling an operator, whatever its size: over an operator of t us
  // the overhead is ~100 * this / t percent.
  int ops_per_prefill = 0;
  double paired_overhead_us_per_op = 0;
  // The direct loop's mean time per operator, in microseconds (0 before
  // ops_per_prefill is known).
  double per_op_direct_us() const {
    return prefills > 0 && ops_per_prefill > 0 ? 1e6 * direct_s / static_cast<double>(prefills * ops_per_prefill)
                                               : 0.0;
  }
  bool tokens_match = false;
  // CPU time (medians over repetitions): the calling thread during (a); the
  // device thread and the master (calling) thread during (b). On a machine
  // whose cores are shared, wall time includes waiting for a core; these
  // show how much work each path did.
  double direct_cpu_s = 0, device_cpu_s = 0, master_cpu_s = 0;
  // Operators the executors ran over the whole run (warm-up included), and
  // how many of them through the local-successor fast path.
  int64_t scheduled_ops = 0, fast_path_ops = 0;
  // Wakes of the master by the device thread over the whole run (warm-up
  // included; ExecutorSet::owner_wakes).
  int64_t owner_wakes = 0;
  std::string only;  // OverheadOptions::only
  // OverheadOptions::null_check: the "scheduled" figures (scheduled_s, the
  // block pairs, overhead_pct) are the twin direct loop's, and so are
  // device_cpu_s and device_thread; the master's are zero.
  bool null_check = false;
  bool direct_on_main = false;  // OverheadOptions::direct_on_main
  bool direct_cache = true;     // OverheadOptions::direct_cache
  // The device thread's tensor cache (cpu_allocator.h) at the end of the
  // run: requests served from it and those that allocated.
  int64_t device_cache_hits = 0, device_cache_misses = 0;
  std::string priorities;       // OverheadOptions::priorities
  std::string order;            // OverheadOptions::order
  // The scheduler's view of the direct loop's thread, of the device thread
  // and of the master thread (see ThreadSched).
  ThreadSched direct_thread, device_thread, master_thread;

  std::string ToJson() const;
};

absl::StatusOr<OverheadResult> RunOverhead(const OverheadOptions& options);

}  // namespace slicesched
