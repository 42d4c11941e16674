// Internal to `slicesim overhead` (experiments/overhead.h): the two paths
// it times and the per-thread counters they are measured with
// (overhead_paths.cc), shared with overhead.cc (the options, the warm-up,
// the timed block pairs and the report).
#pragma once

#include <sys/types.h>
#include <time.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "slicesched/common/clock.h"
#include "slicesched/common/thread_pool.h"
#include "slicesched/estimate/estimators.h"
#include "slicesched/executor/kernels/llama_kernels.h"
#include "slicesched/executor/llama/llama_ops.h"
#include "slicesched/executor/runtime/executor.h"
#include "slicesched/executor/torch/cpu_allocator.h"
#include "slicesched/executor/torch/device.h"
#include "slicesched/executor/torch/tensor.h"
#include "slicesched/experiments/overhead.h"
#include "slicesched/gmg/gmg.h"
#include "slicesched/gmg/llama.h"
#include "slicesched/sched/slice_scheduler.h"
#include "slicesched/sim/simulator.h"

namespace slicesched::overhead_internal {

// CPU time of a thread (CLOCK_THREAD_CPUTIME_ID: the caller), in seconds.
double ThreadCpuSeconds(clockid_t clock);

pid_t CurrentTid();

// The cumulative scheduler counters of thread `tid` of this process (zeros
// where a file is missing). Reads /proc: call it outside timed regions.
ThreadSched ReadThreadSched(pid_t tid);

// (a) The operators called directly. Returns the sampled token.
absl::StatusOr<int64_t> DirectPrefill(const executor::LlamaWeights& w, const executor::Tensor& tokens);

// A thread of its own for the direct loop, so that the two paths run their
// operators alike: each on a thread that does nothing else (the executor's
// device thread; this one), with one intra-op thread, glibc's per-thread
// arena and thread cache, and the same pinning. (On the master's thread the
// direct loop would use the main arena, the thread that also instantiates
// and frees everything else.) Run() executes `f` there and returns when it
// is done (on a ThreadPool of one worker); the caller and `f` take the
// block's time (see RunDirectLoop in overhead.cc).
class DirectThread {
 public:
  // `cache`: the thread takes its tensor memory from the per-thread cache,
  // as a device thread does (OverheadOptions::direct_cache).
  // `cuda`: bound to GPU 0 and a stream of its own, as a device thread of a
  // cuda device is (the caller checked that the GPU is usable).
  explicit DirectThread(bool cache, bool cuda = false) {
    Run([this, cache, cuda] {
      tid_ = CurrentTid();
      executor::SetIntraOpThreadsForThisThread(1);
      if (cache) executor::UseCachingCpuAllocatorOnThisThread();
      if (cuda) bound_ = executor::BindThisThreadToCuda(0);
    });
  }
  const absl::Status& bound() const { return bound_; }
  // The worker's thread id (for its /proc counters).
  pid_t tid() const { return tid_; }
  void Run(absl::FunctionRef<void()> f) {
    absl::Notification done;
    worker_.Schedule([&] {
      f();
      done.Notify();
    });
    done.WaitForNotification();
  }

 private:
  ThreadPool worker_{1};
  pid_t tid_ = 0;
  absl::Status bound_;
};

// (b) The master's path: GMG + SliceScheduler + ExecutorSet on one device.
class ScheduledRig {
 public:
  // `device_cpu` >= 0: the device thread is pinned to that CPU. `nap`: the
  // executors' owner nap.
  // `cuda`: the device is GPU 0 (activations and caches up to 16 GiB; the
  // weights' copy is not charged to the pool).
  static absl::StatusOr<std::unique_ptr<ScheduledRig>> Create(const LlamaDims& dims,
                                                              std::shared_ptr<const executor::LlamaWeights> w,
                                                              int device_cpu, absl::Duration nap, bool cuda);

  // Runs one prefill of context length 1 per prompt, start to retirement,
  // keeping up to `window` of them in flight (instantiated and scheduled,
  // their operators queued on the device) so the device always has the next
  // prefill's operators at hand while the master retires the previous ones;
  // window 1 submits each prefill only after the previous one retired.
  // tokens[i] is prompt i's sampled token.
  // fcfs: each prefill ranks below the one submitted before it (see
  // OverheadOptions::priorities); otherwise all rank alike.
  absl::Status RunPrefills(std::span<const executor::Tensor> prompts, int window, int wake_batch, bool fcfs,
                           absl::Duration tail_spin, std::span<int64_t> tokens);

  // Lets the executors release what the GMG freed (released checkpoints).
  absl::Status Settle();
  int64_t whatif_runs() const { return whatif_runs_; }
  // Operators in one prefill (the template's).
  int prefill_ops() const { return prefill_ops_; }
  const executor::ExecutorSet& executors() const { return *exec_; }
  // CPU time the device thread has used so far (0 before its first sample).
  double DeviceCpuSeconds();
  // The device thread's tensor cache as of its last sampled token.
  executor::CpuCacheStats DeviceCache();
  // The device thread's scheduler counters (zeros before its first sample).
  ThreadSched DeviceSched();

 private:
  ScheduledRig(AcceleratorSet accel, std::unique_ptr<executor::LlamaKernelRunner> runner);
  void Start(int device_cpu, absl::Duration nap);

  SteadyClock clock_;
  GlobalMappingGraph g_;
  std::unique_ptr<executor::LlamaKernelRunner> runner_;
  executor::LlamaTransferBackend transfers_;
  OpEstimator op_est_;
  TransferEstimator transfer_est_;
  SimContext ctx_;
  SliceScheduler sched_;
  SchedulerEnv env_;
  TemplateId prefill_;
  int prefill_ops_ = 0;
  InstanceSpec spec_;
  std::vector<Feedback> feedback_;
  // Prefills in flight: instance -> (prompt index, sampled token); the token
  // sink runs on the device thread.
  struct Slot {
    size_t prompt;
    int64_t token;
  };
  absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Slot> slot_ ABSL_GUARDED_BY(mu_);
  std::optional<clockid_t> device_clock_ ABSL_GUARDED_BY(mu_);
  pid_t device_tid_ ABSL_GUARDED_BY(mu_) = 0;
  executor::CpuCacheStats device_cache_ ABSL_GUARDED_BY(mu_);
  int64_t whatif_runs_ = 0;
  int64_t submitted_ = 0;  // prefills submitted so far (fcfs priorities)
  std::unique_ptr<executor::ExecutorSet> exec_;  // last: stopped first
};

}  // namespace slicesched::overhead_internal
